//! GGUF files (`tests/fixtures/gguf`, written by `dev/gguf_fixtures/generate.py` with the
//! `gguf` package, llama.cpp's own writer, and quantized by ggml's own `ggml_quantize_chunk`):
//! - the float32 layers of the Hugging Face fixtures (Llama with its Q and K rows permuted as
//!   llama.cpp's converter stores them, and linear rope scaling; Qwen2 with biases and YaRN;
//!   Qwen3 with per-head QK-norm; Phi-3 with a fused `attn_qkv` and partial rotary; OLMo 2
//!   with whole-row QK-norm), opened by `Checkpoint::open`, give the fixtures' float64
//!   `transformers` outputs within the tolerance of the safetensors route, and decoding equals
//!   the forward bit for bit;
//! - every quantized tensor (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) dequantizes to the
//!   bits ggml's own `dequantize_row_*` gave (a 64-bit FNV-1a of all values and the first 64
//!   values, recorded in the file by the generator), and the layer of a quantized file equals
//!   bit for bit the f32 layer built by hand from those values; layers whose tensors mix
//!   types (as llama.cpp's `Q4_K_M` does) keep each tensor's bytes and equal the f32 layer of
//!   the dequantized values on every table, prefill and decode, 1 and 3 threads;
//! - every prefix of a file, and files with corrupted counts, lengths, offsets, types and
//!   alignments, are errors naming the numbers, never panics; unsupported architectures,
//!   settings and tensor types are errors naming them.

#![cfg(feature = "std")]

mod common;
#[path = "common/hf_fixture.rs"]
mod hf_fixture;

use std::path::PathBuf;

use common::modes::{ABS, REL};
use common::{assert_bits_eq, assert_close, decode_token_by_token, forward_and_decode, Rng};
use hf_fixture::{forward, token_by_token};
use mha::gguf::{Array, GgmlType, Gguf, GgufError, Value};
use mha::{
    AttentionConfig, Biases, Checkpoint, Isa, Layer, LoadError, Masking, Projections, QkNorm,
    QkNormSpan, Rope, RopeLayout, RopeScaling, Tokens, Widths,
};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/gguf/{name}.gguf"))
}

/// A fresh directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mha-gguf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One Hugging Face case through its GGUF file: the rotary layout llama.cpp's rope type
/// implies, the output within tolerance of `transformers`' float64, decoding bit for bit.
fn hf_case(name: &str, layout: RopeLayout) {
    let case = hf_fixture::load(name);
    let checkpoint = Checkpoint::open(fixture(name)).unwrap();
    assert_eq!(checkpoint.num_layers(), 1);
    let config = checkpoint.config(0).unwrap();
    assert_eq!(config.rope.unwrap().layout, layout, "{name}");
    assert_eq!(config.scale, case.scale as f32, "{name}: scale");
    let mut layer = checkpoint.layer(0).unwrap();
    let y = forward(&mut layer, &case, &case.x, None);
    assert_close(&y, &case.expected, ABS, REL, name);
    assert_bits_eq(&token_by_token(&mut layer, &case), &y, name);
    // The GGUF layer and the safetensors one compute the same model.
    let mut hf = Checkpoint::open(&case.dir).unwrap().layer(0).unwrap();
    let want = forward(&mut hf, &case, &case.x, None);
    let want: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
    assert_close(
        &y,
        &want,
        1e-5,
        1e-5,
        &format!("{name} against safetensors"),
    );
}

#[test]
fn llama_permuted_rows_with_interleaved_rope() {
    hf_case("llama_gqa", RopeLayout::Interleaved);
    hf_case("llama_linear", RopeLayout::Interleaved);
    let config = Checkpoint::open(fixture("llama_linear")).unwrap().config(0);
    let scaling = config.unwrap().rope.unwrap().scaling;
    assert_eq!(scaling, RopeScaling::Linear { factor: 2.5 });
}

#[test]
fn qwen2_biases_and_yarn() {
    hf_case("qwen2_bias", RopeLayout::RotateHalf);
    hf_case("qwen2_yarn", RopeLayout::RotateHalf);
}

#[test]
fn qwen3_qk_norm() {
    hf_case("qwen3_qknorm", RopeLayout::RotateHalf);
}

