//! Attention in the FlashAttention-2 shape, on slices with run-time dimensions.
//!
//! Work item: one batch element `b` and one block of up to [`BLOCK_Q`] query rows, all heads
//! (so each item owns a contiguous block of output rows). Per head, the item transposes its
//! queries once (`Qᵀ`, `d × rows`, with the layer's scale, `1/√d` by default, folded in),
//! then walks key blocks of [`BLOCK_K`] keys from the first one any of its rows can see up to
//! the last one (blocks past the causal diagonal, and before a sliding window's start, are
//! never touched):
//!
//! 0. the block's keys are one contiguous `d × BLOCK_K` panel of the pre-transposed `Kᵀ` and
//!    its values contiguous rows (both laid out by the store, found through its [`KvView`]:
//!    a contiguous store's slots or a paged store's block table);
//! 1. scores, key-major: `Sᵀ (keys × rows) = K · Qᵀ` by the GEMM microtile; tiles no row can
//!    see are skipped; then the layer's soft cap (`Kernels::softcap`) and ALiBi term, when it
//!    has them (see `terms`);
//! 2. masked scores become `-inf` (only in blocks that cross the diagonal);
//! 3. online softmax down the key axis (`Kernels::softmax_block`): running max and sum per
//!    query (starting from the head's sink, if any), the accumulator rescaled by
//!    `exp(m_old - m_new)`;
//! 4. `acc (rows × d) += P · V`: `P` is read straight from `Sᵀ`, `V` from its rows; keys
//!    every row of an `mr`-row panel sees go through the microtile; past them (near the
//!    diagonal) each row continues its chain with `gemv` over each run of keys it sees,
//!    skipping masked keys entirely, so a NaN or infinity in a later token never meets an
//!    earlier row (`0·NaN` would be NaN).
//!
//! A block of only a few query rows (decoding) goes row by row instead (`gemv`, `softmax_row`),
//! with the same arithmetic and so the same bits, the query heads that share a key/value head
//! (up to 4 at once) together, so that each stored key and value is read, and widened, once
//! for all of them. Decoding one token on several threads cuts the heads into such groups (or
//! even parts of them) as work items.
//!
//! From a store in a 16- or 8-bit format (`KvFormat`), the tile path widens each key block's
//! panel and value rows into the thread's scratch (`Kernels::widen`) and computes on them as
//! on `f32` ones; the row path reads them as stored, widened in registers by
//! `Kernels::gemv_stored`, which gives the same values and so the same bits. Finally `out = acc / l` (zeros for a row
//! that sees no key).
//!
//! A store whose values are its keys' last `dv` columns (`ValueLayout::InKeys`, MLA's latent
//! cache) has no value rows: both paths transpose each key block's value rows out of its
//! (`f32` or widened) key panel into the thread's scratch, the values stored value rows would
//! give, and compute on them as on `f32` value rows. The row path's parts then take up to
//! [`BLOCK_Q`] query heads (in `gemv` calls of 4), so that one transpose serves them all; it
//! scores a block for all of them (from the key panel as stored, widened in registers), then
//! transposes [`VALUE_SLICE`] value columns at a time and runs every head's `P·V` on those
//! columns while they are in L1, each accumulator element the same chain over the keys. The
//! output heads are `dv` wide. Scratch is
//! `O(BLOCK_Q · (BLOCK_K + d))` per thread; there is no `T × T` buffer. Each row's arithmetic
//! depends only on the key-block boundaries, never on the query blocking or the thread count.

use alloc::vec::Vec;
use core::iter::StepBy;
use core::ops::Range;

use crate::kernels::attention::mask::{Rule, Visibility};
use crate::kernels::attention::terms::{HeadTerms, ScoreTerms};
use crate::kernels::format::{KvFormat, Stored};
use crate::kernels::gemm::gemv::STORED_ROWS;
use crate::kernels::gemm::grow;
use crate::kernels::math::trig::sqrt;
use crate::kernels::store::layout::{value_stride, ValueLayout};
use crate::kernels::store::layout::{HeadLayout, BLOCK_K};
use crate::kernels::store::view::KvView;
use crate::kernels::threads::parallel::{self, Pool};
use crate::kernels::Kernels;

mod amx;

use amx::{Amx, AmxWork, RowSet};

/// The bytes of one batch element's keys and values from which on the attention prefetches
/// each next key block: a smaller store stays in L2 across the item's heads, where the
/// requests would only add work; a larger one comes from L3 or memory, whose latency the
/// request for the next block hides behind the current block's arithmetic.
const PREFETCH_FROM_BYTES: usize = 1 << 20;

/// Query rows per work item (at most; see [`query_block_rows`]).
pub(crate) const BLOCK_Q: usize = 96;
/// Value columns the row path transposes out of a key panel at a time when the values are in
/// the keys (`BLOCK_K × VALUE_SLICE` floats, 24 KiB: in L1 while every head reads them).
const VALUE_SLICE: usize = 64;
/// The fewest work items per thread a call on several threads is cut into, while its query
/// blocks can shrink (see [`query_block_rows`]).
const MIN_ITEMS_PER_THREAD: usize = 2;
/// The dimensions of one attention call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttentionShape {
    /// Batch elements `B`.
    pub batch: usize,
    /// Query heads `H`.
    pub n_heads: usize,
    /// Key/value heads; a divisor of `H`. Query head `h` reads key/value head
    /// `h / (H / n_kv_heads)` (grouped-query attention; `n_kv_heads == H` is plain MHA).
    pub n_kv_heads: usize,
    /// Query rows per batch element `T`.
    pub q_len: usize,
    /// Keys per batch element `S`.
    pub kv_len: usize,
    /// Width of one head `d`.
    pub head_dim: usize,
}

/// One thread's scratch for [`attention`].
#[derive(Default)]
pub(crate) struct FlashScratch {
    /// What the steps compute in.
    work: Work,
    /// The current key block widened to `f32`, from a store in a 16- or 8-bit format.
    widened: Widened,
    /// The AMX path's operands and accumulator.
    amx: AmxWork,
}

/// A key block's panel and value rows widened to `f32` (see [`KvStore::key_panel`]).
#[derive(Default)]
struct Widened {
    /// `d × BLOCK_K`.
    keys: Vec<f32>,
    /// `BLOCK_K × acc_stride`.
    values: Vec<f32>,
}

