//! Llama-style, Phi-3 and GPT-NeoX checkpoints: files written here in each layout (F32, F16,
//! BF16) with random weights, loaded with `LayerWeights::from_safetensors`, and compared with
//! the stored arrays transposed by a plain loop; then every way a load can fail, as a
//! `LoadError` naming the tensor and the numbers.

mod common;

use common::{file, Rng, Stored};
use mha::safetensors::{serialize_raw, Dtype, Layout, SafeTensors};
use mha::{AttentionConfig, Biases, ConfigError, LayerWeights, LoadError, MhaParams, QkNorm};
use mha::{ShapeError, WeightFormat, WeightValues, Widths};

/// Values exact in F16, BF16 and F32: k / 64 for k in -128..128.
fn exact_values(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| ((rng.next_u64() % 256) as f32 - 128.0) / 64.0)
        .collect()
}

fn config(json: &str) -> AttentionConfig {
    AttentionConfig::from_json(json, 0).unwrap()
}

/// `(D, Q, KV, head_dim)` of a config.
fn dims(c: &AttentionConfig) -> (usize, usize, usize, usize) {
    let q = c.n_heads * c.head_dim;
    (c.hidden_size, q, c.n_kv_heads * c.head_dim, c.head_dim)
}

/// The tensors of layer `p` in `c`'s layout, random, stored as `dtype`.
fn fixture(c: &AttentionConfig, p: &str, dtype: Dtype, seed: u64) -> Vec<Stored> {
    let (d, q, kv, hd) = dims(c);
    let mut rng = Rng::new(seed);
    let mut tensors = Vec::new();
    let mut add = |name: &str, shape: &[usize]| {
        tensors.push(Stored {
            name: format!("{p}.{name}"),
            dtype,
            shape: shape.to_vec(),
            values: exact_values(&mut rng, shape.iter().product()),
        })
    };
    let b = c.biases;
    match c.layout() {
        Layout::Phi3 => {
            add("qkv_proj.weight", &[q + 2 * kv, d]);
            add("o_proj.weight", &[d, q]);
        }
        Layout::GptNeox => {
            add("query_key_value.weight", &[3 * q, d]);
            add("dense.weight", &[d, q]);
            if b.q {
                add("query_key_value.bias", &[3 * q]);
                add("dense.bias", &[d]);
            }
        }
        _ => {
            for (name, rows, bias) in [
                ("q_proj", q, b.q),
                ("k_proj", kv, b.k),
                ("v_proj", kv, b.v),
                ("o_proj", d, b.o),
            ] {
                let inputs = if name == "o_proj" { q } else { d };
                add(&format!("{name}.weight"), &[rows, inputs]);
                if bias {
                    add(&format!("{name}.bias"), &[rows]);
                }
            }
        }
    }
    if let Some(norm) = c.qk_norm {
        let per_head = norm.span == mha::QkNormSpan::PerHead;
        add("q_norm.weight", &[if per_head { hd } else { q }]);
        add("k_norm.weight", &[if per_head { hd } else { kv }]);
    }
    tensors
}

fn stored<'a>(fx: &'a [Stored], p: &str, suffix: &str) -> Option<&'a [f32]> {
    let name = format!("{p}.{suffix}");
    fx.iter()
        .find(|t| t.name == name)
        .map(|t| t.values.as_slice())
}

/// `x @ W` of the rows `rows` of a stored `(out, inputs)` matrix: element `(r, c)` is
/// `w[rows[c]][r]`.
fn transpose_rows(w: &[f32], inputs: usize, rows: &[usize]) -> Vec<f32> {
    let mut out = Vec::new();
    for r in 0..inputs {
        for &row in rows {
            out.push(w[row * inputs + r]);
        }
    }
    out
}

/// The stored rows of the query, key and value projections, listed one by one.
fn qkv_rows(c: &AttentionConfig) -> [Vec<usize>; 3] {
    let (_, q, kv, hd) = dims(c);
    match c.layout() {
        Layout::Phi3 => [
            (0..q).collect(),
            (q..q + kv).collect(),
            (q + kv..q + 2 * kv).collect(),
        ],
        Layout::GptNeox => {
            // GPTNeoXAttention: qkv.view(..., H, 3·hd).chunk(3, dim=-1).
            let mut rows = [Vec::new(), Vec::new(), Vec::new()];
            for h in 0..c.n_heads {
                for (part, rows) in rows.iter_mut().enumerate() {
                    for j in 0..hd {
                        rows.push(h * 3 * hd + part * hd + j);
                    }
                }
            }
            rows
        }
        _ => [(0..q).collect(), (0..kv).collect(), (0..kv).collect()],
    }
}

