//! The crate's own `exp`: `f32::exp` needs `std`, and a softmax needs millions of them.
//!
//! Range reduction `x = n·ln2 + r` with `|r| ≤ ln2/2`, a polynomial for `e^r`, then a scale by
//! `2^n` built from the exponent bits. `exp(-inf) = 0`, `exp(+inf) = +inf`, `exp(NaN) = NaN`.

/// `e^x` for `f32`.
///
/// ```
/// assert_eq!(mha::kernels::exp::exp(0.0), 1.0);
/// assert_eq!(mha::kernels::exp::exp(f32::NEG_INFINITY), 0.0);
/// assert!((mha::kernels::exp::exp(1.0) - core::f32::consts::E).abs() <= f32::EPSILON * 3.0);
/// ```
#[inline]
pub fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = core::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    if x.is_nan() {
        return x;
    }
    if x > 88.722_84 {
        return f32::INFINITY;
    }
    if x < -103.972_08 {
        return 0.0;
    }
    // Round x·log2(e) to the nearest integer with the 1.5·2^23 trick.
    const ROUNDER: f32 = 12_582_912.0;
    let n = (x * LOG2_E + ROUNDER) - ROUNDER;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    // Scale by 2^n in two steps so that subnormal results and n = 128 stay exact.
    let n = n as i32;
    let half = n / 2;
    let two_to = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    e_r * two_to(half) * two_to(n - half)
}
