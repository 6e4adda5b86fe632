//! `C = A · B` in the BLIS shape.
//!
//! Shapes: `A` is `(m, k)` row-major, `B` is `(k, n)` and packed once into [`PackedB`]
//! (`packed/`), `C` is `(m, n)` row-major. The loop nest, outermost first:
//!
//! 1. rows of `C` in blocks of whole `mr`-row panels, about `mc` rows each, spread evenly
//!    over the threads (one work item each); the item packs its rows of `A` into `mr`-row
//!    panels once, over the whole reduction (in L2);
//! 2. columns in chunks of `nc`;
//! 3. the reduction in blocks of `kc`;
//! 4. `nr`-column panels of `B` (one `kc × nr` micro-panel stays in L1; a 16-bit one is
//!    widened to `f32` there first, exactly, for all the row panels that use it);
//! 5. `mr`-row panels of `A`: one microtile call computes an `mr × nr` tile of `C` in registers.
//!
//! `kc`, `mc` and `nc` come from the CPU's cache sizes (`blocking::Blocking`).
//!
//! A few rows (decoding, `Kernels::few_rows`) go row by row with `gemv_stored` instead (which
//! widens 16-bit panels in registers, `gemv.rs`), or over blocks with `gemv_blocks` (up to 4
//! rows a call, each block widened in registers, `blocks.rs`), and on several threads their
//! columns, not their rows, are cut into work items.
//!
//! Edge tiles (fewer than `mr` rows or `nr` columns left) run the same microtile on zero-padded
//! panels into a small buffer, then copy the valid part out. Every element of `C` is the same
//! chain of multiply-adds over `p = 0..k` whatever the thread count or row blocking.

pub(crate) mod bf16;
pub(crate) mod blocking;
pub(crate) mod blocks;
pub(crate) mod gemv;
pub(crate) mod int8;
pub(crate) mod micro;
pub mod packed;
pub(crate) mod pieces;
pub(crate) mod transpose;

use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::buffer::run_time_len;
use crate::kernels::format::Compute;
use crate::kernels::gemm::bf16::{AmxPanels, AmxRows};
use crate::kernels::gemm::blocking::Blocking;
use crate::kernels::gemm::int8::{Int8Panels, QuantizedRows};
use crate::kernels::gemm::packed::PackedB;
pub(crate) use crate::kernels::gemm::pieces::{gemm_pieces, PackedPieces};
use crate::kernels::threads::parallel::{self, Pool};
use crate::kernels::Kernels;

