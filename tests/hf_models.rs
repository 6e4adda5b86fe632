//! Layers loaded from Hugging Face checkpoints and their `config.json` (issue 12's families:
//! Llama with each rope scaling and explicit positions, Mistral, Qwen2 with biases and YaRN,
//! Qwen3 with per-head QK-norm and a query width ≠ D, Phi-3 with a fused projection and partial
//! rotary, GPT-NeoX with its per-head interleaved fused projection, OLMo 2 with whole-row
//! QK-norm; GPT-J's interleaved rotary, built by hand since its config is not read) and issue
//! 13's (sliding windows of Mistral, Qwen2's layers from `max_window_layers`, Gemma 2 with soft
//! cap and `query_pre_attn_scalar` on its local and global layers, Gemma 3 with `(1 + w)`
//! QK-norm and a local rotary base, BLOOM's ALiBi for 6 and 4 heads, gpt-oss's sinks, biases
//! and YaRN on its sliding and full layers) against the float64 outputs of the `transformers`
//! modules (`tests/fixtures/hf`, written by `dev/hf_fixtures/generate.py` and checked there
//! against a plain float64 implementation).
//!
//! Per case, on every supported instruction set at 1 and 2 threads: the forward pass within
//! 1e-4 + 1e-4·|want| of the reference; decoding token by token equals the forward bit for bit
//! (positions continuing from the cache, or the case's explicit ones; a windowed layer through a
//! rolling cache of one token per call, decoded past twice its window); and a batch whose
//! sequences hold different numbers of tokens (the second sequence prefilled 3 tokens short,
//! then given its last 3 while the first adds nothing) gives each sequence's forward rows bit
//! for bit.

mod common;
#[path = "common/hf_fixture.rs"]
mod hf_fixture;

use common::assert_bits_eq;
use common::assert_close;
use common::modes::{configs, ABS, REL};
use hf_fixture::HfCase;
use mha::safetensors::{LayerWeights, SafeTensors};
use mha::{
    AttendOptions, AttentionConfig, Isa, KvCache, Mha, MhaBiases, MhaParams, Output, Tokens,
};
use mha::{Rope, RopeLayout, RopeScaling};

/// Rotary table length: longer than every case's positions.
const CAPACITY: usize = 64;

/// A layer of case `case` read through `config.json` and the checkpoint layout of its family.
fn from_checkpoint<const D: usize, const KV: usize, const Q: usize>(
    case: &HfCase,
    isa: Isa,
    threads: usize,
) -> Mha<D, D, KV, Q> {
    let config = AttentionConfig::from_json(&case.config_json(), case.layer_index).unwrap();
    assert_eq!(format!("{}.", config.tensor_prefix()), case.layer_prefix);
    assert_eq!(
        config.sliding_window, case.sliding_window,
        "{}: window",
        case.name
    );
    assert_eq!(
        config.softcap,
        case.softcap.map(|c| c as f32),
        "{}: cap",
        case.name
    );
    assert_eq!(config.scale, case.scale as f32, "{}: scale", case.name);
    assert_eq!(config.sinks, case.sinks, "{}: sinks", case.name);
    let bytes = case.model_bytes();
    let st = SafeTensors::parse(&bytes).unwrap();
    let weights = LayerWeights::from_safetensors(&st, &config.tensor_prefix(), &config).unwrap();
    let (params, biases, heads) = weights.into_params::<D, KV, Q>().unwrap();
    let layer = config
        .builder(&params, biases, heads, CAPACITY)
        .isa(isa)
        .threads(threads)
        .min_work_per_thread(0)
        .build()
        .unwrap();
    let slopes = case.alibi_slopes.as_ref();
    let want: Option<Vec<f32>> = slopes.map(|s| s.iter().map(|&x| x as f32).collect());
    assert_eq!(
        layer.alibi_slopes(),
        want.as_deref(),
        "{}: slopes",
        case.name
    );
    layer
}

