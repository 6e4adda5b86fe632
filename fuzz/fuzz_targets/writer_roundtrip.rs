//! `serialize_raw` (any dtype) or `serialize` (`F32` values), chosen by the first byte, on a few
//! tensors with awkward names, shapes and lengths and some metadata. The writer must fail
//! exactly when the input breaks a rule (repeated or reserved name, repeated key, a size that
//! overflows, bytes that do not match the shape), with an error of that rule; otherwise its
//! output must parse back to the same tensors, in order, and the same metadata.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use mha::safetensors::{serialize, serialize_raw, Dtype, SafeTensors, SafeTensorsError};
use mha_fuzz::{check_accessors, Input};

/// One tensor to write: name, dtype, shape, little-endian bytes.
struct Tensor {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let raw = input.byte() & 1 == 0;
    let tensors: Vec<Tensor> = (0..input.below(5))
        .map(|_| tensor(&mut input, raw))
        .collect();
    let metadata: Vec<(String, String)> = (0..input.below(3))
        .map(|_| (input.name(2), input.name(3)))
        .collect();
    let meta: Vec<(&str, &str)> = metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let written = if raw {
        let list: Vec<_> = tensors
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    t.dtype,
                    t.shape.as_slice(),
                    t.bytes.as_slice(),
                )
            })
            .collect();
        serialize_raw(&list, &meta)
    } else {
        let values: Vec<Vec<f32>> = tensors.iter().map(|t| f32_values(&t.bytes)).collect();
        let list: Vec<_> = tensors
            .iter()
            .zip(&values)
            .map(|(t, v)| (t.name.as_str(), t.shape.as_slice(), v.as_slice()))
            .collect();
        serialize(&list, &meta)
    };
    let broken = broken_rules(&tensors, &metadata);
    match written {
        Ok(file) => {
            assert!(broken.is_empty(), "wrote a file breaking {broken:?}");
            check_file(&file, &tensors, &metadata);
        }
        Err(e) => assert!(broken.contains(&rule(&e)), "{e} but broken: {broken:?}"),
    }
});

/// A tensor with a name from `input`, now and then `__metadata__`; any dtype when `raw`, else
/// `F32`; a shape of up to 3 small dimensions, now and then a huge one; the bytes the shape
/// needs, now and then one more or one less.
fn tensor(input: &mut Input<'_>, raw: bool) -> Tensor {
    let name = match input.below(16) {
        0 => "__metadata__".to_owned(),
        _ => input.name(3),
    };
    let dtype = if raw {
        Dtype::ALL[input.below(Dtype::ALL.len())]
    } else {
        Dtype::F32
    };
    let mut shape: Vec<usize> = (0..input.below(4)).map(|_| input.below(4)).collect();
    if !shape.is_empty() && input.below(32) == 0 {
        shape[0] = usize::MAX / (1 + input.below(8));
    }
    let bits = shape.iter().fold(1u128, |n, &d| n * d as u128) * dtype.bits() as u128;
    let mut len = usize::try_from(bits.div_ceil(8)).unwrap_or(0).min(64);
    match input.below(16) {
        0 => len += 1,
        1 => len = len.saturating_sub(1),
        _ => {}
    }
    if !raw {
        len = len / 4 * 4;
    }
    let mut bytes = input.bytes(len).to_vec();
    bytes.resize(len, 0);
    Tensor {
        name,
        dtype,
        shape,
        bytes,
    }
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The rules of the writer, by the error that reports each.
#[derive(Debug, PartialEq)]
enum Rule {
    DuplicateTensor,
    DuplicateKey,
    ShapeOverflow,
    WriteLengthMismatch,
    Other,
}

fn rule(e: &SafeTensorsError) -> Rule {
    match e {
        SafeTensorsError::DuplicateTensor { .. } => Rule::DuplicateTensor,
        SafeTensorsError::DuplicateKey { .. } => Rule::DuplicateKey,
        SafeTensorsError::ShapeOverflow { .. } => Rule::ShapeOverflow,
        SafeTensorsError::WriteLengthMismatch { .. } => Rule::WriteLengthMismatch,
        _ => Rule::Other,
    }
}

/// Every rule the input breaks, computed in `u128` without the crate.
fn broken_rules(tensors: &[Tensor], metadata: &[(String, String)]) -> Vec<Rule> {
    let mut broken = Vec::new();
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if names.contains(&"__metadata__") || names.windows(2).any(|w| w[0] == w[1]) {
        broken.push(Rule::DuplicateTensor);
    }
    let mut keys: Vec<&str> = metadata.iter().map(|m| m.0.as_str()).collect();
    keys.sort_unstable();
    if keys.windows(2).any(|w| w[0] == w[1]) {
        broken.push(Rule::DuplicateKey);
    }
    for t in tensors {
        let elements = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let bits = elements.and_then(|n| n.checked_mul(t.dtype.bits()));
        match bits {
            // No buffer holds that many bytes either.
            None => broken.extend([Rule::ShapeOverflow, Rule::WriteLengthMismatch]),
            Some(bits) if bits % 8 != 0 || bits / 8 != t.bytes.len() => {
                broken.push(Rule::WriteLengthMismatch)
            }
            Some(_) => {}
        }
    }
    broken
}

/// Parses `file` and checks that it holds `tensors`, in data order, and `metadata`.
fn check_file(file: &[u8], tensors: &[Tensor], metadata: &[(String, String)]) {
    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap());
    assert_eq!(header_len % 8, 0, "data starts at a multiple of 8");
    let st = SafeTensors::parse(file).expect("the writer's output parses");
    check_accessors(&st, file);
    assert_eq!(st.len(), tensors.len());
    for (got, want) in st.tensors().zip(tensors) {
        assert_eq!(got.name(), want.name);
        assert_eq!(got.dtype(), want.dtype);
        assert_eq!(got.shape(), want.shape);
        assert_eq!(got.data(), want.bytes);
    }
    let want: BTreeMap<String, String> = metadata.iter().cloned().collect();
    assert_eq!(st.metadata(), &want);
}
