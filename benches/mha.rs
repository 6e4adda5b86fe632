//! Criterion benchmarks of the forward pass on the benchmark shapes, through the reusable
//! layer (`Mha::forward_into`), at 1 thread and at every CPU, with throughput in useful FLOPs
//! (`8·B·T·D² + 2·B·D·T·(T+1)`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mha::{Matrix, Mha, MhaParams, Tensor};

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
        let mut layer = Mha::new(&params, heads)
            .expect("valid heads")
            .with_threads(threads);
        let mut out = Tensor::zeros();
        group.bench_function(BenchmarkId::new(name, format!("{threads}thr")), |bench| {
            bench.iter(|| layer.forward_into(&x, &mut out))
        });
        if all == 1 {
            break;
        }
    }
    group.finish();
}

fn shapes(c: &mut Criterion) {
    bench_shape::<1, 2, 4>(c, "tiny", 2);
    bench_shape::<1, 128, 256>(c, "small", 4);
    bench_shape::<1, 1024, 768>(c, "gpt2", 12);
    bench_shape::<8, 256, 512>(c, "batch", 8);
    bench_shape::<1, 4096, 512>(c, "long", 8);
}

criterion_group!(benches, shapes);
criterion_main!(benches);
