//! KV sharing: a layer built without key/value projections
//! ([`Projections::queries_only`](crate::Projections::queries_only)) attends over the keys and
//! values a *source* layer has cached, read in place (Gemma 3n's and Gemma 4's last
//! `num_kv_shared_layers` layers, each reading the cache of the last earlier layer of its
//! type).
//!
//! The contract: the source layer appends the call's tokens first (a
//! [`decode_into`](Layer::decode_into) or [`decode_paged`](Layer::decode_paged) on the same
//! tokens' hidden states at that layer), then the shared layer's call on its own hidden
//! states reads them: its queries are the last `T` tokens of each sequence (`token_lengths[b]`
//! with [`AttendOptions::token_lengths`]), at the positions the source gave them (`cached + t`,
//! or the call's explicit positions, which must be the source's), and see the keys the source
//! layer's own queries saw (causal, the layer's window and chunk, the call's masks). The
//! shared layer's output is therefore, bit for bit, that of a layer with the same query and
//! output weights computing those keys and values itself. A prompt without a cache is a
//! decoding step into an empty cache (which gives the forward pass's bits): a model with
//! shared layers prefills its source layers through caches.

use crate::error::ShapeError;
use crate::layer::cache::KvCache;
use crate::layer::options::{AttendOptions, Masking};
use crate::layer::paged::PagedCache;
use crate::layer::pass::Call;
use crate::layer::tokens::{Output, Tokens};
use crate::layer::Layer;

impl Layer {
    /// Whether the layer is KV-shared: built from
    /// [`Projections::queries_only`](crate::Projections::queries_only), it has no key or
    /// value projections and attends over a source layer's cache
    /// ([`decode_shared_into`](Self::decode_shared_into)).
    pub fn is_kv_shared(&self) -> bool {
        self.settings.kv_shared
    }

