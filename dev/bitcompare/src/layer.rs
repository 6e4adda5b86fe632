//! A run-time layer's shape, random weights and settings, and building it.
use mha::*;

use crate::Rng;

/// The widths and query heads of a layer and the lengths of its calls: `b` sequences of `t`
/// tokens, and for cross-attention memories of `s` tokens.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub b: usize,
    pub t: usize,
    pub s: usize,
    pub widths: Widths,
    pub h: usize,
}

impl Shape {
    /// Self-attention of `h` query heads: `D`, `KV` and `Q` wide.
    pub const fn of_self(b: usize, t: usize, d: usize, kv: usize, q: usize, h: usize) -> Self {
        Shape {
            b,
            t,
            s: t,
            widths: Widths::self_attention(d, kv, q),
            h,
        }
    }

    /// Cross-attention from memories of `s` tokens `e` wide.
    pub const fn cross(self, s: usize, e: usize) -> Self {
        let mut shape = self;
        shape.s = s;
        shape.widths.memory = e;
        shape
    }

    pub fn head_dim(&self) -> usize {
        self.widths.query / self.h
    }
}

/// The random weights and biases of a layer, owned.
pub struct Weights {
    pub widths: Widths,
    /// `wq (D, Q)`, `wk (E, KV)`, `wv (E, KV)`, `wo (Q, D)`.
    pub matrices: [Vec<f32>; 4],
    pub biases: Biases,
}

impl Weights {
    /// Weights uniform with variance about `1 / (3 fan-in)`, biases in [-0.1, 0.1).
    pub fn random(widths: Widths, rng: &mut Rng) -> Self {
        let Widths {
            d_model: d,
            memory: e,
            kv,
            query: q,
            ..
        } = widths;
        let mut matrix =
            |rows: usize, cols: usize| rng.vec(rows * cols, 1.0 / (rows as f32).sqrt());
        let matrices = [matrix(d, q), matrix(e, kv), matrix(e, kv), matrix(q, d)];
        let biases = Biases {
            bq: Some(rng.vec(q, 0.1)),
            bk: Some(rng.vec(kv, 0.1)),
            bv: Some(rng.vec(kv, 0.1)),
            bo: Some(rng.vec(d, 0.1)),
        };
        Weights {
            widths,
            matrices,
            biases,
        }
    }

    pub fn projections(&self) -> Projections<'_> {
        let [wq, wk, wv, wo] = &self.matrices;
        Projections::new(self.widths, wq, wk, wv, wo).unwrap()
    }
}

/// Which ALiBi slopes a layer takes.
#[derive(Clone, Copy, Debug)]
pub enum Slopes {
    Standard,
    /// `0.3 / (h + 1)` for head `h`.
    Given,
}

/// A layer's settings beyond its weights; the builder's defaults where not set.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    pub masking: Masking,
    pub biases: bool,
    pub scale: Option<f32>,
    pub window: Option<usize>,
    pub rope: Option<Rope>,
    /// The span and `eps` of a QK-norm whose weights come from a formula.
    pub qk_norm: Option<(QkNormSpan, f32)>,
    pub alibi: Option<(Slopes, AlibiPositions)>,
    pub softcap: Option<f32>,
    /// Sinks from a formula, head 1's `-inf` (no sink).
    pub sinks: bool,
    pub keys: KvFormat,
    pub values: KvFormat,
    pub weights: WeightFormat,
}

/// The settings of most cases: causal, with biases.
pub fn base() -> Setup {
    Setup {
        biases: true,
        ..Setup::default()
    }
}

/// The same as `base`, bidirectional.
pub fn bidirectional() -> Setup {
    Setup {
        masking: Masking::Bidirectional,
        ..base()
    }
}

/// Each setting, chained: `base().window(5).softcap(1.0)`.
impl Setup {
    pub fn scale(self, scale: f32) -> Self {
        Setup {
            scale: Some(scale),
            ..self
        }
    }

    pub fn window(self, window: usize) -> Self {
        Setup {
            window: Some(window),
            ..self
        }
    }

    pub fn rope(self, rope: Rope) -> Self {
        Setup {
            rope: Some(rope),
            ..self
        }
    }

    pub fn qk_norm(self, span: QkNormSpan, eps: f32) -> Self {
        Setup {
            qk_norm: Some((span, eps)),
            ..self
        }
    }

    pub fn alibi(self, slopes: Slopes, positions: AlibiPositions) -> Self {
        Setup {
            alibi: Some((slopes, positions)),
            ..self
        }
    }

