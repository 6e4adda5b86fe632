//! Criterion benchmarks of `gemm` on the crate's projection shapes `(M, K, N)`, per supported
//! instruction set, at 1 thread, with throughput in FLOPs (`2·M·K·N`). `B` is packed once,
//! outside the timed loop, as the layer does with its weights.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mha::kernels::{gemm, Isa, PackedB};

/// `(M, K, N)`: QKV and output projections of GPT-2 (T = 1024, D = 768), of D = 512 at
/// T = 2048 and 4096 (QKV), and of a small layer (T = 128, D = 256, QKV).
const SHAPES: [(usize, usize, usize); 5] = [
    (1024, 768, 2304),
    (1024, 768, 768),
    (2048, 512, 1536),
    (4096, 512, 1536),
    (128, 256, 768),
];

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let z = (i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let z = (z ^ (z >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

fn projections(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (m, k, n) in SHAPES {
        let a = values(m * k, 1);
        let b = values(k * n, 2);
        let mut out = vec![0.0; m * n];
        group.throughput(Throughput::Elements((2 * m * k * n) as u64));
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let packed = PackedB::from_row_major(isa, &b, k, n).expect("valid B");
            let id = BenchmarkId::new(isa.name(), format!("{m}x{k}x{n}"));
            group.bench_function(id, |bench| {
                bench.iter(|| gemm(&a, m, &packed, &mut out, 1).expect("valid shapes"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, projections);
criterion_main!(benches);