/// Runs every check of the module on one case.
fn check_case<const D: usize, const KV: usize, const Q: usize>(
    name: &str,
    layer: impl Fn(&HfCase, Isa, usize) -> Mha<D, D, KV, Q>,
) {
    let case = hf_fixture::load(name);
    assert_eq!(case.hidden, D, "{name}: D");
    for (isa, threads) in configs() {
        let context = format!("{name}, {isa:?}, {threads} threads");
        let mut layer = layer(&case, isa, threads);
        let forward = forward(&mut layer, &case, &case.x, None);
        assert_close(&forward, &case.expected, ABS, REL, &context);
        let decoded = token_by_token(&mut layer, &case);
        assert_bits_eq(&decoded, &forward, &format!("{context}, decoded"));
        if case.default_positions {
            let ragged = ragged(&mut layer, &case);
            assert_bits_eq(&ragged, &forward, &format!("{context}, ragged batch"));
        }
    }
}

/// The layer's output for `x (B, T, D)`, with the case's positions unless they are the default.
fn forward<const D: usize, const KV: usize, const Q: usize>(
    layer: &mut Mha<D, D, KV, Q>,
    case: &HfCase,
    x: &[f32],
    token_lengths: Option<&[usize]>,
) -> Vec<f32> {
    let positions = case.positions_usize();
    let options = AttendOptions {
        positions: (!case.default_positions).then_some(&positions[..]),
        token_lengths,
        ..AttendOptions::default()
    };
    let (b, t) = (case.batch, case.seq_len);
    let mut out = vec![0.0; b * t * D];
    let input = Tokens::new(x, b, t, D).unwrap();
    layer
        .forward_into(input, options, Output::new(&mut out, b, t, D).unwrap())
        .unwrap();
    out
}

/// The case's tokens decoded one at a time through a cache, as `(B, T, D)`.
fn token_by_token<const D: usize, const KV: usize, const Q: usize>(
    layer: &mut Mha<D, D, KV, Q>,
    case: &HfCase,
) -> Vec<f32> {
    let (b, t) = (case.batch, case.seq_len);
    let positions = case.positions_usize();
    // A windowed layer's cache rolls: one token per call, slots for the window and that token.
    let window = layer.sliding_window();
    if let Some(window) = window {
        assert!(t > 2 * window, "{}: T = {t}, window {window}", case.name);
    }
    let mut cache = layer.new_cache(b, window.map_or(t, |_| 1)).unwrap();
    let mut out = vec![0.0; b * t * D];
    for step in 0..t {
        let x: Vec<f32> = (0..b)
            .flat_map(|s| case.x[(s * t + step) * D..][..D].to_vec())
            .collect();
        let step_positions: Vec<usize> = (0..b).map(|s| positions[s * t + step]).collect();
        let options = AttendOptions {
            positions: (!case.default_positions).then_some(&step_positions[..]),
            ..AttendOptions::default()
        };
        let mut y = vec![0.0; b * D];
        let input = Tokens::new(&x, b, 1, D).unwrap();
        layer
            .decode_into(
                input,
                &mut cache,
                options,
                Output::new(&mut y, b, 1, D).unwrap(),
            )
            .unwrap();
        for s in 0..b {
            out[(s * t + step) * D..][..D].copy_from_slice(&y[s * D..][..D]);
        }
    }
    out
}

/// Sequence 1 prefilled 3 tokens short beside the others' whole prompts, then given its last 3
/// alone (the others adding none), through one cache; the rows in `(B, T, D)` order.
fn ragged<const D: usize, const KV: usize, const Q: usize>(
    layer: &mut Mha<D, D, KV, Q>,
    case: &HfCase,
) -> Vec<f32> {
    let (b, t) = (case.batch, case.seq_len);
    let mut cache: KvCache = layer.new_cache(b, t).unwrap();
    let mut first: Vec<usize> = vec![t; b];
    first[1] = t - 3;
    let mut out = vec![0.0; b * t * D];
    let call =
        |layer: &mut Mha<D, D, KV, Q>, cache: &mut KvCache, x: &[f32], len, real: &[usize]| {
            let options = AttendOptions {
                token_lengths: Some(real),
                ..AttendOptions::default()
            };
            let mut y = vec![0.0; b * len * D];
            let input = Tokens::new(x, b, len, D).unwrap();
            layer
                .decode_into(
                    input,
                    cache,
                    options,
                    Output::new(&mut y, b, len, D).unwrap(),
                )
                .unwrap();
            y
        };
    let y = call(layer, &mut cache, &case.x, t, &first);
    out.copy_from_slice(&y);
    // The last 3 tokens of sequence 1, at the front of its rows; the others' rows are padding.
    let mut x = vec![0.0; b * 3 * D];
    x[3 * D..6 * D].copy_from_slice(&case.x[(t + t - 3) * D..2 * t * D]);
    let mut second = vec![0; b];
    second[1] = 3;
    let y = call(layer, &mut cache, &x, 3, &second);
    out[(t + t - 3) * D..2 * t * D].copy_from_slice(&y[3 * D..6 * D]);
    assert_eq!(cache.lengths(), vec![t; b]);
    out
}

