//! Layers loaded from Hugging Face checkpoints and their `config.json` (Llama with each rope
//! scaling and explicit positions, Mistral, Qwen2 with biases and YaRN, Qwen3 with per-head
//! QK-norm and a query width ≠ D, Phi-3 with a fused projection and partial rotary, GPT-NeoX
//! with its per-head interleaved fused projection, OLMo 2 with whole-row QK-norm; GPT-J's
//! interleaved rotary, built by hand since its config is not read; the sliding windows of
//! Mistral, Qwen2's layers from `max_window_layers`, Gemma 2 with soft cap and
//! `query_pre_attn_scalar` on its local and global layers, Gemma 3 with `(1 + w)` QK-norm and a
//! local rotary base, BLOOM's ALiBi for 6 and 4 heads, gpt-oss's sinks, biases and YaRN on its
//! sliding and full layers; issue 33's families, among them Gemma 4's sliding and full layers
//! with the value norm, values from the key projection, per-layer heads and proportional
//! rotary) against the float64 outputs of the `transformers`
//! modules (`tests/fixtures/hf`, written by `dev/hf_fixtures/generate.py` and checked there
//! against a plain float64 implementation).
//!
//! Every case goes the run-time route: `Checkpoint::open` on the fixture's directory
//! (`config.json` and `model.safetensors`), then the case's layer, with no width written here
//! (GPT-J, whose config is not read, through `Layer::builder` from the checkpoint's tensors);
//! one case also through its typed view (`Mha::try_from`). Per case, on every supported
//! instruction set at 1 and 2 threads: the forward pass within
//! 1e-4 + 1e-4·|want| of the reference; decoding token by token equals the forward bit for bit
//! (positions continuing from the cache, or the case's explicit ones; a windowed layer through a
//! rolling cache of one token per call, decoded past twice its window); and a batch whose
//! sequences hold different numbers of tokens (the second sequence prefilled 3 tokens short,
//! then given its last 3 while the first adds nothing) gives each sequence's forward rows bit
//! for bit.

#![cfg(feature = "std")]

mod common;
#[path = "common/hf_fixture.rs"]
mod hf_fixture;

use common::assert_bits_eq;
use common::assert_close;
use common::modes::{configs, ABS, REL};
use hf_fixture::{forward, token_by_token, HfCase};
use mha::safetensors::SafeTensors;
use mha::{AttendOptions, Checkpoint, Isa, KvCache, Layer, Mha, Output, Tokens};
use mha::{Projections, Rope, RopeLayout, RopeScaling, Widths};

/// The layer of case `case`, read from its directory as a checkpoint: its settings checked
/// against the case's facts.
fn from_checkpoint(case: &HfCase, isa: Isa, threads: usize) -> Layer {
    let checkpoint = Checkpoint::open(&case.dir).unwrap();
    let config = checkpoint.config(case.layer_index).unwrap();
    assert_eq!(format!("{}.", config.tensor_prefix()), case.layer_prefix);
    let name = &case.name;
    assert_eq!(config.sliding_window, case.sliding_window, "{name}: window");
    assert_eq!(
        config.softcap,
        case.softcap.map(|c| c as f32),
        "{name}: cap"
    );
    assert_eq!(config.scale, case.scale as f32, "{name}: scale");
    assert_eq!(config.sinks, case.sinks, "{name}: sinks");
    let layer = checkpoint
        .layer_with(case.layer_index, |b| {
            b.isa(isa).threads(threads).min_work_per_thread(0)
        })
        .unwrap();
    let slopes = case.alibi_slopes.as_ref();
    let want: Option<Vec<f32>> = slopes.map(|s| s.iter().map(|&x| x as f32).collect());
    assert_eq!(layer.alibi_slopes(), want.as_deref(), "{name}: slopes");
    assert_eq!(layer.widths().d_model, case.hidden, "{name}: D");
    layer
}

/// Runs every check of the module on one case.
fn check_case(name: &str, layer: impl Fn(&HfCase, Isa, usize) -> Layer) {
    let case = hf_fixture::load(name);
    for (isa, threads) in configs() {
        let context = format!("{name}, {isa:?}, {threads} threads");
        let mut layer = layer(&case, isa, threads);
        let forward = forward(&mut layer, &case, &case.x, None);
        assert_close(&forward, &case.expected, ABS, REL, &context);
        let decoded = token_by_token(&mut layer, &case);
        assert_bits_eq(&decoded, &forward, &format!("{context}, decoded"));
        if case.default_positions && case.padding_mask.is_none() {
            let ragged = ragged(&mut layer, &case);
            assert_bits_eq(&ragged, &forward, &format!("{context}, ragged batch"));
        }
    }
}

