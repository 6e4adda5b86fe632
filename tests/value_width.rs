//! Value heads of another width than the query/key heads (`Widths::with_value_width`,
//! MiMo-V2-Flash's `v_head_dim`), on odd shapes: heads of 20 with values of 12 and of 28,
//! heads of 5 with values of 7, grouped and plain, with biases, windows (rolling caches),
//! sinks, output gates per element and per head, the value norm and rotary embeddings, against
//! the f64 reference (`tests/common`, whose value heads are `dv` wide); decoding token by
//! token equals the forward bit for bit in every cache format, 1 and 3 threads give the same
//! bits, on every supported instruction set; a paged cache gives each sequence the bits of its
//! forward; bfloat16 attention decodes as it forwards; the attention weights out are the
//! reference's. Inconsistent widths are errors naming the numbers.
//!
//! Tolerance against the reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{check_every_table, ABS, REL};
use common::{assert_bits_eq, assert_close, forward_and_decode, forward_at, random_layer};
use common::{reference_attend, Attend, RefRope, Rng, Terms};
use mha::Layer;
use mha::{AttendOptions, AttentionWeights, Compute, GateActivation, GateSpan, Isa, KvFormat};
use mha::{Masking, Mha, Output, OutputGate, Projections, Rope, RopeLayout, RopeScaling};
use mha::{Tokens, Widths};

/// The shapes: `(D, H, Hkv, head_dim, dv)`.
const SHAPES: [(usize, usize, usize, usize, usize); 4] = [
    (11, 3, 1, 20, 12),
    (13, 4, 2, 20, 28),
    (9, 6, 3, 5, 7),
    (10, 2, 2, 20, 12),
];

/// The widths of a shape.
fn widths((d_model, h, h_kv, d, dv): (usize, usize, usize, usize, usize)) -> Widths {
    Widths::self_attention(d_model, h_kv * d, h * d).with_value_width(h_kv * dv)
}

/// What one case sets beside the projections and their biases.
#[derive(Clone, Copy, Debug, Default)]
struct Case {
    window: Option<usize>,
    sinks: bool,
    gate: Option<GateSpan>,
    value_norm: bool,
    /// Rotary over the whole key head (even head widths only).
    rope: bool,
}

/// The frequencies of a rotary embedding of theta 100 over heads of `d`.
fn inverse_frequencies(d: usize) -> Vec<f64> {
    (0..d / 2)
        .map(|i| 100f64.powf(-2.0 * i as f64 / d as f64))
        .collect()
}

