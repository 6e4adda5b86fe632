//! The rotary embedding of a layer, from `rope_scaling` / `rope_parameters` and the keys
//! around them, with the defaults of `transformers`' `modeling_rope_utils.py`.

use alloc::format;
use alloc::string::String;

use super::read::{describe, required, Obj};
use super::{ConfigError, ModelType};
use crate::error::ShapeError;
use crate::layer::query_scale::{QueryScale, ScalePosition};
use crate::layer::rope::{Rope, RopeLayout, RopeScaling};
use crate::load::json::Value;

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
            ModelType::Gemma3 | ModelType::Gemma3n if sliding => {
                keys("rope_local_base_freq", 10_000.0)
            }
            ModelType::Gemma3 | ModelType::Gemma3n => keys("rope_theta", 1_000_000.0),
            ModelType::GptOss => keys("rope_theta", 150_000.0),
            // GLM-4.5's configuration class rotates half of each head unless told otherwise.
            ModelType::Glm4Moe => Keys {
                partial_default: 0.5,
                ..keys("rope_theta", 10_000.0)
            },
            ModelType::SmolLm3 => keys("rope_theta", 2_000_000.0),
            ModelType::Olmo3 | ModelType::Ernie45 => keys("rope_theta", 500_000.0),
            ModelType::Apertus => keys("rope_theta", 12_000_000.0),
            ModelType::MiniMaxM2 => keys("rope_theta", 5_000_000.0),
            ModelType::Lfm2 => keys("rope_theta", 1_000_000.0),
            // Their configuration classes rotate a quarter of each head unless told otherwise.
            ModelType::Qwen3Next | ModelType::Qwen35 | ModelType::Qwen35Moe => Keys {
                partial_default: 0.25,
                ..keys("rope_theta", 10_000.0)
            },
            // MiMoV2FlashConfig's defaults per layer type.
            ModelType::MiMoV2Flash => Keys {
                partial_default: 0.334,
                ..keys("rope_theta", if sliding { 10_000.0 } else { 5_000_000.0 })
            },
            _ => keys("rope_theta", 10_000.0),
        }
    }

    /// Whether the family's attention rotates only the first features of a head (the others
    /// rotate every feature: their `apply_rotary_pos_emb` has no pass-through part).
    fn partial_rotary(self) -> bool {
        matches!(
            self,
            ModelType::Phi3
                | ModelType::Phi
                | ModelType::GptNeox
                | ModelType::Glm4Moe
                | ModelType::Qwen3Next
                | ModelType::Qwen35
                | ModelType::Qwen35Moe
                | ModelType::MiniMaxM2
                | ModelType::Laguna
                | ModelType::MiMoV2Flash
                | ModelType::Step35
        )
    }

    /// Which features pair up: `(2i, 2i + 1)` for ERNIE 4.5 and Cohere 2 (their
    /// `rotate_half` takes the even and odd features) and Llama 4 (complex pairs), `(i, i + rotary_dim / 2)` for the
    /// others.
    fn rope_layout(self) -> RopeLayout {
        match self {
            ModelType::Ernie45 | ModelType::Cohere2 | ModelType::Llama4 => RopeLayout::Interleaved,
            _ => RopeLayout::RotateHalf,
        }
    }

    /// Whether a rope dictionary that is not nested by layer type is the full layers' alone,
    /// the sliding ones rotating by the default rule (Gemma 3's `rope_local_base_freq`,
    /// OLMo 3's `rope_theta`).
    fn flat_rope_is_full_layers(self) -> bool {
        matches!(
            self,
            ModelType::Gemma3 | ModelType::Gemma3n | ModelType::Olmo3
        )
    }

    /// Whether a config without a rope dictionary is refused: the configuration classes of
    /// gpt-oss (a YaRN), Apertus (a llama3 scaling), Ministral 3 (a YaRN with its query
    /// scale) and Gemma 4 and Laguna (one per layer type) default to one of their own, which
    /// real configs state.
    fn needs_rope_dict(self) -> bool {
        matches!(
            self,
            ModelType::GptOss
                | ModelType::Apertus
                | ModelType::Ministral3
                | ModelType::Gemma4
                | ModelType::Laguna
                | ModelType::Step35
        )
    }
}