/// The scratch of the steps.
#[derive(Default)]
struct Work {
    /// `d × q_stride`: the item's queries of one head, transposed and scaled.
    q_t: Vec<f32>,
    /// `BLOCK_K × q_stride` (plus overhang): scores, then probabilities, key-major.
    scores_t: Vec<f32>,
    /// `rows × acc_stride` output accumulator.
    acc: Vec<f32>,
    /// Running max, running sum and the last rescale factor per query.
    row_max: Vec<f32>,
    row_sum: Vec<f32>,
    rescale: Vec<f32>,
    /// One query's probabilities for a run of keys, gathered contiguous for `gemv`.
    run: Vec<f32>,
}

/// Query rows per work item: [`BLOCK_Q`], or a half or a third of it when a call on several
/// threads would otherwise have fewer than [`MIN_ITEMS_PER_THREAD`] items per thread (with
/// a few uneven items, threads sit idle at the phase's end while one finishes its last item;
/// smaller items even the threads out). The blocks stay aligned with the key blocks, and a
/// row's arithmetic does not depend on its block, so the bits do not either.
fn query_block_rows(batch: usize, q_len: usize, threads: usize) -> usize {
    let enough = |rows: usize| batch * q_len.div_ceil(rows) >= MIN_ITEMS_PER_THREAD * threads;
    [BLOCK_Q, BLOCK_Q / 2, BLOCK_Q / 3]
        .into_iter()
        .find(|&rows| threads == 1 || enough(rows))
        .unwrap_or(BLOCK_Q / 3)
}

/// Rounds `n` up to a multiple of `m`.
fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

/// The strides of one item's scratch for head width `d`.
#[derive(Clone, Copy)]
struct Strides {
    /// Distance between keys in `q_t` and `scores_t` (queries are the fast axis).
    q: usize,
    /// Distance between query rows in `acc`: the value rows' stride, so an accumulator row
    /// and a value row take the same microtile panels.
    acc: usize,
}

impl Strides {
    /// The strides for values `dv` wide.
    fn new(kernels: &Kernels, dv: usize) -> Self {
        Strides {
            q: round_up(BLOCK_Q, kernels.nr),
            acc: value_stride(kernels, dv),
        }
    }
}

/// Grows every thread's scratch for the keys and values of `store`, so [`attention`]
/// allocates nothing.
fn reserve_scratch(scratch: &mut [FlashScratch], kernels: &Kernels, store: &KvView<'_>) {
    let mr = kernels.mr;
    let (d, dv, formats) = (store.head_dim, store.value_dim(), store.formats);
    let strides = Strides::new(kernels, dv);
    let q_rows = round_up(BLOCK_Q, mr);
    for FlashScratch {
        work: s, widened, ..
    } in scratch
    {
        if formats.keys != KvFormat::F32 {
            grow(&mut widened.keys, d * BLOCK_K);
        }
        // Value rows are read in place only as f32 rows of whole panels (see
        // `KvView::value_rows`); values in the keys are transposed out of the key panel.
        if formats.values != KvFormat::F32 || strides.acc != dv || !store.values.is_rows() {
            grow(&mut widened.values, BLOCK_K * strides.acc);
        }
        grow(&mut s.q_t, d * strides.q);
        // Tiles of mr keys overhang the block; P panels of mr queries overhang a key row.
        grow(&mut s.scores_t, round_up(BLOCK_K, mr) * strides.q + q_rows);
        grow(&mut s.acc, q_rows * strides.acc);
        grow(&mut s.row_max, BLOCK_Q);
        grow(&mut s.row_sum, BLOCK_Q);
        grow(&mut s.rescale, BLOCK_Q);
        grow(&mut s.run, BLOCK_K);
    }
}

/// The operands of one attention call.
#[derive(Clone, Copy)]
pub(crate) struct Operands<'a> {
    /// Queries, `(B, H, T, d)` as laid out by `q_layout`.
    pub q: &'a [f32],
    /// Layout of `q`.
    pub q_layout: HeadLayout,
    /// A ragged call's rows: batch element `b`'s queries (and output rows) are rows
    /// `q_starts[b] .. q_starts[b + 1]` (`B + 1` ascending); `None`: `T` rows each, element
    /// `b`'s from `b · q_layout.batch`.
    pub q_starts: Option<&'a [usize]>,
    /// The factor of the scores `q · k` (`1/√d` unless the layer sets another), folded into
    /// the queries.
    pub scale: f32,
    /// Keys and values; the attention reads each batch element's first `S_b` tokens through
    /// the view's block map.
    pub store: KvView<'a>,
    /// The layer's soft cap, ALiBi slopes and sinks.
    pub terms: &'a ScoreTerms,
    /// Products in bfloat16 on AMX (`amx.rs`), where the table has [`Kernels::bf16_tile`];
    /// else, and when false, in `f32`.
    pub bf16: bool,
}

/// `out = softmax(scale · Q Kᵀ, masked) V` for every batch element and head.
///
/// `out` is the merged layout `(B, T, H · dv)` (a ragged call's `(Σ T_b, H · dv)`), row-major, `dv` the store's value width
/// ([`KvView::value_dim`]: the value rows' `dv`, `d` unless the layer's value heads differ, or
/// fewer than `d` when the values are the keys' last columns).
/// `scratch` holds one entry per thread; the threads beyond the calling one are `pool`'s
/// workers.
pub(crate) fn attention(
    kernels: &Kernels,
    shape: AttentionShape,
    ops: Operands<'_>,
    visibility: Visibility<'_>,
    out: &mut [f32],
    scratch: &mut [FlashScratch],
    pool: &mut Pool,
) {
    let dv = ops.store.value_dim();
    let width = shape.n_heads * dv;
    if shape.batch == 0 || shape.q_len == 0 || width == 0 {
        return;
    }
    // The key panels are BLOCK_K wide; score tiles of mr keys must not run past a panel.
    assert!(
        BLOCK_K.is_multiple_of(kernels.mr),
        "BLOCK_K must be a multiple of mr"
    );
    reserve_scratch(scratch, kernels, &ops.store);
    let row_bytes = shape.head_dim + ops.store.values.stored_dim();
    let kv_bytes = size_of::<f32>() * shape.kv_len * shape.n_kv_heads * row_bytes;
    let prefetch = kv_bytes >= PREFETCH_FROM_BYTES;
    let q_len = shape.q_len;
    let strides = Strides::new(kernels, dv);
    // The store pads value rows for the same microtiles: its rows are accumulator rows.
    let mut call = Call {
        kernels,
        shape,
        ops: &ops,
        visibility,
        prefetch,
        strides,
        dv,
        amx: None,
    };
    let mut shared = core::mem::take(&mut scratch[0].amx.shared);
    if let Some(tile) = kernels.bf16_tile.filter(|_| ops.bf16) {
        let blocks = (!kernels.few_rows(q_len)).then(|| shared.pack(&call, scratch, pool));
        call.amx = Some(Amx { tile, blocks });
    }
    let rows = &mut out[..ops.rows(shape) * width];
    if q_len == 1 && scratch.len() > 1 {
        decode_parts(&call, rows, scratch, pool);
    } else {
        forward_blocks(&call, rows, scratch, pool);
    }
    scratch[0].amx.shared = shared;
}

