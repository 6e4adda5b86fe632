//! Writing safetensors files.

use alloc::borrow::ToOwned;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

use super::dtype::Dtype;
use super::error::{try_grow, SafeTensorsError, PARTIAL_BYTE};
use super::format::METADATA_KEY;
use super::header::{need, Need};

/// One tensor for [`serialize_raw`]: name, dtype, shape and its little-endian bytes.
pub type RawTensor<'a> = (&'a str, Dtype, &'a [usize], &'a [u8]);

/// Appends `s` as a JSON string literal: quotes, backslashes and control characters escaped,
/// everything else (non-ASCII included) as UTF-8.
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Fails when a name appears twice in `names` (or a tensor is called `__metadata__`).
fn check_unique<'a>(
    names: impl Iterator<Item = &'a str>,
    reserved: Option<&str>,
    duplicate: impl Fn(&str) -> SafeTensorsError,
) -> Result<(), SafeTensorsError> {
    let mut sorted: Vec<&str> = names.collect();
    if let Some(name) = sorted.iter().find(|n| Some(**n) == reserved) {
        return Err(duplicate(name));
    }
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(duplicate(w[0])),
        None => Ok(()),
    }
}

/// A tensor about to be written: its header fields and its byte length.
struct Planned<'a> {
    name: &'a str,
    dtype: Dtype,
    shape: &'a [usize],
    len: usize,
}

fn overflow(name: &str, shape: &[usize]) -> SafeTensorsError {
    SafeTensorsError::ShapeOverflow {
        tensor: name.to_owned(),
        shape: shape.to_vec(),
    }
}

/// Checks the names, then writes the length prefix and the padded header into a buffer with
/// room for the data.
fn start_file(
    tensors: &[Planned<'_>],
    metadata: &[(&str, &str)],
) -> Result<Vec<u8>, SafeTensorsError> {
    check_unique(tensors.iter().map(|t| t.name), Some(METADATA_KEY), |name| {
        SafeTensorsError::DuplicateTensor {
            name: name.to_owned(),
        }
    })?;
    check_unique(metadata.iter().map(|m| m.0), None, |key| {
        SafeTensorsError::DuplicateKey {
            object: METADATA_KEY.to_owned(),
            key: key.to_owned(),
        }
    })?;

    let mut header = String::from("{");
    push_metadata(&mut header, metadata);
    if !metadata.is_empty() && !tensors.is_empty() {
        header.push(',');
    }
    let data_len = push_tensors(&mut header, tensors)?;
    header.push('}');
    while !header.len().is_multiple_of(8) {
        header.push(' ');
    }

    let mut out = Vec::new();
    let total = (8 + header.len()).saturating_add(data_len);
    try_grow(&mut out, total, || "serialized file".to_owned())?;
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    Ok(out)
}

/// Appends the `__metadata__` member to `header` (nothing when `metadata` is empty).
fn push_metadata(header: &mut String, metadata: &[(&str, &str)]) {
    if metadata.is_empty() {
        return;
    }
    push_json_string(header, METADATA_KEY);
    header.push_str(":{");
    for (i, (key, value)) in metadata.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        push_json_string(header, key);
        header.push(':');
        push_json_string(header, value);
    }
    header.push('}');
}

/// Appends one member per tensor to `header`, their data laid out back to back from offset 0
/// in the order given; returns the length of the data region.
fn push_tensors(header: &mut String, tensors: &[Planned<'_>]) -> Result<usize, SafeTensorsError> {
    let mut offset = 0usize;
    for (i, t) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        push_json_string(header, t.name);
        let _ = write!(header, ":{{\"dtype\":\"{}\",\"shape\":[", t.dtype);
        for (j, d) in t.shape.iter().enumerate() {
            let _ = write!(header, "{}{d}", if j > 0 { "," } else { "" });
        }
        let end = offset
            .checked_add(t.len)
            .ok_or_else(|| overflow(t.name, t.shape))?;
        let _ = write!(header, "],\"data_offsets\":[{offset},{end}]}}");
        offset = end;
    }
    Ok(offset)
}

