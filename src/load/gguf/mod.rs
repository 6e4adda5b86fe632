//! GGUF, llama.cpp's model format: reading a file's header (metadata and tensor infos) and
//! its tensors, without `std`, from a byte slice.
//!
//! A GGUF file (versions 2 and 3, little-endian) is the magic `GGUF`, a `u32` version, a
//! `u64` tensor count and a `u64` metadata count; the metadata entries (a string key, a `u32`
//! value type, the value: integers of 8 to 64 bits, `f32`, `f64`, bools, strings and arrays
//! of any of them, arrays included); the tensor infos (a name, up to four `u64`
//! dimensions with the row length first, a ggml type, a `u64` offset); padding to
//! `general.alignment` (32 when absent); then the data section, where each tensor's bytes
//! start at its offset (a multiple of the alignment).
//!
//! [`Gguf::parse`] checks all of it before returning: every count and length against the bytes
//! the file has left (so nothing is allocated for items that could not be there), every
//! product and sum of dimensions, byte sizes and offsets with checked arithmetic, each row a
//! whole number of its type's blocks, each tensor's bytes inside the file, names and keys
//! unique. A truncated or corrupted file is a [`GgufError`] naming the offset or tensor and
//! the numbers, never a panic.
//!
//! [`dequantize`] turns a tensor's bytes into `f32` values: F32, F16, BF16, and the block
//! types Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K exactly as ggml's reference
//! dequantizers compute them. [`Checkpoint::open`](crate::Checkpoint::open) reads the
//! attention layers of a `.gguf` file through this module.
//!
//! ```
//! use mha::gguf::{Gguf, GgmlType, Value};
//! // A version 3 file: one metadata entry, one 2 x 2 F32 tensor.
//! let mut file = Vec::new();
//! file.extend(b"GGUF");
//! file.extend(3u32.to_le_bytes());
//! file.extend(1u64.to_le_bytes()); // tensors
//! file.extend(1u64.to_le_bytes()); // metadata entries
//! let string = |s: &str| [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat();
//! file.extend(string("general.architecture"));
//! file.extend(8u32.to_le_bytes()); // a string value
//! file.extend(string("llama"));
//! file.extend(string("w"));
//! file.extend(2u32.to_le_bytes()); // dimensions
//! file.extend(2u64.to_le_bytes());
//! file.extend(2u64.to_le_bytes());
//! file.extend(0u32.to_le_bytes()); // F32
//! file.extend(0u64.to_le_bytes()); // offset in the data section
//! file.resize(file.len().next_multiple_of(32), 0); // padding to the alignment
//! for x in [1.0f32, 2.0, 3.0, 4.0] {
//!     file.extend(x.to_le_bytes());
//! }
//!
//! let gguf = Gguf::parse(&file)?;
//! assert_eq!(gguf.metadata()["general.architecture"], Value::String("llama".into()));
//! let w = gguf.tensor("w").unwrap();
//! assert_eq!((w.ggml_type, w.shape()), (GgmlType::F32, vec![2, 2]));
//! assert_eq!(gguf.tensor_f32(&file, "w")?, [1.0, 2.0, 3.0, 4.0]);
//!
//! // Every prefix of the file is an error, not a panic.
//! for len in 0..file.len() {
//!     assert!(Gguf::parse(&file[..len]).is_err());
//! }
//! # Ok::<(), mha::gguf::GgufError>(())
//! ```

#[cfg(feature = "std")]
pub(crate) mod checkpoint;
mod config;
mod error;
mod header;
mod metadata;
mod quant;
mod tensors;

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

pub use error::GgufError;
pub use metadata::{Array, Metadata, Value, MAX_ARRAY_DEPTH};
pub use quant::dequantize;
pub use tensors::{GgmlType, TensorInfo, MAX_DIMS};

use header::{read_start, Reader};

type Result<T> = core::result::Result<T, GgufError>;

/// The alignment of the data section and of each tensor's offset when the file does not set
/// `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A GGUF file's header, parsed and checked: its version, metadata, tensor infos and where
/// its data section starts. It owns what it read, so the bytes need not outlive it; a
/// tensor's values are read from the file's bytes with [`tensor_f32`](Self::tensor_f32).
#[derive(Clone, Debug)]
pub struct Gguf {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    /// Index into `tensors` by name.
    by_name: BTreeMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

impl Gguf {
    /// Parses the header of the GGUF file `bytes` (the whole file) and checks every tensor's
    /// bytes lie inside it.
    ///
    /// # Errors
    /// A [`GgufError`] naming what is wrong, where, and the numbers.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        Self::parse_prefix(bytes, bytes.len() as u64)
    }

