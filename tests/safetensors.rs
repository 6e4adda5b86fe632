//! The safetensors reader and writer: round trips, hand-built files with known bytes, every
//! error with its message, and fuzzing that no input panics.

use mha::safetensors::{
    bf16_to_f32, f16_to_f32, serialize, serialize_raw, Dtype, SafeTensors, SafeTensorsError,
    MAX_DEPTH, MAX_HEADER_LEN,
};
#[cfg(feature = "std")]
use mha::safetensors::{read_file, write_file};
use mha::Matrix;
use quickcheck::{Arbitrary, Gen, QuickCheck};

/// A file with the given header text (unpadded) and data region.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn parse_err(bytes: &[u8]) -> SafeTensorsError {
    match SafeTensors::parse(bytes) {
        Ok(_) => panic!("parse succeeded on {:?}", String::from_utf8_lossy(bytes)),
        Err(e) => e,
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

// ---------------------------------------------------------------------------------------------
// Round trips

#[test]
fn round_trip_odd_shapes() {
    let shapes: [&[usize]; 9] = [
        &[],
        &[0],
        &[3, 0, 2],
        &[1],
        &[7],
        &[2, 3],
        &[3, 1, 4, 1, 5],
        &[0, 0],
        &[1, 1, 1, 1, 1, 1, 1, 1],
    ];
    let mut next = 0u32;
    let values: Vec<Vec<f32>> = shapes
        .iter()
        .map(|s| {
            (0..s.iter().product::<usize>())
                .map(|_| {
                    next += 1;
                    // Mix ordinary values with signed zeros, infinities, NaN payloads, subnormals.
                    match next % 7 {
                        0 => f32::from_bits(0x7fc0_1234),
                        1 => -0.0,
                        2 => f32::INFINITY,
                        3 => f32::from_bits(1),
                        _ => next as f32 * -0.37,
                    }
                })
                .collect()
        })
        .collect();
    let names: Vec<String> = (0..shapes.len()).map(|i| format!("t{i}")).collect();
    let tensors: Vec<(&str, &[usize], &[f32])> = names
        .iter()
        .zip(shapes)
        .zip(&values)
        .map(|((n, s), v)| (n.as_str(), s, v.as_slice()))
        .collect();
    let metadata = [
        ("format", "pt"),
        (
            "quotes \"and\" \\slashes/",
            "tab\tnewline\ncontrol\u{1}\u{1f} bell\u{7}",
        ),
        ("unicode", "naïve 😀 \u{2028}"),
    ];
    let bytes = serialize(&tensors, &metadata).unwrap();

    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(header_len % 8, 0, "header padded to a multiple of 8");
    let total: usize = values.iter().map(|v| v.len() * 4).sum();
    assert_eq!(bytes.len(), 8 + header_len as usize + total);

    let st = SafeTensors::parse(&bytes).unwrap();
    assert_eq!(st.len(), shapes.len());
    assert!(!st.is_empty());
    for (name, value) in metadata {
        assert_eq!(st.metadata()[name], value);
    }
    assert_eq!(st.metadata().len(), 3);
    let debug = format!("{:?}", st.tensor("t5").unwrap());
    assert_eq!(
        debug,
        r#"TensorView { name: "t5", dtype: F32, shape: [2, 3], data_offsets: (36, 60) }"#
    );
    // Data order is the order written; names come sorted.
    let order: Vec<&str> = st.tensors().map(|t| t.name()).collect();
    assert_eq!(order, names.iter().map(String::as_str).collect::<Vec<_>>());
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(st.names().collect::<Vec<_>>(), sorted);

    let mut offset = 0;
    for ((name, shape), value) in names.iter().zip(shapes).zip(&values) {
        let (s, v) = st.tensor_f32(name).unwrap();
        assert_eq!(s, shape);
        assert_eq!(bits(&v), bits(value), "{name}");
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), Dtype::F32);
        assert_eq!(t.element_count(), value.len());
        assert_eq!(t.data_offsets(), (offset, offset + 4 * value.len()));
        assert_eq!(t.data(), f32_bytes(value));
        offset += 4 * value.len();
    }
    let (s, v) = st.tensor_f32("t0").unwrap();
    assert_eq!(
        (s, v),
        (vec![], values[0].clone()),
        "a 0-dim scalar holds one value"
    );
    assert_eq!(values[0].len(), 1);
}

#[test]
fn empty_file_matches_the_reference_bytes() {
    // The reference implementation writes `{}` padded with six spaces.
    let bytes = serialize(&[], &[]).unwrap();
    assert_eq!(
        bytes,
        [8, 0, 0, 0, 0, 0, 0, 0, b'{', b'}', 32, 32, 32, 32, 32, 32]
    );
    let st = SafeTensors::parse(&bytes).unwrap();
    assert!(st.is_empty());
    assert!(st.metadata().is_empty());
    let with_meta = serialize(&[], &[("framework", "pt")]).unwrap();
    assert_eq!(
        &with_meta[8..],
        b"{\"__metadata__\":{\"framework\":\"pt\"}}     "
    );
}

