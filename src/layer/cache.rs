//! The key/value cache for incremental decoding.

use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::store::kv::KvStore;
use crate::kernels::KvFormat;

/// Keys and values of the tokens seen so far, per batch element and key/value head, for
/// feeding sequences a step at a time through [`Layer::decode_into`].
///
/// Made by [`Layer::new_cache`] (or [`MlaLayer::new_cache`](crate::MlaLayer::new_cache): a
/// latent cache, which only its kind of layer reads) with a fixed capacity, its memory
/// reserved up front; appending
/// past it is an error that leaves the cache as it was. It is the store a forward pass
/// fills too: keys already split into heads and transposed for the kernels, values split into
/// heads with rows padded for the microtiles, so a decoding step re-splits nothing and
/// allocates nothing. Its `Debug` shows the shape and fill, not the values.
///
/// The cache of a layer with a sliding window or chunked attention is *rolling*: it keeps a
/// ring of whole 96-key blocks, enough for every key a query can still reach (the window, or
/// the chunk) plus one call's new tokens, and token
/// `t` overwrites the slot of token `t - slots`. Positions ([`KvCache::lengths`]) count every
/// token seen, so the cache decodes without end in constant memory (up to position
/// `isize::MAX`, past which a call is [`ShapeError::Overflow`]); [`KvCache::capacity`] is then
/// the most tokens one call may add.
///
/// [`Layer::decode_into`]: crate::Layer::decode_into
/// [`Layer::new_cache`]: crate::Layer::new_cache
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
            .field("capacity", &self.capacity())
            .field("slots", &store.capacity)
            .field("window", &store.rolling.map(|r| r.window))
            .field("lengths", &store.lengths())
            .finish_non_exhaustive()
    }
}

impl KvCache {
    /// Tokens seen so far (positions: a rolling cache keeps only the recent ones): the most any
    /// sequence (batch element) holds. Sequences hold the
    /// same number unless a call gave [`AttendOptions::token_lengths`]; see
    /// [`KvCache::lengths`].
    ///
    /// [`AttendOptions::token_lengths`]: crate::AttendOptions::token_lengths
    pub fn len(&self) -> usize {
        self.store.longest()
    }

