//! Sequences whose length is known at run time (`Tokens` / `Output`), decoding with options,
//! and the rules of the one call path: run-time shapes against the fixed-shape entry (bit for
//! bit) and the f64 reference, decode with padding and weights against the full forward, and
//! the errors for mismatched shapes and non-finite additive masks.

mod common;

use common::modes::{configs, input, output, Mask, Opts, Weights, ABS, REL};
use common::{assert_bits_eq, assert_close, reference_attend};
use mha::{AttendOptions, AttentionWeights, AttnMask, Masking, Output, ShapeError, Tensor, Tokens};

/// One layer serves many run-time lengths (growing, shrinking, crossing the 96-row blocks):
/// each call matches the f64 reference and, bit for bit, the fixed-shape entry of a fresh
/// layer on the same rows.
#[test]
fn run_time_lengths_match_the_reference_and_the_fixed_shape_entry() {
    const D: usize = 20;
    const KV: usize = 10; // 4 heads of 5, 2 kv heads
    const B: usize = 2;
    const T_MAX: usize = 131;
    let w = Weights::<D, D, KV>::random(1, [true; 4]);
    let all = input::<B, T_MAX, D>(2);
    for (isa, threads) in configs() {
        for masking in [Masking::Causal, Masking::Bidirectional] {
            let mut layer = w.layer(4, masking, isa, threads);
            for len in [7, 131, 1, 97, 50, 0, 96, 3] {
                let x: Vec<f32> = (0..B)
                    .flat_map(|b| all.as_slice()[b * T_MAX * D..][..len * D].to_vec())
                    .collect();
                let context = format!("{isa:?} threads {threads} {masking:?} T {len}");
                let mut y = vec![f32::NAN; B * len * D];
                let tokens = Tokens::new(&x, B, len, D).unwrap();
                let out = Output::new(&mut y, B, len, D).unwrap();
                layer
                    .forward_into(tokens, AttendOptions::default(), out)
                    .unwrap();
                let want = reference_attend(&w.attend(B, len, 4, &x, None, masking));
                assert_close(&y, &want.y, ABS, REL, &context);

                let mut fresh = w.layer(4, masking, isa, threads);
                let mut again = vec![f32::NAN; B * len * D];
                let out = Output::new(&mut again, B, len, D).unwrap();
                fresh
                    .forward_into(tokens, AttendOptions::default(), out)
                    .unwrap();
                assert_bits_eq(&y, &again, &format!("{context}: vs a fresh layer"));
            }
        }
    }
}

/// The run-time entry and the fixed-shape entry are the same computation: equal bits for
/// forward, cross-attention and decode on odd shapes.
#[test]
fn tokens_and_tensors_give_the_same_bits() {
    const B: usize = 3;
    const T: usize = 37;
    const S: usize = 29;
    const D: usize = 24;
    const E: usize = 14;
    let w = Weights::<D, D, 8>::random(3, [true; 4]); // 6 heads of 4, 2 kv heads
    let cw = Weights::<D, E, D>::random(4, [true; 4]);
    let x = input::<B, T, D>(5);
    let memory = input::<B, S, E>(6);
    for (isa, threads) in configs() {
        let context = format!("{isa:?} threads {threads}");
        let mut layer = w.layer(6, Masking::Causal, isa, threads);
        let fixed = layer.forward(&x).unwrap();
        let mut flat = vec![0.0; B * T * D];
        let tokens = Tokens::new(x.as_slice(), B, T, D).unwrap();
        let out = Output::new(&mut flat, B, T, D).unwrap();
        layer
            .forward_into(tokens, AttendOptions::default(), out)
            .unwrap();
        assert_bits_eq(&flat, fixed.as_slice(), &format!("{context}: forward"));

        let mut cross = cw.layer(3, Masking::Bidirectional, isa, threads);
        let mut fixed = Tensor::<B, T, D>::zeros();
        cross
            .cross_into(&x, &memory, AttendOptions::default(), &mut fixed)
            .unwrap();
        let memory_tokens = Tokens::new(memory.as_slice(), B, S, E).unwrap();
        let out = Output::new(&mut flat, B, T, D).unwrap();
        cross
            .cross_into(tokens, memory_tokens, AttendOptions::default(), out)
            .unwrap();
        assert_bits_eq(&flat, fixed.as_slice(), &format!("{context}: cross"));

        // Decode the first 5 tokens as a chunk from a flat buffer, the rest one at a time
        // from tensors: the outputs are the full forward's rows.
        let full = layer.forward(&x).unwrap();
        let mut cache = layer.new_cache(B, T).unwrap();
        let chunk: Vec<f32> = (0..B)
            .flat_map(|b| x.as_slice()[b * T * D..][..5 * D].to_vec())
            .collect();
        let mut step = vec![0.0; B * 5 * D];
        let (tokens, out) = (
            Tokens::new(&chunk, B, 5, D).unwrap(),
            Output::new(&mut step, B, 5, D).unwrap(),
        );
        layer
            .decode_into(tokens, &mut cache, AttendOptions::default(), out)
            .unwrap();
        for b in 0..B {
            let want = &full.as_slice()[b * T * D..][..5 * D];
            let got = &step[b * 5 * D..][..5 * D];
            assert_bits_eq(got, want, &format!("{context}: decode chunk, batch {b}"));
        }
        let mut one = Tensor::<B, 1, D>::zeros();
        for t in 5..T {
            let token = Tensor::<B, 1, D>::from_fn(|b, _, i| x[(b, t, i)]);
            layer
                .decode_into(&token, &mut cache, AttendOptions::default(), &mut one)
                .unwrap();
            for b in 0..B {
                let context = format!("{context}: decode token {t}, batch {b}");
                assert_bits_eq(
                    one.token(b, 0).unwrap(),
                    full.token(b, t).unwrap(),
                    &context,
                );
            }
        }
    }
}

