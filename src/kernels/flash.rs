//! Attention in the FlashAttention-2 shape, on slices with run-time dimensions.
//!
//! Work item: one batch element `b` and one block of up to [`BLOCK_Q`] query rows, all heads
//! (so each item owns a contiguous block of output rows). Per head, the item transposes its
//! queries once (`Qᵀ`, `d × rows`, with `1/√d` folded in), then walks key blocks of
//! [`BLOCK_K`] keys from the first up to the last one any of its rows can see (blocks past the
//! causal diagonal are never touched):
//!
//! 0. the block's keys are one contiguous `d × BLOCK_K` panel of the pre-transposed `Kᵀ` (see
//!    [`transpose_keys`]) and its values contiguous rows of the value panels ([`copy_values`]);
//! 1. scores, key-major: `Sᵀ (keys × rows) = K · Qᵀ` by the GEMM microtile; tiles no row can
//!    see are skipped;
//! 2. masked scores become `-inf` (only in blocks that cross the diagonal);
//! 3. online softmax down the key axis (`Kernels::softmax_block`): running max and sum per
//!    query, the accumulator rescaled by `exp(m_old - m_new)`;
//! 4. `acc (rows × d) += P · V`: `P` is read straight from `Sᵀ`, `V` from its rows; keys
//!    every row of an `mr`-row panel sees go through the microtile; past them (near the
//!    diagonal) each row continues its chain with `gemv` over each run of keys it sees,
//!    skipping masked keys entirely, so a NaN or infinity in a later token never meets an
//!    earlier row (`0·NaN` would be NaN).
//!
//! A block of only a few query rows (decoding) goes row by row instead (`gemv`, `softmax_row`),
//! with the same arithmetic and so the same bits. Finally `out = acc / l` (zeros for a row
//! that sees no key). Scratch is
//! `O(BLOCK_Q · (BLOCK_K + d))` per thread; there is no `T × T` buffer. Each row's arithmetic
//! depends only on the key-block boundaries, never on the query blocking or the thread count.

use alloc::vec::Vec;

use super::gemm::grow;
use super::mask::{Rule, Visibility};
use super::{parallel, Kernels};

/// The keys and values of one batch element from which on the attention prefetches each
/// next key block: below it they stay in L2 across the item's heads and the requests only
/// cost (measured: `small`, 256 KiB, 1-2 % slower with them; gpt2, batch and long, 1-6 MiB,
/// 2-5 % faster).
const PREFETCH_FROM_BYTES: usize = 1 << 20;

/// Query rows per work item.
pub(crate) const BLOCK_Q: usize = 96;
/// Keys per block of the online softmax.
pub(crate) const BLOCK_K: usize = 96;

/// Where the heads of one operand live: element `(b, h, t, j)` is at
/// `b * batch + h * head + t * row + j` (the `d` values of one row are contiguous).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadLayout {
    /// Distance between batch elements.
    pub batch: usize,
    /// Distance between heads.
    pub head: usize,
    /// Distance between tokens.
    pub row: usize,
}

impl HeadLayout {
    /// The layout [`copy_values`] writes: per batch element `n_kv_heads` heads of `capacity`
    /// rows of `stride` values.
    pub(crate) fn value_panels(n_kv_heads: usize, capacity: usize, stride: usize) -> Self {
        HeadLayout {
            batch: n_kv_heads * capacity * stride,
            head: capacity * stride,
            row: stride,
        }
    }
}

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

impl AttentionShape {
    /// Length of a transposed-keys buffer holding all `S` keys (see [`key_panels_len`]).
    pub(crate) fn keys_len(&self) -> usize {
        self.batch * self.n_kv_heads * key_panels_len(self.head_dim, self.kv_len)
    }
}

/// Floats of one key/value head's transposed keys with room for `capacity` keys: the keys in
/// panels of [`BLOCK_K`], each panel `d × BLOCK_K` row-major (`Kᵀ` of one key block), so
/// the score tiles stream a panel contiguously.
pub(crate) fn key_panels_len(d: usize, capacity: usize) -> usize {
    capacity.div_ceil(BLOCK_K) * d * BLOCK_K
}

