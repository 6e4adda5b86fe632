//! The output gate (Qwen3.5, Qwen3-Next, Laguna, Step 3.5): the attention output of each query,
//! before the output projection, multiplied by the sigmoid or softplus of a projection of the
//! query's token.

use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::math::exp::exp;
use crate::kernels::math::trig;
use crate::layer::projections::check_values;

/// Which attention outputs one gate value multiplies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GateSpan {
    /// Every feature of the merged heads its own gate: `G = H · dv` values per token (`Q`
    /// unless the value heads differ from the key heads; Qwen3.5, Qwen3-Next).
    #[default]
    PerElement,
    /// One gate per query head, shared by its `dv` features: `G = H` values per token.
    PerHead,
}

/// Which function of the projected gate multiplies the attention output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GateActivation {
    /// `σ(z) = 1 / (1 + exp(-z))` in `f32` (the crate's own [`exp`]): Qwen3.5, Qwen3-Next,
    /// Step 3.5.
    #[default]
    Sigmoid,
    /// `softplus(z) = ln(1 + exp(z))`, worked out in `f64` as `max(z, 0) + ln(1 + exp(-|z|))`
    /// and rounded once to `f32` (Laguna). `softplus(-inf) = 0`, `softplus(+inf) = +inf`.
    Softplus,
}

impl GateActivation {
    /// The gate value of the projection `z`.
    fn of(self, z: f32) -> f32 {
        match self {
            GateActivation::Sigmoid => sigmoid(z),
            GateActivation::Softplus => softplus(z),
        }
    }
}

/// An output gate: for each token, `g = x·Wg (+ bg)` (`G` values, see [`GateSpan`]), and the
/// merged attention output `o (H · dv)` becomes `o · act(g)` before the output projection,
/// `act` the [`GateActivation`].
///
/// A layer takes it with [`LayerBuilder::output_gate`](crate::LayerBuilder::output_gate),
/// which checks the lengths. `Wg` is projected with the query, key and value weights in one
/// matrix product (row by row the same arithmetic whatever the call), and each output is gated
/// on its own, so a forward pass equals decoding its tokens bit for bit, for any thread count.
///
/// ```
/// use mha::{GateActivation, GateSpan, Layer, OutputGate, Projections, Tensor, Widths};
/// // D = 4, 2 heads of 2; one gate per head, all zero: every output halved.
/// let widths = Widths::self_attention(4, 4, 4);
/// let w: Vec<f32> = (0..16).map(|i| (i % 5) as f32 * 0.1).collect();
/// let projections = Projections::new(widths, &w, &w, &w, &w)?;
/// let activation = GateActivation::Sigmoid;
/// let gate = OutputGate { span: GateSpan::PerHead, activation, weight: vec![0.0; 8], bias: None };
/// let mut plain = Layer::builder(projections, 2).threads(1).build()?;
/// let mut gated = Layer::builder(projections, 2).output_gate(gate).threads(1).build()?;
/// let x = Tensor::<1, 3, 4>::from_fn(|_, t, i| (t + i) as f32 * 0.1);
/// let (y, z) = (plain.forward(&x)?, gated.forward(&x)?);
/// for (y, z) in y.iter().zip(z.iter()) {
///     assert!((y * 0.5 - z).abs() < 1e-6);
/// }
/// # Ok::<(), mha::ShapeError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct OutputGate {
    /// One gate per feature or per head.
    pub span: GateSpan,
    /// The function of `g` that multiplies the outputs.
    pub activation: GateActivation,
    /// `Wg (D, G)`, row-major in the `x @ W` convention.
    pub weight: Vec<f32>,
    /// `bg`, `G` values, if any.
    pub bias: Option<Vec<f32>>,
}

impl OutputGate {
    /// The gate values per token, `G`, of a layer with `n_heads` merged heads of `dv`.
    pub(crate) fn width(&self, n_heads: usize, dv: usize) -> usize {
        match self.span {
            GateSpan::PerElement => n_heads * dv,
            GateSpan::PerHead => n_heads,
        }
    }

    /// Checks the weight (`D · G` values) and bias (`G`) lengths.
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] naming the tensor and both lengths.
    pub(crate) fn check(&self, d_model: usize, width: usize) -> Result<(), ShapeError> {
        check_values("output gate wg (D, G)", &self.weight, &[d_model, width])?;
        match &self.bias {
            Some(bias) => check_values("output gate bias bg (G)", bias, &[width]),
            None => Ok(()),
        }
    }

    /// Multiplies the merged rows `merged (rows, H · dv)` by the activation of their gates
    /// `gates (rows, G)`, element by element.
    pub(crate) fn apply(&self, merged: &mut [f32], gates: &[f32], dv: usize) {
        let per_gate = match self.span {
            GateSpan::PerElement => 1,
            GateSpan::PerHead => dv,
        };
        for (o, &g) in merged
            .iter_mut()
            .zip(gates.iter().flat_map(|g| core::iter::repeat_n(g, per_gate)))
        {
            *o *= self.activation.of(g);
        }
    }
}

/// `1 / (1 + exp(-z))` in `f32`.
fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + exp(-z))
}

/// `ln(1 + exp(z))` in `f64`, rounded to `f32`: `max(z, 0) + ln(1 + e)` with `e = exp(-|z|)`
/// in `(0, 1]`, `ln(1 + e)` as `ln(u) · e / (u − 1)`, `u = 1 + e` (exact to a few ulps even
/// where `u` rounds; `e` itself when `u = 1`).
fn softplus(z: f32) -> f32 {
    let z = f64::from(z);
    let e = trig::exp(-z.abs());
    let u = 1.0 + e;
    let ln_1p = if u == 1.0 {
        e
    } else {
        trig::ln(u) * e / (u - 1.0)
    };
    (z.max(0.0) + ln_1p) as f32
}

#[cfg(test)]
mod tests {
    use super::softplus;

    /// Within one `f32` ulp of std's `max(z, 0) + ln_1p(exp(-|z|))` in `f64`, over 13 decades
    /// either side of 0; the infinities and NaN as documented.
    #[test]
    fn softplus_against_std() {
        for i in -2000..=2000 {
            for z in [i as f32 * 0.05, (i as f32 * 0.01).exp() * 1e-6] {
                let x = f64::from(z);
                let want = (x.max(0.0) + (-x.abs()).exp().ln_1p()) as f32;
                let got = softplus(z);
                let ulps =
                    (i64::from(got.to_bits() as i32) - i64::from(want.to_bits() as i32)).abs();
                assert!(ulps <= 1, "softplus({z}) = {got}, want {want}");
            }
        }
        assert_eq!(softplus(f32::NEG_INFINITY), 0.0);
        assert_eq!(softplus(f32::INFINITY), f32::INFINITY);
        assert!(softplus(f32::NAN).is_nan());
        assert_eq!(softplus(-200.0), 0.0);
    }
}
