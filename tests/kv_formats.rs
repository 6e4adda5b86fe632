//! Keys and values kept in 16 and 8 bits (`LayerBuilder::kv_format`, `key_format`,
//! `value_format`): on every supported instruction set,
//! - each format (and mixed key/value formats) against the f64 reference computed from the
//!   keys and values rounded as the format says, rounded here in f64 code of the test's own
//!   (bfloat16, binary16: to nearest even on the significand; q8_0: blocks of 32 along the
//!   head, scale `max|x| / 127`, one step down where 127 times it overflows); odd head widths
//!   (7, 33, 64), odd lengths, GQA, ALiBi, soft cap and sinks, sliding windows;
//! - ±`f32::MAX` and values near it in a q8_0 store read back finite;
//! - decoding token by token (and in uneven chunks, through a rolling cache too, and with
//!   per-sequence lengths) equals the forward pass bit for bit, for thread counts 1, 2, 3;
//! - RoPE and QK-norm (which change the keys in `f32` before they are rounded, so this test
//!   cannot round the same values): decode equals forward bit for bit, and the output is within
//!   the format's own error of the layer with `f32` storage;
//! - a NaN or infinity in one batch element changes nothing in the others;
//! - 100,000 tokens through rolling caches stay on the reference (and the largest difference
//!   from the `f32` cache is printed);
//! - `Layer::kv_format` and the caches report the builder's formats;
//! - `KvCache::bytes` per format (and the table of `docs/performance.md`, printed).
//!
//! The layers' projections are exact in `f32` (selections of the inputs scaled by powers of
//! two; the output projection the identity), so the keys and values the layer rounds are
//! exactly the ones the test rounds, and the layer's output is its attention output.
//! Tolerance against the reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise (inputs
//! uniform in [-1, 1)).

mod common;

use common::{
    assert_bits_eq, assert_close, attend_heads_with, default_scale, HeadDims, Rng, Terms,
};
use mha::{
    Alibi, AttendOptions, AttentionWeights, Isa, KvCache, KvFormat, Layer, LayerBuilder, Matrix,
    Mha, MhaParams, Output, Projections, QkNorm, QkNormSpan, Rope, RopeLayout, RopeScaling,
    ShapeError, Tokens, Widths,
};

const ABS: f64 = 1e-4;
const REL: f64 = 1e-4;

/// Every format, the same for keys and values.
const FORMATS: [KvFormat; 4] = [KvFormat::F32, KvFormat::Bf16, KvFormat::F16, KvFormat::Q8_0];

/// (keys, values): each format for both, and mixed pairs.
const PAIRS: [(KvFormat, KvFormat); 6] = [
    (KvFormat::F32, KvFormat::F32),
    (KvFormat::Bf16, KvFormat::Bf16),
    (KvFormat::F16, KvFormat::F16),
    (KvFormat::Q8_0, KvFormat::Q8_0),
    (KvFormat::Bf16, KvFormat::Q8_0),
    (KvFormat::Q8_0, KvFormat::F16),
];

fn isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
}

/// The head layout of a layer: `h` query heads and `h_kv` key/value heads of width `d`.
#[derive(Clone, Copy, Debug)]
struct Heads {
    h: usize,
    h_kv: usize,
    d: usize,
}

impl Heads {
    fn new(h: usize, h_kv: usize, d: usize) -> Self {
        Heads { h, h_kv, d }
    }
    fn d_model(self) -> usize {
        self.h * self.d
    }
    fn kv(self) -> usize {
        self.h_kv * self.d
    }
}

/// Key column `j` is input feature `(j + 1) mod D`, value column `j` twice feature
/// `(j + 2) mod D`; queries are the input, the output projection the identity: all exact.
struct ExactWeights {
    heads: Heads,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
}

impl ExactWeights {
    fn new(heads: Heads) -> Self {
        let (dm, kv) = (heads.d_model(), heads.kv());
        let identity: Vec<f32> = (0..dm * dm)
            .map(|e| if e / dm == e % dm { 1.0 } else { 0.0 })
            .collect();
        let select = |shift: usize, factor: f32| {
            let mut w = vec![0.0; dm * kv];
            for j in 0..kv {
                w[((j + shift) % dm) * kv + j] = factor;
            }
            w
        };
        ExactWeights {
            heads,
            wq: identity.clone(),
            wk: select(1, 1.0),
            wv: select(2, 2.0),
            wo: identity,
        }
    }

