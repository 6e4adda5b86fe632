//! Shared test helpers: an independent plain-loop reference in f64 and a seeded PRNG.
#![allow(dead_code)]

use mha::safetensors::{serialize_raw, Dtype};
use mha::{AttendOptions, Layer, Output, Tokens};
use mha::{Biases, GateActivation, GateSpan, OutputGate, QkNorm, QkNormSpan, Widths};

/// A small deterministic PRNG (SplitMix64), so tests need no dependency for data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

/// Random projections `wq (D, Q)`, `wk (E, KV)`, `wv (E, V)`, `wo (H·dv, D)` of a layer of `widths`,
/// uniform with variance `1 / fan-in`, and biases uniform in [-0.5, 0.5).
pub fn random_layer(rng: &mut Rng, widths: Widths) -> ([Vec<f32>; 4], Biases) {
    let Widths {
        d_model,
        memory,
        kv,
        query,
        value,
    } = widths;
    let mut m = |r: usize, c: usize| rng.vec(r * c, (3.0 / r as f32).sqrt());
    let matrices = [
        m(d_model, query),
        m(memory, kv),
        m(memory, value),
        m(widths.merged(), d_model),
    ];
    let mut row = |n: usize| Some(rng.vec(n, 0.5));
    let biases = Biases {
        bq: row(query),
        bk: row(kv),
        bv: row(value),
        bo: row(d_model),
    };
    (matrices, biases)
}

/// Row-major (m, k) · (k, n) in f64.
pub fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}

/// Causal multi-head self-attention, written independently of the crate: `x` is (b, t, dm)
/// row-major; weights are (dm, dm) row-major in the x @ W convention. The plain causal case of
/// [`reference_attend`], the one f64 oracle (per batch element, head and query, plain loops).
#[allow(clippy::too_many_arguments)]
pub fn reference_mha(
    x: &[f32],
    wq: &[f32],
    wk: &[f32],
    wv: &[f32],
    wo: &[f32],
    b: usize,
    t: usize,
    dm: usize,
    h: usize,
) -> Vec<f64> {
    reference_attend(&Attend::new(b, t, dm, dm, h, x, [wq, wk, wv, wo])).y
}

/// Asserts |got - want| <= abs + rel * |want| elementwise, naming the first failure.
pub fn assert_close(got: &[f32], want: &[f64], abs: f64, rel: f64, context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: length");
    for (index, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= abs + rel * w.abs(),
            "{context}: element {index}: got {g}, want {w}, error {err:e}"
        );
    }
}

/// Widens an `f32` buffer to `f64`.
pub fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&e| e as f64).collect()
}

/// Narrows an `f64` buffer to `f32` (round to nearest).
pub fn narrow(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&e| e as f32).collect()
}

/// Masked scaled dot-product attention over heads, written independently of the crate: `q`,
/// `k`, `v` are `(b, h, t, d)` row-major; key `j` takes part in query `i`'s softmax only when
/// `mask[i * t + j]`; a query that sees no key gets zeros. f64 throughout ([`attend_heads`]).
/// Returns `(b, h, t, d)`.
#[allow(clippy::too_many_arguments)]
pub fn reference_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &[bool],
    b: usize,
    h: usize,
    t: usize,
    d: usize,
) -> Vec<f64> {
    // Element (bi, hi, i, c) of (b, h, t, d) is element (bi, i, hi, c) of the (b, t, h·d) rows
    // attend_heads reads and writes.
    let index = |e: usize| {
        let (bi, hi, i, c) = (e / (h * t * d), e / (t * d) % h, e / d % t, e % d);
        ((bi * t + i) * h + hi) * d + c
    };
    let to_rows = |m: &[f32]| {
        let mut rows = vec![0.0; m.len()];
        for (e, &value) in m.iter().enumerate() {
            rows[index(e)] = value as f64;
        }
        rows
    };
    let dims = HeadDims {
        b,
        t,
        s: t,
        h,
        n_kv: h,
        d,
    };
    let visible = |_: usize, i: usize, j: usize| mask[i * t + j].then_some(0.0);
    let (q, k, v) = (to_rows(q), to_rows(k), to_rows(v));
    let (merged, _) = attend_heads(&q, &k, &v, dims, default_scale(d), visible);
    (0..merged.len()).map(|e| merged[index(e)]).collect()
}

