//! The `config.json` of a multi-head latent attention model (`deepseek_v3`, Kimi K2's
//! `kimi_k2`, `deepseek_v2`, `mistral4`, `longcat_flash`) -> [`MlaConfig`]: the widths, the
//! rotary embedding of the `p` rotated features, the softmax scale, the norms' `eps`, Mistral
//! 4's position-dependent query scale and LongCat-Flash's LoRA scales.

use alloc::format;
use alloc::string::{String, ToString};

use super::read::{required, Obj};
use super::rope::{rope_dict, scaling_of};
use super::{ConfigError, ModelType};
use crate::kernels::math::trig::{floor, sqrt};
use crate::layer::latent::{MlaBuilder, MlaLayer, MlaShape, MlaWeights};
use crate::layer::query_scale::QueryScale;
use crate::layer::rope::{Rope, RopeLayout, RopeScaling};
use crate::load::json;

type Result<T> = core::result::Result<T, ConfigError>;

/// The `model_type`s whose attention is DeepSeek's MLA, as `config.json` spells them.
const MLA_TYPES: [&str; 5] = [
    "deepseek_v3",
    "kimi_k2",
    "deepseek_v2",
    "mistral4",
    "longcat_flash",
];

/// LongCat-Flash's `model_type`: two MLA blocks per layer, LoRA scales.
const LONGCAT: &str = "longcat_flash";
/// Mistral 4's `model_type`: the `llama_4_scaling_beta` query scale.
const MISTRAL4: &str = "mistral4";

/// One MLA model's attention settings (every layer's alike), read from `config.json`.
///
/// ```
/// use mha::{MlaConfig, RopeLayout};
/// let json = r#"{"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
///     "num_hidden_layers": 61, "q_lora_rank": 1536, "kv_lora_rank": 512,
///     "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
///     "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
///     "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
///         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}"#;
/// let config = MlaConfig::from_json(json)?;
/// assert_eq!((config.shape.kv_lora_rank, config.shape.latent_width()), (512, 576));
/// assert_eq!(config.rope.layout, RopeLayout::Interleaved);
/// let mscale = 0.1 * 40f64.ln() + 1.0;
/// assert_eq!(config.scale, (mscale * mscale / 192f64.sqrt()) as f32);
/// # Ok::<(), mha::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    /// `model_type`: one of `deepseek_v3`, `kimi_k2`, `deepseek_v2`, `mistral4`,
    /// `longcat_flash`.
    pub model_type: &'static str,
    /// The number of MLA layers: `num_hidden_layers`; for LongCat-Flash, whose every layer
    /// holds two MLA blocks, `2 · num_layers` (MLA layer `i` is block `i mod 2` of layer
    /// `i / 2`, as `transformers` numbers their caches: see
    /// [`tensor_prefix`](Self::tensor_prefix)).
    pub num_hidden_layers: usize,
    /// The widths.
    pub shape: MlaShape,
    /// The rotary embedding of the `qk_rope_head_dim` features: interleaved pairs unless
    /// `rope_interleave` is false (DeepSeek-V2's complex pairs are interleaved pairs too;
    /// LongCat-Flash's are interleaved whatever `rope_interleave` says).
    pub rope: Rope,
    /// The softmax scale, [`MlaShape::softmax_scale`] with YaRN's `factor` and `mscale_all_dim`.
    pub scale: f32,
    /// The `eps` of `q_a_layernorm` and `kv_a_layernorm`: 1e-6 whatever `rms_norm_eps` says
    /// (`transformers` and DeepSeek's own code build both with RMSNorm's default).
    pub eps: f32,
    /// Mistral 4's position-dependent query scale (`llama_4_scaling_beta` over
    /// `original_max_position_embeddings` of the rope dictionary, from the token's position, as
    /// Ministral 3's), applied to the queries after RoPE; `None` for the other families.
    pub query_scale: Option<QueryScale>,
    /// LongCat-Flash's LoRA scales, folded into the norm weights when a checkpoint's layers are
    /// loaded; `None` for the other families.
    pub lora_scales: Option<LoraScales>,
}

