//! The paged KV cache: [`PagedCache`], a pool of key blocks shared by any number of sequences
//! through block tables, and [`Layer::decode_paged`], a decoding step of several of them
//! (an MLA layer's: [`MlaLayer::decode_paged`](crate::MlaLayer::decode_paged)).

use crate::error::ShapeError;
use crate::kernels::store::layout::{BlockLayout, BLOCK_K};
use crate::kernels::store::paged::PagedStore;
use crate::kernels::KvFormat;
use crate::layer::options::{AttendOptions, Masking};
use crate::layer::pass::{value_rows, Call};
use crate::layer::tokens::{Output, Tokens};
use crate::layer::Layer;

/// Keys and values of any number of sequences in a pool of blocks of [`PagedCache::BLOCK`]
/// tokens, for decoding them through [`Layer::decode_paged`] in batches of any composition.
///
/// Made by [`Layer::new_paged_cache`] with a fixed number of blocks, its memory reserved up
/// front; each block holds one layer's keys and values (all key/value heads) of
/// [`PagedCache::BLOCK`] tokens in the layer's formats, laid out as a [`KvCache`]'s key
/// blocks, so a sequence decodes through it to the bits it would have through a `KvCache`.
/// [`MlaLayer::new_paged_cache`](crate::MlaLayer::new_paged_cache) makes one whose blocks hold
/// latent rows, once each (the values are read out of them), for
/// [`MlaLayer::decode_paged`](crate::MlaLayer::decode_paged); a cache serves only the kind of
/// layer that made it.
/// A sequence ([`PagedCache::add_sequence`]) takes blocks as it grows and keeps its position
/// (its length: token `t` is at position `t`); a call that needs more blocks than are free
/// is [`ShapeError::PoolFull`] and changes nothing. With a sliding window or chunked
/// attention, a sequence gives back the blocks no query of it can reach again, so it decodes without end in bounded memory.
/// [`PagedCache::fork`] shares a sequence's blocks with a new one (a shared partial block is
/// copied when one of them next appends to it), [`PagedCache::truncate`] rolls one back,
/// [`PagedCache::remove_sequence`] frees its blocks. Its `Debug` shows the shape and fill.
///
/// One cache serves one layer; a model keeps one per layer and adds, forks, truncates and
/// removes the same sequences in each.
///
/// ```
/// use mha::{AttendOptions, Matrix, Mha, MhaParams, Tensor};
/// let w = Matrix::<4, 4>::from_fn(|r, c| if r == c { 0.5 } else { 0.1 });
/// let mut layer = Mha::new(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)?.into_layer();
/// let mut cache = layer.new_paged_cache(4)?;
/// let (a, b) = (cache.add_sequence()?, cache.add_sequence()?);
/// // Both sequences prefill 3 tokens in one call, then only `b` decodes one more.
/// let x = Tensor::<2, 3, 4>::from_fn(|b, t, i| (b + t + i) as f32 * 0.1);
/// let mut y = Tensor::<2, 3, 4>::zeros();
/// layer.decode_paged(&x, &mut cache, &[a, b], AttendOptions::default(), &mut y)?;
/// let next = Tensor::<1, 1, 4>::from_fn(|_, _, i| i as f32 * 0.1);
/// layer.decode_paged(&next, &mut cache, &[b], AttendOptions::default(), &mut Tensor::<1, 1, 4>::zeros())?;
/// assert_eq!((cache.len(a)?, cache.len(b)?), (3, 4));
/// assert_eq!(cache.free_blocks(), 2);
/// # Ok::<(), mha::ShapeError>(())
/// ```
///
/// [`KvCache`]: crate::KvCache
#[derive(Clone)]
pub struct PagedCache {
    pub(crate) store: PagedStore,
}

/// The shape and fill of the cache, not its values.
impl core::fmt::Debug for PagedCache {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let layout = self.store.layout;
        f.debug_struct("PagedCache")
            .field("n_kv_heads", &layout.n_kv_heads)
            .field("head_dim", &layout.head_dim)
            .field("window", &layout.window)
            .field("blocks", &self.store.blocks())
            .field("free_blocks", &self.store.free_blocks())
            .finish_non_exhaustive()
    }
}

impl PagedCache {
    /// Tokens per block.
    pub const BLOCK: usize = BLOCK_K;

    /// A new empty sequence; its id names it in calls (the lowest id no live sequence has).
    ///
    /// # Errors
    /// [`ShapeError::AllocationFailed`] when its entry cannot be had.
    pub fn add_sequence(&mut self) -> Result<usize, ShapeError> {
        self.store.add()
    }

