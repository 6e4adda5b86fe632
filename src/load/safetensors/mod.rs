//! Reading and writing [safetensors](https://github.com/huggingface/safetensors) files, with
//! no dependencies and without `std`.
//!
//! ## The format
//!
//! ```text
//! [ N: u64, little-endian ][ N bytes: UTF-8 JSON header ][ data region ]
//! ```
//!
//! The header is a JSON object mapping each tensor name to
//! `{"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}`, where the offsets are
//! byte positions in the data region (`end` one past the last byte), plus an optional
//! `"__metadata__"` object of string → string. Tensors are stored row-major, little-endian,
//! packed. A shape of `[]` is a scalar (one element); a shape with a zero dimension is an empty
//! tensor with `begin == end`.
//!
//! ## What parsing checks
//!
//! [`SafeTensors::parse`] validates the whole header before returning, so that no later access
//! can read out of bounds, and follows the rules of the format's reference implementation:
//!
//! - the buffer holds the 8-byte length, and the header fits in the rest
//!   ([`Truncated`](SafeTensorsError::Truncated), [`HeaderPastEnd`](SafeTensorsError::HeaderPastEnd));
//!   the header is at most [`MAX_HEADER_LEN`] bytes ([`HeaderTooLarge`](SafeTensorsError::HeaderTooLarge));
//! - the header is UTF-8 and JSON (RFC 8259: any whitespace, every string escape; trailing
//!   spaces pad it), at most [`MAX_DEPTH`] levels deep, an object
//!   ([`HeaderNotUtf8`](SafeTensorsError::HeaderNotUtf8), [`Json`](SafeTensorsError::Json));
//! - every tensor has a known `dtype`, a `shape` of non-negative integers and two
//!   non-negative integer `data_offsets`; other fields are ignored. `__metadata__` maps
//!   strings to strings (or is `null`). No name or key appears twice, as the format's
//!   notes require ([`WrongType`](SafeTensorsError::WrongType), [`MissingField`](SafeTensorsError::MissingField),
//!   [`UnknownDtype`](SafeTensorsError::UnknownDtype),
//!   [`DuplicateTensor`](SafeTensorsError::DuplicateTensor), [`DuplicateKey`](SafeTensorsError::DuplicateKey));
//! - every tensor's offsets satisfy `begin <= end <= data length`, and `end - begin` is
//!   exactly the product of its shape times its dtype's size, computed without overflow
//!   ([`OffsetsReversed`](SafeTensorsError::OffsetsReversed),
//!   [`OffsetsOutOfRange`](SafeTensorsError::OffsetsOutOfRange),
//!   [`ByteCountMismatch`](SafeTensorsError::ByteCountMismatch), [`ShapeOverflow`](SafeTensorsError::ShapeOverflow));
//! - taken in offset order, the tensors cover the data region exactly: the first starts at 0,
//!   each starts where the previous one ends, the last ends at the end of the buffer. No two
//!   tensors overlap, and no byte — between tensors or after the last — belongs to none (the
//!   reference implementation rejects such files, which could otherwise hide a second file
//!   in the same bytes) ([`Overlap`](SafeTensorsError::Overlap), [`Hole`](SafeTensorsError::Hole),
//!   [`TrailingBytes`](SafeTensorsError::TrailingBytes)).
//!
//! The order of tensors in the header does not matter; [`SafeTensors::tensors`] lists them in
//! data order.
//!
//! ## Loading weights
//!
//! ```
//! use mha::safetensors::{serialize, SafeTensors};
//! use mha::Matrix;
//! // A PyTorch nn.Linear(in_features=2, out_features=3) stores its weight as (out, in) = (3, 2).
//! let weight = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let bytes = serialize(&[("proj.weight", &[3, 2], &weight), ("proj.bias", &[3], &[0.0; 3])], &[])?;
//!
//! let st = SafeTensors::parse(&bytes)?; // borrows `bytes`, copies no tensor data
//! let w: Matrix<2, 3> = st.matrix_transposed("proj.weight")?; // x @ W convention: (in, out)
//! assert_eq!(w[(1, 0)], 2.0);
//! let stored: Matrix<3, 2> = st.matrix("proj.weight")?;
//! assert_eq!(stored.transpose(), w);
//! assert_eq!(st.vector("proj.bias", 3)?, [0.0; 3]);
//! assert!(st.matrix::<2, 3>("proj.weight").is_err()); // shape [3, 2], expected [2, 3]
//! # Ok::<(), mha::safetensors::SafeTensorsError>(())
//! ```
//!
//! ## Loading a whole attention layer
//!
//! A [`Layout`] names where a family keeps one attention layer's tensors; the one loader
//! (`load/checkpoint`) reads every layout through it:
//! [`MhaParams::from_safetensors`](crate::MhaParams::from_safetensors) one self-attention
//! layer by prefix and head count, into the typed parameters;
//! [`LayerWeights::from_safetensors`](crate::LayerWeights::from_safetensors) one layer with
//! its model's config (grouped-query heads, QK-norm, sinks); [`Checkpoint`](crate::Checkpoint)
//! a model directory, reading only the bytes of the tensors it needs.