/// The rotary embedding of layer `layer` (one that has one) whose heads are `head_dim` wide
/// and which slides its window (`sliding`) or not. Gemma 3's and OLMo 3's sliding layers take
/// no scaling unless `rope_parameters` is nested by layer type (Gemma 3's read
/// `rope_local_base_freq`); gpt-oss and Apertus need their rope dictionary (the default of
/// their configuration classes is not implemented). Granite SWA's base is the layer's
/// `layer_rope_theta` when listed; Hunyuan's `dynamic` type with an `alpha` multiplies the
/// base by `alpha^(head_dim / (head_dim − 2))`; MiniMax-M2 without a
/// `partial_rotary_factor` rotates `rotary_dim` features.
pub(super) fn read(
    top: &Obj<'_, '_>,
    model_type: ModelType,
    (layer, sliding): (usize, bool),
    head_dim: usize,
    max_positions: usize,
) -> Result<Rope> {
    let kind = match sliding {
        true => "sliding_attention",
        false => "full_attention",
    };
    let dict = match rope_dict(top, kind)? {
        (Some(_), false) if model_type.flat_rope_is_full_layers() && sliding => None,
        (Some(_), false) if model_type == ModelType::Step35 => return Err(step_flat_rope(top)),
        (dict, _) => dict,
    };
    if dict.is_none() && model_type.needs_rope_dict() {
        // Either spelling holds it: v5 configs write rope_parameters, older ones rope_scaling.
        return Err(ConfigError::Missing {
            key: String::from("rope_parameters (or rope_scaling)"),
        });
    }
    let keys = model_type.rope_keys(sliding);
    let theta = match layer_theta_found(top, model_type, layer)? {
        Some(theta) => Some(theta),
        None => first_f64(dict.as_ref(), top, "rope_theta", keys.theta)?,
    };
    let theta = theta.unwrap_or_else(|| Found::default(top, keys.theta, keys.theta_default));
    if theta.value <= 0.0 {
        return Err(theta.invalid("must be positive"));
    }
    let theta = match (model_type, &dict) {
        (ModelType::HunyuanDense, Some(dict)) => ntk_alpha(dict, theta, head_dim)?,
        _ => theta,
    };
    let partial = first_f64(dict.as_ref(), top, "partial_rotary_factor", keys.partial)?;
    let partial = match partial {
        Some(partial) => partial,
        None => legacy_rotary_dim(top, model_type, head_dim)?
            .unwrap_or_else(|| Found::default(top, keys.partial, keys.partial_default)),
    };
    let head_dim_given = top.get("head_dim")?.is_some();
    // Gemma 4 rotates whole heads; its factor counts the pairs of a proportional rope.
    let rotated = match model_type {
        ModelType::Gemma4 => Found::default(top, keys.partial, 1.0),
        _ => partial.clone(),
    };
    let rotary_dim = rotary_dim(model_type, &rotated, head_dim, head_dim_given)?;
    let scaling = match &dict {
        Some(dict) => scaling(dict, model_type, max_positions, (head_dim, &partial))?,
        None => RopeScaling::Default,
    };
    let rope = Rope {
        theta: theta.value,
        rotary_dim,
        layout: model_type.rope_layout(),
        scaling,
    };
    check_table(&rope, head_dim, max_positions, &theta, dict.as_ref())?;
    Ok(rope)
}

/// Granite SWA's `layer_rope_theta[layer]`, when the list is given: its base for the layer,
/// 0 for a layer without rotary (also for `null`).
pub(super) fn layer_theta(top: &Obj<'_, '_>, layer: usize) -> Result<Option<f64>> {
    Ok(layer_theta_found(top, ModelType::GraniteSwa, layer)?.map(|found| found.value))
}

