//! `C = A · B` in the BLIS shape.
//!
//! Shapes: `A` is `(m, k)` row-major, `B` is `(k, n)` and packed once into [`PackedB`], `C` is
//! `(m, n)` row-major. The loop nest, outermost first:
//!
//! 1. rows of `C` in blocks of `mc` (one work item each; items run on any thread);
//! 2. the reduction in blocks of `kc`: the item packs its `mc × kc` block of `A` into `mr`-row
//!    panels (in L2);
//! 3. `nr`-column panels of `B` (one `kc × nr` micro-panel stays in L1);
//! 4. `mr`-row panels of `A`: one microtile call computes an `mr × nr` tile of `C` in registers.
//!
//! Edge tiles (fewer than `mr` rows or `nr` columns left) run the same microtile on zero-padded
//! panels into a small buffer, then copy the valid part out. Every element of `C` is the same
//! chain of multiply-adds over `p = 0..k` whatever the thread count or row blocking.

use alloc::vec;
use alloc::vec::Vec;

use super::{parallel, Isa, Kernels};
use crate::error::ShapeError;

/// The reduction block: a `kc × nr` micro-panel of `B` should stay in L1.
pub(crate) const KC: usize = 256;

/// A `(k, n)` matrix packed for the microkernels of one instruction set: panels of `nr`
/// columns (the last zero-padded), each panel stored step by step (`nr` values per `p`).
#[derive(Clone, Debug)]
pub struct PackedB {
    k: usize,
    n: usize,
    kernels: &'static Kernels,
    data: Vec<f32>,
}

impl PackedB {
    /// Packs the row-major `(k, n)` matrix `b` for the instruction set `isa`.
    ///
    /// # Errors
    /// When `b.len() != k * n` or `isa` is not supported on this CPU.
    pub fn from_row_major(isa: Isa, b: &[f32], k: usize, n: usize) -> Result<Self, ShapeError> {
        let expected = crate::tensor::element_count(&[k, n])?;
        if b.len() != expected {
            return Err(ShapeError::LengthMismatch {
                what: "matrix B (k, n)",
                expected,
                actual: b.len(),
            });
        }
        Ok(Self::pack(isa.kernels()?, k, n, |p, j| b[p * n + j]))
    }

    /// Packs the `(k, n)` matrix whose element `(p, j)` is `element(p, j)`.
    pub(crate) fn pack(
        kernels: &'static Kernels,
        k: usize,
        n: usize,
        element: impl Fn(usize, usize) -> f32,
    ) -> Self {
        let nr = kernels.nr;
        let panels = n.div_ceil(nr);
        let mut data = vec![0.0; panels * k * nr];
        pack_b_panels(&mut data, nr, k, n, element);
        Self {
            k,
            n,
            kernels,
            data,
        }
    }

    /// The reduction length `k` (rows of `B`).
    pub fn rows(&self) -> usize {
        self.k
    }

    /// The number of columns `n`.
    pub fn cols(&self) -> usize {
        self.n
    }

    /// The instruction set this matrix was packed for.
    pub fn isa(&self) -> Isa {
        self.kernels.isa
    }

    /// The kernel table this matrix was packed for.
    pub(crate) fn kernels(&self) -> &'static Kernels {
        self.kernels
    }
}

/// Writes the `(k, n)` matrix `element(p, j)` into `dst` as `nr`-column panels, zero-padding
/// the last panel: value `(p, j)` goes to `(j / nr) * k * nr + p * nr + j % nr`.
pub(crate) fn pack_b_panels(
    dst: &mut [f32],
    nr: usize,
    k: usize,
    n: usize,
    element: impl Fn(usize, usize) -> f32,
) {
    if k == 0 {
        return; // nothing to pack (and no zero-sized chunks)
    }
    for (panel, block) in dst
        .chunks_exact_mut(k * nr)
        .take(n.div_ceil(nr))
        .enumerate()
    {
        let j0 = panel * nr;
        let width = nr.min(n - j0);
        for (p, step) in block.chunks_exact_mut(nr).enumerate() {
            for (j, value) in step.iter_mut().enumerate() {
                *value = if j < width { element(p, j0 + j) } else { 0.0 };
            }
        }
    }
}

