//! The rotary embedding of a layer, from `rope_scaling` / `rope_parameters` and the keys
//! around them, with the defaults of `transformers`' `modeling_rope_utils.py`.

use alloc::format;
use alloc::string::String;

use super::read::{describe, required, Obj};
use super::{ConfigError, ModelType};
use crate::json::Value;
use crate::rope::{Rope, RopeLayout, RopeScaling};

type Result<T> = core::result::Result<T, ConfigError>;

/// Where a family keeps its rotary settings outside the rope dictionary.
struct Keys {
    /// The base of the frequencies.
    theta: &'static str,
    /// That base when absent.
    theta_default: f64,
    /// The fraction of each head that rotates.
    partial: &'static str,
    /// That fraction when absent.
    partial_default: f64,
}

impl ModelType {
    /// The keys of a layer that slides its window (`sliding`) or not.
    fn rope_keys(self, sliding: bool) -> Keys {
        let keys = |theta, theta_default| Keys {
            theta,
            theta_default,
            partial: "partial_rotary_factor",
            partial_default: 1.0,
        };
        match self {
            // GPTNeoXConfig reads its own names and ignores rope_theta / partial_rotary_factor.
            ModelType::GptNeox => Keys {
                theta: "rotary_emb_base",
                theta_default: 10_000.0,
                partial: "rotary_pct",
                partial_default: 0.25,
            },
            // PhiConfig's default rotates half of each head.
            ModelType::Phi => Keys {
                partial_default: 0.5,
                ..keys("rope_theta", 10_000.0)
            },
            ModelType::Gemma3 if sliding => keys("rope_local_base_freq", 10_000.0),
            ModelType::Gemma3 => keys("rope_theta", 1_000_000.0),
            ModelType::GptOss => keys("rope_theta", 150_000.0),
            _ => keys("rope_theta", 10_000.0),
        }
    }

    /// Whether the family's attention rotates only the first features of a head (the others
    /// rotate every feature: their `apply_rotary_pos_emb` has no pass-through part).
    fn partial_rotary(self) -> bool {
        matches!(self, ModelType::Phi3 | ModelType::Phi | ModelType::GptNeox)
    }
}

/// The rotary embedding of a layer whose heads are `head_dim` wide and which slides its
/// window (`sliding`) or not; none for BLOOM. Gemma 3's sliding layers read
/// `rope_local_base_freq` and no scaling unless `rope_parameters` is nested by layer type;
/// gpt-oss needs its rope dictionary (its configuration class's default is not implemented).
pub(super) fn read(
    top: &Obj<'_, '_>,
    model_type: ModelType,
    sliding: bool,
    head_dim: usize,
    max_positions: usize,
) -> Result<Option<Rope>> {
    if model_type == ModelType::Bloom {
        return Ok(None);
    }
    let kind = match sliding {
        true => "sliding_attention",
        false => "full_attention",
    };
    let dict = match rope_dict(top, kind)? {
        (Some(_), false) if model_type == ModelType::Gemma3 && sliding => None,
        (dict, _) => dict,
    };
    if dict.is_none() && model_type == ModelType::GptOss {
        // GptOssConfig's default is a YaRN of its own; real configs state theirs.
        return Err(ConfigError::Missing {
            key: String::from("rope_scaling"),
        });
    }
    let keys = model_type.rope_keys(sliding);
    let theta =
        first_f64(dict.as_ref(), top, "rope_theta", keys.theta)?.unwrap_or(keys.theta_default);
    if theta <= 0.0 {
        return Err(invalid(top, keys.theta, theta, "must be positive"));
    }
    let partial = first_f64(dict.as_ref(), top, "partial_rotary_factor", keys.partial)?
        .unwrap_or(keys.partial_default);
    let rotary_dim = rotary_dim(top, model_type, keys.partial, partial, head_dim)?;
    let scaling = match &dict {
        Some(dict) => scaling(dict, model_type, max_positions)?,
        None => RopeScaling::Default,
    };
    Ok(Some(Rope {
        theta,
        rotary_dim,
        layout: RopeLayout::RotateHalf,
        scaling,
    }))
}

/// `key` of the rope dictionary, else `top_key` of the top level.
fn first_f64(
    dict: Option<&Obj<'_, '_>>,
    top: &Obj<'_, '_>,
    key: &str,
    top_key: &str,
) -> Result<Option<f64>> {
    match dict.map(|d| d.f64(key)).transpose()?.flatten() {
        Some(x) => Ok(Some(x)),
        None => top.f64(top_key),
    }
}

/// [`ConfigError::Invalid`] for `key` of `obj`.
fn invalid(obj: &Obj<'_, '_>, key: &str, value: f64, reason: impl Into<String>) -> ConfigError {
    ConfigError::invalid(obj.key(key), value, reason)
}

/// The rope dictionary and whether it was nested: `rope_scaling` when it is a non-empty
/// object (it replaces `rope_parameters`, as in `transformers`), else `rope_parameters`; when
/// that is nested by layer type (`{"full_attention": {...}, "sliding_attention": {...}}`), the
/// entry of `kind`, this layer's type.
fn rope_dict<'v, 'a>(top: &Obj<'v, 'a>, kind: &str) -> Result<(Option<Obj<'v, 'a>>, bool)> {
    let dict = match top.object("rope_scaling")? {
        Some(scaling) if !scaling.is_empty() => Some(scaling),
        _ => top.object("rope_parameters")?,
    };
    let Some(dict) = dict else {
        return Ok((None, false));
    };
    if !dict.has_any(&LAYER_TYPES) {
        return Ok((Some(dict), false));
    }
    Ok((Some(required(&dict, kind, dict.object(kind)?)?), true))
}

