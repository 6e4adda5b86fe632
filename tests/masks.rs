//! Masking modes against the general f64 reference (`common::reference_attend`): causal and
//! bidirectional, key lengths (including 0), key-padding masks with holes, bool and additive
//! masks shared `(T, S)` and per batch `(B, T, S)` with fully masked rows, and combinations.
//! Every case runs on every supported instruction set with 1 and 2 threads, with and without
//! attention weights requested.
//!
//! Tolerance: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{check_self, input, Mask, Opts, Weights, BOTH};
use common::Rng;
use mha::{AttendOptions, Masking, Tensor};

#[test]
fn causal_and_bidirectional_without_options() {
    for masking in BOTH {
        let w = Weights::<12, 12, 12>::random(1, [false; 4]);
        check_self(
            &w,
            3,
            masking,
            &input::<2, 7, 12>(2),
            &Opts::default(),
            "plain",
        );
        let w = Weights::<10, 10, 10>::random(3, [false; 4]);
        check_self(
            &w,
            5,
            masking,
            &input::<3, 5, 10>(4),
            &Opts::default(),
            "plain",
        );
        check_self(
            &w,
            1,
            masking,
            &input::<1, 1, 10>(5),
            &Opts::default(),
            "plain",
        );
        let w = Weights::<7, 7, 7>::random(6, [false; 4]);
        check_self(
            &w,
            7,
            masking,
            &input::<1, 9, 7>(7),
            &Opts::default(),
            "plain",
        );
    }
}

#[test]
fn bidirectional_differs_from_causal() {
    let w = Weights::<12, 12, 12>::random(8, [false; 4]);
    let x = input::<1, 5, 12>(9);
    let causal = check_self(&w, 3, Masking::Causal, &x, &Opts::default(), "c");
    let bidirectional = check_self(&w, 3, Masking::Bidirectional, &x, &Opts::default(), "b");
    // The last token sees every key either way; the first one does not.
    assert_eq!(causal[4 * 12..], bidirectional[4 * 12..]);
    assert_ne!(causal[..12], bidirectional[..12]);
}

#[test]
fn key_lengths_including_zero() {
    let w = Weights::<12, 12, 12>::random(10, [false; 4]);
    let x = input::<3, 7, 12>(11);
    for masking in BOTH {
        for lengths in [[7, 0, 3], [1, 7, 6], [0, 0, 0], [7, 7, 7]] {
            let opts = Opts {
                key_lengths: Some(lengths.to_vec()),
                ..Opts::default()
            };
            let y = check_self(&w, 3, masking, &x, &opts, &format!("lengths {lengths:?}"));
            // A batch element of length 0 sees nothing: zeros before Wo, so zeros exactly.
            for (b, &len) in lengths.iter().enumerate() {
                if len == 0 {
                    assert!(y[b * 7 * 12..][..7 * 12].iter().all(|&v| v == 0.0));
                }
            }
        }
    }
}

#[test]
fn fully_hidden_rows_give_the_output_bias() {
    let w = Weights::<12, 12, 12>::random(12, [true; 4]);
    let bo = w.biases.bo.clone().unwrap();
    let x = input::<2, 5, 12>(13);
    let opts = Opts {
        key_lengths: Some(vec![3, 0]),
        ..Opts::default()
    };
    for masking in BOTH {
        let y = check_self(&w, 4, masking, &x, &opts, "length 0 with biases");
        for t in 0..5 {
            assert_eq!(&y[(5 + t) * 12..][..12], bo.as_slice(), "token {t}");
        }
    }
}

