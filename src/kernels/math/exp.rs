//! The crate's own `exp`: `f32::exp` needs `std`, and a softmax needs millions of them.
//!
//! One algorithm over the primitives of `Simd`, so every instruction set computes it the
//! same way: [`exp`] (scalar, on the portable primitives with one lane, branch-free so that
//! LLVM vectorises a loop of it for the build's baseline target) and `exp_vector` for the
//! kernel tables.
//!
//! 1. **Clamp** `x` to `[-104, 89]`, letting NaN through. Below `ln 2^-150 ≈ -103.972` the result
//!    rounds to 0, above `ln(f32::MAX) ≈ 88.7228` to `+inf`, and the clamped arguments still
//!    produce exactly those, so `±inf` and the overflow/underflow cases need no special path.
//! 2. **Reduce**: `n = round(x · log2 e)` (to nearest, ties to even, of the rounded product;
//!    the same `n` on every path) and `r = x - n·ln2` with a Cody–Waite split
//!    `ln2 = LN2_HI + LN2_LO`. `LN2_HI` has 16 significant bits and `|n| ≤ 150`, so `n·LN2_HI`
//!    and `x - n·LN2_HI` are exact; only the `LN2_LO` step rounds. `|r| ≤ 0.34660`.
//! 3. **Approximate** `e^r ≈ 1 + r + r²·q(r)`, `q` of degree 4 (degree 6 in all). The
//!    coefficients were derived for this crate with a Remez exchange minimising the *relative*
//!    error of `e^r` on `[-0.34660, 0.34660]`, then rounded to `f32`: the approximation error is
//!    below `3.8e-9` (0.06 ulp), so the result's error is dominated by the `f32` rounding of
//!    `r` and of the last two operations.
//! 4. **Scale** by `2^n` exactly, rounding once (`Simd::scale`): as `(e^r · 2^n1) · 2^n2`
//!    with `n1 = n >> 1`, `n2 = n - n1` (both in `[-75, 64]`, so `2^n1` and `2^n2` are normal
//!    floats built from exponent bits; the first product is exact, the second rounds once,
//!    which makes subnormal results correctly rounded from `e^r` and lets `n = 128` overflow
//!    to `+inf` cleanly), or one `vscalefps` on AVX-512.
//!
//! Accuracy, measured against `f64::exp` rounded to `f32` (`tests/exp.rs`, and exhaustively over
//! all `2^32` inputs with `cargo test --release -- --ignored exhaustive`): at most 1 ulp on every
//! path, subnormal results included. `exp(-inf) = 0`, `exp(+inf) = +inf`, `exp(NaN) = NaN`.
//!
//! The portable primitives cannot fuse multiply and add (`f32::mul_add` needs `std`), the
//! vector ones do; so the scalar and vector results may differ in the last bit. The vector
//! tables agree bit for bit.

use crate::kernels::simd::portable::Lanes;
use crate::kernels::simd::Simd;

/// `log2(e)`, rounded to `f32`.
const LOG2_E: f32 = core::f32::consts::LOG2_E;
/// `ln 2` to 16 significant bits (`0x3f317200`): `n · LN2_HI` is exact for `|n| < 256`.
const LN2_HI: f32 = 0.693_145_75;
/// `ln 2 - LN2_HI`, rounded to `f32` (`0x35bfbe8e`).
const LN2_LO: f32 = 1.428_606_8e-6;
/// Coefficients of `q(r) = C2 + C3 r + C4 r² + C5 r³ + C6 r⁴` (Remez, relative error, see the
/// module documentation).
const C2: f32 = 4.999_999_4e-1;
/// See [`C2`].
const C3: f32 = 1.666_652_1e-1;
/// See [`C2`].
const C4: f32 = 4.166_839e-2;
/// See [`C2`].
const C5: f32 = 8.368_716e-3;
/// See [`C2`].
const C6: f32 = 1.381_460_2e-3;
/// Arguments are clamped to `[X_MIN, X_MAX]`: `exp(X_MIN)` rounds to 0, `exp(X_MAX)` to `+inf`.
const X_MIN: f32 = -104.0;
/// See [`X_MIN`].
const X_MAX: f32 = 89.0;

