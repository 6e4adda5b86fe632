//! A matrix kept in ggml's blocks (`format/blocks.rs`), once for every instruction set:
//! widened a micro-panel at a time for the microtile
//! ([`Kernels::widen_blocks`](crate::kernels::Kernels::widen_blocks), prefill), or multiplied
//! by a few rows in registers ([`Kernels::gemv_blocks`](crate::kernels::Kernels::gemv_blocks),
//! decoding).
//!
//! The matrix's columns (the blocks' rows) are interleaved [`Simd::LANES`] at a time
//! ([`BlockRows`], done once by [`PackedB`](crate::kernels::PackedB)), so each step of a group
//! of columns is one vector widened by its [`BlockFormat`], one lane per column: the row of
//! the `f32` panel the microtile and `gemv_stored` read. `gemv_blocks` runs each output's chain
//! `acc = a[p] · b(p, j) + acc`, `p` ascending, from zero or from `C`, its NaNs made canonical
//! at the end: the bits of the microtile over the widened matrix, with no widened value ever
//! stored, and [`PASS_GROUPS`] groups at a time so that as many chains hide the multiply-adds'
//! latency.

use crate::kernels::format::blocks::{with_block_format, BlockFormat, BlockRows, RUN};
use crate::kernels::operands::fits;
use crate::kernels::simd::Simd;

/// The most rows one [`gemv_blocks`] call takes.
pub(crate) const BLOCK_ROWS: usize = 4;

/// Groups of columns one pass of [`gemv_blocks`] walks together (the rest one at a time).
const PASS_GROUPS: usize = 4;

/// Steps `p0 .. p0 + kc` (whole runs) of the `G` groups of columns whose superblock rows start
/// at `groups`, in order: `step(p, vectors)` with `vectors[g]` lane `c` the value of step `p`
/// of column `c` of group `g`.
///
/// # Safety
/// Each pointer is the start of a group of `F`'s interleaved rows (of `LANES` columns)
/// holding steps `p0 .. p0 + kc`, and `p0`, `kc` are multiples of [`RUN`].
#[inline(always)]
unsafe fn steps<S: Simd, F: BlockFormat, const G: usize>(
    s: S,
    groups: [*const u8; G],
    (p0, kc): (usize, usize),
    mut step: impl FnMut(usize, [S::V; G]),
) {
    // Plain loops over the groups (`array::map` and `from_fn` may be left out of line, and
    // with them the vector code, compiled without the table's features).
    let mut constants = [[s.zero(); 2]; G];
    let mut vectors = [s.zero(); G];
    for p in (p0..p0 + kc).step_by(RUN) {
        let (offset, run) = (p / F::VALUES * F::BYTES * S::LANES, p % F::VALUES / RUN);
        let mut blocks = groups;
        for (b, k) in blocks.iter_mut().zip(&mut constants) {
            *b = b.wrapping_add(offset);
            // SAFETY: the caller's promise: step p's superblock is inside each group.
            *k = unsafe { F::constants(s, *b, run) };
        }
        for t in 0..RUN {
            for ((v, &b), k) in vectors.iter_mut().zip(&blocks).zip(&constants) {
                // SAFETY: as above, value t < RUN of the run.
                *v = unsafe { F::step(s, b, run, t, k) };
            }
            step(p + t, vectors);
        }
    }
}

/// Where the group of columns `j ..` (`j` a multiple of `LANES`) of `src` starts.
#[inline(always)]
fn group_start<S: Simd>(src: BlockRows<'_>, j: usize) -> *const u8 {
    src.bytes.as_ptr().wrapping_add(j * src.row_bytes())
}

/// See [`Kernels::widen_blocks`](crate::kernels::Kernels::widen_blocks): `dst[p · nr + c]`
/// = value `p0 + p` of output row `j0 + c` for `p < kc`, `c < width`, 0 for `width ≤ c < nr`.
///
/// # Panics
/// When `p0` or `kc` is not a whole number of blocks, the rows or steps are not in `src`,
/// `src` does not interleave `LANES` rows, `j0` or `nr` is not whole groups, `width > nr`,
/// or `dst` holds fewer than `kc · nr` values.
#[inline(always)]
pub(crate) fn widen_panel<S: Simd>(
    s: S,
    src: BlockRows<'_>,
    (j0, width): (usize, usize),
    (p0, kc): (usize, usize),
    (dst, nr): (&mut [f32], usize),
) {
    let values = src.quant.values();
    assert!(
        p0.is_multiple_of(values)
            && kc.is_multiple_of(values)
            && p0 + kc <= src.k
            && src.group == S::LANES
            && j0.is_multiple_of(S::LANES)
            && nr.is_multiple_of(S::LANES)
            && width <= nr
            && src.holds(j0 + width)
            && dst.len() >= kc * nr,
        "widen_blocks operands shorter than the contract"
    );
    for c0 in (0..width).step_by(S::LANES) {
        let dst = dst[c0..].as_mut_ptr();
        let store = |p: usize, [v]: [S::V; 1]| {
            // SAFETY: step p - p0 < kc, columns c0 .. c0 + LANES ≤ nr of `dst` (checked
            // above).
            unsafe { s.store(dst.add((p - p0) * nr), v) };
        };
        let group = [group_start::<S>(src, j0 + c0)];
        // SAFETY: the group's rows hold steps p0 .. p0 + kc, whole blocks (checked above).
        with_block_format!(src.quant, |F| unsafe {
            steps::<S, F, 1>(s, group, (p0, kc), store)
        });
    }
    // The lanes past the last column are the padding rows' values: zeros there.
    if width < nr {
        for step in dst.chunks_exact_mut(nr).take(kc) {
            step[width..].fill(0.0);
        }
    }
}

