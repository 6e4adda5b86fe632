//! Splitting the feature axis into heads and merging it back: the seed's worked example, the
//! wrong reading it warns about, the `(B, H, T, d)` layout against an independent index formula,
//! and `merge_heads(split_heads(x, h)) == x` bit for bit on random data over many shapes.

mod common;

use common::{assert_bits_eq, Rng};
use mha::{merge_heads, split_heads, Heads, Tensor};
use quickcheck::{QuickCheck, TestResult};

/// The seed's example: one text, T = 2 tokens, D = 4, the projected queries 0..8.
fn seed_x() -> Tensor<1, 2, 4> {
    Tensor::from([[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]])
}

/// `expected[h][t][j]` of the seed's example: head 0 = [[0, 1], [4, 5]], head 1 = [[2, 3], [6, 7]].
const SEED_HEADS: [[[f32; 2]; 2]; 2] = [[[0.0, 1.0], [4.0, 5.0]], [[2.0, 3.0], [6.0, 7.0]]];

fn check_seed_heads(heads: &Heads<1, 2, 4>, how: &str) {
    assert_eq!(heads.n_heads(), 2, "{how}");
    assert_eq!(heads.head_dim(), 2, "{how}");
    assert_eq!(heads.head(0, 0), Some(&[0.0, 1.0, 4.0, 5.0][..]), "{how}");
    assert_eq!(heads.head(0, 1), Some(&[2.0, 3.0, 6.0, 7.0][..]), "{how}");
    for (h, head) in SEED_HEADS.iter().enumerate() {
        for (t, token) in head.iter().enumerate() {
            for (j, &want) in token.iter().enumerate() {
                assert_eq!(heads.get(0, h, t, j), Some(want), "{how}: ({h}, {t}, {j})");
            }
        }
    }
    assert_eq!(
        heads.as_slice(),
        &[0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0],
        "{how}"
    );
}

#[test]
fn seed_example_split_heads() {
    let x = seed_x();
    let heads = split_heads(&x, 2).unwrap();
    check_seed_heads(&heads, "split_heads");
    assert_eq!(merge_heads(&heads), x);
}

#[test]
fn seed_example_split_heads_const() {
    let x = seed_x();
    let heads = x.split_heads_const::<2>();
    check_seed_heads(&heads, "split_heads_const::<2>");
    assert_eq!(heads, split_heads(&x, 2).unwrap());
    assert_eq!(merge_heads(&heads), x);
}

#[test]
fn seed_example_one_head_and_four_heads() {
    let x = seed_x();
    // One head: (B, 1, T, D), the buffer unchanged.
    let one = split_heads(&x, 1).unwrap();
    assert_eq!(one.head(0, 0), Some(x.as_slice()));
    assert_eq!(one.head(0, 1), None);
    // Four heads of width 1: head h is feature h of both tokens.
    let four = split_heads(&x, 4).unwrap();
    for h in 0..4 {
        let want = [h as f32, (4 + h) as f32];
        assert_eq!(four.head(0, h), Some(&want[..]), "head {h}");
    }
    assert_eq!(four.as_slice(), &[0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0]);
}

/// The wrong reading the seed warns about: reshape (B, T, H, d) read directly as (B, H, T, d),
/// with no transpose, makes head 0 the two halves of token 0.
#[test]
fn reshape_without_transpose_is_the_wrong_reading() {
    let x = seed_x();
    let wrong = Heads::<1, 2, 4>::from_vec(x.as_slice().to_vec(), 2).unwrap();
    assert_eq!(wrong.head(0, 0), Some(&[0.0, 1.0, 2.0, 3.0][..])); // [[0, 1], [2, 3]]
    assert_eq!(wrong.get(0, 0, 1, 0), Some(2.0));

    let right = split_heads(&x, 2).unwrap();
    assert_ne!(right.head(0, 0), wrong.head(0, 0));
    assert_ne!(right, wrong);
    assert_eq!(right.get(0, 0, 1, 0), Some(4.0));
    // Merging the wrong reading does not give x back either.
    assert_ne!(merge_heads(&wrong), x);
}

/// Every divisor of `d` (every head count for `d = 0`, up to 5).
fn divisors(d: usize) -> Vec<usize> {
    if d == 0 {
        return (1..=5).collect();
    }
    (1..=d).filter(|&h| d.is_multiple_of(h)).collect()
}

