//! Per-layer and per-call choices: masking mode, padding and masks; the attention weights a
//! call can be asked to write.

use alloc::vec::Vec;

use crate::error::ShapeError;
pub use crate::kernels::attention::mask::AttnMask;
use crate::kernels::attention::mask::Masks;
use crate::kernels::buffer::element_count;

/// Which keys a query may see, for a whole layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Masking {
    /// Query `i` sees keys `j <= i` (decoders such as GPT-2). With a KV cache the diagonal is
    /// aligned bottom-right: with `S` keys in all and `L` new queries, key `j` is visible to
    /// new query `i` iff `j <= i + (S - L)`.
    #[default]
    Causal,
    /// Every query sees every key (encoders such as BERT).
    Bidirectional,
}

/// Which keys the queries of one call may see, beyond the layer's own [`Masking`]. The
/// default is no restriction. A plain value: build it once and pass it to every call it fits.
///
/// They combine: a key is visible when the layer's [`Masking`], the key lengths, the padding
/// mask and the mask all allow it. A query that sees no key at all gets zeros (not NaN) from
/// the attention, so its output is the output projection's bias (or zeros). `S` is the number
/// of keys of the call: `T` for self-attention, the memory's length for cross-attention, and
/// the cached tokens plus the new ones for a decoding step.
///
/// ```
/// use mha::{AttendOptions, AttnMask};
/// let lengths = [3, 5];
/// let options = AttendOptions { key_lengths: Some(&lengths), ..AttendOptions::default() };
/// assert!(options.mask.is_none());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct AttendOptions<'a> {
    /// For each batch element, the number of valid keys; the keys after them are padding and
    /// are never read (`B` values, each at most `S`).
    pub key_lengths: Option<&'a [usize]>,
    /// `(B, S)`: `true` for real keys, `false` for padding anywhere in the sequence.
    pub key_padding_mask: Option<&'a [bool]>,
    /// For each batch element, the first key its queries may see (`B` values): the keys
    /// before it are left padding, hidden from every query. Keys count from the start of the
    /// sequence (for a [`KvCache`](crate::KvCache), from its first token ever appended, also
    /// in a rolling cache), so the same `B` numbers serve every call of a decoding loop: unlike
    /// a `key_padding_mask`, they do not grow with the cache. Rotary positions are separate
    /// ([`AttendOptions::positions`]).
    pub key_starts: Option<&'a [usize]>,
    /// A general mask over (query, key).
    pub mask: Option<AttnMask<'a>>,
    /// For each batch element, how many of the call's `T` tokens are real (`B` values, each at
    /// most `T`); the rest are right padding. A batch element's real tokens are the only ones
    /// it appends to a [`KvCache`](crate::KvCache) (or, in a forward pass, the only ones used
    /// as keys), so the sequences of one batch can hold different numbers of tokens: each new
    /// token's causal position continues from its own sequence's cached tokens. The output rows
    /// of padding tokens are those of a query that sees all of its sequence's keys. `None`:
    /// every token is real.
    pub token_lengths: Option<&'a [usize]>,
    /// `(B, T)`: the rotary position of every new token, for a layer with a rotary embedding
    /// ([`MhaBuilder::rope`](crate::MhaBuilder::rope)); by default token `t` of sequence `b`
    /// is at `cached[b] + t`, where `cached[b]` counts that sequence's tokens already in the
    /// cache (0 for a forward pass; padding tokens past its `token_lengths` continue the count).
    /// Every position, padding's too, must be at most
    /// [`RopeAngles::max_position`](crate::RopeAngles::max_position), else the call is an error.
    /// Explicit positions serve left-padded batches (each sequence starting at 0 after its
    /// padding) and packed sequences. A layer without one ignores them but still checks their
    /// length.
    pub positions: Option<&'a [usize]>,
}