/// The layer the fixture holds, worked out with plain loops.
fn expected(c: &AttentionConfig, p: &str, fx: &[Stored]) -> LayerWeights {
    let (d, q, kv, _) = dims(c);
    let names: [&str; 4] = match c.layout() {
        Layout::Phi3 => ["qkv_proj", "qkv_proj", "qkv_proj", "o_proj"],
        Layout::GptNeox => [
            "query_key_value",
            "query_key_value",
            "query_key_value",
            "dense",
        ],
        _ => ["q_proj", "k_proj", "v_proj", "o_proj"],
    };
    let rows = qkv_rows(c);
    let weight = |i: usize| stored(fx, p, &format!("{}.weight", names[i])).unwrap();
    let bias = |i: usize, rows: &[usize]| {
        stored(fx, p, &format!("{}.bias", names[i])).map(|b| rows.iter().map(|&r| b[r]).collect())
    };
    let all_d: Vec<usize> = (0..d).collect();
    LayerWeights {
        widths: Widths::self_attention(d, kv, q),
        wq: transpose_rows(weight(0), d, &rows[0]).into(),
        wk: transpose_rows(weight(1), d, &rows[1]).into(),
        wv: transpose_rows(weight(2), d, &rows[2]).into(),
        wo: transpose_rows(weight(3), q, &all_d).into(),
        biases: Biases {
            bq: bias(0, &rows[0]),
            bk: bias(1, &rows[1]),
            bv: bias(2, &rows[2]),
            bo: bias(3, &all_d),
        },
        qk_norm: c.qk_norm.map(|n| QkNorm {
            span: n.span,
            q_weight: stored(fx, p, "q_norm.weight").unwrap().to_vec(),
            k_weight: stored(fx, p, "k_norm.weight").unwrap().to_vec(),
            eps: n.eps,
        }),
        sinks: None,
        gate: None,
    }
}

/// `w` with its matrices widened to `f32`.
fn widened(w: &LayerWeights) -> LayerWeights {
    let f32 = |m: &WeightValues| WeightValues::F32(m.to_f32());
    LayerWeights {
        wq: f32(&w.wq),
        wk: f32(&w.wk),
        wv: f32(&w.wv),
        wo: f32(&w.wo),
        ..w.clone()
    }
}

fn load(bytes: &[u8], p: &str, c: &AttentionConfig) -> Result<LayerWeights, LoadError> {
    LayerWeights::from_safetensors(&SafeTensors::parse(bytes).unwrap(), p, c)
}

/// Families with odd sizes: grouped-query heads, head_dim ≠ D / H, every bias pattern.
const CONFIGS: [&str; 8] = [
    r#"{"model_type": "llama", "hidden_size": 12, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1}"#,
    r#"{"model_type": "llama", "hidden_size": 10, "head_dim": 6, "num_attention_heads": 3, "num_key_value_heads": 3, "num_hidden_layers": 1, "attention_bias": true}"#,
    r#"{"model_type": "mistral", "hidden_size": 12, "num_attention_heads": 3, "num_key_value_heads": 1, "num_hidden_layers": 1, "sliding_window": null}"#,
    r#"{"model_type": "qwen2", "hidden_size": 12, "num_attention_heads": 3, "num_key_value_heads": 1, "num_hidden_layers": 1}"#,
    r#"{"model_type": "qwen3", "hidden_size": 10, "head_dim": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1}"#,
    r#"{"model_type": "olmo2", "hidden_size": 12, "num_attention_heads": 3, "num_key_value_heads": 3, "num_hidden_layers": 1, "attention_bias": true}"#,
    r#"{"model_type": "phi3", "hidden_size": 12, "num_attention_heads": 3, "num_key_value_heads": 1, "num_hidden_layers": 1, "partial_rotary_factor": 0.5}"#,
    r#"{"model_type": "gpt_neox", "hidden_size": 18, "num_attention_heads": 3, "num_hidden_layers": 1}"#,
];

