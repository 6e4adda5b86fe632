//! Rotary position embedding (RoPE): the settings a model's `config.json` states.
//!
//! Query and key features of each head are rotated in pairs by an angle proportional to the
//! token's position: pair `i` of a head (of `rotary_dim / 2` pairs) turns by
//! `position · inv_freq[i]`, `inv_freq[i] = theta^(-2i / rotary_dim)` before any
//! [`RopeScaling`]. Features `rotary_dim ..` of a head are left as they are (partial rotary).
//!
//! A layer keeps [`RopeAngles`]: the inverse frequencies, in `f64`. A call computes the `cos`
//! and `sin` of each row's angles as it rotates the row ([`RopeAngles::rotate`]), in `f64` with
//! the crate's own [`sin_cos`], rounded to `f32`: a function of the position alone, so no table
//! grows with the context or is kept per layer, and every position below `2^31` (more with
//! slower frequencies) is reached. The frequencies follow Hugging Face `transformers`
//! (`modeling_rope_utils.py`), evaluated in `f64`.

use alloc::format;
use alloc::vec::Vec;
use core::ops::Range;

use crate::error::ShapeError;
use crate::kernels::buffer::{run_time_len, try_grow};
use crate::kernels::math::trig::{ceil, floor, ln, powf, sin_cos, MAX_ANGLE};

/// Which two features of a head form a rotated pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pairs `(i, i + rotary_dim / 2)`: Llama, Mistral, Qwen, Gemma, GPT-NeoX, Phi-3
    /// (`rotate_half` in Hugging Face `transformers`).
    #[default]
    RotateHalf,
    /// Pairs `(2i, 2i + 1)`: GPT-J and its descendants.
    Interleaved,
}

/// How the rotation frequencies are rescaled for contexts longer than the model was trained
/// on (`rope_scaling` / `rope_parameters` in `config.json`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum RopeScaling {
    /// `inv_freq` as defined by `theta`.
    #[default]
    Default,
    /// Positions divided by `factor` (`"rope_type": "linear"`).
    Linear {
        /// The divisor of every position.
        factor: f64,
    },
    /// Llama 3.1's frequency-dependent rescaling (`"rope_type": "llama3"`).
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are divided
        /// by `factor`.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was trained with.
        original_max_position_embeddings: f64,
    },
    /// YaRN (`"rope_type": "yarn"`): frequencies blended between interpolation and
    /// extrapolation, and cos/sin multiplied by an attention factor.
    Yarn {
        /// Context extension factor.
        factor: f64,
        /// The context length the model was trained with.
        original_max_position_embeddings: f64,
        /// Fast boundary of the blend, in rotations (32 when the config omits it).
        beta_fast: f64,
        /// Slow boundary of the blend, in rotations (1 when the config omits it).
        beta_slow: f64,
        /// The factor cos and sin are multiplied by (`0.1 · ln(factor) + 1` when the config
        /// omits it and gives no `mscale`).
        attention_factor: f64,
        /// Whether the blend boundaries are rounded to whole dimensions (`truncate`, true when
        /// the config omits it).
        truncate: bool,
    },
    /// Gemma 4's proportional rotary (`"rope_type": "proportional"`): the first `pairs`
    /// frequencies as `theta` defines them, divided by `factor`, the others 0, so that with
    /// `rotary_dim` the whole head every feature pairs with the one half a head away and only
    /// the first `pairs` pairs turn (`pairs = ⌊partial_rotary_factor · head_dim / 2⌋`; unlike
    /// partial rotary, which pairs `i` with `i + rotary_dim / 2`).
    ///
    /// ```
    /// use mha::{Rope, RopeLayout, RopeScaling};
    /// let scaling = RopeScaling::Proportional { pairs: 1, factor: 1.0 };
    /// let rope = Rope { theta: 100.0, rotary_dim: 8, layout: RopeLayout::RotateHalf, scaling };
    /// assert_eq!(rope.inverse_frequencies()?, [1.0, 0.0, 0.0, 0.0]);
    /// let too_many = Rope { scaling: RopeScaling::Proportional { pairs: 5, factor: 1.0 }, ..rope };
    /// assert!(too_many.check(8).is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    Proportional {
        /// How many leading pairs turn, at most `rotary_dim / 2`.
        pairs: usize,
        /// The divisor of their frequencies (`factor`, 1 when the config omits it).
        factor: f64,
    },
}

