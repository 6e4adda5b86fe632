//! Per-layer and per-call choices: masking mode, padding, masks and attention weights.

use alloc::vec::Vec;

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

/// A mask over (query, key) pairs, `(T, S)` row-major for all batch elements, or `(B, T, S)`
/// with one mask per batch element.
#[derive(Clone, Copy, Debug)]
pub enum AttnMask<'a> {
    /// `true` where the query may see the key.
    Bool(&'a [bool]),
    /// Added to the scaled score before the softmax; `-inf` hides the key.
    Additive(&'a [f32]),
}

/// Options of one forward call beyond the layer's own settings. The default is none of them.
///
/// They combine: a key is visible when the layer's [`Masking`], the key lengths, the padding
/// mask and the mask all allow it. A query that sees no key at all gets zeros (not NaN) from
/// the attention, so its output is the output projection's bias (or zeros).
///
/// ```
/// use mha::{AttendOptions, AttnMask};
/// let lengths = [3, 5];
/// let options = AttendOptions { key_lengths: Some(&lengths), ..AttendOptions::default() };
/// assert!(options.mask.is_none());
/// ```
#[derive(Debug, Default)]
pub struct AttendOptions<'a> {
    /// For each batch element, the number of valid keys; the keys after them are padding and
    /// are never read (`B` values, each at most `S`).
    pub key_lengths: Option<&'a [usize]>,
    /// `(B, S)`: `true` for real keys, `false` for padding anywhere in the sequence.
    pub key_padding_mask: Option<&'a [bool]>,
    /// A general mask over (query, key).
    pub mask: Option<AttnMask<'a>>,
    /// Where to write the attention probabilities, `(B, H, T, S)`. Only computed when asked.
    pub weights: Option<&'a mut AttentionWeights>,
}

/// Attention probabilities of every head, `(B, H, T, S)` row-major: entry `(b, h, i, j)` is
/// how much query `i` of batch element `b` attends to key `j` in head `h`. Each row sums to 1,
/// or is all zeros for a query that sees no key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttentionWeights {
    pub(crate) data: Vec<f32>,
    pub(crate) shape: [usize; 4],
}

impl AttentionWeights {
    /// An empty buffer; a forward call with it in [`AttendOptions::weights`] fills it.
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
        let [nb, nh, t, s] = self.shape;
        (b < nb && h < nh).then(|| &self.data[(b * nh + h) * t * s..][..t * s])
    }

    /// The mean over heads, `(B, T, S)` row-major (PyTorch's `average_attn_weights`).
    pub fn mean_over_heads(&self) -> Vec<f32> {
        let [nb, nh, t, s] = self.shape;
        let mut mean = alloc::vec![0.0; nb * t * s];
        if nh == 0 {
            return mean;
        }
        for (b, out) in mean.chunks_exact_mut((t * s).max(1)).enumerate().take(nb) {
            for h in 0..nh {
                let block = &self.data[(b * nh + h) * t * s..][..t * s];
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