/// Sequence 1 prefilled 3 tokens short beside the others' whole prompts, then given its last 3
/// alone (the others adding none), through one cache; the rows in `(B, T, D)` order.
fn ragged(layer: &mut Layer, case: &HfCase) -> Vec<f32> {
    let (b, t, d) = (case.batch, case.seq_len, case.hidden);
    let mut cache: KvCache = layer.new_cache(b, t).unwrap();
    let mut first: Vec<usize> = vec![t; b];
    first[1] = t - 3;
    let mut out = vec![0.0; b * t * d];
    let call = |layer: &mut Layer, cache: &mut KvCache, x: &[f32], len, real: &[usize]| {
        let options = AttendOptions {
            token_lengths: Some(real),
            ..AttendOptions::default()
        };
        let mut y = vec![0.0; b * len * d];
        let input = Tokens::new(x, b, len, d).unwrap();
        let output = Output::new(&mut y, b, len, d).unwrap();
        layer.decode_into(input, cache, options, output).unwrap();
        y
    };
    let y = call(layer, &mut cache, &case.x, t, &first);
    out.copy_from_slice(&y);
    // The last 3 tokens of sequence 1, at the front of its rows; the others' rows are padding.
    let mut x = vec![0.0; b * 3 * d];
    x[3 * d..6 * d].copy_from_slice(&case.x[(t + t - 3) * d..2 * t * d]);
    let mut second = vec![0; b];
    second[1] = 3;
    let y = call(layer, &mut cache, &x, 3, &second);
    out[(t + t - 3) * d..2 * t * d].copy_from_slice(&y[3 * d..6 * d]);
    assert_eq!(cache.lengths(), vec![t; b]);
    out
}

/// One case through the checkpoint route.
fn checkpoint_case(name: &str) {
    check_case(name, from_checkpoint);
}

#[test]
fn llama_gqa() {
    checkpoint_case("llama_gqa");
}

#[test]
fn llama_linear() {
    checkpoint_case("llama_linear");
}

#[test]
fn llama_llama3() {
    checkpoint_case("llama_llama3");
}

#[test]
fn llama_yarn() {
    checkpoint_case("llama_yarn");
}

#[test]
fn llama_positions() {
    checkpoint_case("llama_positions");
}

#[test]
fn mistral() {
    checkpoint_case("mistral");
}

#[test]
fn mistral_window() {
    checkpoint_case("mistral_window");
}

#[test]
fn qwen2_bias() {
    checkpoint_case("qwen2_bias");
}

#[test]
fn qwen2_yarn() {
    checkpoint_case("qwen2_yarn");
}

#[test]
fn qwen2_window_full() {
    checkpoint_case("qwen2_window_full");
}

#[test]
fn qwen2_window_sliding() {
    checkpoint_case("qwen2_window_sliding");
}

#[test]
fn qwen3_qknorm() {
    checkpoint_case("qwen3_qknorm");
}

#[test]
fn phi3_partial() {
    checkpoint_case("phi3_partial");
}

#[test]
fn gpt_neox() {
    checkpoint_case("gpt_neox");
}

#[test]
fn olmo2_qknorm() {
    checkpoint_case("olmo2_qknorm");
}

#[test]
fn gemma2_local() {
    checkpoint_case("gemma2_local");
}

#[test]
fn gemma2_global() {
    checkpoint_case("gemma2_global");
}

#[test]
fn gemma3_local() {
    checkpoint_case("gemma3_local");
}

#[test]
fn gemma3_global() {
    checkpoint_case("gemma3_global");
}

#[test]
fn bloom_alibi6() {
    checkpoint_case("bloom_alibi6");
}

#[test]
fn bloom_alibi4() {
    checkpoint_case("bloom_alibi4");
}

/// BLOOM over a padding mask with holes: ALiBi places each key at its rank among the real
/// tokens, as `transformers` does (by index, the output would differ by 0.23).
#[test]
fn bloom_holes() {
    checkpoint_case("bloom_holes");
}

#[test]
fn phi2_partial() {
    checkpoint_case("phi2_partial");
}

#[test]
fn gpt_oss_sliding() {
    checkpoint_case("gpt_oss_sliding");
}

