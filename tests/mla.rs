//! Multi-head latent attention (issue 34) against `transformers`' own `DeepseekV3Attention`:
//! `tests/fixtures/mla/deepseek_v3/` and `deepseek_v3_q_proj/`, written by `dev/hf_fixtures/generate.py` (float64; its
//! numpy reference, the naive expansion, agrees with transformers' float64 run to 1e-12).
//!
//! The prefill is within 1e-4 + 1e-4·|want| of the reference; decoding token by token (and in
//! chunks) through the latent cache equals the prefill bit for bit, on 1 and 3 threads alike and
//! in every cache format; the cache holds `2 (p + r)` values per token (the latent row as key
//! and as value, the first step of the module doc).

use std::path::PathBuf;

use mha::safetensors::{Dtype, SafeTensors};
#[cfg(feature = "std")]
use mha::{Checkpoint, LoadError};
use mha::{
    ConfigError, KvFormat, MlaConfig, MlaLayer, MlaShape, MlaWeights, Output, Rope, RopeLayout,
    RopeScaling, ShapeError, Tokens,
};

/// The case's `config.json` values (generate.py's `MLA_CASES[0]`).
const SHAPE: MlaShape = MlaShape {
    d_model: 64,
    n_heads: 4,
    q_lora_rank: Some(24),
    kv_lora_rank: 24,
    qk_nope_head_dim: 16,
    qk_rope_head_dim: 8,
    v_head_dim: 12,
};
const PREFIX: &str = "model.layers.0.self_attn.";

/// YaRN as `rope_parameters` gives it: factor 4 over 256 positions, mscale 1, mscale_all_dim 0.8.
fn rope() -> Rope {
    Rope {
        theta: 10_000.0,
        rotary_dim: 8,
        layout: RopeLayout::Interleaved,
        scaling: RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 256.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: RopeScaling::yarn_attention_factor(4.0, Some(1.0), Some(0.8)),
            truncate: true,
        },
    }
}

struct Fixture {
    tensors: Vec<(String, Vec<f32>)>,
    x: Vec<f32>,
    expected: Vec<f64>,
    batch: usize,
    len: usize,
    scale: f64,
}

impl Fixture {
    fn load() -> Fixture {
        Fixture::of("deepseek_v3")
    }

    fn of(case: &str) -> Fixture {
        let dir = case_dir(case);
        let model = std::fs::read(dir.join("model.safetensors")).unwrap();
        let st = SafeTensors::parse(&model).unwrap();
        let tensors = st
            .names()
            .map(|name| (name.to_owned(), st.tensor_f32(name).unwrap().1))
            .collect();
        let io = std::fs::read(dir.join("io.safetensors")).unwrap();
        let io = SafeTensors::parse(&io).unwrap();
        let meta = |key: &str| io.metadata()[key].clone();
        let (batch, len) = (
            meta("batch").parse().unwrap(),
            meta("seq_len").parse().unwrap(),
        );
        let expected = io.tensor("expected").unwrap();
        assert_eq!(expected.dtype(), Dtype::F64);
        let hidden = meta("hidden_size").parse().unwrap();
        assert_eq!(expected.shape(), [batch, len, hidden]);
        let expected = expected.data().as_chunks::<8>().0;
        Fixture {
            tensors,
            x: io.tensor_f32("x").unwrap().1,
            expected: expected.iter().map(|&b| f64::from_le_bytes(b)).collect(),
            batch,
            len,
            scale: meta("scale").parse().unwrap(),
        }
    }

    fn get(&self, name: &str) -> &[f32] {
        let full = format!("{PREFIX}{name}.weight");
        let found = self.tensors.iter().find(|(n, _)| *n == full);
        &found.unwrap_or_else(|| panic!("{full} missing")).1
    }

    fn weights(&self) -> MlaWeights<'_> {
        MlaWeights {
            shape: SHAPE,
            q_a: Some((self.get("q_a_proj"), self.get("q_a_layernorm"))),
            q_b: self.get("q_b_proj"),
            kv_a: self.get("kv_a_proj_with_mqa"),
            kv_a_norm: self.get("kv_a_layernorm"),
            kv_b: self.get("kv_b_proj"),
            o: self.get("o_proj"),
        }
    }

    /// The layer as the case's `config.json` describes it.
    fn layer(&self, threads: usize, format: KvFormat) -> MlaLayer {
        config()
            .builder(self.weights())
            .threads(threads)
            .kv_format(format)
            .build()
            .unwrap()
    }
}

fn case_dir(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mla")
        .join(case)
}

fn config_text() -> String {
    std::fs::read_to_string(case_dir("deepseek_v3").join("config.json")).unwrap()
}

