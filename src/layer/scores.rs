//! The score stage's terms beyond `scale · q·k` as a layer's settings ([`LayerBuilder`]):
//! logit soft-capping (Gemma 2), ALiBi (BLOOM, MPT) and attention sinks (gpt-oss), checked
//! here and applied by the kernels in the order `kernels::terms` states (soft cap, ALiBi,
//! the mask, the softmax from the sink).
//!
//! [`LayerBuilder`]: crate::LayerBuilder

use alloc::format;
use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::attention::terms::ScoreTerms;
use crate::kernels::buffer::{run_time_len, try_filled};
use crate::kernels::math::trig::sqrt;

/// Where ALiBi places each key and query of a sequence, for the distance its bias scales;
/// set with [`LayerBuilder::alibi_positions`](crate::LayerBuilder::alibi_positions).
///
/// The two agree without padding, and for left and right padding (there the ranks shift every
/// distance of a query by the same amount), so they differ only for a padding mask with holes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AlibiPositions {
    /// At its index in the sequence: query `i` and key `j` are `i - j` apart (the ALiBi
    /// paper, MPT).
    #[default]
    Index,
    /// At its rank among the sequence's real keys, padding not counted, as BLOOM in
    /// `transformers` places keys (`cumsum(attention_mask) - 1`): with a call's
    /// [`key_padding_mask`](crate::AttendOptions::key_padding_mask), a key at position `p` is
    /// at the number of real keys before `p`, a query at the same number for its own
    /// position.
    RealTokens,
}

/// ALiBi, attention with linear biases (BLOOM, MPT): head `h` adds `-slope_h · (i - j)` to the
/// scaled score of query position `i` and key position `j`; set with
/// [`MhaBuilder::alibi`](crate::MhaBuilder::alibi).
///
/// Each bias must be finite in `f32` at every distance `|i - j|` a query reaches, or the
/// scores would be infinite and the softmax NaN: a sliding window bounds the distance by
/// `window - 1`, which the builder checks; on a layer without one, positions have no bound,
/// so every call checks the farthest distance between its own queries and keys before it
/// writes anything ([`ShapeError::Setting`]). The standard slopes are at most 1, so only a
/// given slope can fail.
///
/// ```
/// use mha::{Alibi, Masking, Matrix, Mha, MhaParams, Tensor};
/// let w = Matrix::<12, 12>::identity();
/// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
/// let layer = Mha::builder(&params, 6).alibi(Alibi::Standard).build()?;
/// assert_eq!(layer.alibi_slopes(), Some(&[0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125][..]));
///
/// // A slope of f32::MAX: finite at distance 1, infinite at distance 2.
/// let huge = Alibi::Slopes(vec![f32::MAX, 0.5]);
/// let mut layer = Mha::builder(&params, 2).masking(Masking::Bidirectional).alibi(huge).build()?;
/// assert!(layer.forward(&Tensor::<1, 2, 12>::zeros()).is_ok());
/// let error = layer.forward(&Tensor::<1, 3, 12>::zeros()).unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "ALiBi slope is 3.4028235e38 (head 0), whose bias at key-query distance 2 (the \
///      farthest a query of this call reaches) is inf, but must be small enough that the \
///      bias is finite"
/// );
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
    /// heads differ by an ulp; powers of two are exact). Empty for 0 heads. Costs `O(n_heads)`.
    ///
    /// ```
    /// use mha::{Alibi, ShapeError};
    /// assert_eq!(Alibi::standard_slopes(4)?, [0.25, 0.0625, 0.015625, 0.00390625]);
    /// assert_eq!(Alibi::standard_slopes(3)?, [0.0625, 0.00390625, 0.25]);
    /// assert!(matches!(Alibi::standard_slopes(usize::MAX), Err(ShapeError::Overflow { .. })));
    /// # Ok::<(), ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when `n_heads` slopes do not fit in memory,
    /// [`ShapeError::AllocationFailed`] when they cannot be allocated.
    pub fn standard_slopes(n_heads: usize) -> Result<Vec<f32>, ShapeError> {
        const WHAT: &str = "ALiBi slopes (H)";
        let len = run_time_len::<f32>(WHAT, &[n_heads])?;
        let mut slopes = try_filled(WHAT, len, 0.0)?;
        if n_heads == 0 {
            return Ok(slopes);
        }
        let n = 1usize << n_heads.ilog2();
        let (first, extra) = slopes.split_at_mut(n);
        powers(power_of_half(8, n), 1, first);
        powers(power_of_half(4, n), 2, extra);
        Ok(slopes)
    }
}