    /// A new sequence holding the tokens of sequence `id`, sharing its blocks (no block is
    /// copied until one of the two appends to a shared partial block); it decodes as a
    /// sequence prefilled with the same tokens would.
    ///
    /// ```
    /// use mha::{AttendOptions, Matrix, Mha, MhaParams, Tensor};
    /// let w = Matrix::<4, 4>::from_fn(|r, c| if r == c { 0.5 } else { 0.1 });
    /// let mut layer = Mha::new(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)?.into_layer();
    /// let mut cache = layer.new_paged_cache(3)?;
    /// let prompt = cache.add_sequence()?;
    /// let x = Tensor::<1, 5, 4>::from_fn(|_, t, i| (t + i) as f32 * 0.1);
    /// layer.decode_paged(&x, &mut cache, &[prompt], AttendOptions::default(), &mut Tensor::<1, 5, 4>::zeros())?;
    /// let fork = cache.fork(prompt)?;
    /// assert_eq!((cache.len(fork)?, cache.free_blocks()), (5, 2)); // one block, shared
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not a live sequence,
    /// [`ShapeError::AllocationFailed`] when the new entry cannot be had.
    pub fn fork(&mut self, id: usize) -> Result<usize, ShapeError> {
        self.store.fork(id)
    }

    /// Keeps the first `length` tokens of sequence `id` (rolling back the rest, e.g. a
    /// speculative decoder's rejected tokens), freeing the blocks past them.
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not a live sequence, [`ShapeError::Truncate`]
    /// when it holds fewer tokens, or (with a sliding window) has given back blocks the next
    /// query after `length` tokens would see.
    pub fn truncate(&mut self, id: usize, length: usize) -> Result<(), ShapeError> {
        self.store.truncate(id, length)
    }

    /// Forgets sequence `id`, freeing its blocks; its id may name the next sequence added.
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not a live sequence.
    pub fn remove_sequence(&mut self, id: usize) -> Result<(), ShapeError> {
        self.store.remove(id)
    }

    /// Tokens sequence `id` has seen (its next token's position).
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not a live sequence.
    pub fn len(&self, id: usize) -> Result<usize, ShapeError> {
        self.store.length(id)
    }

    /// Blocks in the pool.
    pub fn blocks(&self) -> usize {
        self.store.blocks()
    }

    /// Blocks no sequence holds.
    pub fn free_blocks(&self) -> usize {
        self.store.free_blocks()
    }

    /// The bytes of its blocks' keys and values, reserved when it was made.
    pub fn bytes(&self) -> usize {
        self.store.bytes()
    }

    /// How it keeps its keys (its layer's [`LayerBuilder::key_format`]).
    ///
    /// [`LayerBuilder::key_format`]: crate::LayerBuilder::key_format
    pub fn key_format(&self) -> KvFormat {
        self.store.layout.formats.keys
    }

    /// How it keeps its values (its layer's [`LayerBuilder::value_format`]).
    ///
    /// [`LayerBuilder::value_format`]: crate::LayerBuilder::value_format
    pub fn value_format(&self) -> KvFormat {
        self.store.layout.formats.values
    }
}

impl Layer {
    /// An empty paged KV cache for this layer: a pool of `blocks` blocks of
    /// [`PagedCache::BLOCK`] tokens, its memory reserved now, and no sequence.
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when the pool's size does not fit in memory,
    /// [`ShapeError::AllocationFailed`] when it cannot be allocated (nothing aborts).
    pub fn new_paged_cache(&self, blocks: usize) -> Result<PagedCache, ShapeError> {
        let settings = &self.settings;
        let layout = BlockLayout {
            n_kv_heads: settings.n_kv_heads,
            head_dim: settings.head_dim,
            formats: settings.kv_formats,
            window: settings.reach(),
            values: value_rows(settings),
        };
        Ok(PagedCache {
            store: PagedStore::new(layout, blocks)?,
        })
    }

    /// One decoding step of the sequences `sequences` of `cache`: row `b` of `x (B, L, D)`
    /// holds new tokens of sequence `sequences[b]` (`B = sequences.len()`), which are appended
    /// at that sequence's length and attend over all its tokens, as
    /// [`decode_into`](Layer::decode_into) does for batch element `b` of a [`KvCache`], and
    /// give its bits: each sequence's outputs are those of decoding it alone, whatever else
    /// the batch holds. The options are `decode_into`'s (`S` the most keys a sequence holds
    /// after the call; [`AttendOptions::token_lengths`] for sequences adding fewer than `L`).
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] or [`ShapeError::RepeatedSequence`] for bad `sequences`,
    /// [`ShapeError::PoolFull`] when the new tokens need more blocks than are free (the cache
    /// is unchanged), [`ShapeError::CacheMismatch`] for a cache of a layer of another shape,
    /// and as [`decode_into`](Layer::decode_into).
    ///
    /// [`KvCache`]: crate::KvCache
    pub fn decode_paged<'a>(
        &mut self,
        x: impl Into<Tokens<'a>>,
        cache: &mut PagedCache,
        sequences: &[usize],
        options: AttendOptions<'_>,
        out: impl Into<Output<'a>>,
    ) -> Result<(), ShapeError> {
        self.check_own_keys("decode_paged")?;
        if self.settings.masking != Masking::Causal {
            return Err(ShapeError::DecodeNeedsCausal);
        }
        let (x, out) = (x.into(), out.into());
        self.check_self_attention(x, &out)?;
        cache.store.select(sequences)?;
        self.run(Call::new(x, options)?, Some(&mut cache.store), out)
    }
}