    pub fn softcap(self, cap: f32) -> Self {
        Setup {
            softcap: Some(cap),
            ..self
        }
    }

    pub fn sinks(self) -> Self {
        Setup {
            sinks: true,
            ..self
        }
    }

    /// Keys and values in these formats.
    pub fn kv(self, keys: KvFormat, values: KvFormat) -> Self {
        Setup {
            keys,
            values,
            ..self
        }
    }

    pub fn weights(self, weights: WeightFormat) -> Self {
        Setup { weights, ..self }
    }
}

/// A rotary embedding with base 10,000.
pub fn rope(rotary_dim: usize, layout: RopeLayout, scaling: RopeScaling) -> Rope {
    Rope {
        theta: 10_000.0,
        rotary_dim,
        layout,
        scaling,
    }
}

/// Full rotary embedding (pairs `(i, i + dim / 2)`, no scaling) of heads `dim` wide.
pub fn full_rope(dim: usize) -> Rope {
    rope(dim, RopeLayout::RotateHalf, RopeScaling::Default)
}

/// Llama 3.1's scaling, for a context of 32 tokens.
pub fn llama3() -> RopeScaling {
    RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 32.0,
    }
}

/// YaRN as gpt-oss configures it (but `truncate`).
pub fn yarn(truncate: bool) -> RopeScaling {
    RopeScaling::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 32.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: RopeScaling::yarn_attention_factor(4.0, None, None),
        truncate,
    }
}

/// Values from a formula: `n` of them around 1.
fn around_one(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.5 + (i % 7) as f32 * 0.125).collect()
}

impl Setup {
    /// The layer of `weights` with these settings on `threads` threads, every phase threaded.
    pub fn build(&self, weights: &Weights, shape: &Shape, threads: usize) -> Layer {
        self.build_with(weights, shape, |b| {
            b.threads(threads).min_work_per_thread(0)
        })
    }

    /// The layer of `weights` with these settings and then `threads`' (the builder's threads).
    pub fn build_with(
        &self,
        weights: &Weights,
        shape: &Shape,
        threads: impl FnOnce(LayerBuilder<'_>) -> LayerBuilder<'_>,
    ) -> Layer {
        let builder = Layer::builder(weights.projections(), shape.h);
        threads(self.apply(builder, weights, shape))
            .build()
            .unwrap_or_else(|e| panic!("{self:?} on {shape:?}: {e}"))
    }

    /// `b` with these settings.
    fn apply<'w>(&self, mut b: LayerBuilder<'w>, w: &Weights, shape: &Shape) -> LayerBuilder<'w> {
        b = b
            .masking(self.masking)
            .key_format(self.keys)
            .value_format(self.values)
            .weight_format(self.weights);
        if self.biases {
            b = b.biases(w.biases.clone());
        }
        if let Some(scale) = self.scale {
            b = b.scale(scale);
        }
        if let Some(window) = self.window {
            b = b.sliding_window(window);
        }
        if let Some(rope) = self.rope {
            b = b.rope(rope);
        }
        if let Some(norm) = self.qk_norm_of(shape) {
            b = b.qk_norm(norm);
        }
        if let Some((slopes, positions)) = self.alibi {
            b = b.alibi(alibi(slopes, shape.h)).alibi_positions(positions);
        }
        if let Some(cap) = self.softcap {
            b = b.softcap(cap);
        }
        if self.sinks {
            b = b.sinks(sinks(shape.h));
        }
        b
    }

    /// The QK-norm of these settings for `shape`.
    pub fn qk_norm_of(&self, shape: &Shape) -> Option<QkNorm> {
        let (span, eps) = self.qk_norm?;
        let (q, k) = match span {
            QkNormSpan::PerHead => (shape.head_dim(), shape.head_dim()),
            _ => (shape.widths.query, shape.widths.kv),
        };
        Some(QkNorm {
            span,
            q_weight: around_one(q),
            k_weight: around_one(k + 3)[3..].to_vec(),
            eps,
        })
    }
}

/// The ALiBi of `h` heads.
pub fn alibi(slopes: Slopes, h: usize) -> Alibi {
    match slopes {
        Slopes::Standard => Alibi::Standard,
        Slopes::Given => Alibi::Slopes((0..h).map(|i| 0.3 / (i + 1) as f32).collect()),
    }
}

/// One sink logit per head, head 1's `-inf`.
pub fn sinks(h: usize) -> Vec<f32> {
    let sink = |i: usize| match i {
        1 => f32::NEG_INFINITY,
        i => i as f32 * 0.75 - 1.0,
    };
    (0..h).map(sink).collect()
}
