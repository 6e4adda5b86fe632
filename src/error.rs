//! [`ShapeError`], the error of the layers' shapes, head counts, settings and buffers.
//!
//! Reading weights and configs has errors of its own:
//! [`SafeTensorsError`](crate::safetensors::SafeTensorsError),
//! [`ConfigError`](crate::ConfigError), and [`LoadError`](crate::LoadError) for a checkpoint
//! (which carries any of the three).

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
        /// The width of one head, `Q / n_heads`.
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
    /// instruction set (whose kernels pad value rows differently), or keeping keys or values
    /// in another [`KvFormat`](crate::KvFormat), or it is a rolling cache made for another
    /// sliding window.
    CacheMismatch,
    /// A KV-shared layer's source cache does not fit the call: its key/value heads, head
    /// width, formats or rolling window are not the layer's, or a sequence holds fewer tokens
    /// than the call's (the source layer appends them first).
    SharedCache {
        /// What differs, e.g. `"key/value heads"`.
        what: &'static str,
        /// What the shared layer's call needs.
        needed: String,
        /// What the source cache holds.
        held: String,
    },
    /// A KV-shared layer ([`Projections::queries_only`](crate::Projections::queries_only))
    /// was called as one with its own keys and values (`call`); it attends only over a
    /// source layer's cache.
    KvSharedLayer {
        /// The call, e.g. `"forward_into"`.
        call: &'static str,
    },
    /// Ragged tokens ([`Tokens::ragged`](crate::Tokens::ragged)) were given where the call
    /// cannot take them (`what`, e.g. `"with cross-attention"`).
    Ragged {
        /// What the call combined them with.
        what: &'static str,
    },
    /// The output of a call on ragged tokens does not hold the same sequences: sequence
    /// `sequence` has `tokens` input rows and `output` output rows.
    RaggedOutput {
        /// The sequence.
        sequence: usize,
        /// Its input rows.
        tokens: usize,
        /// Its output rows (none when the output is not ragged or has fewer sequences).
        output: Option<usize>,
    },
    /// A sequence's positions cannot move by `delta` (`reason`).
    PositionShift {
        /// The sequence.
        id: usize,
        /// The shift asked for.
        delta: isize,
        /// Why not, e.g. `"its first held token would be at a negative position"`.
        reason: &'static str,
    },
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
    /// The query width `Q` of a layer whose heads are not `D / n_heads` wide is not a multiple
    /// of the head count.
    QueryNotDivisible {
        /// The query width `Q = n_heads · head_dim`.
        q_width: usize,
        /// The requested head count `H`.
        n_heads: usize,
    },
    /// A numeric layer setting is out of its range, e.g. a NaN softmax scale, a negative
    /// QK-norm `eps` or a rotary `rope_theta` of 0.
    Setting {
        /// Which setting, e.g. `"softmax scale"`, `"rope_theta"` or `"rope_scaling factor"`
        /// (rotary settings as `config.json` names them).
        what: &'static str,
        /// The value given, as text, e.g. `"NaN"` or `"-0.5"` (with what it is compared to,
        /// when that is another setting).
        value: String,
        /// The range it must be in, e.g. `"finite and >= 0"`.
        expected: &'static str,
    },
    /// A rotary embedding's `rotary_dim` is odd or wider than the head.
    RotaryDim {
        /// The rotary dimension given.
        rotary_dim: usize,
        /// The head width.
        head_dim: usize,
    },
    /// A token's rotary position is beyond [`RopeAngles::max_position`](crate::RopeAngles::max_position),
    /// where an angle would pass what the crate's `sin_cos` reduces exactly.
    RopePosition {
        /// The token's row in the call (`b · T + t`).
        index: usize,
        /// Its position.
        position: usize,
        /// The largest position the layer's frequencies allow.
        max: usize,
    },
    /// A finite weight becomes an infinity when rounded to the layer's 16-bit
    /// [`WeightFormat`](crate::WeightFormat) (binary16 ends at 65504).
    WeightRange {
        /// The matrix, e.g. `"query projection wq (D, Q)"`.
        what: &'static str,
        /// The weight's index in the row-major matrix.
        index: usize,
        /// Its value, as text, e.g. `"70000"`.
        value: String,
        /// The format's name, e.g. `"f16"`.
        format: &'static str,
    },
    /// `cross_into` on a layer with a rotary embedding: positions are defined for
    /// self-attention only (models with rotary embeddings have no cross-attention).
    RopeCrossAttention,
    /// A sliding window of 0 keys ([`MhaBuilder::sliding_window`]): a query would see no key,
    /// not even its own.
    ///
    /// [`MhaBuilder::sliding_window`]: crate::MhaBuilder::sliding_window
    ZeroWindow,
    /// A sliding window on a bidirectional layer: windows are a limit on causal order (as in
    /// Mistral, Qwen2 and Gemma); a bidirectional window is not supported.
    WindowNeedsCausal {
        /// The window given.
        window: usize,
    },
    /// A call appends more tokens to a sequence than a rolling cache (the cache of a layer
    /// with a sliding window) takes in one call; the cache is left as it was.
    WindowChunk {
        /// The batch element (sequence).
        sequence: usize,
        /// Tokens that were to be appended.
        new: usize,
        /// The most tokens one call may append ([`KvCache::capacity`]).
        ///
        /// [`KvCache::capacity`]: crate::KvCache::capacity
        chunk: usize,
        /// The layer's window.
        window: usize,
    },
    /// A [`PagedCache`](crate::PagedCache) has too few free blocks for a call's new tokens
    /// (or a fork's copy); the cache is left as it was.
    PoolFull {
        /// Blocks the call needs: new ones, and copies of shared partial blocks.
        needed: usize,
        /// Blocks free, counting those the call's sequences release before their windows.
        free: usize,
        /// Blocks in the pool.
        blocks: usize,
    },
    /// A sequence id that names no live sequence of a [`PagedCache`](crate::PagedCache).
    SequenceId {
        /// The id given.
        id: usize,
        /// The ids the cache has handed out are below this.
        ids: usize,
    },
    /// A call names one sequence of a [`PagedCache`](crate::PagedCache) twice.
    RepeatedSequence {
        /// The sequence id.
        id: usize,
        /// The two batch elements naming it.
        elements: [usize; 2],
    },
    /// A sequence of a [`PagedCache`](crate::PagedCache) cannot be truncated to `length`
    /// tokens: it holds fewer, or (with a sliding window) the blocks that length's next query
    /// would see are released.
    Truncate {
        /// The sequence id.
        id: usize,
        /// The length asked for.
        length: usize,
        /// Tokens it holds.
        held: usize,
        /// The first token it still holds (0 without a window).
        kept_from: usize,
    },
    /// A matrix kept in a block [`WeightFormat`](crate::WeightFormat) whose input width (the
    /// values along each output's row) is not a whole number of the format's blocks.
    BlockWidth {
        /// The matrix, e.g. `"query projection wq (D, Q)"`.
        what: &'static str,
        /// Its input width.
        width: usize,
        /// Values per block (32 or 256).
        block: usize,
        /// The format's name, e.g. `"q4_K"`.
        format: &'static str,
    },
    /// `f32` weights asked for in a block [`WeightFormat`](crate::WeightFormat) that is not
    /// quantized here (only `q8_0` and `q4_0` are; the others come as blocks).
    NotQuantizable {
        /// The format's name, e.g. `"q4_K"`.
        format: &'static str,
    },
    /// A [`Layer`](crate::Layer) converted to a typed [`Mha<D, E, KV, Q>`](crate::Mha)
    /// (`Mha::try_from`) has other widths than the type's.
    TypedWidths {
        /// The layer's widths `[D, E, KV, Q]`.
        layer: [usize; 4],
        /// The widths `[D, E, KV, Q]` of the type it was converted to.
        typed: [usize; 4],
    },
    /// The value width `V` of a layer whose value heads are not as wide as its key heads is
    /// not `n_kv_heads · dv` for a whole `dv`: no key/value heads (`KV = 0`), a query width
    /// `Q` that is not whole groups of `KV`, or `V` not a multiple of the key/value head
    /// count `KV / head_dim`.
    ValueWidth {
        /// The value width `V`.
        value_width: usize,
        /// The key/value width `KV`.
        kv_width: usize,
        /// The query width `Q`.
        q_width: usize,
    },
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ShapeError::*;
        match *self {
            ZeroHeads => f.write_str("n_heads must be at least 1, got 0"),
            NotDivisible { d_model, n_heads } => messages::not_divisible(f, d_model, n_heads),
            LengthMismatch {
                what,
                expected,
                actual,
            } => messages::length(f, what, expected, actual),
            HeadCountMismatch { expected, actual } => messages::head_count(f, expected, actual),
            KvHeads {
                kv_width,
                head_dim,
                n_heads,
            } => messages::kv_heads(f, kv_width, head_dim, n_heads),
            KeyLength {
                batch,
                length,
                keys,
            } => messages::key_length(f, batch, length, keys),
            TokenLength {
                batch,
                length,
                tokens,
            } => messages::token_length(f, batch, length, tokens),
            SequenceIndex { sequence, batch } => messages::sequence(f, sequence, batch),
            CacheFull {
                sequence,
                capacity,
                cached,
                new,
            } => messages::cache_full(f, sequence, capacity, cached, new),
            CacheMismatch => f.write_str(messages::CACHE_MISMATCH),
            SharedCache {
                what,
                ref needed,
                ref held,
            } => write!(
                f,
                "the shared layer's source KV cache holds {what} {held}, but the call needs {needed}"
            ),
            KvSharedLayer { call } => write!(
                f,
                "{call} on a KV-shared layer, which has no key/value projections: it attends over its source layer's cache (decode_shared_into, decode_shared_paged)"
            ),
            Ragged { what } => write!(
                f,
                "ragged tokens (a length per sequence) cannot be used {what}"
            ),
            RaggedOutput {
                sequence,
                tokens,
                output: Some(output),
            } => write!(
                f,
                "sequence {sequence} of the ragged tokens has {tokens} rows, but its output has {output}"
            ),
            RaggedOutput {
                sequence, tokens, ..
            } => write!(
                f,
                "sequence {sequence} of the ragged tokens has {tokens} rows, but the output has no such ragged sequence"
            ),
            PositionShift { id, delta, reason } => write!(
                f,
                "sequence {id}'s positions cannot move by {delta}: {reason}"
            ),
            TooLarge => f.write_str("shape has more elements than fit in usize"),
            DimensionMismatch {
                what,
                expected,
                actual,
            } => write!(f, "{what} is {actual}, but the call needs {expected}"),
            MaskValue { index, value } => messages::mask_value(f, index, value),
            DecodeNeedsCausal => f.write_str(messages::DECODE_NEEDS_CAUSAL),
            UnsupportedIsa { isa } => {
                write!(f, "instruction set {isa} is not available on this CPU")
            }
            Overflow { what, ref dims } => messages::overflow(f, what, dims),
            AllocationFailed { what, bytes } => messages::allocation(f, what, bytes),
            QueryNotDivisible { q_width, n_heads } => messages::query_width(f, q_width, n_heads),
            Setting {
                what,
                ref value,
                expected,
            } => write!(f, "{what} is {value}, but must be {expected}"),
            RotaryDim {
                rotary_dim,
                head_dim,
            } => messages::rotary_dim(f, rotary_dim, head_dim),
            RopePosition {
                index,
                position,
                max,
            } => messages::rope_position(f, index, position, max),
            RopeCrossAttention => f.write_str(messages::ROPE_CROSS_ATTENTION),
            ZeroWindow => f.write_str("sliding window must be at least 1 key, got 0"),
            WindowNeedsCausal { window } => messages::window_needs_causal(f, window),
            WindowChunk {
                sequence,
                new,
                chunk,
                window,
            } => messages::window_chunk(f, sequence, new, chunk, window),
            WeightRange {
                what,
                index,
                ref value,
                format,
            } => messages::weight_range(f, what, index, value, format),
            BlockWidth {
                what,
                width,
                block,
                format,
            } => messages::block_width(f, what, width, block, format),
            NotQuantizable { format } => messages::not_quantizable(f, format),
            TypedWidths { layer, typed } => messages::typed_widths(f, layer, typed),
            PoolFull {
                needed,
                free,
                blocks,
            } => messages::pool_full(f, needed, free, blocks),
            SequenceId { id, ids } => messages::sequence_id(f, id, ids),
            RepeatedSequence { id, elements } => messages::repeated_sequence(f, id, elements),
            Truncate {
                id,
                length,
                held,
                kept_from,
            } => messages::truncate(f, id, length, held, kept_from),
            ValueWidth {
                value_width,
                kv_width,
                q_width,
            } => write!(
                f,
                "value width {value_width} is not n_kv_heads x dv for the key/value width {kv_width} and query width {q_width}"
            ),
        }
    }
}