fn check_case(case: Case, seed: u64, (b, t): (usize, usize)) {
    for (s, &shape) in SHAPES.iter().enumerate() {
        let (dm, h, _, d, dv) = shape;
        if case.rope && d % 2 == 1 {
            continue;
        }
        let widths = widths(shape);
        let mut rng = Rng::new(seed * 10 + s as u64);
        let ([wq, wk, wv, wo], biases) = random_layer(&mut rng, widths);
        let sinks = case.sinks.then(|| rng.vec(h, 1.5));
        let gate = case.gate.map(|span| {
            let width = if span == GateSpan::PerHead { h } else { h * dv };
            // Per head a softplus gate (Laguna's), per element a sigmoid one.
            let activation = match span {
                GateSpan::PerHead => GateActivation::Softplus,
                GateSpan::PerElement => GateActivation::Sigmoid,
            };
            OutputGate {
                span,
                activation,
                weight: rng.vec(dm * width, 0.5),
                bias: Some(rng.vec(width, 0.5)),
            }
        });
        let x = rng.vec(b * t * dm, 1.0);
        let inv = inverse_frequencies(d);
        let mut want = Attend::new(b, t, dm, widths.kv, h, &x, [&wq, &wk, &wv, &wo]);
        (want.qw, want.dv, want.window) = (widths.query, Some(dv), case.window);
        (want.bq, want.bk) = (biases.bq.as_deref(), biases.bk.as_deref());
        (want.bv, want.bo) = (biases.bv.as_deref(), biases.bo.as_deref());
        want.terms = Terms {
            sinks: sinks.as_deref(),
            ..Terms::default()
        };
        (want.gate, want.value_norm) = (gate.as_ref(), case.value_norm.then_some(1e-5));
        want.rope = case.rope.then_some(RefRope {
            rotary_dim: d,
            interleaved: false,
            inv_freq: &inv,
            attention_factor: 1.0,
            positions: None,
        });
        let want = reference_attend(&want).y;
        let projections = Projections::new(widths, &wq, &wk, &wv, &wo).unwrap();
        let build = |isa, threads, format| {
            let mut builder = Layer::builder(projections, h)
                .isa(isa)
                .threads(threads)
                .min_work_per_thread(0)
                .kv_format(format)
                .biases(biases.clone());
            if let Some(window) = case.window {
                builder = builder.sliding_window(window);
            }
            if let Some(sinks) = &sinks {
                builder = builder.sinks(sinks.clone());
            }
            if let Some(gate) = &gate {
                builder = builder.output_gate(gate.clone());
            }
            if case.value_norm {
                builder = builder.value_norm(1e-5);
            }
            if case.rope {
                builder = builder.rope(Rope {
                    theta: 100.0,
                    rotary_dim: d,
                    layout: RopeLayout::RotateHalf,
                    scaling: RopeScaling::Default,
                });
            }
            builder.build().unwrap()
        };
        let context = format!("shape {shape:?} {case:?}");
        check_every_table(build, &x, (b, t), None, &want, &context);
        // f16 caches (the other formats: check_every_table).
        let mut layer = build(Isa::detect(), 2, KvFormat::F16);
        let (forward, decoded) = forward_and_decode(&mut layer, &x, (b, t));
        assert_bits_eq(&decoded, &forward, &format!("{context} F16"));
    }
}

#[test]
fn plain_and_grouped_value_heads_match_the_reference() {
    check_case(Case::default(), 1, (2, 12));
}

#[test]
fn over_several_key_blocks() {
    check_case(Case::default(), 2, (1, 200));
}

#[test]
fn with_a_window_and_a_rolling_cache() {
    check_case(
        Case {
            window: Some(5),
            ..Case::default()
        },
        3,
        (2, 14),
    );
    check_case(
        Case {
            window: Some(100),
            ..Case::default()
        },
        4,
        (1, 130),
    );
}

#[test]
fn with_sinks_and_rotary() {
    let case = Case {
        sinks: true,
        rope: true,
        ..Case::default()
    };
    check_case(case, 5, (2, 12));
}

#[test]
fn with_output_gates_and_the_value_norm() {
    for (i, span) in [GateSpan::PerElement, GateSpan::PerHead]
        .into_iter()
        .enumerate()
    {
        let case = Case {
            gate: Some(span),
            value_norm: i == 0,
            ..Case::default()
        };
        check_case(case, 6 + i as u64, (2, 9));
    }
}

/// The attention weights out of a layer with narrower values are the reference's
/// probabilities, and the output is unchanged by asking for them.
#[test]
fn attention_weights_match_the_reference() {
    let shape = SHAPES[0];
    let (dm, h, _, _, dv) = shape;
    let widths = widths(shape);
    let mut rng = Rng::new(11);
    let ([wq, wk, wv, wo], _) = random_layer(&mut rng, widths);
    let (b, t) = (2, 7);
    let x = rng.vec(b * t * dm, 1.0);
    let mut want = Attend::new(b, t, dm, widths.kv, h, &x, [&wq, &wk, &wv, &wo]);
    (want.qw, want.dv) = (widths.query, Some(dv));
    let want = reference_attend(&want);
    let projections = Projections::new(widths, &wq, &wk, &wv, &wo).unwrap();
    let mut layer = Layer::builder(projections, h).threads(1).build().unwrap();
    let (mut y, mut weights) = (vec![0.0; b * t * dm], AttentionWeights::new());
    let output = Output::new(&mut y, b, t, dm)
        .unwrap()
        .with_weights(&mut weights);
    let input = Tokens::new(&x, b, t, dm).unwrap();
    layer
        .forward_into(input, AttendOptions::default(), output)
        .unwrap();
    assert_close(&y, &want.y, ABS, REL, "output");
    assert_close(weights.as_slice(), &want.probs, ABS, REL, "weights");
    assert_bits_eq(
        &y,
        &forward_at(&mut layer, &x, (b, t), None),
        "without weights",
    );
}

