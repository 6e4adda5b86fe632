//! The GEMM microkernels, once for every instruction set: the microtile
//! ([`Kernels::tile`](crate::kernels::Kernels::tile)), its one-row `gemv` and `gemv` across packed
//! panels, written over the primitives of [`Simd`].
//!
//! The microtile is `MR × NR` with `NR = NV · LANES`: each row of the tile is `NV` vector
//! accumulators, each step `p` loads one `NR`-wide row of `B` (`NV` vectors) and broadcasts
//! the `MR` values of `A`'s step, one multiply-add per accumulator. `gemv` repeats a row's
//! chain with up to [`Simd::GEMV_VECTORS`] vectors of columns in registers.

use crate::kernels::operands::{
    check_gemv_operands, check_gemv_panel_operands, check_tile_operands,
};
use crate::kernels::simd::{Simd, MAX_LANES};
use crate::kernels::store::narrow::half_to_f32;

/// Bytes per cache line.
const LINE_BYTES: usize = 64;
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

/// See [`Kernels::gemv`](crate::kernels::Kernels::gemv): each column is the chain `acc =
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
    let b = (b.as_ptr(), ldb, nr);
    // SAFETY: checked: row p < k of `b` holds the c.len() columns, NR of them every NR values.
    unsafe { gemv_columns::<S, Floats>(s, NV, k, a, b, c, accumulate) }
}

/// Packed panels of `B` as a [`PackedB`](crate::kernels::PackedB) stores them: `f32`, or bfloat16 or
/// binary16 bits that the kernels widen in registers (exactly).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Panels<'a> {
    /// `f32` values.
    F32(&'a [f32]),
    /// bfloat16 bits.
    Bf16(&'a [u16]),
    /// binary16 bits.
    F16(&'a [u16]),
}

impl<'a> Panels<'a> {
    /// The number of stored values.
    pub(crate) fn len(self) -> usize {
        match self {
            Panels::F32(v) => v.len(),
            Panels::Bf16(v) | Panels::F16(v) => v.len(),
        }
    }

    /// The values from `start` on.
    ///
    /// # Panics
    /// When there are fewer than `start`.
    pub(crate) fn skip(self, start: usize) -> Panels<'a> {
        match self {
            Panels::F32(v) => Panels::F32(&v[start..]),
            Panels::Bf16(v) => Panels::Bf16(&v[start..]),
            Panels::F16(v) => Panels::F16(&v[start..]),
        }
    }

    /// The first `len` values.
    ///
    /// # Panics
    /// When there are fewer.
    pub(crate) fn take(self, len: usize) -> Panels<'a> {
        match self {
            Panels::F32(v) => Panels::F32(&v[..len]),
            Panels::Bf16(v) => Panels::Bf16(&v[..len]),
            Panels::F16(v) => Panels::F16(&v[..len]),
        }
    }
}

/// How [`gemv_columns`] reads one kind of stored element of `B` into a vector of `f32`.
trait Element {
    /// The stored element.
    type Stored: Copy;
    /// `src[..LANES]`, widened.
    ///
    /// # Safety
    /// `src` points to `LANES` readable elements.
    unsafe fn load<S: Simd>(s: S, src: *const Self::Stored) -> S::V;
    /// `src[..n]` widened in the first `n` lanes (`1 ≤ n ≤ LANES`), zeros in the others.
    ///
    /// # Safety
    /// `src` points to `n` readable elements.
    unsafe fn load_first<S: Simd>(s: S, src: *const Self::Stored, n: usize) -> S::V;
}

/// `f32` elements.
struct Floats;
/// bfloat16 (`BF16`) or binary16 bits.
struct Halves<const BF16: bool>;

impl Element for Floats {
    type Stored = f32;
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, src: *const f32) -> S::V {
        // SAFETY: the caller's promise.
        unsafe { s.load(src) }
    }
    #[inline(always)]
    unsafe fn load_first<S: Simd>(s: S, src: *const f32, n: usize) -> S::V {
        // SAFETY: the caller's promise.
        unsafe { s.load_first(src, n) }
    }
}

impl<const BF16: bool> Element for Halves<BF16> {
    type Stored = u16;
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, src: *const u16) -> S::V {
        // SAFETY: the caller's promise.
        unsafe { s.load_half::<BF16>(src) }
    }
    #[inline(always)]
    unsafe fn load_first<S: Simd>(s: S, src: *const u16, n: usize) -> S::V {
        s.load_lanes(|i| {
            if i < n {
                // SAFETY: the caller's promise: `src` holds n values, and i < n.
                half_to_f32::<BF16>(unsafe { *src.add(i) })
            } else {
                0.0
            }
        })
    }
}

