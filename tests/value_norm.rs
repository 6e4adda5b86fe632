//! Gemma 4's settings on layers built by hand, on odd shapes (D = 11, 3 query heads of 6 over
//! one key/value head; D = 13, 4 heads of 6 over 2; D = 9, 3 heads of 5 over one): the
//! weight-less value norm (alone, with each `eps`, with value biases, beside a weighted
//! QK-norm, rotary, a window and explicit positions), values from the key projection (`Wk`
//! given as `Wv`, and `values_from_keys` packing `Wk` once: the same bits, self- and
//! cross-attention) and proportional rotary (2 of 3 pairs turning, a factor), against the f64
//! reference (`tests/common`); decoding token by token equals the forward bit for bit in every
//! cache format (rolling caches included), and 1 and 3 threads give the same bits, on every
//! supported instruction set. Bad settings are errors naming the number.
//!
//! Tolerance against the reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::check_every_table;
use common::{reference_attend, Attend, RefRope, Rng};
use mha::{Biases, Layer, Projections, QkNorm, QkNormSpan, Rope, RopeLayout};
use mha::{RopeScaling, Widths};

/// The shapes: `(D, KV, Q, H)`.
const SHAPES: [(usize, usize, usize, usize); 3] = [(11, 6, 18, 3), (13, 12, 24, 4), (9, 5, 15, 3)];

/// What one case sets beside the projections.
#[derive(Clone, Copy, Debug, Default)]
struct Case {
    /// The value norm's `eps`.
    value_norm: Option<f32>,
    /// `Wk` given as `Wv` (and `bk` as `bv`).
    k_eq_v: bool,
    /// Proportional rotary over the whole head (heads of an even width only).
    rope: bool,
    /// A weighted per-head QK-norm.
    qk_norm: bool,
    biases: bool,
    window: Option<usize>,
    /// Explicit positions, far from the indices.
    explicit: bool,
}

/// Proportional rotary over heads of `head_dim`: 2 pairs turn, theta 100, factor 1.5.
fn rope(head_dim: usize) -> Rope {
    Rope {
        theta: 100.0,
        rotary_dim: head_dim,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Proportional {
            pairs: 2,
            factor: 1.5,
        },
    }
}

/// The reference's frequencies of [`rope`]: `100^(-2i / head_dim) / 1.5` for the first two
/// pairs, 0 for the others.
fn inverse_frequencies(head_dim: usize) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| match i < 2 {
            true => 100f64.powf(-2.0 * i as f64 / head_dim as f64) / 1.5,
            false => 0.0,
        })
        .collect()
}

