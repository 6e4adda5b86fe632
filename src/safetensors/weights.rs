//! [`LayerWeights`]: one attention layer of a Llama, Phi-3 or GPT-NeoX checkpoint, loaded with
//! the shapes its [`AttentionConfig`] states, in this crate's `x @ W` convention.

use alloc::format;
use alloc::vec::Vec;

use super::error::try_grow;
use super::layout::{join, Layout, Loader};
use super::{SafeTensors, SafeTensorsError};
use crate::config::AttentionConfig;
use crate::error::ShapeError;
use crate::norm::{QkNorm, QkNormSpan};
use crate::params::{MhaBiases, MhaParams};
use crate::tensor::Matrix;

type Result<T> = core::result::Result<T, SafeTensorsError>;

/// The weights of one attention layer, with shapes known at run time: `D = d_model`,
/// `Q = q_width = n_heads · head_dim`, `KV = kv_width = n_kv_heads · head_dim`. Matrices are
/// row-major in the `x @ W` convention (rows are input features).
///
/// Read from a checkpoint with [`from_safetensors`](Self::from_safetensors); turned into the
/// typed [`MhaParams`] with [`into_params`](Self::into_params).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerWeights {
    /// The model width `D`.
    pub d_model: usize,
    /// The query width `Q` (`n_heads · head_dim`; the width of the merged heads).
    pub q_width: usize,
    /// The key/value width `KV` (`n_kv_heads · head_dim`).
    pub kv_width: usize,
    /// Query projection, `(D, Q)`.
    pub wq: Vec<f32>,
    /// Key projection, `(D, KV)`.
    pub wk: Vec<f32>,
    /// Value projection, `(D, KV)`.
    pub wv: Vec<f32>,
    /// Output projection, `(Q, D)`.
    pub wo: Vec<f32>,
    /// Query bias, `Q` values.
    pub bq: Option<Vec<f32>>,
    /// Key bias, `KV` values.
    pub bk: Option<Vec<f32>>,
    /// Value bias, `KV` values.
    pub bv: Option<Vec<f32>>,
    /// Output bias, `D` values.
    pub bo: Option<Vec<f32>>,
    /// The QK-norm, with its weights from the checkpoint (plus the config's
    /// [`weight_offset`](crate::QkNormConfig::weight_offset)) and its span and epsilon from
    /// the config.
    pub qk_norm: Option<QkNorm>,
    /// The attention sinks' logits, one per query head (gpt-oss's `{prefix}.sinks`).
    pub sinks: Option<Vec<f32>>,
}

/// The per-head weights of a layer beside its projections, as
/// [`LayerWeights::into_params`] hands them to
/// [`AttentionConfig::builder`](crate::AttentionConfig::builder).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeadWeights {
    /// The QK-norm ([`MhaBuilder::qk_norm`](crate::MhaBuilder::qk_norm)).
    pub qk_norm: Option<QkNorm>,
    /// The attention sinks' logits ([`MhaBuilder::sinks`](crate::MhaBuilder::sinks)).
    pub sinks: Option<Vec<f32>>,
}

/// Which stored rows form a projection's output features: feature `c` is row
/// `(c / block) · stride + offset + c % block`.
#[derive(Clone, Copy)]
struct Rows {
    block: usize,
    stride: usize,
    offset: usize,
    /// The number of output features.
    width: usize,
}

impl Rows {
    /// `width` consecutive rows from `offset`.
    fn run(offset: usize, width: usize) -> Self {
        Rows {
            block: width.max(1),
            stride: 0,
            offset,
            width,
        }
    }

    fn row(self, c: usize) -> usize {
        (c / self.block) * self.stride + self.offset + c % self.block
    }
}

/// Where a layout keeps the query, key or value projection: tensor `{name}.weight`, with
/// `rows` rows in all, of which `take` are this projection's.
struct Source {
    name: &'static str,
    rows: usize,
    take: Rows,
}