/// The rotary embedding of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// The base of the frequencies (`rope_theta`; 10,000 in the original paper).
    pub theta: f64,
    /// How many leading features of each head rotate (even, at most the head width); the head
    /// width for full rotary, less for partial rotary (`rotary_pct`, `partial_rotary_factor`).
    pub rotary_dim: usize,
    /// Which features pair up.
    pub layout: RopeLayout,
    /// Frequency rescaling.
    pub scaling: RopeScaling,
}

impl Rope {
    /// Checks the settings for heads of `head_dim` features: `rotary_dim` even and at most
    /// `head_dim`, `theta` and the scaling's numbers finite and positive (YaRN's attention
    /// factor also in `f32`).
    ///
    /// # Errors
    /// [`ShapeError::RotaryDim`], or [`ShapeError::Setting`] naming the setting and its value.
    pub fn check(&self, head_dim: usize) -> Result<(), ShapeError> {
        let rotary_dim = self.rotary_dim;
        if !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            return Err(ShapeError::RotaryDim {
                rotary_dim,
                head_dim,
            });
        }
        positive("rope_theta", self.theta)?;
        self.scaling.check()?;
        if let RopeScaling::Proportional { pairs, .. } = self.scaling {
            if pairs > rotary_dim / 2 {
                return Err(ShapeError::Setting {
                    what: "proportional rope pairs",
                    value: format!("{pairs} (rotary_dim {rotary_dim})"),
                    expected: "at most rotary_dim / 2",
                });
            }
        }
        // `cos` and `sin` are multiplied by the attention factor in `f32`.
        let factor = self.scaling.attention_factor();
        let in_f32 = factor as f32;
        if !(in_f32.is_finite() && in_f32 > 0.0) {
            return Err(ShapeError::Setting {
                what: "rope_scaling attention_factor",
                value: format!("{factor:?} ({in_f32:?} in f32)"),
                expected: "finite and > 0 in f32",
            });
        }
        Ok(())
    }

    /// The inverse frequencies for heads of `head_dim` features after every check
    /// [`RopeAngles::new`] makes, and the largest position whose angles the crate's `sin_cos`
    /// reduces exactly (what [`RopeAngles::max_position`] reports).
    ///
    /// # Errors
    /// What [`Rope::check`] and [`Rope::inverse_frequencies`] reject.
    pub(crate) fn checked_frequencies(
        &self,
        head_dim: usize,
    ) -> Result<(Vec<f64>, usize), ShapeError> {
        self.check(head_dim)?;
        let inv = self.inverse_frequencies()?;
        let fastest = inv.iter().copied().fold(0.0, f64::max);
        // `as` saturates: no pair turning (or only slowly) reaches every position.
        let max_position = if fastest > 0.0 {
            floor(MAX_ANGLE / fastest) as usize
        } else {
            usize::MAX
        };
        Ok((inv, max_position))
    }

    /// The inverse frequency of each of the `rotary_dim / 2` pairs, in `f64`, as `transformers`
    /// computes them for the scaling (`_compute_default_rope_parameters`,
    /// `_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`,
    /// `_compute_yarn_parameters`), with `pos_freq[i] = theta^(2i / rotary_dim)`.
    ///
    /// ```
    /// use mha::{Rope, RopeLayout, RopeScaling};
    /// let rope = Rope { theta: 10_000.0, rotary_dim: 4, layout: RopeLayout::RotateHalf, scaling: RopeScaling::Linear { factor: 2.0 } };
    /// let inv = rope.inverse_frequencies()?;
    /// assert_eq!(inv[0], 0.5);
    /// assert!((inv[1] - 0.005).abs() < 1e-15);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::Setting`] for a setting that is not finite and positive (or a frequency
    /// that comes out negative or not finite), [`ShapeError::Overflow`] or
    /// [`ShapeError::AllocationFailed`] when the `rotary_dim / 2` values cannot be allocated.
    pub fn inverse_frequencies(&self) -> Result<Vec<f64>, ShapeError> {
        positive("rope_theta", self.theta)?;
        self.scaling.check()?;
        const WHAT: &str = "rotary inverse frequencies (rotary_dim / 2)";
        let pairs = self.rotary_dim / 2;
        let mut inv = Vec::new();
        try_grow(&mut inv, run_time_len::<f64>(WHAT, &[pairs])?, 0.0, WHAT)?;
        let dim = self.rotary_dim as f64;
        for (i, inv) in inv.iter_mut().enumerate() {
            *inv = 1.0 / powf(self.theta, (2 * i) as f64 / dim);
        }
        self.scaling.rescale(&mut inv, dim, self.theta);
        match inv.iter().find(|f| !(f.is_finite() && **f >= 0.0)) {
            Some(&bad) => Err(setting("rotary inverse frequency", bad, "finite and >= 0")),
            None => Ok(inv),
        }
    }
}

