//! Properties of the forward pass and of the public attention helpers: causality, isolation of
//! non-finite values across tokens and batch elements, NaN propagation, large logits,
//! determinism, thread-count invariance, and `attention` / `causal_mask` against an f64
//! reference (alone, and composed with split/merge into the whole forward pass).

mod common;

use common::{
    assert_bits_eq, assert_close, matmul, narrow, reference_attention, reference_mha, weights,
    widen, Rng,
};
use mha::{attention, causal_mask, merge_heads, mha_forward, split_heads, Heads};
use mha::{AttendOptions, Matrix, Mha, MhaParams, Tensor};

/// Random input and weights for one shape, and the weights as flat buffers for the reference.
struct Case<const B: usize, const T: usize, const D: usize> {
    x: Tensor<B, T, D>,
    p: MhaParams<D>,
    w: [Vec<f32>; 4],
}

impl<const B: usize, const T: usize, const D: usize> Case<B, T, D> {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let x = Tensor::from_vec(rng.vec(B * T * D, 1.0)).unwrap();
        let w = [(); 4].map(|_| weights(&mut rng, D));
        let m = |v: &Vec<f32>| Matrix::<D, D>::from_vec(v.clone()).unwrap();
        let p = MhaParams::new(m(&w[0]), m(&w[1]), m(&w[2]), m(&w[3]));
        Self { x, p, w }
    }

    fn reference(&self, x: &Tensor<B, T, D>, h: usize) -> Vec<f64> {
        let [wq, wk, wv, wo] = &self.w;
        reference_mha(x.as_slice(), wq, wk, wv, wo, B, T, D, h)
    }

    fn layer(&self, h: usize, threads: usize) -> Mha<D> {
        Mha::builder(&self.p, h)
            .threads(threads)
            .min_work_per_thread(0)
            .build()
            .unwrap()
    }
}

/// The `(b, t)` token of a flat `(B, T, D)` buffer.
fn token<const T: usize, const D: usize>(v: &[f32], b: usize, t: usize) -> &[f32] {
    &v[(b * T + t) * D..][..D]
}

// ---------------------------------------------------------------------------------------------
// Causality