/// The sources of the query, key and value projections, and the name of the output one.
fn sources(layout: Layout, q: usize, kv: usize, head_dim: usize) -> ([Source; 3], &'static str) {
    let source = |name, rows, take| Source { name, rows, take };
    match layout {
        Layout::Phi3 => {
            let fused = |offset, width| source("qkv_proj", q + 2 * kv, Rows::run(offset, width));
            ([fused(0, q), fused(q, kv), fused(q + kv, kv)], "o_proj")
        }
        Layout::GptNeox => {
            let per_head = |offset| Rows {
                block: head_dim,
                stride: 3 * head_dim,
                offset,
                width: q,
            };
            let qkv = "query_key_value";
            let all =
                [0, head_dim, 2 * head_dim].map(|offset| source(qkv, 3 * q, per_head(offset)));
            (all, "dense")
        }
        // Layout::Llama, the one other layout a config names.
        _ => {
            let whole = |name, rows| source(name, rows, Rows::run(0, rows));
            (
                [whole("q_proj", q), whole("k_proj", kv), whole("v_proj", kv)],
                "o_proj",
            )
        }
    }
}

/// The `x @ W` matrix `(inputs, rows.width)` of a stored `(out, inputs)` matrix: element
/// `(r, c)` is `w[rows.row(c)][r]`.
fn transposed(w: &[f32], inputs: usize, rows: Rows, name: &str) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    try_grow(&mut out, inputs.saturating_mul(rows.width), || {
        format!("values loaded from tensor \"{name}\"")
    })?;
    for r in 0..inputs {
        out.extend((0..rows.width).map(|c| w[rows.row(c) * inputs + r]));
    }
    Ok(out)
}

/// The entries of a stored bias that belong to `rows`.
fn gather(b: &[f32], rows: Rows) -> Vec<f32> {
    (0..rows.width).map(|c| b[rows.row(c)]).collect()
}

const NO_BIAS: &str = "the config gives this projection no bias";
const NO_NORM: &str = "the config gives this layer no QK-norm";
const NO_SINKS: &str = "the config gives this layer no attention sinks";

impl Loader<'_, '_> {
    /// The tensor `{prefix}.{suffix}` of shape `shape` when `present`; when not, checks that
    /// the file does not hold it.
    fn expected(
        &self,
        suffix: &str,
        shape: &[usize],
        present: bool,
        absent_reason: &'static str,
    ) -> Result<Option<Vec<f32>>> {
        if present {
            return self.required(suffix, shape).map(Some);
        }
        let name = join(self.prefix, suffix);
        match self.st.get(&name) {
            Some(_) => Err(SafeTensorsError::UnexpectedTensor {
                tensor: name,
                reason: absent_reason,
            }),
            None => Ok(None),
        }
    }

    /// A projection of width `take.width` from `{name}.weight` (`rows` × `inputs`) and
    /// `{name}.bias` when `bias`.
    fn projection(
        &self,
        name: &str,
        rows: usize,
        inputs: usize,
        bias: bool,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let w = self.required(&format!("{name}.weight"), &[rows, inputs])?;
        let b = self.expected(&format!("{name}.bias"), &[rows], bias, NO_BIAS)?;
        Ok((w, b))
    }

    /// The query, key and value projections and biases, each stored tensor read once.
    fn inputs(&self, sources: &[Source; 3], d: usize, bias: [bool; 3]) -> Result<[Projection; 3]> {
        let mut stored: Option<(&str, Projection)> = None;
        let mut out: [Projection; 3] = Default::default();
        for ((source, bias), slot) in sources.iter().zip(bias).zip(&mut out) {
            let (w, b) = match stored.take() {
                Some((name, read)) if name == source.name => read,
                _ => self.projection(source.name, source.rows, d, bias)?,
            };
            let full = join(self.prefix, &format!("{}.weight", source.name));
            *slot = (
                transposed(&w, d, source.take, &full)?,
                b.as_ref().map(|b| gather(b, source.take)),
            );
            stored = Some((source.name, (w, b)));
        }
        Ok(out)
    }

