//! The AMX path for a few query rows (decoding): the products of the module above with the
//! operands' roles swapped, so that a set of one query's heads multiplies its own rows only
//! and reads each key block once, as the store holds it. Per key block:
//! `S = bf16(q · scale) · bf16(K)ᵀ` (the queries as `A`, the keys as column pairs), the row
//! path's terms, rule and online softmax per row (`softmax_row`: the bits of
//! `softmax_block`), then `acc += bf16(P) · bf16(V)` (the probabilities as `A`, the values as
//! pairs of keys). AMX computes an element the same with `A` and `B` swapped (each product
//! exact, the steps of 32 in order), so each row gets the bits the module above gives it.

use alloc::vec::Vec;

use super::{RowSet, KEY_PANELS, KEY_STEPS};
use crate::kernels::attention::flash::{FlashScratch, KeyBlock, QueryBlock};
use crate::kernels::format::element::bf16_to_f32;
use crate::kernels::gemm::bf16::{bf16_nearest, padded_rows, pair_panels, round_run};
use crate::kernels::gemm::bf16::{B_STEP, STEP, TILE};
use crate::kernels::gemm::grow;
use crate::kernels::store::layout::BLOCK_K;
use crate::kernels::table::Bf16TileFn;

use super::super::BLOCK_Q;

/// The scratch of the rows' path (grown on its first use).
#[derive(Default)]
pub(super) struct RowWork {
    /// `padded_rows(R) × lda` (`lda` the head width rounded up to steps): the queries times
    /// the scale, rounded.
    queries: Vec<u16>,
    /// One query times the scale, before rounding.
    query: Vec<f32>,
    /// The key block as `B` of `S`: [`KEY_PANELS`] panels of the width's steps.
    keys: Vec<u16>,
    /// The value block as `B` of `acc`: `⌈dv / 32⌉` panels of [`KEY_STEPS`] steps.
    values: Vec<u16>,
    /// `padded_rows(R) × BLOCK_K`: scores, then probabilities.
    scores: Vec<f32>,
    /// `padded_rows(R) × BLOCK_K`: the probabilities rounded, zero past the block's keys.
    probabilities: Vec<u16>,
    /// `padded_rows(R) × ld` (`ld` the value width rounded up to 32): the accumulator.
    acc: Vec<f32>,
    /// Each row's running max and sum.
    max: Vec<f32>,
    sum: Vec<f32>,
}