#[test]
fn every_family_loads_its_layout() {
    for (i, json) in CONFIGS.iter().enumerate() {
        let c = config(json);
        let p = c.tensor_prefix();
        for (j, dtype) in [Dtype::F32, Dtype::F16, Dtype::BF16]
            .into_iter()
            .enumerate()
        {
            let fx = fixture(&c, &p, dtype, (10 * i + j) as u64);
            let got = load(&file(&fx), &p, &c).unwrap_or_else(|e| panic!("{e}\n{json}"));
            let format = match dtype {
                Dtype::F16 => WeightFormat::F16,
                Dtype::BF16 => WeightFormat::Bf16,
                _ => WeightFormat::F32,
            };
            assert_eq!(widened(&got), expected(&c, &p, &fx), "{json} {dtype}");
            // Each matrix is kept in the format it is stored in.
            let matrices = [&got.wq, &got.wk, &got.wv, &got.wo];
            assert!(
                matrices.iter().all(|m| m.format() == format),
                "{json} {dtype}"
            );
            assert_eq!(got.format(), format);
            // A trailing '.' on the prefix is ignored.
            assert_eq!(load(&file(&fx), &format!("{p}."), &c).unwrap(), got);
        }
    }
}

#[test]
fn gpt_neox_without_biases() {
    let c = config(
        r#"{"model_type": "gpt_neox", "hidden_size": 10, "num_attention_heads": 5, "num_hidden_layers": 1, "attention_bias": false, "rotary_pct": 1.0}"#,
    );
    let fx = fixture(&c, "layer", Dtype::F32, 7);
    let got = load(&file(&fx), "layer", &c).unwrap();
    assert!(got.biases.bq.is_none() && got.biases.bo.is_none());
    assert_eq!(got, expected(&c, "layer", &fx));
}

#[test]
fn neox_interleaving_by_hand() {
    // Two heads of width 1 in a 2-wide model: rows [q0, k0, v0, q1, k1, v1] of
    // query_key_value, each row [r, r + 0.5] for row r.
    let c = config(
        r#"{"model_type": "gpt_neox", "hidden_size": 2, "num_attention_heads": 2, "num_hidden_layers": 1, "attention_bias": false, "rotary_pct": 0}"#,
    );
    let qkv: Vec<f32> = (0..6).flat_map(|r| [r as f32, r as f32 + 0.5]).collect();
    let dense = [0.0, 1.0, 2.0, 3.0];
    let bytes = mha::safetensors::serialize(
        &[
            ("a.query_key_value.weight", &[6, 2], &qkv),
            ("a.dense.weight", &[2, 2], &dense),
        ],
        &[],
    )
    .unwrap();
    let w = load(&bytes, "a", &c).unwrap();
    // wq column h is row 3h: wq = [[0, 3], [0.5, 3.5]].
    assert_eq!(w.wq.to_f32(), [0.0, 3.0, 0.5, 3.5]);
    assert_eq!(w.wk.to_f32(), [1.0, 4.0, 1.5, 4.5]);
    assert_eq!(w.wv.to_f32(), [2.0, 5.0, 2.5, 5.5]);
    assert_eq!(w.wo.to_f32(), [0.0, 2.0, 1.0, 3.0]);
}

