//! Portable kernels: plain loops over fixed-size arrays that LLVM vectorises for whatever the
//! build targets. They define the arithmetic the SIMD kernels repeat in shape (the SIMD ones
//! fuse multiply and add; these cannot, as `f32::mul_add` needs `std`).

use super::softmax::{softmax_block, softmax_row};
use super::{check_gemv_operands, check_tile_operands, Isa, Kernels};

/// Rows of the portable microtile.
const MR: usize = 4;
/// Columns of the portable microtile.
const NR: usize = 8;

/// The portable kernel table.
pub(crate) static KERNELS: Kernels = Kernels {
    isa: Isa::Portable,
    mr: MR,
    nr: NR,
    tile,
    softmax_block,
    gemv,
    softmax_row,
    transpose: super::transpose::transpose_scaled,
    prefetch,
};

/// See [`Kernels::tile`].
#[allow(clippy::too_many_arguments)]
fn tile(
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    check_tile_operands(k, (a, lda), (b, ldb), (c, ldc), MR, NR);
    let mut acc = [[0.0f32; NR]; MR];
    if accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            row.copy_from_slice(&c[i * ldc..][..NR]);
        }
    }
    for (a_step, b_step) in a.chunks(lda).zip(b.chunks(ldb)).take(k) {
        for (row, &a_value) in acc.iter_mut().zip(&a_step[..MR]) {
            for (sum, &b_value) in row.iter_mut().zip(&b_step[..NR]) {
                *sum += a_value * b_value;
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        c[i * ldc..][..NR].copy_from_slice(row);
    }
}

/// See [`Kernels::gemv`].
fn gemv(k: usize, a: &[f32], b: &[f32], ldb: usize, c: &mut [f32], accumulate: bool) {
    let n = c.len();
    check_gemv_operands(k, a, b, ldb, n);
    if !accumulate {
        c.fill(0.0);
    }
    for (&a_value, b_step) in a[..k].iter().zip(b.chunks(ldb.max(1))) {
        for (sum, &b_value) in c.iter_mut().zip(&b_step[..n]) {
            *sum += a_value * b_value;
        }
    }
}

/// See [`Kernels::prefetch`]: nothing portable asks the cache for data; the hardware
/// prefetchers have to do.
fn prefetch(_data: &[f32]) {}
