//! The layer API at zero, one and extreme sizes and counts: every call returns the documented
//! `Ok` value or `Err`, never a panic, an abort or a silently wrong result.

mod common;

use common::modes::{input, Weights, ABS, REL};
use common::{assert_close, reference_attend};
use mha::{
    mha_forward, AttendOptions, AttnMask, Masking, Matrix, Mha, MhaParams, Output, ShapeError,
    Tensor, Tokens,
};

fn params<const D: usize>() -> MhaParams<D> {
    let w = Matrix::<D, D>::from_fn(|r, c| ((r * 3 + c) % 7) as f32 * 0.05 - 0.15);
    MhaParams::new(w.clone(), w.clone(), w.clone(), w)
}

/// Head counts 0, 1, D, D + 1 and `usize::MAX`: valid ones build layers that run; the others
/// are the head errors naming the numbers.
#[test]
fn head_counts_at_the_limits() {
    const D: usize = 6;
    let x = input::<2, 3, D>(1);
    for h in [0, 1, 2, 3, D, D + 1, usize::MAX] {
        let built = Mha::new(&params::<D>(), h);
        let one_shot = mha_forward(&x, &params::<D>(), h);
        match h {
            0 => {
                assert_eq!(built.unwrap_err(), ShapeError::ZeroHeads);
                assert_eq!(one_shot.unwrap_err(), ShapeError::ZeroHeads);
            }
            1 | 2 | 3 | D => {
                let mut layer = built.unwrap();
                assert_eq!(layer.head_dim(), D / h);
                assert_eq!(layer.forward(&x), one_shot.unwrap());
            }
            _ => {
                let want = ShapeError::NotDivisible {
                    d_model: D,
                    n_heads: h,
                };
                assert_eq!(built.unwrap_err(), want);
                assert_eq!(one_shot.unwrap_err(), want);
            }
        }
    }
}

/// A zero-width model accepts any head count; every call on it returns empty outputs (or an
/// error, never a panic, for usize::MAX sequences), and its caches append nothing but their
/// length.
#[test]
fn zero_width_layers_are_empty() {
    for h in [1, 2, usize::MAX] {
        let mut layer = Mha::new(&params::<0>(), h).unwrap();
        let x = Tensor::<2, 3, 0>::zeros();
        assert!(layer.forward(&x).as_slice().is_empty());
        let mut cache = layer.new_cache(2, 5).unwrap();
        let mut out = Tensor::<2, 3, 0>::zeros();
        layer
            .decode_into(&x, &mut cache, AttendOptions::default(), &mut out)
            .unwrap();
        assert_eq!(cache.len(), 3);
        let huge = Tokens::new(&[], usize::MAX, 2, 0).unwrap();
        let out = Output::new(&mut [], usize::MAX, 2, 0).unwrap();
        let result = layer.forward_into(huge, AttendOptions::default(), out);
        assert!(
            matches!(
                result,
                Ok(())
                    | Err(ShapeError::Overflow { .. })
                    | Err(ShapeError::TooLarge)
                    // The store keeps a length per sequence: usize::MAX of them do not fit.
                    | Err(ShapeError::AllocationFailed { .. })
            ),
            "{result:?}"
        );
    }
}

/// Thread counts 0 (every CPU) to `usize::MAX` (capped) give the same bits.
#[test]
fn thread_counts_at_the_limits() {
    let x = input::<2, 5, 8>(2);
    let p = params::<8>();
    let one = Mha::builder(&p, 2).threads(1).build().unwrap().forward(&x);
    for threads in [0, 2, 3, 256, 257, usize::MAX] {
        let mut layer = Mha::builder(&p, 2)
            .threads(threads)
            .min_work_per_thread(0)
            .build()
            .unwrap();
        assert!((1..=256).contains(&layer.threads()), "{threads}");
        assert_eq!(layer.forward(&x), one, "threads {threads}");
    }
}

