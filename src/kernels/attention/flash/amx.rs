//! The attention in bfloat16 products on AMX ([`Operands::bf16`](super::Operands::bf16) on a
//! table with [`Kernels::bf16_tile`]): `Q·Kᵀ` and `P·V` on the tile, the rest as the `f32`
//! path.
//!
//! First every key block a call reads is packed once, in parallel ([`Shared::pack`]): its
//! keys as rows rounded to bfloat16 (`A` of `Sᵀ = K · Qᵀ`) and its values transposed and
//! rounded (`A` of `accᵀ = Vᵀ · Pᵀ`). Then a pass computes a set of rows together
//! ([`RowSet`]: one head's query rows, or one query's heads when decoding), per key block:
//! 1. `Sᵀ = bf16(K) · bf16(q · scale)ᵀ`, key-major as the `f32` path keeps it (each score one
//!    dot product in steps of 32 of the head width, in AMX's own order), then the head's soft
//!    cap and ALiBi terms and the visibility rule (hidden keys `-inf`, additive masks added);
//! 2. the online-softmax step of the `f32` path ([`Kernels::softmax_block`]), the
//!    accumulator rescaled;
//! 3. `accᵀ += bf16(V)ᵀ · bf16(P)ᵀ` over the block's keys in steps of 32 (keys past the block
//!    zero). A non-finite rounded value would meet every row's probabilities in the tile, also
//!    the zeros of rows that do not see its key (`0 · ∞` is NaN), so the packed block holds it
//!    as zero and each row that sees the key then adds `p · v` for it alone.
//!
//! Every step of a row depends on that row's operands only (AMX computes each element of a
//! tile by itself; masked keys and keys past a shorter block add exact zeros), so a row gets
//! the same bits in any set, for any thread count, and decoding equals the forward. Outputs
//! are `acc / sum`, with `-0` written as `+0` (a zero sum's sign may depend on the zeros the
//! block's other keys added) and NaN as the canonical NaN.

use alloc::vec::Vec;
use core::ops::Range;

use super::{Call, FlashScratch, KeyBlock, QueryBlock, Work, BLOCK_Q};
use crate::kernels::format::element::bf16_to_f32;
use crate::kernels::gemm::bf16::{bf16_nearest, padded_rows, pair_panels, round_run};
use crate::kernels::gemm::bf16::{B_STEP, STEP, TILE};
use crate::kernels::gemm::grow;
use crate::kernels::store::layout::BLOCK_K;
use crate::kernels::table::Bf16TileFn;
use crate::kernels::threads::parallel::{self, Pool};

mod rows;

/// The steps of 32 keys of a key block.
const KEY_STEPS: usize = BLOCK_K / STEP;
/// The panels of 32 keys of a key block.
const KEY_PANELS: usize = BLOCK_K / TILE;
const _: () = assert!(BLOCK_K.is_multiple_of(STEP) && BLOCK_Q.is_multiple_of(TILE));

/// The packed key blocks of a call, shared by its items; kept between calls in the first
/// thread's scratch.
#[derive(Default)]
pub(super) struct Shared {
    /// Per packed block: [`BLOCK_K`] key rows of `lda`, `padded_rows(dv)` value rows of
    /// [`BLOCK_K`], a last value 1 when a value was not finite.
    blocks: Vec<u16>,
    /// Per batch element, the first key block any of its queries sees.
    first: Vec<usize>,
}

/// Where [`Shared`] keeps each block of one call.
#[derive(Clone, Copy)]
pub(super) struct Blocks<'a> {
    blocks: &'a [u16],
    first: &'a [usize],
    /// Values per packed block.
    len: usize,
    /// Packed blocks per key/value head of a batch element.
    per_head: usize,
    /// The key rows' stride: the head width rounded up to steps.
    lda: usize,
}

/// How a call computes in bfloat16 on AMX: its table's tile, and its packed blocks when an
/// item has more than a few rows (a few rows take [`QueryBlock::attend_amx_rows`]).
#[derive(Clone, Copy)]
pub(super) struct Amx<'a> {
    pub tile: Bf16TileFn,
    pub blocks: Option<Blocks<'a>>,
}