/// Writes the block `a[i*lda + p]` (`i < rows`, `p < kc`) of a row-major matrix into `dst` as
/// `mr`-row panels: value `(i, p)` goes to `(i / mr) * kc * mr + p * mr + i % mr` (each panel
/// is the transpose of its rows); the missing rows of the last panel are zeroed. With `kc = 0`
/// the panels are empty and there is nothing to write.
fn pack_a_rows(kernels: &Kernels, dst: &mut [f32], a: &[f32], lda: usize, rows: usize, kc: usize) {
    let mr = kernels.mr;
    if kc == 0 {
        return;
    }
    for (panel, block) in dst
        .chunks_exact_mut(kc * mr)
        .take(rows.div_ceil(mr))
        .enumerate()
    {
        let i0 = panel * mr;
        let height = mr.min(rows - i0);
        // SAFETY: a checked kernel table (see `Kernels`); `a` holds `height` rows of `kc` values
        // at stride `lda` and `block` is `kc` steps of `mr`.
        unsafe { (kernels.transpose)(&a[i0 * lda..], lda, height, kc, block, mr, 1.0) };
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
    /// A 16-bit micro-panel of `B` widened to `f32` (`kc × nr`; empty for `f32` panels).
    widened_b: Vec<f32>,
    /// The block's rows of `A` in 8-bit integers (a `B` in int8 panels).
    quantized_a: QuantizedRows,
    /// The block's rows of `A` in bfloat16 for AMX (a `B` in AMX panels).
    amx_a: AmxRows,
    /// The block's rows of `A` rounded to bfloat16, as `f32` ([`Compute::Bf16`] without AMX).
    rounded_a: Vec<f32>,
}

/// How the rows of `C` are cut into work items: `items` blocks of whole `mr`-row panels, as
/// even as the panels allow (sizes differ by at most one panel), about `mc` rows each, and
/// as many items as a multiple of the thread count, so that threads taking items in turn end
/// with the same number of panels (blocks of exactly `mc` rows would leave the last thread a
/// short block while the others wait).
#[derive(Clone, Copy)]
struct RowBlocks {
    m: usize,
    mr: usize,
    items: usize,
    /// Panels of every item, and how many first items have one more.
    base: usize,
    extra: usize,
}

impl RowBlocks {
    fn new(kernels: &Kernels, mc: usize, m: usize, threads: usize) -> Self {
        let (mr, threads) = (kernels.mr, threads.max(1));
        let panels = m.div_ceil(mr);
        let items = (threads * m.div_ceil(threads * mc)).clamp(1, panels.max(1));
        RowBlocks {
            m,
            mr,
            items,
            base: panels / items,
            extra: panels % items,
        }
    }

    /// The first row and the number of rows of item `i`: the first `extra` items have one
    /// panel more than the others (larger items first, for threads that start late).
    fn rows(&self, i: usize) -> (usize, usize) {
        let first = |i: usize| ((i * self.base + i.min(self.extra)) * self.mr).min(self.m);
        (first(i), first(i + 1) - first(i))
    }

    /// The most rows any item has.
    fn max_rows(&self) -> usize {
        (self.base + usize::from(self.extra > 0)) * self.mr
    }
}

/// Makes `buffer` hold at least `len` values (new values are zero).
pub(crate) fn grow<T: Copy + Default>(buffer: &mut Vec<T>, len: usize) {
    if buffer.len() < len {
        buffer.resize(len, T::default());
    }
}

/// One column segment of a GEMM's output: its own row-major `(m, width)` buffer and an
/// optional bias row of `width` values added to every row.
pub(crate) struct Output<'a> {
    /// The segment's values, at least `m * width`.
    pub buffer: &'a mut [f32],
    /// The segment's number of columns.
    pub width: usize,
    /// Added to every row (`C = bias + A · B`, the bias first in each element's chain).
    pub bias: Option<&'a [f32]>,
}

impl<'a> Output<'a> {
    /// A segment without bias.
    pub(crate) fn new(buffer: &'a mut [f32], width: usize) -> Self {
        Output {
            buffer,
            width,
            bias: None,
        }
    }
}