impl<'a> AttendOptions<'a> {
    /// The limits and masks the attention applies (all but the positions).
    pub(crate) fn masks(&self) -> Masks<'a> {
        Masks {
            key_lengths: self.key_lengths,
            key_padding_mask: self.key_padding_mask,
            key_starts: self.key_starts,
            mask: self.mask,
            token_lengths: self.token_lengths,
        }
    }

    /// Checks the token lengths against a call of `batch` sequences of `queries` tokens (before
    /// [`AttendOptions::check`]: the call's number of keys depends on them).
    pub(crate) fn check_token_lengths(
        &self,
        batch: usize,
        queries: usize,
    ) -> Result<(), ShapeError> {
        let Some(lengths) = self.token_lengths else {
            return Ok(());
        };
        if lengths.len() != batch {
            return Err(ShapeError::LengthMismatch {
                what: "token_lengths (B)",
                expected: batch,
                actual: lengths.len(),
            });
        }
        match lengths.iter().enumerate().find(|&(_, &l)| l > queries) {
            None => Ok(()),
            Some((batch, &length)) => Err(ShapeError::TokenLength {
                batch,
                length,
                tokens: queries,
            }),
        }
    }

    /// Checks the other options against a call of `batch` sequences of `queries` queries over
    /// `keys` keys, `rows` query rows in all (`B · T`, fewer when ragged: one position each);
    /// returns the distance between batch elements' masks (0 for one shared mask).
    pub(crate) fn check(
        &self,
        batch: usize,
        queries: usize,
        keys: usize,
        rows: usize,
    ) -> Result<usize, ShapeError> {
        let mismatch = |what, expected, actual| ShapeError::LengthMismatch {
            what,
            expected,
            actual,
        };
        if let Some(lengths) = self.key_lengths {
            if lengths.len() != batch {
                return Err(mismatch("key_lengths (B)", batch, lengths.len()));
            }
            if let Some((batch, &length)) = lengths.iter().enumerate().find(|&(_, &l)| l > keys) {
                return Err(ShapeError::KeyLength {
                    batch,
                    length,
                    keys,
                });
            }
        }
        if let Some(positions) = self.positions {
            if positions.len() != rows {
                return Err(mismatch("positions (B, T)", rows, positions.len()));
            }
        }
        if let Some(starts) = self.key_starts {
            if starts.len() != batch {
                return Err(mismatch("key_starts (B)", batch, starts.len()));
            }
        }
        if let Some(padding) = self.key_padding_mask {
            let expected = element_count(&[batch, keys])?;
            if padding.len() != expected {
                return Err(mismatch("key_padding_mask (B, S)", expected, padding.len()));
            }
        }
        let Some(mask) = self.mask else {
            return Ok(0);
        };
        let shared = element_count(&[queries, keys])?;
        let per_batch = element_count(&[batch, queries, keys])?;
        let batch_stride = match mask.len() {
            len if len == shared => 0,
            len if len == per_batch => shared,
            len => return Err(mismatch("mask (T, S) or (B, T, S)", shared, len)),
        };
        mask.check_values()?;
        Ok(batch_stride)
    }
}

impl AttnMask<'_> {
    /// An additive mask's entries must be finite or `-inf`.
    fn check_values(&self) -> Result<(), ShapeError> {
        let AttnMask::Additive(values) = *self else {
            return Ok(());
        };
        let bad = values
            .iter()
            .position(|&v| v.is_nan() || v == f32::INFINITY);
        match bad {
            None => Ok(()),
            Some(index) => Err(ShapeError::MaskValue {
                index,
                value: if values[index].is_nan() {
                    "NaN"
                } else {
                    "+inf"
                },
            }),
        }
    }
}

