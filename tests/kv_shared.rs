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
//! same keys and values itself (padded batches, an output gate too); a paged source gives a
//! contiguous one's bits. Caches that do not fit are errors naming the numbers. Then Gemma 4
//! with KV sharing through `Checkpoint::open` against `transformers`' own attention modules
//! (module `gemma4` below).
//!
//! Tolerance against the reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::configs;
use common::{assert_bits_eq, assert_close, reference_attend, Attend, RefRope, Rng};
use mha::{AttendOptions, GateSpan, Isa, KvFormat, Layer, LayerBuilder, Output, OutputGate};
use mha::{GateActivation, Projections, QkNorm};
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
    /// Chunked attention's chunk.
    chunk: Option<usize>,
    /// A sigmoid output gate per head (projected from the shared layer's own `x`).
    gate: bool,
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
    gate: OutputGate,
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
        let gate = OutputGate {
            span: GateSpan::PerHead,
            activation: GateActivation::Sigmoid,
            weight: rng.vec(d * h, 0.5),
            bias: Some(rng.vec(h, 0.5)),
        };
        Pair {
            gate,
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
        if let Some(chunk) = self.case.chunk {
            builder = builder.chunked_attention(chunk);
        }
        if self.case.gate {
            builder = builder.output_gate(self.gate.clone());
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
        chunk: None,
        gate: false,
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
        chunk: None,
        gate: false,
    };
    let gated = Case {
        gate: true,
        ..Case::default()
    };
    for (s, case) in [Case::default(), gemma, gated].into_iter().enumerate() {
        let pair = Pair::random(SHAPES[s % 2], case, 20 + s as u64);
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
        chunk: None,
        gate: true,
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

/// Gemma 4 and Gemma 3n with KV sharing through `Checkpoint::open`, against `transformers`'
/// own attention modules (`tests/fixtures/kv_shared/gemma4_kv_shared/` and
/// `gemma3n_kv_shared/`, written by `dev/hf_fixtures/generate.py`: 4 layers, sliding, full,
/// sliding, full, the last 2 KV-shared; each layer on its own hidden states `x{i}`, the shared
/// ones over their source's keys and values; float64, its numpy reference agreeing with
/// transformers' float64 run to 1e-12).
#[cfg(feature = "std")]
mod hf {
    use super::common::modes::configs;
    use super::common::{assert_bits_eq, assert_close};
    use mha::safetensors::{Dtype, SafeTensors};
    use mha::{AttendOptions, Checkpoint, Isa, KvCache, KvFormat, Layer, Output, Tokens};

    struct Fixture {
        /// `x{i}`, `(B, T, D)`.
        xs: Vec<Vec<f32>>,
        /// `expected{i}`, `(B, T, D)`.
        expected: Vec<Vec<f64>>,
        batch: usize,
        len: usize,
        hidden: usize,
    }

    /// The cases.
    const CASES: [&str; 2] = ["gemma4_kv_shared", "gemma3n_kv_shared"];

    fn dir(case: &str) -> std::path::PathBuf {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        root.join("tests/fixtures/kv_shared").join(case)
    }

    fn fixture(case: &str) -> Fixture {
        let io = std::fs::read(dir(case).join("io.safetensors")).unwrap();
        let io = SafeTensors::parse(&io).unwrap();
        let meta = |key: &str| io.metadata()[key].parse::<usize>().unwrap();
        let f64s = |name: &str| {
            let tensor = io.tensor(name).unwrap();
            assert_eq!(tensor.dtype(), Dtype::F64);
            let bytes = tensor.data().as_chunks::<8>().0;
            bytes.iter().map(|&b| f64::from_le_bytes(b)).collect()
        };
        let layers = meta("layers");
        Fixture {
            xs: (0..layers)
                .map(|i| io.tensor_f32(&format!("x{i}")).unwrap().1)
                .collect(),
            expected: (0..layers).map(|i| f64s(&format!("expected{i}"))).collect(),
            batch: meta("batch"),
            len: meta("seq_len"),
            hidden: meta("hidden_size"),
        }
    }

    /// The model's layers on `isa` and `threads` threads, caches in `format`.
    fn layers(
        checkpoint: &Checkpoint,
        (isa, threads, format): (Isa, usize, KvFormat),
    ) -> Vec<Layer> {
        checkpoint
            .layers_with(.., |b| {
                b.isa(isa)
                    .threads(threads)
                    .min_work_per_thread(0)
                    .kv_format(format)
            })
            .unwrap()
    }

    /// Every layer's outputs, fed in calls of `steps` tokens: the layers with their own keys
    /// and values through caches, each shared one over its source's cache after it;
    /// `token_lengths` per call when given.
    fn run(
        checkpoint: &Checkpoint,
        layers: &mut [Layer],
        f: &Fixture,
        steps: &[usize],
        real: Option<[usize; 2]>,
    ) -> Vec<Vec<f32>> {
        let (b, t, d) = (f.batch, f.len, f.hidden);
        let most = steps.iter().copied().max().unwrap();
        let mut caches: Vec<Option<KvCache>> = layers
            .iter()
            .map(|l| {
                (!l.is_kv_shared()).then(|| {
                    l.new_cache(b, l.sliding_window().map_or(t, |_| most))
                        .unwrap()
                })
            })
            .collect();
        let mut outs = vec![vec![0.0; b * t * d]; layers.len()];
        let mut start = 0;
        for &step in steps {
            // Each sequence's real tokens of this call (all unless `real` stops it sooner).
            let lengths = real.map(|r| r.map(|r| r.clamp(start, start + step) - start));
            let options = AttendOptions {
                token_lengths: lengths.as_ref().map(|l| &l[..]),
                ..AttendOptions::default()
            };
            for (i, layer) in layers.iter_mut().enumerate() {
                let x = super::common::batch_rows(&f.xs[i], b, d, start..start + step);
                let mut y = vec![0.0; b * step * d];
                let (tokens, output) = (
                    Tokens::new(&x, b, step, d).unwrap(),
                    Output::new(&mut y, b, step, d).unwrap(),
                );
                match checkpoint.kv_source(i).unwrap() {
                    Some(source) => {
                        let cache = caches[source].as_ref().unwrap();
                        layer
                            .decode_shared_into(tokens, cache, options, output)
                            .unwrap();
                    }
                    None => {
                        let cache = caches[i].as_mut().unwrap();
                        layer.decode_into(tokens, cache, options, output).unwrap();
                    }
                }
                for s in 0..b {
                    outs[i][(s * t + start) * d..][..step * d]
                        .copy_from_slice(&y[s * step * d..][..step * d]);
                }
            }
            start += step;
        }
        outs
    }

    #[test]
    fn kv_shared_layers_match_transformers() {
        for case in CASES {
            check_case(case);
        }
    }

    fn check_case(case: &str) {
        let checkpoint = Checkpoint::open(dir(case)).unwrap();
        let sources: Vec<_> = (0..4).map(|i| checkpoint.kv_source(i).unwrap()).collect();
        assert_eq!(sources, [None, None, Some(0), Some(1)]);
        let f = fixture(case);
        let (whole, by_token) = (vec![f.len], vec![1; f.len]);
        let mut first = None;
        for (isa, threads) in configs() {
            let mut layers = layers(&checkpoint, (isa, threads, KvFormat::F32));
            assert_eq!(
                layers.iter().map(Layer::is_kv_shared).collect::<Vec<_>>(),
                [false, false, true, true]
            );
            let prefill = run(&checkpoint, &mut layers, &f, &whole, None);
            for (i, (y, want)) in prefill.iter().zip(&f.expected).enumerate() {
                assert_close(y, want, 1e-4, 1e-4, &format!("{case} {isa:?} layer {i}"));
            }
            let decoded = run(&checkpoint, &mut layers, &f, &by_token, None);
            let stepped = run(&checkpoint, &mut layers, &f, &[4, 1, 4], None);
            for i in 0..4 {
                assert_bits_eq(
                    &decoded[i],
                    &prefill[i],
                    &format!("{isa:?} layer {i} token by token"),
                );
                assert_bits_eq(
                    &stepped[i],
                    &prefill[i],
                    &format!("{isa:?} layer {i} in steps"),
                );
            }
            // The layers with their own keys and values: the cache's prefill is the forward.
            for i in 0..2 {
                let x = Tokens::new(&f.xs[i], f.batch, f.len, f.hidden).unwrap();
                assert_bits_eq(
                    &layers[i].forward(x).unwrap(),
                    &prefill[i],
                    &format!("layer {i} forward"),
                );
            }
            if threads == 1 {
                let mut three = super::hf::layers(&checkpoint, (isa, 3, KvFormat::F32));
                let y3 = run(&checkpoint, &mut three, &f, &whole, None);
                for i in 0..4 {
                    assert_bits_eq(&y3[i], &prefill[i], &format!("{isa:?} layer {i} 3 threads"));
                }
            }
            first.get_or_insert(isa);
        }
        for format in [KvFormat::Bf16, KvFormat::Q8_0] {
            let mut layers = layers(&checkpoint, (first.unwrap(), 2, format));
            let prefill = run(&checkpoint, &mut layers, &f, &whole, None);
            let decoded = run(&checkpoint, &mut layers, &f, &by_token, None);
            for i in 0..4 {
                assert_bits_eq(&decoded[i], &prefill[i], &format!("{format:?} layer {i}"));
            }
        }
    }

    /// A padded batch: sequence 0 has 5 real tokens, sequence 1 all 9; each real token's
    /// output is the fixture's (causal: later tokens do not change it), prefilled or decoded.
    #[test]
    fn kv_shared_layers_on_a_padded_batch() {
        for case in CASES {
            padded_batch(case);
        }
    }

    fn padded_batch(case: &str) {
        let checkpoint = Checkpoint::open(dir(case)).unwrap();
        let f = fixture(case);
        let (t, d) = (f.len, f.hidden);
        let real = [5, 9];
        assert_eq!(f.batch, real.len());
        let mut layers = layers(&checkpoint, (Isa::detect(), 2, KvFormat::F32));
        let prefill = run(&checkpoint, &mut layers, &f, &[t], Some(real));
        let decoded = run(&checkpoint, &mut layers, &f, &[3, 3, 3], Some(real));
        for i in 0..4 {
            for (s, &real) in real.iter().enumerate() {
                let rows = (s * t) * d..(s * t + real) * d;
                let context = format!("{case} layer {i} sequence {s}");
                assert_close(
                    &prefill[i][rows.clone()],
                    &f.expected[i][rows.clone()],
                    1e-4,
                    1e-4,
                    &context,
                );
                assert_bits_eq(&decoded[i][rows.clone()], &prefill[i][rows], &context);
            }
        }
    }
}

/// Gemma 3n's config as published: no `layer_types` (4 sliding layers to 1 full), rope from
/// the class's defaults, `num_kv_shared_layers` 15 by default; the `gemma3n` wrapper.
#[test]
fn gemma3n_configs() {
    use mha::{AttentionConfig, ModelType, Wrapper};
    let config = |layers: usize, shared: &str| {
        format!(
            r#"{{"model_type": "gemma3n_text", "hidden_size": 64, "num_attention_heads": 4,
                "num_hidden_layers": {layers}, "head_dim": 16{shared}}}"#
        )
    };
    let ten = config(10, r#", "num_kv_shared_layers": 5"#);
    let read = |json: &str, layer| AttentionConfig::from_json(json, layer).unwrap();
    let sources: Vec<_> = (0..10).map(|i| read(&ten, i).kv_source).collect();
    let (s, f) = (Some(3), Some(4)); // the last sliding and the last full layer before 5
    assert_eq!(sources, [None, None, None, None, None, s, s, s, s, f]);
    let (sliding, full) = (read(&ten, 3), read(&ten, 4));
    assert_eq!(
        (sliding.sliding_window, full.sliding_window),
        (Some(512), None)
    );
    let theta = |c: &AttentionConfig| c.rope.unwrap().theta;
    assert_eq!((theta(&sliding), theta(&full)), (10_000.0, 1_000_000.0));
    assert_eq!(
        (sliding.model_type, sliding.scale, sliding.value_norm),
        (ModelType::Gemma3n, 1.0, Some(1e-6))
    );
    assert_eq!(
        (sliding.n_kv_heads, sliding.qk_norm.unwrap().weight_offset),
        (2, 0.0)
    );
    // 35 layers and the default 15 shared: layers 20 to 34 read layers 18 (sliding) and 19.
    let published = config(35, "");
    assert_eq!(read(&published, 19).kv_source, None);
    assert_eq!(read(&published, 20).kv_source, Some(18));
    assert_eq!(read(&published, 24).kv_source, Some(19));
    let err = AttentionConfig::from_json(&config(10, ""), 9).unwrap_err();
    assert_eq!(
        err.to_string(),
        "config.json: \"num_kv_shared_layers\" = 15: is more than num_hidden_layers = 10"
    );
    let wrapped = format!(r#"{{"model_type": "gemma3n", "text_config": {ten}}}"#);
    let layer = read(&wrapped, 7);
    assert_eq!(
        (layer.wrapper, layer.kv_source),
        (Some(Wrapper::Gemma3n), Some(3))
    );
    assert_eq!(
        layer.tensor_prefix(),
        "model.language_model.layers.7.self_attn"
    );
}

/// A shared call with more tokens than the source's last call: a rolling ring (and a paged
/// sequence releasing blocks) of a window or of a chunk no longer holds the keys its first
/// queries see, an error naming them.
#[test]
fn a_shared_call_past_the_keys_its_source_still_holds() {
    let windowed = Case {
        window: Some(3),
        ..Case::default()
    };
    let chunked = Case {
        chunk: Some(3),
        ..Case::default()
    };
    for case in [windowed, chunked] {
        past_the_keys_held(case);
    }
}

/// [`a_shared_call_past_the_keys_its_source_still_holds`] for a layer of `case`, whose reach
/// is 3 keys.
fn past_the_keys_held(case: Case) {
    let mode = (Isa::detect(), 1, KvFormat::F32);
    let pair = Pair::random(SHAPES[0], case, 70);
    let d = pair.widths.d_model;
    let (mut source, mut shared) = (pair.source(mode), pair.shared(mode));
    let x = Rng::new(71).vec(200 * d, 1.0);
    let mut y = vec![0.0; 200 * d];
    let options = AttendOptions::default();
    let mut cache = source.new_cache(1, 1).unwrap();
    let mut paged = source.new_paged_cache(8).unwrap();
    let id = paged.add_sequence().unwrap();
    for t in 0..200 {
        let token = Tokens::new(&x[t * d..][..d], 1, 1, d).unwrap();
        let output = Output::new(&mut y[..d], 1, 1, d).unwrap();
        source
            .decode_into(token, &mut cache, options, output)
            .unwrap();
        let output = Output::new(&mut y[..d], 1, 1, d).unwrap();
        source
            .decode_paged(token, &mut paged, &[id], options, output)
            .unwrap();
    }
    let last = |n: usize| Tokens::new(&x[(200 - n) * d..], 1, n, d).unwrap();
    let out = Output::new(&mut y[..100 * d], 1, 100, d).unwrap();
    let err = shared
        .decode_shared_into(last(100), &cache, options, out)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the shared layer's source KV cache holds keys from 104 on (sequence 0), but the call needs 98 on (more tokens than the source's last call)"
    );
    let out = Output::new(&mut y[..100 * d], 1, 100, d).unwrap();
    let err = shared
        .decode_shared_paged(last(100), &mut paged, &[id], options, out)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the shared layer's source KV cache holds keys from 192 on (sequence 0), but the call needs 98 on (more tokens than the source's last call)"
    );
    // The last call's token alone is fine, from either.
    let out = Output::new(&mut y[..d], 1, 1, d).unwrap();
    shared
        .decode_shared_into(last(1), &cache, options, out)
        .unwrap();
    let out = Output::new(&mut y[..d], 1, 1, d).unwrap();
    shared
        .decode_shared_paged(last(1), &mut paged, &[id], options, out)
        .unwrap();
}
