//! Sequences of different lengths in one batch (`AttendOptions::token_lengths`, the cache's
//! per-sequence lengths): a batch whose sequences started at different times or have prompts
//! of different lengths, fed through one layer call per step, gives each sequence's real rows
//! bit for bit as decoding that sequence alone, and within 1e-4 of the f64 reference of the
//! sequence's causal attention over all its tokens. Clearing one sequence restarts it while
//! the others go on; bad token lengths and a full sequence are errors naming the numbers.

mod common;

use common::modes::{configs, Weights, ABS, REL};
use common::{assert_bits_eq, assert_close, reference_attend, Rng};
use mha::{AttendOptions, KvCache, Masking, Mha, Output, ShapeError, Tokens};
use mha::{QkNorm, QkNormSpan, Rope, RopeLayout, RopeScaling};

const D: usize = 12;
const KV: usize = 4;
/// 6 query heads of width 2 over 2 key/value heads.
const H: usize = 6;
const B: usize = 3;
const CAPACITY: usize = 120;

/// One call of a schedule: `T` tokens per sequence, of which sequence `b` has `real[b]`.
struct Step {
    tokens: usize,
    real: [usize; B],
}

/// Uneven prompts, single tokens, a step in which one sequence adds nothing, and a long step
/// that carries two sequences across the 96-key block.
fn schedule() -> Vec<Step> {
    let step = |tokens, real| Step { tokens, real };
    vec![
        step(7, [5, 2, 7]),
        step(1, [1, 1, 1]),
        step(1, [1, 1, 1]),
        step(4, [4, 0, 1]),
        step(100, [100, 3, 90]),
        step(1, [1, 1, 1]),
    ]
}

/// Runs `x (B, T, D)` with `real` through `layer`; returns its `(B, T, D)` output.
fn call(
    layer: &mut Mha<D, D, KV>,
    cache: &mut KvCache,
    x: &[f32],
    tokens: usize,
    real: Option<&[usize]>,
) -> Vec<f32> {
    let batch = x.len() / (tokens * D);
    let mut out = vec![f32::NAN; x.len()];
    let options = AttendOptions {
        token_lengths: real,
        ..AttendOptions::default()
    };
    let input = Tokens::new(x, batch, tokens, D).unwrap();
    let output = Output::new(&mut out, batch, tokens, D).unwrap();
    layer.decode_into(input, cache, options, output).unwrap();
    out
}

/// The batch's steps, then each sequence alone, then the reference.
#[test]
fn each_sequence_as_if_alone() {
    let weights = Weights::<D, D, KV>::random(7, [true; 4]);
    for (isa, threads) in configs() {
        let context = format!("{isa:?}, {threads} threads");
        let layer = weights.layer(H, Masking::Causal, isa, threads);
        for (b, (tokens, out)) in ragged_steps(layer, &context).iter().enumerate() {
            let len = tokens.len() / D;
            let want =
                reference_attend(&weights.attend(1, len, H, tokens, None, Masking::Causal)).y;
            assert_close(out, &want, ABS, REL, &format!("{context}, sequence {b}"));
        }
    }
}

/// With a rotary embedding (each sequence's tokens at its own positions) and QK-norm, too.
#[test]
fn each_sequence_as_if_alone_with_rope_and_qk_norm() {
    let weights = Weights::<D, D, KV>::random(12, [true; 4]);
    let rope = Rope {
        theta: 500.0,
        rotary_dim: 2,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    };
    let norm = QkNorm {
        span: QkNormSpan::PerHead,
        q_weight: vec![0.9, 1.2],
        k_weight: vec![1.1, 0.7],
        eps: 1e-6,
    };
    for (isa, threads) in configs() {
        let layer = Mha::builder(&weights.params, H)
            .biases(weights.biases.clone())
            .rope(rope)
            .qk_norm(norm.clone())
            .isa(isa)
            .threads(threads)
            .min_work_per_thread(0)
            .build()
            .unwrap();
        ragged_steps(layer, &format!("{isa:?}, {threads} threads, RoPE"));
    }
}

/// Runs the schedule through `layer` with a batch cache, checks each sequence's rows against
/// that sequence decoded alone (bit for bit); returns each sequence's real tokens and outputs.
fn ragged_steps(mut layer: Mha<D, D, KV>, context: &str) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut rng = Rng::new(3);
    let mut cache = layer.new_cache(B, CAPACITY).unwrap();
    // Each sequence's real tokens and the batch's outputs for them, in order.
    let mut tokens = vec![Vec::new(); B];
    let mut outputs = vec![Vec::new(); B];
    for step in schedule() {
        let x = rng.vec(B * step.tokens * D, 1.0);
        let y = call(&mut layer, &mut cache, &x, step.tokens, Some(&step.real));
        for b in 0..B {
            let rows = (b * step.tokens * D)..(b * step.tokens + step.real[b]) * D;
            tokens[b].extend_from_slice(&x[rows.clone()]);
            outputs[b].extend_from_slice(&y[rows.clone()]);
            let padding = &y[rows.end..(b + 1) * step.tokens * D];
            assert!(
                padding.iter().all(|v| v.is_finite()),
                "{context}: padding rows"
            );
        }
        let lengths: Vec<usize> = (0..B).map(|b| tokens[b].len() / D).collect();
        assert_eq!(cache.lengths(), lengths, "{context}");
        assert_eq!(cache.len(), *lengths.iter().max().unwrap(), "{context}");
    }
    for b in 0..B {
        let alone = alone(&mut layer, &tokens[b], b);
        assert_bits_eq(&outputs[b], &alone, &format!("{context}, sequence {b}"));
    }
    tokens.into_iter().zip(outputs).collect()
}