/// `C = bias + A · B` with the caller's scratch, one [`GemmScratch`] per thread; the threads
/// beyond the calling one are `pool`'s workers.
///
/// `a` is `(m, k)` row-major with row stride `lda`. `C` is columns `first_col ..` of
/// `A · B` (`first_col` a multiple of the panel width `nr`), stored as `S` column segments
/// whose widths add up to the number of columns computed. One segment is a plain row-major
/// `C`; three let one GEMM against `[Wq | Wk | Wv]` write `Q`, `K` and `V` to separate buffers.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_with<const S: usize>(
    a: &[f32],
    lda: usize,
    m: usize,
    b: &PackedB,
    first_col: usize,
    outputs: [Output<'_>; S],
    scratch: &mut [GemmScratch],
    pool: &mut Pool,
) {
    let kernels = b.kernels();
    let widths = outputs.each_ref().map(|o| o.width);
    let biases = outputs.each_ref().map(|o| o.bias);
    let n: usize = widths.iter().sum();
    debug_assert!(first_col.is_multiple_of(kernels.nr) && first_col + n <= b.cols());
    if m == 0 || n == 0 {
        return;
    }
    if kernels.few_rows(m) && scratch.len() > 1 && n > kernels.nr {
        return few_rows_in_column_blocks(a, lda, m, b, first_col, outputs, scratch, pool);
    }
    let blocking = Blocking::detect(kernels);
    let blocks = RowBlocks::new(kernels, blocking.mc, m, scratch.len());
    let widened_len = b.widened_len(&blocking);
    // The int8 and AMX paths keep their rows in their own layouts.
    let packed_len = if b.int8().is_some() || b.amx().is_some() {
        0
    } else {
        blocks.max_rows() * b.rows()
    };
    for s in scratch.iter_mut() {
        grow(&mut s.packed_a, packed_len);
        grow(&mut s.edge, kernels.mr * kernels.nr);
        grow(&mut s.widened_b, widened_len);
    }
    // Work item `i`: its rows of every segment, cut off the front of what is left.
    let mut rest = outputs.map(|o| (&mut o.buffer[..m * o.width], o.width));
    let items = (0..blocks.items).map(move |i| {
        let (row0, rows) = blocks.rows(i);
        let parts = rest.each_mut().map(|(buffer, width)| {
            let (part, tail) = core::mem::take(buffer).split_at_mut(rows * *width);
            *buffer = tail;
            part
        });
        (row0, rows, parts)
    });
    parallel::for_each_item(
        pool,
        items,
        scratch,
        |(row0, rows, mut c_block), scratch| {
            let mut out = Segments {
                parts: c_block.each_mut().map(|c| &mut **c),
                widths,
            };
            let seeded = out.seed(rows, biases);
            let block = RowBlock {
                a: &a[row0 * lda..],
                lda,
                rows,
                first_panel: first_col / kernels.nr,
                cols: n,
                seeded,
                blocking,
            };
            multiply_block(block, b, &mut out, scratch);
        },
    );
}