/// Sequences of a paged cache, prefilled and decoded together in chunks of several sizes,
/// get the bits of their own forward pass; with a window too (blocks released).
#[test]
fn a_paged_cache_gives_each_sequence_its_forward() {
    for (window, seed) in [(None, 21), (Some(60), 22)] {
        let shape = SHAPES[1];
        let (dm, h, ..) = shape;
        let widths = widths(shape);
        let mut rng = Rng::new(seed);
        let ([wq, wk, wv, wo], biases) = random_layer(&mut rng, widths);
        let projections = Projections::new(widths, &wq, &wk, &wv, &wo).unwrap();
        let len = 140;
        let x = rng.vec(2 * len * dm, 1.0);
        for (isa, threads) in common::modes::configs() {
            let mut builder = Layer::builder(projections, h)
                .biases(biases.clone())
                .isa(isa)
                .threads(threads)
                .min_work_per_thread(0);
            if let Some(window) = window {
                builder = builder.sliding_window(window);
            }
            let mut layer = builder.build().unwrap();
            let want = forward_at(&mut layer, &x, (2, len), None);
            let mut cache = layer.new_paged_cache(8).unwrap();
            let ids = [cache.add_sequence().unwrap(), cache.add_sequence().unwrap()];
            let mut got = vec![0.0; 2 * len * dm];
            let mut at = 0;
            for chunk in [100, 1, 30, 1, 8] {
                let rows = |s: usize| &x[(s * len + at) * dm..][..chunk * dm];
                let input: Vec<f32> = [rows(0), rows(1)].concat();
                let mut y = vec![0.0; 2 * chunk * dm];
                let tokens = Tokens::new(&input, 2, chunk, dm).unwrap();
                let output = Output::new(&mut y, 2, chunk, dm).unwrap();
                let options = AttendOptions::default();
                layer
                    .decode_paged(tokens, &mut cache, &ids, options, output)
                    .unwrap();
                for s in 0..2 {
                    let out = &mut got[(s * len + at) * dm..][..chunk * dm];
                    out.copy_from_slice(&y[s * chunk * dm..][..chunk * dm]);
                }
                at += chunk;
            }
            let context = format!("paged {isa:?} {threads} threads, window {window:?}");
            assert_bits_eq(&got, &want, &context);
        }
    }
}

/// With `attention_compute(Compute::Bf16)` (AMX's tile where the CPU has it) over several key
/// blocks: decoding equals the forward, 3 threads equal 1, and the output stays near the
/// `f32` layer's.
#[test]
fn bf16_attention_decodes_as_it_forwards() {
    let (b, t) = (2, 211);
    for (s, &shape) in SHAPES[..3].iter().enumerate() {
        let (dm, h, ..) = shape;
        let widths = widths(shape);
        let mut rng = Rng::new(30 + s as u64);
        let ([wq, wk, wv, wo], biases) = random_layer(&mut rng, widths);
        let projections = Projections::new(widths, &wq, &wk, &wv, &wo).unwrap();
        let x = rng.vec(b * t * dm, 1.0);
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            let layer = |compute, threads| {
                Layer::builder(projections, h)
                    .biases(biases.clone())
                    .isa(isa)
                    .threads(threads)
                    .min_work_per_thread(0)
                    .sliding_window(150)
                    .attention_compute(compute)
                    .build()
                    .unwrap()
            };
            let context = format!("bf16 {shape:?} {isa:?}");
            let want = forward_at(&mut layer(Compute::F32, 1), &x, (b, t), None);
            let (forward, decoded) = forward_and_decode(&mut layer(Compute::Bf16, 1), &x, (b, t));
            assert_bits_eq(&decoded, &forward, &format!("{context}: decode = forward"));
            let three = forward_at(&mut layer(Compute::Bf16, 3), &x, (b, t), None);
            assert_bits_eq(&three, &forward, &format!("{context}: 3 threads"));
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (i, (g, w)) in forward.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 0.03 * scale, "{context} {i}: {g} vs {w}");
            }
        }
    }
}