    /// The bytes of its keys and values, reserved when it was made and constant after that
    /// (keys in panels of 96 per head; values in rows; in [`KvFormat::Q8_0`] with a 4-byte
    /// scale per 32 values). An [`MlaLayer`](crate::MlaLayer)'s cache holds its latent rows
    /// once, as keys, with no value rows: `p + r` elements per token.
    ///
    /// ```
    /// use mha::{Matrix, Mha, MhaParams};
    /// let params = MhaParams::new(Matrix::<8, 8>::identity(), Matrix::identity(), Matrix::identity(), Matrix::identity());
    /// let layer = Mha::new(&params, 2)?;
    /// let cache = layer.new_cache(1, 100)?;
    /// // 2 heads of 4: at least 100 keys and 100 values of 4 floats per head.
    /// assert!(cache.bytes() >= 2 * 2 * 100 * 4 * 4);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn bytes(&self) -> usize {
        self.store.bytes()
    }

    /// How it keeps its keys (its layer's [`LayerBuilder::key_format`]).
    ///
    /// [`LayerBuilder::key_format`]: crate::LayerBuilder::key_format
    pub fn key_format(&self) -> KvFormat {
        self.store.formats().keys
    }

    /// How it keeps its values (its layer's [`LayerBuilder::value_format`]).
    ///
    /// [`LayerBuilder::value_format`]: crate::LayerBuilder::value_format
    pub fn value_format(&self) -> KvFormat {
        self.store.formats().values
    }

    /// Tokens cached so far, per sequence (batch element).
    ///
    /// ```
    /// use mha::{AttendOptions, Matrix, Mha, MhaParams, Tensor};
    /// let params = MhaParams::new(Matrix::<4, 4>::identity(), Matrix::identity(), Matrix::identity(), Matrix::identity());
    /// let mut layer = Mha::new(&params, 2)?;
    /// let mut cache = layer.new_cache(2, 8)?;
    /// // Two prompts of 3 and 1 tokens, right-padded to T = 3, in one call.
    /// let prompts = Tensor::<2, 3, 4>::from_fn(|b, t, i| (b + t + i) as f32 * 0.1);
    /// let options = AttendOptions { token_lengths: Some(&[3, 1]), ..AttendOptions::default() };
    /// layer.decode_into(&prompts, &mut cache, options, &mut Tensor::<2, 3, 4>::zeros())?;
    /// assert_eq!(cache.lengths(), [3, 1]);
    /// // Then one token each: each continues from its own position.
    /// let next = Tensor::<2, 1, 4>::from_fn(|b, _, i| (b + i) as f32 * 0.1);
    /// layer.decode_into(&next, &mut cache, AttendOptions::default(), &mut Tensor::<2, 1, 4>::zeros())?;
    /// assert_eq!(cache.lengths(), [4, 2]);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn lengths(&self) -> &[usize] {
        self.store.lengths()
    }

    /// Where each sequence's next token goes when a call gives no positions: its length, or,
    /// after a call that placed its tokens at explicit [`AttendOptions::positions`], one past
    /// the last of them.
    ///
    /// ```
    /// use mha::{AttendOptions, Matrix, Mha, MhaParams, Tensor};
    /// let params = MhaParams::new(Matrix::<4, 4>::identity(), Matrix::identity(), Matrix::identity(), Matrix::identity());
    /// let mut layer = Mha::new(&params, 2)?;
    /// let mut cache = layer.new_cache(1, 8)?;
    /// let prompt = Tensor::<1, 3, 4>::from_fn(|_, t, i| (t + i) as f32 * 0.1);
    /// let options = AttendOptions { positions: Some(&[1000, 1001, 1002]), ..AttendOptions::default() };
    /// layer.decode_into(&prompt, &mut cache, options, &mut Tensor::<1, 3, 4>::zeros())?;
    /// assert_eq!((cache.lengths(), cache.positions()), (&[3][..], vec![1003]));
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// [`AttendOptions::positions`]: crate::AttendOptions::positions
    pub fn positions(&self) -> Vec<usize> {
        self.store.next_positions().collect()
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most tokens the cache holds per batch element; for a rolling cache (a layer with a
    /// sliding window or chunked attention), the most tokens one call may add per batch element, however many it
    /// has seen: its memory is fixed at [`Layer::new_cache`].
    ///
    /// ```
    /// use mha::{Matrix, Mha, MhaParams};
    /// let params = MhaParams::new(Matrix::<4, 4>::identity(), Matrix::identity(), Matrix::identity(), Matrix::identity());
    /// let full = Mha::new(&params, 2)?.new_cache(1, 1000)?;
    /// assert_eq!(full.capacity(), 1000); // 1000 tokens in all
    /// let windowed = Mha::builder(&params, 2).sliding_window(64).build()?;
    /// assert_eq!(windowed.new_cache(1, 16)?.capacity(), 16); // 16 tokens per call, for ever
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// [`Layer::new_cache`]: crate::Layer::new_cache
    pub fn capacity(&self) -> usize {
        self.store.rolling.map_or(self.store.capacity, |r| r.chunk)
    }

    /// The number of sequences it holds.
    pub fn batch(&self) -> usize {
        self.store.batch
    }

    /// Forgets every cached token (keeps the memory).
    pub fn clear(&mut self) {
        self.store.clear(None);
    }

    /// Forgets the tokens of one sequence (batch element), so that a new sequence can start in
    /// its place while the others go on.
    ///
    /// # Errors
    /// [`ShapeError::SequenceIndex`] when `sequence` is not below [`KvCache::batch`].
    pub fn clear_sequence(&mut self, sequence: usize) -> Result<(), ShapeError> {
        if sequence >= self.store.batch {
            return Err(ShapeError::SequenceIndex {
                sequence,
                batch: self.store.batch,
            });
        }
        self.store.clear(Some(sequence));
        Ok(())
    }
}
