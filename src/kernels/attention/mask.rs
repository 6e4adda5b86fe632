//! Which keys each query may see: causal order, a sliding window, per-batch key padding and
//! general masks.

use crate::kernels::attention::terms::Ranks;

/// A mask over (query, key) pairs, `(T, S)` row-major for all batch elements, or `(B, T, S)`
/// with one mask per batch element.
#[derive(Clone, Copy, Debug)]
pub enum AttnMask<'a> {
    /// `true` where the query may see the key.
    Bool(&'a [bool]),
    /// Added to the scaled score before the softmax; `-inf` hides the key. Every other value
    /// must be finite.
    Additive(&'a [f32]),
}

/// A call's limits on which keys its queries see and which of its queries are real, beyond
/// causal order (the per-call options of the front, checked against the call's shape).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Masks<'a> {
    /// Valid keys per batch element, each at most `S`.
    pub key_lengths: Option<&'a [usize]>,
    /// `(B, S)`: `true` for real keys.
    pub key_padding_mask: Option<&'a [bool]>,
    /// The first key each batch element's queries see (left padding before it), `B` values.
    pub key_starts: Option<&'a [usize]>,
    /// `(T, S)` or `(B, T, S)`.
    pub mask: Option<AttnMask<'a>>,
    /// Real queries per batch element, each at most `T`.
    pub token_lengths: Option<&'a [usize]>,
}

impl AttnMask<'_> {
    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        match self {
            AttnMask::Bool(m) => m.len(),
            AttnMask::Additive(m) => m.len(),
        }
    }

    /// The same mask from entry `offset` on.
    fn skip(self, offset: usize) -> Self {
        match self {
            AttnMask::Bool(m) => AttnMask::Bool(&m[offset..]),
            AttnMask::Additive(m) => AttnMask::Additive(&m[offset..]),
        }
    }

    /// Whether entry `index` lets the query see the key.
    fn allows(&self, index: usize) -> bool {
        match *self {
            AttnMask::Bool(m) => m[index],
            AttnMask::Additive(m) => m[index] != f32::NEG_INFINITY,
        }
    }

    /// What entry `index` adds to a visible score (0 for a boolean mask).
    fn addend(&self, index: usize) -> f32 {
        match *self {
            AttnMask::Bool(_) => 0.0,
            AttnMask::Additive(m) => m[index],
        }
    }
}

/// The visibility rule of one attention call, for all batch elements: the call's masks
/// (already checked against its shape) and the layer's causal order.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Visibility<'a> {
    /// Causal order, aligned bottom-right per batch element: with `S_b` keys and `T_b` real
    /// queries (its [`Masks::token_lengths`], else `T`), key `j` is visible to query
    /// `i` only if `j <= i + S_b - T_b` (a KV cache: `S_b - T_b` tokens were cached before
    /// the call; plain causal self-attention has offset 0).
    pub causal: bool,
    /// A sliding window of causal order: key `j` is visible to query `i` only if also
    /// `j > i + S_b - T_b - window` (the query's own key and the `window - 1` before it).
    /// Ignored without `causal` (the layer's builder rejects that combination).
    pub window: Option<usize>,
    /// Chunked attention: key `j` is visible to query `i` only if also
    /// `⌊j / chunk⌋ = ⌊(i + S_b - T_b) / chunk⌋`. Ignored without `causal` (as the window).
    pub chunk: Option<usize>,
    /// The call's queries per batch element `T`.
    pub queries: usize,
    /// Keys of each batch element `S_b` (its store length) when they differ; `None`: every
    /// element has all `S` keys of the call.
    pub element_keys: Option<&'a [usize]>,
    /// Key lengths, padding mask, mask and token lengths.
    pub masks: Masks<'a>,
    /// Distance between batch elements' masks: 0 for one `(T, S)` mask shared by all.
    pub mask_batch_stride: usize,
    /// ALiBi's ranks of the keys (see [`Ranks`]), `S + 1` per batch element: `None` places
    /// keys at their index.
    pub alibi_ranks: Option<&'a [usize]>,
}