    /// A KV-shared layer's step: the queries of `x (B, T, D)` attend over `source`, the
    /// cache of the layer whose keys and values this one shares, which already holds the
    /// call's `T` tokens (or `token_lengths[b]`) at the end of each sequence: the source layer
    /// appended them first. Nothing is appended or copied; `source` is only read. The options
    /// are those of the source's call (`S` the keys each sequence holds, the call's tokens
    /// included); positions, masks and windows are as the source cache records them.
    ///
    /// ```
    /// use mha::{AttendOptions, Layer, Output, Projections, Tokens, WeightValues, Widths};
    /// // D = 8, 4 query heads of 2 over 2 key/value heads (KV = 4).
    /// let widths = Widths::self_attention(8, 4, 8);
    /// let w = |n: usize, k: usize| (0..n).map(|i| ((i * k) % 11) as f32 * 0.05 - 0.25).collect::<Vec<f32>>();
    /// let (wq, wk, wv, wo, wq2, wo2) = (w(64, 3), w(32, 5), w(32, 7), w(64, 2), w(64, 9), w(64, 4));
    /// let mut source = Layer::builder(Projections::new(widths, &wq, &wk, &wv, &wo)?, 4).build()?;
    /// let (wq2v, wo2v) = (WeightValues::F32(wq2.clone()), WeightValues::F32(wo2.clone()));
    /// let mut shared = Layer::builder(Projections::queries_only(widths, [&wq2v, &wo2v])?, 4).build()?;
    ///
    /// // Three tokens: the source layer appends them, then the shared layer reads them.
    /// let x: Vec<f32> = (0..3 * 8).map(|i| (i % 5) as f32 * 0.1).collect();
    /// let mut cache = source.new_cache(1, 16)?;
    /// let (mut y, mut z) = (vec![0.0; 3 * 8], vec![0.0; 3 * 8]);
    /// source.decode_into(Tokens::new(&x, 1, 3, 8)?, &mut cache, AttendOptions::default(), Output::new(&mut y, 1, 3, 8)?)?;
    /// shared.decode_shared_into(Tokens::new(&x, 1, 3, 8)?, &cache, AttendOptions::default(), Output::new(&mut y, 1, 3, 8)?)?;
    /// assert_eq!(cache.len(), 3); // nothing appended by the shared layer
    ///
    /// // The bits of a layer with the same keys and values computing its own.
    /// let mut own = Layer::builder(Projections::new(widths, &wq2, &wk, &wv, &wo2)?, 4).build()?;
    /// own.forward_into(Tokens::new(&x, 1, 3, 8)?, AttendOptions::default(), Output::new(&mut z, 1, 3, 8)?)?;
    /// assert_eq!(y, z);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::Setting`] on a layer that is not KV-shared (it has key/value projections
    /// of its own),
    /// [`ShapeError::DecodeNeedsCausal`] for a bidirectional layer,
    /// [`ShapeError::SharedCache`] when `source` has other key/value heads, head width,
    /// key/value formats or rolling window than the layer, a sequence holds fewer tokens
    /// than the call's, or (a windowed layer) it no longer holds the keys the call's first
    /// queries see (a rolling ring or a paged sequence drops those no query of the source's
    /// last call sees: a shared call takes no more tokens than that call); [`ShapeError::DimensionMismatch`] when `x` or `out` is not `D` wide or
    /// `x`, `source` and `out` disagree on the batch or `out` on the length; when an option
    /// does not match `B`, `T` and `S`; a rotary position past
    /// [`RopeAngles::max_position`](crate::RopeAngles::max_position), an ALiBi bias that
    /// overflows or buffers that cannot be had, as [`forward_into`](Self::forward_into).
    pub fn decode_shared_into<'a>(
        &mut self,
        x: impl Into<Tokens<'a>>,
        source: &KvCache,
        options: AttendOptions<'_>,
        out: impl Into<Output<'a>>,
    ) -> Result<(), ShapeError> {
        let (x, out) = (x.into(), out.into());
        self.check_shared_call(x, &out)?;
        let call = Call::new(x, options)?;
        self.with_pass(|pass| pass.run_shared(call, &source.store, out))
    }

    /// [`decode_shared_into`](Self::decode_shared_into) over a paged cache: row `b` of `x`
    /// holds the new tokens of sequence `sequences[b]` of `source`, which the source layer's
    /// [`decode_paged`](Self::decode_paged) appended first. Only the cache's choice of
    /// sequences for a call changes (no key or value).
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] or [`ShapeError::RepeatedSequence`] for bad `sequences`,
    /// and as [`decode_shared_into`](Self::decode_shared_into).
    pub fn decode_shared_paged<'a>(
        &mut self,
        x: impl Into<Tokens<'a>>,
        source: &mut PagedCache,
        sequences: &[usize],
        options: AttendOptions<'_>,
        out: impl Into<Output<'a>>,
    ) -> Result<(), ShapeError> {
        let (x, out) = (x.into(), out.into());
        self.check_shared_call(x, &out)?;
        source.store.select(sequences)?;
        let call = Call::new(x, options)?;
        self.with_pass(|pass| pass.run_shared(call, &source.store, out))
    }

    /// A shared call needs a KV-shared, causal layer and `D`-wide tokens and output.
    fn check_shared_call(&self, x: Tokens<'_>, out: &Output<'_>) -> Result<(), ShapeError> {
        if !self.settings.kv_shared {
            return Err(ShapeError::Setting {
                what: "the layer of a shared call",
                value: "a layer with key/value projections".into(),
                expected: "a KV-shared layer (Projections::queries_only)",
            });
        }
        if self.settings.masking != Masking::Causal {
            return Err(ShapeError::DecodeNeedsCausal);
        }
        self.check_self_attention(x, out)
    }

    /// Refuses `call`, a call that projects keys and values, on a KV-shared layer.
    pub(crate) fn check_own_keys(&self, call: &'static str) -> Result<(), ShapeError> {
        match self.settings.kv_shared {
            true => Err(ShapeError::KvSharedLayer { call }),
            false => Ok(()),
        }
    }
}