/// The loaded weights build the layer the config describes, and its typed view checks the
/// widths: a wrong one is an error naming it.
#[test]
fn weights_build_layers_and_typed_views() {
    let c = config(CONFIGS[3]); // qwen2: D = 12, KV = 4, q/k/v biases
    let p = c.tensor_prefix();
    let fx = fixture(&c, &p, Dtype::BF16, 99);
    let w = load(&file(&fx), &p, &c).unwrap();
    let layer = w.builder(&c).unwrap().threads(1).build().unwrap();
    assert_eq!(layer.widths(), Widths::self_attention(12, 4, 12));
    assert_eq!(layer.biases(), &w.biases);
    assert_eq!(
        (layer.n_heads(), layer.n_kv_heads(), layer.scale()),
        (3, 1, c.scale)
    );
    let typed = mha::Mha::<12, 12, 4>::try_from(layer).unwrap();
    assert_eq!(
        typed.biases().bk.as_ref().unwrap().as_slice(),
        w.biases.bk.as_deref().unwrap()
    );
    let layer = w.builder(&c).unwrap().build().unwrap();
    let err = mha::Mha::<12>::try_from(layer).unwrap_err();
    assert_eq!(
        err.to_string(),
        "converting a Layer to Mha<12, 12, 12, 12>: the layer's key/value width (KV) is 4, \
         not 12 (it converts to Mha<12, 12, 4, 12>)"
    );
    let mut cut = w;
    cut.wv = WeightValues::F32(cut.wv.to_f32()[1..].to_vec());
    assert!(matches!(
        cut.builder(&c),
        Err(ShapeError::LengthMismatch {
            expected: 48,
            actual: 47,
            ..
        })
    ));

    // Qwen3's query width 24 is not its model width 10.
    let c = config(CONFIGS[4]);
    let p = c.tensor_prefix();
    let w = load(&file(&fixture(&c, &p, Dtype::F32, 5)), &p, &c).unwrap();
    assert_eq!(w.widths, Widths::self_attention(10, 12, 24));
    let layer = w.builder(&c).unwrap().build().unwrap();
    assert_eq!((layer.head_dim(), layer.qk_norm()), (6, w.qk_norm.as_ref()));
    let err = mha::Mha::<10, 10, 12, 10>::try_from(layer).unwrap_err();
    assert_eq!(
        err.to_string(),
        "converting a Layer to Mha<10, 10, 12, 10>: the layer's query width (Q) is 24, not 10 \
         (it converts to Mha<10, 10, 12, 24>)"
    );
}

/// The fixture of `CONFIGS[i]` with tensor `suffix` replaced by one of `shape` (or removed,
/// for `None`), then loaded.
fn altered(i: usize, suffix: &str, shape: Option<&[usize]>) -> LoadError {
    let c = config(CONFIGS[i]);
    let p = c.tensor_prefix();
    let name = format!("{p}.{suffix}");
    let mut fx = fixture(&c, &p, Dtype::F32, 3);
    fx.retain(|t| t.name != name);
    if let Some(shape) = shape {
        fx.push(common::f32_tensor(
            &name,
            shape,
            vec![0.5; shape.iter().product()],
        ));
    }
    load(&file(&fx), &p, &c).unwrap_err()
}

#[test]
fn tensors_that_disagree_with_the_config() {
    let cases: [(usize, &str, Option<&[usize]>, &str); 10] = [
        (
            0,
            "k_proj.weight",
            Some(&[12, 12]),
            r#"tensor "model.layers.0.self_attn.k_proj.weight" has shape [12, 12], expected [6, 12]"#,
        ),
        (
            0,
            "o_proj.weight",
            Some(&[12, 6]),
            r#"tensor "model.layers.0.self_attn.o_proj.weight" has shape [12, 6], expected [12, 12]"#,
        ),
        (
            3,
            "q_proj.bias",
            Some(&[4]),
            r#"tensor "model.layers.0.self_attn.q_proj.bias" has shape [4], expected [12]"#,
        ),
        (
            4,
            "q_norm.weight",
            Some(&[24]),
            r#"tensor "model.layers.0.self_attn.q_norm.weight" has shape [24], expected [6]"#,
        ),
        (
            5,
            "k_norm.weight",
            Some(&[4]),
            r#"tensor "model.layers.0.self_attn.k_norm.weight" has shape [4], expected [12]"#,
        ),
        (
            6,
            "qkv_proj.weight",
            Some(&[36, 12]),
            r#"tensor "model.layers.0.self_attn.qkv_proj.weight" has shape [36, 12], expected [20, 12]"#,
        ),
        (
            7,
            "query_key_value.bias",
            Some(&[18]),
            r#"tensor "gpt_neox.layers.0.attention.query_key_value.bias" has shape [18], expected [54]"#,
        ),
        (
            0,
            "q_proj.bias",
            Some(&[12]),
            r#"tensor "model.layers.0.self_attn.q_proj.bias" is in the file, but the config gives this projection no bias"#,
        ),
        (
            3,
            "o_proj.bias",
            Some(&[12]),
            r#"tensor "model.layers.0.self_attn.o_proj.bias" is in the file, but the config gives this projection no bias"#,
        ),
        (
            2,
            "q_norm.weight",
            Some(&[4]),
            r#"tensor "model.layers.0.self_attn.q_norm.weight" is in the file, but the config gives this layer no QK-norm"#,
        ),
    ];
    for (i, suffix, shape, message) in cases {
        assert_eq!(altered(i, suffix, shape).to_string(), message, "{suffix}");
    }
    let missing: [(usize, &str); 4] = [
        (3, "v_proj.bias"),
        (4, "k_norm.weight"),
        (6, "o_proj.weight"),
        (7, "dense.bias"),
    ];
    for (i, suffix) in missing {
        let err = altered(i, suffix, None);
        assert!(
            matches!(&err, LoadError::MissingTensor { tensor, .. } if tensor.ends_with(suffix)),
            "{err}"
        );
    }
}