/// The usual factor of the scores of heads of width `d`, `1/√d`.
pub fn default_scale(d: usize) -> f64 {
    1.0 / (d as f64).sqrt()
}

/// The dimensions of [`attend_heads`].
#[derive(Clone, Copy, Debug)]
pub struct HeadDims {
    pub b: usize,
    /// Queries per batch element.
    pub t: usize,
    /// Keys per batch element.
    pub s: usize,
    /// Query heads.
    pub h: usize,
    /// Key/value heads, a divisor of `h`.
    pub n_kv: usize,
    /// Head width.
    pub d: usize,
}

/// The one f64 attention oracle, plain loops per batch element, head and query: `q` is
/// `(b, t, h·d)` rows, `k` and `v` `(b, s, n_kv·d)` rows (head `hq` reads key/value head
/// `hq / (h / n_kv)`); `visible(bi, i, j)` is `None` for a hidden key, else what is added to
/// the score `q·k · scale`; softmax over the visible keys only (a query that sees none gets
/// zeros). Returns the merged `(b, t, h·d)` rows and the probabilities `(b, h, t, s)`.
pub fn attend_heads(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dims: HeadDims,
    scale: f64,
    visible: impl Fn(usize, usize, usize) -> Option<f64>,
) -> (Vec<f64>, Vec<f64>) {
    attend_heads_with(q, k, v, dims, (scale, Terms::default()), visible)
}

/// Score terms for the oracle, per query head (the crate's `MhaBuilder::alibi`, `softcap`,
/// `sinks`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Terms<'a> {
    /// ALiBi: `-slopes[h] · (i - j)` added to the (capped) score, with `i = i_call + s - t`
    /// the query's position and `j` the key's.
    pub slopes: Option<&'a [f32]>,
    /// Soft cap: the scaled score `z` becomes `cap · tanh(z / cap)` first.
    pub cap: Option<f32>,
    /// Sink logits: `sinks[h]` joins each row's softmax denominator (`-inf`: none).
    pub sinks: Option<&'a [f32]>,
}

impl Terms<'_> {
    /// The score of query `i` (position `i + s - t`) and key `j` of head `hq` from its scaled
    /// dot product `z`, before the mask's addend.
    fn score(&self, hq: usize, z: f64, position: f64, j: usize) -> f64 {
        let z = match self.cap {
            Some(cap) => cap as f64 * (z / cap as f64).tanh(),
            None => z,
        };
        match self.slopes {
            Some(slopes) => z - slopes[hq] as f64 * (position - j as f64),
            None => z,
        }
    }

    /// Head `hq`'s sink logit (`-inf` without one).
    fn sink(&self, hq: usize) -> f64 {
        self.sinks.map_or(f64::NEG_INFINITY, |s| s[hq] as f64)
    }
}

