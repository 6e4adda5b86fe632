//! GGUF files (`tests/fixtures/gguf`, written by `dev/gguf_fixtures/generate.py` with the
//! `gguf` package, llama.cpp's own writer, and quantized by ggml's own `ggml_quantize_chunk`):
//! - the float32 layers of the Hugging Face fixtures (Llama with its Q and K rows permuted as
//!   llama.cpp's converter stores them, and linear rope scaling; Qwen2 with biases and YaRN;
//!   Qwen3 with per-head QK-norm), opened by `Checkpoint::open`, give the fixtures' float64
//!   `transformers` outputs within the tolerance of the safetensors route, and decoding equals
//!   the forward bit for bit;
//! - every quantized tensor (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) dequantizes to the
//!   bits ggml's own `dequantize_row_*` gave (a 64-bit FNV-1a of all values and the first 64
//!   values, recorded in the file by the generator), and the layer of a quantized file equals
//!   bit for bit the f32 layer built by hand from those values;
//! - every prefix of a file, and files with corrupted counts, lengths, offsets, types and
//!   alignments, are errors naming the numbers, never panics; unsupported architectures,
//!   settings and tensor types are errors naming them.

#![cfg(feature = "std")]

mod common;
#[path = "common/hf_fixture.rs"]
mod hf_fixture;

use std::path::PathBuf;

use common::modes::{ABS, REL};
use common::{assert_bits_eq, assert_close, Rng};
use hf_fixture::{forward, token_by_token};
use mha::gguf::{Array, GgmlType, Gguf, GgufError, Value};
use mha::{
    AttentionConfig, Biases, Checkpoint, Layer, LoadError, Masking, Projections, QkNorm,
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