impl RopeScaling {
    /// YaRN's default attention factor, as `transformers` derives it when `config.json` gives
    /// none: `get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)` when both are
    /// given and nonzero, else `get_mscale(factor)`, where `get_mscale(s, m) = 0.1 · m · ln(s) + 1`
    /// (`m = 1` when omitted), or 1 for `s ≤ 1`.
    ///
    /// ```
    /// use mha::RopeScaling;
    /// assert_eq!(RopeScaling::yarn_attention_factor(1.0, None, None), 1.0);
    /// let f = RopeScaling::yarn_attention_factor(4.0, None, None);
    /// assert!((f - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-15);
    /// assert_eq!(RopeScaling::yarn_attention_factor(4.0, Some(0.707), Some(0.707)), 1.0);
    /// ```
    pub fn yarn_attention_factor(
        factor: f64,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
    ) -> f64 {
        let get_mscale = |m: f64| {
            if factor <= 1.0 {
                1.0
            } else {
                0.1 * m * ln(factor) + 1.0
            }
        };
        match (mscale, mscale_all_dim) {
            (Some(m), Some(all)) if m != 0.0 && all != 0.0 => get_mscale(m) / get_mscale(all),
            _ => get_mscale(1.0),
        }
    }

    /// What cos and sin are multiplied by: YaRN's attention factor, else 1.
    pub fn attention_factor(&self) -> f64 {
        match *self {
            RopeScaling::Yarn {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        }
    }

    /// Every number finite and positive (YaRN's attention factor also in `f32`, the type of
    /// its products with cos and sin), and llama3's `high_freq_factor > low_freq_factor`.
    fn check(&self) -> Result<(), ShapeError> {
        match *self {
            RopeScaling::Default => Ok(()),
            RopeScaling::Linear { factor } => positive("rope_scaling factor", factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                positive("rope_scaling factor", factor)?;
                positive("rope_scaling low_freq_factor", low_freq_factor)?;
                positive("rope_scaling high_freq_factor", high_freq_factor)?;
                positive(
                    "rope_scaling original_max_position_embeddings",
                    original_max_position_embeddings,
                )?;
                if high_freq_factor <= low_freq_factor {
                    return Err(ShapeError::Setting {
                        what: "rope_scaling high_freq_factor",
                        value: format!(
                            "{high_freq_factor:?} (low_freq_factor {low_freq_factor:?})"
                        ),
                        expected: "above low_freq_factor",
                    });
                }
                Ok(())
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate: _,
            } => {
                positive("rope_scaling factor", factor)?;
                positive(
                    "rope_scaling original_max_position_embeddings",
                    original_max_position_embeddings,
                )?;
                positive("rope_scaling beta_fast", beta_fast)?;
                positive("rope_scaling beta_slow", beta_slow)?;
                positive("rope_scaling attention_factor", attention_factor)
            }
            RopeScaling::Proportional { factor, .. } => positive("rope_scaling factor", factor),
        }
    }

    /// Rescales the unscaled inverse frequencies `inv[i] = 1 / theta^(2i / dim)` in place.
    ///
    /// Each variant's arithmetic is a function of its own that takes the fields as arguments
    /// and is never inlined: LLVM may otherwise compute one variant's math speculatively from
    /// the payload bytes of another (uninitialised for `Default`) and branch on the result,
    /// which is harmless but makes memcheck report every layer built.
    fn rescale(&self, inv: &mut [f64], dim: f64, theta: f64) {
        match *self {
            RopeScaling::Default => {}
            RopeScaling::Linear { factor } => inv.iter_mut().for_each(|inv| *inv /= factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => llama3(
                inv,
                factor,
                (low_freq_factor, high_freq_factor),
                original_max_position_embeddings,
            ),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                attention_factor: _,
            } => {
                let rotations = (beta_fast, beta_slow);
                let original = original_max_position_embeddings;
                let range = yarn_correction_range(rotations, original, truncate, dim, theta);
                yarn(inv, factor, range, dim, theta);
            }
            RopeScaling::Proportional { pairs, factor } => proportional(inv, pairs, factor),
        }
    }
}

/// `_compute_proportional_rope_parameters`: the first `pairs` frequencies divided by
/// `factor`, the others 0.
#[inline(never)]
fn proportional(inv: &mut [f64], pairs: usize, factor: f64) {
    for (i, inv) in inv.iter_mut().enumerate() {
        *inv = if i < pairs { *inv / factor } else { 0.0 };
    }
}

/// `_compute_llama3_parameters`: wavelengths above `original / low_freq_factor` divided by
/// `factor`, below `original / high_freq_factor` kept, smoothly blended between.
#[inline(never)]
fn llama3(inv: &mut [f64], factor: f64, (low, high): (f64, f64), original: f64) {
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    for inv in inv {
        let wavelen = 2.0 * core::f64::consts::PI / *inv;
        let inv_llama = if wavelen > low_wavelen {
            *inv / factor
        } else {
            *inv
        };
        let smooth = (original / wavelen - low) / (high - low);
        let smoothed = (1.0 - smooth) * inv_llama / factor + smooth * inv_llama;
        // `~(wavelen < high) * ~(wavelen > low)`; `wavelen` is never NaN (`inv` is finite).
        let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
        *inv = if medium { smoothed } else { inv_llama };
    }
}

/// YaRN's correction range `(low, high)` in rotary dimensions for `(beta_fast, beta_slow)`
/// rotations over `original` positions, clamped to `0 ..= dim - 1` (rounded outwards when
/// `truncate`; `linear_ramp_factor` moves a degenerate range off its singularity).
#[inline(never)]
fn yarn_correction_range(
    (beta_fast, beta_slow): (f64, f64),
    original: f64,
    truncate: bool,
    dim: f64,
    theta: f64,
) -> (f64, f64) {
    let correction_dim = |rotations: f64| {
        let turns = rotations * 2.0 * core::f64::consts::PI;
        (dim * ln(original / turns)) / (2.0 * ln(theta))
    };
    let (low, high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    let (low, high) = if truncate {
        (floor(low), ceil(high))
    } else {
        (low, high)
    };
    let (low, high) = (low.max(0.0), high.min(dim - 1.0));
    let high = if low == high { high + 0.001 } else { high };
    (low, high)
}

/// YaRN's blend of pair `i`: `inv_freq_extrapolation_factor` is 1 below the correction range,
/// 0 above, a linear ramp between; it weighs the unscaled `inv[i]` against the interpolated
/// `1 / (factor · theta^(2i / dim))`.
#[inline(never)]
fn yarn(inv: &mut [f64], factor: f64, (low, high): (f64, f64), dim: f64, theta: f64) {
    for (i, inv) in inv.iter_mut().enumerate() {
        let pos_freq = powf(theta, (2 * i) as f64 / dim);
        let extrapolation = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
        let interpolation = 1.0 / (factor * pos_freq);
        *inv = interpolation * (1.0 - extrapolation) + *inv * extrapolation;
    }
}

/// `Ok` when `value` is finite and positive, else [`ShapeError::Setting`] naming it.
fn positive(what: &'static str, value: f64) -> Result<(), ShapeError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(setting(what, value, "finite and > 0"))
    }
}

/// [`ShapeError::Setting`]: `what` is `value`, but must be `expected`.
fn setting(what: &'static str, value: f64, expected: &'static str) -> ShapeError {
    ShapeError::Setting {
        what,
        value: format!("{value:?}"),
        expected,
    }
}

/// The rotary embedding of one layer, ready to apply: its settings and the `rotary_dim / 2`
/// inverse frequencies ([`RopeAngles::new`]); the angles of a position are computed when a
/// row at that position is rotated ([`rotate`](RopeAngles::rotate)). Its size does not depend
/// on the positions reached.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeAngles {
    rope: Rope,
    head_dim: usize,
    /// `inv_freq[i]` of each pair, in `f64`.
    inv: Vec<f64>,
    /// What `cos` and `sin` are multiplied by (YaRN's attention factor, else 1).
    factor: f64,
    /// The largest position whose every angle is within [`MAX_ANGLE`].
    max_position: usize,
}

