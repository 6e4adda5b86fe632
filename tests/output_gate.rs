//! The output gate, sigmoid (Qwen3.5, Qwen3-Next, Step 3.5) and softplus (Laguna), per element
//! and per head, with and without a bias, on odd shapes (D = 11, 3 query heads of 5 over one key/value head; D = 13, 4 heads of
//! 5 over 2): against the f64 reference (`tests/common`), alone, beside RoPE and a sliding
//! window, and in cross-attention; decoding token by token equals the forward bit for bit in every
//! cache format, and 1 and 3 threads give the same bits. Gate weights or biases of the wrong
//! length are errors naming both lengths.
//!
//! Tolerance against the reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{configs, ABS, REL};
use common::{assert_bits_eq, assert_close, decode_token_by_token, forward_at};
use common::{reference_attend, Attend, RefRope, Rng};
use mha::{
    AttendOptions, GateActivation, GateSpan, KvFormat, Layer, LayerBuilder, Output, OutputGate,
};
use mha::{Projections, Rope, RopeLayout, RopeScaling, ShapeError, Tokens, Widths};

/// The shapes: `(D, KV, Q, H)`.
const SHAPES: [(usize, usize, usize, usize); 2] = [(11, 5, 15, 3), (13, 10, 20, 4)];

/// A gate of `span` for `H` heads over `Q` features of width `D`, random, with a bias or not;
/// sigmoid unless `softplus`.
fn gate(
    rng: &mut Rng,
    (span, softplus): (GateSpan, bool),
    (d, q, h): (usize, usize, usize),
    bias: bool,
) -> OutputGate {
    let width = match span {
        GateSpan::PerElement => q,
        GateSpan::PerHead => h,
    };
    let activation = match softplus {
        true => GateActivation::Softplus,
        false => GateActivation::Sigmoid,
    };
    OutputGate {
        span,
        activation,
        weight: rng.vec(d * width, 1.5),
        bias: bias.then(|| rng.vec(width, 1.0)),
    }
}

/// Random projections of the shape, owned.
fn weights(rng: &mut Rng, (d, kv, q): (usize, usize, usize)) -> [Vec<f32>; 4] {
    [
        rng.vec(d * q, 0.5),
        rng.vec(d * kv, 0.5),
        rng.vec(d * kv, 0.5),
        rng.vec(q * d, 0.5),
    ]
}

/// Rotary of the first 4 features of each head, theta 100.
fn rope() -> Rope {
    Rope {
        theta: 100.0,
        rotary_dim: 4,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    }
}

/// The reference's view of [`rope`].
fn inv_freq() -> Vec<f64> {
    vec![1.0, 0.1]
}

#[test]
fn self_attention_against_the_reference_and_decoding() {
    let (b, t) = (2, 9);
    for (s, &(d, kv, q, h)) in SHAPES.iter().enumerate() {
        let kinds = [GateSpan::PerElement, GateSpan::PerHead].map(|span| (span, false));
        let softplus = [GateSpan::PerHead, GateSpan::PerElement].map(|span| (span, true));
        for (index, kind) in kinds.into_iter().chain(softplus).enumerate() {
            for (with_rope, window) in [(false, None), (true, None), (true, Some(3))] {
                let mut rng = Rng::new(100 * s as u64 + 10 * index as u64 + u64::from(with_rope));
                let [wq, wk, wv, wo] = weights(&mut rng, (d, kv, q));
                let g = gate(&mut rng, kind, (d, q, h), with_rope);
                let x = rng.vec(b * t * d, 1.0);
                let inv = inv_freq();
                let mut want = Attend::new(b, t, d, kv, h, &x, [&wq, &wk, &wv, &wo]);
                want.qw = q;
                want.gate = Some(&g);
                want.window = window;
                want.rope = with_rope.then_some(RefRope {
                    rotary_dim: 4,
                    interleaved: false,
                    inv_freq: &inv,
                    attention_factor: 1.0,
                    positions: None,
                });
                let want = reference_attend(&want).y;
                let projections =
                    Projections::new(Widths::self_attention(d, kv, q), &wq, &wk, &wv, &wo).unwrap();
                let build = |isa, threads, format| {
                    let mut builder = Layer::builder(projections, h)
                        .output_gate(g.clone())
                        .isa(isa)
                        .threads(threads)
                        .min_work_per_thread(0)
                        .kv_format(format);
                    if with_rope {
                        builder = builder.rope(rope());
                    }
                    if let Some(window) = window {
                        builder = builder.sliding_window(window);
                    }
                    builder.build().unwrap()
                };
                let context = format!("D {d} {kind:?} rope {with_rope} window {window:?}");
                let mut first = None;
                for (isa, threads) in configs() {
                    let mut layer = build(isa, threads, KvFormat::F32);
                    let y = forward_at(&mut layer, &x, (b, t), None);
                    assert_close(&y, &want, ABS, REL, &context);
                    assert_bits_eq(
                        &decode_token_by_token(&mut layer, &x, (b, t), None),
                        &y,
                        &format!("{context} decoded"),
                    );
                    if threads == 1 {
                        let mut three = build(isa, 3, KvFormat::F32);
                        assert_bits_eq(
                            &forward_at(&mut three, &x, (b, t), None),
                            &y,
                            &format!("{context} 3 threads"),
                        );
                    }
                    first.get_or_insert(isa);
                }
                for format in [KvFormat::Bf16, KvFormat::Q8_0] {
                    let mut layer = build(first.unwrap(), 2, format);
                    let y = forward_at(&mut layer, &x, (b, t), None);
                    let context = format!("{context} {format:?}");
                    assert_bits_eq(
                        &decode_token_by_token(&mut layer, &x, (b, t), None),
                        &y,
                        &context,
                    );
                }
            }
        }
    }
}

