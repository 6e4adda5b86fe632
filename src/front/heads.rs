//! Splitting the feature axis into heads and merging it back.
//!
//! `split_heads`: `(B, T, D) -> (B, T, H, d) -> (B, H, T, d)` with `d = D / H`: head `h` takes
//! features `h*d .. (h+1)*d` of every token. `merge_heads` is its exact inverse. Both are one
//! index permutation over the flat buffer (a swap of the two middle axes of a 4-axis array), with
//! no per-head or per-batch-element calls, copies or allocations.

use alloc::vec;
use alloc::vec::Vec;

use crate::error::{head_dim, ShapeError};
use crate::front::tensor::{checked_buffer, const_elements, Tensor};

/// Queries, keys or values cut into heads: shape `(B, H, T, d)` with `d = D / H`, row-major.
///
/// The head count `H` is known at run time; `B`, `T` and the model width `D = H * d` are in the
/// type. Element `(b, h, t, j)` lives at index `((b * H + h) * T + t) * d + j`, so each of the
/// `B * H` heads is one contiguous `(T, d)` block.
#[derive(Clone, Debug, PartialEq)]
pub struct Heads<const B: usize, const T: usize, const D: usize> {
    data: Vec<f32>,
    n_heads: usize,
}

impl<const B: usize, const T: usize, const D: usize> Heads<B, T, D> {
    /// `B * T * D`. Every constructor evaluates it, so a shape whose buffer could not exist
    /// (more than `isize::MAX` bytes) is a compile-time error naming the shape.
    const ELEMENTS: usize = const_elements(
        &[B, T, D],
        "Heads<B, T, D>: B * T * D f32 values overflow usize or exceed isize::MAX bytes",
    );

    /// Wraps a flat `(B, H, T, D / H)` buffer.
    ///
    /// # Errors
    /// When `n_heads` is 0 or does not divide `D`, or when `data.len() != B * T * D`.
    ///
    /// A shape too large for memory does not compile:
    ///
    /// ```compile_fail,E0080
    /// let h = mha::Heads::<{ 1 << 62 }, 2, 4>::from_vec(vec![], 1);
    /// ```
    pub fn from_vec(data: Vec<f32>, n_heads: usize) -> Result<Self, ShapeError> {
        head_dim(D, n_heads)?;
        let data = checked_buffer("Heads (B, H, T, d)", Self::ELEMENTS, data)?;
        Ok(Self { data, n_heads })
    }

    /// Splits the `(B, T, D)` buffer `x` into `n_heads` heads of `d` features, `d` dividing
    /// `D` (see [`split_heads`]).
    fn split(x: &[f32], n_heads: usize, d: usize) -> Self {
        let mut data = vec![0.0; Self::ELEMENTS];
        swap_middle_axes(x, &mut data, [B, T, n_heads, d]);
        Heads { data, n_heads }
    }

    /// The number of heads `H`.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// The width of one head, `d = D / H`.
    pub fn head_dim(&self) -> usize {
        D / self.n_heads
    }

    /// The flat `(B, H, T, d)` buffer.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// Gives back the flat `(B, H, T, d)` buffer.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// Element `(b, h, t, j)`, or `None` when an index is out of range.
    pub fn get(&self, b: usize, h: usize, t: usize, j: usize) -> Option<f32> {
        let d = self.head_dim();
        (b < B && h < self.n_heads && t < T && j < d)
            .then(|| self.data[((b * self.n_heads + h) * T + t) * d + j])
    }

    /// Head `h` of batch element `b` as a `(T, d)` row-major block, or `None` when out of range.
    pub fn head(&self, b: usize, h: usize) -> Option<&[f32]> {
        if b >= B || h >= self.n_heads {
            return None;
        }
        // With B ≥ 1 the block's T·d values fit in usize. An empty block starts at 0, since
        // `b * n_heads` may overflow when `D = 0` lets `n_heads` be anything; a non-empty one
        // starts below B · n_heads · block = B · T · D.
        let block = T * self.head_dim();
        let start = if block == 0 {
            0
        } else {
            (b * self.n_heads + h) * block
        };
        Some(&self.data[start..][..block])
    }
}