/// See [`Kernels::gemv_panels`](crate::kernels::Kernels::gemv_panels): [`gemv`]'s chains, up to
/// [`Simd::GEMV_VECTORS`] vectors of several `NV`-vector panels per pass, each element of a
/// 16-bit panel widened in registers.
#[inline(always)]
pub(crate) fn gemv_panels<S: Simd, const NV: usize>(
    s: S,
    k: usize,
    a: &[f32],
    (panels, panel_len): (Panels<'_>, usize),
    c: &mut [f32],
    accumulate: bool,
) {
    let nr = NV * S::LANES;
    check_gemv_panel_operands(k, a, panels.len(), panel_len, nr, c.len());
    // SAFETY: checked: column j at step p < k is at (j / NR)·panel_len + p·NR + j % NR.
    unsafe {
        match panels {
            Panels::F32(b) => {
                let b = (b.as_ptr(), nr, panel_len);
                gemv_columns::<S, Floats>(s, NV, k, a, b, c, accumulate)
            }
            Panels::Bf16(b) => {
                let b = (b.as_ptr(), nr, panel_len);
                gemv_columns::<S, Halves<true>>(s, NV, k, a, b, c, accumulate)
            }
            Panels::F16(b) => {
                let b = (b.as_ptr(), nr, panel_len);
                gemv_columns::<S, Halves<false>>(s, NV, k, a, b, c, accumulate)
            }
        }
    }
}

/// Where the columns of `B` are for [`gemv_columns`]: `(b, ldb, group)`, element `(p, j)` at
/// `b + (j / NR)·group + p·ldb + j % NR` (`group = NR`: plain rows of stride `ldb`).
type Columns<T> = (*const T, usize, usize);

/// `gemv` over columns grouped by `NR = group_vectors · LANES` (see [`Columns`]), elements
/// of `B` read as `E`. The columns go in passes of at most [`Simd::GEMV_VECTORS`] vectors,
/// whole groups but for the last pass, as even as the groups allow.
///
/// # Safety
/// `a` holds `k` values; for every `p < k` and `j < c.len()` the element of `b` is readable.
#[inline(always)]
unsafe fn gemv_columns<S: Simd, E: Element>(
    s: S,
    group_vectors: usize,
    k: usize,
    a: &[f32],
    (b, ldb, group): Columns<E::Stored>,
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
                            unsafe { gemv_pass::<S, E, $v, false>(s, nr, a, columns, c, accumulate) }
                        }
                        ($v, false) if $v <= S::GEMV_VECTORS => {
                            let a = (k, a);
                            // SAFETY: as above, the last of the $v vectors partial.
                            unsafe { gemv_pass::<S, E, $v, true>(s, nr, a, columns, c, accumulate) }
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
unsafe fn gemv_pass<S: Simd, E: Element, const V: usize, const PARTIAL: bool>(
    s: S,
    nr: usize,
    (k, a): (usize, &[f32]),
    (b, ldb, group): Columns<E::Stored>,
    c: &mut [f32],
    accumulate: bool,
) {
    let lanes = S::LANES;
    let group_vectors = nr / lanes;
    // Where vector v starts in a row of B; elements of B per cache line.
    let offset = |v: usize| (v / group_vectors) * group + (v % group_vectors) * lanes;
    let line = LINE_BYTES / size_of::<E::Stored>();
    let last = (V - 1) * lanes;
    let tail = c.len() - last;
    let c_ptr = c.as_mut_ptr();
    // SAFETY: (every load and store of C and B below) vectors v < V-1, and the last one when
    // not PARTIAL, are whole columns of `c` and of row p < k of `b` (the caller's promise);
    // the partial last vector reads and writes only its `tail` columns.
    let load_b = |src: *const E::Stored, v: usize| unsafe {
        if PARTIAL && v == V - 1 {
            E::load_first(s, src, tail)
        } else {
            E::load(s, src)
        }
    };
    // SAFETY: as above, for the vectors of `c`.
    let load_c = |src: *const f32, v: usize| unsafe {
        if PARTIAL && v == V - 1 {
            s.load_first(src, tail)
        } else {
            s.load(src)
        }
    };
    let mut acc = [s.zero(); V];
    if accumulate {
        for (v, sum) in acc.iter_mut().enumerate() {
            *sum = load_c(c_ptr.wrapping_add(v * lanes), v);
        }
    }
    let mut b_step = b;
    for &a_value in &a[..k] {
        if S::GEMV_PREFETCH_STEPS > 0 {
            // A prefetch never faults, wherever it points.
            let ahead = b_step.wrapping_add(S::GEMV_PREFETCH_STEPS * ldb);
            for g in 0..V.div_ceil(group_vectors) {
                for l in 0..nr.div_ceil(line) {
                    s.prefetch(ahead.wrapping_add(g * group + l * line).cast());
                }
            }
        }
        let a_value = s.splat(a_value);
        for (v, sum) in acc.iter_mut().enumerate() {
            *sum = s.mul_add(a_value, load_b(b_step.wrapping_add(offset(v)), v), *sum);
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
