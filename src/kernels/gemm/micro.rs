//! The GEMM microkernel, once for every instruction set: the microtile
//! ([`Kernels::tile`](crate::kernels::Kernels::tile)), written over the primitives of
//! [`Simd`] (its row counterpart is `gemv.rs`).
//!
//! The microtile is `MR × NR` with `NR = NV · LANES`: each row of the tile is `NV` vector
//! accumulators, each step `p` loads one `NR`-wide row of `B` (`NV` vectors) and broadcasts
//! the `MR` values of `A`'s step, one multiply-add per accumulator.

use crate::kernels::operands::check_tile_operands;
use crate::kernels::simd::{Simd, MAX_LANES};

/// Bytes per cache line.
pub(crate) const LINE_BYTES: usize = 64;
/// Floats per cache line.
pub(crate) const LINE: usize = LINE_BYTES / size_of::<f32>();

/// See [`Kernels::tile`](crate::kernels::Kernels::tile): `c[i*ldc + j] (+)= Σ_p a[p*lda + i] ·
/// b[p*ldb + j]`, `p` ascending, one [`Simd::mul_add`] per step.
#[inline(always)]
pub(crate) fn tile<S: Simd, const MR: usize, const NV: usize>(
    s: S,
    k: usize,
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    let lanes = S::LANES;
    let nr = NV * lanes;
    check_tile_operands(k, (a, lda), (b, ldb), (c, ldc), MR, nr);
    let c = &mut c[..(MR - 1) * ldc + nr];
    // Row i's vector v of the tile: checked above to lie inside `c`.
    let c_at = |i: usize, v: usize| i * ldc + v * lanes;
    if S::TILE_PREFETCHES_C {
        // The tile's rows of C (one or two lines each) are read or written only after the k
        // steps: start fetching them now.
        for i in 0..MR {
            s.prefetch(c[c_at(i, 0)..].as_ptr());
            s.prefetch(c[c_at(i, 0) + nr - 1..].as_ptr());
        }
    }
    // acc[i][v] = row i of the tile, columns v·LANES ..
    let mut acc = [[s.zero(); NV]; MR];
    if accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            for (v, sum) in row.iter_mut().enumerate() {
                // SAFETY: `check_tile_operands` proved that `c` holds (MR-1)·ldc + NR values,
                // so LANES values from row i < MR, vector v < NV.
                *sum = unsafe { s.load(c.as_ptr().add(c_at(i, v))) };
            }
        }
    }
    // Step p reads a[p*lda..][..MR] and b[p*ldb..][..NR] through pointers: the slice
    // iterators' per-step checks would compete with the FMAs for execution ports.
    let (mut a_step, mut b_step) = (a.as_ptr(), b.as_ptr());
    for _ in 0..k {
        if S::TILE_PREFETCH_STEPS > 0 {
            // B's row TILE_PREFETCH_STEPS steps ahead, into L1: a panel arriving from memory
            // does not stall the first tile that streams it (a prefetch never faults).
            let ahead = b_step.wrapping_add(S::TILE_PREFETCH_STEPS * ldb);
            for line in 0..nr.div_ceil(LINE) {
                s.prefetch(ahead.wrapping_add(line * LINE));
            }
        }
        let mut b_row = [s.zero(); NV];
        for (v, b) in b_row.iter_mut().enumerate() {
            // SAFETY: `check_tile_operands` proved that every step p < k has NR values of `b`
            // at p*ldb and MR values of `a` at p*lda; the pointers advance by exactly that.
            *b = unsafe { s.load(b_step.add(v * lanes)) };
        }
        // SAFETY: as above.
        unsafe { s.tile_step(&mut acc, a_step, &b_row) };
        a_step = a_step.wrapping_add(lda);
        b_step = b_step.wrapping_add(ldb);
    }
    for (i, row) in acc.iter().enumerate() {
        for (v, &sum) in row.iter().enumerate() {
            // SAFETY: as for the loads above.
            unsafe { s.store(c.as_mut_ptr().add(c_at(i, v)), s.canonical_nan(sum)) };
        }
    }
}

/// See [`Kernels::prefetch`](crate::kernels::Kernels::prefetch): one L2 request per cache line of
/// `data`.
#[inline(always)]
pub(crate) fn prefetch_l2<S: Simd>(s: S, data: &[f32]) {
    for line in data.chunks(LINE) {
        s.prefetch_l2(line.as_ptr());
    }
}

/// The lanes of `v` as floats, in lane order (the first `LANES` of the array).
#[inline(always)]
pub(crate) fn lane_values<S: Simd>(s: S, v: S::V) -> [f32; MAX_LANES] {
    let mut lanes = [0.0f32; MAX_LANES];
    // SAFETY: `lanes` holds MAX_LANES ≥ LANES values.
    unsafe { s.store(lanes.as_mut_ptr(), v) };
    lanes
}
