//! The crate's own `tanh` (`f32::tanh` needs `std`) and logit soft-capping,
//! `cap · tanh(s / cap)` (Gemma 2), on top of the crate's [`exp`].
//!
//! One algorithm, three spellings: [`tanh`] (scalar, branch-free so that a loop of it
//! vectorises), `tanh_avx2` (`__m256`, AVX2 + FMA) and `tanh_avx512` (`__m512`, AVX-512F).
//! `tanh` is odd, so the work is on `a = |x|` and the sign of `x` is put back at the end (which
//! keeps `tanh(-0) = -0` and passes NaN through):
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
//! double rounding can cost one); AVX-512 takes AVX2's steps. The scalar path cannot fuse multiply and add without `std`,
//! the vector paths do, so they may differ in the last bit; AVX2 and AVX-512 agree bit for bit.

use super::exp::exp;

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
/// The sign bit of an `f32`.
const SIGN: u32 = 0x8000_0000;

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
    let a = f32::from_bits(x.to_bits() & !SIGN);
    let u = a * a;
    let p = ((((P6 * u + P5) * u + P4) * u + P3) * u + P2) * u + P1;
    let small = a + a * u * p;
    let large = 1.0 - 2.0 / (exp(a + a) + 1.0);
    // NaN compares false and takes the `exp` formula, which keeps it NaN.
    let magnitude = if a < SMALL { small } else { large };
    f32::from_bits(magnitude.to_bits() | (x.to_bits() & SIGN))
}