/// Within 1e-4 + 1e-4·|want| of the reference.
fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&got, &want)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(got) - want).abs();
        assert!(
            err <= 1e-4 + 1e-4 * want.abs(),
            "{what} {i}: {got} vs {want}"
        );
    }
}

fn config() -> MlaConfig {
    MlaConfig::from_json(&config_text()).unwrap()
}

#[test]
fn config_json_reads_as_written() {
    let config = config();
    assert_eq!(
        (config.model_type, config.num_hidden_layers),
        ("deepseek_v3", 1)
    );
    assert_eq!(config.shape, SHAPE);
    assert_eq!(config.rope, rope());
    assert_eq!(config.scale, SHAPE.softmax_scale(Some((4.0, 0.8))));
    assert_eq!(config.eps, 1e-6);
    let kimi = config_text().replace("deepseek_v3", "kimi_k2");
    assert_eq!(MlaConfig::from_json(&kimi).unwrap().shape, SHAPE);
    let rotate_half =
        config_text().replace("\"rope_interleave\": true", "\"rope_interleave\": false");
    assert_eq!(
        MlaConfig::from_json(&rotate_half).unwrap().rope.layout,
        RopeLayout::RotateHalf
    );
    let llama = config_text().replace("deepseek_v3", "llama");
    let err = MlaConfig::from_json(&llama).unwrap_err();
    assert!(matches!(err, ConfigError::UnknownModelType { .. }), "{err}");
    let odd = config_text().replace("\"qk_rope_head_dim\": 8", "\"qk_rope_head_dim\": 7");
    let err = MlaConfig::from_json(&odd).unwrap_err();
    assert!(err.to_string().contains("qk_rope_head_dim"), "{err}");
    let missing = config_text().replace("\"kv_lora_rank\"", "\"kv_rank\"");
    let err = MlaConfig::from_json(&missing).unwrap_err();
    assert!(err.to_string().contains("kv_lora_rank"), "{err}");
}

#[cfg(feature = "std")]
#[test]
fn the_checkpoint_loads_as_an_mla_model() {
    let f = Fixture::load();
    let checkpoint = Checkpoint::open(case_dir("deepseek_v3")).unwrap();
    assert_eq!(checkpoint.num_layers(), 1);
    assert_eq!(checkpoint.mla_config(), Some(&config()));
    let mut loaded = checkpoint.mla_layer(0, |b| b.threads(3)).unwrap();
    assert_eq!(loaded.threads(), 3);
    let x = Tokens::new(&f.x, f.batch, f.len, SHAPE.d_model).unwrap();
    assert_eq!(
        loaded.forward(x).unwrap(),
        f.layer(1, KvFormat::F32).forward(x).unwrap()
    );
    let err = checkpoint.mla_layer(1, |b| b).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::Config {
                error: ConfigError::LayerOutOfRange {
                    layer: 1,
                    layers: 1,
                    ..
                },
                ..
            }
        ),
        "{err}"
    );
    let err = checkpoint.layer(0).unwrap_err();
    assert!(err.to_string().contains("mla_layer"), "{err}");
}

/// DeepSeek-V2-Lite's layout: one `q_proj`, rotate-half pairs, YaRN without `mscale_all_dim`,
/// an `rms_norm_eps` the latent norms ignore; loaded from its checkpoint directory.
#[cfg(feature = "std")]
#[test]
fn a_layer_without_query_lora_matches_transformers_float64() {
    let f = Fixture::of("deepseek_v3_q_proj");
    let checkpoint = Checkpoint::open(case_dir("deepseek_v3_q_proj")).unwrap();
    let config = checkpoint.mla_config().unwrap().clone();
    assert_eq!(
        (config.shape.q_lora_rank, config.rope.layout),
        (None, RopeLayout::RotateHalf)
    );
    assert_eq!((config.scale, config.eps), (0.25, 1e-6));
    let d = config.shape.d_model;
    let x = Tokens::new(&f.x, f.batch, f.len, d).unwrap();
    let mut prefill = None;
    for threads in [1, 3] {
        let mut layer = checkpoint.mla_layer(0, |b| b.threads(threads)).unwrap();
        let y = layer.forward(x).unwrap();
        assert_close(&y, &f.expected, "deepseek_v3_q_proj");
        let mut cache = layer.new_cache(f.batch, f.len).unwrap();
        let mut decoded = vec![0.0; y.len()];
        for t in 0..f.len {
            let token: Vec<f32> = (0..f.batch)
                .flat_map(|b| f.x[(b * f.len + t) * d..][..d].to_vec())
                .collect();
            let mut out = vec![0.0; f.batch * d];
            let tokens = Tokens::new(&token, f.batch, 1, d).unwrap();
            let output = Output::new(&mut out, f.batch, 1, d).unwrap();
            layer.decode_into(tokens, &mut cache, output).unwrap();
            for b in 0..f.batch {
                decoded[(b * f.len + t) * d..][..d].copy_from_slice(&out[b * d..][..d]);
            }
        }
        assert_eq!(decoded, y, "{threads} threads");
        assert_eq!(prefill.get_or_insert(y), &decoded, "{threads} threads");
    }
}