/// [`attention`] by items of query blocks: per batch element, blocks aligned with the key
/// blocks (so without a causal offset the diagonal crosses one key block per query block),
/// handed out last block first: the last rows see the most keys, so the most expensive items
/// go first. An item is the block's rows in every head.
fn forward_blocks(
    call: &Call<'_>,
    rows: &mut [f32],
    scratch: &mut [FlashScratch],
    pool: &mut Pool,
) {
    let shape = call.shape;
    let (q_len, width) = (shape.q_len, shape.n_heads * call.dv);
    let block_rows = query_block_rows(shape.batch, q_len, scratch.len());
    let items = element_rows(call.ops.q_starts, shape, width, rows).flat_map(move |(b, rows)| {
        let blocks = rows.chunks_mut(block_rows * width).enumerate().rev();
        blocks.map(move |(i, out)| (b, i * block_rows, 0..shape.n_heads, out))
    });
    call.run(items, false, scratch, pool);
}

/// [`attention`] decoding one token on several threads: each item is a few heads of one row
/// of `rows` (the query heads of one key/value head, or a part of them), so that the items
/// share out the keys and values to stream.
fn decode_parts(call: &Call<'_>, rows: &mut [f32], scratch: &mut [FlashScratch], pool: &mut Pool) {
    let (shape, dv) = (call.shape, call.dv);
    let width = shape.n_heads * dv;
    let (group, most) = (
        shape.n_heads / shape.n_kv_heads,
        part_heads(&call.ops.store),
    );
    let groups = shape.batch * shape.n_kv_heads;
    let parts = parts_per_group(group, groups, scratch.len(), most);
    // One row per element (a ragged call's elements may have none).
    let rows =
        element_rows(call.ops.q_starts, shape, width, rows).filter(|(_, row)| !row.is_empty());
    let items = rows.flat_map(move |(b, row)| {
        let parts = head_parts(0..shape.n_heads, group, parts, most);
        parts.scan(row, move |rest, heads| {
            let (mine, tail) = core::mem::take(rest).split_at_mut(heads.len() * dv);
            *rest = tail;
            Some((b, 0, heads, mine))
        })
    });
    call.run(items, true, scratch, pool);
}

impl Operands<'_> {
    /// Query rows over the batch of a call of `shape`.
    fn rows(&self, shape: AttentionShape) -> usize {
        self.q_starts
            .map_or(shape.batch * shape.q_len, |starts| starts[shape.batch])
    }

    /// Where batch element `b`'s queries start in `q`.
    pub(crate) fn q_start(&self, b: usize) -> usize {
        let layout = self.q_layout;
        self.q_starts
            .map_or(b * layout.batch, |starts| starts[b] * layout.row)
    }
}

/// Each batch element's output rows of `rows` (`width` values each), in order: `T` rows, or
/// a ragged call's own.
fn element_rows<'o>(
    starts: Option<&'o [usize]>,
    shape: AttentionShape,
    width: usize,
    rows: &'o mut [f32],
) -> impl Iterator<Item = (usize, &'o mut [f32])> + Send + 'o {
    (0..shape.batch).scan(rows, move |rest, b| {
        let len = starts.map_or(shape.q_len, |s| s[b + 1] - s[b]);
        let (mine, tail) = core::mem::take(rest).split_at_mut(len * width);
        *rest = tail;
        Some((b, mine))
    })
}

/// What every work item of one [`attention`] call shares.
struct Call<'a> {
    kernels: &'a Kernels,
    shape: AttentionShape,
    ops: &'a Operands<'a>,
    visibility: Visibility<'a>,
    prefetch: bool,
    strides: Strides,
    /// The width of one value head (of one head's output).
    dv: usize,
    /// The tile and the packed key blocks, when the call computes in bfloat16 on AMX.
    amx: Option<Amx<'a>>,
}

impl Call<'_> {
    /// Runs the work items `(b, q0, heads, out)`: query rows from `q0` of batch element `b`
    /// in `heads`, into `out`, whose rows hold those heads only (`heads_only`) or all heads.
    fn run<'o>(
        &self,
        items: impl Iterator<Item = (usize, usize, Range<usize>, &'o mut [f32])> + Send,
        heads_only: bool,
        scratch: &mut [FlashScratch],
        pool: &mut Pool,
    ) {
        let (dv, width) = (self.dv, self.shape.n_heads * self.dv);
        parallel::for_each_item(pool, items, scratch, |(b, q0, heads, out), scratch| {
            // Head h's row i goes to out[i * stride + (h - first) · dv ..][..dv].
            let (stride, first) = match heads_only {
                true => (heads.len() * dv, heads.start),
                false => (width, 0),
            };
            let block = QueryBlock {
                kernels: self.kernels,
                shape: self.shape,
                ops: self.ops,
                rule: self.visibility.for_item(b, q0, self.shape.kv_len),
                b,
                q0,
                rows: out.len() / stride,
                prefetch: self.prefetch,
                out_stride: stride,
                strides: self.strides,
                dv,
                amx: self.amx,
            };
            block.attend(heads, first, out, scratch);
        });
    }
}