    /// Parses the header from `prefix`, the first bytes of a file of `file_len` bytes: the
    /// counts, lengths and tensor ranges are checked against `file_len`, and a header that
    /// runs past `prefix` is [`GgufError::Truncated`] with `len` the prefix's length (read
    /// more of the file and try again).
    pub(crate) fn parse_prefix(prefix: &[u8], file_len: u64) -> Result<Self> {
        let mut r = Reader::new(prefix, file_len);
        let start = read_start(&mut r)?;
        let metadata = metadata::read_metadata(&mut r, start.metadata_count)?;
        let tensors = tensors::read_infos(&mut r, start.tensor_count)?;
        let alignment = alignment(&metadata)?;
        let header_end = r.offset();
        let data_start = header_end
            .checked_next_multiple_of(alignment)
            .filter(|&start| start <= r.file_len())
            .ok_or_else(|| GgufError::Truncated {
                what: "the padding before the data section",
                offset: header_end,
                needed: alignment - header_end % alignment,
                len: r.file_len(),
            })?;
        let mut by_name = BTreeMap::new();
        for (i, t) in tensors.iter().enumerate() {
            check_range(t, alignment, r.file_len() - data_start)?;
            if by_name.insert(t.name.clone(), i).is_some() {
                return Err(GgufError::Duplicate {
                    name: t.name.clone(),
                });
            }
        }
        Ok(Gguf {
            version: start.version,
            metadata,
            tensors,
            by_name,
            alignment,
            data_start,
        })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata, by key.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The tensor infos, in the file's order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor `name`, if the file has it.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The alignment of the data section and the tensors' offsets (`general.alignment`, else
    /// [`DEFAULT_ALIGNMENT`]).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The offset in the file where the data section starts.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// The byte range in the file of tensor `t`'s bytes (checked to be inside the file when
    /// `t` is one of [`tensors`](Self::tensors)).
    pub fn range(&self, t: &TensorInfo) -> core::ops::Range<u64> {
        // Checked when parsed for the file's own infos; saturating for any other.
        let begin = self.data_start.saturating_add(t.offset);
        begin..begin.saturating_add(t.bytes)
    }

    /// The values of tensor `name` of the file `bytes` (the bytes this header was parsed
    /// from), as `f32` ([`dequantize`]).
    ///
    /// # Errors
    /// [`GgufError::MissingKey`] naming a tensor the file does not have, and those of
    /// [`dequantize`].
    pub fn tensor_f32(&self, bytes: &[u8], name: &str) -> Result<Vec<f32>> {
        let t = self.tensor(name).ok_or_else(|| GgufError::MissingKey {
            key: String::from(name),
        })?;
        let range = self.range(t);
        let data = usize::try_from(range.start)
            .ok()
            .zip(usize::try_from(range.end).ok())
            .and_then(|(begin, end)| bytes.get(begin..end));
        let data = data.ok_or(GgufError::Truncated {
            what: "a tensor's bytes",
            offset: range.start,
            needed: t.bytes,
            len: bytes.len() as u64,
        })?;
        dequantize(name, t.ggml_type, data)
    }
}

/// `general.alignment`: a `u32` power of two, 32 when absent.
fn alignment(metadata: &Metadata) -> Result<u64> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(other) => Err(GgufError::BadAlignment {
            value: format!("{other:?}"),
        }),
    }
}

/// Checks that tensor `t`'s offset is a multiple of `alignment` and its bytes end within the
/// `data_len` bytes of the data section.
fn check_range(t: &TensorInfo, alignment: u64, data_len: u64) -> Result<()> {
    let reason = if !t.offset.is_multiple_of(alignment) {
        format!("the offset is not a multiple of the alignment {alignment}")
    } else if t
        .offset
        .checked_add(t.bytes)
        .is_none_or(|end| end > data_len)
    {
        format!("the bytes run past the end of the data section, {data_len} bytes long")
    } else {
        return Ok(());
    };
    Err(GgufError::BadOffset {
        tensor: t.name.clone(),
        offset: t.offset,
        bytes: t.bytes,
        reason,
    })
}
