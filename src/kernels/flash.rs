//! Attention in the FlashAttention-2 shape, on slices with run-time dimensions.
//!
//! Work item: one batch element `b` and one block of up to [`BLOCK_Q`] query rows, all heads
//! (so each item owns a contiguous block of output rows). Per head, the item walks key blocks
//! of [`BLOCK_K`] keys from the first up to the last one any of its rows can see (blocks past
//! the causal diagonal are never touched):
//!
//! 1. scores `S = (Q·scale) · Kᵀ` for the block, by the GEMM microtile (`Q` packed once per
//!    head with `1/√d` folded in, the key block packed transposed);
//! 2. masked scores become `-inf` (only in blocks that cross the diagonal);
//! 3. online softmax per row: running max `m`, running sum `l`, accumulator rescaled by
//!    `exp(m_old - m_new)`;
//! 4. `acc += P · V`: keys every row of an `mr`-row panel sees go through the microtile; the
//!    few keys near the diagonal that only some rows see go through `axpy`, skipping masked
//!    keys entirely, so a NaN or infinity in a later token never meets an earlier row (`0 · NaN`
//!    would be NaN).
//!
//! Finally `out = acc / l` (zeros for a row that sees no key). Scratch is `O(BLOCK_Q · BLOCK_K +
//! BLOCK_Q · d)` per thread; there is no `T × T` buffer. Each row's arithmetic depends only on
//! the key-block boundaries, never on the query blocking or the thread count.

use alloc::vec::Vec;

use super::gemm::{grow, pack_a_panels, pack_b_panels};
use super::{exp, parallel, Kernels};

/// Query rows per work item.
pub(crate) const BLOCK_Q: usize = 64;
/// Keys per block of the online softmax.
pub(crate) const BLOCK_K: usize = 64;

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

/// The dimensions of one attention call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttentionShape {
    /// Batch elements `B`.
    pub batch: usize,
    /// Heads `H`.
    pub n_heads: usize,
    /// Query rows per batch element `T`.
    pub q_len: usize,
    /// Keys per batch element `S`.
    pub kv_len: usize,
    /// Width of one head `d`.
    pub head_dim: usize,
}

/// Which keys each query row may see.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Visibility<'a> {
    /// Key `j` is visible to query `i` iff `j <= i + offset` (`offset = S - T`: bottom-right
    /// aligned, as with a KV cache; 0 for plain causal self-attention).
    Causal {
        /// How many more keys than queries precede the diagonal.
        offset: isize,
    },
    /// A `(T, S)` row-major mask shared by all batch elements and heads: `true` = visible.
    Mask(&'a [bool]),
}

impl Visibility<'_> {
    /// How many keys of the block starting at key `k0` (of `len` keys) query row `i` sees for
    /// sure as a prefix, and whether the rest of the block needs a per-key check.
    fn visible_prefix(&self, i: usize, k0: usize, len: usize) -> usize {
        match *self {
            Visibility::Causal { offset } => {
                let last = i as isize + offset - k0 as isize; // last visible key, block-relative
                (last + 1).clamp(0, len as isize) as usize
            }
            Visibility::Mask(_) => 0,
        }
    }

    /// Whether key `j` is visible to query row `i` (`kv_len` keys in all).
    fn is_visible(&self, i: usize, j: usize, kv_len: usize) -> bool {
        match *self {
            Visibility::Causal { offset } => (j as isize) <= i as isize + offset,
            Visibility::Mask(mask) => mask[i * kv_len + j],
        }
    }

    /// One past the last key any of the query rows `< q_end` can see.
    fn key_end(&self, q_end: usize, kv_len: usize) -> usize {
        match *self {
            Visibility::Causal { offset } => {
                (q_end as isize + offset).clamp(0, kv_len as isize) as usize
            }
            Visibility::Mask(_) => kv_len,
        }
    }
}

/// One thread's scratch for [`attention`].
#[derive(Default)]
pub(crate) struct FlashScratch {
    /// `BLOCK_Q × d` queries of one head, scaled, in `mr`-row panels.
    q_packed: Vec<f32>,
    /// `d × BLOCK_K` transposed keys, in `nr`-key panels.
    k_packed: Vec<f32>,
    /// `BLOCK_K × d` values, in `nr`-column panels.
    v_packed: Vec<f32>,
    /// `BLOCK_Q × BLOCK_K` scores, then probabilities, row stride `BLOCK_K`.
    scores: Vec<f32>,
    /// The probabilities again, in `mr`-row panels.
    p_packed: Vec<f32>,
    /// `BLOCK_Q × d_padded` output accumulator.
    acc: Vec<f32>,
    /// Running max and running sum per query row.
    row_max: Vec<f32>,
    row_sum: Vec<f32>,
}

/// Rounds `n` up to a multiple of `m`.
fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