/// [`attend_heads`] with score terms: the scaled dot product is capped, ALiBi's term added,
/// then `visible`'s addend; the sink (if any) joins the denominator.
pub fn attend_heads_with(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dims: HeadDims,
    terms: (f64, Terms<'_>),
    visible: impl Fn(usize, usize, usize) -> Option<f64>,
) -> (Vec<f64>, Vec<f64>) {
    attend_heads_dv(q, k, v, (dims, dims.d), terms, visible)
}

/// [`attend_heads_with`] over value heads of `dv` (`v` is `(b, s, n_kv·dv)` rows): the merged
/// rows are `(b, t, h·dv)`.
pub fn attend_heads_dv(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (dims, dv): (HeadDims, usize),
    (scale, terms): (f64, Terms<'_>),
    visible: impl Fn(usize, usize, usize) -> Option<f64>,
) -> (Vec<f64>, Vec<f64>) {
    let HeadDims {
        b,
        t,
        s,
        h,
        n_kv,
        d,
    } = dims;
    let (qw, kv, group) = (h * d, n_kv * d, h / n_kv);
    let (mw, vw) = (h * dv, n_kv * dv);
    let mut merged = vec![0.0; b * t * mw];
    let mut probs = vec![0.0; b * h * t * s];
    for bi in 0..b {
        for hq in 0..h {
            let hk = hq / group;
            for i in 0..t {
                let qi = &q[(bi * t + i) * qw + hq * d..][..d];
                let position = (i + s) as f64 - t as f64;
                let mut scores = Vec::new();
                for j in 0..s {
                    if let Some(add) = visible(bi, i, j) {
                        let kj = &k[(bi * s + j) * kv + hk * d..][..d];
                        let dot: f64 = qi.iter().zip(kj).map(|(x, y)| x * y).sum();
                        scores.push((j, terms.score(hq, dot * scale, position, j) + add));
                    }
                }
                if scores.is_empty() {
                    continue;
                }
                let sink = terms.sink(hq);
                let max = scores.iter().map(|&(_, z)| z).fold(sink, f64::max);
                let total: f64 =
                    scores.iter().map(|&(_, z)| (z - max).exp()).sum::<f64>() + (sink - max).exp();
                for &(j, z) in &scores {
                    let p = (z - max).exp() / total;
                    probs[((bi * h + hq) * t + i) * s + j] = p;
                    let vj = &v[(bi * s + j) * vw + hk * dv..][..dv];
                    for c in 0..dv {
                        merged[(bi * t + i) * mw + hq * dv + c] += p * vj[c];
                    }
                }
            }
        }
    }
    (merged, probs)
}

/// Weights of an `(dm, dm)` projection: uniform with variance `1 / dm` (like N(0, 1/dm)).
pub fn weights(rng: &mut Rng, dm: usize) -> Vec<f32> {
    rng.vec(dm * dm, (3.0 / dm as f32).sqrt())
}

/// Tokens `tokens` of every batch element of a flat `(batch, T, d)` buffer (`T` from its
/// length), as a `(batch, tokens.len(), d)` buffer: a decoding step's input, or the rows of a
/// forward pass it must reproduce.
pub fn batch_rows(x: &[f32], batch: usize, d: usize, tokens: std::ops::Range<usize>) -> Vec<f32> {
    let t = x.len() / (batch * d).max(1);
    (0..batch)
        .flat_map(|b| &x[(b * t + tokens.start) * d..(b * t + tokens.end) * d])
        .copied()
        .collect()
}

/// Asserts that two buffers hold the same bits, naming the first difference.
pub fn assert_bits_eq(got: &[f32], want: &[f32], context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: length");
    for (index, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{context}: element {index}: got {g:?}, want {w:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The general reference: every attention mode, one plain-loop f64 function.

/// A mask over (query, key) for [`reference_attend`]: `(t, s)` shared by all batch elements
/// or `(b, t, s)` per batch element (told apart by length).
#[derive(Clone, Copy, Debug)]
pub enum RefMask<'a> {
    /// `true` where the query may see the key.
    Bool(&'a [bool]),
    /// Added to the scaled score; `-inf` hides the key.
    Additive(&'a [f32]),
}

/// One attention call described for [`reference_attend`]. Buffers are row-major `f32`, as the
/// crate takes them; the reference widens them to `f64`.
#[derive(Clone, Debug)]
pub struct Attend<'a> {
    pub b: usize,
    /// Queries per batch element.
    pub t: usize,
    /// Keys per batch element (`t` for self-attention).
    pub s: usize,
    /// Model width `D` (the input tokens and the output).
    pub dm: usize,
    /// Query width `h · d` (`dm` unless the heads are not `dm / h` wide).
    pub qw: usize,
    /// Width of the tokens keys and values come from (`dm` for self-attention).
    pub e: usize,
    /// Key/value width `n_kv_heads · d`.
    pub kv: usize,
    /// Query heads.
    pub h: usize,
    /// The factor of the scores; `None`: `1/√d`.
    pub scale: Option<f32>,
    /// RMSNorm of the projected queries and keys.
    pub qk_norm: Option<&'a QkNorm>,
    /// `(b, t, dm)`.
    pub x: &'a [f32],
    /// `(b, s, e)` cross-attention source; `None`: keys and values from `x`.
    pub memory: Option<&'a [f32]>,
    /// `(dm, qw)`, `(e, kv)`, `(e, kv)`, `(qw, dm)`, in the `x @ W` convention.
    pub wq: &'a [f32],
    pub wk: &'a [f32],
    pub wv: &'a [f32],
    pub wo: &'a [f32],
    /// Optional biases, `qw`, `kv`, `kv`, `dm` values.
    pub bq: Option<&'a [f32]>,
    pub bk: Option<&'a [f32]>,
    pub bv: Option<&'a [f32]>,
    pub bo: Option<&'a [f32]>,
    /// Causal order aligned bottom-right: key `j` visible to query `i` iff `j <= i + s - t`.
    pub causal: bool,
    /// A sliding window on top of causal order: key `j` visible to query `i` only if also
    /// `j > i + s - t - window`.
    pub window: Option<usize>,
    /// Per batch element, keys `>= len` are hidden.
    pub key_lengths: Option<&'a [usize]>,
    /// `(b, s)`: `false` hides the key.
    pub key_padding_mask: Option<&'a [bool]>,
    pub mask: Option<RefMask<'a>>,
    /// A rotary embedding of the queries and keys (self-attention).
    pub rope: Option<RefRope<'a>>,
    /// ALiBi slopes, soft cap, sinks.
    pub terms: Terms<'a>,
    /// A sigmoid output gate of the query tokens, applied to the merged heads.
    pub gate: Option<&'a OutputGate>,
    /// The QK-norm after the rotary embedding instead of before it.
    pub norm_after_rope: bool,
    /// A position-dependent factor of the queries, after QK-norm and RoPE.
    pub query_scale: Option<RefQueryScale<'a>>,
    /// Chunked attention on top of causal order: key `j` visible to query `i` only if also
    /// `j / chunk == (i + s - t) / chunk`.
    pub chunk: Option<usize>,
    /// The `eps` of a weight-less RMSNorm of every value head, after the value bias.
    pub value_norm: Option<f32>,
    /// The width of a value head (`wv (e, n_kv·dv)`, `bv` `n_kv·dv` values, `wo (h·dv, dm)`);
    /// `None`: `d`.
    pub dv: Option<usize>,
}

/// A query scale for [`reference_attend`], f64 with std's `ln` and `floor`: query token `i` of
/// batch element `bi` at position `p` is multiplied by
/// `1 + beta · ln(1 + floor((p + offset) / period))`.
#[derive(Clone, Copy, Debug)]
pub struct RefQueryScale<'a> {
    pub beta: f64,
    pub period: f64,
    pub offset: usize,
    /// `(b, t)` positions; `None`: query `i` is at `i + s - t`.
    pub positions: Option<&'a [usize]>,
}

impl RefQueryScale<'_> {
    /// Scales the `(b, t, qw)` queries in place.
    pub fn apply(&self, q: &mut [f64], (t, s, qw): (usize, usize, usize)) {
        for (r, row) in q.chunks_exact_mut(qw.max(1)).enumerate() {
            let p = self.positions.map_or(r % t.max(1) + s - t, |p| p[r]);
            let steps = ((p + self.offset) as f64 / self.period).floor();
            let factor = 1.0 + self.beta * (1.0 + steps).ln();
            row.iter_mut().for_each(|x| *x *= factor);
        }
    }
}

/// A rotary embedding for [`reference_attend`], f64 throughout: pair `(a, b)` of the first
/// `rotary_dim` features of every query and key head, `(i, i + rotary_dim / 2)` or
/// `(2i, 2i + 1)`, becomes `(a·cos − b·sin, b·cos + a·sin)` with `cos` and `sin` of
/// `position · inv_freq[i]` (std's), each times `attention_factor`.
#[derive(Clone, Copy, Debug)]
pub struct RefRope<'a> {
    pub rotary_dim: usize,
    /// Pairs `(2i, 2i + 1)` (GPT-J) instead of `(i, i + rotary_dim / 2)`.
    pub interleaved: bool,
    /// `rotary_dim / 2` inverse frequencies.
    pub inv_freq: &'a [f64],
    pub attention_factor: f64,
    /// `(b, t)` positions of the tokens; `None`: token `t` is at `t`.
    pub positions: Option<&'a [usize]>,
}

impl RefRope<'_> {
    /// Rotates `rows` rows of `width` features (heads of `d`) in place; row `r` is token
    /// `r % per_sequence` of its sequence.
    pub fn rotate(&self, m: &mut [f64], width: usize, d: usize, per_sequence: usize) {
        let half = self.rotary_dim / 2;
        for (r, row) in m.chunks_exact_mut(width.max(1)).enumerate() {
            let position = self.positions.map_or(r % per_sequence.max(1), |p| p[r]);
            for head in row.chunks_exact_mut(d.max(1)) {
                for (i, &freq) in self.inv_freq.iter().enumerate() {
                    let (ia, ib) = if self.interleaved {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + half)
                    };
                    let angle = position as f64 * freq;
                    let c = angle.cos() * self.attention_factor;
                    let s = angle.sin() * self.attention_factor;
                    let (a, b) = (head[ia], head[ib]);
                    head[ia] = a * c - b * s;
                    head[ib] = b * c + a * s;
                }
            }
        }
    }
}

