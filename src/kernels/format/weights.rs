//! [`WeightValues`]: the values of a weight matrix in the element format a checkpoint stores
//! them in (`f32`, or the bits of bfloat16 or binary16 values), and [`WeightSlice`], the
//! same borrowed, which packing reads without widening a 16-bit matrix it keeps 16-bit.

use alloc::vec::Vec;
use core::mem::MaybeUninit;

use crate::kernels::format::element::{bf16_to_f32, f16_to_f32, Element};
use crate::kernels::format::WeightFormat;

/// The values of a weight matrix as a checkpoint stores them: `f32`, or the bits of bfloat16
/// or binary16 values. A layer built in the matrix's own format packs the stored bits as
/// they are (a 16-bit matrix is never widened to `f32` and rounded back); in another format
/// the values are widened exactly first.
///
/// ```
/// use mha::{WeightFormat, WeightValues};
/// // bfloat16 bits of 1.0 and -2.5.
/// let w = WeightValues::Bf16(vec![0x3f80, 0xc020]);
/// assert_eq!((w.len(), w.format()), (2, WeightFormat::Bf16));
/// assert_eq!(w.to_f32(), [1.0, -2.5]);
/// assert_eq!(WeightValues::from(vec![0.5f32]).as_f32(), Some(&[0.5][..]));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum WeightValues {
    /// `f32` values.
    F32(Vec<f32>),
    /// bfloat16 bits (the upper half of an `f32`).
    Bf16(Vec<u16>),
    /// IEEE binary16 bits.
    F16(Vec<u16>),
}

impl Default for WeightValues {
    fn default() -> Self {
        WeightValues::F32(Vec::new())
    }
}

impl From<Vec<f32>> for WeightValues {
    fn from(values: Vec<f32>) -> Self {
        WeightValues::F32(values)
    }
}

impl WeightValues {
    /// The number of values.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The format its values are stored in.
    pub fn format(&self) -> WeightFormat {
        match self {
            WeightValues::F32(_) => WeightFormat::F32,
            WeightValues::Bf16(_) => WeightFormat::Bf16,
            WeightValues::F16(_) => WeightFormat::F16,
        }
    }

    /// The values as `f32` (16-bit ones widened exactly).
    pub fn to_f32(&self) -> Vec<f32> {
        let values = self.as_slice();
        (0..values.len()).map(|i| values.get(i)).collect()
    }

    /// The values as `f32`, without a copy when they are `f32`.
    pub fn into_f32(self) -> Vec<f32> {
        match self {
            WeightValues::F32(values) => values,
            other => other.to_f32(),
        }
    }

    /// The `f32` values, when it holds `f32`.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            WeightValues::F32(values) => Some(values),
            _ => None,
        }
    }

    /// Its values, borrowed.
    pub(crate) fn as_slice(&self) -> WeightSlice<'_> {
        match self {
            WeightValues::F32(values) => WeightSlice::F32(values),
            WeightValues::Bf16(bits) => WeightSlice::Bf16(bits),
            WeightValues::F16(bits) => WeightSlice::F16(bits),
        }
    }
}

/// The values of (a part of) a weight matrix, borrowed, in their stored format.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WeightSlice<'a> {
    /// `f32` values.
    F32(&'a [f32]),
    /// bfloat16 bits.
    Bf16(&'a [u16]),
    /// binary16 bits.
    F16(&'a [u16]),
}

impl<'a> From<&'a [f32]> for WeightSlice<'a> {
    fn from(values: &'a [f32]) -> Self {
        WeightSlice::F32(values)
    }
}

impl<'a> From<&'a Vec<f32>> for WeightSlice<'a> {
    fn from(values: &'a Vec<f32>) -> Self {
        WeightSlice::F32(values)
    }
}

impl<'a> WeightSlice<'a> {
    /// The number of values.
    pub(crate) fn len(self) -> usize {
        match self {
            WeightSlice::F32(values) => values.len(),
            WeightSlice::Bf16(bits) | WeightSlice::F16(bits) => bits.len(),
        }
    }

    /// The element format of its values.
    pub(crate) fn element(self) -> Element {
        match self {
            WeightSlice::F32(_) => Element::F32,
            WeightSlice::Bf16(_) => Element::Bf16,
            WeightSlice::F16(_) => Element::F16,
        }
    }

    /// Value `i` (`< len`), widened exactly.
    pub(crate) fn get(self, i: usize) -> f32 {
        match self {
            WeightSlice::F32(values) => values[i],
            WeightSlice::Bf16(bits) => bf16_to_f32(bits[i]),
            WeightSlice::F16(bits) => f16_to_f32(bits[i]),
        }
    }

    /// Values `start .. end` (within `len`).
    pub(crate) fn range(self, start: usize, end: usize) -> Self {
        match self {
            WeightSlice::F32(values) => WeightSlice::F32(&values[start..end]),
            WeightSlice::Bf16(bits) => WeightSlice::Bf16(&bits[start..end]),
            WeightSlice::F16(bits) => WeightSlice::F16(&bits[start..end]),
        }
    }

    /// The index of the first value (widened) for which `pred` holds.
    pub(crate) fn position(self, pred: impl Fn(f32) -> bool) -> Option<usize> {
        match self {
            WeightSlice::F32(values) => values.iter().position(|&x| pred(x)),
            WeightSlice::Bf16(bits) => bits.iter().position(|&b| pred(bf16_to_f32(b))),
            WeightSlice::F16(bits) => bits.iter().position(|&b| pred(f16_to_f32(b))),
        }
    }

    /// Initialises `dst` (of its length) with `convert` of each value, widened.
    pub(crate) fn convert_into<T>(self, dst: &mut [MaybeUninit<T>], convert: impl Fn(f32) -> T) {
        fn each<S: Copy, T>(dst: &mut [MaybeUninit<T>], src: &[S], convert: impl Fn(S) -> T) {
            for (d, &s) in dst.iter_mut().zip(src) {
                d.write(convert(s));
            }
        }
        match self {
            WeightSlice::F32(values) => each(dst, values, convert),
            WeightSlice::Bf16(bits) => each(dst, bits, |b| convert(bf16_to_f32(b))),
            WeightSlice::F16(bits) => each(dst, bits, |b| convert(f16_to_f32(b))),
        }
    }
}
