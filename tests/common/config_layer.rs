//! A layer built from an [`AttentionConfig`] and run, for the checks that a config that loads
//! builds and computes finite outputs from finite inputs: `tests/abuse.rs` over the mutated
//! configs of the fixtures, the `config_load` fuzz target (`fuzz/`) over any text. Include it
//! with `#[path = "common/config_layer.rs"] mod config_layer;`. Its shape list, [`run_shape`],
//! holds every `(D, KV, Q)` the sweep of `tests/abuse.rs` meets at sizes that fit in memory.
#![allow(dead_code)]

use mha::safetensors::LayerWeights;
use mha::{AttendOptions, AttentionConfig, Output, QkNorm, QkNormSpan, Tokens};

/// `run.go::<D, KV, Q>()` for the `(D, KV, Q)` listed that is `(d, kv, q)`, else `None`.
macro_rules! each_shape {
    ($run:expr, $d:expr, $kv:expr, $q:expr; $(($D:literal, $KV:literal, $Q:literal)),* $(,)?) => {
        match ($d, $kv, $q) {
            $(($D, $KV, $Q) => Some($run.go::<$D, $KV, $Q>()),)*
            _ => None,
        }
    };
}

/// [`Run::go`] at the shapes `(d, kv, q)` when they are among the instantiated ones: the
/// fixtures' and those their configs take with one size key changed to 1, 2, 3 or absent.
pub fn run_shape(run: Run<'_>, d: usize, kv: usize, q: usize) -> Option<Result<bool, String>> {
    each_shape!(
        run, d, kv, q;
        (1, 10, 30), (1, 12, 36), (1, 14, 42), (1, 18, 36), (1, 20, 60), (1, 30, 30),
        (1, 30, 60), (2, 10, 30), (2, 12, 36), (2, 14, 42), (2, 18, 36), (2, 20, 60),
        (2, 30, 30), (2, 30, 60), (3, 1, 3), (3, 3, 3), (3, 10, 30), (3, 12, 36), (3, 14, 42),
        (3, 18, 36), (3, 20, 60), (3, 30, 30), (3, 30, 60), (30, 2, 6), (30, 6, 6),
        (30, 10, 10), (30, 10, 20), (30, 10, 30), (30, 14, 14), (30, 14, 28), (30, 14, 42),
        (30, 30, 30), (30, 42, 42), (30, 256, 768), (36, 1, 3), (36, 2, 6), (36, 3, 9),
        (36, 4, 12), (36, 6, 12), (36, 6, 36), (36, 10, 60), (36, 12, 12), (36, 12, 36),
        (36, 18, 18), (36, 18, 36), (36, 20, 20), (36, 20, 60), (36, 30, 60), (36, 36, 36),
        (36, 60, 60), (36, 128, 384), (42, 2, 6), (42, 4, 12), (42, 10, 60), (42, 14, 42),
        (42, 20, 20), (42, 20, 60), (42, 30, 60), (42, 42, 42), (42, 60, 60), (42, 512, 1536),
        (44, 4, 12), (44, 10, 60), (44, 20, 20), (44, 20, 60), (44, 30, 60), (44, 60, 60),
        (44, 256, 768), (60, 4, 12), (60, 6, 12), (60, 10, 60), (60, 20, 60), (60, 30, 30),
        (60, 30, 60), (60, 60, 60), (72, 72, 72),
    )
}

/// Weights for the shapes of `config`, `|w| ≤ 1/√D`, with the biases, QK-norm weights (the
/// family's offset included) and sinks it says the layer has; `values(n, scale)` gives `n`
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
    LayerWeights {
        d_model: d,
        q_width: q,
        kv_width: kv,
        wq: values(d * q, scale),
        wk: values(d * kv, scale),
        wv: values(d * kv, scale),
        wo: values(q * d, scale),
        bq,
        bk,
        bv,
        bo,
        qk_norm,
        sinks: config.sinks.then(|| values(config.n_heads, 2.0)),
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
    pub fn go<const D: usize, const KV: usize, const Q: usize>(self) -> Result<bool, String> {
        let (config, context) = (self.config, self.context);
        let (b, t) = (2, config.max_position_embeddings.min(9));
        let x = &self.x[..b * t * D];
        let bound = score_bound(config, &self.weights, x);
        let (params, biases, heads) = self
            .weights
            .into_params::<D, KV, Q>()
            .map_err(|e| format!("{context}: {e}"))?;
        let mut layer = config
            .builder(&params, biases, heads)
            .threads(1)
            .build()
            .map_err(|e| format!("{context}: loaded, but does not build: {e}"))?;
        let mut out = vec![0.0; b * t * D];
        let input = Tokens::new(x, b, t).unwrap();
        let output = Output::new(&mut out, b, t).unwrap();
        layer
            .forward_into(input, AttendOptions::default(), output)
            .map_err(|e| format!("{context}: forward: {e}"))?;
        if bound > f64::from(f32::MAX) / 16.0 {
            return Ok(false);
        }
        match out.iter().find(|v| !v.is_finite()) {
            Some(v) => Err(format!("{context}: finite input, output {v}")),
            None => Ok(true),
        }
    }
}

/// A bound on the magnitude of every product the scores are made of, `scale · a² · |q| · |k|`
/// with `a` the rotary table's attention factor (at least 1), `|q|`, `|k|` bounds on the norms
/// of a query and a key head of input `x` (`(·, D)` rows): by the weights' magnitudes, or the
/// QK-norm weights times `√span` after a norm. Computed in f64 from the settings and weights.
pub fn score_bound(config: &AttentionConfig, w: &LayerWeights, x: &[f32]) -> f64 {
    let d = w.d_model;
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
            projected(&w.wq, &w.bq, w.q_width),
            projected(&w.wk, &w.bk, w.kv_width),
        ),
    };
    let a = config
        .rope
        .map_or(1.0, |r| r.scaling.attention_factor().max(1.0));
    let scale = f64::from(config.scale);
    (scale * a * a * nq * nk).max(scale * a * nq).max(a * nk)
}
