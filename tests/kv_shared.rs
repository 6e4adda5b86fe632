//! KV sharing (Gemma 3n, Gemma 4): a layer built from `Projections::queries_only` attends over
//! the cache of a source layer that appended the same tokens first, on odd shapes (D = 11, 3
//! query heads of 6 over one key/value head; D = 13, 4 heads of 6 over 2), alone and with
//! Gemma's settings (weighted QK-norm, rotary, value norm, scale 1, a sliding window with
//! rolling caches). The shared layer's hidden states differ from the source's, so the f64
//! reference (`tests/common`) is attention with queries from one and keys and values from the
//! other at the same positions. On every supported instruction set: prefill (one call) within
//! the tolerance, decoding token by token and in uneven steps bit-identical to it, 3 threads
//! bit-identical to 1, bf16 and q8_0 caches decoding bit-identical to their prefill; the shared
//! layer equals, bit for bit, a layer with the same query and output weights projecting the
//! same keys and values itself (padded batches too); a paged source gives a contiguous one's
//! bits. Caches that do not fit are errors naming the numbers.
//!
//! Tolerance against the reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::configs;
use common::{assert_bits_eq, assert_close, reference_attend, Attend, RefRope, Rng};
use mha::{AttendOptions, Isa, KvFormat, Layer, LayerBuilder, Output, Projections, QkNorm};
use mha::{QkNormSpan, Rope, RopeLayout, RopeScaling, ShapeError, Tokens, WeightValues, Widths};

/// The shapes: `(D, KV, Q, H)`.
const SHAPES: [(usize, usize, usize, usize); 2] = [(11, 6, 18, 3), (13, 12, 24, 4)];

/// Gemma's settings, each on or off.
#[derive(Clone, Copy, Debug, Default)]
struct Case {
    /// Weighted per-head QK-norm, value norm and scale 1 (Gemma 3n's attention).
    gemma: bool,
    /// Rotary over the whole head, theta 100.
    rope: bool,
    window: Option<usize>,
}

/// A source layer's weights, a shared layer's, and the settings both take.
struct Pair {
    widths: Widths,
    h: usize,
    head_dim: usize,
    source: [Vec<f32>; 4],
    /// The shared layer's `wq` and `wo`.
    shared: [WeightValues; 2],
    norm: QkNorm,
    case: Case,
}

impl Pair {
    fn random((d, kv, q, h): (usize, usize, usize, usize), case: Case, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let head_dim = q / h;
        let mut m = |r: usize, c: usize| rng.vec(r * c, (3.0 / r as f32).sqrt());
        let source = [m(d, q), m(d, kv), m(d, kv), m(q, d)];
        let shared = [m(d, q), m(q, d)].map(WeightValues::F32);
        let norm = QkNorm {
            span: QkNormSpan::PerHead,
            q_weight: rng.vec(head_dim, 1.0),
            k_weight: rng.vec(head_dim, 1.0),
            eps: 1e-6,
        };
        Pair {
            widths: Widths::self_attention(d, kv, q),
            h,
            head_dim,
            source,
            shared,
            norm,
            case,
        }
    }

    /// The shared layer's `wq` and `wo` as `f32`.
    fn shared_f32(&self) -> [&[f32]; 2] {
        self.shared.each_ref().map(|w| match w {
            WeightValues::F32(values) => &values[..],
            _ => unreachable!("the tests' weights are f32"),
        })
    }

