//! `C = A · B` in the BLIS shape.
//!
//! Shapes: `A` is `(m, k)` row-major, `B` is `(k, n)` and packed once into [`PackedB`], `C` is
//! `(m, n)` row-major. The loop nest, outermost first:
//!
//! 1. rows of `C` in blocks of whole `mr`-row panels, about `mc` rows each, spread evenly
//!    over the threads (one work item each); the item packs its rows of `A` into `mr`-row
//!    panels once, over the whole reduction (in L2);
//! 2. columns in chunks of `nc`;
//! 3. the reduction in blocks of `kc`;
//! 4. `nr`-column panels of `B` (one `kc × nr` micro-panel stays in L1);
//! 5. `mr`-row panels of `A`: one microtile call computes an `mr × nr` tile of `C` in registers.
//!
//! `kc`, `mc` and `nc` come from the CPU's cache sizes (`blocking::Blocking`).
//!
//! A few rows (decoding, `Kernels::few_rows`) go row by row with `gemv_panels` instead, and on
//! several threads their columns, not their rows, are cut into work items.
//!
//! Edge tiles (fewer than `mr` rows or `nr` columns left) run the same microtile on zero-padded
//! panels into a small buffer, then copy the valid part out. Every element of `C` is the same
//! chain of multiply-adds over `p = 0..k` whatever the thread count or row blocking.

use alloc::vec::Vec;
use core::mem::MaybeUninit;

use super::blocking::Blocking;
use super::buffer::run_time_len;
use super::parallel::{self, Pool};
use super::{Isa, Kernels};
use crate::error::ShapeError;

/// A `(k, n)` matrix packed for the microkernels of one instruction set: panels of `nr`
/// columns (the last zero-padded), each panel stored step by step (`nr` values per `p`).
#[derive(Clone)]
pub struct PackedB {
    k: usize,
    n: usize,
    kernels: &'static Kernels,
    data: Vec<f32>,
}

/// The shape and instruction set, not the values.
impl core::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PackedB")
            .field("k", &self.k)
            .field("n", &self.n)
            .field("isa", &self.kernels.isa)
            .finish_non_exhaustive()
    }
}

impl PackedB {
    /// Packs the row-major `(k, n)` matrix `b` for the instruction set `isa`. Either size may
    /// be 0 (then [`gemm`] gives `C = 0` or has nothing to compute).
    ///
    /// ```
    /// use mha::kernels::{Isa, PackedB};
    /// let empty = PackedB::from_row_major(Isa::detect(), &[], usize::MAX, 0)?;
    /// assert_eq!((empty.rows(), empty.cols()), (usize::MAX, 0));
    /// assert!(PackedB::from_row_major(Isa::detect(), &[], usize::MAX, 2).is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] naming the sizes when the matrix or its packed form (`n`
    /// rounded up to whole panels) would not fit in memory, [`ShapeError::LengthMismatch`]
    /// when `b.len() != k * n`, [`ShapeError::UnsupportedIsa`] when `isa` is not supported on
    /// this CPU, [`ShapeError::AllocationFailed`] when the packed form cannot be allocated.
    pub fn from_row_major(isa: Isa, b: &[f32], k: usize, n: usize) -> Result<Self, ShapeError> {
        let expected = run_time_len::<f32>("matrix B (k, n)", &[k, n])?;
        if b.len() != expected {
            return Err(ShapeError::LengthMismatch {
                what: "matrix B (k, n)",
                expected,
                actual: b.len(),
            });
        }
        let kernels = isa.kernels()?;
        const PACKED: &str = "packed matrix B (k, panels, panel width)";
        let len = run_time_len::<f32>(PACKED, &[k, n.div_ceil(kernels.nr), kernels.nr])?;
        let mut data = Vec::new();
        data.try_reserve_exact(len)
            .map_err(|_| ShapeError::AllocationFailed {
                what: PACKED,
                bytes: len.saturating_mul(core::mem::size_of::<f32>()),
            })?;
        let b = Columns {
            values: b,
            width: n,
        };
        Ok(Self::fill(kernels, k, &[b], data))
    }

