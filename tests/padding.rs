//! Quickcheck properties of the options: random combinations (masking, key lengths, padding
//! masks, bool and additive masks, attention weights, self- and cross-attention, grouped
//! heads), with lengths that are sometimes wrong, never panic and return `Ok` exactly when
//! valid; valid ones match the general f64 reference; and padded keys never influence the
//! outputs: changing the padded tokens (past `key_lengths`, or hidden by `key_padding_mask`),
//! even to NaN or infinities, leaves the rows of every real token bit-identical (and in
//! cross-attention every row), and their attention weights too.
//!
//! Tolerance against the reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use common::modes::{output, Mask, Opts, Weights, ABS, REL};
use common::{reference_attend, Rng};
use mha::{AttentionWeights, Masking, ShapeError, Tensor};
use quickcheck::{QuickCheck, TestResult};

const B: usize = 2;
const T: usize = 5;
/// Keys of the cross-attention memory.
const S: usize = 4;
const D: usize = 12;
/// Width of the cross-attention memory.
const E: usize = 6;

/// One random call: its options (maybe invalid), whether they are valid, and the rest.
struct Call {
    cross: bool,
    masking: Masking,
    opts: Opts,
    weights: bool,
    valid: bool,
}

/// Draws a call; lengths are right most of the time.
fn draw(rng: &mut Rng) -> Call {
    let mut pick = |n: u64| (rng.next_u64() % n) as usize;
    let cross = pick(2) == 1;
    let s = if cross { S } else { T };
    let masking = if pick(2) == 0 {
        Masking::Causal
    } else {
        Masking::Bidirectional
    };
    let weights = pick(2) == 0;
    let mut valid = true;
    let key_lengths = (pick(2) == 0).then(|| {
        let len = [B, B, B, B, 0, 1, B + 1][pick(7)];
        valid &= len == B;
        (0..len)
            .map(|_| {
                let l = pick(s as u64 + 2);
                valid &= l <= s;
                l
            })
            .collect::<Vec<_>>()
    });
    let key_padding_mask = (pick(3) == 0).then(|| {
        let len = [B * s, B * s, B * s, B * s - 1, B * s + 1, s][pick(6)];
        valid &= len == B * s;
        (0..len).map(|_| pick(4) != 0).collect::<Vec<_>>()
    });
    let mask = match pick(3) {
        0 => None,
        kind => {
            let len = [T * s, B * T * s, T * s, B * T * s, T * s + 1, B * s, T, 0][pick(8)];
            valid &= len == T * s || len == B * T * s;
            Some(if kind == 1 {
                Mask::Bool((0..len).map(|_| pick(4) != 0).collect())
            } else {
                Mask::Additive(
                    (0..len)
                        .map(|_| match pick(5) {
                            0 => f32::NEG_INFINITY,
                            v => v as f32 - 3.0,
                        })
                        .collect(),
                )
            })
        }
    };
    Call {
        cross,
        masking,
        opts: Opts {
            key_lengths,
            key_padding_mask,
            mask,
        },
        weights,
        valid,
    }
}

/// Runs one call (self-attention: 6 heads over 2 kv heads; cross: 3 heads) and returns its
/// result, the output and the weights.
fn run(seed: u64, call: &Call) -> (Result<(), ShapeError>, Vec<f32>, AttentionWeights) {
    let mut rng = Rng::new(seed ^ 0xABCD);
    let x = Tensor::<B, T, D>::from_vec(rng.vec(B * T * D, 1.0)).unwrap();
    let mut out = Tensor::<B, T, D>::zeros();
    let mut weights = AttentionWeights::new();
    let w_out = call.weights.then_some(&mut weights);
    let result = if call.cross {
        let w = Weights::<D, E, D>::random(seed, [true; 4]);
        let memory = Tensor::<B, S, E>::from_vec(rng.vec(B * S * E, 1.0)).unwrap();
        let mut layer = w.layer(3, call.masking, mha::Isa::detect(), 1);
        layer.cross_into(&x, &memory, call.opts.options(), output(&mut out, w_out))
    } else {
        let w = Weights::<D, D, 4>::random(seed, [true; 4]);
        let mut layer = w.layer(6, call.masking, mha::Isa::detect(), 1);
        layer.forward_into(&x, call.opts.options(), output(&mut out, w_out))
    };
    (result, out.into_vec(), weights)
}

