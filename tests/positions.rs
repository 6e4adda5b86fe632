//! Positions kept with each sequence in its cache, and moved (llama.cpp's `seq_add`).
//!
//! - After a call that places its tokens at explicit positions, the next call without
//!   positions continues after the last of them: `KvCache` and `PagedCache`, rectangular and
//!   ragged calls, bit for bit as passing the continued positions explicitly.
//! - `Layer::shift_positions` moves a paged sequence's tokens from index 60 on by `delta`,
//!   turning their cached keys: it then decodes as a sequence prefilled at the moved
//!   positions, within 1e-6 of the largest output (f32 keys; 1e-3 for bf16 and 2e-3 for
//!   q8_0 keys, rounded again), for positive and negative shifts, on every table (not shifting is ten
//!   times farther off); a fork it shares blocks with keeps its own positions and bits;
//!   a layer without RoPE only moves the positions. Shifts that cannot be done are errors
//!   that change nothing.

mod common;

use common::modes::{configs, qk_norm, Weights};
use common::{assert_bits_eq, Rng};
use mha::{AttendOptions, KvFormat, Layer, Masking, Output, PagedCache, QkNormPlacement};
use mha::{QkNormSpan, Rope, RopeLayout, RopeScaling, ShapeError, Tokens};

const D: usize = 12;
const KV: usize = 4;
/// 6 query heads of width 2 over 2 key/value heads.
const H: usize = 6;

const ROPE: Rope = Rope {
    theta: 100.0,
    rotary_dim: 2,
    layout: RopeLayout::RotateHalf,
    scaling: RopeScaling::Default,
};

fn layer(isa: mha::Isa, threads: usize, format: KvFormat, rope: bool) -> Layer {
    let weights = Weights::<D, D, KV>::random(31, [true; 4]);
    let builder = weights.builder(H, Masking::Causal, isa, threads);
    let builder = builder.key_format(format).value_format(format);
    let builder = if rope { builder.rope(ROPE) } else { builder };
    builder.build().unwrap().into_layer()
}

/// `x (tokens, D)` of sequence `id` through `decode_paged`, at `positions` when given.
fn step(
    layer: &mut Layer,
    cache: &mut PagedCache,
    id: usize,
    x: &[f32],
    positions: Option<&[usize]>,
) -> Vec<f32> {
    let tokens = x.len() / D;
    let mut out = vec![f32::NAN; x.len()];
    let options = AttendOptions {
        positions,
        ..AttendOptions::default()
    };
    let (input, output) = (
        Tokens::new(x, 1, tokens, D),
        Output::new(&mut out, 1, tokens, D),
    );
    let done = layer.decode_paged(input.unwrap(), cache, &[id], options, output.unwrap());
    done.unwrap();
    out
}

