//! [`WeightValues`]: the values of a weight matrix in the format a checkpoint stores them in
//! (`f32`, the bits of bfloat16 or binary16 values, or ggml's quantized blocks), and
//! [`MatrixRef`], the same borrowed, which packing reads without widening a matrix it keeps
//! in its own format ([`WeightSlice`] for the element formats).

use alloc::vec::Vec;
use core::mem::MaybeUninit;

use crate::error::ShapeError;
use crate::kernels::buffer::{run_time_len, try_filled};
use crate::kernels::format::blocks::{dequantize, BlockRows, Quant};
use crate::kernels::format::element::{bf16_to_f32, f16_to_f32, Element};
use crate::kernels::format::formats::Storage;
use crate::kernels::format::WeightFormat;

/// The values of a weight matrix `(inputs, outputs)` as a checkpoint stores them: `f32` or
/// the bits of bfloat16 or binary16 values, row-major in the `x @ W` convention (rows are
/// inputs); or ggml's quantized blocks as a GGUF tensor holds them, the transposed layout:
/// `outputs` rows of `inputs` values in blocks. A layer built in the matrix's own format
/// packs the stored bits or blocks as they are (nothing is widened to `f32` and rounded
/// back); in another format the values are widened exactly first (blocks to the values of
/// ggml's reference dequantization).
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
    /// ggml's blocks of a block format, output by output (made by [`WeightValues::blocks`],
    /// which checks the sizes).
    Blocks(WeightBlocks),
}

/// A weight matrix in ggml's blocks of a block format ([`WeightFormat::Q8_0`],
/// [`WeightFormat::Q4_0`], [`WeightFormat::Q4_K`], [`WeightFormat::Q5_K`],
/// [`WeightFormat::Q6_K`]): output `j`'s `inputs` values are the `inputs / block values`
/// blocks at `bytes[j · row_bytes ..]`, exactly a GGUF tensor's bytes. Made only by
/// [`WeightValues::blocks`], so its format is a block format and its bytes whole rows.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightBlocks {
    /// The block type.
    pub(crate) quant: Quant,
    /// The number of inputs, a whole number of blocks.
    pub(crate) inputs: usize,
    /// The blocks, output by output (whole rows).
    pub(crate) bytes: Vec<u8>,
}

impl WeightBlocks {
    /// Its block format.
    pub fn format(&self) -> WeightFormat {
        WeightFormat::of_blocks(self.quant)
    }

    /// The number of inputs (values per output), a whole number of blocks.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// The blocks, output by output.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
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
    /// The matrix of `inputs` inputs whose outputs' blocks in the block `format` are `bytes`
    /// (a GGUF tensor of shape `[inputs, outputs]`, as ggml writes shapes); `None` unless
    /// `format` is a block format, `inputs` a whole number of its blocks and `bytes` whole
    /// rows of them.
    ///
    /// ```
    /// use mha::{WeightFormat, WeightValues};
    /// // One output of 32 inputs in q8_0: scale 0.5 (binary16 0x3800), integers 2.
    /// let mut bytes = vec![0x00, 0x38];
    /// bytes.extend([2u8; 32]);
    /// let w = WeightValues::blocks(WeightFormat::Q8_0, 32, bytes.clone()).unwrap();
    /// assert_eq!((w.len(), w.format()), (32, WeightFormat::Q8_0));
    /// assert_eq!(w.to_f32(), vec![1.0; 32]);
    /// assert!(WeightValues::blocks(WeightFormat::Q8_0, 40, bytes.clone()).is_none());
    /// // An element format has no blocks.
    /// assert!(WeightValues::blocks(WeightFormat::F16, 32, bytes).is_none());
    /// ```
    pub fn blocks(format: WeightFormat, inputs: usize, bytes: Vec<u8>) -> Option<Self> {
        let Storage::Blocks(quant) = format.storage() else {
            return None;
        };
        let row_bytes = inputs / quant.values() * quant.bytes();
        let whole = inputs.is_multiple_of(quant.values())
            && (row_bytes == 0 || bytes.len().is_multiple_of(row_bytes));
        whole.then_some(WeightValues::Blocks(WeightBlocks {
            quant,
            inputs,
            bytes,
        }))
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        match self.as_matrix() {
            MatrixRef::Values(values) => values.len(),
            MatrixRef::Blocks(blocks) => blocks.rows() * blocks.k,
        }
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The format its values are stored in.
    pub fn format(&self) -> WeightFormat {
        self.as_matrix().format()
    }

    /// The values as `f32` in the `x @ W` layout, `(inputs, outputs)` row-major (16-bit ones
    /// widened exactly, blocks to the values of ggml's reference dequantization). Like any
    /// `Vec` it aborts when its memory cannot be allocated.
    pub fn to_f32(&self) -> Vec<f32> {
        match self.as_matrix() {
            MatrixRef::Values(values) => (0..values.len()).map(|i| values.get(i)).collect(),
            // As any `Vec` whose memory cannot be had, it aborts then.
            MatrixRef::Blocks(blocks) => blocks.try_x_at_w().unwrap_or_else(|_| {
                alloc::alloc::handle_alloc_error(core::alloc::Layout::new::<f32>())
            }),
        }
    }

    /// The values as `f32`, without a copy when they are `f32`.
    pub fn into_f32(self) -> Vec<f32> {
        match self {
            WeightValues::F32(values) => values,
            other => other.to_f32(),
        }
    }

    /// The values as `f32` in the order they are stored: as [`to_f32`](Self::to_f32) but
    /// for blocks, whose values come output by output, `(outputs, inputs)` row-major.
    pub fn to_f32_as_stored(&self) -> Vec<f32> {
        match self.as_matrix() {
            MatrixRef::Blocks(blocks) => blocks.try_dequantized().unwrap_or_else(|_| {
                alloc::alloc::handle_alloc_error(core::alloc::Layout::new::<f32>())
            }),
            MatrixRef::Values(_) => self.to_f32(),
        }
    }

    /// The `f32` values, when it holds `f32`.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            WeightValues::F32(values) => Some(values),
            _ => None,
        }
    }

    /// The matrix, borrowed.
    pub(crate) fn as_matrix(&self) -> MatrixRef<'_> {
        match self {
            WeightValues::F32(values) => MatrixRef::Values(WeightSlice::F32(values)),
            WeightValues::Bf16(bits) => MatrixRef::Values(WeightSlice::Bf16(bits)),
            WeightValues::F16(bits) => MatrixRef::Values(WeightSlice::F16(bits)),
            WeightValues::Blocks(blocks) => MatrixRef::Blocks(BlockRows {
                quant: blocks.quant,
                bytes: &blocks.bytes,
                k: blocks.inputs,
                group: 1,
            }),
        }
    }
}