/// Where feature `p` of key `t` lives in one head's key panels (see [`key_panels_len`]).
pub(crate) fn key_panel_index(d: usize, p: usize, t: usize) -> usize {
    (t / BLOCK_K) * d * BLOCK_K + p * BLOCK_K + t % BLOCK_K
}

/// One thread's scratch for [`attention`].
#[derive(Default)]
pub(crate) struct FlashScratch {
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

/// Rounds `n` up to a multiple of `m`.
fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

/// The strides of one item's scratch for head width `d`.
struct Strides {
    /// Distance between keys in `q_t` and `scores_t` (queries are the fast axis).
    q: usize,
    /// Distance between query rows in `acc`.
    acc: usize,
}

impl Strides {
    fn new(kernels: &Kernels, d: usize) -> Self {
        Strides {
            q: round_up(BLOCK_Q, kernels.nr),
            acc: value_stride(kernels, d),
        }
    }
}

/// Grows every thread's scratch for head width `d`, so [`attention`] allocates nothing.
fn reserve_scratch(scratch: &mut [FlashScratch], kernels: &Kernels, d: usize) {
    let mr = kernels.mr;
    let strides = Strides::new(kernels, d);
    let q_rows = round_up(BLOCK_Q, mr);
    for s in scratch {
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

/// Writes the `shape.kv_len` keys of every key/value head, transposed into key panels (see
/// [`key_panels_len`]) with room for `capacity` keys per head, as keys `first_key ..`: feature
/// `p` of key `t` of key/value head `h` of batch element `b` goes to
/// `key_panel_index(d, p, first_key + t)` of head `b·Hkv + h`. Other positions are untouched.
#[allow(clippy::too_many_arguments)]
pub(crate) fn transpose_keys(
    kernels: &Kernels,
    shape: AttentionShape,
    k: &[f32],
    k_layout: HeadLayout,
    keys_t: &mut [f32],
    capacity: usize,
    first_key: usize,
    threads: usize,
) {
    let d = shape.head_dim;
    let head_len = key_panels_len(d, capacity);
    for_each_kv_head(
        shape,
        k_layout,
        keys_t,
        head_len,
        threads,
        |panels, base| {
            // Panel by panel: the keys of one panel are its columns.
            let mut t0 = 0;
            while t0 < shape.kv_len {
                let key = first_key + t0;
                let run = (shape.kv_len - t0).min(BLOCK_K - key % BLOCK_K);
                let src = &k[base + t0 * k_layout.row..];
                let dst = &mut panels[key_panel_index(d, 0, key)..];
                // SAFETY: a checked kernel table; `src` holds `run` keys of `d` values at stride
                // `row`, and the panel `d` rows of BLOCK_K from this key's column.
                unsafe { (kernels.transpose)(src, k_layout.row, run, d, dst, BLOCK_K, 1.0) };
                t0 += run;
            }
        },
    );
}

/// Runs `write(region, base)` for every key/value head `b·Hkv + h` of `shape`: `region` is
/// that head's `head_len` floats of `buffer`, `base` where the head starts in a source laid
/// out by `layout`. The heads are independent work items on up to `threads` threads.
fn for_each_kv_head(
    shape: AttentionShape,
    layout: HeadLayout,
    buffer: &mut [f32],
    head_len: usize,
    threads: usize,
    write: impl Fn(&mut [f32], usize) + Sync,
) {
    let heads = shape.batch * shape.n_kv_heads;
    if shape.head_dim == 0 || heads == 0 || shape.kv_len == 0 {
        return;
    }
    let items = buffer[..heads * head_len].chunks_mut(head_len).enumerate();
    let mut workers = [(); parallel::MAX_THREADS];
    let threads = threads.clamp(1, workers.len());
    parallel::for_each_item(items, &mut workers[..threads], |(head, region), ()| {
        let (b, h) = (head / shape.n_kv_heads, head % shape.n_kv_heads);
        write(region, b * layout.batch + h * layout.head);
    });
}

/// The row stride of a value panel for head width `d`: `d` rounded up to whole `nr`-wide
/// microtile panels, so a tile never reads past a row.
pub(crate) fn value_stride(kernels: &Kernels, d: usize) -> usize {
    round_up(d, kernels.nr)
}

/// Writes the `shape.kv_len` values of every key/value head into value panels with room for
/// `capacity` keys per head, as keys `first_key ..`: head `b·Hkv + h` is `capacity` rows of
/// `stride` values (the `d` values, then zeros), so a key block's values are contiguous rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_values(
    shape: AttentionShape,
    v: &[f32],
    v_layout: HeadLayout,
    panels: &mut [f32],
    stride: usize,
    capacity: usize,
    first_key: usize,
    threads: usize,
) {
    let d = shape.head_dim;
    for_each_kv_head(
        shape,
        v_layout,
        panels,
        capacity * stride,
        threads,
        |rows, base| {
            let rows = rows[first_key * stride..]
                .chunks_exact_mut(stride)
                .take(shape.kv_len);
            for (t, row) in rows.enumerate() {
                row[..d].copy_from_slice(&v[base + t * v_layout.row..][..d]);
                row[d..].fill(0.0);
            }
        },
    );
}

/// The operands of one attention call.
#[derive(Clone, Copy)]
pub(crate) struct Operands<'a> {
    /// Queries, `(B, H, T, d)` as laid out by `q_layout`.
    pub q: &'a [f32],
    /// Layout of `q`.
    pub q_layout: HeadLayout,
    /// Keys, transposed into key panels by [`transpose_keys`], one head after the other.
    pub keys_t: &'a [f32],
    /// Keys each head of `keys_t` has room for; at least `S` (a KV cache uses its capacity).
    pub key_capacity: usize,
    /// Values, `(B, Hkv, S, d)` as laid out by `v_layout`; each row holds at least
    /// `round_up(d, nr)` values (zero-padded), as [`copy_values`] writes them.
    pub v: &'a [f32],
    /// Layout of `v`.
    pub v_layout: HeadLayout,
}

/// `out = softmax(Q Kᵀ / √d, masked) V` for every batch element and head.
///
/// `out` is the merged layout `(B, T, H · d)`, row-major. `scratch` holds one entry per thread.
pub(crate) fn attention(
    kernels: &Kernels,
    shape: AttentionShape,
    ops: Operands<'_>,
    visibility: Visibility<'_>,
    out: &mut [f32],
    scratch: &mut [FlashScratch],
) {
    let width = shape.n_heads * shape.head_dim;
    if shape.batch == 0 || shape.q_len == 0 || width == 0 {
        return;
    }
    // The key panels are BLOCK_K wide; score tiles of mr keys must not run past a panel.
    assert!(
        BLOCK_K.is_multiple_of(kernels.mr),
        "BLOCK_K must be a multiple of mr"
    );
    reserve_scratch(scratch, kernels, shape.head_dim);
    let scale = score_scale(shape.head_dim);
    let kv_bytes = 2 * size_of::<f32>() * shape.kv_len * shape.n_kv_heads * shape.head_dim;
    let prefetch = kv_bytes >= PREFETCH_FROM_BYTES;
    let (q_len, d) = (shape.q_len, shape.head_dim);
    // Per batch element, query blocks aligned with the key blocks (so without a causal offset
    // the diagonal crosses one key block per query block), handed out last block first: the last rows see
    // the most keys, so the most expensive items go first. An item is the block's rows in
    // every head, except when decoding one token on several threads: then each head of the
    // row is an item, so that the heads share out the keys and values to stream.
    let per_head = q_len == 1 && scratch.len() > 1;
    let items = out[..shape.batch * q_len * width]
        .chunks_mut(q_len * width)
        .enumerate()
        .flat_map(move |(b, rows)| {
            let chunk = if per_head { d } else { BLOCK_Q * width };
            rows.chunks_mut(chunk)
                .enumerate()
                .rev()
                .map(move |(i, out)| {
                    if per_head {
                        (b, 0, i..i + 1, out)
                    } else {
                        (b, i * BLOCK_Q, 0..shape.n_heads, out)
                    }
                })
        });
    parallel::for_each_item(items, scratch, |(b, q0, heads, out), scratch| {
        let rule = visibility.for_item(b, q0, shape.kv_len);
        // Head h's row i goes to out[i * stride + col ..][..d].
        let stride = if per_head { d } else { width };
        let rows = out.len() / stride;
        for h in heads {
            let head = Head {
                kernels,
                shape,
                ops: &ops,
                rule,
                b,
                h,
                q0,
                scale,
                prefetch,
                out_stride: stride,
                out_col: if per_head { 0 } else { h * d },
            };
            head.attend(out, rows, scratch);
        }
    });
}

/// One head of one work item: query rows `q0 .. q0 + rows` of batch element `b`, head `h`.
struct Head<'a> {
    kernels: &'a Kernels,
    shape: AttentionShape,
    ops: &'a Operands<'a>,
    /// The visibility rule with rows counted from `q0`.
    rule: Rule<'a>,
    b: usize,
    h: usize,
    q0: usize,
    /// `1/√d`, folded into the queries.
    scale: f32,
    /// Whether to prefetch each next key block (see [`PREFETCH_FROM_BYTES`]).
    prefetch: bool,
    /// Distance between the item's output rows.
    out_stride: usize,
    /// Where this head's `d` columns start in an output row.
    out_col: usize,
}