impl<'a> Blocks<'a> {
    /// The packed block from key `k0` of batch element `b`'s key/value head `g`.
    fn block(&self, n_kv_heads: usize, (b, g, k0): (usize, usize, usize)) -> &'a [u16] {
        let n = (b * n_kv_heads + g) * self.per_head + k0 / BLOCK_K - self.first[b];
        &self.blocks[n * self.len..][..self.len]
    }
}

impl Shared {
    /// Packs every key block the call's queries see (one item per block, on `pool`), and
    /// where each is.
    pub(super) fn pack<'s>(
        &'s mut self,
        call: &Call<'_>,
        scratch: &mut [FlashScratch],
        pool: &mut Pool,
    ) -> Blocks<'s> {
        let shape = call.shape;
        let lda = shape.head_dim.next_multiple_of(STEP);
        let len = (BLOCK_K * lda + padded_rows(call.dv) * BLOCK_K + 1).next_multiple_of(32);
        // Per batch element: its key blocks, and one past its last key.
        let ranges: Vec<(Range<usize>, usize)> = (0..shape.batch)
            .map(|b| {
                let rule = call.visibility.for_item(b, 0, shape.kv_len);
                let key_end = rule.key_end(shape.q_len);
                let end = key_end.div_ceil(BLOCK_K);
                ((rule.key_start(0) / BLOCK_K).min(end)..end, key_end)
            })
            .collect();
        let per_head = ranges.iter().map(|(r, _)| r.len()).max().unwrap_or(0);
        self.first.clear();
        self.first.extend(ranges.iter().map(|(r, _)| r.start));
        grow(
            &mut self.blocks,
            shape.batch * shape.n_kv_heads * per_head * len,
        );
        let n_kv_heads = shape.n_kv_heads;
        let items = self
            .blocks
            .chunks_mut(len)
            .enumerate()
            .filter_map(|(n, out)| {
                let (part, index) = (n / per_head.max(1), n % per_head.max(1));
                let (b, g) = (part / n_kv_heads, part % n_kv_heads);
                let (blocks, key_end) = ranges.get(b)?;
                let block = blocks.start + index;
                (block < blocks.end).then_some((b, g, block * BLOCK_K, *key_end, out))
            });
        parallel::for_each_item(pool, items, scratch, |(b, g, k0, end, out), s| {
            pack_block(call, (b, g, k0, end), lda, out, s);
        });
        Blocks {
            blocks: &self.blocks,
            first: &self.first,
            len,
            per_head,
            lda,
        }
    }
}

/// Packs the block from key `k0` (up to `end`) of batch element `b`'s
/// key/value head `g` into `out` (see [`Shared::blocks`]).
fn pack_block(
    call: &Call<'_>,
    (b, g, k0, end): (usize, usize, usize, usize),
    lda: usize,
    out: &mut [u16],
    s: &mut FlashScratch,
) {
    let (kernels, store, dv) = (call.kernels, &call.ops.store, call.dv);
    let (d, len) = (call.shape.head_dim, BLOCK_K.min(end - k0));
    let at = store.locate(b, g, k0);
    let FlashScratch { widened, amx, .. } = s;
    let k_panel = store.key_panel(kernels, at, &mut widened.keys);
    let values = store.value_rows(kernels, (at, len), k_panel, &mut widened.values);
    let (keys_out, rest) = out.split_at_mut(BLOCK_K * lda);
    let (values_out, flag) = rest.split_at_mut(padded_rows(dv) * BLOCK_K);
    grow(&mut amx.transposed, BLOCK_K * d.max(dv));
    // SAFETY: a checked kernel table; the panel holds d rows of BLOCK_K ≥ len keys,
    // `transposed` len rows of d.
    unsafe { (kernels.transpose)(k_panel, BLOCK_K, d, len, &mut amx.transposed, d, 1.0) };
    round_rows((&amx.transposed, d), (len, d), (keys_out, lda));
    let acc = call.strides.acc;
    // SAFETY: as above; `len` value rows of stride acc ≥ dv, `transposed` dv rows of BLOCK_K.
    unsafe { (kernels.transpose)(values, acc, len, dv, &mut amx.transposed, BLOCK_K, 1.0) };
    let non_finite = round_rows((&amx.transposed, BLOCK_K), (dv, len), (values_out, BLOCK_K));
    flag.fill(0);
    if non_finite {
        flag[0] = 1;
        for value in values_out.iter_mut().filter(|v| **v & 0x7f80 == 0x7f80) {
            *value = 0;
        }
    }
}