    fn configure<'p>(
        &self,
        builder: LayerBuilder<'p>,
        (isa, threads, format): Mode,
    ) -> LayerBuilder<'p> {
        let mut builder = builder
            .isa(isa)
            .threads(threads)
            .min_work_per_thread(0)
            .kv_format(format);
        if self.case.gemma {
            builder = builder
                .qk_norm(self.norm.clone())
                .value_norm(1e-6)
                .scale(1.0);
        }
        if self.case.rope {
            builder = builder.rope(rope(self.head_dim));
        }
        if let Some(window) = self.case.window {
            builder = builder.sliding_window(window);
        }
        builder
    }

    fn source(&self, mode: Mode) -> Layer {
        let [wq, wk, wv, wo] = &self.source;
        let projections = Projections::new(self.widths, wq, wk, wv, wo).unwrap();
        self.configure(Layer::builder(projections, self.h), mode)
            .build()
            .unwrap()
    }

    fn shared(&self, mode: Mode) -> Layer {
        let [wq, wo] = &self.shared;
        let projections = Projections::queries_only(self.widths, [wq, wo]).unwrap();
        self.configure(Layer::builder(projections, self.h), mode)
            .build()
            .unwrap()
    }

    /// A layer with the shared layer's query and output weights and the source's key and
    /// value weights, projecting its own keys and values.
    fn own(&self, mode: Mode) -> Layer {
        let [wq, wo] = self.shared_f32();
        let [_, wk, wv, _] = &self.source;
        let projections = Projections::new(self.widths, wq, wk, wv, wo).unwrap();
        self.configure(Layer::builder(projections, self.h), mode)
            .build()
            .unwrap()
    }

    /// The f64 reference: queries from `xh`, keys and values from `xs`, both `(b, t, D)`.
    fn reference(&self, xs: &[f32], xh: &[f32], (b, t): (usize, usize)) -> Vec<f64> {
        let [wq, wo] = self.shared_f32();
        let [_, wk, wv, _] = &self.source;
        let d = self.widths.d_model;
        let mut want = Attend::new(b, t, d, self.widths.kv, self.h, xh, [wq, wk, wv, wo]);
        want.qw = self.widths.query;
        want.memory = Some(xs);
        want.window = self.case.window;
        if self.case.gemma {
            (want.qk_norm, want.value_norm, want.scale) = (Some(&self.norm), Some(1e-6), Some(1.0));
        }
        let inv = inverse_frequencies(self.head_dim);
        want.rope = self.case.rope.then_some(RefRope {
            rotary_dim: self.head_dim,
            interleaved: false,
            inv_freq: &inv,
            attention_factor: 1.0,
            positions: None,
        });
        reference_attend(&want).y
    }
}

/// An instruction set, a thread count and a cache format.
type Mode = (Isa, usize, KvFormat);

/// Rotary over heads of `head_dim`, theta 100.
fn rope(head_dim: usize) -> Rope {
    Rope {
        theta: 100.0,
        rotary_dim: head_dim,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    }
}

/// [`rope`]'s frequencies: `100^(-2i / head_dim)`.
fn inverse_frequencies(head_dim: usize) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| 100f64.powf(-2.0 * i as f64 / head_dim as f64))
        .collect()
}

/// Tokens `range` of every sequence of `x (b, t, d)`, as `(b, range.len(), d)`.
fn rows(x: &[f32], (b, _, d): (usize, usize, usize), range: std::ops::Range<usize>) -> Vec<f32> {
    common::batch_rows(x, b, d, range)
}