impl Head<'_> {
    /// Computes the head for the item's `rows` query rows and writes row `i` to
    /// `out[i * out_stride + out_col ..][..d]`.
    fn attend(&self, out: &mut [f32], rows: usize, s: &mut FlashScratch) {
        if self.kernels.few_rows(rows) {
            self.attend_rows(out, rows, s);
        } else {
            self.attend_tiles(out, rows, s);
        }
    }

    /// The same head for a few query rows (decoding): one row at a time, scores and `P·V` by
    /// `gemv`, the softmax by `softmax_row`, so no work goes to the empty rows of a tile. Each
    /// kernel repeats its tile counterpart's arithmetic, so the bits are those of
    /// [`Head::attend_tiles`].
    fn attend_rows(&self, out: &mut [f32], rows: usize, s: &mut FlashScratch) {
        let (kernels, shape, ops) = (self.kernels, self.shape, self.ops);
        let d = shape.head_dim;
        let (keys_t, v_base) = self.kv_base();
        let v_row = ops.v_layout.row;
        let q_base = self.b * ops.q_layout.batch + self.h * ops.q_layout.head;
        for i in 0..rows {
            let q_row = &mut s.q_t[..d];
            let q = &ops.q[q_base + (self.q0 + i) * ops.q_layout.row..][..d];
            for (value, &query) in q_row.iter_mut().zip(q) {
                *value = query * self.scale;
            }
            let acc_row = &mut s.acc[..d];
            acc_row.fill(0.0);
            let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0);
            let key_end = self.rule.key_end(i + 1);
            for k0 in (0..key_end).step_by(BLOCK_K) {
                let block = BLOCK_K.min(key_end - k0);
                let scores = &mut s.scores_t[..block];
                let panel = &keys_t[key_panel_index(d, 0, k0)..][..d * BLOCK_K];
                // SAFETY: checked kernel table; q_row holds d values and the key panel
                // (d-1)·BLOCK_K + block; V holds `block` rows of d from k0.
                unsafe { (kernels.gemv)(d, q_row, panel, BLOCK_K, scores, false) };
                // The block ends at the row's last key, so a prefix-only rule changes nothing.
                if !self.rule.is_prefix_only() {
                    for (j, score) in scores.iter_mut().enumerate() {
                        *score = self.rule.adjust(i, k0 + j, *score);
                    }
                }
                // SAFETY: as above.
                let factor = unsafe { (kernels.softmax_row)(scores, &mut max, &mut sum) };
                if factor != 1.0 {
                    for a in acc_row.iter_mut() {
                        *a *= factor;
                    }
                }
                let v = &ops.v[v_base + k0 * v_row..];
                // The keys the row sees from the block's start in one call (all of them under
                // causal masking), then each further run.
                let shared = self.rule.visible_prefix(i..i + 1, k0, block);
                // SAFETY: as above; keys 0 .. shared < block have rows of d values.
                unsafe { (kernels.gemv)(shared, &scores[..shared], v, v_row, acc_row, true) };
                self.for_each_visible_run(i, k0, shared, block, |start, end| {
                    // SAFETY: as above; keys start .. end < block have rows of d values.
                    unsafe {
                        (kernels.gemv)(
                            end - start,
                            &scores[start..end],
                            &v[start * v_row..],
                            v_row,
                            acc_row,
                            true,
                        )
                    };
                });
            }
            self.write_row(out, i, acc_row, sum);
        }
    }

    /// Calls `run(start, end)` for each maximal run `start .. end` of the keys `k0 + j`,
    /// `j` in `from .. to`, that query row `i` sees, in key order.
    fn for_each_visible_run(
        &self,
        i: usize,
        k0: usize,
        from: usize,
        to: usize,
        mut run: impl FnMut(usize, usize),
    ) {
        // No key at or past the row's end is visible.
        let to = to.min(self.rule.key_end(i + 1).saturating_sub(k0));
        let mut j = from;
        while j < to {
            let start = j;
            while j < to && self.rule.is_visible(i, k0 + j) {
                j += 1;
            }
            if j > start {
                run(start, j);
            } else {
                j += 1;
            }
        }
    }

    /// Row `i` of the head's output, `acc / sum` (zeros for a row that saw no key), into
    /// `out[i * out_stride + out_col ..]`.
    fn write_row(&self, out: &mut [f32], i: usize, acc_row: &[f32], sum: f32) {
        let d = self.shape.head_dim;
        let out_row = &mut out[i * self.out_stride + self.out_col..][..d];
        for (o, &a) in out_row.iter_mut().zip(acc_row) {
            *o = if sum == 0.0 { 0.0 } else { a / sum };
        }
    }

    /// The transposed keys of this head's key/value head, and where its values start.
    fn kv_base(&self) -> (&[f32], usize) {
        let (shape, ops) = (self.shape, self.ops);
        let d = shape.head_dim;
        let kv_head = self.h / (shape.n_heads / shape.n_kv_heads);
        let head_index = self.b * shape.n_kv_heads + kv_head;
        let head_len = key_panels_len(d, ops.key_capacity);
        let keys_t = &ops.keys_t[head_index * head_len..][..head_len];
        (
            keys_t,
            self.b * ops.v_layout.batch + kv_head * ops.v_layout.head,
        )
    }

    /// The head by microtiles, for a full block of query rows.
    fn attend_tiles(&self, out: &mut [f32], rows: usize, s: &mut FlashScratch) {
        let (kernels, shape, ops) = (self.kernels, self.shape, self.ops);
        let (mr, nr) = (kernels.mr, kernels.nr);
        let d = shape.head_dim;
        let strides = Strides::new(kernels, d);

        // Qᵀ · (1/√d): q_t[p * stride + i] = q(i, p) / √d for the queries, zeros for the
        // padding queries up to the last nr-wide panel the score tiles read.
        let q_base = self.b * ops.q_layout.batch + self.h * ops.q_layout.head;
        let q_t = &mut s.q_t[..d * strides.q];
        let queries = &ops.q[q_base + self.q0 * ops.q_layout.row..];
        // SAFETY: checked kernel table; `queries` holds `rows` rows of `d` at stride `row`,
        // `q_t` is `d` rows of `strides.q ≥ rows`.
        unsafe {
            (kernels.transpose)(
                queries,
                ops.q_layout.row,
                rows,
                d,
                q_t,
                strides.q,
                self.scale,
            )
        };
        let read = round_up(rows, nr);
        for column in q_t.chunks_exact_mut(strides.q) {
            column[rows..read].fill(0.0);
        }
        s.acc[..round_up(rows, mr) * strides.acc].fill(0.0);
        s.row_max[..rows].fill(f32::NEG_INFINITY);
        s.row_sum[..rows].fill(0.0);

        let (keys_t, v_base) = self.kv_base();
        let v_row = ops.v_layout.row;
        let key_end = self.rule.key_end(rows);

        for k0 in (0..key_end).step_by(BLOCK_K) {
            let block = BLOCK_K.min(key_end - k0);

            // 0. The block's keys are one contiguous panel of Kᵀ (d × BLOCK_K) and its values
            // contiguous rows of a value panel (see `copy_values`), so the tiles stream both.
            let k_panel = &keys_t[key_panel_index(d, 0, k0)..][..d * BLOCK_K];
            let v_block = &ops.v[v_base + k0 * v_row..];
            // The next block's key panel and value rows, requested into L2 a slice per tile
            // while this block computes, when they are likely to come from further away.
            let next = k0 + BLOCK_K;
            let (next_keys, next_values) = if next < key_end && self.prefetch {
                let values = &ops.v[v_base + next * v_row..][..BLOCK_K.min(key_end - next) * v_row];
                (
                    &keys_t[key_panel_index(d, 0, next)..][..d * BLOCK_K],
                    values,
                )
            } else {
                (&[][..], &[][..])
            };
            let key_tiles = block.div_ceil(mr);

            // 1. Sᵀ = K · Qᵀ, skipping tiles whose keys no query of the tile can see.
            for i0 in (0..block).step_by(mr) {
                // SAFETY: a checked kernel table; a prefetch reads nothing.
                unsafe { (kernels.prefetch)(share(next_keys, i0 / mr, key_tiles)) };
                let first_query = self.rule.first_query(k0 + i0);
                for j0 in (0..rows).step_by(nr).filter(|&j0| j0 + nr > first_query) {
                    let tile = &mut s.scores_t[i0 * strides.q + j0..];
                    // SAFETY: `kernels` came from `Isa::kernels` (CPU support checked). A
                    // reads (d-1)·BLOCK_K + i0+mr ≤ d·BLOCK_K values of the key panel (mr
                    // divides BLOCK_K; keys past the block are stale and only reach score rows
                    // past the block, which nothing reads), B reads (d-1)·q + j0+nr ≤ d·q, and
                    // the tile ends inside the scores buffer, sized for BLOCK_K key rows.
                    unsafe {
                        (kernels.tile)(
                            d,
                            &k_panel[i0..],
                            BLOCK_K,
                            &q_t[j0..],
                            strides.q,
                            tile,
                            strides.q,
                            false,
                        )
                    };
                }
            }

            // 2. Masked scores become -inf (additive mask values are added).
            for (j, row) in s.scores_t.chunks_mut(strides.q).take(block).enumerate() {
                self.rule.apply(k0 + j, &mut row[..rows]);
            }

            // 3. Online softmax down the key axis, then rescale the accumulator.
            // SAFETY: checked kernel table; the score rows hold `rows` values at stride q.
            unsafe {
                (kernels.softmax_block)(
                    &mut s.scores_t,
                    strides.q,
                    block,
                    &mut s.row_max[..rows],
                    &mut s.row_sum[..rows],
                    &mut s.rescale[..rows],
                )
            };
            for (acc_row, &factor) in s.acc.chunks_exact_mut(strides.acc).zip(&s.rescale[..rows]) {
                if factor != 1.0 {
                    for a in &mut acc_row[..d] {
                        *a *= factor;
                    }
                }
            }

            // 4. acc += P · V.
            let (scores_t, run) = (&s.scores_t, &mut s.run);
            for i0 in (0..rows).step_by(mr) {
                // SAFETY: as above.
                unsafe { (kernels.prefetch)(share(next_values, i0 / mr, rows.div_ceil(mr))) };
                let shared = self.rule.visible_prefix(i0..(i0 + mr).min(rows), k0, block);
                if shared > 0 {
                    for c0 in (0..d).step_by(nr) {
                        let tile = &mut s.acc[i0 * strides.acc + c0..];
                        // SAFETY: checked kernel table. A reads (shared-1)·q + i0+mr values,
                        // inside the scores buffer (it has q_rows of overhang); B reads
                        // (shared-1)·v_row + c0+nr values, inside the block's value rows (each
                        // row holds v_row ≥ round_up(d, nr) values, see `Operands::v`); the
                        // tile lies in the accumulator (round_up(rows, mr) rows of stride acc).
                        unsafe {
                            (kernels.tile)(
                                shared,
                                &scores_t[i0..],
                                strides.q,
                                &v_block[c0..],
                                v_row,
                                tile,
                                strides.acc,
                                true,
                            )
                        };
                    }
                }
                // The keys past the shared prefix that only some rows see: per row, each run of
                // keys it sees continues its chain (`gemv` repeats the tile's steps).
                for i in i0..(i0 + mr).min(rows) {
                    let acc_row = &mut s.acc[i * strides.acc..][..d];
                    self.for_each_visible_run(i, k0, shared, block, |start, end| {
                        let probabilities = &mut run[..end - start];
                        for (p, j) in probabilities.iter_mut().zip(start..end) {
                            *p = scores_t[j * strides.q + i];
                        }
                        // SAFETY: checked kernel table; keys start .. end < block have value
                        // rows of d values, `acc_row` holds d.
                        unsafe {
                            (kernels.gemv)(
                                end - start,
                                probabilities,
                                &v_block[start * v_row..],
                                v_row,
                                acc_row,
                                true,
                            )
                        };
                    });
                }
            }
        }

        for (i, acc_row) in s.acc.chunks_exact(strides.acc).take(rows).enumerate() {
            self.write_row(out, i, &acc_row[..d], s.row_sum[i]);
        }
    }
}