/// [`layer_theta`] of a Granite SWA model with its key, `None` for the other families.
fn layer_theta_found(
    top: &Obj<'_, '_>,
    model_type: ModelType,
    layer: usize,
) -> Result<Option<Found>> {
    let key = "layer_rope_theta";
    let list = match model_type {
        ModelType::GraniteSwa => top.array(key)?,
        _ => None,
    };
    let Some(list) = list else {
        return Ok(None);
    };
    let entry = format!("{}[{layer}]", top.key(key));
    let value = match list.get(layer) {
        Some(Value::Null) => 0.0,
        Some(v @ Value::Number(n)) => n.parse::<f64>().map_err(|_| ConfigError::WrongType {
            key: entry.clone(),
            expected: "a number",
            found: describe(v),
        })?,
        Some(v) => {
            return Err(ConfigError::WrongType {
                key: entry,
                expected: "a number or null",
                found: describe(v),
            })
        }
        None => {
            let reason = format!("needs one per layer, layer {layer} asked for");
            let entries = format!("{} entries", list.len());
            return Err(ConfigError::invalid(top.key(key), entries, reason));
        }
    };
    Ok(Some(Found {
        value,
        written: format!("{value}"),
        key: entry,
    }))
}

/// Whether Granite 4.0-H's `position_embedding_type` is `"rope"` (`"nope"` and `null`, its
/// default, are no rotary embedding); another value is [`ConfigError::Unsupported`].
pub(super) fn position_embedding_is_rope(top: &Obj<'_, '_>) -> Result<bool> {
    let key = "position_embedding_type";
    match top.str(key)? {
        Some("rope") => Ok(true),
        None | Some("nope") => Ok(false),
        Some(other) => Err(ConfigError::Unsupported {
            key: top.key(key),
            value: format!("\"{other}\""),
            reason: "the position embeddings read are \"rope\" and \"nope\" (or null: none)",
        }),
    }
}

/// Hunyuan's NTK-alpha base (`HunYuanDenseV1RotaryEmbedding`: rope type `dynamic` with an
/// `alpha`): `theta · alpha^(head_dim / (head_dim − 2))`, fixed whatever the sequence length.
/// A `dynamic` type without `alpha` (dynamic NTK scaling) is left to [`scaling`], which
/// refuses it.
fn ntk_alpha(dict: &Obj<'_, '_>, theta: Found, head_dim: usize) -> Result<Found> {
    let Some(alpha) = dict.f64("alpha")?.filter(|_| is_ntk_alpha(dict)) else {
        return Ok(theta);
    };
    if !(alpha > 0.0 && alpha.is_finite()) {
        return Err(invalid(dict, "alpha", "must be positive"));
    }
    if head_dim <= 2 {
        let reason =
            "NTK-alpha rotary needs head_dim > 2 (the exponent is head_dim / (head_dim - 2))";
        return Err(ConfigError::invalid("head_dim", head_dim, reason));
    }
    let exponent = head_dim as f64 / (head_dim - 2) as f64;
    let value = theta.value * crate::kernels::math::trig::powf(alpha, exponent);
    Ok(Found {
        value,
        written: format!(
            "{} (times alpha = {} to the {exponent:?}: {value:?})",
            theta.written,
            dict.written("alpha")
        ),
        key: theta.key,
    })
}

/// Whether the rope dictionary is Hunyuan's NTK-alpha: type `dynamic` with a non-zero `alpha`
/// (as `HunYuanDenseV1RotaryEmbedding` tests it).
fn is_ntk_alpha(dict: &Obj<'_, '_>) -> bool {
    let dynamic = matches!(rope_type(dict), Ok((_, "dynamic")));
    dynamic && matches!(dict.f64("alpha"), Ok(Some(alpha)) if alpha != 0.0)
}

/// MiniMax-M2's `rotary_dim` (as `MiniMaxM2Config` reads it: `partial_rotary_factor =
/// rotary_dim / head_dim` when no factor is given), for the other families `None`.
fn legacy_rotary_dim(
    top: &Obj<'_, '_>,
    model_type: ModelType,
    head_dim: usize,
) -> Result<Option<Found>> {
    let key = "rotary_dim";
    let rotary = match model_type {
        ModelType::MiniMaxM2 => top.usize(key)?,
        _ => None,
    };
    match rotary {
        None => Ok(None),
        Some(rotary) if rotary > head_dim => Err(ConfigError::invalid(
            top.key(key),
            rotary,
            format!("must be at most head_dim = {head_dim}"),
        )),
        Some(rotary) => Ok(Some(Found {
            value: rotary as f64 / head_dim as f64,
            key: top.key(key),
            written: format!("{rotary}"),
        })),
    }
}