impl<'a> Attend<'a> {
    /// Plain causal self-attention of `x (b, t, dm)` with `h` heads and `(dm, kv)` K/V weights.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        b: usize,
        t: usize,
        dm: usize,
        kv: usize,
        h: usize,
        x: &'a [f32],
        w: [&'a [f32]; 4],
    ) -> Self {
        Attend {
            b,
            t,
            s: t,
            dm,
            qw: dm,
            e: dm,
            kv,
            h,
            scale: None,
            qk_norm: None,
            x,
            memory: None,
            wq: w[0],
            wk: w[1],
            wv: w[2],
            wo: w[3],
            bq: None,
            bk: None,
            bv: None,
            bo: None,
            causal: true,
            window: None,
            key_lengths: None,
            key_padding_mask: None,
            mask: None,
            rope: None,
            terms: Terms::default(),
            gate: None,
            norm_after_rope: false,
            query_scale: None,
            chunk: None,
            value_norm: None,
            dv: None,
        }
    }
}

/// RMSNorm in f64 of every `span` values of `m`: `x / sqrt(mean(x²) + eps) · w`; a span whose
/// mean square plus `eps` is 0 stays zeros (the crate's rule for `0 / 0`).
fn rms_norm(m: &mut [f64], span: usize, weight: &[f32], eps: f32) {
    assert_eq!(weight.len(), span, "reference: QK-norm weight length");
    if span == 0 {
        return;
    }
    for run in m.chunks_exact_mut(span) {
        let mean = run.iter().map(|x| x * x).sum::<f64>() / span as f64 + eps as f64;
        let inverse = if mean == 0.0 { 0.0 } else { 1.0 / mean.sqrt() };
        for (x, &w) in run.iter_mut().zip(weight) {
            *x *= inverse * w as f64;
        }
    }
}