fn check_case(case: Case, seed: u64) {
    let (b, t) = (2, 12);
    for (s, &(d, kv, q, h)) in SHAPES.iter().enumerate() {
        let head_dim = q / h;
        if case.rope && head_dim % 2 == 1 {
            continue;
        }
        let mut rng = Rng::new(seed * 10 + s as u64);
        let wk = rng.vec(d * kv, 0.5);
        let wv = if case.k_eq_v {
            wk.clone()
        } else {
            rng.vec(d * kv, 0.5)
        };
        let (wq, wo) = (rng.vec(d * q, 0.5), rng.vec(q * d, 0.5));
        let bias = |rng: &mut Rng, n| case.biases.then(|| rng.vec(n, 0.5));
        let (bq, bk, bo) = (bias(&mut rng, q), bias(&mut rng, kv), bias(&mut rng, d));
        let bv = if case.k_eq_v {
            bk.clone()
        } else {
            bias(&mut rng, kv)
        };
        let norm = case.qk_norm.then(|| QkNorm {
            span: QkNormSpan::PerHead,
            q_weight: rng.vec(head_dim, 1.0),
            k_weight: rng.vec(head_dim, 1.0),
            eps: 1e-6,
        });
        let x = rng.vec(b * t * d, 1.0);
        let positions: Vec<usize> = (0..b * t).map(|r| 9 * (r / t) + 2 * (r % t)).collect();
        let positions = case.explicit.then_some(&positions[..]);
        let inv = inverse_frequencies(head_dim);
        let mut want = Attend::new(b, t, d, kv, h, &x, [&wq, &wk, &wv, &wo]);
        want.qw = q;
        (want.bq, want.bk, want.bv, want.bo) =
            (bq.as_deref(), bk.as_deref(), bv.as_deref(), bo.as_deref());
        (want.window, want.qk_norm, want.value_norm) =
            (case.window, norm.as_ref(), case.value_norm);
        want.rope = case.rope.then_some(RefRope {
            rotary_dim: head_dim,
            interleaved: false,
            inv_freq: &inv,
            attention_factor: 1.0,
            positions,
        });
        let want = reference_attend(&want).y;
        let projections =
            Projections::new(Widths::self_attention(d, kv, q), &wq, &wk, &wv, &wo).unwrap();
        let biases = Biases {
            bq: bq.clone(),
            bk: bk.clone(),
            bv: bv.clone(),
            bo: bo.clone(),
        };
        let build = |isa, threads, format| {
            let mut builder = Layer::builder(projections, h)
                .isa(isa)
                .threads(threads)
                .min_work_per_thread(0)
                .kv_format(format)
                .biases(biases.clone());
            if let Some(eps) = case.value_norm {
                builder = builder.value_norm(eps);
            }
            if case.rope {
                builder = builder.rope(rope(head_dim));
            }
            if let Some(window) = case.window {
                builder = builder.sliding_window(window);
            }
            if let Some(norm) = &norm {
                builder = builder.qk_norm(norm.clone());
            }
            builder.build().unwrap()
        };
        let context = format!("D {d} {case:?}");
        check_every_table(build, &x, (b, t), positions, &want, &context);
    }
}

#[test]
fn value_norm_alone_with_each_eps() {
    for (i, eps) in [1e-6, 0.0, 0.5].into_iter().enumerate() {
        let case = Case {
            value_norm: Some(eps),
            ..Case::default()
        };
        check_case(case, 1 + i as u64);
        let biased = Case {
            biases: true,
            ..case
        };
        check_case(biased, 4 + i as u64);
    }
}

#[test]
fn value_norm_beside_qk_norm_rope_and_a_window() {
    let gemma4_sliding = Case {
        value_norm: Some(1e-6),
        qk_norm: true,
        rope: true,
        window: Some(4),
        ..Case::default()
    };
    check_case(gemma4_sliding, 7);
    let explicit = Case {
        explicit: true,
        window: None,
        ..gemma4_sliding
    };
    check_case(explicit, 8);
}

#[test]
fn values_from_the_key_projection() {
    let gemma4_full = Case {
        value_norm: Some(1e-6),
        k_eq_v: true,
        qk_norm: true,
        rope: true,
        ..Case::default()
    };
    check_case(gemma4_full, 9);
    let biased = Case {
        biases: true,
        explicit: true,
        ..gemma4_full
    };
    check_case(biased, 10);
}

#[test]
fn proportional_rope_alone() {
    let case = Case {
        rope: true,
        ..Case::default()
    };
    check_case(case, 11);
    let explicit = Case {
        explicit: true,
        ..case
    };
    check_case(explicit, 12);
}

#[test]
fn proportional_frequencies() {
    let inv = rope(10).inverse_frequencies().unwrap();
    let want = inverse_frequencies(10);
    assert_eq!(inv.len(), 5);
    for (got, want) in inv.iter().zip(&want) {
        assert!((got - want).abs() <= 1e-15 * want.abs(), "{got} vs {want}");
    }
    assert_eq!(&inv[2..], [0.0; 3]);
}