/// Splits `(B, T, D)` into `n_heads` heads: `(B, T, D) -> (B, T, H, d) -> (B, H, T, d)`.
///
/// Head `h` takes features `h*d .. (h+1)*d` of every token:
///
/// ```
/// use mha::{split_heads, Tensor};
/// let x = Tensor::from([[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]]);
/// let heads = split_heads(&x, 2)?;
/// assert_eq!(heads.head(0, 0).unwrap(), &[0.0, 1.0, 4.0, 5.0]); // [[0, 1], [4, 5]]
/// assert_eq!(heads.head(0, 1).unwrap(), &[2.0, 3.0, 6.0, 7.0]); // [[2, 3], [6, 7]]
/// # Ok::<(), mha::ShapeError>(())
/// ```
///
/// # Errors
/// [`ShapeError::ZeroHeads`] when `n_heads == 0`, [`ShapeError::NotDivisible`] when `D` is not a
/// multiple of `n_heads`.
pub fn split_heads<const B: usize, const T: usize, const D: usize>(
    x: &Tensor<B, T, D>,
    n_heads: usize,
) -> Result<Heads<B, T, D>, ShapeError> {
    let d = head_dim(D, n_heads)?;
    Ok(Heads::split(x.as_slice(), n_heads, d))
}

/// Merges heads back: `(B, H, T, d) -> (B, T, H, d) -> (B, T, H * d)`, the exact inverse of
/// [`split_heads`] (bit for bit: values are only moved).
///
/// ```
/// use mha::{merge_heads, split_heads, Tensor};
/// let x = Tensor::<2, 3, 6>::from_fn(|b, t, i| (b * 100 + t * 10 + i) as f32);
/// assert_eq!(merge_heads(&split_heads(&x, 3)?), x);
/// # Ok::<(), mha::ShapeError>(())
/// ```
pub fn merge_heads<const B: usize, const T: usize, const D: usize>(
    heads: &Heads<B, T, D>,
) -> Tensor<B, T, D> {
    let mut data = vec![0.0; heads.data.len()];
    swap_middle_axes(
        &heads.data,
        &mut data,
        [B, heads.n_heads, T, heads.head_dim()],
    );
    Tensor::from_vec(data).expect("a Heads buffer always holds B * T * D values")
}

impl<const B: usize, const T: usize, const D: usize> Tensor<B, T, D> {
    /// Splits into `H` heads where the head count is a constant: a `D` that `H` does not divide
    /// is a compile-time error instead of a run-time one.
    ///
    /// ```
    /// use mha::Tensor;
    /// let x = Tensor::<1, 2, 4>::from([[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]]);
    /// let heads = x.split_heads_const::<2>();
    /// assert_eq!(heads.head(0, 1).unwrap(), &[2.0, 3.0, 6.0, 7.0]);
    /// ```
    ///
    /// Six features do not split into four heads, so this does not compile:
    ///
    /// ```compile_fail
    /// use mha::Tensor;
    /// let x = Tensor::<1, 2, 6>::zeros();
    /// let heads = x.split_heads_const::<4>();
    /// ```
    pub fn split_heads_const<const H: usize>(&self) -> Heads<B, T, D> {
        const {
            assert!(H > 0, "the head count must be at least 1");
            assert!(
                D.is_multiple_of(H),
                "D must be a multiple of the head count H"
            );
        }
        Heads::split(self.as_slice(), H, D / H)
    }
}

/// Copies the 4-axis row-major array `src` of shape `[n0, n1, n2, n3]` into `dst` as shape
/// `[n0, n2, n1, n3]`: `dst[a][c][b][..] = src[a][b][c][..]`. Runs of `n3` values stay
/// contiguous. Splitting heads is the swap `(B, T, H, d) -> (B, H, T, d)`; merging is the swap
/// `(B, H, T, d) -> (B, T, H, d)`, so one function serves both.
fn swap_middle_axes(src: &[f32], dst: &mut [f32], [n0, n1, n2, n3]: [usize; 4]) {
    debug_assert_eq!(dst.len(), src.len());
    // An empty array may have huge axes (any head count divides D = 0); a non-empty one has
    // no zero axis, and the product of its axes is its length.
    if src.is_empty() {
        return;
    }
    debug_assert_eq!(src.len(), n0 * n1 * n2 * n3);
    for (index, run) in src.chunks_exact(n3).enumerate() {
        let c = index % n2;
        let b = (index / n2) % n1;
        let a = index / (n1 * n2);
        let start = ((a * n2 + c) * n1 + b) * n3;
        dst[start..start + n3].copy_from_slice(run);
    }
}
