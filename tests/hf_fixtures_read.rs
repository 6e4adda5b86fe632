//! The Hugging Face reference fixtures (`tests/fixtures/hf/`, written by
//! `dev/hf_fixtures/generate.py`) are all present and readable with the crate's own safetensors
//! reader: shapes agree, values are finite, the expected outputs are not zero, and each
//! `model.safetensors` holds float32 tensors under its layer prefix.

#[path = "common/hf_fixture.rs"]
mod hf_fixture;

use hf_fixture::{case_names, load};
use mha::safetensors::{Dtype, SafeTensors};

/// The families the generator covers; every one must have at least one case.
const FAMILIES: [&str; 8] = [
    "llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "gpt_neox", "gptj",
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

        let bytes = case.model_bytes();
        let st = SafeTensors::parse(&bytes).expect("model.safetensors parses");
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
