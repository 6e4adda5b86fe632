//! Typed flat buffers: [`Tensor<B, T, D>`] for activations and [`Matrix<R, C>`] for weights.
//!
//! Both own one row-major `Vec<f32>`; the shape lives in the type, so a weight of the wrong size
//! or a merge into the wrong shape is a compile error, not a run-time surprise.

use alloc::vec;
use alloc::vec::Vec;
use core::ops::{Index, IndexMut};

use crate::error::ShapeError;
use crate::kernels::buffer::buffer_elements;
use crate::layer::tokens::{Output, Tokens};

/// Accepts `data` when it holds exactly `expected` values.
pub(crate) fn checked_buffer(
    what: &'static str,
    expected: usize,
    data: Vec<f32>,
) -> Result<Vec<f32>, ShapeError> {
    if data.len() != expected {
        return Err(ShapeError::LengthMismatch {
            what,
            expected,
            actual: data.len(),
        });
    }
    Ok(data)
}

/// The element count of an `f32` buffer of a shape fixed at compile time, for the `ELEMENTS`
/// constants of the typed buffers. Panics with `message` — which, evaluated in a constant,
/// stops compilation — when [`buffer_elements`] finds that no such buffer can exist.
pub(crate) const fn const_elements(dims: &[usize], message: &'static str) -> usize {
    match buffer_elements(dims, core::mem::size_of::<f32>()) {
        Some(count) => count,
        None => panic!("{}", message),
    }
}

/// The `len` values `f(index)` of a row-major array of shape `dims` holding `len` elements,
/// in order. The loop runs over the elements, so an empty array costs nothing whatever its
/// other dimensions.
fn row_major<const N: usize>(
    dims: [usize; N],
    len: usize,
    mut f: impl FnMut([usize; N]) -> f32,
) -> Vec<f32> {
    let mut data = Vec::with_capacity(len);
    let mut index = [0; N];
    for _ in 0..len {
        data.push(f(index));
        // The next index: the last axis moves fastest, carrying into the ones before it.
        for axis in (0..N).rev() {
            index[axis] += 1;
            if index[axis] < dims[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    data
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
    /// `B * T * D`. Every constructor evaluates it, so a shape whose buffer could not exist
    /// (more than `isize::MAX` bytes) is a compile-time error naming the shape.
    pub(crate) const ELEMENTS: usize = const_elements(
        &[B, T, D],
        "Tensor<B, T, D>: B * T * D f32 values overflow usize or exceed isize::MAX bytes",
    );

    /// Wraps a flat row-major buffer of `B * T * D` values.
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] when `data.len() != B * T * D`.
    pub fn from_vec(data: Vec<f32>) -> Result<Self, ShapeError> {
        checked_buffer("Tensor (B, T, D)", Self::ELEMENTS, data).map(|data| Self { data })
    }

    /// Builds a tensor whose element `(b, t, i)` is `f(b, t, i)`.
    pub fn from_fn(mut f: impl FnMut(usize, usize, usize) -> f32) -> Self {
        Self {
            data: row_major([B, T, D], Self::ELEMENTS, |[b, t, i]| f(b, t, i)),
        }
    }

    /// A tensor of zeros.
    ///
    /// A shape too large for memory does not compile:
    ///
    /// ```compile_fail,E0080
    /// let x = mha::Tensor::<{ 1 << 62 }, 1, 4>::zeros();
    /// ```
    pub fn zeros() -> Self {
        Self {
            data: vec![0.0; Self::ELEMENTS],
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
        // With D = 0 the offset would multiply indices of axes that may be huge: no features.
        let start = || if D == 0 { 0 } else { (b * T + t) * D };
        (b < B && t < T).then(|| &self.data[start()..][..D])
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
    /// `R * C`. Every constructor evaluates it, so a shape whose buffer could not exist (more
    /// than `isize::MAX` bytes) is a compile-time error naming the shape.
    pub(crate) const ELEMENTS: usize = const_elements(
        &[R, C],
        "Matrix<R, C>: R * C f32 values overflow usize or exceed isize::MAX bytes",
    );

    /// Wraps a flat row-major buffer of `R * C` values.
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] when `data.len() != R * C`.
    pub fn from_vec(data: Vec<f32>) -> Result<Self, ShapeError> {
        checked_buffer("Matrix (R, C)", Self::ELEMENTS, data).map(|data| Self { data })
    }

    /// Builds a matrix whose element `(r, c)` is `f(r, c)`.
    pub fn from_fn(mut f: impl FnMut(usize, usize) -> f32) -> Self {
        Self {
            data: row_major([R, C], Self::ELEMENTS, |[r, c]| f(r, c)),
        }
    }

    /// A matrix of zeros.
    ///
    /// A shape too large for memory does not compile:
    ///
    /// ```compile_fail,E0080
    /// let w = mha::Matrix::<{ 1 << 62 }, 8>::zeros();
    /// ```
    pub fn zeros() -> Self {
        Self {
            data: vec![0.0; Self::ELEMENTS],
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

impl<'a, const B: usize, const T: usize, const D: usize> From<&'a Tensor<B, T, D>> for Tokens<'a> {
    fn from(tensor: &'a Tensor<B, T, D>) -> Self {
        Tokens {
            data: tensor.as_slice(),
            batch: B,
            len: T,
            width: D,
            lengths: None,
        }
    }
}

impl<'a, const B: usize, const T: usize, const D: usize> From<&'a mut Tensor<B, T, D>>
    for Output<'a>
{
    fn from(tensor: &'a mut Tensor<B, T, D>) -> Self {
        Output {
            data: tensor.as_mut_slice(),
            batch: B,
            len: T,
            width: D,
            lengths: None,
            weights: None,
        }
    }
}

/// Inputs of the typed layer [`Mha`](crate::Mha) whose tokens are `D` wide: a
/// `&Tensor<B, T, D>`, whose width the compiler checks, or [`Tokens`], whose width the layer
/// checks when called.
///
/// A tensor of another width does not compile:
///
/// ```compile_fail,E0277
/// use mha::{AttendOptions, Matrix, Mha, MhaParams, Tensor};
/// let w = Matrix::<4, 4>::identity();
/// let mut layer = Mha::new(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2).unwrap();
/// let x = Tensor::<1, 2, 5>::zeros();
/// layer.forward_into(&x, AttendOptions::default(), &mut Tensor::<1, 2, 4>::zeros());
/// ```
pub trait IntoTokens<'a, const D: usize>: Into<Tokens<'a>> {}

impl<'a, const B: usize, const T: usize, const D: usize> IntoTokens<'a, D> for &'a Tensor<B, T, D> {}

impl<'a, const D: usize> IntoTokens<'a, D> for Tokens<'a> {}

/// Outputs of the typed layer [`Mha`](crate::Mha) whose tokens are `D` wide: a
/// `&mut Tensor<B, T, D>` or an [`Output`] (checked when called), as [`IntoTokens`].
pub trait IntoOutput<'a, const D: usize>: Into<Output<'a>> {}

impl<'a, const B: usize, const T: usize, const D: usize> IntoOutput<'a, D>
    for &'a mut Tensor<B, T, D>
{
}

impl<'a, const D: usize> IntoOutput<'a, D> for Output<'a> {}
