//! Out-of-place transposes in small blocks (`Kernels::transpose`), once for every
//! instruction set.
//!
//! A plain transpose reads or writes one value at a time along a stride. Going through blocks
//! of 8 columns, both sides move whole rows of the block ([`Simd::transpose_block`]: through a
//! local array on the portable table, by vector shuffles on the others, e.g. eight 256-bit row
//! loads, 24 shuffles and eight column stores per `8 × 8` block with AVX). It serves the three
//! places that turn rows into columns: packing `A` panels for the GEMM, the keys' `Kᵀ` panels
//! and each attention item's `Qᵀ`.

use crate::kernels::gemm::micro::LINE;
use crate::kernels::simd::Simd;

/// Columns per block.
pub(crate) const WIDTH: usize = 8;

/// `dst[p * dst_stride + t] = scale * src[t * src_stride + p]` for every `t < rows`,
/// `p < cols`: the `(rows, cols)` matrix at the start of `src` (row stride `src_stride`)
/// transposed into `dst` (row stride `dst_stride`) and scaled; a scale of 1 copies the values
/// exactly. Other values of `dst` are untouched.
///
/// Rows in blocks of 8, then one of 4 (a 12-row GEMM panel is 8 + 4), each across the columns
/// in blocks of [`WIDTH`]; single rows and the last `cols % 8` columns one value at a time.
/// Each block of rows prefetches the next block's rows a line ahead of its own columns.
///
/// # Panics
/// When `src` or `dst` is too short for those rows and columns (callers size them).
#[inline(always)]
pub(crate) fn transpose<S: Simd>(
    s: S,
    (src, src_stride): (&[f32], usize),
    rows: usize,
    cols: usize,
    (dst, dst_stride): (&mut [f32], usize),
    scale: f32,
) {
    let block_cols = cols - cols % WIDTH;
    let mut t0 = 0;
    while t0 < rows {
        let height = match rows - t0 {
            h if h >= 8 => 8,
            h if h >= 4 => 4,
            _ => 1,
        };
        let mut first_scalar_col = 0;
        if height > 1 {
            for p0 in (0..block_cols).step_by(WIDTH) {
                if p0 % LINE == 0 {
                    let next = t0 + height..(t0 + height + 8).min(rows);
                    prefetch_rows(s, src, src_stride, next, p0);
                }
                let src = &src[t0 * src_stride + p0..][..(height - 1) * src_stride + WIDTH];
                let dst = &mut dst[p0 * dst_stride + t0..][..(WIDTH - 1) * dst_stride + height];
                if height == 8 {
                    s.transpose_block::<8>((src, src_stride), (dst, dst_stride), scale);
                } else {
                    s.transpose_block::<4>((src, src_stride), (dst, dst_stride), scale);
                }
            }
            first_scalar_col = block_cols;
        }
        for p in first_scalar_col..cols {
            for t in t0..t0 + height {
                dst[p * dst_stride + t] = scale * src[t * src_stride + p];
            }
        }
        t0 += height;
    }
}

/// Starts fetching the line at column `col` of each of `rows` of `src` (rows of the matrix,
/// so the addresses lie inside it): while one block of rows is transposed, the next block's
/// rows, each a separate line `src_stride` apart, arrive instead of stalling its loads.
#[inline(always)]
fn prefetch_rows<S: Simd>(
    s: S,
    src: &[f32],
    src_stride: usize,
    rows: core::ops::Range<usize>,
    col: usize,
) {
    for t in rows {
        // `wrapping_add`: no bounds check for a hint (a prefetch never faults).
        s.prefetch(src.as_ptr().wrapping_add(t * src_stride + col));
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::Isa;
    use alloc::vec;
    use alloc::vec::Vec;

    /// Every shape around the block sizes, on every table, against the definition, with
    /// padding on both sides that must stay untouched.
    #[test]
    fn matches_the_definition_on_odd_shapes() {
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            for rows in [0, 1, 3, 4, 5, 7, 8, 9, 12, 13, 15, 16, 17, 33] {
                for cols in [0, 1, 2, 7, 8, 9, 16, 25] {
                    let (src_stride, dst_stride) = (cols + 3, rows + 5);
                    let src: Vec<f32> = (0..rows * src_stride).map(|i| i as f32).collect();
                    let mut dst = vec![-1.0; cols * dst_stride];
                    // SAFETY: a checked table; `src` and `dst` hold the rows and columns.
                    unsafe {
                        (kernels.transpose)(&src, src_stride, rows, cols, &mut dst, dst_stride, 2.0)
                    };
                    for p in 0..cols {
                        for t in 0..dst_stride {
                            let expected = if t < rows {
                                2.0 * src[t * src_stride + p]
                            } else {
                                -1.0
                            };
                            assert_eq!(
                                dst[p * dst_stride + t],
                                expected,
                                "{isa:?} {rows}x{cols} ({t}, {p})"
                            );
                        }
                    }
                }
            }
        }
    }
}