/// [`gemm_with`] for a few rows (a decoding step) on several threads. A few rows are one
/// row block, so the work items are blocks of whole `nr`-column panels instead, as even as the
/// panels allow, one per thread. An item's columns of a few rows are not contiguous in `C`, so
/// each item writes them to its own part of a staging buffer (the first thread's packing
/// buffer, which this path does not use), copied into `C` afterwards. Every element is the
/// same `gemv` chain as on one thread.
#[allow(clippy::too_many_arguments)]
fn few_rows_in_column_blocks<const S: usize>(
    a: &[f32],
    lda: usize,
    m: usize,
    b: &PackedB,
    first_col: usize,
    outputs: [Output<'_>; S],
    scratch: &mut [GemmScratch],
    pool: &mut Pool,
) {
    let kernels = b.kernels();
    let nr = kernels.nr;
    let blocking = Blocking::detect(kernels);
    let widths = outputs.each_ref().map(|o| o.width);
    let n: usize = widths.iter().sum();
    let panels = n.div_ceil(nr);
    let items = scratch.len().min(panels);
    let bound = |i: usize| (i * panels / items * nr).min(n);
    // Item `i` covers columns `bound(i) .. bound(i+1)`; of segment `s` (columns
    // `start[s] .. start[s] + widths[s]`) that is the range `overlap(i, s)` of its own columns.
    let mut start = [0; S];
    for s in 1..S {
        start[s] = start[s - 1] + widths[s - 1];
    }
    let overlap = |i: usize, s: usize| {
        let lo = bound(i).clamp(start[s], start[s] + widths[s]) - start[s];
        let hi = bound(i + 1).clamp(start[s], start[s] + widths[s]) - start[s];
        lo..hi
    };
    let mut staging = core::mem::take(&mut scratch[0].packed_a);
    grow(&mut staging, m * n);
    for s in scratch.iter_mut() {
        grow(&mut s.edge, kernels.mr * nr);
        grow(&mut s.widened_b, b.widened_len(&blocking));
    }
    // Staging layout: item by item, segment by segment, `m` rows of the overlap's width.
    let mut rest = &mut staging[..m * n];
    let biases = outputs.each_ref().map(|o| o.bias);
    let items_iter = (0..items).map(|i| {
        let mut parts_widths = [0; S];
        let parts = core::array::from_fn(|s| {
            let width = overlap(i, s).len();
            let (part, tail) = core::mem::take(&mut rest).split_at_mut(m * width);
            rest = tail;
            parts_widths[s] = width;
            part
        });
        let item_biases = core::array::from_fn(|s| biases[s].map(|bias| &bias[overlap(i, s)]));
        (bound(i), bound(i + 1), parts, parts_widths, item_biases)
    });
    parallel::for_each_item(
        pool,
        items_iter,
        scratch,
        |(c0, c1, parts, widths, biases), scratch| {
            let mut out = Segments { parts, widths };
            let seeded = out.seed(m, biases);
            let block = RowBlock {
                a,
                lda,
                rows: m,
                first_panel: (first_col + c0) / nr,
                cols: c1 - c0,
                seeded,
                blocking,
            };
            multiply_block(block, b, &mut out, scratch);
        },
    );
    // Into C, in the same order.
    let mut staged = &staging[..m * n];
    let mut outputs = outputs;
    for i in 0..items {
        for (s, output) in outputs.iter_mut().enumerate() {
            let columns = overlap(i, s);
            let (part, tail) = staged.split_at(m * columns.len());
            staged = tail;
            if columns.is_empty() {
                continue;
            }
            let rows = output.buffer.chunks_exact_mut(output.width).take(m);
            for (row, staged_row) in rows.zip(part.chunks_exact(columns.len())) {
                row[columns.clone()].copy_from_slice(staged_row);
            }
        }
    }
    scratch[0].packed_a = staging;
}

/// The column segments of one row block of `C` (see [`gemm_with`]).
struct Segments<'a, const S: usize> {
    parts: [&'a mut [f32]; S],
    widths: [usize; S],
}

impl<const S: usize> Segments<'_, S> {
    /// When any segment has a bias, fills the block's rows with the biases (zeros where a
    /// segment has none) and returns true: the GEMM then accumulates onto them. With no bias,
    /// or `k = 0`, the rows become the bias or zero either way.
    fn seed(&mut self, rows: usize, biases: [Option<&[f32]>; S]) -> bool {
        if biases.iter().all(Option::is_none) {
            return false;
        }
        for ((part, &w), bias) in self.parts.iter_mut().zip(&self.widths).zip(biases) {
            for row in part.chunks_exact_mut(w.max(1)).take(rows) {
                match bias {
                    Some(bias) => row.copy_from_slice(&bias[..w]),
                    None => row.fill(0.0),
                }
            }
        }
        true
    }

    /// Where the segment holding column `j0` ends (the total width when none does).
    fn segment_end(&self, j0: usize) -> usize {
        let mut end = 0;
        for &w in &self.widths {
            end += w;
            if j0 < end {
                break;
            }
        }
        end
    }

    /// The segment holding columns `j0 .. j0 + width`, with the column offset inside it, if
    /// they all lie in one segment.
    fn locate(&mut self, j0: usize, width: usize) -> Option<(&mut [f32], usize, usize)> {
        let mut start = 0;
        for (part, &w) in self.parts.iter_mut().zip(&self.widths) {
            if j0 < start + w {
                return (j0 + width <= start + w).then_some((&mut **part, j0 - start, w));
            }
            start += w;
        }
        None
    }

    /// Copies the `rect` of `C` between `C` and the `nr`-wide `tile` whose top-left corner
    /// it is: into the tile when `to_tile`, else out of it.
    fn copy(&mut self, tile: &mut [f32], nr: usize, rect: Rect, to_tile: bool) {
        let mut start = 0;
        for (part, &w) in self.parts.iter_mut().zip(&self.widths) {
            let (lo, hi) = (rect.j0.max(start), (rect.j0 + rect.width).min(start + w));
            if lo < hi {
                for i in 0..rect.height {
                    let c_row = &mut part[(rect.i0 + i) * w + lo - start..][..hi - lo];
                    let t_row = &mut tile[i * nr + lo - rect.j0..][..hi - lo];
                    if to_tile {
                        t_row.copy_from_slice(c_row);
                    } else {
                        c_row.copy_from_slice(t_row);
                    }
                }
            }
            start += w;
        }
    }
}