#[test]
fn wrong_prefix_lists_the_layers() {
    let c = config(CONFIGS[6]);
    let mut fx = fixture(&c, "model.layers.0.self_attn", Dtype::F32, 1);
    fx.extend(fixture(&c, "model.layers.1.self_attn", Dtype::F32, 2));
    let bytes = file(&fx);
    let st = SafeTensors::parse(&bytes).unwrap();
    assert_eq!(
        Layout::Phi3.prefixes_in(&st),
        ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    );
    assert!(Layout::Llama.prefixes_in(&st).is_empty());
    let err = LayerWeights::from_safetensors(&st, "model.layers.2.self_attn", &c).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"no tensor "model.layers.2.self_attn.qkv_proj.weight" in the checkpoint; layers of this family in it: "model.layers.0.self_attn", "model.layers.1.self_attn""#
    );
    // A Llama config on a Phi-3 file.
    let llama = config(CONFIGS[0]);
    let err = LayerWeights::from_safetensors(&st, "model.layers.0.self_attn", &llama).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("it holds no layer of this family"),
        "{err}"
    );
}

#[test]
fn other_failures() {
    let mut c = config(CONFIGS[0]);
    let p = c.tensor_prefix();
    let bytes = file(&fixture(&c, &p, Dtype::F32, 4));
    c.n_kv_heads = 0;
    assert_eq!(
        load(&bytes, &p, &c).unwrap_err(),
        LoadError::Config {
            dir: String::new(),
            error: ConfigError::Invalid {
                key: "num_key_value_heads".into(),
                value: "0".into(),
                reason: "must be at least 1".into(),
            }
        }
    );
    c.n_kv_heads = 1;
    c.head_dim = usize::MAX;
    assert!(matches!(
        load(&bytes, &p, &c),
        Err(LoadError::Config { .. })
    ));
    // Huge widths whose weights fit in no address space (2^40 x 2^40 floats): a config error
    // naming the width.
    (c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim) = (1 << 40, 1 << 10, 1 << 10, 1 << 30);
    assert!(matches!(
        load(&bytes, &p, &c),
        Err(LoadError::Config { error: ConfigError::Invalid { key, .. }, .. }) if key == "hidden_size"
    ));
    // Huge widths whose weights could be addressed (2^20 x 2^20 floats): the shapes are
    // compared before anything is allocated, and the error names the shape the config implies.
    (c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim) = (1 << 20, 1 << 10, 1 << 10, 1 << 10);
    assert!(matches!(
        load(&bytes, &p, &c),
        Err(LoadError::Shape { expected, .. }) if expected == [1 << 20, 1 << 20]
    ));

    // An integer tensor.
    let ids = [0u8; 8 * 12 * 12];
    let raw = serialize_raw(&[("x.q_proj.weight", Dtype::I64, &[12, 12], &ids)], &[]).unwrap();
    let c = config(CONFIGS[0]);
    assert_eq!(
        load(&raw, "x", &c).unwrap_err().to_string(),
        r#"tensor "x.q_proj.weight" has dtype I64, which does not convert to f32 (only F32, F16 and BF16 do)"#
    );

    // MhaParams::from_safetensors (no config) on this grouped-query Llama layer: its key
    // projection is not (D, D); a layout whose tensors the file lacks names the first one.
    let st = SafeTensors::parse(&bytes).unwrap();
    let err = MhaParams::<12>::from_safetensors(&st, &p, Layout::Llama, 2).unwrap_err();
    assert!(
        matches!(&err, LoadError::Shape { tensor, expected, actual, .. }
            if tensor.ends_with("k_proj.weight") && expected == &[12, 12] && actual == &[6, 12]),
        "{err:?}"
    );
    for layout in [Layout::Phi3, Layout::GptNeox] {
        let err = MhaParams::<12>::from_safetensors(&st, &p, layout, 2).unwrap_err();
        assert!(matches!(err, LoadError::MissingTensor { .. }), "{err:?}");
    }
    let err = MhaParams::<12>::from_safetensors(&st, &p, Layout::Llama, 5).unwrap_err();
    assert!(matches!(err, LoadError::Typed { .. }), "{err:?}");
}

