//! The softmax scale set on the builder (`softmax(scale · q·k)`): T5-style 1, a Gemma-style
//! `query_pre_attn_scalar^-0.5`, 0 (every visible key weighted alike) and an odd value, in
//! self- and cross-attention, with grouped heads, heads not `D / H` wide and options, the
//! attention weights included, against the general f64 reference; decoding token by token with
//! a scale equals the forward bit for bit. The default is `1/√d`, bit for bit the same as
//! setting it. A scale that is not finite or is negative is `Err(ShapeError::Setting)` naming
//! the value. Every supported instruction set, 1 and 2 threads (the decoding test: one).
//!
//! Tolerance: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{check_cross, check_self, input, Mask, Opts, Weights, BOTH};
use common::{assert_bits_eq, assert_close, reference_attend};
use mha::{AttendOptions, Masking, Matrix, Mha, MhaParams, ShapeError, Tensor};

/// 1 (T5), 256^-0.5 (Gemma's query_pre_attn_scalar), 0, and an odd value.
const SCALES: [f32; 4] = [1.0, 0.0625, 0.0, 0.37];

#[test]
fn self_attention_with_a_set_scale() {
    let x = input::<2, 7, 12>(1);
    let opts = Opts {
        key_lengths: Some(vec![7, 3]),
        mask: Some(Mask::Additive(
            (0..49).map(|e| (e % 3) as f32 * 0.5).collect(),
        )),
        ..Opts::default()
    };
    for scale in SCALES {
        let mut plain = Weights::<12, 12, 12>::random(2, [true; 4]);
        let mut grouped = Weights::<12, 12, 6, 18>::random(3, [true; 4]);
        plain.scale = Some(scale);
        grouped.scale = Some(scale);
        let context = format!("scale {scale}");
        for masking in BOTH {
            for opts in [&Opts::default(), &opts] {
                check_self(&plain, 3, masking, &x, opts, &context);
                check_self(&grouped, 3, masking, &x, opts, &context);
            }
        }
    }
}

#[test]
fn cross_attention_with_a_set_scale() {
    let x = input::<2, 5, 12>(4);
    let memory = input::<2, 6, 7>(5);
    for scale in SCALES {
        let mut w = Weights::<12, 7, 6, 18>::random(6, [false; 4]);
        w.scale = Some(scale);
        for masking in BOTH {
            let context = format!("scale {scale}");
            check_cross(&w, 3, masking, &x, &memory, &Opts::default(), &context);
        }
    }
}

/// Token by token, the same bits as the forward, and within tolerance of the reference.
#[test]
fn decoding_with_a_set_scale_equals_the_forward() {
    const T: usize = 9;
    let mut w = Weights::<10, 10, 6, 18>::random(7, [true; 4]);
    w.scale = Some(0.0625);
    let x = input::<1, T, 10>(8);
    let mut layer = w.layer(3, Masking::Causal, mha::Isa::detect(), 1);
    let full = layer.forward(&x).unwrap();
    let want = reference_attend(&w.attend(1, T, 3, x.as_slice(), None, Masking::Causal));
    assert_close(full.as_slice(), &want.y, 1e-4, 1e-4, "forward");
    let mut cache = layer.new_cache(1, T).unwrap();
    let mut out = Tensor::<1, 1, 10>::zeros();
    for t in 0..T {
        let token = Tensor::<1, 1, 10>::from_fn(|_, _, i| x[(0, t, i)]);
        layer
            .decode_into(&token, &mut cache, AttendOptions::default(), &mut out)
            .unwrap();
        let context = format!("token {t}");
        assert_bits_eq(out.as_slice(), full.token(0, t).unwrap(), &context);
    }
}

/// Leaving the scale unset and setting it to `1/√d` (rounded to f32) give the same bits.
#[test]
fn the_default_is_one_over_root_d() {
    let w = Weights::<12, 12, 15, 15>::random(9, [true; 4]);
    let x = input::<2, 5, 12>(10);
    let mut default = w.layer(3, Masking::Causal, mha::Isa::detect(), 1);
    let explicit = (1.0 / 5f64.sqrt()) as f32;
    assert_eq!(default.scale(), explicit);
    let mut set = Weights {
        scale: Some(explicit),
        ..w
    }
    .layer(3, Masking::Causal, mha::Isa::detect(), 1);
    assert_eq!(set.scale(), explicit);
    assert_bits_eq(
        default.forward(&x).unwrap().as_slice(),
        set.forward(&x).unwrap().as_slice(),
        "default vs 1/sqrt(5)",
    );
}

#[test]
fn a_scale_not_finite_or_negative_is_an_error() {
    let w = Matrix::<4, 4>::identity();
    let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
    for (scale, text) in [
        (f32::NAN, "NaN"),
        (f32::INFINITY, "inf"),
        (f32::NEG_INFINITY, "-inf"),
        (-0.5, "-0.5"),
        (-f32::MIN_POSITIVE, "-1.1754944e-38"),
    ] {
        let error = Mha::builder(&params, 2).scale(scale).build().unwrap_err();
        assert_eq!(
            error,
            ShapeError::Setting {
                what: "softmax scale",
                value: text.into(),
                expected: "finite and >= 0",
            }
        );
        assert_eq!(
            error.to_string(),
            format!("softmax scale is {text}, but must be finite and >= 0")
        );
    }
    // Zero, negative zero, the smallest and largest finite values are accepted.
    for scale in [0.0, -0.0, f32::from_bits(1), f32::MAX] {
        let layer = Mha::builder(&params, 2).scale(scale).build().unwrap();
        assert_eq!(layer.scale().to_bits(), scale.to_bits());
    }
}