#[cfg(feature = "std")]
#[test]
fn file_helpers_round_trip() {
    let path = std::env::temp_dir().join(format!("mha-st-{}.safetensors", std::process::id()));
    write_file(
        &path,
        &[("w", &[2, 2], &[1.0, 2.0, 3.0, 4.0])],
        &[("a", "b")],
    )
    .unwrap();
    let bytes = read_file(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let st = SafeTensors::parse(&bytes).unwrap();
    assert_eq!(
        st.matrix::<2, 2>("w").unwrap(),
        Matrix::from([[1.0, 2.0], [3.0, 4.0]])
    );
    assert_eq!(st.metadata()["a"], "b");
}

#[derive(Clone, Debug)]
struct Spec {
    tensors: Vec<(String, Vec<usize>, Vec<u32>)>,
    metadata: Vec<(String, String)>,
}

impl Arbitrary for Spec {
    fn arbitrary(g: &mut Gen) -> Self {
        let count = usize::arbitrary(g) % 6;
        let mut tensors: Vec<(String, Vec<usize>, Vec<u32>)> = Vec::new();
        for _ in 0..count {
            let name = String::arbitrary(g);
            if name == "__metadata__" || tensors.iter().any(|t| t.0 == name) {
                continue;
            }
            let rank = usize::arbitrary(g) % 4;
            let shape: Vec<usize> = (0..rank).map(|_| usize::arbitrary(g) % 4).collect();
            let n = shape.iter().product();
            let values = (0..n).map(|_| u32::arbitrary(g)).collect();
            tensors.push((name, shape, values));
        }
        let mut metadata: Vec<(String, String)> = Vec::new();
        for _ in 0..usize::arbitrary(g) % 4 {
            let key = String::arbitrary(g);
            if !metadata.iter().any(|m| m.0 == key) {
                metadata.push((key, String::arbitrary(g)));
            }
        }
        Spec { tensors, metadata }
    }
}

#[test]
fn round_trip_random() {
    fn prop(spec: Spec) -> bool {
        let values: Vec<Vec<f32>> = spec
            .tensors
            .iter()
            .map(|t| t.2.iter().map(|&b| f32::from_bits(b)).collect())
            .collect();
        let tensors: Vec<(&str, &[usize], &[f32])> = spec
            .tensors
            .iter()
            .zip(&values)
            .map(|(t, v)| (t.0.as_str(), t.1.as_slice(), v.as_slice()))
            .collect();
        let metadata: Vec<(&str, &str)> = spec
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let bytes = serialize(&tensors, &metadata).unwrap();
        let st = SafeTensors::parse(&bytes).unwrap();
        assert_eq!(st.len(), tensors.len());
        for (name, shape, raw) in &spec.tensors {
            let (s, v) = st.tensor_f32(name).unwrap();
            assert_eq!(&s, shape);
            assert_eq!(&bits(&v), raw);
        }
        assert_eq!(st.metadata().len(), metadata.len());
        for (k, v) in &spec.metadata {
            assert_eq!(&st.metadata()[k], v);
        }
        true
    }
    QuickCheck::new()
        .tests(300)
        .quickcheck(prop as fn(Spec) -> bool);
}

// ---------------------------------------------------------------------------------------------
// F16 and BF16, against values computed here from the bit layout in f64

/// IEEE half: (-1)^s · 2^(e-15) · (1 + m/1024), or (-1)^s · m · 2^-24 when e = 0.
fn f16_reference(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((h >> 10) & 0x1f);
    let m = f64::from(h & 0x3ff);
    match e {
        0 => sign * m * 2f64.powi(-24),
        31 if m == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        _ => sign * 2f64.powi(e - 15) * (1.0 + m / 1024.0),
    }
}

/// bfloat16: (-1)^s · 2^(e-127) · (1 + m/128), or (-1)^s · m · 2^-133 when e = 0.
fn bf16_reference(b: u16) -> f64 {
    let sign = if b & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b >> 7) & 0xff);
    let m = f64::from(b & 0x7f);
    match e {
        0 => sign * m * 2f64.powi(-133),
        255 if m == 0.0 => sign * f64::INFINITY,
        255 => f64::NAN,
        _ => sign * 2f64.powi(e - 127) * (1.0 + m / 128.0),
    }
}

/// Same value, same sign (so +0 and -0 differ), NaN matching NaN.
fn same(got: f32, want: f64) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else {
        f64::from(got) == want && got.is_sign_negative() == want.is_sign_negative()
    }
}

#[test]
// The F16 subnormals are written as their exact decimal expansions.
#[allow(clippy::excessive_precision)]
fn f16_and_bf16_edge_values_from_a_hand_built_file() {
    // (bits, value written out by hand)
    let f16: [(u16, f64); 12] = [
        (0x0000, 0.0),
        (0x8000, -0.0),
        (0x0001, 5.960_464_477_539_062_5e-8), // 2^-24, smallest subnormal
        (0x03ff, 6.097_555_160_522_460_937_5e-5), // 1023 · 2^-24, largest subnormal
        (0x0400, 6.103_515_625e-5),           // 2^-14, smallest normal
        (0x7bff, 65504.0),                    // largest normal
        (0x7c00, f64::INFINITY),
        (0xfc00, f64::NEG_INFINITY),
        (0x7e00, f64::NAN),
        (0x3c00, 1.0),
        (0xc100, -2.5),
        (0x3555, 0.333_251_953_125),
    ];
    let mut bf16: [(u16, f64); 10] = [
        (0x0000, 0.0),
        (0x8000, -0.0),
        (0x0001, 0.0), // 2^-133, smallest subnormal: set below
        (0x007f, 0.0), // 127 · 2^-133, largest subnormal: set below
        (0x7f7f, 0.0), // (2 - 2^-7) · 2^127, largest normal: set below
        (0x7f80, f64::INFINITY),
        (0xff80, f64::NEG_INFINITY),
        (0xffc1, f64::NAN),
        (0x3f80, 1.0),
        (0xc020, -2.5),
    ];
    // Too many digits to write out: 2^-133 ≈ 9.18355e-41, 127 · 2^-133 ≈ 1.16631e-38,
    // (2 - 2^-7) · 2^127 ≈ 3.38953e38.
    bf16[2].1 = 2f64.powi(-133);
    bf16[3].1 = 127.0 * 2f64.powi(-133);
    bf16[4].1 = (2.0 - 2f64.powi(-7)) * 2f64.powi(127);
    assert!((bf16[2].1 - 9.18355e-41).abs() < 1e-45);
    assert!((bf16[3].1 - 1.16631e-38).abs() < 1e-43);
    assert!((bf16[4].1 - 3.38953e38).abs() < 1e33);
    for &(b, v) in &f16 {
        assert!(
            same(f16_reference(b) as f32, v),
            "f16 reference for {b:#06x}"
        );
    }
    for &(b, v) in &bf16 {
        assert!(
            same(bf16_reference(b) as f32, v),
            "bf16 reference for {b:#06x}"
        );
    }

    let mut data: Vec<u8> = f16.iter().flat_map(|(b, _)| b.to_le_bytes()).collect();
    data.extend(bf16.iter().flat_map(|(b, _)| b.to_le_bytes()));
    // Keys in unusual order, whitespace everywhere, the BF16 tensor first in the header but
    // second in the data, an odd byte offset for it.
    let header = "\n{ \"b\" :{\"data_offsets\" : [ 24 , 44 ],\t\"shape\":[2,5], \"dtype\":\"BF16\"} ,\r\n  \"h\": { \"shape\": [12], \"dtype\": \"F16\", \"data_offsets\": [0, 24] } }   ";
    let bytes = file(header, &data);
    let st = SafeTensors::parse(&bytes).unwrap();
    assert_eq!(
        st.tensors().map(|t| t.name()).collect::<Vec<_>>(),
        ["h", "b"]
    );

    let (shape, got) = st.tensor_f32("h").unwrap();
    assert_eq!(shape, [12]);
    for (&g, &(b, want)) in got.iter().zip(&f16) {
        assert!(same(g, want), "F16 {b:#06x}: got {g:e}, want {want:e}");
    }
    let (shape, got) = st.tensor_f32("b").unwrap();
    assert_eq!(shape, [2, 5]);
    for (&g, &(b, want)) in got.iter().zip(&bf16) {
        assert!(same(g, want), "BF16 {b:#06x}: got {g:e}, want {want:e}");
    }
    // The NaN payload and sign survive.
    assert_eq!(got[7].to_bits(), 0xffc1_0000);
}