/// Decoding with a key padding mask and with the attention weights gives, token by token, the
/// rows of one causal forward with the same padding: outputs and weights bit for bit.
#[test]
fn decode_with_padding_and_weights_matches_the_forward() {
    const B: usize = 2;
    const T: usize = 23;
    const D: usize = 12;
    const H: usize = 3;
    let w = Weights::<D, D, D>::random(7, [true; 4]);
    let x = input::<B, T, D>(8);
    let padding: Vec<bool> = (0..B * T).map(|e| e % 7 != 2 && e % 11 != 5).collect();
    for (isa, threads) in configs() {
        let context = format!("{isa:?} threads {threads}");
        let mut layer = w.layer(H, Masking::Causal, isa, threads);
        let options = AttendOptions {
            key_padding_mask: Some(&padding),
            ..AttendOptions::default()
        };
        let mut full = Tensor::<B, T, D>::zeros();
        let mut full_weights = AttentionWeights::new();
        layer
            .forward_into(&x, options, output(&mut full, Some(&mut full_weights)))
            .unwrap();
        let opts = Opts {
            key_padding_mask: Some(padding.clone()),
            ..Opts::default()
        };
        let mut a = w.attend(B, T, H, x.as_slice(), None, Masking::Causal);
        opts.apply(&mut a);
        assert_close(full.as_slice(), &reference_attend(&a).y, ABS, REL, &context);

        let mut cache = layer.new_cache(B, T).unwrap();
        let mut step = Tensor::<B, 1, D>::zeros();
        let mut weights = AttentionWeights::new();
        for t in 0..T {
            // The padding of the keys cached so far and of the new one: (B, t + 1).
            let seen: Vec<bool> = (0..B)
                .flat_map(|b| padding[b * T..][..t + 1].to_vec())
                .collect();
            let options = AttendOptions {
                key_padding_mask: Some(&seen),
                ..AttendOptions::default()
            };
            let token = Tensor::<B, 1, D>::from_fn(|b, _, i| x[(b, t, i)]);
            layer
                .decode_into(
                    &token,
                    &mut cache,
                    options,
                    output(&mut step, Some(&mut weights)),
                )
                .unwrap();
            assert_eq!(weights.shape(), [B, H, 1, t + 1]);
            for b in 0..B {
                let context = format!("{context}: token {t}, batch {b}");
                assert_bits_eq(
                    step.token(b, 0).unwrap(),
                    full.token(b, t).unwrap(),
                    &context,
                );
                for h in 0..H {
                    let row = &full_weights.head(b, h).unwrap()[t * T..][..t + 1];
                    let got = weights.head(b, h).unwrap();
                    assert_bits_eq(got, row, &format!("{context}: weights head {h}"));
                }
            }
        }
    }
}

/// Decode options are checked against `S` = cached + new keys: lengths and padding per batch
/// element, masks `(L, S)`.
#[test]
fn decode_options_are_checked_against_all_cached_keys() {
    let w = Weights::<8, 8, 8>::random(9, [false; 4]);
    let mut layer = w.layer(2, Masking::Causal, mha::Isa::detect(), 1);
    let x = input::<2, 4, 8>(10);
    let mut cache = layer.new_cache(2, 10).unwrap();
    let mut out = Tensor::<2, 4, 8>::zeros();
    layer
        .decode_into(&x, &mut cache, AttendOptions::default(), &mut out)
        .unwrap();
    let lengths = [8, 9];
    let options = AttendOptions {
        key_lengths: Some(&lengths),
        ..AttendOptions::default()
    };
    let err = layer.decode_into(&x, &mut cache, options, &mut out);
    assert_eq!(
        err,
        Err(ShapeError::KeyLength {
            batch: 1,
            length: 9,
            keys: 8
        })
    );
    assert_eq!(cache.len(), 4, "a rejected step appends nothing");
    let padding = vec![true; 2 * 4];
    let options = AttendOptions {
        key_padding_mask: Some(&padding),
        ..AttendOptions::default()
    };
    assert_eq!(
        layer.decode_into(&x, &mut cache, options, &mut out),
        Err(ShapeError::LengthMismatch {
            what: "key_padding_mask (B, S)",
            expected: 16,
            actual: 8
        })
    );
    let mask = vec![0.0; 4 * 8];
    let options = AttendOptions {
        mask: Some(AttnMask::Additive(&mask)),
        key_lengths: Some(&[7, 8]),
        ..AttendOptions::default()
    };
    layer
        .decode_into(&x, &mut cache, options, &mut out)
        .unwrap();
    assert_eq!(cache.len(), 8);
}