#[test]
fn bad_settings_are_errors_naming_the_number() {
    let widths = Widths::self_attention(11, 6, 18);
    let (w, wo) = (vec![0.1; 11 * 18], vec![0.1; 18 * 11]);
    let wk = vec![0.1; 11 * 6];
    let projections = Projections::new(widths, &w, &wk, &wk, &wo).unwrap();
    for (eps, shown) in [(-1.0, "-1.0"), (f32::NAN, "NaN"), (f32::INFINITY, "inf")] {
        let err = Layer::builder(projections, 3)
            .value_norm(eps)
            .build()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("value norm eps is {shown}, but must be finite and >= 0")
        );
    }
    let too_many = Rope {
        scaling: RopeScaling::Proportional {
            pairs: 4,
            factor: 1.0,
        },
        ..rope(6)
    };
    let err = Layer::builder(projections, 3)
        .rope(too_many)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "proportional rope pairs is 4 (rotary_dim 6), but must be at most rotary_dim / 2"
    );
    let zero_factor = Rope {
        scaling: RopeScaling::Proportional {
            pairs: 1,
            factor: 0.0,
        },
        ..rope(6)
    };
    let err = Layer::builder(projections, 3)
        .rope(zero_factor)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "rope_scaling factor is 0.0, but must be finite and > 0"
    );
}

/// `values_from_keys`: values from the key projection's output, `Wk` packed once, give the bits
/// of the layer given `Wk` as `Wv` (and `bk` as `bv`), forward and decoding, with the value
/// norm, a QK-norm and rotary, on every table; the `wv` given is not read.
#[test]
fn values_from_keys_equal_wk_given_as_wv() {
    use common::modes::configs;
    use common::{assert_bits_eq, decode_token_by_token, forward_at};
    use mha::{AttendOptions, Output, Tokens};
    let (b, t) = (2, 12);
    for (s, &(d, kv, q, h)) in SHAPES.iter().enumerate() {
        let mut rng = Rng::new(90 + s as u64);
        let (wq, wk, wo) = (
            rng.vec(d * q, 0.5),
            rng.vec(d * kv, 0.5),
            rng.vec(q * d, 0.5),
        );
        let garbage = vec![f32::NAN; d * kv];
        let bk = rng.vec(kv, 0.5);
        let x = rng.vec(b * t * d, 1.0);
        let head_dim = q / h;
        let widths = Widths::self_attention(d, kv, q);
        for (isa, threads) in configs() {
            let build = |wv: &[f32], bv: Option<Vec<f32>>, from_keys: bool| {
                let projections = Projections::new(widths, &wq, &wk, wv, &wo).unwrap();
                let biases = Biases {
                    bk: Some(bk.clone()),
                    bv,
                    ..Biases::default()
                };
                let mut builder = Layer::builder(projections, h)
                    .isa(isa)
                    .threads(threads)
                    .min_work_per_thread(0)
                    .biases(biases)
                    .value_norm(1e-6);
                if head_dim % 2 == 0 {
                    builder = builder.rope(rope(head_dim));
                }
                if from_keys {
                    builder = builder.values_from_keys();
                }
                builder.build().unwrap()
            };
            let mut twice = build(&wk, Some(bk.clone()), false);
            let mut once = build(&garbage, None, true);
            assert!(once.weight_bytes() < twice.weight_bytes());
            let want = forward_at(&mut twice, &x, (b, t), None);
            let context = format!("D {d} {isa:?} {threads}");
            assert_bits_eq(&forward_at(&mut once, &x, (b, t), None), &want, &context);
            let decoded = decode_token_by_token(&mut once, &x, (b, t), None);
            assert_bits_eq(&decoded, &want, &format!("{context} decoded"));
            if head_dim % 2 == 1 {
                // Cross-attention (no rotary): keys and values from a memory of 5 tokens.
                let memory = &x[..b * 5 * d];
                let cross = |layer: &mut Layer| {
                    let mut y = vec![0.0; b * t * d];
                    let (xs, mem) = (
                        Tokens::new(&x, b, t, d).unwrap(),
                        Tokens::new(memory, b, 5, d).unwrap(),
                    );
                    let out = Output::new(&mut y, b, t, d).unwrap();
                    layer
                        .cross_into(xs, mem, AttendOptions::default(), out)
                        .unwrap();
                    y
                };
                assert_bits_eq(
                    &cross(&mut once),
                    &cross(&mut twice),
                    &format!("{context} cross"),
                );
            }
        }
    }
}
