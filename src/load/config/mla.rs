//! The `config.json` of a multi-head latent attention model (`deepseek_v3`, Kimi K2's
//! `kimi_k2`, `deepseek_v2`) -> [`MlaConfig`]: the widths, the rotary embedding of the `p`
//! rotated features, the softmax scale and the norms' `eps`.

use alloc::format;
use alloc::string::ToString;

use super::read::{required, Obj};
use super::rope::{rope_dict, scaling_of};
use super::ConfigError;
use crate::layer::latent::{MlaBuilder, MlaLayer, MlaShape, MlaWeights};
use crate::layer::rope::{Rope, RopeLayout, RopeScaling};
use crate::load::json;

type Result<T> = core::result::Result<T, ConfigError>;

/// The `model_type`s whose attention is DeepSeek's MLA, as `config.json` spells them.
const MLA_TYPES: [&str; 3] = ["deepseek_v3", "kimi_k2", "deepseek_v2"];

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
    /// `model_type`: one of `deepseek_v3`, `kimi_k2`, `deepseek_v2`.
    pub model_type: &'static str,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// The widths.
    pub shape: MlaShape,
    /// The rotary embedding of the `qk_rope_head_dim` features: interleaved pairs unless
    /// `rope_interleave` is false (DeepSeek-V2's complex pairs are interleaved pairs too).
    pub rope: Rope,
    /// The softmax scale, [`MlaShape::softmax_scale`] with YaRN's `factor` and `mscale_all_dim`.
    pub scale: f32,
    /// The `eps` of `q_a_layernorm` and `kv_a_layernorm`: 1e-6 whatever `rms_norm_eps` says
    /// (`transformers` and DeepSeek's own code build both with RMSNorm's default).
    pub eps: f32,
}

impl MlaConfig {
    /// Reads the text of a `config.json`.
    ///
    /// # Errors
    /// [`ConfigError::Json`] for text that is not JSON, [`ConfigError::UnknownModelType`] for
    /// a `model_type` that is not MLA, [`ConfigError::Missing`] or [`ConfigError::WrongType`]
    /// for a missing or mistyped width, [`ConfigError::Invalid`] for widths
    /// [`MlaShape::check`] rejects or an odd
    /// `qk_rope_head_dim`, and what the rope dictionary's reader rejects.
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
        let (rope, yarn) = read_rope(&top, &shape)?;
        Ok(MlaConfig {
            model_type,
            num_hidden_layers: width("num_hidden_layers")?,
            shape,
            rope,
            scale: shape.softmax_scale(yarn),
            eps: 1e-6,
        })
    }

    /// A builder of the layer over `weights` with this config's rope, scale and `eps`.
    pub fn builder<'a>(&self, weights: MlaWeights<'a>) -> MlaBuilder<'a> {
        MlaLayer::builder(weights, self.rope)
            .scale(self.scale)
            .eps(self.eps)
    }
}

/// The rotary embedding (theta from the rope dictionary or the top level, 10,000 when absent)
/// and, for a scaled rope with a nonzero `mscale_all_dim`, `(factor, mscale_all_dim)` for the
/// softmax scale (as `transformers`' `yarn_apply_mscale`).
fn read_rope(top: &Obj<'_, '_>, shape: &MlaShape) -> Result<(Rope, Option<(f64, f64)>)> {
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
    let theta = theta.or(top.f64("rope_theta")?).unwrap_or(10_000.0);
    let interleave = top.bool("rope_interleave")?.unwrap_or(true);
    let rope = Rope {
        theta,
        rotary_dim: p,
        layout: match interleave {
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
