//! Borrowed views of a call's tokens: `(B, T, width)` buffers whose shape is known at run
//! time, and the traits that let the typed layer take them or fixed-shape tensors.

use crate::error::ShapeError;
use crate::kernels::buffer::run_time_len;
use crate::layer::options::AttentionWeights;

/// `batch` sequences of `len` tokens of `width` features, borrowed, row-major
/// `(B, T, width)`.
///
/// The input of every call of a [`Layer`](crate::Layer) and an [`Mha`](crate::Mha). A
/// `&Tensor<B, T, D>` converts into one; [`Tokens::new`] wraps a plain slice whose shape comes
/// at run time (prompts of any length, models of any width). A layer checks the width against
/// its own.
///
/// ```
/// use mha::{Tensor, Tokens};
/// let data = vec![0.5; 2 * 3 * 4];
/// let x = Tokens::new(&data, 2, 3, 4)?;
/// assert_eq!((x.batch(), x.len(), x.width()), (2, 3, 4));
/// assert!(Tokens::new(&data, 2, 4, 4).is_err()); // 32 values needed, 24 given
/// let tensor = Tensor::<2, 3, 4>::zeros();
/// assert_eq!(Tokens::from(&tensor).width(), 4);
/// # Ok::<(), mha::ShapeError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Tokens<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) batch: usize,
    pub(crate) len: usize,
    pub(crate) width: usize,
}

impl<'a> Tokens<'a> {
    /// Views `data` as `(batch, len, width)`.
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] naming both numbers when `data` does not hold
    /// `batch · len · width` values, [`ShapeError::Overflow`] when that product overflows (a
    /// zero axis makes it 0, whatever the others).
    pub fn new(
        data: &'a [f32],
        batch: usize,
        len: usize,
        width: usize,
    ) -> Result<Self, ShapeError> {
        check_len("tokens (B, T, D)", data.len(), [batch, len, width])?;
        Ok(Tokens {
            data,
            batch,
            len,
            width,
        })
    }

    /// The number of sequences `B`.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens per sequence `T`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Features per token.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Whether there are no tokens at all (`B` or `T` is 0; zero-width tokens are tokens).
    pub fn is_empty(&self) -> bool {
        self.batch == 0 || self.len == 0
    }

    /// The flat `(B, T, width)` values.
    pub fn as_slice(&self) -> &'a [f32] {
        self.data
    }
}

/// Where a call writes: `(B, T, width)` output tokens and, on request, the attention
/// probabilities `(B, H, T, S)`.
///
/// A `&mut Tensor<B, T, D>` converts into one; [`Output::new`] wraps a plain slice.
///
/// ```
/// use mha::{AttentionWeights, Output, Tensor};
/// let mut y = Tensor::<1, 3, 4>::zeros();
/// let mut weights = AttentionWeights::new();
/// let out = Output::from(&mut y).with_weights(&mut weights);
/// assert_eq!((out.len(), out.width()), (3, 4));
/// ```
#[derive(Debug)]
pub struct Output<'a> {
    pub(crate) data: &'a mut [f32],
    pub(crate) batch: usize,
    pub(crate) len: usize,
    pub(crate) width: usize,
    pub(crate) weights: Option<&'a mut AttentionWeights>,
}

impl<'a> Output<'a> {
    /// Views `data` as `(batch, len, width)` output tokens.
    ///
    /// # Errors
    /// As [`Tokens::new`].
    pub fn new(
        data: &'a mut [f32],
        batch: usize,
        len: usize,
        width: usize,
    ) -> Result<Self, ShapeError> {
        check_len("output (B, T, D)", data.len(), [batch, len, width])?;
        Ok(Output {
            data,
            batch,
            len,
            width,
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

    /// Features per token.
    pub fn width(&self) -> usize {
        self.width
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

/// Checks that a buffer of `actual` values holds `dims = [batch, len, width]`.
fn check_len(what: &'static str, actual: usize, dims: [usize; 3]) -> Result<(), ShapeError> {
    let expected = run_time_len::<f32>(what, &dims)?;
    if actual != expected {
        return Err(ShapeError::LengthMismatch {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}
