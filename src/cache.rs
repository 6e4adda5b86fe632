//! The key/value cache for incremental decoding.

use crate::kernels::kv::KvStore;

/// Keys and values of the tokens seen so far, per batch element and key/value head, for
/// feeding sequences a step at a time through [`Mha::decode_into`].
///
/// Made by [`Mha::new_cache`] with a fixed capacity, its memory reserved up front; appending
/// past it is an error that leaves the cache as it was. It is the store a forward pass
/// fills too: keys already split into heads and transposed for the kernels, values split into
/// heads with rows padded for the microtiles, so a decoding step re-splits nothing and
/// allocates nothing. Its `Debug` shows the shape and fill, not the values.
///
/// [`Mha::decode_into`]: crate::Mha::decode_into
/// [`Mha::new_cache`]: crate::Mha::new_cache
#[derive(Clone)]
pub struct KvCache {
    pub(crate) store: KvStore,
}

/// The shape and fill of the cache, not its values.
impl core::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let store = &self.store;
        f.debug_struct("KvCache")
            .field("batch", &store.batch)
            .field("n_kv_heads", &store.n_kv_heads)
            .field("head_dim", &store.head_dim)
            .field("capacity", &store.capacity)
            .field("len", &store.len)
            .finish_non_exhaustive()
    }
}

impl KvCache {
    /// Tokens cached so far (per batch element).
    pub fn len(&self) -> usize {
        self.store.len
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.store.len == 0
    }

    /// The most tokens the cache holds per batch element.
    pub fn capacity(&self) -> usize {
        self.store.capacity
    }

    /// The number of sequences it holds.
    pub fn batch(&self) -> usize {
        self.store.batch
    }

    /// Forgets every cached token (keeps the memory).
    pub fn clear(&mut self) {
        self.store.len = 0;
    }
}