/// Writes the `(m, k)` matrix `element(i, p)` into `dst` as `mr`-row panels, zero-padding the
/// last panel: value `(i, p)` goes to `(i / mr) * k * mr + p * mr + i % mr`.
pub(crate) fn pack_a_panels(
    dst: &mut [f32],
    mr: usize,
    m: usize,
    k: usize,
    element: impl Fn(usize, usize) -> f32,
) {
    for (panel, block) in dst
        .chunks_exact_mut(k * mr)
        .take(m.div_ceil(mr))
        .enumerate()
    {
        let i0 = panel * mr;
        let height = mr.min(m - i0);
        for (p, step) in block.chunks_exact_mut(mr).enumerate() {
            for (i, value) in step.iter_mut().enumerate() {
                *value = if i < height { element(i0 + i, p) } else { 0.0 };
            }
        }
    }
}

/// [`pack_a_panels`] for the common case, the block `a[i*lda + p]` (`i < rows`, `p < kc`) of a
/// row-major matrix: each row is read contiguously and scattered into its lane of the panel
/// steps (value `(i, p)` goes to `(i / mr) * kc * mr + p * mr + i % mr`), then the missing rows of
/// the last panel are zeroed.
fn pack_a_rows(dst: &mut [f32], mr: usize, a: &[f32], lda: usize, rows: usize, kc: usize) {
    for (panel, block) in dst
        .chunks_exact_mut(kc * mr)
        .take(rows.div_ceil(mr))
        .enumerate()
    {
        let i0 = panel * mr;
        let height = mr.min(rows - i0);
        for (lane, row) in a[i0 * lda..].chunks(lda).take(height).enumerate() {
            for (step, &value) in block.chunks_exact_mut(mr).zip(&row[..kc]) {
                step[lane] = value;
            }
        }
        if height < mr {
            for step in block.chunks_exact_mut(mr) {
                step[height..].fill(0.0);
            }
        }
    }
}

/// Per-thread scratch of the GEMM: one packed block of `A` and one edge tile.
#[derive(Default)]
pub(crate) struct GemmScratch {
    packed_a: Vec<f32>,
    edge: Vec<f32>,
}

/// Rows of `C` per work item: about four items per thread, a multiple of `mr`, at most 192.
fn row_block(kernels: &Kernels, m: usize, threads: usize) -> usize {
    let per_item = m.div_ceil(4 * threads.max(1));
    per_item.div_ceil(kernels.mr).clamp(1, 192 / kernels.mr) * kernels.mr
}

/// Grows the scratch buffers so that [`gemm_with`] allocates nothing for these sizes.
pub(crate) fn reserve_scratch(
    scratch: &mut [GemmScratch],
    kernels: &Kernels,
    m: usize,
    threads: usize,
) {
    let mc = row_block(kernels, m, threads);
    for s in scratch {
        grow(&mut s.packed_a, mc * KC);
        grow(&mut s.edge, kernels.mr * kernels.nr);
    }
}

/// Makes `buffer` hold at least `len` values (new values are zero).
pub(crate) fn grow(buffer: &mut Vec<f32>, len: usize) {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
}

/// `C = A · B` with the caller's scratch, one [`GemmScratch`] per thread.
///
/// `a` is `(m, k)` row-major with row stride `lda`, `c` is `(m, b.cols())` row-major.
pub(crate) fn gemm_with(
    a: &[f32],
    lda: usize,
    m: usize,
    b: &PackedB,
    c: &mut [f32],
    scratch: &mut [GemmScratch],
) {
    let kernels = b.kernels;
    let (k, n) = (b.k, b.n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c[..m * n].fill(0.0);
        return;
    }
    let mc = row_block(kernels, m, scratch.len());
    reserve_scratch(scratch, kernels, m, scratch.len());
    let items = c[..m * n].chunks_mut(mc * n).enumerate();
    parallel::for_each_item(items, scratch, |(block, c_block), scratch| {
        let row0 = block * mc;
        let rows = c_block.len() / n;
        multiply_block(kernels, &a[row0 * lda..], lda, rows, b, c_block, scratch);
    });
}