/// A weight matrix `(inputs, outputs)`, borrowed in its stored format: values in the
/// `x @ W` layout, or ggml's blocks of each output (see [`WeightValues`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum MatrixRef<'a> {
    /// Element values, `(inputs, outputs)` row-major.
    Values(WeightSlice<'a>),
    /// Blocks, output by output.
    Blocks(BlockRows<'a>),
}

impl MatrixRef<'_> {
    /// The format it is stored in.
    pub(crate) fn format(self) -> WeightFormat {
        match self {
            MatrixRef::Values(WeightSlice::F32(_)) => WeightFormat::F32,
            MatrixRef::Values(WeightSlice::Bf16(_)) => WeightFormat::Bf16,
            MatrixRef::Values(WeightSlice::F16(_)) => WeightFormat::F16,
            MatrixRef::Blocks(blocks) => WeightFormat::of_blocks(blocks.quant),
        }
    }
}

impl BlockRows<'_> {
    /// The number of rows (outputs).
    pub(crate) fn rows(self) -> usize {
        match self.row_bytes() {
            0 => 0,
            row_bytes => self.bytes.len() / row_bytes,
        }
    }

    /// Its values dequantized, row by row: `(rows, k)` row-major.
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] or [`ShapeError::AllocationFailed`] when they do not fit in
    /// memory.
    pub(crate) fn try_dequantized(self) -> Result<Vec<f32>, ShapeError> {
        const WHAT: &str = "blocks dequantized to f32 (n, k)";
        let len = run_time_len::<f32>(WHAT, &[self.rows(), self.k])?;
        let mut out = Vec::new();
        out.try_reserve_exact(len)
            .map_err(|_| ShapeError::AllocationFailed {
                what: WHAT,
                bytes: len * size_of::<f32>(),
            })?;
        dequantize(
            self.quant,
            &self.bytes[..self.rows() * self.row_bytes()],
            &mut out,
        );
        Ok(out)
    }

    /// Its values dequantized, in the `x @ W` layout `(k, rows)` row-major.
    ///
    /// # Errors
    /// As [`try_dequantized`](Self::try_dequantized).
    pub(crate) fn try_x_at_w(self) -> Result<Vec<f32>, ShapeError> {
        const WHAT: &str = "blocks dequantized to f32 (k, n)";
        let (k, n) = (self.k, self.rows());
        let mut out = try_filled(WHAT, run_time_len::<f32>(WHAT, &[k, n])?, 0.0)?;
        // One row dequantized at a time, into a buffer of `k` reused for every row.
        let mut row = Vec::new();
        row.try_reserve_exact(k)
            .map_err(|_| ShapeError::AllocationFailed {
                what: "a row of blocks dequantized to f32 (k)",
                bytes: k * size_of::<f32>(),
            })?;
        for j in 0..n {
            row.clear();
            dequantize(self.quant, self.row(j), &mut row);
            for (p, &x) in row.iter().enumerate() {
                out[p * n + j] = x;
            }
        }
        Ok(out)
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

    /// The first value (with its index) that is finite but becomes an infinity when rounded
    /// to `format` (in a block format: makes its block's scale one); none when the values are
    /// stored in `format` already, or it is `f32`.
    pub(crate) fn first_overflow(self, format: WeightFormat) -> Option<(usize, f32)> {
        let same = format.storage() == Storage::Element(self.element());
        if format == WeightFormat::F32 || same {
            return None;
        }
        let index = self.position(|x| x.is_finite() && format.overflows(x))?;
        Some((index, self.get(index)))
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