/// Phi-3: one fused `attn_qkv`, half of each head rotated (`rope.dimension_count`).
#[test]
fn phi3_fused_qkv_and_partial_rotary() {
    hf_case("phi3_partial", RopeLayout::RotateHalf);
    let rope = Checkpoint::open(fixture("phi3_partial")).unwrap().config(0);
    assert_eq!(rope.unwrap().rope.unwrap().rotary_dim, 6);
}

/// OLMo 2: QK-norm over the whole projected row (`attn_q_norm` of Q values).
#[test]
fn olmo2_whole_row_qk_norm() {
    hf_case("olmo2_qknorm", RopeLayout::RotateHalf);
}

/// Every Phi-3 layer slides its window `attention.sliding_window` (as `transformers`' Phi-3
/// applies it); a window of 0 is an error naming the key.
#[test]
fn phi3_windows_every_layer() {
    let window = |w: u32| {
        small_model(
            "phi3",
            &[u32_entry("phi3.attention.sliding_window", w)],
            None,
            0,
        )
    };
    let bytes = window(8);
    let config = AttentionConfig::from_gguf(&Gguf::parse(&bytes).unwrap(), 0).unwrap();
    assert_eq!(config.sliding_window, Some(8));
    let message = layer_err("phi3_window", &window(0)).to_string();
    assert!(
        message.contains("\"phi3.attention.sliding_window\" = 0"),
        "{message}"
    );
}

/// The quantized fixtures: name, and the ggml types of q, k, v and output.
const QUANT_CASES: [(&str, [GgmlType; 4]); 3] = [
    (
        "qwen2_kquants",
        [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q8_0,
        ],
    ),
    (
        "llama_legacy",
        [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
        ],
    ),
    (
        "qwen3_mixed",
        [
            GgmlType::Q8_0,
            GgmlType::Q6_K,
            GgmlType::Q4_K,
            GgmlType::Q4_0,
        ],
    ),
];
const PROJECTIONS: [&str; 4] = ["attn_q", "attn_k", "attn_v", "attn_output"];