/// `e^x` for `f32`, within 1 ulp of the correctly rounded result wherever that is finite and
/// nonzero (subnormal results included).
///
/// `exp(-inf) = 0`, `exp(+inf) = +inf`, `exp(NaN) = NaN`; results that overflow are `+inf`,
/// results below half the smallest subnormal are `0`. Branch-free, so a loop of it over a slice
/// vectorises. Needs no `std`.
///
/// ```
/// use mha::kernels::exp::exp;
/// assert_eq!(exp(0.0), 1.0);
/// assert_eq!(exp(1.0), core::f32::consts::E);
/// assert_eq!(exp(f32::NEG_INFINITY), 0.0);
/// assert_eq!(exp(f32::INFINITY), f32::INFINITY);
/// assert_eq!(exp(100.0), f32::INFINITY);
/// assert!(exp(f32::NAN).is_nan());
/// assert_eq!(exp(-103.0), f32::from_bits(1)); // the smallest subnormal: e^-103 ≈ 1.32 · 2^-149
/// ```
#[inline]
pub fn exp(x: f32) -> f32 {
    exp_vector(Lanes, [x])[0]
}

/// [`exp`] of every lane.
#[inline(always)]
pub(crate) fn exp_vector<S: Simd>(s: S, x: S::V) -> S::V {
    // NaN passes the clamp (and stays NaN to the end).
    let x = s.clamp(x, s.splat(X_MIN), s.splat(X_MAX));
    let (n, e_r) = reduce(s, x);
    s.scale(e_r, n)
}

/// Steps 2 and 3 of [`exp`] for a clamped `x`: `n = round(x · log2 e)` and `e^r` for
/// `r = x - n·ln2`.
#[inline(always)]
fn reduce<S: Simd>(s: S, x: S::V) -> (S::V, S::V) {
    let n = s.round(s.mul(x, s.splat(LOG2_E)));
    let r = s.neg_mul_add(n, s.splat(LN2_HI), x);
    let r = s.neg_mul_add(n, s.splat(LN2_LO), r);
    let q = s.mul_add(s.splat(C6), r, s.splat(C5));
    let q = s.mul_add(q, r, s.splat(C4));
    let q = s.mul_add(q, r, s.splat(C3));
    let q = s.mul_add(q, r, s.splat(C2));
    let t = s.mul_add(s.mul(r, r), q, r);
    (n, s.add(s.splat(1.0), t))
}

/// The smallest argument whose `exp` is a normal float (`exp(-87.33) ≈ 1.1756e-38`).
pub(crate) const SMALLEST_NORMAL_ARG: f32 = -87.33;

/// `exp` for softmax probabilities, `x ≤ 0` or NaN (a score minus the running maximum).
///
/// With [`Simd::FLUSHES_TINY_PROBABILITIES`] (the vector tables): [`exp_vector`], except that
/// arguments below [`SMALLEST_NORMAL_ARG`] (masked scores are `-inf`) give exactly 0 without
/// computing subnormal intermediates, which cost microcode assists on some CPUs. A
/// probability that small cannot change a softmax sum, which is at least 1. On
/// `[SMALLEST_NORMAL_ARG, 0]` the clamps are no-ops, `n` lies in `[-126, 0]` and the result
/// is a normal float, so [`Simd::scale_normal`] gives the bits of [`Simd::scale`]. Without
/// it (the portable table): [`exp_vector`] itself.
#[inline(always)]
pub(crate) fn probability<S: Simd>(s: S, x: S::V) -> S::V {
    if !S::FLUSHES_TINY_PROBABILITIES {
        return exp_vector(s, x);
    }
    let floor = s.splat(SMALLEST_NORMAL_ARG);
    let tiny = s.lt(x, floor);
    // `max` passes a NaN `x` on (and makes `e_r` NaN, whatever the scaling of that lane).
    let (n, e_r) = reduce(s, s.max(floor, x));
    s.zero_where(tiny, s.scale_normal(e_r, n))
}

/// `f` of every value in place, `LANES` at a time, the tail through its first lanes.
#[cfg(all(test, feature = "std"))]
#[inline(always)]
fn in_place<S: Simd>(s: S, values: &mut [f32], f: impl Fn(S::V) -> S::V) {
    for chunk in values.chunks_mut(S::LANES) {
        let (n, ptr) = (chunk.len(), chunk.as_mut_ptr());
        // SAFETY: `chunk` holds n ≤ LANES values.
        unsafe { s.store_first(ptr, n, f(s.load_first(ptr, n))) };
    }
}