/// `out[i] = base^(1 + i · step)` rounded to `f32`: each power is the running `f64` product,
/// one multiplication by `base` per unit of exponent (the same chain as multiplying `base`
/// that many times, in `O(out.len() · step)`).
fn powers(base: f64, step: usize, out: &mut [f32]) {
    let mut power = base;
    for (i, slope) in out.iter_mut().enumerate() {
        if i > 0 {
            for _ in 0..step {
                power *= base;
            }
        }
        *slope = power as f32;
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
            Alibi::Slopes(slopes) => Ok(slopes),
        });
        let slopes = slopes.transpose()?;
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

    /// Checks that ALiBi's term `slope · (j - i)` is finite in `f32` for every head at every
    /// key-query distance up to `farthest`: the largest a call reaches or, for a layer with a
    /// sliding `window`, the largest it ever reaches (`window - 1`). The kernels convert the
    /// distance to `f32` and multiply once; both roundings are monotonic, so the farthest
    /// distance decides.
    ///
    /// # Errors
    /// [`ShapeError::Setting`] naming the first head whose bias overflows, its slope and the
    /// distance.
    pub(crate) fn check_alibi_reach(
        &self,
        farthest: usize,
        window: Option<usize>,
    ) -> Result<(), ShapeError> {
        let Some(slopes) = &self.slopes else {
            return Ok(());
        };
        let distance = farthest as f32;
        let Some(h) = slopes.iter().position(|&s| !(s * distance).is_finite()) else {
            return Ok(());
        };
        let reach = match window {
            Some(window) => format!("the farthest the sliding window of {window} keys reaches"),
            None => "the farthest a query of this call reaches".into(),
        };
        Err(ShapeError::Setting {
            what: "ALiBi slope",
            value: format!(
                "{:?} (head {h}), whose bias at key-query distance {farthest} ({reach}) is {:?}",
                slopes[h],
                slopes[h] * distance
            ),
            expected: "small enough that the bias is finite",
        })
    }

    /// [`ScoreTerms::check_alibi_reach`] for a layer with a sliding window (at least 1 key),
    /// which bounds every distance the layer will ever see by `window - 1` (and positions
    /// stop at `isize::MAX`); other layers' calls are checked against their own positions.
    ///
    /// # Errors
    /// As [`ScoreTerms::check_alibi_reach`].
    pub(crate) fn check_window_reach(&self, window: Option<usize>) -> Result<(), ShapeError> {
        match window {
            Some(window) => {
                let reach = window.saturating_sub(1).min(isize::MAX as usize);
                self.check_alibi_reach(reach, Some(window))
            }
            None => Ok(()),
        }
    }

    /// [`ScoreTerms::check_alibi_reach`] for a call whose farthest key-query distance is
    /// `farthest()`, computed only for a layer with ALiBi and without a window (whose reach
    /// [`ScoreTerms::check_window_reach`] checked when it was built).
    ///
    /// # Errors
    /// As [`ScoreTerms::check_alibi_reach`].
    pub(crate) fn check_call_reach(
        &self,
        window: Option<usize>,
        farthest: impl FnOnce() -> usize,
    ) -> Result<(), ShapeError> {
        if self.slopes.is_none() || window.is_some() {
            return Ok(());
        }
        self.check_alibi_reach(farthest(), None)
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