/// LongCat-Flash's LoRA scales: its queries (rotated features and not) are multiplied by
/// `query = √(D / q_lora_rank)` and its normalised latent `c` by `latent = √(D /
/// kv_lora_rank)`. Both products are linear in a norm's output, so loading folds them into the
/// norm weights: `q_a_layernorm`'s times `query`, `kv_a_layernorm`'s times `latent` (each
/// product in `f64`, rounded once to `f32`); the cache then holds the scaled latent, as
/// `transformers`' does.
///
/// ```
/// let json = r#"{"model_type": "longcat_flash", "hidden_size": 48, "num_attention_heads": 3,
///     "num_layers": 2, "q_lora_rank": 12, "kv_lora_rank": 20, "qk_nope_head_dim": 8,
///     "qk_rope_head_dim": 4, "head_dim": 4, "v_head_dim": 10}"#;
/// let config = mha::MlaConfig::from_json(json)?;
/// let scales = config.lora_scales.unwrap();
/// assert_eq!((scales.query, scales.latent), (2.0, (48f64 / 20.0).sqrt()));
/// // Two MLA blocks per layer: self_attn.0 and self_attn.1.
/// assert_eq!(config.num_hidden_layers, 4);
/// assert_eq!(config.tensor_prefix(3), "model.layers.1.self_attn.1.");
/// # Ok::<(), mha::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraScales {
    /// The queries' factor, `√(hidden_size / q_lora_rank)`.
    pub query: f64,
    /// The normalised latent's factor, `√(hidden_size / kv_lora_rank)`.
    pub latent: f64,
}

impl MlaConfig {
    /// Reads the text of a `config.json`.
    ///
    /// # Errors
    /// [`ConfigError::Json`] for text that is not JSON, [`ConfigError::UnknownModelType`] for
    /// a `model_type` that is not MLA, [`ConfigError::Missing`] or [`ConfigError::WrongType`]
    /// for a missing or mistyped width, [`ConfigError::Invalid`] for widths
    /// [`MlaShape::check`] rejects or an odd
    /// `qk_rope_head_dim`, and what the rope dictionary's reader rejects;
    /// [`ConfigError::Unsupported`] for `attention_bias` true. Mistral 4: a missing
    /// `llama_4_scaling_beta` or `original_max_position_embeddings`, a rotary width
    /// (`partial_rotary_factor`, or a default rope) other than `qk_rope_head_dim`. LongCat-Flash:
    /// a missing `num_layers` or `q_lora_rank`, a `qk_head_dim` other than `n + p` or a
    /// `head_dim` other than `p`.
    pub fn from_json(text: &str) -> Result<Self> {
        let value = json::parse(text)?;
        let top = Obj::root(&value)?;
        let name = required(&top, "model_type", top.str("model_type")?)?;
        let Some(model_type) = MLA_TYPES.into_iter().find(|&t| t == name) else {
            return Err(ConfigError::UnknownModelType {
                model_type: name.to_string(),
            });
        };
        let width = |key: &str| required(&top, key, top.usize(key)?);
        let shape = MlaShape {
            d_model: width("hidden_size")?,
            n_heads: width("num_attention_heads")?,
            q_lora_rank: top.usize("q_lora_rank")?,
            kv_lora_rank: width("kv_lora_rank")?,
            qk_nope_head_dim: width("qk_nope_head_dim")?,
            qk_rope_head_dim: width("qk_rope_head_dim")?,
            v_head_dim: width("v_head_dim")?,
        };
        shape.check().map_err(|error| {
            let widths = "hidden_size, num_attention_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim";
            let value = format!("{shape:?}");
            ConfigError::invalid(widths, value, error.to_string())
        })?;
        refuse_biases(&top)?;
        let (rope, yarn) = read_rope(&top, &shape, model_type)?;
        Ok(MlaConfig {
            model_type,
            num_hidden_layers: layer_count(&top, model_type)?,
            shape,
            rope,
            scale: shape.softmax_scale(yarn),
            eps: 1e-6,
            query_scale: match model_type {
                MISTRAL4 => Some(mistral4_query_scale(&top, &shape)?),
                _ => None,
            },
            lora_scales: match model_type {
                LONGCAT => Some(longcat_scales(&top, &shape)?),
                _ => None,
            },
        })
    }

