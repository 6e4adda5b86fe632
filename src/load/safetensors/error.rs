//! [`SafeTensorsError`]: everything that can be wrong with a safetensors buffer or a request.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use super::dtype::Dtype;
use crate::load::json::JsonError;

/// Why a safetensors buffer was rejected, or why a tensor could not be returned as asked.
///
/// Every variant carries the names and numbers involved, and its [`Display`](fmt::Display)
/// text names them, e.g. `tensor "w" has shape [3, 2], expected [2, 3]`.
///
/// Parsing checks the whole header up front (see the [module documentation](super) for the
/// rules), so once [`SafeTensors::parse`](super::SafeTensors::parse) succeeds the accessors can
/// only fail with [`NotFound`](Self::NotFound), [`ShapeMismatch`](Self::ShapeMismatch),
/// [`NotConvertible`](Self::NotConvertible) or, when memory runs out,
/// [`AllocationFailed`](Self::AllocationFailed). Loading a layer from the tensors
/// ([`MhaParams::from_safetensors`](crate::MhaParams::from_safetensors),
/// [`LayerWeights::from_safetensors`](crate::LayerWeights::from_safetensors),
/// [`Checkpoint`](crate::Checkpoint)) fails with a [`LoadError`](crate::LoadError).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SafeTensorsError {
    /// The buffer is shorter than the 8-byte header length that starts every file.
    Truncated {
        /// The buffer's length in bytes.
        len: usize,
    },
    /// The header length runs past the end of the buffer.
    HeaderPastEnd {
        /// The header length read from the first 8 bytes.
        header_len: u64,
        /// The bytes left after those 8.
        available: usize,
    },
    /// The header length exceeds [`MAX_HEADER_LEN`](super::MAX_HEADER_LEN), the limit the
    /// reference implementation also applies.
    HeaderTooLarge {
        /// The header length read from the first 8 bytes.
        header_len: u64,
        /// The limit.
        limit: usize,
    },
    /// The header is not valid UTF-8.
    HeaderNotUtf8 {
        /// Offset within the header of the first byte that is not part of valid UTF-8.
        position: usize,
    },
    /// The header is not valid JSON (or nests arrays and objects too deeply).
    Json {
        /// Byte offset within the header (add 8 for the offset in the file).
        position: usize,
        /// What was expected or found there.
        reason: &'static str,
    },
    /// A value in the header has the wrong JSON type or range, e.g. a shape that is not an
    /// array of non-negative integers, or a header that is not an object.
    WrongType {
        /// The tensor (or `__metadata__`) the value belongs to; empty for the header itself.
        tensor: String,
        /// The field, e.g. `"shape"`, or the metadata key.
        field: String,
        /// What the format requires, e.g. `"an array of non-negative integers"`.
        expected: &'static str,
        /// What the header holds instead, e.g. `"string"` or `"number -1"`.
        found: String,
    },
    /// A tensor entry lacks `dtype`, `shape` or `data_offsets`.
    MissingField {
        /// The tensor.
        tensor: String,
        /// The missing field.
        field: &'static str,
    },
    /// A tensor's `dtype` is not one the format defines.
    UnknownDtype {
        /// The tensor.
        tensor: String,
        /// The dtype string found in the header.
        dtype: String,
    },
    /// The header lists the same tensor name twice, or a tensor handed to the writer is named
    /// `__metadata__`, the header's key for the metadata.
    DuplicateTensor {
        /// The repeated (or reserved) name.
        name: String,
    },
    /// A tensor entry, the `__metadata__` object or the header itself (a second
    /// `__metadata__`) has the same key twice.
    DuplicateKey {
        /// The tensor name, `__metadata__`, or empty for the header.
        object: String,
        /// The repeated key.
        key: String,
    },
    /// A tensor's `data_offsets` are `[begin, end]` with `begin > end`.
    OffsetsReversed {
        /// The tensor.
        tensor: String,
        /// The first offset.
        begin: u64,
        /// The second offset.
        end: u64,
    },
    /// A tensor's `data_offsets` reach past the end of the data region.
    OffsetsOutOfRange {
        /// The tensor.
        tensor: String,
        /// The first offset.
        begin: u64,
        /// The second offset.
        end: u64,
        /// The length of the data region (the bytes after the header).
        data_len: usize,
    },
    /// A tensor's byte range does not match its dtype and shape.
    ByteCountMismatch {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<usize>,
        /// The byte length its `data_offsets` give.
        actual: usize,
    },
    /// A tensor's shape has more elements (or bits) than fit in `usize`.
    ShapeOverflow {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// Two tensors' byte ranges overlap.
    Overlap {
        /// The later tensor (in data order).
        tensor: String,
        /// Where it starts.
        begin: usize,
        /// The tensor it overlaps.
        previous: String,
        /// Where that one ends.
        previous_end: usize,
    },
    /// Bytes between two tensors (or before the first) belong to no tensor.
    Hole {
        /// The tensor after the hole.
        tensor: String,
        /// The first uncovered byte.
        from: usize,
        /// One past the last uncovered byte (where `tensor` starts).
        to: usize,
    },
    /// Bytes after the last tensor belong to no tensor.
    TrailingBytes {
        /// Where the last tensor ends.
        covered: usize,
        /// The length of the data region.
        data_len: usize,
    },
    /// No tensor has this name.
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// A tensor does not have the shape asked for.
    ShapeMismatch {
        /// The tensor.
        tensor: String,
        /// The shape asked for.
        expected: Vec<usize>,
        /// The shape in the file.
        actual: Vec<usize>,
    },
    /// A tensor's dtype cannot be converted to `f32` (only `F32`, `F16` and `BF16` can).
    NotConvertible {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
    },
    /// A tensor handed to the writer has a data length that does not match its shape.
    WriteLengthMismatch {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
        /// What is counted: `"values"` for `f32` data, `"bytes"` for raw data, and
        /// `"bytes (the last partly)"` for raw data of a sub-byte dtype whose elements do not
        /// fill whole bytes (which no data length fits).
        unit: &'static str,
        /// How many the shape needs (rounded up to whole bytes for sub-byte dtypes).
        expected: usize,
        /// How many were given.
        actual: usize,
    },
    /// Memory for a buffer whose size comes from the file (or, when writing, from the
    /// tensors given) could not be allocated.
    AllocationFailed {
        /// What the buffer is for, e.g. `values of tensor "w"`.
        what: String,
        /// The bytes asked for.
        bytes: usize,
    },
    /// Reading or writing a file failed.
    #[cfg(feature = "std")]
    Io {
        /// The path.
        path: String,
        /// The operating system's message.
        message: String,
    },
}