/// A call at explicit positions sets where the next default one goes, for a `KvCache` of two
/// sequences (one adding fewer tokens) and for ragged paged calls.
#[test]
fn explicit_positions_are_kept_with_the_sequence() {
    let mut rng = Rng::new(2);
    let prompt = rng.vec(2 * 3 * D, 1.0);
    let next = rng.vec(2 * D, 1.0);
    for (isa, threads) in configs() {
        let mut layer = layer(isa, threads, KvFormat::F32, true);
        let context = format!("{isa:?}, {threads} threads");
        // A KvCache: sequence 0 at 500.., sequence 1 (two real tokens) at 7, 8.
        let mut outs = Vec::new();
        for explicit_next in [false, true] {
            let mut cache = layer.new_cache(2, 8).unwrap();
            let options = AttendOptions {
                positions: Some(&[500, 501, 502, 7, 8, 0]),
                token_lengths: Some(&[3, 2]),
                ..AttendOptions::default()
            };
            let mut y = vec![0.0; prompt.len()];
            let (x, out) = (Tokens::new(&prompt, 2, 3, D), Output::new(&mut y, 2, 3, D));
            layer
                .decode_into(x.unwrap(), &mut cache, options, out.unwrap())
                .unwrap();
            assert_eq!(cache.positions(), [503, 9], "{context}");
            let options = AttendOptions {
                positions: explicit_next.then_some(&[503, 9][..]),
                ..AttendOptions::default()
            };
            let mut y = vec![0.0; next.len()];
            let (x, out) = (Tokens::new(&next, 2, 1, D), Output::new(&mut y, 2, 1, D));
            layer
                .decode_into(x.unwrap(), &mut cache, options, out.unwrap())
                .unwrap();
            assert_eq!(
                (cache.lengths(), cache.positions()),
                (&[4, 3][..], vec![504, 10])
            );
            outs.push(y);
        }
        assert_bits_eq(&outs[0], &outs[1], &format!("{context}, KvCache"));
        // Ragged paged calls: a prompt at 40.. beside a sequence at its default positions.
        let mut outs = Vec::new();
        for explicit_next in [false, true] {
            let mut cache = layer.new_paged_cache(4).unwrap();
            let ids = [cache.add_sequence().unwrap(), cache.add_sequence().unwrap()];
            let lengths = [3, 2];
            let options = AttendOptions {
                positions: Some(&[40, 41, 42, 0, 1]),
                ..AttendOptions::default()
            };
            let mut y = vec![0.0; 5 * D];
            let x = Tokens::ragged(&prompt[..5 * D], &lengths, D).unwrap();
            let out = Output::ragged(&mut y, &lengths, D).unwrap();
            layer
                .decode_paged(x, &mut cache, &ids, options, out)
                .unwrap();
            let next_positions = [43, 2];
            let options = AttendOptions {
                positions: explicit_next.then_some(&next_positions[..]),
                ..AttendOptions::default()
            };
            let mut y = vec![0.0; next.len()];
            let (x, out) = (
                Tokens::ragged(&next, &[1, 1], D),
                Output::ragged(&mut y, &[1, 1], D),
            );
            layer
                .decode_paged(x.unwrap(), &mut cache, &ids, options, out.unwrap())
                .unwrap();
            let positions = ids.map(|id| cache.position(id).unwrap());
            assert_eq!(positions, [44, 3], "{context}");
            outs.push(y);
        }
        assert_bits_eq(&outs[0], &outs[1], &format!("{context}, paged"));
    }
}

/// A layer without RoPE takes any position; the next one saturates at `isize::MAX`, and a
/// shift past it is an error (no overflow, also in debug builds).
#[test]
fn the_largest_positions_saturate() {
    let mut plain = layer(mha::Isa::detect(), 1, KvFormat::F32, false);
    let x = Rng::new(9).vec(D, 1.0);
    let mut cache = plain.new_cache(1, 4).unwrap();
    let options = AttendOptions {
        positions: Some(&[usize::MAX]),
        ..AttendOptions::default()
    };
    let mut y = vec![0.0; D];
    let (input, output) = (Tokens::new(&x, 1, 1, D), Output::new(&mut y, 1, 1, D));
    plain
        .decode_into(input.unwrap(), &mut cache, options, output.unwrap())
        .unwrap();
    assert_eq!(cache.positions(), [isize::MAX as usize]);
    let mut paged = plain.new_paged_cache(1).unwrap();
    let id = paged.add_sequence().unwrap();
    step(&mut plain, &mut paged, id, &x, Some(&[usize::MAX - 1]));
    assert_eq!(paged.position(id).unwrap(), isize::MAX as usize);
    let err = plain.shift_positions(&mut paged, id, 0, 1).unwrap_err();
    assert!(matches!(err, ShapeError::PositionShift { .. }), "{err}");
    assert_eq!(paged.position(id).unwrap(), isize::MAX as usize);
}

/// The largest magnitude of `values`.
fn largest(values: &[f32]) -> f32 {
    values.iter().fold(0.0, |m, v| m.max(v.abs()))
}