/// Cache capacities 0 and 1, steps of 0 tokens, and a full cache.
#[test]
fn cache_capacities_at_the_limits() {
    let w = Weights::<8, 8, 8>::random(3, [true; 4]);
    let mut layer = w.layer(2, Masking::Causal, mha::Isa::detect(), 1);
    let x = input::<1, 1, 8>(4);
    let mut out = Tensor::<1, 1, 8>::zeros();
    let mut empty = layer.new_cache(1, 0).unwrap();
    assert_eq!(
        layer.decode_into(&x, &mut empty, AttendOptions::default(), &mut out),
        Err(ShapeError::CacheFull {
            sequence: 0,
            capacity: 0,
            cached: 0,
            new: 1
        })
    );
    let mut one = layer.new_cache(1, 1).unwrap();
    let mut none = Tensor::<1, 0, 8>::zeros();
    let nothing = Tensor::<1, 0, 8>::zeros();
    for _ in 0..3 {
        layer
            .decode_into(&nothing, &mut one, AttendOptions::default(), &mut none)
            .unwrap();
    }
    layer
        .decode_into(&x, &mut one, AttendOptions::default(), &mut out)
        .unwrap();
    assert_eq!(out, layer.forward(&x));
    assert!(layer
        .decode_into(&x, &mut one, AttendOptions::default(), &mut out)
        .is_err());
    let mut zero_batch = layer.new_cache(0, 4).unwrap();
    let mut out0 = Tensor::<0, 2, 8>::zeros();
    layer
        .decode_into(
            &Tensor::<0, 2, 8>::zeros(),
            &mut zero_batch,
            AttendOptions::default(),
            &mut out0,
        )
        .unwrap();
}

/// Empty and mismatched masks and lengths are errors naming the numbers; an empty mask of an
/// empty call is fine.
#[test]
fn masks_and_lengths_at_the_limits() {
    let w = Weights::<8, 8, 8>::random(5, [false; 4]);
    let mut layer = w.layer(2, Masking::Bidirectional, mha::Isa::detect(), 1);
    let x = input::<2, 3, 8>(6);
    let mut out = Tensor::<2, 3, 8>::zeros();
    let cases: [(AttendOptions, ShapeError); 5] = [
        (
            AttendOptions {
                key_lengths: Some(&[]),
                ..AttendOptions::default()
            },
            ShapeError::LengthMismatch {
                what: "key_lengths (B)",
                expected: 2,
                actual: 0,
            },
        ),
        (
            AttendOptions {
                key_lengths: Some(&[3, usize::MAX]),
                ..AttendOptions::default()
            },
            ShapeError::KeyLength {
                batch: 1,
                length: usize::MAX,
                keys: 3,
            },
        ),
        (
            AttendOptions {
                key_padding_mask: Some(&[]),
                ..AttendOptions::default()
            },
            ShapeError::LengthMismatch {
                what: "key_padding_mask (B, S)",
                expected: 6,
                actual: 0,
            },
        ),
        (
            AttendOptions {
                mask: Some(AttnMask::Bool(&[])),
                ..AttendOptions::default()
            },
            ShapeError::LengthMismatch {
                what: "mask (T, S) or (B, T, S)",
                expected: 9,
                actual: 0,
            },
        ),
        (
            AttendOptions {
                mask: Some(AttnMask::Additive(&[0.0; 10])),
                ..AttendOptions::default()
            },
            ShapeError::LengthMismatch {
                what: "mask (T, S) or (B, T, S)",
                expected: 9,
                actual: 10,
            },
        ),
    ];
    for (options, want) in cases {
        assert_eq!(layer.forward_into(&x, options, &mut out), Err(want));
    }
    // Key lengths of 0: rows that see nothing get the output bias (none here): zeros.
    let options = AttendOptions {
        key_lengths: Some(&[0, 0]),
        ..AttendOptions::default()
    };
    layer.forward_into(&x, options, &mut out).unwrap();
    assert!(out.as_slice().iter().all(|&v| v == 0.0));
    let empty = Tensor::<2, 0, 8>::zeros();
    let mut empty_out = Tensor::<2, 0, 8>::zeros();
    let options = AttendOptions {
        mask: Some(AttnMask::Bool(&[])),
        key_padding_mask: Some(&[]),
        key_lengths: Some(&[0, 0]),
        token_lengths: Some(&[0, 0]),
        ..AttendOptions::default()
    };
    layer.forward_into(&empty, options, &mut empty_out).unwrap();
}

/// Cross-attention over an empty memory (`S = 0`): every query sees no key, so the output is
/// the output bias; from zero-width memory tokens (`E = 0`): keys and values are their biases,
/// checked against the f64 reference.
#[test]
fn cross_attention_over_empty_memories() {
    let x = input::<2, 20, 8>(8);
    let mut out = Tensor::<2, 20, 8>::zeros();
    let w = Weights::<8, 0, 8>::random(7, [true; 4]);
    let mut layer = w.layer(2, Masking::Bidirectional, mha::Isa::detect(), 1);
    let memory = Tensor::<2, 17, 0>::zeros();
    layer
        .cross_into(&x, &memory, AttendOptions::default(), &mut out)
        .unwrap();
    let a = w.attend(
        2,
        20,
        2,
        x.as_slice(),
        Some((17, memory.as_slice())),
        Masking::Bidirectional,
    );
    assert_close(out.as_slice(), &reference_attend(&a).y, ABS, REL, "E = 0");

    let w = Weights::<8, 6, 8>::random(9, [true; 4]);
    let mut layer = w.layer(2, Masking::Causal, mha::Isa::detect(), 1);
    let memory = Tensor::<2, 0, 6>::zeros();
    layer
        .cross_into(&x, &memory, AttendOptions::default(), &mut out)
        .unwrap();
    let bias = w.biases.bo.as_ref().unwrap().as_slice();
    for token in out.as_slice().chunks(8) {
        assert_eq!(token, bias);
    }
}

