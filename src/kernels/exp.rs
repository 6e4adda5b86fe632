//! The crate's own `exp`: `f32::exp` needs `std`, and a softmax needs millions of them.
//!
//! One algorithm, three spellings: [`exp`] (scalar, branch-free so that LLVM vectorises a loop
//! of it for the build's baseline target), `exp_avx2` (`__m256`, AVX2 + FMA) and `exp_avx512`
//! (`__m512`, AVX-512F).
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
//! 4. **Scale** by `2^n` exactly: `n` is split as `n1 = n >> 1`, `n2 = n - n1` (both in
//!    `[-75, 64]`, so `2^n1` and `2^n2` are normal floats built from exponent bits) and the
//!    result is `(e^r · 2^n1) · 2^n2`. The first product is exact; the second rounds once, which
//!    makes subnormal results correctly rounded (from `e^r`) and lets `n = 128` overflow to
//!    `+inf` cleanly. AVX-512 does the same with one `vscalefps`.
//!
//! Accuracy, measured against `f64::exp` rounded to `f32` (`tests/exp.rs`, and exhaustively over
//! all `2^32` inputs with `cargo test --release -- --ignored exhaustive`): at most 1 ulp on every
//! path, subnormal results included. `exp(-inf) = 0`, `exp(+inf) = +inf`, `exp(NaN) = NaN`.
//!
//! The scalar path cannot fuse multiply and add (`f32::mul_add` needs `std`), the vector paths
//! do; so the scalar and vector results may differ in the last bit. AVX2 and AVX-512 agree bit
//! for bit.

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
/// `1.5 · 2^23`: adding it rounds an `f32` of magnitude below `2^22` to an integer (ties to
/// even), which then sits in the low bits of the sum's representation.
const ROUNDER: f32 = 12_582_912.0;

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
    // Clamp; comparisons with NaN are false, so NaN passes through (and stays NaN to the end).
    let x = if x < X_MIN { X_MIN } else { x };
    let x = if x > X_MAX { X_MAX } else { x };
    // n = round(x · log2 e); its integer value is in the low mantissa bits of `t`.
    let t = x * LOG2_E + ROUNDER;
    let n = t - ROUNDER;
    let n_int = (t.to_bits() as i32).wrapping_sub(ROUNDER.to_bits() as i32);
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let q = C6 * r + C5;
    let q = q * r + C4;
    let q = q * r + C3;
    let q = q * r + C2;
    let e_r = 1.0 + (r * r * q + r);
    let n1 = n_int >> 1;
    let n2 = n_int.wrapping_sub(n1);
    e_r * pow2(n1) * pow2(n2)
}

