//! Times one MLA decoding step over a latent cache of `S` tokens (and hashes its output's bits): a DeepSeek-shaped
//! attention (r = 512, p = 64, n = 128, v = 128, q_lora 512) with a small model width, so the
//! attention over the cache, not the weights, dominates.
//!
//! `cargo run --release --example mla_decode -- HEADS S FORMAT STEPS THREADS`
//! (defaults 16 4096 f32 20 1; FORMAT f32, bf16, f16 or q8_0). Prints the cache's bytes per
//! token and the median, minimum and maximum microseconds of `STEPS` steps, each from the same
//! `S` cached tokens (the last token is rolled back by re-prefilling nothing: each step decodes
//! into a clone of the prefilled cache).

use std::time::Instant;

use mha::{
    KvFormat, MlaLayer, MlaShape, MlaWeights, Output, Rope, RopeLayout, RopeScaling, Tokens,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.into());
    let heads: usize = arg(0, "16").parse().expect("HEADS");
    let cached: usize = arg(1, "4096").parse().expect("S");
    let format = match arg(2, "f32").as_str() {
        "f32" => KvFormat::F32,
        "bf16" => KvFormat::Bf16,
        "f16" => KvFormat::F16,
        "q8_0" => KvFormat::Q8_0,
        other => panic!("unknown format {other}"),
    };
    let steps: usize = arg(3, "20").parse().expect("STEPS");
    let threads: usize = arg(4, "1").parse().expect("THREADS");
    let shape = MlaShape {
        d_model: 512,
        n_heads: heads,
        q_lora_rank: Some(512),
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
    };
    let (d, h, q, r) = (shape.d_model, heads, 512, 512);
    let values = |n: usize, seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 2003.0 - 0.5)
            .map(|x| x * 0.05)
            .collect()
    };
    let (qa, qb) = (values(q * d, 1), values(h * 192 * q, 2));
    let (kva, kvb, o) = (
        values(576 * d, 3),
        values(h * 256 * r, 4),
        values(d * h * 128, 5),
    );
    let (qn, kvn) = (vec![1.0; q], vec![1.0; r]);
    let weights = MlaWeights {
        shape,
        q_a: Some((&qa, &qn)),
        q_b: &qb,
        kv_a: &kva,
        kv_a_norm: &kvn,
        kv_b: &kvb,
        o: &o,
    };
    let rope = Rope {
        theta: 10_000.0,
        rotary_dim: 64,
        layout: RopeLayout::Interleaved,
        scaling: RopeScaling::Default,
    };
    let mut layer = MlaLayer::builder(weights, rope)
        .threads(threads)
        .kv_format(format)
        .build()
        .expect("layer");
    let mut cache = layer.new_cache(1, cached + 1).expect("cache");
    let chunk = 512;
    for t0 in (0..cached).step_by(chunk) {
        let n = chunk.min(cached - t0);
        let x = values(n * d, 10 + t0);
        let mut y = vec![0.0; n * d];
        let tokens = Tokens::new(&x, 1, n, d).unwrap();
        layer
            .decode_into(tokens, &mut cache, Output::new(&mut y, 1, n, d).unwrap())
            .expect("prefill");
    }
    let x = values(d, 7);
    let mut times = Vec::new();
    let mut bits = 0u64;
    for _ in 0..steps {
        let mut step = cache.clone();
        let mut y = vec![0.0; d];
        let start = Instant::now();
        let tokens = Tokens::new(&x, 1, 1, d).unwrap();
        layer
            .decode_into(tokens, &mut step, Output::new(&mut y, 1, 1, d).unwrap())
            .expect("step");
        times.push(start.elapsed().as_secs_f64() * 1e6);
        bits = y
            .iter()
            .fold(0, |h, v| h.rotate_left(5) ^ u64::from(v.to_bits()));
    }
    if std::env::var_os("MLA_TIMES").is_some() {
        eprintln!("{times:.0?}");
    }
    times.sort_by(f64::total_cmp);
    let per_token = cache.bytes() / (cached + 1);
    println!(
        "heads {h} S {cached} {format:?}: cache {per_token} B/token, step median {:.0} us (min {:.0}, max {:.0}), output bits {bits:016x}",
        times[steps / 2],
        times[0],
        times[steps - 1]
    );
}