/// See [`Kernels::gemv_blocks`](crate::kernels::Kernels::gemv_blocks).
///
/// # Panics
/// When `rows` exceeds [`BLOCK_ROWS`], `b` does not interleave `LANES` rows, `j0` is not
/// whole groups, or an operand is shorter than `rows` rows of `k` values of `a` (`lda` apart),
/// the rows of columns `j0 .. j0 + n` of `b` and `rows` rows of `n` values of `c` (`ldc`
/// apart).
#[inline(always)]
pub(crate) fn gemv_blocks<S: Simd>(
    s: S,
    b: BlockRows<'_>,
    (j0, n): (usize, usize),
    (a, lda): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    rows: usize,
    accumulate: bool,
) {
    let (k, last) = (b.k, rows.saturating_sub(1));
    assert!(
        rows <= BLOCK_ROWS
            && b.group == S::LANES
            && j0.is_multiple_of(S::LANES)
            && (rows == 0 || (fits(a.len(), last, lda, k) && fits(c.len(), last, ldc, n)))
            && b.holds(j0 + n),
        "gemv_blocks operands shorter than the contract"
    );
    // Row r's first values (past the call's rows, pointers never read).
    let a: [*const f32; BLOCK_ROWS] = core::array::from_fn(|r| a.as_ptr().wrapping_add(r * lda));
    let c0 = c.as_mut_ptr();
    let c: [*mut f32; BLOCK_ROWS] = core::array::from_fn(|r| c0.wrapping_add(r * ldc));
    let call = Call {
        b,
        a,
        c,
        accumulate,
    };
    // Whole passes of PASS_GROUPS groups, then the rest (the last partial) one group a pass.
    let passes = n / (PASS_GROUPS * S::LANES);
    let rest = passes * PASS_GROUPS * S::LANES;
    with_block_format!(b.quant, |F| {
        for pass in 0..passes {
            let c0 = pass * PASS_GROUPS * S::LANES;
            rows_pass::<S, F, PASS_GROUPS>(s, &call, (j0, c0), rows, n - c0);
        }
        for c0 in (rest..n).step_by(S::LANES) {
            rows_pass::<S, F, 1>(s, &call, (j0, c0), rows, n - c0);
        }
    });
}

/// The checked operands of one [`gemv_blocks`] call: each row's first value of `A` and of
/// `C` (the rows past the call's not read).
struct Call<'b> {
    b: BlockRows<'b>,
    a: [*const f32; BLOCK_ROWS],
    c: [*mut f32; BLOCK_ROWS],
    accumulate: bool,
}

/// One pass of [`gemv_blocks`]: the `G` groups of columns `c0 ..` of the call (matrix
/// columns `j0 + c0 ..`), of which `left` are left (the last group's lanes past it not
/// stored), for `rows` rows.
#[inline(always)]
fn rows_pass<S: Simd, F: BlockFormat, const G: usize>(
    s: S,
    call: &Call<'_>,
    (j0, c0): (usize, usize),
    rows: usize,
    left: usize,
) {
    match rows {
        1 => pass::<S, F, G, 1>(s, call, (j0, c0), left),
        2 => pass::<S, F, G, 2>(s, call, (j0, c0), left),
        3 => pass::<S, F, G, 3>(s, call, (j0, c0), left),
        _ => pass::<S, F, G, 4>(s, call, (j0, c0), left),
    }
}

/// [`rows_pass`] for `R` rows: `R × G` accumulators.
#[inline(always)]
fn pass<S: Simd, F: BlockFormat, const G: usize, const R: usize>(
    s: S,
    call: &Call<'_>,
    (j0, c0): (usize, usize),
    left: usize,
) {
    let width = |g: usize| S::LANES.min(left - g * S::LANES);
    let mut acc = [[s.zero(); G]; R];
    if call.accumulate {
        for (row, c) in acc.iter_mut().zip(call.c) {
            for (g, sum) in row.iter_mut().enumerate() {
                // SAFETY: columns c0 + g·LANES .. + width(g) < n of every row of `c` (checked
                // by `gemv_blocks`).
                *sum = unsafe { s.load_first(c.add(c0 + g * S::LANES), width(g)) };
            }
        }
    }
    let mut groups = [call.b.bytes.as_ptr(); G];
    for (g, start) in groups.iter_mut().enumerate() {
        *start = group_start::<S>(call.b, j0 + c0 + g * S::LANES);
    }
    let step = |p: usize, vectors: [S::V; G]| {
        for (row, a) in acc.iter_mut().zip(call.a) {
            // SAFETY: step p < k of every row of `a` (checked by `gemv_blocks`).
            let x = s.splat(unsafe { *a.add(p) });
            for (sum, &v) in row.iter_mut().zip(&vectors) {
                *sum = s.mul_add(x, v, *sum);
            }
        }
    };
    // SAFETY: the groups' rows hold all k steps, whole blocks (a `BlockRows` row).
    unsafe { steps::<S, F, G>(s, groups, (0, call.b.k), step) };
    for (row, c) in acc.iter().zip(call.c) {
        for (g, &sum) in row.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { s.store_first(c.add(c0 + g * S::LANES), width(g), s.canonical_nan(sum)) };
        }
    }
}