/// The output gate in f64: `g = x·Wg (+bg)` per query token, `G = qw` or `h` values (`qw`
/// the merged width `h·dv`), and feature `c` of the merged row times `act(g)` of its own gate
/// (per element) or of its head's (per head): `1 / (1 + e^-g)` or `ln(1 + e^g)` (std's `exp`
/// and `ln_1p`).
fn gate_merged(
    merged: &mut [f64],
    x: &[f64],
    gate: &OutputGate,
    (rows, dm, qw, h): (usize, usize, usize, usize),
) {
    let width = match gate.span {
        GateSpan::PerElement => qw,
        GateSpan::PerHead => h,
    };
    let mut g = matmul(x, &widen(&gate.weight), rows, dm, width);
    if let Some(bias) = &gate.bias {
        for (index, value) in g.iter_mut().enumerate() {
            *value += bias[index % width] as f64;
        }
    }
    let d = qw / h;
    for r in 0..rows {
        for c in 0..qw {
            let z = match gate.span {
                GateSpan::PerElement => g[r * width + c],
                GateSpan::PerHead => g[r * width + c / d],
            };
            merged[r * qw + c] *= match gate.activation {
                GateActivation::Sigmoid => 1.0 / (1.0 + (-z).exp()),
                GateActivation::Softplus => z.max(0.0) + (-z.abs()).exp().ln_1p(),
            };
        }
    }
}