/// The rows [`RopeAngles::rotate`] turns: `rows` rows of `heads` heads of the embedding's
/// `head_dim` features each, row `r` starting at `r · row_stride` (a `(rows, heads, head_dim)`
/// buffer, or the query or key part of wider rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeRows {
    /// The number of rows (tokens).
    pub rows: usize,
    /// Heads per row.
    pub heads: usize,
    /// Floats from one row to the next, at least `heads · head_dim`.
    pub row_stride: usize,
}

/// The position of each row of a rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePositions<'a> {
    /// The rows are `starts.len()` sequences of `len` tokens each (a `(B, len)` batch),
    /// sequence `b` continuing from `starts[b]`: row `r` is at `starts[r / len] + r % len`. A
    /// forward pass starts every sequence at 0, a decoding step each at the number of tokens
    /// it has cached.
    PerSequence {
        /// The position of each sequence's first row.
        starts: &'a [usize],
        /// Rows per sequence (nonzero when there are rows).
        len: usize,
    },
    /// One position per row (left-padded batches, packed sequences).
    Explicit(&'a [usize]),
}

impl RopePositions<'_> {
    /// The position of row `r` (checked by [`RopeAngles::check_positions`]).
    pub(crate) fn at(&self, r: usize) -> usize {
        match *self {
            RopePositions::PerSequence { starts, len } => starts[r / len] + r % len,
            RopePositions::Explicit(positions) => positions[r],
        }
    }
}

