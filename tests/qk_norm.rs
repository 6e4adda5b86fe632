//! QK-norm (RMSNorm of the projected queries and keys, after the biases and before the keys
//! are cached): per head with an odd head width (Qwen3, Gemma 3) and over the whole row
//! (OLMo 2), heads `D / H` wide or not, plain and grouped heads, with biases, options, a set
//! scale and cross-attention, the attention weights included, against the general f64
//! reference; decoding is in `tests/cache.rs`. Properties: with unit weights and `eps = 0` the
//! layer is scale-invariant in its inputs (the probabilities unchanged, the output scaled
//! along); zero rows with `eps = 0` stay zeros. Weights of the wrong length and an `eps` that
//! is not finite or is negative are errors naming the numbers. Every supported instruction
//! set, 1 and 2 threads (the properties: the detected set, 1 thread).
//!
//! Tolerance against the reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{check_cross, check_self, input, qk_norm, Mask, Opts, Weights, BOTH};
use common::{assert_bits_eq, assert_close, reference_attend, Rng};
use mha::{AttendOptions, AttentionWeights, Masking, Mha, Output, QkNorm, QkNormSpan};
use mha::{ShapeError, Tensor};
use quickcheck::{QuickCheck, TestResult};

const SPANS: [QkNormSpan; 2] = [QkNormSpan::PerHead, QkNormSpan::Whole];

/// Key lengths and a boolean mask over `(7, 7)`.
fn options() -> Opts {
    Opts {
        key_lengths: Some(vec![6, 7]),
        mask: Some(Mask::Bool((0..49).map(|e| e % 5 != 3).collect())),
        ..Opts::default()
    }
}

/// D = 10, H = 3 heads of 5 (Q = 15) with one key/value head (KV = 5) or three (KV = 15); and
/// D = 12, H = 4 heads of 3 (Q = D) with two key/value heads. Epsilons 1e-6, 0 and 0.1.
#[test]
fn self_attention_against_the_reference() {
    let x = input::<2, 7, 10>(1);
    let x12 = input::<2, 7, 12>(2);
    for (index, span) in SPANS.into_iter().enumerate() {
        for (e, eps) in [1e-6, 0.0, 0.1].into_iter().enumerate() {
            let seed = 10 * (index * 3 + e) as u64;
            let biases = [e != 1; 4];
            let mut grouped = Weights::<10, 10, 5, 15>::random(seed + 3, biases);
            grouped.qk_norm = Some(qk_norm(span, 5, 3, 1, eps, seed + 4));
            let mut plain = Weights::<10, 10, 15, 15>::random(seed + 5, biases);
            plain.qk_norm = Some(qk_norm(span, 5, 3, 3, eps, seed + 6));
            let mut square = Weights::<12, 12, 6, 12>::random(seed + 7, biases);
            square.qk_norm = Some(qk_norm(span, 3, 4, 2, eps, seed + 8));
            let context = format!("{span:?} eps {eps}");
            for masking in BOTH {
                for opts in [&Opts::default(), &options()] {
                    check_self(&grouped, 3, masking, &x, opts, &context);
                    check_self(&plain, 3, masking, &x, opts, &context);
                    check_self(&square, 4, masking, &x12, opts, &context);
                }
            }
        }
    }
}

/// The norm of the keys applies to keys projected from a memory; with a set scale too.
#[test]
fn cross_attention_and_a_set_scale_against_the_reference() {
    let x = input::<2, 5, 10>(30);
    let memory = input::<2, 6, 7>(31);
    let x7 = input::<2, 7, 10>(36);
    for span in SPANS {
        let mut w = Weights::<10, 7, 5, 15>::random(32, [true; 4]);
        w.qk_norm = Some(qk_norm(span, 5, 3, 1, 1e-6, 33));
        for scale in [None, Some(0.0625)] {
            w.scale = scale;
            let context = format!("{span:?} scale {scale:?}");
            for masking in BOTH {
                check_cross(&w, 3, masking, &x, &memory, &Opts::default(), &context);
                check_self(&w_self(span, scale), 3, masking, &x7, &options(), &context);
            }
        }
    }
}