/// What [`reference_attend`] computes.
#[derive(Clone, Debug)]
pub struct RefOut {
    /// The layer output, `(b, t, dm)`.
    pub y: Vec<f64>,
    /// The attention probabilities, `(b, h, t, s)`: zeros for hidden keys; a query that sees no
    /// key has an all-zero row.
    pub probs: Vec<f64>,
}

/// Multi-head attention in every mode, written independently of the crate: the projections,
/// then [`attend_heads`], f64 throughout.
///
/// 1. `Q = x·Wq (+bq)`; `K = src·Wk (+bk)`, `V = src·Wv (+bv)` with `src` = memory or `x`
///    (with a value norm, every head of `V` becomes `v / sqrt(mean(v²) + eps)`);
///    with a QK-norm, every head of `Q` and `K` (or every whole row) becomes
///    `x / sqrt(mean(x²) + eps) · w`; then, with a rotary embedding ([`RefRope`],
///    self-attention), every query and key head rotated;
/// 2. query head `hq` (width `d = qw / h`) reads key/value head `hq / (h / n_kv)` where
///    `n_kv = kv / d`;
/// 3. key `j` is visible to query `i` of batch element `bi` when every rule allows it (causal
///    `j <= i + s - t`, with a window also `j > i + s - t - window`, `j < key_lengths[bi]`,
///    `key_padding_mask[bi][j]`, a bool mask entry `true`, an additive mask entry not `-inf`);
///    the score is `q·k · scale` (`1/√d` unless given) plus the additive
///    mask entry; softmax over the visible keys only; a query that sees no key gets zeros;
/// 4. heads merged (`h · dv` wide: value heads of `dv`, `d` unless given), `y = merged·Wo
///    (+bo)`.
pub fn reference_attend(a: &Attend<'_>) -> RefOut {
    let (b, t, s, dm, e, kv, h) = (a.b, a.t, a.s, a.dm, a.e, a.kv, a.h);
    let qw = a.qw;
    let d = qw / h;
    let n_kv = kv / d;
    let dv = a.dv.unwrap_or(d);
    let (vw, mw) = (n_kv * dv, h * dv);
    let x = widen(a.x);
    let src = match a.memory {
        Some(m) => widen(m),
        None => x.clone(),
    };
    assert_eq!(x.len(), b * t * dm, "reference: x length");
    assert_eq!(src.len(), b * s * e, "reference: key source length");
    let add_bias = |m: &mut Vec<f64>, bias: Option<&[f32]>, width: usize| {
        if let Some(bias) = bias {
            for (index, value) in m.iter_mut().enumerate() {
                *value += bias[index % width] as f64;
            }
        }
    };
    let mut q = matmul(&x, &widen(a.wq), b * t, dm, qw);
    add_bias(&mut q, a.bq, qw);
    let mut k = matmul(&src, &widen(a.wk), b * s, e, kv);
    add_bias(&mut k, a.bk, kv);
    let mut v = matmul(&src, &widen(a.wv), b * s, e, vw);
    add_bias(&mut v, a.bv, vw);
    if let Some(eps) = a.value_norm {
        rms_norm(&mut v, dv, &vec![1.0; dv], eps);
    }
    let normalise = |q: &mut Vec<f64>, k: &mut Vec<f64>| {
        if let Some(norm) = a.qk_norm {
            let (q_span, k_span) = match norm.span {
                QkNormSpan::PerHead => (d, d),
                QkNormSpan::Whole => (qw, kv),
            };
            rms_norm(q, q_span, &norm.q_weight, norm.eps);
            rms_norm(k, k_span, &norm.k_weight, norm.eps);
        }
    };
    if !a.norm_after_rope {
        normalise(&mut q, &mut k);
    }
    if let Some(rope) = &a.rope {
        // Keys from memory rotate at the queries' positions: a KV-shared layer's source.
        assert!(
            a.memory.is_none() || s == t,
            "reference: rotary embedding of cross-attention"
        );
        rope.rotate(&mut q, qw, d, t);
        rope.rotate(&mut k, kv, d, s);
    }
    if a.norm_after_rope {
        normalise(&mut q, &mut k);
    }
    if let Some(scale) = &a.query_scale {
        scale.apply(&mut q, (t, s, qw));
    }

    let mask_at = |bi: usize, i: usize, j: usize| -> (bool, f64) {
        let index = |len: usize| {
            if len == t * s {
                i * s + j
            } else {
                assert_eq!(len, b * t * s, "reference: mask length");
                (bi * t + i) * s + j
            }
        };
        match a.mask {
            None => (true, 0.0),
            Some(RefMask::Bool(m)) => (m[index(m.len())], 0.0),
            Some(RefMask::Additive(m)) => {
                let value = m[index(m.len())];
                (value != f32::NEG_INFINITY, value as f64)
            }
        }
    };
    let visible = |bi: usize, i: usize, j: usize| -> Option<f64> {
        let diagonal = i as isize + s as isize - t as isize;
        if a.causal && j as isize > diagonal {
            return None;
        }
        if a.window
            .is_some_and(|w| j as isize <= diagonal - w as isize)
        {
            return None;
        }
        if a.causal
            && a.chunk
                .is_some_and(|c| j / c != diagonal.max(0) as usize / c)
        {
            return None;
        }
        if a.key_lengths.is_some_and(|lens| j >= lens[bi]) {
            return None;
        }
        if a.key_padding_mask.is_some_and(|m| !m[bi * s + j]) {
            return None;
        }
        let (allowed, add) = mask_at(bi, i, j);
        allowed.then_some(add)
    };

    let dims = HeadDims {
        b,
        t,
        s,
        h,
        n_kv,
        d,
    };
    let scale = a.scale.map_or(default_scale(d), f64::from);
    let heads = (dims, dv);
    let (mut merged, probs) = attend_heads_dv(&q, &k, &v, heads, (scale, a.terms), visible);
    if let Some(gate) = a.gate {
        gate_merged(&mut merged, &x, gate, (b * t, dm, mw, h));
    }
    let mut y = matmul(&merged, &widen(a.wo), b * t, mw, dm);
    add_bias(&mut y, a.bo, dm);
    RefOut { y, probs }
}