impl<'a> Visibility<'a> {
    /// The rule for batch element `b` with query rows counted from `q0` (`kv_len` keys).
    pub(crate) fn for_item(&self, b: usize, q0: usize, kv_len: usize) -> Rule<'a> {
        let options = self.masks;
        let keys = self.element_keys.map_or(kv_len, |keys| keys[b]);
        let queries = options
            .token_lengths
            .map_or(self.queries, |lengths| lengths[b]);
        // Query row 0's position: the element's keys before its real queries, plus q0.
        let position = keys as isize - queries as isize + q0 as isize;
        Rule {
            causal: self.causal,
            window: self.window,
            chunk: self.chunk,
            position,
            key_limit: options.key_lengths.map_or(keys, |lens| lens[b].min(keys)),
            key_floor: options.key_starts.map_or(0, |starts| starts[b]),
            key_mask: options.key_padding_mask.map(|m| &m[b * kv_len..][..kv_len]),
            mask: options
                .mask
                .map(|mask| mask.skip(b * self.mask_batch_stride + q0 * kv_len)),
            kv_len,
            ranks: Ranks {
                before: self
                    .alibi_ranks
                    .map(|ranks| &ranks[b * (kv_len + 1)..][..kv_len + 1]),
            },
        }
    }
}

/// The visibility rule of one work item: one batch element, query rows counted from the
/// item's first row. [`Rule::sees`] is the rule; [`Rule::adjust`] applies it to a score, and
/// every other method is a shortcut that agrees with those two.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rule<'a> {
    /// Causal order: query `i` sees keys up to its position (see [`Rule::causal`]).
    causal: bool,
    /// The sliding window; it applies only with `causal`.
    window: Option<usize>,
    /// The chunk of chunked attention; it applies only with `causal`.
    chunk: Option<usize>,
    /// The position of query row 0 in its sequence (causal order's offset, also without it).
    position: isize,
    key_limit: usize,
    /// Keys before it are hidden from every query ([`Masks::key_starts`]).
    key_floor: usize,
    key_mask: Option<&'a [bool]>,
    mask: Option<AttnMask<'a>>,
    kv_len: usize,
    /// Where ALiBi places this element's keys and queries.
    ranks: Ranks<'a>,
}

