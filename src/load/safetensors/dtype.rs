//! [`Dtype`], the element types of the format, and the exact conversions of the 16-bit float
//! formats to `f32`.

use core::fmt;

/// The element type of a tensor, as the header's `dtype` string names it.
///
/// All the dtypes the reference implementation defines are known, so the size of every tensor
/// can be checked against its byte range; a string that is none of these is rejected with
/// [`SafeTensorsError::UnknownDtype`](super::SafeTensorsError::UnknownDtype). Only
/// [`F32`](Self::F32), [`F16`](Self::F16) and [`BF16`](Self::BF16) convert to `f32`
/// ([`TensorView::to_f32`](super::TensorView::to_f32)); the others can still be read as raw
/// little-endian bytes ([`TensorView::data`](super::TensorView::data)).
///
/// ```
/// use mha::safetensors::Dtype;
/// assert_eq!(Dtype::from_name("BF16"), Some(Dtype::BF16));
/// assert_eq!(Dtype::I64.bits(), 64);
/// assert_eq!(Dtype::F8E4M3.to_string(), "F8_E4M3");
/// assert_eq!(Dtype::from_name("float32"), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Dtype {
    /// `BOOL`: one byte per element.
    Bool,
    /// `U8`: unsigned 8-bit integer.
    U8,
    /// `I8`: signed 8-bit integer.
    I8,
    /// `F8_E5M2`: 8-bit float, 5 exponent and 2 mantissa bits.
    F8E5M2,
    /// `F8_E4M3`: 8-bit float, 4 exponent and 3 mantissa bits.
    F8E4M3,
    /// `F8_E8M0`: 8-bit exponent-only scale (microscaling formats).
    F8E8M0,
    /// `I16`: signed 16-bit integer.
    I16,
    /// `U16`: unsigned 16-bit integer.
    U16,
    /// `F16`: IEEE 754 half precision (1 sign, 5 exponent, 10 mantissa bits).
    F16,
    /// `BF16`: bfloat16, the upper half of an `f32` (1 sign, 8 exponent, 7 mantissa bits).
    BF16,
    /// `I32`: signed 32-bit integer.
    I32,
    /// `U32`: unsigned 32-bit integer.
    U32,
    /// `F32`: IEEE 754 single precision.
    F32,
    /// `F64`: IEEE 754 double precision.
    F64,
    /// `C64`: complex number of two `f32`.
    C64,
    /// `I64`: signed 64-bit integer (e.g. `position_ids`).
    I64,
    /// `U64`: unsigned 64-bit integer.
    U64,
    /// `F4`: 4-bit float (E2M1), two elements per byte.
    F4,
    /// `F6_E2M3`: 6-bit float, 2 exponent and 3 mantissa bits, packed.
    F6E2M3,
    /// `F6_E3M2`: 6-bit float, 3 exponent and 2 mantissa bits, packed.
    F6E3M2,
}

impl Dtype {
    /// Every dtype, in the order of the enum.
    pub const ALL: [Dtype; 20] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8E5M2,
        Dtype::F8E4M3,
        Dtype::F8E8M0,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::F64,
        Dtype::C64,
        Dtype::I64,
        Dtype::U64,
        Dtype::F4,
        Dtype::F6E2M3,
        Dtype::F6E3M2,
    ];

    /// The string the header uses for this dtype, e.g. `"F8_E4M3"`.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::C64 => "C64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
            Dtype::F4 => "F4",
            Dtype::F6E2M3 => "F6_E2M3",
            Dtype::F6E3M2 => "F6_E3M2",
        }
    }

    /// The dtype the header string `name` stands for (case-sensitive, as in the format).
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The size of one element in bits: 4 for `F4`, 6 for the `F6` types, else 8 × bytes.
    pub const fn bits(self) -> usize {
        match self {
            Dtype::F4 => 4,
            Dtype::F6E2M3 | Dtype::F6E3M2 => 6,
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 8,
            Dtype::F8E5M2 | Dtype::F8E4M3 | Dtype::F8E8M0 => 8,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 16,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
            Dtype::F64 | Dtype::C64 | Dtype::I64 | Dtype::U64 => 64,
        }
    }

    /// Whether [`TensorView::to_f32`](super::TensorView::to_f32) accepts this dtype: `F32`,
    /// `F16` and `BF16`, which all convert exactly.
    pub const fn converts_to_f32(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F16 | Dtype::BF16)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Converts IEEE 754 half-precision bits to `f32`, exactly: every `f16` value, subnormals,
/// infinities and signed zeros included, is an `f32` value. NaNs stay NaNs, with sign and
/// payload kept.
///
/// ```
/// use mha::safetensors::f16_to_f32;
/// assert_eq!(f16_to_f32(0x3c00), 1.0);
/// assert_eq!(f16_to_f32(0xc100), -2.5);
/// assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24)); // smallest subnormal
/// assert_eq!(f16_to_f32(0x7bff), 65504.0); // largest finite
/// assert!(f16_to_f32(0x7e00).is_nan());
/// ```
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    match exp {
        0 => {
            // Subnormal (or zero): mant · 2^-24, exact in f32 since mant < 2^10 and 2^-24 is
            // far above f32's subnormal range. Build the magnitude, then set the sign bit so
            // that -0 stays -0.
            let two_pow_minus_24 = f32::from_bits((127 - 24) << 23);
            f32::from_bits(sign | (mant as f32 * two_pow_minus_24).to_bits())
        }
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (mant << 13)),
        _ => f32::from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13)),
    }
}

/// Converts bfloat16 bits to `f32`, exactly: bfloat16 is the upper 16 bits of an `f32`.
///
/// ```
/// use mha::safetensors::bf16_to_f32;
/// assert_eq!(bf16_to_f32(0x3f80), 1.0);
/// assert_eq!(bf16_to_f32(0xc020), -2.5);
/// ```
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}