/// The widths a layer cannot have are errors naming the numbers; a cache of another value
/// width is refused; a typed `Mha` has value heads as wide as its key heads.
#[test]
fn inconsistent_widths_are_errors() {
    let err = |widths: Widths, h: usize| {
        let w = |n: usize| vec![0.1; n];
        let (wq, wk) = (
            w(widths.d_model * widths.query),
            w(widths.memory * widths.kv),
        );
        let (wv, wo) = (
            w(widths.memory * widths.value),
            w(widths.merged() * widths.d_model),
        );
        let projections = Projections::new(widths, &wq, &wk, &wv, &wo)?;
        Layer::builder(projections, h).build().map(|_| ())
    };
    // 2 key/value heads of 10: 9 values are no whole value heads.
    let odd = Widths::self_attention(8, 20, 40).with_value_width(9);
    assert_eq!(
        err(odd, 4).unwrap_err().to_string(),
        "value width 9 is not n_kv_heads x dv for the key/value width 20 and query width 40"
    );
    // Q = 30 is not whole groups of KV = 20.
    let groups = Widths::self_attention(8, 20, 30).with_value_width(10);
    assert_eq!(
        err(groups, 3).unwrap_err().to_string(),
        "value width 10 is not n_kv_heads x dv for the key/value width 20 and query width 30"
    );
    // No key/value heads at all.
    let none = Widths::self_attention(8, 0, 0).with_value_width(4);
    assert!(err(none, 2).is_err());
    // Wo must be (H·dv, D): 4 heads of 6 values, not Q = 40 rows.
    let widths = Widths::self_attention(8, 20, 40).with_value_width(12);
    let (wq, wk, wv) = (vec![0.1; 8 * 40], vec![0.1; 8 * 20], vec![0.1; 8 * 12]);
    let e = Projections::new(widths, &wq, &wk, &wv, &wq).unwrap_err();
    assert_eq!(
        e.to_string(),
        "output projection wo (H·dv, D) needs 192 elements, but the buffer has 320"
    );
    let e = Projections::new(widths, &wq, &wk, &wk, &wq[..192]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "value projection wv (E, V) needs 96 elements, but the buffer has 160"
    );
    // A cache of the layer with values as wide as the keys does not fit.
    let wo = vec![0.1; 24 * 8];
    let narrow = Projections::new(widths, &wq, &wk, &wv, &wo).unwrap();
    // Values copied from the keys need value heads as wide as the key heads.
    let copied = Layer::builder(narrow, 4).values_from_keys().build();
    assert_eq!(
        copied.unwrap_err().to_string(),
        "values from the keys is V = 12 beside KV = 20, but must be value heads as wide as the key \
         heads (V = KV)"
    );
    let mut layer = Layer::builder(narrow, 4).build().unwrap();
    assert_eq!(layer.value_head_dim(), 6);
    let wide = Projections::new(widths.with_value_width(20), &wq, &wk, &wk, &wq).unwrap();
    let mut cache = Layer::builder(wide, 4)
        .build()
        .unwrap()
        .new_cache(1, 4)
        .unwrap();
    let (x, mut y) = (vec![0.5; 8], vec![0.0; 8]);
    let output = Output::new(&mut y, 1, 1, 8).unwrap();
    let input = Tokens::new(&x, 1, 1, 8).unwrap();
    let e = layer.decode_into(input, &mut cache, AttendOptions::default(), output);
    assert!(matches!(e, Err(mha::ShapeError::CacheMismatch)), "{e:?}");
    let e = Mha::<8, 8, 20, 40>::try_from(layer).unwrap_err();
    assert!(e.to_string().contains("value width V"), "{e}");
    // A bidirectional layer with narrower values builds and runs.
    let mut layer = Layer::builder(narrow, 4)
        .masking(Masking::Bidirectional)
        .build()
        .unwrap();
    let y = layer.forward(Tokens::new(&x, 1, 1, 8).unwrap()).unwrap();
    assert!(y.iter().all(|v| v.is_finite()));
}