/// Grows every thread's scratch for head width `head_dim`, so [`attention`] allocates nothing.
pub(crate) fn reserve_scratch(scratch: &mut [FlashScratch], kernels: &Kernels, head_dim: usize) {
    let (mr, nr) = (kernels.mr, kernels.nr);
    let rows = round_up(BLOCK_Q, mr);
    let keys = round_up(BLOCK_K, nr);
    let width = round_up(head_dim, nr);
    for s in scratch {
        grow(&mut s.q_packed, rows * head_dim);
        grow(&mut s.k_packed, head_dim * keys);
        grow(&mut s.v_packed, BLOCK_K * width);
        grow(&mut s.scores, rows * keys);
        grow(&mut s.p_packed, rows * BLOCK_K);
        grow(&mut s.acc, rows * width);
        grow(&mut s.row_max, BLOCK_Q);
        grow(&mut s.row_sum, BLOCK_Q);
    }
}

/// The operands of one attention call: queries, keys, values and their layouts.
#[derive(Clone, Copy)]
pub(crate) struct Operands<'a> {
    /// Queries, `(B, H, T, d)` as laid out by `q_layout`.
    pub q: &'a [f32],
    /// Layout of `q`.
    pub q_layout: HeadLayout,
    /// Keys, `(B, H, S, d)` as laid out by `k_layout`.
    pub k: &'a [f32],
    /// Layout of `k`.
    pub k_layout: HeadLayout,
    /// Values, `(B, H, S, d)` as laid out by `v_layout`.
    pub v: &'a [f32],
    /// Layout of `v`.
    pub v_layout: HeadLayout,
}

/// `out = softmax(Q Kᵀ / √d + mask) V` for every batch element and head.
///
/// `out` is the merged layout `(B, T, H * d)`, row-major. `scratch` holds one entry per thread.
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
    reserve_scratch(scratch, kernels, shape.head_dim);
    let q_len = shape.q_len;
    // Per batch element, query blocks from the end of the sequence: the last rows see the most
    // keys, so the most expensive items are handed out first.
    let items = out[..shape.batch * q_len * width]
        .chunks_mut(q_len * width)
        .enumerate()
        .flat_map(|(b, rows)| {
            rows.rchunks_mut(BLOCK_Q * width)
                .enumerate()
                .map(move |(i, block)| (b, q_len - i * BLOCK_Q - block.len() / width, block))
        });
    parallel::for_each_item(items, scratch, |(b, q0, out_block), scratch| {
        for h in 0..shape.n_heads {
            attend_block(
                kernels, shape, &ops, visibility, b, h, q0, out_block, scratch,
            );
        }
    });
}

