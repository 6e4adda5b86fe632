//! Attention probabilities on request: plain loops, off the fast path, for inspection.

use super::flash::{AttentionShape, Operands};
use super::kv::key_panel_index;
use super::mask::Visibility;
use super::softmax::softmax_row;
use super::Kernels;

/// Writes `softmax(scale · q·kᵀ + mask)` for every batch element, head and query into `out`,
/// `(B, H, T, S)` row-major, zeros for hidden keys (a row that sees no key is all zeros), with
/// the layer's score terms as the flash kernel applies them (its soft cap kernel; a sink takes
/// its share, so a row with a sink sums to less than 1). Reads the same operands as the flash
/// kernel.
pub(crate) fn attention_weights(
    kernels: &Kernels,
    shape: AttentionShape,
    ops: &Operands<'_>,
    visibility: &Visibility<'_>,
    out: &mut [f32],
) {
    let (d, s_len) = (shape.head_dim, shape.kv_len);
    let scale = ops.scale;
    let group = shape.n_heads / shape.n_kv_heads.max(1);
    let rows = out
        .chunks_exact_mut(s_len.max(1))
        .take(shape.batch * shape.n_heads * shape.q_len);
    for (row_index, row) in rows.enumerate() {
        let i = row_index % shape.q_len;
        let h = row_index / shape.q_len % shape.n_heads;
        let b = row_index / (shape.q_len * shape.n_heads);
        let rule = visibility.for_item(b, i, s_len);
        let q =
            &ops.q[b * ops.q_layout.batch + h * ops.q_layout.head + i * ops.q_layout.row..][..d];
        let keys_t = ops.store.keys_t(b * shape.n_kv_heads + h / group);
        let terms = ops.terms.head(h);
        let slot = |j| ops.store.slot(j);
        scaled_scores(q, (keys_t, slot), scale, |j| rule.sees(0, j), row);
        terms.apply_row(kernels, rule.position(0), 0, row);
        for (j, w) in row.iter_mut().enumerate() {
            *w = rule.adjust(0, j, *w);
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

/// `row[j] = scale · q·k_j` for the keys `visible(j)` of the `Kᵀ` panels `keys_t` (key `j` in
/// column `slot(j)`: its slot of a rolling cache), 0 for the others (hidden keys are never
/// read: the rule makes their scores `-inf` whatever they hold).
fn scaled_scores(
    q: &[f32],
    (keys_t, slot): (&[f32], impl Fn(usize) -> usize),
    scale: f32,
    visible: impl Fn(usize) -> bool,
    row: &mut [f32],
) {
    let d = q.len();
    for (j, w) in row.iter_mut().enumerate() {
        *w = if visible(j) {
            let dot: f32 = q
                .iter()
                .enumerate()
                .map(|(p, &qp)| qp * keys_t[key_panel_index(d, p, slot(j))])
                .sum();
            dot * scale
        } else {
            0.0
        };
    }
}
