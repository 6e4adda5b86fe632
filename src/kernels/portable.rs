//! Portable kernels: plain loops over fixed-size arrays that LLVM vectorises for whatever the
//! build targets. They define the arithmetic the SIMD kernels repeat in shape (the SIMD ones
//! fuse multiply and add; these cannot, as `f32::mul_add` needs `std`).

use super::softmax::{softmax_block, softmax_row};
use super::{check_gemv_operands, check_gemv_panel_operands, check_tile_operands, Isa, Kernels};

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
    gemv_panels,
    softmax_row,
    transpose: super::transpose::transpose_scaled,
    softcap: super::tanh::softcap,
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
        store(&mut c[i * ldc..][..NR], row);
    }
}

/// Copies `sums` into `dst`, every NaN as the canonical NaN (see [`Kernels::tile`]).
#[inline(always)]
fn store(dst: &mut [f32], sums: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(sums) {
        *d = canonical_nan(s);
    }
}

/// `x`, or the canonical NaN `f32::NAN` when `x` is a NaN (selected on the bits, which no
/// floating-point reasoning may fold away).
#[inline(always)]
fn canonical_nan(x: f32) -> f32 {
    f32::from_bits(if x.is_nan() {
        f32::NAN.to_bits()
    } else {
        x.to_bits()
    })
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
    for sum in c.iter_mut() {
        *sum = canonical_nan(*sum);
    }
}

/// See [`Kernels::gemv_panels`]: [`gemv`]'s chains, four panels at a time.
fn gemv_panels(
    k: usize,
    a: &[f32],
    panels: &[f32],
    panel_len: usize,
    c: &mut [f32],
    accumulate: bool,
) {
    check_gemv_panel_operands(k, a, panels, panel_len, NR, c.len());
    gemv_columns(k, a, panels, NR, panel_len, c, accumulate);
}

/// Most `NR`-column groups per pass of [`gemv_columns`]: 32 accumulators, which LLVM keeps
/// in registers, instead of one load and store of `c` per step.
const GEMV_GROUPS: usize = 4;

/// [`gemv`]'s chains over columns grouped by [`NR`]: element `(p, j)` of `B` is at
/// `b[(j / NR)·group + p·ldb + j % NR]`, in passes of at most [`GEMV_GROUPS`] whole groups,
/// then the partial last group. (Plain rows go through [`gemv`], whose walk along each row
/// suits the hardware prefetchers better than passes over part of it.)
///
/// # Panics
/// When `b` does not hold those elements for `p < k`, `j < c.len()`, or `a` not `k` values.
fn gemv_columns(
    k: usize,
    a: &[f32],
    b: &[f32],
    ldb: usize,
    group: usize,
    c: &mut [f32],
    accumulate: bool,
) {
    if k == 0 {
        for sum in c.iter_mut() {
            *sum = if accumulate { canonical_nan(*sum) } else { 0.0 };
        }
        return;
    }
    let a = &a[..k];
    let whole = c.len() / NR;
    let mut g = 0;
    while g < whole {
        let count = (whole - g).min(GEMV_GROUPS);
        let b = &b[g * group..];
        let c = &mut c[g * NR..][..count * NR];
        match count {
            4 => whole_groups::<4>(a, b, ldb, group, c, accumulate),
            3 => whole_groups::<3>(a, b, ldb, group, c, accumulate),
            2 => whole_groups::<2>(a, b, ldb, group, c, accumulate),
            _ => whole_groups::<1>(a, b, ldb, group, c, accumulate),
        }
        g += count;
    }
    let c = &mut c[whole * NR..];
    if !c.is_empty() {
        let b = &b[whole * group..];
        let mut sums = [0.0f32; NR];
        let sums = &mut sums[..c.len()];
        if accumulate {
            sums.copy_from_slice(c);
        }
        for (p, &a_value) in a.iter().enumerate() {
            for (sum, &b_value) in sums.iter_mut().zip(&b[p * ldb..][..c.len()]) {
                *sum += a_value * b_value;
            }
        }
        store(c, sums);
    }
}

/// [`gemv_columns`] over `G` whole groups (`c` holds `G·NR` values).
#[inline(always)]
fn whole_groups<const G: usize>(
    a: &[f32],
    b: &[f32],
    ldb: usize,
    group: usize,
    c: &mut [f32],
    accumulate: bool,
) {
    let mut acc = [[0.0f32; NR]; G];
    if accumulate {
        for (sums, c) in acc.iter_mut().zip(c.chunks_exact(NR)) {
            sums.copy_from_slice(c);
        }
    }
    for (p, &a_value) in a.iter().enumerate() {
        for (g, sums) in acc.iter_mut().enumerate() {
            let b_row = &b[g * group + p * ldb..][..NR];
            for (sum, &b_value) in sums.iter_mut().zip(b_row) {
                *sum += a_value * b_value;
            }
        }
    }
    for (sums, c) in acc.iter().zip(c.chunks_exact_mut(NR)) {
        store(c, sums);
    }
}

/// See [`Kernels::prefetch`]: nothing portable asks the cache for data; the hardware
/// prefetchers have to do.
fn prefetch(_data: &[f32]) {}
