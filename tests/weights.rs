//! Attention weights out: `(B, H, T, S)` probabilities against the general f64 reference (also
//! checked by every mode test through `check_all`), rows summing to 1 or all zero, the mean
//! over heads, look-ups, and one buffer reused across calls of other shapes.
//!
//! Tolerance: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{check_weights, input, output, Opts, Weights, BOTH};
use common::reference_attend;
use mha::{AttendOptions, AttentionWeights, Masking, Tensor};

#[test]
fn probabilities_match_the_reference_with_hidden_rows() {
    const B: usize = 2;
    const T: usize = 5;
    let w = Weights::<12, 12, 4>::random(1, [true; 4]);
    let x = input::<B, T, 12>(2);
    let opts = Opts {
        key_lengths: Some(vec![0, 3]),
        ..Opts::default()
    };
    for masking in BOTH {
        let mut a = w.attend(B, T, 3, x.as_slice(), None, masking);
        opts.apply(&mut a);
        let want = reference_attend(&a);
        let mut layer = w.layer(3, masking, mha::Isa::detect(), 1);
        let mut weights = AttentionWeights::new();
        let mut out = Tensor::<B, T, 12>::zeros();
        layer
            .forward_into(&x, opts.options(), output(&mut out, Some(&mut weights)))
            .unwrap();
        check_weights(&weights, &want, [B, 3, T, T], "weights");
        // Batch element 0 sees nothing: all zero.
        assert!(weights.as_slice()[..3 * T * T].iter().all(|&p| p == 0.0));
        assert_eq!(weights.get(1, 2, 4, 2).map(|p| p > 0.0), Some(true));
        assert_eq!(weights.get(1, 2, 4, 3), Some(0.0));
        assert_eq!(weights.get(2, 0, 0, 0), None);
        assert_eq!(weights.get(0, 3, 0, 0), None);
        assert_eq!(weights.get(0, 0, T, 0), None);
        assert_eq!(weights.get(0, 0, 0, T), None);
        assert!(weights.head(0, 3).is_none());
        assert!(weights.head(2, 0).is_none());
    }
}

#[test]
fn one_buffer_reused_across_shapes() {
    let w = Weights::<12, 10, 12>::random(3, [false; 4]);
    let mut layer = w.layer(3, Masking::Bidirectional, mha::Isa::detect(), 1);
    let mut weights = AttentionWeights::new();
    assert_eq!(weights.shape(), [0; 4]);
    assert!(weights.mean_over_heads().is_empty());

    let (x, memory) = (input::<2, 5, 12>(4), input::<2, 7, 10>(5));
    let mut out = Tensor::<2, 5, 12>::zeros();
    let options = AttendOptions::default();
    layer
        .cross_into(&x, &memory, options, output(&mut out, Some(&mut weights)))
        .unwrap();
    assert_eq!(weights.shape(), [2, 3, 5, 7]);
    assert_eq!(weights.as_slice().len(), 2 * 3 * 5 * 7);

    // Smaller: the shape and the length follow.
    let (x, memory) = (input::<1, 2, 12>(6), input::<1, 3, 10>(7));
    let mut out = Tensor::<1, 2, 12>::zeros();
    let options = AttendOptions::default();
    layer
        .cross_into(&x, &memory, options, output(&mut out, Some(&mut weights)))
        .unwrap();
    assert_eq!(weights.shape(), [1, 3, 2, 3]);
    assert_eq!(weights.as_slice().len(), 3 * 2 * 3);
    let a = w.attend(
        1,
        2,
        3,
        x.as_slice(),
        Some((3, memory.as_slice())),
        Masking::Bidirectional,
    );
    check_weights(&weights, &reference_attend(&a), [1, 3, 2, 3], "reused");

    // A failed call leaves the buffer alone.
    let before = weights.clone();
    let options = AttendOptions {
        key_lengths: Some(&[4]),
        ..AttendOptions::default()
    };
    let output = output(&mut out, Some(&mut weights));
    assert!(layer.cross_into(&x, &memory, options, output).is_err());
    assert_eq!(weights, before);
}

#[test]
fn mean_over_heads_averages() {
    let w = Weights::<8, 8, 8>::random(8, [false; 4]);
    let x = input::<2, 3, 8>(9);
    let mut layer = w.layer(4, Masking::Causal, mha::Isa::detect(), 1);
    let mut weights = AttentionWeights::new();
    let mut out = Tensor::<2, 3, 8>::zeros();
    let options = AttendOptions::default();
    layer
        .forward_into(&x, options, output(&mut out, Some(&mut weights)))
        .unwrap();
    let mean = weights.mean_over_heads();
    for b in 0..2 {
        for i in 0..3 {
            for j in 0..3 {
                let sum: f32 = (0..4).map(|h| weights.get(b, h, i, j).unwrap()).sum();
                assert!((mean[(b * 3 + i) * 3 + j] - sum / 4.0).abs() < 1e-6);
            }
            let row: f32 = mean[(b * 3 + i) * 3..][..3].iter().sum();
            assert!((row - 1.0).abs() < 1e-5);
        }
    }
}
