//! The GEMM microkernels, once for every instruction set: the microtile
//! ([`Kernels::tile`](super::Kernels::tile)), its one-row `gemv` and `gemv` across packed
//! panels, written over the primitives of [`Simd`].
//!
//! The microtile is `MR × NR` with `NR = NV · LANES`: each row of the tile is `NV` vector
//! accumulators, each step `p` loads one `NR`-wide row of `B` (`NV` vectors) and broadcasts
//! the `MR` values of `A`'s step, one multiply-add per accumulator. `gemv` repeats a row's
//! chain with up to [`Simd::GEMV_VECTORS`] vectors of columns in registers.

use super::simd::{Simd, MAX_LANES};
use super::{check_gemv_operands, check_gemv_panel_operands, check_tile_operands};

/// Floats per 64-byte cache line.
const LINE: usize = 16;

/// See [`Kernels::tile`](super::Kernels::tile): `c[i*ldc + j] (+)= Σ_p a[p*lda + i] ·
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
    if S::TILE_PREFETCHES_C {
        // The tile's rows of C (one or two lines each) are read or written only after the k
        // steps: start fetching them now.
        for i in 0..MR {
            s.prefetch(c[i * ldc..].as_ptr());
            s.prefetch(c[i * ldc + nr - 1..].as_ptr());
        }
    }
    // acc[i][v] = row i of the tile, columns v·LANES ..
    let mut acc = [[s.zero(); NV]; MR];
    if accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            for (v, sum) in row.iter_mut().enumerate() {
                let c = &c[i * ldc + v * lanes..][..lanes];
                // SAFETY: `c` holds LANES values.
                *sum = unsafe { s.load(c.as_ptr()) };
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
            let c = &mut c[i * ldc + v * lanes..][..lanes];
            // SAFETY: `c` holds LANES values.
            unsafe { s.store(c.as_mut_ptr(), s.canonical_nan(sum)) };
        }
    }
}

/// See [`Kernels::gemv`](super::Kernels::gemv): each column is the chain `acc =
/// a[p] · b[p*ldb + j] + acc`, `p` ascending, as in the microtile of `NV` vectors per row.
#[inline(always)]
pub(crate) fn gemv<S: Simd, const NV: usize>(
    s: S,
    k: usize,
    a: &[f32],
    (b, ldb): (&[f32], usize),
    c: &mut [f32],
    accumulate: bool,
) {
    check_gemv_operands(k, a, b, ldb, c.len());
    let nr = NV * S::LANES;
    // SAFETY: checked: row p < k of `b` holds the c.len() columns, NR of them every NR values.
    unsafe { gemv_columns(s, NV, k, a, (b.as_ptr(), ldb, nr), c, accumulate) }
}

/// See [`Kernels::gemv_panels`](super::Kernels::gemv_panels): [`gemv`]'s chains, up to
/// [`Simd::GEMV_VECTORS`] vectors of several `NV`-vector panels per pass.
#[inline(always)]
pub(crate) fn gemv_panels<S: Simd, const NV: usize>(
    s: S,
    k: usize,
    a: &[f32],
    (panels, panel_len): (&[f32], usize),
    c: &mut [f32],
    accumulate: bool,
) {
    let nr = NV * S::LANES;
    check_gemv_panel_operands(k, a, panels, panel_len, nr, c.len());
    // SAFETY: checked: column j at step p < k is at (j / NR)·panel_len + p·NR + j % NR.
    unsafe { gemv_columns(s, NV, k, a, (panels.as_ptr(), nr, panel_len), c, accumulate) }
}

/// Where the columns of `B` are for [`gemv_columns`]: `(b, ldb, group)`, element `(p, j)` at
/// `b + (j / NR)·group + p·ldb + j % NR` (`group = NR`: plain rows of stride `ldb`).
type Columns = (*const f32, usize, usize);