/// Inputs holding NaN and ±inf give the same output bits — NaN payloads and signs included —
/// on 1, 2 and 3 threads, for every instruction set, through forward (causal and
/// bidirectional, across 96-row blocks), cross-attention and decoding.
#[test]
fn non_finite_inputs_give_the_same_bits_on_any_thread_count() {
    const B: usize = 2;
    const T: usize = 101;
    const D: usize = 16;
    let w = Weights::<D, D, 8>::random(11, [true; 4]);
    let cw = Weights::<D, 12, D>::random(12, [true; 4]);
    let mut x = input::<B, T, D>(13);
    let memory = input::<B, 9, 12>(14);
    let specials = [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    // Lone specials, and rows holding NaN, +inf and -inf together: there the NaN that comes
    // out depends on the order of the operations (`inf - inf` makes the default NaN).
    let mut at = vec![(0, 5), (1, 40), (2, 700), (3, 1601)];
    for row in [50, 99, 100, T + 3, T + 98] {
        at.extend([(0, row * D + 1), (2, row * D + 3), (3, row * D + 7)]);
    }
    for (n, e) in at {
        x.as_mut_slice()[e] = specials[n];
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for isa in mha::Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        let mut first: Option<Vec<Vec<u32>>> = None;
        for threads in [1, 2, 3] {
            let mut outputs = Vec::new();
            for masking in [Masking::Causal, Masking::Bidirectional] {
                outputs.push(bits(
                    w.layer(4, masking, isa, threads).forward(&x).as_slice(),
                ));
            }
            let mut cross = cw.layer(4, Masking::Bidirectional, isa, threads);
            let mut out = Tensor::<B, T, D>::zeros();
            cross
                .cross_into(&x, &memory, AttendOptions::default(), &mut out)
                .unwrap();
            outputs.push(bits(out.as_slice()));
            let mut decoder = w.layer(4, Masking::Causal, isa, threads);
            let mut cache = decoder.new_cache(B, T).unwrap();
            let mut step = Tensor::<B, 1, D>::zeros();
            let mut decoded = Vec::new();
            for t in 0..T {
                let token = Tensor::<B, 1, D>::from_fn(|b, _, i| x[(b, t, i)]);
                decoder
                    .decode_into(&token, &mut cache, AttendOptions::default(), &mut step)
                    .unwrap();
                decoded.extend(bits(step.as_slice()));
            }
            outputs.push(decoded);
            match &first {
                None => first = Some(outputs),
                Some(want) => {
                    for (k, (got, want)) in outputs.iter().zip(want).enumerate() {
                        let at = got.iter().zip(want).position(|(g, w)| g != w);
                        assert!(
                            at.is_none(),
                            "{isa:?} threads {threads}, call {k}: element {at:?} differs"
                        );
                    }
                }
            }
        }
    }
}

/// Zero-width memory tokens cost no input memory however many there are, but their keys and
/// values do: a call that would need more than the machine has is an error, not an abort.
#[test]
fn a_call_too_large_to_allocate_is_an_error() {
    let w = Weights::<8, 0, 8>::random(15, [true; 4]);
    let mut layer = w.layer(2, Masking::Bidirectional, mha::Isa::detect(), 1);
    let x = input::<1, 2, 8>(16);
    let memory = Tokens::new(&[], 1, 1 << 44, 0).unwrap();
    let mut out = Tensor::<1, 2, 8>::from_fn(|_, _, _| 3.0);
    let result = layer.cross_into(&x, memory, AttendOptions::default(), &mut out);
    assert!(
        matches!(result, Err(ShapeError::AllocationFailed { .. })),
        "{result:?}"
    );
    assert!(out.as_slice().iter().all(|&v| v == 3.0), "output untouched");
    // The layer still works afterwards.
    let memory = Tensor::<1, 3, 0>::zeros();
    layer
        .cross_into(&x, &memory, AttendOptions::default(), &mut out)
        .unwrap();
}
