//! The weights of one attention layer and its optional biases, in the shapes their types state.

use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::front::tensor::Matrix;
use crate::layer::Biases;

/// The four weight matrices of one attention layer, in the `x @ W` convention (rows are input
/// features, columns output features).
///
/// `D` is the model width (the input tokens and the output), `E` the width of the tokens keys
/// and values are computed from (`E = D` for self-attention; the memory's width for
/// cross-attention), `Q` the query width `n_heads · head_dim` (`D` unless the model's heads are
/// not `D / n_heads` wide, as in Qwen3 or Gemma) and `KV` the key/value width
/// `n_kv_heads · head_dim`: `Q` for plain multi-head attention, less for grouped-query or
/// multi-query attention. `MhaParams<D>` is the plain self-attention case.
///
/// ```
/// use mha::{Matrix, MhaParams};
/// let p = MhaParams::new(Matrix::<4, 4>::identity(), Matrix::identity(), Matrix::identity(), Matrix::identity());
/// assert_eq!(p.wq[(2, 2)], 1.0);
/// ```
///
/// A weight of the wrong size does not compile:
///
/// ```compile_fail,E0308
/// use mha::{Matrix, MhaParams};
/// let p: MhaParams<4> = MhaParams::new(Matrix::<4, 4>::zeros(), Matrix::zeros(), Matrix::zeros(), Matrix::<3, 3>::zeros());
/// ```
///
/// nor does an output projection that does not map the query width back to `D`:
///
/// ```compile_fail,E0308
/// use mha::{Matrix, MhaParams};
/// let p: MhaParams<4, 4, 6, 6> = MhaParams::from_parts(Matrix::<4, 6>::zeros(), Matrix::zeros(), Matrix::zeros(), Matrix::<4, 4>::zeros());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MhaParams<const D: usize, const E: usize = D, const KV: usize = D, const Q: usize = D> {
    /// Query projection `Wq`, `(D, Q)`: `Q = x · Wq`.
    pub wq: Matrix<D, Q>,
    /// Key projection `Wk`, `(E, KV)`: `K = x · Wk` (or `memory · Wk`).
    pub wk: Matrix<E, KV>,
    /// Value projection `Wv`, `(E, KV)`: `V = x · Wv` (or `memory · Wv`).
    pub wv: Matrix<E, KV>,
    /// Output projection `Wo`, `(Q, D)`: `y = merged · Wo`.
    pub wo: Matrix<Q, D>,
}

impl<const D: usize> MhaParams<D> {
    /// Bundles the four `(D, D)` weight matrices of plain multi-head self-attention.
    pub fn new(wq: Matrix<D, D>, wk: Matrix<D, D>, wv: Matrix<D, D>, wo: Matrix<D, D>) -> Self {
        Self { wq, wk, wv, wo }
    }
}

impl<const D: usize, const E: usize, const KV: usize, const Q: usize> MhaParams<D, E, KV, Q> {
    /// Bundles the weights of any shape: cross-attention (`E ≠ D`), grouped-query attention
    /// (`KV < Q`) and heads not `D / n_heads` wide (`Q ≠ D`).
    ///
    /// ```
    /// use mha::{Matrix, MhaParams};
    /// // Queries of width 8, keys and values from 6-wide memory tokens, 2 key/value heads of 2.
    /// let p = MhaParams::from_parts(Matrix::<8, 8>::zeros(), Matrix::<6, 4>::zeros(), Matrix::<6, 4>::zeros(), Matrix::<8, 8>::zeros());
    /// assert_eq!(p.wk.as_slice().len(), 24);
    /// // Model width 4, 2 query heads of 3 (Q = 6) and 1 key/value head (KV = 3).
    /// let p = MhaParams::from_parts(Matrix::<4, 6>::zeros(), Matrix::<4, 3>::zeros(), Matrix::<4, 3>::zeros(), Matrix::<6, 4>::zeros());
    /// assert_eq!(p.wo.as_slice().len(), 24);
    /// ```
    pub fn from_parts(
        wq: Matrix<D, Q>,
        wk: Matrix<E, KV>,
        wv: Matrix<E, KV>,
        wo: Matrix<Q, D>,
    ) -> Self {
        Self { wq, wk, wv, wo }
    }
}

/// Optional projection biases (BERT and GPT-2 layers have them): `Q = x·Wq + bq`,
/// `K = x·Wk + bk`, `V = x·Wv + bv`, `y = merged·Wo + bo`. Each is a row vector; `D`, `KV`
/// and `Q` are as in [`MhaParams`].
///
/// ```
/// use mha::{Matrix, MhaBiases};
/// let biases = MhaBiases::<4> { bq: Some(Matrix::from([[0.1, 0.2, 0.3, 0.4]])), ..MhaBiases::default() };
/// assert!(biases.bo.is_none());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MhaBiases<const D: usize, const KV: usize = D, const Q: usize = D> {
    /// Query bias, `(1, Q)`.
    pub bq: Option<Matrix<1, Q>>,
    /// Key bias, `(1, KV)`.
    pub bk: Option<Matrix<1, KV>>,
    /// Value bias, `(1, KV)`.
    pub bv: Option<Matrix<1, KV>>,
    /// Output bias, `(1, D)`.
    pub bo: Option<Matrix<1, D>>,
}

impl<const D: usize, const KV: usize, const Q: usize> Default for MhaBiases<D, KV, Q> {
    fn default() -> Self {
        Self {
            bq: None,
            bk: None,
            bv: None,
            bo: None,
        }
    }
}

/// The run-time biases, typed: each checked to hold its width.
impl<const D: usize, const KV: usize, const Q: usize> TryFrom<&Biases> for MhaBiases<D, KV, Q> {
    type Error = ShapeError;

    fn try_from(biases: &Biases) -> Result<Self, ShapeError> {
        fn typed<const C: usize>(
            row: &Option<Vec<f32>>,
        ) -> Result<Option<Matrix<1, C>>, ShapeError> {
            row.clone().map(Matrix::from_vec).transpose()
        }
        Ok(MhaBiases {
            bq: typed(&biases.bq)?,
            bk: typed(&biases.bk)?,
            bv: typed(&biases.bv)?,
            bo: typed(&biases.bo)?,
        })
    }
}

impl<const D: usize, const KV: usize, const Q: usize> From<MhaBiases<D, KV, Q>> for Biases {
    fn from(biases: MhaBiases<D, KV, Q>) -> Self {
        Biases {
            bq: biases.bq.map(Matrix::into_vec),
            bk: biases.bk.map(Matrix::into_vec),
            bv: biases.bv.map(Matrix::into_vec),
            bo: biases.bo.map(Matrix::into_vec),
        }
    }
}
