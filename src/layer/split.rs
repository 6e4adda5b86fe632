//! Attention over keys and values already split into heads, `(B, H, T, d)`, with a boolean
//! mask shared by the batch: the run-time core of the front's `attention()`. It runs the
//! attention step of a layer's pass on the calling thread, with `f32` keys and values.

use alloc::vec;
use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::attention::flash::{score_scale, AttentionShape, FlashScratch, Operands};
use crate::kernels::attention::mask::{AttnMask, Masks, Visibility};
use crate::kernels::attention::terms::ScoreTerms;
use crate::kernels::store::kv::{KvStore, NewTokens, StoreShape};
use crate::kernels::store::layout::HeadLayout;
use crate::kernels::store::layout::{KvFormats, ValueLayout};
use crate::kernels::store::Store;
use crate::kernels::threads::parallel::Pool;
use crate::kernels::{Isa, Kernels};
use crate::layer::pass::attend;

/// The shape of split heads: `batch` elements of `n_heads` heads of `len` rows of
/// `head_dim` values, `(B, H, T, d)`, whose element count fits in memory (the caller's
/// buffers hold it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SplitHeads {
    pub batch: usize,
    pub len: usize,
    pub n_heads: usize,
    pub head_dim: usize,
}

/// Scaled dot-product attention (`1/√d`) of the split heads `[q, k, v]`, each `(B, H, T, d)`,
/// key `j` seen by query `i` only where `mask[i · T + j]` (a `(T, T)` matrix the caller
/// checked): the merged rows `(B, T, H · d)`.
///
/// # Errors
/// [`ShapeError::UnsupportedIsa`] (never for the detected table), [`ShapeError::Overflow`] or
/// [`ShapeError::AllocationFailed`] for the store.
pub(crate) fn attend_split_heads(
    shape: SplitHeads,
    [q, k, v]: [&[f32]; 3],
    mask: &[bool],
) -> Result<Vec<f32>, ShapeError> {
    let SplitHeads {
        batch,
        len,
        n_heads,
        head_dim: d,
    } = shape;
    let kernels = Isa::detect().kernels()?;
    // The heads are (B, H, T, d): appended to a store like a layer's projected keys.
    let layout = HeadLayout {
        batch: n_heads * len * d,
        head: len * d,
        row: d,
    };
    // One thread (one scratch below): a pool that never starts a worker.
    let mut pool = Pool::default();
    let store = store_of(kernels, shape, [k, v], layout, &mut pool)?;
    let attention = AttentionShape {
        batch,
        n_heads,
        n_kv_heads: n_heads,
        q_len: len,
        kv_len: len,
        head_dim: d,
    };
    let operands = Operands {
        q,
        q_layout: layout,
        q_starts: None,
        scale: score_scale(d),
        store: store.view(),
        terms: &ScoreTerms::default(),
        bf16: false,
    };
    let visibility = Visibility {
        masks: Masks {
            mask: Some(AttnMask::Bool(mask)),
            ..Masks::default()
        },
        ..Visibility::default()
    };
    let mut merged = vec![0.0; q.len()];
    let mut scratch = [FlashScratch::default()];
    let (out, scratch, pool) = (&mut merged, &mut scratch, &mut pool);
    attend(
        kernels, attention, operands, visibility, None, out, scratch, pool,
    );
    Ok(merged)
}

/// A store holding the keys and values of `[k, v]`, laid out by `layout`, on one thread.
fn store_of(
    kernels: &'static Kernels,
    shape: SplitHeads,
    [k, v]: [&[f32]; 2],
    layout: HeadLayout,
    pool: &mut Pool,
) -> Result<KvStore, ShapeError> {
    let store_shape = StoreShape {
        batch: shape.batch,
        n_kv_heads: shape.n_heads,
        head_dim: layout.row,
        capacity: shape.len,
        rolling: None,
        formats: KvFormats::default(),
        values: ValueLayout::Rows { dim: layout.row },
    };
    let mut store = KvStore::new(store_shape)?;
    let new = NewTokens {
        rows: shape.len,
        lengths: None,
        starts: None,
    };
    store.append(kernels, Some(k), v, [layout; 2], new, 1, pool)?;
    Ok(store)
}