    /// Packs the `(k, n)` matrix made of the row-major `blocks` side by side (`n` is the sum of
    /// their widths; each holds `k` rows).
    pub(crate) fn pack(kernels: &'static Kernels, k: usize, blocks: &[Columns<'_>]) -> Self {
        let n: usize = blocks.iter().map(|b| b.width).sum();
        let data = Vec::with_capacity(n.div_ceil(kernels.nr) * k * kernels.nr);
        Self::fill(kernels, k, blocks, data)
    }

    /// Packs `blocks` (as in [`PackedB::pack`]) into the empty `data`, whose capacity holds the
    /// packed form: every value is written once, padding included, and nothing is zeroed first.
    fn fill(
        kernels: &'static Kernels,
        k: usize,
        blocks: &[Columns<'_>],
        mut data: Vec<f32>,
    ) -> Self {
        let nr = kernels.nr;
        let n: usize = blocks.iter().map(|b| b.width).sum();
        debug_assert!(blocks.iter().all(|b| b.values.len() == k * b.width));
        // An empty matrix has no panels; `k * nr` is then not needed (nor known to fit).
        let len = if k == 0 || n == 0 {
            0
        } else {
            n.div_ceil(nr) * k * nr
        };
        let dst = &mut data.spare_capacity_mut()[..len];
        pack_b_panels(dst, nr, k, blocks, Store::for_len(len));
        // SAFETY: `pack_b_panels` initialised all of `dst`, the first `len` values after the
        // (empty) initialised part.
        unsafe { data.set_len(len) };
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

    /// The bytes of the packed panels (whole panels of `nr` columns).
    pub(crate) fn bytes(&self) -> usize {
        size_of_val(&self.data[..])
    }

    /// The packed values from step `p0` of panel `first` on: panel `first + q` at `q·k·nr`.
    fn panels_from(&self, first: usize, p0: usize) -> &[f32] {
        &self.data[first * self.k * self.kernels.nr + p0 * self.kernels.nr..]
    }

    /// Steps `p0 .. p0 + kc` of panels `first .. first + count`: one contiguous `kc × nr`
    /// micro-panel per panel.
    fn micro_panels(
        &self,
        first: usize,
        count: usize,
        p0: usize,
        kc: usize,
    ) -> impl Iterator<Item = &[f32]> {
        let nr = self.kernels.nr;
        self.data
            .chunks_exact(self.k * nr)
            .skip(first)
            .take(count)
            .map(move |panel| &panel[p0 * nr..][..kc * nr])
    }
}

/// A row-major `(k, width)` block of the columns of a matrix `B` whose blocks lie side by
/// side (`[Wq | Wk | Wv]`): row `p` is `values[p * width ..][..width]`.
#[derive(Clone, Copy)]
pub(crate) struct Columns<'a> {
    /// The block's `k * width` values.
    pub values: &'a [f32],
    /// The block's number of columns.
    pub width: usize,
}

/// Rows of `B` per packing pass.
const PACK_ROWS: usize = 16;

/// Packs of at least this many values bypass the caches where the CPU can (streaming stores
/// on x86-64): they would not stay cached, and a store that bypasses the caches does not read
/// the line it replaces first.
const STREAM_FROM: usize = 1 << 18;

