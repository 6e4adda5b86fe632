//! Multi-head latent attention (issue 34) against `transformers`' own `DeepseekV3Attention`,
//! `Mistral4Attention` and `LongcatFlashMLA`: `tests/fixtures/mla/deepseek_v3/`,
//! `deepseek_v3_q_proj/`, `mistral4/` and `longcat_flash/`, written by
//! `dev/hf_fixtures/generate.py` (float64; its numpy reference, the naive expansion, agrees with
//! transformers' float64 run to 1e-12); the query scale also against a float64 naive expansion
//! here, on odd widths over 200 tokens.
//!
//! The prefill is within 1e-4 + 1e-4·|want| of the reference; decoding token by token (and in
//! chunks) through the latent cache equals the prefill bit for bit, on 1 and 3 threads alike and
//! in every cache format, over one block and (random weights, 200 tokens) across 96-token
//! blocks, through a `KvCache` and through a paged cache in batches of changing composition
//! and forks; the cache holds each latent row once, `p + r` elements per token in its format
//! (and `q8_0`'s scales); a cache of another layout (a `Layer`'s, or another split of the same
//! width) is an error.

use std::path::PathBuf;

use mha::safetensors::{Dtype, SafeTensors};
use mha::{
    AttendOptions, ConfigError, KvFormat, Matrix, Mha, MhaParams, MlaConfig, MlaLayer, MlaShape,
    MlaWeights, Output, Rope, RopeLayout, RopeScaling, ShapeError, Tokens,
};
#[cfg(feature = "std")]
use mha::{Checkpoint, LoadError};

/// Every cache format.
const FORMATS: [KvFormat; 4] = [KvFormat::F32, KvFormat::Bf16, KvFormat::F16, KvFormat::Q8_0];

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
    decode_with(layer, f, step, SHAPE.d_model)
}

/// Decodes the sequences of `f.x` (`d` wide) in steps of `step` tokens through a `KvCache`.
fn decode_with(layer: &mut MlaLayer, f: &Fixture, step: usize, d: usize) -> Vec<f32> {
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

/// The bytes one token's latent row of `width` takes in `format`: `width` elements, and in
/// `q8_0` a 4-byte scale per 32.
fn row_bytes(format: KvFormat, width: usize) -> usize {
    match format {
        KvFormat::F32 => 4 * width,
        KvFormat::Bf16 | KvFormat::F16 => 2 * width,
        KvFormat::Q8_0 => width + 4 * width.div_ceil(32),
    }
}

#[test]
fn the_cache_holds_each_latent_row_once() {
    let f = Fixture::load();
    let width = SHAPE.latent_width();
    assert_eq!(width, 32);
    // Whole 96-token key blocks: the bytes are exact.
    for format in FORMATS {
        let layer = f.layer(1, format);
        let per_token = row_bytes(format, width);
        let cache = layer.new_cache(1, 96).unwrap();
        assert_eq!(cache.bytes(), 96 * per_token, "{format:?}");
        let cache = layer.new_cache(3, 192).unwrap();
        assert_eq!(cache.bytes(), 3 * 192 * per_token, "{format:?}");
        let paged = layer.new_paged_cache(5).unwrap();
        assert_eq!(paged.bytes(), 5 * 96 * per_token, "{format:?} paged");
        assert_eq!((paged.key_format(), paged.value_format()), (format, format));
    }
}

/// A shape whose latent (`r` = 40) is not a whole number of kernel panels and whose 6 heads
/// are more than one `gemv` call takes.
const LONG: MlaShape = MlaShape {
    d_model: 32,
    n_heads: 6,
    q_lora_rank: Some(16),
    kv_lora_rank: 40,
    qk_nope_head_dim: 8,
    qk_rope_head_dim: 8,
    v_head_dim: 8,
};

/// `filled`'s weights with pseudo-random values in `[-0.25, 0.25)` (norm weights around 1).
fn varied(shape: MlaShape) -> [Vec<f32>; 7] {
    let mut state = 0x2545_f491_u32;
    let mut next = move || {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (state >> 8) as f32 / (1u32 << 24) as f32 * 0.5 - 0.25
    };
    let mut weights = filled(shape);
    for (i, w) in weights.iter_mut().enumerate() {
        let norm = i == 1 || i == 4;
        w.iter_mut()
            .for_each(|v| *v = if norm { 1.0 + next() } else { next() });
    }
    weights
}

fn long_layer(w: &[Vec<f32>; 7], threads: usize, format: KvFormat) -> MlaLayer {
    long_layer_with(w, threads, format, None)
}

/// [`LONG`]'s layer over `w`, default rope, with the query scale `scale` if any.
fn long_layer_with(
    w: &[Vec<f32>; 7],
    threads: usize,
    format: KvFormat,
    scale: Option<mha::QueryScale>,
) -> MlaLayer {
    let weights = MlaWeights {
        shape: LONG,
        q_a: Some((&w[0], &w[1])),
        q_b: &w[2],
        kv_a: &w[3],
        kv_a_norm: &w[4],
        kv_b: &w[5],
        o: &w[6],
    };
    let rope = Rope {
        theta: 10_000.0,
        rotary_dim: 8,
        layout: RopeLayout::Interleaved,
        scaling: RopeScaling::Default,
    };
    let layer = MlaLayer::builder(weights, rope).threads(threads);
    let layer = match scale {
        Some(scale) => layer.query_scale(scale),
        None => layer,
    };
    layer.kv_format(format).build().unwrap()
}

/// Two sequences of 200 tokens, `(2, 200, 32)`.
fn long_tokens() -> Vec<f32> {
    (0..2 * 200 * 32)
        .map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * 2.0)
        .collect()
}

