//! The Hugging Face reference fixtures (`tests/fixtures/hf/`, written by
//! `dev/hf_fixtures/generate.py`) are all present and readable with the crate's own safetensors
//! reader: shapes agree, values are finite, the expected outputs are not zero, and each
//! `model.safetensors` holds float32 tensors under its layer prefix.

#[path = "common/hf_fixture.rs"]
mod hf_fixture;

use hf_fixture::{case_names, load};
use mha::safetensors::{Dtype, SafeTensors};

/// The families the generator covers; every one must have at least one case.
const FAMILIES: [&str; 38] = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "phi",
    "olmo2",
    "gpt_neox",
    "gptj",
    "gemma2",
    "gemma3",
    "bloom",
    "gpt_oss",
    "glm4_moe",
    "smollm3",
    "olmo3",
    "seed_oss",
    "ernie4_5",
    "apertus",
    "exaone4",
    "cohere2",
    "qwen3_next",
    "qwen3_5",
    "ministral3",
    "mistral3",
    "llama4",
    "gemma4",
    "minimax_m2",
    "hunyuan_v1_dense",
    "lfm2",
    "nemotron_h",
    "granite_swa",
    "granitemoehybrid",
    "falcon_h1",
    "laguna",
    "mimo_v2_flash",
    "step3p5",
    "step3p7",
];

#[test]
fn every_family_has_a_case() {
    let cases: Vec<_> = case_names().iter().map(|n| load(n)).collect();
    for family in FAMILIES {
        assert!(
            cases.iter().any(|c| c.family == family),
            "no fixture for family {family}"
        );
    }
    // A sliding and a full layer of each family whose layers alternate or switch by index.
    for family in [
        "qwen2",
        "gemma2",
        "gemma3",
        "gpt_oss",
        "olmo3",
        "exaone4",
        "cohere2",
        "gemma4",
        "mimo_v2_flash",
        "step3p5",
    ] {
        for kind in ["layer_sliding", "layer_full"] {
            assert!(
                cases.iter().any(|c| c.family == family && c.has(kind)),
                "no {kind} fixture for {family}"
            );
        }
    }
    for feature in [
        "rope_scaling_linear",
        "rope_scaling_llama3",
        "rope_scaling_yarn",
        "rope_interleaved",
        "rope_partial",
        "explicit_positions",
        "qk_norm_per_head",
        "qk_norm_whole",
        "query_width_ne_hidden",
        "fused_qkv",
        "fused_qkv_per_head",
        "qkv_bias",
        "config_legacy",
        "config_v5",
        // The score terms and per-layer settings.
        "sliding_window",
        "layer_sliding",
        "layer_full",
        "layer_index_nonzero",
        "softcap",
        "query_pre_attn_scalar",
        "qk_norm_gemma",
        "rope_local_theta",
        "alibi",
        "alibi_non_power_of_two",
        "no_rope",
        "attention_sinks",
        "out_bias",
        // Padding masks with holes.
        "padding_mask_holes",
        // Layers without rotary in a model whose other layers rotate.
        "no_rope_layer",
        // Qwen3.5's output gate and the text model of a composite config.
        "output_gate",
        "text_config",
        // Ministral 3's and Llama 4's query scales, Llama 4's chunks and QK-norm after RoPE.
        "query_scale",
        "chunked_attention",
        "qk_norm_after_rope",
        // Gemma 4's value norm, values from the key projection, proportional rotary and a
        // layer whose heads are not the model's.
        "value_norm",
        "k_eq_v",
        "rope_proportional",
        "layer_head_dim",
        // The second round: MiniMax-M2's rotary_dim, Hunyuan's NTK-alpha base and weighted
        // QK-norm after RoPE, LFM2's full_attn_idxs, Nemotron-H's pattern, Granite's scale and
        // per-layer base, Falcon-H1's multipliers.
        "rotary_dim_key",
        "rope_ntk_alpha",
        "qk_norm_weighted_after_rope",
        "full_attn_idxs",
        "hybrid_pattern",
        "attention_multiplier",
        "layer_rope_theta",
        "projection_multipliers",
        // MiMo-V2-Flash's value heads of their own width, its value factor and its sliding
        // layers' own key/value head count.
        "value_head_dim",
        "value_scale",
        "layer_kv_heads",
    ] {
        assert!(
            cases.iter().any(|c| c.has(feature)),
            "no fixture exercises {feature}"
        );
    }
}

