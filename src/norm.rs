//! Per-head normalisation of queries and keys (QK-norm): RMSNorm with a learned weight.

use alloc::vec::Vec;

/// Which features one RMSNorm of a query or key spans.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QkNormSpan {
    /// Each head's `head_dim` features on their own (Qwen3, Gemma 3): the weights hold
    /// `head_dim` values, shared by all heads.
    #[default]
    PerHead,
    /// The whole projected row: `H · head_dim` features of a query, `Hkv · head_dim` of a key
    /// (OLMo 2); the weights hold that many values.
    Whole,
}

/// RMSNorm over queries and keys, after the projections (and their biases) and before the
/// rotary embedding: `y = x / sqrt(mean(x²) + eps) · weight`.
#[derive(Clone, Debug, PartialEq)]
pub struct QkNorm {
    /// Which features one norm spans.
    pub span: QkNormSpan,
    /// The query weights (`head_dim` values for [`QkNormSpan::PerHead`], `H · head_dim` for
    /// [`QkNormSpan::Whole`]).
    pub q_weight: Vec<f32>,
    /// The key weights (`head_dim` values, or `Hkv · head_dim`).
    pub k_weight: Vec<f32>,
    /// Added to the mean square (`rms_norm_eps`).
    pub eps: f32,
}
