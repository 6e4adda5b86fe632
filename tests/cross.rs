//! Cross-attention (`cross_into`) against the general f64 reference: S ≠ T and E ≠ D, S < T
//! with causal order aligned bottom-right (the first queries see nothing), E = D through both
//! of the layer's weight layouts, and with key lengths, padding masks and masks over (T, S).
//! Every supported instruction set, 1 and 2 threads.
//!
//! Tolerance: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{check_cross, input, Mask, Opts, Weights, BOTH};
use common::Rng;
use mha::Masking;

#[test]
fn s_and_e_differ_from_t_and_d() {
    let w = Weights::<12, 10, 12>::random(1, [false; 4]);
    let x = input::<2, 5, 12>(2);
    let memory = input::<2, 7, 10>(3);
    for masking in BOTH {
        check_cross(&w, 3, masking, &x, &memory, &Opts::default(), "D12 E10");
    }
    // One query, one key; E wider than D.
    let w = Weights::<6, 9, 6>::random(4, [false; 4]);
    for masking in BOTH {
        check_cross(
            &w,
            2,
            masking,
            &input::<1, 1, 6>(5),
            &input::<1, 1, 9>(6),
            &Opts::default(),
            "T1 S1",
        );
    }
}

#[test]
fn fewer_keys_than_queries() {
    let w = Weights::<12, 10, 12>::random(7, [false; 4]);
    let x = input::<2, 7, 12>(8);
    let memory = input::<2, 3, 10>(9);
    for masking in BOTH {
        let y = check_cross(&w, 3, masking, &x, &memory, &Opts::default(), "S3 T7");
        if masking == Masking::Causal {
            // Bottom-right alignment: query i sees key j iff j <= i + 3 - 7, so queries 0..4
            // see nothing and get zeros.
            for b in 0..2 {
                assert!(y[b * 7 * 12..][..4 * 12].iter().all(|&v| v == 0.0));
            }
        }
    }
}

#[test]
fn memory_as_wide_as_the_model() {
    // D = 16 is a whole number of 8-column panels (the fused weights' window), D = 12 is not.
    let w = Weights::<16, 16, 16>::random(10, [false; 4]);
    for masking in BOTH {
        check_cross(
            &w,
            4,
            masking,
            &input::<2, 3, 16>(11),
            &input::<2, 9, 16>(12),
            &Opts::default(),
            "E=D=16",
        );
    }
    let w = Weights::<12, 12, 12>::random(13, [false; 4]);
    for masking in BOTH {
        check_cross(
            &w,
            2,
            masking,
            &input::<1, 4, 12>(14),
            &input::<1, 6, 12>(15),
            &Opts::default(),
            "E=D=12",
        );
    }
}

#[test]
fn with_options() {
    const B: usize = 2;
    const T: usize = 5;
    const S: usize = 7;
    let w = Weights::<12, 10, 12>::random(16, [true; 4]);
    let x = input::<B, T, 12>(17);
    let memory = input::<B, S, 10>(18);
    let mut rng = Rng::new(19);
    let bools: Vec<bool> = (0..B * T * S).map(|_| rng.uniform() > -0.3).collect();
    let additive: Vec<f32> = (0..T * S)
        .map(|e| {
            if e % 4 == 1 {
                f32::NEG_INFINITY
            } else {
                rng.uniform()
            }
        })
        .collect();
    for masking in BOTH {
        for (index, opts) in [
            Opts {
                key_lengths: Some(vec![7, 2]),
                ..Opts::default()
            },
            Opts {
                key_lengths: Some(vec![0, 4]),
                mask: Some(Mask::Bool(bools[..T * S].to_vec())),
                ..Opts::default()
            },
            Opts {
                mask: Some(Mask::Bool(bools.clone())),
                ..Opts::default()
            },
            Opts {
                key_lengths: Some(vec![6, 7]),
                mask: Some(Mask::Additive(additive.clone())),
                ..Opts::default()
            },
        ]
        .iter()
        .enumerate()
        {
            check_cross(
                &w,
                3,
                masking,
                &x,
                &memory,
                opts,
                &format!("options {index}"),
            );
        }
    }
}

#[test]
fn with_key_padding_mask() {
    const B: usize = 2;
    const S: usize = 7;
    let w = Weights::<12, 10, 12>::random(20, [false; 4]);
    let x = input::<B, 5, 12>(21);
    let memory = input::<B, S, 10>(22);
    let padding = vec![
        true, false, true, false, true, true, false, false, true, true, true, true, true, false,
    ];
    for masking in BOTH {
        let opts = Opts {
            key_padding_mask: Some(padding.clone()),
            ..Opts::default()
        };
        check_cross(&w, 3, masking, &x, &memory, &opts, "padding mask");
    }
}

/// No memory tokens at all: every query sees nothing, so the output is the output bias.
#[test]
fn empty_memory() {
    let w = Weights::<12, 10, 12>::random(30, [true; 4]);
    let bo = w.biases.bo.clone().unwrap();
    let x = input::<2, 3, 12>(31);
    let memory = input::<2, 0, 10>(32);
    for masking in BOTH {
        let opts = Opts {
            key_lengths: Some(vec![0, 0]),
            ..Opts::default()
        };
        for opts in [Opts::default(), opts] {
            let y = check_cross(&w, 3, masking, &x, &memory, &opts, "S0");
            for row in y.chunks(12) {
                assert_eq!(row, bo.as_slice());
            }
        }
    }
}