#[test]
fn decoding_across_blocks_equals_the_prefill_in_every_format() {
    let (w, x) = (varied(LONG), long_tokens());
    let f = Fixture {
        tensors: Vec::new(),
        x: x.clone(),
        expected: Vec::new(),
        batch: 2,
        len: 200,
        scale: 0.0,
    };
    for format in FORMATS {
        let tokens = Tokens::new(&x, 2, 200, 32).unwrap();
        let prefill = long_layer(&w, 1, format).forward(tokens).unwrap();
        assert!(prefill.iter().all(|v| v.is_finite()), "{format:?}");
        for threads in [1, 3] {
            let mut layer = long_layer(&w, threads, format);
            for step in [1, 7, 96] {
                let what = format!("{format:?}, {threads} threads, steps of {step}");
                assert_eq!(
                    decode_with(&mut layer, &f, step, LONG.d_model),
                    prefill,
                    "{what}"
                );
            }
        }
    }
}

#[test]
fn a_paged_latent_cache_decodes_each_sequence_as_alone() {
    let (w, x) = (varied(LONG), long_tokens());
    let d = LONG.d_model;
    let seq = |b: usize, t: usize, n: usize| &x[(b * 200 + t) * d..][..n * d];
    for format in FORMATS {
        let tokens = Tokens::new(&x, 2, 200, d).unwrap();
        let prefill = long_layer(&w, 1, format).forward(tokens).unwrap();
        let want = |b: usize, t: usize, n: usize| &prefill[(b * 200 + t) * d..][..n * d];
        let mut layer = long_layer(&w, 3, format);
        let mut cache = layer.new_paged_cache(7).unwrap();
        let (a, b) = (cache.add_sequence().unwrap(), cache.add_sequence().unwrap());
        // Both prefill 100 tokens in one call, then `b` alone and the two in either order.
        let mut out = vec![0.0; 2 * 100 * d];
        let both: Vec<f32> = [seq(0, 0, 100), seq(1, 0, 100)].concat();
        let (xs, ys) = (
            Tokens::new(&both, 2, 100, d).unwrap(),
            Output::new(&mut out, 2, 100, d).unwrap(),
        );
        layer.decode_paged(xs, &mut cache, &[a, b], ys).unwrap();
        assert_eq!(
            out,
            [want(0, 0, 100), want(1, 0, 100)].concat(),
            "{format:?}"
        );
        let mut one = vec![0.0; d];
        for t in 100..110 {
            let (xs, ys) = (
                Tokens::new(seq(1, t, 1), 1, 1, d).unwrap(),
                Output::new(&mut one, 1, 1, d).unwrap(),
            );
            layer.decode_paged(xs, &mut cache, &[b], ys).unwrap();
            assert_eq!(one, want(1, t, 1), "{format:?} b at {t}");
        }
        let fork = cache.fork(a).unwrap();
        for t in 100..200 {
            let (ids, rows) = match t < 110 {
                true => (vec![fork, a], [seq(0, t, 1), seq(0, t, 1)].concat()),
                false => (vec![b, a], [seq(1, t, 1), seq(0, t, 1)].concat()),
            };
            let mut two = vec![0.0; 2 * d];
            let (xs, ys) = (
                Tokens::new(&rows, 2, 1, d).unwrap(),
                Output::new(&mut two, 2, 1, d).unwrap(),
            );
            layer.decode_paged(xs, &mut cache, &ids, ys).unwrap();
            let first = if t < 110 {
                want(0, t, 1)
            } else {
                want(1, t, 1)
            };
            assert_eq!(two, [first, want(0, t, 1)].concat(), "{format:?} at {t}");
        }
        assert_eq!(
            (
                cache.len(a).unwrap(),
                cache.len(b).unwrap(),
                cache.len(fork).unwrap()
            ),
            (200, 200, 110)
        );
    }
}

