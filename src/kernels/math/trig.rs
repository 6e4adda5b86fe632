//! The crate's own `sin` and `cos` for the rotary angles, and the few other `f64` functions
//! (`ln`, `powf`, `floor`, `ceil`) their frequencies need and the square root of the softmax
//! scale and RMSNorm (`sqrt`): `core` has none of them without `std`.
//!
//! They favour accuracy and plainness over speed (a rotated row costs one `sin_cos` per pair); they
//! work in `f64`, and the rotary angles round once, to `f32`, at the end.
//!
//! **[`sin_cos`]**, for `|x| ≤` [`MAX_ANGLE`] (about `3.37e9`, `2^31` quarter turns):
//!
//! 1. **Reduce**: `n = round(x · 2/π)` (to nearest, ties to even, of the rounded product) and
//!    `r = x - n·π/2`, with `π/2` split Cody–Waite style into four parts of 22 significant bits
//!    and a fifth holding the rest (`π/2` to about 141 bits). `|n| ≤ 2^31`, so each `n · part`
//!    of 22 bits is exact, and each subtraction is exact while the next parts dominate what is
//!    left (Sterbenz): when `x` is close to a multiple of `π/2`, the small remainder comes out
//!    with a relative error near `2^-53`, not the absolute one of a single-step reduction.
//!    `|r| ≤ π/4 + 2^-22`.
//! 2. **Approximate** `sin r` and `cos r` by their Taylor polynomials to degree 17 and 18 (the
//!    coefficients are `±1/k!`, each rounded once from an exact integer `k!`): the truncation
//!    error is below `2e-18` on `|r| ≤ 0.786`, under one `f64` ulp of the results.
//! 3. **Quadrant**: `n mod 4` picks `±sin r` or `±cos r`.
//!
//! Accuracy, measured against the platform's `f64::sin` / `f64::cos` (`tests/trig.rs`, about
//! 9 million angles up to `MAX_ANGLE`, the doubles nearest to multiples of `π/2` among them):
//! rounded to `f32`, every result equals the rounded reference (the test allows the 2 ulp a
//! double rounding could cost); in `f64` the absolute error stays below `2.3e-16`, and near a
//! multiple of `π/2` the error is relative to the small result. Outside `[-MAX_ANGLE, MAX_ANGLE]` (and for NaN and
//! infinities) both results are NaN: the reduction would no longer be exact, and
//! [`RopeAngles`](crate::RopeAngles) never asks for such an angle.

/// The largest `|x|` [`sin_cos`] reduces exactly: `2^31` quarter turns (`≈ 3.37e9`), so a
/// rotary angle `position · inv_freq` with `inv_freq ≤ 1` stays within it for every position
/// below `2^31`.
pub const MAX_ANGLE: f64 = (1u64 << 31) as f64 * PIO2_1;

/// `2/π`, rounded to `f64`.
const FRAC_2_PI: f64 = core::f64::consts::FRAC_2_PI;
/// `π/2 = PIO2_1 + PIO2_2 + PIO2_3 + PIO2_4 + PIO2_5`: the first four have 22 significant bits
/// (`n · PIO2_k` is exact for `|n| ≤ 2^31`), each the truncation of what the previous ones
/// leave; the last is the rest rounded to `f64`.
const PIO2_1: f64 = f64::from_bits(0x3ff9_21fb_0000_0000);
/// See [`PIO2_1`].
const PIO2_2: f64 = f64::from_bits(0x3e95_110b_0000_0000);
/// See [`PIO2_1`].
const PIO2_3: f64 = f64::from_bits(0x3d31_8469_8000_0000);
/// See [`PIO2_1`].
const PIO2_4: f64 = f64::from_bits(0x3ba3_198a_0000_0000);
/// See [`PIO2_1`].
const PIO2_5: f64 = f64::from_bits(0x3a37_01b8_39a2_5205);
/// `1.5 · 2^52`: adding it rounds an `f64` of magnitude below `2^51` to an integer (ties to
/// even).
const ROUNDER: f64 = 6_755_399_441_055_744.0;

/// `1/k!` for `k = 0..=18`, each rounded once from the exact integer `k!` (`18! < 2^53`).
const INV_FACTORIAL: [f64; 19] = {
    let mut table = [1.0; 19];
    let mut factorial = 1u64;
    let mut k = 1;
    while k < 19 {
        factorial *= k as u64;
        table[k] = 1.0 / factorial as f64;
        k += 1;
    }
    table
};