#[test]
fn gpt_oss_full() {
    checkpoint_case("gpt_oss_full");
}

#[test]
fn glm4_moe() {
    checkpoint_case("glm4_moe");
}

#[test]
fn smollm3_rope() {
    checkpoint_case("smollm3_rope");
}

#[test]
fn smollm3_nope() {
    checkpoint_case("smollm3_nope");
}

#[test]
fn olmo3_sliding() {
    checkpoint_case("olmo3_sliding");
}

#[test]
fn olmo3_full() {
    checkpoint_case("olmo3_full");
}

#[test]
fn seed_oss() {
    checkpoint_case("seed_oss");
}

#[test]
fn ernie4_5() {
    checkpoint_case("ernie4_5");
}

#[test]
fn apertus() {
    checkpoint_case("apertus");
}

#[test]
fn exaone4_sliding() {
    checkpoint_case("exaone4_sliding");
}

#[test]
fn exaone4_full() {
    checkpoint_case("exaone4_full");
}

#[test]
fn cohere2_sliding() {
    checkpoint_case("cohere2_sliding");
}

#[test]
fn cohere2_full() {
    checkpoint_case("cohere2_full");
}

#[test]
fn qwen3_next() {
    checkpoint_case("qwen3_next");
}

#[test]
fn qwen3_5() {
    checkpoint_case("qwen3_5");
}

/// The linear-attention layers of a hybrid stack are reported, with the layers that load.
/// Ministral 3's query scale from explicit positions up to 6 periods out.
#[test]
fn ministral3() {
    checkpoint_case("ministral3");
}

/// Mistral 3 (text_config ministral3, layers under `language_model.model.`) with a window.
#[test]
fn mistral3_ministral3() {
    checkpoint_case("mistral3_ministral3");
}

/// Llama 4's rotary layer: interleaved llama3 rotary, weight-less QK-norm after it, chunks of
/// 4 tokens.
#[test]
fn llama4_chunked() {
    checkpoint_case("llama4_chunked");
}

/// Llama 4's layer without rotary: the temperature tuning from the token index.
#[test]
fn llama4_nope() {
    checkpoint_case("llama4_nope");
}

/// Gemma 4's sliding layer: plain-weight QK-norm, weight-less value norm, scale 1, window 3.
#[test]
fn gemma4_sliding() {
    checkpoint_case("gemma4_sliding");
}

/// Gemma 4's full layer: its own head width and key/value heads (`per_layer_config`), values
/// from `k_proj` (no `v_proj` in the checkpoint), proportional rotary.
#[test]
fn gemma4_full() {
    checkpoint_case("gemma4_full");
}

/// As `gemma4_full`, its heads from `global_head_dim` and `num_global_key_value_heads`.
#[test]
fn gemma4_full_global_keys() {
    checkpoint_case("gemma4_full_global_keys");
}