mod dtype;
mod error;
mod format;
mod header;
mod layout;
mod writer;

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::front::tensor::Matrix;
use crate::kernels::WeightValues;

pub use crate::load::json::MAX_DEPTH;
pub use dtype::{bf16_to_f32, f16_to_f32, Dtype};
pub use error::SafeTensorsError;
pub use format::MAX_HEADER_LEN;
pub use layout::Layout;
pub use writer::{serialize, serialize_index, serialize_raw, RawTensor};

use error::try_grow;
pub(crate) use header::Entry;
use header::{check_layout, parse_header};

/// A tensor stored in the file.
#[derive(Clone)]
struct Stored<'data> {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    offsets: (usize, usize),
    data: &'data [u8],
}

impl<'data> Stored<'data> {
    /// The tensor an entry checked by [`check_layout`] describes, within the data region.
    fn new(entry: Entry, data: &'data [u8]) -> Result<Self, SafeTensorsError> {
        let Entry {
            name,
            dtype,
            shape,
            begin,
            end,
        } = entry;
        // check_layout guarantees begin <= end <= data.len(), so the conversions are exact and
        // the range is inside `data`.
        let offsets = (begin as usize, end as usize);
        let bytes = data
            .get(offsets.0..offsets.1)
            .ok_or(SafeTensorsError::OffsetsOutOfRange {
                tensor: name.clone(),
                begin,
                end,
                data_len: data.len(),
            })?;
        Ok(Stored {
            name,
            dtype,
            shape,
            offsets,
            data: bytes,
        })
    }
}

/// The header length a file's first 8 bytes give, checked against [`MAX_HEADER_LEN`] and
/// against the `available` bytes after them.
pub(crate) fn header_len(first: [u8; 8], available: u64) -> Result<usize, SafeTensorsError> {
    let header_len = u64::from_le_bytes(first);
    if header_len > MAX_HEADER_LEN as u64 {
        return Err(SafeTensorsError::HeaderTooLarge {
            header_len,
            limit: MAX_HEADER_LEN,
        });
    }
    match usize::try_from(header_len) {
        Ok(len) if header_len <= available => Ok(len),
        _ => Err(SafeTensorsError::HeaderPastEnd {
            header_len,
            available: usize::try_from(available).unwrap_or(usize::MAX),
        }),
    }
}

/// The tensors a header describes, checked (UTF-8, JSON, fields, offsets) against a data
/// region of `data_len` bytes, in data order; and the metadata.
pub(crate) fn read_header(
    header: &[u8],
    data_len: usize,
) -> Result<(Vec<Entry>, BTreeMap<String, String>), SafeTensorsError> {
    let text = core::str::from_utf8(header).map_err(|e| SafeTensorsError::HeaderNotUtf8 {
        position: e.valid_up_to(),
    })?;
    let parsed = parse_header(text)?;
    let mut entries = parsed.entries;
    check_layout(&mut entries, data_len)?;
    Ok((entries, parsed.metadata))
}

