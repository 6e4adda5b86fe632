//! `config.json` → `AttentionConfig`: each family in the spelling of published checkpoints and
//! in the one current `transformers` (v5) writes, and every error path.

use mha::safetensors::Layout;
use mha::{
    AttentionConfig, ConfigError, ModelType, ProjectionBiases, QkNormConfig, QkNormSpan, Rope,
    RopeLayout, RopeScaling,
};

fn read(json: &str) -> AttentionConfig {
    AttentionConfig::from_json(json, 0).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

fn fail(json: &str, layer: usize) -> ConfigError {
    match AttentionConfig::from_json(json, layer) {
        Ok(c) => panic!("accepted: {c:?}\n{json}"),
        Err(e) => e,
    }
}

/// `json` is refused (layer 0) with the error `config.json: {message}`.
fn assert_fails_with(json: &str, message: &str) {
    assert_eq!(
        fail(json, 0).to_string(),
        format!("config.json: {message}"),
        "{json}"
    );
}

/// `base` (an object) with the members `extra` added at the end.
fn with(base: &str, extra: &str) -> String {
    let end = base.rfind('}').unwrap();
    format!("{}, {extra}}}", &base[..end])
}

fn rope(theta: f64, rotary_dim: usize, scaling: RopeScaling) -> Option<Rope> {
    Some(Rope {
        theta,
        rotary_dim,
        layout: RopeLayout::RotateHalf,
        scaling,
    })
}

const NO_BIAS: ProjectionBiases = ProjectionBiases {
    q: false,
    k: false,
    v: false,
    o: false,
};
const ALL_BIASES: ProjectionBiases = ProjectionBiases {
    q: true,
    k: true,
    v: true,
    o: true,
};

/// Meta-Llama-3.1-8B's config.json (as published, trimmed of unrelated keys).
const LLAMA_3_1: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256
}"#;

/// The same model as transformers v5 writes it.
const LLAMA_3_1_V5: &str = r#"{
  "attention_bias": false, "head_dim": 128, "hidden_size": 4096, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_theta": 500000.0,
                      "rope_type": "llama3"},
  "transformers_version": "5.23.0"
}"#;

#[test]
fn llama_3_1_in_both_spellings() {
    let expected = AttentionConfig::from_json(LLAMA_3_1, 7).unwrap();
    assert_eq!(expected.model_type, ModelType::Llama);
    assert_eq!(expected.layer, 7);
    assert_eq!(
        (
            expected.hidden_size,
            expected.n_heads,
            expected.n_kv_heads,
            expected.head_dim
        ),
        (4096, 32, 8, 128)
    );
    let scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192.0,
    };
    assert_eq!(expected.rope, rope(500000.0, 128, scaling));
    assert_eq!(expected.qk_norm, None);
    assert_eq!(expected.scale, (1.0 / 128f64.sqrt()) as f32);
    assert_eq!(expected.biases, NO_BIAS);
    assert_eq!(expected.layout(), Layout::Llama);
    assert_eq!(expected.max_position_embeddings, 131072);
    assert_eq!(expected.tensor_prefix(), "model.layers.7.self_attn");
    assert_eq!(AttentionConfig::from_json(LLAMA_3_1_V5, 7), Ok(expected));
}