/// The gate comes from the queries' tokens, not the memory's.
#[test]
fn cross_attention_against_the_reference() {
    let (b, t, s, d, e, kv, q, h) = (2, 5, 6, 11, 7, 5, 15, 3);
    let mut rng = Rng::new(7);
    let [wq, _, _, wo] = weights(&mut rng, (d, kv, q));
    let (wk, wv) = (rng.vec(e * kv, 0.5), rng.vec(e * kv, 0.5));
    let g = gate(&mut rng, (GateSpan::PerHead, true), (d, q, h), true);
    let (x, memory) = (rng.vec(b * t * d, 1.0), rng.vec(b * s * e, 1.0));
    let mut want = Attend::new(b, t, d, kv, h, &x, [&wq, &wk, &wv, &wo]);
    (want.qw, want.s, want.e, want.memory, want.causal, want.gate) =
        (q, s, e, Some(&memory[..]), false, Some(&g));
    let want = reference_attend(&want).y;
    let widths = Widths {
        d_model: d,
        memory: e,
        kv,
        query: q,
        value: kv,
    };
    let projections = Projections::new(widths, &wq, &wk, &wv, &wo).unwrap();
    for (isa, threads) in configs() {
        let mut layer = Layer::builder(projections, h)
            .masking(mha::Masking::Bidirectional)
            .output_gate(g.clone())
            .isa(isa)
            .threads(threads)
            .build()
            .unwrap();
        let mut y = vec![0.0; b * t * d];
        layer
            .cross_into(
                Tokens::new(&x, b, t, d).unwrap(),
                Tokens::new(&memory, b, s, e).unwrap(),
                AttendOptions::default(),
                Output::new(&mut y, b, t, d).unwrap(),
            )
            .unwrap();
        assert_close(&y, &want, ABS, REL, &format!("cross {isa:?} {threads}"));
    }
}

#[test]
fn wrong_lengths_are_errors_naming_them() {
    let (d, kv, q, h) = SHAPES[0];
    let mut rng = Rng::new(9);
    let [wq, wk, wv, wo] = weights(&mut rng, (d, kv, q));
    let projections =
        Projections::new(Widths::self_attention(d, kv, q), &wq, &wk, &wv, &wo).unwrap();
    let build = |gate: OutputGate| -> Result<Layer, ShapeError> {
        LayerBuilder::build(Layer::builder(projections, h).output_gate(gate))
    };
    let per_head = gate(&mut rng, (GateSpan::PerHead, false), (d, q, h), false);
    let wrong = OutputGate {
        span: GateSpan::PerElement,
        ..per_head.clone()
    };
    assert_eq!(
        build(wrong).unwrap_err().to_string(),
        "output gate wg (D, G) needs 165 elements, but the buffer has 33"
    );
    let bias = OutputGate {
        bias: Some(vec![0.0; 4]),
        ..per_head
    };
    assert_eq!(
        build(bias).unwrap_err().to_string(),
        "output gate bias bg (G) needs 3 elements, but the buffer has 4"
    );
}