/// A typed layer of one head of width 32, so one key/value head as wide as [`SHAPE`]'s latent.
fn plain_layer() -> mha::Layer {
    let w = Matrix::<32, 32>::from_fn(|r, c| if r == c { 0.5 } else { 0.01 });
    let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
    Mha::new(&params, 1).unwrap().into_layer()
}

#[test]
fn caches_of_another_layout_are_errors() {
    let f = Fixture::load();
    let mut layer = f.layer(1, KvFormat::F32);
    let mut plain = plain_layer();
    let (x, mut out) = (vec![0.1; SHAPE.d_model], vec![0.0; SHAPE.d_model]);
    let (x32, mut out32) = (vec![0.1; 32], vec![0.0; 32]);
    let tokens = Tokens::new(&x, 1, 1, SHAPE.d_model).unwrap();
    let tokens32 = Tokens::new(&x32, 1, 1, 32).unwrap();
    let mismatch = |err: ShapeError| assert!(matches!(err, ShapeError::CacheMismatch), "{err}");
    // A layer's cache of one head as wide as the latent, and the other way round.
    let mut theirs = plain.new_cache(1, 4).unwrap();
    let output = Output::new(&mut out, 1, 1, SHAPE.d_model).unwrap();
    mismatch(layer.decode_into(tokens, &mut theirs, output).unwrap_err());
    let mut ours = layer.new_cache(1, 4).unwrap();
    let output = Output::new(&mut out32, 1, 1, 32).unwrap();
    let options = AttendOptions::default();
    mismatch(
        plain
            .decode_into(tokens32, &mut ours, options, output)
            .unwrap_err(),
    );
    // Paged ones.
    let mut theirs = plain.new_paged_cache(2).unwrap();
    let id = theirs.add_sequence().unwrap();
    let output = Output::new(&mut out, 1, 1, SHAPE.d_model).unwrap();
    mismatch(
        layer
            .decode_paged(tokens, &mut theirs, &[id], output)
            .unwrap_err(),
    );
    let mut ours = layer.new_paged_cache(2).unwrap();
    let id = ours.add_sequence().unwrap();
    let output = Output::new(&mut out32, 1, 1, 32).unwrap();
    mismatch(
        plain
            .decode_paged(tokens32, &mut ours, &[id], options, output)
            .unwrap_err(),
    );
    // Another split of the same latent width (p 16, r 16), and another format.
    let split = MlaShape {
        qk_rope_head_dim: 16,
        kv_lora_rank: 16,
        ..SHAPE
    };
    let w = filled(split);
    let weights = MlaWeights {
        shape: split,
        q_a: Some((&w[0], &w[1])),
        q_b: &w[2],
        kv_a: &w[3],
        kv_a_norm: &w[4],
        kv_b: &w[5],
        o: &w[6],
    };
    let rope = Rope {
        rotary_dim: 16,
        ..rope()
    };
    let other = MlaLayer::builder(weights, rope).build().unwrap();
    assert_eq!(other.shape().latent_width(), SHAPE.latent_width());
    let mut cache = other.new_cache(1, 4).unwrap();
    let output = Output::new(&mut out, 1, 1, SHAPE.d_model).unwrap();
    mismatch(layer.decode_into(tokens, &mut cache, output).unwrap_err());
    let mut paged = other.new_paged_cache(2).unwrap();
    let id = paged.add_sequence().unwrap();
    let output = Output::new(&mut out, 1, 1, SHAPE.d_model).unwrap();
    mismatch(
        layer
            .decode_paged(tokens, &mut paged, &[id], output)
            .unwrap_err(),
    );
    let mut bf16 = f.layer(1, KvFormat::Bf16).new_paged_cache(2).unwrap();
    let id = bf16.add_sequence().unwrap();
    let output = Output::new(&mut out, 1, 1, SHAPE.d_model).unwrap();
    mismatch(
        layer
            .decode_paged(tokens, &mut bf16, &[id], output)
            .unwrap_err(),
    );
    // Nothing was appended anywhere.
    assert_eq!(
        (cache.len(), paged.len(id).unwrap(), bf16.len(id).unwrap()),
        (0, 0, 0)
    );
    // A full pool is an error too, and changes nothing.
    let mut small = layer.new_paged_cache(1).unwrap();
    let id = small.add_sequence().unwrap();
    let long = vec![0.1; 97 * SHAPE.d_model];
    let mut long_out = vec![0.0; 97 * SHAPE.d_model];
    let tokens = Tokens::new(&long, 1, 97, SHAPE.d_model).unwrap();
    let output = Output::new(&mut long_out, 1, 97, SHAPE.d_model).unwrap();
    let err = layer.decode_paged(tokens, &mut small, &[id], output);
    let full = ShapeError::PoolFull {
        needed: 2,
        free: 1,
        blocks: 1,
    };
    assert_eq!(err, Err(full));
    assert_eq!(small.len(id).unwrap(), 0);
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

/// The float64 tensor `name` of case `case`'s `io.safetensors` (`expected1`: LongCat-Flash's
/// second block).
#[cfg(feature = "std")]
fn expected_of(case: &str, name: &str) -> Vec<f64> {
    let io = std::fs::read(case_dir(case).join("io.safetensors")).unwrap();
    let io = SafeTensors::parse(&io).unwrap();
    let tensor = io.tensor(name).unwrap();
    assert_eq!(tensor.dtype(), Dtype::F64);
    let bytes = tensor.data().as_chunks::<8>().0;
    bytes.iter().map(|&b| f64::from_le_bytes(b)).collect()
}

/// The largest difference between `got` and `want`.
fn worst(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&got, &want)| (f64::from(got) - want).abs())
        .fold(0.0, f64::max)
}