    /// The prefix of MLA layer `layer`'s tensors: `model.layers.{layer}.self_attn.`; for
    /// LongCat-Flash `model.layers.{layer / 2}.self_attn.{layer mod 2}.` (its two blocks per
    /// layer, numbered as `transformers` numbers their caches, `2 · layer + block`).
    pub fn tensor_prefix(&self, layer: usize) -> String {
        match self.model_type {
            LONGCAT => format!("model.layers.{}.self_attn.{}.", layer / 2, layer % 2),
            _ => format!("model.layers.{layer}.self_attn."),
        }
    }

    /// A builder of the layer over `weights` with this config's rope, scale, `eps` and query
    /// scale. LongCat-Flash's [`lora_scales`](Self::lora_scales) are not applied here:
    /// [`Checkpoint::mla_layer`](crate::Checkpoint::mla_layer) folds them into the norm
    /// weights it reads; weights given by hand must hold them already.
    pub fn builder<'a>(&self, weights: MlaWeights<'a>) -> MlaBuilder<'a> {
        let builder = MlaLayer::builder(weights, self.rope)
            .scale(self.scale)
            .eps(self.eps);
        match self.query_scale {
            Some(scale) => builder.query_scale(scale),
            None => builder,
        }
    }
}

/// The number of MLA layers: `num_hidden_layers`, LongCat-Flash's `2 · num_layers`.
fn layer_count(top: &Obj<'_, '_>, model_type: &str) -> Result<usize> {
    if model_type != LONGCAT {
        return required(top, "num_hidden_layers", top.usize("num_hidden_layers")?);
    }
    let layers = required(top, "num_layers", top.usize("num_layers")?)?;
    let reason = "two MLA blocks per layer overflow the layer count";
    layers
        .checked_mul(2)
        .ok_or_else(|| ConfigError::invalid("num_layers", layers, reason))
}

/// `attention_bias` true puts biases on `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj`, which
/// the layer does not take.
fn refuse_biases(top: &Obj<'_, '_>) -> Result<()> {
    match top.bool("attention_bias")? {
        Some(true) => Err(ConfigError::Unsupported {
            key: String::from("attention_bias"),
            value: String::from("true"),
            reason: "multi-head latent attention layers are read without projection biases",
        }),
        _ => Ok(()),
    }
}

/// Mistral 4's query scale, read as Ministral 3's (`llama_4_scaling_beta` and
/// `original_max_position_embeddings` of the rope dictionary, both required), after checking
/// its rotary width: `transformers` rotates `⌊head_dim · partial_rotary_factor⌋` features with
/// `head_dim = n + p` (the factor `p / (n + p)` when absent; a default rope all `n + p`), which
/// must be `p`.
fn mistral4_query_scale(top: &Obj<'_, '_>, shape: &MlaShape) -> Result<QueryScale> {
    let (p, head) = (shape.qk_rope_head_dim, shape.q_head());
    if let (Some(dict), _) = rope_dict(top, "full_attention")? {
        let kind = dict.str("rope_type")?.or(dict.str("type")?);
        let spans = match (kind, dict.f64("partial_rotary_factor")?) {
            (None | Some("default"), _) => head as f64,
            (_, Some(factor)) => floor(head as f64 * factor),
            (_, None) => p as f64,
        };
        if spans != p as f64 {
            let reason = format!(
                "Mistral 4's rotary embedding would span {spans} features of a head of n + p = {head}, where qk_rope_head_dim = {p}"
            );
            let key = match dict.f64("partial_rotary_factor")? {
                Some(_) => "partial_rotary_factor",
                None => "rope_type",
            };
            return Err(ConfigError::invalid(
                dict.key(key),
                dict.written(key),
                reason,
            ));
        }
    }
    let scale = super::read_query_scale(top, ModelType::Ministral3, true)?;
    scale.ok_or_else(|| ConfigError::Missing {
        key: String::from("llama_4_scaling_beta"),
    })
}