/// Splits a file into its header and its data region, checking the length prefix.
fn split_file(bytes: &[u8]) -> Result<(&[u8], &[u8]), SafeTensorsError> {
    let Some((len_bytes, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(SafeTensorsError::Truncated { len: bytes.len() });
    };
    let split = header_len(*len_bytes, rest.len() as u64)?;
    Ok(rest.split_at(split))
}

/// A parsed safetensors buffer: the header, checked, over the borrowed bytes.
///
/// Parsing copies no tensor data; accessors convert on demand. See the
/// [module documentation](self) for what [`parse`](Self::parse) checks.
///
/// ```
/// use mha::safetensors::{serialize, Dtype, SafeTensors};
/// let bytes = serialize(&[("a", &[2], &[1.0, 2.0]), ("b", &[], &[3.0])], &[("k", "v")])?;
/// let st = SafeTensors::parse(&bytes)?;
/// assert_eq!(st.len(), 2);
/// for t in st.tensors() {
///     assert_eq!(t.dtype(), Dtype::F32);
///     println!("{} {:?} {} bytes", t.name(), t.shape(), t.data().len());
/// }
/// assert_eq!(st.metadata().get("k").map(String::as_str), Some("v"));
/// # Ok::<(), mha::safetensors::SafeTensorsError>(())
/// ```
#[derive(Clone)]
pub struct SafeTensors<'data> {
    /// In data order.
    tensors: Vec<Stored<'data>>,
    /// Indices into `tensors`, sorted by name.
    by_name: Vec<usize>,
    metadata: BTreeMap<String, String>,
}

impl core::fmt::Debug for SafeTensors<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SafeTensors")
            .field("tensors", &self.tensors().collect::<Vec<_>>())
            .field("metadata", &self.metadata)
            .finish()
    }
}

impl<'data> SafeTensors<'data> {
    /// Parses and checks a whole safetensors file held in `bytes`, borrowing it.
    ///
    /// # Errors
    /// Any of the format errors listed in the [module documentation](self), naming the
    /// tensor, field or byte position at fault.
    ///
    /// ```
    /// use mha::safetensors::{SafeTensors, SafeTensorsError};
    /// let header = br#"{"x": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}"#;
    /// let mut file = (header.len() as u64).to_le_bytes().to_vec();
    /// file.extend_from_slice(header);
    /// file.extend_from_slice(&1.5f32.to_le_bytes());
    /// assert_eq!(SafeTensors::parse(&file)?.tensor_f32("x")?.1, [1.5]);
    ///
    /// let err = SafeTensors::parse(&file[..file.len() - 1]).unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     r#"tensor "x" has data_offsets [0, 4] past the end of the 3-byte data region"#
    /// );
    /// # Ok::<(), SafeTensorsError>(())
    /// ```
    pub fn parse(bytes: &'data [u8]) -> Result<Self, SafeTensorsError> {
        let (header, data) = split_file(bytes)?;
        let (entries, metadata) = read_header(header, data.len())?;
        let tensors = entries
            .into_iter()
            .map(|entry| Stored::new(entry, data))
            .collect::<Result<Vec<_>, _>>()?;
        let mut by_name: Vec<usize> = (0..tensors.len()).collect();
        // Names are unique (parse_header checked), so the order is total.
        by_name.sort_unstable_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name));
        Ok(SafeTensors {
            tensors,
            by_name,
            metadata,
        })
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the file holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The `__metadata__` strings (empty when the header has none).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// All tensors, in the order of their data.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = TensorView<'_>> + '_ {
        self.tensors.iter().map(TensorView::new)
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.by_name.iter().map(|&i| self.tensors[i].name.as_str())
    }

    /// The tensor called `name`, if any.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let i = self
            .by_name
            .binary_search_by(|&i| self.tensors[i].name.as_str().cmp(name))
            .ok()?;
        self.tensors.get(*self.by_name.get(i)?).map(TensorView::new)
    }

    /// The tensor called `name`.
    ///
    /// # Errors
    /// [`SafeTensorsError::NotFound`] when there is none.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, SafeTensorsError> {
        self.get(name).ok_or_else(|| SafeTensorsError::NotFound {
            name: name.to_owned(),
        })
    }

    /// The shape and the values of tensor `name`, converted to `f32` (exactly, from `F32`,
    /// `F16` or `BF16`).
    ///
    /// # Errors
    /// [`SafeTensorsError::NotFound`], or [`SafeTensorsError::NotConvertible`] for any other
    /// dtype.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), SafeTensorsError> {
        let t = self.tensor(name)?;
        Ok((t.shape().to_vec(), t.to_f32()?))
    }

    /// The tensor `name`, checked to have shape `expected`, as `f32`.
    fn with_shape(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>, SafeTensorsError> {
        let t = self.tensor(name)?;
        if t.shape() != expected {
            return Err(SafeTensorsError::ShapeMismatch {
                tensor: name.to_owned(),
                expected: expected.to_vec(),
                actual: t.shape().to_vec(),
            });
        }
        t.to_f32()
    }

    /// The 2-D tensor `name`, stored with shape exactly `[R, C]`, as a [`Matrix<R, C>`].
    ///
    /// # Errors
    /// [`SafeTensorsError::NotFound`], [`SafeTensorsError::ShapeMismatch`] naming both
    /// shapes, [`SafeTensorsError::NotConvertible`].
    pub fn matrix<const R: usize, const C: usize>(
        &self,
        name: &str,
    ) -> Result<Matrix<R, C>, SafeTensorsError> {
        let values = self.with_shape(name, &[R, C])?;
        let len = values.len();
        // Cannot fail: parsing checked that the byte count matches the shape [R, C].
        Matrix::from_vec(values).map_err(|_| SafeTensorsError::ShapeMismatch {
            tensor: name.to_owned(),
            expected: vec![R, C],
            actual: vec![len],
        })
    }

    /// The 2-D tensor `name`, stored with shape `[C, R]`, transposed into a [`Matrix<R, C>`].
    ///
    /// PyTorch's `nn.Linear(in, out)` stores its weight as `(out, in)`; this crate multiplies
    /// `x @ W` with `W` of shape `(in, out)`, so `matrix_transposed::<IN, OUT>` loads it.
    ///
    /// # Errors
    /// As [`matrix`](Self::matrix), with the stored shape expected to be `[C, R]`.
    pub fn matrix_transposed<const R: usize, const C: usize>(
        &self,
        name: &str,
    ) -> Result<Matrix<R, C>, SafeTensorsError> {
        Ok(self.matrix::<C, R>(name)?.transpose())
    }

    /// The 1-D tensor `name` (e.g. a bias), stored with shape exactly `[len]`, as `f32`.
    ///
    /// # Errors
    /// [`SafeTensorsError::NotFound`], [`SafeTensorsError::ShapeMismatch`],
    /// [`SafeTensorsError::NotConvertible`].
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, SafeTensorsError> {
        self.with_shape(name, &[len])
    }
}