/// One row block: `c_block (rows, n) = a_block (rows, k) · B`.
fn multiply_block(
    kernels: &Kernels,
    a_block: &[f32],
    lda: usize,
    rows: usize,
    b: &PackedB,
    c_block: &mut [f32],
    scratch: &mut GemmScratch,
) {
    let (mr, nr) = (kernels.mr, kernels.nr);
    let (k, n) = (b.k, b.n);
    for p0 in (0..k).step_by(KC) {
        let kc = KC.min(k - p0);
        let accumulate = p0 > 0;
        let packed_a = &mut scratch.packed_a[..rows.div_ceil(mr) * mr * kc];
        pack_a_rows(packed_a, mr, &a_block[p0..], lda, rows, kc);
        for (panel, b_panel) in b.data.chunks_exact(k * nr).enumerate() {
            let b_micro = &b_panel[p0 * nr..][..kc * nr];
            let j0 = panel * nr;
            let width = nr.min(n - j0);
            for (a_micro, i0) in packed_a.chunks_exact(kc * mr).zip((0..rows).step_by(mr)) {
                let height = mr.min(rows - i0);
                let c_tile = &mut c_block[i0 * n + j0..];
                if height == mr && width == nr {
                    // SAFETY: `b.kernels` came from `Isa::kernels`, which checked CPU support;
                    // the panels hold kc·mr and kc·nr values and the tile spans (mr-1)·n + nr.
                    unsafe { (kernels.tile)(kc, a_micro, b_micro, c_tile, n, accumulate) };
                } else {
                    edge_tile(
                        kernels,
                        kc,
                        a_micro,
                        b_micro,
                        c_tile,
                        n,
                        height,
                        width,
                        accumulate,
                        &mut scratch.edge,
                    );
                }
            }
        }
    }
}

/// Runs the microtile for a partial `height × width` tile of `c` through the `mr × nr` buffer
/// `edge`: copy in (when accumulating), compute, copy the valid part out.
#[allow(clippy::too_many_arguments)]
pub(crate) fn edge_tile(
    kernels: &Kernels,
    k: usize,
    a_micro: &[f32],
    b_micro: &[f32],
    c: &mut [f32],
    ldc: usize,
    height: usize,
    width: usize,
    accumulate: bool,
    edge: &mut [f32],
) {
    let nr = kernels.nr;
    let edge = &mut edge[..kernels.mr * nr];
    if accumulate {
        for i in 0..height {
            edge[i * nr..][..width].copy_from_slice(&c[i * ldc..][..width]);
        }
    }
    // SAFETY: the kernel table was checked by `Isa::kernels`; the panels hold k·mr and k·nr
    // values and `edge` is a full mr × nr tile with row stride nr.
    unsafe { (kernels.tile)(k, a_micro, b_micro, edge, nr, accumulate) };
    for i in 0..height {
        c[i * ldc..][..width].copy_from_slice(&edge[i * nr..][..width]);
    }
}

/// `C = A · B` on `threads` threads (0 means the default, the number of CPUs).
///
/// `a` is `(m, k)` row-major with `k = b.rows()`, `c` is `(m, n)` row-major with `n = b.cols()`.
/// The result is bit-identical for every thread count.
///
/// ```
/// use mha::kernels::{gemm, Isa, PackedB};
/// let b = PackedB::from_row_major(Isa::detect(), &[1.0, 2.0, 3.0, 4.0], 2, 2)?;
/// let mut c = [0.0; 2];
/// gemm(&[1.0, 1.0], 1, &b, &mut c, 1)?;
/// assert_eq!(c, [4.0, 6.0]);
/// # Ok::<(), mha::ShapeError>(())
/// ```
///
/// # Errors
/// When `a` or `c` does not hold `m * k` or `m * n` values.
pub fn gemm(
    a: &[f32],
    m: usize,
    b: &PackedB,
    c: &mut [f32],
    threads: usize,
) -> Result<(), ShapeError> {
    let check = |what, expected: Result<usize, ShapeError>, actual: usize| {
        let expected = expected?;
        if expected == actual {
            Ok(())
        } else {
            Err(ShapeError::LengthMismatch {
                what,
                expected,
                actual,
            })
        }
    };
    check(
        "matrix A (m, k)",
        crate::tensor::element_count(&[m, b.k]),
        a.len(),
    )?;
    check(
        "matrix C (m, n)",
        crate::tensor::element_count(&[m, b.n]),
        c.len(),
    )?;
    let threads = if threads == 0 {
        parallel::default_threads()
    } else {
        threads
    };
    let mut scratch: Vec<GemmScratch> = (0..threads).map(|_| GemmScratch::default()).collect();
    gemm_with(a, b.k, m, b, c, &mut scratch);
    Ok(())
}