/// Ministral 3's query scale from its rope dictionary: `llama_4_scaling_beta` and the period
/// `original_max_position_embeddings`, both required (its attention reads both).
pub(super) fn llama_4_scaling(top: &Obj<'_, '_>) -> Result<QueryScale> {
    let Some(dict) = rope_dict(top, "full_attention")?.0 else {
        return Err(ConfigError::Missing {
            key: String::from("rope_parameters"),
        });
    };
    let beta = required(
        &dict,
        "llama_4_scaling_beta",
        dict.f64("llama_4_scaling_beta")?,
    )?;
    Ok(QueryScale {
        beta,
        period: positive(&dict, "original_max_position_embeddings")?,
        offset: 0,
        from: ScalePosition::Position,
    })
}

/// The most rotary features a `config.json` layer may have: 2^17 (the widest heads of
/// published models have 512 features), so that reading the config computes at most 2^16
/// frequencies.
const MAX_ROTARY_DIM: usize = 1 << 17;

/// Checks `rope` as the layer's builder will, and that every position below `max_positions`
/// (the model's context) is within [`RopeAngles::max_position`](crate::RopeAngles::max_position): errors name the key at fault in the rope dictionary `dict` (if any) or
/// else the key that makes the frequencies fast ([`fast_key`]), `theta`'s for a rotary inverse
/// frequency that is not finite, `max_position_embeddings` for angles that pass
/// [`MAX_ANGLE`](crate::kernels::math::trig::MAX_ANGLE).
fn check_table(
    rope: &Rope,
    head_dim: usize,
    max_positions: usize,
    theta: &Found,
    dict: Option<&Obj<'_, '_>>,
) -> Result<()> {
    if rope.rotary_dim > MAX_ROTARY_DIM {
        return Err(ConfigError::Unsupported {
            key: String::from("head_dim"),
            value: format!("{head_dim}"),
            reason: "rotary embeddings of more than 2^17 features are not read from config.json",
        });
    }
    let (reason, error) = match rope.checked_frequencies(head_dim) {
        Ok((_, max)) if max >= max_positions.saturating_sub(1) => return Ok(()),
        Ok((inv, max)) => {
            let fastest = inv.iter().copied().fold(0.0, f64::max);
            let reason = format!(
                "the fastest rotary frequency, {fastest:?} radians per position, turns positions from {} on (below max_position_embeddings = {max_positions}) past the angles sin_cos reduces exactly",
                max + 1
            );
            let fast = fast_key(rope, theta, dict);
            return Err(fast
                .unwrap_or_else(|| Found::usize("max_position_embeddings", max_positions))
                .invalid(reason));
        }
        Err(error) => (format!("{error}"), error),
    };
    let dict_key = |key: &str| dict.map_or_else(|| String::from(key), |d| d.key(key));
    let fast = fast_key(rope, theta, dict);
    Err(match error {
        ShapeError::Setting { what, value, .. } => match what.strip_prefix("rope_scaling ") {
            Some(key) => ConfigError::invalid(dict_key(key), value, reason),
            None => match (yarn_beta_at_fault(rope), dict) {
                (Some(key), Some(dict)) => invalid(dict, key, reason),
                _ => fast.as_ref().unwrap_or(theta).invalid(reason),
            },
        },
        _ => ConfigError::invalid("head_dim", head_dim, reason),
    })
}

/// The YaRN boundary (`beta_fast` or `beta_slow`) whose default (32 or 1) in its place makes
/// every rotary frequency finite, when there is one: a boundary of so few rotations that
/// `original_max_position_embeddings / (2π · beta)` overflows makes them NaN.
fn yarn_beta_at_fault(rope: &Rope) -> Option<&'static str> {
    let RopeScaling::Yarn {
        beta_fast,
        beta_slow,
        ..
    } = rope.scaling
    else {
        return None;
    };
    let with = |fast, slow| {
        let mut scaling = rope.scaling;
        if let RopeScaling::Yarn {
            beta_fast,
            beta_slow,
            ..
        } = &mut scaling
        {
            (*beta_fast, *beta_slow) = (fast, slow);
        }
        Rope { scaling, ..*rope }.inverse_frequencies().is_ok()
    };
    if with(32.0, beta_slow) {
        Some("beta_fast")
    } else if with(beta_fast, 1.0) {
        Some("beta_slow")
    } else {
        None
    }
}