/// The text of the [`ShapeError`]s whose messages do not fit one line of its `Display`.
mod messages {
    use super::Count;
    use core::fmt::{Formatter, Result};

    pub(super) fn pool_full(
        f: &mut Formatter<'_>,
        needed: usize,
        free: usize,
        blocks: usize,
    ) -> Result {
        write!(
            f,
            "paged KV cache of {blocks} blocks has {free} free, but the call needs {needed}"
        )
    }

    pub(super) fn sequence_id(f: &mut Formatter<'_>, id: usize, ids: usize) -> Result {
        write!(
            f,
            "sequence id {id} is not a live sequence of the paged KV cache (ids below {ids})"
        )
    }

    pub(super) fn repeated_sequence(
        f: &mut Formatter<'_>,
        id: usize,
        [a, b]: [usize; 2],
    ) -> Result {
        write!(
            f,
            "sequence id {id} is named by batch elements {a} and {b} of one call"
        )
    }

    pub(super) fn truncate(
        f: &mut Formatter<'_>,
        id: usize,
        length: usize,
        held: usize,
        kept_from: usize,
    ) -> Result {
        write!(
            f,
            "sequence {id} holds tokens {kept_from}..{held} and cannot be truncated to {length}"
        )
    }

    pub(super) const CACHE_MISMATCH: &str =
        "KV cache was made by a layer with other key/value heads, head width, instruction set or key/value formats";
    pub(super) const DECODE_NEEDS_CAUSAL: &str =
        "decoding needs a causal layer: a bidirectional one would let tokens see later ones";
    pub(super) const ROPE_CROSS_ATTENTION: &str = "cross_into on a layer with a rotary embedding: \
        rotary positions apply to self-attention only";

