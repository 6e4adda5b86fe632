//! `gemv` over a stored matrix ([`Kernels::gemv_stored`](crate::kernels::Kernels::gemv_stored)),
//! once for every instruction set: a few rows of `A` times a [`Stored`] `B` (plain rows, or
//! the panels of a [`PackedB`](crate::kernels::PackedB)), each element of `B` widened in
//! registers by its format's [`Read`], once for all the rows.
//!
//! Each column of each row is the microtile's chain, `acc = a[p] · b(p, j) + acc`, `p`
//! ascending, from zero or from `C`, its NaNs made canonical at the end, so a row has the bits
//! of the tile's row over the widened matrix, however the columns are cut into passes. Over
//! packed panels (one row: decoding's projections, weights streamed from memory) a pass takes
//! up to [`Simd::GEMV_VECTORS`] vectors, whole panels but for the last pass, as even as the
//! panels allow, and prefetches each panel [`Simd::GEMV_PREFETCH_STEPS`] steps ahead; over
//! plain rows (keys and values, in cache) up to [`PASS_ACCUMULATORS`] accumulators over all
//! the rows. A last partial vector of columns is a pass of its own.

use crate::kernels::format::read::{with_reader, Read};
use crate::kernels::format::Stored;
use crate::kernels::gemm::micro::LINE_BYTES;
use crate::kernels::operands::fits;
use crate::kernels::simd::Simd;

/// The most rows one call takes (the GQA heads of one key/value head that share each widened
/// element).
pub(crate) const STORED_ROWS: usize = 4;

/// The most accumulators a pass over plain rows keeps in registers, over all its rows.
const PASS_ACCUMULATORS: usize = 12;

/// The most vectors of columns a pass over `rows` rows takes: for packed panels (one row)
/// [`Simd::GEMV_VECTORS`], for plain rows the largest power of two that keeps at most
/// [`PASS_ACCUMULATORS`] (the widths `gemv`'s arms instantiate).
fn pass_vectors<S: Simd>(rows: usize, panels: bool) -> usize {
    match panels {
        true => S::GEMV_VECTORS,
        false => 1 << (PASS_ACCUMULATORS / rows.max(1)).ilog2(),
    }
}

/// One pass: columns `j0 .. j0 + width` of `R` rows of `k` steps, `a[r]` and `c[r]` each
/// row's first value of `A` and of `C`; `b` as the call's `B` (for its panels).
#[derive(Clone, Copy)]
struct Pass<'b, const R: usize> {
    k: usize,
    a: [*const f32; R],
    c: [*mut f32; R],
    b: Stored<'b>,
    j0: usize,
    width: usize,
}

/// See [`Kernels::gemv_stored`](crate::kernels::Kernels::gemv_stored); `B`'s panels, if it
/// has them, are the table's: `NV` vectors wide (a constant, so that a pass's offsets and
/// prefetches unroll).
///
/// # Panics
/// When `rows` exceeds [`STORED_ROWS`] (or 1 over panels), `B`'s panels are not `NV`
/// vectors wide, or an operand is shorter than `rows` rows of `k` values of `a` (`lda` apart),
/// `k × n` elements of `b` and `rows` rows of `n` values of `c` (`ldc` apart).
#[inline(always)]
pub(crate) fn gemv<S: Simd, const NV: usize>(
    s: S,
    k: usize,
    (a, lda): (&[f32], usize),
    b: Stored<'_>,
    (c, ldc, n): (&mut [f32], usize, usize),
    rows: usize,
    accumulate: bool,
) {
    let last = rows.saturating_sub(1);
    let panels = b.panels.is_some();
    assert!(
        rows <= if panels { 1 } else { STORED_ROWS }
            && b.panels.is_none_or(|p| p.width == NV * S::LANES)
            && (!panels || NV <= S::GEMV_VECTORS)
            && (rows == 0 || (fits(a.len(), last, lda, k) && fits(c.len(), last, ldc, n)))
            && b.holds(k, n),
        "gemv_stored operands shorter than the contract"
    );
    /// The passes of `$r` rows (in panels when `$panels`), one arm per pass width `$v`.
    macro_rules! rows {
        ($reader:ident, $r:literal, $panels:literal: $($v:literal)*) => {{
            let a: [*const f32; $r] = core::array::from_fn(|r| a[r * lda..].as_ptr());
            let c: [*mut f32; $r] = core::array::from_fn(|r| c[r * ldc..].as_mut_ptr());
            let whole = n - n % S::LANES;
            let (most, group_vectors) = (pass_vectors::<S>($r, $panels), if $panels { NV } else { 1 });
            for (j0, width) in passes::<S>(whole, group_vectors, most) {
                let pass = Pass { k, a, c, b, j0, width };
                match width / S::LANES {
                    $(
                        // SAFETY: the pass's columns are inside every row of `c` and of rows
                        // p < k of `b`, and every row of `a` holds k values (checked above);
                        // the pass holds exactly $v whole vectors.
                        $v => unsafe {
                            gemv_pass::<S, _, NV, $v, $r, false, $panels>(s, $reader, pass, accumulate)
                        },
                    )*
                    _ => unreachable!("a pass holds 1 to pass_vectors vectors"),
                }
            }
            if whole < n {
                let pass = Pass { k, a, c, b, j0: whole, width: n - whole };
                // SAFETY: as above, for the last n % LANES columns, one partial vector.
                unsafe { gemv_pass::<S, _, NV, 1, $r, true, $panels>(s, $reader, pass, accumulate) }
            }
        }};
    }
    with_reader!(b, |reader| match (rows, panels) {
        (0, _) => {}
        (_, true) =>
            rows!(reader, 1, true: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24),
        (1, false) => rows!(reader, 1, false: 1 2 3 4 5 6 7 8),
        (2, false) => rows!(reader, 2, false: 1 2 3 4),
        (3, false) => rows!(reader, 3, false: 1 2 3 4),
        _ => rows!(reader, 4, false: 1 2),
    })
}