/// Decodes the fixture's sequences in steps of `step` tokens.
fn decode(layer: &mut MlaLayer, f: &Fixture, step: usize) -> Vec<f32> {
    let d = SHAPE.d_model;
    let mut cache = layer.new_cache(f.batch, f.len).unwrap();
    let mut y = vec![0.0; f.x.len()];
    for t0 in (0..f.len).step_by(step) {
        let n = step.min(f.len - t0);
        let mut x = Vec::new();
        for b in 0..f.batch {
            x.extend_from_slice(&f.x[(b * f.len + t0) * d..][..n * d]);
        }
        let mut out = vec![0.0; f.batch * n * d];
        let tokens = Tokens::new(&x, f.batch, n, d).unwrap();
        let output = Output::new(&mut out, f.batch, n, d).unwrap();
        layer.decode_into(tokens, &mut cache, output).unwrap();
        for b in 0..f.batch {
            y[(b * f.len + t0) * d..][..n * d].copy_from_slice(&out[b * n * d..][..n * d]);
        }
    }
    assert_eq!(cache.len(), f.len);
    y
}

#[test]
fn prefill_matches_transformers_float64() {
    let f = Fixture::load();
    assert!((f64::from(SHAPE.softmax_scale(Some((4.0, 0.8)))) - f.scale).abs() < 1e-7 * f.scale);
    for threads in [1, 3] {
        let mut layer = f.layer(threads, KvFormat::F32);
        let y = layer
            .forward(Tokens::new(&f.x, f.batch, f.len, SHAPE.d_model).unwrap())
            .unwrap();
        assert_close(&y, &f.expected, "deepseek_v3");
    }
}

#[test]
fn decode_equals_prefill_bit_for_bit_on_any_thread_count() {
    let f = Fixture::load();
    let x = Tokens::new(&f.x, f.batch, f.len, SHAPE.d_model).unwrap();
    let prefill = f.layer(1, KvFormat::F32).forward(x).unwrap();
    for threads in [1, 3] {
        let mut layer = f.layer(threads, KvFormat::F32);
        assert_eq!(layer.forward(x).unwrap(), prefill, "{threads} threads");
        for step in [1, 3] {
            assert_eq!(
                decode(&mut layer, &f, step),
                prefill,
                "{threads} threads, steps of {step}"
            );
        }
    }
}

#[test]
fn every_cache_format_decodes_as_its_prefill() {
    let f = Fixture::load();
    let x = Tokens::new(&f.x, f.batch, f.len, SHAPE.d_model).unwrap();
    for format in [KvFormat::Bf16, KvFormat::F16, KvFormat::Q8_0] {
        let mut layer = f.layer(2, format);
        assert_eq!(layer.kv_format(), format);
        let prefill = layer.forward(x).unwrap();
        assert_eq!(decode(&mut layer, &f, 1), prefill, "{format:?}");
        let worst = prefill
            .iter()
            .zip(&f.expected)
            .map(|(&got, &want)| (f64::from(got) - want).abs())
            .fold(0.0, f64::max);
        assert!(worst < 0.05, "{format:?}: {worst}");
    }
}

#[test]
fn the_cache_holds_the_latent_row_as_key_and_value() {
    let f = Fixture::load();
    let width = SHAPE.latent_width();
    assert_eq!(width, 32);
    // Whole 96-token key blocks and rows of whole kernel panels: the bytes are exact.
    for (format, bytes) in [(KvFormat::F32, 4), (KvFormat::Bf16, 2), (KvFormat::F16, 2)] {
        let cache = f.layer(1, format).new_cache(1, 96).unwrap();
        assert_eq!(cache.bytes(), 96 * 2 * width * bytes, "{format:?}");
    }
}

