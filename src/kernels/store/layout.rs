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
/// `n_kv_heads` heads of [`BLOCK_K`] tokens, keys as one `head_dim × BLOCK_K` `Kᵀ` panel per
/// head and values as `BLOCK_K` rows of `dv` per head ([`ValueLayout::Rows`]), or no value rows at all when the
/// values are the keys' own columns ([`ValueLayout::InKeys`]: MLA's latent cache), each side
/// in its [`KvFormat`](crate::KvFormat) (`q8_0` scales beside, as `side.rs` places them).
/// Block `p` holds the parts `p·Hkv ..= p·Hkv + Hkv - 1` of each side, so its heads are
/// contiguous and a block is copied whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockLayout {
    /// Key/value heads per block.
    pub n_kv_heads: usize,
    /// Width of one key head `d` (a value head's is in [`values`](Self::values)).
    pub head_dim: usize,
    /// How keys and values are kept.
    pub formats: KvFormats,
    /// The layer's sliding window: a sequence releases the blocks no query can reach again.
    pub window: Option<usize>,
    /// Where the values are.
    pub values: ValueLayout,
}

/// Where a store keeps its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ValueLayout {
    /// A value side of its own: per head, one row of `dim` values per token (`dv`: the key
    /// head width `d` unless the layer's value heads are narrower or wider).
    Rows { dim: usize },
    /// No value side: token `t`'s values are features `from .. head_dim` of its key (stored
    /// once, in the keys' format). MLA's latent cache: the key is `[k_rope (p) | c (r)]`, the
    /// values `c`, `from = p`. The attention reads a block's values out of its key panel
    /// (transposed into rows: `view.rs`).
    InKeys { from: usize },
}

/// An empty store's: rows of no values.
impl Default for ValueLayout {
    fn default() -> Self {
        ValueLayout::Rows { dim: 0 }
    }
}

impl ValueLayout {
    /// The width of one value head of a store whose key heads are `head_dim` wide.
    pub(crate) fn value_dim(self, head_dim: usize) -> usize {
        match self {
            ValueLayout::Rows { dim } => dim,
            ValueLayout::InKeys { from } => head_dim.saturating_sub(from),
        }
    }

    /// Whether the values are rows of their own.
    pub(crate) fn is_rows(self) -> bool {
        matches!(self, ValueLayout::Rows { .. })
    }

    /// The width of one value head's stored rows: [`value_dim`](Self::value_dim), or 0 when
    /// the values are in the keys.
    pub(crate) fn stored_dim(self) -> usize {
        match self {
            ValueLayout::Rows { dim } => dim,
            ValueLayout::InKeys { .. } => 0,
        }
    }
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