#[test]
fn llama_defaults_and_biases() {
    let tiny = r#"{"model_type": "llama", "hidden_size": 12, "num_attention_heads": 3, "num_hidden_layers": 2}"#;
    let c = read(tiny);
    assert_eq!(
        (c.n_kv_heads, c.head_dim, c.max_position_embeddings),
        (3, 4, 2048)
    );
    assert_eq!(c.rope, rope(10000.0, 4, RopeScaling::Default));
    assert_eq!(
        read(&with(tiny, r#""attention_bias": true"#)).biases,
        ALL_BIASES
    );
    // A null boolean is refused (transformers v5 refuses it, older versions read false);
    // null head counts and widths are computed as transformers does.
    assert_eq!(
        fail(&with(tiny, r#""attention_bias": null"#), 0).to_string(),
        r#"config.json: "attention_bias" must be true or false, found null"#
    );
    assert_eq!(
        read(&with(tiny, r#""num_key_value_heads": null"#)).n_kv_heads,
        3
    );
    assert_eq!(read(&with(tiny, r#""head_dim": null"#)).head_dim, 4);
    // A linear scaling in the older spelling ("type").
    let linear = with(tiny, r#""rope_scaling": {"type": "linear", "factor": 2.0}"#);
    assert_eq!(
        read(&linear).rope.unwrap().scaling,
        RopeScaling::Linear { factor: 2.0 }
    );
    // rope_scaling replaces rope_parameters entirely, as transformers does.
    let both = with(
        &linear,
        r#""rope_parameters": {"rope_type": "default", "rope_theta": 99.0}"#,
    );
    assert_eq!(
        read(&both).rope,
        rope(10000.0, 4, RopeScaling::Linear { factor: 2.0 })
    );
    // An empty rope_scaling does not.
    let empty = with(
        tiny,
        r#""rope_scaling": {}, "rope_parameters": {"rope_theta": 99.0}"#,
    );
    assert_eq!(read(&empty).rope.unwrap().theta, 99.0);
}

/// Mistral-7B-Instruct-v0.3 and v0.1.
const MISTRAL_V0_3: &str = r#"{
  "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
  "sliding_window": null, "vocab_size": 32768
}"#;

#[test]
fn mistral() {
    let c = read(MISTRAL_V0_3);
    assert_eq!(
        (c.model_type, c.n_kv_heads, c.head_dim),
        (ModelType::Mistral, 8, 128)
    );
    assert_eq!(c.rope, rope(1e6, 128, RopeScaling::Default));
    assert_eq!((c.biases, c.layout()), (NO_BIAS, Layout::Llama));
    // transformers v5 spelling.
    let v5 = r#"{"head_dim": 128, "hidden_size": 4096, "max_position_embeddings": 32768,
        "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "sliding_window": null}"#;
    assert_eq!(read(v5), c);
    assert_eq!(c.sliding_window, None);
    // Mistral-7B-v0.1 attends within a 4096-token window, on every layer.
    let v0_1 = MISTRAL_V0_3.replace(r#""sliding_window": null"#, r#""sliding_window": 4096"#);
    let c = AttentionConfig::from_json(&v0_1, 31).unwrap();
    assert_eq!(c.sliding_window, Some(4096));
    let zero = MISTRAL_V0_3.replace(r#""sliding_window": null"#, r#""sliding_window": 0"#);
    assert_eq!(
        fail(&zero, 0).to_string(),
        "config.json: \"sliding_window\" = 0: must be at least 1"
    );
    // Absent keys take MistralConfig's defaults: 8 key/value heads, a 4096 window.
    let bare = r#"{"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 16, "num_hidden_layers": 1}"#;
    assert_eq!(
        (read(bare).n_kv_heads, read(bare).sliding_window),
        (8, Some(4096))
    );
}

/// Qwen2.5-7B-Instruct.
const QWEN2_5: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "hidden_size": 3584,
  "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen2",
  "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
  "tie_word_embeddings": false, "use_sliding_window": false, "vocab_size": 152064
}"#;

#[test]
fn qwen2_biases_yarn_and_sliding_layers() {
    let c = read(QWEN2_5);
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (28, 4, 128));
    let qkv = ProjectionBiases {
        o: false,
        ..ALL_BIASES
    };
    assert_eq!((c.biases, c.qk_norm), (qkv, None));
    // The YaRN block Qwen's model cards suggest adding, in the older spelling.
    let yarn = with(
        QWEN2_5,
        r#""rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}"#,
    );
    let scaling = RopeScaling::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 32768.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 0.1 * 4f64.ln() + 1.0,
        truncate: true,
    };
    let expected = rope(1e6, 128, scaling);
    let got = read(&yarn).rope;
    assert_eq!(got, expected, "{got:?}");
    // As transformers v5 writes it: layer_types, rope_parameters with both type keys.
    let v5 = r#"{"hidden_size": 3584, "layer_types": ["full_attention", "full_attention"],
        "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen2",
        "num_attention_heads": 28, "num_hidden_layers": 2, "num_key_value_heads": 4,
        "rope_parameters": {"factor": 4.0, "original_max_position_embeddings": 32768,
                            "rope_theta": 1000000.0, "rope_type": "yarn", "type": "yarn"},
        "sliding_window": null, "use_sliding_window": false}"#;
    assert_eq!(AttentionConfig::from_json(v5, 1).unwrap().rope, expected);
    // A sliding window on the layers from max_window_layers on.
    let sliding = QWEN2_5
        .replace(
            r#""use_sliding_window": false"#,
            r#""use_sliding_window": true"#,
        )
        .replace(r#""max_window_layers": 28"#, r#""max_window_layers": 2"#);
    assert_eq!(c.sliding_window, None);
    let window = |layer| {
        AttentionConfig::from_json(&sliding, layer)
            .unwrap()
            .sliding_window
    };
    assert_eq!((window(1), window(2)), (None, Some(131072)));
    // Absent num_key_value_heads: Qwen2Config's default, 32.
    let bare = r#"{"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 32, "num_hidden_layers": 1}"#;
    assert_eq!(read(bare).n_kv_heads, 32);
}

/// Qwen3-0.6B: head_dim 128 with 16 heads in a 1024-wide model.
const QWEN3_0_6B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "head_dim": 128, "hidden_size": 1024, "max_position_embeddings": 40960,
  "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16,
  "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "use_sliding_window": false, "vocab_size": 151936
}"#;

#[test]
fn qwen3_head_dim_and_qk_norm() {
    let c = read(QWEN3_0_6B);
    assert_eq!(
        (c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim),
        (1024, 16, 8, 128)
    );
    assert_eq!(
        c.qk_norm,
        Some(QkNormConfig {
            span: QkNormSpan::PerHead,
            eps: 1e-6,
            weight_offset: 0.0,
            learned: true,
            placement: mha::QkNormPlacement::BeforeRope,
        })
    );
    assert_eq!(c.rope, rope(1e6, 128, RopeScaling::Default));
    assert_eq!((c.biases, c.scale), (NO_BIAS, (1.0 / 128f64.sqrt()) as f32));
    let v5 = r#"{"attention_bias": false, "head_dim": 128, "hidden_size": 1024,
        "layer_types": ["full_attention", "full_attention", "full_attention"],
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 3, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
        "sliding_window": null, "use_sliding_window": false}"#;
    let v5c = read(v5);
    assert_eq!(
        (v5c.head_dim, v5c.rope, v5c.qk_norm),
        (128, c.rope, c.qk_norm)
    );
    // Absent head_dim: Qwen3Config's default, 128, not hidden_size / heads.
    let bare = r#"{"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1}"#;
    assert_eq!(read(bare).head_dim, 128);
    assert_eq!(
        read(&with(bare, r#""attention_bias": true"#)).biases,
        ALL_BIASES
    );
}

#[test]
fn nested_rope_parameters_and_layer_types() {
    let nested = r#"{"model_type": "qwen3", "hidden_size": 64, "head_dim": 16,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3,
        "layer_types": ["full_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 3.0, "rope_theta": 77.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}"#;
    let c = AttentionConfig::from_json(nested, 1).unwrap();
    assert_eq!(c.rope, rope(77.0, 16, RopeScaling::Linear { factor: 3.0 }));
    // The sliding layer: its own rope entry, Qwen3Config's default window.
    let c = AttentionConfig::from_json(nested, 2).unwrap();
    assert_eq!(c.rope, rope(10000.0, 16, RopeScaling::Default));
    assert_eq!(c.sliding_window, Some(4096));
    let other = nested.replace(r#", "sliding_attention"]"#, r#", "chunked_attention"]"#);
    assert_eq!(
        fail(&other, 2).to_string(),
        "config.json: \"layer_types[2]\" = \"chunked_attention\" is not supported: chunked attention is read for llama4_text only"
    );
    let short = nested.replace(r#""num_hidden_layers": 3"#, r#""num_hidden_layers": 4"#);
    assert_eq!(
        fail(&short, 3).to_string(),
        "config.json: \"layer_types\" = 3 entries: needs one per layer, num_hidden_layers = 4"
    );
    let bad = nested.replace(r#""sliding_attention"]"#, "7]");
    assert_eq!(
        fail(&bad, 2).to_string(),
        "config.json: \"layer_types[2]\" must be a string, found 7"
    );
    let missing = nested.replace(r#""full_attention": {"#, r#""other": {"#);
    assert_eq!(
        fail(&missing, 0),
        ConfigError::Missing {
            key: "rope_parameters.full_attention".into()
        }
    );
}

/// Phi-3-mini-4k-instruct, with and without its 2047-token sliding window.
const PHI_3_MINI: &str = r#"{
  "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "hidden_size": 3072,
  "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
  "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0, "sliding_window": 2047,
  "vocab_size": 32064
}"#;

#[test]
fn phi3_partial_rotary_and_longrope() {
    assert_eq!(read(PHI_3_MINI).sliding_window, Some(2047));
    let full = PHI_3_MINI.replace("2047", "null");
    let c = read(&full);
    assert_eq!(c.sliding_window, None);
    assert_eq!(
        (c.head_dim, c.biases, c.layout()),
        (96, NO_BIAS, Layout::Phi3)
    );
    assert_eq!(c.rope, rope(10000.0, 96, RopeScaling::Default));
    // Phi-4-mini: partial_rotary_factor 0.75 of 128-wide heads, 8 key/value heads.
    let phi4 = r#"{"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 24,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "partial_rotary_factor": 0.75,
        "rope_theta": 10000.0, "sliding_window": null}"#;
    let c = read(phi4);
    assert_eq!((c.head_dim, c.n_kv_heads), (128, 8));
    assert_eq!(c.rope, rope(10000.0, 96, RopeScaling::Default));
    let v5 = r#"{"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 24,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "partial_rotary_factor": 0.75,
        "rope_parameters": {"partial_rotary_factor": 0.75, "rope_theta": 10000.0, "rope_type": "default"},
        "sliding_window": null}"#;
    assert_eq!(read(v5), c);
    // Phi-3-mini-128k: longrope (also written "su", or "yarn" which Phi3Config reads as longrope).
    for t in ["longrope", "su", "yarn"] {
        let long = with(
            &full.replace(r#""rope_scaling": null, "#, ""),
            &format!(
                r#""rope_scaling": {{"type": "{t}", "long_factor": [1.0], "short_factor": [1.0]}}"#
            ),
        );
        assert_eq!(
            fail(&long, 0).to_string(),
            format!("config.json: \"rope_scaling.type\" = \"{t}\" is not supported: Phi-3 reads it as longrope, which is not implemented")
        );
    }
}

/// microsoft/phi-2's config.json (as published, trimmed of unrelated keys).
const PHI_2: &str = r#"{
  "architectures": ["PhiForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 50256,
  "embd_pdrop": 0.0, "eos_token_id": 50256, "hidden_act": "gelu_new", "hidden_size": 2560,
  "initializer_range": 0.02, "intermediate_size": 10240, "layer_norm_eps": 1e-05,
  "max_position_embeddings": 2048, "model_type": "phi", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4,
  "qk_layernorm": false, "resid_pdrop": 0.1, "rope_scaling": null, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.37.0",
  "use_cache": true, "vocab_size": 51200
}"#;

#[test]
fn phi_2_partial_rotary_and_biases() {
    let c = read(PHI_2);
    assert_eq!(c.model_type, ModelType::Phi);
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (32, 32, 80));
    // int(80 · 0.4) = 32 features of each head rotate.
    assert_eq!(c.rope, rope(10000.0, 32, RopeScaling::Default));
    assert_eq!((c.biases, c.layout()), (ALL_BIASES, Layout::Phi));
    assert_eq!(
        (c.sliding_window, c.qk_norm, c.max_position_embeddings),
        (None, None, 2048)
    );
    assert_eq!(c.tensor_prefix(), "model.layers.0.self_attn");
    // PhiConfig's default rotates half of each head.
    let c = read(&PHI_2.replace(r#""partial_rotary_factor": 0.4,"#, ""));
    assert_eq!(c.rope, rope(10000.0, 40, RopeScaling::Default));
    assert_fails_with(
        &PHI_2.replace(r#""qk_layernorm": false"#, r#""qk_layernorm": true"#),
        r#""qk_layernorm" = true is not supported: Phi's LayerNorm of the queries and keys (with a bias) is not implemented"#,
    );
}

/// Pythia-160m.
const PYTHIA_160M: &str = r#"{
  "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
  "hidden_act": "gelu", "hidden_size": 768, "initializer_range": 0.02,
  "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
  "model_type": "gpt_neox", "num_attention_heads": 12, "num_hidden_layers": 12,
  "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": false,
  "use_parallel_residual": true, "vocab_size": 50304
}"#;

#[test]
fn gpt_neox_rotary_pct() {
    let c = read(PYTHIA_160M);
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (12, 12, 64));
    assert_eq!(c.rope, rope(10000.0, 16, RopeScaling::Default));
    assert_eq!((c.biases, c.layout()), (ALL_BIASES, Layout::GptNeox));
    assert_eq!(c.tensor_prefix(), "gpt_neox.layers.0.attention");
    let v5 = r#"{"attention_bias": true, "hidden_size": 768, "max_position_embeddings": 2048,
        "model_type": "gpt_neox", "num_attention_heads": 12, "num_hidden_layers": 12,
        "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000, "rope_type": "default"}}"#;
    assert_eq!(read(v5), c);
    // GPTNeoXConfig's own keys win over the generic ones, and its default is a quarter.
    let generic = with(
        PYTHIA_160M,
        r#""rope_theta": 5.0, "partial_rotary_factor": 1.0"#,
    );
    assert_eq!(read(&generic).rope, c.rope);
    let bare = r#"{"model_type": "gpt_neox", "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 1}"#;
    assert_eq!(read(bare).rope, c.rope);
    assert_eq!(
        read(&with(bare, r#""attention_bias": false"#)).biases,
        NO_BIAS
    );
}

/// OLMo-2-1124-7B.
const OLMO_2: &str = r#"{
  "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "hidden_size": 4096, "max_position_embeddings": 4096, "model_type": "olmo2",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 500000, "vocab_size": 100352
}"#;

#[test]
fn olmo2_whole_qk_norm() {
    let c = read(OLMO_2);
    assert_eq!(
        c.qk_norm,
        Some(QkNormConfig {
            span: QkNormSpan::Whole,
            eps: 1e-6,
            weight_offset: 0.0,
            learned: true,
            placement: mha::QkNormPlacement::BeforeRope,
        })
    );
    assert_eq!(c.rope, rope(500000.0, 128, RopeScaling::Default));
    let v5 = r#"{"attention_bias": false, "hidden_size": 4096, "max_position_embeddings": 4096,
        "model_type": "olmo2", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 32, "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 500000, "rope_type": "default"}}"#;
    assert_eq!(read(v5), c);
    let bare = r#"{"model_type": "olmo2", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1}"#;
    assert_eq!(read(bare).qk_norm.unwrap().eps, 1e-5);
}

const TINY: &str = r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}"#;

#[test]
fn yarn_defaults() {
    let yarn = |block: &str| {
        let json = with(
            TINY,
            &format!(
                r#""max_position_embeddings": 8192, "rope_scaling": {{"rope_type": "yarn", {block}}}"#
            ),
        );
        match read(&json).rope.unwrap().scaling {
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => (
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            ),
            other => panic!("{other:?}"),
        }
    };
    let mscale = |scale: f64, m: f64| 0.1 * m * scale.ln() + 1.0;
    // original_max_position_embeddings defaults to max_position_embeddings.
    assert_eq!(
        yarn(r#""factor": 2.0"#),
        (2.0, 8192.0, 32.0, 1.0, mscale(2.0, 1.0), true)
    );
    // A null factor is max_position_embeddings / original_max_position_embeddings.
    assert_eq!(
        yarn(r#""factor": null, "original_max_position_embeddings": 2048"#).0,
        4.0
    );
    // mscale / mscale_all_dim (both non-zero) set the attention factor.
    let got = yarn(
        r#""factor": 40, "mscale": 0.707, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096"#,
    );
    assert_eq!(got.4, mscale(40.0, 0.707) / mscale(40.0, 1.0));
    let got = yarn(r#""factor": 40, "mscale": 0, "mscale_all_dim": 1.0"#);
    assert_eq!(got.4, mscale(40.0, 1.0));
    // An explicit attention factor, zero betas (Python's `or` makes them 32 and 1), truncate.
    let got = yarn(
        r#""factor": 4, "attention_factor": 0.5, "beta_fast": 0, "beta_slow": 2, "truncate": false"#,
    );
    assert_eq!(got, (4.0, 8192.0, 32.0, 2.0, 0.5, false));
    // A factor at most 1 gives attention factor 1.
    assert_eq!(yarn(r#""factor": 1"#).4, 1.0);
}

#[test]
fn syntax_errors_name_the_byte() {
    assert_eq!(
        fail(r#"{"model_type": "llama",}"#, 0),
        ConfigError::Json {
            position: 23,
            reason: "expected a string key"
        }
    );
    assert_eq!(
        fail("", 0).to_string(),
        "config.json: bad JSON at byte 0: unexpected end of JSON, expected a value"
    );
    let deep = "[".repeat(65) + &"]".repeat(65);
    assert!(matches!(
        fail(&deep, 0),
        ConfigError::Json { position: 64, .. }
    ));
    assert_eq!(
        fail("[]", 0).to_string(),
        "config.json must be a JSON object, found an array"
    );
}

#[test]
fn missing_and_mistyped_keys() {
    let cases: [(&str, &str); 12] = [
        (r#"{"hidden_size": 8}"#, r#""model_type" is missing"#),
        (r#"{"model_type": null}"#, r#""model_type" is missing"#),
        (
            r#"{"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 2}"#,
            r#""hidden_size" is missing"#,
        ),
        (
            r#"{"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 8}"#,
            r#""num_attention_heads" is missing"#,
        ),
        (
            r#"{"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2}"#,
            r#""num_hidden_layers" is missing"#,
        ),
        (
            r#"{"model_type": 3}"#,
            r#""model_type" must be a string, found 3"#,
        ),
        (
            r#"{"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": "8"}"#,
            r#""hidden_size" must be a non-negative integer, found "8""#,
        ),
        (
            r#"{"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 8.0}"#,
            r#""hidden_size" must be a non-negative integer, found 8.0"#,
        ),
        (
            r#"{"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": -2, "hidden_size": 8}"#,
            r#""num_attention_heads" must be a non-negative integer, found -2"#,
        ),
        (
            r#"{"model_type": "llama", "num_hidden_layers": 99999999999999999999999, "hidden_size": 8}"#,
            r#""num_hidden_layers" = 99999999999999999999999: is more than the largest size, 18446744073709551615"#,
        ),
        (
            r#"{"model_type": "llama", "model_type": "llama"}"#,
            r#""model_type" appears twice"#,
        ),
        (
            r#"{"model_type": "gemma"}"#,
            r#""model_type" = "gemma" is not supported; supported: llama, mistral, qwen2, qwen3, phi3, phi, gpt_neox, olmo2, gemma2, gemma3_text, bloom, gpt_oss, glm4_moe, smollm3, olmo3, seed_oss, ernie4_5, apertus, exaone4, cohere2, qwen3_next, qwen3_5_text, qwen3_5_moe_text, ministral3, llama4_text, gemma4_text, minimax_m2, hunyuan_v1_dense, lfm2, nemotron_h, granite_swa, granitemoehybrid, falcon_h1, laguna, mimo_v2_flash, gemma3n_text, step3p5 (and in text_config: qwen3_5, qwen3_5_moe, mistral3, llama4, gemma4, gemma3n, step3p7)"#,
        ),
    ];
    for (json, message) in cases {
        assert_fails_with(json, message);
    }
    let typed: [(&str, &str); 8] = [
        (
            r#""rope_theta": "big""#,
            r#""rope_theta" must be a number, found "big""#,
        ),
        (
            r#""rope_theta": 1e400"#,
            r#""rope_theta" = 1e400: is beyond the range of a 64-bit float"#,
        ),
        (
            r#""attention_bias": 1"#,
            r#""attention_bias" must be true or false, found 1"#,
        ),
        (
            r#""layer_types": "full_attention""#,
            r#""layer_types" must be an array, found "full_attention""#,
        ),
        (
            r#""rope_scaling": "linear""#,
            r#""rope_scaling" must be an object, found "linear""#,
        ),
        (
            r#""rope_scaling": {"rope_type": 1}"#,
            r#""rope_scaling.rope_type" must be a string, found 1"#,
        ),
        (
            r#""rope_scaling": {"rope_type": "linear"}"#,
            r#""rope_scaling.factor" is missing"#,
        ),
        (
            r#""rope_parameters": {"rope_theta": 1, "rope_theta": 2}"#,
            r#""rope_parameters.rope_theta" appears twice"#,
        ),
    ];
    for (extra, message) in typed {
        assert_fails_with(&with(TINY, extra), message);
    }
}

#[test]
fn unsupported_and_invalid_settings() {
    let cases: [(&str, &str); 13] = [
        (
            r#""rope_scaling": {"rope_type": "dynamic", "factor": 2.0}"#,
            r#""rope_scaling.rope_type" = "dynamic" is not supported: the rope types implemented are default, linear, llama3 and yarn"#,
        ),
        (
            r#""rope_parameters": {"rope_type": "longrope", "factor": 2.0}"#,
            r#""rope_parameters.rope_type" = "longrope" is not supported: the rope types implemented are default, linear, llama3 and yarn"#,
        ),
        (
            r#""partial_rotary_factor": 0.5"#,
            r#""partial_rotary_factor" = 0.5 is not supported: this family's attention rotates whole heads (only phi3, phi, gpt_neox, glm4_moe, minimax_m2, laguna, mimo_v2_flash, step3p5 and the qwen3_next / qwen3_5 families rotate part of a head)"#,
        ),
        (
            r#""num_key_value_heads": 3"#,
            r#""num_key_value_heads" = 3: must divide num_attention_heads = 4"#,
        ),
        (
            r#""num_key_value_heads": 0"#,
            r#""num_key_value_heads" = 0: must be at least 1"#,
        ),
        (r#""head_dim": 0"#, r#""head_dim" = 0: must be at least 1"#),
        (
            r#""head_dim": 9223372036854775807"#,
            r#""head_dim" = 9223372036854775807: with num_attention_heads = 4, num_key_value_heads = 4 and hidden_size = 64, the projection widths overflow"#,
        ),
        (
            r#""rope_theta": 0"#,
            r#""rope_theta" = 0: must be positive"#,
        ),
        (
            r#""rope_scaling": {"rope_type": "linear", "factor": 0}"#,
            r#""rope_scaling.factor" = 0: must be positive"#,
        ),
        (
            r#""rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 4}"#,
            r#""rope_scaling.high_freq_factor" = 4: must be greater than low_freq_factor = 4"#,
        ),
        (
            r#""rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1}"#,
            r#""rope_scaling.high_freq_factor" is missing"#,
        ),
        (
            r#""rope_scaling": {"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": -1}"#,
            r#""rope_scaling.original_max_position_embeddings" = -1: must be at least 1"#,
        ),
        (
            r#""rope_scaling": {"rope_type": "yarn", "factor": 2, "attention_factor": 0}"#,
            r#""rope_scaling.attention_factor" = 0: must be positive"#,
        ),
    ];
    for (extra, message) in cases {
        assert_fails_with(&with(TINY, extra), message);
    }
    let others: [(&str, &str); 7] = [
        (
            r#"{"model_type": "llama", "hidden_size": 10, "num_attention_heads": 4, "num_hidden_layers": 1}"#,
            r#""num_attention_heads" = 4: must divide hidden_size = 10 when head_dim is absent"#,
        ),
        (
            r#"{"model_type": "llama", "hidden_size": 0, "num_attention_heads": 4, "num_hidden_layers": 1}"#,
            r#""hidden_size" = 0: must be at least 1"#,
        ),
        (
            r#"{"model_type": "llama", "hidden_size": 8, "num_attention_heads": 0, "num_hidden_layers": 1, "head_dim": 2}"#,
            r#""num_attention_heads" = 0: must be at least 1"#,
        ),
        (
            r#"{"model_type": "llama", "hidden_size": 10, "num_attention_heads": 2, "num_hidden_layers": 1}"#,
            r#""head_dim" = 5: (head_dim absent: hidden_size / num_attention_heads) is odd, but the rotary embedding turns the features of a head in pairs"#,
        ),
        (
            r#"{"model_type": "gpt_neox", "hidden_size": 8, "num_attention_heads": 1, "num_hidden_layers": 1, "rotary_pct": 1.5}"#,
            r#""rotary_pct" = 1.5: must be between 0 and 1"#,
        ),
        (
            r#"{"model_type": "gpt_neox", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "head_dim": 2}"#,
            r#""head_dim" = 2: gpt_neox needs num_attention_heads 2 = num_key_value_heads 2 and num_attention_heads x head_dim = hidden_size 8"#,
        ),
        (
            r#"{"model_type": "qwen3", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "rms_norm_eps": -1}"#,
            r#""rms_norm_eps" = -1: must not be negative"#,
        ),
    ];
    for (json, message) in others {
        assert_fails_with(json, message);
    }
}

#[test]
fn layers_out_of_range() {
    assert_eq!(
        fail(TINY, 2),
        ConfigError::LayerOutOfRange {
            layer: 2,
            layers: 2,
            key: "num_hidden_layers"
        }
    );
    assert_eq!(
        fail(TINY, usize::MAX).to_string(),
        format!(
            "config.json: layer {} is out of range: \"num_hidden_layers\" = 2",
            usize::MAX
        )
    );
}

#[test]
fn partial_rotary_zero_and_one() {
    let neox = |pct: &str| {
        let json = format!(
            r#"{{"model_type": "gpt_neox", "hidden_size": 12, "num_attention_heads": 2, "num_hidden_layers": 1, "rotary_pct": {pct}}}"#
        );
        read(&json).rope.unwrap().rotary_dim
    };
    assert_eq!(
        (neox("0"), neox("1"), neox("1.0"), neox("0.34")),
        (0, 6, 6, 2)
    );
    // An odd int(head_dim · pct) rotates one more feature, as transformers' cos table does.
    assert_eq!((neox("0.2"), neox("0.5")), (2, 4));
}

#[test]
fn model_types_round_trip() {
    for m in ModelType::ALL {
        assert_eq!(ModelType::from_name(m.name()), Some(m));
        assert_eq!(m.to_string(), m.name());
        assert!(ModelType::NAMES.contains(m.name()));
    }
}

#[cfg(feature = "std")]
#[test]
fn files() {
    let dir = std::env::temp_dir().join(format!("mha-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    std::fs::write(&path, QWEN3_0_6B).unwrap();
    assert_eq!(AttentionConfig::from_file(&path, 0), Ok(read(QWEN3_0_6B)));
    std::fs::remove_dir_all(&dir).unwrap();
    let err = AttentionConfig::from_file(dir.join("config.json"), 0).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Io { path, .. } if path.ends_with("config.json")),
        "{err}"
    );
    // A file longer than MAX_CONFIG_LEN is not read (a sparse one here, of zeros).
    std::fs::create_dir_all(&dir).unwrap();
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(mha::MAX_CONFIG_LEN as u64 + 1).unwrap();
    let err = AttentionConfig::from_file(&path, 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: 16000001 bytes, more than the 16000000 a config.json may have",
            path.display()
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Gemma 2 (as `transformers` writes a 2-layer config): sliding windows on the even layers,
/// the soft cap and `query_pre_attn_scalar`, and their defaults and bad values.
#[test]
fn gemma2_windows_softcap_and_scale() {
    let gemma2 = r#"{"model_type": "gemma2", "hidden_size": 42, "head_dim": 10,
        "num_attention_heads": 6, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "attn_logit_softcapping": 1.0, "query_pre_attn_scalar": 16, "rope_theta": 500.0,
        "sliding_window": 4, "use_bidirectional_attention": null}"#;
    let local = AttentionConfig::from_json(gemma2, 0).unwrap();
    assert_eq!((local.sliding_window, local.softcap), (Some(4), Some(1.0)));
    assert_eq!((local.scale, local.layout()), (0.25, Layout::Llama));
    assert_eq!(
        (local.biases, local.alibi, local.sinks),
        (NO_BIAS, false, false)
    );
    let global = AttentionConfig::from_json(gemma2, 1).unwrap();
    assert_eq!(global.sliding_window, None);
    // Gemma2Config's defaults: cap 50, scalar 256, window 4096; null is no cap.
    let bare = r#"{"model_type": "gemma2", "hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 1}"#;
    let c = read(bare);
    assert_eq!((c.softcap, c.scale), (Some(50.0), 1.0 / 16.0));
    assert_eq!(
        (c.sliding_window, c.n_heads, c.n_kv_heads, c.head_dim),
        (Some(4096), 8, 4, 256)
    );
    assert_eq!(
        read(&with(bare, r#""attn_logit_softcapping": null"#)).softcap,
        None
    );
    for (extra, message) in [
        (
            r#""attn_logit_softcapping": 0"#,
            r#""attn_logit_softcapping" = 0: must be positive"#,
        ),
        (
            r#""attn_logit_softcapping": 1e300"#,
            r#""attn_logit_softcapping" = 1e300: gives the soft cap inf in f32, which must be finite and > 0"#,
        ),
        (
            r#""query_pre_attn_scalar": -4"#,
            r#""query_pre_attn_scalar" = -4: must be positive"#,
        ),
        (
            r#""sliding_window": 0"#,
            r#""sliding_window" = 0: must be at least 1"#,
        ),
    ] {
        assert_fails_with(&with(bare, extra), message);
    }
}

/// Gemma 3 text: `sliding_window_pattern` (default 6), the local rotary base on sliding layers
/// and `rope_theta` with its scaling on global ones, in both spellings; `(1 + w)` QK-norm.
#[test]
fn gemma3_pattern_local_rope_and_qk_norm() {
    let gemma3 = r#"{"model_type": "gemma3_text", "hidden_size": 30, "head_dim": 14,
        "num_attention_heads": 3, "num_key_value_heads": 1, "num_hidden_layers": 3,
        "query_pre_attn_scalar": 10, "rope_local_base_freq": 100.0, "rope_theta": 10000.0,
        "rope_scaling": {"factor": 2.0, "rope_type": "linear"}, "sliding_window": 5,
        "sliding_window_pattern": 3, "attn_logit_softcapping": null}"#;
    let layer = |json: &str, i| AttentionConfig::from_json(json, i).unwrap();
    let local = layer(gemma3, 1);
    assert_eq!((local.sliding_window, local.softcap), (Some(5), None));
    assert_eq!(local.rope, rope(100.0, 14, RopeScaling::Default));
    let norm = QkNormConfig {
        span: QkNormSpan::PerHead,
        eps: 1e-6,
        weight_offset: 1.0,
        learned: true,
        placement: mha::QkNormPlacement::BeforeRope,
    };
    assert_eq!(local.qk_norm, Some(norm));
    let global = layer(gemma3, 2);
    assert_eq!(global.sliding_window, None);
    assert_eq!(
        global.rope,
        rope(1e4, 14, RopeScaling::Linear { factor: 2.0 })
    );
    // transformers v5: layer_types and rope_parameters nested by layer type.
    let v5 = r#"{"model_type": "gemma3_text", "hidden_size": 30, "head_dim": 14,
        "num_attention_heads": 3, "num_key_value_heads": 1, "num_hidden_layers": 3,
        "query_pre_attn_scalar": 10, "sliding_window": 5,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"factor": 2.0, "rope_type": "linear", "rope_theta": 10000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}}"#;
    assert_eq!(
        (layer(v5, 1).rope, layer(v5, 2).rope),
        (local.rope, global.rope)
    );
    // Defaults: a pattern of 6, bases 10,000 (local) and 1,000,000 (global).
    let bare = r#"{"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 6}"#;
    assert_eq!(layer(bare, 4).rope, rope(1e4, 256, RopeScaling::Default));
    assert_eq!(layer(bare, 5).rope, rope(1e6, 256, RopeScaling::Default));
    assert_eq!(layer(bare, 5).sliding_window, None);
    assert_eq!(
        fail(&with(bare, r#""sliding_window_pattern": 0"#), 0).to_string(),
        r#"config.json: "sliding_window_pattern" = 0: must be at least 1"#
    );
    assert_eq!(
        fail(&with(bare, r#""use_bidirectional_attention": true"#), 0).to_string(),
        r#"config.json: "use_bidirectional_attention" = true is not supported: only causal attention is implemented for config.json layers"#
    );
}

/// BLOOM: `n_head` and `n_layer`, ALiBi instead of a rotary embedding, biases everywhere, the
/// fused per-head layout under `transformer.h.{i}.self_attention`.
#[test]
fn bloom_alibi() {
    let bloom = r#"{"model_type": "bloom", "hidden_size": 42, "n_head": 6, "n_layer": 2,
        "layer_norm_epsilon": 1e-05, "pretraining_tp": 1, "slow_but_exact": false}"#;
    let c = AttentionConfig::from_json(bloom, 1).unwrap();
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (6, 6, 7));
    assert_eq!((c.rope, c.alibi, c.biases), (None, true, ALL_BIASES));
    assert_eq!((c.sliding_window, c.layout()), (None, Layout::GptNeox));
    assert_eq!(c.tensor_prefix(), "transformer.h.1.self_attention");
    assert_eq!(
        fail(bloom, 2),
        ConfigError::LayerOutOfRange {
            layer: 2,
            layers: 2,
            key: "n_layer"
        }
    );
    assert_eq!(
        fail(bloom, 2).to_string(),
        r#"config.json: layer 2 is out of range: "n_layer" = 2"#
    );
    let no_heads = bloom.replace(r#""n_head": 6, "#, "");
    assert_eq!(
        fail(&no_heads, 0).to_string(),
        r#"config.json: "n_head" is missing"#
    );
}

/// gpt-oss: sinks, biases, YaRN, and windows on the layers `layer_types` (or, without it, the
/// even layers) slide, 128 tokens when `sliding_window` is absent.
#[test]
fn gpt_oss_sinks_and_layer_types() {
    let gpt_oss = r#"{"model_type": "gpt_oss", "hidden_size": 36, "head_dim": 10,
        "num_attention_heads": 6, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"], "rope_theta": 500.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 16, "truncate": false},
        "sliding_window": 4, "max_position_embeddings": 64}"#;
    let sliding = AttentionConfig::from_json(gpt_oss, 0).unwrap();
    assert_eq!((sliding.sinks, sliding.biases), (true, ALL_BIASES));
    assert_eq!(sliding.sliding_window, Some(4));
    assert!(matches!(
        sliding.rope.unwrap().scaling,
        RopeScaling::Yarn {
            factor: 4.0,
            truncate: false,
            ..
        }
    ));
    assert_eq!(
        AttentionConfig::from_json(gpt_oss, 1)
            .unwrap()
            .sliding_window,
        None
    );
    let bare = r#"{"model_type": "gpt_oss", "hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 2,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}}"#;
    let window = |i| AttentionConfig::from_json(bare, i).unwrap().sliding_window;
    assert_eq!((window(0), window(1)), (Some(128), None));
    assert_eq!(read(bare).rope.unwrap().theta, 150_000.0);
    let no_rope = r#"{"model_type": "gpt_oss", "hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 2}"#;
    assert_eq!(
        fail(no_rope, 0),
        ConfigError::Missing {
            key: "rope_parameters (or rope_scaling)".to_string()
        }
    );
}

/// Every number a config yields is checked as the layer takes it: after its conversion to
/// `f32` (scale, soft cap, eps), after its derivation (YaRN's factor and attention factor) and
/// against the RoPE angles over the model's context; each error names the key and its value as
/// written (each of these once loaded, then failed to build or built a layer computing NaN).
#[test]
fn numbers_are_checked_as_the_layer_takes_them() {
    let yarn = |block: &str| {
        with(
            TINY,
            &format!(r#""rope_scaling": {{"rope_type": "yarn", {block}}}"#),
        )
    };
    let gemma2 = r#"{"model_type": "gemma2", "hidden_size": 8, "head_dim": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1}"#;
    let qwen3 = r#"{"model_type": "qwen3", "hidden_size": 8, "head_dim": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1}"#;
    let cases: [(String, &str); 12] = [
        (
            // The factor, absent, is max_position_embeddings / original: 0 / 0.
            with(TINY, r#""max_position_embeddings": 0, "rope_scaling": {"rope_type": "yarn"}"#),
            r#""max_position_embeddings" = 0: must be at least 1"#,
        ),
        (
            yarn(r#""original_max_position_embeddings": 0.5"#),
            r#""rope_scaling.original_max_position_embeddings" = 0.5: must be at least 1"#,
        ),
        (
            yarn(r#""factor": 4, "beta_fast": -1"#),
            r#""rope_scaling.beta_fast" = -1: must be positive"#,
        ),
        (
            yarn(r#""factor": 4, "beta_slow": -1e-300"#),
            r#""rope_scaling.beta_slow" = -1e-300: must be positive"#,
        ),
        (
            yarn(r#""factor": 40, "mscale": -1, "mscale_all_dim": 1"#),
            r#""rope_scaling.mscale" = -1: must not be negative"#,
        ),
        (
            yarn(r#""factor": 4, "mscale": 1e300, "mscale_all_dim": 1"#),
            r#""rope_scaling.mscale" = 1e300: gives the attention factor 1.2175114371305807e299 (with mscale_all_dim = 1), inf in f32, which must be finite and > 0"#,
        ),
        (
            yarn(r#""factor": 4, "attention_factor": 1e39"#),
            r#""rope_scaling.attention_factor" = 1e39: gives the attention factor 1e39, inf in f32, which must be finite and > 0"#,
        ),
        (
            with(gemma2, r#""query_pre_attn_scalar": 1e-300"#),
            r#""query_pre_attn_scalar" = 1e-300: gives the softmax scale inf in f32, which must be finite and > 0"#,
        ),
        (
            with(gemma2, r#""query_pre_attn_scalar": 1e300"#),
            r#""query_pre_attn_scalar" = 1e300: gives the softmax scale 0.0 in f32, which must be finite and > 0"#,
        ),
        (
            with(gemma2, r#""attn_logit_softcapping": 1e-50"#),
            r#""attn_logit_softcapping" = 1e-50: gives the soft cap 0.0 in f32, which must be finite and > 0"#,
        ),
        (
            with(qwen3, r#""rms_norm_eps": 1e300"#),
            r#""rms_norm_eps" = 1e300: gives the QK-norm eps inf in f32, which must be finite and >= 0"#,
        ),
        (
            // Without head_dim, 0 heads must not be asked to divide hidden_size.
            r#"{"model_type": "llama", "hidden_size": 8, "num_attention_heads": 0, "num_hidden_layers": 1}"#.to_string(),
            r#""num_attention_heads" = 0: must be at least 1"#,
        ),
    ];
    for (json, message) in &cases {
        assert_fails_with(json, message);
    }
    // In range after conversion: an eps that rounds to 0 in f32 (0 is an eps the layer takes,
    // and `x / sqrt(mean + 1e-300)` is `x / sqrt(mean)` in f32 but for all-zero spans, which
    // stay zeros either way); a subnormal soft cap.
    assert_eq!(
        read(&with(qwen3, r#""rms_norm_eps": 1e-300"#))
            .qk_norm
            .unwrap()
            .eps,
        0.0
    );
    assert_eq!(
        read(&with(gemma2, r#""attn_logit_softcapping": 1e-40"#)).softcap,
        Some(1e-40)
    );
}

/// Size keys by their names, BLOOM's included, and sizes no layer can have.
#[test]
fn sizes_are_refused_naming_their_keys() {
    // BLOOM's keys by their names.
    let bloom = r#"{"model_type": "bloom", "hidden_size": 8, "n_layer": 2}"#;
    let bloom_cases = [
        (r#""n_head": 0"#, r#""n_head" = 0: must be at least 1"#),
        (
            r#""n_head": 2, "head_dim": 4611686018427387904"#,
            r#""head_dim" = 4611686018427387904: with n_head = 2, num_key_value_heads = 2 and hidden_size = 8, the projection widths overflow"#,
        ),
    ];
    for (extra, message) in bloom_cases {
        assert_fails_with(&with(bloom, extra), message);
    }
    let short_types = with(bloom, r#""n_head": 2, "layer_types": ["full_attention"]"#);
    assert_eq!(
        fail(&short_types, 1).to_string(),
        r#"config.json: "layer_types" = 1 entries: needs one per layer, n_layer = 2"#
    );
    // Rotary embeddings up to 2^17 features are read (their 2^16 frequencies computed), wider
    // ones are refused rather than computed.
    let wide = |head_dim: usize| {
        format!(
            r#"{{"model_type": "llama", "hidden_size": 8, "head_dim": {head_dim}, "num_attention_heads": 1, "num_hidden_layers": 1}}"#
        )
    };
    assert_eq!(read(&wide(1 << 17)).rope.unwrap().rotary_dim, 1 << 17);
    assert_fails_with(
        &wide(1 << 18),
        r#""head_dim" = 262144 is not supported: rotary embeddings of more than 2^17 features are not read from config.json"#,
    );
    // Weights that no address space holds.
    assert_fails_with(
        r#"{"model_type": "llama", "hidden_size": 1152921504606846976, "head_dim": 16, "num_attention_heads": 4, "num_hidden_layers": 1}"#,
        r#""hidden_size" = 1152921504606846976: with num_attention_heads = 4, num_key_value_heads = 4 and head_dim = 16, the weights pass isize::MAX bytes"#,
    );
}

/// The rotary frequencies over the model's context: the angles of every position up to
/// `max_position_embeddings`, as the builder checks them (these once loaded, then failed to
/// build).
#[test]
fn rotary_frequencies_are_checked_over_the_context() {
    // Frequencies above 1 turn position 1 past sin_cos's range: a linear factor of 1e-300
    // (fastest frequency 1e300), a base of 1e-300 (pair 7 of 8: 1e-300^(-14/16) = 10^262.5).
    let too_fast = [
        (
            r#""rope_scaling": {"rope_type": "linear", "factor": 1e-300}"#,
            "rope_scaling.factor",
            1e300,
        ),
        (r#""rope_theta": 1e-300"#, "rope_theta", 10f64.powf(262.5)),
    ];
    for (extra, key, fastest) in too_fast {
        let text = fail(&with(TINY, extra), 0).to_string();
        let head = format!(r#"config.json: "{key}" = 1e-300: the fastest rotary frequency, "#);
        let tail = " radians per position, turns positions from 1 on (below max_position_embeddings = 2048) past the angles sin_cos reduces exactly";
        let number = text.strip_prefix(&head).and_then(|t| t.strip_suffix(tail));
        let got: f64 = number.unwrap_or_else(|| panic!("{text}")).parse().unwrap();
        assert!((got / fastest - 1.0).abs() < 1e-12, "{text}");
    }
    // Every frequency is at most 1: the context alone passes what sin_cos reduces exactly.
    let first = mha::kernels::trig::MAX_ANGLE.floor() as usize + 1;
    assert_fails_with(
        &with(TINY, r#""max_position_embeddings": 4000000000"#),
        &format!(
            r#""max_position_embeddings" = 4000000000: the fastest rotary frequency, 1.0 radians per position, turns positions from {first} on (below max_position_embeddings = 4000000000) past the angles sin_cos reduces exactly"#
        ),
    );
}

/// Ministral 3's query scale comes from its rope dictionary; without `llama_4_scaling_beta` the
/// error names the key. Llama 4's layers: chunked, weight-less QK-norm after RoPE on the rotary
/// ones; the temperature tuning on the others.
#[test]
fn ministral3_and_llama4_settings() {
    let ministral = r#"{"model_type": "ministral3", "hidden_size": 16, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 8, "num_hidden_layers": 1,
        "rope_parameters": {"rope_type": "yarn", "factor": 16.0, "rope_theta": 1000000.0,
        "original_max_position_embeddings": 16384, "llama_4_scaling_beta": 0.1}}"#;
    let config = mha::AttentionConfig::from_json(ministral, 0).unwrap();
    let scale = config.query_scale.unwrap();
    assert_eq!((scale.beta, scale.period, scale.offset), (0.1, 16384.0, 0));
    assert_eq!(scale.from, mha::ScalePosition::Position);
    let without = ministral.replace(", \"llama_4_scaling_beta\": 0.1", "");
    let err = mha::AttentionConfig::from_json(&without, 0).unwrap_err();
    assert!(err.to_string().contains("llama_4_scaling_beta"), "{err}");

    let llama4 = r#"{"model_type": "llama4", "text_config": {"model_type": "llama4_text",
        "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
        "num_hidden_layers": 4, "attention_chunk_size": 8192, "floor_scale": 8192,
        "attn_scale": 0.1, "rope_theta": 500000.0}}"#;
    let rotary = mha::AttentionConfig::from_json(llama4, 0).unwrap();
    assert_eq!(
        rotary.tensor_prefix(),
        "language_model.model.layers.0.self_attn"
    );
    assert_eq!(rotary.attention_chunk_size, Some(8192));
    assert_eq!(rotary.rope.unwrap().layout, mha::RopeLayout::Interleaved);
    let norm = rotary.qk_norm.unwrap();
    assert!(!norm.learned);
    assert_eq!(norm.placement, mha::QkNormPlacement::AfterRope);
    assert_eq!(rotary.query_scale, None);
    let nope = mha::AttentionConfig::from_json(llama4, 3).unwrap();
    assert_eq!(
        (nope.rope, nope.qk_norm, nope.attention_chunk_size),
        (None, None, None)
    );
    let scale = nope.query_scale.unwrap();
    assert_eq!((scale.beta, scale.period, scale.offset), (0.1, 8192.0, 1));
    assert_eq!(scale.from, mha::ScalePosition::Index);
    let zero = llama4.replace(
        "\"attention_chunk_size\": 8192",
        "\"attention_chunk_size\": 0",
    );
    let err = mha::AttentionConfig::from_json(&zero, 0).unwrap_err();
    assert!(err.to_string().contains("attention_chunk_size"), "{err}");
}

/// The second round's keys, and their errors naming the key.
#[test]
fn hybrid_round_keys_and_their_errors() {
    let minimax = r#"{"model_type": "minimax_m2", "hidden_size": 16, "num_attention_heads": 2,
        "num_key_value_heads": 1, "num_hidden_layers": 1, "head_dim": 8, "rotary_dim": 4}"#;
    let c = read(minimax);
    assert_eq!(c.rope.unwrap().rotary_dim, 4);
    assert_eq!(c.rope.unwrap().theta, 5_000_000.0);
    assert_eq!(c.qk_norm.unwrap().span, QkNormSpan::Whole);
    // A partial_rotary_factor wins over rotary_dim, as MiniMaxM2Config reads them.
    let both = with(minimax, r#""partial_rotary_factor": 0.5"#);
    assert_eq!(read(&both).rope.unwrap().rotary_dim, 4);
    let wide = minimax.replace(r#""rotary_dim": 4"#, r#""rotary_dim": 10"#);
    assert_fails_with(&wide, r#""rotary_dim" = 10: must be at most head_dim = 8"#);

    let hunyuan = r#"{"model_type": "hunyuan_v1_dense", "hidden_size": 16, "num_attention_heads": 2,
        "num_hidden_layers": 1, "head_dim": 8, "rope_theta": 100.0,
        "rope_scaling": {"type": "dynamic", "alpha": -1.0, "factor": 1.0}}"#;
    assert_fails_with(hunyuan, r#""rope_scaling.alpha" = -1.0: must be positive"#);
    let c = read(&hunyuan.replace("-1.0", "16.0"));
    let theta = c.rope.unwrap().theta;
    assert!(
        (theta - 100.0 * 16f64.powf(8.0 / 6.0)).abs() < 1e-9 * theta,
        "{theta}"
    );
    assert_eq!(c.n_kv_heads, 2); // as many as the query heads when absent

    let nemotron = r#"{"model_type": "nemotron_h", "hidden_size": 16, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 8, "hybrid_override_pattern": "M*X"}"#;
    assert_fails_with(
        nemotron,
        r#""hybrid_override_pattern" = "M*X": 'X' is none of M (Mamba-2), * (attention), - (MLP), E (MoE)"#,
    );
    let missing = nemotron.replace(r#", "hybrid_override_pattern": "M*X""#, "");
    assert_fails_with(
        &missing,
        r#""layers_block_type (or hybrid_override_pattern)" is missing"#,
    );
    let listed = missing.replace("}", r#", "layers_block_type": ["mamba", "attention"]}"#);
    assert!(read(&listed.replace("\"mamba\", ", "")).rope.is_none());
    let err = fail(&listed, 0).to_string();
    assert!(err.ends_with("the attention layers are [1]"), "{err}");

    let lfm2 = r#"{"model_type": "lfm2", "hidden_size": 16, "num_attention_heads": 2,
        "num_key_value_heads": 1, "num_hidden_layers": 3, "full_attn_idxs": [2, "x"]}"#;
    assert_fails_with(
        lfm2,
        r#""full_attn_idxs[1]" must be a layer index, found "x""#,
    );
    let lfm2 = lfm2.replace(r#", "x""#, "");
    assert_eq!(
        AttentionConfig::from_json(&lfm2, 2)
            .unwrap()
            .qk_norm
            .unwrap()
            .eps,
        1e-5
    );
    let lfm2 = lfm2.replace("]", r#"], "norm_eps": 0.001"#);
    assert_eq!(
        AttentionConfig::from_json(&lfm2, 2)
            .unwrap()
            .qk_norm
            .unwrap()
            .eps,
        1e-3
    );

    let granite = r#"{"model_type": "granite_swa", "hidden_size": 16, "num_attention_heads": 2,
        "num_key_value_heads": 1, "num_hidden_layers": 2, "attention_multiplier": 0.5, "layer_rope_theta": [null]}"#;
    let c = read(granite);
    assert_eq!((c.scale, c.sinks, c.sliding_window), (0.5, true, None));
    assert!(c.rope.is_none());
    let err = fail(granite, 1).to_string();
    assert_eq!(
        err,
        r#"config.json: "layer_rope_theta" = 1 entries: needs one per layer, layer 1 asked for"#
    );
    let c = AttentionConfig::from_json(&granite.replace("[null]", "[0, 300]"), 1).unwrap();
    assert_eq!(
        (c.rope.unwrap().theta, c.sliding_window),
        (300.0, Some(128))
    );

    let hybrid = r#"{"model_type": "granitemoehybrid", "hidden_size": 16,
        "num_attention_heads": 2, "num_hidden_layers": 2}"#;
    let err = fail(hybrid, 1).to_string();
    assert!(err.ends_with("the attention layers are []"), "{err}");

    let falcon = r#"{"model_type": "falcon_h1", "hidden_size": 16, "num_attention_heads": 2,
        "num_hidden_layers": 1, "key_multiplier": 1e30, "attention_in_multiplier": 1e30}"#;
    let err = fail(falcon, 0).to_string();
    assert!(err.starts_with(r#"config.json: "key_multiplier" = 1e30: times attention_in_multiplier = 1e30 gives inf in f32"#), "{err}");
}