#[test]
fn every_case_loads_with_consistent_shapes_and_values() {
    let names = case_names();
    assert!(names.len() >= 8, "only {} cases", names.len());
    for name in &names {
        let case = load(name);
        let (b, t, d) = (case.batch, case.seq_len, case.hidden);
        assert!(b >= 2, "{name}: batch {b}");
        assert_eq!(case.x.len(), b * t * d, "{name}: x");
        assert_eq!(case.positions.len(), b * t, "{name}: positions");
        assert_eq!(case.expected.len(), b * t * d, "{name}: expected");
        assert!(case.x.iter().all(|v| v.is_finite()), "{name}: x finite");
        assert!(
            case.expected.iter().all(|v| v.is_finite()),
            "{name}: expected finite"
        );
        assert!(
            case.expected.iter().any(|&v| v != 0.0),
            "{name}: expected all zero"
        );
        assert!(
            case.positions.iter().all(|&p| p >= 0),
            "{name}: negative position"
        );
        let arange = (0..b)
            .all(|bi| (0..t).all(|ti| case.positions[bi * t + ti] == i64::try_from(ti).unwrap()));
        assert_eq!(arange, case.default_positions, "{name}: default_positions");
        assert_eq!(case.has("explicit_positions"), !arange, "{name}: feature");
        assert_eq!(case.positions_usize().len(), b * t);

        let config = case.config_json();
        assert!(
            config.contains(&format!("\"hidden_size\": {d}"))
                || config.contains(&format!("\"n_embd\": {d}")),
            "{name}: config.json width"
        );

        check_issue13_settings(&case, &config);

        let bytes = case.model_bytes();
        let st = SafeTensors::parse(&bytes).expect("model.safetensors parses");
        if case.sinks {
            let sinks = st
                .tensor(&format!("{}sinks", case.layer_prefix))
                .expect("sinks tensor present");
            assert_eq!(sinks.shape().len(), 1, "{name}: sinks shape");
            let heads = sinks.shape()[0];
            assert!(
                config.contains(&format!("\"num_attention_heads\": {heads}")),
                "{name}: {heads} sinks"
            );
        }
        assert!(st.len() >= 2, "{name}: {} weight tensors", st.len());
        for t in st.tensors() {
            assert!(
                t.name().starts_with(&case.layer_prefix),
                "{name}: {} outside {}",
                t.name(),
                case.layer_prefix
            );
            assert_eq!(t.dtype(), Dtype::F32, "{name}: {}", t.name());
            let values = t.to_f32().unwrap();
            assert!(values.iter().all(|v| v.is_finite()), "{name}: {}", t.name());
            // Every projection reads or writes the model width.
            if t.name().ends_with("proj.weight") || t.name().ends_with("value.weight") {
                assert!(
                    t.shape().contains(&d),
                    "{name}: {} {:?}",
                    t.name(),
                    t.shape()
                );
            }
        }
    }
}

/// The issue-13 settings in the metadata agree with the features, the layer prefix and
/// `config.json`, and are such that they matter at this sequence length.
fn check_issue13_settings(case: &hf_fixture::HfCase, config: &str) {
    let name = &case.name;
    assert!(
        case.layer_prefix
            .contains(&format!(".{}.", case.layer_index)),
        "{name}: prefix {} for layer {}",
        case.layer_prefix,
        case.layer_index
    );
    assert_eq!(
        case.has("layer_index_nonzero"),
        case.layer_index != 0,
        "{name}: layer index {}",
        case.layer_index
    );
    match case.layer_type.as_str() {
        "sliding_attention" => assert!(case.sliding_window.is_some(), "{name}: no window"),
        "full_attention" | "chunked_attention" => {
            assert!(case.sliding_window.is_none(), "{name}: window")
        }
        other => panic!("{name}: layer_type {other:?}"),
    }
    assert_eq!(
        case.has("sliding_window"),
        case.sliding_window.is_some(),
        "{name}: feature sliding_window"
    );
    assert_eq!(
        case.has("layer_sliding"),
        case.sliding_window.is_some(),
        "{name}: feature layer_sliding"
    );
    if let Some(w) = case.sliding_window {
        // 0 < w, and several times shorter than T, so that the window hides keys.
        assert!(
            w >= 1 && 2 * w < case.seq_len,
            "{name}: window {w}, T {}",
            case.seq_len
        );
        assert!(
            config.contains(&format!("\"sliding_window\": {w}")),
            "{name}: config.json window"
        );
    }
    if case.has("layer_full") {
        // A full-attention layer of a model with a window (the window must not be applied).
        assert!(
            case.sliding_window.is_none(),
            "{name}: full layer with a window"
        );
        assert!(
            !config.contains("\"sliding_window\": null"),
            "{name}: the model has no window"
        );
    }
    assert!(
        case.scale.is_finite() && case.scale > 0.0,
        "{name}: scale {}",
        case.scale
    );
    assert_eq!(
        case.has("softcap"),
        case.softcap.is_some(),
        "{name}: feature softcap"
    );
    if let Some(cap) = case.softcap {
        assert!(cap.is_finite() && cap > 0.0, "{name}: softcap {cap}");
        assert!(
            config.contains(&format!("\"attn_logit_softcapping\": {cap:?}")),
            "{name}: config.json softcap"
        );
    }
    if case.has("query_pre_attn_scalar") {
        let want = config
            .lines()
            .find_map(|l| l.trim().strip_prefix("\"query_pre_attn_scalar\": "))
            .map(|v| v.trim_end_matches(',').parse::<f64>().unwrap())
            .expect("config.json query_pre_attn_scalar");
        assert!(
            (case.scale - want.powf(-0.5)).abs() < 1e-15,
            "{name}: scale {} vs query_pre_attn_scalar {want}",
            case.scale
        );
    }
    assert_eq!(
        case.has("alibi"),
        case.alibi_slopes.is_some(),
        "{name}: feature alibi"
    );
    if let Some(slopes) = &case.alibi_slopes {
        let heads = slopes.len();
        assert!(
            config.contains(&format!("\"n_head\": {heads}")),
            "{name}: {heads} slopes"
        );
        assert!(
            slopes.iter().all(|&s| s > 0.0 && s < 1.0),
            "{name}: slopes {slopes:?}"
        );
        assert_eq!(
            case.has("alibi_non_power_of_two"),
            !heads.is_power_of_two(),
            "{name}: {heads} heads"
        );
    }
    assert_eq!(
        case.has("attention_sinks"),
        case.sinks,
        "{name}: feature attention_sinks"
    );
    assert_eq!(case.has("no_rope"), !case.has("rope"), "{name}: rope");
}
