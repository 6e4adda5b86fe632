//! The model-shaped table of the bench example: the attention of every layer of a
//! Qwen2.5-0.5B-shaped model (24 layers, D 896, 14 query heads and 2 key/value heads of 64,
//! RoPE with theta 1e6), a prefill of 512 tokens then 128 decoding steps through all 24 layers
//! (attention only: each layer's output is the next one's input), with the layers' work on one
//! shared `ThreadPool` or on a pool of each layer's own, and once more on one pool without
//! RoPE, which bounds what the rotation costs (angles computed per position as the rows need
//! them: a table could save at most that difference); then, for each pair of the bench's
//! `--weight-formats` and `--kv-formats` other than `f32`/`f32`, once more on one pool with
//! RoPE, the weights and caches in those formats.
//!
//! Columns: the threads per call, who owns the workers, whether the layers rotate, the weight
//! and cache formats, prefill tokens per second, ms per decoded token (all 24 layers), the
//! threads of the process after the run (Linux), and the bytes of the weight matrices
//! (`Layer::weight_bytes`; the widths fill whole panels and there are no biases, so the layers
//! hold exactly these), of the 24 caches and of the rotary state (the layers' inverse
//! frequencies: no table).

use std::time::Instant;

use mha::{
    AttendOptions, KvCache, KvFormat, Matrix, Mha, MhaParams, Output, Rope, RopeLayout,
    RopeScaling, ThreadPool, Tokens, WeightFormat,
};

use super::cli::process_threads;
use super::split_mix::SplitMix;

pub(super) const LAYERS: usize = 24;
pub(super) const D: usize = 896;
pub(super) const HEADS: usize = 14;
pub(super) const HEAD_DIM: usize = 64;
/// Two key/value heads of 64.
pub(super) const KV: usize = 2 * HEAD_DIM;
const PREFILL: usize = 512;
const DECODE: usize = 128;

pub(super) type Layer = Mha<D, D, KV, D>;

/// Random weights with variance about `1 / fan-in`.
pub(super) fn params(rng: &mut SplitMix) -> MhaParams<D, D, KV, D> {
    let scale = (3.0 / D as f32).sqrt();
    let mut m = || rng.uniform() * scale;
    MhaParams::from_parts(
        Matrix::from_fn(|_, _| m()),
        Matrix::from_fn(|_, _| m()),
        Matrix::from_fn(|_, _| m()),
        Matrix::from_fn(|_, _| m()),
    )
}

/// How one row's layers run: on a shared pool or each on its own, with or without RoPE, in
/// which weight and cache formats.
#[derive(Clone, Copy)]
pub(super) struct Setup {
    pub shared: bool,
    pub rotate: bool,
    pub weights: WeightFormat,
    pub cache: KvFormat,
}

/// The 24 layers on `threads` threads as `setup` says (sharing `pool` when given).
pub(super) fn layers(
    all: &[MhaParams<D, D, KV, D>],
    threads: usize,
    pool: Option<&ThreadPool>,
    setup: Setup,
) -> Vec<Layer> {
    let rope = Rope {
        theta: 1_000_000.0,
        rotary_dim: HEAD_DIM,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    };
    all.iter()
        .map(|params| {
            let builder = Mha::builder(params, HEADS)
                .threads(threads)
                .weight_format(setup.weights)
                .kv_format(setup.cache);
            let builder = if setup.rotate {
                builder.rope(rope)
            } else {
                builder
            };
            match pool {
                Some(pool) => builder.thread_pool(pool),
                None => builder,
            }
            .build()
            .expect("a valid layer")
        })
        .collect()
}

/// One call of `tokens` new tokens through every layer, each decoding into its cache.
fn through_all(layers: &mut [Layer], caches: &mut [KvCache], x: &[f32], tokens: usize) -> Vec<f32> {
    let mut h = x.to_vec();
    let mut out = vec![0.0; tokens * D];
    for (layer, cache) in layers.iter_mut().zip(caches.iter_mut()) {
        let input = Tokens::new(&h, 1, tokens, D).expect("whole tokens");
        let output = Output::new(&mut out, 1, tokens, D).expect("whole tokens");
        layer
            .decode_into(input, cache, AttendOptions::default(), output)
            .expect("the cache has room");
        std::mem::swap(&mut h, &mut out);
    }
    h
}

