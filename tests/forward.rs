//! `mha_forward` and the `Mha` layer against the independent f64 plain-loop reference, on
//! shapes covering d = 1 (H = D), H = 1, T = 1, odd T and D, B > 1, T past the 96-row query
//! and key blocks, and keys and values past the size from which the attention prefetches, for
//! every supported instruction set and thread counts 1, 2 and 3.
//!
//! Tolerance: |got - want| <= 1e-4 + 1e-4 * |want| elementwise (inputs uniform in [-1, 1),
//! weights uniform with variance 1/D, so outputs are O(1)).

mod common;

use common::{assert_bits_eq, assert_close, reference_mha, weights, Rng};
use mha::{mha_forward, Isa, Matrix, Mha, MhaParams, Tensor};

/// Absolute tolerance against the f64 reference.
const ABS: f64 = 1e-4;
/// Relative tolerance against the f64 reference.
const REL: f64 = 1e-4;

fn check<const B: usize, const T: usize, const D: usize>(h: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let x = Tensor::<B, T, D>::from_vec(rng.vec(B * T * D, 1.0)).unwrap();
    let w: Vec<Matrix<D, D>> = (0..4)
        .map(|_| Matrix::from_vec(weights(&mut rng, D)).unwrap())
        .collect();
    let p = MhaParams::new(w[0].clone(), w[1].clone(), w[2].clone(), w[3].clone());
    let want = reference_mha(
        x.as_slice(),
        w[0].as_slice(),
        w[1].as_slice(),
        w[2].as_slice(),
        w[3].as_slice(),
        B,
        T,
        D,
        h,
    );
    let shape = format!("B{B} T{T} D{D} H{h}");

    let y = mha_forward(&x, &p, h).unwrap();
    assert_close(
        y.as_slice(),
        &want,
        ABS,
        REL,
        &format!("mha_forward {shape}"),
    );

    let mut supported = 0;
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        supported += 1;
        for threads in [1, 2, 3] {
            let context = format!("{isa:?} threads {threads} {shape}");
            let mut layer = Mha::builder(&p, h)
                .isa(isa)
                .threads(threads)
                .min_work_per_thread(0)
                .build()
                .unwrap();
            assert_eq!(layer.isa(), isa, "{context}");
            assert_eq!(layer.threads(), threads, "{context}");
            assert_eq!(layer.n_heads(), h, "{context}");
            assert_eq!(layer.head_dim(), D / h, "{context}");
            let y = layer.forward(&x).unwrap();
            assert_close(y.as_slice(), &want, ABS, REL, &context);
            // forward_into into a buffer full of garbage writes every element.
            let mut into = Tensor::<B, T, D>::from_fn(|_, _, _| f32::NAN);
            layer
                .forward_into(&x, mha::AttendOptions::default(), &mut into)
                .unwrap();
            assert_bits_eq(
                into.as_slice(),
                y.as_slice(),
                &format!("forward_into {context}"),
            );
        }
    }
    assert!(supported >= 1, "Isa::Portable must always be supported");
}

#[test]
fn one_token_one_feature() {
    check::<1, 1, 1>(1, 1);
}

#[test]
fn seed_sized() {
    check::<1, 2, 4>(2, 2);
}

#[test]
fn head_width_one_odd() {
    check::<1, 3, 5>(5, 3);
}

#[test]
fn batch_two_odd_tokens() {
    check::<2, 7, 6>(3, 4);
}

#[test]
fn single_head_odd_width() {
    check::<3, 5, 9>(1, 5);
}

#[test]
fn seventeen_tokens() {
    check::<1, 17, 12>(4, 6);
}

#[test]
fn thirty_three_tokens_batch_two() {
    check::<2, 33, 10>(2, 7);
}

#[test]
fn sixty_five_tokens_sixteen_features() {
    check::<1, 65, 16>(8, 8);
}

#[test]
fn batch_four_odd_width() {
    check::<4, 9, 15>(5, 9);
}

#[test]
fn one_hundred_thirty_tokens_wide_heads() {
    // More than one query block, on two and three threads.
    check::<1, 130, 64>(2, 10);
}

#[test]
fn ninety_six_tokens_exactly_one_block() {
    check::<2, 96, 32>(4, 11);
}

#[test]
fn ninety_seven_tokens_one_past_a_block() {
    check::<1, 97, 16>(2, 15);
}

/// Keys and values past the size from which the attention prefetches each next key block
/// (1 MiB per batch element: 1024 tokens × 128 features × K and V × 4 bytes). The layer is
/// causal, so its first `P` output rows depend only on the first `P` tokens: they are checked
/// against the reference run on those tokens (which keeps the f64 reference cheap), and the
/// whole output is bit-identical on 1 and 2 threads.
#[test]
fn keys_and_values_past_the_prefetch_size() {
    const T: usize = 1024;
    const D: usize = 128;
    const P: usize = 200;
    let h = 2;
    let mut rng = Rng::new(16);
    let x = Tensor::<1, T, D>::from_vec(rng.vec(T * D, 1.0)).unwrap();
    let w: Vec<Matrix<D, D>> = (0..4)
        .map(|_| Matrix::from_vec(weights(&mut rng, D)).unwrap())
        .collect();
    let p = MhaParams::new(w[0].clone(), w[1].clone(), w[2].clone(), w[3].clone());
    let [wq, wk, wv, wo] = [0, 1, 2, 3].map(|i| w[i].as_slice());
    let want = reference_mha(&x.as_slice()[..P * D], wq, wk, wv, wo, 1, P, D, h);
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        let run = |threads| {
            let mut layer = Mha::builder(&p, h)
                .isa(isa)
                .threads(threads)
                .min_work_per_thread(0)
                .build()
                .unwrap();
            layer.forward(&x).unwrap()
        };
        let one = run(1);
        let context = format!("{isa:?} T{T} D{D} first {P} rows");
        assert_close(&one.as_slice()[..P * D], &want, ABS, REL, &context);
        assert_bits_eq(one.as_slice(), run(2).as_slice(), &context);
    }
}

#[test]
fn one_hundred_tokens_twelve_heads() {
    check::<1, 100, 48>(12, 12);
}

#[test]
fn one_token_many_heads() {
    check::<3, 1, 24>(24, 13);
}

#[test]
fn prime_everything() {
    check::<3, 67, 7>(7, 14);
}