/// What the Gemma 4 configs give each layer, and the settings refused by key.
#[test]
fn gemma4_layers_read_as_configured() {
    for name in ["gemma4_full", "gemma4_full_global_keys"] {
        let case = hf_fixture::load(name);
        let checkpoint = Checkpoint::open(&case.dir).unwrap();
        let full = checkpoint.config(2).unwrap();
        assert_eq!((full.head_dim, full.n_kv_heads), (10, 1), "{name}");
        assert!(full.values_from_keys, "{name}");
        assert_eq!(full.value_norm, Some(1e-6), "{name}");
        let rope = full.rope.unwrap();
        assert_eq!(rope.rotary_dim, 10, "{name}");
        let proportional = RopeScaling::Proportional {
            pairs: 2,
            factor: 1.0,
        };
        assert_eq!(rope.scaling, proportional, "{name}");
        let sliding = checkpoint.config(1).unwrap();
        assert_eq!((sliding.head_dim, sliding.n_kv_heads), (6, 3), "{name}");
        assert!(!sliding.values_from_keys, "{name}");
        assert_eq!(
            sliding.rope.unwrap().scaling,
            RopeScaling::Default,
            "{name}"
        );
        let layer = checkpoint.layer(2).unwrap();
        assert_eq!((layer.value_norm(), layer.scale()), (Some(1e-6), 1.0));
    }
    let config = hf_fixture::load("gemma4_full").config_json();
    let shared = config.replace("\"num_kv_shared_layers\": 0", "\"num_kv_shared_layers\": 2");
    // Layers 1 and 2 are KV-shared: 1 reads sliding layer 0; no full layer precedes 2.
    let source = |layer| mha::AttentionConfig::from_json(&shared, layer).map(|c| c.kv_source);
    assert_eq!((source(0), source(1)), (Ok(None), Ok(Some(0))));
    assert_eq!(
        source(2).unwrap_err().to_string(),
        "config.json: \"num_kv_shared_layers\" = 2: leaves no earlier full layer \
         for layer 2 to share keys and values with"
    );
    let all = config.replace(
        "\"use_bidirectional_attention\": null",
        "\"use_bidirectional_attention\": \"all\"",
    );
    let err = mha::AttentionConfig::from_json(&all, 2)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"use_bidirectional_attention\" = \"all\" is not supported"),
        "{err}"
    );
    let vision = all.replace("\"all\"", "\"vision\"");
    assert!(mha::AttentionConfig::from_json(&vision, 2).is_ok());
    // The composite model's text model, under `text_config`.
    let wrapped = format!(r#"{{"model_type": "gemma4", "text_config": {config}}}"#);
    let full = mha::AttentionConfig::from_json(&wrapped, 2).unwrap();
    assert_eq!(full.wrapper, Some(mha::Wrapper::Gemma4));
    assert_eq!((full.head_dim, full.n_kv_heads), (10, 1));
    let prefix = full.tensor_prefix();
    assert_eq!(prefix, "model.language_model.layers.2.self_attn");
    // A full layer's heads from the global keys: errors name them.
    let global = hf_fixture::load("gemma4_full_global_keys").config_json();
    let zero = global.replace("\"global_head_dim\": 10", "\"global_head_dim\": 0");
    let err = mha::AttentionConfig::from_json(&zero, 2).unwrap_err();
    let want = "config.json: \"global_head_dim\" = 0: must be at least 1";
    assert_eq!(err.to_string(), want);
}

#[test]
fn linear_attention_layers_are_reported() {
    for (name, key) in [
        ("qwen3_next", "layer_types[0]"),
        ("qwen3_5", "text_config.layer_types[0]"),
    ] {
        let case = hf_fixture::load(name);
        let checkpoint = Checkpoint::open(&case.dir).unwrap();
        let err = checkpoint.layer(0).unwrap_err().to_string();
        let want = format!(
            "config.json: layer 0 is a \"linear_attention\" layer ({key}), not softmax \
             attention (not computed by this crate); the attention layers are [1]"
        );
        assert!(err.ends_with(&want), "{name}: {err}");
    }
}

/// MiniMax-M2: whole-row QK-norm, `rotary_dim` 6 of 10 (the published spelling).
#[test]
fn minimax_m2() {
    checkpoint_case("minimax_m2");
}

/// Hunyuan dense: the NTK-alpha base (`dynamic` with `alpha`), weighted per-head QK-norm
/// (`query_layernorm`, `key_layernorm`) after RoPE, biases.
#[test]
fn hunyuan_v1_dense() {
    checkpoint_case("hunyuan_v1_dense");
}

/// LFM2's attention layer (from `full_attn_idxs`): `out_proj`, `q_layernorm`/`k_layernorm`.
#[test]
fn lfm2() {
    checkpoint_case("lfm2");
}

/// Nemotron-H's attention layer (`hybrid_override_pattern` "-*ME"), `backbone.layers.1.mixer`,
/// no rotary.
#[test]
fn nemotron_h() {
    checkpoint_case("nemotron_h");
}

/// Granite SWA's full layer without rotary (`layer_rope_theta` 0), scale
/// `attention_multiplier`, sinks, biases.
#[test]
fn granite_swa_nope() {
    checkpoint_case("granite_swa_nope");
}

/// Granite SWA's sliding layer with its own rotary base.
#[test]
fn granite_swa_sliding() {
    checkpoint_case("granite_swa_sliding");
}

/// Granite 4.0-H's attention layer without rotary (`position_embedding_type` "nope"; layer
/// types in their legacy names).
#[test]
fn granitemoehybrid_nope() {
    checkpoint_case("granitemoehybrid_nope");
}

/// Granite 4.0-H's attention layer after a Mamba-2 layer, with rotary and biases.
#[test]
fn granitemoehybrid_rope() {
    checkpoint_case("granitemoehybrid_rope");
}

/// Falcon-H1: the key, input and output multipliers folded into the weights and biases.
#[test]
fn falcon_h1() {
    checkpoint_case("falcon_h1");
}

