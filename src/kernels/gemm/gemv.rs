//! `gemv` over a stored matrix ([`Kernels::gemv_stored`](crate::kernels::Kernels::gemv_stored)),
//! once for every instruction set: a few rows of `A` times a [`Stored`] `B` (plain rows, or
//! the panels of a [`PackedB`](crate::kernels::PackedB)), each element of `B` widened in
//! registers by its format's [`Read`], once for all the rows.
//!
//! Each column of each row is the microtile's chain, `acc = a[p] · b(p, j) + acc`, `p`
//! ascending, from zero or from `C`, its NaNs made canonical at the end, so a row has the bits
//! of the tile's row over the widened matrix, however the columns are cut into passes. The
//! columns go in passes of up to [`Simd::GEMV_VECTORS`] vectors for one row, fewer for more
//! rows (at most [`PASS_ACCUMULATORS`] accumulators in all), whole panels but for the last
//! pass, as even as the panels allow. Streaming packed panels (weights, from memory), a pass
//! prefetches each panel [`Simd::GEMV_PREFETCH_STEPS`] steps ahead.

use crate::kernels::format::read::{with_reader, Read};
use crate::kernels::format::Stored;
use crate::kernels::gemm::micro::LINE_BYTES;
use crate::kernels::operands::fits;
use crate::kernels::simd::Simd;

/// The most rows one call takes (the GQA heads of one key/value head that share each widened
/// element).
pub(crate) const STORED_ROWS: usize = 4;

/// The most accumulators a pass of more than one row keeps in registers, over all its rows.
const PASS_ACCUMULATORS: usize = 12;

/// The most vectors of columns a pass over `rows` rows takes: [`Simd::GEMV_VECTORS`] for one
/// row, else the largest power of two that keeps at most [`PASS_ACCUMULATORS`] (the widths
/// `gemv`'s arms instantiate).
fn pass_vectors<S: Simd>(rows: usize) -> usize {
    match rows {
        0 | 1 => S::GEMV_VECTORS,
        _ => 1 << (PASS_ACCUMULATORS / rows).ilog2(),
    }
}

/// How a call's columns lie in `B`: `group_vectors` vectors per panel (1 for plain rows),
/// where each column starts ([`Stored::column`]), and whether to prefetch (panels).
#[derive(Clone, Copy)]
struct Layout<'a> {
    b: Stored<'a>,
    group_vectors: usize,
    prefetch: bool,
}

/// One pass: columns `j0 .. j0 + width` of `R` rows of `k` steps, `a[r]` and `c[r]` each
/// row's first value of `A` and of `C`.
#[derive(Clone, Copy)]
struct Pass<const R: usize> {
    k: usize,
    a: [*const f32; R],
    c: [*mut f32; R],
    j0: usize,
    width: usize,
}

