//! The crate's one error type.

use core::fmt;

/// Why a shape, a head count or a buffer was rejected.
///
/// Every variant carries the numbers involved, and its [`Display`](fmt::Display) text names
/// them, e.g. `d_model 6 is not divisible by n_heads 4`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShapeError {
    /// The head count was zero.
    ZeroHeads,
    /// The model width `d_model` is not a multiple of the head count.
    NotDivisible {
        /// The model width `D`.
        d_model: usize,
        /// The requested head count `H`.
        n_heads: usize,
    },
    /// A buffer does not hold the number of elements its shape needs.
    LengthMismatch {
        /// What the buffer is, e.g. `"Tensor (B, T, D)"` or `"mask (T, T)"`.
        what: &'static str,
        /// The number of elements the shape needs.
        expected: usize,
        /// The number of elements given.
        actual: usize,
    },
    /// Two head buffers that must agree were split with different head counts.
    HeadCountMismatch {
        /// The head count of the first (query) buffer.
        expected: usize,
        /// The head count of the other buffer.
        actual: usize,
    },
    /// A shape's element count does not fit in `usize`.
    TooLarge,
    /// The requested instruction set is not available on this CPU.
    UnsupportedIsa {
        /// The instruction set's name, e.g. `"avx512"`.
        isa: &'static str,
    },
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShapeError::ZeroHeads => write!(f, "n_heads must be at least 1, got 0"),
            ShapeError::NotDivisible { d_model, n_heads } => {
                write!(f, "d_model {d_model} is not divisible by n_heads {n_heads}")
            }
            ShapeError::LengthMismatch {
                what,
                expected,
                actual,
            } => write!(
                f,
                "{what} needs {expected} elements, but the buffer has {actual}"
            ),
            ShapeError::HeadCountMismatch { expected, actual } => write!(
                f,
                "head counts differ: queries have {expected} heads, another buffer has {actual}"
            ),
            ShapeError::TooLarge => write!(f, "shape has more elements than fit in usize"),
            ShapeError::UnsupportedIsa { isa } => {
                write!(f, "instruction set {isa} is not available on this CPU")
            }
        }
    }
}

impl core::error::Error for ShapeError {}

/// Checks that `n_heads` is at least 1 and divides `d_model`; returns the head width `d_model / n_heads`.
pub(crate) fn head_dim(d_model: usize, n_heads: usize) -> Result<usize, ShapeError> {
    if n_heads == 0 {
        return Err(ShapeError::ZeroHeads);
    }
    if !d_model.is_multiple_of(n_heads) {
        return Err(ShapeError::NotDivisible { d_model, n_heads });
    }
    Ok(d_model / n_heads)
}