/// `(sin x, cos x)` in `f64`, for `|x| ≤` [`MAX_ANGLE`]; NaN for both beyond it and for NaN and
/// infinite `x`. Rounded to `f32`, each equals the rounded `f64` reference on every input
/// tested (see the module documentation). Needs no `std`.
///
/// ```
/// use mha::kernels::trig::{sin_cos, MAX_ANGLE};
/// assert_eq!(sin_cos(0.0), (0.0, 1.0));
/// let (s, c) = sin_cos(1.0e6);
/// assert!((s + 0.349_993_502_171_292_9).abs() < 1e-15);
/// assert!((c - 0.936_752_127_533_144_7).abs() < 1e-15);
/// assert!(sin_cos(2.0 * MAX_ANGLE).0.is_nan());
/// assert!(sin_cos(f64::INFINITY).1.is_nan());
/// ```
pub fn sin_cos(x: f64) -> (f64, f64) {
    if x.is_nan() || abs(x) > MAX_ANGLE {
        return (f64::NAN, f64::NAN);
    }
    let n = (x * FRAC_2_PI + ROUNDER) - ROUNDER;
    let r = x - n * PIO2_1 - n * PIO2_2 - n * PIO2_3 - n * PIO2_4 - n * PIO2_5;
    let (s, c) = (sin_taylor(r), cos_taylor(r));
    // |n| ≤ 2^31 fits i64; two's complement makes `& 3` the quadrant for negative n too.
    match (n as i64) & 3 {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}

/// `sin r` for `|r| ≤ 0.786`: `r + r·z·(-1/3! + z/5! - … + z^7/17!)`, `z = r²`.
fn sin_taylor(r: f64) -> f64 {
    let z = r * r;
    let mut p = INV_FACTORIAL[17];
    for k in (1..8).rev() {
        let term = INV_FACTORIAL[2 * k + 1];
        p = p * z + if k % 2 == 0 { term } else { -term };
    }
    r + r * z * p
}

/// `cos r` for `|r| ≤ 0.786`: `1 + z·(-1/2! + z/4! - … + z^8/18!)`, `z = r²`.
fn cos_taylor(r: f64) -> f64 {
    let z = r * r;
    let mut p = -INV_FACTORIAL[18];
    for k in (1..9).rev() {
        let term = INV_FACTORIAL[2 * k];
        p = p * z + if k % 2 == 0 { term } else { -term };
    }
    1.0 + z * p
}

/// `|x|`: the sign bit cleared (no `std` needed on any supported toolchain).
fn abs(x: f64) -> f64 {
    f64::from_bits(x.to_bits() & !(1 << 63))
}

/// `ln 2` to 32 significant bits: `e · LN2_HI` is exact for `|e| < 2^21`.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
/// `ln 2 - LN2_HI`, rounded to `f64`.
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);

/// The natural logarithm, within a few `f64` ulps: `x = m · 2^e` with `m` in `[√½, √2)`,
/// `ln m = 2·atanh(f)`, `f = (m - 1)/(m + 1)` (`|f| ≤ 0.172`), its series to `f^23`.
/// `ln(0) = -inf`, `ln(+inf) = +inf`, NaN for negative `x` and NaN.
pub(crate) fn ln(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 || x == f64::INFINITY {
        return if x == 0.0 { f64::NEG_INFINITY } else { x };
    }
    // Subnormals: scale into the normal range first.
    let (x, bias) = if x < f64::MIN_POSITIVE {
        (x * (1u64 << 54) as f64, -54)
    } else {
        (x, 0)
    };
    let bits = x.to_bits();
    let mut e = ((bits >> 52) as i64) - 1023 + bias;
    let mut m = f64::from_bits((bits & ((1 << 52) - 1)) | (1023 << 52));
    if m > core::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let f = (m - 1.0) / (m + 1.0);
    let s = f * f;
    let mut series = 1.0 / 23.0;
    for k in (0..11).rev() {
        series = series * s + 1.0 / (2 * k + 1) as f64;
    }
    let e = e as f64;
    e * LN2_HI + (e * LN2_LO + 2.0 * f * series)
}

/// `e^x` within a few `f64` ulps: `x = n·ln 2 + r`, `|r| ≤ 0.347`, `e^r` by its Taylor
/// polynomial to degree 16, scaled by `2^n` in three steps (each exact while the result is
/// normal). Overflows to `+inf`, underflows to 0; NaN stays NaN.
pub(crate) fn exp(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let x = x.clamp(-1100.0, 1100.0);
    let n = (x * core::f64::consts::LOG2_E + ROUNDER) - ROUNDER;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = INV_FACTORIAL[16];
    for k in (0..16).rev() {
        p = p * r + INV_FACTORIAL[k];
    }
    // |n| ≤ 1587: three parts of the same sign, each within the normal exponents.
    let n = n as i64;
    let (n1, n2) = (n / 3, (n - n / 3) / 2);
    p * pow2(n1) * pow2(n2) * pow2(n - n1 - n2)
}

/// `2^k` for `|k| ≤ 1022`, from the exponent bits.
fn pow2(k: i64) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// `base^y` as `e^(y · ln base)`, for `base > 0` (within about `|y · ln base| + 4` ulps).
pub(crate) fn powf(base: f64, y: f64) -> f64 {
    exp(y * ln(base))
}

