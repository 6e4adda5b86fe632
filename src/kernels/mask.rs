//! Which keys each query may see: causal order, per-batch key padding and general masks.

/// The values of a mask over (query, key), row-major `(T, S)`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MaskValues<'a> {
    /// `true` where the query may see the key.
    Bool(&'a [bool]),
    /// Added to the scaled score; `-inf` hides the key.
    Additive(&'a [f32]),
}

impl<'a> MaskValues<'a> {
    /// The same mask from element `offset` on.
    fn skip(self, offset: usize) -> Self {
        match self {
            MaskValues::Bool(m) => MaskValues::Bool(&m[offset..]),
            MaskValues::Additive(m) => MaskValues::Additive(&m[offset..]),
        }
    }

    /// Whether entry `index` lets the query see the key.
    fn allows(&self, index: usize) -> bool {
        match *self {
            MaskValues::Bool(m) => m[index],
            MaskValues::Additive(m) => m[index] != f32::NEG_INFINITY,
        }
    }
}

/// The visibility rule of one attention call, for all batch elements.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Visibility<'a> {
    /// `Some(offset)`: key `j` is visible to query `i` only if `j <= i + offset`. With `S` keys
    /// and `T` queries, `offset = S - T` aligns the diagonal bottom-right (a KV cache); plain
    /// causal self-attention has offset 0.
    pub causal: Option<isize>,
    /// Per batch element, the number of valid keys; keys at or past it are padding and are
    /// never read.
    pub key_lens: Option<&'a [usize]>,
    /// `(B, S)`: `true` for keys that may be seen, `false` for padding anywhere in the sequence.
    pub key_mask: Option<&'a [bool]>,
    /// A `(T, S)` mask and the distance between batch elements' masks (0: one mask for all).
    pub mask: Option<(MaskValues<'a>, usize)>,
}

impl<'a> Visibility<'a> {
    /// The rule for batch element `b` with query rows counted from `q0` (`kv_len` keys).
    pub(crate) fn for_item(&self, b: usize, q0: usize, kv_len: usize) -> Rule<'a> {
        Rule {
            causal: self.causal.map(|offset| offset + q0 as isize),
            key_limit: self.key_lens.map_or(kv_len, |lens| lens[b].min(kv_len)),
            key_mask: self.key_mask.map(|m| &m[b * kv_len..][..kv_len]),
            mask: self
                .mask
                .map(|(values, batch_stride)| values.skip(b * batch_stride + q0 * kv_len)),
            kv_len,
        }
    }
}

/// The visibility rule of one work item: one batch element, query rows counted from the
/// item's first row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rule<'a> {
    causal: Option<isize>,
    key_limit: usize,
    key_mask: Option<&'a [bool]>,
    mask: Option<MaskValues<'a>>,
    kv_len: usize,
}

impl Rule<'_> {
    /// One past the last key any query `< rows` can see.
    pub(crate) fn key_end(&self, rows: usize) -> usize {
        let causal_end = self.causal.map_or(self.kv_len, |offset| {
            (rows as isize + offset).clamp(0, self.kv_len as isize) as usize
        });
        causal_end.min(self.key_limit)
    }

    /// The first query the causal order lets see key `j` (0 without causal order).
    pub(crate) fn first_query(&self, j: usize) -> usize {
        self.causal
            .map_or(0, |offset| (j as isize - offset).max(0) as usize)
    }

    /// Whether query `i` sees key `j`.
    pub(crate) fn is_visible(&self, i: usize, j: usize) -> bool {
        j < self.key_limit
            && self.key_mask.is_none_or(|m| m[j])
            && self
                .causal
                .is_none_or(|offset| j as isize <= i as isize + offset)
            && self.mask.is_none_or(|m| m.allows(i * self.kv_len + j))
    }

    /// How many keys from `k0` on (at most `len`) every query in `rows` sees.
    pub(crate) fn visible_prefix(
        &self,
        rows: core::ops::Range<usize>,
        k0: usize,
        len: usize,
    ) -> usize {
        let len = len.min(self.key_limit.saturating_sub(k0));
        let causal_len = self.causal.map_or(len, |offset| {
            (rows.start as isize + offset + 1 - k0 as isize).clamp(0, len as isize) as usize
        });
        if self.mask.is_none() && self.key_mask.is_none() {
            return causal_len;
        }
        (0..causal_len)
            .find(|&j| !rows.clone().all(|i| self.is_visible(i, k0 + j)))
            .unwrap_or(causal_len)
    }

    /// What happens to query `i`'s score for key `j`: `None` when the key is hidden, else the
    /// value added to the score (0 without an additive mask).
    pub(crate) fn adjustment(&self, i: usize, j: usize) -> Option<f32> {
        if !self.is_visible(i, j) {
            return None;
        }
        Some(match self.mask {
            Some(MaskValues::Additive(m)) => m[i * self.kv_len + j],
            _ => 0.0,
        })
    }

    /// Query `i`'s score for key `j` after the rule: `-inf` when hidden, plus the additive
    /// mask value when there is one.
    pub(crate) fn adjust(&self, i: usize, j: usize, score: f32) -> f32 {
        match self.adjustment(i, j) {
            None => f32::NEG_INFINITY,
            Some(add) if self.mask.is_some() => score + add,
            Some(_) => score,
        }
    }

    /// Whether the rule is only a limit on each query's keys (causal order, key lengths): every
    /// key below [`Rule::key_end`] of a query is visible to it and nothing is added to scores.
    pub(crate) fn is_prefix_only(&self) -> bool {
        self.mask.is_none() && self.key_mask.is_none()
    }

    /// Applies the rule to the scores of key `j` against queries `0 .. row.len()`: hidden
    /// scores become `-inf`, additive mask values are added.
    pub(crate) fn apply(&self, j: usize, row: &mut [f32]) {
        if self.is_prefix_only() && j < self.key_limit {
            // Causal only: the hidden queries are a prefix.
            let hidden = self.first_query(j).min(row.len());
            row[..hidden].fill(f32::NEG_INFINITY);
            return;
        }
        for (i, score) in row.iter_mut().enumerate() {
            *score = self.adjust(i, j, *score);
        }
    }
}