/// The reference of a valid call.
fn reference(seed: u64, call: &Call) -> common::RefOut {
    let mut rng = Rng::new(seed ^ 0xABCD);
    let x = rng.vec(B * T * D, 1.0);
    if call.cross {
        let w = Weights::<D, E, D>::random(seed, [true; 4]);
        let memory = rng.vec(B * S * E, 1.0);
        let mut a = w.attend(B, T, 3, &x, Some((S, &memory)), call.masking);
        call.opts.apply(&mut a);
        reference_attend(&a)
    } else {
        let w = Weights::<D, D, 4>::random(seed, [true; 4]);
        let mut a = w.attend(B, T, 6, &x, None, call.masking);
        call.opts.apply(&mut a);
        reference_attend(&a)
    }
}

#[test]
fn random_combinations_never_panic_and_are_ok_exactly_when_valid() {
    fn prop(seed: u64) -> TestResult {
        let call = draw(&mut Rng::new(seed));
        let result = match catch_unwind(AssertUnwindSafe(|| run(seed, &call).0)) {
            Ok(result) => result,
            Err(_) => return TestResult::error(format!("seed {seed}: panicked")),
        };
        match (result, call.valid) {
            (Ok(()), true) => TestResult::passed(),
            (Err(ShapeError::LengthMismatch { .. } | ShapeError::KeyLength { .. }), false) => {
                TestResult::passed()
            }
            (other, valid) => {
                TestResult::error(format!("seed {seed}: valid {valid}, got {other:?}"))
            }
        }
    }
    QuickCheck::new()
        .tests(300)
        .quickcheck(prop as fn(u64) -> TestResult);
}

/// The first element outside the tolerance, described.
fn mismatch(got: &[f32], want: &[f64]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("length {} instead of {}", got.len(), want.len()));
    }
    got.iter()
        .zip(want)
        .position(|(&g, &w)| {
            let err = (g as f64 - w).abs();
            err.is_nan() || err > ABS + REL * w.abs()
        })
        .map(|i| format!("element {i}: got {}, want {}", got[i], want[i]))
}

#[test]
fn random_valid_combinations_match_the_reference() {
    fn prop(seed: u64) -> TestResult {
        let call = draw(&mut Rng::new(seed));
        if !call.valid {
            return TestResult::discard();
        }
        let (result, y, weights) = run(seed, &call);
        if let Err(e) = result {
            return TestResult::error(format!("seed {seed}: valid call failed: {e}"));
        }
        let want = reference(seed, &call);
        let context = format!(
            "seed {seed} cross {} {:?} {:?}",
            call.cross, call.masking, call.opts
        );
        // Failures are returned, not panicked, so quickcheck's shrinking stays quiet.
        if let Some(e) = mismatch(&y, &want.y) {
            return TestResult::error(format!("{context}: output {e}"));
        }
        if call.weights {
            let (h, s) = if call.cross { (3, S) } else { (6, T) };
            if weights.shape() != [B, h, T, s] {
                return TestResult::error(format!(
                    "{context}: weights shape {:?}",
                    weights.shape()
                ));
            }
            if let Some(e) = mismatch(weights.as_slice(), &want.probs) {
                return TestResult::error(format!("{context}: weights {e}"));
            }
        }
        TestResult::passed()
    }
    QuickCheck::new()
        .tests(200)
        .quickcheck(prop as fn(u64) -> TestResult);
}

// ---------------------------------------------------------------------------------------------
// Padding invariance