/// `gemv` over columns grouped by `NR = group_vectors · LANES` (see [`Columns`]). The
/// columns go in passes of at most [`Simd::GEMV_VECTORS`] vectors, whole groups but for the
/// last pass, as even as the groups allow.
///
/// # Safety
/// `a` holds `k` values; for every `p < k` and `j < c.len()` the element of `b` is readable.
#[inline(always)]
unsafe fn gemv_columns<S: Simd>(
    s: S,
    group_vectors: usize,
    k: usize,
    a: &[f32],
    (b, ldb, group): Columns,
    c: &mut [f32],
    accumulate: bool,
) {
    let (lanes, nr) = (S::LANES, group_vectors * S::LANES);
    let n = c.len();
    let groups = n.div_ceil(nr);
    let passes = groups.div_ceil(S::GEMV_VECTORS / group_vectors);
    for pass in 0..passes {
        let (g0, g1) = (pass * groups / passes, (pass + 1) * groups / passes);
        let (j0, j1) = (g0 * nr, (g1 * nr).min(n));
        let columns = (b.wrapping_add(g0 * group), ldb, group);
        let c = &mut c[j0..j1];
        let vectors = c.len().div_ceil(lanes);
        let whole = c.len().is_multiple_of(lanes);
        /// One arm per pass width `$v`, for the widths this instruction set uses.
        macro_rules! passes {
            ($($v:literal)*) => {
                match (vectors, whole) {
                    $(
                        ($v, true) if $v <= S::GEMV_VECTORS => {
                            let a = (k, a);
                            // SAFETY: the caller's promise for the columns j0 .. j1, exactly
                            // $v whole vectors.
                            unsafe { gemv_pass::<S, $v, false>(s, nr, a, columns, c, accumulate) }
                        }
                        ($v, false) if $v <= S::GEMV_VECTORS => {
                            let a = (k, a);
                            // SAFETY: as above, the last of the $v vectors partial.
                            unsafe { gemv_pass::<S, $v, true>(s, nr, a, columns, c, accumulate) }
                        }
                    )*
                    _ => unreachable!("a pass holds 1 to GEMV_VECTORS vectors"),
                }
            };
        }
        passes!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24);
    }
}

/// One pass of [`gemv_columns`]: `V` vectors of columns, the last one partial when
/// `PARTIAL`; groups of `nr` columns.
///
/// # Safety
/// `c.len()` is `V·LANES` when not `PARTIAL`, else in `(V-1)·LANES + 1 .. V·LANES`; `a`
/// holds `k` values and every element `(p < k, j < c.len())` of `b` (see [`Columns`]) is
/// readable.
#[inline(always)]
unsafe fn gemv_pass<S: Simd, const V: usize, const PARTIAL: bool>(
    s: S,
    nr: usize,
    (k, a): (usize, &[f32]),
    (b, ldb, group): Columns,
    c: &mut [f32],
    accumulate: bool,
) {
    let lanes = S::LANES;
    let group_vectors = nr / lanes;
    // Where vector v starts in a row of B.
    let offset = |v: usize| (v / group_vectors) * group + (v % group_vectors) * lanes;
    let last = (V - 1) * lanes;
    let tail = c.len() - last;
    let c_ptr = c.as_mut_ptr();
    // SAFETY: (every load and store of C and B below) vectors v < V-1, and the last one when
    // not PARTIAL, are whole columns of `c` and of row p < k of `b` (the caller's promise);
    // the partial last vector reads and writes only its `tail` columns.
    let load = |src: *const f32, v: usize| unsafe {
        if PARTIAL && v == V - 1 {
            s.load_first(src, tail)
        } else {
            s.load(src)
        }
    };
    let mut acc = [s.zero(); V];
    if accumulate {
        for (v, sum) in acc.iter_mut().enumerate() {
            *sum = load(c_ptr.wrapping_add(v * lanes), v);
        }
    }
    let mut b_step = b;
    for &a_value in &a[..k] {
        if S::GEMV_PREFETCH_STEPS > 0 {
            // A prefetch never faults, wherever it points.
            let ahead = b_step.wrapping_add(S::GEMV_PREFETCH_STEPS * ldb);
            for g in 0..V.div_ceil(group_vectors) {
                for line in 0..nr.div_ceil(LINE) {
                    s.prefetch(ahead.wrapping_add(g * group + line * LINE));
                }
            }
        }
        let a_value = s.splat(a_value);
        for (v, sum) in acc.iter_mut().enumerate() {
            *sum = s.mul_add(a_value, load(b_step.wrapping_add(offset(v)), v), *sum);
        }
        b_step = b_step.wrapping_add(ldb);
    }
    for (v, &sum) in acc.iter().enumerate() {
        let sum = s.canonical_nan(sum);
        // SAFETY: see above.
        unsafe {
            if PARTIAL && v == V - 1 {
                s.store_first(c_ptr.add(last), tail, sum);
            } else {
                s.store(c_ptr.add(v * lanes), sum);
            }
        }
    }
}

/// See [`Kernels::prefetch`](super::Kernels::prefetch): one L2 request per cache line of
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
