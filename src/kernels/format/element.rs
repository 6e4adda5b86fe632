//! The element formats the kernels store numbers in, and the scalar conversions between
//! them and `f32`: rounding on the way in (keys and values when appended, weights when
//! packed), exact widening on the way out (the vector widening of `read.rs` gives the same
//! values).
//!
//! - [`Element::F32`]: the values as computed.
//! - [`Element::Bf16`]: the top 16 bits of the `f32` after rounding to nearest, ties to even
//!   (a NaN stays a quiet NaN).
//! - [`Element::F16`]: IEEE binary16, rounded to nearest, ties to even (subnormals kept,
//!   magnitudes from 65520 on become infinities, a NaN the quiet NaN `0x7e00`).
//! - [`Element::Q8_0`]: blocks of [`Q8_BLOCK`] consecutive values along the head dimension (a
//!   head of `d` values has `⌈d / 32⌉` blocks, the last one short when 32 does not divide
//!   `d`), each one `f32` scale `s = min(max|x| / 127, Q8_MAX_SCALE)` (the quotient rounded in
//!   `f32`) and one `i8` per value, `q = clamp(round(x / s), -127, 127)` (the quotient rounded
//!   in `f32`, then to the nearest integer, ties to even; 0 when `s` is 0). A value reads back
//!   as `q · s`, rounded in `f32`, on every path (the vector widening is the same one
//!   product). [`Q8_MAX_SCALE`] is the largest `f32` whose 127 multiple is finite, so a block
//!   of finite values always reads back finite. It is below `max|x| / 127` only for a block
//!   holding ±`f32::MAX` (that quotient rounds up, and `127 · s` would overflow to infinity),
//!   whose extreme values then read back as ±`127 · Q8_MAX_SCALE`, the largest multiple below
//!   `f32::MAX`; every other block's scale, and so every other bit, is as it was. A non-finite
//!   value makes its block's scale non-finite, so the whole block reads back as NaN; no other
//!   block (token, head or batch element) is touched.

/// How stored numbers are kept: the one list behind [`KvFormat`](crate::KvFormat) and
/// [`WeightFormat`](crate::WeightFormat) (each a choice among these).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) enum Element {
    /// `f32`, as computed.
    #[default]
    F32,
    /// bfloat16 bits.
    Bf16,
    /// binary16 bits.
    F16,
    /// `q8_0` blocks: one `i8` per value, one `f32` scale per [`Q8_BLOCK`] values (at most
    /// [`Q8_MAX_SCALE`], so finite values read back finite).
    Q8_0,
}

impl Element {
    /// Its name, as llama.cpp and safetensors spell it in lower case: `f32`, `bf16`, `f16`,
    /// `q8_0`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Element::F32 => "f32",
            Element::Bf16 => "bf16",
            Element::F16 => "f16",
            Element::Q8_0 => "q8_0",
        }
    }

    /// The average bytes per stored value: 4, 2, 2, or `1 + 4 / 32` (a `q8_0` block's scale).
    pub(crate) fn bytes_per_value(self) -> f64 {
        match self {
            Element::F32 => 4.0,
            Element::Bf16 | Element::F16 => 2.0,
            Element::Q8_0 => 1.0 + 4.0 / Q8_BLOCK as f64,
        }
    }

    /// Whether some finite `f32` becomes an infinity when rounded to this format (the 16-bit
    /// formats).
    pub(crate) fn can_overflow(self) -> bool {
        matches!(self, Element::Bf16 | Element::F16)
    }

    /// Whether the finite `x` becomes an infinity when rounded to this format (a `q8_0`
    /// block's scale of a finite block is finite).
    #[inline]
    pub(crate) fn overflows(self, x: f32) -> bool {
        match self {
            Element::F32 | Element::Q8_0 => false,
            Element::Bf16 => bf16_to_f32(bf16_from_f32(x)).is_infinite(),
            Element::F16 => f16_to_f32(f16_from_f32(x)).is_infinite(),
        }
    }
}

/// Values per block of [`Element::Q8_0`], along the head dimension.
pub(crate) const Q8_BLOCK: usize = 32;

/// The quiet NaN of binary16.
const F16_NAN: u16 = 0x7e00;

/// `x` rounded to bfloat16 (nearest, ties to even), as its bits.
pub(crate) fn bf16_from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// The bfloat16 `bits` as `f32` (exact).
#[inline(always)]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `x` rounded to binary16 (nearest, ties to even), as its bits.
pub(crate) fn f16_from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let magnitude = bits & 0x7fff_ffff;
    if x.is_nan() {
        return sign | F16_NAN;
    }
    if magnitude >= 0x4780_0000 {
        // 2^16 and more (infinity too): beyond the largest binary16 even after rounding.
        return sign | 0x7c00;
    }
    if magnitude >= 0x3880_0000 {
        // A normal binary16 (2^-14 and up): rebias the exponent (127 → 15), then round off 13
        // significand bits; a carry into the exponent is the right result (up to infinity).
        let rebiased = magnitude - (112 << 23);
        let round = 0x0fff + ((rebiased >> 13) & 1);
        return sign | ((rebiased + round) >> 13) as u16;
    }
    // A subnormal binary16 or zero: a whole number of 2^-24. `x · 2^24` is exact and below
    // 1024, and adding 1.5 · 2^23 rounds it to an integer, ties to even.
    const ROUNDER: f32 = 12_582_912.0;
    let units = f32::from_bits(magnitude) * 16_777_216.0;
    sign | ((units + ROUNDER) - ROUNDER) as u16
}

