//! The layers of a multi-head latent attention checkpoint ([`MlaConfig`]): the tensors
//! `{prefix}{q_a_proj, q_a_layernorm, q_b_proj (or q_proj), kv_a_proj_with_mqa,
//! kv_a_layernorm, kv_b_proj, o_proj}.weight` with the prefix
//! [`MlaConfig::tensor_prefix`] (`model.layers.{i}.self_attn.`; LongCat-Flash's
//! `model.layers.{i / 2}.self_attn.{i mod 2}.`), shapes checked against the config, read
//! through any [`TensorSource`]; LongCat-Flash's LoRA scales folded into the norm weights.

use std::format;
use std::string::String;
use std::vec::Vec;

use super::error::LoadError;
use super::weights::TensorSource;
use crate::layer::latent::{MlaBuilder, MlaLayer, MlaWeights};
use crate::load::config::{ConfigError, LoraScales, MlaConfig};

type Result<T> = core::result::Result<T, LoadError>;

/// One MLA layer's tensors, read and owned: `(out, in)` row-major, as [`MlaWeights`] takes
/// them.
struct MlaTensors {
    /// `q_a_proj` and `q_a_layernorm`, with a query LoRA.
    q_a: Option<(Vec<f32>, Vec<f32>)>,
    q_b: Vec<f32>,
    kv_a: Vec<f32>,
    kv_a_norm: Vec<f32>,
    kv_b: Vec<f32>,
    o: Vec<f32>,
}

/// The values of `{prefix}{name}.weight`, of shape `shape`.
fn tensor(
    source: &impl TensorSource,
    prefix: &str,
    name: &str,
    shape: &[usize],
) -> Result<Vec<f32>> {
    let full = format!("{prefix}{name}.weight");
    if let Some(found) = source.find(&full) {
        if found.shape != shape {
            return Err(LoadError::Shape {
                file: String::from(found.file),
                tensor: full,
                expected: shape.to_vec(),
                actual: found.shape.to_vec(),
            });
        }
    }
    source.stored(&full).map(|w| w.to_f32_as_stored())
}

impl MlaTensors {
    /// Reads layer `layer`'s tensors of the model `config` describes.
    fn read(source: &impl TensorSource, config: &MlaConfig, layer: usize) -> Result<Self> {
        let prefix = config.tensor_prefix(layer);
        let s = config.shape;
        let (d, h, r, p) = (s.d_model, s.n_heads, s.kv_lora_rank, s.qk_rope_head_dim);
        let q_rows = h * (s.qk_nope_head_dim + p);
        let get = |name: &str, shape: &[usize]| tensor(source, &prefix, name, shape);
        let (q_a, q_b) = match s.q_lora_rank {
            Some(rank) => {
                let q_a = (get("q_a_proj", &[rank, d])?, get("q_a_layernorm", &[rank])?);
                (Some(q_a), get("q_b_proj", &[q_rows, rank])?)
            }
            None => (None, get("q_proj", &[q_rows, d])?),
        };
        let mut tensors = MlaTensors {
            q_a,
            q_b,
            kv_a: get("kv_a_proj_with_mqa", &[r + p, d])?,
            kv_a_norm: get("kv_a_layernorm", &[r])?,
            kv_b: get("kv_b_proj", &[h * (s.qk_nope_head_dim + s.v_head_dim), r])?,
            o: get("o_proj", &[d, h * s.v_head_dim])?,
        };
        if let Some(scales) = config.lora_scales {
            tensors.fold(scales);
        }
        Ok(tensors)
    }

    /// Folds LongCat-Flash's LoRA scales into the norms whose outputs they multiply:
    /// `q_a_layernorm` by `query`, `kv_a_layernorm` by `latent` (each product in `f64`, rounded
    /// once). Without a query LoRA only the latent's is folded (the config requires one).
    fn fold(&mut self, scales: LoraScales) {
        let times = |w: &mut [f32], factor: f64| {
            w.iter_mut()
                .for_each(|v| *v = (f64::from(*v) * factor) as f32);
        };
        if let Some((_, q_norm)) = &mut self.q_a {
            times(q_norm, scales.query);
        }
        times(&mut self.kv_a_norm, scales.latent);
    }

    /// Borrowed as the layer's builder takes them.
    fn weights(&self, config: &MlaConfig) -> MlaWeights<'_> {
        MlaWeights {
            shape: config.shape,
            q_a: self.q_a.as_ref().map(|(a, n)| (&a[..], &n[..])),
            q_b: &self.q_b,
            kv_a: &self.kv_a,
            kv_a_norm: &self.kv_a_norm,
            kv_b: &self.kv_b,
            o: &self.o,
        }
    }
}

/// Layer `layer` of the MLA model `config` describes, its tensors from `source`, its builder
/// passed through `configure`.
///
/// # Errors
/// [`LoadError::Config`] for a layer past the last, [`LoadError::MissingTensor`],
/// [`LoadError::Shape`], what reading a tensor fails with, [`LoadError::Layer`] when the
/// weights and settings do not make a layer.
pub(crate) fn mla_layer(
    source: &impl TensorSource,
    (config, dir): (&MlaConfig, &str),
    layer: usize,
    configure: impl FnOnce(MlaBuilder<'_>) -> MlaBuilder<'_>,
) -> Result<MlaLayer> {
    if layer >= config.num_hidden_layers {
        return Err(LoadError::Config {
            dir: String::from(dir),
            error: ConfigError::LayerOutOfRange {
                layer,
                layers: config.num_hidden_layers,
                key: "num_hidden_layers",
            },
        });
    }
    let tensors = MlaTensors::read(source, config, layer)?;
    let builder = config.builder(tensors.weights(config));
    let as_layer = |error| LoadError::Layer { layer, error };
    configure(builder).build().map_err(as_layer)
}

/// The error of a call that needs an [`AttentionConfig`](crate::AttentionConfig) on an MLA
/// checkpoint.
pub(crate) fn not_attention_config(config: &MlaConfig, dir: &str) -> LoadError {
    LoadError::Config {
        dir: String::from(dir),
        error: ConfigError::Unsupported {
            key: String::from("model_type"),
            value: format!("\"{}\"", config.model_type),
            reason: "multi-head latent attention: its layers load through Checkpoint::mla_layer",
        },
    }
}