/// The layout of `split_heads` against `((b*H + h)*T + t)*d + j`, for every element and every
/// head count, on one shape. Values are the element's own index, so any misplacement shows.
fn check_layout<const B: usize, const T: usize, const D: usize>() {
    let x = Tensor::<B, T, D>::from_fn(|b, t, i| ((b * T + t) * D + i) as f32);
    for h in divisors(D) {
        let d = D / h;
        let heads = split_heads(&x, h).unwrap();
        let context = format!("B{B} T{T} D{D} H{h}");
        assert_eq!(heads.n_heads(), h, "{context}");
        assert_eq!(heads.head_dim(), d, "{context}");
        assert_eq!(heads.as_slice().len(), B * T * D, "{context}");
        for b in 0..B {
            for head in 0..h {
                let block = heads.head(b, head).unwrap();
                assert_eq!(block.len(), T * d, "{context}");
                for t in 0..T {
                    for j in 0..d {
                        let want = x.get(b, t, head * d + j).unwrap();
                        let flat = ((b * h + head) * T + t) * d + j;
                        assert_eq!(
                            heads.as_slice()[flat],
                            want,
                            "{context} ({b},{head},{t},{j})"
                        );
                        assert_eq!(heads.get(b, head, t, j), Some(want), "{context}");
                        assert_eq!(block[t * d + j], want, "{context}");
                    }
                }
            }
        }
        assert_eq!(merge_heads(&heads), x, "{context}");
    }
}

#[test]
fn split_layout_matches_index_formula() {
    check_layout::<1, 1, 1>();
    check_layout::<1, 2, 4>();
    check_layout::<2, 3, 6>();
    check_layout::<3, 5, 12>();
    check_layout::<1, 7, 30>();
    check_layout::<2, 13, 13>();
    check_layout::<4, 1, 16>();
    check_layout::<1, 11, 60>();
    check_layout::<2, 9, 64>();
    check_layout::<0, 3, 4>();
    check_layout::<2, 0, 6>();
}

/// Bit patterns worth planting: NaNs (quiet, signalling, negative, with payload), infinities,
/// signed zeros, subnormals, extremes.
const SPECIAL_BITS: [u32; 12] = [
    0x7fc0_0000, // quiet NaN
    0xffc0_0000, // negative quiet NaN
    0x7f80_0001, // signalling NaN
    0x7fbf_ffff, // NaN with payload
    0x7f80_0000, // +inf
    0xff80_0000, // -inf
    0x8000_0000, // -0.0
    0x0000_0000, // +0.0
    0x0000_0001, // smallest subnormal
    0x807f_ffff, // largest negative subnormal
    0x7f7f_ffff, // f32::MAX
    0xff7f_ffff, // f32::MIN
];

/// Builds a tensor from random bit patterns (seeded by quickcheck), then plants special values.
fn random_bits_tensor<const B: usize, const T: usize, const D: usize>(
    seed: u64,
    plants: &[(usize, u8)],
) -> Tensor<B, T, D> {
    let n = B * T * D;
    let mut rng = Rng::new(seed);
    let mut data: Vec<f32> = (0..n)
        .map(|_| f32::from_bits(rng.next_u64() as u32))
        .collect();
    if n > 0 {
        for &(at, which) in plants {
            data[at % n] = f32::from_bits(SPECIAL_BITS[usize::from(which) % SPECIAL_BITS.len()]);
        }
    }
    Tensor::from_vec(data).unwrap()
}

/// `merge_heads(split_heads(x, h)) == x` bit for bit, `h` a divisor of `D` picked by quickcheck,
/// and `split_heads_const::<H>` agrees with `split_heads(x, H)` bit for bit.
fn roundtrip<const B: usize, const T: usize, const D: usize, const H: usize>(
    seed: u64,
    plants: Vec<(usize, u8)>,
    pick: usize,
) -> TestResult {
    let x = random_bits_tensor::<B, T, D>(seed, &plants);
    let choices = divisors(D);
    let h = choices[pick % choices.len()];
    let heads = split_heads(&x, h).unwrap();
    let back = merge_heads(&heads);
    let context = format!("B{B} T{T} D{D} H{h}");
    assert_bits_eq(back.as_slice(), x.as_slice(), &context);
    let constant = x.split_heads_const::<H>();
    let runtime = split_heads(&x, H).unwrap();
    assert_bits_eq(constant.as_slice(), runtime.as_slice(), &context);
    assert_eq!(constant.n_heads(), H);
    assert_bits_eq(merge_heads(&constant).as_slice(), x.as_slice(), &context);
    TestResult::passed()
}

type Prop = fn(u64, Vec<(usize, u8)>, usize) -> TestResult;

macro_rules! roundtrip_shapes {
    ($($b:literal $t:literal $d:literal / $h:literal),+ $(,)?) => {
        $(
            QuickCheck::new()
                .tests(60)
                .quickcheck(roundtrip::<$b, $t, $d, $h> as Prop);
        )+
    };
}

#[test]
fn merge_inverts_split_bit_for_bit() {
    roundtrip_shapes![
        1 1 1 / 1,
        1 1 7 / 7,
        1 2 4 / 2,
        2 3 6 / 3,
        1 5 12 / 4,
        3 1 8 / 8,
        2 7 30 / 5,
        1 13 13 / 13,
        4 3 16 / 2,
        1 11 60 / 6,
        2 17 24 / 12,
        3 5 36 / 9,
        1 1 64 / 16,
        5 2 10 / 5,
        1 31 1 / 1,
        2 4 9 / 3,
        7 3 2 / 2,
        1 0 4 / 2,
        0 2 6 / 3,
        2 3 0 / 4,
    ];
}