#[test]
fn f16_and_bf16_conversions_are_exact_for_every_bit_pattern() {
    for b in 0..=u16::MAX {
        let h = f16_to_f32(b);
        assert!(same(h, f16_reference(b)), "F16 {b:#06x}: {h:e}");
        let r = bf16_to_f32(b);
        assert!(same(r, bf16_reference(b)), "BF16 {b:#06x}: {r:e}");
    }
    // F16 NaNs keep their payload in the top mantissa bits.
    assert_eq!(f16_to_f32(0x7e01).to_bits(), 0x7fc0_2000);
    assert_eq!(f16_to_f32(0xfd00).to_bits(), 0xffa0_0000);
}

#[test]
fn f16_matrix_loads_through_the_conversion() {
    let halves: [u16; 6] = [0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600]; // 1..6
    let data: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
    let bytes = file(
        r#"{"w":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]}}"#,
        &data,
    );
    let st = SafeTensors::parse(&bytes).unwrap();
    let m: Matrix<2, 3> = st.matrix("w").unwrap();
    assert_eq!(m, Matrix::from([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]));
    let t: Matrix<3, 2> = st.matrix_transposed("w").unwrap();
    assert_eq!(t, Matrix::from([[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]));
}

// ---------------------------------------------------------------------------------------------
// Other dtypes alongside F32

#[test]
fn i64_tensors_do_not_stop_the_others_from_loading() {
    let ids: Vec<u8> = [0i64, 1, 2, -3]
        .iter()
        .flat_map(|i| i.to_le_bytes())
        .collect();
    let w = f32_bytes(&[0.5, -1.5, 2.0, 4.0, 8.0, 16.0]);
    let bias = f32_bytes(&[1.0, 2.0, 3.0]);
    let mut data = ids.clone();
    data.extend(&w);
    data.extend(&bias);
    data.push(1); // a BOOL
    data.extend([7u8, 8]); // two U8
    let header = concat!(
        r#"{"__metadata__":{"format":"pt"},"#,
        r#""embeddings.position_ids":{"dtype":"I64","shape":[1,4],"data_offsets":[0,32]},"#,
        r#""layer.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[32,56]},"#,
        r#""layer.bias":{"dtype":"F32","shape":[3],"data_offsets":[56,68]},"#,
        r#""flag":{"dtype":"BOOL","shape":[],"data_offsets":[68,69]},"#,
        r#""bytes":{"dtype":"U8","shape":[2],"data_offsets":[69,71]}}"#
    );
    let bytes = file(header, &data);
    let st = SafeTensors::parse(&bytes).unwrap();
    assert_eq!(st.len(), 5);

    let w: Matrix<2, 3> = st.matrix_transposed("layer.weight").unwrap();
    assert_eq!(w, Matrix::from([[0.5, 2.0, 8.0], [-1.5, 4.0, 16.0]]));
    assert_eq!(st.vector("layer.bias", 3).unwrap(), [1.0, 2.0, 3.0]);

    let ids_view = st.tensor("embeddings.position_ids").unwrap();
    assert_eq!(ids_view.dtype(), Dtype::I64);
    assert_eq!(ids_view.shape(), [1, 4]);
    let decoded: Vec<i64> = ids_view
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(decoded, [0, 1, 2, -3]);
    let err = st.tensor_f32("embeddings.position_ids").unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"tensor "embeddings.position_ids" has dtype I64, which does not convert to f32 (only F32, F16 and BF16 do)"#
    );
    assert_eq!(st.tensor("flag").unwrap().data(), [1]);
    assert_eq!(st.tensor("bytes").unwrap().dtype(), Dtype::U8);

    // The same file through the raw writer.
    let again = serialize_raw(
        &[
            ("embeddings.position_ids", Dtype::I64, &[1, 4], &ids),
            ("layer.weight", Dtype::F32, &[3, 2], &w_bytes()),
        ],
        &[],
    )
    .unwrap();
    let st = SafeTensors::parse(&again).unwrap();
    assert!(st.matrix::<3, 2>("layer.weight").is_ok());

    fn w_bytes() -> Vec<u8> {
        f32_bytes(&[0.5, -1.5, 2.0, 4.0, 8.0, 16.0])
    }
}

#[test]
fn every_dtype_name_and_size() {
    for d in Dtype::ALL {
        assert_eq!(Dtype::from_name(d.name()), Some(d));
        assert_eq!(d.to_string(), d.name());
    }
    let sizes: Vec<(&str, usize)> = Dtype::ALL.iter().map(|d| (d.name(), d.bits())).collect();
    for (name, bits) in [
        ("BOOL", 8),
        ("U8", 8),
        ("I8", 8),
        ("F8_E5M2", 8),
        ("F8_E4M3", 8),
        ("F8_E8M0", 8),
        ("I16", 16),
        ("U16", 16),
        ("F16", 16),
        ("BF16", 16),
        ("I32", 32),
        ("U32", 32),
        ("F32", 32),
        ("F64", 64),
        ("C64", 64),
        ("I64", 64),
        ("U64", 64),
        ("F4", 4),
        ("F6_E2M3", 6),
        ("F6_E3M2", 6),
    ] {
        assert!(sizes.contains(&(name, bits)), "{name}");
    }
    // Sub-byte dtypes: 3 F4 elements would be 12 bits, not a whole number of bytes.
    let bytes = file(
        r#"{"q":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}"#,
        &[0, 0],
    );
    assert!(SafeTensors::parse(&bytes).is_ok());
    let bytes = file(
        r#"{"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#,
        &[0, 0],
    );
    assert_eq!(
        parse_err(&bytes).to_string(),
        r#"tensor "q" of dtype F4 and shape [3] (3 elements) needs 12 bits (not a whole number of bytes), but its data_offsets span 2 bytes"#
    );
}

// ---------------------------------------------------------------------------------------------
// The JSON subset

