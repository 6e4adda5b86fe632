//! The model-shaped table of the bench example: the attention of every layer of a
//! Qwen2.5-0.5B-shaped model (24 layers, D 896, 14 query heads and 2 key/value heads of 64,
//! RoPE with theta 1e6), a prefill of 512 tokens then 128 decoding steps through all 24 layers
//! (attention only: each layer's output is the next one's input), with the layers' work on one
//! shared `ThreadPool` or on a pool of each layer's own, and once more on one pool without
//! RoPE, which bounds what the rotation costs (angles computed per position as the rows need
//! them: a table could save at most that difference).
//!
//! Columns: the threads per call, who owns the workers, whether the layers rotate, prefill tokens per second, ms per
//! decoded token (all 24 layers), the threads of the process after the run (Linux), and the
//! bytes of the weights (as `f32`), of the 24 caches and of the rotary state (the layers'
//! inverse frequencies: no table).

use std::time::Instant;

use mha::{
    AttendOptions, KvCache, Matrix, Mha, MhaParams, Output, Rope, RopeLayout, RopeScaling,
    ThreadPool, Tokens,
};

use super::split_mix::SplitMix;

const LAYERS: usize = 24;
const D: usize = 896;
const HEADS: usize = 14;
const HEAD_DIM: usize = 64;
/// Two key/value heads of 64.
const KV: usize = 2 * HEAD_DIM;
const PREFILL: usize = 512;
const DECODE: usize = 128;

type Layer = Mha<D, D, KV, D>;

/// Random weights with variance about `1 / fan-in`.
fn params(rng: &mut SplitMix) -> MhaParams<D, D, KV, D> {
    let scale = (3.0 / D as f32).sqrt();
    let mut m = || rng.uniform() * scale;
    MhaParams::from_parts(
        Matrix::from_fn(|_, _| m()),
        Matrix::from_fn(|_, _| m()),
        Matrix::from_fn(|_, _| m()),
        Matrix::from_fn(|_, _| m()),
    )
}

/// The threads of this process (`/proc/self/task`), if readable.
fn process_threads() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/task").ok()?.count())
}

/// The 24 layers on `threads` threads, sharing `pool` when given, with RoPE when `rotate`.
fn layers(
    all: &[MhaParams<D, D, KV, D>],
    threads: usize,
    pool: Option<&ThreadPool>,
    rotate: bool,
) -> Vec<Layer> {
    let rope = Rope {
        theta: 1_000_000.0,
        rotary_dim: HEAD_DIM,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    };
    all.iter()
        .map(|params| {
            let builder = Mha::builder(params, HEADS).threads(threads);
            let builder = if rotate { builder.rope(rope) } else { builder };
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

/// Prints the model-shaped table for each thread count.
pub fn run_model(threads: &[usize]) {
    println!(
        "\nmodel: Qwen2.5-0.5B-shaped attention, {LAYERS} layers (D {D}, {HEADS} heads, 2 KV heads \
         of {HEAD_DIM}, RoPE), prefill {PREFILL} tokens, then {DECODE} decoding steps"
    );
    println!(
        "{:>3} {:>10} {:>5} {:>13} {:>12} {:>8} {:>11} {:>10} {:>9}",
        "thr",
        "workers",
        "RoPE",
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
    for &n in threads {
        for (shared, rotate) in [(true, true), (false, true), (true, false)] {
            let pool = shared.then(|| ThreadPool::new(n));
            let mut layers = layers(&all, n, pool.as_ref(), rotate);
            let mut caches: Vec<KvCache> = layers
                .iter()
                .map(|l| l.new_cache(1, PREFILL + DECODE).expect("a cache"))
                .collect();
            let start = Instant::now();
            through_all(&mut layers, &mut caches, &prompt, PREFILL);
            let prefill = start.elapsed().as_secs_f64();
            let start = Instant::now();
            for step in steps.chunks_exact(D) {
                through_all(&mut layers, &mut caches, step, 1);
            }
            let decode = start.elapsed().as_secs_f64() / DECODE as f64;
            let weights = LAYERS * (2 * D * D + 2 * D * KV) * size_of::<f32>();
            let cache_bytes: usize = caches.iter().map(KvCache::bytes).sum();
            let rope_bytes = usize::from(rotate) * LAYERS * HEAD_DIM / 2 * size_of::<f64>();
            println!(
                "{n:>3} {:>10} {:>5} {:>13.0} {:>12.3} {:>8} {:>11.1} {:>10.1} {:>9}",
                if shared { "one pool" } else { "per layer" },
                if rotate { "yes" } else { "no" },
                PREFILL as f64 / prefill,
                decode * 1e3,
                process_threads().map_or("?".into(), |t| t.to_string()),
                weights as f64 / 1e6,
                cache_bytes as f64 / 1e6,
                rope_bytes,
            );
        }
    }
}
