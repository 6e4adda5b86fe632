//! The shapes the key/value store and the attention agree on: the key block, where a key's
//! features live in its head's panels, where the heads of an operand live in its buffer, and
//! what one block of a paged store holds ([`BlockLayout`]).

use crate::kernels::{Kernels, KvFormat};

/// Keys per block: of the online softmax, and of the store's `Kᵀ` panels.
pub(crate) const BLOCK_K: usize = 96;

/// Where feature `p` of key `t` lives in one head's key panels: `⌈capacity / BLOCK_K⌉` panels
/// of [`BLOCK_K`] keys, each `d × BLOCK_K` row-major.
pub(crate) fn key_panel_index(d: usize, p: usize, t: usize) -> usize {
    (t / BLOCK_K) * d * BLOCK_K + p * BLOCK_K + t % BLOCK_K
}

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

/// What one block of a paged store holds, the one description of its layout: for one layer,
/// `n_kv_heads` heads of [`BLOCK_K`] tokens on each side, keys as one `head_dim × BLOCK_K`
/// `Kᵀ` panel per head and values as `BLOCK_K` rows of `head_dim` per head, each side in its
/// [`KvFormat`](crate::KvFormat) (`q8_0` scales beside, as `side.rs` places them). Block `p`
/// holds the parts `p·Hkv ..= p·Hkv + Hkv - 1` of each side, so its heads are contiguous and
/// a block is copied whole.
///
/// MLA's latent cache (issue 34) is one more such layout, not another store: one shared head
/// (`n_kv_heads = 1`) whose keys are the `kv_lora_rank + rope_dim` (576) wide latents and
/// whose values are their first `kv_lora_rank` (512) features; for it this type gains a value
/// width (and a value side that may read the key panel's first rows instead of rows of its
/// own), and the block tables, the pool and the walk stay as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockLayout {
    /// Key/value heads per block.
    pub n_kv_heads: usize,
    /// Width of one head `d` (keys and values).
    pub head_dim: usize,
    /// How keys and values are kept.
    pub formats: KvFormats,
    /// The layer's sliding window: a sequence releases the blocks no query can reach again.
    pub window: Option<usize>,
}

/// The formats of a store's keys and of its values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KvFormats {
    pub keys: KvFormat,
    pub values: KvFormat,
}

/// The row stride of a value panel for head width `d`: `d` rounded up to whole `nr`-wide
/// microtile panels, so a tile never reads past a row.
pub(crate) fn value_stride(kernels: &Kernels, d: usize) -> usize {
    d.div_ceil(kernels.nr) * kernels.nr
}