/// The hybrid stacks' other layers are reported with their kind, where the config says it,
/// and the attention layers that load.
#[test]
fn hybrid_layers_are_reported() {
    for (name, layer, kind, key, attention) in [
        (
            "lfm2",
            0,
            "conv",
            "full_attn_idxs (layer 0 not listed)",
            "[1]",
        ),
        (
            "lfm2",
            2,
            "conv",
            "full_attn_idxs (layer 2 not listed)",
            "[1]",
        ),
        (
            "nemotron_h",
            0,
            "mlp",
            "hybrid_override_pattern[0] = \"-\"",
            "[1]",
        ),
        (
            "nemotron_h",
            2,
            "linear_attention",
            "hybrid_override_pattern[2] = \"M\"",
            "[1]",
        ),
        (
            "nemotron_h",
            3,
            "moe",
            "hybrid_override_pattern[3] = \"E\"",
            "[1]",
        ),
        ("granitemoehybrid_nope", 1, "mamba", "layer_types[1]", "[0]"),
        (
            "granitemoehybrid_rope",
            0,
            "linear_attention",
            "layer_types[0]",
            "[1]",
        ),
    ] {
        let case = hf_fixture::load(name);
        let checkpoint = Checkpoint::open(&case.dir).unwrap();
        let err = checkpoint.layer(layer).unwrap_err().to_string();
        let want = format!(
            "config.json: layer {layer} is a \"{kind}\" layer ({key}), not softmax attention \
             (not computed by this crate); the attention layers are {attention}"
        );
        assert!(err.ends_with(&want), "{name}: {err}");
    }
    // Nemotron-H counts its layers by the pattern (num_hidden_layers is ignored).
    let case = hf_fixture::load("nemotron_h");
    let err = Checkpoint::open(&case.dir).unwrap().layer(4).unwrap_err();
    let want = "layer 4 is out of range: \"hybrid_override_pattern\" = 4";
    assert!(err.to_string().ends_with(want), "{err}");
}

/// What the second round's configs give their layers.
#[test]
fn hybrid_round_configs_read_as_written() {
    let config = |name: &str, layer| {
        let case = hf_fixture::load(name);
        Checkpoint::open(&case.dir).unwrap().config(layer).unwrap()
    };
    let minimax = config("minimax_m2", 0);
    assert_eq!(minimax.rope.unwrap().rotary_dim, 6);
    let hunyuan = config("hunyuan_v1_dense", 0);
    let theta = 100.0 * 4f64.powf(10.0 / 8.0);
    assert!((hunyuan.rope.unwrap().theta - theta).abs() < 1e-12 * theta);
    assert_eq!(
        hunyuan.qk_norm.unwrap().placement,
        mha::QkNormPlacement::AfterRope
    );
    assert!(config("granite_swa_nope", 0).rope.is_none());
    assert_eq!(config("granite_swa_sliding", 1).rope.unwrap().theta, 500.0);
    assert!(config("nemotron_h", 1).rope.is_none());
    let scales = mha::ProjectionScales {
        input: 1.5,
        key: 0.4,
        value: 1.0,
        output: 0.75,
    };
    assert_eq!(config("falcon_h1", 0).projection_scales, scales);
    // A position embedding type other than rope or nope is refused by key.
    let text = hf_fixture::load("granitemoehybrid_nope").config_json();
    let alibi = text.replace("\"nope\"", "\"alibi\"");
    let err = mha::AttentionConfig::from_json(&alibi, 0).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("config.json: \"position_embedding_type\" = \"alibi\" is not supported"),
        "{err}"
    );
    // Hunyuan's dynamic rope without alpha (dynamic NTK scaling) is refused by key.
    let text = hf_fixture::load("hunyuan_v1_dense").config_json();
    let dynamic = text.replace("\"alpha\": 4.0,", "");
    let err = mha::AttentionConfig::from_json(&dynamic, 0).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("config.json: \"rope_scaling.type\" = \"dynamic\" is not supported"),
        "{err}"
    );
}

/// Every fixture but GPT-J's (whose config is not read) has a test above.
#[test]
fn every_case_is_checked() {
    let listed = include_str!("hf_models.rs")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("checkpoint_case(\""))
        .filter_map(|l| l.strip_suffix("\");"))
        .map(String::from)
        .collect::<Vec<_>>();
    let mut want = hf_fixture::case_names();
    want.retain(|n| n != "gptj_interleaved");
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    assert_eq!(listed_sorted, want);
}

