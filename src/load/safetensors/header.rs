//! Reading the JSON header into tensor entries, and checking them against the data region.

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::dtype::Dtype;
use super::error::{try_grow, SafeTensorsError};
use super::format::METADATA_KEY;
use crate::load::json::{Cursor, Kind};

type Result<T> = core::result::Result<T, SafeTensorsError>;

/// One tensor as the header describes it.
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    pub(crate) begin: u64,
    pub(crate) end: u64,
}

/// The parsed header: tensors in header order, and the metadata.
pub(crate) struct Header {
    pub(crate) entries: Vec<Entry>,
    pub(crate) metadata: BTreeMap<String, String>,
}

/// Shortens long numbers quoted in error messages.
fn excerpt(token: &str) -> String {
    match token.get(..24) {
        Some(head) if token.len() > 24 => format!("{head}…"),
        _ => token.to_owned(),
    }
}

fn wrong_type(
    tensor: &str,
    field: &str,
    expected: &'static str,
    found: String,
) -> SafeTensorsError {
    SafeTensorsError::WrongType {
        tensor: tensor.to_owned(),
        field: field.to_owned(),
        expected,
        found,
    }
}

/// Fails with [`SafeTensorsError::WrongType`] unless the next value is of kind `want`.
fn require(
    c: &mut Cursor<'_>,
    want: Kind,
    tensor: &str,
    field: &str,
    expected: &'static str,
) -> Result<()> {
    let kind = c.peek_kind()?;
    if kind == want {
        Ok(())
    } else {
        Err(wrong_type(tensor, field, expected, kind.name().to_owned()))
    }
}

/// Reads a non-negative integer without sign, fraction or exponent (as serde_json does for
/// unsigned fields).
fn read_u64(c: &mut Cursor<'_>, tensor: &str, field: &str, expected: &'static str) -> Result<u64> {
    require(c, Kind::Number, tensor, field, expected)?;
    let token = c.number()?;
    let mut value: u64 = 0;
    for b in token.bytes() {
        let digit = match b {
            b'0'..=b'9' => u64::from(b - b'0'),
            _ => {
                return Err(wrong_type(
                    tensor,
                    field,
                    expected,
                    format!("number {}", excerpt(token)),
                ))
            }
        };
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(digit))
            .ok_or_else(|| {
                wrong_type(
                    tensor,
                    field,
                    expected,
                    format!("number {} (too large)", excerpt(token)),
                )
            })?;
    }
    Ok(value)
}

const SHAPE: &str = "an array of non-negative integers";
const OFFSETS: &str = "an array of two non-negative integers [begin, end]";

/// The fields of one tensor entry read so far.
#[derive(Default)]
struct Fields {
    dtype: Option<Dtype>,
    shape: Option<Vec<usize>>,
    offsets: Option<(u64, u64)>,
}

impl Fields {
    /// The entry, once every field has been read.
    fn finish(self, name: String) -> Result<Entry> {
        let missing = |field| SafeTensorsError::MissingField {
            tensor: name.clone(),
            field,
        };
        let dtype = self.dtype.ok_or_else(|| missing("dtype"))?;
        let shape = self.shape.ok_or_else(|| missing("shape"))?;
        let (begin, end) = self.offsets.ok_or_else(|| missing("data_offsets"))?;
        Ok(Entry {
            name,
            dtype,
            shape,
            begin,
            end,
        })
    }
}

/// Reads one tensor entry `{"dtype": …, "shape": […], "data_offsets": [b, e]}`. Unknown fields
/// are skipped, as the reference implementation does.
fn read_entry(c: &mut Cursor<'_>, name: String) -> Result<Entry> {
    require(
        c,
        Kind::Object,
        &name,
        "",
        "an object with dtype, shape and data_offsets",
    )?;
    let mut fields = Fields::default();
    c.object(2, |c, key| read_field(c, &name, key, &mut fields))?;
    fields.finish(name)
}