/// The layer types a rope dictionary may be nested by.
const LAYER_TYPES: [&str; 2] = ["full_attention", "sliding_attention"];

/// `int(head_dim * partial_rotary_factor)` rounded up to even: `transformers` computes
/// `inv_freq` for `ceil(dim / 2)` pairs and rotates as many features as its cos table is wide,
/// so an odd width rotates one feature more. The rounded width must fit in the head.
fn rotary_dim(
    top: &Obj<'_, '_>,
    model_type: ModelType,
    key: &str,
    partial: f64,
    head_dim: usize,
) -> Result<usize> {
    if !(0.0..=1.0).contains(&partial) {
        return Err(invalid(top, key, partial, "must be between 0 and 1"));
    }
    if partial != 1.0 && !model_type.partial_rotary() {
        return Err(ConfigError::Unsupported {
            key: top.key(key),
            value: format!("{partial}"),
            reason: "this family's attention rotates whole heads (only phi3, phi and gpt_neox rotate part of a head)",
        });
    }
    // Exact: the product of two doubles rounded once, then truncated, as Python does.
    let dim = ((head_dim as f64 * partial) as usize).checked_next_multiple_of(2);
    let Some(dim) = dim.filter(|&dim| dim <= head_dim) else {
        let reason = format!(
            "rotates an odd number of features of head_dim {head_dim}; features rotate in pairs"
        );
        return Err(invalid(top, key, partial, reason));
    };
    Ok(dim)
}

/// The frequency scaling of `rope_type` (or the older `type`; `default` when neither).
fn scaling(dict: &Obj<'_, '_>, model_type: ModelType, max_positions: usize) -> Result<RopeScaling> {
    let (key, rope_type) = match dict.str("rope_type")? {
        Some(t) => ("rope_type", t),
        None => ("type", dict.str("type")?.unwrap_or("default")),
    };
    let unsupported = |reason| ConfigError::Unsupported {
        key: dict.key(key),
        value: describe(&Value::String(String::from(rope_type))),
        reason,
    };
    if model_type == ModelType::Phi3 && rope_type != "default" {
        // Phi3Config turns every other type ("su", "yarn", "longrope") into longrope.
        return Err(unsupported(
            "Phi-3 reads it as longrope, which is not implemented",
        ));
    }
    match rope_type {
        "default" => Ok(RopeScaling::Default),
        "linear" => Ok(RopeScaling::Linear {
            factor: factor(dict)?,
        }),
        "llama3" => llama3(dict, max_positions),
        "yarn" => yarn(dict, max_positions),
        _ => Err(unsupported(
            "the rope types implemented are default, linear, llama3 and yarn",
        )),
    }
}

/// A positive number under `key`, required.
fn positive(dict: &Obj<'_, '_>, key: &str) -> Result<f64> {
    let x = required(dict, key, dict.f64(key)?)?;
    if x > 0.0 {
        Ok(x)
    } else {
        Err(invalid(dict, key, x, "must be positive"))
    }
}

/// The scaling `factor`, required and positive.
fn factor(dict: &Obj<'_, '_>) -> Result<f64> {
    positive(dict, "factor")
}

/// `original_max_position_embeddings`, else `max_position_embeddings` (as
/// `standardize_rope_params` fills it in).
fn original_max(dict: &Obj<'_, '_>, max_positions: usize) -> Result<f64> {
    match dict.f64("original_max_position_embeddings")? {
        Some(_) => positive(dict, "original_max_position_embeddings"),
        None => Ok(max_positions as f64),
    }
}

fn llama3(dict: &Obj<'_, '_>, max_positions: usize) -> Result<RopeScaling> {
    let low_freq_factor = positive(dict, "low_freq_factor")?;
    let high_freq_factor = positive(dict, "high_freq_factor")?;
    if high_freq_factor <= low_freq_factor {
        let reason = format!("must be greater than low_freq_factor = {low_freq_factor}");
        return Err(invalid(dict, "high_freq_factor", high_freq_factor, reason));
    }
    Ok(RopeScaling::Llama3 {
        factor: factor(dict)?,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings: original_max(dict, max_positions)?,
    })
}

/// YaRN, with `_compute_yarn_parameters`' defaults: `factor` (when `null` or absent)
/// `max_position_embeddings / original_max_position_embeddings`; `attention_factor` from
/// `mscale` and `mscale_all_dim` when both are non-zero, else `0.1 · ln(factor) + 1` (1 for
/// `factor ≤ 1`); `beta_fast` 32 and `beta_slow` 1 when absent, `null` or 0; `truncate` true.
fn yarn(dict: &Obj<'_, '_>, max_positions: usize) -> Result<RopeScaling> {
    let original = original_max(dict, max_positions)?;
    let factor = match dict.f64("factor")? {
        Some(_) => factor(dict)?,
        None => max_positions as f64 / original,
    };
    let attention_factor = match dict.f64("attention_factor")? {
        Some(_) => positive(dict, "attention_factor")?,
        None => RopeScaling::yarn_attention_factor(
            factor,
            dict.f64("mscale")?,
            dict.f64("mscale_all_dim")?,
        ),
    };
    let or = |x: Option<f64>, default| x.filter(|&x| x != 0.0).unwrap_or(default);
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast: or(dict.f64("beta_fast")?, 32.0),
        beta_slow: or(dict.f64("beta_slow")?, 1.0),
        attention_factor,
        truncate: dict.bool("truncate")?.unwrap_or(true),
    })
}