    pub(super) fn not_divisible(f: &mut Formatter<'_>, d_model: usize, n_heads: usize) -> Result {
        write!(f, "d_model {d_model} is not divisible by n_heads {n_heads}")
    }

    pub(super) fn length(
        f: &mut Formatter<'_>,
        what: &str,
        expected: usize,
        actual: usize,
    ) -> Result {
        let expected = Count(expected, "element");
        write!(f, "{what} needs {expected}, but the buffer has {actual}")
    }

    pub(super) fn head_count(f: &mut Formatter<'_>, expected: usize, actual: usize) -> Result {
        let expected = Count(expected, "head");
        write!(
            f,
            "head counts differ: queries have {expected}, another buffer has {actual}"
        )
    }

    pub(super) fn kv_heads(
        f: &mut Formatter<'_>,
        kv_width: usize,
        head_dim: usize,
        n_heads: usize,
    ) -> Result {
        write!(
            f,
            "key/value width {kv_width} is not n_kv_heads x head_dim {head_dim} for a head count n_kv_heads dividing n_heads {n_heads}"
        )
    }

    pub(super) fn key_length(
        f: &mut Formatter<'_>,
        batch: usize,
        length: usize,
        keys: usize,
    ) -> Result {
        let keys = Count(keys, "key");
        write!(
            f,
            "key length {length} of batch element {batch} is longer than the {keys}"
        )
    }