/// The factor `1/√d` applied to the scores of heads of width `d`.
pub(crate) fn score_scale(d: usize) -> f32 {
    (1.0 / sqrt(d as f64)) as f32
}

/// Part `i` of `data` cut into `parts` nearly equal runs of whole 64-byte lines.
fn share(data: &[f32], i: usize, parts: usize) -> &[f32] {
    let len = data.len().div_ceil(parts.max(1)).next_multiple_of(16);
    data.get(i * len..)
        .map_or(&[], |rest| &rest[..len.min(rest.len())])
}

/// `√x` for `x ≥ 0` (NaN for NaN) by Newton's method (`f64::sqrt` needs `std`); within an ulp
/// of `f64`, far below `f32` precision.
pub(crate) fn sqrt(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x <= 0.0 || x.is_infinite() {
        return x.max(0.0);
    }
    // Halving the exponent is within a factor of 1.5 of √x; one Newton step from any positive
    // guess lands at or above √x, from where the steps decrease until they stop.
    let rough = f64::from_bits((x.to_bits() >> 1) + (1023 << 51));
    let mut guess = 0.5 * (rough + x / rough);
    loop {
        let next = 0.5 * (guess + x / guess);
        if next >= guess {
            return guess;
        }
        guess = next;
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::sqrt;

    /// Within an ulp of `f64::sqrt` over head widths, powers of two and awkward values.
    #[test]
    fn sqrt_matches_std() {
        let mut values: std::vec::Vec<f64> = (1..=4096).map(|d| d as f64).collect();
        values.extend((-60..60).map(|e| 2f64.powi(e)));
        values.extend([
            5e-324,
            1e-310,
            1e-300,
            3e-7,
            0.3,
            1.5,
            7.77,
            1e15,
            1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
        ]);
        for x in values {
            let (ours, std) = (sqrt(x), x.sqrt());
            let ulps = (ours.to_bits() as i64 - std.to_bits() as i64).abs();
            assert!(ulps <= 1, "sqrt({x}) = {ours}, std {std}");
        }
        assert_eq!(sqrt(0.0), 0.0);
        assert_eq!(sqrt(-4.0), 0.0);
        assert_eq!(sqrt(f64::INFINITY), f64::INFINITY);
        assert!(sqrt(f64::NAN).is_nan());
    }
}