/// Decodes `f`'s two sequences through a paged cache in a ragged batch: sequence 0 prefills 3
/// tokens alone, sequence 1 six, then both step one token at a time at their own lengths
/// (sequence 1 first in the batch), and sequence 0 finishes alone; every output is the
/// prefill's row for that token.
#[cfg(feature = "std")]
fn paged_ragged(layer: &mut MlaLayer, f: &Fixture, prefill: &[f32]) {
    let d = f.x.len() / (f.batch * f.len);
    assert_eq!(f.batch, 2);
    let row = |v: &[f32], b: usize, t: usize, n: usize| v[(b * f.len + t) * d..][..n * d].to_vec();
    let mut cache = layer.new_paged_cache(2).unwrap();
    let ids = [cache.add_sequence().unwrap(), cache.add_sequence().unwrap()];
    let mut step = |seqs: &[usize], starts: &[usize], n: usize| {
        let x: Vec<f32> = seqs
            .iter()
            .zip(starts)
            .flat_map(|(&b, &t)| row(&f.x, b, t, n))
            .collect();
        let mut out = vec![0.0; x.len()];
        let (xs, ys) = (
            Tokens::new(&x, seqs.len(), n, d).unwrap(),
            Output::new(&mut out, seqs.len(), n, d).unwrap(),
        );
        let chosen: Vec<usize> = seqs.iter().map(|&b| ids[b]).collect();
        layer.decode_paged(xs, &mut cache, &chosen, ys).unwrap();
        let want: Vec<f32> = seqs
            .iter()
            .zip(starts)
            .flat_map(|(&b, &t)| row(prefill, b, t, n))
            .collect();
        assert_eq!(out, want, "sequences {seqs:?} from {starts:?}");
    };
    step(&[0], &[0], 3);
    step(&[1], &[0], 6);
    for k in 0..f.len - 6 {
        step(&[1, 0], &[6 + k, 3 + k], 1);
    }
    step(&[0], &[f.len - 3], 3);
}