    fn builder(&self) -> LayerBuilder<'_> {
        let (dm, kv) = (self.heads.d_model(), self.heads.kv());
        let widths = Widths::self_attention(dm, kv, dm);
        let projections = Projections::new(widths, &self.wq, &self.wk, &self.wv, &self.wo).unwrap();
        Layer::builder(projections, self.heads.h).min_work_per_thread(0)
    }

    /// A layer of these weights on `isa` and `threads` threads, keys and values kept in
    /// `formats`, with the settings of `more`.
    fn layer(
        &self,
        isa: Isa,
        threads: usize,
        formats: (KvFormat, KvFormat),
        more: impl FnOnce(LayerBuilder<'_>) -> LayerBuilder<'_>,
    ) -> Layer {
        let builder = self.builder().isa(isa).threads(threads);
        let builder = builder.key_format(formats.0).value_format(formats.1);
        more(builder).build().unwrap()
    }

    /// The keys and values the layer computes from `x (rows, D)`, each `(rows, KV)`.
    fn keys_values(&self, x: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let (dm, kv) = (self.heads.d_model(), self.heads.kv());
        let rows = x.len() / dm;
        let pick = |shift: usize, factor: f32| -> Vec<f32> {
            (0..rows * kv)
                .map(|e| factor * x[e / kv * dm + (e % kv + shift) % dm])
                .collect()
        };
        (pick(1, 1.0), pick(2, 2.0))
    }
}

/// `x` rounded to nearest even with `bits` significant bits, exponents down to `min_exp`
/// (below it the step stays `2^(min_exp - bits + 1)`: subnormals), infinite from `overflow`
/// on; in f64.
fn round_significand(x: f64, bits: i32, min_exp: i32, overflow: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let exp = ((x.abs().to_bits() >> 52) as i32) - 1023;
    let step = 2f64.powi(exp.max(min_exp) - bits + 1);
    let r = (x / step).round_ties_even() * step;
    if r.abs() >= overflow {
        f64::INFINITY.copysign(x)
    } else {
        r
    }
}

/// `rows` rows of `KV = heads · d` stored values as the format reads them back, in f64.
fn rounded(format: KvFormat, values: &[f32], d: usize) -> Vec<f64> {
    let wide: Vec<f64> = values.iter().map(|&x| x as f64).collect();
    match format {
        KvFormat::F32 => wide,
        // bfloat16: 8 significant bits, f32's exponents; the largest is (2 - 2^-7)·2^127, and
        // the halfway point above it rounds to infinity.
        KvFormat::Bf16 => (wide.iter())
            .map(|&x| round_significand(x, 8, -126, (2.0 - 2f64.powi(-8)) * 2f64.powi(127)))
            .collect(),
        KvFormat::F16 => (wide.iter())
            .map(|&x| round_significand(x, 11, -14, 65520.0))
            .collect(),
        KvFormat::Q8_0 => {
            let mut out = Vec::with_capacity(wide.len());
            for head in wide.chunks(d.max(1)) {
                for block in head.chunks(32) {
                    let most = block.iter().fold(0.0f64, |m, &x| m.max(x.abs()));
                    // Divisions of f32 values in f64, then rounded to f32: the f32 quotient;
                    // one step down when 127 times it is not finite in f32 (most = f32::MAX).
                    let mut scale = (most / 127.0) as f32;
                    if most <= f32::MAX as f64 && (127.0 * scale as f64) as f32 == f32::INFINITY {
                        scale = f32::from_bits(scale.to_bits() - 1);
                    }
                    let scale = scale as f64;
                    for &x in block {
                        let q = if scale == 0.0 {
                            0.0
                        } else {
                            ((x / scale) as f32 as f64)
                                .round_ties_even()
                                .clamp(-127.0, 127.0)
                        };
                        out.push((q * scale) as f32 as f64);
                    }
                }
            }
            out
        }
    }
}