/// Logit soft-capping in place: `v = cap · tanh(v / cap)` for every value, with [`tanh`].
/// The portable entry of [`Kernels::softcap`](super::Kernels::softcap).
pub(crate) fn softcap(values: &mut [f32], cap: f32) {
    for v in values {
        *v = cap * tanh(*v / cap);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{softcap_avx2, softcap_avx512};

/// The vector spellings of [`tanh`] and [`softcap`].
#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    use super::super::exp::{exp_avx2, exp_avx512};
    use super::{P1, P2, P3, P4, P5, P6, SIGN, SMALL};

    /// [`tanh`](super::tanh) of eight lanes with AVX2 + FMA (same algorithm, fused steps).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn tanh_avx2(x: __m256) -> __m256 {
        let sign = _mm256_set1_ps(f32::from_bits(SIGN));
        let a = _mm256_andnot_ps(sign, x);
        let u = _mm256_mul_ps(a, a);
        let p = _mm256_fmadd_ps(_mm256_set1_ps(P6), u, _mm256_set1_ps(P5));
        let p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(P4));
        let p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(P3));
        let p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(P2));
        let p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(P1));
        let small = _mm256_fmadd_ps(_mm256_mul_ps(a, u), p, a);
        let one = _mm256_set1_ps(1.0);
        let e = exp_avx2(_mm256_add_ps(a, a));
        let large = _mm256_sub_ps(
            one,
            _mm256_div_ps(_mm256_set1_ps(2.0), _mm256_add_ps(e, one)),
        );
        // Ordered compare: NaN lanes take `large`, which is NaN there.
        let is_small = _mm256_cmp_ps::<_CMP_LT_OQ>(a, _mm256_set1_ps(SMALL));
        let magnitude = _mm256_blendv_ps(large, small, is_small);
        _mm256_or_ps(magnitude, _mm256_and_ps(sign, x))
    }

    /// [`tanh`](super::tanh) of sixteen lanes with AVX-512F: [`tanh_avx2`]'s steps, so the two
    /// agree bit for bit (their `exp`s do).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn tanh_avx512(x: __m512) -> __m512 {
        let sign = _mm512_set1_epi32(SIGN as i32);
        let bits = _mm512_castps_si512(x);
        let a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, bits));
        let u = _mm512_mul_ps(a, a);
        let p = _mm512_fmadd_ps(_mm512_set1_ps(P6), u, _mm512_set1_ps(P5));
        let p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(P4));
        let p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(P3));
        let p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(P2));
        let p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(P1));
        let small = _mm512_fmadd_ps(_mm512_mul_ps(a, u), p, a);
        let one = _mm512_set1_ps(1.0);
        let e = exp_avx512(_mm512_add_ps(a, a));
        let large = _mm512_sub_ps(
            one,
            _mm512_div_ps(_mm512_set1_ps(2.0), _mm512_add_ps(e, one)),
        );
        let is_small = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, _mm512_set1_ps(SMALL));
        let magnitude = _mm512_castps_si512(_mm512_mask_blend_ps(is_small, large, small));
        _mm512_castsi512_ps(_mm512_or_si512(magnitude, _mm512_and_si512(sign, bits)))
    }

    /// [`softcap`](super::softcap) with AVX2 + FMA: eight values at a time, the tail through a
    /// copy (so every value takes the same lane arithmetic, wherever it sits).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn softcap_avx2(values: &mut [f32], cap: f32) {
        let c = _mm256_set1_ps(cap);
        let step = |lanes: &mut [f32; 8]| {
            // SAFETY: `lanes` holds 8 values; the load and store are unaligned.
            unsafe {
                let v = _mm256_loadu_ps(lanes.as_ptr());
                let capped = _mm256_mul_ps(c, tanh_avx2(_mm256_div_ps(v, c)));
                _mm256_storeu_ps(lanes.as_mut_ptr(), capped);
            }
        };
        for_each_lanes(values, step);
    }

    /// [`softcap`](super::softcap) with AVX-512F, as [`softcap_avx2`] sixteen at a time.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn softcap_avx512(values: &mut [f32], cap: f32) {
        let c = _mm512_set1_ps(cap);
        let step = |lanes: &mut [f32; 16]| {
            // SAFETY: `lanes` holds 16 values; the load and store are unaligned.
            unsafe {
                let v = _mm512_loadu_ps(lanes.as_ptr());
                let capped = _mm512_mul_ps(c, tanh_avx512(_mm512_div_ps(v, c)));
                _mm512_storeu_ps(lanes.as_mut_ptr(), capped);
            }
        };
        for_each_lanes(values, step);
    }

    /// Calls `step` on each run of `N` values of `values` in place, the last partial run
    /// through a copy padded with zeros.
    #[inline(always)]
    fn for_each_lanes<const N: usize>(values: &mut [f32], mut step: impl FnMut(&mut [f32; N])) {
        let mut chunks = values.chunks_exact_mut(N);
        for chunk in &mut chunks {
            if let Ok(lanes) = <&mut [f32; N]>::try_from(chunk) {
                step(lanes);
            }
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mut lanes = [0.0; N];
            lanes[..rest.len()].copy_from_slice(rest);
            step(&mut lanes);
            rest.copy_from_slice(&lanes[..rest.len()]);
        }
    }

    #[cfg(all(test, feature = "std"))]
    mod tests {
        //! The vector paths against `f64::tanh` over the sweep `tests/tanh.rs` runs on the
        //! scalar [`tanh`](super::super::tanh), and AVX2 against AVX-512 bit for bit.
        use super::super::tests::{max_ulp, sweep};
        use super::*;
        use alloc::vec::Vec;

        /// `tanh` of every value by `softcap` with cap 1 (`1 · tanh(v / 1)` is `tanh(v)`
        /// exactly), through the vector path `f`.
        fn through(f: unsafe fn(&mut [f32], f32), xs: &[f32]) -> Vec<f32> {
            let mut ys = xs.to_vec();
            // SAFETY: callers checked the CPU features.
            unsafe { f(&mut ys, 1.0) };
            ys
        }

        #[test]
        fn avx2_sweep() {
            if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
                return;
            }
            let xs = sweep();
            let (worst, x) = max_ulp("avx2", &xs, &through(softcap_avx2, &xs));
            assert!(worst <= 2, "{worst} ulp at {x:e}");
        }

        #[test]
        fn avx512_sweep_and_agreement_with_avx2() {
            if !std::is_x86_feature_detected!("avx512f") {
                return;
            }
            let xs = sweep();
            let ys = through(softcap_avx512, &xs);
            let (worst, x) = max_ulp("avx512", &xs, &ys);
            assert!(worst <= 2, "{worst} ulp at {x:e}");
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                let zs = through(softcap_avx2, &xs);
                for ((&x, &y), &z) in xs.iter().zip(&ys).zip(&zs) {
                    assert_eq!(y.to_bits(), z.to_bits(), "tanh({x:e}): avx512 vs avx2");
                }
            }
        }

        /// A partial last run takes the same arithmetic as a whole one.
        #[test]
        fn tails_match_whole_runs() {
            if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
                return;
            }
            let xs: Vec<f32> = (0..37).map(|i| i as f32 * 0.37 - 6.0).collect();
            let mut whole = xs.clone();
            // SAFETY: AVX2 and FMA checked above.
            unsafe { softcap_avx2(&mut whole, 3.5) };
            for len in 0..xs.len() {
                let mut part = xs[..len].to_vec();
                // SAFETY: as above.
                unsafe { softcap_avx2(&mut part, 3.5) };
                assert_eq!(part, whole[..len], "length {len}");
            }
        }
    }
}

#[cfg(all(test, feature = "std"))]
pub(super) mod tests {
    //! Helpers shared with the vector paths' tests (the scalar sweep is `tests/tanh.rs`).
    use super::super::ulp::{bit_range, ordinal, SPECIAL};
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
