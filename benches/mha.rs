//! Criterion benchmarks of the forward pass on the benchmark shapes, through the reusable
//! layer (`Mha::forward_into`), at 1 thread and at every CPU, with throughput in useful FLOPs
//! (`8·B·T·D² + 2·B·D·T·(T+1)`).
//!
//! The attention modes (`modes`): a KV-cache decode step (1 new token over a cache of 1024 and
//! 4096 tokens, D = 768, H = 12, with 12 and 4 key/value heads; throughput in bytes of cached K
//! and V read per step, `B·S·KV·2·4`) and a padded encoder batch (B = 8, T = 128, D = 384,
//! H = 12, bidirectional, key lengths 64 of 128; throughput in useful FLOPs
//! `8·B·T·D² + 4·B·T·64·D`).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mha::{AttendOptions, KvCache, Masking, Matrix, Mha, MhaParams, Tensor};

/// Deterministic pseudo-random values in [-1, 1).
fn value(seed: usize) -> f32 {
    let z = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let z = (z ^ (z >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
}

fn bench_shape<const B: usize, const T: usize, const D: usize>(
    c: &mut Criterion,
    name: &str,
    heads: usize,
) {
    let x = Tensor::<B, T, D>::from_fn(|b, t, i| value((b * T + t) * D + i));
    let scale = (3.0 / D as f32).sqrt();
    let w = |k: usize| Matrix::<D, D>::from_fn(|r, c| value(k * D * D + r * D + c + 1) * scale);
    let params = MhaParams::new(w(1), w(2), w(3), w(4));
    let flops = 8 * B * T * D * D + 2 * B * D * T * (T + 1);
    let mut group = c.benchmark_group("mha_forward");
    group.throughput(Throughput::Elements(flops as u64));
    if flops > 1_000_000_000 {
        group.sample_size(10);
    }
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, all] {
        let mut layer = Mha::builder(&params, heads)
            .threads(threads)
            .build()
            .expect("valid heads");
        let mut out = Tensor::<B, T, D>::zeros();
        group.bench_function(BenchmarkId::new(name, format!("{threads}thr")), |bench| {
            bench.iter(|| {
                layer
                    .forward_into(&x, AttendOptions::default(), &mut out)
                    .expect("matching shapes")
            })
        });
        if all == 1 {
            break;
        }
    }
    group.finish();
}

fn shapes(c: &mut Criterion) {
    println!("kernels: {}", mha::Isa::detect().name());
    bench_shape::<1, 2, 4>(c, "tiny", 2);
    bench_shape::<1, 128, 256>(c, "small", 4);
    bench_shape::<1, 1024, 768>(c, "gpt2", 12);
    bench_shape::<8, 256, 512>(c, "batch", 8);
    bench_shape::<1, 4096, 512>(c, "long", 8);
}

/// Decode steps timed between cache resets: the cache holds `S .. S + STEPS_PER_FILL` tokens
/// during the timed steps (under 1% more than `S`).
const STEPS_PER_FILL: usize = 8;

/// One decode step over a cache of `S` tokens, D = 768, H = 12, `KV / 64` key/value heads.
fn bench_decode<const S: usize, const KV: usize>(c: &mut Criterion) {
    const D: usize = 768;
    let scale = (3.0 / D as f32).sqrt();
    let w = |k: usize| Matrix::<D, D>::from_fn(|r, c| value(k * D * D + r * D + c + 1) * scale);
    let kv = |k: usize| Matrix::<D, KV>::from_fn(|r, c| value(k * D * D + r * KV + c + 1) * scale);
    let params = MhaParams::from_parts(w(1), kv(2), kv(3), w(4));
    let prefix = Tensor::<1, S, D>::from_fn(|_, t, i| value(t * D + i + 7));
    let token = Tensor::<1, 1, D>::from_fn(|_, _, i| value(i + 11));
    let bytes = S * KV * 2 * 4;
    let mut group = c.benchmark_group("mha_decode");
    group.throughput(Throughput::Bytes(bytes as u64));
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, all] {
        let mut layer = Mha::builder(&params, 12)
            .threads(threads)
            .build()
            .expect("valid heads");
        let mut filled: KvCache = layer.new_cache(1, S + STEPS_PER_FILL).expect("cache fits");
        let mut out = Tensor::<1, S, D>::zeros();
        layer
            .decode_into(&prefix, &mut filled, AttendOptions::default(), &mut out)
            .expect("prefix fits");
        let mut cache = filled.clone();
        let mut step_out = Tensor::<1, 1, D>::zeros();
        let id = BenchmarkId::new(format!("S{S}_kv{}", KV / 64), format!("{threads}thr"));
        group.bench_function(id, |bench| {
            bench.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    if cache.len() == cache.capacity() {
                        cache.clone_from(&filled); // not timed
                    }
                    let start = Instant::now();
                    layer
                        .decode_into(&token, &mut cache, AttendOptions::default(), &mut step_out)
                        .expect("room in the cache");
                    total += start.elapsed();
                }
                total
            })
        });
        if all == 1 {
            break;
        }
    }
    group.finish();
}

/// A padded encoder batch: B = 8, T = 128, D = 384, H = 12, bidirectional, 64 real tokens each.
fn bench_padded_encoder(c: &mut Criterion) {
    const B: usize = 8;
    const T: usize = 128;
    const D: usize = 384;
    const VALID: usize = 64;
    let x = Tensor::<B, T, D>::from_fn(|b, t, i| value((b * T + t) * D + i));
    let scale = (3.0 / D as f32).sqrt();
    let w = |k: usize| Matrix::<D, D>::from_fn(|r, c| value(k * D * D + r * D + c + 1) * scale);
    let params = MhaParams::new(w(1), w(2), w(3), w(4));
    let lengths = [VALID; B];
    let flops = 8 * B * T * D * D + 4 * B * T * VALID * D;
    let mut group = c.benchmark_group("mha_padded_encoder");
    group.throughput(Throughput::Elements(flops as u64));
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, all] {
        let mut layer = Mha::builder(&params, 12)
            .masking(Masking::Bidirectional)
            .threads(threads)
            .build()
            .expect("valid heads");
        let mut out = Tensor::<B, T, D>::zeros();
        let id = BenchmarkId::new("B8_T128_D384_len64", format!("{threads}thr"));
        group.bench_function(id, |bench| {
            bench.iter(|| {
                let options = AttendOptions {
                    key_lengths: Some(&lengths),
                    ..AttendOptions::default()
                };
                layer
                    .forward_into(&x, options, &mut out)
                    .expect("valid lengths")
            })
        });
        if all == 1 {
            break;
        }
    }
    group.finish();
}

fn modes(c: &mut Criterion) {
    bench_decode::<1024, 768>(c);
    bench_decode::<1024, 256>(c);
    bench_decode::<4096, 768>(c);
    bench_decode::<4096, 256>(c);
    bench_padded_encoder(c);
}

criterion_group!(benches, shapes, modes);
criterion_main!(benches);