/// The largest integer not above `x` (`x` itself when it is NaN, infinite or whole).
pub(crate) fn floor(x: f64) -> f64 {
    if x.is_nan() || abs(x) >= ROUNDER {
        return x;
    }
    let truncated = x as i64 as f64;
    if truncated > x {
        truncated - 1.0
    } else {
        truncated
    }
}

/// The smallest integer not below `x` (`x` itself when it is NaN, infinite or whole).
pub(crate) fn ceil(x: f64) -> f64 {
    -floor(-x)
}

/// `√x` for `x ≥ 0` (NaN for NaN) by Newton's method (`f64::sqrt` needs `std`); within an ulp
/// of `f64`, far below `f32` precision.
pub(crate) fn sqrt(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x <= 0.0 || x.is_infinite() {
        return x.max(0.0);
    }
    // Halving the exponent is within a factor of 1.5 of √x; one Newton step from any positive
    // guess lands at or above √x, from where the steps decrease until they stop.
    let rough = f64::from_bits((x.to_bits() >> 1) + (1023 << 51));
    let mut guess = 0.5 * (rough + x / rough);
    loop {
        let next = 0.5 * (guess + x / guess);
        if next >= guess {
            return guess;
        }
        guess = next;
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    //! The `f64` helpers against `std` (`sin_cos`, the public one, is tested in `tests/trig.rs`).
    use super::*;

    /// Relative error of `got` against `want`, in units of `2^-52`.
    fn rel_ulps(got: f64, want: f64) -> f64 {
        if got == want {
            return 0.0;
        }
        ((got - want) / want).abs() / f64::EPSILON
    }

    #[test]
    fn ln_and_exp_against_std() {
        let mut worst: f64 = 0.0;
        for i in 1..20_000 {
            let x = i as f64 * 0.013_7;
            for x in [x, 1.0 / x, x * 1e100, x * 1e-300, x * 1e-310] {
                worst = worst.max(rel_ulps(ln(x), x.ln()));
            }
            let y = (i as f64 - 10_000.0) * 0.0707;
            worst = worst.max(rel_ulps(exp(y), y.exp()));
        }
        assert!(worst <= 4.0, "{worst} ulps");
        assert_eq!(exp(-800.0), (-800.0f64).exp());
        assert_eq!(exp(710.0), f64::INFINITY);
        assert_eq!(exp(-1e300), 0.0);
        assert_eq!(ln(0.0), f64::NEG_INFINITY);
        assert!(ln(-1.0).is_nan() && exp(f64::NAN).is_nan());
        assert_eq!(ln(f64::INFINITY), f64::INFINITY);
        assert_eq!(ln(1.0), 0.0);
    }

    #[test]
    fn powf_of_rotary_frequencies() {
        let mut worst: f64 = 0.0;
        for theta in [10_000.0, 500_000.0, 1e6, 1.5e7, 2.0, 0.5] {
            for dim in [2, 6, 64, 128, 18] {
                for i in (0..dim).step_by(2) {
                    let y = i as f64 / dim as f64;
                    worst = worst.max(rel_ulps(powf(theta, y), theta.powf(y)));
                }
            }
        }
        assert!(worst <= 24.0, "{worst} ulps");
    }

    #[test]
    fn floor_and_ceil_against_std() {
        for x in [
            0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.999, -2.999, 1e15, -1e15, 4.5e15, 1e300, -1e300,
        ] {
            assert_eq!(floor(x), x.floor(), "floor({x})");
            assert_eq!(ceil(x), x.ceil(), "ceil({x})");
        }
        assert!(floor(f64::NAN).is_nan());
        assert_eq!(ceil(f64::NEG_INFINITY), f64::NEG_INFINITY);
    }

    /// Within an ulp of `f64::sqrt` over head widths, powers of two and awkward values.
    #[test]
    fn sqrt_matches_std() {
        let mut values: std::vec::Vec<f64> = (1..=4096).map(|d| d as f64).collect();
        values.extend((-60..60).map(|e| 2f64.powi(e)));
        values.extend([
            5e-324,
            1e-310,
            1e-300,
            3e-7,
            0.3,
            1.5,
            7.77,
            1e15,
            1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
        ]);
        for x in values {
            let (ours, std) = (sqrt(x), x.sqrt());
            let ulps = (ours.to_bits() as i64 - std.to_bits() as i64).abs();
            assert!(ulps <= 1, "sqrt({x}) = {ours}, std {std}");
        }
        assert_eq!(sqrt(0.0), 0.0);
        assert_eq!(sqrt(-4.0), 0.0);
        assert_eq!(sqrt(f64::INFINITY), f64::INFINITY);
        assert!(sqrt(f64::NAN).is_nan());
    }
}