/// [`exp_vector`] of every value in place.
#[cfg(all(test, feature = "std"))]
#[inline(always)]
pub(crate) fn exp_in_place<S: Simd>(s: S, values: &mut [f32]) {
    in_place(s, values, |x| exp_vector(s, x));
}

/// [`probability`] of every value in place.
#[cfg(all(test, feature = "std"))]
#[inline(always)]
pub(crate) fn probability_in_place<S: Simd>(s: S, values: &mut [f32]) {
    in_place(s, values, |x| probability(s, x));
}

#[cfg(all(test, feature = "std"))]
mod tests {
    //! Every table's `exp` over the same sweep as `tests/exp.rs` (which covers the public
    //! scalar [`exp`]); same reference, `f64::exp` rounded to `f32`.
    use super::*;
    use crate::kernels::math::ulp::{bit_range, ordinal, SPECIAL};
    use crate::kernels::Isa;
    use alloc::vec::Vec;
    use std::println;

    /// A table's in-place `exp` or probability `exp`.
    type InPlace = unsafe fn(&mut [f32]);

    /// The tables this CPU runs: name, in-place `exp`, in-place probability `exp`.
    fn tables() -> Vec<(&'static str, InPlace, InPlace)> {
        Isa::ALL
            .into_iter()
            .filter(|isa| isa.is_supported())
            .map(|isa| {
                let kernels = isa.kernels().unwrap();
                (isa.name(), kernels.exp, kernels.probability)
            })
            .collect()
    }

    /// `f` on a copy of `xs`.
    fn through(f: InPlace, xs: &[f32]) -> Vec<f32> {
        let mut ys = xs.to_vec();
        // SAFETY: `tables` lists supported tables only.
        unsafe { f(&mut ys) };
        ys
    }

    /// Inputs: every 61st bit pattern over `[-104, 89]`, every float in `[-104, -103]` and
    /// `[88, 89]`, `[-1, 1]` in steps of 1e-4, special values.
    fn sweep() -> Vec<f32> {
        bit_range(0, 89.0f32.to_bits(), 61)
            .chain(bit_range(0x8000_0000, (-104.0f32).to_bits(), 61))
            .chain(bit_range((-103.0f32).to_bits(), (-104.0f32).to_bits(), 1))
            .chain(bit_range(88.0f32.to_bits(), 89.0f32.to_bits(), 1))
            .chain((-10_000..=10_000).map(|i| i as f32 * 1e-4))
            .chain(SPECIAL)
            .chain([88.722_84, -103.972_08, 1e10, -1e10])
            .collect()
    }

    /// The largest ulp error of `ys` as `exp` of `xs`, and where; NaN must map to NaN.
    fn max_ulp(name: &str, xs: &[f32], ys: &[f32]) -> (u64, f32) {
        let (mut worst, mut worst_x, mut off) = (0, 0.0f32, 0usize);
        for (&x, &y) in xs.iter().zip(ys) {
            let want = f64::from(x).exp() as f32;
            if want.is_nan() {
                assert!(y.is_nan(), "{name}: exp({x:e}) = {y:e}, expected NaN");
                continue;
            }
            let ulps = ordinal(y).abs_diff(ordinal(want));
            off += usize::from(ulps > 0);
            if ulps > worst {
                (worst, worst_x) = (ulps, x);
            }
        }
        println!(
            "{name}: max error {worst} ulp (at x = {worst_x:e}) over {} inputs, {off} not \
             correctly rounded",
            xs.len()
        );
        (worst, worst_x)
    }

    #[test]
    fn scalar_sweep() {
        let xs = sweep();
        let ys: Vec<f32> = xs.iter().map(|&x| exp(x)).collect();
        let (worst, x) = max_ulp("scalar", &xs, &ys);
        assert!(worst <= 2, "{worst} ulp at {x:e}");
    }

