//! How a [`PackedB`] is made: from row-major `f32` values or stored weights (any element
//! format, or ggml's blocks, copied, dequantized or quantized), for the products of a
//! [`Compute`]; the checks on its sizes; the panel writer (rounding to 16 bits, streaming large
//! `f32` panels past the caches).

use alloc::vec::Vec;
use core::mem::MaybeUninit;

use super::{Data, PackedB, PACKED};
use crate::error::ShapeError;
use crate::kernels::buffer::run_time_len;
use crate::kernels::format::blocks::{dequantize, Quant};
use crate::kernels::format::element::{bf16_from_f32, f16_from_f32, Element};
use crate::kernels::format::formats::Storage;
use crate::kernels::format::weights::{MatrixRef, WeightSlice};
use crate::kernels::format::{Compute, Elements, WeightFormat};
use crate::kernels::gemm::bf16::AmxPanels;
use crate::kernels::gemm::int8::Int8Panels;
use crate::kernels::{Isa, Kernels};

impl PackedB {
    /// Packs the row-major `(k, n)` matrix `b` for the instruction set `isa`, in `f32`.
    /// Either size may be 0 (then [`gemm`](crate::kernels::gemm()) gives `C = 0` or has nothing to
    /// compute).
    ///
    /// ```
    /// use mha::kernels::{Isa, PackedB};
    /// let empty = PackedB::from_row_major(Isa::detect(), &[], usize::MAX, 0)?;
    /// assert_eq!((empty.rows(), empty.cols()), (usize::MAX, 0));
    /// assert!(PackedB::from_row_major(Isa::detect(), &[], usize::MAX, 2).is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// As [`from_row_major_as`](Self::from_row_major_as).
    pub fn from_row_major(isa: Isa, b: &[f32], k: usize, n: usize) -> Result<Self, ShapeError> {
        Self::from_row_major_as(isa, b, k, n, WeightFormat::F32)
    }

    /// Packs the row-major `(k, n)` matrix `b` for the instruction set `isa`, each value
    /// rounded to `format` (to nearest, ties to even). A product then has the bits of the
    /// product with the `f32` matrix of the rounded values; a 16-bit format holds half the
    /// bytes.
    ///
    /// ```
    /// use mha::kernels::{gemm, Isa, PackedB};
    /// use mha::WeightFormat;
    /// // 1 + 2^-10 is not a bfloat16: it rounds to 1.
    /// let b = [1.0 + 1.0 / 1024.0, 2.0];
    /// let half = PackedB::from_row_major_as(Isa::detect(), &b, 1, 2, WeightFormat::Bf16)?;
    /// let mut c = [0.0; 2];
    /// gemm(&[3.0], 1, &half, &mut c, 1)?;
    /// assert_eq!(c, [3.0, 6.0]);
    /// // 100000 is past the largest binary16.
    /// let err = PackedB::from_row_major_as(Isa::detect(), &[1e5], 1, 1, WeightFormat::F16);
    /// assert!(err.is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] naming the sizes when the matrix or its packed form (`n`
    /// rounded up to whole panels) would not fit in memory, [`ShapeError::LengthMismatch`]
    /// when `b.len() != k * n`, [`ShapeError::WeightRange`] when a finite value rounds to an
    /// infinity in `format`, [`ShapeError::UnsupportedIsa`] when `isa` is not supported on
    /// this CPU, [`ShapeError::AllocationFailed`] when the packed form cannot be allocated.
    pub fn from_row_major_as(
        isa: Isa,
        b: &[f32],
        k: usize,
        n: usize,
        format: WeightFormat,
    ) -> Result<Self, ShapeError> {
        Self::from_row_major_with(isa, b, k, n, format, Compute::F32)
    }