/// Reads the value of the member `key` of tensor `name`'s entry into `fields`; a field seen
/// twice is an error, an unknown one is skipped.
fn read_field(c: &mut Cursor<'_>, name: &str, key: String, fields: &mut Fields) -> Result<()> {
    match key.as_str() {
        "dtype" if fields.dtype.is_none() => fields.dtype = Some(read_dtype(c, name)?),
        "shape" if fields.shape.is_none() => fields.shape = Some(read_shape(c, name)?),
        "data_offsets" if fields.offsets.is_none() => fields.offsets = Some(read_offsets(c, name)?),
        "dtype" | "shape" | "data_offsets" => {
            return Err(SafeTensorsError::DuplicateKey {
                object: name.to_owned(),
                key,
            })
        }
        _ => return Ok(c.skip_value(3)?),
    }
    Ok(())
}

/// Reads a `dtype` string naming one of the format's dtypes.
fn read_dtype(c: &mut Cursor<'_>, name: &str) -> Result<Dtype> {
    require(c, Kind::String, name, "dtype", "a string")?;
    let text = c.string()?;
    Dtype::from_name(&text).ok_or_else(|| SafeTensorsError::UnknownDtype {
        tensor: name.to_owned(),
        dtype: text,
    })
}

/// Reads a `shape`: an array of non-negative integers that fit in `usize`.
fn read_shape(c: &mut Cursor<'_>, name: &str) -> Result<Vec<usize>> {
    require(c, Kind::Array, name, "shape", SHAPE)?;
    let mut dims = Vec::new();
    c.array(3, |c| {
        let dim = read_u64(c, name, "shape", SHAPE)?;
        let dim = usize::try_from(dim).map_err(|_| {
            wrong_type(
                name,
                "shape",
                SHAPE,
                format!("dimension {dim} (too large for usize)"),
            )
        })?;
        try_grow(&mut dims, 1, || format!("shape of tensor \"{name}\""))?;
        dims.push(dim);
        Ok::<_, SafeTensorsError>(())
    })?;
    Ok(dims)
}

/// Reads `data_offsets`: an array of exactly two non-negative integers.
fn read_offsets(c: &mut Cursor<'_>, name: &str) -> Result<(u64, u64)> {
    require(c, Kind::Array, name, "data_offsets", OFFSETS)?;
    let mut values: Vec<u64> = Vec::new();
    c.array(3, |c| {
        let v = read_u64(c, name, "data_offsets", OFFSETS)?;
        if values.len() == 2 {
            return Err(wrong_type(
                name,
                "data_offsets",
                OFFSETS,
                "more than two elements".to_owned(),
            ));
        }
        values.push(v);
        Ok::<_, SafeTensorsError>(())
    })?;
    match values[..] {
        [begin, end] => Ok((begin, end)),
        _ => Err(wrong_type(
            name,
            "data_offsets",
            OFFSETS,
            format!("{} element(s)", values.len()),
        )),
    }
}

/// Reads the `__metadata__` object: string keys to string values (`null` means none).
fn read_metadata(c: &mut Cursor<'_>, metadata: &mut BTreeMap<String, String>) -> Result<()> {
    const WANT: &str = "an object mapping strings to strings";
    match c.peek_kind()? {
        Kind::Null => return Ok(c.literal().map(drop)?),
        Kind::Object => {}
        other => return Err(wrong_type(METADATA_KEY, "", WANT, other.name().to_owned())),
    }
    c.object(2, |c, key| {
        require(c, Kind::String, METADATA_KEY, &key, "a string")?;
        let value = c.string()?;
        if metadata.contains_key(&key) {
            return Err(SafeTensorsError::DuplicateKey {
                object: METADATA_KEY.to_owned(),
                key,
            });
        }
        metadata.insert(key, value);
        Ok(())
    })
}