/// LongCat-Flash's LoRA scales; its query LoRA is required, and the widths `transformers`
/// reads apart must agree: `qk_head_dim` (when given) is `n + p`, `head_dim` (the rotary
/// embedding's width, 64 when absent) is `p`.
fn longcat_scales(top: &Obj<'_, '_>, shape: &MlaShape) -> Result<LoraScales> {
    let (n, p) = (shape.qk_nope_head_dim, shape.qk_rope_head_dim);
    let rank = required(top, "q_lora_rank", shape.q_lora_rank)?;
    for (key, want, default) in [("qk_head_dim", n + p, n + p), ("head_dim", p, 64)] {
        let given = top.usize(key)?.unwrap_or(default);
        if given != want {
            let reason = format!(
                "LongCat-Flash's attention needs {want} (qk_nope_head_dim {n}, qk_rope_head_dim {p})"
            );
            return Err(ConfigError::invalid(key, given, reason));
        }
    }
    let ratio = |key: &str, width: usize| match width {
        0 => Err(ConfigError::invalid(key, 0, "the LoRA scale divides by it")),
        _ => Ok(sqrt(shape.d_model as f64 / width as f64)),
    };
    Ok(LoraScales {
        query: ratio("q_lora_rank", rank)?,
        latent: ratio("kv_lora_rank", shape.kv_lora_rank)?,
    })
}

/// The rotary embedding (theta from the rope dictionary or the top level, 10,000 when absent,
/// LongCat-Flash's 10^7) and, for a scaled rope with a nonzero `mscale_all_dim`, `(factor,
/// mscale_all_dim)` for the softmax scale (as `transformers`' `yarn_apply_mscale`).
fn read_rope(
    top: &Obj<'_, '_>,
    shape: &MlaShape,
    model_type: &str,
) -> Result<(Rope, Option<(f64, f64)>)> {
    let p = shape.qk_rope_head_dim;
    if !p.is_multiple_of(2) {
        let reason = "the rotary embedding turns features in pairs";
        return Err(ConfigError::invalid("qk_rope_head_dim", p, reason));
    }
    let max_positions = top.usize("max_position_embeddings")?.unwrap_or(4096);
    let (dict, _) = rope_dict(top, "full_attention")?;
    let (scaling, theta) = match &dict {
        Some(dict) => (scaling_of(dict, max_positions)?, dict.f64("rope_theta")?),
        None => (RopeScaling::Default, None),
    };
    let (default_theta, interleave) = match model_type {
        LONGCAT => (10_000_000.0, Some(true)),
        _ => (10_000.0, top.bool("rope_interleave")?),
    };
    let theta = theta.or(top.f64("rope_theta")?).unwrap_or(default_theta);
    let rope = Rope {
        theta,
        rotary_dim: p,
        layout: match interleave.unwrap_or(true) {
            true => RopeLayout::Interleaved,
            false => RopeLayout::RotateHalf,
        },
        scaling,
    };
    let yarn = match (scaling, &dict) {
        (RopeScaling::Yarn { factor, .. }, Some(dict)) => dict
            .f64("mscale_all_dim")?
            .filter(|&all| all != 0.0)
            .map(|all| (factor, all)),
        _ => None,
    };
    Ok((rope, yarn))
}
