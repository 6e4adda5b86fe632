//! The score stage's terms beyond `scale · q·k`, each a layer setting of [`MhaBuilder`]:
//! logit soft-capping (Gemma 2), ALiBi (BLOOM, MPT) and attention sinks (gpt-oss).
//!
//! Per query `i` and visible key `j` of head `h` (positions as causal order counts them: a
//! query's position is its sequence's cached tokens plus its index in the call):
//!
//! 1. `s = scale · q·k` (the scale is folded into the queries);
//! 2. `s = cap · tanh(s / cap)` with a soft cap;
//! 3. `s = s + slope_h · (j - i)` with ALiBi, i.e. `- slope_h · (i - j)`;
//! 4. the mask's rule (hidden keys `-inf`, an additive mask's entry added);
//! 5. softmax over the visible keys and, with a sink, the sink logit `sink_h`, which takes
//!    probability mass and contributes no value.
//!
//! [`MhaBuilder`]: crate::MhaBuilder

use alloc::format;
use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::flash::sqrt;
use crate::kernels::Kernels;

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

/// The layer's score-stage settings, checked (see the module documentation).
#[derive(Clone, Debug, Default)]
pub(crate) struct ScoreTerms {
    /// ALiBi slopes, one per query head.
    pub slopes: Option<Vec<f32>>,
    /// The soft cap, finite and positive.
    pub cap: Option<f32>,
    /// Sink logits, one per query head, finite or `-inf` (no sink).
    pub sinks: Option<Vec<f32>>,
}

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

    /// The terms of query head `h`.
    pub(crate) fn head(&self, h: usize) -> HeadTerms {
        HeadTerms {
            slope: self.slopes.as_ref().map(|s| s[h]),
            cap: self.cap,
            sink: self.sinks.as_ref().map_or(f32::NEG_INFINITY, |s| s[h]),
        }
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

/// The score-stage terms of one query head.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadTerms {
    slope: Option<f32>,
    cap: Option<f32>,
    /// `-inf` without a sink.
    sink: f32,
}

impl HeadTerms {
    /// Whether steps 2 or 3 (see the module documentation) change the scores.
    pub(crate) fn changes_scores(&self) -> bool {
        self.slope.is_some() || self.cap.is_some()
    }

    /// A row's running `(max, sum)` before its first key: the sink's logit and `e^0 = 1`, or
    /// `(-inf, 0)` without a sink (the plain online softmax's start, so a sink of `-inf` is
    /// no sink, bit for bit).
    pub(crate) fn start(&self) -> (f32, f32) {
        let sum = if self.sink == f32::NEG_INFINITY {
            0.0
        } else {
            1.0
        };
        (self.sink, sum)
    }

    /// Steps 2 and 3 on the scores of key `key` against the queries at positions
    /// `first_position ..` (a key-major column of the tile path).
    pub(crate) fn apply_column(
        &self,
        kernels: &Kernels,
        key: usize,
        first_position: isize,
        column: &mut [f32],
    ) {
        self.apply(kernels, column, key as isize - first_position, -1);
    }

    /// Steps 2 and 3 on the scores of the query at `position` against the keys
    /// `first_key ..` (a row of the row path): per score the arithmetic of
    /// [`HeadTerms::apply_column`], so the same bits.
    pub(crate) fn apply_row(
        &self,
        kernels: &Kernels,
        position: isize,
        first_key: usize,
        row: &mut [f32],
    ) {
        self.apply(kernels, row, first_key as isize - position, 1);
    }

    /// Steps 2 and 3 on `scores`, whose `n`-th has key position minus query position
    /// `first_distance + n · step`: ALiBi's term `slope · (j - i)`, the distance converted
    /// exactly (below `2^24`) and multiplied once.
    fn apply(&self, kernels: &Kernels, scores: &mut [f32], first_distance: isize, step: isize) {
        if let Some(cap) = self.cap {
            // SAFETY: a checked kernel table; `cap` is finite and positive.
            unsafe { (kernels.softcap)(scores, cap) };
        }
        if let Some(slope) = self.slope {
            for (n, s) in scores.iter_mut().enumerate() {
                *s += slope * (first_distance + n as isize * step) as f32;
            }
        }
    }
}