/// Layer `layer` of checkpoint case `case` against `expected`: the prefill within tolerance
/// on 1 and 3 threads, decoding token by token and in chunks its bits, a ragged paged batch
/// too; returns the prefill.
#[cfg(feature = "std")]
fn check_checkpoint_layer(case: &str, layer: usize, expected: &[f64]) -> Vec<f32> {
    let f = Fixture::of(case);
    let checkpoint = Checkpoint::open(case_dir(case)).unwrap();
    let d = checkpoint.mla_config().unwrap().shape.d_model;
    let x = Tokens::new(&f.x, f.batch, f.len, d).unwrap();
    let mut prefill: Option<Vec<f32>> = None;
    for threads in [1, 3] {
        let mut mla = checkpoint.mla_layer(layer, |b| b.threads(threads)).unwrap();
        let y = mla.forward(x).unwrap();
        assert_close(&y, expected, case);
        assert_eq!(
            prefill.get_or_insert_with(|| y.clone()),
            &y,
            "{threads} threads"
        );
        for step in [1, 4] {
            let decoded = decode_with(&mut mla, &f, step, d);
            assert_eq!(decoded, y, "{case}: {threads} threads, steps of {step}");
        }
        paged_ragged(&mut mla, &f, &y);
    }
    prefill.unwrap()
}

/// Mistral 4 (`mistral4`) through `Checkpoint::open`: DeepSeek-V3's MLA with the
/// `llama_4_scaling_beta` query scale (period 4 over 11 positions: three factors), against
/// `transformers`' own `Mistral4Attention` in float64.
#[cfg(feature = "std")]
#[test]
fn mistral4_matches_transformers_float64() {
    let checkpoint = Checkpoint::open(case_dir("mistral4")).unwrap();
    let config = checkpoint.mla_config().unwrap().clone();
    assert_eq!(
        (config.model_type, config.num_hidden_layers),
        ("mistral4", 1)
    );
    let want = mha::QueryScale {
        beta: 0.3,
        period: 4.0,
        offset: 0,
        from: mha::ScalePosition::Position,
    };
    assert_eq!((config.query_scale, config.lora_scales), (Some(want), None));
    assert_eq!(config.rope.layout, RopeLayout::Interleaved);
    let f = Fixture::of("mistral4");
    let prefill = check_checkpoint_layer("mistral4", 0, &f.expected);
    // The scale counts: without it (beta 0) the first period agrees and the rest does not.
    let none = mha::QueryScale { beta: 0.0, ..want };
    let mut plain = checkpoint.mla_layer(0, |b| b.query_scale(none)).unwrap();
    assert_eq!(plain.query_scale(), Some(none));
    let d = config.shape.d_model;
    let y = plain
        .forward(Tokens::new(&f.x, f.batch, f.len, d).unwrap())
        .unwrap();
    assert_eq!(y[..4 * d], prefill[..4 * d]);
    assert!(worst(&y, &f.expected) > 1e-3, "{}", worst(&y, &f.expected));
}

