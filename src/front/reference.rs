//! The oracle: the five steps written as plain loops, with no blocking, packing, SIMD or
//! threads. Slow on purpose; kept so that every fast path can be checked against it and so the
//! benchmarks can report their speed-up over it.

use alloc::vec;
use alloc::vec::Vec;

use crate::error::{head_dim, ShapeError};
use crate::front::params::MhaParams;
use crate::front::tensor::Tensor;
use crate::kernels::attention::flash::score_scale;
use crate::kernels::math::exp::exp;

/// `(rows, D) · (D, D)`, row-major, the textbook triple loop; `D > 0`.
fn project(x: &[f32], w: &[f32], dm: usize) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    for (x_row, y_row) in x.chunks_exact(dm).zip(y.chunks_exact_mut(dm)) {
        for (&x_value, w_row) in x_row.iter().zip(w.chunks_exact(dm)) {
            for (y_value, &w_value) in y_row.iter_mut().zip(w_row) {
                *y_value += x_value * w_value;
            }
        }
    }
    y
}

/// Causal multi-head self-attention by plain loops: the same result as
/// [`mha_forward`](crate::mha_forward) up to rounding.
///
/// ```
/// use mha::{reference, mha_forward, Matrix, MhaParams, Tensor};
/// let x = Tensor::<1, 3, 4>::from_fn(|_, t, i| (t * 4 + i) as f32 * 0.1);
/// let w = Matrix::<4, 4>::from_fn(|r, c| if r == c { 0.5 } else { 0.1 });
/// let p = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
/// let fast = mha_forward(&x, &p, 2)?;
/// let slow = reference::mha_forward(&x, &p, 2)?;
/// for (a, b) in fast.as_slice().iter().zip(slow.as_slice()) {
///     assert!((a - b).abs() < 1e-5);
/// }
/// # Ok::<(), mha::ShapeError>(())
/// ```
///
/// An input with no values (`B`, `T` or `D` zero) gives an output with none.
///
/// # Errors
/// As [`mha_forward`](crate::mha_forward).
pub fn mha_forward<const B: usize, const T: usize, const D: usize>(
    x: &Tensor<B, T, D>,
    params: &MhaParams<D>,
    n_heads: usize,
) -> Result<Tensor<B, T, D>, ShapeError> {
    let d = head_dim(D, n_heads)?;
    // An empty input gives an empty output. Its other axes may be huge (and with D = 0 so may
    // the head count), so the loops below must not run over them.
    if x.as_slice().is_empty() {
        return Ok(Tensor::zeros());
    }
    let q = project(x.as_slice(), params.wq.as_slice(), D);
    let k = project(x.as_slice(), params.wk.as_slice(), D);
    let v = project(x.as_slice(), params.wv.as_slice(), D);
    let scale = score_scale(d);
    let mut merged = vec![0.0; x.as_slice().len()];
    let mut weights = vec![0.0; T];
    let at = |b: usize, t: usize, h: usize| (b * T + t) * D + h * d;
    for b in 0..B {
        for h in 0..n_heads {
            for i in 0..T {
                let q_row = &q[at(b, i, h)..][..d];
                let mut max = f32::NEG_INFINITY;
                for (j, weight) in weights[..=i].iter_mut().enumerate() {
                    let k_row = &k[at(b, j, h)..][..d];
                    *weight = q_row.iter().zip(k_row).map(|(a, b)| a * b).sum::<f32>() * scale;
                    max = max.max(*weight);
                }
                let mut total = 0.0;
                for weight in &mut weights[..=i] {
                    *weight = exp(*weight - max);
                    total += *weight;
                }
                let out = &mut merged[at(b, i, h)..][..d];
                for (j, &weight) in weights[..=i].iter().enumerate() {
                    let v_row = &v[at(b, j, h)..][..d];
                    for (o, &v_value) in out.iter_mut().zip(v_row) {
                        *o += weight / total * v_value;
                    }
                }
            }
        }
    }
    Tensor::from_vec(project(&merged, params.wo.as_slice(), D))
}