/// The typed route: the checkpoint's layer as an `Mha<D, D, KV, Q>` gives the same bits.
#[test]
fn typed_view_of_a_checkpoint_layer() {
    let case = hf_fixture::load("qwen3_qknorm");
    let mut layer = from_checkpoint(&case, Isa::detect(), 1);
    let want = forward(&mut layer, &case, &case.x, None);
    let mut typed = Mha::<44, 44, 20, 60>::try_from(layer).unwrap();
    let x = mha::Tensor::<2, 7, 44>::from_vec(case.x.clone()).unwrap();
    let mut y = mha::Tensor::<2, 7, 44>::zeros();
    typed
        .forward_into(&x, AttendOptions::default(), &mut y)
        .unwrap();
    assert_bits_eq(y.as_slice(), &want, "typed view");
    let layer = from_checkpoint(&case, Isa::detect(), 1);
    let err = Mha::<44, 44, 60, 60>::try_from(layer).unwrap_err();
    assert_eq!(
        err.to_string(),
        "converting a Layer to Mha<44, 44, 60, 60>: the layer's key/value width (KV) is 20, \
         not 60 (it converts to Mha<44, 44, 20, 60>)"
    );
}

/// GPT-J (interleaved rotary of the first 6 of 10 features, theta 10,000 as its code fixes it,
/// no biases): its `config.json` is not one the crate reads, so the layer is built by hand from
/// the checkpoint's tensors, at the width the case gives.
#[test]
fn gptj_interleaved() {
    check_case("gptj_interleaved", |case, isa, threads| {
        let bytes = case.model_bytes();
        let st = SafeTensors::parse(&bytes).unwrap();
        let d = case.hidden;
        let w = |name: &str| {
            let (shape, values) = st
                .tensor_f32(&format!("{}{name}.weight", case.layer_prefix))
                .unwrap();
            assert_eq!(shape, [d, d]);
            // (out, in) as stored, transposed into x @ W.
            (0..d * d)
                .map(|i| values[(i % d) * d + i / d])
                .collect::<Vec<f32>>()
        };
        let [wq, wk, wv, wo] = ["q_proj", "k_proj", "v_proj", "out_proj"].map(w);
        let projections =
            Projections::new(Widths::self_attention(d, d, d), &wq, &wk, &wv, &wo).unwrap();
        let rope = Rope {
            theta: 10_000.0,
            rotary_dim: 6,
            layout: RopeLayout::Interleaved,
            scaling: RopeScaling::Default,
        };
        Layer::builder(projections, 3)
            .rope(rope)
            .isa(isa)
            .threads(threads)
            .min_work_per_thread(0)
            .build()
            .unwrap()
    });
}

/// Laguna's sliding layer: 6 query heads of its own (`num_attention_heads_per_layer`) over 2
/// key/value heads, plain-weight QK-norm, window 3, a softplus gate per head (`g_proj`).
#[test]
fn laguna_sliding() {
    checkpoint_case("laguna_sliding");
}

/// Laguna's full layer: 2 query heads, half of each head rotating, the softplus gate per head.
#[test]
fn laguna_full() {
    checkpoint_case("laguna_full");
}

/// Laguna with `gating: "per-element"` and biases on every projection (`g_proj` has none).
#[test]
fn laguna_per_element() {
    checkpoint_case("laguna_per_element");
}