/// The most query heads of one key/value head a part of the row path takes: [`STORED_ROWS`]
/// (one `gemv_stored` call, each stored key and value widened once per part); over values in
/// the keys, whose value rows a part transposes out of every key panel it reads, as many as
/// the scratch holds ([`BLOCK_Q`]), so that every head the part can take shares the
/// transpose (its `gemv` calls still take [`STORED_ROWS`] heads at a time).
fn part_heads(store: &KvView<'_>) -> usize {
    match store.values {
        ValueLayout::Rows { .. } => STORED_ROWS,
        ValueLayout::InKeys { .. } => BLOCK_Q,
    }
}

/// Into how many parts a decoding step on `threads` threads cuts the `group` query heads of
/// each of its `groups` key/value heads: as few as hold at most `most` heads each (each
/// stored element is read once per part: [`part_heads`]), and more while there would be fewer
/// than [`MIN_ITEMS_PER_THREAD`] items per thread.
fn parts_per_group(group: usize, groups: usize, threads: usize, most: usize) -> usize {
    (group.div_ceil(most)..=group)
        .find(|&parts| groups * parts >= MIN_ITEMS_PER_THREAD * threads)
        .unwrap_or(group)
}

/// `heads` cut at the boundaries of the key/value groups of `group` query heads, each
/// group's share into `parts` parts, or as many more as hold at most `most` heads each (never
/// more parts than heads), as even as the heads allow, in order.
fn head_parts(
    heads: Range<usize>,
    group: usize,
    parts: usize,
    most: usize,
) -> impl Iterator<Item = Range<usize>> {
    let kv_heads = heads.start / group..heads.end.div_ceil(group);
    kv_heads.flat_map(move |kv| {
        let lo = heads.start.max(kv * group);
        let hi = heads.end.min((kv + 1) * group);
        let parts = parts.max((hi - lo).div_ceil(most)).min(hi - lo);
        (0..parts).map(move |q| lo + (hi - lo) * q / parts..lo + (hi - lo) * (q + 1) / parts)
    })
}

/// One work item: query rows `q0 .. q0 + rows` of batch element `b`, computed head by head.
struct QueryBlock<'a> {
    kernels: &'a Kernels,
    shape: AttentionShape,
    ops: &'a Operands<'a>,
    /// The visibility rule with rows counted from `q0`.
    rule: Rule<'a>,
    b: usize,
    q0: usize,
    rows: usize,
    /// Whether to prefetch each next key block (see [`PREFETCH_FROM_BYTES`]).
    prefetch: bool,
    /// Distance between the item's output rows.
    out_stride: usize,
    strides: Strides,
    /// The width of one value head (of one head's output).
    dv: usize,
    /// The tile and the packed key blocks, when the call computes in bfloat16 on AMX.
    amx: Option<Amx<'a>>,
}

/// What one head of a [`QueryBlock`] reads and where it writes.
struct HeadOperands<'a> {
    /// The block's first query row; rows `q_row` apart, `d` values each.
    queries: &'a [f32],
    q_row: usize,
    /// The head's key/value head, `h / (H / Hkv)`.
    kv_head: usize,
    /// Where the head's `dv` columns start in an output row.
    out_col: usize,
}

/// One block of keys `k0 .. k0 + len` of a head: its `Kᵀ` panel (`d × BLOCK_K`) and its
/// value rows, both contiguous.
struct KeyBlock<'a> {
    k0: usize,
    len: usize,
    k_panel: &'a [f32],
    values: &'a [f32],
}

/// The keys a row's chain runs over: block keys `k0 .. k0 + len` and their value rows, as
/// stored or widened.
#[derive(Clone, Copy)]
struct ChainKeys<'a> {
    k0: usize,
    len: usize,
    values: Stored<'a>,
}

/// A key block of the row path: its `Kᵀ` panel and value rows as the store holds them (the
/// row path's `gemv` widens 16- and 8-bit ones in registers); when the values are in the keys,
/// the chain's values are empty and `value_panel` is the key panel as `f32`.
struct RowBlock<'a> {
    chain: ChainKeys<'a>,
    k_panel: Stored<'a>,
    value_panel: Option<&'a [f32]>,
}