/// See [`Kernels::gemv_stored`](crate::kernels::Kernels::gemv_stored).
///
/// # Panics
/// When `rows` exceeds [`STORED_ROWS`], `B`'s panels are not whole vectors, or an operand is
/// shorter than `rows` rows of `k` values of `a` (`lda` apart), `k × n` elements of `b` and
/// `rows` rows of `n` values of `c` (`ldc` apart).
#[inline(always)]
pub(crate) fn gemv<S: Simd>(
    s: S,
    k: usize,
    (a, lda): (&[f32], usize),
    b: Stored<'_>,
    (c, ldc, n): (&mut [f32], usize, usize),
    rows: usize,
    accumulate: bool,
) {
    let last = rows.saturating_sub(1);
    let group = b.panels.map_or(S::LANES, |p| p.width);
    let group_vectors = group / S::LANES;
    assert!(
        rows <= STORED_ROWS
            && group.is_multiple_of(S::LANES)
            && (1..=pass_vectors::<S>(rows)).contains(&group_vectors)
            && (rows == 0 || (fits(a.len(), last, lda, k) && fits(c.len(), last, ldc, n)))
            && b.holds(k, n),
        "gemv_stored operands shorter than the contract"
    );
    let layout = Layout {
        b,
        group_vectors,
        prefetch: b.panels.is_some(),
    };
    /// The passes of `$r` rows, one arm per pass width `$v` that many rows use.
    macro_rules! rows {
        ($reader:ident, $r:literal: $($v:literal)*) => {{
            let a: [*const f32; $r] = core::array::from_fn(|r| a[r * lda..].as_ptr());
            let c: [*mut f32; $r] = core::array::from_fn(|r| c[r * ldc..].as_mut_ptr());
            for (j0, width) in passes::<S>(n, group_vectors, pass_vectors::<S>($r)) {
                let pass = Pass { k, a, c, j0, width };
                // SAFETY: (every arm) the pass's columns are inside every row of `c` and of
                // rows p < k of `b`, and every row of `a` holds k values (checked above); the
                // pass holds exactly $v vectors.
                match width.div_ceil(S::LANES) {
                    $(
                        $v => unsafe {
                            gemv_pass::<S, _, $v, $r>(s, $reader, layout, pass, accumulate)
                        },
                    )*
                    _ => unreachable!("a pass holds 1 to pass_vectors vectors"),
                }
            }
        }};
    }
    with_reader!(b, |reader| match rows {
        0 => {}
        1 => rows!(reader, 1: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24),
        2 => rows!(reader, 2: 1 2 3 4),
        3 => rows!(reader, 3: 1 2 3 4),
        _ => rows!(reader, 4: 1 2),
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

/// One pass of [`gemv`]: `V` vectors of columns for `R` rows, the last one partial when the
/// pass's width is not a whole number of vectors.
///
/// # Safety
/// `pass.width` is in `(V-1)·LANES + 1 ..= V·LANES`; its columns are inside every row of `c`
/// and every row `p < k` of `b`; every row of `a` holds `k` values.
#[inline(always)]
unsafe fn gemv_pass<S: Simd, B: Read, const V: usize, const R: usize>(
    s: S,
    b: B,
    layout: Layout<'_>,
    Pass { k, a, c, j0, width }: Pass<R>,
    accumulate: bool,
) {
    let lanes = S::LANES;
    let tail = width - (V - 1) * lanes;
    let partial = tail < lanes;
    // Where vector v starts in a row of B.
    let at: [usize; V] = core::array::from_fn(|v| layout.b.column(j0 + v * lanes));
    let mut acc = [[s.zero(); V]; R];
    if accumulate {
        for (row, c) in acc.iter_mut().zip(c) {
            for (v, sum) in row.iter_mut().enumerate() {
                let src = c.wrapping_add(j0 + v * lanes);
                // SAFETY: the caller's promise; a partial last vector reads its `tail` columns.
                *sum = unsafe {
                    if partial && v == V - 1 {
                        s.load_first(src, tail)
                    } else {
                        s.load(src)
                    }
                };
            }
        }
    }
    for p in 0..k {
        if S::GEMV_PREFETCH_STEPS > 0 && layout.prefetch {
            prefetch_panels::<S, B, V>(s, b, layout.group_vectors, p, &at);
        }
        // SAFETY: the caller's promise: p < k values in every row of `a`.
        let x: [S::V; R] = core::array::from_fn(|r| s.splat(unsafe { *a[r].add(p) }));
        for v in 0..V {
            // SAFETY: the caller's promise; a partial last vector reads its `tail` columns.
            let element = unsafe {
                if partial && v == V - 1 {
                    b.partial(s, p, at[v], tail)
                } else {
                    b.vector(s, p, at[v])
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
                if partial && v == V - 1 {
                    s.store_first(dst, tail, sum);
                } else {
                    s.store(dst, sum);
                }
            }
        }
    }
}

/// Asks for the rows of the pass's panels (`V` vectors starting at `at`, `group_vectors` per
/// panel) [`Simd::GEMV_PREFETCH_STEPS`] steps after step `p`, one request per cache line.
#[inline(always)]
fn prefetch_panels<S: Simd, B: Read, const V: usize>(
    s: S,
    b: B,
    group_vectors: usize,
    p: usize,
    at: &[usize; V],
) {
    let (line, nr) = (LINE_BYTES / B::BYTES, group_vectors * S::LANES);
    for g in 0..V.div_ceil(group_vectors) {
        for l in 0..nr.div_ceil(line) {
            b.prefetch(
                s,
                p + S::GEMV_PREFETCH_STEPS,
                at[g * group_vectors] + l * line,
            );
        }
    }
}