/// What the Laguna configs give each layer, and bad gating / head lists as errors naming keys.
#[test]
fn laguna_layers_read_as_configured() {
    let case = hf_fixture::load("laguna_full");
    let checkpoint = Checkpoint::open(&case.dir).unwrap();
    let heads: Vec<usize> = (0..3)
        .map(|i| checkpoint.config(i).unwrap().n_heads)
        .collect();
    assert_eq!(heads, [4, 6, 2]);
    let gate = checkpoint.config(2).unwrap().output_gate.unwrap();
    let per_head = mha::GateConfig {
        span: mha::GateSpan::PerHead,
        activation: mha::GateActivation::Softplus,
        tensor: mha::GateTensor::Own,
    };
    assert_eq!(gate, per_head);
    let layer = checkpoint.layer(2).unwrap();
    assert_eq!(layer.n_heads(), 2);
    assert_eq!(layer.output_gate().unwrap().weight.len(), 30 * 2);
    let config = case.config_json();
    let bad = config.replace("\"gating\": true", "\"gating\": \"per-token\"");
    let err = mha::AttentionConfig::from_json(&bad, 0).unwrap_err();
    let want = "config.json: \"gating\" = \"per-token\" is not supported: Laguna's gating is \
                true, false, \"per-head\" or \"per-element\"";
    assert_eq!(err.to_string(), want);
    let short = config.replace(
        "\"num_attention_heads_per_layer\": [\n    4,\n",
        "\"num_attention_heads_per_layer\": [\n",
    );
    let err = mha::AttentionConfig::from_json(&short, 0).unwrap_err();
    let want = "config.json: \"num_attention_heads_per_layer\" = 2 entries: needs one entry per \
                layer, num_hidden_layers = 3";
    assert_eq!(err.to_string(), want);
    let zero = config.replace(
        "\"num_attention_heads_per_layer\": [\n    4,",
        "\"num_attention_heads_per_layer\": [\n    0,",
    );
    let err = mha::AttentionConfig::from_json(&zero, 0).unwrap_err();
    let want = "config.json: \"num_attention_heads_per_layer[0]\" = 0: must be at least 1";
    assert_eq!(err.to_string(), want);
}

/// MiMo-V2-Flash's full layer 0: query/key heads of 12, value heads of 8 (`v_head_dim`), one
/// key/value head, the values times `attention_value_scale`, a third of each head rotating.
#[test]
fn mimo_v2_flash_full() {
    checkpoint_case("mimo_v2_flash_full");
}

/// MiMo-V2-Flash's sliding layer 1: twice the key/value heads, sinks, window 3, its own rotary
/// base.
#[test]
fn mimo_v2_flash_sliding() {
    checkpoint_case("mimo_v2_flash_sliding");
}

/// What the MiMo-V2-Flash config gives each layer, and the defaults of its configuration
/// class when keys are absent.
#[test]
fn mimo_v2_flash_layers_read_as_configured() {
    let case = hf_fixture::load("mimo_v2_flash_full");
    let checkpoint = Checkpoint::open(&case.dir).unwrap();
    let full = checkpoint.config(0).unwrap();
    let read = |c: &mha::AttentionConfig| (c.head_dim, c.v_head_dim, c.n_kv_heads, c.sinks);
    assert_eq!(read(&full), (12, 8, 1, false));
    assert_eq!(full.projection_scales.value, 0.707);
    let rope = full.rope.unwrap();
    assert_eq!((rope.rotary_dim, rope.theta), (4, 5000.0));
    let sliding = checkpoint.config(1).unwrap();
    assert_eq!(read(&sliding), (12, 8, 2, true));
    assert_eq!(sliding.sliding_window, Some(3));
    assert_eq!(sliding.rope.unwrap().theta, 100.0);
    let sliding_case = hf_fixture::load("mimo_v2_flash_sliding");
    let layer = Checkpoint::open(&sliding_case.dir)
        .unwrap()
        .layer(1)
        .unwrap();
    assert_eq!((layer.head_dim(), layer.value_head_dim()), (12, 8));
    assert_eq!(layer.widths().value, 16);
    // The configuration class's defaults: v_head_dim 128, head_dim 192, the value factor
    // 0.707 (none when null), layer 0 and every 6th full, window 129, rotary bases 5e6 / 1e4
    // over int(192 · 0.334) = 64 features.
    let bare = r#"{"model_type": "mimo_v2_flash", "hidden_size": 64, "num_attention_heads": 8,
                   "num_hidden_layers": 12}"#;
    let at = |layer| mha::AttentionConfig::from_json(bare, layer).unwrap();
    let (first, second, sixth) = (at(0), at(1), at(5));
    assert_eq!(read(&first), (192, 128, 4, false));
    assert_eq!(read(&second), (192, 128, 8, true));
    assert_eq!(read(&sixth), (192, 128, 4, false));
    assert_eq!(second.sliding_window, Some(129));
    assert_eq!(first.projection_scales.value, 0.707);
    let (full_rope, sliding_rope) = (first.rope.unwrap(), second.rope.unwrap());
    assert_eq!((full_rope.rotary_dim, full_rope.theta), (64, 5_000_000.0));
    assert_eq!(sliding_rope.theta, 10_000.0);
    let null = bare.replace(
        "\"num_hidden_layers\"",
        "\"attention_value_scale\": null, \"num_hidden_layers\"",
    );
    let none = mha::AttentionConfig::from_json(&null, 0).unwrap();
    assert_eq!(none.projection_scales.value, 1.0);
    let zero = bare.replace(
        "\"num_hidden_layers\"",
        "\"v_head_dim\": 0, \"num_hidden_layers\"",
    );
    let err = mha::AttentionConfig::from_json(&zero, 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "config.json: \"v_head_dim\" = 0: must be at least 1"
    );
}