/// The prompt's tokens before it stay, the rest move.
const FROM: usize = 60;

/// `130` tokens at `start..`: as prefilled, or with those from [`FROM`] on moved by `delta`.
fn prompt_positions(start: usize, delta: isize) -> Vec<usize> {
    let moved = |(t, p): (usize, usize)| match t < FROM {
        true => p,
        false => p.checked_add_signed(delta).unwrap(),
    };
    (start..start + 130).enumerate().map(moved).collect()
}

/// How [`decode_tail`]'s sequence gets its positions: prefilled at `start..` and then shifted
/// by `delta` from token [`FROM`] on, prefilled there and not shifted, or prefilled at the
/// moved positions.
#[derive(Clone, Copy, PartialEq)]
enum Placed {
    Shifted,
    NotShifted,
    PrefilledThere,
}

/// A 130-token sequence placed as `placed` says, then decoding 5 tokens one by one: their
/// outputs.
fn decode_tail(layer: &mut Layer, (delta, start): (isize, usize), placed: Placed) -> Vec<f32> {
    let mut rng = Rng::new(8);
    let (prompt, tail) = (rng.vec(130 * D, 1.0), rng.vec(5 * D, 1.0));
    let mut cache = layer.new_paged_cache(8).unwrap();
    let id = cache.add_sequence().unwrap();
    let moved = if placed == Placed::PrefilledThere {
        delta
    } else {
        0
    };
    let positions = prompt_positions(start, moved);
    step(layer, &mut cache, id, &prompt, Some(&positions));
    if placed == Placed::Shifted {
        layer.shift_positions(&mut cache, id, FROM, delta).unwrap();
    }
    let tail = tail.chunks_exact(D);
    tail.flat_map(|token| step(layer, &mut cache, id, token, None))
        .collect()
}

