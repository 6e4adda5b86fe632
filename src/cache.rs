//! The key/value cache for incremental decoding.

use alloc::vec;
use alloc::vec::Vec;

/// Keys and values of the tokens seen so far, per batch element and key/value head, for
/// feeding a sequence one token (or one chunk) at a time through [`Mha::decode`].
///
/// Made by [`Mha::new_cache`] with a fixed capacity; appending past it is an error that leaves
/// the cache as it was. Keys are stored already split into heads and transposed for the
/// kernels (per head, `d × capacity` in panels of the attention's key block), values split
/// into heads (`(B, Hkv, capacity, d)`, rows zero-padded for the kernels), so a decode step
/// re-splits nothing and allocates nothing. Its `Debug` shows the shape and fill, not the
/// values.
///
/// [`Mha::decode`]: crate::Mha::decode
/// [`Mha::new_cache`]: crate::Mha::new_cache
#[derive(Clone)]
pub struct KvCache<const B: usize> {
    pub(crate) n_kv_heads: usize,
    pub(crate) head_dim: usize,
    /// Floats per cached value row: `head_dim` zero-padded for the microtiles.
    pub(crate) value_stride: usize,
    pub(crate) capacity: usize,
    pub(crate) len: usize,
    pub(crate) keys_t: Vec<f32>,
    pub(crate) values: Vec<f32>,
}

/// The shape and fill of the cache, not its values.
impl<const B: usize> core::fmt::Debug for KvCache<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KvCache")
            .field("batch", &B)
            .field("n_kv_heads", &self.n_kv_heads)
            .field("head_dim", &self.head_dim)
            .field("capacity", &self.capacity)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<const B: usize> KvCache<B> {
    pub(crate) fn new(
        n_kv_heads: usize,
        head_dim: usize,
        value_stride: usize,
        capacity: usize,
    ) -> Self {
        Self {
            n_kv_heads,
            head_dim,
            value_stride,
            capacity,
            len: 0,
            keys_t: vec![
                0.0;
                B * n_kv_heads * crate::kernels::flash::key_panels_len(head_dim, capacity)
            ],
            values: vec![0.0; B * n_kv_heads * capacity * value_stride],
        }
    }

    /// Tokens cached so far (per batch element).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most tokens the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets every cached token (keeps the memory).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}
