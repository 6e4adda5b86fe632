//! Typed flat buffers: [`Tensor<B, T, D>`] for activations and [`Matrix<R, C>`] for weights.
//!
//! Both own one row-major `Vec<f32>`; the shape lives in the type, so a weight of the wrong size
//! or a merge into the wrong shape is a compile error, not a run-time surprise.

use alloc::vec;
use alloc::vec::Vec;
use core::ops::{Index, IndexMut};

use crate::error::ShapeError;

/// Multiplies the dimensions of a shape, failing instead of overflowing.
pub(crate) fn element_count(dims: &[usize]) -> Result<usize, ShapeError> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or(ShapeError::TooLarge)
}

/// Accepts `data` when its length is the product of `dims`.
pub(crate) fn checked_buffer(
    what: &'static str,
    dims: &[usize],
    data: Vec<f32>,
) -> Result<Vec<f32>, ShapeError> {
    let expected = element_count(dims)?;
    if data.len() != expected {
        return Err(ShapeError::LengthMismatch {
            what,
            expected,
            actual: data.len(),
        });
    }
    Ok(data)
}

/// A batch of token sequences: shape `(B, T, D)` = (batch, tokens, features), stored row-major
/// (feature index fastest) in one flat `Vec<f32>`.
///
/// Element `(b, t, i)` lives at index `(b * T + t) * D + i`.
///
/// ```
/// use mha::Tensor;
/// let x = Tensor::from([[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]]);
/// assert_eq!(x[(0, 1, 2)], 6.0);
/// assert_eq!(x.as_slice(), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor<const B: usize, const T: usize, const D: usize> {
    data: Vec<f32>,
}

impl<const B: usize, const T: usize, const D: usize> Tensor<B, T, D> {
    /// Wraps a flat row-major buffer of `B * T * D` values.
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] when `data.len() != B * T * D`.
    pub fn from_vec(data: Vec<f32>) -> Result<Self, ShapeError> {
        checked_buffer("Tensor (B, T, D)", &[B, T, D], data).map(|data| Self { data })
    }

    /// Builds a tensor whose element `(b, t, i)` is `f(b, t, i)`.
    pub fn from_fn(mut f: impl FnMut(usize, usize, usize) -> f32) -> Self {
        let mut data = Vec::with_capacity(B * T * D);
        for b in 0..B {
            for t in 0..T {
                for i in 0..D {
                    data.push(f(b, t, i));
                }
            }
        }
        Self { data }
    }

    /// A tensor of zeros.
    pub fn zeros() -> Self {
        Self {
            data: vec![0.0; B * T * D],
        }
    }

    /// The flat row-major buffer, `B * T * D` values.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The flat row-major buffer, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Gives back the flat row-major buffer.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// Element `(b, t, i)`, or `None` when an index is out of range.
    pub fn get(&self, b: usize, t: usize, i: usize) -> Option<f32> {
        (b < B && t < T && i < D).then(|| self.data[(b * T + t) * D + i])
    }

    /// The `D` features of token `t` of batch element `b`, or `None` when out of range.
    pub fn token(&self, b: usize, t: usize) -> Option<&[f32]> {
        (b < B && t < T).then(|| &self.data[(b * T + t) * D..][..D])
    }
}

impl<const B: usize, const T: usize, const D: usize> Index<(usize, usize, usize)>
    for Tensor<B, T, D>
{
    type Output = f32;
    /// Panics when an index is out of range, as slice indexing does; see [`Tensor::get`].
    fn index(&self, (b, t, i): (usize, usize, usize)) -> &f32 {
        assert!(
            b < B && t < T && i < D,
            "index ({b}, {t}, {i}) out of range for Tensor ({B}, {T}, {D})"
        );
        &self.data[(b * T + t) * D + i]
    }
}