/// The largest difference of `a` and `b`.
fn farthest(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn a_shifted_sequence_decodes_as_one_prefilled_there() {
    let formats = [
        (KvFormat::F32, 1e-6),
        (KvFormat::Bf16, 1e-3),
        (KvFormat::Q8_0, 2e-3),
    ];
    for (isa, threads) in configs() {
        for (format, bound) in formats {
            let mut layer = layer(isa, threads, format, true);
            for shift in [(37, 0), (1000, 5), (-20, 60)] {
                let context = format!("{isa:?}, {threads} threads, {format:?}, shift {shift:?}");
                let got = decode_tail(&mut layer, shift, Placed::Shifted);
                let want = decode_tail(&mut layer, shift, Placed::PrefilledThere);
                let error = farthest(&got, &want) / largest(&want);
                assert!(error <= bound, "{context}: {error}");
                // Not shifting is far off: the shift is what makes them agree.
                let stale = decode_tail(&mut layer, shift, Placed::NotShifted);
                let off = farthest(&stale, &want) / largest(&want);
                assert!(off > 10.0 * bound, "{context}: {off}");
            }
        }
    }
}

/// A fork shifted alone copies the blocks it shares; the original keeps its positions and
/// decodes with the bits it would have had; a full pool refuses the shift unchanged.
#[test]
fn a_shifted_fork_leaves_its_original_alone() {
    let mut layer = layer(mha::Isa::detect(), 1, KvFormat::F32, true);
    let mut rng = Rng::new(4);
    let (prompt, token) = (rng.vec(100 * D, 1.0), rng.vec(D, 1.0));
    let mut cache = layer.new_paged_cache(4).unwrap();
    let original = cache.add_sequence().unwrap();
    step(&mut layer, &mut cache, original, &prompt, None);
    let mut reference = cache.clone();
    let fork = cache.fork(original).unwrap();
    assert_eq!(cache.free_blocks(), 2);
    layer.shift_positions(&mut cache, fork, 0, 9).unwrap();
    assert_eq!(cache.free_blocks(), 0, "both blocks copied");
    assert_eq!(
        (
            cache.position(original).unwrap(),
            cache.position(fork).unwrap()
        ),
        (100, 109)
    );
    let want = step(&mut layer, &mut reference, original, &token, None);
    let got = step(&mut layer, &mut cache, original, &token, None);
    assert_bits_eq(&got, &want, "the original after its fork's shift");
    // No free block left: a second fork cannot copy what it shares.
    let mut full = layer.new_paged_cache(1).unwrap();
    let a = full.add_sequence().unwrap();
    step(&mut layer, &mut full, a, &prompt[..10 * D], None);
    let b = full.fork(a).unwrap();
    let err = layer.shift_positions(&mut full, b, 2, 3).unwrap_err();
    assert_eq!(
        err,
        ShapeError::PoolFull {
            needed: 1,
            free: 0,
            blocks: 1
        }
    );
    assert_eq!(full.position(b).unwrap(), 10);
}

/// Without RoPE a shift moves only the positions; bad shifts are errors naming the numbers.
#[test]
fn shifts_that_cannot_be_done_are_errors() {
    let mut plain = layer(mha::Isa::detect(), 1, KvFormat::F32, false);
    let mut rng = Rng::new(6);
    let (prompt, token) = (rng.vec(4 * D, 1.0), rng.vec(D, 1.0));
    let mut cache = plain.new_paged_cache(2).unwrap();
    let (a, b) = (cache.add_sequence().unwrap(), cache.add_sequence().unwrap());
    step(&mut plain, &mut cache, a, &prompt, None);
    step(&mut plain, &mut cache, b, &prompt, None);
    plain.shift_positions(&mut cache, a, 1, 50).unwrap();
    assert_eq!(cache.position(a).unwrap(), 54);
    let (ya, yb) = (
        step(&mut plain, &mut cache, a, &token, None),
        step(&mut plain, &mut cache, b, &token, None),
    );
    assert_bits_eq(&ya, &yb, "no rotary embedding: the same keys");
    let err = plain.shift_positions(&mut cache, a, 0, -56).unwrap_err();
    assert_eq!(
        err.to_string(),
        "sequence 0's positions cannot move by -56: its next token would be at a negative position"
    );
    let err = plain.shift_positions(&mut cache, a, 6, 1).unwrap_err();
    assert!(
        matches!(
            err,
            ShapeError::PositionShift {
                id: 0,
                delta: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        plain.shift_positions(&mut cache, 7, 0, 1),
        Err(ShapeError::SequenceId { id: 7, .. })
    ));
    let rotary = layer(mha::Isa::detect(), 1, KvFormat::Bf16, true);
    assert_eq!(
        rotary.shift_positions(&mut cache, a, 0, 1),
        Err(ShapeError::CacheMismatch),
        "a cache of a layer of other formats is refused"
    );
    let mut rotary_cache = rotary.new_paged_cache(1).unwrap();
    let id = rotary_cache.add_sequence().unwrap();
    let err = rotary
        .shift_positions(&mut rotary_cache, id, 0, isize::MAX)
        .unwrap_err();
    assert!(matches!(err, ShapeError::PositionShift { .. }), "{err}");
    let weights = Weights::<D, D, KV>::random(31, [true; 4]);
    let after = weights
        .builder(H, Masking::Causal, mha::Isa::detect(), 1)
        .rope(ROPE)
        .qk_norm(qk_norm(QkNormSpan::PerHead, 2, H, 2, 1e-6, 5))
        .qk_norm_placement(QkNormPlacement::AfterRope)
        .build()
        .unwrap()
        .into_layer();
    let mut norm_cache = after.new_paged_cache(1).unwrap();
    let id = norm_cache.add_sequence().unwrap();
    let err = after
        .shift_positions(&mut norm_cache, id, 0, 1)
        .unwrap_err();
    assert!(matches!(err, ShapeError::PositionShift { .. }), "{err}");
    assert_eq!(norm_cache.position(id).unwrap(), 0);
}