impl RopeAngles {
    /// The rotary embedding `rope` for heads of `head_dim` features.
    ///
    /// ```
    /// use mha::{Rope, RopeAngles, RopeLayout, RopePositions, RopeRows, RopeScaling};
    /// let rope = Rope { theta: 10_000.0, rotary_dim: 2, layout: RopeLayout::RotateHalf, scaling: RopeScaling::Default };
    /// let angles = RopeAngles::new(rope, 2)?;
    /// // One row of one head, [1, 0] at position 1: turned by 1 radian.
    /// let mut row = [1.0, 0.0];
    /// let rows = RopeRows { rows: 1, heads: 1, row_stride: 2 };
    /// angles.rotate(&mut row, rows, RopePositions::Explicit(&[1]))?;
    /// assert_eq!(row, [1f64.cos() as f32, 1f64.sin() as f32]);
    /// assert!(angles.max_position() >= (1 << 31) - 1);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// What [`Rope::check`] and [`Rope::inverse_frequencies`] reject.
    pub fn new(rope: Rope, head_dim: usize) -> Result<Self, ShapeError> {
        let (inv, max_position) = rope.checked_frequencies(head_dim)?;
        Ok(RopeAngles {
            factor: rope.scaling.attention_factor(),
            rope,
            head_dim,
            inv,
            max_position,
        })
    }

    /// The settings.
    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// The head width the embedding rotates.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The largest position a row may have: every angle `position · inv_freq[i]` of it is
    /// within [`MAX_ANGLE`], where [`sin_cos`] is exact. At least `2^31 - 1` for every
    /// frequency up to 1 (`inv_freq[0] = 1` without scaling).
    pub fn max_position(&self) -> usize {
        self.max_position
    }

    /// `(cos, sin)` of pair `pair` at `position`: `cos(position · inv_freq[pair])` and the
    /// `sin`, times YaRN's attention factor, computed in `f64` and rounded to `f32`, as
    /// [`rotate`](RopeAngles::rotate) uses them; `None` for a pair or a position out of range.
    pub fn cos_sin(&self, position: usize, pair: usize) -> Option<(f32, f32)> {
        let inv = *self.inv.get(pair)?;
        (position <= self.max_position).then(|| self.turn(position as f64 * inv))
    }

    /// `(cos, sin)` of `angle`, times the attention factor, rounded to `f32`.
    fn turn(&self, angle: f64) -> (f32, f32) {
        let (sin, cos) = sin_cos(angle);
        ((cos * self.factor) as f32, (sin * self.factor) as f32)
    }