/// `2^k` for `-126 ≤ k ≤ 127`, from the exponent bits (garbage, never UB, outside).
#[inline]
fn pow2(k: i32) -> f32 {
    f32::from_bits((k.wrapping_add(127) as u32) << 23)
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{exp_avx2, exp_avx512, exp_probability_avx2, exp_probability_avx512};

/// The vector spellings of [`exp`].
#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    use super::{C2, C3, C4, C5, C6, LN2_HI, LN2_LO, LOG2_E, X_MAX, X_MIN};

    /// Round to nearest (ties to even), exceptions suppressed.
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    /// [`exp`](super::exp) of eight lanes with AVX2 + FMA (same algorithm, fused steps).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn exp_avx2(x: __m256) -> __m256 {
        // max/min return their second operand when either is NaN, so NaN passes through.
        let x = _mm256_min_ps(
            _mm256_set1_ps(X_MAX),
            _mm256_max_ps(_mm256_set1_ps(X_MIN), x),
        );
        let (n, e_r) = reduce_avx2(x);
        // n is an integer in [-150, 128] (NaN lanes give garbage, but e_r is NaN there).
        let n_int = _mm256_cvtps_epi32(n);
        let n1 = _mm256_srai_epi32::<1>(n_int);
        let n2 = _mm256_sub_epi32(n_int, n1);
        _mm256_mul_ps(_mm256_mul_ps(e_r, pow2_avx2(n1)), pow2_avx2(n2))
    }

    /// Steps 2 and 3 of [`exp`](super::exp) for a clamped `x`: `n = round(x · log2 e)` and
    /// `e^r` for `r = x - n·ln2`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn reduce_avx2(x: __m256) -> (__m256, __m256) {
        let n = _mm256_round_ps::<NEAREST>(_mm256_mul_ps(x, _mm256_set1_ps(LOG2_E)));
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let q = _mm256_fmadd_ps(_mm256_set1_ps(C6), r, _mm256_set1_ps(C5));
        let q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(C4));
        let q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(C3));
        let q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(C2));
        let s = _mm256_fmadd_ps(_mm256_mul_ps(r, r), q, r);
        (n, _mm256_add_ps(_mm256_set1_ps(1.0), s))
    }

    /// `2^k` per lane for `-126 ≤ k ≤ 127`, from the exponent bits.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn pow2_avx2(k: __m256i) -> __m256 {
        let biased = _mm256_add_epi32(k, _mm256_set1_epi32(127));
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased))
    }

    /// [`exp`](super::exp) of sixteen lanes with AVX-512F (same algorithm, fused steps; the
    /// scaling is one `vscalefps`, which rounds once like the two-step product).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn exp_avx512(x: __m512) -> __m512 {
        let x = _mm512_min_ps(
            _mm512_set1_ps(X_MAX),
            _mm512_max_ps(_mm512_set1_ps(X_MIN), x),
        );
        let n = _mm512_roundscale_ps::<NEAREST>(_mm512_mul_ps(x, _mm512_set1_ps(LOG2_E)));
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let q = _mm512_fmadd_ps(_mm512_set1_ps(C6), r, _mm512_set1_ps(C5));
        let q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(C4));
        let q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(C3));
        let q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(C2));
        let s = _mm512_fmadd_ps(_mm512_mul_ps(r, r), q, r);
        let e_r = _mm512_add_ps(_mm512_set1_ps(1.0), s);
        _mm512_scalef_ps(e_r, n)
    }

    /// The smallest argument whose `exp` is a normal float (`exp(-87.33) ≈ 1.1756e-38`).
    pub(super) const SMALLEST_NORMAL_ARG: f32 = -87.33;

    /// `exp` for softmax probabilities, `x ≤ 0` or NaN (a score minus the running maximum):
    /// [`exp_avx2`], except that arguments below [`SMALLEST_NORMAL_ARG`] (masked scores are
    /// `-inf`) give exactly 0 without computing subnormal intermediates, which cost microcode
    /// assists on some CPUs. A probability that small cannot change a softmax sum, which is at
    /// least 1.
    ///
    /// On `[SMALLEST_NORMAL_ARG, 0]`, `n` lies in `[-126, 0]` and the result is a normal float,
    /// so one scaling by `2^n` gives the bits of [`exp_avx2`]'s two half-scalings (scaling by
    /// a power of two is exact while the result stays normal) with fewer operations; the
    /// clamps of [`exp_avx2`] are no-ops there.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn exp_probability_avx2(x: __m256) -> __m256 {
        let floor = _mm256_set1_ps(SMALLEST_NORMAL_ARG);
        let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, floor);
        // `max` returns its second operand when either is NaN, so NaN passes through (and
        // makes `e_r` NaN, whatever the scaling bits of that lane).
        let (n, e_r) = reduce_avx2(_mm256_max_ps(floor, x));
        let scaled = _mm256_mul_ps(e_r, pow2_avx2(_mm256_cvtps_epi32(n)));
        _mm256_andnot_ps(tiny, scaled)
    }

    /// [`exp_probability_avx2`] for sixteen lanes, on [`exp_avx512`].
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn exp_probability_avx512(x: __m512) -> __m512 {
        let floor = _mm512_set1_ps(SMALLEST_NORMAL_ARG);
        let normal = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, floor);
        _mm512_maskz_mov_ps(normal, exp_avx512(_mm512_max_ps(floor, x)))
    }
}