impl<'a> Rule<'a> {
    /// Where ALiBi places this element's keys and queries.
    pub(crate) fn ranks(&self) -> Ranks<'a> {
        self.ranks
    }

    /// The position of query row `i` in its sequence: the element's keys before its real
    /// queries plus the row's index in the call (where causal order puts its diagonal).
    pub(crate) fn position(&self, i: usize) -> isize {
        self.position + i as isize
    }

    /// Under causal order, the offset of query row 0's diagonal: query `i` sees keys up to
    /// `i + offset`.
    fn causal(&self) -> Option<isize> {
        self.causal.then_some(self.position)
    }

    /// Whether query `i` sees key `j`.
    pub(crate) fn sees(&self, i: usize, j: usize) -> bool {
        j < self.key_limit
            && j >= self.key_start(i)
            && self.key_mask.is_none_or(|m| m[j])
            && self
                .causal()
                .is_none_or(|offset| j as isize <= i as isize + offset)
            && self.mask.is_none_or(|m| m.allows(i * self.kv_len + j))
    }

    /// Query `i`'s score for key `j` after the rule: `-inf` when hidden, else the score plus
    /// the mask's entry when there is a mask.
    pub(crate) fn adjust(&self, i: usize, j: usize, score: f32) -> f32 {
        if !self.sees(i, j) {
            return f32::NEG_INFINITY;
        }
        match self.mask {
            Some(mask) => score + mask.addend(i * self.kv_len + j),
            None => score,
        }
    }

    /// [`Rule::adjust`] on the scores of key `j` against queries `0 .. column.len()`.
    pub(crate) fn adjust_key(&self, j: usize, column: &mut [f32]) {
        if self.is_prefix_only() && j < self.key_limit && j >= self.key_floor {
            // Only causal order, the window and the chunk: the queries that see the key are a
            // range.
            let seen_end = self.query_end(j).min(column.len());
            let hidden = self.first_query(j).min(seen_end);
            column[..hidden].fill(f32::NEG_INFINITY);
            column[seen_end..].fill(f32::NEG_INFINITY);
            return;
        }
        for (i, score) in column.iter_mut().enumerate() {
            *score = self.adjust(i, j, *score);
        }
    }

    /// Whether the rule is only a range of keys per query (causal order, the window, key
    /// starts and lengths): every key from [`Rule::key_start`] to below [`Rule::key_end`] of a query is
    /// visible to it and nothing is added to scores.
    pub(crate) fn is_prefix_only(&self) -> bool {
        self.mask.is_none() && self.key_mask.is_none()
    }

    /// One past the last key any query `< rows` can see.
    pub(crate) fn key_end(&self, rows: usize) -> usize {
        let causal_end = self.causal().map_or(self.kv_len, |offset| {
            (rows as isize + offset).clamp(0, self.kv_len as isize) as usize
        });
        causal_end.min(self.key_limit)
    }

    /// The causal offset and the window, when there is a window.
    fn windowed(&self) -> Option<(isize, isize)> {
        let (offset, window) = (self.causal()?, self.window?);
        Some((offset, window.min(isize::MAX as usize) as isize))
    }

    /// The causal offset and the chunk, when there is a chunk.
    fn chunked(&self) -> Option<(isize, isize)> {
        let (offset, chunk) = (self.causal()?, self.chunk?);
        Some((offset, chunk.min(isize::MAX as usize) as isize))
    }

    /// The first key query `i` may see: the key floor, or the window's or its chunk's start
    /// when later.
    pub(crate) fn key_start(&self, i: usize) -> usize {
        let window_start = self.windowed().map_or(0, |(offset, window)| {
            (i as isize + offset + 1).saturating_sub(window).max(0) as usize
        });
        let chunk_start = self.chunked().map_or(0, |(offset, chunk)| {
            let position = (i as isize + offset).max(0);
            (position - position % chunk) as usize
        });
        window_start.max(chunk_start).max(self.key_floor)
    }

    /// One past the last query the window and the chunk let see key `j` (`usize::MAX`
    /// without either).
    fn query_end(&self, j: usize) -> usize {
        let window_end = self.windowed().map_or(usize::MAX, |(offset, window)| {
            (j as isize - offset).saturating_add(window).max(0) as usize
        });
        let chunk_end = self.chunked().map_or(usize::MAX, |(offset, chunk)| {
            let next_chunk = (j as isize - j as isize % chunk).saturating_add(chunk);
            next_chunk.saturating_sub(offset).max(0) as usize
        });
        window_end.min(chunk_end)
    }

    /// The first query the causal order lets see key `j` (0 without causal order).
    pub(crate) fn first_query(&self, j: usize) -> usize {
        self.causal()
            .map_or(0, |offset| (j as isize - offset).max(0) as usize)
    }

    /// How many keys from `k0` on (at most `len`) every query in `rows` sees.
    pub(crate) fn visible_prefix(
        &self,
        rows: core::ops::Range<usize>,
        k0: usize,
        len: usize,
    ) -> usize {
        // The last row's window starts last: a key before it is not seen by every row.
        if rows
            .end
            .checked_sub(1)
            .is_some_and(|last| self.key_start(last) > k0)
        {
            return 0;
        }
        let len = len.min(self.key_limit.saturating_sub(k0));
        let causal_len = self.causal().map_or(len, |offset| {
            (rows.start as isize + offset + 1 - k0 as isize).clamp(0, len as isize) as usize
        });
        if self.is_prefix_only() {
            return causal_len;
        }
        (0..causal_len)
            .find(|&j| !rows.clone().all(|i| self.sees(i, k0 + j)))
            .unwrap_or(causal_len)
    }

    /// Calls `run(start, end)` for each maximal run `start .. end` of the keys `k0 + j`,
    /// `j` in `from .. to`, that query `i` sees, in key order.
    pub(crate) fn for_each_visible_run(
        &self,
        i: usize,
        k0: usize,
        from: usize,
        to: usize,
        mut run: impl FnMut(usize, usize),
    ) {
        // No key at or past the query's end is visible.
        let to = to.min(self.key_end(i + 1).saturating_sub(k0));
        // Nor any before its window's start.
        let mut j = from.max(self.key_start(i).saturating_sub(k0));
        while j < to {
            let start = j;
            while j < to && self.sees(i, k0 + j) {
                j += 1;
            }
            if j > start {
                run(start, j);
            } else {
                j += 1;
            }
        }
    }
}