/// `xs` through `source` and `xh` through `shared` over the source's cache, in calls of
/// `steps` tokens (the source's call first each time), with `options`; the shared layer's
/// outputs `(b, t, D)`.
fn run_shared(
    (source, shared): (&mut Layer, &mut Layer),
    (xs, xh): (&[f32], &[f32]),
    (b, t): (usize, usize),
    steps: &[usize],
    options: AttendOptions<'_>,
) -> Vec<f32> {
    let d = source.widths().d_model;
    let most = steps.iter().copied().max().unwrap();
    let capacity = source.sliding_window().map_or(t, |_| most);
    let mut cache = source.new_cache(b, capacity).unwrap();
    let mut out = vec![0.0; b * t * d];
    let mut start = 0;
    for &step in steps {
        let range = start..start + step;
        let (cs, ch) = (
            rows(xs, (b, t, d), range.clone()),
            rows(xh, (b, t, d), range.clone()),
        );
        let mut ys = vec![0.0; b * step * d];
        let tokens = Tokens::new(&cs, b, step, d).unwrap();
        let output = Output::new(&mut ys, b, step, d).unwrap();
        source
            .decode_into(tokens, &mut cache, options, output)
            .unwrap();
        let mut yh = vec![0.0; b * step * d];
        let tokens = Tokens::new(&ch, b, step, d).unwrap();
        let output = Output::new(&mut yh, b, step, d).unwrap();
        shared
            .decode_shared_into(tokens, &cache, options, output)
            .unwrap();
        for s in 0..b {
            let to = (s * t + start) * d;
            out[to..to + step * d].copy_from_slice(&yh[s * step * d..][..step * d]);
        }
        start += step;
    }
    assert_eq!(start, t);
    out
}

/// Every check of the module doc for `case` on both shapes.
fn check_case(case: Case, seed: u64) {
    let (b, t) = (2, 12);
    for (s, &shape) in SHAPES.iter().enumerate() {
        let pair = Pair::random(shape, case, seed * 10 + s as u64);
        let d = pair.widths.d_model;
        let mut rng = Rng::new(seed * 100 + s as u64);
        let (xs, xh) = (rng.vec(b * t * d, 1.0), rng.vec(b * t * d, 1.0));
        let want = pair.reference(&xs, &xh, (b, t));
        let context = format!("D {d} {case:?}");
        let run = |mode: Mode, steps: &[usize]| {
            let (mut source, mut shared) = (pair.source(mode), pair.shared(mode));
            let options = AttendOptions::default();
            run_shared(
                (&mut source, &mut shared),
                (&xs, &xh),
                (b, t),
                steps,
                options,
            )
        };
        let (whole, by_token, uneven) = (&[t][..], &[1; 12][..], &[5, 1, 6][..]);
        let mut first = None;
        for (isa, threads) in configs() {
            let y = run((isa, threads, KvFormat::F32), whole);
            assert_close(&y, &want, 1e-4, 1e-4, &context);
            let decoded = run((isa, threads, KvFormat::F32), by_token);
            assert_bits_eq(&decoded, &y, &format!("{context} {isa:?} token by token"));
            let stepped = run((isa, threads, KvFormat::F32), uneven);
            assert_bits_eq(&stepped, &y, &format!("{context} {isa:?} in steps"));
            if threads == 1 {
                let three = run((isa, 3, KvFormat::F32), whole);
                assert_bits_eq(&three, &y, &format!("{context} {isa:?} 3 threads"));
            }
            first.get_or_insert(isa);
        }
        for format in [KvFormat::Bf16, KvFormat::Q8_0] {
            let y = run((first.unwrap(), 2, format), whole);
            let decoded = run((first.unwrap(), 2, format), by_token);
            assert_bits_eq(&decoded, &y, &format!("{context} {format:?}"));
        }
    }
}

#[test]
fn shared_layer_over_its_source_cache() {
    check_case(Case::default(), 1);
}

#[test]
fn shared_layer_with_gemma_settings_and_a_rolling_window() {
    let gemma = Case {
        gemma: true,
        rope: true,
        window: Some(4),
    };
    check_case(gemma, 2);
    let full = Case {
        window: None,
        ..gemma
    };
    check_case(full, 3);
}

