//! Metadata values: GGUF's thirteen value types, arrays of any of them (nested arrays
//! included), and typed look-ups that name the key when a value is missing or mistyped.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;

use super::error::GgufError;
use super::header::{read_vec, Reader};

type Result<T> = core::result::Result<T, GgufError>;

/// How deep arrays may nest in a metadata value (an array of arrays is depth 2). Deeper
/// nesting is [`GgufError::TooDeep`], so a crafted file cannot exhaust the stack.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7 (a byte, 0 or 1).
    Bool(bool),
    /// Type 8 (a `u64` length and UTF-8 bytes).
    String(String),
    /// Type 9 (an element type, a `u64` count, the elements).
    Array(Array),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

/// An array value: its elements, stored by element type so that an array takes about the
/// bytes it takes in the file.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Array {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements.
    String(Vec<String>),
    /// Array elements (each of its own element type).
    Array(Vec<Array>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl Array {
    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as an unsigned integer, for the integer element types (a negative one is
    /// `None`).
    pub fn get_u64(&self, i: usize) -> Option<u64> {
        match self {
            Array::U8(v) => v.get(i).map(|&x| u64::from(x)),
            Array::U16(v) => v.get(i).map(|&x| u64::from(x)),
            Array::U32(v) => v.get(i).map(|&x| u64::from(x)),
            Array::U64(v) => v.get(i).copied(),
            Array::I8(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            Array::I16(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            Array::I32(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            Array::I64(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            _ => None,
        }
    }
}

impl Value {
    /// The value type's name as GGUF's specification spells it, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "uint8",
            Value::I8(_) => "int8",
            Value::U16(_) => "uint16",
            Value::I16(_) => "int16",
            Value::U32(_) => "uint32",
            Value::I32(_) => "int32",
            Value::F32(_) => "float32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "uint64",
            Value::I64(_) => "int64",
            Value::F64(_) => "float64",
        }
    }

    /// The value as an unsigned integer: any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::U8(x) => Some(u64::from(*x)),
            Value::U16(x) => Some(u64::from(*x)),
            Value::U32(x) => Some(u64::from(*x)),
            Value::U64(x) => Some(*x),
            Value::I8(x) => u64::try_from(*x).ok(),
            Value::I16(x) => u64::try_from(*x).ok(),
            Value::I32(x) => u64::try_from(*x).ok(),
            Value::I64(x) => u64::try_from(*x).ok(),
            _ => None,
        }
    }

    /// The value as a float: `float32` (widened exactly) or `float64`.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::F32(x) => Some(f64::from(*x)),
            Value::F64(x) => Some(*x),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

/// The metadata of a file: each key once, in key order.
pub type Metadata = BTreeMap<String, Value>;

/// Reads `count` metadata entries.
pub(super) fn read_metadata(r: &mut Reader<'_>, count: usize) -> Result<Metadata> {
    let mut metadata = Metadata::new();
    for _ in 0..count {
        let key = r.string("a metadata key")?;
        let value_type = r.u32("a value type")?;
        let value = read_value(r, &key, value_type)?;
        if metadata.contains_key(&key) {
            return Err(GgufError::Duplicate { name: key });
        }
        metadata.insert(key, value);
    }
    Ok(metadata)
}

/// One value of type `value_type` (of the entry `key`).
fn read_value(r: &mut Reader<'_>, key: &str, value_type: u32) -> Result<Value> {
    Ok(match value_type {
        0 => Value::U8(r.u8("a uint8")?),
        1 => Value::I8(r.u8("an int8")? as i8),
        2 => Value::U16(r.u16("a uint16")?),
        3 => Value::I16(r.u16("an int16")? as i16),
        4 => Value::U32(r.u32("a uint32")?),
        5 => Value::I32(r.u32("an int32")? as i32),
        6 => Value::F32(f32::from_bits(r.u32("a float32")?)),
        7 => Value::Bool(read_bool(r, key)?),
        8 => Value::String(r.string("a string")?),
        9 => Value::Array(read_array(r, key, 1)?),
        10 => Value::U64(r.u64("a uint64")?),
        11 => Value::I64(r.u64("an int64")? as i64),
        12 => Value::F64(f64::from_bits(r.u64("a float64")?)),
        _ => return Err(unknown_type(key, value_type)),
    })
}

fn unknown_type(key: &str, value_type: u32) -> GgufError {
    GgufError::UnknownValueType {
        key: String::from(key),
        value_type,
    }
}

/// A bool: one byte, 0 or 1.
fn read_bool(r: &mut Reader<'_>, key: &str) -> Result<bool> {
    match r.u8("a bool")? {
        0 => Ok(false),
        1 => Ok(true),
        byte => Err(GgufError::BadBool {
            key: String::from(key),
            byte,
        }),
    }
}

/// The smallest encoding of one element of each value type, in bytes (a string's length, an
/// array's type and count).
fn min_size(value_type: u32) -> u64 {
    match value_type {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        // Arrays (9): an element type and a count.
        _ => 12,
    }
}

/// An array at nesting `depth` (1 for a top-level array): element type, count, elements.
fn read_array(r: &mut Reader<'_>, key: &str, depth: usize) -> Result<Array> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::TooDeep {
            key: String::from(key),
        });
    }
    let ty = r.u32("an array's element type")?;
    if ty > 12 {
        return Err(unknown_type(key, ty));
    }
    let n = r.count(min_size(ty), "an array's element count")?;
    Ok(match ty {
        0 => Array::U8(read_vec(n, || r.u8("a uint8"))?),
        1 => Array::I8(read_vec(n, || Ok(r.u8("an int8")? as i8))?),
        2 => Array::U16(read_vec(n, || r.u16("a uint16"))?),
        3 => Array::I16(read_vec(n, || Ok(r.u16("an int16")? as i16))?),
        4 => Array::U32(read_vec(n, || r.u32("a uint32"))?),
        5 => Array::I32(read_vec(n, || Ok(r.u32("an int32")? as i32))?),
        6 => Array::F32(read_vec(n, || Ok(f32::from_bits(r.u32("a float32")?)))?),
        7 => Array::Bool(read_vec(n, || read_bool(r, key))?),
        8 => Array::String(read_vec(n, || r.string("a string"))?),
        9 => Array::Array(read_vec(n, || read_array(r, key, depth + 1))?),
        10 => Array::U64(read_vec(n, || r.u64("a uint64"))?),
        11 => Array::I64(read_vec(n, || Ok(r.u64("an int64")? as i64))?),
        _ => Array::F64(read_vec(n, || Ok(f64::from_bits(r.u64("a float64")?)))?),
    })
}
