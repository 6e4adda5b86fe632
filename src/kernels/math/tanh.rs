//! The crate's own `tanh` (`f32::tanh` needs `std`) and logit soft-capping,
//! `cap · tanh(s / cap)` (Gemma 2), on top of the crate's [`exp`](crate::kernels::math::exp::exp).
//!
//! One algorithm over the primitives of `Simd`, so every instruction set computes it the
//! same way: [`tanh`] (scalar, on the portable primitives with one lane, branch-free so that
//! a loop of it vectorises) and the kernel tables' soft cap. `tanh` is odd, so the work is on
//! `a = |x|` and the sign of `x` is put back at the end (which keeps `tanh(-0) = -0` and
//! passes NaN through):
//!
//! - `a < 0.625`: `a + a³·p(a²)`, `p` of degree 5 (degree 13 in all). The coefficients were
//!   fitted for this crate by a minimax (Lawson) iteration on the *relative* error of `tanh` on
//!   `[0, 0.625]`, then rounded to `f32`: the approximation error is below `1.6e-10`, so the
//!   result's error is the `f32` rounding of the last steps (measured below 1 ulp). Subnormal
//!   arguments give themselves (`a³` underflows to 0).
//! - `a ≥ 0.625`: `1 - 2 / (e^{2a} + 1)` with the crate's `exp` (within 1 ulp); the result is
//!   at least `0.55`, so the subtraction does not magnify the error much. `e^{2a}` overflows
//!   to `+inf` for `a > 44.4`, giving exactly 1 (as does every `a > 9.01` by rounding).
//!
//! Accuracy, measured against `f64::tanh` rounded to `f32` (`tests/tanh.rs` and the vector
//! paths' tests below, sweeping the whole range, signed zeros, subnormals, infinities and NaN):
//! at most 1 ulp on the scalar and AVX2 paths (the tests assert 2, as the `f64` reference's
//! double rounding can cost one). The portable primitives cannot fuse multiply and add without
//! `std`, the vector ones do, so they may differ in the last bit; the vector tables agree bit
//! for bit.

use crate::kernels::math::exp::exp_vector;
use crate::kernels::simd::portable::Lanes;
use crate::kernels::simd::Simd;

/// Below this `|x|` the polynomial, from it on the `exp` formula.
const SMALL: f32 = 0.625;
/// `p(u) = P1 + P2 u + P3 u² + P4 u³ + P5 u⁴ + P6 u⁵` (minimax, see the module documentation).
const P1: f32 = -0.333_333_3;
/// See [`P1`].
const P2: f32 = 0.133_332_06;
/// See [`P1`].
const P3: f32 = -0.053_946_763;
/// See [`P1`].
const P4: f32 = 0.021_700_703;
/// See [`P1`].
const P5: f32 = -0.008_177_397;
/// See [`P1`].
const P6: f32 = 0.002_142_961;

/// `tanh(x)` for `f32`, within 2 ulp of the correctly rounded result (measured: see the
/// module documentation).
///
/// `tanh(±0) = ±0`, `tanh(±inf) = ±1`, `tanh(NaN) = NaN`, odd for every input. Branch-free,
/// so a loop of it over a slice vectorises. Needs no `std`.
///
/// ```
/// use mha::kernels::tanh::tanh;
/// assert_eq!(tanh(0.0), 0.0);
/// assert!(tanh(-0.0).is_sign_negative());
/// assert_eq!(tanh(f32::INFINITY), 1.0);
/// assert_eq!(tanh(-20.0), -1.0);
/// assert!(tanh(f32::NAN).is_nan());
/// assert!((tanh(0.5) - 0.462_117_17).abs() <= f32::EPSILON);
/// ```
#[inline]
pub fn tanh(x: f32) -> f32 {
    tanh_vector(Lanes, [x])[0]
}

/// [`tanh`] of every lane.
#[inline(always)]
fn tanh_vector<S: Simd>(s: S, x: S::V) -> S::V {
    let a = s.abs(x);
    let u = s.mul(a, a);
    let p = s.mul_add(s.splat(P6), u, s.splat(P5));
    let p = s.mul_add(p, u, s.splat(P4));
    let p = s.mul_add(p, u, s.splat(P3));
    let p = s.mul_add(p, u, s.splat(P2));
    let p = s.mul_add(p, u, s.splat(P1));
    let small = s.mul_add(s.mul(a, u), p, a);
    let one = s.splat(1.0);
    let e = exp_vector(s, s.add(a, a));
    let large = s.sub(one, s.div(s.splat(2.0), s.add(e, one)));
    // NaN compares false and takes the `exp` formula, which keeps it NaN.
    let magnitude = s.select(s.lt(a, s.splat(SMALL)), small, large);
    s.with_sign_of(magnitude, x)
}

/// See [`Kernels::softcap`](crate::kernels::Kernels::softcap): `v = cap · tanh(v / cap)` for every
/// value, `LANES` at a time, the last partial run through its first lanes (so every value
/// takes the same lane arithmetic, wherever it sits).
#[inline(always)]
pub(crate) fn softcap<S: Simd>(s: S, values: &mut [f32], cap: f32) {
    let c = s.splat(cap);
    for chunk in values.chunks_mut(S::LANES) {
        let (n, ptr) = (chunk.len(), chunk.as_mut_ptr());
        // SAFETY: `chunk` holds n ≤ LANES values; a partial one is read and written through
        // its first n lanes only.
        unsafe {
            let v = if n == S::LANES {
                s.load(ptr)
            } else {
                s.load_first(ptr, n)
            };
            let capped = s.mul(c, tanh_vector(s, s.div(v, c)));
            if n == S::LANES {
                s.store(ptr, capped);
            } else {
                s.store_first(ptr, n, capped);
            }
        }
    }
}