pub mod modes;
pub mod threads;

// ---------------------------------------------------------------------------------------------
// Safetensors fixture files

/// One stored tensor: name, dtype, shape, values (converted to `dtype` when written).
#[derive(Clone)]
pub struct Stored {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

pub fn f32_tensor(name: &str, shape: &[usize], values: Vec<f32>) -> Stored {
    assert_eq!(shape.iter().product::<usize>(), values.len(), "{name}");
    Stored {
        name: name.to_string(),
        dtype: Dtype::F32,
        shape: shape.to_vec(),
        values,
    }
}

/// IEEE half precision of a value that has an exact f16 representation (normal or zero).
pub fn to_f16_exact(v: f32) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    assert!(
        (1..31).contains(&exp) && bits & 0x1fff == 0,
        "{v} is not exact in f16"
    );
    sign | ((exp as u16) << 10) | ((bits >> 13) & 0x3ff) as u16
}

/// bfloat16 of a value that has an exact bf16 representation.
pub fn to_bf16_exact(v: f32) -> u16 {
    let bits = v.to_bits();
    assert_eq!(bits & 0xffff, 0, "{v} is not exact in bf16");
    (bits >> 16) as u16
}

/// A safetensors file of these tensors, each in its own dtype.
pub fn file(tensors: &[Stored]) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| match t.dtype {
            Dtype::F32 => t.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Dtype::F16 => t
                .values
                .iter()
                .flat_map(|&v| to_f16_exact(v).to_le_bytes())
                .collect(),
            Dtype::BF16 => t
                .values
                .iter()
                .flat_map(|&v| to_bf16_exact(v).to_le_bytes())
                .collect(),
            Dtype::I64 => t
                .values
                .iter()
                .flat_map(|&v| (v as i64).to_le_bytes())
                .collect(),
            other => panic!("no fixture encoder for {other}"),
        })
        .collect();
    let raw: Vec<(&str, Dtype, &[usize], &[u8])> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| (t.name.as_str(), t.dtype, t.shape.as_slice(), b.as_slice()))
        .collect();
    serialize_raw(&raw, &[("format", "pt")]).expect("fixture serializes")
}

