//! Out-of-place transposes in small blocks (`Kernels::transpose`).
//!
//! A plain transpose reads or writes one value at a time along a stride. Going through blocks
//! of 8 columns, both sides move whole rows of the block: the portable version through a local
//! array, the x86 version (AVX, for the AVX2 and AVX-512 tables) with eight 256-bit row loads,
//! 24 shuffles and eight column stores per `8 × 8` block. It serves the three places that turn
//! rows into columns: packing `A` panels for the GEMM, the keys' `Kᵀ` panels and each
//! attention item's `Qᵀ`.

/// Columns per block: eight values, one 256-bit vector.
const WIDTH: usize = 8;

/// `dst[p * dst_stride + t] = scale * src[t * src_stride + p]` for every `t < rows`,
/// `p < cols`: the `(rows, cols)` matrix at the start of `src` (row stride `src_stride`)
/// transposed into `dst` (row stride `dst_stride`) and scaled; a scale of 1 copies the values
/// exactly. Other values of `dst` are untouched.
///
/// # Panics
/// When `src` or `dst` is too short for those rows and columns (callers size them).
pub(crate) fn transpose_scaled(
    src: &[f32],
    src_stride: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    dst_stride: usize,
    scale: f32,
) {
    let blocks = |height, src: &[f32], dst: &mut [f32]| {
        if height == 8 {
            block::<8>(src, src_stride, dst, dst_stride, scale);
        } else {
            block::<4>(src, src_stride, dst, dst_stride, scale);
        }
    };
    walk(src, src_stride, rows, cols, dst, dst_stride, scale, blocks);
}

/// The walk both versions share: rows in blocks of 8, then one of 4 (a 12-row GEMM panel is
/// 8 + 4), each across the columns in blocks of [`WIDTH`] through
/// `block(height, src_block, dst_block)` (the slices start at the block's corner and hold
/// exactly its rows and columns); single rows and the last `cols % 8` columns one value at a
/// time.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn walk(
    src: &[f32],
    src_stride: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    dst_stride: usize,
    scale: f32,
    mut block: impl FnMut(usize, &[f32], &mut [f32]),
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
                let src = &src[t0 * src_stride + p0..][..(height - 1) * src_stride + WIDTH];
                let dst = &mut dst[p0 * dst_stride + t0..][..(WIDTH - 1) * dst_stride + height];
                block(height, src, dst);
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