    /// Every table within 2 ulp, the portable one with the scalar bits (the same
    /// primitives, lane by lane), partial last vectors included.
    #[test]
    fn every_table_sweep() {
        let xs = sweep();
        for (name, exp_table, _) in tables() {
            for len in [xs.len(), xs.len() - 1, 5] {
                let ys = through(exp_table, &xs[..len]);
                let (worst, x) = max_ulp(name, &xs[..len], &ys);
                assert!(worst <= 2, "{name}: {worst} ulp at {x:e}");
                if name == Isa::Portable.name() {
                    for (&x, &y) in xs.iter().zip(&ys) {
                        assert_eq!(y.to_bits(), exp(x).to_bits(), "portable exp({x:e})");
                    }
                }
            }
        }
    }

    /// The vector tables (all but the portable one) agree bit for bit.
    #[test]
    fn vector_tables_agree() {
        let xs = sweep();
        let vector: Vec<_> = tables()
            .into_iter()
            .filter(|&(name, _, _)| name != Isa::Portable.name())
            .collect();
        for pair in vector.windows(2) {
            let (a, b) = (through(pair[0].1, &xs), through(pair[1].1, &xs));
            for ((&x, &a), &b) in xs.iter().zip(&a).zip(&b) {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "exp({x:e}): {} {a:e} != {} {b:e}",
                    pair[0].0,
                    pair[1].0
                );
            }
        }
    }

    /// The probability `exp` gives each table's `exp` bits on its domain, `x ≤ 0` (every
    /// 1009th non-positive float, the floor's neighbourhood, `-0`, `-inf`, NaN), and 0 below
    /// the floor on the tables that flush.
    #[test]
    fn probability_is_exp_on_non_positive_arguments() {
        let near_floor = (SMALLEST_NORMAL_ARG.to_bits() - 4096
            ..SMALLEST_NORMAL_ARG.to_bits() + 4096)
            .map(f32::from_bits);
        let xs: Vec<f32> = (0x8000_0000u32..=0xff80_0000)
            .step_by(1009)
            .map(f32::from_bits)
            .chain(near_floor)
            .chain([-0.0, f32::NEG_INFINITY, f32::NAN, -f32::NAN])
            .collect();
        for (name, exp_table, probability_table) in tables() {
            let flushes = name != Isa::Portable.name();
            let (want, got) = (through(exp_table, &xs), through(probability_table, &xs));
            for ((&x, &want), &got) in xs.iter().zip(&want).zip(&got) {
                let want = if flushes && x < SMALLEST_NORMAL_ARG {
                    0.0
                } else {
                    want
                };
                assert!(
                    want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                    "{name}: probability exp({x:e}) {got:e} != exp {want:e}"
                );
            }
        }
    }

    /// Every `f32` through each table's `exp`.
    #[test]
    #[ignore = "exhaustive over 2^32 inputs: run with --release -- --ignored"]
    fn exhaustive_vector_paths() {
        for (name, exp_table, _) in tables() {
            let mut worst = 0;
            for hi in 0..(1u32 << 8) {
                let xs: Vec<f32> = (0..1u32 << 24)
                    .map(|lo| f32::from_bits(hi << 24 | lo))
                    .collect();
                worst = worst.max(max_ulp(name, &xs, &through(exp_table, &xs)).0);
            }
            println!("{name}, all 2^32 inputs: max error {worst} ulp");
            assert!(worst <= 2);
        }
    }

    /// Throughput of `exp` over one 64-float row, in place, per table, in ns per element.
    #[test]
    #[ignore = "timing: run with --release -- --ignored --nocapture"]
    fn timing_64_float_row() {
        use core::hint::black_box;
        const REPS: usize = 2_000_000;
        let row: [f32; 64] = core::array::from_fn(|i| (i * 37 % 64) as f32 * 0.15 - 8.0);
        let mut out = [0.0f32; 64];
        for (name, exp_table, _) in tables() {
            let ns = (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    for _ in 0..REPS {
                        out = row;
                        // SAFETY: `tables` lists supported tables only.
                        unsafe { exp_table(black_box(&mut out)) };
                    }
                    t.elapsed().as_secs_f64() * 1e9 / (REPS * 64) as f64
                })
                .fold(f64::INFINITY, f64::min);
            println!("exp {name}: {ns:.3} ns/element");
        }
    }
}
