//! The weights of one attention layer and its optional biases, in the shapes their types state.

use crate::tensor::Matrix;

/// The four weight matrices of one attention layer, in the `x @ W` convention (rows are input
/// features, columns output features).
///
/// `D` is the model width (queries and output), `E` the width of the tokens keys and values
/// are computed from (`E = D` for self-attention; the memory's width for cross-attention) and
/// `KV` the key/value width: `D` for plain multi-head attention, `n_kv_heads · D / n_heads` for
/// grouped-query or multi-query attention. `MhaParams<D>` is the plain self-attention case.
///
/// ```
/// use mha::{Matrix, MhaParams};
/// let p = MhaParams::new(Matrix::<4, 4>::identity(), Matrix::identity(), Matrix::identity(), Matrix::identity());
/// assert_eq!(p.wq[(2, 2)], 1.0);
/// ```
///
/// A weight of the wrong size does not compile:
///
/// ```compile_fail
/// use mha::{Matrix, MhaParams};
/// let p: MhaParams<4> = MhaParams::new(Matrix::<4, 4>::zeros(), Matrix::zeros(), Matrix::zeros(), Matrix::<3, 3>::zeros());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MhaParams<const D: usize, const E: usize = D, const KV: usize = D> {
    /// Query projection `Wq`, `(D, D)`: `Q = x · Wq`.
    pub wq: Matrix<D, D>,
    /// Key projection `Wk`, `(E, KV)`: `K = x · Wk` (or `memory · Wk`).
    pub wk: Matrix<E, KV>,
    /// Value projection `Wv`, `(E, KV)`: `V = x · Wv` (or `memory · Wv`).
    pub wv: Matrix<E, KV>,
    /// Output projection `Wo`, `(D, D)`: `y = merged · Wo`.
    pub wo: Matrix<D, D>,
}

impl<const D: usize> MhaParams<D> {
    /// Bundles the four `(D, D)` weight matrices of plain multi-head self-attention.
    pub fn new(wq: Matrix<D, D>, wk: Matrix<D, D>, wv: Matrix<D, D>, wo: Matrix<D, D>) -> Self {
        Self { wq, wk, wv, wo }
    }
}

impl<const D: usize, const E: usize, const KV: usize> MhaParams<D, E, KV> {
    /// Bundles the weights of any shape: cross-attention (`E ≠ D`) and grouped-query attention
    /// (`KV < D`).
    ///
    /// ```
    /// use mha::{Matrix, MhaParams};
    /// // Queries of width 8, keys and values from 6-wide memory tokens, 2 key/value heads of 2.
    /// let p = MhaParams::from_parts(Matrix::<8, 8>::zeros(), Matrix::<6, 4>::zeros(), Matrix::<6, 4>::zeros(), Matrix::<8, 8>::zeros());
    /// assert_eq!(p.wk.as_slice().len(), 24);
    /// ```
    pub fn from_parts(
        wq: Matrix<D, D>,
        wk: Matrix<E, KV>,
        wv: Matrix<E, KV>,
        wo: Matrix<D, D>,
    ) -> Self {
        Self { wq, wk, wv, wo }
    }
}

/// Optional projection biases (BERT and GPT-2 layers have them): `Q = x·Wq + bq`,
/// `K = x·Wk + bk`, `V = x·Wv + bv`, `y = merged·Wo + bo`. Each is a row vector.
///
/// ```
/// use mha::{Matrix, MhaBiases};
/// let biases = MhaBiases::<4> { bq: Some(Matrix::from([[0.1, 0.2, 0.3, 0.4]])), ..MhaBiases::default() };
/// assert!(biases.bo.is_none());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MhaBiases<const D: usize, const KV: usize = D> {
    /// Query bias, `(1, D)`.
    pub bq: Option<Matrix<1, D>>,
    /// Key bias, `(1, KV)`.
    pub bk: Option<Matrix<1, KV>>,
    /// Value bias, `(1, KV)`.
    pub bv: Option<Matrix<1, KV>>,
    /// Output bias, `(1, D)`.
    pub bo: Option<Matrix<1, D>>,
}

impl<const D: usize, const KV: usize> Default for MhaBiases<D, KV> {
    fn default() -> Self {
        Self {
            bq: None,
            bk: None,
            bv: None,
            bo: None,
        }
    }
}

impl<const D: usize, const KV: usize> MhaBiases<D, KV> {
    /// `[bq, bk, bv, bo]` as plain rows.
    pub(crate) fn rows(&self) -> [Option<&[f32]>; 4] {
        [
            self.bq.as_ref().map(Matrix::as_slice),
            self.bk.as_ref().map(Matrix::as_slice),
            self.bv.as_ref().map(Matrix::as_slice),
            self.bo.as_ref().map(Matrix::as_slice),
        ]
    }
}