/// One tensor of a [`SafeTensors`]: its name, dtype, shape and raw bytes.
///
/// Its `Debug` output shows the byte range, not the bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TensorView<'a> {
    name: &'a str,
    dtype: Dtype,
    shape: &'a [usize],
    offsets: (usize, usize),
    data: &'a [u8],
}

impl core::fmt::Debug for TensorView<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TensorView")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("data_offsets", &self.offsets)
            .finish()
    }
}

impl<'a> TensorView<'a> {
    fn new(s: &'a Stored<'_>) -> Self {
        TensorView {
            name: &s.name,
            dtype: s.dtype,
            shape: &s.shape,
            offsets: s.offsets,
            data: s.data,
        }
    }

    /// The tensor's name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The shape, outermost dimension first; `[]` for a scalar.
    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }

    /// The number of elements: the product of the shape (1 for a scalar).
    pub fn element_count(&self) -> usize {
        // Checked not to overflow when the file was parsed.
        self.shape.iter().fold(1, |n, &d| n.saturating_mul(d))
    }

    /// `[begin, end]`: the byte range within the data region, as in the header.
    pub fn data_offsets(&self) -> (usize, usize) {
        self.offsets
    }

    /// The raw little-endian bytes, borrowed from the buffer.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The values converted to `f32`, row-major. `F32` is read as is, `F16` and `BF16` are
    /// widened exactly ([`f16_to_f32`], [`bf16_to_f32`]); the bytes need no alignment.
    ///
    /// # Errors
    /// [`SafeTensorsError::NotConvertible`] naming any other dtype;
    /// [`SafeTensorsError::AllocationFailed`] when the values do not fit in memory.
    pub fn to_f32(&self) -> Result<Vec<f32>, SafeTensorsError> {
        decode_f32(self.name, self.dtype, self.data)
    }
}