/// Sequence `b`'s real tokens through a one-sequence cache, in the schedule's steps.
fn alone(layer: &mut Mha<D, D, KV>, tokens: &[f32], b: usize) -> Vec<f32> {
    let mut cache = layer.new_cache(1, CAPACITY).unwrap();
    let mut out = Vec::new();
    let mut start = 0;
    for step in schedule() {
        let n = step.real[b];
        if n > 0 {
            out.extend(call(
                layer,
                &mut cache,
                &tokens[start * D..(start + n) * D],
                n,
                None,
            ));
        }
        start += n;
    }
    out
}

/// A forward pass with token lengths: each sequence's real rows are its own forward pass, bit
/// for bit; its padding tokens are no keys of anyone.
#[test]
fn forward_with_token_lengths() {
    const T: usize = 9;
    let weights = Weights::<D, D, KV>::random(8, [false, true, true, true]);
    let real = [9, 0, 4];
    for (isa, threads) in configs() {
        let context = format!("{isa:?}, {threads} threads");
        let mut layer = weights.layer(H, Masking::Causal, isa, threads);
        let x = Rng::new(5).vec(B * T * D, 1.0);
        let mut y = vec![0.0; x.len()];
        let options = AttendOptions {
            token_lengths: Some(&real),
            ..AttendOptions::default()
        };
        let input = Tokens::new(&x, B, T, D).unwrap();
        layer
            .forward_into(input, options, Output::new(&mut y, B, T, D).unwrap())
            .unwrap();
        for (b, &n) in real.iter().enumerate() {
            let rows = b * T * D..(b * T + n) * D;
            let mut own = vec![0.0; n * D];
            let input = Tokens::new(&x[rows.clone()], 1, n, D).unwrap();
            let output = Output::new(&mut own, 1, n, D).unwrap();
            layer
                .forward_into(input, AttendOptions::default(), output)
                .unwrap();
            assert_bits_eq(&y[rows], &own, &format!("{context}, sequence {b}"));
        }
    }
}

/// `clear_sequence` starts one sequence over while the others keep their tokens.
#[test]
fn clearing_one_sequence() {
    let weights = Weights::<D, D, KV>::random(9, [true; 4]);
    let mut layer = weights.layer(H, Masking::Causal, mha::Isa::detect(), 1);
    let mut cache = layer.new_cache(B, CAPACITY).unwrap();
    let mut rng = Rng::new(11);
    call(&mut layer, &mut cache, &rng.vec(B * 5 * D, 1.0), 5, None);
    cache.clear_sequence(1).unwrap();
    assert_eq!(cache.lengths(), [5, 0, 5]);
    // Sequence 1 starts a 3-token prompt while the others take one token each.
    let x = rng.vec(B * 3 * D, 1.0);
    let y = call(&mut layer, &mut cache, &x, 3, Some(&[1, 3, 1]));
    assert_eq!(cache.lengths(), [6, 3, 6]);
    let prompt = &x[3 * D..6 * D];
    let mut fresh = layer.new_cache(1, CAPACITY).unwrap();
    let alone = call(&mut layer, &mut fresh, prompt, 3, None);
    assert_bits_eq(&y[3 * D..6 * D], &alone, "restarted sequence");
    assert_eq!(
        cache.clear_sequence(B),
        Err(ShapeError::SequenceIndex {
            sequence: B,
            batch: B
        })
    );
}

/// Token lengths of the wrong count or longer than `T`, and one sequence without room, are
/// errors naming the numbers; the cache is left as it was.
#[test]
fn bad_token_lengths_and_a_full_sequence() {
    let weights = Weights::<D, D, KV>::random(10, [false; 4]);
    let mut layer = weights.layer(H, Masking::Causal, mha::Isa::detect(), 1);
    let mut cache = layer.new_cache(B, 6).unwrap();
    let x = vec![0.5; B * 4 * D];
    let input = || Tokens::new(&x, B, 4, D).unwrap();
    let mut out = vec![0.0; x.len()];
    let mut attempt = |cache: &mut KvCache, real: &[usize]| {
        let options = AttendOptions {
            token_lengths: Some(real),
            ..AttendOptions::default()
        };
        let output = Output::new(&mut out, B, 4, D).unwrap();
        layer.decode_into(input(), cache, options, output)
    };
    let err = attempt(&mut cache, &[1, 2]).unwrap_err();
    assert_eq!(
        err,
        ShapeError::LengthMismatch {
            what: "token_lengths (B)",
            expected: 3,
            actual: 2
        }
    );
    let err = attempt(&mut cache, &[1, 5, 2]).unwrap_err();
    assert_eq!(
        err,
        ShapeError::TokenLength {
            batch: 1,
            length: 5,
            tokens: 4
        }
    );
    assert_eq!(
        err.to_string(),
        "token length 5 of batch element 1 is longer than the call's 4 tokens"
    );
    attempt(&mut cache, &[1, 4, 0]).unwrap();
    assert_eq!(cache.lengths(), [1, 4, 0]);
    let err = attempt(&mut cache, &[4, 3, 4]).unwrap_err();
    assert_eq!(
        err,
        ShapeError::CacheFull {
            sequence: 1,
            capacity: 6,
            cached: 4,
            new: 3
        }
    );
    assert_eq!(
        err.to_string(),
        "KV cache of capacity 6 holds 4 tokens of sequence 1 and cannot take 3 more"
    );
    assert_eq!(cache.lengths(), [1, 4, 0]);
}