/// `rows × cols` of `src` (row stride `lds`) rounded into the rows of `dst` (stride `ldd`),
/// zeros past `cols` and below the last row; whether any rounded value is not finite.
fn round_rows(
    (src, lds): (&[f32], usize),
    (rows, cols): (usize, usize),
    (dst, ldd): (&mut [u16], usize),
) -> bool {
    let mut non_finite = false;
    let (filled, padding) = dst.split_at_mut(rows * ldd);
    for (row, values) in filled.chunks_exact_mut(ldd).zip(src.chunks(lds.max(1))) {
        let (row, tail) = row.split_at_mut(cols);
        // SAFETY: a table with `bf16_tile` is an AVX-512 table.
        non_finite |= unsafe { round_run(row, &values[..cols]) };
        tail.fill(0);
    }
    padding.fill(0);
    non_finite
}

/// The scratch of the AMX path (grown on its first use).
#[derive(Default)]
pub(super) struct AmxWork {
    /// The call's packed blocks (the first thread's only).
    pub shared: Shared,
    /// A block's keys or values, or the set's queries, transposed before rounding; the
    /// accumulator transposed before the outputs.
    transposed: Vec<f32>,
    /// The set's queries times the scale, rounded, as `B` of `Sᵀ`: `⌈R / 32⌉` panels of the
    /// head width's steps.
    queries: Vec<u16>,
    /// The block's probabilities as `B` of `accᵀ`: `⌈R / 32⌉` panels of [`KEY_STEPS`] steps.
    probabilities: Vec<u16>,
    /// `padded_rows(dv) × BLOCK_Q`: the accumulator, value column `c` of row `r` at
    /// `c · BLOCK_Q + r`.
    acc_t: Vec<f32>,
    /// The scratch of the rows' path (`rows.rs`).
    rows: rows::RowWork,
}

/// The rows of one pass: every query row of `queries` in every head of `heads` (head-major),
/// at most [`BLOCK_Q`]; the heads share one key/value head.
#[derive(Clone)]
pub(super) struct RowSet {
    pub heads: Range<usize>,
    pub queries: Range<usize>,
}

impl RowSet {
    fn len(&self) -> usize {
        self.heads.len() * self.queries.len()
    }

    /// Row `r`'s head and query row.
    fn row(&self, r: usize) -> (usize, usize) {
        let n = self.queries.len();
        (self.heads.start + r / n, self.queries.start + r % n)
    }
}