#[test]
fn bad_weights_and_caches_are_errors() {
    let f = Fixture::load();
    let mut weights = f.weights();
    weights.kv_b = &weights.kv_b[1..];
    let err = MlaLayer::builder(weights, rope()).build().unwrap_err();
    assert_eq!(
        err.to_string(),
        ShapeError::LengthMismatch {
            what: "kv_b_proj (H (n + v), r)",
            expected: 4 * 28 * 24,
            actual: 4 * 28 * 24 - 1,
        }
        .to_string()
    );
    let wrong_rope = Rope {
        rotary_dim: 6,
        ..rope()
    };
    let err = MlaLayer::builder(f.weights(), wrong_rope)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            ShapeError::RotaryDim {
                rotary_dim: 6,
                head_dim: 8
            }
        ),
        "{err}"
    );
    let mut layer = f.layer(1, KvFormat::F32);
    let mut other = f.layer(1, KvFormat::Bf16).new_cache(1, 4).unwrap();
    let x = vec![0.0; SHAPE.d_model];
    let mut out = vec![0.0; SHAPE.d_model];
    let tokens = Tokens::new(&x, 1, 1, SHAPE.d_model).unwrap();
    let output = Output::new(&mut out, 1, 1, SHAPE.d_model).unwrap();
    let err = layer.decode_into(tokens, &mut other, output).unwrap_err();
    assert!(matches!(err, ShapeError::CacheMismatch), "{err}");
    let mut full = layer.new_cache(1, 0).unwrap();
    let output = Output::new(&mut out, 1, 1, SHAPE.d_model).unwrap();
    let err = layer.decode_into(tokens, &mut full, output).unwrap_err();
    assert!(matches!(err, ShapeError::CacheFull { .. }), "{err}");
}

/// Weights of the right lengths for `shape`, every value `0.1`: `q_a_proj`, `q_a_layernorm`,
/// `q_b_proj` (or `q_proj`), `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`.
fn filled(shape: MlaShape) -> [Vec<f32>; 7] {
    let (d, h, r, p) = (
        shape.d_model,
        shape.n_heads,
        shape.kv_lora_rank,
        shape.qk_rope_head_dim,
    );
    let (n, v, q) = (
        shape.qk_nope_head_dim,
        shape.v_head_dim,
        shape.q_lora_rank.unwrap_or(d),
    );
    [
        q * d,
        q,
        h * (n + p) * q,
        (r + p) * d,
        r,
        h * (n + v) * r,
        d * h * v,
    ]
    .map(|len| vec![0.1; len])
}

#[test]
fn degenerate_widths_run_or_fail_without_panicking() {
    let base = SHAPE;
    let shapes = [
        MlaShape { d_model: 0, ..base },
        MlaShape {
            kv_lora_rank: 0,
            ..base
        },
        MlaShape {
            qk_nope_head_dim: 0,
            ..base
        },
        MlaShape {
            v_head_dim: 0,
            ..base
        },
        MlaShape {
            qk_rope_head_dim: 0,
            ..base
        },
        MlaShape {
            q_lora_rank: Some(0),
            ..base
        },
        MlaShape {
            q_lora_rank: None,
            ..base
        },
    ];
    for shape in shapes {
        let w = filled(shape);
        let weights = MlaWeights {
            shape,
            q_a: shape.q_lora_rank.map(|_| (&w[0][..], &w[1][..])),
            q_b: &w[2],
            kv_a: &w[3],
            kv_a_norm: &w[4],
            kv_b: &w[5],
            o: &w[6],
        };
        let rope = Rope {
            rotary_dim: shape.qk_rope_head_dim,
            ..rope()
        };
        let mut layer = MlaLayer::builder(weights, rope).threads(2).build().unwrap();
        let d = shape.d_model;
        let x = vec![0.5; 2 * 3 * d];
        let y = layer.forward(Tokens::new(&x, 2, 3, d).unwrap()).unwrap();
        assert!(y.iter().all(|v| v.is_finite()), "{shape:?}");
        let mut cache = layer.new_cache(2, 3).unwrap();
        let mut out = vec![0.0; 2 * 3 * d];
        let output = Output::new(&mut out, 2, 3, d).unwrap();
        layer
            .decode_into(Tokens::new(&x, 2, 3, d).unwrap(), &mut cache, output)
            .unwrap();
        assert_eq!(out, y, "{shape:?}");
        for (batch, len) in [(2, 0), (0, 3)] {
            let empty = layer
                .forward(Tokens::new(&[], batch, len, d).unwrap())
                .unwrap();
            assert!(empty.is_empty(), "{shape:?}");
        }
    }
    let f = Fixture::load();
    let huge = MlaShape {
        v_head_dim: usize::MAX / 2,
        ..base
    };
    let weights = MlaWeights {
        shape: huge,
        ..f.weights()
    };
    let err = MlaLayer::builder(weights, rope()).build().unwrap_err();
    assert_eq!(err, ShapeError::TooLarge);
    let json = config_text().replace(
        "\"v_head_dim\": 12",
        &format!("\"v_head_dim\": {}", usize::MAX / 2),
    );
    let err = MlaConfig::from_json(&json).unwrap_err();
    assert!(err.to_string().contains("v_head_dim"), "{err}");
}