    pub(super) fn token_length(
        f: &mut Formatter<'_>,
        batch: usize,
        length: usize,
        tokens: usize,
    ) -> Result {
        let tokens = Count(tokens, "token");
        write!(
            f,
            "token length {length} of batch element {batch} is longer than the call's {tokens}"
        )
    }

    pub(super) fn sequence(f: &mut Formatter<'_>, sequence: usize, batch: usize) -> Result {
        let batch = Count(batch, "sequence");
        write!(f, "sequence {sequence} is past the batch of {batch}")
    }

    pub(super) fn cache_full(
        f: &mut Formatter<'_>,
        sequence: usize,
        capacity: usize,
        cached: usize,
        new: usize,
    ) -> Result {
        let cached = Count(cached, "token");
        write!(
            f,
            "KV cache of capacity {capacity} holds {cached} of sequence {sequence} and cannot take {new} more"
        )
    }

    pub(super) fn mask_value(f: &mut Formatter<'_>, index: usize, value: &str) -> Result {
        write!(
            f,
            "additive mask entry {index} is {value}; entries must be finite or -inf"
        )
    }

    pub(super) fn overflow(f: &mut Formatter<'_>, what: &str, dims: &[usize]) -> Result {
        write!(
            f,
            "{what} of sizes {dims:?} has more elements than fit in memory"
        )
    }