/// Writes the `(k, n)` matrix `blocks` (side by side, `n` the sum of their widths) into all
/// of `dst`, `n.div_ceil(nr) * k * nr` values (none when `k` or `n` is 0), as `nr`-column
/// panels, zero-padding the last panel: value `(p, j)` goes to
/// `(j / nr) * k * nr + p * nr + j % nr`.
///
/// `PACK_ROWS` rows at a time: each pass reads a few whole rows, contiguous in each block, and
/// writes a contiguous run of steps into every panel, where a panel at a time would read `nr`
/// values from each of `k` rows, a page apart.
fn pack_b_panels(
    dst: &mut [MaybeUninit<f32>],
    nr: usize,
    k: usize,
    blocks: &[Columns<'_>],
    store: Store,
) {
    // No panels: nothing to write, and `k * nr` is not needed (nor known to fit).
    if dst.is_empty() {
        return;
    }
    for p0 in (0..k).step_by(PACK_ROWS) {
        let rows = PACK_ROWS.min(k - p0);
        for (panel, values) in dst.chunks_exact_mut(k * nr).enumerate() {
            let steps = &mut values[p0 * nr..][..rows * nr];
            pack_steps(steps, nr, blocks, panel * nr, p0, store);
        }
    }
    store.fence();
}

/// Writes rows `p0 ..` of columns `j0 .. j0 + nr` of the matrix `blocks` (side by side) into
/// `steps` (`nr` values per row), the columns past the last zero.
fn pack_steps(
    steps: &mut [MaybeUninit<f32>],
    nr: usize,
    blocks: &[Columns<'_>],
    j0: usize,
    p0: usize,
    store: Store,
) {
    let mut start = 0;
    let mut filled = 0;
    for block in blocks {
        // The block's columns `lo .. hi` are the panel's `filled ..`.
        let lo = j0.clamp(start, start + block.width) - start;
        let hi = (j0 + nr).clamp(start, start + block.width) - start;
        if lo < hi {
            let rows = block.values[p0 * block.width..].chunks_exact(block.width);
            for (step, row) in steps.chunks_exact_mut(nr).zip(rows) {
                store.write(&mut step[filled..][..hi - lo], &row[lo..hi]);
            }
            filled += hi - lo;
        }
        start += block.width;
    }
    if filled < nr {
        for step in steps.chunks_exact_mut(nr) {
            for value in &mut step[filled..] {
                value.write(0.0);
            }
        }
    }
}

/// How packing writes its values: through the caches, or around them.
#[derive(Clone, Copy, Debug)]
enum Store {
    Cached,
    /// Streaming stores (x86-64 only): memory written this way is read only after
    /// [`Store::fence`].
    Streamed,
}

impl Store {
    /// Streamed for a pack of `len` values, at least [`STREAM_FROM`], where the CPU has
    /// streaming stores.
    fn for_len(len: usize) -> Store {
        if cfg!(target_arch = "x86_64") && len >= STREAM_FROM {
            Store::Streamed
        } else {
            Store::Cached
        }
    }

    /// Initialises `dst` with a copy of `src` (of the same length).
    fn write(self, dst: &mut [MaybeUninit<f32>], src: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Store::Streamed = self {
            return stream(dst, src);
        }
        for (d, &s) in dst.iter_mut().zip(src) {
            d.write(s);
        }
    }

    /// Makes this thread's streaming stores visible, in order, before anything it does next
    /// (reading the packed matrix, or handing it to other threads).
    fn fence(self) {
        #[cfg(target_arch = "x86_64")]
        if let Store::Streamed = self {
            // SAFETY: SSE is part of every x86-64 CPU.
            unsafe { core::arch::x86_64::_mm_sfence() };
        }
    }
}

/// [`Store::write`] with streaming stores, 4 values at a time, when `dst` is 16-byte aligned
/// (whole steps of a buffer the allocator aligned to 16 bytes, as the system allocators do,
/// are: every `nr` is a multiple of 4); otherwise, and for the last `len % 4` values, through
/// the caches.
#[cfg(target_arch = "x86_64")]
fn stream(dst: &mut [MaybeUninit<f32>], src: &[f32]) {
    use core::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
    let len = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..len], &src[..len]);
    let split = if dst.as_ptr().addr().is_multiple_of(16) {
        dst.len() - dst.len() % 4
    } else {
        0
    };
    let (vectors, rest) = dst.split_at_mut(split);
    for (d, s) in vectors.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
        // SAFETY: SSE is part of every x86-64 CPU; `d` is 4 writable values at a 16-byte
        // aligned address (`dst` is, and `d` starts a multiple of 4 values into it), `s` 4
        // readable values.
        unsafe { _mm_stream_ps(d.as_mut_ptr().cast(), _mm_loadu_ps(s.as_ptr())) };
    }
    for (d, &s) in rest.iter_mut().zip(&src[split..]) {
        d.write(s);
    }
}

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
pub(crate) fn grow(buffer: &mut Vec<f32>, len: usize) {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
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
    let kernels = b.kernels;
    let widths = outputs.each_ref().map(|o| o.width);
    let biases = outputs.each_ref().map(|o| o.bias);
    let n: usize = widths.iter().sum();
    debug_assert!(first_col.is_multiple_of(kernels.nr) && first_col + n <= b.n);
    if m == 0 || n == 0 {
        return;
    }
    if kernels.few_rows(m) && scratch.len() > 1 && n > kernels.nr {
        return few_rows_in_column_blocks(a, lda, m, b, first_col, outputs, scratch, pool);
    }
    let blocking = Blocking::detect(kernels);
    let blocks = RowBlocks::new(kernels, blocking.mc, m, scratch.len());
    for s in scratch.iter_mut() {
        grow(&mut s.packed_a, blocks.max_rows() * b.k);
        grow(&mut s.edge, kernels.mr * kernels.nr);
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
    let kernels = b.kernels;
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
    if b.k == 0 && !block.seeded {
        for (part, &w) in out.parts.iter_mut().zip(&out.widths) {
            part[..block.rows * w].fill(0.0);
        }
    }
    if b.kernels.few_rows(block.rows) {
        multiply_rows(block, b, out, &mut scratch.edge);
    } else {
        multiply_tiles(block, b, out, scratch);
    }
}

/// [`multiply_block`] for a few rows (decoding): straight from the rows of A instead of mostly
/// empty tiles, the same arithmetic, so the same bits. Each run of whole panels inside one
/// segment (at most `nc` columns, whose micro-panels stay in L2 for the next rows) takes one
/// `gemv_panels` per row, written in place; a panel that straddles two segments takes one
/// `gemv` per row through `edge`.
fn multiply_rows<const S: usize>(
    block: RowBlock<'_>,
    b: &PackedB,
    out: &mut Segments<'_, S>,
    edge: &mut [f32],
) {
    let (kernels, k, nr) = (b.kernels, b.k, b.kernels.nr);
    let (rows, n) = (block.rows, block.cols);
    let (block_kc, nc) = (block.blocking.steps(k), block.blocking.nc);
    for p0 in (0..k).step_by(block_kc) {
        let kc = block_kc.min(k - p0);
        let accumulate = p0 > 0 || block.seeded;
        let mut j0 = 0;
        while j0 < n {
            let a_row = |i: usize| &block.a[i * block.lda + p0..][..kc];
            let panels = b.panels_from(block.first_panel + j0 / nr, p0);
            let segment_end = out.segment_end(j0);
            let run = if segment_end >= n {
                n - j0
            } else {
                (segment_end - j0) / nr * nr
            }
            .min(nc);
            if run > 0 {
                for i in 0..rows {
                    let (part, offset, ldc) = out
                        .locate(j0, run)
                        .expect("a run of panels lies in one segment");
                    let c = &mut part[i * ldc + offset..][..run];
                    // SAFETY: checked kernel table; `a_row` holds kc values and the panels
                    // from `j0` hold steps p0 .. p0 + kc of the run's columns, k·nr apart.
                    unsafe { (kernels.gemv_panels)(kc, a_row(i), panels, k * nr, c, accumulate) };
                }
                j0 += run;
                continue;
            }
            let width = nr.min(n - j0);
            for i in 0..rows {
                let rect = Rect {
                    i0: i,
                    height: 1,
                    j0,
                    width,
                };
                if accumulate {
                    out.copy(edge, nr, rect, true);
                }
                // SAFETY: checked kernel table; `a_row` holds kc values and the panel
                // (kc-1)·nr + width from step p0.
                unsafe { (kernels.gemv)(kc, a_row(i), panels, nr, &mut edge[..width], accumulate) };
                out.copy(edge, nr, rect, false);
            }
            j0 += width;
        }
    }
}

/// [`multiply_block`] by microtiles.
fn multiply_tiles<const S: usize>(
    block: RowBlock<'_>,
    b: &PackedB,
    out: &mut Segments<'_, S>,
    scratch: &mut GemmScratch,
) {
    let (kernels, k) = (b.kernels, b.k);
    let (mr, nr) = (kernels.mr, kernels.nr);
    let (rows, n) = (block.rows, block.cols);
    // The block's rows of A, packed once over the whole reduction: the kc-slice of a panel is
    // contiguous, so the column chunks below reuse it.
    let packed_a = &mut scratch.packed_a[..rows.div_ceil(mr) * mr * k];
    pack_a_rows(kernels, packed_a, block.a, block.lda, rows, k);
    // Columns in chunks of nc, so that the chunk of C stays in L2 across the kc passes.
    let (block_kc, nc) = (block.blocking.steps(k), block.blocking.nc);
    for jc in (0..n).step_by(nc) {
        let chunk = nc.min(n - jc);
        for p0 in (0..k).step_by(block_kc) {
            let kc = block_kc.min(k - p0);
            let accumulate = p0 > 0 || block.seeded;
            let panels = b.micro_panels(block.first_panel + jc / nr, chunk.div_ceil(nr), p0, kc);
            for (panel, b_micro) in panels.enumerate() {
                let j0 = jc + panel * nr;
                let width = nr.min(n - j0);
                for (a_panel, i0) in packed_a.chunks_exact(k * mr).zip((0..rows).step_by(mr)) {
                    let a_micro = &a_panel[p0 * mr..][..kc * mr];
                    let height = mr.min(rows - i0);
                    let direct = if height == mr && width == nr {
                        out.locate(j0, width)
                    } else {
                        None
                    };
                    if let Some((part, offset, ldc)) = direct {
                        let c_tile = &mut part[i0 * ldc + offset..];
                        // SAFETY: `b.kernels` came from `Isa::kernels`, which checked CPU
                        // support; the panels hold kc·mr and kc·nr values and the tile spans
                        // (mr-1)·ldc + nr.
                        unsafe {
                            (kernels.tile)(kc, a_micro, mr, b_micro, nr, c_tile, ldc, accumulate)
                        };
                    } else {
                        let edge = &mut scratch.edge[..mr * nr];
                        let rect = Rect {
                            i0,
                            height,
                            j0,
                            width,
                        };
                        if accumulate {
                            out.copy(edge, nr, rect, true);
                        }
                        // SAFETY: as above; `edge` is a full mr × nr tile with row stride nr.
                        unsafe {
                            (kernels.tile)(kc, a_micro, mr, b_micro, nr, edge, nr, accumulate)
                        };
                        out.copy(edge, nr, rect, false);
                    }
                }
            }
        }
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
    check("matrix A (m, k)", &[m, b.k], a.len())?;
    check("matrix C (m, n)", &[m, b.n], c.len())?;
    let threads = super::plan::thread_count(threads);
    let mut scratch: Vec<GemmScratch> = (0..threads).map(|_| GemmScratch::default()).collect();
    // This call's own workers, joined when it returns.
    let mut pool = Pool::default();
    gemm_with(
        a,
        b.k,
        m,
        b,
        0,
        [Output::new(c, b.n)],
        &mut scratch,
        &mut pool,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use alloc::vec;

    use super::*;

    /// The packed form by its definition, element by element: value `(p, j)` of the `(k, n)`
    /// matrix `element` at `(j / nr) * k * nr + p * nr + j % nr`, zeros elsewhere.
    fn packed_by_definition(
        nr: usize,
        k: usize,
        n: usize,
        element: impl Fn(usize, usize) -> f32,
    ) -> Vec<u32> {
        let mut packed = vec![0.0f32; n.div_ceil(nr) * k * nr];
        for p in 0..k {
            for j in 0..n {
                packed[(j / nr) * k * nr + p * nr + j % nr] = element(p, j);
            }
        }
        packed.iter().map(|v| v.to_bits()).collect()
    }

    /// Distinct values for every block, row and column (exactly representable).
    fn block_values(block: usize, k: usize, width: usize) -> Vec<f32> {
        (0..k * width)
            .map(|i| (block * 1_000_000 + i) as f32 + 0.5)
            .collect()
    }

    /// `pack_b_panels` into a buffer `misalign` values past a 16-byte boundary, as bits.
    fn pack_bits(
        nr: usize,
        k: usize,
        blocks: &[Columns<'_>],
        store: Store,
        misalign: usize,
    ) -> Vec<u32> {
        let n: usize = blocks.iter().map(|b| b.width).sum();
        let len = if k == 0 || n == 0 {
            0
        } else {
            n.div_ceil(nr) * k * nr
        };
        let mut buffer: Vec<MaybeUninit<f32>> = Vec::with_capacity(len + 4 + misalign);
        buffer.resize(len + 4 + misalign, MaybeUninit::uninit());
        let aligned = (16 - buffer.as_ptr().addr() % 16) % 16 / 4;
        let dst = &mut buffer[aligned + misalign..][..len];
        pack_b_panels(dst, nr, k, blocks, store);
        // SAFETY: `pack_b_panels` initialised all of `dst`.
        dst.iter()
            .map(|v| unsafe { v.assume_init() }.to_bits())
            .collect()
    }

    /// Packs blocks of `widths` side by side with `k` rows, for the panel widths of every
    /// instruction set (supported here or not) with each kind of store, and through
    /// [`PackedB`] for every supported one, and compares with the definition.
    fn check(k: usize, widths: &[usize]) {
        let values: Vec<Vec<f32>> = (0..widths.len())
            .map(|b| block_values(b, k, widths[b]))
            .collect();
        let blocks: Vec<Columns<'_>> = values
            .iter()
            .zip(widths)
            .map(|(values, &width)| Columns { values, width })
            .collect();
        let n: usize = widths.iter().sum();
        // Column `j` of the whole matrix is column `j - start` of the block it falls in.
        let element = |p: usize, j: usize| {
            let mut start = 0;
            for (values, &width) in values.iter().zip(widths) {
                if j < start + width {
                    return values[p * width + j - start];
                }
                start += width;
            }
            unreachable!("column {j} of {n}")
        };
        for nr in [8, 16, 32] {
            let want = packed_by_definition(nr, k, n, element);
            for (store, misalign) in [
                (Store::Cached, 0),
                (Store::Streamed, 0),
                (Store::Streamed, 1),
            ] {
                let bits = pack_bits(nr, k, &blocks, store, misalign);
                assert!(
                    bits == want,
                    "nr {nr} k {k} widths {widths:?} {store:?} +{misalign}"
                );
            }
        }
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            let packed = PackedB::pack(kernels, k, &blocks);
            let bits: Vec<u32> = packed.data.iter().map(|v| v.to_bits()).collect();
            assert_eq!((packed.k, packed.n), (k, n));
            let want = packed_by_definition(kernels.nr, k, n, element);
            assert!(bits == want, "{isa:?} k {k} widths {widths:?}");
            if let [b] = blocks[..] {
                let from_row_major = PackedB::from_row_major(isa, b.values, k, b.width).unwrap();
                assert_eq!(from_row_major.data, packed.data, "{isa:?} k {k} n {n}");
            }
        }
    }

    #[test]
    fn packing_equals_the_definition_on_odd_shapes() {
        let widths: [&[usize]; 14] = [
            &[0],
            &[1],
            &[7],
            &[16],
            &[17],
            &[33],
            &[600],
            &[0, 0, 0],
            &[5, 3, 9],
            &[8, 16, 32],
            &[17, 0, 30],
            &[40, 24, 24],
            &[33, 33, 33],
            &[509, 7, 517],
        ];
        for k in [0, 1, 3, PACK_ROWS, PACK_ROWS + 1, 2 * PACK_ROWS + 5] {
            for widths in widths {
                check(k, widths);
            }
        }
    }
}