/// One block of `H` rows and [`WIDTH`] columns at the start of `src` and `dst`: `H` row loads
/// into a local array, then [`WIDTH`] stores of `H` values, each a scaled column.
#[inline(always)]
fn block<const H: usize>(
    src: &[f32],
    src_stride: usize,
    dst: &mut [f32],
    dst_stride: usize,
    scale: f32,
) {
    let block: [[f32; WIDTH]; H] = core::array::from_fn(|t| {
        let row = &src[t * src_stride..][..WIDTH];
        core::array::from_fn(|p| row[p])
    });
    for p in 0..WIDTH {
        let column: [f32; H] = core::array::from_fn(|t| scale * block[t][p]);
        dst[p * dst_stride..][..H].copy_from_slice(&column);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::transpose_avx;

/// The AVX version.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::{
        __m256, _mm256_castps256_ps128, _mm256_extractf128_ps, _mm256_loadu_ps, _mm256_mul_ps,
        _mm256_permute2f128_ps, _mm256_set1_ps, _mm256_shuffle_ps, _mm256_storeu_ps,
        _mm256_unpackhi_ps, _mm256_unpacklo_ps, _mm_mul_ps, _mm_set1_ps, _mm_storeu_ps,
    };

    use super::WIDTH;

    /// [`transpose_scaled`](super::transpose_scaled) with AVX: the same walk, its blocks of 8
    /// and 4 rows by shuffles. Same results (one multiply per value).
    ///
    /// # Safety
    /// The CPU must support AVX (every CPU with AVX2 or AVX-512F does).
    ///
    /// # Panics
    /// When `src` or `dst` is too short for those rows and columns (callers size them).
    #[target_feature(enable = "avx")]
    pub(crate) unsafe fn transpose_avx(
        src: &[f32],
        src_stride: usize,
        rows: usize,
        cols: usize,
        dst: &mut [f32],
        dst_stride: usize,
        scale: f32,
    ) {
        let blocks = |height, src: &[f32], dst: &mut [f32]| {
            if height == 8 {
                block8(src, src_stride, dst, dst_stride, scale);
            } else {
                block4(src, src_stride, dst, dst_stride, scale);
            }
        };
        super::walk(src, src_stride, rows, cols, dst, dst_stride, scale, blocks);
    }

    /// Rows `t` of `src[t * src_stride..][..8]` for `t < N`, loaded (the caller checked that
    /// `src` holds `(N-1)·src_stride + 8` values).
    #[inline]
    #[target_feature(enable = "avx")]
    fn load_rows<const N: usize>(src: &[f32], src_stride: usize) -> [__m256; N] {
        assert!(src.len() >= (N - 1) * src_stride + WIDTH);
        // SAFETY: row t < N starts at t·src_stride and holds 8 values, inside `src` by the
        // assertion; the loads are unaligned.
        core::array::from_fn(|t| unsafe { _mm256_loadu_ps(src.as_ptr().add(t * src_stride)) })
    }

    /// An `8 × 8` block: column `p` of the 8 rows of `src` becomes `dst[p * dst_stride..][..8]`.
    #[inline]
    #[target_feature(enable = "avx")]
    fn block8(src: &[f32], src_stride: usize, dst: &mut [f32], dst_stride: usize, scale: f32) {
        let [r0, r1, r2, r3, r4, r5, r6, r7] = load_rows::<8>(src, src_stride);
        // Pairs of rows interleaved: (a0 b0 a1 b1 | a4 b4 a5 b5), (a2 b2 a3 b3 | a6 b6 a7 b7).
        let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
        let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
        let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
        let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
        // Quads: s0 = (a0 b0 c0 d0 | a4 b4 c4 d4), s1 columns 1 | 5, s2 2 | 6, s3 3 | 7;
        // s4 .. s7 the same for rows 4 .. 7.
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        // Column p: the low halves (p < 4) or high halves (p ≥ 4) of the two quads.
        let columns = [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ];
        assert!(dst.len() >= (WIDTH - 1) * dst_stride + 8);
        let scale = _mm256_set1_ps(scale);
        for (p, column) in columns.into_iter().enumerate() {
            // SAFETY: column p < 8 goes to p·dst_stride .. + 8, inside `dst` by the assertion.
            unsafe {
                _mm256_storeu_ps(
                    dst.as_mut_ptr().add(p * dst_stride),
                    _mm256_mul_ps(scale, column),
                )
            };
        }
    }

    /// A `4 × 8` block: column `p` of the 4 rows of `src` becomes `dst[p * dst_stride..][..4]`.
    #[inline]
    #[target_feature(enable = "avx")]
    fn block4(src: &[f32], src_stride: usize, dst: &mut [f32], dst_stride: usize, scale: f32) {
        let [r0, r1, r2, r3] = load_rows::<4>(src, src_stride);
        let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
        let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
        // Quads: columns 0 | 4, 1 | 5, 2 | 6, 3 | 7.
        let quads = [
            _mm256_shuffle_ps::<0x44>(t0, t2),
            _mm256_shuffle_ps::<0xEE>(t0, t2),
            _mm256_shuffle_ps::<0x44>(t1, t3),
            _mm256_shuffle_ps::<0xEE>(t1, t3),
        ];
        assert!(dst.len() >= (WIDTH - 1) * dst_stride + 4);
        let scale = _mm_set1_ps(scale);
        for (p, quad) in quads.into_iter().enumerate() {
            let (low, high) = (
                _mm256_castps256_ps128(quad),
                _mm256_extractf128_ps::<1>(quad),
            );
            // SAFETY: columns p and p + 4 (< 8) go to their dst_stride rows, 4 values each,
            // inside `dst` by the assertion.
            unsafe {
                _mm_storeu_ps(dst.as_mut_ptr().add(p * dst_stride), _mm_mul_ps(scale, low));
                _mm_storeu_ps(
                    dst.as_mut_ptr().add((p + 4) * dst_stride),
                    _mm_mul_ps(scale, high),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use alloc::vec::Vec;

    /// Every shape around the block sizes, against the definition, with padding on both sides
    /// that must stay untouched.
    #[test]
    fn matches_the_definition_on_odd_shapes() {
        for rows in [0, 1, 3, 4, 5, 7, 8, 9, 12, 13, 15, 16, 17, 33] {
            for cols in [0, 1, 2, 7, 8, 9, 16, 25] {
                let (src_stride, dst_stride) = (cols + 3, rows + 5);
                let src: Vec<f32> = (0..rows * src_stride).map(|i| i as f32).collect();
                let mut dst = vec![-1.0; cols * dst_stride];
                transpose_scaled(&src, src_stride, rows, cols, &mut dst, dst_stride, 2.0);
                #[cfg(all(target_arch = "x86_64", feature = "std"))]
                if std::is_x86_feature_detected!("avx") {
                    let mut avx = vec![-1.0; cols * dst_stride];
                    // SAFETY: AVX was just detected.
                    unsafe {
                        transpose_avx(&src, src_stride, rows, cols, &mut avx, dst_stride, 2.0)
                    };
                    assert_eq!(avx, dst, "{rows}x{cols}: AVX and portable differ");
                }
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
                            "{rows}x{cols} ({t}, {p})"
                        );
                    }
                }
            }
        }
    }
}
