//! A query scale that depends on the token's position (Ministral 3's `llama_4_scaling_beta`,
//! Llama 4's attention temperature tuning): every query feature of a token at position `p` is
//! multiplied by `1 + beta · ln(1 + ⌊(p + offset) / period⌋)`, after QK-norm and RoPE, before
//! the scores. Keys are not scaled, so a cache holds what it would without the scale.

use alloc::format;

use crate::error::ShapeError;
use crate::kernels::math::trig::{floor, ln};
use crate::layer::rope::RopePositions;

/// Which position of a token a [`QueryScale`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScalePosition {
    /// The token's position as RoPE takes it: its explicit
    /// [`AttendOptions::positions`](crate::AttendOptions::positions) entry when the call gives
    /// them, else its index (Ministral 3, from `position_ids`).
    #[default]
    Position,
    /// The token's index in its sequence, `cached + t` (the tokens its sequence held before the
    /// call, plus its index in the call), whatever explicit positions say (Llama 4, from the
    /// cache position).
    Index,
}

/// A position-dependent query scale in log-floor form: the queries of a token at position `p`
/// (see [`ScalePosition`]) are multiplied by
/// `s(p) = 1 + beta · ln(1 + ⌊(p + offset) / period⌋)`, computed in `f64` and rounded to `f32`,
/// after QK-norm and RoPE.
///
/// Ministral 3 (`llama_4_scaling_beta`): `beta` = that value, `period` =
/// `original_max_position_embeddings`, `offset` 0, from the position. Llama 4's attention
/// temperature tuning: `beta` = `attn_scale`, `period` = `floor_scale`, `offset` 1, from the
/// index.
///
/// A layer takes it with [`LayerBuilder::query_scale`](crate::LayerBuilder::query_scale),
/// which checks it. Each token's factor depends on its own position alone, so decoding equals
/// the forward pass bit for bit, for any thread count and cache.
///
/// ```
/// use mha::{QueryScale, ScalePosition};
/// let scale = QueryScale { beta: 0.5, period: 4.0, offset: 0, from: ScalePosition::Position };
/// assert_eq!(scale.factor(3), 1.0); // ⌊3 / 4⌋ = 0
/// assert_eq!(scale.factor(4), (1.0 + 0.5 * 2f64.ln()) as f32);
/// assert_eq!(scale.factor(12), (1.0 + 0.5 * 4f64.ln()) as f32);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueryScale {
    /// The strength of the scale (finite).
    pub beta: f64,
    /// The positions one step of the floor spans (finite and positive).
    pub period: f64,
    /// Added to the position before the division.
    pub offset: usize,
    /// Which position of a token is read.
    pub from: ScalePosition,
}

impl QueryScale {
    /// `s(position)` as the layer multiplies the queries by it, in `f32`.
    pub fn factor(&self, position: usize) -> f32 {
        let shifted = position as f64 + self.offset as f64;
        (1.0 + self.beta * ln(1.0 + floor(shifted / self.period))) as f32
    }

    /// Checks `beta` (finite), `period` (finite and positive) and that the factor stays finite
    /// in `f32` at every position (it grows with the position: the last one decides).
    ///
    /// # Errors
    /// [`ShapeError::Setting`] naming the number.
    pub(crate) fn check(&self) -> Result<(), ShapeError> {
        let setting = |what, value: f64, expected| ShapeError::Setting {
            what,
            value: format!("{value:?}"),
            expected,
        };
        if !self.beta.is_finite() {
            return Err(setting("query scale beta", self.beta, "finite"));
        }
        if !(self.period.is_finite() && self.period > 0.0) {
            let expected = "finite and > 0";
            return Err(setting("query scale period", self.period, expected));
        }
        let last = self.factor(usize::MAX);
        if !last.is_finite() {
            let expected = "a factor finite in f32 at every position";
            return Err(setting("query scale beta", self.beta, expected));
        }
        Ok(())
    }

    /// Multiplies the query rows `range` of a call (`rows` starts at row `range.start`; each
    /// row `width` floats) by the factor of their position: `positions` as RoPE reads them, or
    /// each sequence's indices `index` for [`ScalePosition::Index`].
    pub(crate) fn scale_rows(
        &self,
        rows: &mut [f32],
        width: usize,
        (positions, index): (RopePositions<'_>, RopePositions<'_>),
        range: core::ops::Range<usize>,
    ) {
        let positions = match self.from {
            ScalePosition::Position => positions,
            ScalePosition::Index => index,
        };
        for (row, r) in rows.chunks_exact_mut(width.max(1)).zip(range) {
            let factor = self.factor(positions.at(r));
            row.iter_mut().for_each(|q| *q *= factor);
        }
    }
}
