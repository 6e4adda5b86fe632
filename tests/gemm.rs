//! `gemm` against a plain f64 triple loop for every supported instruction set, on shapes that
//! leave partial microtiles in both directions and cross the `KC` reduction block, and
//! bit-identity of the result across thread counts.

mod common;
use common::Rng;
use mha::kernels::{gemm, Isa, PackedB};

/// Sizes around the microtile heights and widths (portable 4 × 8, AVX2 6 × 16, AVX-512
/// 12 × 32) and the reduction block (256).
const SIZES: [usize; 20] = [
    1, 2, 3, 7, 8, 9, 12, 13, 15, 16, 17, 24, 25, 31, 33, 63, 65, 100, 257, 300,
];

fn supported() -> impl Iterator<Item = Isa> {
    Isa::ALL.into_iter().filter(|isa| isa.is_supported())
}

/// Checks `gemm` for `(m, k) · (k, n)` on every supported instruction set.
///
/// Tolerance: each element is a chain of `k` rounded multiply-adds, whose error is at most
/// `k · 2^-24 · Σ_p |a_ip · b_pj|` (to first order); we allow `k · 2^-23` times that sum, twice
/// the bound, plus `1e-30` for sums that are zero.
fn check(m: usize, k: usize, n: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let a = rng.vec(m * k, 1.0);
    let b = rng.vec(k * n, 1.0);
    let mut want = vec![0.0f64; m * n];
    let mut bound = vec![0.0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = f64::from(a[i * k + p]);
            for j in 0..n {
                let y = f64::from(b[p * n + j]);
                want[i * n + j] += x * y;
                bound[i * n + j] += (x * y).abs();
            }
        }
    }
    let scale = k as f64 * f64::from(f32::EPSILON);
    for isa in supported() {
        let packed = PackedB::from_row_major(isa, &b, k, n).unwrap();
        assert_eq!((packed.rows(), packed.cols(), packed.isa()), (k, n, isa));
        let mut c = vec![f32::NAN; m * n];
        gemm(&a, m, &packed, &mut c, 1).unwrap();
        for (idx, ((&got, &want), &bound)) in c.iter().zip(&want).zip(&bound).enumerate() {
            let err = (f64::from(got) - want).abs();
            assert!(
                err <= scale * bound + 1e-30,
                "{isa:?} m {m} k {k} n {n}: C[{}, {}] = {got}, want {want} (error {err:e}, \
                 allowed {:e})",
                idx / n,
                idx % n,
                scale * bound + 1e-30,
            );
        }
    }
}

#[test]
fn odd_shapes_match_f64_reference() {
    // Every (m, n) pair; k cycles through all sizes, so each k meets many (m, n).
    for (im, &m) in SIZES.iter().enumerate() {
        for (jn, &n) in SIZES.iter().enumerate() {
            let k = SIZES[(im + 3 * jn) % SIZES.len()];
            check(m, k, n, (m * 1000 + n) as u64);
        }
    }
}

#[test]
fn long_reductions_cross_the_kc_block() {
    for k in [255, 256, 257, 300, 512, 513, 700] {
        for (m, n) in [(1, 1), (15, 33), (29, 65), (100, 17)] {
            check(m, k, n, k as u64);
        }
    }
}

#[test]
fn degenerate_shapes() {
    for isa in supported() {
        // k = 0: C is all zeros.
        let packed = PackedB::from_row_major(isa, &[], 0, 3).unwrap();
        let mut c = [f32::NAN; 6];
        gemm(&[], 2, &packed, &mut c, 1).unwrap();
        assert_eq!(c, [0.0; 6]);
        // m = 0 and n = 0: nothing to do.
        let packed = PackedB::from_row_major(isa, &[1.0, 2.0], 2, 1).unwrap();
        gemm(&[], 0, &packed, &mut [], 1).unwrap();
        let packed = PackedB::from_row_major(isa, &[], 2, 0).unwrap();
        gemm(&[1.0, 2.0], 1, &packed, &mut [], 1).unwrap();
        // Wrong lengths are errors.
        let packed = PackedB::from_row_major(isa, &[1.0, 2.0], 2, 1).unwrap();
        assert!(gemm(&[1.0], 1, &packed, &mut [0.0], 1).is_err());
        assert!(gemm(&[1.0, 2.0], 1, &packed, &mut [0.0; 2], 1).is_err());
        assert!(PackedB::from_row_major(isa, &[1.0], 2, 1).is_err());
    }
}