impl QueryBlock<'_> {
    /// Computes the query heads `heads` and writes head `h`'s row `i` to `out[i · out_stride +
    /// (h - first) · dv ..][..dv]`: a few rows (decoding) head group by head group, the heads
    /// of one key/value head together (at most [`part_heads`] at once), more by tiles head by
    /// head.
    fn attend(&self, heads: Range<usize>, first: usize, out: &mut [f32], s: &mut FlashScratch) {
        if let Some(amx) = self.amx {
            return self.attend_bf16(heads, (first, out), amx, s);
        }
        if self.kernels.few_rows(self.rows) {
            let group = self.shape.n_heads / self.shape.n_kv_heads;
            for part in head_parts(heads, group, 1, part_heads(&self.ops.store)) {
                self.attend_rows(part, first, out, s);
            }
        } else {
            for h in heads {
                let head = self.head_operands(h, (h - first) * self.dv);
                self.attend_tiles(&head, self.ops.terms.head(h), out, s);
            }
        }
    }

    /// [`QueryBlock::attend`] on AMX: more than a few rows head by head over the call's
    /// packed blocks; a few (decoding) one query row at a time, the heads of one key/value
    /// head together (at most [`BLOCK_Q`]), by rows (see `amx/rows.rs`).
    fn attend_bf16(
        &self,
        heads: Range<usize>,
        (first, out): (usize, &mut [f32]),
        amx: Amx<'_>,
        s: &mut FlashScratch,
    ) {
        if let (false, Some(blocks)) = (self.kernels.few_rows(self.rows), amx.blocks) {
            for h in heads {
                let set = RowSet {
                    heads: h..h + 1,
                    queries: 0..self.rows,
                };
                self.attend_amx(set, (first, &mut *out), (amx.tile, blocks), s);
            }
            return;
        }
        let group = self.shape.n_heads / self.shape.n_kv_heads;
        for part in head_parts(heads, group, 1, BLOCK_Q) {
            for i in 0..self.rows {
                let set = RowSet {
                    heads: part.clone(),
                    queries: i..i + 1,
                };
                self.attend_amx_rows(set, (first, &mut *out), amx.tile, s);
            }
        }
    }

    fn head_operands(&self, h: usize, out_col: usize) -> HeadOperands<'_> {
        let (shape, ops) = (self.shape, self.ops);
        let kv_head = h / (shape.n_heads / shape.n_kv_heads);
        let q = ops.q_layout;
        HeadOperands {
            queries: &ops.q[ops.q_start(self.b) + h * q.head + self.q0 * q.row..],
            q_row: q.row,
            kv_head,
            out_col,
        }
    }

    /// The first keys of the key blocks the item's queries `rows` see (from the block of the
    /// first query's first key to the last query's last key), and that last key's end.
    fn key_blocks(&self, rows: Range<usize>) -> (StepBy<Range<usize>>, usize) {
        let key_end = self.rule.key_end(rows.end);
        let start = self.rule.key_start(rows.start) / BLOCK_K * BLOCK_K;
        ((start..key_end).step_by(BLOCK_K), key_end)
    }

    /// The head by microtiles, for a full block of query rows: the steps of the module docs.
    fn attend_tiles(
        &self,
        head: &HeadOperands<'_>,
        terms: HeadTerms,
        out: &mut [f32],
        FlashScratch {
            work: s, widened, ..
        }: &mut FlashScratch,
    ) {
        self.load_queries(head, terms, s);
        let (blocks, key_end) = self.key_blocks(0..self.rows);
        for k0 in blocks {
            let keys = self.key_block(head, (k0, key_end), widened);
            let next = self.next_block(head, k0 + BLOCK_K, key_end);
            self.score_block(&keys, next.0, s);
            if terms.changes_scores() {
                self.score_terms(&keys, terms, s);
            }
            self.mask_block(&keys, s);
            self.softmax_step(&keys, s);
            self.accumulate_block(&keys, next.1, s);
        }
        let strides = self.strides;
        for (i, acc_row) in s.acc.chunks_exact(strides.acc).take(self.rows).enumerate() {
            self.write_row(out, head.out_col, i, acc_row, s.row_sum[i]);
        }
    }

    /// Step 0: `q_t[p * stride + i] = q(i, p) · scale` for the block's queries, zeros for the
    /// padding queries up to the last `nr`-wide panel the score tiles read; accumulator reset,
    /// running max and running sum set to the head's start (its sink, if any).
    fn load_queries(&self, head: &HeadOperands<'_>, terms: HeadTerms, s: &mut Work) {
        let (kernels, rows, d) = (self.kernels, self.rows, self.shape.head_dim);
        let strides = self.strides;
        let q_t = &mut s.q_t[..d * strides.q];
        // SAFETY: checked kernel table; `queries` holds `rows` rows of `d` at stride `q_row`,
        // `q_t` is `d` rows of `strides.q ≥ rows`.
        unsafe {
            (kernels.transpose)(
                head.queries,
                head.q_row,
                rows,
                d,
                q_t,
                strides.q,
                self.ops.scale,
            )
        };
        let read = round_up(rows, kernels.nr);
        for column in q_t.chunks_exact_mut(strides.q) {
            column[rows..read].fill(0.0);
        }
        s.acc[..round_up(rows, kernels.mr) * strides.acc].fill(0.0);
        let (max, sum) = terms.start();
        s.row_max[..rows].fill(max);
        s.row_sum[..rows].fill(sum);
    }

    /// Step 1: `Sᵀ = K · Qᵀ`, skipping tiles whose keys no query of the tile can see; a slice
    /// of the next key panel is prefetched per tile row.
    fn score_block(&self, keys: &KeyBlock<'_>, next_keys: &[f32], s: &mut Work) {
        let kernels = self.kernels;
        let (mr, nr, d) = (kernels.mr, kernels.nr, self.shape.head_dim);
        let strides = self.strides;
        let key_tiles = keys.len.div_ceil(mr);
        for i0 in (0..keys.len).step_by(mr) {
            // SAFETY: a checked kernel table; a prefetch reads nothing.
            unsafe { (kernels.prefetch)(share(next_keys, i0 / mr, key_tiles)) };
            let first_query = self.rule.first_query(keys.k0 + i0);
            for j0 in (0..self.rows)
                .step_by(nr)
                .filter(|&j0| j0 + nr > first_query)
            {
                let tile = &mut s.scores_t[i0 * strides.q + j0..];
                // SAFETY: a checked kernel table. A reads (d-1)·BLOCK_K + i0+mr ≤ d·BLOCK_K
                // values of the key panel (mr divides BLOCK_K; keys past the block are stale
                // and only reach score rows past the block, which nothing reads), B reads
                // (d-1)·q + j0+nr ≤ d·q, and the tile ends inside the scores buffer, sized for
                // BLOCK_K key rows.
                unsafe {
                    (kernels.tile)(
                        d,
                        &keys.k_panel[i0..],
                        BLOCK_K,
                        &s.q_t[j0..],
                        strides.q,
                        tile,
                        strides.q,
                        false,
                    )
                };
            }
        }
    }

    /// Between steps 1 and 2: the head's soft cap and ALiBi terms on the block's scores, key
    /// by key (see `terms`).
    fn score_terms(&self, keys: &KeyBlock<'_>, terms: HeadTerms, s: &mut Work) {
        let (stride, first) = (self.strides.q, self.rule.position(0));
        for (j, column) in s.scores_t.chunks_mut(stride).take(keys.len).enumerate() {
            let column = &mut column[..self.rows];
            terms.apply_column(self.kernels, self.rule.ranks(), keys.k0 + j, first, column);
        }
    }

    /// Step 2: masked scores become `-inf`, additive mask values are added. (Nothing to do
    /// when every query of the item sees every key of the block and the rule adds nothing.)
    fn mask_block(&self, keys: &KeyBlock<'_>, s: &mut Work) {
        let rule = &self.rule;
        if rule.is_prefix_only() && rule.visible_prefix(0..self.rows, keys.k0, keys.len) == keys.len
        {
            return;
        }
        let stride = self.strides.q;
        for (j, column) in s.scores_t.chunks_mut(stride).take(keys.len).enumerate() {
            rule.adjust_key(keys.k0 + j, &mut column[..self.rows]);
        }
    }

    /// Step 3: online softmax down the key axis, then the accumulator rescaled.
    fn softmax_step(&self, keys: &KeyBlock<'_>, s: &mut Work) {
        let (rows, dv) = (self.rows, self.dv);
        let strides = self.strides;
        // SAFETY: checked kernel table; the score rows hold `rows` values at stride q.
        unsafe {
            (self.kernels.softmax_block)(
                &mut s.scores_t,
                strides.q,
                keys.len,
                &mut s.row_max[..rows],
                &mut s.row_sum[..rows],
                &mut s.rescale[..rows],
            )
        };
        for (acc_row, &factor) in s.acc.chunks_exact_mut(strides.acc).zip(&s.rescale[..rows]) {
            rescale(&mut acc_row[..dv], factor);
        }
    }

    /// Step 4: `acc += P · V`. The keys every row of an `mr`-row panel sees go through the
    /// microtile; each row then continues its chain over the runs of keys only it sees.
    fn accumulate_block(&self, keys: &KeyBlock<'_>, next_values: &[f32], s: &mut Work) {
        let kernels = self.kernels;
        let (mr, rows) = (kernels.mr, self.rows);
        let strides = self.strides;
        for i0 in (0..rows).step_by(mr) {
            // SAFETY: a checked kernel table; a prefetch reads nothing.
            unsafe { (kernels.prefetch)(share(next_values, i0 / mr, rows.div_ceil(mr))) };
            let panel = i0..(i0 + mr).min(rows);
            let shared = self.rule.visible_prefix(panel.clone(), keys.k0, keys.len);
            if shared > 0 {
                self.accumulate_tiles(keys, i0, shared, s);
            }
            if shared == keys.len {
                continue;
            }
            for i in panel {
                let probabilities = Probabilities {
                    values: &s.scores_t[i..],
                    stride: strides.q,
                };
                let acc_row = &mut s.acc[i * strides.acc..][..self.dv];
                let chain = ChainKeys {
                    k0: keys.k0,
                    len: keys.len,
                    values: Stored::floats(keys.values, strides.acc),
                };
                self.continue_chain(i, chain, shared, probabilities, acc_row, &mut s.run);
            }
        }
    }

    /// `acc` rows `i0 .. i0 + mr` `+= P · V` over the block's first `shared` keys, by tiles.
    fn accumulate_tiles(&self, keys: &KeyBlock<'_>, i0: usize, shared: usize, s: &mut Work) {
        let kernels = self.kernels;
        let strides = self.strides;
        let v_row = self.strides.acc;
        for c0 in (0..self.dv).step_by(kernels.nr) {
            let tile = &mut s.acc[i0 * strides.acc + c0..];
            // SAFETY: checked kernel table. A reads (shared-1)·q + i0+mr values, inside the
            // scores buffer (it has q_rows of overhang); B reads (shared-1)·v_row + c0+nr
            // values, inside the block's value rows (each row holds v_row ≥ round_up(dv, nr)
            // values); the tile lies in the accumulator (round_up(rows, mr) rows of stride acc).
            unsafe {
                (kernels.tile)(
                    shared,
                    &s.scores_t[i0..],
                    strides.q,
                    &keys.values[c0..],
                    v_row,
                    tile,
                    strides.acc,
                    true,
                )
            };
        }
    }
}