    /// The QK-norm weights `{prefix}.q_norm.weight` and `{prefix}.k_norm.weight`.
    fn qk_norm(&self, config: &AttentionConfig, q: usize, kv: usize) -> Result<Option<QkNorm>> {
        let (q_len, k_len) = match config.qk_norm.map(|n| n.span) {
            Some(QkNormSpan::PerHead) => (config.head_dim, config.head_dim),
            Some(QkNormSpan::Whole) | None => (q, kv),
        };
        let on = config.qk_norm.is_some();
        let q_weight = self.expected("q_norm.weight", &[q_len], on, NO_NORM)?;
        let k_weight = self.expected("k_norm.weight", &[k_len], on, NO_NORM)?;
        Ok(match (config.qk_norm, q_weight, k_weight) {
            (Some(norm), Some(q_weight), Some(k_weight)) => {
                let shift = |w: Vec<f32>| w.into_iter().map(|x| x + norm.weight_offset).collect();
                Some(QkNorm {
                    span: norm.span,
                    q_weight: shift(q_weight),
                    k_weight: shift(k_weight),
                    eps: norm.eps,
                })
            }
            _ => None,
        })
    }

    /// The attention sinks `{prefix}.sinks`, one logit per query head.
    fn sinks(&self, config: &AttentionConfig) -> Result<Option<Vec<f32>>> {
        self.expected("sinks", &[config.n_heads], config.sinks, NO_SINKS)
    }
}

/// A projection's `x @ W` weights and its bias.
type Projection = (Vec<f32>, Option<Vec<f32>>);

impl LayerWeights {
    /// Loads the attention layer stored under `prefix` (e.g.
    /// [`config.tensor_prefix()`](AttentionConfig::tensor_prefix)) in the layout of
    /// `config`'s family ([`Layout::Llama`], [`Layout::Phi3`] or [`Layout::GptNeox`]; see
    /// each for the tensor names and formulas), checking every tensor's shape against the
    /// config, and converting to `x @ W`. `F32`, `F16` and `BF16` tensors are read, the 16-bit
    /// ones widened exactly. Biases are read where [`AttentionConfig::biases`] says (for the
    /// fused layouts, one bias covers the query, key and value projections and is read when
    /// `biases.q` is set); QK-norm weights where [`AttentionConfig::qk_norm`] says, the sinks
    /// (`{prefix}.sinks`, `n_heads` logits) where [`AttentionConfig::sinks`] says.
    ///
    /// ```
    /// use mha::safetensors::{serialize, LayerWeights, SafeTensors};
    /// use mha::AttentionConfig;
    /// // A tiny Qwen2 layer: D = 4, 2 query heads and 1 key/value head of 2.
    /// let config = AttentionConfig::from_json(r#"{"model_type": "qwen2", "hidden_size": 4,
    ///     "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1}"#, 0)?;
    /// let p = config.tensor_prefix();
    /// let name = |s: &str| format!("{p}.{s}");
    /// let (w4, w2, b4, b2) = ([0.5; 16], [0.25; 8], [0.1; 4], [0.2; 2]);
    /// let bytes = serialize(&[
    ///     (&name("q_proj.weight"), &[4, 4], &w4), (&name("q_proj.bias"), &[4], &b4),
    ///     (&name("k_proj.weight"), &[2, 4], &w2), (&name("k_proj.bias"), &[2], &b2),
    ///     (&name("v_proj.weight"), &[2, 4], &w2), (&name("v_proj.bias"), &[2], &b2),
    ///     (&name("o_proj.weight"), &[4, 4], &w4),
    /// ], &[])?;
    /// let st = SafeTensors::parse(&bytes)?;
    /// let layer = LayerWeights::from_safetensors(&st, &p, &config)?;
    /// assert_eq!((layer.q_width, layer.kv_width, layer.wk.len()), (4, 2, 8));
    /// assert!(layer.bo.is_none());
    ///
    /// let (params, biases, heads) = layer.into_params::<4, 2, 4>()?;
    /// assert_eq!(biases.bk.unwrap().as_slice(), &[0.2, 0.2]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// - [`SafeTensorsError::Config`] when `config` fails
    ///   [`validate`](AttentionConfig::validate);
    /// - [`SafeTensorsError::LayerTensorNotFound`] naming the first missing tensor and the
    ///   layers of this layout the file holds;
    /// - [`SafeTensorsError::ShapeMismatch`] naming a tensor, its shape and the shape the
    ///   config implies;
    /// - [`SafeTensorsError::UnexpectedTensor`] for a bias, QK-norm weight or sinks the config says
    ///   the layer does not have;
    /// - [`SafeTensorsError::NotConvertible`], [`SafeTensorsError::AllocationFailed`].
    pub fn from_safetensors(
        st: &SafeTensors<'_>,
        prefix: &str,
        config: &AttentionConfig,
    ) -> Result<Self> {
        let (q, kv) = config.widths().map_err(SafeTensorsError::Config)?;
        let d = config.hidden_size;
        let layout = config.layout();
        let prefix = prefix.strip_suffix('.').unwrap_or(prefix);
        let l = Loader { st, prefix, layout };
        let (sources, output) = sources(layout, q, kv, config.head_dim);
        let b = config.biases;
        let fused = layout != Layout::Llama;
        let bias = if fused { [b.q; 3] } else { [b.q, b.k, b.v] };
        let [(wq, bq), (wk, bk), (wv, bv)] = l.inputs(&sources, d, bias)?;
        let (wo, bo) = l.projection(output, d, q, b.o)?;
        let wo = transposed(&wo, q, Rows::run(0, d), &join(prefix, output))?;
        Ok(LayerWeights {
            d_model: d,
            q_width: q,
            kv_width: kv,
            wq,
            wk,
            wv,
            wo,
            bq,
            bk,
            bv,
            bo,
            qk_norm: l.qk_norm(config, q, kv)?,
            sinks: l.sinks(config)?,
        })
    }