/// The number that makes rotary frequencies faster than 1 radian per position: `theta` below
/// 1, else the scaling factor below 1 (`original_max_position_embeddings` when YaRN derived
/// such a factor from it); `None` when neither is.
fn fast_key(rope: &Rope, theta: &Found, dict: Option<&Obj<'_, '_>>) -> Option<Found> {
    let factor = match rope.scaling {
        RopeScaling::Default => 1.0,
        RopeScaling::Linear { factor }
        | RopeScaling::Llama3 { factor, .. }
        | RopeScaling::Yarn { factor, .. }
        | RopeScaling::Proportional { factor, .. } => factor,
    };
    let found = |dict: &Obj<'_, '_>, key: &str| Found {
        value: factor,
        key: dict.key(key),
        written: dict.written(key),
    };
    match dict {
        _ if theta.value < 1.0 => Some(theta.clone()),
        Some(dict) if factor < 1.0 && matches!(dict.f64("factor"), Ok(None)) => {
            Some(found(dict, "original_max_position_embeddings"))
        }
        Some(dict) if factor < 1.0 => Some(found(dict, "factor")),
        _ => None,
    }
}

/// A number of the file: its value, the full path of its key and its text as written.
#[derive(Clone)]
struct Found {
    value: f64,
    key: String,
    written: String,
}

impl Found {
    /// `key` of `obj` when absent: `value`, written as it displays.
    fn default(obj: &Obj<'_, '_>, key: &str, value: f64) -> Self {
        Found {
            value,
            key: obj.key(key),
            written: format!("{value}"),
        }
    }

    /// A top-level integer `key` = `value`.
    fn usize(key: &str, value: usize) -> Self {
        Found {
            value: value as f64,
            key: String::from(key),
            written: format!("{value}"),
        }
    }

    /// [`ConfigError::Invalid`] for this number.
    fn invalid(&self, reason: impl Into<String>) -> ConfigError {
        ConfigError::invalid(self.key.as_str(), self.written.as_str(), reason)
    }
}

/// `key` of the rope dictionary, else `top_key` of the top level.
fn first_f64(
    dict: Option<&Obj<'_, '_>>,
    top: &Obj<'_, '_>,
    key: &str,
    top_key: &str,
) -> Result<Option<Found>> {
    let found = |obj: &Obj<'_, '_>, key: &str| -> Result<Option<Found>> {
        Ok(obj.f64(key)?.map(|value| Found {
            value,
            key: obj.key(key),
            written: obj.written(key),
        }))
    };
    match dict.map(|d| found(d, key)).transpose()?.flatten() {
        Some(x) => Ok(Some(x)),
        None => found(top, top_key),
    }
}

/// [`ConfigError::Invalid`] for `key` of `obj`, its value as written.
fn invalid(obj: &Obj<'_, '_>, key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::invalid(obj.key(key), obj.written(key), reason)
}

