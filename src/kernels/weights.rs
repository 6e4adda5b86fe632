//! Attention probabilities on request: plain loops, off the fast path, for inspection.

use super::flash::{AttentionShape, Operands};
use super::kv::key_panel_index;
use super::mask::Visibility;
use super::softmax::softmax_row;

/// Writes `softmax(scale · q·kᵀ + mask)` for every batch element, head and query into `out`,
/// `(B, H, T, S)` row-major, zeros for hidden keys (a row that sees no key is all zeros).
/// Reads the same operands as the flash kernel.
pub(crate) fn attention_weights(
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
        for (j, w) in row.iter_mut().enumerate() {
            // Hidden keys are never read: their scores are -inf whatever they hold.
            let score = if rule.sees(0, j) {
                let slot = ops.store.slot(j);
                let dot: f32 = q
                    .iter()
                    .enumerate()
                    .map(|(p, &qp)| qp * keys_t[key_panel_index(d, p, slot)])
                    .sum();
                dot * scale
            } else {
                0.0
            };
            *w = rule.adjust(0, j, score);
        }
        // exp(w - max) and their sum, as the flash kernel's row step (zeros when every key is
        // hidden), then normalised.
        let (mut max, mut total) = (f32::NEG_INFINITY, 0.0);
        softmax_row(row, &mut max, &mut total);
        if total != 0.0 {
            for w in row.iter_mut() {
                *w /= total;
            }
        }
    }
}