    /// [`from_row_major_as`](Self::from_row_major_as) for the products of `compute`: with
    /// [`Compute::Int8`], `format` must be `q8_0` or `q4_0`, and [`gemm`](crate::kernels::gemm())
    /// quantizes the rows of `A` to `q8_0` and sums integers (see [`Compute::Int8`]).
    ///
    /// ```
    /// use mha::kernels::{gemm, Isa, PackedB};
    /// use mha::{Compute, WeightFormat};
    /// // Integers whose blocks' largest magnitude is 127: scale 1, so both quantizations
    /// // keep them exactly, and the product is exact.
    /// let b: Vec<f32> = (0..64).map(|i| if i < 2 { 127.0 } else { (i % 7) as f32 - 3.0 }).collect();
    /// let a: Vec<f32> = (0..32).map(|p| if p == 0 { -127.0 } else { 1.0 }).collect();
    /// let int8 = PackedB::from_row_major_with(Isa::detect(), &b, 32, 2, WeightFormat::Q8_0, Compute::Int8)?;
    /// let mut c = [0.0; 2];
    /// gemm(&a, 1, &int8, &mut c, 1)?;
    /// let exact: [f32; 2] = [0, 1].map(|j| (0..32).map(|p| a[p] * b[p * 2 + j]).sum());
    /// assert_eq!(c, exact);
    /// assert!(PackedB::from_row_major_with(Isa::detect(), &b, 32, 2, WeightFormat::Bf16, Compute::Int8).is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// As [`from_row_major_as`](Self::from_row_major_as); [`ShapeError::Setting`] when
    /// `compute` is [`Compute::Int8`] and `format` is not `q8_0` or `q4_0`.
    pub fn from_row_major_with(
        isa: Isa,
        b: &[f32],
        k: usize,
        n: usize,
        format: WeightFormat,
        compute: Compute,
    ) -> Result<Self, ShapeError> {
        const MATRIX: &str = "matrix B (k, n)";
        let expected = run_time_len::<f32>(MATRIX, &[k, n])?;
        if b.len() != expected {
            return Err(ShapeError::LengthMismatch {
                what: MATRIX,
                expected,
                actual: b.len(),
            });
        }
        let b = WeightSlice::F32(b);
        check_range(MATRIX, b, format)?;
        let kernels = isa.kernels()?;
        let dims = [k, n.div_ceil(kernels.nr), kernels.nr];
        run_time_len::<f32>(PACKED, &dims)?;
        let parts = [Part {
            values: MatrixRef::Values(b),
            width: n,
        }];
        Self::pack(kernels, k, &parts, format, compute)
    }