    /// The typed weights and biases of the layer, model width `D`, key/value width `KV` and
    /// query width `Q` (`H · head_dim`; `D` unless the config gives a `head_dim` other than
    /// `D / H`), and the QK-norm and sinks: what
    /// [`AttentionConfig::builder`](crate::AttentionConfig::builder) makes a layer of.
    ///
    /// # Errors
    /// [`ShapeError::DimensionMismatch`] naming `D`, `KV` or `Q` and the width loaded, or
    /// [`ShapeError::LengthMismatch`] when a vector's length was changed after loading.
    ///
    /// ```
    /// # use mha::safetensors::LayerWeights;
    /// let w = LayerWeights { d_model: 2, q_width: 2, kv_width: 2, wq: vec![0.0; 4], wk: vec![0.0; 4],
    ///     wv: vec![0.0; 4], wo: vec![0.0; 4], bq: None, bk: None, bv: None, bo: None, qk_norm: None,
    ///     sinks: None };
    /// let err = w.clone().into_params::<3, 3, 3>().unwrap_err();
    /// assert_eq!(err.to_string(), "d_model (D) is 2, but the call needs 3");
    /// assert!(w.into_params::<2, 2, 2>().is_ok());
    /// ```
    #[allow(clippy::type_complexity)]
    pub fn into_params<const D: usize, const KV: usize, const Q: usize>(
        self,
    ) -> core::result::Result<(MhaParams<D, D, KV, Q>, MhaBiases<D, KV, Q>, HeadWeights), ShapeError>
    {
        let check = |what, expected, actual| match expected == actual {
            true => Ok(()),
            false => Err(ShapeError::DimensionMismatch {
                what,
                expected,
                actual,
            }),
        };
        check("d_model (D)", D, self.d_model)?;
        check("query width (Q)", Q, self.q_width)?;
        check("key/value width (KV)", KV, self.kv_width)?;
        let params = MhaParams::from_parts(
            Matrix::from_vec(self.wq)?,
            Matrix::from_vec(self.wk)?,
            Matrix::from_vec(self.wv)?,
            Matrix::from_vec(self.wo)?,
        );
        let biases = MhaBiases {
            bq: self.bq.map(Matrix::from_vec).transpose()?,
            bk: self.bk.map(Matrix::from_vec).transpose()?,
            bv: self.bv.map(Matrix::from_vec).transpose()?,
            bo: self.bo.map(Matrix::from_vec).transpose()?,
        };
        let heads = HeadWeights {
            qk_norm: self.qk_norm,
            sinks: self.sinks,
        };
        Ok((params, biases, heads))
    }
}