impl QueryBlock<'_> {
    /// The rows of `set` (at most [`BLOCK_Q`]) by the steps of this module; head `h`'s row `i`
    /// goes to `out[i · out_stride + (h - first) · dv ..][..dv]`.
    pub(in crate::kernels::attention::flash) fn attend_amx_rows(
        &self,
        set: RowSet,
        (first, out): (usize, &mut [f32]),
        tile: Bf16TileFn,
        scratch: &mut FlashScratch,
    ) {
        let FlashScratch { widened, amx, .. } = scratch;
        let w = &mut amx.rows;
        self.start_rows(&set, w);
        let (blocks, key_end) = self.key_blocks(set.queries.clone());
        let head = self.head_operands(set.heads.start, 0);
        for k0 in blocks {
            let keys = self.key_block(&head, (k0, key_end), widened);
            self.row_scores(&set, &keys, tile, w);
            self.row_values(&set, &keys, tile, w);
        }
        let ld = self.dv.next_multiple_of(TILE);
        self.write_set(&set, (first, out), (&w.acc, ld), &w.sum);
    }

    /// The set's queries rounded, the accumulator zero, the running max and sum at each
    /// row's head's start.
    fn start_rows(&self, set: &RowSet, w: &mut RowWork) {
        let (d, rows) = (self.shape.head_dim, set.len());
        let (lda, ld) = (d.next_multiple_of(STEP), self.dv.next_multiple_of(TILE));
        let padded = padded_rows(BLOCK_Q);
        grow(&mut w.queries, padded * lda);
        grow(&mut w.query, d);
        grow(&mut w.keys, KEY_PANELS * lda / STEP * B_STEP);
        grow(&mut w.values, ld / TILE * KEY_STEPS * B_STEP);
        grow(&mut w.scores, padded * BLOCK_K);
        grow(&mut w.probabilities, padded * BLOCK_K);
        grow(&mut w.acc, padded * ld);
        grow(&mut w.max, BLOCK_Q);
        grow(&mut w.sum, BLOCK_Q);
        let queries = &mut w.queries[..padded_rows(rows) * lda];
        queries.fill(0);
        for (r, row) in queries.chunks_exact_mut(lda).take(rows).enumerate() {
            let (h, i) = set.row(r);
            let head = self.head_operands(h, 0);
            let q = &head.queries[i * head.q_row..][..d];
            for (scaled, &x) in w.query.iter_mut().zip(q) {
                *scaled = x * self.ops.scale;
            }
            // SAFETY: a table with `bf16_tile` is an AVX-512 table.
            unsafe { round_run(&mut row[..d], &w.query[..d]) };
            let (h, _) = set.row(r);
            (w.max[r], w.sum[r]) = self.ops.terms.head(h).start();
        }
        w.acc[..padded_rows(rows) * ld].fill(0.0);
    }

    /// Steps 1 and 2 by rows: the scores, each row's terms, rule and softmax step, its
    /// accumulator rescaled and its probabilities rounded.
    fn row_scores(&self, set: &RowSet, keys: &KeyBlock<'_>, tile: Bf16TileFn, w: &mut RowWork) {
        let (d, rows, len) = (self.shape.head_dim, set.len(), keys.len);
        let steps = d.div_ceil(STEP);
        let pairs = &mut w.keys;
        // SAFETY: a table with `bf16_tile` is an AVX-512 table.
        unsafe {
            pair_panels(
                (keys.k_panel, BLOCK_K),
                (d, len),
                (steps, KEY_PANELS),
                pairs,
            )
        };
        let panels = (&pairs[..], len.div_ceil(TILE), steps * B_STEP);
        // SAFETY: a table has `bf16_tile` only where AMX is usable; the queries hold
        // padded_rows(rows) rows of steps · 32, the key panels steps · B_STEP values each, the
        // scores padded_rows(rows) rows of BLOCK_K ≥ 32 · panels.
        unsafe {
            tile(
                (&w.queries, steps * STEP),
                rows,
                panels,
                steps,
                (&mut w.scores, BLOCK_K),
                false,
            )
        };
        let ld = self.dv.next_multiple_of(TILE);
        let rows = w.scores.chunks_exact_mut(BLOCK_K).take(rows).enumerate();
        for ((r, row), p) in rows.zip(w.probabilities.chunks_exact_mut(BLOCK_K)) {
            let (h, i) = set.row(r);
            let (row, terms) = (&mut row[..len], self.ops.terms.head(h));
            if terms.changes_scores() {
                let position = self.rule.position(i);
                terms.apply_row(self.kernels, self.rule.ranks(), position, keys.k0, row);
            }
            self.hide_keys(i, keys.k0, row);
            // SAFETY: checked kernel table; `row` holds the block's scores.
            let factor = unsafe { (self.kernels.softmax_row)(row, &mut w.max[r], &mut w.sum[r]) };
            for a in &mut w.acc[r * ld..][..self.dv] {
                *a *= factor;
            }
            // SAFETY: a table with `bf16_tile` is an AVX-512 table.
            unsafe { round_run(&mut p[..len], row) };
            p[len..].fill(0);
        }
    }

    /// Step 3 by rows: `acc += P · V` over the block's keys, then each non-finite value for
    /// the rows that see its key.
    fn row_values(&self, set: &RowSet, keys: &KeyBlock<'_>, tile: Bf16TileFn, w: &mut RowWork) {
        let (dv, rows, len, stride) = (self.dv, set.len(), keys.len, self.strides.acc);
        let (panels, ld) = (dv.div_ceil(TILE), dv.next_multiple_of(TILE));
        let pairs = &mut w.values[..panels * KEY_STEPS * B_STEP];
        // SAFETY: a table with `bf16_tile` is an AVX-512 table.
        unsafe { pair_panels((keys.values, stride), (len, dv), (KEY_STEPS, panels), pairs) };
        let non_finite = pairs
            .iter()
            .fold(false, |any, &v| any | (v & 0x7f80 == 0x7f80));
        if non_finite {
            pairs
                .iter_mut()
                .filter(|v| **v & 0x7f80 == 0x7f80)
                .for_each(|v| *v = 0);
        }
        let pairs = (&pairs[..], panels, KEY_STEPS * B_STEP);
        // SAFETY: as in `row_scores`: the probabilities hold padded_rows(rows) rows of BLOCK_K
        // = KEY_STEPS · 32, the value panels KEY_STEPS · B_STEP values each, the accumulator
        // padded_rows(rows) rows of ld = 32 · panels.
        unsafe {
            tile(
                (&w.probabilities, BLOCK_K),
                rows,
                pairs,
                len.div_ceil(STEP),
                (&mut w.acc, ld),
                true,
            )
        };
        if non_finite {
            let (acc, scores) = (&mut w.acc, &w.scores);
            self.for_each_non_finite(set, keys.k0, (keys.values, stride, len), |j, c, r, v| {
                let p = bf16_to_f32(bf16_nearest(scores[r * BLOCK_K + j]));
                acc[r * ld + c] += p * v;
            });
        }
    }

    /// The rule on query `i`'s scores against the keys from `k0` on: hidden keys (also those
    /// past the query's last) `-inf`, a mask's values added.
    fn hide_keys(&self, i: usize, k0: usize, row: &mut [f32]) {
        let rule = &self.rule;
        if !rule.is_prefix_only() {
            for (j, score) in row.iter_mut().enumerate() {
                *score = rule.adjust(i, k0 + j, *score);
            }
            return;
        }
        let len = row.len();
        let end = rule.key_end(i + 1).saturating_sub(k0).min(len);
        let start = rule.key_start(i).saturating_sub(k0).min(end);
        row[..start].fill(f32::NEG_INFINITY);
        row[end..].fill(f32::NEG_INFINITY);
    }
}
