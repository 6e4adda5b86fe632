//! What MiMo-V2-Flash (`mimo_v2_flash`) sets per layer, as `MiMoV2FlashAttention` derives it:
//! the sliding layers' doubled key/value head count, value heads of their own width
//! (`v_head_dim`), the constant factor of the values (`attention_value_scale`) and attention
//! sinks on the sliding layers.

use super::read::{layer_f32, Obj, Range};
use super::{at_least_one, AttentionConfig, ProjectionScales, Result};

/// MiMo-V2-Flash's settings of one layer.
#[derive(Clone, Copy, Debug)]
pub(super) struct MimoLayer {
    /// The layer's key/value heads: twice `num_key_value_heads` on a sliding layer.
    pub n_kv_heads: usize,
    /// The width of a value head (`v_head_dim`, 128 when absent).
    pub v_head_dim: usize,
    /// `attention_value_scale` (0.707 when absent, 1 when `null`).
    pub value_scale: f32,
    /// Whether the layer slides its window (and so has sinks).
    pub sliding: bool,
}

impl MimoLayer {
    /// `config` (read with the layer's head count) with the value heads, the value factor and
    /// the sliding layers' sinks.
    pub(super) fn apply(&self, config: AttentionConfig) -> AttentionConfig {
        let projection_scales = ProjectionScales {
            value: self.value_scale,
            ..config.projection_scales
        };
        AttentionConfig {
            v_head_dim: self.v_head_dim,
            projection_scales,
            sinks: self.sliding,
            ..config
        }
    }
}

/// The settings of a layer that slides its window (`sliding`) or not, over the model's
/// `num_key_value_heads`.
///
/// # Errors
/// [`ConfigError::Invalid`](super::ConfigError::Invalid) for a `v_head_dim` of 0, a doubled
/// head count that overflows, or an `attention_value_scale` that is not finite in `f32`.
pub(super) fn read(top: &Obj<'_, '_>, sliding: bool, kv_heads: usize) -> Result<MimoLayer> {
    let v_head_dim = top.usize("v_head_dim")?.unwrap_or(128);
    if v_head_dim == 0 {
        return Err(at_least_one("v_head_dim"));
    }
    let n_kv_heads = match sliding {
        true => kv_heads.checked_mul(2).ok_or_else(|| {
            let reason = "doubled on the sliding layers, overflows";
            super::ConfigError::invalid("num_key_value_heads", kv_heads, reason)
        })?,
        false => kv_heads,
    };
    let key = "attention_value_scale";
    let value_scale = match top.raw(key)? {
        None => 0.707,
        Some(_) => match top.f64(key)? {
            None => 1.0,
            Some(scale) => layer_f32(top, key, "the value factor", scale, Range::Finite)?,
        },
    };
    Ok(MimoLayer {
        n_kv_heads,
        v_head_dim,
        value_scale,
        sliding,
    })
}