#[test]
fn json_escapes_whitespace_and_unknown_fields() {
    let header = concat!(
        " \t\r\n{",
        r#""a\"b\\c\/d\u00e9\ud83d\ude00\b\f\n\r\t" : {"#,
        r#""extra": {"nested": [1, -2.5e+3, true, false, null, "s", {}, []]},"#,
        r#""dtype": "F32", "shape": [ ], "data_offsets": [0, 4], "more": 0.5E-7},"#,
        r#""__metadata__": {"k\u0041": "v\n\u4e2d"}"#,
        "}  \n "
    );
    let bytes = file(header, &2.0f32.to_le_bytes());
    let st = SafeTensors::parse(&bytes).unwrap();
    let name = "a\"b\\c/dé😀\u{8}\u{c}\n\r\t";
    assert_eq!(st.tensor_f32(name).unwrap(), (vec![], vec![2.0]));
    assert_eq!(st.metadata()["kA"], "v\n中");

    // `__metadata__: null` means no metadata, as in the reference implementation.
    let bytes = file(r#"{"__metadata__":null}"#, &[]);
    assert!(SafeTensors::parse(&bytes).unwrap().metadata().is_empty());

    // Nesting up to the limit is fine inside skipped fields; deeper is an error, not a crash.
    let nest = |n: usize| {
        let inner = "[".repeat(n) + &"]".repeat(n);
        file(
            &format!(r#"{{"x":{{"u":{inner},"dtype":"U8","shape":[],"data_offsets":[0,1]}}}}"#),
            &[0],
        )
    };
    assert!(SafeTensors::parse(&nest(MAX_DEPTH - 2)).is_ok());
    assert_eq!(
        parse_err(&nest(MAX_DEPTH - 1)),
        SafeTensorsError::Json {
            position: 10 + MAX_DEPTH - 2,
            reason: "arrays and objects nested more than 64 deep"
        }
    );
    let deep = file(&"[".repeat(1_000_000), &[]);
    assert!(matches!(
        parse_err(&deep),
        SafeTensorsError::WrongType { .. }
    ));
    let deep = file(
        &(String::from(r#"{"x":{"u":"#) + &"{\"a\":".repeat(1_000_000)),
        &[],
    );
    assert!(matches!(parse_err(&deep), SafeTensorsError::Json { .. }));
}

// ---------------------------------------------------------------------------------------------
// Errors, each with its message

fn check(bytes: &[u8], want: SafeTensorsError, message: &str) {
    let err = parse_err(bytes);
    assert_eq!(err, want);
    assert_eq!(err.to_string(), message);
}

fn one(fields: &str, data: &[u8]) -> Vec<u8> {
    file(&format!(r#"{{"t":{{{fields}}}}}"#), data)
}

#[test]
fn errors_in_the_framing() {
    use SafeTensorsError::*;
    check(
        &[1, 2, 3],
        Truncated { len: 3 },
        "buffer of 3 bytes is too short for the 8-byte header length",
    );
    let mut past = 100u64.to_le_bytes().to_vec();
    past.extend(b"{}");
    check(
        &past,
        HeaderPastEnd {
            header_len: 100,
            available: 2,
        },
        "header length 100 runs past the end of the buffer: only 2 bytes follow the 8-byte length",
    );
    check(
        &u64::MAX.to_le_bytes(),
        HeaderTooLarge {
            header_len: u64::MAX,
            limit: MAX_HEADER_LEN,
        },
        "header length 18446744073709551615 exceeds the limit of 100000000 bytes",
    );
    let mut bad = 3u64.to_le_bytes().to_vec();
    bad.extend([b'{', 0xff, b'}']);
    check(
        &bad,
        HeaderNotUtf8 { position: 1 },
        "header is not UTF-8: invalid byte at header offset 1",
    );
}

#[test]
fn errors_in_the_json() {
    use SafeTensorsError::*;
    let json = |header: &str, position, reason| {
        let message = format!("bad JSON at header byte {position}: {reason}");
        check(&file(header, &[]), Json { position, reason }, &message);
    };
    json("", 0, "empty header, expected '{'");
    json("   ", 3, "empty header, expected '{'");
    json(r#"{"a":}"#, 5, "expected a value");
    json(r#"{"t":{"x":1,}}"#, 12, "expected a string key");
    json(r#"{} x"#, 3, "unexpected content after the header object");
    json(r#"{"a" {}}"#, 5, "expected ':' after an object key");
    json(
        r#"{"t":{"x":1 "y":2}}"#,
        12,
        "expected ',' or '}' after an object member",
    );
    json(r#"{"a\x":{}}"#, 4, "invalid escape");
    json(r#"{"a\u12":{}}"#, 7, "expected four hex digits after \\u");
    json(
        r#"{"\ud800":{}}"#,
        8,
        "lone leading surrogate in \\u escape",
    );
    json(
        r#"{"\ud800\u0041":{}}"#,
        14,
        "leading surrogate not followed by a trailing one",
    );
    json(
        r#"{"\udc00":{}}"#,
        8,
        "lone trailing surrogate in \\u escape",
    );
    json(
        "{\"a\tb\":{}}",
        3,
        "control character in a string must be escaped",
    );
    json(r#"{"abc"#, 5, "unterminated string");
    json(
        r#"{"t":{"shape":[01]}}"#,
        16,
        "leading zeros are not allowed in numbers",
    );
    json(r#"{"t":{"shape":[1.]}}"#, 17, "expected a digit");
    json(r#"{"t":{"shape":[-]}}"#, 16, "expected a digit");
    json(r#"{"t":{"shape":[1,]}}"#, 17, "expected a value");
    json(
        r#"{"t":{"shape":[1 2]}}"#,
        17,
        "expected ',' or ']' after an array element",
    );
    json(r#"{"t":{"x":nul}}"#, 10, "expected true, false or null");
    json(
        r#"{"t":{"x":[1,2}}"#,
        14,
        "expected ',' or ']' after an array element",
    );
    json(
        r#"{"t":{"#,
        6,
        "unexpected end of JSON, expected a string key",
    );
    json(
        r#"{"t":{"x":"#,
        10,
        "unexpected end of JSON, expected a value",
    );
}

#[test]
fn errors_in_the_fields() {
    use SafeTensorsError::*;
    check(
        &file("[]", &[]),
        WrongType {
            tensor: "".into(),
            field: "".into(),
            expected: "a JSON object",
            found: "an array".into(),
        },
        "header must be a JSON object, found an array",
    );
    check(
        &file(r#"{"t":[1]}"#, &[]),
        WrongType {
            tensor: "t".into(),
            field: "".into(),
            expected: "an object with dtype, shape and data_offsets",
            found: "an array".into(),
        },
        r#""t" must be an object with dtype, shape and data_offsets, found an array"#,
    );
    check(
        &one(r#""dtype":32"#, &[]),
        WrongType {
            tensor: "t".into(),
            field: "dtype".into(),
            expected: "a string",
            found: "a number".into(),
        },
        r#""t": "dtype" must be a string, found a number"#,
    );
    let shape = |value: &str, found: &str| {
        let err = parse_err(&one(&format!(r#""dtype":"F32","shape":{value}"#), &[]));
        assert_eq!(
            err.to_string(),
            format!(r#""t": "shape" must be an array of non-negative integers, found {found}"#)
        );
    };
    shape(r#""2""#, "a string");
    shape("[2, -1]", "number -1");
    shape("[2.5]", "number 2.5");
    shape("[1e3]", "number 1e3");
    shape("[null]", "null");
    shape(
        "[123456789012345678901234567890]",
        "number 123456789012345678901234… (too large)",
    );
    let offsets = |value: &str, found: &str| {
        let err = parse_err(&one(
            &format!(r#""dtype":"F32","shape":[],"data_offsets":{value}"#),
            &[],
        ));
        assert_eq!(
            err.to_string(),
            format!(
                r#""t": "data_offsets" must be an array of two non-negative integers [begin, end], found {found}"#
            )
        );
    };
    offsets("[0]", "1 element(s)");
    offsets("[]", "0 element(s)");
    offsets("[0, 4, 8]", "more than two elements");
    offsets("[0, true]", "a boolean");
    offsets("{}", "an object");
    check(
        &file(r#"{"__metadata__":{"k":1}}"#, &[]),
        WrongType {
            tensor: "__metadata__".into(),
            field: "k".into(),
            expected: "a string",
            found: "a number".into(),
        },
        r#""__metadata__": "k" must be a string, found a number"#,
    );
    check(
        &file(r#"{"__metadata__":[]}"#, &[]),
        WrongType {
            tensor: "__metadata__".into(),
            field: "".into(),
            expected: "an object mapping strings to strings",
            found: "an array".into(),
        },
        r#""__metadata__" must be an object mapping strings to strings, found an array"#,
    );
    check(
        &one(r#""shape":[],"data_offsets":[0,0]"#, &[]),
        MissingField {
            tensor: "t".into(),
            field: "dtype",
        },
        r#"tensor "t" has no "dtype" field"#,
    );
    check(
        &one(r#""dtype":"F32","data_offsets":[0,0]"#, &[]),
        MissingField {
            tensor: "t".into(),
            field: "shape",
        },
        r#"tensor "t" has no "shape" field"#,
    );
    check(
        &one(r#""dtype":"F32","shape":[]"#, &[]),
        MissingField {
            tensor: "t".into(),
            field: "data_offsets",
        },
        r#"tensor "t" has no "data_offsets" field"#,
    );
    check(
        &one(
            r#""dtype":"F128","shape":[],"data_offsets":[0,16]"#,
            &[0; 16],
        ),
        UnknownDtype {
            tensor: "t".into(),
            dtype: "F128".into(),
        },
        r#"tensor "t" has unknown dtype "F128""#,
    );
    check(
        &one(r#""dtype":"f32","shape":[],"data_offsets":[0,4]"#, &[0; 4]),
        UnknownDtype {
            tensor: "t".into(),
            dtype: "f32".into(),
        },
        r#"tensor "t" has unknown dtype "f32""#,
    );
}

#[test]
fn errors_for_duplicates() {
    use SafeTensorsError::*;
    let t = r#"{"dtype":"F32","shape":[],"data_offsets":[0,4]}"#;
    check(
        &file(&format!(r#"{{"a":{t},"b":{t},"a":{t}}}"#), &[0; 4]),
        DuplicateTensor { name: "a".into() },
        r#"the header lists "a" twice"#,
    );
    // `__metadata__` is a key of the header, not a tensor.
    check(
        &file(r#"{"__metadata__":{},"__metadata__":{}}"#, &[]),
        DuplicateKey {
            object: String::new(),
            key: "__metadata__".into(),
        },
        r#"the header has the key "__metadata__" twice"#,
    );
    // The same name spelled with an escape is still the same name.
    check(
        &file(&format!(r#"{{"a":{t},"\u0061":{t}}}"#), &[0; 4]),
        DuplicateTensor { name: "a".into() },
        r#"the header lists "a" twice"#,
    );
    check(
        &one(
            r#""dtype":"F32","shape":[],"dtype":"F16","data_offsets":[0,4]"#,
            &[0; 4],
        ),
        DuplicateKey {
            object: "t".into(),
            key: "dtype".into(),
        },
        r#""t" has the key "dtype" twice"#,
    );
    check(
        &file(r#"{"__metadata__":{"k":"1","k":"2"}}"#, &[]),
        DuplicateKey {
            object: "__metadata__".into(),
            key: "k".into(),
        },
        r#""__metadata__" has the key "k" twice"#,
    );
}

#[test]
fn errors_in_the_layout() {
    use SafeTensorsError::*;
    check(
        &one(r#""dtype":"F32","shape":[1],"data_offsets":[8,4]"#, &[0; 8]),
        OffsetsReversed {
            tensor: "t".into(),
            begin: 8,
            end: 4,
        },
        r#"tensor "t" has data_offsets [8, 4]: begin is after end"#,
    );
    check(
        &one(
            r#""dtype":"F32","shape":[4],"data_offsets":[0,16]"#,
            &[0; 8],
        ),
        OffsetsOutOfRange {
            tensor: "t".into(),
            begin: 0,
            end: 16,
            data_len: 8,
        },
        r#"tensor "t" has data_offsets [0, 16] past the end of the 8-byte data region"#,
    );
    check(
        &one(
            r#""dtype":"F32","shape":[],"data_offsets":[18446744073709551615,18446744073709551615]"#,
            &[0; 8],
        ),
        OffsetsOutOfRange {
            tensor: "t".into(),
            begin: u64::MAX,
            end: u64::MAX,
            data_len: 8,
        },
        r#"tensor "t" has data_offsets [18446744073709551615, 18446744073709551615] past the end of the 8-byte data region"#,
    );
    check(
        &one(r#""dtype":"F32","shape":[2],"data_offsets":[0,4]"#, &[0; 4]),
        ByteCountMismatch {
            tensor: "t".into(),
            dtype: Dtype::F32,
            shape: vec![2],
            actual: 4,
        },
        r#"tensor "t" of dtype F32 and shape [2] (2 elements) needs 8 bytes, but its data_offsets span 4 bytes"#,
    );
    check(
        &one(
            r#""dtype":"BF16","shape":[0,5],"data_offsets":[0,2]"#,
            &[0; 2],
        ),
        ByteCountMismatch {
            tensor: "t".into(),
            dtype: Dtype::BF16,
            shape: vec![0, 5],
            actual: 2,
        },
        r#"tensor "t" of dtype BF16 and shape [0, 5] (0 elements) needs 0 bytes, but its data_offsets span 2 bytes"#,
    );
    let max = usize::MAX;
    check(
        &one(
            &format!(r#""dtype":"F32","shape":[{max},2],"data_offsets":[0,0]"#),
            &[],
        ),
        ShapeOverflow {
            tensor: "t".into(),
            shape: vec![max, 2],
        },
        &format!(r#"tensor "t" has shape [{max}, 2], whose size overflows usize"#),
    );
    // The element count fits, the byte count does not.
    let quarter = usize::MAX / 4 + 1;
    assert!(matches!(
        parse_err(&one(
            &format!(r#""dtype":"F32","shape":[{quarter}],"data_offsets":[0,0]"#),
            &[]
        )),
        ShapeOverflow { .. }
    ));
    // Zero-size dimensions make the product zero even next to huge ones; no overflow.
    let ok = one(
        &format!(r#""dtype":"F64","shape":[{max},0,{max}],"data_offsets":[0,0]"#),
        &[],
    );
    assert!(SafeTensors::parse(&ok).is_ok());

    let two = |a: &str, b: &str, data: &[u8]| {
        file(
            &format!(
                r#"{{"a":{{"dtype":"F32","shape":[1],"data_offsets":{a}}},"b":{{"dtype":"F32","shape":[1],"data_offsets":{b}}}}}"#
            ),
            data,
        )
    };
    check(
        &two("[0,4]", "[2,6]", &[0; 6]),
        Overlap {
            tensor: "b".into(),
            begin: 2,
            previous: "a".into(),
            previous_end: 4,
        },
        r#"tensor "b" starts at byte 2, inside "a" which ends at byte 4"#,
    );
    check(
        &two("[0,4]", "[0,4]", &[0; 4]),
        Overlap {
            tensor: "b".into(),
            begin: 0,
            previous: "a".into(),
            previous_end: 4,
        },
        r#"tensor "b" starts at byte 0, inside "a" which ends at byte 4"#,
    );
    check(
        &two("[0,4]", "[8,12]", &[0; 12]),
        Hole {
            tensor: "b".into(),
            from: 4,
            to: 8,
        },
        r#"data bytes 4..8 before tensor "b" belong to no tensor"#,
    );
    check(
        &two("[4,8]", "[8,12]", &[0; 12]),
        Hole {
            tensor: "a".into(),
            from: 0,
            to: 4,
        },
        r#"data bytes 0..4 before tensor "a" belong to no tensor"#,
    );
    check(
        &two("[0,4]", "[4,8]", &[0; 10]),
        TrailingBytes {
            covered: 8,
            data_len: 10,
        },
        "data bytes 8..10 after the last tensor belong to no tensor",
    );
    check(
        &file("{}", &[0]),
        TrailingBytes {
            covered: 0,
            data_len: 1,
        },
        "data bytes 0..1 after the last tensor belong to no tensor",
    );
    // Out of header order but contiguous in data order: fine. Zero-size tensors may sit at
    // any boundary.
    let st_bytes = file(
        r#"{"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"e":{"dtype":"F32","shape":[2,0],"data_offsets":[8,8]}}"#,
        &f32_bytes(&[1.0, 2.0]),
    );
    let st = SafeTensors::parse(&st_bytes).unwrap();
    assert_eq!(
        st.tensors().map(|t| t.name()).collect::<Vec<_>>(),
        ["a", "z", "b", "e"]
    );
    assert_eq!(st.vector("b", 1).unwrap(), [2.0]);
    // A zero-size tensor inside another one overlaps it.
    let inside = file(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}"#,
        &[0; 8],
    );
    assert!(matches!(parse_err(&inside), Overlap { .. }));
}

#[test]
fn errors_from_the_accessors() {
    use SafeTensorsError::*;
    let bytes = serialize(&[("w", &[2, 3], &[0.0; 6]), ("b", &[3], &[0.0; 3])], &[]).unwrap();
    let st = SafeTensors::parse(&bytes).unwrap();
    let err = st.tensor("nope").unwrap_err();
    assert_eq!(
        err,
        NotFound {
            name: "nope".into()
        }
    );
    assert_eq!(err.to_string(), r#"no tensor named "nope""#);
    assert!(st.get("nope").is_none());
    assert_eq!(st.tensor_f32("nope").unwrap_err(), err);
    assert_eq!(st.matrix::<2, 3>("nope").unwrap_err(), err);

    let err = st.matrix::<3, 2>("w").unwrap_err();
    assert_eq!(
        err,
        ShapeMismatch {
            tensor: "w".into(),
            expected: vec![3, 2],
            actual: vec![2, 3],
        }
    );
    assert_eq!(
        err.to_string(),
        r#"tensor "w" has shape [2, 3], expected [3, 2]"#
    );
    assert_eq!(
        st.matrix_transposed::<2, 3>("w").unwrap_err().to_string(),
        r#"tensor "w" has shape [2, 3], expected [3, 2]"#
    );
    assert_eq!(
        st.vector("b", 4).unwrap_err().to_string(),
        r#"tensor "b" has shape [3], expected [4]"#
    );
    assert_eq!(
        st.vector("w", 6).unwrap_err().to_string(),
        r#"tensor "w" has shape [2, 3], expected [6]"#
    );

    let raw = file(
        r#"{"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}"#,
        &1.0f64.to_le_bytes(),
    );
    let st = SafeTensors::parse(&raw).unwrap();
    let err = st.vector("d", 1).unwrap_err();
    assert_eq!(
        err,
        NotConvertible {
            tensor: "d".into(),
            dtype: Dtype::F64,
        }
    );
    assert_eq!(
        err.to_string(),
        r#"tensor "d" has dtype F64, which does not convert to f32 (only F32, F16 and BF16 do)"#
    );

    let err = std::error::Error::source(&err);
    assert!(err.is_none());
}

#[test]
fn errors_from_the_writer() {
    use SafeTensorsError::*;
    let err = serialize(&[("w", &[2, 3], &[0.0; 5])], &[]).unwrap_err();
    assert_eq!(
        err,
        WriteLengthMismatch {
            tensor: "w".into(),
            shape: vec![2, 3],
            unit: "values",
            expected: 6,
            actual: 5,
        }
    );
    assert_eq!(
        err.to_string(),
        r#"tensor "w" of shape [2, 3] needs 6 values, but 5 were given"#
    );
    let err = serialize_raw(&[("h", Dtype::F16, &[3], &[0; 5])], &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"tensor "h" of shape [3] needs 6 bytes, but 5 were given"#
    );
    // Three F4 values are 12 bits: no length of data fits them.
    for given in [1, 2, 3] {
        let err = serialize_raw(&[("q", Dtype::F4, &[3], &vec![0; given])], &[]).unwrap_err();
        assert_eq!(
            err,
            WriteLengthMismatch {
                tensor: "q".into(),
                shape: vec![3],
                unit: "bytes (the last partly)",
                expected: 2,
                actual: given,
            }
        );
        assert_eq!(
            err.to_string(),
            r#"tensor "q" of shape [3] fills 2 bytes, the last only partly, but a safetensors tensor must fill whole bytes"#
        );
    }
    let err = serialize_raw(&[("one", Dtype::U8, &[1], &[])], &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"tensor "one" of shape [1] needs 1 byte, but 0 were given"#
    );
    let err = serialize(&[("two", &[2], &[0.0])], &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"tensor "two" of shape [2] needs 2 values, but 1 was given"#
    );
    let err = serialize(&[("a", &[], &[1.0]), ("a", &[], &[2.0])], &[]).unwrap_err();
    assert_eq!(err, DuplicateTensor { name: "a".into() });
    let err = serialize(&[("__metadata__", &[], &[1.0])], &[]).unwrap_err();
    assert_eq!(
        err,
        DuplicateTensor {
            name: "__metadata__".into()
        }
    );
    // Named once: not "listed twice".
    assert_eq!(
        err.to_string(),
        r#"a tensor cannot be named "__metadata__": the header keeps that key for the metadata"#
    );
    let err = serialize(&[], &[("k", "1"), ("k", "2")]).unwrap_err();
    assert_eq!(err.to_string(), r#""__metadata__" has the key "k" twice"#);
    let err = serialize(&[("big", &[usize::MAX, 2], &[])], &[]).unwrap_err();
    assert!(matches!(err, ShapeOverflow { .. }));
}

#[cfg(feature = "std")]
#[test]
fn io_errors_name_the_path() {
    let path = std::env::temp_dir().join("mha-no-such-dir/none.safetensors");
    let err = read_file(&path).unwrap_err();
    let SafeTensorsError::Io { path: p, message } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(p, &path.display().to_string());
    assert!(!message.is_empty());
    assert!(err.to_string().starts_with(&path.display().to_string()));
    assert!(write_file(&path, &[], &[]).is_err());
}

// ---------------------------------------------------------------------------------------------
// matrix / matrix_transposed

#[test]
fn matrix_and_transpose_follow_the_layouts() {
    // nn.Linear(in=3, out=2): weight (out, in) = (2, 3); y = x · weightᵀ + bias.
    let weight = [1.0, 2.0, 3.0, -4.0, 5.0, -6.0];
    let bias = [0.5, -0.5];
    let bytes = serialize(&[("w", &[2, 3], &weight), ("b", &[2], &bias)], &[]).unwrap();
    let st = SafeTensors::parse(&bytes).unwrap();

    let stored: Matrix<2, 3> = st.matrix("w").unwrap();
    for r in 0..2 {
        for c in 0..3 {
            assert_eq!(stored[(r, c)], weight[r * 3 + c]);
        }
    }
    let w: Matrix<3, 2> = st.matrix_transposed("w").unwrap();
    for r in 0..3 {
        for c in 0..2 {
            assert_eq!(w[(r, c)], weight[c * 3 + r]);
        }
    }
    let b = st.vector("b", 2).unwrap();
    // x @ W + b with the crate's convention equals PyTorch's x · weightᵀ + bias.
    let x = [0.25, -1.0, 2.0];
    for o in 0..2 {
        let ours: f32 = (0..3).map(|i| x[i] * w[(i, o)]).sum::<f32>() + b[o];
        let torch: f32 = (0..3).map(|i| x[i] * weight[o * 3 + i]).sum::<f32>() + bias[o];
        assert_eq!(ours, torch);
    }
    // Square matrices: matrix and matrix_transposed differ by a transpose.
    let sq: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let bytes = serialize(&[("s", &[4, 4], &sq)], &[]).unwrap();
    let st = SafeTensors::parse(&bytes).unwrap();
    let a: Matrix<4, 4> = st.matrix("s").unwrap();
    let t: Matrix<4, 4> = st.matrix_transposed("s").unwrap();
    assert_eq!(a.transpose(), t);
    assert_eq!(a.as_slice(), &sq[..]);
    // Degenerate shapes.
    let bytes = serialize(&[("e", &[0, 3], &[])], &[]).unwrap();
    let st = SafeTensors::parse(&bytes).unwrap();
    assert_eq!(st.matrix::<0, 3>("e").unwrap(), Matrix::<0, 3>::zeros());
    assert_eq!(
        st.matrix_transposed::<3, 0>("e").unwrap(),
        Matrix::<3, 0>::zeros()
    );
}

// ---------------------------------------------------------------------------------------------
// Fuzzing: no input panics, and every accessor stays in bounds

/// Parses `bytes` and, when that succeeds, calls every accessor on every tensor.
fn exercise(bytes: &[u8]) -> bool {
    let st = match SafeTensors::parse(bytes) {
        Ok(st) => st,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return true;
        }
    };
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let data_len = bytes.len() - 8 - header_len;
    let mut covered = 0;
    for t in st.tensors() {
        let (begin, end) = t.data_offsets();
        assert_eq!(begin, covered, "tensors tile the data region");
        covered = end;
        assert_eq!(t.data().len(), end - begin);
        assert_eq!(
            t.data(),
            &bytes[8 + header_len + begin..8 + header_len + end]
        );
        let name = t.name();
        assert_eq!(st.get(name).unwrap(), t);
        match st.tensor_f32(name) {
            Ok((shape, values)) => {
                assert!(t.dtype().converts_to_f32());
                assert_eq!(shape, t.shape());
                assert_eq!(values.len(), t.element_count());
            }
            Err(e) => assert!(matches!(e, SafeTensorsError::NotConvertible { .. })),
        }
        let _ = st.matrix::<2, 2>(name);
        let _ = st.matrix::<1, 0>(name);
        let _ = st.matrix_transposed::<2, 3>(name);
        let _ = st.vector(name, t.element_count());
        let _ = format!("{t:?} {}", t.dtype());
    }
    assert_eq!(covered, data_len, "no trailing bytes");
    assert_eq!(st.names().count(), st.len());
    for (k, v) in st.metadata() {
        let _ = (k.len(), v.len());
    }
    let _ = format!("{st:?}");
    assert!(st.get("\u{0}no such tensor\u{0}").is_none());
    true
}

#[test]
fn fuzz_random_bytes() {
    fn prop(bytes: Vec<u8>) -> bool {
        exercise(&bytes)
    }
    fn prop_framed(header: Vec<u8>, data: Vec<u8>) -> bool {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header);
        bytes.extend(data);
        exercise(&bytes)
    }
    QuickCheck::new()
        .tests(1000)
        .quickcheck(prop as fn(Vec<u8>) -> bool);
    QuickCheck::new()
        .tests(1000)
        .quickcheck(prop_framed as fn(Vec<u8>, Vec<u8>) -> bool);
}

/// JSON fragments that make up safetensors headers, for generating near-valid headers.
const TOKENS: [&str; 32] = [
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    " ",
    "\"dtype\"",
    "\"shape\"",
    "\"data_offsets\"",
    "\"F32\"",
    "\"F16\"",
    "\"BF16\"",
    "\"I64\"",
    "\"U8\"",
    "\"F4\"",
    "\"a\"",
    "\"b\"",
    "\"__metadata__\"",
    "0",
    "1",
    "2",
    "4",
    "8",
    "-1",
    "1.5",
    "1e2",
    "null",
    "true",
    "\"\\u00e9\\ud83d\\ude00\"",
    "\"\\",
    "18446744073709551615",
];

#[test]
fn fuzz_token_soup_headers() {
    fn prop(tokens: Vec<u8>, data_len: u8) -> bool {
        let header: String = core::iter::once("{")
            .chain(tokens.iter().map(|&t| TOKENS[t as usize % TOKENS.len()]))
            .collect();
        exercise(&file(&header, &vec![0x3c; data_len as usize % 24]))
    }
    QuickCheck::new()
        .tests(2000)
        .quickcheck(prop as fn(Vec<u8>, u8) -> bool);
}

/// A header that is well-formed JSON, mostly shaped like a safetensors header, with its
/// tensors laid out validly and then, with some probability each, one thing wrong: offsets
/// off by a little, a shape off by one, a field missing, duplicated or of the wrong type, an
/// unknown dtype, a duplicate name, extra bytes.
#[derive(Clone, Debug)]
struct NearlyValid {
    header: String,
    data: Vec<u8>,
}

impl Arbitrary for NearlyValid {
    fn arbitrary(g: &mut Gen) -> Self {
        let pick = |g: &mut Gen, n: usize| usize::arbitrary(g) % n;
        let chance = |g: &mut Gen, in_n: usize| usize::arbitrary(g) % in_n == 0;
        let dtypes = [
            "F32", "F16", "BF16", "I64", "U8", "BOOL", "F4", "F64", "F8_E4M3", "X",
        ];
        let mut members: Vec<String> = Vec::new();
        let mut offset = 0usize;
        let count = pick(g, 5);
        for i in 0..count {
            // The unknown dtype "X" (last) only now and then.
            let choices = dtypes.len() - usize::from(!chance(g, 20));
            let dtype = dtypes[pick(g, choices)];
            let bits = Dtype::from_name(dtype).map_or(8, Dtype::bits);
            let mut shape: Vec<usize> = (0..pick(g, 4)).map(|_| pick(g, 4)).collect();
            if bits == 4 {
                shape.push(2);
            }
            let len = shape.iter().product::<usize>() * bits / 8;
            let (mut begin, mut end) = (offset, offset + len);
            offset = end;
            if chance(g, 8) {
                begin = begin.wrapping_add(pick(g, 5)).wrapping_sub(2);
            }
            if chance(g, 8) {
                end = end.wrapping_add(pick(g, 5)).wrapping_sub(2);
            }
            if chance(g, 10) && !shape.is_empty() {
                shape[0] += 1;
            }
            let name = if chance(g, 10) {
                "dup".to_string()
            } else {
                format!("t{i}")
            };
            let shape_json = if chance(g, 20) {
                "\"oops\"".to_string()
            } else {
                format!("{shape:?}")
            };
            let mut fields = vec![
                format!("\"dtype\":\"{dtype}\""),
                format!("\"shape\":{shape_json}"),
                format!("\"data_offsets\":[{begin},{end}]"),
            ];
            if chance(g, 15) {
                fields.remove(pick(g, 3));
            }
            if chance(g, 15) {
                let again = fields[pick(g, fields.len())].clone();
                fields.push(again);
            }
            if chance(g, 5) {
                fields.push("\"extra\":{\"x\":[1,{\"y\":null}]}".to_string());
            }
            // Shuffle the fields a little.
            let rotate = pick(g, fields.len());
            fields.rotate_left(rotate);
            members.push(format!("\"{name}\":{{{}}}", fields.join(",")));
        }
        if chance(g, 3) {
            members.insert(0, "\"__metadata__\":{\"format\":\"pt\"}".to_string());
        }
        let rotate = if members.is_empty() {
            0
        } else {
            pick(g, members.len())
        };
        members.rotate_left(rotate);
        let header = format!("{{{}}}", members.join(","));
        let extra = if chance(g, 8) { pick(g, 3) } else { 0 };
        let data = (0..offset + extra).map(|_| u8::arbitrary(g)).collect();
        NearlyValid { header, data }
    }
}

#[test]
fn fuzz_nearly_valid_headers() {
    fn prop(f: NearlyValid) -> bool {
        exercise(&file(&f.header, &f.data))
    }
    QuickCheck::new()
        .tests(3000)
        .quickcheck(prop as fn(NearlyValid) -> bool);
}

/// A valid file with a few tensors of assorted dtypes and shapes, chosen by `seed`.
fn valid_file(seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as usize
    };
    let dtypes = [
        Dtype::F32,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I64,
        Dtype::U8,
        Dtype::F4,
    ];
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for i in 0..1 + next() % 4 {
        let dtype = dtypes[next() % dtypes.len()];
        let mut shape: Vec<usize> = (0..next() % 4).map(|_| next() % 4).collect();
        if dtype == Dtype::F4 {
            shape.push(2);
        }
        let bits: usize = shape.iter().product::<usize>() * dtype.bits();
        let data = (0..bits / 8).map(|_| next() as u8).collect();
        owned.push((format!("t{i}"), dtype, shape, data));
    }
    let raw: Vec<_> = owned
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    serialize_raw(&raw, &[("format", "pt")]).unwrap()
}

#[test]
fn fuzz_mutated_valid_files() {
    fn prop(seed: u64, edits: Vec<(u8, u16, u8)>) -> bool {
        let mut bytes = valid_file(seed);
        assert!(SafeTensors::parse(&bytes).is_ok());
        assert!(exercise(&bytes));
        let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        for (op, at, value) in edits.into_iter().take(4) {
            let len = bytes.len();
            // Most edits land in the header, where they matter most.
            let at = if op & 0x80 != 0 {
                at as usize % (len + 1)
            } else {
                at as usize % (header_end.min(len) + 1)
            };
            match op % 7 {
                0 if at < len => bytes[at] ^= 1 << (value % 8),
                1 if at < len => bytes[at] = value,
                2 => bytes.truncate(at),
                3 => bytes.insert(at, value),
                4 if at < len => {
                    bytes.remove(at);
                }
                // Change a digit in the header to another digit: still JSON, different numbers.
                5 => {
                    let digits: Vec<usize> = (8..header_end.min(len))
                        .filter(|&i| bytes[i].is_ascii_digit())
                        .collect();
                    if !digits.is_empty() {
                        bytes[digits[at % digits.len()]] = b'0' + value % 10;
                    }
                }
                // Rewrite the header length, the most sensitive 8 bytes.
                _ if len >= 8 => {
                    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
                    let n = n.wrapping_add(u64::from(value)).wrapping_sub(128);
                    bytes[..8].copy_from_slice(&n.to_le_bytes());
                }
                _ => {}
            }
        }
        exercise(&bytes)
    }
    QuickCheck::new()
        .tests(3000)
        .quickcheck(prop as fn(u64, Vec<(u8, u16, u8)>) -> bool);
}
