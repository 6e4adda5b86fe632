//! The paged KV cache: [`PagedCache`], a pool of key blocks shared by any number of sequences
//! through block tables, and [`Layer::decode_paged`], a decoding step of several of them
//! (an MLA layer's: [`MlaLayer::decode_paged`](crate::MlaLayer::decode_paged)).

use crate::error::ShapeError;
use crate::kernels::store::layout::{BlockLayout, BLOCK_K};
use crate::kernels::store::paged::PagedStore;
use crate::kernels::KvFormat;
use crate::layer::norm::QkNormPlacement;
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
/// ([`PagedCache::position`]: its length, or one past the last explicit position a call gave
/// it, moved by [`Layer::shift_positions`]); a call that needs more blocks than are free
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

    /// The position of sequence `id`'s next token when a call gives no positions: its
    /// length, or, after a call that placed its tokens at explicit
    /// [`AttendOptions::positions`], one past the last of them (moved by
    /// [`Layer::shift_positions`]).
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not a live sequence.
    pub fn position(&self, id: usize) -> Result<usize, ShapeError> {
        self.store.position(id)
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

    /// Moves the positions of sequence `id`'s tokens from index `from` on by `delta`, as
    /// llama.cpp's `seq_add` over `[from, ∞)`: those cached tokens and the ones to come sit
    /// `delta` positions further on (back, when negative), opening or closing a gap after
    /// the tokens before `from`. With a rotary embedding each of their keys is turned by
    /// `delta` positions (blocks shared with forks are copied first; 16- and 8-bit keys are
    /// rounded again). Causal order, windows and ALiBi distances are by token order and do not
    /// move. A turned key equals the key rotated at its new position up to rounding, so the
    /// sequence then decodes as one prefilled at the new positions would, within rounding,
    /// not bit for bit. (Moving every token, `from = 0`, changes no score: RoPE's are
    /// relative.)
    ///
    /// ```
    /// use mha::{AttendOptions, Matrix, Mha, MhaParams, Rope, RopeLayout, RopeScaling, Tensor};
    /// let w = Matrix::<4, 4>::from_fn(|r, c| if r == c { 0.5 } else { 0.1 });
    /// let rope = Rope { theta: 10_000.0, rotary_dim: 2, layout: RopeLayout::RotateHalf, scaling: RopeScaling::Default };
    /// let mut layer = Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2).rope(rope).build()?.into_layer();
    /// let mut cache = layer.new_paged_cache(2)?;
    /// let id = cache.add_sequence()?;
    /// let x = Tensor::<1, 3, 4>::from_fn(|_, t, i| (t + i) as f32 * 0.1);
    /// layer.decode_paged(&x, &mut cache, &[id], AttendOptions::default(), &mut Tensor::<1, 3, 4>::zeros())?;
    /// // Tokens 1 and 2 move to positions 101 and 102; the next token goes to 103.
    /// layer.shift_positions(&mut cache, id, 1, 100)?;
    /// assert_eq!((cache.len(id)?, cache.position(id)?), (3, 103));
    /// assert!(layer.shift_positions(&mut cache, id, 3, -104).is_err()); // next would be at -1
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not a live sequence, [`ShapeError::CacheMismatch`]
    /// for a cache of another layer's shape, [`ShapeError::KvSharedLayer`] for a KV-shared
    /// layer (shift through its source layer), [`ShapeError::PositionShift`] when `from` is
    /// past its tokens, or its next token would be at a negative position or past the rotary
    /// embedding's
    /// [`max_position`](crate::RopeAngles::max_position), or the layer normalises its keys
    /// after rotating them (QK-norm after RoPE: a turned key is not the key at the new
    /// position), [`ShapeError::PoolFull`] when the pool cannot hold copies of the blocks it
    /// shares. Nothing changes on an error.
    pub fn shift_positions(
        &self,
        cache: &mut PagedCache,
        id: usize,
        from: usize,
        delta: isize,
    ) -> Result<(), ShapeError> {
        self.check_own_keys("shift_positions")?;
        let store = &cache.store;
        if store.layout.values != value_rows(&self.settings)
            || store.layout.n_kv_heads != self.settings.n_kv_heads
            || store.layout.head_dim != self.settings.head_dim
            || store.layout.formats != self.settings.kv_formats
            || store.layout.window != self.settings.reach()
        {
            return Err(ShapeError::CacheMismatch);
        }
        let Some(rope) = &self.settings.rope else {
            return cache.store.shift(id, (from, delta), None);
        };
        let refuse = |reason| ShapeError::PositionShift { id, delta, reason };
        if self.settings.qk_norm.is_some()
            && self.settings.qk_norm_placement == QkNormPlacement::AfterRope
        {
            return Err(refuse("the layer normalises its keys after rotating them"));
        }
        let max = rope.max_position();
        let last = cache.store.position(id)?.checked_add_signed(delta);
        if delta.unsigned_abs() > max || last.is_none_or(|next| next > max) {
            return Err(refuse("past the rotary embedding's largest position"));
        }
        let turn = |key: &mut [f32]| rope.shift_row(key, delta);
        cache.store.shift(id, (from, delta), Some(&turn))
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