/// The typed loader and the config's loader are one: for self-attention layers without QK-norm
/// (a biased Llama layer, GPT-NeoX's per-head rows), `MhaParams::from_safetensors` with
/// the head count gives the matrices and biases `LayerWeights::from_safetensors` gives.
#[test]
fn the_typed_loader_reads_what_the_config_loader_reads() {
    fn check<const D: usize>(json: &str, layout: Layout) {
        let c = config(json);
        let p = c.tensor_prefix();
        let bytes = file(&fixture(&c, &p, Dtype::F32, 9));
        let st = SafeTensors::parse(&bytes).unwrap();
        let w = LayerWeights::from_safetensors(&st, &p, &c).unwrap();
        let (params, biases) = MhaParams::<D>::from_safetensors(&st, &p, layout, c.n_heads)
            .unwrap_or_else(|e| panic!("{layout}: {e}"));
        let typed = [&params.wq, &params.wk, &params.wv, &params.wo].map(|m| m.as_slice());
        assert_eq!(
            typed,
            [&w.wq, &w.wk, &w.wv, &w.wo].map(|v| v.as_f32().unwrap()),
            "{layout}"
        );
        assert_eq!(Biases::from(biases), w.biases, "{layout}");
    }
    let llama = r#"{"model_type": "llama", "hidden_size": 12, "num_attention_heads": 3,
        "num_key_value_heads": 3, "num_hidden_layers": 1, "attention_bias": true}"#;
    check::<12>(llama, Layout::Llama);
    check::<18>(CONFIGS[7], Layout::GptNeox);
}

#[test]
fn tensor_names_of_the_new_layouts() {
    assert_eq!(
        Layout::Llama.tensor_names("m."),
        [
            "m.q_proj.weight",
            "m.k_proj.weight",
            "m.v_proj.weight",
            "m.o_proj.weight"
        ]
    );
    assert_eq!(
        Layout::Phi3.tensor_names(""),
        ["qkv_proj.weight", "o_proj.weight"]
    );
    assert_eq!(
        Layout::GptNeox.tensor_names("a"),
        ["a.query_key_value.weight", "a.dense.weight"]
    );
    assert_eq!(Layout::GptNeox.to_string(), "GPT-NeoX attention");
}

/// gpt-oss's `sinks` (one logit per head) and Gemma 3's `(1 + w)` QK-norm weights, read from
/// the Hugging Face fixtures; sinks the config does not have, or of the wrong count, are errors.
#[test]
fn sinks_and_gemma_norm_offset() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf");
    let read = |case: &str| {
        let json = std::fs::read_to_string(dir.join(case).join("config.json")).unwrap();
        let bytes = std::fs::read(dir.join(case).join("model.safetensors")).unwrap();
        (json, bytes)
    };
    let (json, bytes) = read("gpt_oss_sliding");
    let st = SafeTensors::parse(&bytes).unwrap();
    let mut c = config(&json);
    let p = c.tensor_prefix();
    let (_, stored) = st.tensor_f32(&format!("{p}.sinks")).unwrap();
    let w = LayerWeights::from_safetensors(&st, &p, &c).unwrap();
    assert_eq!(w.sinks.as_deref(), Some(&stored[..]));
    // The same file with one sink too few.
    let sinks = format!("{p}.sinks");
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = st
        .names()
        .map(|name| {
            let (mut shape, mut values) = st.tensor_f32(name).unwrap();
            if name == sinks {
                (shape[0], values) = (5, values[..5].to_vec());
            }
            (name.to_string(), shape, values)
        })
        .collect();
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
        .collect();
    let short = mha::safetensors::serialize(&views, &[]).unwrap();
    let err = LayerWeights::from_safetensors(&SafeTensors::parse(&short).unwrap(), &p, &c);
    assert!(
        matches!(&err, Err(LoadError::Shape { tensor, expected, .. }) if *tensor == sinks && expected == &[6]),
        "{err:?}"
    );
    c.sinks = false;
    assert_eq!(
        LayerWeights::from_safetensors(&st, &p, &c),
        Err(LoadError::UnexpectedTensor {
            file: String::new(),
            tensor: format!("{p}.sinks"),
            reason: "the config gives this layer no attention sinks",
        })
    );

    let (json, bytes) = read("gemma3_local");
    let st = SafeTensors::parse(&bytes).unwrap();
    let c = AttentionConfig::from_json(&json, 1).unwrap();
    let p = c.tensor_prefix();
    let (_, stored) = st.tensor_f32(&format!("{p}.q_norm.weight")).unwrap();
    let norm = LayerWeights::from_safetensors(&st, &p, &c)
        .unwrap()
        .qk_norm
        .unwrap();
    let shifted: Vec<f32> = stored.iter().map(|w| w + 1.0).collect();
    assert_eq!(norm.q_weight, shifted);
}