/// The [`SafeTensorsError::WriteLengthMismatch`] unit of raw data of a sub-byte dtype whose
/// elements do not fill whole bytes.
pub(crate) const PARTIAL_BYTE: &str = "bytes (the last partly)";

/// The plural `unit` (`"values"`, `"bytes"`) of a count, singular when the count is 1.
fn singular_if_one(unit: &str, count: usize) -> &str {
    match unit.strip_suffix('s') {
        Some(singular) if count == 1 => singular,
        _ => unit,
    }
}

/// Writes `bits` as whole bytes when it is a multiple of 8, else as bits.
fn bits_or_bytes(f: &mut fmt::Formatter<'_>, bits: u128) -> fmt::Result {
    if bits.is_multiple_of(8) {
        write!(f, "{} bytes", bits / 8)
    } else {
        write!(f, "{bits} bits (not a whole number of bytes)")
    }
}

impl fmt::Display for SafeTensorsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use SafeTensorsError::*;
        match self {
            Truncated { len } => messages::truncated(f, *len),
            HeaderPastEnd {
                header_len,
                available,
            } => messages::header_past_end(f, *header_len, *available),
            HeaderTooLarge { header_len, limit } => messages::too_large(f, *header_len, *limit),
            HeaderNotUtf8 { position } => messages::not_utf8(f, *position),
            Json { position, reason } => write!(f, "bad JSON at header byte {position}: {reason}"),
            WrongType {
                tensor,
                field,
                expected,
                found,
            } => messages::wrong_type(f, tensor, field, expected, found),
            MissingField { tensor, field } => messages::missing_field(f, tensor, field),
            UnknownDtype { tensor, dtype } => messages::unknown_dtype(f, tensor, dtype),
            DuplicateTensor { name } => messages::duplicate_tensor(f, name),
            DuplicateKey { object, key } => messages::duplicate_key(f, object, key),
            OffsetsReversed { tensor, begin, end } => messages::reversed(f, tensor, *begin, *end),
            OffsetsOutOfRange {
                tensor,
                begin,
                end,
                data_len,
            } => messages::offsets_out_of_range(f, tensor, [*begin, *end], *data_len),
            ByteCountMismatch {
                tensor,
                dtype,
                shape,
                actual,
            } => messages::byte_count(f, tensor, *dtype, shape, *actual),
            ShapeOverflow { tensor, shape } => messages::shape_overflow(f, tensor, shape),
            Overlap {
                tensor,
                begin,
                previous,
                previous_end,
            } => messages::overlap(f, (tensor, *begin), (previous, *previous_end)),
            Hole { tensor, from, to } => messages::hole(f, tensor, *from, *to),
            TrailingBytes { covered, data_len } => messages::trailing(f, *covered, *data_len),
            NotFound { name } => write!(f, "no tensor named \"{name}\""),
            ShapeMismatch {
                tensor,
                expected,
                actual,
            } => messages::shape_mismatch(f, tensor, expected, actual),
            NotConvertible { tensor, dtype } => messages::not_convertible(f, tensor, *dtype),
            WriteLengthMismatch {
                tensor,
                shape,
                unit,
                expected,
                actual,
            } => messages::write_length(f, (tensor, shape), unit, *expected, *actual),
            AllocationFailed { what, bytes } => messages::allocation(f, what, *bytes),
            #[cfg(feature = "std")]
            Io { path, message } => write!(f, "{path}: {message}"),
        }
    }
}

