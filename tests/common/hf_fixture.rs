//! Reader of the Hugging Face reference fixtures in `tests/fixtures/hf/<case>/`, written by
//! `dev/hf_fixtures/generate.py` (see `dev/hf_fixtures/README.md` for the formats).
//!
//! Include it from a test crate with
//! `#[path = "common/hf_fixture.rs"] mod hf_fixture;`. It uses only the crate's own
//! safetensors reader: `F32` tensors through `tensor_f32`, `I64` and `F64` (which do not convert to
//! `f32`) decoded here from the raw little-endian bytes of `TensorView::data`, and the case
//! facts from the `__metadata__` strings of `io.safetensors` (so no JSON parser is needed;
//! `case.json` holds the same facts and more for people).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mha::safetensors::{Dtype, SafeTensors};
use mha::{AttendOptions, Layer, Output, Tokens};

/// The directory holding one sub-directory per case.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf")
}

/// The names of all cases, sorted.
pub fn case_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures/hf exists")
        .map(|e| e.expect("readable directory entry"))
        .filter(|e| e.path().join("io.safetensors").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// One case: what it is, its inputs and the float64 reference output.
#[derive(Debug)]
pub struct HfCase {
    /// The case's directory name, e.g. `qwen3_qknorm`.
    pub name: String,
    /// Its directory (holding `config.json`, `model.safetensors`, `io.safetensors`, `case.json`).
    pub dir: PathBuf,
    /// `llama`, `mistral`, `qwen2`, `qwen3`, `phi3`, `olmo2`, `gpt_neox`, `gptj`, `gemma2`,
    /// `gemma3`, `bloom` or `gpt_oss`.
    pub family: String,
    /// The prefix of the layer's tensors in `model.safetensors`, e.g.
    /// `model.layers.0.self_attn.` (layer [`HfCase::layer_index`]).
    pub layer_prefix: String,
    /// Batch size `B`.
    pub batch: usize,
    /// Sequence length `T`.
    pub seq_len: usize,
    /// Model width `D` (`hidden_size`; `n_embd` for GPT-J).
    pub hidden: usize,
    /// What the case exercises, e.g. `rope`, `gqa`, `qk_norm_per_head`, `config_legacy`.
    pub features: Vec<String>,
    /// Whether every row of `positions` is `0..T` (so the case also runs without explicit
    /// positions).
    pub default_positions: bool,
    /// Input `(B, T, D)` row-major, float32 as stored.
    pub x: Vec<f32>,
    /// `position_ids` `(B, T)` row-major.
    pub positions: Vec<i64>,
    /// Reference output `(B, T, D)` row-major, float64.
    pub expected: Vec<f64>,
    /// The layer's index in its model (the number inside `layer_prefix`); it decides the layer's
    /// type (window or not) for Qwen2, Gemma 2/3 and gpt-oss.
    pub layer_index: usize,
    /// `sliding_attention` or `full_attention` (transformers' names).
    pub layer_type: String,
    /// The layer's window: query `i` sees key `j` iff `j ≤ i` and `i − window < j`; `None` for a
    /// causal-only layer (also a full layer of a model whose config has a window).
    pub sliding_window: Option<usize>,
    /// The score scale the reference used (`query_pre_attn_scalar^-½` for Gemma 2/3, else
    /// `head_dim^-½`).
    pub scale: f64,
    /// Logit soft-cap (`s = cap · tanh(s / cap)` before the mask), Gemma 2.
    pub softcap: Option<f64>,
    /// ALiBi slopes, one per head (BLOOM); the bias is `−slope_h · (i − j)`.
    pub alibi_slopes: Option<Vec<f64>>,
    /// Whether the layer has gpt-oss attention sinks (`<layer_prefix>sinks`, one logit per head,
    /// in `model.safetensors`).
    pub sinks: bool,
    /// The `(B, T)` padding mask the model was given (`true` for real tokens), when the case
    /// has one (metadata `padding_mask`, tensor `attention_mask`); `None`: every token real.
    pub padding_mask: Option<Vec<bool>>,
}

impl HfCase {
    /// Whether the case lists `feature`.
    pub fn has(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }

    /// The text of `config.json`.
    pub fn config_json(&self) -> String {
        std::fs::read_to_string(self.dir.join("config.json")).expect("config.json readable")
    }

    /// The bytes of `model.safetensors` (the layer's weights, float32, checkpoint names).
    pub fn model_bytes(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("model.safetensors")).expect("model.safetensors readable")
    }

    /// The positions as `usize` (all fixtures' positions are non-negative).
    pub fn positions_usize(&self) -> Vec<usize> {
        self.positions
            .iter()
            .map(|&p| usize::try_from(p).expect("non-negative position"))
            .collect()
    }
}

/// The `F64` tensor `name`, shape checked.
fn f64_tensor(st: &SafeTensors<'_>, name: &str, shape: &[usize]) -> Vec<f64> {
    let t = st.tensor(name).expect("tensor present");
    assert_eq!(t.dtype(), Dtype::F64, "{name}: dtype");
    assert_eq!(t.shape(), shape, "{name}: shape");
    t.data()
        .as_chunks::<8>()
        .0
        .iter()
        .map(|&b| f64::from_le_bytes(b))
        .collect()
}

/// The `I64` tensor `name`, shape checked.
fn i64_tensor(st: &SafeTensors<'_>, name: &str, shape: &[usize]) -> Vec<i64> {
    let t = st.tensor(name).expect("tensor present");
    assert_eq!(t.dtype(), Dtype::I64, "{name}: dtype");
    assert_eq!(t.shape(), shape, "{name}: shape");
    t.data()
        .as_chunks::<8>()
        .0
        .iter()
        .map(|&b| i64::from_le_bytes(b))
        .collect()
}

