//! Borrowed views of a call's tokens: `(B, T, width)` buffers whose shape is known at run
//! time, and the traits that let the typed layer take them or fixed-shape tensors.

use crate::error::ShapeError;
use crate::kernels::buffer::run_time_len;
use crate::layer::options::AttentionWeights;

/// `batch` sequences of `len` tokens of `width` features, borrowed, row-major
/// `(B, T, width)`; or, ragged ([`Tokens::ragged`]), sequences of their own lengths one after
/// another, `(Σ lengths, width)`, with no padding rows.
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
    /// Ragged tokens: the tokens of each sequence (`batch` of them, the longest `len`).
    pub(crate) lengths: Option<&'a [usize]>,
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
            lengths: None,
        })
    }

    /// Views `data` as the tokens of `lengths.len()` sequences one after another, sequence
    /// `b` holding `lengths[b]` rows of `width` (a *ragged* or *flat* batch: `(Σ lengths,
    /// width)` with no padding rows, as FlashAttention's variable-length calls take them).
    /// A call on ragged tokens treats them as a batch whose sequence `b` has `lengths[b]`
    /// real tokens (as [`AttendOptions::token_lengths`] would) and writes ragged output
    /// ([`Output::ragged`]) of the same lengths; no work is spent on padding.
    ///
    /// ```
    /// use mha::Tokens;
    /// // A 3-token prompt and two sequences decoding one token each: 5 rows of 4 features.
    /// let data = vec![0.5; 5 * 4];
    /// let x = Tokens::ragged(&data, &[3, 1, 1], 4)?;
    /// assert_eq!((x.batch(), x.len(), x.rows()), (3, 3, 5));
    /// assert_eq!(x.lengths(), Some(&[3, 1, 1][..]));
    /// assert!(Tokens::ragged(&data, &[3, 2, 1], 4).is_err()); // 24 values needed, 20 given
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// [`AttendOptions::token_lengths`]: crate::AttendOptions::token_lengths
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] naming both numbers when `data` does not hold
    /// `Σ lengths · width` values, [`ShapeError::Overflow`] when that count overflows.
    pub fn ragged(data: &'a [f32], lengths: &'a [usize], width: usize) -> Result<Self, ShapeError> {
        let (rows, longest) = ragged_rows(lengths)?;
        check_len("ragged tokens (Σ lengths, D)", data.len(), [rows, 1, width])?;
        Ok(Tokens {
            data,
            batch: lengths.len(),
            len: longest,
            width,
            lengths: Some(lengths),
        })
    }

    /// The number of sequences `B`.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens per sequence `T` (ragged tokens: the longest sequence's).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Each sequence's tokens, for ragged tokens ([`Tokens::ragged`]); `None` when every
    /// sequence has [`len`](Self::len).
    pub fn lengths(&self) -> Option<&'a [usize]> {
        self.lengths
    }

    /// The rows of `width` values it holds: `B · T`, or `Σ lengths` for ragged tokens.
    pub fn rows(&self) -> usize {
        let rect = self.batch.saturating_mul(self.len);
        self.lengths.map_or(rect, |lengths| lengths.iter().sum())
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
    /// Ragged output: the tokens of each sequence, as [`Tokens::lengths`].
    pub(crate) lengths: Option<&'a [usize]>,
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
            lengths: None,
            weights: None,
        })
    }

    /// Views `data` as the output tokens of sequences of `lengths` one after another, `(Σ
    /// lengths, width)`: where a call on ragged tokens ([`Tokens::ragged`]) of the same
    /// lengths writes.
    ///
    /// # Errors
    /// As [`Tokens::ragged`].
    pub fn ragged(
        data: &'a mut [f32],
        lengths: &'a [usize],
        width: usize,
    ) -> Result<Self, ShapeError> {
        let (rows, longest) = ragged_rows(lengths)?;
        check_len("ragged output (Σ lengths, D)", data.len(), [rows, 1, width])?;
        Ok(Output {
            data,
            batch: lengths.len(),
            len: longest,
            width,
            lengths: Some(lengths),
            weights: None,
        })
    }

    /// Also writes the attention probabilities of every head into `weights`, `(B, H, T, S)`
    /// with `S` the call's keys, bounded by the window through a rolling cache (see
    /// [`AttentionWeights`]; computed only when asked, off the fast path). For ragged output
    /// `T` is the longest sequence's, and a shorter sequence's rows past its length are zeros.
    pub fn with_weights(mut self, weights: &'a mut AttentionWeights) -> Self {
        self.weights = Some(weights);
        self
    }

    /// The number of sequences `B`.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens per sequence `T` (ragged output: the longest sequence's).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Each sequence's tokens, for ragged output ([`Output::ragged`]).
    pub fn lengths(&self) -> Option<&'a [usize]> {
        self.lengths
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

/// The rows of ragged tokens of `lengths` and the longest sequence's.
///
/// # Errors
/// [`ShapeError::Overflow`] when the rows overflow.
fn ragged_rows(lengths: &[usize]) -> Result<(usize, usize), ShapeError> {
    let rows = lengths
        .iter()
        .try_fold(0usize, |sum, &l| sum.checked_add(l));
    let rows = rows.ok_or_else(|| ShapeError::Overflow {
        what: "ragged tokens (Σ lengths)",
        dims: lengths.to_vec(),
    })?;
    Ok((rows, lengths.iter().copied().max().unwrap_or(0)))
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