#[test]
fn bit_identical_for_any_thread_count() {
    for (m, k, n) in [
        (300, 257, 100),
        (257, 65, 300),
        (100, 513, 33),
        (1000, 40, 70),
        // Fewer row panels than threads: some threads get no rows, some blocks one short row.
        (13, 40, 70),
        (5, 33, 17),
        // A few rows are cut into column blocks instead.
        (1, 70, 100),
        (1, 9, 3),
    ] {
        let mut rng = Rng::new((m + k + n) as u64);
        let a = rng.vec(m * k, 1.0);
        let b = rng.vec(k * n, 1.0);
        for isa in supported() {
            let packed = PackedB::from_row_major(isa, &b, k, n).unwrap();
            let run = |threads| {
                let mut c = vec![0.0; m * n];
                gemm(&a, m, &packed, &mut c, threads).unwrap();
                c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            let one = run(1);
            for threads in [2, 3, 5] {
                assert!(
                    one == run(threads),
                    "{isa:?} m {m} k {k} n {n}: threads {threads} differs from 1"
                );
            }
        }
    }
}

/// Values with NaNs of both signs and several payloads, infinities and zeros among them (so
/// that `inf · 0` makes NaNs too), about one in five.
fn with_specials(rng: &mut Rng, n: usize) -> Vec<f32> {
    const SPECIALS: [u32; 8] = [
        0x7fc0_0000, // f32::NAN
        0xffc0_0000, // the x86 default NaN
        0x7fc1_2345,
        0xff80_0001, // signalling, negative
        0x7f80_0000, // +inf
        0xff80_0000, // -inf
        0x0000_0000,
        0x8000_0000,
    ];
    (0..n)
        .map(|_| {
            let r = rng.next_u64();
            if r.is_multiple_of(5) {
                f32::from_bits(SPECIALS[(r >> 8) as usize % SPECIALS.len()])
            } else {
                rng.uniform()
            }
        })
        .collect()
}

/// A row's bits, NaN payloads included, do not depend on which path computed it: the tile
/// (in a block of many rows), `gemv_panels` (a row alone, or the last short block of a
/// thread), any thread count. Every NaN that comes out is the canonical `f32::NAN`.
#[test]
fn nan_payloads_agree_across_paths_and_threads() {
    for isa in supported() {
        for (m, k, n) in [(13, 40, 70), (25, 300, 33), (7, 5, 17), (3, 257, 100)] {
            let mut rng = Rng::new((m * k + n) as u64);
            let a = with_specials(&mut rng, m * k);
            let b = with_specials(&mut rng, k * n);
            let packed = PackedB::from_row_major(isa, &b, k, n).unwrap();
            let run = |a: &[f32], rows: usize, threads: usize| {
                let mut c = vec![0.0; rows * n];
                gemm(a, rows, &packed, &mut c, threads).unwrap();
                c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            let all = run(&a, m, 1);
            assert!(
                all.iter().any(|&x| f32::from_bits(x).is_nan()),
                "the inputs make NaNs"
            );
            for &x in &all {
                assert!(
                    !f32::from_bits(x).is_nan() || x == f32::NAN.to_bits(),
                    "{isa:?} m {m} k {k} n {n}: NaN {x:#010x} is not canonical"
                );
            }
            for threads in [2, 3, 5] {
                assert!(
                    all == run(&a, m, threads),
                    "{isa:?} m {m} k {k} n {n}: {threads} threads differ from 1"
                );
            }
            for i in 0..m {
                let row = run(&a[i * k..][..k], 1, 1);
                assert_eq!(
                    row,
                    all[i * n..][..n],
                    "{isa:?} m {m} k {k} n {n}: row {i} alone differs"
                );
            }
        }
    }
}