/// The key blocks, read from the store where its view locates them.
impl<'a> QueryBlock<'a> {
    /// The keys from `k0` on, up to a block and at most to `key_end`, from the store's slots
    /// (widened into `widened` from a 16- or 8-bit store).
    fn key_block<'w>(
        &'w self,
        head: &HeadOperands<'_>,
        (k0, key_end): (usize, usize),
        widened: &'w mut Widened,
    ) -> KeyBlock<'w> {
        let (kernels, store) = (self.kernels, &self.ops.store);
        let (at, len) = (
            store.locate(self.b, head.kv_head, k0),
            BLOCK_K.min(key_end - k0),
        );
        let Widened { keys, values } = widened;
        let k_panel = store.key_panel(kernels, at, keys);
        KeyBlock {
            k0,
            len,
            k_panel,
            values: store.value_rows(kernels, (at, len), k_panel, values),
        }
    }

    /// The key panel and value rows of the block from `next` on, when they are to be
    /// prefetched while the current block computes; empty slices otherwise.
    /// (A store in a 16- or 8-bit format is not prefetched.)
    fn next_block(
        &self,
        head: &HeadOperands<'_>,
        next: usize,
        key_end: usize,
    ) -> (&'a [f32], &'a [f32]) {
        if next >= key_end || !self.prefetch {
            return (&[], &[]);
        }
        let (store, len) = (&self.ops.store, BLOCK_K.min(key_end - next));
        let at = store.locate(self.b, head.kv_head, next);
        let f32_or_none = |data: Option<Stored<'a>>| data.and_then(Stored::as_f32).unwrap_or(&[]);
        (
            f32_or_none(Some(store.key_data(at))),
            f32_or_none(store.value_data(at, len)),
        )
    }

    /// The row path's keys from `k0` on, up to a block and at most to `key_end`, as stored
    /// (`gemv_stored` widens 16- and 8-bit ones in registers); values in the keys come as the
    /// block's key panel in `f32` (widened into `widened` first from a 16- or 8-bit store: the
    /// values `gemv_stored` widens, so the same bits), out of which
    /// [`QueryBlock::accumulate_row_block`] transposes them a slice at a time.
    fn row_block<'w>(
        &self,
        head: &HeadOperands<'_>,
        (k0, key_end): (usize, usize),
        widened: &'w mut [f32],
    ) -> RowBlock<'w>
    where
        'a: 'w,
    {
        let (store, len) = (&self.ops.store, BLOCK_K.min(key_end - k0));
        let at = store.locate(self.b, head.kv_head, k0);
        let (values, value_panel) = match store.value_data(at, len) {
            Some(values) => (values, None),
            None => {
                let panel = store.key_panel(self.kernels, at, widened);
                (Stored::floats(&[], 0), Some(panel))
            }
        };
        RowBlock {
            chain: ChainKeys { k0, len, values },
            k_panel: store.key_data(at),
            value_panel,
        }
    }
}