#[cfg(all(test, feature = "std"))]
mod table_tests {
    //! Every table's soft cap against `f64::tanh` over the sweep `tests/tanh.rs` runs on the
    //! scalar [`tanh`], and the vector tables against each other bit for bit.
    use super::tests::{max_ulp, sweep};
    use super::*;
    use crate::kernels::{table::SoftcapFn, Isa};
    use alloc::vec::Vec;

    /// The tables this CPU runs: name and soft cap.
    fn tables() -> Vec<(&'static str, SoftcapFn)> {
        Isa::ALL
            .into_iter()
            .filter(|isa| isa.is_supported())
            .map(|isa| (isa.name(), isa.kernels().unwrap().softcap))
            .collect()
    }

    /// `tanh` of every value by `softcap` with cap 1 (`1 · tanh(v / 1)` is `tanh(v)`
    /// exactly), through the table's `f`.
    fn through(f: SoftcapFn, xs: &[f32]) -> Vec<f32> {
        let mut ys = xs.to_vec();
        // SAFETY: `tables` lists supported tables only.
        unsafe { f(&mut ys, 1.0) };
        ys
    }

    /// Every table within 2 ulp; the portable one gives the scalar [`tanh`]'s bits.
    #[test]
    fn every_table_sweep() {
        let xs = sweep();
        for (name, softcap) in tables() {
            let ys = through(softcap, &xs);
            let (worst, x) = max_ulp(name, &xs, &ys);
            assert!(worst <= 2, "{name}: {worst} ulp at {x:e}");
            if name == Isa::Portable.name() {
                for (&x, &y) in xs.iter().zip(&ys) {
                    assert_eq!(y.to_bits(), tanh(x).to_bits(), "portable tanh({x:e})");
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
            .filter(|&(name, _)| name != Isa::Portable.name())
            .collect();
        for pair in vector.windows(2) {
            let (a, b) = (through(pair[0].1, &xs), through(pair[1].1, &xs));
            for ((&x, &a), &b) in xs.iter().zip(&a).zip(&b) {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "tanh({x:e}): {} vs {}",
                    pair[0].0,
                    pair[1].0
                );
            }
        }
    }

    /// A partial last run takes the same arithmetic as a whole one, on every table.
    #[test]
    fn tails_match_whole_runs() {
        let xs: Vec<f32> = (0..37).map(|i| i as f32 * 0.37 - 6.0).collect();
        for (name, softcap) in tables() {
            let mut whole = xs.clone();
            // SAFETY: `tables` lists supported tables only.
            unsafe { softcap(&mut whole, 3.5) };
            for len in 0..xs.len() {
                let mut part = xs[..len].to_vec();
                // SAFETY: as above.
                unsafe { softcap(&mut part, 3.5) };
                assert_eq!(part, whole[..len], "{name} length {len}");
            }
        }
    }
}

#[cfg(all(test, feature = "std"))]
pub(super) mod tests {
    //! Helpers shared with the vector paths' tests (the scalar sweep is `tests/tanh.rs`).
    use crate::kernels::math::ulp::{bit_range, ordinal, SPECIAL};
    use alloc::vec::Vec;
    use std::println;

    /// Inputs: every 61st bit pattern of either sign up to 10 (past which `tanh` is ±1), every
    /// float around the switch at 0.625, `[-1, 1]` in steps of 1e-4, special values.
    pub(crate) fn sweep() -> Vec<f32> {
        let switch = (super::SMALL.to_bits() - 5000, super::SMALL.to_bits() + 5000);
        bit_range(0, 10.0f32.to_bits(), 61)
            .chain(bit_range(0x8000_0000, (-10.0f32).to_bits(), 61))
            .chain(bit_range(switch.0, switch.1, 1))
            .chain((-10_000..=10_000).map(|i| i as f32 * 1e-4))
            .chain(SPECIAL)
            .chain([
                f32::from_bits(0x8000_0001),
                f32::MIN_POSITIVE,
                9.01,
                44.4,
                50.0,
                -50.0,
                1e10,
                -1e30,
            ])
            .collect()
    }

    /// The largest ulp error of `ys` as `tanh` of `xs` against `f64::tanh` rounded to `f32`,
    /// and where; NaN must map to NaN and zeros keep their sign.
    pub(crate) fn max_ulp(name: &str, xs: &[f32], ys: &[f32]) -> (u64, f32) {
        let (mut worst, mut worst_x) = (0, 0.0f32);
        for (&x, &y) in xs.iter().zip(ys) {
            let want = f64::from(x).tanh() as f32;
            if want.is_nan() {
                assert!(y.is_nan(), "{name}: tanh({x:e}) = {y:e}, expected NaN");
                continue;
            }
            assert_eq!(
                y.is_sign_negative(),
                want.is_sign_negative(),
                "{name}: tanh({x:e}) = {y:e}, sign"
            );
            let ulps = ordinal(y).abs_diff(ordinal(want));
            if ulps > worst {
                (worst, worst_x) = (ulps, x);
            }
        }
        println!("{name}: tanh max error {worst} ulp (at x = {worst_x:e})");
        (worst, worst_x)
    }
}