/// With the same hidden states, the shared layer gives the bits of a layer projecting the
/// source's keys and values itself: a forward pass, and a padded batch (`token_lengths`).
#[test]
fn shared_layer_equals_a_layer_with_its_own_keys_and_values() {
    let (b, t) = (2, 10);
    let gemma = Case {
        gemma: true,
        rope: true,
        window: Some(3),
    };
    for (s, case) in [Case::default(), gemma].into_iter().enumerate() {
        let pair = Pair::random(SHAPES[s], case, 20 + s as u64);
        let d = pair.widths.d_model;
        let x = Rng::new(30 + s as u64).vec(b * t * d, 1.0);
        for (isa, threads) in configs() {
            let mode = (isa, threads, KvFormat::F32);
            let (mut source, mut shared, mut own) =
                (pair.source(mode), pair.shared(mode), pair.own(mode));
            for real in [None, Some([7, 10])] {
                let options = AttendOptions {
                    token_lengths: real.as_ref().map(|r| &r[..]),
                    ..AttendOptions::default()
                };
                let layers = (&mut source, &mut shared);
                let y = run_shared(layers, (&x, &x), (b, t), &[t], options);
                let mut want = vec![0.0; b * t * d];
                let tokens = Tokens::new(&x, b, t, d).unwrap();
                let output = Output::new(&mut want, b, t, d).unwrap();
                own.forward_into(tokens, options, output).unwrap();
                assert_bits_eq(&y, &want, &format!("{isa:?} {threads} {case:?} {real:?}"));
            }
        }
    }
}

/// A paged source: each sequence's shared outputs are those over a contiguous cache.
#[test]
fn shared_layer_over_a_paged_cache() {
    let (b, t) = (2, 9);
    let case = Case {
        gemma: true,
        rope: true,
        window: None,
    };
    let pair = Pair::random(SHAPES[1], case, 40);
    let d = pair.widths.d_model;
    let mut rng = Rng::new(41);
    let (xs, xh) = (rng.vec(b * t * d, 1.0), rng.vec(b * t * d, 1.0));
    let mode = (Isa::detect(), 2, KvFormat::F32);
    let (mut source, mut shared) = (pair.source(mode), pair.shared(mode));
    let options = AttendOptions::default();
    let want = run_shared(
        (&mut source, &mut shared),
        (&xs, &xh),
        (b, t),
        &[4, 5],
        options,
    );
    let mut cache = source.new_paged_cache(4).unwrap();
    let ids = [cache.add_sequence().unwrap(), cache.add_sequence().unwrap()];
    let mut got = vec![0.0; b * t * d];
    let mut start = 0;
    for step in [4, 5] {
        let range = start..start + step;
        let (cs, ch) = (
            rows(&xs, (b, t, d), range.clone()),
            rows(&xh, (b, t, d), range),
        );
        let mut y = vec![0.0; b * step * d];
        let (tokens, output) = (
            Tokens::new(&cs, b, step, d).unwrap(),
            Output::new(&mut y, b, step, d).unwrap(),
        );
        source
            .decode_paged(tokens, &mut cache, &ids, options, output)
            .unwrap();
        let (tokens, output) = (
            Tokens::new(&ch, b, step, d).unwrap(),
            Output::new(&mut y, b, step, d).unwrap(),
        );
        shared
            .decode_shared_paged(tokens, &mut cache, &ids, options, output)
            .unwrap();
        for s in 0..b {
            got[(s * t + start) * d..][..step * d].copy_from_slice(&y[s * step * d..][..step * d]);
        }
        start += step;
    }
    assert_bits_eq(&got, &want, "paged source");
}

