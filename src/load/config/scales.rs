//! Constant factors around a layer's projections that a config states apart from the weights
//! (Falcon-H1's `attention_in_multiplier`, `key_multiplier`, `attention_out_multiplier`;
//! MiMo-V2-Flash's `attention_value_scale`):
//! loading folds them into the weights and biases, so the layer computes them at no cost.

use alloc::format;

use super::read::{layer_f32, Obj, Range};
use super::{ConfigError, ModelType, Result};

/// Factors folded into a layer's projections when its weights are loaded
/// ([`LayerWeights::from_safetensors`](crate::LayerWeights::from_safetensors),
/// [`Checkpoint`](crate::Checkpoint)); all 1 (nothing folded) but for Falcon-H1 and
/// MiMo-V2-Flash.
///
/// The layer computes `y = output · (merged · Wo + bo)` with
/// `q = (input · x) · Wq + bq`, `k = key · ((input · x) · Wk + bk)` and
/// `v = value · ((input · x) · Wv + bv)`: loading multiplies `Wq` by `input`, `Wk` by
/// `input · key`, `Wv` by `input · value`, `bk` by `key`, `bv` by `value`, and `Wo` and `bo`
/// by `output` (each product rounded once to `f32`; a 16-bit matrix whose factor is not 1 is
/// widened to `f32` first).
///
/// ```
/// let json = r#"{"model_type": "falcon_h1", "hidden_size": 8, "num_attention_heads": 2,
///     "num_key_value_heads": 1, "num_hidden_layers": 1, "key_multiplier": 0.5,
///     "attention_in_multiplier": 2.0, "attention_out_multiplier": 0.25}"#;
/// let config = mha::AttentionConfig::from_json(json, 0)?;
/// let scales = mha::ProjectionScales { input: 2.0, key: 0.5, value: 1.0, output: 0.25 };
/// assert_eq!(config.projection_scales, scales);
/// # Ok::<(), mha::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProjectionScales {
    /// Multiplies the layer's input before the query, key and value projections
    /// (`attention_in_multiplier`).
    pub input: f32,
    /// Multiplies the projected keys, bias included, before QK-norm and rotary
    /// (`key_multiplier`).
    pub key: f32,
    /// Multiplies the projected values, bias included, before the value norm
    /// (`attention_value_scale`).
    pub value: f32,
    /// Multiplies the layer's output, bias included (`attention_out_multiplier`).
    pub output: f32,
}

impl Default for ProjectionScales {
    /// No factor: all 1.
    fn default() -> Self {
        ProjectionScales {
            input: 1.0,
            key: 1.0,
            value: 1.0,
            output: 1.0,
        }
    }
}

/// The factors of `model_type`'s config: Falcon-H1's multipliers (1 when absent), each finite
/// in `f32` (0 and negative factors are read: they are what the model multiplies by).
pub(super) fn read(top: &Obj<'_, '_>, model_type: ModelType) -> Result<ProjectionScales> {
    if model_type != ModelType::FalconH1 {
        return Ok(ProjectionScales::default());
    }
    let factor = |key: &str| {
        let value = top.f64(key)?.unwrap_or(1.0);
        // Finite: a negative factor is finite too, so the range checks its magnitude.
        layer_f32(top, key, "the factor", value.abs(), Range::NonNegative).map(|m| {
            if value < 0.0 {
                -m
            } else {
                m
            }
        })
    };
    let scales = ProjectionScales {
        input: factor("attention_in_multiplier")?,
        key: factor("key_multiplier")?,
        value: 1.0,
        output: factor("attention_out_multiplier")?,
    };
    let wk = scales.input * scales.key;
    if !wk.is_finite() {
        let reason = format!(
            "times attention_in_multiplier = {} gives {wk:?} in f32 (the key weights' factor), which must be finite",
            top.written("attention_in_multiplier")
        );
        return Err(ConfigError::invalid(
            "key_multiplier",
            top.written("key_multiplier"),
            reason,
        ));
    }
    Ok(scales)
}