/// Replacement values for padded tokens: `kind` 0 fresh random, 1 NaN, 2 +inf, 3 -inf, 4 a mix.
fn fill(kind: u8, rng: &mut Rng, i: usize) -> f32 {
    match kind % 5 {
        0 => rng.uniform() * 4.0,
        1 => f32::NAN,
        2 => f32::INFINITY,
        3 => f32::NEG_INFINITY,
        _ => [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -0.0][i % 5],
    }
}

/// Which keys of a batch of `s` keys are padding: past a random length (`by_lengths`) or a
/// random key-padding mask.
struct Padding {
    lengths: Option<Vec<usize>>,
    mask: Option<Vec<bool>>,
}

impl Padding {
    fn draw<const BB: usize>(rng: &mut Rng, s: usize, by_lengths: bool) -> Self {
        if by_lengths {
            let lengths = (0..BB)
                .map(|_| (rng.next_u64() % (s as u64 + 1)) as usize)
                .collect();
            Padding {
                lengths: Some(lengths),
                mask: None,
            }
        } else {
            let mask = (0..BB * s).map(|_| rng.uniform() > -0.3).collect();
            Padding {
                lengths: None,
                mask: Some(mask),
            }
        }
    }

    fn is_padding(&self, b: usize, j: usize, s: usize) -> bool {
        self.lengths.as_ref().is_some_and(|l| j >= l[b])
            || self.mask.as_ref().is_some_and(|m| !m[b * s + j])
    }

    fn opts(&self, mask: Option<Mask>) -> Opts {
        Opts {
            key_lengths: self.lengths.clone(),
            key_padding_mask: self.mask.clone(),
            mask,
        }
    }
}

/// Self-attention of `(BB, TT, DD)`: the rows of real tokens, and their attention weights, are
/// bit-identical when the padded tokens change.
fn self_invariance<const BB: usize, const TT: usize, const DD: usize, const KV: usize>(
    seed: u64,
    kind: u8,
    h: usize,
    by_lengths: bool,
) -> TestResult {
    let mut rng = Rng::new(seed);
    let masking = if seed.is_multiple_of(2) {
        Masking::Causal
    } else {
        Masking::Bidirectional
    };
    let padding = Padding::draw::<BB>(&mut rng, TT, by_lengths);
    let mask = seed
        .is_multiple_of(3)
        .then(|| Mask::Bool((0..TT * TT).map(|_| rng.uniform() > -0.6).collect()));
    let opts = padding.opts(mask);
    let w = Weights::<DD, DD, KV>::random(seed, [true; 4]);
    let x = Tensor::<BB, TT, DD>::from_vec(rng.vec(BB * TT * DD, 1.0)).unwrap();
    let mut changed = x.clone();
    for b in 0..BB {
        for t in (0..TT).filter(|&t| padding.is_padding(b, t, TT)) {
            for i in 0..DD {
                changed.as_mut_slice()[(b * TT + t) * DD + i] = fill(kind, &mut rng, i);
            }
        }
    }
    let mut layer = w.layer(h, masking, mha::Isa::detect(), 1);
    let mut results = Vec::new();
    for input in [&x, &changed] {
        let mut out = Tensor::<BB, TT, DD>::zeros();
        let mut weights = AttentionWeights::new();
        layer
            .forward_into(input, opts.options(), output(&mut out, Some(&mut weights)))
            .unwrap();
        results.push((out.into_vec(), weights));
    }
    let context = format!("seed {seed} fill {kind} {masking:?} {opts:?}");
    let ((y0, w0), (y1, w1)) = (&results[0], &results[1]);
    for b in 0..BB {
        for t in (0..TT).filter(|&t| !padding.is_padding(b, t, TT)) {
            let row = (b * TT + t) * DD;
            for i in 0..DD {
                if y0[row + i].to_bits() != y1[row + i].to_bits() {
                    return TestResult::error(format!(
                        "{context}: token ({b}, {t}) feature {i}: {} became {}",
                        y0[row + i],
                        y1[row + i]
                    ));
                }
            }
            for hh in 0..h {
                for j in 0..TT {
                    let (p0, p1) = (w0.get(b, hh, t, j).unwrap(), w1.get(b, hh, t, j).unwrap());
                    if p0.to_bits() != p1.to_bits() {
                        return TestResult::error(format!(
                            "{context}: weight ({b}, {hh}, {t}, {j}): {p0} became {p1}"
                        ));
                    }
                }
            }
        }
    }
    TestResult::passed()
}