impl QueryBlock<'_> {
    /// The rows of `set` by the steps of the module; head `h`'s row `i` goes to
    /// `out[i · out_stride + (h - first) · dv ..][..dv]`.
    pub(super) fn attend_amx(
        &self,
        set: RowSet,
        (first, out): (usize, &mut [f32]),
        (tile, blocks): (Bf16TileFn, Blocks<'_>),
        scratch: &mut FlashScratch,
    ) {
        debug_assert!(set.heads.len() == 1 && set.queries == (0..self.rows));
        self.start_amx(&set, scratch);
        let (key_blocks, key_end) = self.key_blocks(set.queries.clone());
        let kv_head = self.head_operands(set.heads.start, 0).kv_head;
        for k0 in key_blocks {
            let block = blocks.block(self.shape.n_kv_heads, (self.b, kv_head, k0));
            let keys = KeyBlock {
                k0,
                len: BLOCK_K.min(key_end - k0),
                k_panel: &[],
                values: &[],
            };
            let FlashScratch { work, amx, .. } = &mut *scratch;
            self.amx_scores(&set, (&keys, block), (tile, &blocks), work, amx);
            self.amx_softmax(set.len(), keys.len, work, amx);
            self.amx_accumulate(&set, (&keys, block), (tile, &blocks), work, amx);
            if block[block.len() - 1] != 0 {
                self.add_non_finite(&set, &keys, key_end, scratch);
            }
        }
        self.write_amx(&set, (first, out), &scratch.work, &mut scratch.amx);
    }

    /// The set's queries rounded into panels, the accumulator zero, the running max and sum
    /// at each row's head's start.
    fn start_amx(&self, set: &RowSet, FlashScratch { work, amx, .. }: &mut FlashScratch) {
        let (d, dv, rows) = (self.shape.head_dim, self.dv, set.len());
        let steps = d.div_ceil(STEP);
        grow(&mut amx.queries, BLOCK_Q / TILE * steps * B_STEP);
        grow(&mut amx.probabilities, BLOCK_Q / TILE * KEY_STEPS * B_STEP);
        grow(&mut amx.acc_t, padded_rows(dv) * BLOCK_Q);
        let head = self.head_operands(set.heads.start, 0);
        let (queries, stride) = (head.queries, head.q_row);
        grow(&mut amx.transposed, d * BLOCK_Q);
        let (scale, q_t) = (self.ops.scale, &mut amx.transposed);
        // SAFETY: a checked kernel table; `rows` query rows of `d` at `stride` (the layout's),
        // `transposed` d rows of BLOCK_Q ≥ rows.
        unsafe { (self.kernels.transpose)(queries, stride, rows, d, q_t, BLOCK_Q, scale) };
        let panels = (rows.div_ceil(TILE), &mut amx.queries);
        // SAFETY: a table with `bf16_tile` is an AVX-512 table.
        unsafe { pair_panels((q_t, BLOCK_Q), (d, rows), (steps, panels.0), panels.1) };
        amx.acc_t[..padded_rows(dv) * BLOCK_Q].fill(0.0);
        for r in 0..rows {
            let (h, _) = set.row(r);
            (work.row_max[r], work.row_sum[r]) = self.ops.terms.head(h).start();
        }
    }

    /// Step 1 into the key-major `scores_t` of the `f32` path.
    fn amx_scores(
        &self,
        set: &RowSet,
        (keys, block): (&KeyBlock<'_>, &[u16]),
        (tile, blocks): (Bf16TileFn, &Blocks<'_>),
        work: &mut Work,
        amx: &mut AmxWork,
    ) {
        let (rows, q) = (set.len(), self.strides.q);
        let steps = self.shape.head_dim.div_ceil(STEP);
        let panels = (&amx.queries[..], rows.div_ceil(TILE), steps * B_STEP);
        // SAFETY: a table has `bf16_tile` only where AMX is usable; the block holds BLOCK_K ≥
        // padded_rows(len) key rows of lda = steps · 32, the query panels `steps · B_STEP`
        // values each, and the scores round_up(BLOCK_K, mr) ≥ padded_rows(len) key rows of
        // q ≥ BLOCK_Q ≥ 32 · panels (plus overhang).
        unsafe {
            tile(
                (block, blocks.lda),
                keys.len,
                panels,
                steps,
                (&mut work.scores_t, q),
                false,
            )
        };
        // The tile path's columns: query `r` is row `r` of the item, all of one head.
        let terms = self.ops.terms.head(set.heads.start);
        if terms.changes_scores() {
            self.score_terms(keys, terms, work);
        }
        self.mask_block(keys, work);
    }

    /// Step 2: the online-softmax step over the block's `len` keys, then the accumulator's
    /// columns rescaled.
    fn amx_softmax(&self, rows: usize, len: usize, work: &mut Work, amx: &mut AmxWork) {
        // SAFETY: checked kernel table; the score rows hold `rows` values at stride q.
        unsafe {
            (self.kernels.softmax_block)(
                &mut work.scores_t,
                self.strides.q,
                len,
                &mut work.row_max[..rows],
                &mut work.row_sum[..rows],
                &mut work.rescale[..rows],
            )
        };
        for column in amx.acc_t.chunks_exact_mut(BLOCK_Q).take(self.dv) {
            for (a, &factor) in column.iter_mut().zip(&work.rescale[..rows]) {
                *a *= factor;
            }
        }
    }

    /// Step 3: `accᵀ += Vᵀ · Pᵀ` over the block's keys.
    fn amx_accumulate(
        &self,
        set: &RowSet,
        (keys, block): (&KeyBlock<'_>, &[u16]),
        (tile, blocks): (Bf16TileFn, &Blocks<'_>),
        work: &Work,
        amx: &mut AmxWork,
    ) {
        let (rows, dv, q) = (set.len(), self.dv, self.strides.q);
        let panels = rows.div_ceil(TILE);
        let p = &mut amx.probabilities;
        // SAFETY: a table with `bf16_tile` is an AVX-512 table.
        unsafe {
            pair_panels(
                (&work.scores_t, q),
                (keys.len, rows),
                (KEY_STEPS, panels),
                p,
            )
        };
        let values = &block[BLOCK_K * blocks.lda..];
        let p = (&p[..], panels, KEY_STEPS * B_STEP);
        // SAFETY: as in `amx_scores`: the block's values are padded_rows(dv) rows of BLOCK_K =
        // KEY_STEPS · 32, the panels KEY_STEPS · B_STEP values each, the accumulator
        // padded_rows(dv) rows of BLOCK_Q ≥ 32 · panels.
        unsafe {
            tile(
                (values, BLOCK_K),
                dv,
                p,
                keys.len.div_ceil(STEP),
                (&mut amx.acc_t, BLOCK_Q),
                true,
            )
        };
    }

    /// After step 3 on a block with non-finite rounded values: `p · v` for each of them, for
    /// the rows that see its key.
    fn add_non_finite(
        &self,
        set: &RowSet,
        keys: &KeyBlock<'_>,
        key_end: usize,
        s: &mut FlashScratch,
    ) {
        let head = self.head_operands(set.heads.start, 0);
        let FlashScratch { work, widened, amx } = s;
        let values = self.key_block(&head, (keys.k0, key_end), widened).values;
        let (q, acc_t) = (self.strides.q, &mut amx.acc_t);
        let values = (values, self.strides.acc, keys.len);
        self.for_each_non_finite(set, keys.k0, values, |j, c, r, v| {
            let p = bf16_to_f32(bf16_nearest(work.scores_t[j * q + r]));
            acc_t[c * BLOCK_Q + r] += p * v;
        });
    }

    /// `add(j, c, r, v)` for each value `v` of key `j`, column `c` (`values`: `len` rows of
    /// stride `ld`) not finite when rounded, and each row `r` of `set` that sees the key, in
    /// that order.
    fn for_each_non_finite(
        &self,
        set: &RowSet,
        k0: usize,
        (values, ld, len): (&[f32], usize, usize),
        mut add: impl FnMut(usize, usize, usize, f32),
    ) {
        for j in 0..len {
            for (c, &x) in values[j * ld..][..self.dv].iter().enumerate() {
                let v = bf16_to_f32(bf16_nearest(x));
                if v.is_finite() {
                    continue;
                }
                for r in (0..set.len()).filter(|&r| self.rule.sees(set.row(r).1, k0 + j)) {
                    add(j, c, r, v);
                }
            }
        }
    }

    /// The accumulator transposed back, then [`QueryBlock::write_set`].
    fn write_amx(
        &self,
        set: &RowSet,
        (first, out): (usize, &mut [f32]),
        work: &Work,
        amx: &mut AmxWork,
    ) {
        let (dv, rows) = (self.dv, set.len());
        grow(&mut amx.transposed, rows * dv);
        let acc = &mut amx.transposed;
        // SAFETY: a checked kernel table; the accumulator holds dv rows of BLOCK_Q ≥ rows,
        // `transposed` rows × dv values.
        unsafe { (self.kernels.transpose)(&amx.acc_t, BLOCK_Q, dv, rows, acc, dv, 1.0) };
        self.write_set(set, (first, out), (acc, dv), &work.row_sum);
    }

    /// Each row's `acc / sum` (zeros for a row that saw no key; `-0` as `+0`, NaN as the
    /// canonical NaN), row `r` of `acc` at `r · ld`, into its place in `out`.
    fn write_set(
        &self,
        set: &RowSet,
        (first, out): (usize, &mut [f32]),
        (acc, ld): (&[f32], usize),
        sums: &[f32],
    ) {
        let dv = self.dv;
        for r in 0..set.len() {
            let (h, i) = set.row(r);
            let sum = sums[r];
            let out_row = &mut out[i * self.out_stride + (h - first) * dv..][..dv];
            for (o, &a) in out_row.iter_mut().zip(&acc[r * ld..][..dv]) {
                let value = a / sum + 0.0;
                let value = if value.is_nan() { f32::NAN } else { value };
                *o = if sum == 0.0 { 0.0 } else { value };
            }
        }
    }
}
