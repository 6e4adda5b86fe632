//! Grouped-query and multi-query attention against the general f64 reference: 1, 2 and H
//! key/value heads, self- and cross-attention, with masks; head counts that are not a whole
//! number of heads or do not divide H are `Err(ShapeError::KvHeads)` with its message. Every
//! supported instruction set, 1 and 2 threads.
//!
//! Tolerance: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{check_cross, check_self, input, Mask, Opts, Weights, BOTH};
use mha::{Masking, Matrix, Mha, MhaParams, ShapeError};

/// D = 12, H = 6 (d = 2): KV = 2 is multi-query (1 kv head), KV = 4 grouped (2), KV = 12 plain.
fn self_case<const KV: usize>(n_kv: usize) {
    let w = Weights::<12, 12, KV>::random(KV as u64, [false; 4]);
    let layer = w.layer(6, Masking::Causal, mha::Isa::detect(), 1);
    assert_eq!(layer.n_kv_heads(), n_kv);
    assert_eq!(layer.n_heads(), 6);
    assert_eq!(layer.head_dim(), 2);
    let x = input::<2, 7, 12>(1);
    let opts = Opts {
        key_lengths: Some(vec![7, 4]),
        mask: Some(Mask::Bool((0..49).map(|e| e % 5 != 2).collect())),
        ..Opts::default()
    };
    for masking in BOTH {
        let context = format!("{n_kv} kv heads");
        check_self(&w, 6, masking, &x, &Opts::default(), &context);
        check_self(&w, 6, masking, &x, &opts, &context);
    }
}

#[test]
fn one_two_and_all_kv_heads_self_attention() {
    self_case::<2>(1);
    self_case::<4>(2);
    self_case::<6>(3);
    self_case::<12>(6);
}

fn cross_case<const KV: usize>() {
    let w = Weights::<12, 10, KV>::random(50 + KV as u64, [true; 4]);
    let x = input::<2, 5, 12>(2);
    let memory = input::<2, 7, 10>(3);
    let opts = Opts {
        key_lengths: Some(vec![3, 7]),
        ..Opts::default()
    };
    for masking in BOTH {
        check_cross(&w, 6, masking, &x, &memory, &Opts::default(), "gqa cross");
        check_cross(&w, 6, masking, &x, &memory, &opts, "gqa cross");
    }
}

#[test]
fn one_two_and_all_kv_heads_cross_attention() {
    cross_case::<2>();
    cross_case::<4>();
    cross_case::<12>();
}

#[test]
fn single_query_head_is_multi_query() {
    let w = Weights::<9, 9, 9>::random(60, [false; 4]);
    check_self(
        &w,
        1,
        Masking::Causal,
        &input::<2, 5, 9>(4),
        &Opts::default(),
        "H1",
    );
}

fn kv_error<const D: usize, const KV: usize>(h: usize) -> ShapeError {
    let p = MhaParams::from_parts(
        Matrix::<D, D>::zeros(),
        Matrix::<D, KV>::zeros(),
        Matrix::<D, KV>::zeros(),
        Matrix::<D, D>::zeros(),
    );
    Mha::builder(&p, h).build().expect_err("bad kv heads")
}

#[test]
fn kv_width_not_whole_heads_or_not_dividing_is_an_error() {
    let message = |kv, d, h| {
        format!(
            "key/value width {kv} is not n_kv_heads x head_dim {d} for a head count n_kv_heads dividing n_heads {h}"
        )
    };
    // Not a whole number of heads of width 2.
    let e = kv_error::<12, 3>(6);
    assert_eq!(
        e,
        ShapeError::KvHeads {
            kv_width: 3,
            head_dim: 2,
            n_heads: 6
        }
    );
    assert_eq!(e.to_string(), message(3, 2, 6));
    // 4 kv heads do not divide 6.
    let e = kv_error::<12, 8>(6);
    assert_eq!(
        e,
        ShapeError::KvHeads {
            kv_width: 8,
            head_dim: 2,
            n_heads: 6
        }
    );
    assert_eq!(e.to_string(), message(8, 2, 6));
    // More kv heads than query heads.
    let e = kv_error::<12, 24>(6);
    assert_eq!(
        e,
        ShapeError::KvHeads {
            kv_width: 24,
            head_dim: 2,
            n_heads: 6
        }
    );
    // No kv head at all.
    let e = kv_error::<12, 0>(3);
    assert_eq!(
        e,
        ShapeError::KvHeads {
            kv_width: 0,
            head_dim: 4,
            n_heads: 3
        }
    );
    assert_eq!(e.to_string(), message(0, 4, 3));
    // The head count itself is checked first.
    assert_eq!(kv_error::<12, 4>(0), ShapeError::ZeroHeads);
    assert_eq!(
        kv_error::<12, 4>(5),
        ShapeError::NotDivisible {
            d_model: 12,
            n_heads: 5
        }
    );
}
