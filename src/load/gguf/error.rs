//! [`GgufError`]: everything that can be wrong with a GGUF file, or with what it asks a layer to
//! be.

use alloc::string::String;
use core::fmt;

use crate::load::config::ConfigError;

/// Why a GGUF file (or one of its tensors, or the model its metadata describes) was rejected.
///
/// Every variant names the offset, key or tensor at fault and the numbers involved, and its
/// [`Display`](fmt::Display) text gives them, e.g. `GGUF: the string at byte 40 is 4294967296
/// bytes long, but only 72 bytes are left in the file`. Parsing checks every count, length and
/// offset against the bytes the file has before it allocates or reads, so a truncated or
/// corrupted file is one of these, never a panic or a huge allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GgufError {
    /// The file does not start with the magic `GGUF`.
    BadMagic {
        /// The first four bytes (fewer when the file is shorter).
        found: [u8; 4],
    },
    /// The version is not 2 or 3 (version 1 used 32-bit counts and is not read).
    UnsupportedVersion {
        /// The version in the file.
        version: u32,
    },
    /// A value runs past the end of the file: `needed` bytes from `offset`, of which the file
    /// (or the buffer given, `len` bytes long) has fewer.
    Truncated {
        /// What was being read, e.g. `"the tensor count"`.
        what: &'static str,
        /// Its offset in the file.
        offset: u64,
        /// The bytes it needs.
        needed: u64,
        /// The bytes there are.
        len: u64,
    },
    /// A count or length cannot be right: more items than the bytes left in the file could
    /// hold, a dimension product or byte size past `u64`, an offset past the data section.
    Corrupt {
        /// What is wrong, naming the numbers.
        reason: String,
    },
    /// A string (a key, a tensor name or a value) is not UTF-8.
    NotUtf8 {
        /// The string's offset in the file.
        offset: u64,
    },
    /// A metadata value type is not one of GGUF's thirteen (0 to 12).
    UnknownValueType {
        /// The key whose value it is.
        key: String,
        /// The type id.
        value_type: u32,
    },
    /// A boolean value is neither 0 nor 1.
    BadBool {
        /// The key whose value it is.
        key: String,
        /// The byte found.
        byte: u8,
    },
    /// Arrays nest deeper than [`MAX_ARRAY_DEPTH`](super::MAX_ARRAY_DEPTH).
    TooDeep {
        /// The key whose value it is.
        key: String,
    },
    /// Two metadata entries have the same key, or two tensors the same name.
    Duplicate {
        /// The key or tensor name.
        name: String,
    },
    /// `general.alignment` is not a power of two that fits the file (or is not a `u32`).
    BadAlignment {
        /// The value, as written.
        value: String,
    },
    /// A tensor's ggml type id is not one this crate knows the block size of.
    UnknownType {
        /// The tensor.
        tensor: String,
        /// The type id.
        type_id: u32,
    },
    /// A tensor's shape does not fit its type: more than four dimensions, or a row length that
    /// is not a multiple of the type's block length.
    BadShape {
        /// The tensor.
        tensor: String,
        /// Why, naming the numbers.
        reason: String,
    },
    /// A tensor's bytes do not lie where they must: its offset is not a multiple of the
    /// alignment, or its bytes run past the end of the file.
    BadOffset {
        /// The tensor.
        tensor: String,
        /// Its offset from the start of the data section.
        offset: u64,
        /// Its byte size.
        bytes: u64,
        /// Why, naming the numbers.
        reason: String,
    },
    /// The tensor's ggml type is not converted to `f32` by this crate (F32, F16, BF16, Q8_0,
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K are).
    NotConvertible {
        /// The tensor.
        tensor: String,
        /// The ggml type's name, e.g. `IQ2_XXS`.
        ggml_type: &'static str,
    },
    /// A metadata key the model needs is absent.
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata value has the wrong type for its key.
    WrongType {
        /// The key.
        key: String,
        /// What the key must hold, e.g. `"an unsigned integer"`.
        expected: &'static str,
        /// The type found, e.g. `"string"`.
        found: &'static str,
    },
    /// Metadata that does not describe an attention layer the crate implements: a value it
    /// does not implement (an architecture, a rope scaling type, a sliding window where the
    /// architecture's layer pattern is not known, a `rope_freqs` tensor:
    /// [`ConfigError::Unsupported`]), or values that cannot describe a layer, alone or
    /// together ([`ConfigError::Invalid`], or the layer's own check), named by their GGUF keys.
    Config(ConfigError),
    /// Memory for a value could not be allocated.
    AllocationFailed {
        /// The bytes asked for.
        bytes: usize,
    },
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgufError::*;
        f.write_str("GGUF")?;
        match self {
            BadMagic { found } => write!(f, ": the file starts with {found:?}, not \"GGUF\""),
            UnsupportedVersion { version } => {
                write!(f, ": version {version} is not supported (2 and 3 are)")
            }
            Truncated {
                what,
                offset,
                needed,
                len,
            } => write!(
                f,
                ": {what} at byte {offset} needs {needed} bytes, but the file ends at byte {len}"
            ),
            Corrupt { reason } => write!(f, ": {reason}"),
            NotUtf8 { offset } => write!(f, ": the string at byte {offset} is not UTF-8"),
            UnknownValueType { key, value_type } => {
                write!(f, ": \"{key}\" has value type {value_type}, not one of 0 to 12")
            }
            BadBool { key, byte } => write!(f, ": \"{key}\" is a bool of byte {byte}, not 0 or 1"),
            TooDeep { key } => write!(
                f,
                ": \"{key}\" nests arrays more than {} deep",
                super::MAX_ARRAY_DEPTH
            ),
            Duplicate { name } => write!(f, ": \"{name}\" appears twice"),
            BadAlignment { value } => write!(
                f,
                ": \"general.alignment\" = {value} must be a u32 power of two"
            ),
            UnknownType { tensor, type_id } => {
                write!(f, ": tensor \"{tensor}\" has the unknown ggml type {type_id}")
            }
            BadShape { tensor, reason } => write!(f, ": tensor \"{tensor}\": {reason}"),
            BadOffset {
                tensor,
                offset,
                bytes,
                reason,
            } => write!(
                f,
                ": tensor \"{tensor}\" ({bytes} bytes at offset {offset} of the data): {reason}"
            ),
            NotConvertible { tensor, ggml_type } => write!(
                f,
                ": tensor \"{tensor}\" has ggml type {ggml_type}, which is not read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K are)"
            ),
            MissingKey { key } => write!(f, ": \"{key}\" is missing"),
            WrongType {
                key,
                expected,
                found,
            } => write!(f, ": \"{key}\" must be {expected}, found {found}"),
            Config(error) => error.describe(f),
            AllocationFailed { bytes } => write!(f, ": cannot allocate {bytes} bytes"),
        }
    }
}

impl core::error::Error for GgufError {}