/// The chain continuation both paths share, and the row path: a few query rows (decoding)
/// one at a time.
impl QueryBlock<'_> {
    /// Query `i`'s chain `acc_row += p_j · v_j` over each run of keys it sees from block key
    /// `from` on, one `gemv` per run (it repeats the tile's steps); masked keys are skipped,
    /// so a NaN or infinity in a hidden token never meets the row (`0·NaN` would be NaN).
    fn continue_chain(
        &self,
        i: usize,
        keys: ChainKeys<'_>,
        from: usize,
        probabilities: Probabilities<'_>,
        acc_row: &mut [f32],
        run: &mut [f32],
    ) {
        self.rule
            .for_each_visible_run(i, keys.k0, from, keys.len, |start, end| {
                let p = probabilities.gather(start, end, run);
                // Keys start .. end < block have value rows of dv values, `acc_row` holds dv.
                let (a, n) = ((end - start, p, 0), acc_row.len());
                let values = (keys.values, start);
                gemv_rows(self.kernels, values, a, 1, (&mut *acc_row, 0, n), true);
            });
    }

    /// The query heads `heads` (of one key/value head, at most [`part_heads`]) for a few query
    /// rows (decoding): one row at a time, block by block, the heads in chunks of
    /// [`STORED_ROWS`]; each chunk's scores and `P·V` by one `gemv` call for all its heads'
    /// rows (16- and 8-bit keys and values widened once for all of them), the softmax by
    /// `softmax_row` per head, so no work goes to the empty rows of a tile. Each kernel
    /// repeats its tile counterpart's arithmetic, so each head gets the bits of
    /// [`QueryBlock::attend_tiles`]. Head `n` of the part keeps its query in `q_t[n·d ..]`,
    /// its scores in `scores_t[n·BLOCK_K ..]`, its accumulator in `acc[n·acc ..]` and its
    /// running max and sum in `row_max[n]` and `row_sum[n]`.
    fn attend_rows(
        &self,
        heads: Range<usize>,
        first: usize,
        out: &mut [f32],
        FlashScratch {
            work: s, widened, ..
        }: &mut FlashScratch,
    ) {
        let (d, dv, acc) = (self.shape.head_dim, self.dv, self.strides.acc);
        let Widened { keys, values } = widened;
        let count = heads.len();
        debug_assert!((1..=BLOCK_Q).contains(&count));
        let head = |n: usize| self.head_operands(heads.start + n, (heads.start + n - first) * dv);
        for i in 0..self.rows {
            for n in 0..count {
                self.load_query_row(&head(n), i, &mut s.q_t[n * d..][..d]);
                s.acc[n * acc..][..dv].fill(0.0);
                (s.row_max[n], s.row_sum[n]) = self.ops.terms.head(heads.start + n).start();
            }
            let (blocks, key_end) = self.key_blocks(i..i + 1);
            for k0 in blocks {
                let block = self.row_block(&head(0), (k0, key_end), keys);
                for chunk in chunks(count) {
                    self.score_row_block(&block, i, (heads.start, chunk), s);
                }
                self.accumulate_row_block(&block, i, count, values, s);
            }
            for n in 0..count {
                let acc_row = &s.acc[n * acc..][..dv];
                self.write_row(out, head(n).out_col, i, acc_row, s.row_sum[n]);
            }
        }
    }

    /// Steps 1 to 3 for query `i` of the heads `chunk` of a part (at most [`STORED_ROWS`],
    /// counted from the part's first head `part`) over one key block.
    fn score_row_block(
        &self,
        block: &RowBlock<'_>,
        i: usize,
        (part, chunk): (usize, Range<usize>),
        s: &mut Work,
    ) {
        let (dv, acc, len) = (self.dv, self.strides.acc, chunk.len());
        let terms: [HeadTerms; STORED_ROWS] =
            core::array::from_fn(|n| self.ops.terms.head(part + chunk.start + n.min(len - 1)));
        self.score_rows(block, i, (chunk.start, &terms[..len]), s);
        for n in chunk.clone() {
            let scores = &mut s.scores_t[n * BLOCK_K..][..block.chain.len];
            let (max, sum) = (&mut s.row_max[n], &mut s.row_sum[n]);
            // SAFETY: checked kernel table; `scores` holds the block's scores.
            let factor = unsafe { (self.kernels.softmax_row)(scores, max, sum) };
            rescale(&mut s.acc[n * acc..][..dv], factor);
        }
    }

    /// Step 4 for query `i` of the part's `count` heads over one key block, [`STORED_ROWS`]
    /// heads per `gemv` call: over its value rows, or, when the values are in the keys,
    /// [`VALUE_SLICE`] value columns at a time, transposed out of the key panel into `slice`
    /// (at least `BLOCK_K · VALUE_SLICE` floats) and read by every head while in L1. Each
    /// accumulator element takes the same chain over the keys either way.
    fn accumulate_row_block(
        &self,
        block: &RowBlock<'_>,
        i: usize,
        count: usize,
        slice: &mut [f32],
        s: &mut Work,
    ) {
        let (keys, dv) = (block.chain, self.dv);
        let Some(panel) = block.value_panel else {
            for chunk in chunks(count) {
                self.accumulate_rows(keys, i, (chunk, 0..dv), s);
            }
            return;
        };
        for c0 in (0..dv).step_by(VALUE_SLICE) {
            let cols = c0..(c0 + VALUE_SLICE).min(dv);
            let part = (panel, keys.len, cols.clone());
            let values = self
                .ops
                .store
                .value_slice(self.kernels, part, (slice, cols.len()));
            let keys = ChainKeys {
                values: Stored::floats(values, cols.len()),
                ..keys
            };
            for chunk in chunks(count) {
                self.accumulate_rows(keys, i, (chunk, cols.clone()), s);
            }
        }
    }

    /// `query[..d] = q(i) · scale` of `head`.
    fn load_query_row(&self, head: &HeadOperands<'_>, i: usize, query: &mut [f32]) {
        let d = self.shape.head_dim;
        let row = &head.queries[i * head.q_row..][..d];
        for (value, &q) in query.iter_mut().zip(row) {
            *value = q * self.ops.scale;
        }
    }

    /// Steps 1 and 2 for query `i` of the part's heads `n0 ..` with `terms` (one each): their
    /// scores against the block's keys, with the head's terms, after the rule.
    fn score_rows(
        &self,
        block: &RowBlock<'_>,
        i: usize,
        (n0, terms): (usize, &[HeadTerms]),
        s: &mut Work,
    ) {
        let (d, keys) = (self.shape.head_dim, block.chain);
        let scores = &mut s.scores_t[n0 * BLOCK_K..][..terms.len() * BLOCK_K];
        // The queries hold d values each, d apart, and the key panel (d-1)·BLOCK_K + len.
        let queries = (d, &s.q_t[n0 * d..], d);
        let scores_out = (&mut scores[..], BLOCK_K, keys.len);
        let panel = (block.k_panel, 0);
        gemv_rows(self.kernels, panel, queries, terms.len(), scores_out, false);
        for (scores, terms) in scores.chunks_exact_mut(BLOCK_K).zip(terms) {
            let scores = &mut scores[..keys.len];
            if terms.changes_scores() {
                let position = self.rule.position(i);
                terms.apply_row(self.kernels, self.rule.ranks(), position, keys.k0, scores);
            }
            self.mask_row(i, keys.k0, scores);
        }
    }

    /// Step 2 for query `i`'s scores against the keys from `k0` on.
    fn mask_row(&self, i: usize, k0: usize, scores: &mut [f32]) {
        if self.rule.is_prefix_only() {
            // The block ends at the row's last key: only keys before its window are hidden.
            let hidden = self.rule.key_start(i).saturating_sub(k0);
            let hidden = hidden.min(scores.len());
            scores[..hidden].fill(f32::NEG_INFINITY);
        } else {
            for (j, score) in scores.iter_mut().enumerate() {
                *score = self.rule.adjust(i, k0 + j, *score);
            }
        }
    }

    /// Step 4 for query `i` of the part's heads `chunk` (at most [`STORED_ROWS`]) in the
    /// accumulator columns `cols`, `keys.values` those columns' values: the keys it sees from
    /// the block's start in one `gemv` call (all of them under causal masking), then each
    /// further run (the runs are the row's, the same for every head).
    fn accumulate_rows(
        &self,
        keys: ChainKeys<'_>,
        i: usize,
        (chunk, cols): (Range<usize>, Range<usize>),
        s: &mut Work,
    ) {
        let (kernels, dv, acc) = (self.kernels, cols.len(), self.strides.acc);
        let shared = self.rule.visible_prefix(i..i + 1, keys.k0, keys.len);
        let group = chunk.len();
        let p = &s.scores_t[chunk.start * BLOCK_K..];
        let out = &mut s.acc[chunk.start * acc + cols.start..];
        // Keys 0 .. shared < block have rows of dv values; head n's probabilities are at
        // p[n·BLOCK_K ..] and its accumulator at out[n·acc ..].
        let values = (keys.values, 0);
        gemv_rows(
            kernels,
            values,
            (shared, p, BLOCK_K),
            group,
            (&mut *out, acc, dv),
            true,
        );
        self.rule
            .for_each_visible_run(i, keys.k0, shared, keys.len, |start, end| {
                let values = (keys.values, start);
                let p = (end - start, &p[start..], BLOCK_K);
                gemv_rows(kernels, values, p, group, (&mut *out, acc, dv), true);
            });
    }

    /// Row `i` of the head's output, `acc / sum` (zeros for a row that saw no key), into
    /// `out[i * out_stride + out_col ..]`.
    fn write_row(&self, out: &mut [f32], out_col: usize, i: usize, acc_row: &[f32], sum: f32) {
        let out_row = &mut out[i * self.out_stride + out_col..][..self.dv];
        for (o, &a) in out_row.iter_mut().zip(acc_row) {
            *o = if sum == 0.0 { 0.0 } else { a / sum };
        }
    }
}