/// A named rule giving the value of flat element `i`.
type Fill = (&'static str, Box<dyn Fn(usize) -> f32>);

/// Replacement values for "the future": fresh random values, then non-finite ones.
fn futures(seed: u64) -> Vec<Fill> {
    let mut rng = Rng::new(seed);
    let random: Vec<f32> = rng.vec(1 << 16, 5.0);
    vec![
        (
            "random",
            Box::new(move |i| random[i % random.len()]) as Box<dyn Fn(usize) -> f32>,
        ),
        ("NaN", Box::new(|_| f32::NAN)),
        ("+inf", Box::new(|_| f32::INFINITY)),
        ("-inf", Box::new(|_| f32::NEG_INFINITY)),
        (
            "mixed",
            Box::new(|i| [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -0.0][i % 5]),
        ),
    ]
}

/// Changing tokens `>= cut` (in every batch element) leaves the outputs of tokens `< cut`
/// bit-identical.
fn check_causality<const B: usize, const T: usize, const D: usize>(
    h: usize,
    threads: usize,
    cuts: &[usize],
    seed: u64,
) {
    let case = Case::<B, T, D>::new(seed);
    let mut layer = case.layer(h, threads);
    let base = layer.forward(&case.x).unwrap();
    for &cut in cuts {
        for (name, value) in futures(seed + cut as u64) {
            let mut x = case.x.clone();
            for b in 0..B {
                for t in cut..T {
                    for i in 0..D {
                        x[(b, t, i)] = value((b * T + t) * D + i);
                    }
                }
            }
            let y = layer.forward(&x).unwrap();
            for b in 0..B {
                for t in 0..cut {
                    assert_bits_eq(
                        token::<T, D>(y.as_slice(), b, t),
                        token::<T, D>(base.as_slice(), b, t),
                        &format!("B{B} T{T} D{D} threads {threads}: future {name} from {cut}, token ({b}, {t})"),
                    );
                }
            }
            // Not vacuous: the changed tokens did change.
            if cut < T {
                assert_ne!(
                    token::<T, D>(y.as_slice(), 0, cut),
                    token::<T, D>(base.as_slice(), 0, cut),
                    "future {name} from {cut} changed nothing"
                );
            }
        }
    }
}

#[test]
fn causality_small() {
    check_causality::<2, 9, 6>(3, 1, &[0, 1, 4, 8, 9], 100);
}

#[test]
fn causality_across_query_and_key_blocks() {
    // The attention's query and key blocks hold 96 rows (src/kernels/flash.rs).
    check_causality::<2, 200, 24>(3, 1, &[1, 37, 95, 96, 97, 191, 192, 199], 101);
}

#[test]
fn causality_with_threads() {
    check_causality::<2, 100, 64>(4, 4, &[5, 64, 95, 96, 99], 102);
}

// ---------------------------------------------------------------------------------------------
// Non-finite isolation and propagation

/// One NaN or infinity in `x[(b, j, i)]`: tokens `< j` of element `b`, and every other batch
/// element, are bit-identical to the clean run.
fn check_token_isolation<const B: usize, const T: usize, const D: usize>(
    h: usize,
    threads: usize,
    seed: u64,
) {
    let case = Case::<B, T, D>::new(seed);
    let mut layer = case.layer(h, threads);
    let base = layer.forward(&case.x).unwrap();
    let mut rng = Rng::new(seed ^ 0xABCD);
    for poison in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for j in [0, 1, T / 2, T - 1] {
            let b = (rng.next_u64() as usize) % B;
            let i = (rng.next_u64() as usize) % D;
            let mut x = case.x.clone();
            x[(b, j, i)] = poison;
            let y = layer.forward(&x).unwrap();
            for bb in 0..B {
                let upto = if bb == b { j } else { T };
                for t in 0..upto {
                    assert_bits_eq(
                        token::<T, D>(y.as_slice(), bb, t),
                        token::<T, D>(base.as_slice(), bb, t),
                        &format!("{poison} at ({b}, {j}, {i}): token ({bb}, {t})"),
                    );
                }
            }
        }
    }
}

#[test]
fn non_finite_token_does_not_reach_earlier_tokens() {
    check_token_isolation::<2, 70, 24>(4, 1, 200);
    check_token_isolation::<1, 5, 3>(3, 1, 201);
}

/// Non-finite values anywhere in batch element 1 leave elements 0 and 2 bit-identical.
#[test]
fn non_finite_batch_element_does_not_reach_other_elements() {
    const B: usize = 3;
    const T: usize = 96;
    const D: usize = 64;
    let case = Case::<B, T, D>::new(300);
    let base = case.layer(4, 1).forward(&case.x).unwrap();
    type Poison = fn(&mut Tensor<B, T, D>);
    let poisonings: [(&str, Poison); 5] = [
        ("NaN at the first element", |x| x[(1, 0, 0)] = f32::NAN),
        ("NaN at the last element", |x| {
            x[(1, T - 1, D - 1)] = f32::NAN
        }),
        ("+inf in the middle", |x| x[(1, 40, 7)] = f32::INFINITY),
        ("all NaN", |x| {
            for t in 0..T {
                for i in 0..D {
                    x[(1, t, i)] = f32::NAN;
                }
            }
        }),
        ("alternating -inf and NaN", |x| {
            for t in 0..T {
                for i in 0..D {
                    x[(1, t, i)] = if (t + i) % 2 == 0 {
                        f32::NEG_INFINITY
                    } else {
                        f32::NAN
                    };
                }
            }
        }),
    ];
    for (name, poison) in poisonings {
        let mut x = case.x.clone();
        poison(&mut x);
        for threads in [1, 2, 3] {
            let y = case.layer(4, threads).forward(&x).unwrap();
            for b in [0, 2] {
                let range = b * T * D..(b + 1) * T * D;
                assert_bits_eq(
                    &y.as_slice()[range.clone()],
                    &base.as_slice()[range],
                    &format!("{name}, threads {threads}: batch element {b}"),
                );
            }
        }
    }
}