/// Loads case `name` (a directory under [`fixtures_dir`]); panics with the file and field at
/// fault when anything is missing or malformed.
pub fn load(name: &str) -> HfCase {
    let dir = fixtures_dir().join(name);
    let bytes = std::fs::read(dir.join("io.safetensors")).expect("io.safetensors readable");
    let st = SafeTensors::parse(&bytes).expect("io.safetensors parses");
    let meta = st.metadata();
    let get = |key: &str| -> String {
        meta.get(key)
            .unwrap_or_else(|| panic!("{name}: io.safetensors metadata lacks {key}"))
            .clone()
    };
    let num = |key: &str| -> usize {
        get(key)
            .parse()
            .unwrap_or_else(|_| panic!("{name}: metadata {key} is not a number"))
    };
    assert_eq!(get("case"), name, "metadata case name");
    let (batch, seq_len, hidden) = (num("batch"), num("seq_len"), num("hidden_size"));

    let optional = |key: &str| -> Option<String> {
        let v = get(key);
        (v != "none").then_some(v)
    };
    let float = |key: &str, v: &str| -> f64 {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: metadata {key} is not a number: {v:?}"))
    };
    let sliding_window = optional("sliding_window").map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: metadata sliding_window is {v:?}"))
    });
    let softcap = optional("softcap").map(|v| float("softcap", &v));
    let alibi_slopes =
        optional("alibi_slopes").map(|v| v.split(',').map(|s| float("alibi_slopes", s)).collect());
    let scale = float("scale", &get("scale"));

    let (x_shape, x) = st.tensor_f32("x").expect("x is F32");
    assert_eq!(st.tensor("x").unwrap().dtype(), Dtype::F32, "x: dtype");
    assert_eq!(x_shape, [batch, seq_len, hidden], "x: shape");
    let positions = i64_tensor(&st, "position_ids", &[batch, seq_len]);
    let expected = f64_tensor(&st, "expected", &[batch, seq_len, hidden]);
    let padding_mask = (meta.get("padding_mask").map(String::as_str) == Some("true")).then(|| {
        let mask = i64_tensor(&st, "attention_mask", &[batch, seq_len]);
        assert!(
            mask.iter().all(|&m| m == 0 || m == 1),
            "{name}: attention_mask"
        );
        mask.into_iter().map(|m| m == 1).collect()
    });

    HfCase {
        name: name.to_owned(),
        family: get("family"),
        layer_prefix: get("layer_prefix"),
        batch,
        seq_len,
        hidden,
        features: get("features").split(',').map(str::to_owned).collect(),
        default_positions: match get("default_positions").as_str() {
            "true" => true,
            "false" => false,
            other => panic!("{name}: default_positions is {other:?}"),
        },
        x,
        positions,
        expected,
        layer_index: num("layer_index"),
        layer_type: get("layer_type"),
        sliding_window,
        scale,
        softcap,
        alibi_slopes,
        sinks: match get("sinks").as_str() {
            "true" => true,
            "false" => false,
            other => panic!("{name}: sinks is {other:?}"),
        },
        padding_mask,
        dir,
    }
}

/// The layer's output for `x (B, T, D)`, with the case's positions unless they are the default.
pub fn forward(
    layer: &mut Layer,
    case: &HfCase,
    x: &[f32],
    token_lengths: Option<&[usize]>,
) -> Vec<f32> {
    let positions = case.positions_usize();
    let options = AttendOptions {
        positions: (!case.default_positions).then_some(&positions[..]),
        token_lengths,
        key_padding_mask: case.padding_mask.as_deref(),
        ..AttendOptions::default()
    };
    let (b, t, d) = (case.batch, case.seq_len, case.hidden);
    let mut out = vec![0.0; b * t * d];
    let input = Tokens::new(x, b, t, d).unwrap();
    layer
        .forward_into(input, options, Output::new(&mut out, b, t, d).unwrap())
        .unwrap();
    out
}

/// The case's tokens decoded one at a time through a cache, as `(B, T, D)`.
pub fn token_by_token(layer: &mut Layer, case: &HfCase) -> Vec<f32> {
    let (b, t, d) = (case.batch, case.seq_len, case.hidden);
    let positions = case.positions_usize();
    // A windowed layer's cache rolls: one token per call, slots for the window and that token.
    let window = layer.sliding_window();
    if let Some(window) = window {
        assert!(t > 2 * window, "{}: T = {t}, window {window}", case.name);
    }
    let mut cache = layer.new_cache(b, window.map_or(t, |_| 1)).unwrap();
    let mut out = vec![0.0; b * t * d];
    for step in 0..t {
        let x: Vec<f32> = (0..b)
            .flat_map(|s| case.x[(s * t + step) * d..][..d].to_vec())
            .collect();
        let step_positions: Vec<usize> = (0..b).map(|s| positions[s * t + step]).collect();
        // The padding of the keys so far, `(B, step + 1)`.
        let padding: Option<Vec<bool>> = case.padding_mask.as_ref().map(|mask| {
            (0..b)
                .flat_map(|s| mask[s * t..][..=step].to_vec())
                .collect()
        });
        let options = AttendOptions {
            positions: (!case.default_positions).then_some(&step_positions[..]),
            key_padding_mask: padding.as_deref(),
            ..AttendOptions::default()
        };
        let mut y = vec![0.0; b * d];
        let input = Tokens::new(&x, b, 1, d).unwrap();
        let output = Output::new(&mut y, b, 1, d).unwrap();
        layer
            .decode_into(input, &mut cache, options, output)
            .unwrap();
        for s in 0..b {
            out[(s * t + step) * d..][..d].copy_from_slice(&y[s * d..][..d]);
        }
    }
    out
}
