//! Layers whose heads are not `D / H` wide (`H · head_dim = Q ≠ D`, as in Qwen3 and Gemma):
//! `Wq (D, Q)`, `Wo (Q, D)`, `bq (1, Q)`, keys and values `Hkv · head_dim` wide. Self- and
//! cross-attention, plain and grouped heads, with biases and options, against the general f64
//! reference; decoding is in `tests/cache.rs`. A query width the head count does not divide is
//! `Err(ShapeError::QueryNotDivisible)` naming both. Every supported instruction set, 1 and 2
//! threads.
//!
//! Tolerance: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{check_cross, check_self, input, Mask, Opts, Weights, BOTH};
use mha::{Masking, Matrix, Mha, MhaParams, ShapeError, Tensor};

/// Biases: none, and all four.
const BIASES: [[bool; 4]; 2] = [[false; 4], [true; 4]];

/// Key lengths and a boolean mask over `(7, 7)`.
fn options() -> Opts {
    Opts {
        key_lengths: Some(vec![7, 5]),
        mask: Some(Mask::Bool((0..49).map(|e| e % 4 != 1).collect())),
        ..Opts::default()
    }
}

/// D = 10, H = 3 heads of 6 (Q = 18): KV = 18 is plain multi-head, KV = 6 one key/value
/// head. Also Q < D: D = 12, H = 2 heads of 3 (Q = 6), KV = 3.
#[test]
fn self_attention_against_the_reference() {
    for (index, biases) in BIASES.into_iter().enumerate() {
        let seed = 10 * index as u64;
        let x = input::<2, 7, 10>(seed + 1);
        let wide = Weights::<10, 10, 18, 18>::random(seed + 2, biases);
        let grouped = Weights::<10, 10, 6, 18>::random(seed + 3, biases);
        let narrow = Weights::<12, 12, 3, 6>::random(seed + 4, biases);
        let narrow_x = input::<2, 7, 12>(seed + 5);
        for masking in BOTH {
            let context = format!("biases {biases:?}");
            for opts in [Opts::default(), options()] {
                check_self(&wide, 3, masking, &x, &opts, &context);
                check_self(&grouped, 3, masking, &x, &opts, &context);
                check_self(&narrow, 2, masking, &narrow_x, &opts, &context);
            }
        }
    }
}

/// Keys and values from a memory of width E = 7, and E = D, where `[Wk | Wv]` is either a
/// window of the packed `[Wq | Wk | Wv]` (Q = 32, a whole number of panels) or packed apart
/// (Q = 18).
#[test]
fn cross_attention_against_the_reference() {
    let x = input::<2, 5, 10>(20);
    let memory = input::<2, 6, 7>(21);
    let same_width = input::<2, 6, 10>(22);
    let opts = Opts {
        key_lengths: Some(vec![6, 2]),
        ..Opts::default()
    };
    for biases in BIASES {
        let context = format!("biases {biases:?}");
        let from_memory = Weights::<10, 7, 6, 18>::random(23, biases);
        let window = Weights::<10, 10, 16, 32>::random(24, biases);
        let apart = Weights::<10, 10, 6, 18>::random(25, biases);
        for masking in BOTH {
            for opts in [&Opts::default(), &opts] {
                check_cross(&from_memory, 3, masking, &x, &memory, opts, &context);
                check_cross(&window, 4, masking, &x, &same_width, opts, &context);
                check_cross(&apart, 3, masking, &x, &same_width, opts, &context);
            }
        }
    }
}

/// `forward` (compile-time shapes) and `forward_into` agree bit for bit, and the layer reports
/// its head widths.
#[test]
fn forward_equals_forward_into_and_accessors() {
    let w = Weights::<10, 10, 6, 18>::random(30, [true; 4]);
    let mut layer = w.layer(3, Masking::Causal, mha::Isa::detect(), 2);
    assert_eq!(
        (layer.n_heads(), layer.n_kv_heads(), layer.head_dim()),
        (3, 1, 6)
    );
    let x = input::<3, 9, 10>(31);
    let mut out = Tensor::<3, 9, 10>::zeros();
    layer
        .forward_into(&x, mha::AttendOptions::default(), &mut out)
        .unwrap();
    common::assert_bits_eq(
        layer.forward(&x).unwrap().as_slice(),
        out.as_slice(),
        "forward",
    );
}

/// A query width the head count does not divide names both numbers; a key/value width that is
/// not whole heads of `Q / H` names the head width.
#[test]
fn query_width_not_divisible_is_an_error() {
    let params = MhaParams::from_parts(
        Matrix::<10, 18>::zeros(),
        Matrix::<10, 6>::zeros(),
        Matrix::<10, 6>::zeros(),
        Matrix::<18, 10>::zeros(),
    );
    let error = Mha::builder(&params, 4).build().unwrap_err();
    assert_eq!(
        error,
        ShapeError::QueryNotDivisible {
            q_width: 18,
            n_heads: 4
        }
    );
    assert_eq!(
        error.to_string(),
        "query width 18 is not divisible by n_heads 4"
    );
    assert_eq!(
        Mha::builder(&params, 0).build().unwrap_err(),
        ShapeError::ZeroHeads
    );
    for n_heads in [7, usize::MAX] {
        assert_eq!(
            Mha::builder(&params, n_heads).build().unwrap_err(),
            ShapeError::QueryNotDivisible {
                q_width: 18,
                n_heads
            }
        );
    }
    // 3, 6 and 18 heads of 6, 3 and 1: KV = 6 is 1, 2 and 6 key/value heads.
    for (n_heads, n_kv) in [(3, 1), (6, 2), (18, 6)] {
        let layer = Mha::builder(&params, n_heads).build().unwrap();
        assert_eq!((layer.head_dim(), layer.n_kv_heads()), (18 / n_heads, n_kv));
    }
    // 2 heads of 9: KV = 6 is not a whole number of heads of 9.
    let error = Mha::builder(&params, 2).build().unwrap_err();
    assert_eq!(
        error,
        ShapeError::KvHeads {
            kv_width: 6,
            head_dim: 9,
            n_heads: 2
        }
    );
    // Q = D keeps the error naming d_model.
    let square = MhaParams::new(
        Matrix::<6, 6>::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
    );
    assert_eq!(
        Mha::builder(&square, 4).build().unwrap_err().to_string(),
        "d_model 6 is not divisible by n_heads 4"
    );
}