/// Rows `i0 .. i0 + height` and columns `j0 .. j0 + width` of `C`.
#[derive(Clone, Copy)]
struct Rect {
    i0: usize,
    height: usize,
    j0: usize,
    width: usize,
}

/// One row block of a GEMM: rows of `A` and which columns of `B` to use.
struct RowBlock<'a> {
    /// The block's rows of `A`, row stride `lda`.
    a: &'a [f32],
    lda: usize,
    rows: usize,
    /// The first `nr`-column panel of `B` to use.
    first_panel: usize,
    /// How many columns of `B` to use from there.
    cols: usize,
    /// Whether `C` already holds the biases to accumulate onto (see [`Segments::seed`]).
    seeded: bool,
    /// The loops' blocks.
    blocking: Blocking,
}

/// `C (rows, cols) (+)= A (rows, k) · B[:, panels]` for one row block.
fn multiply_block<const S: usize>(
    block: RowBlock<'_>,
    b: &PackedB,
    out: &mut Segments<'_, S>,
    scratch: &mut GemmScratch,
) {
    if b.rows() == 0 && !block.seeded {
        for (part, &w) in out.parts.iter_mut().zip(&out.widths) {
            part[..block.rows * w].fill(0.0);
        }
    }
    if let Some(panels) = b.int8() {
        multiply_int8(block, b, panels, out, scratch);
    } else if let Some(panels) = b.amx() {
        multiply_amx(block, b, panels, out, scratch);
    } else if b.compute() == Compute::Bf16 {
        let mut rounded = core::mem::take(&mut scratch.rounded_a);
        bf16::round_rows(&mut rounded, (block.a, block.lda), block.rows, b.rows());
        let block = RowBlock {
            a: &rounded,
            lda: b.rows(),
            ..block
        };
        multiply_f32(block, b, out, scratch);
        scratch.rounded_a = rounded;
    } else {
        multiply_f32(block, b, out, scratch);
    }
}

/// [`multiply_block`] on `f32` products: by rows for a few, else by microtiles.
fn multiply_f32<const S: usize>(
    block: RowBlock<'_>,
    b: &PackedB,
    out: &mut Segments<'_, S>,
    scratch: &mut GemmScratch,
) {
    if b.kernels().few_rows(block.rows) {
        multiply_rows(block, b, out, &mut scratch.edge);
    } else {
        multiply_tiles(block, b, out, scratch);
    }
}

/// [`multiply_block`] for a few rows (decoding): straight from the rows of A instead of mostly
/// empty tiles, the same arithmetic, so the same bits. Each run of whole panels inside one
/// segment (at most `nc` columns, whose micro-panels stay in L2 for the next rows) is one
/// [`row_product`], written in place; a panel that straddles two segments is one through
/// `edge`. Over blocks the reduction is one pass (nothing widened is kept to reuse).
fn multiply_rows<const S: usize>(
    block: RowBlock<'_>,
    b: &PackedB,
    out: &mut Segments<'_, S>,
    edge: &mut [f32],
) {
    let (k, nr) = (b.rows(), b.kernels().nr);
    let (rows, n) = (block.rows, block.cols);
    let block_kc = match b.blocks() {
        Some(_) => k.max(1),
        None => block.blocking.steps(k),
    };
    for p0 in (0..k).step_by(block_kc) {
        let steps = (p0, block_kc.min(k - p0));
        let accumulate = p0 > 0 || block.seeded;
        let mut j0 = 0;
        while j0 < n {
            let segment_end = out.segment_end(j0);
            let run = if segment_end >= n {
                n - j0
            } else {
                (segment_end - j0) / nr * nr
            }
            .min(block.blocking.nc);
            if run > 0 {
                let (part, offset, ldc) = out
                    .locate(j0, run)
                    .expect("a run of panels lies in one segment");
                let c = (&mut part[offset..], ldc);
                row_product(&block, b, steps, (j0, run), c, accumulate);
                j0 += run;
                continue;
            }
            let width = nr.min(n - j0);
            let rect = Rect {
                i0: 0,
                height: rows,
                j0,
                width,
            };
            // A panel straddling two segments: through `edge` (rows < mr).
            write_tile(out, rect, (rows, nr), edge, accumulate, |c, ldc| {
                row_product(&block, b, steps, (j0, width), (c, ldc), accumulate)
            });
            j0 += width;
        }
    }
}