/// The text of the [`SafeTensorsError`]s whose messages do not fit one line of its
/// `Display`.
mod messages {
    use core::fmt::{Formatter, Result};

    use super::super::dtype::Dtype;
    use super::super::format::METADATA_KEY;
    use super::{bits_or_bytes, singular_if_one, PARTIAL_BYTE};

    pub(super) fn truncated(f: &mut Formatter<'_>, len: usize) -> Result {
        write!(
            f,
            "buffer of {len} bytes is too short for the 8-byte header length"
        )
    }

    pub(super) fn header_past_end(
        f: &mut Formatter<'_>,
        header_len: u64,
        available: usize,
    ) -> Result {
        write!(
            f,
            "header length {header_len} runs past the end of the buffer: only {available} bytes follow the 8-byte length"
        )
    }

    pub(super) fn too_large(f: &mut Formatter<'_>, header_len: u64, limit: usize) -> Result {
        write!(
            f,
            "header length {header_len} exceeds the limit of {limit} bytes"
        )
    }

    pub(super) fn not_utf8(f: &mut Formatter<'_>, position: usize) -> Result {
        write!(
            f,
            "header is not UTF-8: invalid byte at header offset {position}"
        )
    }

    pub(super) fn missing_field(f: &mut Formatter<'_>, tensor: &str, field: &str) -> Result {
        write!(f, "tensor \"{tensor}\" has no \"{field}\" field")
    }

    pub(super) fn unknown_dtype(f: &mut Formatter<'_>, tensor: &str, dtype: &str) -> Result {
        write!(f, "tensor \"{tensor}\" has unknown dtype \"{dtype}\"")
    }

    pub(super) fn allocation(f: &mut Formatter<'_>, what: &str, bytes: usize) -> Result {
        write!(f, "cannot allocate {bytes} bytes for the {what}")
    }

    pub(super) fn wrong_type(
        f: &mut Formatter<'_>,
        tensor: &str,
        field: &str,
        expected: &str,
        found: &str,
    ) -> Result {
        if tensor.is_empty() && field.is_empty() {
            write!(f, "header must be {expected}, found {found}")
        } else if field.is_empty() {
            write!(f, "\"{tensor}\" must be {expected}, found {found}")
        } else {
            write!(
                f,
                "\"{tensor}\": \"{field}\" must be {expected}, found {found}"
            )
        }
    }

    pub(super) fn duplicate_tensor(f: &mut Formatter<'_>, name: &str) -> Result {
        if name == METADATA_KEY {
            write!(
                f,
                "a tensor cannot be named \"{name}\": the header keeps that key for the metadata"
            )
        } else {
            write!(f, "the header lists \"{name}\" twice")
        }
    }

    pub(super) fn duplicate_key(f: &mut Formatter<'_>, object: &str, key: &str) -> Result {
        if object.is_empty() {
            write!(f, "the header has the key \"{key}\" twice")
        } else {
            write!(f, "\"{object}\" has the key \"{key}\" twice")
        }
    }

    pub(super) fn reversed(f: &mut Formatter<'_>, tensor: &str, begin: u64, end: u64) -> Result {
        write!(
            f,
            "tensor \"{tensor}\" has data_offsets [{begin}, {end}]: begin is after end"
        )
    }