/// Step 3.5's sliding layer 1 (`model.layers.`): 6 query heads of its own
/// (`per_layer_config`) over 2 key/value heads, `(1 + w)` QK-norm, scale `10^-½`
/// (`query_pre_attn_scalar`), window 3, a sigmoid gate per head (`g_proj`).
#[test]
fn step3p5_sliding() {
    checkpoint_case("step3p5_sliding");
}

/// Step 3.5's full layer 2: the model's 4 query heads, half of each head rotating.
#[test]
fn step3p5_full() {
    checkpoint_case("step3p5_full");
}

/// Step 3.7 (`step3p7`): the text model under `text_config`, its sliding layer 1 under
/// `model.language_model.layers`.
#[test]
fn step3p7_sliding() {
    checkpoint_case("step3p7");
}

/// What the Step 3.5 configs give each layer, the legacy head keys, and the settings not
/// read as errors naming their keys.
#[test]
fn step3p5_layers_read_as_configured() {
    let case = hf_fixture::load("step3p5_full");
    let checkpoint = Checkpoint::open(&case.dir).unwrap();
    let heads: Vec<usize> = (0..3)
        .map(|i| checkpoint.config(i).unwrap().n_heads)
        .collect();
    assert_eq!(heads, [4, 6, 4]);
    let full = checkpoint.config(2).unwrap();
    let per_head = mha::GateConfig {
        span: mha::GateSpan::PerHead,
        activation: mha::GateActivation::Sigmoid,
        tensor: mha::GateTensor::Own,
    };
    assert_eq!(full.output_gate, Some(per_head));
    assert_eq!(full.scale, (1.0 / 10f64.sqrt()) as f32);
    assert_eq!(full.qk_norm.unwrap().weight_offset, 1.0);
    let rotary = |c: &mha::AttentionConfig| c.rope.map(|r| (r.rotary_dim, r.theta));
    assert_eq!(rotary(&full), Some((4, 10_000.0)));
    assert_eq!(rotary(&checkpoint.config(1).unwrap()), Some((8, 1000.0)));
    let config = case.config_json();
    // Without per_layer_config: num_sliding_attention_heads, else the legacy
    // attention_other_setting, on the sliding layers.
    let start = config.find("\"per_layer_config\"").unwrap();
    let end = start + config[start..].find("},\n").unwrap() + 3;
    let unmapped = format!("{}{}", &config[..start], &config[end..]);
    let at = |text: &str, layer| mha::AttentionConfig::from_json(text, layer).unwrap();
    assert_eq!((at(&unmapped, 1).n_heads, at(&unmapped, 2).n_heads), (6, 4));
    let legacy = unmapped.replace(
        "\"num_sliding_attention_heads\": 6",
        "\"attention_other_setting\": {\"num_attention_heads\": 2}",
    );
    assert_eq!(at(&legacy, 1).n_heads, 2);
    let without = config.replace("\"query_pre_attn_scalar\": 10,", "");
    assert_eq!(at(&without, 2).scale, 1.0 / 8f32.sqrt());
    let err = |text: &str| {
        mha::AttentionConfig::from_json(text, 1)
            .unwrap_err()
            .to_string()
    };
    let per_element = config.replace("\"num_sliding", "\"gating\": false, \"num_sliding");
    assert!(err(&per_element).starts_with("config.json: \"gating\" = false is not supported"));
    let start = config.find("\"rope_parameters\"").unwrap();
    let end = start + config[start..].find("\n  },\n").unwrap() + 5;
    let flat = format!(
        "{}\"rope_parameters\": {{\"rope_type\": \"default\", \"rope_theta\": 10000.0}},\n  \"rope_theta\": [1.0, 2.0, 3.0],{}",
        &config[..start],
        &config[end..]
    );
    assert!(
        err(&flat).starts_with("config.json: \"rope_parameters\" = "),
        "{}",
        err(&flat)
    );
    let other = config.replace("\"num_attention_heads\": 6", "\"head_dim\": 6");
    assert!(err(&other).contains("Step 3.5's per-layer setting read is num_attention_heads"));
}