/// The values of tensor `name`, stored as `dtype` in `data` (exactly as many bytes as its
/// values take), converted to `f32`: `F32` as is, `F16` and `BF16` widened exactly; the bytes
/// need no alignment.
///
/// # Errors
/// [`SafeTensorsError::NotConvertible`] naming any other dtype;
/// [`SafeTensorsError::AllocationFailed`] when the values do not fit in memory.
pub(crate) fn decode_f32(
    name: &str,
    dtype: Dtype,
    data: &[u8],
) -> Result<Vec<f32>, SafeTensorsError> {
    fn halves(data: &[u8], widen: fn(u16) -> f32) -> impl Iterator<Item = f32> + '_ {
        data.as_chunks::<2>()
            .0
            .iter()
            .map(move |&b| widen(u16::from_le_bytes(b)))
    }
    if !dtype.converts_to_f32() {
        return Err(SafeTensorsError::NotConvertible {
            tensor: name.to_owned(),
            dtype,
        });
    }
    let mut values = Vec::new();
    try_grow(&mut values, data.len() * 8 / dtype.bits(), || {
        format!("values of tensor \"{name}\"")
    })?;
    match dtype {
        Dtype::F16 => values.extend(halves(data, f16_to_f32)),
        Dtype::BF16 => values.extend(halves(data, bf16_to_f32)),
        // F32, the one other dtype that converts.
        _ => values.extend(
            data.as_chunks::<4>()
                .0
                .iter()
                .map(|&b| f32::from_le_bytes(b)),
        ),
    }
    Ok(values)
}

/// The values of tensor `name` as [`decode_f32`] reads them, but kept in their format:
/// `BF16` and `F16` tensors as their bits (nothing widened), `F32` as values.
///
/// # Errors
/// As [`decode_f32`].
pub(crate) fn decode_stored(
    name: &str,
    dtype: Dtype,
    data: &[u8],
) -> Result<WeightValues, SafeTensorsError> {
    let bits = || {
        let mut bits = Vec::new();
        try_grow(&mut bits, data.len() / 2, || {
            format!("values of tensor \"{name}\"")
        })?;
        let chunks = data.as_chunks::<2>().0.iter();
        bits.extend(chunks.map(|&b| u16::from_le_bytes(b)));
        Ok(bits)
    };
    match dtype {
        Dtype::BF16 => bits().map(WeightValues::Bf16),
        Dtype::F16 => bits().map(WeightValues::F16),
        _ => decode_f32(name, dtype, data).map(WeightValues::F32),
    }
}

/// Reads a whole file into memory, to [`parse`](SafeTensors::parse) from.
///
/// ```no_run
/// use mha::safetensors::{read_file, SafeTensors};
/// let bytes = read_file("model.safetensors")?;
/// let st = SafeTensors::parse(&bytes)?;
/// # Ok::<(), mha::safetensors::SafeTensorsError>(())
/// ```
///
/// # Errors
/// [`SafeTensorsError::Io`] naming the path and the operating system's message.
#[cfg(feature = "std")]
pub fn read_file(path: impl AsRef<std::path::Path>) -> Result<Vec<u8>, SafeTensorsError> {
    let path = path.as_ref();
    std::fs::read(path).map_err(|e| io_error(path, &e))
}

/// Writes `F32` tensors and metadata to a file, as [`serialize`] lays them out.
///
/// # Errors
/// The errors of [`serialize`], or [`SafeTensorsError::Io`] naming the path.
#[cfg(feature = "std")]
pub fn write_file(
    path: impl AsRef<std::path::Path>,
    tensors: &[(&str, &[usize], &[f32])],
    metadata: &[(&str, &str)],
) -> Result<(), SafeTensorsError> {
    let path = path.as_ref();
    let bytes = serialize(tensors, metadata)?;
    std::fs::write(path, bytes).map_err(|e| io_error(path, &e))
}

#[cfg(feature = "std")]
fn io_error(path: &std::path::Path, e: &std::io::Error) -> SafeTensorsError {
    use std::string::ToString;
    SafeTensorsError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}