/// Parses the header text. Checks the JSON and the types of the fields, but not yet the
/// offsets (see [`check_layout`]).
pub(crate) fn parse_header(text: &str) -> Result<Header> {
    let mut c = Cursor::new(text);
    if c.at_end() {
        return Err(c.error("empty header, expected '{'").into());
    }
    require(&mut c, Kind::Object, "", "", "a JSON object")?;
    let mut entries = Vec::new();
    let mut metadata = BTreeMap::new();
    let mut have_metadata = false;
    c.object(1, |c, key| {
        if key == METADATA_KEY {
            if core::mem::replace(&mut have_metadata, true) {
                return Err(SafeTensorsError::DuplicateKey {
                    object: String::new(),
                    key,
                });
            }
            read_metadata(c, &mut metadata)
        } else {
            let entry = read_entry(c, key)?;
            try_grow(&mut entries, 1, || {
                "tensor entries of the header".to_owned()
            })?;
            entries.push(entry);
            Ok(())
        }
    })?;
    if !c.at_end() {
        return Err(c.error("unexpected content after the header object").into());
    }
    let mut names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(SafeTensorsError::DuplicateTensor {
            name: pair[0].to_owned(),
        });
    }
    Ok(Header { entries, metadata })
}

/// How many bytes a tensor needs.
pub(crate) enum Need {
    /// This many.
    Bytes(usize),
    /// This many bits, not a multiple of 8 (sub-byte dtypes).
    PartialByte(usize),
    /// More than fit in `usize`.
    Overflow,
}

pub(crate) fn need(dtype: Dtype, shape: &[usize]) -> Need {
    let bits = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .and_then(|elements| elements.checked_mul(dtype.bits()));
    match bits {
        None => Need::Overflow,
        Some(bits) if bits.is_multiple_of(8) => Need::Bytes(bits / 8),
        Some(bits) => Need::PartialByte(bits),
    }
}

/// Checks every tensor against the data region of `data_len` bytes, then sorts the entries by
/// offset and checks that they tile the region: starting at 0, each tensor beginning where
/// the previous one ends, the last one ending at `data_len`. Leaves the entries in data order.
pub(crate) fn check_layout(entries: &mut [Entry], data_len: usize) -> Result<()> {
    for e in entries.iter() {
        check_entry(e, data_len)?;
    }
    // A stable sort keeps header order among zero-sized tensors at the same offset.
    entries.sort_by_key(|e| (e.begin, e.end));
    check_tiling(entries, data_len)
}

/// Checks one tensor's offsets against the data region and its byte count against its dtype
/// and shape.
fn check_entry(e: &Entry, data_len: usize) -> Result<()> {
    if e.begin > e.end {
        return Err(SafeTensorsError::OffsetsReversed {
            tensor: e.name.clone(),
            begin: e.begin,
            end: e.end,
        });
    }
    // `end <= data_len` implies both offsets fit in usize.
    if e.end > data_len as u64 {
        return Err(SafeTensorsError::OffsetsOutOfRange {
            tensor: e.name.clone(),
            begin: e.begin,
            end: e.end,
            data_len,
        });
    }
    let actual = (e.end - e.begin) as usize;
    match need(e.dtype, &e.shape) {
        Need::Overflow => Err(SafeTensorsError::ShapeOverflow {
            tensor: e.name.clone(),
            shape: e.shape.clone(),
        }),
        Need::Bytes(bytes) if bytes == actual => Ok(()),
        Need::Bytes(_) | Need::PartialByte(_) => Err(SafeTensorsError::ByteCountMismatch {
            tensor: e.name.clone(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            actual,
        }),
    }
}

/// Checks that `entries`, in data order and each within the region, tile the `data_len`
/// bytes exactly.
fn check_tiling(entries: &[Entry], data_len: usize) -> Result<()> {
    let mut covered = 0u64;
    let mut previous: Option<&Entry> = None;
    for e in entries {
        if e.begin < covered {
            return Err(SafeTensorsError::Overlap {
                tensor: e.name.clone(),
                begin: e.begin as usize,
                previous: previous.map(|p| p.name.clone()).unwrap_or_default(),
                previous_end: covered as usize,
            });
        }
        if e.begin > covered {
            return Err(SafeTensorsError::Hole {
                tensor: e.name.clone(),
                from: covered as usize,
                to: e.begin as usize,
            });
        }
        covered = e.end;
        previous = Some(e);
    }
    if covered != data_len as u64 {
        return Err(SafeTensorsError::TrailingBytes {
            covered: covered as usize,
            data_len,
        });
    }
    Ok(())
}
