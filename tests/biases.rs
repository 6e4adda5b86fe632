//! Projection biases `bq, bk, bv, bo`, each alone and all together, in self-attention,
//! cross-attention and grouped-query attention, against the general f64 reference. Every
//! supported instruction set, 1 and 2 threads.
//!
//! Tolerance: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{check_cross, check_self, input, Opts, Weights, BOTH};
use mha::Masking;

/// No bias, each alone, all four.
const SETS: [[bool; 4]; 6] = [
    [false, false, false, false],
    [true, false, false, false],
    [false, true, false, false],
    [false, false, true, false],
    [false, false, false, true],
    [true, true, true, true],
];

#[test]
fn each_bias_alone_and_all_self_attention() {
    for (index, set) in SETS.into_iter().enumerate() {
        let w = Weights::<12, 12, 12>::random(100 + index as u64, set);
        for masking in BOTH {
            let context = format!("biases {set:?}");
            check_self(
                &w,
                3,
                masking,
                &input::<2, 7, 12>(1),
                &Opts::default(),
                &context,
            );
        }
    }
}

#[test]
fn each_bias_alone_and_all_cross_and_grouped() {
    for (index, set) in SETS.into_iter().enumerate() {
        let context = format!("biases {set:?}");
        let w = Weights::<12, 10, 6>::random(200 + index as u64, set);
        let x = input::<2, 5, 12>(2);
        let memory = input::<2, 7, 10>(3);
        check_cross(
            &w,
            6,
            Masking::Bidirectional,
            &x,
            &memory,
            &Opts::default(),
            &context,
        );
        let w = Weights::<12, 12, 4>::random(300 + index as u64, set);
        check_self(
            &w,
            3,
            Masking::Causal,
            &input::<3, 5, 12>(4),
            &Opts::default(),
            &context,
        );
    }
}

#[test]
fn key_bias_alone_changes_nothing() {
    // With bk alone, each query's scores shift by q·bk, the same for every key, so the
    // softmax (and the output) does not change: a property independent of the reference.
    let plain = Weights::<12, 12, 12>::random(400, [false; 4]);
    let mut biased = Weights::<12, 12, 12>::random(400, [false; 4]);
    biased.biases.bk = Some(mha::Matrix::from_fn(|_, c| c as f32 * 0.3 - 1.0));
    let x = input::<2, 6, 12>(5);
    let a = check_self(
        &plain,
        3,
        Masking::Bidirectional,
        &x,
        &Opts::default(),
        "no bk",
    );
    let b = check_self(
        &biased,
        3,
        Masking::Bidirectional,
        &x,
        &Opts::default(),
        "bk",
    );
    common::assert_close(&a, &common::widen(&b), 1e-5, 1e-5, "bk changes nothing");
}
