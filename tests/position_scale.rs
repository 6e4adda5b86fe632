//! The position-dependent query scale (Ministral 3's `llama_4_scaling_beta`, Llama 4's
//! attention temperature tuning), chunked attention (Llama 4) and QK-norm after RoPE, on odd
//! shapes (D = 11, 3 query heads of 5 over one key/value head; D = 13, 4 heads of 5 over 2):
//! against the f64 reference (`tests/common`), alone and beside RoPE, a sliding window and
//! explicit positions; decoding token by token equals the forward bit for bit in every cache
//! format (rolling caches included), and 1 and 3 threads give the same bits. Bad settings are
//! errors naming the number.
//!
//! Tolerance against the reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::check_every_table;
use common::{reference_attend, Attend, RefQueryScale, RefRope, Rng};
use mha::{Layer, LayerBuilder, Projections, QkNorm};
use mha::{QkNormPlacement, QkNormSpan, QueryScale, Rope, RopeLayout, RopeScaling};
use mha::{ScalePosition, Widths};

/// The shapes: `(D, KV, Q, H)`.
const SHAPES: [(usize, usize, usize, usize); 2] = [(11, 5, 15, 3), (13, 10, 20, 4)];

/// What one case sets beside the projections.
#[derive(Clone, Copy, Debug, Default)]
struct Case {
    /// `(beta, period, offset, from)`.
    scale: Option<(f64, f64, usize, ScalePosition)>,
    rope: bool,
    window: Option<usize>,
    chunk: Option<usize>,
    /// A weighted per-head QK-norm, after RoPE when `true`.
    norm_after_rope: Option<bool>,
    /// Explicit positions, far from the indices.
    explicit: bool,
}

/// Rotary of the first 4 features of each head, theta 100, interleaved.
fn rope() -> Rope {
    Rope {
        theta: 100.0,
        rotary_dim: 4,
        layout: RopeLayout::Interleaved,
        scaling: RopeScaling::Default,
    }
}

fn norm(rng: &mut Rng) -> QkNorm {
    QkNorm {
        span: QkNormSpan::PerHead,
        q_weight: rng.vec(5, 1.0),
        k_weight: rng.vec(5, 1.0),
        eps: 1e-6,
    }
}

/// `(b, t)` positions from a few periods on, with a restart in batch element 1.
fn explicit_positions(b: usize, t: usize) -> Vec<usize> {
    (0..b * t)
        .map(|r| match r / t {
            0 => 7 + r % t,
            _ => [20, 21, 0, 1, 2, 3, 30, 31, 32, 33, 34, 35][r % t],
        })
        .collect()
}

fn check_case(case: Case, seed: u64) {
    let (b, t) = (2, 12);
    for (s, &(d, kv, q, h)) in SHAPES.iter().enumerate() {
        let mut rng = Rng::new(seed * 10 + s as u64);
        let w = [
            rng.vec(d * q, 0.5),
            rng.vec(d * kv, 0.5),
            rng.vec(d * kv, 0.5),
            rng.vec(q * d, 0.5),
        ];
        let norm = case.norm_after_rope.map(|_| norm(&mut rng));
        let x = rng.vec(b * t * d, 1.0);
        let positions = explicit_positions(b, t);
        let positions = case.explicit.then_some(&positions[..]);
        let inv = [1.0, 0.1];
        let mut want = Attend::new(b, t, d, kv, h, &x, [&w[0], &w[1], &w[2], &w[3]]);
        want.qw = q;
        (want.window, want.chunk, want.qk_norm) = (case.window, case.chunk, norm.as_ref());
        want.norm_after_rope = case.norm_after_rope == Some(true);
        want.rope = case.rope.then_some(RefRope {
            rotary_dim: 4,
            interleaved: true,
            inv_freq: &inv,
            attention_factor: 1.0,
            positions,
        });
        want.query_scale = case
            .scale
            .map(|(beta, period, offset, from)| RefQueryScale {
                beta,
                period,
                offset,
                positions: positions.filter(|_| from == ScalePosition::Position),
            });
        let want = reference_attend(&want).y;
        let projections =
            Projections::new(Widths::self_attention(d, kv, q), &w[0], &w[1], &w[2], &w[3]).unwrap();
        let build = |isa, threads, format| {
            let mut builder = Layer::builder(projections, h)
                .isa(isa)
                .threads(threads)
                .min_work_per_thread(0)
                .kv_format(format);
            if let Some((beta, period, offset, from)) = case.scale {
                let scale = QueryScale {
                    beta,
                    period,
                    offset,
                    from,
                };
                builder = builder.query_scale(scale);
            }
            if case.rope {
                builder = builder.rope(rope());
            }
            if let Some(window) = case.window {
                builder = builder.sliding_window(window);
            }
            if let Some(chunk) = case.chunk {
                builder = builder.chunked_attention(chunk);
            }
            if let (Some(norm), Some(after)) = (&norm, case.norm_after_rope) {
                let placement = match after {
                    true => QkNormPlacement::AfterRope,
                    false => QkNormPlacement::BeforeRope,
                };
                builder = builder.qk_norm(norm.clone()).qk_norm_placement(placement);
            }
            builder.build().unwrap()
        };
        let context = format!("D {d} {case:?}");
        check_every_table(build, &x, (b, t), positions, &want, &context);
    }
}