/// LongCat-Flash (`longcat_flash`) through `Checkpoint::open`: one layer of two MLA blocks
/// (`self_attn.0`, `self_attn.1`: MLA layers 0 and 1), each against `transformers`' own
/// `LongcatFlashMLA` in float64, its LoRA scales folded into the norms.
#[cfg(feature = "std")]
#[test]
fn longcat_flash_blocks_match_transformers_float64() {
    let checkpoint = Checkpoint::open(case_dir("longcat_flash")).unwrap();
    let config = checkpoint.mla_config().unwrap().clone();
    assert_eq!(
        (config.model_type, checkpoint.num_layers()),
        ("longcat_flash", 2)
    );
    let scales = config.lora_scales.unwrap();
    assert_eq!((scales.query, scales.latent), (2.0, (48f64 / 20.0).sqrt()));
    assert_eq!(config.tensor_prefix(1), "model.layers.0.self_attn.1.");
    let first = check_checkpoint_layer(
        "longcat_flash",
        0,
        &expected_of("longcat_flash", "expected"),
    );
    let second = expected_of("longcat_flash", "expected1");
    let other = check_checkpoint_layer("longcat_flash", 1, &second);
    assert!(worst(&first, &second) > 1e-2, "the blocks' weights differ");
    assert_ne!(first, other);
    let err = checkpoint.mla_layer(2, |b| b).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::Config {
                error: ConfigError::LayerOutOfRange {
                    layer: 2,
                    layers: 2,
                    ..
                },
                ..
            }
        ),
        "{err}"
    );
}

/// The text of case `case`'s `config.json` with `from` replaced by `to` (which must occur).
fn edited(case: &str, from: &str, to: &str) -> String {
    let text = std::fs::read_to_string(case_dir(case).join("config.json")).unwrap();
    assert!(text.contains(from), "{from}");
    text.replace(from, to)
}

/// The message of the error `MlaConfig::from_json` gives for `text`, which names `key`.
fn config_error(text: &str, key: &str) -> String {
    let err = MlaConfig::from_json(text).unwrap_err().to_string();
    assert!(err.contains(key), "{key}: {err}");
    err
}

#[test]
fn mistral4_and_longcat_settings_read_or_fail_naming_the_key() {
    // Mistral 4: the scale's beta and period are required, the rotary width must be p.
    let text = edited("mistral4", "\"llama_4_scaling_beta\": 0.3,", "");
    config_error(&text, "llama_4_scaling_beta");
    let text = edited(
        "mistral4",
        "\"llama_4_scaling_beta\": 0.3,",
        "\"llama_4_scaling_beta\": 0.3, \"partial_rotary_factor\": 0.25,",
    );
    config_error(&text, "partial_rotary_factor");
    let text = edited(
        "mistral4",
        "\"rope_type\": \"yarn\"",
        "\"rope_type\": \"default\"",
    );
    config_error(&text, "rope_type");
    let text = edited(
        "mistral4",
        "\"llama_4_scaling_beta\": 0.3,",
        "\"llama_4_scaling_beta\": 0.3, \"partial_rotary_factor\": 0.5,",
    );
    assert!(MlaConfig::from_json(&text).unwrap().query_scale.is_some());
    // Every MLA family: projection biases are refused.
    for case in ["mistral4", "longcat_flash", "deepseek_v3"] {
        let text = edited(
            case,
            "\"hidden_size\"",
            "\"attention_bias\": true, \"hidden_size\"",
        );
        config_error(&text, "attention_bias");
    }
    // LongCat-Flash: interleaved whatever rope_interleave says, theta 10^7 when absent, the
    // widths transformers reads apart must agree, a query LoRA and num_layers are required.
    let text = edited(
        "longcat_flash",
        "\"hidden_size\"",
        "\"rope_interleave\": false, \"hidden_size\"",
    );
    let config = MlaConfig::from_json(&text).unwrap();
    assert_eq!(config.rope.layout, RopeLayout::Interleaved);
    let text = edited("longcat_flash", "\"rope_theta\": 1000000.0,", "");
    assert_eq!(MlaConfig::from_json(&text).unwrap().rope.theta, 1e7);
    config_error(
        &edited("longcat_flash", "\"head_dim\": 4", "\"head_dim\": 8"),
        "head_dim",
    );
    let text = edited(
        "longcat_flash",
        "\"head_dim\": 4",
        "\"head_dim\": 4, \"qk_head_dim\": 16",
    );
    config_error(&text, "qk_head_dim");
    config_error(
        &edited(
            "longcat_flash",
            "\"q_lora_rank\": 12",
            "\"q_lora_rank\": null",
        ),
        "q_lora_rank",
    );
    config_error(
        &edited("longcat_flash", "\"num_layers\"", "\"layers\""),
        "num_layers",
    );
}

