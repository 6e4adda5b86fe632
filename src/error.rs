//! The crate's one error type.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// Why a shape, a head count or a buffer was rejected.
///
/// Every variant carries the numbers involved, and its [`Display`](fmt::Display) text names
/// them, e.g. `d_model 6 is not divisible by n_heads 4`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShapeError {
    /// The head count was zero.
    ZeroHeads,
    /// The model width `d_model` is not a multiple of the head count.
    NotDivisible {
        /// The model width `D`.
        d_model: usize,
        /// The requested head count `H`.
        n_heads: usize,
    },
    /// A buffer does not hold the number of elements its shape needs.
    LengthMismatch {
        /// What the buffer is, e.g. `"Tensor (B, T, D)"` or `"mask (T, T)"`.
        what: &'static str,
        /// The number of elements the shape needs.
        expected: usize,
        /// The number of elements given.
        actual: usize,
    },
    /// Two head buffers that must agree were split with different head counts.
    HeadCountMismatch {
        /// The head count of the first (query) buffer.
        expected: usize,
        /// The head count of the other buffer.
        actual: usize,
    },
    /// The key/value width `KV` of grouped-query weights is not `n_kv_heads · head_dim` for a
    /// head count `n_kv_heads` that divides `n_heads`.
    KvHeads {
        /// The key/value projection width `KV`.
        kv_width: usize,
        /// The width of one head, `D / n_heads`.
        head_dim: usize,
        /// The number of query heads.
        n_heads: usize,
    },
    /// A batch element's key length is longer than its sequence of keys.
    KeyLength {
        /// The batch element.
        batch: usize,
        /// The key length given for it.
        length: usize,
        /// The number of keys `S`.
        keys: usize,
    },
    /// A batch element's token length ([`AttendOptions::token_lengths`]) exceeds the call's
    /// `T` tokens.
    ///
    /// [`AttendOptions::token_lengths`]: crate::AttendOptions::token_lengths
    TokenLength {
        /// The batch element.
        batch: usize,
        /// The token length given for it.
        length: usize,
        /// The call's tokens per batch element `T`.
        tokens: usize,
    },
    /// A batch element index past the batch (e.g. [`KvCache::clear_sequence`]).
    ///
    /// [`KvCache::clear_sequence`]: crate::KvCache::clear_sequence
    SequenceIndex {
        /// The index given.
        sequence: usize,
        /// The batch size.
        batch: usize,
    },
    /// Appending to a KV cache would pass its capacity; the cache is left as it was.
    CacheFull {
        /// The batch element (sequence) without room.
        sequence: usize,
        /// The cache's capacity in tokens.
        capacity: usize,
        /// Tokens already cached.
        cached: usize,
        /// Tokens that were to be appended.
        new: usize,
    },
    /// A KV cache was made by a layer with other key/value heads or head width, or for another
    /// instruction set (whose kernels pad value rows differently).
    CacheMismatch,
    /// A shape's element count does not fit in `usize`.
    TooLarge,
    /// Two run-time dimensions that must agree differ, e.g. the output's sequence length
    /// and the input's.
    DimensionMismatch {
        /// Which dimension, e.g. `"output length (T)"`.
        what: &'static str,
        /// The value the call needs.
        expected: usize,
        /// The value given.
        actual: usize,
    },
    /// An additive mask holds NaN or `+inf`; only finite values and `-inf` (hide the key) are
    /// allowed.
    MaskValue {
        /// The entry's index in the flat mask.
        index: usize,
        /// `"NaN"` or `"+inf"`.
        value: &'static str,
    },
    /// Decoding needs causal masking: with a bidirectional layer every token would see tokens
    /// that arrive later, so the outputs would depend on how the sequence is cut into steps.
    DecodeNeedsCausal,
    /// The requested instruction set is not available on this CPU.
    UnsupportedIsa {
        /// The instruction set's name, e.g. `"avx512"`.
        isa: &'static str,
    },
    /// A buffer sized from numbers given at run time cannot exist: its element count
    /// overflows `usize`, or its bytes exceed `isize::MAX`, the most one allocation can hold.
    Overflow {
        /// What the buffer is, its axes named, e.g. `"causal mask (t, t)"`.
        what: &'static str,
        /// The sizes of those axes, e.g. `[t, t]`.
        dims: Vec<usize>,
    },
    /// Allocating a buffer sized from numbers given at run time failed.
    AllocationFailed {
        /// What the buffer is, e.g. `"causal mask (t, t)"`.
        what: &'static str,
        /// The bytes asked for.
        bytes: usize,
    },
    /// A numeric layer setting is out of its range, e.g. a negative soft cap.
    Setting {
        /// Which setting, e.g. `"logit soft cap"`.
        what: &'static str,
        /// The value given, as text, e.g. `"NaN"` or `"-0.5"`.
        value: String,
        /// The range it must be in, e.g. `"finite and > 0"`.
        expected: &'static str,
    },
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShapeError::ZeroHeads => write!(f, "n_heads must be at least 1, got 0"),
            ShapeError::NotDivisible { d_model, n_heads } => {
                write!(f, "d_model {d_model} is not divisible by n_heads {n_heads}")
            }
            ShapeError::LengthMismatch {
                what,
                expected,
                actual,
            } => write!(
                f,
                "{what} needs {expected} elements, but the buffer has {actual}"
            ),
            ShapeError::HeadCountMismatch { expected, actual } => write!(
                f,
                "head counts differ: queries have {expected} heads, another buffer has {actual}"
            ),
            ShapeError::KvHeads {
                kv_width,
                head_dim,
                n_heads,
            } => write!(
                f,
                "key/value width {kv_width} is not n_kv_heads x head_dim {head_dim} for a head count n_kv_heads dividing n_heads {n_heads}"
            ),
            ShapeError::KeyLength {
                batch,
                length,
                keys,
            } => write!(
                f,
                "key length {length} of batch element {batch} is longer than the {keys} keys"
            ),
            ShapeError::TokenLength {
                batch,
                length,
                tokens,
            } => write!(
                f,
                "token length {length} of batch element {batch} is longer than the call's {tokens} tokens"
            ),
            ShapeError::SequenceIndex { sequence, batch } => write!(
                f,
                "sequence {sequence} is past the batch of {batch} sequences"
            ),
            ShapeError::CacheFull {
                sequence,
                capacity,
                cached,
                new,
            } => write!(
                f,
                "KV cache of capacity {capacity} holds {cached} tokens of sequence {sequence} and cannot take {new} more"
            ),
            ShapeError::CacheMismatch => write!(
                f,
                "KV cache was made by a layer with other key/value heads, head width or \
                 instruction set"
            ),
            ShapeError::TooLarge => write!(f, "shape has more elements than fit in usize"),
            ShapeError::DimensionMismatch {
                what,
                expected,
                actual,
            } => write!(f, "{what} is {actual}, but the call needs {expected}"),
            ShapeError::MaskValue { index, value } => write!(
                f,
                "additive mask entry {index} is {value}; entries must be finite or -inf"
            ),
            ShapeError::DecodeNeedsCausal => write!(
                f,
                "decoding needs a causal layer: a bidirectional one would let tokens see later ones"
            ),
            ShapeError::UnsupportedIsa { isa } => {
                write!(f, "instruction set {isa} is not available on this CPU")
            }
            ShapeError::Overflow { what, dims } => write!(
                f,
                "{what} of sizes {dims:?} has more elements than fit in memory"
            ),
            ShapeError::AllocationFailed { what, bytes } => {
                write!(f, "cannot allocate {bytes} bytes for {what}")
            }
            ShapeError::Setting {
                what,
                value,
                expected,
            } => write!(f, "{what} is {value}, but must be {expected}"),
        }
    }
}

impl core::error::Error for ShapeError {}

/// Checks that `n_heads` is at least 1 and divides `d_model`; returns the head width `d_model / n_heads`.
pub(crate) fn head_dim(d_model: usize, n_heads: usize) -> Result<usize, ShapeError> {
    if n_heads == 0 {
        return Err(ShapeError::ZeroHeads);
    }
    if !d_model.is_multiple_of(n_heads) {
        return Err(ShapeError::NotDivisible { d_model, n_heads });
    }
    Ok(d_model / n_heads)
}