#[test]
fn query_scale_from_positions() {
    // Periods of 3 over 12 tokens (and positions up to 35): factors from 1 to 1 + 0.4·ln 12.
    let scale = Some((0.4, 3.0, 0, ScalePosition::Position));
    check_case(
        Case {
            scale,
            ..Case::default()
        },
        1,
    );
    check_case(
        Case {
            scale,
            rope: true,
            ..Case::default()
        },
        2,
    );
    check_case(
        Case {
            scale,
            rope: true,
            explicit: true,
            ..Case::default()
        },
        3,
    );
    let windowed = Case {
        scale,
        rope: true,
        window: Some(4),
        ..Case::default()
    };
    check_case(windowed, 4);
}

#[test]
fn query_scale_from_the_index_ignores_explicit_positions() {
    // Llama 4's form: offset 1, a negative beta too.
    let scale = Some((0.3, 4.0, 1, ScalePosition::Index));
    check_case(
        Case {
            scale,
            rope: true,
            explicit: true,
            ..Case::default()
        },
        5,
    );
    let scale = Some((-0.2, 2.0, 1, ScalePosition::Index));
    check_case(
        Case {
            scale,
            ..Case::default()
        },
        6,
    );
}

#[test]
fn chunked_attention() {
    check_case(
        Case {
            chunk: Some(5),
            ..Case::default()
        },
        7,
    );
    check_case(
        Case {
            chunk: Some(1),
            rope: true,
            ..Case::default()
        },
        8,
    );
    let both = Case {
        chunk: Some(4),
        window: Some(3),
        rope: true,
        ..Case::default()
    };
    check_case(both, 9);
    let explicit = Case {
        chunk: Some(3),
        rope: true,
        explicit: true,
        ..Case::default()
    };
    check_case(explicit, 10);
}

#[test]
fn qk_norm_after_rope() {
    let after = Case {
        rope: true,
        norm_after_rope: Some(true),
        ..Case::default()
    };
    check_case(after, 11);
    check_case(
        Case {
            norm_after_rope: Some(false),
            ..after
        },
        12,
    );
    // Llama 4's RoPE layer: norm after RoPE, chunks; its NoPE layer: the index scale.
    let llama4 = Case {
        chunk: Some(5),
        ..after
    };
    check_case(llama4, 13);
}

#[test]
fn bad_settings_are_errors_naming_them() {
    let (d, kv, q, h) = SHAPES[0];
    let mut rng = Rng::new(99);
    let w = [
        rng.vec(d * q, 0.5),
        rng.vec(d * kv, 0.5),
        rng.vec(d * kv, 0.5),
        rng.vec(q * d, 0.5),
    ];
    let projections =
        Projections::new(Widths::self_attention(d, kv, q), &w[0], &w[1], &w[2], &w[3]).unwrap();
    let build = |builder: LayerBuilder<'_>| builder.build().unwrap_err().to_string();
    let scale = QueryScale {
        beta: 0.1,
        period: 8.0,
        offset: 0,
        from: ScalePosition::Position,
    };
    let bad = QueryScale {
        period: 0.0,
        ..scale
    };
    assert_eq!(
        build(Layer::builder(projections, h).query_scale(bad)),
        "query scale period is 0.0, but must be finite and > 0"
    );
    let bad = QueryScale {
        beta: f64::NAN,
        ..scale
    };
    assert_eq!(
        build(Layer::builder(projections, h).query_scale(bad)),
        "query scale beta is NaN, but must be finite"
    );
    let bad = QueryScale {
        beta: 1e300,
        ..scale
    };
    assert_eq!(
        build(Layer::builder(projections, h).query_scale(bad)),
        "query scale beta is 1e300, but must be a factor finite in f32 at every position"
    );
    assert_eq!(
        build(Layer::builder(projections, h).chunked_attention(0)),
        "attention chunk size is 0, but must be at least 1"
    );
    let bidirectional = Layer::builder(projections, h).masking(mha::Masking::Bidirectional);
    assert_eq!(
        build(bidirectional.chunked_attention(4)),
        "attention chunk size is 4, but must be on a causal layer"
    );
}