/// Columns `j0 .. j0 + width` of the block's rows of `C` (row `i` at `c[i · ldc ..]`) `(+)=`
/// its rows of `A` times `B`'s steps `p0 .. p0 + kc`: one `gemv_stored` per row over packed
/// panels, one `gemv_blocks` per [`blocks::BLOCK_ROWS`] rows over blocks (whole steps).
fn row_product(
    block: &RowBlock<'_>,
    b: &PackedB,
    (p0, kc): (usize, usize),
    (j0, width): (usize, usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    let (kernels, nr, lda) = (b.kernels(), b.kernels().nr, block.lda);
    let first = block.first_panel * nr + j0;
    let Some(src) = b.blocks() else {
        let panels = b.panels_from(first / nr, p0);
        for i in 0..block.rows {
            let a_row = &block.a[i * lda + p0..][..kc];
            let c_row = &mut c[i * ldc..][..width];
            // SAFETY: checked kernel table; `a_row` holds kc values and the panels from
            // column `first` hold steps p0 .. p0 + kc of its `width` columns, k·nr apart.
            unsafe { (kernels.gemv_stored)(kc, a_row, kc, panels, c_row, 0, width, 1, accumulate) };
        }
        return;
    };
    for i0 in (0..block.rows).step_by(blocks::BLOCK_ROWS) {
        let rows = blocks::BLOCK_ROWS.min(block.rows - i0);
        let (a, c) = (&block.a[i0 * lda..], &mut c[i0 * ldc..]);
        // SAFETY: checked kernel table; `a` holds `rows` rows of k values `lda` apart, `c`
        // `rows` rows of `width` values `ldc` apart, and the matrix columns first .. first +
        // width.
        unsafe { (kernels.gemv_blocks)(src, first, width, a, lda, c, ldc, rows, accumulate) };
    }
}

/// [`multiply_block`] by microtiles.
fn multiply_tiles<const S: usize>(
    block: RowBlock<'_>,
    b: &PackedB,
    out: &mut Segments<'_, S>,
    scratch: &mut GemmScratch,
) {
    let (kernels, k) = (b.kernels(), b.rows());
    let (mr, nr) = (kernels.mr, kernels.nr);
    let (rows, n) = (block.rows, block.cols);
    // The block's rows of A, packed once over the whole reduction: the kc-slice of a panel is
    // contiguous, so the column chunks below reuse it.
    let packed_a = &mut scratch.packed_a[..rows.div_ceil(mr) * mr * k];
    pack_a_rows(kernels, packed_a, block.a, block.lda, rows, k);
    // Columns in chunks of nc, so that the chunk of C stays in L2 across the kc passes.
    let (block_kc, nc) = (b.steps(&block.blocking), block.blocking.nc);
    for jc in (0..n).step_by(nc) {
        let chunk = nc.min(n - jc);
        for p0 in (0..k).step_by(block_kc) {
            let kc = block_kc.min(k - p0);
            let accumulate = p0 > 0 || block.seeded;
            for panel in 0..chunk.div_ceil(nr) {
                let panel_index = block.first_panel + jc / nr + panel;
                let b_micro = b.widened_micro_panel(panel_index, p0, kc, &mut scratch.widened_b);
                let j0 = jc + panel * nr;
                let width = nr.min(n - j0);
                for (a_panel, i0) in packed_a.chunks_exact(k * mr).zip((0..rows).step_by(mr)) {
                    let a_micro = &a_panel[p0 * mr..][..kc * mr];
                    let rect = Rect {
                        i0,
                        height: mr.min(rows - i0),
                        j0,
                        width,
                    };
                    write_tile(
                        out,
                        rect,
                        (mr, nr),
                        &mut scratch.edge,
                        accumulate,
                        |c, ldc| {
                            // SAFETY: `b.kernels()` came from `Isa::kernels`, which checked CPU
                            // support; the panels hold kc·mr and kc·nr values and the tile spans
                            // (mr-1)·ldc + nr.
                            unsafe {
                                (kernels.tile)(kc, a_micro, mr, b_micro, nr, c, ldc, accumulate)
                            }
                        },
                    );
                }
            }
        }
    }
}

/// Runs `kernel(c, ldc)` on the `shape.0 × shape.1` tile of `C` whose top-left corner is
/// `rect`'s: in place when `rect` is the whole tile inside one segment, else on `edge` (a
/// full tile, row stride `shape.1`), `rect` copied in first when `accumulate`, then out.
fn write_tile<const S: usize>(
    out: &mut Segments<'_, S>,
    rect: Rect,
    (mr, nr): (usize, usize),
    edge: &mut [f32],
    accumulate: bool,
    kernel: impl FnOnce(&mut [f32], usize),
) {
    let direct = if rect.height == mr && rect.width == nr {
        out.locate(rect.j0, rect.width)
    } else {
        None
    };
    if let Some((part, offset, ldc)) = direct {
        return kernel(&mut part[rect.i0 * ldc + offset..], ldc);
    }
    let edge = &mut edge[..mr * nr];
    if accumulate {
        out.copy(edge, nr, rect, true);
    }
    kernel(edge, nr);
    out.copy(edge, nr, rect, false);
}

/// [`multiply_block`] over int8 panels: the block's rows quantized once, then one int8 tile
/// per `int8_mr` rows and `nr` columns over the whole reduction (every block of 32 steps
/// in order, from the bias or zero).
fn multiply_int8<const S: usize>(
    block: RowBlock<'_>,
    b: &PackedB,
    panels: &Int8Panels,
    out: &mut Segments<'_, S>,
    scratch: &mut GemmScratch,
) {
    let kernels = b.kernels();
    let (mr, nr) = (kernels.int8_mr, kernels.nr);
    let (rows, n) = (block.rows, block.cols);
    let quantized = &mut scratch.quantized_a;
    quantized.quantize(kernels, (block.a, block.lda), rows, b.rows());
    grow(&mut scratch.edge, mr * nr);
    for panel in 0..n.div_ceil(nr) {
        let b_panel = panels.panel(block.first_panel + panel);
        let j0 = panel * nr;
        for i0 in (0..rows).step_by(mr) {
            let a_panel = quantized.panel(i0 / mr);
            let rect = Rect {
                i0,
                height: mr.min(rows - i0),
                j0,
                width: nr.min(n - j0),
            };
            let accumulate = block.seeded;
            write_tile(
                out,
                rect,
                (mr, nr),
                &mut scratch.edge,
                accumulate,
                |c, ldc| {
                    // SAFETY: a checked kernel table; the panels hold the same blocks, and the
                    // tile spans (int8_mr-1)·ldc + nr values.
                    unsafe { (kernels.int8_tile)(a_panel, b_panel, c, ldc, accumulate) }
                },
            );
        }
    }
}

/// [`multiply_block`] over AMX panels: the block's rows rounded to bfloat16 once; per panel of
/// 32 columns, the block's column of `C` computed in `edge` (from the bias or zero), each
/// [`AMX_STEPS`] steps of the reduction in order one pass of AMX tiles down its rows (a tile of
/// `C` kept in memory between passes is exact: the sums are those of one pass), then copied
/// into `C` with its NaNs made `f32::NAN`.
fn multiply_amx<const S: usize>(
    block: RowBlock<'_>,
    b: &PackedB,
    panels: &AmxPanels,
    out: &mut Segments<'_, S>,
    scratch: &mut GemmScratch,
) {
    let kernels = b.kernels();
    let tile_fn = kernels
        .bf16_tile
        .expect("AMX panels are made for a table with AMX");
    let (rows, n, tile, steps) = (block.rows, block.cols, bf16::TILE, panels.steps());
    debug_assert_eq!(kernels.nr, tile);
    let padded = bf16::padded_rows(rows);
    let rounded = &mut scratch.amx_a;
    rounded.round((block.a, block.lda), rows, b.rows());
    grow(&mut scratch.edge, padded * tile);
    let column = &mut scratch.edge[..padded * tile];
    for panel in 0..n.div_ceil(tile) {
        let b_panel = panels.panel(block.first_panel + panel);
        let j0 = panel * tile;
        let rect = Rect {
            i0: 0,
            height: rows,
            j0,
            width: tile.min(n - j0),
        };
        if block.seeded {
            out.copy(column, tile, rect, true);
        }
        for s0 in (0..steps.max(1)).step_by(AMX_STEPS) {
            let kc = AMX_STEPS.min(steps - s0);
            let accumulate = s0 > 0 || block.seeded;
            let a = (&rounded.rows()[s0 * bf16::STEP..], rounded.lda());
            let b_steps = &b_panel[s0 * bf16::B_STEP..];
            // SAFETY: a table with `bf16_tile` is handed out only where AMX is usable; the
            // rounded rows hold `padded_rows(rows)` rows of `steps · 32` values (from step
            // `s0`: the rest of each row), the panel `steps` steps, `column` those rows of 32.
            unsafe { tile_fn(a, rows, (b_steps, 1, 0), kc, (column, tile), accumulate) };
        }
        canonical_nans(column);
        out.copy(column, tile, rect, false);
    }
}

/// Steps of 32 values per pass of [`multiply_amx`]: a panel's steps (16 KiB) stay in L1 for
/// every tile of rows.
const AMX_STEPS: usize = 8;

/// Every NaN of `c` made `f32::NAN`.
fn canonical_nans(c: &mut [f32]) {
    for x in c {
        // A select, not a branch: this loop vectorises.
        *x = if x.is_nan() { f32::NAN } else { *x };
    }
}

/// `C = A · B` on `threads` threads (0 means the default, the number of CPUs; at most 256).
///
/// `a` is `(m, k)` row-major with `k = b.rows()`, `c` is `(m, n)` row-major with `n = b.cols()`.
/// The result is bit-identical for every thread count. Each call allocates the scratch it packs
/// `A` into (about `min(m, 192) · k` values per thread); [`Mha`](crate::Mha) keeps its own and
/// allocates nothing per forward.
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
/// `k = 0` gives `C = 0`; `m = 0` or `n = 0` leaves nothing to compute.
///
/// # Errors
/// [`ShapeError::LengthMismatch`] when `a` or `c` does not hold `m * k` or `m * n` values;
/// [`ShapeError::Overflow`] when `m * k` or `m * n` values would not fit in memory.
pub fn gemm(
    a: &[f32],
    m: usize,
    b: &PackedB,
    c: &mut [f32],
    threads: usize,
) -> Result<(), ShapeError> {
    let check = |what, dims: &[usize], actual: usize| {
        let expected = run_time_len::<f32>(what, dims)?;
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
    check("matrix A (m, k)", &[m, b.rows()], a.len())?;
    check("matrix C (m, n)", &[m, b.cols()], c.len())?;
    let threads = crate::kernels::threads::plan::thread_count(threads);
    let mut scratch: Vec<GemmScratch> = (0..threads).map(|_| GemmScratch::default()).collect();
    // This call's own workers, joined when it returns.
    let mut pool = Pool::default();
    gemm_with(
        a,
        b.rows(),
        m,
        b,
        0,
        [Output::new(c, b.cols())],
        &mut scratch,
        &mut pool,
    );
    Ok(())
}