/// The rope dictionary and whether it was nested: `rope_scaling` when it is a non-empty
/// object (it replaces `rope_parameters`, as in `transformers`), else `rope_parameters`; when
/// that is nested by layer type (`{"full_attention": {...}, "sliding_attention": {...}}`), the
/// entry of `kind`, this layer's type.
pub(super) fn rope_dict<'v, 'a>(
    top: &Obj<'v, 'a>,
    kind: &str,
) -> Result<(Option<Obj<'v, 'a>>, bool)> {
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

/// Step 3.5's rope dictionary not nested by layer type: `Step3p7TextConfig` then ignores it
/// and reads the legacy per-layer `rope_theta` / `partial_rotary_factors` lists, not read.
fn step_flat_rope(top: &Obj<'_, '_>) -> ConfigError {
    let key = match top.object("rope_scaling") {
        Ok(Some(scaling)) if !scaling.is_empty() => "rope_scaling",
        _ => "rope_parameters",
    };
    ConfigError::Unsupported {
        key: top.key(key),
        value: top.written(key),
        reason: "Step 3.5's rotary is read from rope_parameters nested by layer type \
                 (full_attention, sliding_attention); the legacy per-layer rope_theta and \
                 partial_rotary_factors lists are not read",
    }
}

/// The layer types a rope dictionary may be nested by.
const LAYER_TYPES: [&str; 2] = ["full_attention", "sliding_attention"];

/// `int(head_dim * partial_rotary_factor)` rounded up to even: `transformers` computes
/// `inv_freq` for `ceil(dim / 2)` pairs and rotates as many features as its cos table is wide,
/// so an odd width rotates one feature more. The rounded width must fit in the head (whose
/// width is `hidden_size / heads` unless `head_dim` is `given`).
fn rotary_dim(
    model_type: ModelType,
    partial: &Found,
    head_dim: usize,
    given: bool,
) -> Result<usize> {
    if !(0.0..=1.0).contains(&partial.value) {
        return Err(partial.invalid("must be between 0 and 1"));
    }
    if partial.value != 1.0 && !model_type.partial_rotary() {
        return Err(ConfigError::Unsupported {
            key: partial.key.clone(),
            value: partial.written.clone(),
            reason: "this family's attention rotates whole heads (only phi3, phi, gpt_neox, glm4_moe, minimax_m2, laguna, mimo_v2_flash, step3p5 and the qwen3_next / qwen3_5 families rotate part of a head)",
        });
    }
    // Exact: the product of two doubles rounded once, then truncated, as Python does.
    let dim = ((head_dim as f64 * partial.value) as usize).checked_next_multiple_of(2);
    match dim.filter(|&dim| dim <= head_dim) {
        Some(dim) => Ok(dim),
        None if partial.value == 1.0 => {
            let width = match given {
                true => "is odd",
                false => {
                    let heads = model_type.heads_key();
                    &format!("(head_dim absent: hidden_size / {heads}) is odd")
                }
            };
            Err(ConfigError::invalid(
                "head_dim",
                head_dim,
                format!("{width}, but the rotary embedding turns the features of a head in pairs"),
            ))
        }
        None => Err(partial.invalid(format!(
            "rotates an odd number of features of head_dim {head_dim}, the last one unpaired"
        ))),
    }
}

/// The frequency scaling of `rope_type` (or the older `type`; `default` when neither), for
/// heads of `head_dim` of which `partial` rotate (Gemma 4's `proportional`).
fn scaling(
    dict: &Obj<'_, '_>,
    model_type: ModelType,
    max_positions: usize,
    (head_dim, partial): (usize, &Found),
) -> Result<RopeScaling> {
    let (key, rope_type) = rope_type(dict)?;
    if model_type == ModelType::Phi3 && rope_type != "default" {
        // Phi3Config turns every other type ("su", "yarn", "longrope") into longrope.
        let reason = "Phi-3 reads it as longrope, which is not implemented";
        return Err(unsupported_type(dict, (key, rope_type), reason));
    }
    match (rope_type, model_type) {
        ("proportional", ModelType::Gemma4) => proportional(dict, head_dim, partial),
        // NTK-alpha changes the base only (ntk_alpha).
        ("dynamic", ModelType::HunyuanDense) if is_ntk_alpha(dict) => Ok(RopeScaling::Default),
        ("proportional", _) => Err(unsupported_type(
            dict,
            (key, rope_type),
            "proportional rope is read for gemma4_text only",
        )),
        _ => scaling_of(dict, max_positions),
    }
}

/// `_compute_proportional_rope_parameters`: `⌊partial · head_dim / 2⌋` pairs turn (`partial`
/// between 0 and 1), their frequencies divided by `factor` (1 when absent).
fn proportional(dict: &Obj<'_, '_>, head_dim: usize, partial: &Found) -> Result<RopeScaling> {
    if !(0.0..=1.0).contains(&partial.value) {
        return Err(partial.invalid("must be between 0 and 1"));
    }
    let factor = match dict.f64("factor")? {
        Some(_) => factor(dict)?,
        None => 1.0,
    };
    // Python's `int(partial * head_dim // 2)`: the product rounded once, then floored.
    let pairs = crate::kernels::math::trig::floor(partial.value * head_dim as f64 / 2.0) as usize;
    Ok(RopeScaling::Proportional { pairs, factor })
}

/// The key naming the rope type (`rope_type`, or the older `type`) and the type (`default`
/// when neither is given).
fn rope_type<'v>(dict: &Obj<'v, '_>) -> Result<(&'static str, &'v str)> {
    Ok(match dict.str("rope_type")? {
        Some(t) => ("rope_type", t),
        None => ("type", dict.str("type")?.unwrap_or("default")),
    })
}