/// `x (batch, len, D)` through MLA in float64 as `transformers` computes it, per-head keys and
/// values formed in full: [`LONG`]'s widths and weights `w` (as [`filled`] orders them), RMSNorm
/// eps 1e-6, interleaved pairs of the default rope (theta 10,000) from each token's index, the
/// softmax scale `(n + p)^-½`, the queries times `scale`'s factor when given.
fn naive_mla(
    w: &[Vec<f32>; 7],
    scale: Option<mha::QueryScale>,
    x: &[f32],
    (batch, len): (usize, usize),
) -> Vec<f64> {
    let s = LONG;
    let (d, h, r, n, p, v) = (
        s.d_model,
        s.n_heads,
        s.kv_lora_rank,
        s.qk_nope_head_dim,
        s.qk_rope_head_dim,
        s.v_head_dim,
    );
    let rank = s.q_lora_rank.unwrap();
    let w: Vec<Vec<f64>> = w
        .iter()
        .map(|m| m.iter().map(|&e| f64::from(e)).collect())
        .collect();
    // y = a · mᵀ for m (outs, ins) row-major.
    let linear = |a: &[f64], m: &[f64], outs: usize| -> Vec<f64> {
        (0..outs)
            .map(|o| {
                a.iter()
                    .zip(&m[o * a.len()..][..a.len()])
                    .map(|(x, y)| x * y)
                    .sum()
            })
            .collect()
    };
    let rms = |a: &[f64], weight: &[f64]| -> Vec<f64> {
        let ms = a.iter().map(|e| e * e).sum::<f64>() / a.len() as f64;
        let inv = 1.0 / (ms + 1e-6).sqrt();
        a.iter().zip(weight).map(|(e, g)| e * inv * g).collect()
    };
    let rotate = |pair: &mut [f64], t: usize| {
        for i in 0..p / 2 {
            let angle = t as f64 * 10_000f64.powf(-((2 * i) as f64) / p as f64);
            let (sin, cos) = angle.sin_cos();
            let (a, b) = (pair[2 * i], pair[2 * i + 1]);
            pair[2 * i] = a * cos - b * sin;
            pair[2 * i + 1] = b * cos + a * sin;
        }
    };
    let mut y = vec![0.0; batch * len * d];
    for b in 0..batch {
        // Per token: queries (H, n + p), keys (H, n + p), values (H, v).
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for t in 0..len {
            let xt: Vec<f64> = x[(b * len + t) * d..][..d]
                .iter()
                .map(|&e| f64::from(e))
                .collect();
            let mut q = linear(&rms(&linear(&xt, &w[0], rank), &w[1]), &w[2], h * (n + p));
            let kv = linear(&xt, &w[3], r + p);
            let c = rms(&kv[..r], &w[4]);
            let mut k_rope = kv[r..].to_vec();
            rotate(&mut k_rope, t);
            let kvb = linear(&c, &w[5], h * (n + v));
            let factor = scale.map_or(1.0, |s| f64::from(s.factor(t)));
            let mut k = Vec::new();
            for head in 0..h {
                rotate(&mut q[head * (n + p) + n..][..p], t);
                k.extend_from_slice(&kvb[head * (n + v)..][..n]);
                k.extend_from_slice(&k_rope);
                vs.extend_from_slice(&kvb[head * (n + v) + n..][..v]);
            }
            qs.extend(q.iter().map(|e| e * factor));
            ks.extend(k);
        }
        for t in 0..len {
            let mut heads = vec![0.0; h * v];
            for head in 0..h {
                let q = &qs[(t * h + head) * (n + p)..][..n + p];
                let scores: Vec<f64> = (0..=t)
                    .map(|u| {
                        let k = &ks[(u * h + head) * (n + p)..][..n + p];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / ((n + p) as f64).sqrt()
                    })
                    .collect();
                let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = e.iter().sum();
                for (u, pu) in e.iter().enumerate() {
                    let value = &vs[(u * h + head) * v..][..v];
                    for (o, val) in heads[head * v..][..v].iter_mut().zip(value) {
                        *o += pu / total * val;
                    }
                }
            }
            y[(b * len + t) * d..][..d].copy_from_slice(&linear(&heads, &w[6], d));
        }
    }
    y
}