/// The stored values of tensor `name` in a fixture.
pub fn values<'a>(tensors: &'a [Stored], name: &str) -> &'a [f32] {
    &tensors
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("fixture has no {name}"))
        .values
}

/// A forward pass of `x (b, t, D)` at `positions` (the default ones when `None`).
pub fn forward_at(
    layer: &mut Layer,
    x: &[f32],
    (b, t): (usize, usize),
    positions: Option<&[usize]>,
) -> Vec<f32> {
    let d = layer.widths().d_model;
    let mut y = vec![0.0; b * t * d];
    let options = AttendOptions {
        positions,
        ..AttendOptions::default()
    };
    let output = Output::new(&mut y, b, t, d).unwrap();
    layer
        .forward_into(Tokens::new(x, b, t, d).unwrap(), options, output)
        .unwrap();
    y
}

/// `x (b, t, D)` decoded one token per call through a cache (a rolling one for a window), each
/// token at its entry of `positions` when given.
pub fn decode_token_by_token(
    layer: &mut Layer,
    x: &[f32],
    (b, t): (usize, usize),
    positions: Option<&[usize]>,
) -> Vec<f32> {
    let d = layer.widths().d_model;
    let mut cache = layer
        .new_cache(b, layer.sliding_window().map_or(t, |_| 1))
        .unwrap();
    let mut out = vec![0.0; b * t * d];
    for step in 0..t {
        let token: Vec<f32> = (0..b)
            .flat_map(|s| x[(s * t + step) * d..][..d].to_vec())
            .collect();
        let at: Option<Vec<usize>> = positions.map(|p| (0..b).map(|s| p[s * t + step]).collect());
        let options = AttendOptions {
            positions: at.as_deref(),
            ..AttendOptions::default()
        };
        let mut y = vec![0.0; b * d];
        let output = Output::new(&mut y, b, 1, d).unwrap();
        let input = Tokens::new(&token, b, 1, d).unwrap();
        layer
            .decode_into(input, &mut cache, options, output)
            .unwrap();
        for s in 0..b {
            out[(s * t + step) * d..][..d].copy_from_slice(&y[s * d..][..d]);
        }
    }
    out
}

/// The layer's forward pass over `x (b, t, D)` and the same tokens decoded one at a time
/// ([`forward_at`] and [`decode_token_by_token`] at the default positions).
pub fn forward_and_decode(
    layer: &mut Layer,
    x: &[f32],
    (b, t): (usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    let forward = forward_at(layer, x, (b, t), None);
    (forward, decode_token_by_token(layer, x, (b, t), None))
}
