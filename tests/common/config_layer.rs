//! A layer built from an [`AttentionConfig`] and run, for the checks that a config that loads
//! builds and computes finite outputs from finite inputs: `tests/abuse.rs` over the mutated
//! configs of the fixtures, the `config_load` fuzz target (`fuzz/`) over any text. Include it
//! with `#[path = "common/config_layer.rs"] mod config_layer;`. The layers are run-time ones,
//! so every shape a config gives runs (those that fit in memory).
#![allow(dead_code)]

use mha::{AttendOptions, AttentionConfig, Biases, GateSpan, GateTensor, LayerWeights};
use mha::{Output, OutputGate};
use mha::{QkNorm, QkNormSpan, Tokens, Widths};

/// Weights for the shapes of `config`, `|w| ≤ 1/√D`, with the biases, QK-norm weights (the
/// family's offset included), output gate and sinks it says the layer has; `values(n, scale)` gives `n`
/// values in `[-scale, scale]`.
pub fn made_up_weights(
    config: &AttentionConfig,
    values: &mut dyn FnMut(usize, f32) -> Vec<f32>,
) -> LayerWeights {
    let d = config.hidden_size;
    let (q, kv) = (
        config.n_heads * config.head_dim,
        config.n_kv_heads * config.head_dim,
    );
    let b = config.biases;
    let mut bias = |on: bool, n: usize| on.then(|| values(n, 0.5));
    let (bq, bk, bv, bo) = (bias(b.q, q), bias(b.k, kv), bias(b.v, kv), bias(b.o, d));
    let qk_norm = config.qk_norm.map(|norm| {
        let (qn, kn) = match norm.span {
            QkNormSpan::PerHead => (config.head_dim, config.head_dim),
            _ => (q, kv),
        };
        let mut weight = |n: usize| -> Vec<f32> {
            let w = values(n, 0.5);
            w.iter().map(|w| w + 1.0 + norm.weight_offset).collect()
        };
        QkNorm {
            span: norm.span,
            q_weight: weight(qn),
            k_weight: weight(kn),
            eps: norm.eps,
        }
    });
    let scale = 1.0 / (d as f32).sqrt();
    let gate = config.output_gate.map(|gate| {
        let width = match gate.span {
            GateSpan::PerElement => q,
            GateSpan::PerHead => config.n_heads,
        };
        let bias = gate.tensor == GateTensor::InQuery && b.q;
        OutputGate {
            span: gate.span,
            activation: gate.activation,
            weight: values(d * width, scale),
            bias: bias.then(|| values(width, 0.5)),
        }
    });
    LayerWeights {
        widths: Widths::self_attention(d, kv, q),
        wq: values(d * q, scale).into(),
        wk: values(d * kv, scale).into(),
        wv: values(d * kv, scale).into(),
        wo: values(q * d, scale).into(),
        biases: Biases { bq, bk, bv, bo },
        qk_norm,
        sinks: config.sinks.then(|| values(config.n_heads, 2.0)),
        gate,
    }
}

/// One layer to build and run.
pub struct Run<'a> {
    pub config: &'a AttentionConfig,
    pub weights: LayerWeights,
    /// At least `2 · 9 · D` finite values: the input's.
    pub x: &'a [f32],
    /// What the messages start with.
    pub context: &'a str,
}

impl Run<'_> {
    /// Builds the layer and runs a forward pass of 2 sequences of up to 9 tokens of `x` (no
    /// more than `max_position_embeddings`): `true` when the output
    /// was checked finite, `false` when the scores may pass `f32`'s range ([`score_bound`]);
    /// `Err` for a layer that does not build or a forward pass that fails or is not finite.
    pub fn go(self) -> Result<bool, String> {
        let (config, context) = (self.config, self.context);
        let d = config.hidden_size;
        let (b, t) = (2, config.max_position_embeddings.min(9));
        let x = &self.x[..b * t * d];
        let bound = score_bound(config, &self.weights, x);
        let builder = self.weights.builder(config);
        let builder = builder.map_err(|e| format!("{context}: {e}"))?;
        let mut layer = builder
            .threads(1)
            .build()
            .map_err(|e| format!("{context}: loaded, but does not build: {e}"))?;
        let mut out = vec![0.0; b * t * d];
        let input = Tokens::new(x, b, t, d).unwrap();
        let output = Output::new(&mut out, b, t, d).unwrap();
        let done = match config.kv_source {
            None => layer.forward_into(input, AttendOptions::default(), output),
            Some(_) => shared_forward(config, &mut layer, input, output),
        };
        done.map_err(|e| format!("{context}: forward: {e}"))?;
        if bound > f64::from(f32::MAX) / 16.0 {
            return Ok(false);
        }
        match out.iter().find(|v| !v.is_finite()) {
            Some(v) => Err(format!("{context}: finite input, output {v}")),
            None => Ok(true),
        }
    }
}