/// The smallest reproduction of the key-padding-mask bug: one head of width 2, identity
/// weights, bidirectional, two tokens, key 1 masked out. Query 0 can only see key 0, so its
/// output is exactly token 0.
#[test]
fn key_padding_mask_hides_a_key_minimal() {
    use mha::{Matrix, Mha, MhaParams};
    let id = Matrix::<2, 2>::identity();
    let params = MhaParams::new(id.clone(), id.clone(), id.clone(), id);
    let mut layer = Mha::builder(&params, 1)
        .masking(Masking::Bidirectional)
        .threads(1)
        .build()
        .unwrap();
    let x = Tensor::from([[[1.0, 0.0], [0.0, 1.0]]]);
    let mut out = Tensor::<1, 2, 2>::zeros();
    let options = AttendOptions {
        key_padding_mask: Some(&[true, false]),
        ..AttendOptions::default()
    };
    layer.forward_into(&x, options, &mut out).unwrap();
    assert_eq!(
        out.token(0, 0).unwrap(),
        &[1.0, 0.0],
        "query 0 must only see key 0"
    );
    assert_eq!(
        out.token(0, 1).unwrap(),
        &[1.0, 0.0],
        "query 1 must only see key 0"
    );
}

#[test]
fn key_padding_mask_with_holes() {
    let w = Weights::<12, 12, 12>::random(14, [false; 4]);
    let x = input::<2, 7, 12>(15);
    #[rustfmt::skip]
    let masks = [
        // Holes in the middle, the first key hidden, everything hidden for element 1.
        [true, false, true, true, false, false, true,   false, true, true, false, true, true, true],
        [false, true, true, true, true, true, true,     false, false, false, false, false, false, false],
        [true, true, true, true, true, true, false,     true, false, false, false, false, false, true],
    ];
    for masking in BOTH {
        for (index, mask) in masks.iter().enumerate() {
            let opts = Opts {
                key_padding_mask: Some(mask.to_vec()),
                ..Opts::default()
            };
            check_self(&w, 3, masking, &x, &opts, &format!("padding mask {index}"));
        }
    }
}

/// A bool mask of `n` entries, about `keep` of them true, with row `hidden_row` (of `s` keys,
/// in every `(T, S)` block) all false.
fn bool_mask(seed: u64, n: usize, s: usize, t: usize, hidden_row: usize) -> Vec<bool> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|e| e / s % t != hidden_row && rng.uniform() > -0.4)
        .collect()
}

/// An additive mask: finite values in [-2, 2), some `-inf`, row `hidden_row` all `-inf`.
fn additive_mask(seed: u64, n: usize, s: usize, t: usize, hidden_row: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|e| {
            let u = rng.uniform();
            if e / s % t == hidden_row || u < -0.7 {
                f32::NEG_INFINITY
            } else {
                2.0 * u
            }
        })
        .collect()
}

#[test]
fn bool_masks_shared_and_per_batch() {
    const B: usize = 2;
    const T: usize = 6;
    let w = Weights::<10, 10, 10>::random(16, [false; 4]);
    let x = input::<B, T, 10>(17);
    for masking in BOTH {
        for n in [T * T, B * T * T] {
            let opts = Opts {
                mask: Some(Mask::Bool(bool_mask(18, n, T, T, 2))),
                ..Opts::default()
            };
            check_self(&w, 5, masking, &x, &opts, &format!("bool mask of {n}"));
        }
        // All false: every row sees nothing.
        let opts = Opts {
            mask: Some(Mask::Bool(vec![false; T * T])),
            ..Opts::default()
        };
        let y = check_self(&w, 2, masking, &x, &opts, "bool mask all false");
        assert!(y.iter().all(|&v| v == 0.0));
    }
}

#[test]
fn additive_masks_shared_and_per_batch() {
    const B: usize = 3;
    const T: usize = 5;
    let w = Weights::<12, 12, 12>::random(19, [false; 4]);
    let x = input::<B, T, 12>(20);
    for masking in BOTH {
        for n in [T * T, B * T * T] {
            let opts = Opts {
                mask: Some(Mask::Additive(additive_mask(21, n, T, T, 4))),
                ..Opts::default()
            };
            check_self(&w, 3, masking, &x, &opts, &format!("additive mask of {n}"));
        }
        // All zero: the same as no mask, bit for bit.
        let opts = Opts {
            mask: Some(Mask::Additive(vec![0.0; T * T])),
            ..Opts::default()
        };
        let zero = check_self(&w, 3, masking, &x, &opts, "additive mask all 0");
        let none = check_self(&w, 3, masking, &x, &Opts::default(), "no mask");
        assert_eq!(zero, none);
    }
}