/// Prints the model-shaped table for each thread count; `formats` are the (weights, cache)
/// pairs of the extra rows.
pub fn run_model(threads: &[usize], formats: &[(WeightFormat, KvFormat)]) {
    println!(
        "\nmodel: Qwen2.5-0.5B-shaped attention, {LAYERS} layers (D {D}, {HEADS} heads, 2 KV heads \
         of {HEAD_DIM}, RoPE), prefill {PREFILL} tokens, then {DECODE} decoding steps"
    );
    println!(
        "{:>3} {:>10} {:>5} {:>10} {:>13} {:>12} {:>8} {:>11} {:>10} {:>9}",
        "thr",
        "workers",
        "RoPE",
        "formats",
        "prefill tok/s",
        "ms / token",
        "threads",
        "weights MB",
        "caches MB",
        "RoPE B"
    );
    let mut rng = SplitMix(2026);
    let all: Vec<_> = (0..LAYERS).map(|_| params(&mut rng)).collect();
    let prompt: Vec<f32> = (0..PREFILL * D).map(|_| rng.uniform()).collect();
    let steps: Vec<f32> = (0..DECODE * D).map(|_| rng.uniform()).collect();
    let f32_setup = |shared, rotate| Setup {
        shared,
        rotate,
        weights: WeightFormat::F32,
        cache: KvFormat::F32,
    };
    let reduced = formats
        .iter()
        .filter(|&&pair| pair != (WeightFormat::F32, KvFormat::F32))
        .map(|&(weights, cache)| Setup {
            weights,
            cache,
            ..f32_setup(true, true)
        });
    let setups: Vec<Setup> = [
        f32_setup(true, true),
        f32_setup(false, true),
        f32_setup(true, false),
    ]
    .into_iter()
    .chain(reduced)
    .collect();
    for &n in threads {
        for &setup in &setups {
            run_row(&all, n, setup, (&prompt, &steps));
        }
    }
}

/// One row of the table: prefill `prompt`, then decode `steps` one token at a time.
fn run_row(
    all: &[MhaParams<D, D, KV, D>],
    n: usize,
    setup: Setup,
    (prompt, steps): (&[f32], &[f32]),
) {
    let pool = setup.shared.then(|| ThreadPool::new(n));
    let mut layers = layers(all, n, pool.as_ref(), setup);
    let mut caches: Vec<KvCache> = layers
        .iter()
        .map(|l| l.new_cache(1, PREFILL + DECODE).expect("a cache"))
        .collect();
    let start = Instant::now();
    through_all(&mut layers, &mut caches, prompt, PREFILL);
    let prefill = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for step in steps.chunks_exact(D) {
        through_all(&mut layers, &mut caches, step, 1);
    }
    let decode = start.elapsed().as_secs_f64() / DECODE as f64;
    let weights: usize = layers.iter().map(|l| l.weight_bytes()).sum();
    let cache_bytes: usize = caches.iter().map(KvCache::bytes).sum();
    let rope_bytes = usize::from(setup.rotate) * LAYERS * HEAD_DIM / 2 * size_of::<f64>();
    let formats = format!("{}/{}", setup.weights.name(), setup.cache.name());
    println!(
        "{n:>3} {:>10} {:>5} {formats:>10} {:>13.0} {:>12.3} {:>8} {:>11.1} {:>10.1} {:>9}",
        if setup.shared {
            "one pool"
        } else {
            "per layer"
        },
        if setup.rotate { "yes" } else { "no" },
        PREFILL as f64 / prefill,
        decode * 1e3,
        process_threads().map_or("?".into(), |t| t.to_string()),
        weights as f64 / 1e6,
        cache_bytes as f64 / 1e6,
        rope_bytes,
    );
}