    /// Packs the `(k, n)` matrix made of the `parts` side by side (`n` is the sum of their
    /// widths; each holds `k` inputs, and the packed form's size fits) in `format`, the
    /// values of element parts already checked with [`check_range`]. Parts already in
    /// `format` are copied; blocks of another format are dequantized first.
    ///
    /// # Errors
    /// [`ShapeError::AllocationFailed`] when the packed form (or a part's dequantized values)
    /// cannot be allocated; in a block format as [`quantize`](Self::quantize).
    pub(crate) fn pack(
        kernels: &'static Kernels,
        k: usize,
        parts: &[Part<'_>],
        format: WeightFormat,
        compute: Compute,
    ) -> Result<Self, ShapeError> {
        check_compute(format, compute)?;
        let element = match format.storage() {
            Storage::Element(element) => element,
            Storage::Blocks(quant) => {
                return Self::quantize(kernels, k, parts, (format, compute), quant)
            }
        };
        // Each part in blocks dequantized (none for the others).
        let widened: Vec<Vec<f32>> = parts
            .iter()
            .map(|part| match part.values {
                MatrixRef::Blocks(blocks) => blocks.try_x_at_w(),
                MatrixRef::Values(_) => Ok(Vec::new()),
            })
            .collect::<Result<_, _>>()?;
        let columns: Vec<Columns<'_>> = parts
            .iter()
            .zip(&widened)
            .map(|(part, widened)| Columns {
                values: match part.values {
                    MatrixRef::Values(values) => values,
                    MatrixRef::Blocks(_) => WeightSlice::F32(widened),
                },
                width: part.width,
            })
            .collect();
        if compute == Compute::Bf16 {
            return Self::pack_bf16(kernels, k, &columns);
        }
        Self::pack_elements(kernels, k, &columns, element, format)
    }

    /// [`PackedB::pack`] for [`Compute::Bf16`]: the values rounded to bfloat16, in AMX panels
    /// on a table with AMX, else in `nr`-column bfloat16 panels.
    fn pack_bf16(
        kernels: &'static Kernels,
        k: usize,
        columns: &[Columns<'_>],
    ) -> Result<Self, ShapeError> {
        let data = match kernels.bf16_tile {
            Some(_) => {
                let parts: Vec<_> = columns.iter().map(|c| (c.values, c.width)).collect();
                Data::Amx(AmxPanels::from_columns(k, &parts)?)
            }
            None => {
                let format = WeightFormat::Bf16;
                Self::pack_elements(kernels, k, columns, Element::Bf16, format)?.data
            }
        };
        Ok(Self {
            k,
            n: columns.iter().map(|c| c.width).sum(),
            kernels,
            format: WeightFormat::Bf16,
            compute: Compute::Bf16,
            data,
        })
    }

    /// [`PackedB::pack`] in the element format `element` (of `format`).
    fn pack_elements(
        kernels: &'static Kernels,
        k: usize,
        blocks: &[Columns<'_>],
        element: Element,
        format: WeightFormat,
    ) -> Result<Self, ShapeError> {
        let (nr, n) = (kernels.nr, blocks.iter().map(|b| b.width).sum::<usize>());
        // An empty matrix has no panels; `k * nr` is then not needed (nor known to fit).
        let len = if k == 0 || n == 0 {
            0
        } else {
            n.div_ceil(nr) * k * nr
        };
        let data = match element {
            Element::Bf16 => fill(len, nr, k, blocks, Rounding::BF16).map(Elements::Bf16),
            Element::F16 => fill(len, nr, k, blocks, Rounding::F16).map(Elements::F16),
            _ => fill(len, nr, k, blocks, Store::for_len(len)).map(Elements::F32),
        };
        let data = data.ok_or(ShapeError::AllocationFailed {
            what: PACKED,
            bytes: format.bytes(len),
        })?;
        Ok(Self {
            k,
            n,
            kernels,
            format,
            compute: Compute::F32,
            data: Data::Panels(data),
        })
    }

    /// [`PackedB::pack`] in the block format `format` (of `quant`): the rows of parts in
    /// `quant`'s blocks copied, each other column quantized by ggml's reference quantizer
    /// (blocks of another format dequantized first).
    ///
    /// # Errors
    /// [`ShapeError::NotQuantizable`] when a column needs quantizing and `quant` has no
    /// quantizer here, [`ShapeError::BlockWidth`] when `k` is not whole blocks,
    /// [`ShapeError::AllocationFailed`] when the blocks cannot be allocated.
    fn quantize(
        kernels: &'static Kernels,
        k: usize,
        parts: &[Part<'_>],
        (format, compute): (WeightFormat, Compute),
        quant: Quant,
    ) -> Result<Self, ShapeError> {
        let copied =
            |part: &Part<'_>| matches!(part.values, MatrixRef::Blocks(b) if b.quant == quant);
        if !quant.quantizes() && !parts.iter().all(copied) {
            return Err(ShapeError::NotQuantizable {
                format: quant.name(),
            });
        }
        let n = parts.iter().map(|b| b.width).sum::<usize>();
        let mut plain = block_buffer(quant, k, n)?;
        let row_bytes = k / quant.values() * quant.bytes();
        let mut column = Vec::new();
        column
            .try_reserve_exact(k)
            .map_err(|_| ShapeError::AllocationFailed {
                what: "a column of matrix B (k)",
                bytes: k * size_of::<f32>(),
            })?;
        let mut rows = plain.chunks_exact_mut(row_bytes.max(1));
        for part in parts {
            for j in 0..part.width {
                let Some(row) = rows.next() else { break };
                column.clear();
                match part.values {
                    MatrixRef::Blocks(blocks) if blocks.quant == quant => {
                        row.copy_from_slice(blocks.row(j));
                        continue;
                    }
                    MatrixRef::Blocks(blocks) => {
                        dequantize(blocks.quant, blocks.row(j), &mut column)
                    }
                    MatrixRef::Values(values) => {
                        column.extend((0..k).map(|p| values.get(p * part.width + j)));
                    }
                }
                quant.quantize(&column, row);
            }
        }
        let data = match compute {
            Compute::Int8 => Data::Int8(Int8Panels::from_blocks(kernels, quant, k, n, &plain)?),
            _ => Data::Blocks(interleaved(kernels, quant, k, n, &plain)?),
        };
        Ok(Self {
            k,
            n,
            kernels,
            format,
            compute,
            data,
        })
    }

    /// The `(k, n)` matrix `B` whose `n` columns are the rows of `blocks`, each `k` values in
    /// ggml's blocks of the block format `format` (exactly the bytes of a GGUF tensor of
    /// shape `[k, n]`, an `(n, k)` matrix of `n` rows: a checkpoint's `(out, in)` weight, so
    /// `x · B` is the layer's `x · Wᵀ`), for the instruction set `isa` (which keeps them
    /// interleaved a vector's lanes of columns at a time, the same bytes in another order).
    /// The kernels widen each block to the values of ggml's reference dequantization, so a
    /// product has the bits of the product with the `f32` matrix of those values.
    ///
    /// ```
    /// use mha::kernels::{gemm, Isa, PackedB};
    /// use mha::WeightFormat;
    /// // Two columns of 32 values in q8_0: scale 0.5 (binary16 0x3800), integers 2 and -4.
    /// let mut bytes = vec![0x00, 0x38];
    /// bytes.extend([2u8; 32]);
    /// bytes.extend([0x00, 0x38]);
    /// bytes.extend([(-4i8) as u8; 32]);
    /// let b = PackedB::from_blocks(Isa::detect(), &bytes, 32, 2, WeightFormat::Q8_0)?;
    /// let mut c = [0.0; 2];
    /// gemm(&[1.0; 32], 1, &b, &mut c, 1)?;
    /// assert_eq!(c, [32.0, -64.0]);
    /// // 40 values are not whole blocks of 32.
    /// let err = PackedB::from_blocks(Isa::detect(), &bytes, 40, 2, WeightFormat::Q8_0);
    /// assert!(err.is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::BlockWidth`] when `format` is not a block format or `k` is not a whole
    /// number of its blocks, [`ShapeError::LengthMismatch`] when `blocks` does not hold `n`
    /// rows of `k / values` blocks, [`ShapeError::Overflow`],
    /// [`ShapeError::AllocationFailed`] or [`ShapeError::UnsupportedIsa`] as
    /// [`from_row_major_as`](Self::from_row_major_as).
    pub fn from_blocks(
        isa: Isa,
        blocks: &[u8],
        k: usize,
        n: usize,
        format: WeightFormat,
    ) -> Result<Self, ShapeError> {
        const MATRIX: &str = "blocks of matrix B (n rows of k values)";
        let Storage::Blocks(quant) = format.storage() else {
            return Err(block_width(MATRIX, k, 0, format.name()));
        };
        let kernels = isa.kernels()?;
        let expected = block_len(quant, k, n)?;
        if blocks.len() != expected {
            return Err(ShapeError::LengthMismatch {
                what: MATRIX,
                expected,
                actual: blocks.len(),
            });
        }
        let data = interleaved(kernels, quant, k, n, blocks)?;
        Ok(Self {
            k,
            n,
            kernels,
            format,
            compute: Compute::F32,
            data: Data::Blocks(data),
        })
    }
}

/// Checks that `format` can take the products of `compute`: [`Compute::Int8`] needs `q8_0`
/// or `q4_0` weights, [`Compute::Bf16`] `f32`, `bf16` or `f16` ones.
///
/// # Errors
/// [`ShapeError::Setting`] naming both otherwise.
pub(crate) fn check_compute(format: WeightFormat, compute: Compute) -> Result<(), ShapeError> {
    if compute.accepts(format) {
        return Ok(());
    }
    Err(ShapeError::Setting {
        what: "compute",
        value: alloc::format!("{} with {} weights", compute.name(), format.name()),
        expected: "int8 only with q8_0 or q4_0 weights, bf16 only with f32, bf16 or f16 weights",
    })
}

/// What the blocks of matrix B are called in errors.
const BLOCKS: &str = "blocks of matrix B (n, k / block values, block bytes)";

/// The bytes of the blocks of `n` columns of `k` values in `quant`.
///
/// # Errors
/// [`ShapeError::BlockWidth`] when `k` is not whole blocks, [`ShapeError::Overflow`] when
/// the bytes do not fit.
fn block_len(quant: Quant, k: usize, n: usize) -> Result<usize, ShapeError> {
    if !k.is_multiple_of(quant.values()) {
        return Err(block_width("matrix B", k, quant.values(), quant.name()));
    }
    run_time_len::<u8>(BLOCKS, &[n, k / quant.values(), quant.bytes()])
}

/// A zeroed buffer for the blocks of `n` columns of `k` values in `quant`.
///
/// # Errors
/// As [`block_len`], and [`ShapeError::AllocationFailed`] when the bytes cannot be allocated.
fn block_buffer(quant: Quant, k: usize, n: usize) -> Result<Vec<u8>, ShapeError> {
    let len = block_len(quant, k, n)?;
    let mut data = Vec::new();
    data.try_reserve_exact(len)
        .map_err(|_| ShapeError::AllocationFailed {
            what: BLOCKS,
            bytes: len,
        })?;
    data.resize(len, 0);
    Ok(data)
}

/// The blocks `plain` of `n` columns of `k` values in `quant` (GGUF's layout: column after
/// column) interleaved for `kernels`: groups of one vector's lanes of columns, the last padded
/// with zero columns ([`BlockRows`]).
///
/// # Errors
/// As [`block_buffer`].
fn interleaved(
    kernels: &Kernels,
    quant: Quant,
    k: usize,
    n: usize,
    plain: &[u8],
) -> Result<Vec<u8>, ShapeError> {
    let group = kernels.lanes;
    let mut data = block_buffer(quant, k, n.div_ceil(group).saturating_mul(group))?;
    quant.interleave(plain, k, group, &mut data);
    Ok(data)
}

/// `Err(BlockWidth)` naming `what` when its input width `width` is not a whole number of
/// `format`'s blocks.
pub(crate) fn check_block_width(
    what: &'static str,
    width: usize,
    format: WeightFormat,
) -> Result<(), ShapeError> {
    let block = format.block_values();
    match width.is_multiple_of(block) {
        true => Ok(()),
        false => Err(block_width(what, width, block, format.name())),
    }
}

/// [`ShapeError::BlockWidth`] for `what` of input width `width` in `format` (blocks of
/// `block` values).
fn block_width(what: &'static str, width: usize, block: usize, format: &'static str) -> ShapeError {
    ShapeError::BlockWidth {
        what,
        width,
        block,
        format,
    }
}

/// `Err(WeightRange)` naming `what` when a finite value of `values` rounds to an infinity in
/// `format`.
pub(crate) fn check_range(
    what: &'static str,
    values: WeightSlice<'_>,
    format: WeightFormat,
) -> Result<(), ShapeError> {
    match values.first_overflow(format) {
        None => Ok(()),
        Some((index, value)) => Err(ShapeError::WeightRange {
            what,
            index,
            value: alloc::format!("{value}"),
            format: format.name(),
        }),
    }
}

/// Packs `blocks` (as in [`PackedB::pack`]) into a new buffer of `len` values written by
/// `write`: every value is written once, padding included, and nothing is zeroed first.
/// `None` when the buffer cannot be allocated.
fn fill<T: Copy + Default>(
    len: usize,
    nr: usize,
    k: usize,
    blocks: &[Columns<'_>],
    write: impl Write<T>,
) -> Option<Vec<T>> {
    debug_assert!(blocks.iter().all(|b| b.values.len() == k * b.width));
    let mut data = Vec::new();
    data.try_reserve_exact(len).ok()?;
    let dst = &mut data.spare_capacity_mut()[..len];
    pack_b_panels(dst, nr, k, blocks, write);
    // SAFETY: `pack_b_panels` initialised all of `dst`, the first `len` values after the
    // (empty) initialised part.
    unsafe { data.set_len(len) };
    Some(data)
}

/// The columns of one matrix of a matrix `B` made of several side by side
/// (`[Wq | Wk | Wv]`): a `(k, width)` matrix in its stored format.
#[derive(Clone, Copy)]
pub(crate) struct Part<'a> {
    /// Its values (`k * width`), or its `width` rows of blocks.
    pub values: MatrixRef<'a>,
    /// Its number of columns.
    pub width: usize,
}

/// A row-major `(k, width)` block of the columns of a matrix `B` whose blocks lie side by
/// side (`[Wq | Wk | Wv]`): row `p` is values `p * width ..` of `width`, in the format they
/// are stored in.
#[derive(Clone, Copy)]
pub(crate) struct Columns<'a> {
    /// The block's `k * width` values.
    pub values: WeightSlice<'a>,
    /// The block's number of columns.
    pub width: usize,
}

/// Rows of `B` per packing pass.
const PACK_ROWS: usize = 16;

/// Packs of at least this many values bypass the caches where the CPU can (streaming stores
/// on x86-64): they would not stay cached, and a store that bypasses the caches does not read
/// the line it replaces first.
const STREAM_FROM: usize = 1 << 18;

/// Writes the `(k, n)` matrix `blocks` (side by side, `n` the sum of their widths) into all
/// of `dst`, `n.div_ceil(nr) * k * nr` values (none when `k` or `n` is 0), as `nr`-column
/// panels, zero-padding the last panel: value `(p, j)` goes to
/// `(j / nr) * k * nr + p * nr + j % nr`.
///
/// `PACK_ROWS` rows at a time: each pass reads a few whole rows, contiguous in each block, and
/// writes a contiguous run of steps into every panel, where a panel at a time would read `nr`
/// values from each of `k` rows, a page apart.
fn pack_b_panels<T: Copy + Default>(
    dst: &mut [MaybeUninit<T>],
    nr: usize,
    k: usize,
    blocks: &[Columns<'_>],
    write: impl Write<T>,
) {
    // No panels: nothing to write, and `k * nr` is not needed (nor known to fit).
    if dst.is_empty() {
        return;
    }
    for p0 in (0..k).step_by(PACK_ROWS) {
        let rows = PACK_ROWS.min(k - p0);
        for (panel, values) in dst.chunks_exact_mut(k * nr).enumerate() {
            let steps = &mut values[p0 * nr..][..rows * nr];
            pack_steps(steps, nr, blocks, panel * nr, p0, write);
        }
    }
    write.finish();
}

/// Writes rows `p0 ..` of columns `j0 .. j0 + nr` of the matrix `blocks` (side by side) into
/// `steps` (`nr` values per row), the columns past the last zero.
fn pack_steps<T: Copy + Default>(
    steps: &mut [MaybeUninit<T>],
    nr: usize,
    blocks: &[Columns<'_>],
    j0: usize,
    p0: usize,
    write: impl Write<T>,
) {
    let mut start = 0;
    let mut filled = 0;
    for block in blocks {
        // The block's columns `lo .. hi` are the panel's `filled ..`.
        let lo = j0.clamp(start, start + block.width) - start;
        let hi = (j0 + nr).clamp(start, start + block.width) - start;
        if lo < hi {
            for (p, step) in (p0..).zip(steps.chunks_exact_mut(nr)) {
                let row = p * block.width;
                let src = block.values.range(row + lo, row + hi);
                write.write(&mut step[filled..][..hi - lo], src);
            }
            filled += hi - lo;
        }
        start += block.width;
    }
    if filled < nr {
        for step in steps.chunks_exact_mut(nr) {
            for value in &mut step[filled..] {
                value.write(T::default());
            }
        }
    }
}

/// How packing turns the matrix's values (in their stored format) into packed ones and
/// writes them.
trait Write<T>: Copy {
    /// Initialises `dst` with the packed form of `src` (of the same length).
    fn write(self, dst: &mut [MaybeUninit<T>], src: WeightSlice<'_>);
    /// Makes every value written visible, in order, before anything this thread does next
    /// (reading the packed matrix, or handing it to other threads).
    fn finish(self) {}
}

/// 16-bit values of the format `element`: values stored in it are copied, others widened
/// exactly and rounded by `round`.
#[derive(Clone, Copy)]
struct Rounding {
    element: Element,
    round: fn(f32) -> u16,
}

impl Rounding {
    const BF16: Rounding = Rounding {
        element: Element::Bf16,
        round: bf16_from_f32,
    };
    const F16: Rounding = Rounding {
        element: Element::F16,
        round: f16_from_f32,
    };
}

impl Write<u16> for Rounding {
    fn write(self, dst: &mut [MaybeUninit<u16>], src: WeightSlice<'_>) {
        match src {
            WeightSlice::Bf16(bits) | WeightSlice::F16(bits) if src.element() == self.element => {
                for (d, &s) in dst.iter_mut().zip(bits) {
                    d.write(s);
                }
            }
            _ => src.convert_into(dst, self.round),
        }
    }
}

/// How packing writes `f32` values: through the caches, or around them.
#[derive(Clone, Copy, Debug)]
enum Store {
    Cached,
    /// Streaming stores (x86-64 only): memory written this way is read only after
    /// [`Write::finish`].
    Streamed,
}

impl Store {
    /// Streamed for a pack of `len` values, at least [`STREAM_FROM`], where the CPU has
    /// streaming stores.
    fn for_len(len: usize) -> Store {
        if cfg!(target_arch = "x86_64") && len >= STREAM_FROM {
            Store::Streamed
        } else {
            Store::Cached
        }
    }
}

impl Write<f32> for Store {
    fn write(self, dst: &mut [MaybeUninit<f32>], src: WeightSlice<'_>) {
        #[cfg(target_arch = "x86_64")]
        if let (Store::Streamed, WeightSlice::F32(src)) = (self, src) {
            return stream(dst, src);
        }
        src.convert_into(dst, |x| x);
    }

    fn finish(self) {
        #[cfg(target_arch = "x86_64")]
        if let Store::Streamed = self {
            // SAFETY: SSE is part of every x86-64 CPU.
            unsafe { core::arch::x86_64::_mm_sfence() };
        }
    }
}

/// [`Store`]'s `write` with streaming stores, 4 values at a time, when `dst` is 16-byte aligned
/// (whole steps of a buffer the allocator aligned to 16 bytes, as the system allocators do,
/// are: every `nr` is a multiple of 4); otherwise, and for the last `len % 4` values, through
/// the caches.
#[cfg(target_arch = "x86_64")]
fn stream(dst: &mut [MaybeUninit<f32>], src: &[f32]) {
    use core::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
    let len = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..len], &src[..len]);
    let split = if dst.as_ptr().addr().is_multiple_of(16) {
        dst.len() - dst.len() % 4
    } else {
        0
    };
    let (vectors, rest) = dst.split_at_mut(split);
    for (d, s) in vectors.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
        // SAFETY: SSE is part of every x86-64 CPU; `d` is 4 writable values at a 16-byte
        // aligned address (`dst` is, and `d` starts a multiple of 4 values into it), `s` 4
        // readable values.
        unsafe { _mm_stream_ps(d.as_mut_ptr().cast(), _mm_loadu_ps(s.as_ptr())) };
    }
    for (d, &s) in rest.iter_mut().zip(&src[split..]) {
        d.write(s);
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec;

    use super::*;
    use crate::kernels::format::blocks::BlockRows;

    /// The packed form by its definition, element by element: value `(p, j)` of the `(k, n)`
    /// matrix `element` at `(j / nr) * k * nr + p * nr + j % nr`, zeros elsewhere.
    fn packed_by_definition(
        nr: usize,
        k: usize,
        n: usize,
        element: impl Fn(usize, usize) -> f32,
    ) -> Vec<u32> {
        let mut packed = vec![0.0f32; n.div_ceil(nr) * k * nr];
        for p in 0..k {
            for j in 0..n {
                packed[(j / nr) * k * nr + p * nr + j % nr] = element(p, j);
            }
        }
        packed.iter().map(|v| v.to_bits()).collect()
    }

    /// The stored values' bits (16-bit ones widened to `u32` as they are).
    fn stored_bits(values: &Data) -> Vec<u32> {
        match values {
            Data::Panels(Elements::F32(v)) => v.iter().map(|v| v.to_bits()).collect(),
            Data::Panels(Elements::Bf16(v) | Elements::F16(v)) => {
                v.iter().map(|&v| u32::from(v)).collect()
            }
            _ => unreachable!("not a panel format"),
        }
    }

    /// Distinct values for every block, row and column (exactly representable).
    fn block_values(block: usize, k: usize, width: usize) -> Vec<f32> {
        (0..k * width)
            .map(|i| (block * 1_000_000 + i) as f32 + 0.5)
            .collect()
    }

    /// `pack_b_panels` into a buffer `misalign` values past a 16-byte boundary, as bits.
    fn pack_bits(
        nr: usize,
        k: usize,
        blocks: &[Columns<'_>],
        store: Store,
        misalign: usize,
    ) -> Vec<u32> {
        let n: usize = blocks.iter().map(|b| b.width).sum();
        let len = if k == 0 || n == 0 {
            0
        } else {
            n.div_ceil(nr) * k * nr
        };
        let mut buffer: Vec<MaybeUninit<f32>> = Vec::with_capacity(len + 4 + misalign);
        buffer.resize(len + 4 + misalign, MaybeUninit::uninit());
        let aligned = (16 - buffer.as_ptr().addr() % 16) % 16 / 4;
        let dst = &mut buffer[aligned + misalign..][..len];
        pack_b_panels(dst, nr, k, blocks, store);
        // SAFETY: `pack_b_panels` initialised all of `dst`.
        dst.iter()
            .map(|v| unsafe { v.assume_init() }.to_bits())
            .collect()
    }

    /// Packs blocks of `widths` side by side with `k` rows, for the panel widths of every
    /// instruction set (supported here or not) with each kind of store, and through
    /// [`PackedB`] for every supported one, and compares with the definition.
    fn check(k: usize, widths: &[usize]) {
        let values: Vec<Vec<f32>> = (0..widths.len())
            .map(|b| block_values(b, k, widths[b]))
            .collect();
        let blocks: Vec<Columns<'_>> = values
            .iter()
            .zip(widths)
            .map(|(values, &width)| Columns {
                values: WeightSlice::F32(values),
                width,
            })
            .collect();
        let n: usize = widths.iter().sum();
        // Column `j` of the whole matrix is column `j - start` of the block it falls in.
        let element = |p: usize, j: usize| {
            let mut start = 0;
            for (values, &width) in values.iter().zip(widths) {
                if j < start + width {
                    return values[p * width + j - start];
                }
                start += width;
            }
            unreachable!("column {j} of {n}")
        };
        for nr in [8, 16, 32] {
            let want = packed_by_definition(nr, k, n, element);
            for (store, misalign) in [
                (Store::Cached, 0),
                (Store::Streamed, 0),
                (Store::Streamed, 1),
            ] {
                let bits = pack_bits(nr, k, &blocks, store, misalign);
                assert!(
                    bits == want,
                    "nr {nr} k {k} widths {widths:?} {store:?} +{misalign}"
                );
            }
        }
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            let formats = [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16];
            for format in formats {
                let parts: Vec<Part<'_>> = blocks
                    .iter()
                    .map(|b| Part {
                        values: MatrixRef::Values(b.values),
                        width: b.width,
                    })
                    .collect();
                let packed = PackedB::pack(kernels, k, &parts, format, Compute::F32).unwrap();
                assert_eq!((packed.k, packed.n, packed.format()), (k, n, format));
                let rounded = |p: usize, j: usize| match format {
                    WeightFormat::F32 => element(p, j),
                    WeightFormat::Bf16 => f32::from_bits(u32::from(bf16_from_f32(element(p, j)))),
                    _ => f32::from_bits(u32::from(f16_from_f32(element(p, j)))),
                };
                let want = packed_by_definition(kernels.nr, k, n, rounded);
                let bits = stored_bits(&packed.data);
                assert!(bits == want, "{isa:?} {format:?} k {k} widths {widths:?}");
                if let [b] = blocks[..] {
                    let from_row_major =
                        PackedB::from_row_major_as(isa, &values[0], k, b.width, format).unwrap();
                    assert_eq!(
                        stored_bits(&from_row_major.data),
                        bits,
                        "{isa:?} k {k} n {n}"
                    );
                }
            }
        }
    }

    #[test]
    fn packing_equals_the_definition_on_odd_shapes() {
        let widths: [&[usize]; 14] = [
            &[0],
            &[1],
            &[7],
            &[16],
            &[17],
            &[33],
            &[600],
            &[0, 0, 0],
            &[5, 3, 9],
            &[8, 16, 32],
            &[17, 0, 30],
            &[40, 24, 24],
            &[33, 33, 33],
            &[509, 7, 517],
        ];
        for k in [0, 1, 3, PACK_ROWS, PACK_ROWS + 1, 2 * PACK_ROWS + 5] {
            for widths in widths {
                check(k, widths);
            }
        }
    }

    /// Packing blocks stored in bf16, f16 and `f32` side by side gives, in every format, the
    /// bits of packing their values widened to `f32` (a block already in the packed format is
    /// copied, never rounded twice).
    #[test]
    fn stored_blocks_pack_as_their_widened_values() {
        use crate::kernels::format::element::{bf16_to_f32, f16_to_f32};
        let formats = [
            WeightFormat::F32,
            WeightFormat::Bf16,
            WeightFormat::F16,
            WeightFormat::Q8_0,
        ];
        for (k, widths) in [(32, [3, 17, 5]), (64, [16, 1, 33]), (96, [9, 40, 0])] {
            let bits = |b: u16, w: usize| -> Vec<u16> {
                (0..k * w).map(|i| b ^ ((i * 37 % 509) as u16)).collect()
            };
            let (bf16, f16) = (bits(0x3e00, widths[0]), bits(0x3400, widths[1]));
            let f32s = block_values(2, k, widths[2]);
            let stored = [
                WeightSlice::Bf16(&bf16),
                WeightSlice::F16(&f16),
                WeightSlice::F32(&f32s),
            ];
            let widened: [Vec<f32>; 2] = [
                bf16.iter().map(|&b| bf16_to_f32(b)).collect(),
                f16.iter().map(|&b| f16_to_f32(b)).collect(),
            ];
            let wide = [&widened[0][..], &widened[1][..], &f32s[..]].map(WeightSlice::F32);
            fn columns<'a>(values: [WeightSlice<'a>; 3], widths: [usize; 3]) -> Vec<Part<'a>> {
                let pairs = values.into_iter().zip(widths);
                pairs
                    .map(|(values, width)| Part {
                        values: MatrixRef::Values(values),
                        width,
                    })
                    .collect()
            }
            for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
                let kernels = isa.kernels().unwrap();
                for format in formats {
                    let got =
                        PackedB::pack(kernels, k, &columns(stored, widths), format, Compute::F32)
                            .unwrap();
                    let want =
                        PackedB::pack(kernels, k, &columns(wide, widths), format, Compute::F32)
                            .unwrap();
                    let same = match (&got.data, &want.data) {
                        (Data::Blocks(a), Data::Blocks(b)) => a == b,
                        (a, b) => stored_bits(a) == stored_bits(b),
                    };
                    assert!(same, "{isa:?} {format:?} k {k} widths {widths:?}");
                }
            }
        }
    }