/// The rope type `rope_type` under `key`, not implemented for `reason`.
fn unsupported_type(
    dict: &Obj<'_, '_>,
    (key, rope_type): (&str, &str),
    reason: &'static str,
) -> ConfigError {
    ConfigError::Unsupported {
        key: dict.key(key),
        value: describe(&Value::String(String::from(rope_type))),
        reason,
    }
}

/// The frequency scaling `rope_type` (or `type`) names, whatever the family.
pub(super) fn scaling_of(dict: &Obj<'_, '_>, max_positions: usize) -> Result<RopeScaling> {
    let (key, rope_type) = rope_type(dict)?;
    match rope_type {
        "default" => Ok(RopeScaling::Default),
        "linear" => Ok(RopeScaling::Linear {
            factor: factor(dict)?,
        }),
        "llama3" => llama3(dict, max_positions),
        "yarn" => yarn(dict, max_positions),
        _ => Err(unsupported_type(
            dict,
            (key, rope_type),
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
        Err(invalid(dict, key, "must be positive"))
    }
}

/// The scaling `factor`, required and positive.
fn factor(dict: &Obj<'_, '_>) -> Result<f64> {
    positive(dict, "factor")
}

/// `original_max_position_embeddings` (a context length: at least 1), else
/// `max_position_embeddings` (as `standardize_rope_params` fills it in).
fn original_max(dict: &Obj<'_, '_>, max_positions: usize) -> Result<f64> {
    let key = "original_max_position_embeddings";
    match dict.f64(key)? {
        Some(x) if x >= 1.0 => Ok(x),
        Some(_) => Err(invalid(dict, key, "must be at least 1")),
        None => Ok(max_positions as f64),
    }
}

fn llama3(dict: &Obj<'_, '_>, max_positions: usize) -> Result<RopeScaling> {
    let low_freq_factor = positive(dict, "low_freq_factor")?;
    let high_freq_factor = positive(dict, "high_freq_factor")?;
    if high_freq_factor <= low_freq_factor {
        let low = dict.written("low_freq_factor");
        let reason = format!("must be greater than low_freq_factor = {low}");
        return Err(invalid(dict, "high_freq_factor", reason));
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
    let attention_factor = attention_factor(dict, factor)?;
    // Python's `or`: absent, null and 0 take the default.
    let or = |key: &str, default| match dict.f64(key)? {
        Some(x) if x != 0.0 => positive(dict, key),
        _ => Ok(default),
    };
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast: or("beta_fast", 32.0)?,
        beta_slow: or("beta_slow", 1.0)?,
        attention_factor,
        truncate: dict.bool("truncate")?.unwrap_or(true),
    })
}

/// YaRN's attention factor: `attention_factor`, else derived from `factor`, `mscale` and
/// `mscale_all_dim` (neither negative); finite and positive also in `f32`, the type of the
/// rotary table it multiplies.
fn attention_factor(dict: &Obj<'_, '_>, factor: f64) -> Result<f64> {
    let (key, value) = match dict.f64("attention_factor")? {
        Some(_) => ("attention_factor", positive(dict, "attention_factor")?),
        None => {
            let mscale = non_negative(dict, "mscale")?;
            let mscale_all_dim = non_negative(dict, "mscale_all_dim")?;
            let derived = RopeScaling::yarn_attention_factor(factor, mscale, mscale_all_dim);
            ("mscale", derived)
        }
    };
    let in_f32 = value as f32;
    if in_f32.is_finite() && in_f32 > 0.0 {
        return Ok(value);
    }
    // A derived factor comes from mscale over mscale_all_dim: the reason names the other.
    let with = match key {
        "mscale" => format!(
            " (with mscale_all_dim = {})",
            dict.written("mscale_all_dim")
        ),
        _ => String::new(),
    };
    let reason = format!(
        "gives the attention factor {value:?}{with}, {in_f32:?} in f32, which must be finite and > 0"
    );
    Err(invalid(dict, key, reason))
}

/// The number under `key`, if any; it must not be negative.
fn non_negative(dict: &Obj<'_, '_>, key: &str) -> Result<Option<f64>> {
    match dict.f64(key)? {
        Some(x) if x < 0.0 => Err(invalid(dict, key, "must not be negative")),
        x => Ok(x),
    }
}