#[test]
fn combinations() {
    const B: usize = 3;
    const T: usize = 7;
    let w = Weights::<12, 12, 12>::random(22, [true, false, true, false]);
    let x = input::<B, T, 12>(23);
    let mut rng = Rng::new(24);
    let padding: Vec<bool> = (0..B * T).map(|_| rng.uniform() > -0.5).collect();
    for masking in BOTH {
        for (index, mask) in [
            None,
            Some(Mask::Bool(bool_mask(25, T * T, T, T, 3))),
            Some(Mask::Bool(bool_mask(26, B * T * T, T, T, 0))),
            Some(Mask::Additive(additive_mask(27, T * T, T, T, 6))),
            Some(Mask::Additive(additive_mask(28, B * T * T, T, T, 1))),
        ]
        .into_iter()
        .enumerate()
        {
            let mut opts = Opts {
                key_lengths: Some(vec![5, 7, 0]),
                key_padding_mask: None,
                mask,
            };
            check_self(&w, 3, masking, &x, &opts, &format!("combination {index}"));
            opts.key_lengths = Some(vec![2, 6, 7]);
            check_self(&w, 4, masking, &x, &opts, &format!("combination {index}b"));
            opts.key_padding_mask = Some(padding.clone());
            check_self(&w, 4, masking, &x, &opts, &format!("combination {index}c"));
        }
    }
}

/// Long enough for two query blocks and two key blocks of 96, on two threads (the helpers set
/// `min_work_per_thread(0)`, so every phase really uses them).
#[test]
fn combinations_past_the_blocks_with_two_threads() {
    const B: usize = 2;
    const T: usize = 131;
    const D: usize = 48;
    let w = Weights::<D, D, D>::random(29, [true; 4]);
    let x = input::<B, T, D>(30);
    let mut rng = Rng::new(31);
    let padding: Vec<bool> = (0..B * T).map(|_| rng.uniform() > -0.8).collect();
    for masking in BOTH {
        let mut opts = Opts {
            key_lengths: Some(vec![129, 70]),
            key_padding_mask: None,
            mask: Some(Mask::Additive(additive_mask(32, T * T, T, T, 100))),
        };
        check_self(&w, 4, masking, &x, &opts, "long combination");
        opts.key_padding_mask = Some(padding.clone());
        check_self(
            &w,
            4,
            masking,
            &x,
            &opts,
            "long combination with padding mask",
        );
    }
}

#[test]
fn forward_with_default_options_is_forward() {
    let w = Weights::<12, 12, 12>::random(33, [true; 4]);
    let x = input::<2, 5, 12>(34);
    for masking in BOTH {
        let mut layer = w.layer(3, masking, mha::Isa::detect(), 1);
        let mut out = Tensor::zeros();
        layer
            .forward_into(&x, AttendOptions::default(), &mut out)
            .unwrap();
        assert_eq!(out, layer.forward(&x).unwrap());
    }
}

/// Hugging Face models mask with the most negative finite `f32` rather than `-inf`: a row of
/// only such entries attends uniformly (as the reference does), a mixed row ignores them.
#[test]
fn additive_mask_with_the_most_negative_finite_value() {
    const T: usize = 5;
    let w = Weights::<12, 12, 12>::random(35, [false; 4]);
    let x = input::<2, T, 12>(36);
    let additive: Vec<f32> = (0..T * T)
        .map(|e| {
            if e / T == 1 || e % 3 == 0 {
                f32::MIN
            } else {
                0.0
            }
        })
        .collect();
    let opts = Opts {
        mask: Some(Mask::Additive(additive)),
        ..Opts::default()
    };
    check_self(&w, 3, Masking::Bidirectional, &x, &opts, "f32::MIN mask");
}