/// Attention probabilities of every head, `(B, H, T, S)` row-major: entry `(b, h, i, j)` is
/// how much query `i` of batch element `b` attends to key `j` in head `h`. Each row sums to 1
/// (less with an attention sink), or is all zeros for a query that sees no key.
///
/// `S` is the call's number of keys (see [`AttendOptions`]), and column `j` is key `j`,
/// except for a decoding step through a rolling cache (the cache of a layer with a sliding
/// window, which decodes without end in constant memory): a query there sees at most the
/// `window` keys ending at its own, so the `T` queries of a call see no more than the last
/// `window + T - 1` keys of their sequence, and the weights keep only those. `S` is then
/// `min(keys, window + T - 1)` and column `c` of batch element `b` is its key at position
/// `lengths[b] - S + c` (or `c`, when the sequence holds fewer than `S` keys), `lengths` being
/// [`KvCache::lengths`](crate::KvCache::lengths) after the call.
///
/// ```
/// use mha::{AttendOptions, AttentionWeights, Matrix, Mha, MhaParams, Output, Tensor};
/// let w = Matrix::<4, 4>::identity();
/// let mut layer = Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)
///     .sliding_window(3)
///     .build()?;
/// let mut cache = layer.new_cache(1, 1)?;
/// let (mut y, mut weights) = (Tensor::<1, 1, 4>::zeros(), AttentionWeights::new());
/// for t in 0..100 {
///     let token = Tensor::<1, 1, 4>::from_fn(|_, _, i| (t + i) as f32 * 0.01);
///     let out = Output::from(&mut y).with_weights(&mut weights);
///     layer.decode_into(&token, &mut cache, AttendOptions::default(), out)?;
/// }
/// // After 100 tokens, the last query's window: keys 97, 98 and 99.
/// assert_eq!(weights.shape(), [1, 2, 1, 3]);
/// assert_eq!(cache.lengths()[0] - weights.shape()[3], 97);
/// let total: f32 = weights.head(0, 0).unwrap().iter().sum();
/// assert!((total - 1.0).abs() < 1e-6);
/// # Ok::<(), mha::ShapeError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttentionWeights {
    pub(crate) data: Vec<f32>,
    pub(crate) shape: [usize; 4],
}

impl AttentionWeights {
    /// An empty buffer; a call given it through [`Output::with_weights`] fills it.
    ///
    /// [`Output::with_weights`]: crate::Output::with_weights
    pub fn new() -> Self {
        Self::default()
    }

    /// `[B, H, T, S]`.
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    /// The flat `(B, H, T, S)` probabilities.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// Entry `(b, h, i, j)`, or `None` when out of range.
    pub fn get(&self, b: usize, h: usize, i: usize, j: usize) -> Option<f32> {
        let [nb, nh, t, s] = self.shape;
        (b < nb && h < nh && i < t && j < s).then(|| self.data[((b * nh + h) * t + i) * s + j])
    }

    /// Head `h` of batch element `b` as a `(T, S)` row-major block, or `None` when out of range.
    pub fn head(&self, b: usize, h: usize) -> Option<&[f32]> {
        let [nb, nh, _, _] = self.shape;
        (b < nb && h < nh).then(|| self.block(b * nh + h))
    }

    /// Entries per `(T, S)` block: with entries, `B · H · T · S` fits in usize; without, every
    /// block is empty (and its size, or the products of the other axes, need not fit).
    fn block_len(&self) -> usize {
        let [_, _, t, s] = self.shape;
        if self.data.is_empty() {
            0
        } else {
            t * s
        }
    }

    /// Block `n` (head `n % H` of batch element `n / H`), `n < B · H`.
    fn block(&self, n: usize) -> &[f32] {
        let len = self.block_len();
        if len == 0 {
            return &[];
        }
        &self.data[n * len..][..len]
    }

    /// The mean over heads, `(B, T, S)` row-major (PyTorch's `average_attn_weights`).
    pub fn mean_over_heads(&self) -> Vec<f32> {
        let [nb, nh, _, _] = self.shape;
        let len = self.block_len();
        let mut mean = alloc::vec![0.0; nb * len];
        if nh == 0 || len == 0 {
            return mean;
        }
        for (b, out) in mean.chunks_exact_mut(len).enumerate() {
            for h in 0..nh {
                let block = self.block(b * nh + h);
                for (o, &w) in out.iter_mut().zip(block) {
                    *o += w;
                }
            }
            for o in out.iter_mut() {
                *o /= nh as f32;
            }
        }
        mean
    }
}