/// A self-attention layer D = 10, H = 3 heads of 5, KV = 5 with the norm and scale.
fn w_self(span: QkNormSpan, scale: Option<f32>) -> Weights<10, 10, 5, 15> {
    let mut w = Weights::random(34, [true, true, false, false]);
    w.qk_norm = Some(qk_norm(span, 5, 3, 1, 1e-5, 35));
    w.scale = scale;
    w
}

/// The output and the attention weights of one forward of `layer` on `x`.
fn forward<const T: usize>(
    layer: &mut Mha<10, 10, 5, 15>,
    x: &Tensor<1, T, 10>,
) -> (Vec<f32>, AttentionWeights) {
    let mut out = Tensor::<1, T, 10>::zeros();
    let mut weights = AttentionWeights::new();
    let output = Output::from(&mut out).with_weights(&mut weights);
    layer
        .forward_into(x, AttendOptions::default(), output)
        .unwrap();
    (out.into_vec(), weights)
}

/// A layer D = 10, H = 3 heads of 5, KV = 5, no biases, QK-norm of `span` with unit weights and
/// `eps = 0`.
fn unit_layer(span: QkNormSpan, seed: u64) -> Mha<10, 10, 5, 15> {
    let mut w = Weights::<10, 10, 5, 15>::random(seed, [false; 4]);
    let mut unit = qk_norm(span, 5, 3, 1, 0.0, 0);
    unit.q_weight.fill(1.0);
    unit.k_weight.fill(1.0);
    w.qk_norm = Some(unit);
    w.layer(3, Masking::Causal, mha::Isa::detect(), 1)
}

/// `x` scaled by `c`.
fn scaled<const T: usize>(x: &Tensor<1, T, 10>, c: f32) -> Tensor<1, T, 10> {
    Tensor::from_fn(|b, t, i| x[(b, t, i)] * c)
}

/// Scaling the input by `c > 0` scales `Q`, `K` and `V` by `c` (no biases); the norm undoes it
/// on `Q` and `K`, so the probabilities stay and the output scales by `c`. Exactly so only up
/// to rounding: `c · x` and the projections round differently from `x`'s (unless `c` is a power
/// of two), about 1e-6 relative in the normalised queries and keys, whose scores are at most
/// `√head_dim · max |w|² ≈ 2.2` in size, so probabilities and `output / c` move by ~1e-5;
/// the tolerance is 1e-4 absolute plus 1e-4 relative, and `eps = 0` (a positive `eps` would
/// make the invariance inexact by design, most for small `c`).
#[test]
fn unit_weights_make_the_layer_scale_invariant() {
    fn prop(seed: u64) -> TestResult {
        let mut rng = Rng::new(seed);
        let span = SPANS[(rng.next_u64() % 2) as usize];
        let c = 2f32.powf(rng.uniform() * 7.0);
        let mut layer = unit_layer(span, seed);
        let x = Tensor::<1, 9, 10>::from_vec(rng.vec(90, 1.0)).unwrap();
        let (y, weights) = forward(&mut layer, &x);
        let (y_c, weights_c) = forward(&mut layer, &scaled(&x, c));
        let unscaled: Vec<f32> = y_c.iter().map(|v| v / c).collect();
        let close = |got: &[f32], want: &[f32]| {
            got.iter()
                .zip(want)
                .all(|(&g, &w)| (g as f64 - w as f64).abs() <= 1e-4 + 1e-4 * (w as f64).abs())
        };
        if close(weights_c.as_slice(), weights.as_slice()) && close(&unscaled, &y) {
            TestResult::passed()
        } else {
            TestResult::error(format!("seed {seed}: {span:?} c {c}: not invariant"))
        }
    }
    QuickCheck::new()
        .tests(100)
        .quickcheck(prop as fn(u64) -> TestResult);
}

/// For `c` a power of two every rounding scales exactly: the same probabilities and `c` times
/// the output, bit for bit.
#[test]
fn powers_of_two_are_exactly_invariant() {
    for span in SPANS {
        let mut layer = unit_layer(span, 40);
        let x = input::<1, 9, 10>(41);
        let (y, weights) = forward(&mut layer, &x);
        for k in -8..=8 {
            let c = 2f32.powi(k);
            let (y_c, weights_c) = forward(&mut layer, &scaled(&x, c));
            let context = format!("{span:?} c 2^{k}");
            assert_bits_eq(weights_c.as_slice(), weights.as_slice(), &context);
            let y_times_c: Vec<f32> = y.iter().map(|v| v * c).collect();
            assert_bits_eq(&y_c, &y_times_c, &context);
        }
    }
}