    pub(super) fn offsets_out_of_range(
        f: &mut Formatter<'_>,
        tensor: &str,
        [begin, end]: [u64; 2],
        data_len: usize,
    ) -> Result {
        write!(
            f,
            "tensor \"{tensor}\" has data_offsets [{begin}, {end}] past the end of the {data_len}-byte data region"
        )
    }

    pub(super) fn byte_count(
        f: &mut Formatter<'_>,
        tensor: &str,
        dtype: Dtype,
        shape: &[usize],
        actual: usize,
    ) -> Result {
        let elements = shape
            .iter()
            .fold(1u128, |n, &d| n.saturating_mul(d as u128));
        write!(
            f,
            "tensor \"{tensor}\" of dtype {dtype} and shape {shape:?} ({elements} elements) needs "
        )?;
        bits_or_bytes(f, elements.saturating_mul(dtype.bits() as u128))?;
        write!(f, ", but its data_offsets span {actual} bytes")
    }

    pub(super) fn shape_overflow(f: &mut Formatter<'_>, tensor: &str, shape: &[usize]) -> Result {
        write!(
            f,
            "tensor \"{tensor}\" has shape {shape:?}, whose size overflows usize"
        )
    }

    pub(super) fn overlap(
        f: &mut Formatter<'_>,
        (tensor, begin): (&str, usize),
        (previous, previous_end): (&str, usize),
    ) -> Result {
        write!(
            f,
            "tensor \"{tensor}\" starts at byte {begin}, inside \"{previous}\" which ends at byte {previous_end}"
        )
    }

    pub(super) fn hole(f: &mut Formatter<'_>, tensor: &str, from: usize, to: usize) -> Result {
        write!(
            f,
            "data bytes {from}..{to} before tensor \"{tensor}\" belong to no tensor"
        )
    }

    pub(super) fn trailing(f: &mut Formatter<'_>, covered: usize, data_len: usize) -> Result {
        write!(
            f,
            "data bytes {covered}..{data_len} after the last tensor belong to no tensor"
        )
    }

    pub(super) fn shape_mismatch(
        f: &mut Formatter<'_>,
        tensor: &str,
        expected: &[usize],
        actual: &[usize],
    ) -> Result {
        write!(
            f,
            "tensor \"{tensor}\" has shape {actual:?}, expected {expected:?}"
        )
    }

    pub(super) fn not_convertible(f: &mut Formatter<'_>, tensor: &str, dtype: Dtype) -> Result {
        write!(
            f,
            "tensor \"{tensor}\" has dtype {dtype}, which does not convert to f32 (only F32, F16 and BF16 do)"
        )
    }

    pub(super) fn write_length(
        f: &mut Formatter<'_>,
        (tensor, shape): (&str, &[usize]),
        unit: &str,
        expected: usize,
        actual: usize,
    ) -> Result {
        if unit == PARTIAL_BYTE {
            return write!(
                f,
                "tensor \"{tensor}\" of shape {shape:?} fills {expected} bytes, the last only partly, but a safetensors tensor must fill whole bytes"
            );
        }
        write!(
            f,
            "tensor \"{tensor}\" of shape {shape:?} needs {expected} {}, but {actual} {} given",
            singular_if_one(unit, expected),
            if actual == 1 { "was" } else { "were" }
        )
    }
}

impl core::error::Error for SafeTensorsError {}

impl From<JsonError> for SafeTensorsError {
    fn from(e: JsonError) -> Self {
        match e {
            JsonError::Syntax { position, reason } => SafeTensorsError::Json { position, reason },
            JsonError::AllocationFailed { position, bytes } => SafeTensorsError::AllocationFailed {
                what: format!("header string at byte {position}"),
                bytes,
            },
        }
    }
}

/// Makes room in `buffer` for `additional` more elements, growing it as `push` would, or fails
/// with [`SafeTensorsError::AllocationFailed`] naming `what()`.
pub(crate) fn try_grow<T>(
    buffer: &mut Vec<T>,
    additional: usize,
    what: impl FnOnce() -> String,
) -> Result<(), SafeTensorsError> {
    buffer
        .try_reserve(additional)
        .map_err(|_| SafeTensorsError::AllocationFailed {
            what: what(),
            bytes: additional.saturating_mul(core::mem::size_of::<T>()),
        })
}
