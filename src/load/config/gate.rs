//! The output gate of a family's attention layers: one gate per feature or per head, its
//! activation, and where the checkpoint keeps its weights.

use super::read::{describe, Obj};
use super::{ConfigError, ModelType, Result};
use crate::layer::gate::{GateActivation, GateSpan};
use crate::load::json::Value;

/// Where a checkpoint keeps an output gate's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateTensor {
    /// In `q_proj`, after each head's query rows: `[q_h | gate_h]` per head `h`, `2 · Q` rows
    /// in all (Qwen3.5, Qwen3-Next).
    InQuery,
    /// A projection of its own, `g_proj` (`G` rows, no bias): Laguna, Step 3.5.
    Own,
}

/// An attention layer's output gate as its config describes it (the layer's
/// [`OutputGate`](crate::OutputGate) once its weights are read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateConfig {
    /// One gate per feature or per head.
    pub span: GateSpan,
    /// Sigmoid or softplus.
    pub activation: GateActivation,
    /// Where its weights are stored.
    pub tensor: GateTensor,
}

impl GateConfig {
    /// The gate's width `G` in a layer of `n_heads` heads over `Q = q` features: `Q` values
    /// per token for one gate per feature, `H` for one per head.
    pub(crate) fn width(&self, q: usize, n_heads: usize) -> usize {
        match self.span {
            GateSpan::PerElement => q,
            GateSpan::PerHead => n_heads,
        }
    }
}

/// The output gate of the family's attention: Qwen3.5's and Qwen3-Next's sigmoid per feature
/// in `q_proj`; Laguna's softplus in `g_proj`, per head when `gating` is `true` (its default)
/// or `"per-head"`, per feature when `false` or `"per-element"`; Step 3.5's sigmoid in
/// `g_proj`, per head.
///
/// # Errors
/// [`ConfigError::Unsupported`] for another `gating` string, or Step 3.5's per-feature
/// `gating` (`Step3p7Attention` multiplies its `[H·D]` gate into `[H, D]` heads, which
/// broadcasts for no model of more than one head); [`ConfigError::WrongType`] for a `gating`
/// neither a boolean nor a string.
pub(super) fn read(top: &Obj<'_, '_>, model_type: ModelType) -> Result<Option<GateConfig>> {
    match model_type {
        ModelType::Qwen3Next | ModelType::Qwen35 | ModelType::Qwen35Moe => Ok(Some(GateConfig {
            span: GateSpan::PerElement,
            activation: GateActivation::Sigmoid,
            tensor: GateTensor::InQuery,
        })),
        ModelType::Laguna => Ok(Some(GateConfig {
            span: gating_span(
                top,
                "Laguna's gating is true, false, \"per-head\" or \"per-element\"",
            )?,
            activation: GateActivation::Softplus,
            tensor: GateTensor::Own,
        })),
        ModelType::Step35 => match gating_span(top, "Step 3.5's gating is true or \"per-head\"")? {
            GateSpan::PerHead => Ok(Some(GateConfig {
                span: GateSpan::PerHead,
                activation: GateActivation::Sigmoid,
                tensor: GateTensor::Own,
            })),
            GateSpan::PerElement => Err(ConfigError::Unsupported {
                key: top.key("gating"),
                value: top.written("gating"),
                reason: "Step 3.5's gate per feature does not broadcast over its heads in \
                         transformers (Step3p7Attention); only its gate per head is read",
            }),
        },
        _ => Ok(None),
    }
}

/// `gating` (Laguna's, Step 3.5's): `true` (the default) or `"per-head"` one gate per head,
/// `false` or `"per-element"` one per feature; another string is refused with `reason`.
fn gating_span(top: &Obj<'_, '_>, reason: &'static str) -> Result<GateSpan> {
    let key = "gating";
    match top.get(key)? {
        None | Some(Value::Bool(true)) => Ok(GateSpan::PerHead),
        Some(Value::Bool(false)) => Ok(GateSpan::PerElement),
        Some(Value::String(s)) if s == "per-head" => Ok(GateSpan::PerHead),
        Some(Value::String(s)) if s == "per-element" => Ok(GateSpan::PerElement),
        Some(v @ Value::String(_)) => Err(ConfigError::Unsupported {
            key: top.key(key),
            value: describe(v),
            reason,
        }),
        Some(v) => Err(ConfigError::WrongType {
            key: top.key(key),
            expected: "a boolean or a string",
            found: describe(v),
        }),
    }
}
