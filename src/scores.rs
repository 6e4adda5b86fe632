//! The score stage's terms beyond `scale · q·k` as a layer's settings ([`LayerBuilder`]):
//! logit soft-capping (Gemma 2), ALiBi (BLOOM, MPT) and attention sinks (gpt-oss), checked
//! here and applied by the kernels in the order `kernels::terms` states (soft cap, ALiBi,
//! the mask, the softmax from the sink).
//!
//! [`LayerBuilder`]: crate::LayerBuilder

use alloc::format;
use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::terms::ScoreTerms;
use crate::kernels::trig::sqrt;

/// ALiBi, attention with linear biases (BLOOM, MPT): head `h` adds `-slope_h · (i - j)` to the
/// scaled score of query position `i` and key position `j`; set with
/// [`MhaBuilder::alibi`](crate::MhaBuilder::alibi).
///
/// ```
/// use mha::{Alibi, Matrix, Mha, MhaParams};
/// let w = Matrix::<12, 12>::identity();
/// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
/// let layer = Mha::builder(&params, 6).alibi(Alibi::Standard).build()?;
/// assert_eq!(layer.alibi_slopes(), Some(&[0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125][..]));
/// # Ok::<(), mha::ShapeError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Alibi {
    /// The standard slopes of the layer's head count ([`Alibi::standard_slopes`]).
    Standard,
    /// One slope per query head, each finite.
    Slopes(Vec<f32>),
}

impl Alibi {
    /// The standard ALiBi slopes of `n_heads` heads, as Hugging Face `transformers`'
    /// `build_alibi_tensor` (BLOOM) computes them in `f32`: with `n` the largest power of two
    /// not above `n_heads` and `base = 2^(-8/n)` rounded to `f32`, head `h < n` gets
    /// `base^(h+1)`; the other heads get the odd powers `1, 3, 5, ..` of `2^(-4/n)` (the
    /// interleaved extension to a head count that is not a power of two). Each power is taken
    /// of the `f32` base and rounded to `f32` once, which is transformers' value or 1 ulp from
    /// it (torch's `f32` `pow` is not correctly rounded: 65 of the 8,256 slopes of 1 to 128
    /// heads differ by an ulp; powers of two are exact). Empty for 0 heads.
    ///
    /// ```
    /// use mha::Alibi;
    /// assert_eq!(Alibi::standard_slopes(4), [0.25, 0.0625, 0.015625, 0.00390625]);
    /// assert_eq!(Alibi::standard_slopes(3), [0.0625, 0.00390625, 0.25]);
    /// ```
    pub fn standard_slopes(n_heads: usize) -> Vec<f32> {
        if n_heads == 0 {
            return Vec::new();
        }
        let n = 1usize << n_heads.ilog2();
        let powers = |base: f64, exponents: &mut dyn Iterator<Item = usize>| {
            exponents
                .map(|k| (0..k).fold(1.0, |p, _| p * base) as f32)
                .collect::<Vec<f32>>()
        };
        let mut slopes = powers(power_of_half(8, n), &mut (1..=n));
        let extra = powers(power_of_half(4, n), &mut (1..2 * (n_heads - n)).step_by(2));
        slopes.extend(extra);
        slopes
    }
}

/// `2^(-m/n)` rounded to `f32` (returned widened), for `n` a power of two: a power of two when
/// `n` divides `m`, else `√` taken of `2^(-m/n')` repeatedly (`n'` the largest power of two
/// dividing `m`).
fn power_of_half(m: usize, n: usize) -> f64 {
    let mut whole = n;
    let mut roots = 0;
    while !m.is_multiple_of(whole) {
        whole /= 2;
        roots += 1;
    }
    let mut value = (0..m / whole).fold(1.0, |p, _| p * 0.5);
    for _ in 0..roots {
        value = sqrt(value);
    }
    f64::from(value as f32)
}

/// The checks of a layer's score terms.
impl ScoreTerms {
    /// Checks the settings for `n_heads` query heads.
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] for slopes or sinks that are not `n_heads` values,
    /// [`ShapeError::Setting`] for a non-finite slope, a cap that is not finite and positive,
    /// a sink that is NaN or `+inf`.
    pub(crate) fn new(
        alibi: Option<Alibi>,
        cap: Option<f32>,
        sinks: Option<Vec<f32>>,
        n_heads: usize,
    ) -> Result<Self, ShapeError> {
        let slopes = alibi.map(|alibi| match alibi {
            Alibi::Standard => Alibi::standard_slopes(n_heads),
            Alibi::Slopes(slopes) => slopes,
        });
        if let Some(slopes) = &slopes {
            check_heads(
                "ALiBi slopes (H)",
                slopes,
                n_heads,
                f32::is_finite,
                "finite",
            )?;
        }
        if let Some(sinks) = &sinks {
            let allowed = |s: f32| s.is_finite() || s == f32::NEG_INFINITY;
            check_heads(
                "attention sinks (H)",
                sinks,
                n_heads,
                allowed,
                "finite or -inf",
            )?;
        }
        if let Some(cap) = cap.filter(|&c| !(c.is_finite() && c > 0.0)) {
            return Err(ShapeError::Setting {
                what: "logit soft cap",
                value: format!("{cap:?}"),
                expected: "finite and > 0",
            });
        }
        Ok(ScoreTerms { slopes, cap, sinks })
    }
}

/// `Err` unless `values` holds `n_heads` values, each `allowed`.
fn check_heads(
    what: &'static str,
    values: &[f32],
    n_heads: usize,
    allowed: impl Fn(f32) -> bool,
    expected: &'static str,
) -> Result<(), ShapeError> {
    if values.len() != n_heads {
        return Err(ShapeError::LengthMismatch {
            what,
            expected: n_heads,
            actual: values.len(),
        });
    }
    match values.iter().position(|&v| !allowed(v)) {
        Some(h) => Err(ShapeError::Setting {
            what,
            value: format!("{:?} (head {h})", values[h]),
            expected,
        }),
        None => Ok(()),
    }
}
