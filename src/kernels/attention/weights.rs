//! Attention probabilities on request: plain loops, off the fast path, for inspection.

use crate::kernels::attention::flash::{AttentionShape, Operands};
use crate::kernels::attention::mask::Visibility;
use crate::kernels::attention::softmax::softmax_row;
use crate::kernels::store::view::KvView;
use crate::kernels::Kernels;

/// The key columns `S` of the weights of a call of `shape` over `store`: the call's keys,
/// except through a rolling store (the cache of a layer with a sliding window), where the
/// call's `T` query rows of a batch element see only its last `window + T - 1` keys (a
/// query's window ends at most `T - 1` keys after the first query's), so the weights keep
/// those: column `c` of element `b` is its key [`first_key`]` + c`. Their memory is then
/// bounded by the window and the call, however many tokens the cache has seen.
pub(crate) fn columns(shape: AttentionShape, store: &KvView<'_>) -> usize {
    match store.window {
        Some(window) => {
            let reach = window.saturating_add(shape.q_len.saturating_sub(1));
            shape.kv_len.min(reach)
        }
        None => shape.kv_len,
    }
}

/// The position of the key in column 0 of batch element `b`'s weights of `columns` columns:
/// 0 unless the element holds more keys than that (through a rolling store).
fn first_key(store: &KvView<'_>, b: usize, columns: usize) -> usize {
    store.lengths[b].saturating_sub(columns)
}

/// Writes `softmax(scale · q·kᵀ + mask)` for every batch element, head and query into `out`,
/// `(B, H, T, S)` row-major with `S` the [`columns`] (column `c` of element `b` is its key
/// [`first_key`]` + c`), zeros for hidden keys (a row that sees no key is all zeros), with
/// the layer's score terms as the flash kernel applies them (its soft cap kernel; a sink takes
/// its share, so a row with a sink sums to less than 1; a ragged call's rows past a
/// sequence's length are zeros). Reads the same operands as the flash kernel.
pub(crate) fn attention_weights(
    kernels: &Kernels,
    shape: AttentionShape,
    ops: &Operands<'_>,
    visibility: &Visibility<'_>,
    out: &mut [f32],
) {
    let (d, s_len) = (shape.head_dim, shape.kv_len);
    // Without entries there are no rows; with them, `out` holds exactly the `B · H · T` rows
    // of `S` columns (and so every index below fits in usize).
    if out.is_empty() {
        return;
    }
    let columns = columns(shape, &ops.store);
    let scale = ops.scale;
    let group = shape.n_heads / shape.n_kv_heads.max(1);
    for (row_index, row) in out.chunks_exact_mut(columns).enumerate() {
        let i = row_index % shape.q_len;
        let h = row_index / shape.q_len % shape.n_heads;
        let b = row_index / (shape.q_len * shape.n_heads);
        // A ragged call's sequence has no rows past its own length: zeros there.
        if ops
            .q_starts
            .is_some_and(|starts| i >= starts[b + 1] - starts[b])
        {
            row.fill(0.0);
            continue;
        }
        let rule = visibility.for_item(b, i, s_len);
        let q = &ops.q[ops.q_start(b) + h * ops.q_layout.head + i * ops.q_layout.row..][..d];
        let key = |p, j| ops.store.key((b, h / group), p, j);
        let terms = ops.terms.head(h);
        let first = first_key(&ops.store, b, columns);
        scaled_scores(q, key, scale, first, |j| rule.sees(0, j), row);
        terms.apply_row(kernels, rule.ranks(), rule.position(0), first, row);
        for (c, w) in row.iter_mut().enumerate() {
            *w = rule.adjust(0, first + c, *w);
        }
        // exp(w - max) and their sum from the sink's start, as the flash kernel's row step
        // (zeros when every key is hidden), then normalised.
        let (mut max, mut total) = terms.start();
        softmax_row(row, &mut max, &mut total);
        if total != 0.0 {
            for w in row.iter_mut() {
                *w /= total;
            }
        }
    }
}

/// `row[c] = scale · q·k_j` for the keys `j = first + c` that are `visible(j)`, feature `p`
/// of key `j` being `key(p, j)`, 0 for the others (hidden keys are never read: the rule
/// makes their scores `-inf` whatever they hold).
fn scaled_scores(
    q: &[f32],
    key: impl Fn(usize, usize) -> f32,
    scale: f32,
    first: usize,
    visible: impl Fn(usize) -> bool,
    row: &mut [f32],
) {
    for (c, w) in row.iter_mut().enumerate() {
        let j = first + c;
        *w = if visible(j) {
            let dot: f32 = q.iter().enumerate().map(|(p, &qp)| qp * key(p, j)).sum();
            dot * scale
        } else {
            0.0
        };
    }
}