/// A source cache that does not fit is an error naming the numbers; a shared layer refuses the
/// calls that project keys and values, and a layer with them refuses the shared calls.
#[test]
fn caches_that_do_not_fit_and_calls_a_shared_layer_cannot_make() {
    let mode = (Isa::detect(), 1, KvFormat::F32);
    let pair = Pair::random(SHAPES[1], Case::default(), 50);
    let mut shared = pair.shared(mode);
    let d = pair.widths.d_model;
    let x = vec![0.1; 2 * d];
    let call = |shared: &mut Layer, cache: &mha::KvCache, len: usize| {
        let mut y = vec![0.0; len * d];
        let tokens = Tokens::new(&x[..len * d], 1, len, d).unwrap();
        let output = Output::new(&mut y, 1, len, d).unwrap();
        shared
            .decode_shared_into(tokens, cache, AttendOptions::default(), output)
            .map(|()| y)
    };
    let empty = pair.source(mode).new_cache(1, 4).unwrap();
    assert_eq!(
        call(&mut shared, &empty, 2).unwrap_err().to_string(),
        "the shared layer's source KV cache holds tokens: 0 in sequence 0, but the call needs at least 2 (this call's) in sequence 0"
    );
    // Another head count: D = 13, 4 heads of 6 over one key/value head.
    let other = Pair::random((13, 6, 24, 4), Case::default(), 51);
    let cache = other.source(mode).new_cache(1, 4).unwrap();
    assert_eq!(
        call(&mut shared, &cache, 1).unwrap_err(),
        ShapeError::SharedCache {
            what: "key/value heads",
            needed: "2".into(),
            held: "1".into()
        }
    );
    let narrow = Pair::random((13, 8, 16, 4), Case::default(), 52);
    let cache = narrow.source(mode).new_cache(1, 4).unwrap();
    let err = call(&mut shared, &cache, 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the shared layer's source KV cache holds heads of width 4, but the call needs 6"
    );
    let cache = pair
        .source((mode.0, 1, KvFormat::Bf16))
        .new_cache(1, 4)
        .unwrap();
    let err = call(&mut shared, &cache, 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the shared layer's source KV cache holds key/value formats (Bf16, Bf16), but the call needs (F32, F32)"
    );
    let windowed = Pair::random(
        SHAPES[1],
        Case {
            window: Some(3),
            ..Case::default()
        },
        53,
    );
    let cache = windowed.source(mode).new_cache(1, 4).unwrap();
    let err = call(&mut shared, &cache, 1).unwrap_err();
    assert_eq!(err.to_string(), "the shared layer's source KV cache holds a rolling window of Some(3), but the call needs None");
    // The calls of a layer with its own keys and values.
    let err = shared
        .forward(Tokens::new(&x, 1, 2, d).unwrap())
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError::KvSharedLayer {
            call: "forward_into"
        }
    );
    let mut source = pair.source(mode);
    let mut cache = source.new_cache(1, 4).unwrap();
    let mut y = vec![0.0; 2 * d];
    let (tokens, output) = (
        Tokens::new(&x, 1, 2, d).unwrap(),
        Output::new(&mut y, 1, 2, d).unwrap(),
    );
    let err = shared
        .decode_into(tokens, &mut cache, AttendOptions::default(), output)
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError::KvSharedLayer {
            call: "decode_into"
        }
    );
    let (tokens, output) = (
        Tokens::new(&x, 1, 2, d).unwrap(),
        Output::new(&mut y, 1, 2, d).unwrap(),
    );
    source
        .decode_into(tokens, &mut cache, AttendOptions::default(), output)
        .unwrap();
    let (tokens, output) = (
        Tokens::new(&x, 1, 2, d).unwrap(),
        Output::new(&mut y, 1, 2, d).unwrap(),
    );
    let err = source
        .decode_shared_into(tokens, &cache, AttendOptions::default(), output)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ShapeError::Setting {
                what: "the layer of a shared call",
                ..
            }
        ),
        "{err}"
    );
    assert!(call(&mut shared, &cache, 2).is_ok());
    // No key or value bias on a layer without key and value projections.
    let [wq, wo] = &pair.shared;
    let projections = Projections::queries_only(pair.widths, [wq, wo]).unwrap();
    let biases = mha::Biases {
        bv: Some(vec![0.0; 12]),
        ..mha::Biases::default()
    };
    let err = Layer::builder(projections, 4)
        .biases(biases)
        .build()
        .unwrap_err();
    assert_eq!(err.to_string(), "key/value bias of a KV-shared layer is bv given, but must be none: its keys and values are its source layer's");
}