    pub(super) fn allocation(f: &mut Formatter<'_>, what: &str, bytes: usize) -> Result {
        write!(f, "cannot allocate {} for {what}", Count(bytes, "byte"))
    }

    pub(super) fn query_width(f: &mut Formatter<'_>, q_width: usize, n_heads: usize) -> Result {
        write!(
            f,
            "query width {q_width} is not divisible by n_heads {n_heads}"
        )
    }

    pub(super) fn rotary_dim(f: &mut Formatter<'_>, rotary_dim: usize, head_dim: usize) -> Result {
        write!(
            f,
            "rotary_dim {rotary_dim} must be even and at most head_dim {head_dim}"
        )
    }

    pub(super) fn rope_position(
        f: &mut Formatter<'_>,
        index: usize,
        position: usize,
        max: usize,
    ) -> Result {
        write!(
            f,
            "rotary position {position} of token {index} is beyond {max}, the largest whose angles sin_cos reduces exactly"
        )
    }

    pub(super) fn block_width(
        f: &mut Formatter<'_>,
        what: &str,
        width: usize,
        block: usize,
        format: &str,
    ) -> Result {
        write!(
            f,
            "{what} has input width {width}, not a multiple of {format}'s blocks of {block} values"
        )
    }

    pub(super) fn not_quantizable(f: &mut Formatter<'_>, format: &str) -> Result {
        write!(
            f,
            "f32 weights are quantized to q8_0 and q4_0 only, not {format}: give {format} \
             blocks (PackedB::from_blocks)"
        )
    }

    pub(super) fn weight_range(
        f: &mut Formatter<'_>,
        what: &str,
        index: usize,
        value: &str,
        format: &str,
    ) -> Result {
        write!(
            f,
            "{what} element {index} is {value}, which is an infinity in {format}"
        )
    }

    pub(super) fn window_needs_causal(f: &mut Formatter<'_>, window: usize) -> Result {
        write!(
            f,
            "sliding window {window} needs a causal layer; bidirectional windows are not supported"
        )
    }

    pub(super) fn window_chunk(
        f: &mut Formatter<'_>,
        sequence: usize,
        new: usize,
        chunk: usize,
        window: usize,
    ) -> Result {
        let chunk = Count(chunk, "token");
        write!(
            f,
            "rolling KV cache of window {window} takes at most {chunk} per call, but sequence {sequence} appends {new}"
        )
    }

    pub(super) fn typed_widths(
        f: &mut Formatter<'_>,
        layer: [usize; 4],
        typed: [usize; 4],
    ) -> Result {
        let mha = |f: &mut Formatter<'_>, [d, e, kv, q]: [usize; 4]| {
            write!(f, "Mha<{d}, {e}, {kv}, {q}>")
        };
        f.write_str("converting a Layer to ")?;
        mha(f, typed)?;
        let names = [
            "model width (D)",
            "memory width (E)",
            "key/value width (KV)",
            "query width (Q)",
        ];
        let mut whose = ": the layer's";
        for ((name, have), want) in names.into_iter().zip(layer).zip(typed) {
            if have != want {
                write!(f, "{whose} {name} is {have}, not {want}")?;
                whose = "; its";
            }
        }
        f.write_str(" (it converts to ")?;
        mha(f, layer)?;
        f.write_str(")")
    }
}

impl core::error::Error for ShapeError {}

/// A count and its noun, the noun plural unless the count is 1: `1 token`, `2 tokens`, `0 keys`.
pub(crate) struct Count(pub usize, pub &'static str);

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Count(count, noun) = *self;
        let plural = if count == 1 { "" } else { "s" };
        write!(f, "{count} {noun}{plural}")
    }
}

/// `value` when it is finite and not negative, else [`ShapeError::Setting`] naming `what` and
/// the value.
pub(crate) fn finite_non_negative(what: &'static str, value: f32) -> Result<f32, ShapeError> {
    if value.is_finite() && value >= 0.0 {
        return Ok(value);
    }
    Err(ShapeError::Setting {
        what,
        value: alloc::format!("{value:?}"),
        expected: "finite and >= 0",
    })
}

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

/// `Err(DimensionMismatch)` unless `actual == expected`.
pub(crate) fn check_dimension(
    what: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), ShapeError> {
    if actual == expected {
        Ok(())
    } else {
        Err(ShapeError::DimensionMismatch {
            what,
            expected,
            actual,
        })
    }
}
