//! The score stage's terms beyond `scale · q·k`, per query `i` and visible key `j` of head `h`
//! (positions as causal order counts them: a query's position is its sequence's cached tokens
//! plus its index in the call):
//!
//! 1. `s = scale · q·k` (the scale is folded into the queries);
//! 2. `s = cap · tanh(s / cap)` with a soft cap;
//! 3. `s = s + slope_h · (j - i)` with ALiBi, i.e. `- slope_h · (i - j)`;
//! 4. the mask's rule (hidden keys `-inf`, an additive mask's entry added);
//! 5. softmax over the visible keys and, with a sink, the sink logit `sink_h`, which takes
//!    probability mass and contributes no value.

use alloc::vec::Vec;

use crate::kernels::Kernels;

/// A layer's score-stage settings, checked by the layer's builder.
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
    /// The terms of query head `h`.
    pub(crate) fn head(&self, h: usize) -> HeadTerms {
        HeadTerms {
            slope: self.slopes.as_ref().map(|s| s[h]),
            cap: self.cap,
            sink: self.sinks.as_ref().map_or(f32::NEG_INFINITY, |s| s[h]),
        }
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
    /// `first_position ..` (a key-major column of the tile path), ALiBi placing them by
    /// `ranks`.
    pub(crate) fn apply_column(
        &self,
        kernels: &Kernels,
        ranks: Ranks<'_>,
        key: usize,
        first_position: isize,
        column: &mut [f32],
    ) {
        if ranks.before.is_none() {
            let first_distance = key as isize - first_position;
            return self.apply(kernels, column, |n| first_distance - n as isize);
        }
        let key = ranks.at(key as isize);
        self.apply(kernels, column, |n| {
            key - ranks.at(first_position + n as isize)
        });
    }

    /// Steps 2 and 3 on the scores of the query at `position` against the keys
    /// `first_key ..` (a row of the row path): per score the arithmetic of
    /// [`HeadTerms::apply_column`], so the same bits.
    pub(crate) fn apply_row(
        &self,
        kernels: &Kernels,
        ranks: Ranks<'_>,
        position: isize,
        first_key: usize,
        row: &mut [f32],
    ) {
        if ranks.before.is_none() {
            let first_distance = first_key as isize - position;
            return self.apply(kernels, row, |n| first_distance + n as isize);
        }
        let query = ranks.at(position);
        self.apply(kernels, row, |n| ranks.at((first_key + n) as isize) - query);
    }

    /// Steps 2 and 3 on `scores`, whose `n`-th has key position minus query position
    /// `distance(n)`: ALiBi's term `slope · (j - i)`, the distance converted exactly (below
    /// `2^24`) and multiplied once.
    fn apply(&self, kernels: &Kernels, scores: &mut [f32], distance: impl Fn(usize) -> isize) {
        if let Some(cap) = self.cap {
            // SAFETY: a checked kernel table; `cap` is finite and positive.
            unsafe { (kernels.softcap)(scores, cap) };
        }
        if let Some(slope) = self.slope {
            for (n, s) in scores.iter_mut().enumerate() {
                *s += slope * distance(n) as f32;
            }
        }
    }
}

/// Where ALiBi places the keys and queries of one batch element: at their index, or at their
/// rank among its real keys (BLOOM: `cumsum(mask) - 1`, padding not counted).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ranks<'a> {
    /// `before[p]`: the real keys before position `p`, for `p` in `0 ..= S`; `None`: every
    /// position is its own rank.
    pub before: Option<&'a [usize]>,
}

impl Ranks<'_> {
    /// The rank of position `p`: `before[p]` inside the keys; past them, one per position on
    /// from the last (a query beyond the keys, as cross-attention places them); before them,
    /// `p` itself.
    fn at(&self, p: isize) -> isize {
        let Some(before) = self.before else {
            return p;
        };
        let last = before.len() as isize - 1;
        match p {
            p if p < 0 => p,
            p if p <= last => before[p as usize] as isize,
            p => before[last as usize] as isize + (p - last),
        }
    }
}