/// bfloat16 (`BF16`) or binary16 `bits` as `f32` (exact).
#[inline(always)]
pub(crate) fn half_to_f32<const BF16: bool>(bits: u16) -> f32 {
    if BF16 {
        bf16_to_f32(bits)
    } else {
        f16_to_f32(bits)
    }
}

/// The binary16 `bits` as `f32` (exact).
#[inline(always)]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x03ff);
    let magnitude = match exponent {
        // Zero or subnormal: mantissa · 2^-24, exact in f32.
        0 => (mantissa as f32 * (1.0 / 16_777_216.0)).to_bits(),
        0x1f => 0x7f80_0000 | (mantissa << 13),
        _ => ((exponent + 112) << 23) | (mantissa << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// The largest [`Element::Q8_0`] scale: the largest `f32` whose 127 multiple is finite, one
/// step below `f32::MAX / 127` (which rounds up: `127 ·` it is infinite).
pub(crate) const Q8_MAX_SCALE: f32 = f32::from_bits((f32::MAX / 127.0).to_bits() - 1);

/// The [`Element::Q8_0`] scale of one block: `max|x| / 127`, at most [`Q8_MAX_SCALE`] for
/// finite values (so that every `q · scale` is finite); a NaN when the block holds one, infinite
/// when it holds an infinity.
pub(crate) fn q8_scale(block: &[f32]) -> f32 {
    let mut most = 0.0f32;
    for &x in block {
        if x.is_nan() {
            return f32::NAN;
        }
        most = most.max(f32::from_bits(x.to_bits() & 0x7fff_ffff));
    }
    let scale = most / 127.0;
    if scale.is_finite() {
        scale.min(Q8_MAX_SCALE)
    } else {
        scale
    }
}

/// `x` of a block with scale `scale` as its [`Element::Q8_0`] integer.
#[inline(always)]
pub(crate) fn q8_from_f32(x: f32, scale: f32) -> i8 {
    if scale == 0.0 {
        return 0;
    }
    const ROUNDER: f32 = 12_582_912.0;
    // |x / scale| is at most about 127 for a finite scale (a NaN saturates to 0 below).
    let quotient = (x / scale).clamp(-127.0, 127.0);
    ((quotient + ROUNDER) - ROUNDER) as i8
}

/// The value of the [`Element::Q8_0`] integer `q` of a block with scale `scale`.
#[inline(always)]
pub(crate) fn q8_to_f32(q: i8, scale: f32) -> f32 {
    f32::from(q) * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every binary16 widens to itself and rounds back to itself (NaNs to the quiet NaN).
    #[test]
    fn f16_round_trip() {
        for bits in 0..=u16::MAX {
            let x = f16_to_f32(bits);
            let back = f16_from_f32(x);
            if x.is_nan() {
                assert_eq!(back & 0x7fff, F16_NAN, "{bits:#x}");
            } else {
                assert_eq!(back, bits, "{bits:#x} -> {x}");
            }
        }
    }

    /// Halfway cases round to even, overflow to infinity.
    #[test]
    fn f16_ties_and_overflow() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: to 1 (even).
        assert_eq!(f16_from_f32(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f16_from_f32(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f16_from_f32(65504.0), 0x7bff);
        assert_eq!(f16_from_f32(65519.0), 0x7bff);
        assert_eq!(f16_from_f32(65520.0), 0x7c00);
        assert_eq!(f16_from_f32(-2f32.powi(-25)), 0x8000);
        assert_eq!(f16_from_f32(3.0 * 2f32.powi(-25)), 0x0002);
    }

    /// `Q8_MAX_SCALE` is the largest scale whose 127 multiple is finite, and it changes the
    /// scale of a block only where `127 · (max|x| / 127)` would overflow: of the block maxima
    /// from 2^127 up, only `f32::MAX` (its quotient rounds up). Finite blocks read back finite.
    #[test]
    fn q8_scales_keep_finite_values_finite() {
        assert!((127.0 * Q8_MAX_SCALE).is_finite());
        assert!((127.0 * f32::from_bits(Q8_MAX_SCALE.to_bits() + 1)).is_infinite());
        let top = (0x7f00_0000..=0x7f7f_ffff).step_by(97);
        for bits in top.chain([0x7f7f_fffe, 0x7f7f_ffff]) {
            let most = f32::from_bits(bits);
            let scale = q8_scale(&[most, -0.5 * most, 1.0]);
            assert_eq!(scale == most / 127.0, bits != 0x7f7f_ffff, "{most:e}");
            for x in [most, -most, 0.5 * most] {
                let back = q8_to_f32(q8_from_f32(x, scale), scale);
                assert!(back.is_finite(), "{x:e} -> {back}");
            }
        }
        assert_eq!(q8_scale(&[f32::MAX]), Q8_MAX_SCALE);
        assert_eq!(q8_scale(&[1.0, f32::INFINITY]), f32::INFINITY);
        assert!(q8_scale(&[f32::NAN, 1.0]).is_nan());
    }

    /// bfloat16 keeps the top bits, rounding to even.
    #[test]
    fn bf16_rounding() {
        assert_eq!(bf16_from_f32(1.0), 0x3f80);
        assert_eq!(bf16_from_f32(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(bf16_from_f32(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(bf16_from_f32(f32::MAX), 0x7f80);
        assert!(bf16_to_f32(bf16_from_f32(f32::NAN)).is_nan());
    }
}