/// The passes over `n` columns in groups of `group_vectors` vectors, at most `most` vectors
/// each (at least one group): `(first column, columns)`, whole groups but for the last, as
/// even as the groups allow.
#[inline(always)]
fn passes<S: Simd>(
    n: usize,
    group_vectors: usize,
    most: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let nr = group_vectors * S::LANES;
    let groups = n.div_ceil(nr);
    let passes = groups.div_ceil((most / group_vectors).max(1));
    (0..passes).map(move |pass| {
        let (g0, g1) = (pass * groups / passes, (pass + 1) * groups / passes);
        (g0 * nr, (g1 * nr).min(n) - g0 * nr)
    })
}

/// One pass of [`gemv`]: `V` vectors of columns for `R` rows, the last one partial when
/// `PARTIAL`, over `B`'s panels of `NV` vectors when `PANELS` (else plain rows).
///
/// # Safety
/// `pass.width` is `V·LANES` when not `PARTIAL`, else in `(V-1)·LANES + 1 .. V·LANES`; its
/// columns are inside every row of `c` and every row `p < k` of `b`; every row of `a` holds
/// `k` values.
#[inline(always)]
unsafe fn gemv_pass<
    S: Simd,
    B: Read,
    const NV: usize,
    const V: usize,
    const R: usize,
    const PARTIAL: bool,
    const PANELS: bool,
>(
    s: S,
    b: B,
    Pass {
        k,
        a,
        c,
        b: stored,
        j0,
        width,
    }: Pass<'_, R>,
    accumulate: bool,
) {
    let lanes = S::LANES;
    let tail = width - (V - 1) * lanes;
    // Where vector v starts in a row of B: in panels of `group_vectors` vectors `len` apart
    // from the pass's first column, or `v` vectors on.
    let (group_vectors, len) = (
        if PANELS { NV } else { 1 },
        stored.panels.map_or(0, |p| p.len),
    );
    let first = stored.column(j0);
    let at = |v: usize| match PANELS {
        true => first + v / group_vectors * len + v % group_vectors * lanes,
        false => j0 + v * lanes,
    };
    let mut acc = [[s.zero(); V]; R];
    if accumulate {
        for (row, c) in acc.iter_mut().zip(c) {
            for (v, sum) in row.iter_mut().enumerate() {
                let src = c.wrapping_add(j0 + v * lanes);
                // SAFETY: the caller's promise; a partial last vector reads its `tail` columns.
                *sum = unsafe {
                    if PARTIAL && v == V - 1 {
                        s.load_first(src, tail)
                    } else {
                        s.load(src)
                    }
                };
            }
        }
    }
    for p in 0..k {
        if S::GEMV_PREFETCH_STEPS > 0 {
            prefetch_panels::<S, B, V>(s, b, group_vectors, p, at);
        }
        // SAFETY: the caller's promise: p < k values in every row of `a`.
        let x: [S::V; R] = core::array::from_fn(|r| s.splat(unsafe { *a[r].add(p) }));
        for v in 0..V {
            // SAFETY: the caller's promise; a partial last vector reads its `tail` columns.
            let element = unsafe {
                if PARTIAL && v == V - 1 {
                    b.partial(s, p, at(v), tail)
                } else {
                    b.vector(s, p, at(v))
                }
            };
            for (row, &x) in acc.iter_mut().zip(&x) {
                row[v] = s.mul_add(x, element, row[v]);
            }
        }
    }
    for (row, c) in acc.iter().zip(c) {
        for (v, &sum) in row.iter().enumerate() {
            let (sum, dst) = (s.canonical_nan(sum), c.wrapping_add(j0 + v * lanes));
            // SAFETY: the caller's promise; a partial last vector writes its `tail` columns.
            unsafe {
                if PARTIAL && v == V - 1 {
                    s.store_first(dst, tail, sum);
                } else {
                    s.store(dst, sum);
                }
            }
        }
    }
}

/// Asks for the rows of the pass's panels (`V` vectors, vector `v` at `at(v)`,
/// `group_vectors` per panel) [`Simd::GEMV_PREFETCH_STEPS`] steps after step `p`, one request
/// per cache line.
#[inline(always)]
fn prefetch_panels<S: Simd, B: Read, const V: usize>(
    s: S,
    b: B,
    group_vectors: usize,
    p: usize,
    at: impl Fn(usize) -> usize,
) {
    let (line, nr) = (LINE_BYTES / B::BYTES, group_vectors * S::LANES);
    for g in 0..V.div_ceil(group_vectors) {
        for l in 0..nr.div_ceil(line) {
            b.prefetch(
                s,
                p + S::GEMV_PREFETCH_STEPS,
                at(g * group_vectors) + l * line,
            );
        }
    }
}