    /// Rotates the first `rotary_dim` features of every head of every row of `buffer` in place,
    /// row `r` by its position: pair `(a, b)` (`(i, i + rotary_dim/2)` or `(2i, 2i + 1)` by the
    /// layout) becomes `(a·cos - b·sin, b·cos + a·sin)` with [`cos_sin`](RopeAngles::cos_sin)
    /// of the row's position and pair `i`, as `transformers`' `q * cos + rotate_half(q) * sin`.
    /// Writes nothing unless every check passes.
    ///
    /// # Errors
    /// [`ShapeError::DimensionMismatch`] for a row stride below `heads · head_dim` or zero rows
    /// per sequence, [`ShapeError::LengthMismatch`] for a buffer too short for the rows,
    /// explicit positions not one per row or sequences whose rows do not add up to `rows`,
    /// [`ShapeError::RopePosition`] for a position beyond [`max_position`](Self::max_position),
    /// [`ShapeError::TooLarge`] when the rows' extent overflows.
    pub fn rotate(
        &self,
        buffer: &mut [f32],
        rows: RopeRows,
        positions: RopePositions<'_>,
    ) -> Result<(), ShapeError> {
        self.check(buffer.len(), rows, positions)?;
        self.rotate_rows(buffer, rows, positions, 0..rows.rows);
        Ok(())
    }

    /// The checks of [`RopeAngles::rotate`] for `rows` in a buffer of `len` floats.
    ///
    /// # Errors
    /// As [`RopeAngles::rotate`].
    pub(crate) fn check(
        &self,
        len: usize,
        rows: RopeRows,
        positions: RopePositions<'_>,
    ) -> Result<(), ShapeError> {
        self.check_rows(len, rows)?;
        self.check_positions(rows.rows, positions)
    }

    /// [`RopeAngles::rotate`] of the rows `range` of `rows`, after [`RopeAngles::check`]:
    /// `buffer` starts at row `range.start`. Each row's angles are computed once for all its
    /// heads, [`PAIRS_AT_ONCE`] pairs at a time.
    pub(crate) fn rotate_rows(
        &self,
        buffer: &mut [f32],
        rows: RopeRows,
        positions: RopePositions<'_>,
        range: Range<usize>,
    ) {
        let pairs = self.inv.len();
        let width = rows.heads * self.head_dim;
        let (mut cos, mut sin) = ([0.0; PAIRS_AT_ONCE], [0.0; PAIRS_AT_ONCE]);
        for (i, r) in range.enumerate() {
            let position = positions.at(r) as f64;
            let row = &mut buffer[i * rows.row_stride..][..width];
            for first in (0..pairs).step_by(PAIRS_AT_ONCE) {
                let inv = &self.inv[first..pairs.min(first + PAIRS_AT_ONCE)];
                for ((c, s), &inv) in cos.iter_mut().zip(&mut sin).zip(inv) {
                    (*c, *s) = self.turn(position * inv);
                }
                let span = PairSpan {
                    first,
                    count: inv.len(),
                    pairs,
                };
                for head in row.chunks_exact_mut(self.head_dim) {
                    rotate_pairs(head, span, &cos, &sin, self.rope.layout);
                }
            }
        }
    }

    /// Turns the rotary features of every head of `row` (whole heads of `head_dim`) by
    /// `delta` positions: a key rotated at position `p` becomes one rotated at `p + delta`
    /// (up to rounding), by the rotation of angle `delta · inv_freq[i]` alone (without the
    /// attention factor, which the row carries once already). `|delta|` is at most
    /// [`max_position`](Self::max_position) (the caller checks).
    pub(crate) fn shift_row(&self, row: &mut [f32], delta: isize) {
        let pairs = self.inv.len();
        let (sign, steps) = (
            if delta < 0 { -1.0 } else { 1.0 },
            delta.unsigned_abs() as f64,
        );
        let (mut cos, mut sin) = ([0.0; PAIRS_AT_ONCE], [0.0; PAIRS_AT_ONCE]);
        for first in (0..pairs).step_by(PAIRS_AT_ONCE) {
            let inv = &self.inv[first..pairs.min(first + PAIRS_AT_ONCE)];
            for ((c, s), &inv) in cos.iter_mut().zip(&mut sin).zip(inv) {
                let (sine, cosine) = sin_cos(steps * inv);
                (*c, *s) = (cosine as f32, (sign * sine) as f32);
            }
            let span = PairSpan {
                first,
                count: inv.len(),
                pairs,
            };
            for head in row.chunks_exact_mut(self.head_dim) {
                rotate_pairs(head, span, &cos, &sin, self.rope.layout);
            }
        }
    }