impl<const B: usize, const T: usize, const D: usize> IndexMut<(usize, usize, usize)>
    for Tensor<B, T, D>
{
    fn index_mut(&mut self, (b, t, i): (usize, usize, usize)) -> &mut f32 {
        assert!(
            b < B && t < T && i < D,
            "index ({b}, {t}, {i}) out of range for Tensor ({B}, {T}, {D})"
        );
        &mut self.data[(b * T + t) * D + i]
    }
}

impl<const B: usize, const T: usize, const D: usize> From<[[[f32; D]; T]; B]> for Tensor<B, T, D> {
    fn from(nested: [[[f32; D]; T]; B]) -> Self {
        Self::from_fn(|b, t, i| nested[b][t][i])
    }
}

/// A weight matrix of shape `(R, C)`, stored row-major.
///
/// The crate uses the `x @ W` convention: rows are inputs and columns are outputs, so a
/// projection from `D` features to `E` features is a `Matrix<D, E>`. (PyTorch's `nn.Linear`
/// stores the transpose.) Element `(r, c)` lives at index `r * C + c`.
///
/// ```
/// use mha::Matrix;
/// let w = Matrix::from([[1.0, 2.0], [3.0, 4.0]]);
/// assert_eq!(w[(1, 0)], 3.0);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix<const R: usize, const C: usize> {
    data: Vec<f32>,
}

impl<const R: usize, const C: usize> Matrix<R, C> {
    /// Wraps a flat row-major buffer of `R * C` values.
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] when `data.len() != R * C`.
    pub fn from_vec(data: Vec<f32>) -> Result<Self, ShapeError> {
        checked_buffer("Matrix (R, C)", &[R, C], data).map(|data| Self { data })
    }

    /// Builds a matrix whose element `(r, c)` is `f(r, c)`.
    pub fn from_fn(mut f: impl FnMut(usize, usize) -> f32) -> Self {
        let mut data = Vec::with_capacity(R * C);
        for r in 0..R {
            for c in 0..C {
                data.push(f(r, c));
            }
        }
        Self { data }
    }

    /// A matrix of zeros.
    pub fn zeros() -> Self {
        Self {
            data: vec![0.0; R * C],
        }
    }

    /// The identity-like matrix: ones where `r == c`, zeros elsewhere.
    pub fn identity() -> Self {
        Self::from_fn(|r, c| if r == c { 1.0 } else { 0.0 })
    }

    /// The flat row-major buffer, `R * C` values.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The flat row-major buffer, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Gives back the flat row-major buffer.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// Element `(r, c)`, or `None` when an index is out of range.
    pub fn get(&self, r: usize, c: usize) -> Option<f32> {
        (r < R && c < C).then(|| self.data[r * C + c])
    }

    /// The transpose, a `Matrix<C, R>`.
    pub fn transpose(&self) -> Matrix<C, R> {
        Matrix::from_fn(|r, c| self.data[c * C + r])
    }
}

impl<const R: usize, const C: usize> Index<(usize, usize)> for Matrix<R, C> {
    type Output = f32;
    /// Panics when an index is out of range, as slice indexing does; see [`Matrix::get`].
    fn index(&self, (r, c): (usize, usize)) -> &f32 {
        assert!(
            r < R && c < C,
            "index ({r}, {c}) out of range for Matrix ({R}, {C})"
        );
        &self.data[r * C + c]
    }
}

impl<const R: usize, const C: usize> IndexMut<(usize, usize)> for Matrix<R, C> {
    fn index_mut(&mut self, (r, c): (usize, usize)) -> &mut f32 {
        assert!(
            r < R && c < C,
            "index ({r}, {c}) out of range for Matrix ({R}, {C})"
        );
        &mut self.data[r * C + c]
    }
}

impl<const R: usize, const C: usize> From<[[f32; C]; R]> for Matrix<R, C> {
    fn from(nested: [[f32; C]; R]) -> Self {
        Self::from_fn(|r, c| nested[r][c])
    }
}