macro_rules! checkpoint_cases {
    ($($test:ident: $name:literal, D $d:literal, KV $kv:literal, Q $q:literal;)*) => {$(
        #[test]
        fn $test() {
            check_case::<$d, $kv, $q>($name, from_checkpoint::<$d, $kv, $q>);
        }
    )*};
}

checkpoint_cases! {
    llama_gqa: "llama_gqa", D 36, KV 12, Q 36;
    llama_linear: "llama_linear", D 30, KV 10, Q 30;
    llama_llama3: "llama_llama3", D 30, KV 30, Q 30;
    llama_yarn: "llama_yarn", D 30, KV 10, Q 30;
    llama_positions: "llama_positions", D 36, KV 18, Q 36;
    mistral: "mistral", D 60, KV 30, Q 60;
    qwen2_bias: "qwen2_bias", D 42, KV 14, Q 42;
    qwen2_yarn: "qwen2_yarn", D 60, KV 20, Q 60;
    qwen3_qknorm: "qwen3_qknorm", D 44, KV 20, Q 60;
    phi3_partial: "phi3_partial", D 36, KV 12, Q 36;
    gpt_neox: "gpt_neox", D 72, KV 72, Q 72;
    olmo2_qknorm: "olmo2_qknorm", D 36, KV 12, Q 36;
    mistral_window: "mistral_window", D 36, KV 12, Q 36;
    qwen2_window_full: "qwen2_window_full", D 30, KV 10, Q 30;
    qwen2_window_sliding: "qwen2_window_sliding", D 30, KV 10, Q 30;
    gemma2_local: "gemma2_local", D 42, KV 20, Q 60;
    gemma2_global: "gemma2_global", D 42, KV 20, Q 60;
    gemma3_local: "gemma3_local", D 30, KV 14, Q 42;
    gemma3_global: "gemma3_global", D 30, KV 14, Q 42;
    bloom_alibi6: "bloom_alibi6", D 42, KV 42, Q 42;
    bloom_alibi4: "bloom_alibi4", D 36, KV 36, Q 36;
    gpt_oss_sliding: "gpt_oss_sliding", D 36, KV 20, Q 60;
    gpt_oss_full: "gpt_oss_full", D 36, KV 20, Q 60;
}

/// GPT-J (interleaved rotary of the first 6 of 10 features, theta 10,000 as its code fixes it,
/// no biases): its `config.json` is not one the crate reads, so the layer is built by hand from
/// the checkpoint's tensors.
#[test]
fn gptj_interleaved() {
    const D: usize = 30;
    check_case::<D, D, D>("gptj_interleaved", |case, isa, threads| {
        let bytes = case.model_bytes();
        let st = SafeTensors::parse(&bytes).unwrap();
        let w = |name: &str| {
            st.matrix_transposed::<D, D>(&format!("{}{name}.weight", case.layer_prefix))
                .unwrap()
        };
        let params: MhaParams<D> =
            MhaParams::new(w("q_proj"), w("k_proj"), w("v_proj"), w("out_proj"));
        let rope = Rope {
            theta: 10_000.0,
            rotary_dim: 6,
            layout: RopeLayout::Interleaved,
            scaling: RopeScaling::Default,
        };
        Mha::builder(&params, 3)
            .biases(MhaBiases::default())
            .rope(rope, CAPACITY)
            .isa(isa)
            .threads(threads)
            .min_work_per_thread(0)
            .build()
            .unwrap()
    });
}