/// FNV-1a, 64 bits, of the values' little-endian bytes (the generator's hash).
fn fnv1a64(values: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in values.iter().flat_map(|v| v.to_le_bytes()) {
        h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The values of the quantized tensor `name` of `gguf`, checked against what ggml's own
/// dequantization gave (recorded in the file's metadata).
fn ggml_values(gguf: &Gguf, bytes: &[u8], name: &str) -> Vec<f32> {
    let values = gguf.tensor_f32(bytes, name).unwrap();
    let meta = gguf.metadata();
    let Some(Value::U64(hash)) = meta.get(&format!("mha.test.fnv1a64.{name}")) else {
        panic!("{name}: no hash");
    };
    let Some(Value::Array(Array::F32(head))) = meta.get(&format!("mha.test.head.{name}")) else {
        panic!("{name}: no head");
    };
    assert_bits_eq(&values[..head.len()], head, name);
    assert_eq!(fnv1a64(&values), *hash, "{name}: the hash of all values");
    values
}

#[test]
fn dequantized_values_are_ggmls() {
    for (case, types) in QUANT_CASES {
        let bytes = std::fs::read(fixture(case)).unwrap();
        let gguf = Gguf::parse(&bytes).unwrap();
        for (projection, ty) in PROJECTIONS.into_iter().zip(types) {
            let name = format!("blk.0.{projection}.weight");
            let info = gguf.tensor(&name).unwrap();
            assert_eq!(info.ggml_type, ty, "{case}: {name}");
            let values = ggml_values(&gguf, &bytes, &name);
            assert_eq!(values.len() as u64, info.len());
        }
    }
}

/// The stored `(rows, cols)` matrix `w` as `x @ W`, `(cols, rows)`, by a plain loop.
fn transposed(w: &[f32], rows: usize) -> Vec<f32> {
    let cols = w.len() / rows;
    let mut out = vec![0.0; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = w[r * cols + c];
        }
    }
    out
}

/// The layer of quantized case `case` built by hand from ggml's dequantized weights: D = 256,
/// 4 heads of 64, 2 key/value heads, rope theta 10,000 over whole heads.
fn by_hand(case: &str, gguf: &Gguf, bytes: &[u8]) -> Layer {
    let (d, q, kv) = (256, 256, 128);
    let tensor = |name: &str| gguf.tensor_f32(bytes, &format!("blk.0.{name}")).unwrap();
    let [wq, wk, wv, wo] = [(0, q), (1, kv), (2, kv), (3, d)].map(|(i, rows)| {
        transposed(
            &ggml_values(gguf, bytes, &format!("blk.0.{}.weight", PROJECTIONS[i])),
            rows,
        )
    });
    let widths = Widths::self_attention(d, kv, q);
    let projections = Projections::new(widths, &wq, &wk, &wv, &wo).unwrap();
    let layout = match case {
        "llama_legacy" => RopeLayout::Interleaved,
        _ => RopeLayout::RotateHalf,
    };
    let rope = Rope {
        theta: 10_000.0,
        rotary_dim: 64,
        layout,
        scaling: RopeScaling::Default,
    };
    let mut builder = Layer::builder(projections, 4)
        .masking(Masking::Causal)
        .rope(rope);
    if case == "qwen2_kquants" {
        let [bq, bk, bv] =
            ["attn_q", "attn_k", "attn_v"].map(|m| Some(tensor(&format!("{m}.bias"))));
        builder = builder.biases(Biases {
            bq,
            bk,
            bv,
            bo: None,
        });
    }
    if case == "qwen3_mixed" {
        builder = builder.qk_norm(QkNorm {
            span: QkNormSpan::PerHead,
            q_weight: tensor("attn_q_norm.weight"),
            k_weight: tensor("attn_k_norm.weight"),
            eps: 1e-6,
        });
    }
    builder.build().unwrap()
}

#[test]
fn quantized_layers_equal_the_f32_layer_of_ggmls_values() {
    let mut rng = Rng::new(7);
    let (b, t, d) = (2, 9, 256);
    let x = rng.vec(b * t * d, 1.0);
    for (case, _) in QUANT_CASES {
        let bytes = std::fs::read(fixture(case)).unwrap();
        let gguf = Gguf::parse(&bytes).unwrap();
        let mut want = by_hand(case, &gguf, &bytes);
        let checkpoint = Checkpoint::open(fixture(case)).unwrap();
        let mut got = checkpoint.layer(0).unwrap();
        let tokens = || Tokens::new(&x, b, t, d).unwrap();
        let (y, y_want) = (
            got.forward(tokens()).unwrap(),
            want.forward(tokens()).unwrap(),
        );
        assert_bits_eq(&y, &y_want, case);
    }
}

/// The end of the last tensor's bytes: every shorter prefix of the file is not a whole file.
fn data_end(gguf: &Gguf) -> u64 {
    gguf.tensors()
        .iter()
        .map(|t| gguf.range(t).end)
        .max()
        .unwrap_or(gguf.data_start())
}

#[test]
fn every_prefix_of_a_file_is_an_error() {
    for case in ["llama_gqa", "qwen3_qknorm"] {
        let bytes = std::fs::read(fixture(case)).unwrap();
        let end = data_end(&Gguf::parse(&bytes).unwrap()) as usize;
        for len in 0..bytes.len() {
            match Gguf::parse(&bytes[..len]) {
                Ok(_) => assert!(len >= end, "{case}: a prefix of {len} bytes parsed"),
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
    }
    // Through Checkpoint::open: the file cut inside its header, and inside its tensors.
    let bytes = std::fs::read(fixture("llama_gqa")).unwrap();
    let dir = temp_dir("truncated");
    let cuts = [
        (100, "bytes are left in the file"),
        (bytes.len() - 100, "past the end"),
    ];
    for (len, expected) in cuts {
        let path = dir.join("model.gguf");
        std::fs::write(&path, &bytes[..len]).unwrap();
        let err = Checkpoint::open(&dir).unwrap_err();
        assert!(matches!(err, LoadError::Gguf { .. }), "{err}");
        assert!(err.to_string().contains(expected), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn random_corruptions_never_panic() {
    let bytes = std::fs::read(fixture("qwen2_bias")).unwrap();
    let mut rng = Rng::new(11);
    for _ in 0..3000 {
        let mut corrupt = bytes.clone();
        for _ in 0..1 + rng.next_u64() % 4 {
            // Mostly the header, where the counts and offsets are.
            let at = (rng.next_u64() % 2048) as usize % corrupt.len();
            corrupt[at] = rng.next_u64() as u8;
        }
        if let Ok(gguf) = Gguf::parse(&corrupt) {
            for t in gguf.tensors() {
                if let Ok(values) = gguf.tensor_f32(&corrupt, &t.name) {
                    assert_eq!(values.len() as u64, t.len());
                }
            }
        }
    }
}

/// A GGUF string.
fn string(s: &str) -> Vec<u8> {
    [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat()
}

/// A metadata entry: key, value type, value bytes.
fn entry(key: &str, value_type: u32, value: &[u8]) -> Vec<u8> {
    [
        string(key),
        value_type.to_le_bytes().to_vec(),
        value.to_vec(),
    ]
    .concat()
}

/// A `u32` metadata entry.
fn u32_entry(key: &str, value: u32) -> Vec<u8> {
    entry(key, 4, &value.to_le_bytes())
}

/// A tensor info: name, dimensions (ggml order), type id, offset.
fn info(name: &str, dims: &[u64], type_id: u32, offset: u64) -> Vec<u8> {
    let mut out = string(name);
    out.extend((dims.len() as u32).to_le_bytes());
    dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
    out.extend(type_id.to_le_bytes());
    out.extend(offset.to_le_bytes());
    out
}

/// A version 3 file of `entries` and `infos`, padded to 32, then `data`.
fn file(entries: &[Vec<u8>], infos: &[Vec<u8>], data: &[u8]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((infos.len() as u64).to_le_bytes());
    out.extend((entries.len() as u64).to_le_bytes());
    entries
        .iter()
        .chain(infos)
        .for_each(|part| out.extend(part));
    out.resize(out.len().next_multiple_of(32), 0);
    out.extend(data);
    out
}

fn parse_err(bytes: &[u8]) -> GgufError {
    Gguf::parse(bytes).unwrap_err()
}

#[test]
fn corrupted_headers_are_errors_naming_the_numbers() {
    let ok = file(&[u32_entry("a", 1)], &[info("w", &[2], 0, 0)], &[0; 8]);
    assert!(Gguf::parse(&ok).is_ok());
    let at = |bytes: &[u8], offset: usize, value: &[u8]| {
        let mut b = bytes.to_vec();
        b[offset..offset + value.len()].copy_from_slice(value);
        b
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (at(&ok, 0, b"GGML"), "not \"GGUF\""),
        (at(&ok, 4, &1u32.to_le_bytes()), "version 1"),
        (at(&ok, 8, &u64::MAX.to_le_bytes()), "the tensor count at byte 8 is 18446744073709551615"),
        (at(&ok, 16, &(1u64 << 40).to_le_bytes()), "the metadata count at byte 16"),
        (at(&ok, 24, &(1u64 << 33).to_le_bytes()), "a metadata key at byte 24 is 8589934592 bytes long"),
        (at(&ok, 33, &13u32.to_le_bytes()), "\"a\" has value type 13"),
        (file(&[entry("b", 7, &[2])], &[], &[]), "\"b\" is a bool of byte 2"),
        (file(&[entry("s", 8, &string("x")), entry("s", 0, &[1])], &[], &[]), "\"s\" appears twice"),
        (file(&[entry("s", 8, &[0xff; 8])], &[], &[]), "bytes long"),
        (file(&[entry("n", 9, &[&4u32.to_le_bytes()[..], &u64::MAX.to_le_bytes()].concat())], &[], &[]), "an array's element count"),
        (file(&[u32_entry("general.alignment", 3)], &[], &[]), "\"general.alignment\" = U32(3)"),
        (file(&[entry("general.alignment", 8, &string("32"))], &[], &[]), "must be a u32 power of two"),
        (file(&[], &[info("w", &[1, 1, 1, 1, 1], 0, 0)], &[0; 4]), "5 dimensions"),
        (file(&[], &[info("w", &[2], 99, 0)], &[0; 8]), "unknown ggml type 99"),
        (file(&[], &[info("w", &[u64::MAX, 2], 0, 0)], &[]), "overflow u64"),
        (file(&[], &[info("w", &[33], 8, 0)], &[0; 68]), "a row of 33 values is not a whole number of Q8_0 blocks of 32 values"),
        (file(&[], &[info("w", &[2], 0, 4)], &[0; 12]), "not a multiple of the alignment 32"),
        (file(&[], &[info("w", &[4], 0, 0)], &[0; 8]), "16 bytes at offset 0 of the data): the bytes run past the end of the data section, 8 bytes long"),
        (file(&[], &[info("w", &[2], 0, u64::MAX - 31)], &[0; 8]), "run past the end"),
        (file(&[], &[info("w", &[2], 0, 0), info("w", &[2], 0, 0)], &[0; 8]), "\"w\" appears twice"),
    ];
    for (bytes, expected) in cases {
        let message = parse_err(&bytes).to_string();
        assert!(message.contains(expected), "{message:?} lacks {expected:?}");
    }
    // Arrays nested past the limit; at the limit they parse.
    let nested = |depth: usize| {
        let mut value = [&0u32.to_le_bytes()[..], &0u64.to_le_bytes()].concat();
        for _ in 1..depth {
            value = [&9u32.to_le_bytes()[..], &1u64.to_le_bytes(), &value].concat();
        }
        file(&[entry("deep", 9, &value)], &[], &[])
    };
    assert!(Gguf::parse(&nested(mha::gguf::MAX_ARRAY_DEPTH)).is_ok());
    let err = parse_err(&nested(mha::gguf::MAX_ARRAY_DEPTH + 1));
    assert_eq!(err, GgufError::TooDeep { key: "deep".into() });
}

/// A llama layer (D = 4, 2 heads of 2, 1 key/value head) with `extra` metadata entries and
/// tensor infos; the attention weights F32 unless `q_type` says otherwise.
fn small_model(arch: &str, extra: &[Vec<u8>], extra_tensor: Option<&str>, q_type: u32) -> Vec<u8> {
    let key = |k: &str| format!("{arch}.{k}");
    let mut entries = vec![
        entry("general.architecture", 8, &string(arch)),
        u32_entry(&key("block_count"), 1),
        u32_entry(&key("context_length"), 16),
        u32_entry(&key("embedding_length"), 4),
        u32_entry(&key("attention.head_count"), 2),
        u32_entry(&key("attention.head_count_kv"), 1),
    ];
    entries.extend_from_slice(extra);
    let mut infos = Vec::new();
    let mut offset = 0;
    for (name, rows) in [
        ("attn_q", 4),
        ("attn_k", 2),
        ("attn_v", 2),
        ("attn_output", 4),
    ] {
        let ty = if name == "attn_q" { q_type } else { 0 };
        infos.push(info(
            &format!("blk.0.{name}.weight"),
            &[4, rows],
            ty,
            offset,
        ));
        offset += 64;
    }
    if let Some(name) = extra_tensor {
        infos.push(info(name, &[2], 0, offset));
    }
    let data: Vec<u8> = (0..offset + 32).map(|i| (i % 7) as u8 * 16).collect();
    file(&entries, &infos, &data)
}

/// The error of `Checkpoint::open(...).layer(0)` on the file `bytes`.
fn layer_err(name: &str, bytes: &[u8]) -> LoadError {
    let dir = temp_dir(name);
    std::fs::write(dir.join("m.gguf"), bytes).unwrap();
    let result = Checkpoint::open(&dir).and_then(|c| c.layer(0));
    std::fs::remove_dir_all(&dir).unwrap();
    result.unwrap_err()
}

#[test]
fn unsupported_models_are_errors_naming_them() {
    let dir = temp_dir("small");
    std::fs::write(dir.join("m.gguf"), small_model("llama", &[], None, 0)).unwrap();
    let layer = Checkpoint::open(dir.join("m.gguf"))
        .unwrap()
        .layer(0)
        .unwrap();
    assert_eq!(layer.widths().kv, 2);
    std::fs::remove_dir_all(&dir).unwrap();
    let bytes = std::fs::read(fixture("llama_gqa")).unwrap();
    let config = AttentionConfig::from_gguf(&Gguf::parse(&bytes).unwrap(), 0).unwrap();
    assert_eq!(
        (config.n_heads, config.n_kv_heads, config.head_dim),
        (6, 2, 6)
    );

    let scaling = entry("llama.rope.scaling.type", 8, &string("longrope"));
    let cases = [
        ("arch", small_model("gemma2", &[], None, 0), "\"general.architecture\" = \"gemma2\" is not supported"),
        ("window", small_model("llama", &[u32_entry("llama.attention.sliding_window", 8)], None, 0), "\"llama.attention.sliding_window\" = U32(8) is not supported"),
        ("freqs", small_model("llama", &[], Some("rope_freqs.weight"), 0), "\"rope_freqs.weight\" = a tensor is not supported"),
        ("scaling", small_model("llama", &[scaling], None, 0), "\"llama.rope.scaling.type\" = \"longrope\" is not supported"),
        ("value", small_model("llama", &[u32_entry("llama.attention.value_length", 1)], None, 0), "\"llama.attention.value_length\" = 1: must equal attention.key_length = 2"),
        ("key", small_model("llama", &[entry("llama.attention.key_length", 8, &string("2"))], None, 0), "\"llama.attention.key_length\" must be a non-negative integer (or an array of them, one per layer), found string"),
        ("i32", small_model("llama", &[], None, 26), "tensor \"blk.0.attn_q.weight\" has ggml type I32, which is not read"),
        ("bias", small_model("llama", &[], Some("blk.0.attn_q.bias"), 0), "tensor \"blk.0.attn_q.bias\" has shape [2], expected [4]"),
        ("longrope", small_model("phi3", &[], Some("rope_factors_long.weight"), 0), "\"rope_factors_long.weight\" = a tensor is not supported"),
    ];
    for (name, bytes, expected) in cases {
        let message = layer_err(name, &bytes).to_string();
        assert!(
            message.contains(expected),
            "{name}: {message:?} lacks {expected:?}"
        );
    }
    // A missing projection names the GGUF tensor and the layers the file holds.
    let mut bytes = small_model("llama", &[], None, 0);
    let at = bytes
        .windows(12)
        .position(|w| w == b"attn_k.weigh")
        .unwrap();
    bytes[at..at + 6].copy_from_slice(b"attn_x");
    let message = layer_err("missing", &bytes).to_string();
    assert!(
        message.contains(
            "no tensor \"blk.0.attn_k.weight\" in m.gguf; layers of this family in it: \"blk.0\""
        ),
        "{message}"
    );
}

#[test]
fn split_files_open_as_one_model() {
    let split = fixture("split/x").parent().unwrap().to_path_buf();
    let case = hf_fixture::load("qwen2_bias");
    let mut from_splits = Checkpoint::open(&split).unwrap().layer(0).unwrap();
    let mut from_one = Checkpoint::open(fixture("qwen2_bias"))
        .unwrap()
        .layer(0)
        .unwrap();
    let y = forward(&mut from_splits, &case, &case.x, None);
    assert_bits_eq(&y, &forward(&mut from_one, &case, &case.x, None), "splits");
    // An incomplete set is not a model.
    let dir = temp_dir("splits");
    for i in [1, 3] {
        let name = format!("qwen2_bias-0000{i}-of-00003.gguf");
        std::fs::copy(split.join(&name), dir.join(&name)).unwrap();
    }
    let err = Checkpoint::open(&dir).unwrap_err();
    assert!(
        matches!(err, LoadError::NoWeights { ref found, .. } if found.len() == 2),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Random blocks of `ty` for `rows` rows of `cols` values, each block's binary16 scales
/// small and finite (q8_0, q4_0: `d` first; q4_K, q5_K: `d`, `dmin` first; q6_K: `d` last).
fn random_blocks(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let (values, bytes) = (ty.block_len(), ty.block_bytes());
    let scale = 0x211fu16.to_le_bytes(); // 0.01
    let mut out = Vec::new();
    for _ in 0..rows * cols / values {
        let mut block: Vec<u8> = (0..bytes).map(|_| (rng.next_u64() >> 56) as u8).collect();
        let scales = match ty {
            GgmlType::Q6_K => vec![bytes - 2],
            GgmlType::Q4_K | GgmlType::Q5_K => vec![0, 2],
            _ => vec![0],
        };
        for at in scales {
            block[at..at + 2].copy_from_slice(&scale);
        }
        out.extend(block);
    }
    out
}

/// Random values of `ty` for `rows` rows of `cols`: blocks as [`random_blocks`], binary16
/// and `f32` values of magnitude below 0.125.
fn random_tensor(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 => rng
            .vec(rows * cols, 0.1)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..rows * cols)
            .flat_map(|_| {
                let r = rng.next_u64();
                // Sign, exponent 8 .. 11 (2^-7 .. 2^-4), any mantissa.
                let bits = ((r >> 63) << 15) | ((8 + (r >> 40) % 4) << 10) | (r & 0x3ff);
                (bits as u16).to_le_bytes()
            })
            .collect(),
        _ => random_blocks(rng, ty, rows, cols),
    }
}

/// A file of `arch` (D 256, 4 heads of 64, 2 key/value heads, rope theta 10,000) holding the
/// layer tensors `tensors` (name after `blk.0.`, output rows, type), random values of their
/// types.
fn model_file(rng: &mut Rng, arch: &str, tensors: &[(&str, usize, GgmlType)]) -> Vec<u8> {
    let f32_entry = |k: &str, v: f32| entry(&format!("{arch}.{k}"), 6, &v.to_le_bytes());
    let u32_arch = |k: &str, v: u32| u32_entry(&format!("{arch}.{k}"), v);
    let entries = [
        entry("general.architecture", 8, &string(arch)),
        u32_arch("block_count", 1),
        u32_arch("context_length", 64),
        u32_arch("embedding_length", 256),
        u32_arch("attention.head_count", 4),
        u32_arch("attention.head_count_kv", 2),
        f32_entry("rope.freq_base", 10_000.0),
    ];
    let (mut infos, mut data) = (Vec::new(), Vec::new());
    for &(name, rows, ty) in tensors {
        let name = format!("blk.0.{name}");
        data.resize(data.len().next_multiple_of(32), 0);
        infos.push(info(&name, &[256, rows as u64], ty.id(), data.len() as u64));
        data.extend(random_tensor(rng, ty, rows, 256));
    }
    file(&entries, &infos, &data)
}

/// A llama file whose four projections are all random blocks of `ty`.
fn uniform_model(rng: &mut Rng, ty: GgmlType) -> Vec<u8> {
    let names = PROJECTIONS.map(|p| format!("{p}.weight"));
    let rows = [256, 128, 128, 256];
    let tensors: Vec<_> = (0..4).map(|i| (&names[i][..], rows[i], ty)).collect();
    model_file(rng, "llama", &tensors)
}

/// The f32 layer of the dequantized projections of the file `bytes` (one fused `attn_qkv`
/// or `attn_q`, `attn_k`, `attn_v`; `attn_output`), rotating pairs as `layout`.
fn f32_layer_of(bytes: &[u8], layout: RopeLayout, isa: Isa, threads: usize) -> Layer {
    let gguf = Gguf::parse(bytes).unwrap();
    let values = |name: &str| gguf.tensor_f32(bytes, &format!("blk.0.{name}.weight"));
    let (q, kv, d) = (256, 128, 256);
    let [wq, wk, wv] = match values("attn_qkv") {
        Ok(fused) => {
            [0..q, q..q + kv, q + kv..q + 2 * kv].map(|r| fused[r.start * d..r.end * d].to_vec())
        }
        Err(_) => ["attn_q", "attn_k", "attn_v"].map(|name| values(name).unwrap()),
    };
    let [wq, wk, wv, wo] = [
        (wq, q),
        (wk, kv),
        (wv, kv),
        (values("attn_output").unwrap(), d),
    ]
    .map(|(w, rows)| transposed(&w, rows));
    let projections =
        Projections::new(Widths::self_attention(d, kv, q), &wq, &wk, &wv, &wo).unwrap();
    let rope = Rope {
        theta: 10_000.0,
        rotary_dim: 64,
        layout,
        scaling: RopeScaling::Default,
    };
    let builder = Layer::builder(projections, 4)
        .masking(Masking::Causal)
        .rope(rope);
    builder.isa(isa).threads(threads).build().unwrap()
}

/// A file whose projections are all in one of the block formats the kernels keep opens as a
/// layer in that format, holding exactly the file's blocks, and computes the bits of the f32
/// layer of the dequantized values (prefill and decode).
#[test]
fn uniform_block_files_keep_their_blocks() {
    use mha::WeightFormat;
    let mut rng = Rng::new(11);
    let (b, t, d) = (2, 5, 256);
    let x = rng.vec(b * t * d, 1.0);
    let dir = temp_dir("uniform");
    let formats = [
        (GgmlType::Q8_0, WeightFormat::Q8_0),
        (GgmlType::Q4_0, WeightFormat::Q4_0),
        (GgmlType::Q4_K, WeightFormat::Q4_K),
        (GgmlType::Q5_K, WeightFormat::Q5_K),
        (GgmlType::Q6_K, WeightFormat::Q6_K),
    ];
    for (ty, format) in formats {
        let bytes = uniform_model(&mut rng, ty);
        let path = dir.join(format!("{}.gguf", ty.name()));
        std::fs::write(&path, &bytes).unwrap();
        let gguf = Gguf::parse(&bytes).unwrap();
        let checkpoint = Checkpoint::open(&path).unwrap();
        let weights = checkpoint.weights(0).unwrap();
        assert_eq!(weights.format(), format, "{ty:?}");
        let mut layer = checkpoint.layer(0).unwrap();
        assert_eq!(layer.weight_format(), format);
        let stored: u64 = gguf.tensors().iter().map(|t| t.bytes).sum();
        assert_eq!(layer.weight_bytes() as u64, stored, "{ty:?}");
        let mut want = f32_layer_of(
            &bytes,
            RopeLayout::Interleaved,
            layer.isa(),
            layer.threads(),
        );
        let tokens = || Tokens::new(&x, b, t, d).unwrap();
        let y = layer.forward(tokens()).unwrap();
        assert_bits_eq(&y, &want.forward(tokens()).unwrap(), ty.name());
        let decoded = decode_token_by_token(&mut layer, &x, (b, t), None);
        assert_bits_eq(&decoded, &y, &format!("{ty:?} decoded"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Files whose layer mixes tensor types as llama.cpp's mixtures do — `Q4_K_M`'s q4_K q, k and
/// output with a q6_K v; a fused `attn_qkv` in q5_K beside a q4_K output; q8_0 beside the
/// F16 and F32 tensors a q8_0 file falls back to — keep every tensor in its own format
/// (`weight_bytes` is the file's tensor bytes) and compute the bits of the f32 layer of the
/// dequantized values on every kernel table, forward and decoding token by token, on 1 and 3
/// threads.
#[test]
fn mixed_files_keep_each_tensors_format() {
    use mha::WeightFormat::{self, F16, F32, Q4_K, Q5_K, Q6_K, Q8_0};
    use GgmlType as G;
    let mut rng = Rng::new(12);
    let (b, t, d) = (2, 5, 256);
    let x = rng.vec(b * t * d, 1.0);
    let dir = temp_dir("mixed");
    type Case<'a> = (
        &'a str,
        &'a str,
        Vec<(&'a str, usize, GgmlType)>,
        [WeightFormat; 4],
    );
    let separate = |types: [GgmlType; 4]| -> Vec<(&str, usize, GgmlType)> {
        let names = [
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
        ];
        (0..4)
            .map(|i| (names[i], [256, 128, 128, 256][i], types[i]))
            .collect()
    };
    let cases: [Case<'_>; 4] = [
        (
            "q4_k_m",
            "llama",
            separate([G::Q4_K, G::Q4_K, G::Q6_K, G::Q4_K]),
            [Q4_K, Q4_K, Q6_K, Q4_K],
        ),
        (
            "fused_q5_k",
            "phi3",
            vec![
                ("attn_qkv.weight", 512, G::Q5_K),
                ("attn_output.weight", 256, G::Q4_K),
            ],
            [Q5_K, Q5_K, Q5_K, Q4_K],
        ),
        (
            "q8_0_f16",
            "qwen2",
            separate([G::Q8_0, G::F16, G::Q8_0, G::Q8_0]),
            [Q8_0, F16, Q8_0, Q8_0],
        ),
        (
            "q8_0_f32",
            "llama",
            separate([G::F32, G::Q8_0, G::F16, G::Q8_0]),
            [F32, Q8_0, F16, Q8_0],
        ),
    ];
    for (name, arch, tensors, formats) in cases {
        let bytes = model_file(&mut rng, arch, &tensors);
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, &bytes).unwrap();
        let checkpoint = Checkpoint::open(&path).unwrap();
        let layout = checkpoint.config(0).unwrap().rope.unwrap().layout;
        let stored: u64 = Gguf::parse(&bytes)
            .unwrap()
            .tensors()
            .iter()
            .map(|t| t.bytes)
            .sum();
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let mut one_thread = None;
            for threads in [1, 3] {
                let mut got = checkpoint
                    .layer_with(0, |l| l.isa(isa).threads(threads))
                    .unwrap();
                assert_eq!(got.weight_formats(), formats, "{name}");
                assert_eq!(got.weight_bytes() as u64, stored, "{name}");
                let mut want = f32_layer_of(&bytes, layout, isa, threads);
                let context = format!("{name} {isa:?} {threads} threads");
                let (y, decoded) = forward_and_decode(&mut got, &x, (b, t));
                assert_bits_eq(&y, &forward_and_decode(&mut want, &x, (b, t)).0, &context);
                assert_bits_eq(&decoded, &y, &format!("{context} decoded"));
                assert_bits_eq(&y, one_thread.get_or_insert_with(|| y.clone()), &context);
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