/// NaN and `+inf` in an additive mask are errors naming the entry; `-inf` and finite values
/// are accepted.
#[test]
fn non_finite_additive_masks_are_errors() {
    let w = Weights::<8, 8, 8>::random(11, [false; 4]);
    let x = input::<1, 3, 8>(12);
    let mut layer = w.layer(2, Masking::Bidirectional, mha::Isa::detect(), 1);
    let mut out = Tensor::<1, 3, 8>::from_fn(|_, _, _| 5.0);
    for (index, value, name) in [(4, f32::NAN, "NaN"), (8, f32::INFINITY, "+inf")] {
        let mut mask = vec![0.5; 9];
        mask[0] = f32::NEG_INFINITY;
        mask[index] = value;
        let options = AttendOptions {
            mask: Some(AttnMask::Additive(&mask)),
            ..AttendOptions::default()
        };
        let err = layer.forward_into(&x, options, &mut out).unwrap_err();
        assert_eq!(err, ShapeError::MaskValue { index, value: name });
        assert_eq!(
            err.to_string(),
            format!("additive mask entry {index} is {name}; entries must be finite or -inf")
        );
        assert!(out.as_slice().iter().all(|&v| v == 5.0), "output untouched");
    }
    let opts = Opts {
        mask: Some(Mask::Additive(vec![
            f32::NEG_INFINITY,
            0.0,
            -3.0e38,
            1.0,
            2.0,
            -1.0,
            0.0,
            0.0,
            0.0,
        ])),
        ..Opts::default()
    };
    layer.forward_into(&x, opts.options(), &mut out).unwrap();
    let mut a = w.attend(1, 3, 2, x.as_slice(), None, Masking::Bidirectional);
    opts.apply(&mut a);
    assert_close(
        out.as_slice(),
        &reference_attend(&a).y,
        ABS,
        REL,
        "finite and -inf",
    );
}

/// Shapes that do not line up are errors naming both numbers, and nothing is written.
#[test]
fn mismatched_run_time_shapes_are_errors() {
    let data = vec![0.25; 2 * 3 * 8];
    assert_eq!(
        Tokens::new(&data, 2, 4, 8).unwrap_err(),
        ShapeError::LengthMismatch {
            what: "tokens (B, T, D)",
            expected: 64,
            actual: 48
        }
    );
    assert_eq!(
        Tokens::new(&data, usize::MAX, 2, 8).unwrap_err(),
        ShapeError::Overflow {
            what: "tokens (B, T, D)",
            dims: vec![usize::MAX, 2, 8]
        }
    );
    let w = Weights::<8, 8, 8>::random(13, [false; 4]);
    let mut layer = w.layer(2, Masking::Causal, mha::Isa::detect(), 1);
    let x = Tokens::new(&data, 2, 3, 8).unwrap();
    let mut y = vec![9.0; 2 * 2 * 8];
    let out = Output::new(&mut y, 2, 2, 8).unwrap();
    let err = layer
        .forward_into(x, AttendOptions::default(), out)
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError::DimensionMismatch {
            what: "output length (T)",
            expected: 3,
            actual: 2
        }
    );
    assert_eq!(
        err.to_string(),
        "output length (T) is 2, but the call needs 3"
    );
    let out = Output::new(&mut y, 1, 4, 8).unwrap();
    let err = layer
        .forward_into(x, AttendOptions::default(), out)
        .unwrap_err();
    assert!(matches!(
        err,
        ShapeError::DimensionMismatch {
            what: "output batch (B)",
            ..
        }
    ));
    assert!(y.iter().all(|&v| v == 9.0), "output untouched");

    let mut cache = layer.new_cache(1, 8).unwrap();
    let mut y = vec![0.0; 2 * 3 * 8];
    let out = Output::new(&mut y, 2, 3, 8).unwrap();
    let err = layer.decode_into(x, &mut cache, AttendOptions::default(), out);
    // The call's batch is what is needed, the cache's what it has.
    assert_eq!(
        err,
        Err(ShapeError::DimensionMismatch {
            what: "KV cache batch (B)",
            expected: 2,
            actual: 1
        })
    );
    assert_eq!(
        err.unwrap_err().to_string(),
        "KV cache batch (B) is 1, but the call needs 2"
    );
    assert!(cache.is_empty());
}