/// The row path's chunks of `count` heads: [`STORED_ROWS`] at a time (one `gemv` call each).
fn chunks(count: usize) -> impl Iterator<Item = Range<usize>> {
    (0..count)
        .step_by(STORED_ROWS)
        .map(move |n0| n0..(n0 + STORED_ROWS).min(count))
}

/// One query's probabilities in the block: key `j`'s at `values[j * stride]`.
#[derive(Clone, Copy)]
struct Probabilities<'a> {
    values: &'a [f32],
    stride: usize,
}

impl<'a> Probabilities<'a> {
    /// Keys `start .. end` as a contiguous slice: in place, or gathered into `run`.
    fn gather<'r>(&self, start: usize, end: usize, run: &'r mut [f32]) -> &'r [f32]
    where
        'a: 'r,
    {
        if self.stride == 1 {
            return &self.values[start..end];
        }
        let run = &mut run[..end - start];
        for (p, j) in run.iter_mut().zip(start..end) {
            *p = self.values[j * self.stride];
        }
        run
    }
}

/// For each of `rows` rows `r`: `c[r·ldc ..][..n] (+)= a[r·lda ..][..k] · B`, `B` the rows
/// `row ..` of `data`, by one `gemv_stored` call (which widens each 16- or 8-bit element in
/// registers once for all the rows, to the values `widen` gives, and so gives the bits of the
/// tile path).
fn gemv_rows(
    kernels: &Kernels,
    (data, row): (Stored<'_>, usize),
    (k, a, lda): (usize, &[f32], usize),
    rows: usize,
    (c, ldc, n): (&mut [f32], usize, usize),
    accumulate: bool,
) {
    let b = data.skip_rows(row);
    // SAFETY: a checked kernel table; the kernel checks its operands' lengths.
    unsafe { (kernels.gemv_stored)(k, a, lda, b, c, ldc, n, rows, accumulate) }
}

/// `acc_row *= factor` (the online softmax's rescale; nothing when the max did not move).
fn rescale(acc_row: &mut [f32], factor: f32) {
    if factor != 1.0 {
        for a in acc_row {
            *a *= factor;
        }
    }
}

/// The default factor `1/√d` applied to the scores of heads of width `d`. Heads of width 0
/// have only zero scores (empty dot products); their factor is 1, so the scores stay 0 instead
/// of `0 · ∞ = NaN`, and every visible key gets the same weight.
pub(crate) fn score_scale(d: usize) -> f32 {
    if d == 0 {
        return 1.0;
    }
    (1.0 / sqrt(d as f64)) as f32
}

/// Part `i` of `data` cut into `parts` nearly equal runs of whole 64-byte lines.
fn share(data: &[f32], i: usize, parts: usize) -> &[f32] {
    let len = data.len().div_ceil(parts.max(1)).next_multiple_of(16);
    data.get(i * len..)
        .map_or(&[], |rest| &rest[..len.min(rest.len())])
}