/// The query scale on odd widths (`r` = 40, 6 heads) over 200 tokens, across key blocks: the
/// prefill within tolerance of the float64 naive expansion with and without the scale, which
/// changes the output; decoding in steps of 1, 7 and 96 gives the prefill's bits on 1 and 3
/// threads, in every cache format.
#[test]
fn the_query_scale_matches_a_float64_reference_and_decodes_as_its_prefill() {
    let (w, x) = (varied(LONG), long_tokens());
    let scale = mha::QueryScale {
        beta: 0.4,
        period: 9.0,
        offset: 0,
        from: mha::ScalePosition::Position,
    };
    let tokens = Tokens::new(&x, 2, 200, 32).unwrap();
    let want = naive_mla(&w, Some(scale), &x, (2, 200));
    let unscaled = naive_mla(&w, None, &x, (2, 200));
    let y = long_layer_with(&w, 3, KvFormat::F32, Some(scale))
        .forward(tokens)
        .unwrap();
    assert_close(&y, &want, "scaled");
    let plain = long_layer(&w, 3, KvFormat::F32).forward(tokens).unwrap();
    assert_close(&plain, &unscaled, "unscaled");
    assert!(worst(&y, &unscaled) > 1e-2, "{}", worst(&y, &unscaled));
    let f = Fixture {
        tensors: Vec::new(),
        x: x.clone(),
        expected: Vec::new(),
        batch: 2,
        len: 200,
        scale: 0.0,
    };
    for format in FORMATS {
        let prefill = long_layer_with(&w, 1, format, Some(scale))
            .forward(tokens)
            .unwrap();
        for threads in [1, 3] {
            let mut layer = long_layer_with(&w, threads, format, Some(scale));
            for step in [1, 7, 96] {
                let decoded = decode_with(&mut layer, &f, step, LONG.d_model);
                assert_eq!(
                    decoded, prefill,
                    "{format:?}, {threads} threads, steps of {step}"
                );
            }
        }
    }
    // A scale whose factor is not finite is refused when the layer is built.
    let bad = mha::QueryScale {
        beta: f64::NAN,
        ..scale
    };
    let weights = MlaWeights {
        shape: LONG,
        q_a: Some((&w[0], &w[1])),
        q_b: &w[2],
        kv_a: &w[3],
        kv_a_norm: &w[4],
        kv_b: &w[5],
        o: &w[6],
    };
    let rope = Rope {
        rotary_dim: 8,
        scaling: RopeScaling::Default,
        ..rope()
    };
    let err = MlaLayer::builder(weights, rope)
        .query_scale(bad)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("beta"), "{err}");
}