/// Cross-attention: every output row is bit-identical when padded memory tokens change.
fn cross_invariance(seed: u64, kind: u8, by_lengths: bool) -> TestResult {
    const SS: usize = 9;
    let mut rng = Rng::new(seed);
    let masking = if seed.is_multiple_of(2) {
        Masking::Causal
    } else {
        Masking::Bidirectional
    };
    let padding = Padding::draw::<B>(&mut rng, SS, by_lengths);
    let opts = padding.opts(None);
    let w = Weights::<D, E, 4>::random(seed, [true; 4]);
    let x = Tensor::<B, T, D>::from_vec(rng.vec(B * T * D, 1.0)).unwrap();
    let memory = Tensor::<B, SS, E>::from_vec(rng.vec(B * SS * E, 1.0)).unwrap();
    let mut changed = memory.clone();
    for b in 0..B {
        for j in (0..SS).filter(|&j| padding.is_padding(b, j, SS)) {
            for i in 0..E {
                changed.as_mut_slice()[(b * SS + j) * E + i] = fill(kind, &mut rng, i);
            }
        }
    }
    let mut layer = w.layer(6, masking, mha::Isa::detect(), 1);
    let mut outs = Vec::new();
    for memory in [&memory, &changed] {
        let mut out = Tensor::<B, T, D>::zeros();
        let mut weights = AttentionWeights::new();
        layer
            .cross_into(
                &x,
                memory,
                opts.options(),
                output(&mut out, Some(&mut weights)),
            )
            .unwrap();
        outs.push((out.into_vec(), weights.as_slice().to_vec()));
    }
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    if same(&outs[0].0, &outs[1].0) && same(&outs[0].1, &outs[1].1) {
        TestResult::passed()
    } else {
        TestResult::error(format!(
            "seed {seed} fill {kind} {masking:?} {opts:?}: output changed"
        ))
    }
}

#[test]
fn values_past_key_lengths_never_influence_real_tokens() {
    QuickCheck::new().tests(100).quickcheck(
        (|seed, kind| self_invariance::<2, 7, 12, 4>(seed, kind, 6, true))
            as fn(u64, u8) -> TestResult,
    );
    QuickCheck::new()
        .tests(100)
        .quickcheck((|seed, kind| cross_invariance(seed, kind, true)) as fn(u64, u8) -> TestResult);
    // Past the first 96-key block.
    QuickCheck::new().tests(8).quickcheck(
        (|seed, kind| self_invariance::<1, 100, 8, 8>(seed, kind, 2, true))
            as fn(u64, u8) -> TestResult,
    );
}

#[test]
fn values_hidden_by_the_key_padding_mask_never_influence_real_tokens() {
    QuickCheck::new().tests(100).quickcheck(
        (|seed, kind| self_invariance::<2, 7, 12, 4>(seed, kind, 6, false))
            as fn(u64, u8) -> TestResult,
    );
    QuickCheck::new().tests(100).quickcheck(
        (|seed, kind| cross_invariance(seed, kind, false)) as fn(u64, u8) -> TestResult,
    );
    QuickCheck::new().tests(8).quickcheck(
        (|seed, kind| self_invariance::<1, 70, 8, 8>(seed, kind, 2, false))
            as fn(u64, u8) -> TestResult,
    );
}
