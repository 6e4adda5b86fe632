//! The fixed start of a GGUF file and the cursor every part of the header is read with.
//!
//! Layout (little-endian): the magic `GGUF`, a `u32` version (2 or 3), a `u64` tensor count, a
//! `u64` metadata count; then the metadata entries, the tensor infos, padding to the
//! alignment, and the data section. A string is a `u64` byte length and that many UTF-8 bytes.

use alloc::string::String;
use alloc::vec::Vec;

use super::error::GgufError;

type Result<T> = core::result::Result<T, GgufError>;

/// A cursor over the first bytes of a file of `file_len` bytes. A read past the bytes given
/// is [`GgufError::Truncated`]; a length or count that the rest of the *file* could not hold
/// is [`GgufError::Corrupt`], found before anything is allocated.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    file_len: u64,
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `bytes`, the first bytes of a file of `file_len` bytes
    /// (`file_len >= bytes.len()`).
    pub(super) fn new(bytes: &'a [u8], file_len: u64) -> Self {
        let file_len = file_len.max(bytes.len() as u64);
        Reader {
            bytes,
            pos: 0,
            file_len,
        }
    }

    /// The offset of the next byte read.
    pub(super) fn offset(&self) -> u64 {
        self.pos as u64
    }

    /// The length of the file.
    pub(super) fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The bytes of the file after the cursor.
    pub(super) fn left(&self) -> u64 {
        self.file_len - self.pos as u64
    }

    /// The next `n` bytes (`what`, for the message when they are not there).
    pub(super) fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        let truncated = || GgufError::Truncated {
            what,
            offset: self.pos as u64,
            needed: n,
            len: self.bytes.len() as u64,
        };
        let n = usize::try_from(n).map_err(|_| truncated())?;
        let end = self.pos.checked_add(n).ok_or_else(truncated)?;
        let slice = self.bytes.get(self.pos..end).ok_or_else(truncated)?;
        self.pos = end;
        Ok(slice)
    }

    /// The next `N` bytes as an array.
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let bytes = self.take(N as u64, what)?;
        // `take` returned exactly N bytes.
        Ok(bytes.try_into().unwrap_or([0; N]))
    }

    /// A `u8`.
    pub(super) fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    /// A little-endian `u16`.
    pub(super) fn u16(&mut self, what: &'static str) -> Result<u16> {
        self.array(what).map(u16::from_le_bytes)
    }

    /// A little-endian `u32`.
    pub(super) fn u32(&mut self, what: &'static str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    /// A little-endian `u64`.
    pub(super) fn u64(&mut self, what: &'static str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A count of items of at least `min_size` bytes each, checked to fit in the rest of the
    /// file (so that no more than the file's bytes are ever reserved for them).
    pub(super) fn count(&mut self, min_size: u64, what: &'static str) -> Result<usize> {
        let at = self.offset();
        let count = self.u64(what)?;
        let fits = count
            .checked_mul(min_size)
            .is_some_and(|bytes| bytes <= self.left());
        match usize::try_from(count) {
            Ok(count) if fits => Ok(count),
            _ => Err(GgufError::Corrupt {
                reason: alloc::format!(
                    "{what} at byte {at} is {count}, but {} bytes are left in the file for items of at least {min_size} bytes",
                    self.left()
                ),
            }),
        }
    }

    /// A string: a `u64` length, checked against the rest of the file, and UTF-8 bytes.
    pub(super) fn string(&mut self, what: &'static str) -> Result<String> {
        let at = self.offset();
        let len = self.u64(what)?;
        if len > self.left() {
            return Err(GgufError::Corrupt {
                reason: alloc::format!(
                    "{what} at byte {at} is {len} bytes long, but only {} bytes are left in the file",
                    self.left()
                ),
            });
        }
        let bytes = self.take(len, what)?;
        let text = core::str::from_utf8(bytes).map_err(|_| GgufError::NotUtf8 { offset: at })?;
        let mut owned = String::new();
        owned
            .try_reserve_exact(text.len())
            .map_err(|_| GgufError::AllocationFailed { bytes: text.len() })?;
        owned.push_str(text);
        Ok(owned)
    }
}

/// `count` items read by `one`, each at least `min_size` bytes in the file: the count was
/// checked against the file's bytes, and the vector is reserved fallibly.
pub(super) fn read_vec<T>(count: usize, mut one: impl FnMut() -> Result<T>) -> Result<Vec<T>> {
    let mut items = Vec::new();
    items
        .try_reserve_exact(count)
        .map_err(|_| GgufError::AllocationFailed {
            bytes: count.saturating_mul(size_of::<T>()),
        })?;
    for _ in 0..count {
        items.push(one()?);
    }
    Ok(items)
}

/// The fixed start of a GGUF file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Start {
    pub version: u32,
    pub tensor_count: usize,
    pub metadata_count: usize,
}

/// The smallest metadata entry: an empty key (8 bytes), a type (4) and a `u8` value.
const MIN_ENTRY: u64 = 13;
/// The smallest tensor info: an empty name (8), no dimensions (4), a type (4), an offset (8).
const MIN_TENSOR_INFO: u64 = 24;

/// Reads the magic, the version and the two counts.
pub(super) fn read_start(r: &mut Reader<'_>) -> Result<Start> {
    let magic = r.bytes.get(..4).unwrap_or(r.bytes);
    if !b"GGUF".starts_with(magic) {
        let mut found = [0; 4];
        found[..magic.len()].copy_from_slice(magic);
        return Err(GgufError::BadMagic { found });
    }
    r.take(4, "the magic")?;
    let version = r.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let tensor_count = r.count(MIN_TENSOR_INFO, "the tensor count")?;
    let metadata_count = r.count(MIN_ENTRY, "the metadata count")?;
    Ok(Start {
        version,
        tensor_count,
        metadata_count,
    })
}