/// Falcon-H1's multipliers are folded into the weights and biases as they load: `Wq`, `Wv`
/// times the input factor, `Wk` times it and the key factor, `bk` times the key factor, `Wo`
/// and `bo` times the output factor; a 16-bit checkpoint's matrices become `f32` then, each
/// product rounded once. Factors of 1 keep the stored format.
#[test]
fn falcon_h1_multipliers_fold_into_the_weights() {
    let json = r#"{"model_type": "falcon_h1", "hidden_size": 12, "head_dim": 6,
        "num_attention_heads": 3, "num_key_value_heads": 1, "num_hidden_layers": 1,
        "attention_bias": true, "key_multiplier": 0.3, "attention_in_multiplier": 1.7,
        "attention_out_multiplier": 0.6}"#;
    let c = config(json);
    let p = c.tensor_prefix();
    for (j, dtype) in [Dtype::F32, Dtype::F16, Dtype::BF16]
        .into_iter()
        .enumerate()
    {
        let fx = fixture(&c, &p, dtype, 90 + j as u64);
        let got = load(&file(&fx), &p, &c).unwrap();
        let plain = expected(&c, &p, &fx);
        let times = |m: &WeightValues, f: f32| m.to_f32().iter().map(|x| x * f).collect::<Vec<_>>();
        let scale =
            |b: &Option<Vec<f32>>, f: f32| b.as_ref().map(|b| b.iter().map(|x| x * f).collect());
        assert_eq!(
            got.wq,
            WeightValues::F32(times(&plain.wq, 1.7f32)),
            "{dtype}"
        );
        assert_eq!(
            got.wk,
            WeightValues::F32(times(&plain.wk, 1.7f32 * 0.3f32)),
            "{dtype}"
        );
        assert_eq!(
            got.wv,
            WeightValues::F32(times(&plain.wv, 1.7f32)),
            "{dtype}"
        );
        assert_eq!(
            got.wo,
            WeightValues::F32(times(&plain.wo, 0.6f32)),
            "{dtype}"
        );
        let biases = &plain.biases;
        assert_eq!(got.biases.bq, biases.bq, "{dtype}");
        assert_eq!(got.biases.bk, scale(&biases.bk, 0.3), "{dtype}");
        assert_eq!(got.biases.bv, biases.bv, "{dtype}");
        assert_eq!(got.biases.bo, scale(&biases.bo, 0.6), "{dtype}");
    }
    // Without multipliers, nothing is folded and a 16-bit checkpoint stays 16-bit.
    let ones = config(
        &json
            .replace("0.3", "1.0")
            .replace("1.7", "1")
            .replace("0.6", "1.0"),
    );
    assert_eq!(ones.projection_scales, mha::ProjectionScales::default());
    let fx = fixture(&ones, &p, Dtype::BF16, 99);
    let got = load(&file(&fx), &p, &ones).unwrap();
    assert_eq!(got.format(), WeightFormat::Bf16);
    assert_eq!(widened(&got), expected(&ones, &p, &fx));
}
