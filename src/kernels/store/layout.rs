//! The shapes the key/value store and the attention agree on: the key block, where a key's
//! features live in its head's panels, and where the heads of an operand live in its buffer.

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
