//! Layers computing in bfloat16 (`Compute::Bf16`) over several key blocks, with every score
//! setting: on every table decoding equals the forward and 3 threads equal 1 (on the AMX
//! table the attention's own arithmetic, elsewhere the `f32` attention), the outputs stay near
//! the `f32` layer's, and a non-finite token changes no output that does not see it.

mod common;

use common::{assert_bits_eq, forward_and_decode, random_layer, Rng};
use mha::{Alibi, Compute, Isa, Layer, LayerBuilder, Masking, Projections, Tokens, Widths};

/// Tokens per sequence: two key blocks and part of a third.
const T: usize = 211;
/// Sequences per call.
const B: usize = 2;
/// Model width; 6 query heads of 20, 2 key/value heads (groups of 3).
const DM: usize = 48;

fn isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
}

/// Settings a layer of the test takes on top of causal order.
type Settings = fn(LayerBuilder<'_>) -> LayerBuilder<'_>;

/// The settings of the test's layers, named.
fn variants() -> Vec<(&'static str, Settings)> {
    vec![
        ("plain", |b| b),
        ("window 70", |b| b.sliding_window(70)),
        ("alibi + soft cap", |b| {
            b.alibi(Alibi::Standard).softcap(4.0)
        }),
        ("sinks", |b| {
            b.sinks(vec![0.5, -1.0, 2.0, f32::NEG_INFINITY, 0.0, 1.0])
        }),
    ]
}

struct Weights {
    w: [Vec<f32>; 4],
    biases: mha::Biases,
}

impl Weights {
    fn new(seed: u64) -> Self {
        let (w, biases) = random_layer(&mut Rng::new(seed), widths());
        Weights { w, biases }
    }

    fn layer(&self, (isa, compute, threads): (Isa, Compute, usize), settings: Settings) -> Layer {
        let [wq, wk, wv, wo] = &self.w;
        let projections = Projections::new(widths(), wq, wk, wv, wo).unwrap();
        let builder = Layer::builder(projections, 6)
            .biases(self.biases.clone())
            .masking(Masking::Causal)
            .isa(isa)
            .threads(threads)
            .min_work_per_thread(0)
            .compute(compute)
            .attention_compute(compute);
        settings(builder).build().unwrap()
    }
}

fn widths() -> Widths {
    Widths::self_attention(DM, 40, 120)
}

/// Decoding equals the forward, 3 threads equal 1, and the outputs lie within 3 % of the
/// largest output of the `f32` layer: each of q, k, p and v rounded to 8 significant bits
/// (2^-9 relative) on top of the projections' rounding, through the softmax's sensitivity.
#[test]
fn bf16_layers_decode_as_they_forward_with_every_setting() {
    let weights = Weights::new(41);
    let x = Rng::new(42).vec(B * T * DM, 1.0);
    for isa in isas() {
        for (name, settings) in variants() {
            let context = format!("{isa:?} {name}");
            let mut f32_layer = weights.layer((isa, Compute::F32, 1), settings);
            let want = f32_layer
                .forward(Tokens::new(&x, B, T, DM).unwrap())
                .unwrap();
            let mut layer = weights.layer((isa, Compute::Bf16, 1), settings);
            let (forward, decoded) = forward_and_decode(&mut layer, &x, (B, T));
            assert_bits_eq(&decoded, &forward, &format!("{context}: decode = forward"));
            let mut three = weights.layer((isa, Compute::Bf16, 3), settings);
            let three = three.forward(Tokens::new(&x, B, T, DM).unwrap()).unwrap();
            assert_bits_eq(&three, &forward, &format!("{context}: 3 threads"));
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (i, (g, w)) in forward.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 0.03 * scale, "{context} {i}: {g} vs {w}");
            }
            assert_ne!(forward, want, "{context}: gave the f32 layer's bits");
        }
    }
}

/// A NaN or an infinity in one token of one sequence reaches only the outputs of the queries
/// that see that token: every other output has the bits of the call without it.
#[test]
fn a_non_finite_token_reaches_only_the_queries_that_see_it() {
    let weights = Weights::new(43);
    let clean = Rng::new(44).vec(B * T * DM, 1.0);
    let bad_token = 150;
    for isa in isas() {
        for bad in [f32::NAN, f32::INFINITY] {
            let mut x = clean.clone();
            x[bad_token * DM + 5] = bad;
            let mut layer = weights.layer((isa, Compute::Bf16, 1), |b| b);
            let want = layer
                .forward(Tokens::new(&clean, B, T, DM).unwrap())
                .unwrap();
            let (got, decoded) = forward_and_decode(&mut layer, &x, (B, T));
            let context = format!("{isa:?} {bad}");
            assert_bits_eq(&decoded, &got, &format!("{context}: decode = forward"));
            // Sequence 0's rows before the token, and all of sequence 1.
            let before = bad_token * DM;
            assert_bits_eq(
                &got[..before],
                &want[..before],
                &format!("{context}: before"),
            );
            let other = T * DM;
            assert_bits_eq(
                &got[other..],
                &want[other..],
                &format!("{context}: other sequence"),
            );
            let row = &got[before..before + DM];
            assert!(
                row.iter().any(|v| !v.is_finite()),
                "{context}: the token's own row"
            );
        }
    }
}

/// The attention's arithmetic is `f32` unless set, and int8 is not one: a clear error.
#[test]
fn the_attention_computes_in_f32_or_bf16() {
    let weights = Weights::new(45);
    let layer = weights.layer((Isa::detect(), Compute::F32, 1), |b| b);
    assert_eq!(layer.attention_compute(), Compute::F32);
    let [wq, wk, wv, wo] = &weights.w;
    let projections = Projections::new(widths(), wq, wk, wv, wo).unwrap();
    let int8 = Layer::builder(projections, 6)
        .attention_compute(Compute::Int8)
        .build();
    let message = int8.expect_err("int8 attention is an error").to_string();
    assert!(
        message.contains("attention compute") && message.contains("int8"),
        "{message}"
    );
}
