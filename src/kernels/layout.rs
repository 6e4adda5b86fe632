//! The shapes the key/value store and the attention agree on: the key block, and where the
//! heads of an operand live in its buffer.

/// Keys per block: of the online softmax, and of the store's `Kᵀ` panels.
pub(crate) const BLOCK_K: usize = 96;

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
