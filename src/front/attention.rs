//! Attention over split heads, as a plain function: a causal mask and masked scaled
//! dot-product attention in every head at once. It runs the attention step of a layer's pass.

use alloc::vec::Vec;

use crate::error::{head_dim, ShapeError};
use crate::front::heads::{split_heads, Heads};
use crate::front::tensor::Tensor;
use crate::layer::split::{attend_split_heads, SplitHeads};

/// The causal mask for `t` tokens: a `(t, t)` row-major boolean matrix where entry `(i, j)` is
/// `true` when query `i` may see key `j`, i.e. when `j <= i`.
///
/// ```
/// assert_eq!(mha::causal_mask(2)?, vec![true, false, true, true]);
/// assert_eq!(mha::causal_mask(0)?, vec![]);
/// // 2^32 × 2^32 entries do not fit in a 64-bit address space.
/// # #[cfg(target_pointer_width = "64")]
/// assert_eq!(
///     mha::causal_mask(1 << 32).unwrap_err().to_string(),
///     "causal mask (t, t) of sizes [4294967296, 4294967296] has more elements than fit in memory"
/// );
/// # Ok::<(), mha::ShapeError>(())
/// ```
///
/// # Errors
/// [`ShapeError::Overflow`] naming `t` when `t * t` bytes exceed `isize::MAX`;
/// [`ShapeError::AllocationFailed`] when the memory cannot be had.
pub fn causal_mask(t: usize) -> Result<Vec<bool>, ShapeError> {
    const WHAT: &str = "causal mask (t, t)";
    let len = crate::kernels::buffer::run_time_len::<bool>(WHAT, &[t, t])?;
    let mut mask = crate::kernels::buffer::try_filled(WHAT, len, false)?;
    for (i, row) in mask.chunks_exact_mut(t.max(1)).enumerate() {
        row[..=i].fill(true);
    }
    Ok(mask)
}

/// Scaled dot-product attention in every head at once: for each batch element and head,
/// `softmax(Q Kᵀ / √d) V` over the last two axes, `(B, H, T, d)`, where key `j` takes part in
/// query `i`'s softmax only when `mask[i * T + j]` is `true`.
///
/// Softmax subtracts the row maximum. Masked keys are skipped, not weighted by zero, so a
/// non-finite value in a masked key cannot reach the output. A query that sees no key gets
/// zeros.
///
/// ```
/// use mha::{attention, causal_mask, split_heads, Tensor};
/// let x = Tensor::from([[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]]);
/// let h = split_heads(&x, 2)?;
/// let out = attention(&h, &h, &h, &causal_mask(2)?)?;
/// // Query 0 sees only key 0, so it gets value 0 back.
/// assert_eq!(out.get(0, 1, 0, 1), Some(3.0));
/// # Ok::<(), mha::ShapeError>(())
/// ```
///
/// # Errors
/// [`ShapeError::HeadCountMismatch`] when `k` or `v` has a different head count from `q`,
/// [`ShapeError::LengthMismatch`] when `mask` does not hold `T * T` values.
pub fn attention<const B: usize, const T: usize, const D: usize>(
    q: &Heads<B, T, D>,
    k: &Heads<B, T, D>,
    v: &Heads<B, T, D>,
    mask: &[bool],
) -> Result<Heads<B, T, D>, ShapeError> {
    let n_heads = check_inputs(q, [k, v], mask)?;
    let d = head_dim(D, n_heads)?;
    // No values, nothing to attend; its axes may be huge (with D = 0 so may the head count).
    if q.as_slice().is_empty() {
        return Heads::from_vec(Vec::new(), n_heads);
    }
    let shape = SplitHeads {
        batch: B,
        len: T,
        n_heads,
        head_dim: d,
    };
    let merged = attend_split_heads(shape, [q.as_slice(), k.as_slice(), v.as_slice()], mask)?;
    split_heads(&Tensor::<B, T, D>::from_vec(merged)?, n_heads)
}

/// The head count of `q` when `k` and `v` have it too and `mask` holds `T · T` values.
fn check_inputs<const B: usize, const T: usize, const D: usize>(
    q: &Heads<B, T, D>,
    others: [&Heads<B, T, D>; 2],
    mask: &[bool],
) -> Result<usize, ShapeError> {
    let n_heads = q.n_heads();
    for other in others {
        if other.n_heads() != n_heads {
            return Err(ShapeError::HeadCountMismatch {
                expected: n_heads,
                actual: other.n_heads(),
            });
        }
    }
    let mask_len = crate::kernels::buffer::run_time_len::<bool>("mask (T, T)", &[T, T])?;
    if mask.len() != mask_len {
        return Err(ShapeError::LengthMismatch {
            what: "mask (T, T)",
            expected: mask_len,
            actual: mask.len(),
        });
    }
    Ok(n_heads)
}
