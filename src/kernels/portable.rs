//! Portable kernels: plain loops over fixed-size arrays that LLVM vectorises for whatever the
//! build targets. They define the arithmetic the SIMD kernels repeat in shape (the SIMD ones
//! fuse multiply and add; these cannot, as `f32::mul_add` needs `std`).

use super::{exp, tile_steps, Isa, Kernels};

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
    axpy,
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
    let mut acc = [[0.0f32; NR]; MR];
    if accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            row.copy_from_slice(&c[i * ldc..][..NR]);
        }
    }
    for (a_step, b_step) in tile_steps::<MR, NR>(k, a, lda, b, ldb) {
        for (row, &a_value) in acc.iter_mut().zip(a_step) {
            for (sum, &b_value) in row.iter_mut().zip(b_step) {
                *sum += a_value * b_value;
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        c[i * ldc..][..NR].copy_from_slice(row);
    }
}

/// See [`Kernels::softmax_block`].
pub(crate) fn softmax_block(
    scores: &mut [f32],
    lds: usize,
    keys: usize,
    max: &mut [f32],
    sum: &mut [f32],
    rescale: &mut [f32],
) {
    let q = max.len();
    let (sum, rescale) = (&mut sum[..q], &mut rescale[..q]);
    // The new running max goes into `rescale` first.
    rescale.copy_from_slice(max);
    for row in scores.chunks_mut(lds).take(keys) {
        for (new, &s) in rescale.iter_mut().zip(&row[..q]) {
            // A NaN score must win and stay, so that it reaches the output.
            if s > *new || s.is_nan() {
                *new = s;
            }
        }
    }
    for ((old, new), total) in max.iter_mut().zip(rescale.iter_mut()).zip(sum.iter_mut()) {
        let factor = if *old == *new {
            1.0
        } else {
            exp::exp(*old - *new)
        };
        *old = *new;
        *new = factor;
        *total *= factor;
    }
    for row in scores.chunks_mut(lds).take(keys) {
        for ((s, &m), total) in row[..q].iter_mut().zip(max.iter()).zip(sum.iter_mut()) {
            *s = if m == f32::NEG_INFINITY {
                0.0
            } else {
                exp::exp(*s - m)
            };
            *total += *s;
        }
    }
}

/// See [`Kernels::axpy`].
fn axpy(p: f32, v: &[f32], o: &mut [f32]) {
    for (o, &v) in o.iter_mut().zip(v) {
        *o += p * v;
    }
}
