//! Sequences whose batch size and length are known only at run time: borrowed `(B, T, D)`
//! views with the model width `D` still in the type.

use crate::error::ShapeError;
use crate::options::AttentionWeights;
use crate::tensor::{run_time_len, Tensor};

/// `batch` sequences of `len` tokens of `D` features, borrowed, row-major `(B, T, D)`.
///
/// The input of every [`Mha`](crate::Mha) call. A `&Tensor<B, T, D>` converts into one;
/// [`Tokens::new`] wraps a plain slice whose batch size and length come at run time (prompts
/// of any length, through one compiled layer).
///
/// ```
/// use mha::Tokens;
/// let data = vec![0.5; 2 * 3 * 4];
/// let x = Tokens::<4>::new(&data, 2, 3)?;
/// assert_eq!((x.batch(), x.len()), (2, 3));
/// assert!(Tokens::<4>::new(&data, 2, 4).is_err()); // 32 values needed, 24 given
/// # Ok::<(), mha::ShapeError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Tokens<'a, const D: usize> {
    data: &'a [f32],
    batch: usize,
    len: usize,
}

impl<'a, const D: usize> Tokens<'a, D> {
    /// Views `data` as `(batch, len, D)`.
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] naming both numbers when `data` does not hold
    /// `batch · len · D` values, [`ShapeError::Overflow`] when that product overflows (a zero
    /// axis makes it 0, whatever the others).
    pub fn new(data: &'a [f32], batch: usize, len: usize) -> Result<Self, ShapeError> {
        check_len("tokens (B, T, D)", data.len(), batch, len, D)?;
        Ok(Tokens { data, batch, len })
    }

    /// The number of sequences `B`.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens per sequence `T`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no tokens at all (`B` or `T` is 0; zero-width tokens are tokens).
    pub fn is_empty(&self) -> bool {
        self.batch == 0 || self.len == 0
    }

    /// The flat `(B, T, D)` values.
    pub fn as_slice(&self) -> &'a [f32] {
        self.data
    }
}

impl<'a, const B: usize, const T: usize, const D: usize> From<&'a Tensor<B, T, D>>
    for Tokens<'a, D>
{
    fn from(tensor: &'a Tensor<B, T, D>) -> Self {
        Tokens {
            data: tensor.as_slice(),
            batch: B,
            len: T,
        }
    }
}

/// Where a call writes: `(B, T, D)` output tokens and, on request, the attention
/// probabilities `(B, H, T, S)`.
///
/// A `&mut Tensor<B, T, D>` converts into one; [`Output::new`] wraps a plain slice.
///
/// ```
/// use mha::{AttentionWeights, Output, Tensor};
/// let mut y = Tensor::<1, 3, 4>::zeros();
/// let mut weights = AttentionWeights::new();
/// let out = Output::from(&mut y).with_weights(&mut weights);
/// assert_eq!(out.len(), 3);
/// ```
#[derive(Debug)]
pub struct Output<'a, const D: usize> {
    data: &'a mut [f32],
    batch: usize,
    len: usize,
    weights: Option<&'a mut AttentionWeights>,
}

impl<'a, const D: usize> Output<'a, D> {
    /// Views `data` as `(batch, len, D)` output tokens.
    ///
    /// # Errors
    /// As [`Tokens::new`].
    pub fn new(data: &'a mut [f32], batch: usize, len: usize) -> Result<Self, ShapeError> {
        check_len("output (B, T, D)", data.len(), batch, len, D)?;
        Ok(Output {
            data,
            batch,
            len,
            weights: None,
        })
    }

    /// Also writes the attention probabilities of every head into `weights`, `(B, H, T, S)`
    /// with `S` the call's keys, bounded by the window through a rolling cache (see
    /// [`AttentionWeights`]; computed only when asked, off the fast path).
    pub fn with_weights(mut self, weights: &'a mut AttentionWeights) -> Self {
        self.weights = Some(weights);
        self
    }

    /// The number of sequences `B`.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens per sequence `T`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no output tokens at all (`B` or `T` is 0; zero-width tokens are
    /// tokens).
    pub fn is_empty(&self) -> bool {
        self.batch == 0 || self.len == 0
    }

    /// The output values and where the weights go, for the layer to fill.
    pub(crate) fn parts(&mut self) -> (&mut [f32], Option<&mut AttentionWeights>) {
        (&mut *self.data, self.weights.as_deref_mut())
    }
}

impl<'a, const B: usize, const T: usize, const D: usize> From<&'a mut Tensor<B, T, D>>
    for Output<'a, D>
{
    fn from(tensor: &'a mut Tensor<B, T, D>) -> Self {
        Output {
            data: tensor.as_mut_slice(),
            batch: B,
            len: T,
            weights: None,
        }
    }
}

/// Checks that a buffer of `actual` values holds `(batch, len, width)`.
fn check_len(
    what: &'static str,
    actual: usize,
    batch: usize,
    len: usize,
    width: usize,
) -> Result<(), ShapeError> {
    let expected = run_time_len::<f32>(what, &[batch, len, width])?;
    if actual != expected {
        return Err(ShapeError::LengthMismatch {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}