    /// A part in `q8_0` blocks packs as its bytes (what `from_blocks` keeps) in `q8_0`, and in
    /// every other format as the `x @ W` matrix of its values (`qs · d`, worked out here),
    /// beside a part of values.
    #[test]
    fn block_parts_are_copied_or_widened() {
        let (k, n, m) = (64, 5, 3);
        let mut bytes = Vec::new();
        for b in 0..n * k / 32 {
            bytes.extend([0x00, 0x38]); // d = 0.5
            bytes.extend((0..32).map(|i| ((b * 7 + i * 13) % 255) as u8));
        }
        let mut widened = vec![0.0f32; k * n];
        for j in 0..n {
            for p in 0..k {
                let q = bytes[(j * k / 32 + p / 32) * 34 + 2 + p % 32] as i8;
                widened[p * n + j] = f32::from(q) * 0.5;
            }
        }
        let others = block_values(1, k, m);
        let blocks = BlockRows {
            quant: Quant::Q8_0,
            bytes: &bytes,
            k,
            group: 1,
        };
        let part = |values| Part { values, width: n };
        let other = Part {
            values: MatrixRef::Values(WeightSlice::F32(&others)),
            width: m,
        };
        let got_parts = [part(MatrixRef::Blocks(blocks)), other];
        let want_parts = [part(MatrixRef::Values(WeightSlice::F32(&widened))), other];
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            let copied = PackedB::pack(
                kernels,
                k,
                &got_parts[..1],
                WeightFormat::Q8_0,
                Compute::F32,
            )
            .unwrap();
            let from_blocks = PackedB::from_blocks(isa, &bytes, k, n, WeightFormat::Q8_0).unwrap();
            let same = match (&copied.data, &from_blocks.data) {
                (Data::Blocks(a), Data::Blocks(b)) => a == b,
                _ => false,
            };
            assert!(same, "{isa:?}");
            for format in [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::Q4_0] {
                let got = PackedB::pack(kernels, k, &got_parts, format, Compute::F32).unwrap();
                let want = PackedB::pack(kernels, k, &want_parts, format, Compute::F32).unwrap();
                let same = match (&got.data, &want.data) {
                    (Data::Blocks(a), Data::Blocks(b)) => a == b,
                    (a, b) => stored_bits(a) == stored_bits(b),
                };
                assert!(same, "{isa:?} {format:?}");
            }
        }
    }
}