/// A NaN in token `j` makes every output of tokens `>= j` of that batch element NaN, as in the
/// reference (and in the seed's numpy): a NaN input must never turn into a finite output.
#[test]
fn nan_input_propagates_like_the_reference() {
    const B: usize = 2;
    const T: usize = 9;
    const D: usize = 8;
    let case = Case::<B, T, D>::new(400);
    for j in [0, 3, T - 1] {
        let mut x = case.x.clone();
        x[(1, j, 5)] = f32::NAN;
        let want = case.reference(&x, 2);
        let y = mha_forward(&x, &case.p, 2).unwrap();
        for (index, (&g, &w)) in y.as_slice().iter().zip(&want).enumerate() {
            let (b, t) = (index / (T * D), index / D % T);
            assert_eq!(
                g.is_nan(),
                w.is_nan(),
                "NaN at (1, {j}, 5): output ({b}, {t}, {}) is {g}, the reference gives {w}",
                index % D
            );
        }
    }
}

/// The same through the attention helper: a query that sees only NaN keys gets NaN, not zeros.
#[test]
fn attention_nan_scores_propagate_like_the_reference() {
    const T: usize = 4;
    const D: usize = 4;
    let mut rng = Rng::new(401);
    let mut k = rng.vec(T * D, 1.0);
    let q = rng.vec(T * D, 1.0);
    let v = rng.vec(T * D, 1.0);
    // Key 0 is NaN; query 0 sees only key 0, query 1 sees keys 0 and 1.
    k[..D].fill(f32::NAN);
    let heads = |v: &[f32]| Heads::<1, T, D>::from_vec(v.to_vec(), 1).unwrap();
    let mask = causal_mask(T).unwrap();
    let got = attention(&heads(&q), &heads(&k), &heads(&v), &mask).unwrap();
    let want = reference_attention(&q, &k, &v, &mask, 1, 1, T, D);
    for (index, (&g, &w)) in got.as_slice().iter().zip(&want).enumerate() {
        assert_eq!(
            g.is_nan(),
            w.is_nan(),
            "query {}: got {g}, the reference gives {w}",
            index / D
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Large logits

#[test]
fn large_logits_stay_finite_and_accurate() {
    const B: usize = 2;
    const T: usize = 40;
    const D: usize = 32;
    for scale in [1e2f32, 1e3, 1e4] {
        let mut case = Case::<B, T, D>::new(500 + scale as u64);
        for v in case.x.as_mut_slice() {
            *v *= scale;
        }
        let want = case.reference(&case.x, 4);
        let y = mha_forward(&case.x, &case.p, 4).unwrap();
        assert!(
            y.as_slice().iter().all(|v| v.is_finite()),
            "x scaled by {scale}: non-finite output"
        );
        // Scores reach ~1e5 · scale / 1e3 and are rounded to f32, so compare relative to the
        // output's own scale.
        let top = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
        assert_close(
            y.as_slice(),
            &want,
            1e-4 * top,
            1e-3,
            &format!("x scaled by {scale}"),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Determinism and thread-count invariance

#[test]
fn repeated_calls_are_bit_identical() {
    const B: usize = 2;
    const T: usize = 70;
    const D: usize = 24;
    let case = Case::<B, T, D>::new(600);
    let first = mha_forward(&case.x, &case.p, 3).unwrap();
    let second = mha_forward(&case.x, &case.p, 3).unwrap();
    assert_bits_eq(second.as_slice(), first.as_slice(), "mha_forward twice");

    // One layer reused across calls and other shapes (dirty scratch) vs a fresh layer.
    let fresh = case.layer(3, 1).forward(&case.x).unwrap();
    assert_bits_eq(
        fresh.as_slice(),
        first.as_slice(),
        "fresh layer vs mha_forward",
    );
    let mut layer = case.layer(3, 1);
    let mut rng = Rng::new(601);
    for round in 0..3 {
        let y = layer.forward(&case.x).unwrap();
        assert_bits_eq(
            y.as_slice(),
            fresh.as_slice(),
            &format!("reused, round {round}"),
        );
        let big = Tensor::<1, 130, D>::from_vec(rng.vec(130 * D, 3.0)).unwrap();
        let _ = layer.forward(&big).unwrap();
        let small = Tensor::<3, 5, D>::from_fn(|_, _, _| f32::NAN);
        let _ = layer.forward(&small).unwrap();
        let mut out = Tensor::<B, T, D>::from_fn(|_, _, _| f32::INFINITY);
        layer
            .forward_into(&case.x, AttendOptions::default(), &mut out)
            .unwrap();
        assert_bits_eq(
            out.as_slice(),
            fresh.as_slice(),
            &format!("forward_into, round {round}"),
        );
    }
}

fn check_thread_invariance<const B: usize, const T: usize, const D: usize>(h: usize, seed: u64) {
    let case = Case::<B, T, D>::new(seed);
    let one = case.layer(h, 1).forward(&case.x).unwrap();
    assert_close(
        one.as_slice(),
        &case.reference(&case.x, h),
        1e-4,
        1e-4,
        &format!("B{B} T{T} D{D} H{h}"),
    );
    for threads in [2, 3, 4, 7, 0] {
        let mut layer = case.layer(h, threads);
        let y = layer.forward(&case.x).unwrap();
        let context = format!("B{B} T{T} D{D} H{h} threads {threads}");
        assert_bits_eq(y.as_slice(), one.as_slice(), &context);
        assert_bits_eq(
            layer.forward(&case.x).unwrap().as_slice(),
            one.as_slice(),
            &context,
        );
    }
}

#[test]
fn thread_count_does_not_change_bits() {
    check_thread_invariance::<2, 96, 64>(4, 700);
}

#[test]
fn thread_count_does_not_change_bits_ragged() {
    // T not a multiple of the 96-row blocks, narrow heads.
    check_thread_invariance::<2, 100, 64>(16, 701);
}

// ---------------------------------------------------------------------------------------------
// The public helpers: causal_mask and attention

#[test]
fn causal_mask_sees_exactly_the_past_and_present() {
    for t in 0..12 {
        let mask = causal_mask(t).unwrap();
        assert_eq!(mask.len(), t * t);
        for i in 0..t {
            for j in 0..t {
                assert_eq!(mask[i * t + j], j <= i, "t {t}: ({i}, {j})");
            }
        }
    }
}

/// A random mask with some rows forced: fully masked, only the first key, only the last key,
/// only the diagonal, everything.
fn random_mask(rng: &mut Rng, t: usize) -> (Vec<bool>, Vec<usize>) {
    let mut mask: Vec<bool> = (0..t * t)
        .map(|_| !rng.next_u64().is_multiple_of(3))
        .collect();
    let mut empty = Vec::new();
    for i in 0..t {
        let row = &mut mask[i * t..][..t];
        match i % 6 {
            0 => {
                row.fill(false);
                empty.push(i);
            }
            1 => {
                row.fill(false);
                row[0] = true;
            }
            2 => {
                row.fill(false);
                row[t - 1] = true;
            }
            3 => {
                row.fill(false);
                row[i] = true;
            }
            4 => row.fill(true),
            _ => {}
        }
    }
    (mask, empty)
}

fn check_masked_attention<const B: usize, const T: usize, const D: usize>(h: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let d = D / h;
    let q = rng.vec(B * T * D, 1.5);
    let k = rng.vec(B * T * D, 1.5);
    let v = rng.vec(B * T * D, 1.0);
    let heads = |v: &[f32]| Heads::<B, T, D>::from_vec(v.to_vec(), h).unwrap();
    let (qh, kh, vh) = (heads(&q), heads(&k), heads(&v));
    let context = format!("B{B} T{T} D{D} H{h}");
    for (name, (mask, empty)) in [
        ("random", random_mask(&mut rng, T)),
        ("causal", (causal_mask(T).unwrap(), vec![])),
        ("all visible", (vec![true; T * T], vec![])),
    ] {
        let got = attention(&qh, &kh, &vh, &mask).unwrap();
        assert_eq!(got.n_heads(), h);
        let want = reference_attention(&q, &k, &v, &mask, B, h, T, d);
        assert_close(
            got.as_slice(),
            &want,
            1e-5,
            1e-4,
            &format!("{context} {name}"),
        );
        for b in 0..B {
            for head in 0..h {
                for &i in &empty {
                    for j in 0..d {
                        assert_eq!(got.get(b, head, i, j), Some(0.0), "{context}: row {i}");
                    }
                }
            }
        }
    }
}

#[test]
fn attention_with_random_masks_matches_reference() {
    check_masked_attention::<1, 1, 4>(1, 800);
    check_masked_attention::<1, 5, 6>(6, 801);
    check_masked_attention::<3, 9, 8>(2, 802);
    check_masked_attention::<2, 70, 12>(3, 803);
    check_masked_attention::<1, 130, 10>(2, 804);
}

/// NaN keys and values of one key reach no query that the mask hides them from.
#[test]
fn masked_nan_keys_do_not_leak() {
    const B: usize = 2;
    const T: usize = 100;
    const D: usize = 12;
    const H: usize = 3;
    let mut rng = Rng::new(900);
    let q = rng.vec(B * T * D, 1.0);
    let k = rng.vec(B * T * D, 1.0);
    let v = rng.vec(B * T * D, 1.0);
    let (mask, _) = random_mask(&mut rng, T);
    let heads = |v: &[f32]| Heads::<B, T, D>::from_vec(v.to_vec(), H).unwrap();
    let clean = attention(&heads(&q), &heads(&k), &heads(&v), &mask).unwrap();
    let d = D / H;
    for j in [0, 5, 95, 96, T - 1] {
        let (mut kn, mut vn) = (k.clone(), v.clone());
        for b in 0..B {
            for h in 0..H {
                let at = ((b * H + h) * T + j) * d;
                kn[at..at + d].fill(f32::NAN);
                vn[at..at + d].fill(f32::INFINITY);
            }
        }
        let got = attention(&heads(&q), &heads(&kn), &heads(&vn), &mask).unwrap();
        for b in 0..B {
            for h in 0..H {
                for i in (0..T).filter(|&i| !mask[i * T + j]) {
                    for c in 0..d {
                        assert_eq!(
                            got.get(b, h, i, c).unwrap().to_bits(),
                            clean.get(b, h, i, c).unwrap().to_bits(),
                            "key {j} poisoned, query {i} does not see it"
                        );
                    }
                }
            }
        }
    }
}

/// `attention(q, k, v, causal_mask(T))` composed with split/merge and f64 projections is the
/// whole forward pass.
fn check_composition<const B: usize, const T: usize, const D: usize>(h: usize, seed: u64) {
    let case = Case::<B, T, D>::new(seed);
    let rows = B * T;
    let x = widen(case.x.as_slice());
    let project = |w: &[f32]| -> Tensor<B, T, D> {
        Tensor::from_vec(narrow(&matmul(&x, &widen(w), rows, D, D))).unwrap()
    };
    let (q, k, v) = (
        project(&case.w[0]),
        project(&case.w[1]),
        project(&case.w[2]),
    );
    let split = |t: &Tensor<B, T, D>| split_heads(t, h).unwrap();
    let heads = attention(&split(&q), &split(&k), &split(&v), &causal_mask(T).unwrap()).unwrap();
    let merged = merge_heads(&heads);
    let y = matmul(&widen(merged.as_slice()), &widen(&case.w[3]), rows, D, D);
    let want = case.reference(&case.x, h);
    assert_close(
        &narrow(&y),
        &want,
        1e-4,
        1e-4,
        &format!("composed B{B} T{T} D{D} H{h}"),
    );
    // And the layer agrees with the composition.
    let layer = mha_forward(&case.x, &case.p, h).unwrap();
    assert_close(
        layer.as_slice(),
        &y,
        1e-4,
        1e-4,
        &format!("layer vs composed B{B} T{T} D{D} H{h}"),
    );
}

#[test]
fn attention_composed_with_split_merge_is_the_forward_pass() {
    check_composition::<1, 17, 12>(4, 1000);
    check_composition::<3, 5, 9>(1, 1001);
    check_composition::<2, 70, 24>(3, 1002);
    check_composition::<2, 6, 5>(5, 1003);
}