/// One head of one work item: query rows `q0 .. q0 + rows` of batch element `b`, head `h`,
/// written to columns `h*d .. (h+1)*d` of `out_block` (`rows × H*d`).
#[allow(clippy::too_many_arguments)]
fn attend_block(
    kernels: &Kernels,
    shape: AttentionShape,
    ops: &Operands<'_>,
    visibility: Visibility<'_>,
    b: usize,
    h: usize,
    q0: usize,
    out_block: &mut [f32],
    s: &mut FlashScratch,
) {
    let (mr, nr) = (kernels.mr, kernels.nr);
    let d = shape.head_dim;
    let width = shape.n_heads * d;
    let rows = out_block.len() / width;
    let kv_len = shape.kv_len;
    let keys_stride = round_up(BLOCK_K, nr);
    let acc_stride = round_up(d, nr);
    let mask = visibility_for_rows(visibility, q0, kv_len);

    let q_base = b * ops.q_layout.batch + h * ops.q_layout.head;
    let k_base = b * ops.k_layout.batch + h * ops.k_layout.head;
    let v_base = b * ops.v_layout.batch + h * ops.v_layout.head;
    let (q_row, k_row, v_row) = (ops.q_layout.row, ops.k_layout.row, ops.v_layout.row);

    let scale = (1.0 / sqrt(d as f64)) as f32;
    let q_packed = &mut s.q_packed[..round_up(rows, mr) * d];
    pack_a_panels(q_packed, mr, rows, d, |i, p| {
        ops.q[q_base + (q0 + i) * q_row + p] * scale
    });
    s.acc[..round_up(rows, mr) * acc_stride].fill(0.0);
    s.row_max[..rows].fill(f32::NEG_INFINITY);
    s.row_sum[..rows].fill(0.0);

    let key_end = mask.key_end(rows, kv_len);
    for k0 in (0..key_end).step_by(BLOCK_K) {
        let block = BLOCK_K.min(key_end - k0);
        let k_packed = &mut s.k_packed[..d * round_up(block, nr)];
        pack_b_panels(k_packed, nr, d, block, |p, j| {
            ops.k[k_base + (k0 + j) * k_row + p]
        });
        let v_packed = &mut s.v_packed[..block * acc_stride];
        pack_b_panels(v_packed, nr, block, d, |p, j| {
            ops.v[v_base + (k0 + p) * v_row + j]
        });

        // 1. Scores, skipping tiles no row of the panel can see.
        for (q_micro, i0) in q_packed.chunks_exact(d * mr).zip((0..rows).step_by(mr)) {
            let last_row = (i0 + mr).min(rows) - 1;
            let seen = mask
                .key_end(last_row + 1, kv_len)
                .saturating_sub(k0)
                .min(block);
            for (k_micro, j0) in k_packed.chunks_exact(d * nr).zip((0..seen).step_by(nr)) {
                let tile = &mut s.scores[i0 * keys_stride + j0..];
                // SAFETY: `kernels` came from `Isa::kernels` (CPU support checked); the panels
                // hold d·mr and d·nr values; the tile lies inside the BLOCK_Q × keys_stride
                // score buffer, whose row count is a multiple of mr and width of nr.
                unsafe { (kernels.tile)(d, q_micro, k_micro, tile, keys_stride, false) };
            }
        }

        // 2 and 3. Mask, online softmax, rescale the accumulator.
        for i in 0..rows {
            let row = &mut s.scores[i * keys_stride..][..block];
            let prefix = mask.visible_prefix(i, k0, block);
            for (j, score) in row.iter_mut().enumerate().skip(prefix) {
                if !mask.is_visible(i, k0 + j, kv_len) {
                    *score = f32::NEG_INFINITY;
                }
            }
            let old_max = s.row_max[i];
            // SAFETY: checked kernel table (see above); `row` is any slice.
            let (new_max, sum) = unsafe { (kernels.softmax_row)(row, old_max) };
            let rescale = if new_max == old_max {
                1.0
            } else {
                exp::exp(old_max - new_max)
            };
            s.row_max[i] = new_max;
            s.row_sum[i] = s.row_sum[i] * rescale + sum;
            if rescale != 1.0 {
                for a in &mut s.acc[i * acc_stride..][..d] {
                    *a *= rescale;
                }
            }
        }

        // 4. acc += P · V.
        let p_packed = &mut s.p_packed[..round_up(rows, mr) * block];
        let scores = &s.scores;
        pack_a_panels(p_packed, mr, rows, block, |i, p| {
            scores[i * keys_stride + p]
        });
        for (p_micro, i0) in p_packed.chunks_exact(block * mr).zip((0..rows).step_by(mr)) {
            let shared = mask.visible_prefix(i0, k0, block);
            if shared > 0 {
                for (v_micro, c0) in v_packed.chunks_exact(block * nr).zip((0..d).step_by(nr)) {
                    let tile = &mut s.acc[i0 * acc_stride + c0..];
                    // SAFETY: checked kernel table; the panels hold at least shared·mr and
                    // shared·nr values; the tile lies inside the accumulator, whose row count
                    // is a multiple of mr and row stride a multiple of nr.
                    unsafe { (kernels.tile)(shared, p_micro, v_micro, tile, acc_stride, true) };
                }
            }
            for i in i0..(i0 + mr).min(rows) {
                let acc_row = &mut s.acc[i * acc_stride..][..d];
                for j in shared..block {
                    if mask.is_visible(i, k0 + j, kv_len) {
                        let p = scores[i * keys_stride + j];
                        let v = &ops.v[v_base + (k0 + j) * v_row..][..d];
                        // SAFETY: checked kernel table; `v` and `acc_row` both hold d values.
                        unsafe { (kernels.axpy)(p, v, acc_row) };
                    }
                }
            }
        }
    }

    for i in 0..rows {
        let sum = s.row_sum[i];
        let acc_row = &s.acc[i * acc_stride..][..d];
        let out_row = &mut out_block[i * width + h * d..][..d];
        for (o, &a) in out_row.iter_mut().zip(acc_row) {
            *o = if sum == 0.0 { 0.0 } else { a / sum };
        }
    }
}

/// The visibility rule re-expressed for rows counted from `q0`, so the block code can use
/// block-relative row indices.
fn visibility_for_rows(visibility: Visibility<'_>, q0: usize, kv_len: usize) -> Visibility<'_> {
    match visibility {
        Visibility::Causal { offset } => Visibility::Causal {
            offset: offset + q0 as isize,
        },
        Visibility::Mask(mask) => Visibility::Mask(&mask[q0 * kv_len..]),
    }
}

/// `√x` for `x ≥ 0` by Newton's method (`f64::sqrt` needs `std`); exact to the last bit or one
/// below, which is far below `f32` precision.
pub(crate) fn sqrt(x: f64) -> f64 {
    if x <= 0.0 || x.is_infinite() {
        return x.max(0.0);
    }
    let mut guess = if x >= 1.0 { x } else { 1.0 };
    loop {
        let next = 0.5 * (guess + x / guess);
        if next >= guess {
            return guess;
        }
        guess = next;
    }
}