/// Writes a safetensors file holding `tensors` of any dtype, given as raw little-endian
/// bytes, and the string → string `metadata` (omitted from the header when empty).
///
/// Tensors are laid out in the order given, back to back. The header is padded with spaces
/// so that the data starts at a multiple of 8 bytes, as the reference implementation does.
///
/// # Errors
/// [`SafeTensorsError::WriteLengthMismatch`] when a tensor's bytes do not match its dtype and
/// shape (sub-byte dtypes must fill whole bytes), [`SafeTensorsError::ShapeOverflow`] when a
/// size overflows `usize`, [`SafeTensorsError::DuplicateTensor`] for a repeated name (or one
/// called `__metadata__`), [`SafeTensorsError::DuplicateKey`] for a repeated metadata key.
///
/// ```
/// use mha::safetensors::{serialize_raw, Dtype, SafeTensors};
/// let ids: Vec<u8> = [0i64, 1, 2].iter().flat_map(|i| i.to_le_bytes()).collect();
/// let bytes = serialize_raw(&[("position_ids", Dtype::I64, &[1, 3], &ids)], &[])?;
/// let st = SafeTensors::parse(&bytes)?;
/// assert_eq!(st.tensor("position_ids")?.dtype(), Dtype::I64);
/// assert_eq!(st.tensor("position_ids")?.data(), &ids[..]);
/// # Ok::<(), mha::safetensors::SafeTensorsError>(())
/// ```
pub fn serialize_raw(
    tensors: &[RawTensor<'_>],
    metadata: &[(&str, &str)],
) -> Result<Vec<u8>, SafeTensorsError> {
    let mut planned = Vec::with_capacity(tensors.len());
    for &(name, dtype, shape, data) in tensors {
        let (expected, unit) = match need(dtype, shape) {
            Need::Bytes(bytes) => (bytes, "bytes"),
            Need::PartialByte(bits) => (bits.div_ceil(8), PARTIAL_BYTE),
            Need::Overflow => return Err(overflow(name, shape)),
        };
        if expected != data.len() || unit == PARTIAL_BYTE {
            return Err(SafeTensorsError::WriteLengthMismatch {
                tensor: name.to_owned(),
                shape: shape.to_vec(),
                unit,
                expected,
                actual: data.len(),
            });
        }
        planned.push(Planned {
            name,
            dtype,
            shape,
            len: data.len(),
        });
    }
    let mut out = start_file(&planned, metadata)?;
    for &(_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    Ok(out)
}

/// Writes a safetensors file of `F32` tensors, each given as `(name, shape, row-major values)`,
/// with the string → string `metadata`. See [`serialize_raw`] for the layout.
///
/// A shape of `[]` is a scalar (one value); a shape with a zero dimension holds no values.
///
/// # Errors
/// [`SafeTensorsError::WriteLengthMismatch`] when a tensor has not exactly as many values as
/// its shape needs; the other errors of [`serialize_raw`].
///
/// ```
/// use mha::safetensors::{serialize, SafeTensors};
/// let bytes = serialize(
///     &[("bias", &[3], &[0.5, -1.0, 2.0]), ("scale", &[], &[4.0])],
///     &[("format", "pt")],
/// )?;
/// assert_eq!((bytes.len() - 16) % 8, 0); // 8 + padded header + 16 data bytes
/// let st = SafeTensors::parse(&bytes)?;
/// assert_eq!(st.vector("bias", 3)?, [0.5, -1.0, 2.0]);
/// assert_eq!(st.tensor_f32("scale")?, (vec![], vec![4.0]));
/// assert_eq!(st.metadata()["format"], "pt");
/// # Ok::<(), mha::safetensors::SafeTensorsError>(())
/// ```
pub fn serialize(
    tensors: &[(&str, &[usize], &[f32])],
    metadata: &[(&str, &str)],
) -> Result<Vec<u8>, SafeTensorsError> {
    let mut planned = Vec::with_capacity(tensors.len());
    for &(name, shape, values) in tensors {
        let elements = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| overflow(name, shape))?;
        if elements != values.len() {
            return Err(SafeTensorsError::WriteLengthMismatch {
                tensor: name.to_owned(),
                shape: shape.to_vec(),
                unit: "values",
                expected: elements,
                actual: values.len(),
            });
        }
        planned.push(Planned {
            name,
            dtype: Dtype::F32,
            shape,
            len: values.len() * 4,
        });
    }
    let mut out = start_file(&planned, metadata)?;
    for &(_, _, values) in tensors {
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    Ok(out)
}

/// The text of a sharded checkpoint's `model.safetensors.index.json`: `{"metadata":
/// {"total_size": total_size}, "weight_map": {tensor: file, ...}}` with the entries in the
/// order given (`total_size` is the bytes of all tensors' data, as `transformers` writes it).
///
/// ```
/// use mha::safetensors::serialize_index;
/// let index = serialize_index(&[("a.weight", "model-00001-of-00002.safetensors"), ("b", "model-00002-of-00002.safetensors")], 24);
/// assert_eq!(
///     index,
///     r#"{"metadata":{"total_size":24},"weight_map":{"a.weight":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#
/// );
/// ```
pub fn serialize_index(weight_map: &[(&str, &str)], total_size: u64) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{{\"metadata\":{{\"total_size\":{total_size}}},\"weight_map\":{{"
    );
    for (i, (tensor, file)) in weight_map.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_json_string(&mut out, tensor);
        out.push(':');
        push_json_string(&mut out, file);
    }
    out.push_str("}}");
    out
}