/// Zero tokens, no biases, `eps = 0`: the norm of a zero span is 0 / 0; it stays zero, so the
/// output is zeros rather than NaN.
#[test]
fn zero_rows_with_eps_zero_stay_zero() {
    for span in SPANS {
        let mut w = Weights::<10, 10, 5, 15>::random(50, [false; 4]);
        w.qk_norm = Some(qk_norm(span, 5, 3, 1, 0.0, 51));
        let x = Tensor::<2, 4, 10>::zeros();
        let want = reference_attend(&w.attend(2, 4, 3, x.as_slice(), None, Masking::Causal));
        let y = w
            .layer(3, Masking::Causal, mha::Isa::detect(), 1)
            .forward(&x)
            .unwrap();
        assert_close(y.as_slice(), &want.y, 0.0, 0.0, &format!("{span:?}"));
        assert!(y.as_slice().iter().all(|&v| v == 0.0));
    }
}

#[test]
fn weights_of_the_wrong_length_are_errors() {
    let w = Weights::<10, 10, 5, 15>::random(60, [false; 4]);
    let build = |norm: QkNorm| {
        Mha::builder(&w.params, 3)
            .qk_norm(norm)
            .build()
            .unwrap_err()
    };
    let cases = [
        (
            QkNormSpan::PerHead,
            4,
            5,
            "QK-norm q_weight (head_dim)",
            5,
            4,
        ),
        (
            QkNormSpan::PerHead,
            5,
            15,
            "QK-norm k_weight (head_dim)",
            5,
            15,
        ),
        (
            QkNormSpan::Whole,
            5,
            5,
            "QK-norm q_weight (H x head_dim)",
            15,
            5,
        ),
        (
            QkNormSpan::Whole,
            15,
            15,
            "QK-norm k_weight (Hkv x head_dim)",
            5,
            15,
        ),
    ];
    for (span, q, k, what, expected, actual) in cases {
        let norm = QkNorm {
            span,
            q_weight: vec![1.0; q],
            k_weight: vec![1.0; k],
            eps: 1e-6,
        };
        let error = build(norm);
        assert_eq!(
            error,
            ShapeError::LengthMismatch {
                what,
                expected,
                actual
            }
        );
        assert_eq!(
            error.to_string(),
            format!("{what} needs {expected} elements, but the buffer has {actual}")
        );
    }
}

#[test]
fn eps_not_finite_or_negative_is_an_error() {
    let w = Weights::<10, 10, 5, 15>::random(61, [false; 4]);
    for (eps, text) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf"), (-1e-6, "-1e-6")] {
        let norm = QkNorm {
            eps,
            ..qk_norm(QkNormSpan::PerHead, 5, 3, 1, 0.0, 62)
        };
        let error = Mha::builder(&w.params, 3)
            .qk_norm(norm)
            .build()
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("QK-norm eps is {text}, but must be finite and >= 0")
        );
        assert!(matches!(
            error,
            ShapeError::Setting {
                what: "QK-norm eps",
                ..
            }
        ));
    }
}

/// Heads of width 0 (`Q = KV = 0`): the norm has nothing to normalise and nothing panics; every
/// output row is the output bias, in a forward and in decoding.
#[test]
fn zero_width_heads_do_not_panic() {
    for span in SPANS {
        let mut w = Weights::<4, 4, 0, 0>::random(70, [true; 4]);
        w.qk_norm = Some(qk_norm(span, 0, 3, 3, 0.0, 71));
        w.scale = Some(2.0);
        let x = input::<2, 3, 4>(72);
        let mut layer = w.layer(3, Masking::Causal, mha::Isa::detect(), 1);
        let bo = w.biases.bo.as_ref().unwrap().as_slice();
        let y = layer.forward(&x).unwrap();
        for row in y.as_slice().chunks(4) {
            assert_eq!(row, bo, "{span:?}");
        }
        let mut cache = layer.new_cache(2, 3).unwrap();
        let mut out = Tensor::<2, 3, 4>::zeros();
        layer
            .decode_into(&x, &mut cache, AttendOptions::default(), &mut out)
            .unwrap();
        assert_eq!(out, y, "{span:?}");
    }
}