/// The f64 reference: causal attention of `x (b, t, D)` (queries the input) over the keys
/// and values as `formats` store them, within `window`, with `terms`.
fn reference(
    w: &ExactWeights,
    formats: (KvFormat, KvFormat),
    (b, t): (usize, usize),
    x: &[f32],
    (window, terms): (Option<usize>, Terms<'_>),
) -> Vec<f64> {
    let Heads { h, h_kv, d } = w.heads;
    let (k, v) = w.keys_values(x);
    let (k, v) = (rounded(formats.0, &k, d), rounded(formats.1, &v, d));
    let q: Vec<f64> = x.iter().map(|&e| e as f64).collect();
    let dims = HeadDims {
        b,
        t,
        s: t,
        h,
        n_kv: h_kv,
        d,
    };
    let visible =
        |_: usize, i: usize, j: usize| (j <= i && window.is_none_or(|w| i - j < w)).then_some(0.0);
    attend_heads_with(&q, &k, &v, dims, (default_scale(d), terms), visible).0
}

fn input(seed: u64, n: usize) -> Vec<f32> {
    Rng::new(seed).vec(n, 1.0)
}

fn forward(layer: &mut Layer, x: &[f32], b: usize, t: usize) -> Vec<f32> {
    layer
        .forward(Tokens::new(x, b, t, layer.widths().d_model).unwrap())
        .unwrap()
}

/// [`decode`] into a new cache of `capacity` tokens, which holds all of `x` after.
fn decode_all(
    layer: &mut Layer,
    x: &[f32],
    (b, t, capacity): (usize, usize, usize),
    chunks: &[usize],
) -> Vec<f32> {
    let mut cache = layer.new_cache(b, capacity).unwrap();
    let out = decode(layer, &mut cache, x, (b, t), chunks);
    assert_eq!(cache.lengths(), vec![t; b]);
    out
}

/// Decodes `x (b, t, D)` in chunks cycling through `chunks`, returning the outputs `(b, t, D)`.
fn decode(
    layer: &mut Layer,
    cache: &mut KvCache,
    x: &[f32],
    (b, t): (usize, usize),
    chunks: &[usize],
) -> Vec<f32> {
    let dm = layer.widths().d_model;
    let mut out = vec![f32::NAN; b * t * dm];
    let (mut start, mut step) = (0, 0);
    while start < t {
        let n = chunks[step % chunks.len()].min(t - start);
        let rows = |m: &[f32]| -> Vec<f32> {
            (0..b)
                .flat_map(|bi| m[(bi * t + start) * dm..(bi * t + start + n) * dm].to_vec())
                .collect()
        };
        let new = rows(x);
        let mut y = vec![0.0; b * n * dm];
        let tokens = Tokens::new(&new, b, n, dm).unwrap();
        let output = Output::new(&mut y, b, n, dm).unwrap();
        layer
            .decode_into(tokens, cache, AttendOptions::default(), output)
            .unwrap();
        for bi in 0..b {
            out[(bi * t + start) * dm..(bi * t + start + n) * dm]
                .copy_from_slice(&y[bi * n * dm..(bi + 1) * n * dm]);
        }
        (start, step) = (start + n, step + 1);
    }
    out
}

/// Each format, and mixed ones, against the reference of the rounded keys and values: odd
/// head widths, GQA, odd lengths (across the 96-key block).
#[test]
fn each_format_matches_the_reference_of_its_rounded_keys_and_values() {
    let shapes = [
        (Heads::new(2, 2, 7), 13),
        (Heads::new(3, 1, 33), 29),
        (Heads::new(2, 2, 64), 101),
        (Heads::new(4, 2, 64), 5),
    ];
    let b = 2;
    for isa in isas() {
        for (heads, t) in shapes {
            let w = ExactWeights::new(heads);
            let x = input(t as u64 + heads.d as u64, b * t * heads.d_model());
            for formats in PAIRS {
                let context = format!("{isa:?} {heads:?} T {t} {formats:?}");
                let mut layer = w.layer(isa, 2, formats, |b| b);
                let got = forward(&mut layer, &x, b, t);
                let want = reference(&w, formats, (b, t), &x, (None, Terms::default()));
                assert_close(&got, &want, ABS, REL, &context);
            }
        }
    }
}

/// The attention weights (`Output::with_weights`) read the stored keys too: against the
/// reference's probabilities of the rounded keys, in every format.
#[test]
fn attention_weights_in_every_format() {
    let heads = Heads::new(2, 1, 33);
    let (b, t) = (2, 17);
    let w = ExactWeights::new(heads);
    let x = input(31, b * t * heads.d_model());
    let dims = HeadDims {
        b,
        t,
        s: t,
        h: heads.h,
        n_kv: heads.h_kv,
        d: heads.d,
    };
    for isa in isas() {
        for formats in PAIRS {
            let context = format!("{isa:?} {formats:?}");
            let mut layer = w.layer(isa, 1, formats, |b| b);
            let (mut y, mut weights) = (vec![0.0; x.len()], AttentionWeights::new());
            let tokens = Tokens::new(&x, b, t, heads.d_model()).unwrap();
            let out = Output::new(&mut y, b, t, heads.d_model()).unwrap();
            let options = AttendOptions::default();
            layer
                .forward_into(tokens, options, out.with_weights(&mut weights))
                .unwrap();
            let (k, v) = w.keys_values(&x);
            let (k, v) = (
                rounded(formats.0, &k, heads.d),
                rounded(formats.1, &v, heads.d),
            );
            let q: Vec<f64> = x.iter().map(|&e| e as f64).collect();
            let visible = |_: usize, i: usize, j: usize| (j <= i).then_some(0.0);
            let scale = (default_scale(heads.d), Terms::default());
            let (_, probs) = attend_heads_with(&q, &k, &v, dims, scale, visible);
            assert_close(weights.as_slice(), &probs, ABS, REL, &context);
        }
    }
}

/// The reduced formats do round: a 16-bit cache's output is not the `f32` one's (so the
/// reference comparisons above see the rounding).
#[test]
fn reduced_formats_differ_from_f32_storage() {
    let heads = Heads::new(2, 2, 33);
    let w = ExactWeights::new(heads);
    let (b, t) = (1, 9);
    let x = input(5, b * t * heads.d_model());
    let mut f32_layer = w.builder().build().unwrap();
    let exact = forward(&mut f32_layer, &x, b, t);
    for format in &FORMATS[1..] {
        let mut layer = w.builder().kv_format(*format).build().unwrap();
        let got = forward(&mut layer, &x, b, t);
        assert!(got.iter().zip(&exact).any(|(g, e)| g != e), "{format:?}");
    }
}

/// Decoding in steps of 1 and in uneven chunks equals the forward pass bit for bit, for every
/// format and thread counts 1, 2, 3 (which give the same bits).
#[test]
fn decode_equals_forward_bit_for_bit() {
    let heads = Heads::new(4, 2, 33);
    let (b, t) = (2, 103);
    let w = ExactWeights::new(heads);
    let x = input(7, b * t * heads.d_model());
    for isa in isas() {
        for formats in PAIRS {
            let mut first: Option<Vec<f32>> = None;
            for threads in [1, 2, 3] {
                let context = format!("{isa:?} {formats:?} threads {threads}");
                let mut layer = w.layer(isa, threads, formats, |b| b);
                let full = forward(&mut layer, &x, b, t);
                let first = first.get_or_insert_with(|| full.clone());
                assert_bits_eq(&full, first, &format!("{context}: forward vs 1 thread"));
                for chunks in [&[1][..], &[3, 1, 5, 2]] {
                    let stepped = decode_all(&mut layer, &x, (b, t, t), chunks);

                    assert_bits_eq(&stepped, &full, &format!("{context}: chunks {chunks:?}"));
                }
            }
        }
    }
}

/// A sliding window's rolling cache, wrapped around several times: decode equals the
/// forward bit for bit, and both the reference over the window.
#[test]
fn rolling_cache_in_every_format() {
    let heads = Heads::new(2, 1, 40);
    let (b, t, window) = (2, 230, 37);
    let w = ExactWeights::new(heads);
    let x = input(11, b * t * heads.d_model());
    for isa in isas() {
        for formats in PAIRS {
            let context = format!("{isa:?} {formats:?}");
            let mut layer = w.layer(isa, 2, formats, |b| b.sliding_window(window));
            let full = forward(&mut layer, &x, b, t);
            let want = reference(&w, formats, (b, t), &x, (Some(window), Terms::default()));
            assert_close(&full, &want, ABS, REL, &context);
            let stepped = decode_all(&mut layer, &x, (b, t, 4), &[1, 4, 3]);

            assert_bits_eq(&stepped, &full, &format!("{context}: decode"));
        }
    }
}

/// 100,000 tokens decoded one at a time through rolling caches (window 50) in every format:
/// every 10,000th step against the reference over its window of rounded keys and values, and
/// the largest difference from the `f32` cache's outputs printed (the figure in
/// `docs/performance.md`).
#[test]
fn a_long_rolling_decode_in_every_format() {
    let heads = Heads::new(2, 1, 16);
    let (dm, steps, window) = (heads.d_model(), 100_000, 50);
    let w = ExactWeights::new(heads);
    let x = input(41, steps * dm);
    let mut layers: Vec<Layer> = FORMATS
        .iter()
        .map(|&f| w.layer(Isa::detect(), 1, (f, f), |b| b.sliding_window(window)))
        .collect();
    let mut caches: Vec<KvCache> = layers.iter().map(|l| l.new_cache(1, 1).unwrap()).collect();
    let mut deviation = [0.0f64; 4];
    let mut y = vec![vec![0.0f32; dm]; 4];
    for step in 0..steps {
        let token = &x[step * dm..][..dm];
        for (f, (layer, cache)) in layers.iter_mut().zip(&mut caches).enumerate() {
            let (tokens, out) = (
                Tokens::new(token, 1, 1, dm).unwrap(),
                Output::new(&mut y[f], 1, 1, dm).unwrap(),
            );
            layer
                .decode_into(tokens, cache, AttendOptions::default(), out)
                .unwrap();
        }
        for f in 1..4 {
            let most = y[f]
                .iter()
                .zip(&y[0])
                .map(|(a, b)| (a - b).abs() as f64)
                .fold(0.0, f64::max);
            deviation[f] = deviation[f].max(most);
        }
        if (step + 1) % 10_000 == 0 {
            let first = step + 1 - window;
            let span = &x[first * dm..(step + 1) * dm];
            for (f, &format) in FORMATS.iter().enumerate() {
                let want = reference(
                    &w,
                    (format, format),
                    (1, window),
                    span,
                    (None, Terms::default()),
                );
                let context = format!("{format:?} step {step}");
                assert_close(&y[f], &want[(window - 1) * dm..], ABS, REL, &context);
            }
        }
    }
    assert_eq!(caches[0].len(), steps);
    println!(
        "largest |output - f32 cache's| over {steps} steps: bf16 {:.1e}, f16 {:.1e}, q8_0 {:.1e}",
        deviation[1], deviation[2], deviation[3]
    );
}

/// Prompts of different lengths in one call (`token_lengths`), then single tokens: each
/// sequence's outputs are those of a forward pass over that sequence alone, bit for bit.
#[test]
fn per_sequence_lengths_in_every_format() {
    let heads = Heads::new(2, 2, 36);
    let dm = heads.d_model();
    let (prompt, lengths, steps) = (6, [6, 2], 4);
    let w = ExactWeights::new(heads);
    let x = input(13, 2 * prompt * dm);
    let next = input(17, 2 * steps * dm);
    for isa in isas() {
        for format in FORMATS {
            let context = format!("{isa:?} {format:?}");
            let mut layer = w.layer(isa, 2, (format, format), |b| b);
            let mut cache = layer.new_cache(2, prompt + steps).unwrap();
            let mut first = vec![0.0; 2 * prompt * dm];
            let options = AttendOptions {
                token_lengths: Some(&lengths),
                ..AttendOptions::default()
            };
            let (tokens, output) = (
                Tokens::new(&x, 2, prompt, dm).unwrap(),
                Output::new(&mut first, 2, prompt, dm).unwrap(),
            );
            layer
                .decode_into(tokens, &mut cache, options, output)
                .unwrap();
            let mut outputs: [Vec<f32>; 2] =
                [0, 1].map(|b| first[b * prompt * dm..][..lengths[b] * dm].to_vec());
            let mut sequences: [Vec<f32>; 2] =
                [0, 1].map(|b| x[b * prompt * dm..][..lengths[b] * dm].to_vec());
            for s in 0..steps {
                let rows: Vec<f32> = (0..2)
                    .flat_map(|b| next[(b * steps + s) * dm..][..dm].to_vec())
                    .collect();
                let mut y = vec![0.0; 2 * dm];
                let (tokens, output) = (
                    Tokens::new(&rows, 2, 1, dm).unwrap(),
                    Output::new(&mut y, 2, 1, dm).unwrap(),
                );
                layer
                    .decode_into(tokens, &mut cache, AttendOptions::default(), output)
                    .unwrap();
                for b in 0..2 {
                    outputs[b].extend_from_slice(&y[b * dm..][..dm]);
                    sequences[b].extend_from_slice(&rows[b * dm..][..dm]);
                }
            }
            assert_eq!(
                cache.lengths(),
                [lengths[0] + steps, lengths[1] + steps],
                "{context}"
            );
            for b in 0..2 {
                let t = lengths[b] + steps;
                let alone = forward(&mut layer, &sequences[b], 1, t);
                assert_bits_eq(&outputs[b], &alone, &format!("{context}: sequence {b}"));
            }
        }
    }
}

/// ALiBi, a soft cap and sinks together, in every format, against the reference.
#[test]
fn score_terms_in_every_format() {
    let heads = Heads::new(4, 2, 24);
    let (b, t) = (2, 107);
    let w = ExactWeights::new(heads);
    let x = input(19, b * t * heads.d_model());
    let sinks = vec![0.5, -1.0, f32::NEG_INFINITY, 2.0];
    let cap = 1.5;
    for isa in isas() {
        for formats in PAIRS {
            let context = format!("{isa:?} {formats:?}");
            let mut layer = w.layer(isa, 2, formats, |b| {
                b.alibi(Alibi::Standard).softcap(cap).sinks(sinks.clone())
            });
            let slopes = layer.alibi_slopes().unwrap().to_vec();
            let terms = Terms {
                slopes: Some(&slopes),
                cap: Some(cap),
                sinks: Some(&sinks),
            };
            let full = forward(&mut layer, &x, b, t);
            assert_close(
                &full,
                &reference(&w, formats, (b, t), &x, (None, terms)),
                ABS,
                REL,
                &context,
            );
            let stepped = decode_all(&mut layer, &x, (b, t, t), &[1, 2, 7]);

            assert_bits_eq(&stepped, &full, &format!("{context}: decode"));
        }
    }
}

/// The error one rounding of a key or value of magnitude about 1 may bring, for a format,
/// with room for its effect through the softmax (scores and outputs are O(1)).
fn format_tolerance(format: KvFormat) -> f64 {
    match format {
        KvFormat::F32 => 1e-5,
        KvFormat::Bf16 => 4.0 * 2f64.powi(-8),
        KvFormat::F16 => 4.0 * 2f64.powi(-11),
        // A step of max|x| / 127 ≤ 2 / 127 (the values are twice the inputs), half of it.
        _ => 4.0 / 127.0,
    }
}

/// RoPE and QK-norm (keys rotated and normalised in `f32` before they are rounded): decode
/// equals forward bit for bit, and the output is within the format's error of `f32` storage.
#[test]
fn rope_and_qk_norm_in_every_format() {
    let heads = Heads::new(2, 1, 32);
    let (b, t) = (2, 100);
    let w = ExactWeights::new(heads);
    let x = input(23, b * t * heads.d_model());
    let rope = Rope {
        theta: 10_000.0,
        rotary_dim: 32,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    };
    let norm = QkNorm {
        span: QkNormSpan::PerHead,
        q_weight: (0..32).map(|i| 0.5 + i as f32 / 32.0).collect(),
        k_weight: (0..32).map(|i| 1.5 - i as f32 / 32.0).collect(),
        eps: 1e-6,
    };
    let build = |isa: Isa, format: KvFormat| {
        w.layer(isa, 2, (format, format), |b| {
            b.rope(rope).qk_norm(norm.clone())
        })
    };
    for isa in isas() {
        let exact = forward(&mut build(isa, KvFormat::F32), &x, b, t);
        for format in FORMATS {
            let context = format!("{isa:?} {format:?}");
            let mut layer = build(isa, format);
            let full = forward(&mut layer, &x, b, t);
            let tol = format_tolerance(format);
            let exact: Vec<f64> = exact.iter().map(|&e| e as f64).collect();
            assert_close(&full, &exact, tol, tol, &context);
            let stepped = decode_all(&mut layer, &x, (b, t, t), &[1, 5]);

            assert_bits_eq(&stepped, &full, &format!("{context}: decode"));
        }
    }
}

/// A NaN in one batch element and an infinity in another leave the third element's outputs
/// as a forward pass over it alone gives them, and the poisoned elements' earlier rows finite.
#[test]
fn non_finite_values_stay_in_their_batch_element() {
    let heads = Heads::new(2, 2, 40);
    let dm = heads.d_model();
    let (b, t) = (3, 12);
    let w = ExactWeights::new(heads);
    let mut x = input(29, b * t * dm);
    x[(t + 4) * dm + 3] = f32::NAN;
    x[(2 * t + 2) * dm + 17] = f32::INFINITY;
    for isa in isas() {
        for format in FORMATS {
            let context = format!("{isa:?} {format:?}");
            let mut layer = w.layer(isa, 2, (format, format), |b| b);
            let full = forward(&mut layer, &x, b, t);
            let alone = forward(&mut layer, &x[..t * dm], 1, t);
            assert_bits_eq(&full[..t * dm], &alone, &format!("{context}: element 0"));
            for (element, poisoned) in [(1, 4), (2, 2)] {
                let rows = &full[element * t * dm..][..poisoned * dm];
                assert!(
                    rows.iter().all(|v| v.is_finite()),
                    "{context}: element {element}"
                );
            }
            let stepped = decode_all(&mut layer, &x, (b, t, t), &[1]);

            assert_bits_eq(
                &stepped[..t * dm],
                &alone,
                &format!("{context}: decode element 0"),
            );
        }
    }
}

/// `Layer::kv_format` reports the builder's key and value formats (`kv_format` sets both,
/// `key_format` / `value_format` one each, the last call winning), and the layer's caches keep
/// the same; the typed `Mha` shows the same through its layer.
#[test]
fn a_layer_reports_its_key_and_value_formats() {
    let heads = Heads::new(2, 2, 8);
    let w = ExactWeights::new(heads);
    assert_eq!(
        w.builder().build().unwrap().kv_format(),
        (KvFormat::F32, KvFormat::F32)
    );
    for keys in KvFormat::ALL {
        let both = w.builder().kv_format(keys).build().unwrap();
        assert_eq!(both.kv_format(), (keys, keys));
        for values in KvFormat::ALL {
            let layer = w.layer(Isa::detect(), 1, (keys, values), |b| b);
            assert_eq!(layer.kv_format(), (keys, values));
            let cache = layer.new_cache(1, 4).unwrap();
            assert_eq!((cache.key_format(), cache.value_format()), (keys, values));
            let last = w
                .builder()
                .key_format(keys)
                .kv_format(values)
                .build()
                .unwrap();
            assert_eq!(last.kv_format(), (values, values));
        }
    }
    let params = MhaParams::new(
        Matrix::<8, 8>::identity(),
        Matrix::identity(),
        Matrix::identity(),
        Matrix::identity(),
    );
    let typed = Mha::builder(&params, 2)
        .value_format(KvFormat::F16)
        .build()
        .unwrap();
    assert_eq!(typed.kv_format(), (KvFormat::F32, KvFormat::F16));
}

/// Finite keys and values read back finite from a q8_0 store, ±`f32::MAX` included: the
/// block scale `f32::MAX / 127` rounds up, so `127 · scale` overflowed and a block holding
/// `f32::MAX` read its largest values back as infinities (that token's output inf, then NaN).
/// One head of 33 (a whole block and a block of one): token 1 holds `f32::MAX` at features
/// 0..8, token 2 `-f32::MAX` at 8..16 and `f32::MAX` alone in the short block, tokens 3 and 4
/// values near `f32::MAX` (no feature is huge in two tokens, so no sum of them overflows), the
/// others in [-1, 1). Keys and values are the inputs, queries the inputs times 2^-140 (so no
/// score overflows), the output projection the identity: with `f32` storage every output is
/// finite, and it must stay so with q8_0 keys, values or both, forward and decoding, on every
/// supported table (the one `MHA_ISA` selects among them).
#[test]
fn q8_0_reads_f32_max_back_finite() {
    const D: usize = 33;
    let t = 7;
    let max = f32::MAX;
    let below = f32::from_bits(max.to_bits() - 1);
    let mut x = input(41, t * D);
    let at = |token: usize, feature: usize| token * D + feature;
    x[at(1, 0)..at(1, 8)].fill(max);
    x[at(2, 8)..at(2, 16)].fill(-max);
    x[at(2, 32)] = max;
    let near = [
        below,
        -below,
        max * 0.999,
        -max * 0.75,
        max * 0.5,
        below,
        -max,
        0.5,
    ];
    x[at(3, 16)..at(3, 24)].copy_from_slice(&near);
    x[at(4, 24)..at(4, 32)].copy_from_slice(&near.map(|v| if v == -max { -below } else { -v }));
    let identity: Vec<f32> = (0..D * D)
        .map(|e| if e / D == e % D { 1.0 } else { 0.0 })
        .collect();
    let small: Vec<f32> = identity.iter().map(|&w| w * 2f32.powi(-140)).collect();
    let widths = Widths::self_attention(D, D, D);
    let projections = Projections::new(widths, &small, &identity, &identity, &identity).unwrap();
    let pairs = [
        (KvFormat::F32, KvFormat::F32),
        (KvFormat::Q8_0, KvFormat::Q8_0),
        (KvFormat::Q8_0, KvFormat::F32),
        (KvFormat::F32, KvFormat::Q8_0),
    ];
    let mut failures = Vec::new();
    for isa in isas() {
        for formats in pairs {
            let context = format!("{isa:?} {formats:?}");
            let mut layer = Layer::builder(projections, 1)
                .isa(isa)
                .threads(1)
                .key_format(formats.0)
                .value_format(formats.1)
                .build()
                .unwrap();
            let full = forward(&mut layer, &x, 1, t);
            let stepped = decode_all(&mut layer, &x, (1, t, t), &[1]);
            for (call, out) in [("forward", &full), ("decode", &stepped)] {
                if let Some(i) = out.iter().position(|v| !v.is_finite()) {
                    let token = i / D;
                    failures.push(format!("{context} {call}: token {token} gives {}", out[i]));
                }
            }
            assert_bits_eq(&stepped, &full, &format!("{context}: decode"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A cache keeps the formats of the layer that made it: another layer with the same shape but
/// other formats refuses it.
#[test]
fn a_cache_of_other_formats_is_refused() {
    let heads = Heads::new(2, 2, 8);
    let w = ExactWeights::new(heads);
    let dm = heads.d_model();
    let x = input(37, dm);
    for (made, used) in [
        (KvFormat::F32, KvFormat::Bf16),
        (KvFormat::Q8_0, KvFormat::F16),
    ] {
        let maker = w.layer(Isa::detect(), 1, (made, made), |b| b);
        let mut cache = maker.new_cache(1, 4).unwrap();
        let mut layer = w.layer(Isa::detect(), 1, (made, used), |b| b);
        let mut y = vec![0.0; dm];
        let (tokens, out) = (
            Tokens::new(&x, 1, 1, dm).unwrap(),
            Output::new(&mut y, 1, 1, dm).unwrap(),
        );
        let result = layer.decode_into(tokens, &mut cache, AttendOptions::default(), out);
        assert_eq!(
            result,
            Err(ShapeError::CacheMismatch),
            "{made:?} -> {used:?}"
        );
        assert!(cache.is_empty());
    }
}

/// Bytes per cached token per layer of `heads`, from `KvCache::bytes` (capacity a whole number
/// of 96-key panels, so no panel is partly used).
fn bytes_per_token(heads: Heads, keys: KvFormat, values: KvFormat) -> f64 {
    let w = ExactWeights::new(heads);
    let layer = w.layer(Isa::detect(), 1, (keys, values), |b| b);
    let cache = layer.new_cache(1, 96 * 4).unwrap();
    assert_eq!((cache.key_format(), cache.value_format()), (keys, values));
    cache.bytes() as f64 / (96.0 * 4.0)
}

/// `KvCache::bytes` per format, per token: `d` values per head and side in every format (no
/// padding, whatever the head width and the kernel table's panel width), plus one 4-byte
/// scale per 32 values, or part of 32, in q8_0: 16-bit caches take exactly half of `f32`'s.
/// Prints one table row per shape (`docs/performance.md` shows the first two).
#[test]
fn cache_bytes_per_format() {
    let shapes = [
        ("12 heads of 64 (GPT-2)", Heads::new(12, 12, 64)),
        ("8 of 128 (Llama 3 8B)", Heads::new(32, 8, 128)),
        ("32 of 80 (Phi-2)", Heads::new(32, 32, 80)),
        ("3 of 10", Heads::new(6, 3, 10)),
    ];
    for (name, heads) in shapes {
        let full = bytes_per_token(heads, KvFormat::F32, KvFormat::F32);
        assert_eq!(full, (2 * heads.kv() * 4) as f64, "{name}");
        let mut row = format!("| {name} | {full}");
        for format in &FORMATS[1..] {
            let bytes = bytes_per_token(heads, *format, *format);
            let scales = match format {
                KvFormat::Q8_0 => 4 * heads.d.div_ceil(32),
                _ => 0,
            };
            let per_head = heads.d * format.bytes_per_value().floor() as usize + scales;
            assert_eq!(
                bytes,
                (2 * heads.h_kv * per_head) as f64,
                "{name} {format:?}"
            );
            row += &format!(" | {bytes}");
        }
        let mixed = bytes_per_token(heads, KvFormat::Bf16, KvFormat::Q8_0);
        println!("{row} | {mixed} |");
    }
}

/// Decoding reads the keys and values of each key/value head once for the query heads that
/// share it (at most 4 at once, a group cut into even parts, the parts shared out between
/// threads): for groups of 1 to 9 heads, with per-head ALiBi slopes and sinks, decoding token
/// by token and in chunks equals the forward bit for bit on 1, 2 and 3 threads, and the
/// forward is on the reference of the rounded keys and values.
#[test]
fn grouped_heads_decode_equals_forward_in_every_format() {
    let layouts = [(4, 4), (5, 1), (8, 1), (9, 3), (12, 2), (6, 1)];
    let (b, t, d) = (2, 40, 8);
    for isa in isas() {
        for (h, h_kv) in layouts {
            let heads = Heads::new(h, h_kv, d);
            let w = ExactWeights::new(heads);
            let x = input(h as u64 * 31 + h_kv as u64, b * t * heads.d_model());
            let sinks: Vec<f32> = (0..h).map(|i| i as f32 * 0.25 - 1.0).collect();
            for formats in [PAIRS[0], PAIRS[1], PAIRS[3], PAIRS[4]] {
                let context = format!("{isa:?} H {h} Hkv {h_kv} {formats:?}");
                let mut full: Option<Vec<f32>> = None;
                for threads in [1, 2, 3] {
                    let mut layer = w.layer(isa, threads, formats, |b| {
                        b.alibi(Alibi::Standard).sinks(sinks.clone())
                    });
                    let forward_out = forward(&mut layer, &x, b, t);
                    let full = full.get_or_insert_with(|| {
                        let slopes = layer.alibi_slopes().unwrap().to_vec();
                        let terms = Terms {
                            slopes: Some(&slopes),
                            cap: None,
                            sinks: Some(&sinks),
                        };
                        let want = reference(&w, formats, (b, t), &x, (None, terms));
                        assert_close(&forward_out, &want, ABS, REL, &context);
                        forward_out.clone()
                    });
                    assert_bits_eq(&forward_out, full, &format!("{context} threads {threads}"));
                    for chunks in [&[1][..], &[2, 1]] {
                        let stepped = decode_all(&mut layer, &x, (b, t, t), chunks);
                        let context = format!("{context} threads {threads} chunks {chunks:?}");
                        assert_bits_eq(&stepped, full, &context);
                    }
                }
            }
        }
    }
}