/// The prefill of a KV-shared layer (`config.kv_source`): a source layer of the same config
/// with keys and values of its own (made-up weights) appends `x` to a cache, then `layer`
/// attends over it.
fn shared_forward(
    config: &AttentionConfig,
    layer: &mut mha::Layer,
    x: Tokens<'_>,
    out: Output<'_>,
) -> Result<(), mha::ShapeError> {
    let mut own = *config;
    own.kv_source = None;
    let mut state = 1u64;
    let mut values = |n: usize, scale: f32| -> Vec<f32> {
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        };
        (0..n).map(|_| next()).collect()
    };
    let weights = made_up_weights(&own, &mut values);
    let mut source = weights.builder(&own)?.threads(1).build()?;
    let mut cache = source.new_cache(x.batch(), x.len())?;
    let mut y = vec![0.0; x.batch() * x.len() * x.width()];
    let output = Output::new(&mut y, x.batch(), x.len(), x.width())?;
    source.decode_into(x, &mut cache, AttendOptions::default(), output)?;
    layer.decode_shared_into(x, &cache, AttendOptions::default(), out)
}

/// A bound on the magnitude of every product the scores are made of, `scale · a² · |q| · |k|`
/// with `a` the rotary embedding's attention factor (at least 1), `|q|`, `|k|` bounds on the norms
/// of a query and a key head of input `x` (`(·, D)` rows): by the weights' magnitudes, or the
/// QK-norm weights times `√span` after a norm. Computed in f64 from the settings and weights.
pub fn score_bound(config: &AttentionConfig, w: &LayerWeights, x: &[f32]) -> f64 {
    let d = w.widths.d_model;
    let x_max: Vec<f64> = (0..d)
        .map(|j| {
            x.chunks(d)
                .map(|row| f64::from(row[j].abs()))
                .fold(0.0, f64::max)
        })
        .collect();
    let head = config.head_dim;
    // The largest norm of a head of `x · W + bias`, `W` being `(D, width)`.
    let projected = |wt: &[f32], bias: &Option<Vec<f32>>, width: usize| -> f64 {
        let feature = |c: usize| {
            let sum: f64 = (0..d)
                .map(|j| x_max[j] * f64::from(wt[j * width + c].abs()))
                .sum();
            sum + bias.as_ref().map_or(0.0, |b| f64::from(b[c].abs()))
        };
        (0..width / head.max(1))
            .map(|h| {
                (0..head)
                    .map(|i| feature(h * head + i).powi(2))
                    .sum::<f64>()
                    .sqrt()
            })
            .fold(0.0, f64::max)
    };
    let normed = |weight: &[f32]| {
        let max = weight
            .iter()
            .map(|v| f64::from(v.abs()))
            .fold(0.0, f64::max);
        max * (weight.len() as f64).sqrt()
    };
    let (nq, nk) = match &w.qk_norm {
        Some(norm) => (normed(&norm.q_weight), normed(&norm.k_weight)),
        None => (
            projected(&w.wq.to_f32(), &w.biases.bq, w.widths.query),
            projected(&w.wk.to_f32(), &w.biases.bk, w.widths.kv),
        ),
    };
    let a = config
        .rope
        .map_or(1.0, |r| r.scaling.attention_factor().max(1.0));
    let scale = f64::from(config.scale);
    (scale * a * a * nq * nk).max(scale * a * nq).max(a * nk)
}
