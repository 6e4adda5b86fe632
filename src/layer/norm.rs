//! Per-head normalisation of queries and keys (QK-norm): RMSNorm with a learned weight.

use alloc::vec::Vec;

use crate::error::{finite_non_negative, ShapeError};
use crate::kernels::math::trig::sqrt;

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

/// Where the QK-norm sits relative to the rotary embedding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QkNormPlacement {
    /// Right after the projections and their biases, before RoPE (Qwen3, Gemma 3, OLMo 2).
    #[default]
    BeforeRope,
    /// After RoPE (Llama 4's weight-less L2 norm, Hunyuan's weighted one).
    AfterRope,
}

/// RMSNorm over queries and keys, after the projections (and their biases) and before the
/// rotary embedding: `y = x / sqrt(mean(x²) + eps) · weight`.
///
/// A layer takes it with [`MhaBuilder::qk_norm`](crate::MhaBuilder::qk_norm), which checks the
/// weights' lengths and `eps` (finite and `>= 0`). The keys are normalised before they are
/// cached, so a [`KvCache`](crate::KvCache) holds normalised keys. The norm is computed in
/// `f32`, the squares summed in feature order, so its bits depend neither on the thread count
/// nor on how a sequence is cut into decoding steps. A span whose mean square plus `eps` is 0
/// (all zeros with `eps = 0`) stays zeros instead of becoming `0 / 0`.
///
/// ```
/// use mha::{Matrix, Mha, MhaParams, QkNorm, QkNormSpan, Tensor};
/// // Qwen3-style: 2 query heads of 3 (Q = 6) over a model width of 4, one key/value head.
/// let params = MhaParams::from_parts(
///     Matrix::<4, 6>::from_fn(|r, c| (r + c) as f32 * 0.1),
///     Matrix::<4, 3>::from_fn(|r, c| (r * c) as f32 * 0.1),
///     Matrix::<4, 3>::identity(),
///     Matrix::<6, 4>::identity(),
/// );
/// let norm = QkNorm {
///     span: QkNormSpan::PerHead,
///     q_weight: vec![1.0, 0.5, 2.0],
///     k_weight: vec![1.0; 3],
///     eps: 1e-6,
/// };
/// let mut layer = Mha::builder(&params, 2).qk_norm(norm.clone()).build()?;
/// assert_eq!(layer.qk_norm(), Some(&norm));
/// let y = layer.forward(&Tensor::<1, 3, 4>::from_fn(|_, t, i| (t + i) as f32))?;
/// assert!(y.as_slice().iter().all(|v| v.is_finite()));
///
/// // Whole-row weights must be H · head_dim and Hkv · head_dim long.
/// let whole = QkNorm { span: QkNormSpan::Whole, ..norm };
/// let error = Mha::builder(&params, 2).qk_norm(whole).build().unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "QK-norm q_weight (H x head_dim) needs 6 elements, but the buffer has 3"
/// );
/// # Ok::<(), mha::ShapeError>(())
/// ```
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

impl QkNorm {
    /// Checks the weights' lengths for `n_heads` query and `n_kv_heads` key heads of
    /// `head_dim`, and `eps`.
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] naming the weight and both lengths,
    /// [`ShapeError::Setting`] for an `eps` that is not finite or is negative.
    pub(crate) fn check(
        &self,
        head_dim: usize,
        n_heads: usize,
        n_kv_heads: usize,
    ) -> Result<(), ShapeError> {
        let lengths = match self.span {
            QkNormSpan::PerHead => [
                ("QK-norm q_weight (head_dim)", head_dim),
                ("QK-norm k_weight (head_dim)", head_dim),
            ],
            QkNormSpan::Whole => [
                ("QK-norm q_weight (H x head_dim)", n_heads * head_dim),
                ("QK-norm k_weight (Hkv x head_dim)", n_kv_heads * head_dim),
            ],
        };
        for ((what, expected), weight) in lengths.into_iter().zip([&self.q_weight, &self.k_weight])
        {
            if weight.len() != expected {
                return Err(ShapeError::LengthMismatch {
                    what,
                    expected,
                    actual: weight.len(),
                });
            }
        }
        finite_non_negative("QK-norm eps", self.eps).map(drop)
    }

    /// Normalises whole rows of projected queries in place: every run of as many values as the
    /// weight holds (a head, or a whole row, as [`QkNorm::check`] made sure), each run on its
    /// own, so the rows may go in any grouping.
    pub(crate) fn queries(&self, q: &mut [f32]) {
        rms_norm(q, &self.q_weight, self.eps);
    }

    /// [`QkNorm::queries`] for rows of projected keys.
    pub(crate) fn keys(&self, k: &mut [f32]) {
        rms_norm(k, &self.k_weight, self.eps);
    }
}

/// RMSNorm in place of every run of `weight.len()` values of `values`:
/// `x / sqrt(mean(x²) + eps) · w`, the squares summed in order.
pub(crate) fn rms_norm(values: &mut [f32], weight: &[f32], eps: f32) {
    rms_norm_runs(values, weight.len(), eps, |i| weight[i]);
}

/// The value norm (Gemma 4's `v_norm`): RMSNorm without weights of every run of `head_dim`
/// values (each value head of rows of projected values), `x / sqrt(mean(x²) + eps)`, the
/// squares summed in order; the bits of [`rms_norm`] with weights of 1.
pub(crate) fn value_norm(values: &mut [f32], head_dim: usize, eps: f32) {
    rms_norm_runs(values, head_dim, eps, |_| 1.0);
}

/// RMSNorm in place of every run of `width` values of `values`, feature `i` of a run
/// multiplied by `weight(i)` (`i < width`).
fn rms_norm_runs(values: &mut [f32], width: usize, eps: f32, weight: impl Fn(usize) -> f32) {
    if width == 0 {
        return;
    }
    for run in values.chunks_exact_mut(width) {
        let squares = run.iter().fold(0.0f32, |sum, &x| sum + x * x);
        let inverse = inverse_root(squares / width as f32 + eps);
        for (i, x) in run.iter_mut().enumerate() {
            *x = *x * inverse * weight(i);
        }
    }
}

/// `1/√m` in `f32`; 0 for `m = 0`, so that a span of zeros with `eps = 0` stays zeros.
fn inverse_root(m: f32) -> f32 {
    if m == 0.0 {
        return 0.0;
    }
    (1.0 / sqrt(f64::from(m))) as f32
}