#[cfg(all(test, feature = "std", target_arch = "x86_64"))]
mod tests {
    //! The vector paths over the same sweep as `tests/exp.rs` (which covers the public scalar
    //! [`exp`]); same reference, `f64::exp` rounded to `f32`.
    use super::super::ulp::{bit_range, ordinal, SPECIAL};
    use super::x86::{exp_avx2, exp_avx512, exp_probability_avx2, SMALLEST_NORMAL_ARG as FLOOR};
    use super::*;
    use alloc::vec::Vec;
    use core::arch::x86_64::*;
    use std::println;

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

    /// `exp` of every value, eight at a time with AVX2.
    fn exp_slice_avx2(xs: &mut [f32]) {
        // SAFETY: callers checked AVX2 and FMA.
        unsafe { exp_slice_avx2_inner(xs) }
    }

    /// Callers check AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    fn exp_slice_avx2_inner(xs: &mut [f32]) {
        let mut chunks = xs.chunks_exact_mut(8);
        for chunk in &mut chunks {
            // SAFETY: `chunk` holds 8 floats.
            unsafe {
                let v = _mm256_loadu_ps(chunk.as_ptr());
                _mm256_storeu_ps(chunk.as_mut_ptr(), exp_avx2(v));
            }
        }
        let rest = chunks.into_remainder();
        let mut tmp = [0.0f32; 8];
        tmp[..rest.len()].copy_from_slice(rest);
        // SAFETY: as above, on the 8-float `tmp`.
        unsafe { _mm256_storeu_ps(tmp.as_mut_ptr(), exp_avx2(_mm256_loadu_ps(tmp.as_ptr()))) };
        rest.copy_from_slice(&tmp[..rest.len()]);
    }

    /// `exp` of every value, sixteen at a time with AVX-512.
    fn exp_slice_avx512(xs: &mut [f32]) {
        // SAFETY: callers checked AVX-512F.
        unsafe { exp_slice_avx512_inner(xs) }
    }

    /// Callers check AVX-512F.
    #[target_feature(enable = "avx512f")]
    fn exp_slice_avx512_inner(xs: &mut [f32]) {
        let mut chunks = xs.chunks_exact_mut(16);
        for chunk in &mut chunks {
            // SAFETY: `chunk` holds 16 floats.
            unsafe {
                let v = _mm512_loadu_ps(chunk.as_ptr());
                _mm512_storeu_ps(chunk.as_mut_ptr(), exp_avx512(v));
            }
        }
        let rest = chunks.into_remainder();
        let mut tmp = [0.0f32; 16];
        tmp[..rest.len()].copy_from_slice(rest);
        // SAFETY: as above, on the 16-float `tmp`.
        unsafe { _mm512_storeu_ps(tmp.as_mut_ptr(), exp_avx512(_mm512_loadu_ps(tmp.as_ptr()))) };
        rest.copy_from_slice(&tmp[..rest.len()]);
    }

    /// The largest ulp error of `f` over `xs`, and where; NaN must map to NaN.
    fn max_ulp(name: &str, xs: &[f32], f: fn(&mut [f32])) -> (u64, f32) {
        let mut ys = xs.to_vec();
        f(&mut ys);
        let (mut worst, mut worst_x, mut off) = (0, 0.0f32, 0usize);
        for (&x, &y) in xs.iter().zip(&ys) {
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
        let (worst, x) = max_ulp("scalar", &xs, |ys| ys.iter_mut().for_each(|y| *y = exp(*y)));
        assert!(worst <= 2, "{worst} ulp at {x:e}");
    }

    #[test]
    fn avx2_sweep() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            return;
        }
        let xs = sweep();
        let (worst, x) = max_ulp("avx2", &xs, exp_slice_avx2);
        assert!(worst <= 2, "{worst} ulp at {x:e}");
    }

    #[test]
    fn avx512_sweep_and_agreement_with_avx2() {
        if !std::is_x86_feature_detected!("avx512f") {
            return;
        }
        let xs = sweep();
        let (worst, x) = max_ulp("avx512", &xs, exp_slice_avx512);
        assert!(worst <= 2, "{worst} ulp at {x:e}");
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            let (mut a, mut b) = (xs.clone(), xs.clone());
            exp_slice_avx2(&mut a);
            exp_slice_avx512(&mut b);
            for ((&x, &a), &b) in xs.iter().zip(&a).zip(&b) {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "exp({x:e}): avx2 {a:e} != avx512 {b:e}"
                );
            }
        }
    }

    /// The probability `exp` (one scaling instead of two, no clamps) gives the bits of
    /// `exp_avx2` on its domain, `x ≤ 0` (every 1009th non-positive float, the floor's
    /// neighbourhood, `-0`, `-inf`, NaN), and 0 below the floor.
    #[test]
    fn probability_exp_is_exp_avx2_on_non_positive_arguments() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            return;
        }
        let near_floor = (FLOOR.to_bits() - 4096..FLOOR.to_bits() + 4096).map(f32::from_bits);
        let xs: Vec<f32> = (0x8000_0000u32..=0xff80_0000)
            .step_by(1009)
            .map(f32::from_bits)
            .chain(near_floor)
            .chain([-0.0, f32::NEG_INFINITY, f32::NAN, -f32::NAN])
            .collect();
        let (mut want, mut got) = (xs.clone(), xs.clone());
        exp_slice_avx2(&mut want);
        for chunk in got.chunks_exact_mut(8) {
            // SAFETY: AVX2 and FMA checked above; `chunk` holds 8 floats.
            unsafe {
                let v = _mm256_loadu_ps(chunk.as_ptr());
                _mm256_storeu_ps(chunk.as_mut_ptr(), exp_probability_avx2(v));
            }
        }
        let checked = xs.len() / 8 * 8;
        for ((&x, &want), &got) in xs.iter().zip(&want).zip(&got).take(checked) {
            let want = if x < FLOOR { 0.0 } else { want };
            assert!(
                want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                "exp({x:e}): probability exp {got:e} != exp_avx2 {want:e}"
            );
        }
    }

    /// Every `f32` through each available vector path.
    #[test]
    #[ignore = "exhaustive over 2^32 inputs: run with --release -- --ignored"]
    fn exhaustive_vector_paths() {
        type Path = (&'static str, fn(&mut [f32]));
        let mut paths: Vec<Path> = Vec::new();
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            paths.push(("avx2", exp_slice_avx2));
        }
        if std::is_x86_feature_detected!("avx512f") {
            paths.push(("avx512", exp_slice_avx512));
        }
        for (name, f) in paths {
            let mut worst = 0;
            for hi in 0..(1u32 << 8) {
                let xs: Vec<f32> = (0..1u32 << 24)
                    .map(|lo| f32::from_bits(hi << 24 | lo))
                    .collect();
                worst = worst.max(max_ulp(name, &xs, f).0);
            }
            println!("{name}, all 2^32 inputs: max error {worst} ulp");
            assert!(worst <= 2);
        }
    }

    /// Throughput of `exp` over one 64-float row, out of place, per path, in ns per element.
    #[test]
    #[ignore = "timing: run with --release -- --ignored --nocapture"]
    fn timing_64_float_row() {
        use core::hint::black_box;
        const REPS: usize = 2_000_000;
        let row: [f32; 64] = core::array::from_fn(|i| (i * 37 % 64) as f32 * 0.15 - 8.0);
        let mut out = [0.0f32; 64];
        let time = |f: &mut dyn FnMut()| {
            (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    for _ in 0..REPS {
                        f();
                    }
                    t.elapsed().as_secs_f64() * 1e9 / (REPS * 64) as f64
                })
                .fold(f64::INFINITY, f64::min)
        };
        let ns = time(&mut || {
            for (o, &x) in black_box(&mut out).iter_mut().zip(black_box(&row)) {
                *o = exp(x);
            }
        });
        println!("exp portable: {ns:.3} ns/element");
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            let ns = time(&mut || {
                out = row;
                exp_slice_avx2(black_box(&mut out));
            });
            println!("exp avx2: {ns:.3} ns/element");
        }
        if std::is_x86_feature_detected!("avx512f") {
            let ns = time(&mut || {
                out = row;
                exp_slice_avx512(black_box(&mut out));
            });
            println!("exp avx512: {ns:.3} ns/element");
        }
    }
}