    /// The rows fit in `len` floats.
    fn check_rows(&self, len: usize, rows: RopeRows) -> Result<(), ShapeError> {
        if rows.rows == 0 {
            return Ok(());
        }
        let width = rows
            .heads
            .checked_mul(self.head_dim)
            .ok_or(ShapeError::TooLarge)?;
        if rows.row_stride < width {
            return Err(ShapeError::DimensionMismatch {
                what: "rotary row stride (at least heads x head_dim)",
                expected: width,
                actual: rows.row_stride,
            });
        }
        let needed = (rows.rows - 1)
            .checked_mul(rows.row_stride)
            .and_then(|n| n.checked_add(width))
            .ok_or(ShapeError::TooLarge)?;
        if len < needed {
            return Err(ShapeError::LengthMismatch {
                what: "rotary buffer (rows, row stride)",
                expected: needed,
                actual: len,
            });
        }
        Ok(())
    }

    /// Every row's position is at most [`max_position`](Self::max_position).
    fn check_positions(&self, rows: usize, positions: RopePositions<'_>) -> Result<(), ShapeError> {
        let max = self.max_position;
        let beyond = |index, position| ShapeError::RopePosition {
            index,
            position,
            max,
        };
        match positions {
            RopePositions::Explicit(explicit) => {
                if explicit.len() != rows {
                    return Err(ShapeError::LengthMismatch {
                        what: "rotary positions (one per row)",
                        expected: rows,
                        actual: explicit.len(),
                    });
                }
                match explicit.iter().position(|&p| p > max) {
                    Some(index) => Err(beyond(index, explicit[index])),
                    None => Ok(()),
                }
            }
            RopePositions::PerSequence { starts, len } => {
                if rows > 0 && len == 0 {
                    return Err(ShapeError::DimensionMismatch {
                        what: "rows per sequence of rotary positions",
                        expected: rows,
                        actual: 0,
                    });
                }
                if starts.len().checked_mul(len) != Some(rows) {
                    return Err(ShapeError::LengthMismatch {
                        what: "rotary sequence starts times rows per sequence",
                        expected: rows,
                        actual: starts.len().saturating_mul(len),
                    });
                }
                check_sequences(starts, len, max)
            }
        }
    }
}

/// `Ok` when the rows of the sequences of `len` rows starting at `starts` (row `r` at
/// `starts[r / len] + r % len`) are all at most `max`; else [`ShapeError::RopePosition`]
/// naming the first row that is not.
fn check_sequences(starts: &[usize], len: usize, max: usize) -> Result<(), ShapeError> {
    for (b, &start) in starts.iter().enumerate() {
        // The first row of this sequence whose position would be beyond `max`.
        let first_beyond = (max - max.min(start)).saturating_add(usize::from(start <= max));
        if first_beyond < len {
            return Err(ShapeError::RopePosition {
                index: b * len + first_beyond,
                position: start.saturating_add(first_beyond),
                max,
            });
        }
    }
    Ok(())
}

/// How many pairs' `cos` and `sin` [`RopeAngles::rotate_rows`] holds at once (on the stack).
const PAIRS_AT_ONCE: usize = 32;

/// Pairs `first .. first + count` of the `pairs` of a head's rotary features.
#[derive(Clone, Copy)]
struct PairSpan {
    first: usize,
    count: usize,
    pairs: usize,
}

/// Turns pairs `span` of one head's rotary features by the angles whose `cos` and `sin` are
/// given (`cos[j]`, `sin[j]` for pair `span.first + j`): pair `i` is features `(i, i + pairs)`
/// or `(2i, 2i + 1)` by the layout.
fn rotate_pairs(head: &mut [f32], span: PairSpan, cos: &[f32], sin: &[f32], layout: RopeLayout) {
    let turn = |a: f32, b: f32, c: f32, s: f32| (a * c - b * s, b * c + a * s);
    let (cos, sin) = (&cos[..span.count], &sin[..span.count]);
    match layout {
        RopeLayout::RotateHalf => {
            let (first, second) = head[..2 * span.pairs].split_at_mut(span.pairs);
            let first = &mut first[span.first..][..span.count];
            let second = &mut second[span.first..][..span.count];
            for (((a, b), &c), &s) in first.iter_mut().zip(second).zip(cos).zip(sin) {
                (*a, *b) = turn(*a, *b, c, s);
            }
        }
        RopeLayout::Interleaved => {
            let features = &mut head[2 * span.first..][..2 * span.count];
            for ((pair, &c), &s) in features.chunks_exact_mut(2).zip(cos).zip(sin) {
                (pair[0], pair[1]) = turn(pair[0], pair[1], c, s);
            }
        }
    }
}
