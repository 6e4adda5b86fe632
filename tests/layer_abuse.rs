//! The layer API at zero, one and extreme sizes and counts, and every numeric setting at 0,
//! subnormal, huge, `f32::MAX` and non-finite: `Mha` and its builder, `Tokens` / `Output`,
//! `KvCache`, `attention`, split / merge heads, the safetensors writer and the public GEMM.
//! Every call returns the documented `Ok` value or `Err`, never a panic, an abort or a
//! silently wrong result; run in debug (overflow checks on) and release builds.

mod common;

use common::modes::{input, Weights, ABS, REL};
use common::{assert_close, reference_attend};
use mha::kernels::{gemm, Isa, PackedB};
use mha::{
    attention, causal_mask, mha_forward, split_heads, Alibi, AttendOptions, AttentionWeights,
    AttnMask, Masking, Matrix, Mha, MhaParams, Output, QkNorm, QkNormSpan, Rope, RopeAngles,
    RopeLayout, RopeScaling, ShapeError, Tensor, Tokens,
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
                assert_eq!(layer.forward(&x).unwrap(), one_shot.unwrap());
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
        assert!(layer.forward(&x).unwrap().as_slice().is_empty());
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
    let one = Mha::builder(&p, 2)
        .threads(1)
        .build()
        .unwrap()
        .forward(&x)
        .unwrap();
    for threads in [0, 2, 3, 256, 257, usize::MAX] {
        let mut layer = Mha::builder(&p, 2)
            .threads(threads)
            .min_work_per_thread(0)
            .build()
            .unwrap();
        assert!((1..=256).contains(&layer.threads()), "{threads}");
        assert_eq!(layer.forward(&x).unwrap(), one, "threads {threads}");
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
    assert_eq!(out, layer.forward(&x).unwrap());
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
                    w.layer(4, masking, isa, threads)
                        .forward(&x)
                        .unwrap()
                        .as_slice(),
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

fn rope(theta: f64) -> Rope {
    Rope {
        theta,
        rotary_dim: 2,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    }
}

/// `forward` returns a `Result`: `2^62` sequences of zero-width tokens, whose per-sequence
/// lengths cannot be allocated, are an error (once, release builds returned zeros and debug
/// builds failed a `debug_assert`); a RoPE layer computes every length (its angles are
/// computed per position, with no table to run past) and equals `forward_into`.
#[test]
fn forward_reports_what_it_cannot_compute() {
    let p = params::<4>();
    let mut layer = Mha::builder(&p, 2).rope(rope(10_000.0)).build().unwrap();
    let fits = input::<2, 300, 4>(21);
    let y = layer.forward(&fits).unwrap();
    let mut want = Tensor::<2, 300, 4>::zeros();
    layer
        .forward_into(&fits, AttendOptions::default(), &mut want)
        .unwrap();
    assert_eq!(y, want);
    assert!(y.as_slice().iter().all(|v| v.is_finite() && *v != 0.0));

    let mut empty = Mha::new(&params::<0>(), 1).unwrap();
    let result = empty.forward(&Tensor::<{ 1 << 62 }, 1, 0>::zeros());
    assert_eq!(
        result,
        Err(ShapeError::Overflow {
            what: "key/value store: lengths",
            dims: vec![1 << 62],
        })
    );
    assert_eq!(
        result.unwrap_err().to_string(),
        "key/value store: lengths of sizes [4611686018427387904] has more elements than fit in memory"
    );
    // The layer still works.
    assert!(empty.forward(&Tensor::<3, 2, 0>::zeros()).is_ok());
}

/// The standard ALiBi slopes cost O(H): 2^20 heads are each within an ulp of the power taken
/// directly (an O(H²) loop never finishes); usize::MAX heads are an error, also from the
/// builder of a zero-width layer (which accepts any head count), not "capacity overflow".
#[test]
fn standard_alibi_slopes_at_the_limits() {
    let n = 1usize << 20;
    let slopes = Alibi::standard_slopes(n).unwrap();
    assert_eq!(slopes.len(), n);
    let base = 2f64.powf(-8.0 / n as f64) as f32 as f64;
    for h in [0, 1, 2, 1000, n / 2, n - 1] {
        let direct = base.powi(h as i32 + 1) as f32;
        let ulps = (slopes[h].to_bits() as i64 - direct.to_bits() as i64).abs();
        assert!(ulps <= 1, "head {h}: {} vs {direct}", slopes[h]);
    }
    // 2^20 + 3 heads: 3 extra heads, the odd powers of 2^(-4/n).
    let more = Alibi::standard_slopes(n + 3).unwrap();
    assert_eq!(more[..n], slopes[..]);
    let half = 2f64.powf(-4.0 / n as f64) as f32 as f64;
    for (k, &slope) in more[n..].iter().enumerate() {
        let direct = half.powi(2 * k as i32 + 1) as f32;
        let ulps = (slope.to_bits() as i64 - direct.to_bits() as i64).abs();
        assert!(ulps <= 1, "extra head {k}: {slope} vs {direct}");
    }
    let want = ShapeError::Overflow {
        what: "ALiBi slopes (H)",
        dims: vec![usize::MAX],
    };
    assert_eq!(Alibi::standard_slopes(usize::MAX), Err(want.clone()));
    let p = params::<0>();
    let built = Mha::builder(&p, usize::MAX).alibi(Alibi::Standard).build();
    assert_eq!(built.unwrap_err(), want);
    assert_eq!(
        Alibi::standard_slopes(1 << 62).unwrap_err().to_string(),
        "ALiBi slopes (H) of sizes [4611686018427387904] has more elements than fit in memory"
    );
}

/// A slope whose bias `slope · (i - j)` overflows `f32` at a distance the call reaches is an
/// error before anything is written (once, ±f32::MAX on a bidirectional layer gave all-NaN
/// output from finite input); a windowed layer's reach is its window, checked by the builder;
/// a decoding loop meets the error at the step that first reaches that distance, with the
/// cache and the output unchanged.
#[test]
fn alibi_slopes_whose_bias_overflows() {
    let p = params::<4>();
    let slopes = Alibi::Slopes(vec![f32::MAX, -f32::MAX]);
    let mut layer = Mha::builder(&p, 2)
        .masking(Masking::Bidirectional)
        .alibi(slopes.clone())
        .build()
        .unwrap();
    // Distance 1 is finite: f32::MAX · 1.
    let y = layer.forward(&input::<1, 2, 4>(22)).unwrap();
    assert!(y.as_slice().iter().all(|v| v.is_finite()), "{y:?}");
    let mut out = Tensor::<1, 3, 4>::from_fn(|_, _, _| 7.0);
    let x = input::<1, 3, 4>(23);
    let err = layer
        .forward_into(&x, AttendOptions::default(), &mut out)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "ALiBi slope is 3.4028235e38 (head 0), whose bias at key-query distance 2 (the farthest \
         a query of this call reaches) is inf, but must be small enough that the bias is finite"
    );
    assert!(out.as_slice().iter().all(|&v| v == 7.0), "output untouched");

    // A window of 2 keys reaches distance 1 only: fine; of 3, distance 2: refused at build.
    let windowed = |window| {
        Mha::builder(&p, 2)
            .sliding_window(window)
            .alibi(slopes.clone())
            .build()
    };
    let mut two = windowed(2).unwrap();
    let long = input::<1, 50, 4>(24);
    assert!(two
        .forward(&long)
        .unwrap()
        .as_slice()
        .iter()
        .all(|v| v.is_finite()));
    let err = windowed(3).unwrap_err();
    assert_eq!(
        err.to_string(),
        "ALiBi slope is 3.4028235e38 (head 0), whose bias at key-query distance 2 (the farthest \
         the sliding window of 3 keys reaches) is inf, but must be small enough that the bias is \
         finite"
    );

    // Causal decoding with a slope of 1e38: distances up to 3 are finite, 4 is not.
    let mut decoder = Mha::builder(&p, 2)
        .alibi(Alibi::Slopes(vec![1e38, 0.5]))
        .build()
        .unwrap();
    let mut cache = decoder.new_cache(1, 8).unwrap();
    let mut step = Tensor::<1, 1, 4>::zeros();
    for t in 0..4 {
        let token = Tensor::<1, 1, 4>::from_fn(|_, _, i| long[(0, t, i)]);
        decoder
            .decode_into(&token, &mut cache, AttendOptions::default(), &mut step)
            .unwrap();
        assert!(step.as_slice().iter().all(|v| v.is_finite()), "step {t}");
    }
    step = Tensor::from_fn(|_, _, _| 7.0);
    let token = Tensor::<1, 1, 4>::from_fn(|_, _, i| long[(0, 4, i)]);
    let err = decoder.decode_into(&token, &mut cache, AttendOptions::default(), &mut step);
    assert!(
        matches!(&err, Err(ShapeError::Setting { what: "ALiBi slope", value, .. })
            if value.starts_with("1e38 (head 0), whose bias at key-query distance 4 ")),
        "{err:?}"
    );
    assert_eq!(cache.len(), 4, "the refused step appended nothing");
    assert!(
        step.as_slice().iter().all(|&v| v == 7.0),
        "output untouched"
    );
}

/// Zero-width heads let the head count be anything: `attention` over them, and
/// cross-attention over an empty memory with the weights requested (the fuzzer's
/// reproducer), compute nothing and return empty results; no product of the head count with
/// the other axes is formed (they overflowed in debug builds).
#[test]
fn zero_width_heads_of_any_count() {
    let x = Tensor::<1, 2, 0>::zeros();
    for h in [1, 7, usize::MAX] {
        let heads = split_heads(&x, h).unwrap();
        let out = attention(&heads, &heads, &heads, &causal_mask(2).unwrap()).unwrap();
        assert_eq!(out.n_heads(), h);
        assert!(out.as_slice().is_empty());
    }
    let p = MhaParams::<0, 0, 0, 0>::from_parts(
        Matrix::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
    );
    let mut layer = Mha::builder(&p, usize::MAX)
        .masking(Masking::Bidirectional)
        .build()
        .unwrap();
    let memory = Tensor::<1, 0, 0>::zeros();
    let mut weights = AttentionWeights::new();
    let mut y = Tensor::<1, 2, 0>::zeros();
    let out = Output::from(&mut y).with_weights(&mut weights);
    layer
        .cross_into(&x, &memory, AttendOptions::default(), out)
        .unwrap();
    assert_eq!(weights.shape(), [1, usize::MAX, 2, 0]);
    assert!(weights.as_slice().is_empty());
    assert_eq!(weights.head(0, usize::MAX - 1), Some(&[][..]));
    assert_eq!(weights.get(0, usize::MAX - 1, 1, 0), None);
    assert!(weights.mean_over_heads().is_empty());
}

/// Runs a `(1, 3, 4)` forward of `layer` with its weights: the output is finite and every
/// weight row sums to at most 1 (less with a sink).
fn finite_forward(layer: &mut Mha<4>) -> Result<AttentionWeights, ShapeError> {
    let x = input::<1, 3, 4>(30);
    let mut y = Tensor::<1, 3, 4>::zeros();
    let mut weights = AttentionWeights::new();
    let out = Output::from(&mut y).with_weights(&mut weights);
    layer.forward_into(&x, AttendOptions::default(), out)?;
    assert!(y.as_slice().iter().all(|v| v.is_finite()), "{y:?}");
    for row in weights.as_slice().chunks(3) {
        let total: f32 = row.iter().sum();
        assert!(
            row.iter().all(|w| w.is_finite()) && total <= 1.0 + 1e-6,
            "{row:?}"
        );
    }
    Ok(weights)
}

/// The `what` of a [`ShapeError::Setting`].
fn setting(result: Result<impl std::fmt::Debug, ShapeError>) -> &'static str {
    match result {
        Err(ShapeError::Setting { what, .. }) => what,
        other => panic!("expected a Setting error, got {other:?}"),
    }
}

/// Every numeric setting of the builder at zero, the smallest subnormal and normal, huge,
/// `f32::MAX` and non-finite: out of range is a `Setting` error naming it at build; in range
/// gives a finite forward with weights.
#[test]
fn numeric_settings_at_the_limits() {
    let p = params::<4>();
    let tiny = [0.0, f32::from_bits(1), f32::MIN_POSITIVE, 1e-30];
    let huge = [1e30, f32::MAX];
    let bad = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0];
    for scale in tiny.into_iter().chain([-0.0, 1e30]) {
        finite_forward(&mut Mha::builder(&p, 2).scale(scale).build().unwrap()).unwrap();
    }
    for scale in bad {
        assert_eq!(
            setting(Mha::builder(&p, 2).scale(scale).build()),
            "softmax scale"
        );
    }
    for cap in tiny[1..].iter().chain(&huge) {
        finite_forward(&mut Mha::builder(&p, 2).softcap(*cap).build().unwrap()).unwrap();
    }
    for cap in bad.into_iter().chain([0.0, -0.0]) {
        assert_eq!(
            setting(Mha::builder(&p, 2).softcap(cap).build()),
            "logit soft cap"
        );
    }
    for sink in [f32::NEG_INFINITY, -f32::MAX, 0.0, 1e30, f32::MAX] {
        let mut layer = Mha::builder(&p, 2).sinks(vec![sink, 0.0]).build().unwrap();
        let weights = finite_forward(&mut layer).unwrap();
        // A sink of f32::MAX (or 1e30) takes every row's whole mass.
        let head = weights.head(0, 0).unwrap();
        assert_eq!(head.iter().all(|&w| w == 0.0), sink >= 1e30, "sink {sink}");
    }
    for sink in [f32::NAN, f32::INFINITY] {
        let built = Mha::builder(&p, 2).sinks(vec![0.0, sink]).build();
        assert_eq!(setting(built), "attention sinks (H)");
    }
    for eps in tiny.into_iter().chain(huge) {
        let norm = QkNorm {
            q_weight: vec![1.0; 2],
            k_weight: vec![1.0; 2],
            eps,
            span: QkNormSpan::PerHead,
        };
        finite_forward(&mut Mha::builder(&p, 2).qk_norm(norm).build().unwrap()).unwrap();
    }
    for eps in bad {
        let norm = QkNorm {
            q_weight: vec![1.0; 2],
            k_weight: vec![1.0; 2],
            eps,
            span: QkNormSpan::PerHead,
        };
        assert_eq!(
            setting(Mha::builder(&p, 2).qk_norm(norm).build()),
            "QK-norm eps"
        );
    }
    for slope in tiny.into_iter().chain([1e30, -1e30, 1e37]) {
        for masking in [Masking::Causal, Masking::Bidirectional] {
            let alibi = Alibi::Slopes(vec![slope, 0.5]);
            let built = Mha::builder(&p, 2).masking(masking).alibi(alibi).build();
            finite_forward(&mut built.unwrap()).unwrap();
        }
    }
    for slope in [f32::NAN, f32::INFINITY] {
        let built = Mha::builder(&p, 2)
            .alibi(Alibi::Slopes(vec![slope, 0.5]))
            .build();
        assert_eq!(setting(built), "ALiBi slopes (H)");
    }
}

/// Rotary settings at their limits: out of range at build (a YaRN attention factor that is
/// 0 or infinite in `f32`, the type of its products with cos and sin, included: it would give
/// an all-NaN or all-rotated-to-zero layer), and every position a long context reaches
/// (`max_position` at least `2^31 - 1`) whatever the frequencies.
#[test]
fn rotary_settings_at_the_limits() {
    let p = params::<4>();
    let yarn = |attention_factor| RopeScaling::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 8.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor,
        truncate: true,
    };
    let with = |theta, rotary_dim, scaling| Rope {
        theta,
        rotary_dim,
        layout: RopeLayout::RotateHalf,
        scaling,
    };
    let build = |rope| Mha::builder(&p, 2).rope(rope).build();
    for theta in [0.5, 1.0, 1e-300, 1e300] {
        let mut layer = build(with(theta, 2, RopeScaling::Default)).unwrap();
        finite_forward(&mut layer).unwrap();
    }
    // (Larger factors multiply every score by their square: a finite factor of 1e30 makes
    // ordinary scores overflow, as a softmax scale of 1e60 would; magnitudes are the caller's.)
    for factor in [1e-30, 1.5, 1e3] {
        finite_forward(&mut build(with(1e4, 2, yarn(factor))).unwrap()).unwrap();
    }
    for factor in [1e-300, 1e300] {
        let built = build(with(1e4, 2, yarn(factor)));
        assert_eq!(setting(built), "rope_scaling attention_factor");
    }
    let built = build(with(1e4, 2, yarn(1e300)));
    assert_eq!(
        built.unwrap_err().to_string(),
        "rope_scaling attention_factor is 1e300 (inf in f32), but must be finite and > 0 in f32"
    );
    for theta in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let built = build(with(theta, 2, RopeScaling::Default));
        assert_eq!(setting(built), "rope_theta");
    }
    for rotary_dim in [3, 4, usize::MAX - 1] {
        let built = build(with(1e4, rotary_dim, RopeScaling::Default));
        assert!(
            matches!(built, Err(ShapeError::RotaryDim { .. })),
            "{rotary_dim}"
        );
    }
    // Every position a long context reaches, whatever the frequencies.
    for theta in [0.5, 1.0, 1e4, 1e300] {
        let layer = build(with(theta, 2, RopeScaling::Default)).unwrap();
        assert!(
            layer.rope().unwrap().max_position() >= (1 << 31) - 1,
            "{theta}"
        );
    }
}

/// Zero-width tokens make any batch and length free: a call of `usize::MAX` tokens (which
/// overflowed `2 · rows` in debug builds) is an error, because the attention places queries
/// and keys at signed positions, and so is a rolling cache's position passing `isize::MAX`
/// (the cache is left as it was); smaller calls succeed, and weights too large to exist are
/// an error.
#[test]
fn zero_width_calls_of_any_length() {
    let mut layer = Mha::new(&params::<0>(), 3).unwrap();
    let call = |layer: &mut Mha<0>, b, t| {
        let x = Tokens::new(&[], b, t, 0).unwrap();
        layer.forward_into(
            x,
            AttendOptions::default(),
            Output::new(&mut [], b, t, 0).unwrap(),
        )
    };
    assert_eq!(
        call(&mut layer, 1, usize::MAX),
        Err(ShapeError::Overflow {
            what: "query positions (T)",
            dims: vec![usize::MAX]
        })
    );
    assert_eq!(call(&mut layer, 0, usize::MAX), Ok(()));
    assert_eq!(call(&mut layer, 1, 1 << 40), Ok(()));
    let mut weights = AttentionWeights::new();
    let x = Tokens::new(&[], 1, 1 << 40, 0).unwrap();
    let out = Output::new(&mut [], 1, 1 << 40, 0)
        .unwrap()
        .with_weights(&mut weights);
    assert_eq!(
        layer.forward_into(x, AttendOptions::default(), out),
        Err(ShapeError::Overflow {
            what: "attention weights (B, H, T, S)",
            dims: vec![1, 3, 1 << 40, 1 << 40]
        })
    );
    let memory = Tokens::new(&[], 1, 2, 0).unwrap();
    let x = Tokens::new(&[], 1, usize::MAX, 0).unwrap();
    let out = Output::new(&mut [], 1, usize::MAX, 0).unwrap();
    let crossed = layer.cross_into(x, memory, AttendOptions::default(), out);
    assert!(matches!(
        crossed,
        Err(ShapeError::Overflow {
            what: "query positions (T)",
            ..
        })
    ));

    let mut windowed = Mha::builder(&params::<0>(), 3)
        .sliding_window(2)
        .build()
        .unwrap();
    let chunk = 1 << 62;
    let mut cache = windowed.new_cache(1, chunk).unwrap();
    let step = |layer: &mut Mha<0>, cache: &mut mha::KvCache| {
        let x = Tokens::new(&[], 1, chunk, 0).unwrap();
        let out = Output::new(&mut [], 1, chunk, 0).unwrap();
        layer.decode_into(x, cache, AttendOptions::default(), out)
    };
    step(&mut windowed, &mut cache).unwrap();
    assert_eq!(
        step(&mut windowed, &mut cache),
        Err(ShapeError::Overflow {
            what: "key positions (cached + new tokens)",
            dims: vec![chunk, chunk]
        })
    );
    assert_eq!(cache.len(), chunk, "the refused step appended nothing");
}

/// `is_empty` of `Tokens` and `Output` counts tokens, not values: zero-width tokens are
/// tokens (it once said a batch of 2 × 3 zero-width tokens was empty).
#[test]
fn token_views_are_empty_only_without_tokens() {
    for (b, t, empty) in [
        (2, 3, false),
        (0, 3, true),
        (2, 0, true),
        (usize::MAX, 1, false),
    ] {
        assert_eq!(Tokens::new(&[], b, t, 0).unwrap().is_empty(), empty);
        assert_eq!(Output::new(&mut [], b, t, 0).unwrap().is_empty(), empty);
    }
    assert!(!Tokens::new(&[0.0; 4], 1, 1, 4).unwrap().is_empty());
    assert!(Tokens::new(&[], 0, 5, 4).unwrap().is_empty());
}

/// Additive masks at the ends of the finite range: `±f32::MAX` everywhere, alternating, or
/// 1e30 give finite output (a score plus `f32::MAX` is `f32::MAX`, and the softmax subtracts
/// the row's maximum); `-inf` everywhere hides every key, so the rows are the output bias
/// (zeros here); NaN and `+inf` are errors naming the first such entry.
#[test]
fn additive_masks_at_the_limits() {
    let mut layer = Mha::new(&params::<4>(), 2).unwrap();
    let x = input::<2, 3, 4>(31);
    let mut out = Tensor::<2, 3, 4>::zeros();
    let mut run = |mask: &[f32], out: &mut Tensor<2, 3, 4>| {
        let options = AttendOptions {
            mask: Some(AttnMask::Additive(mask)),
            ..AttendOptions::default()
        };
        layer.forward_into(&x, options, out)
    };
    for value in [f32::MAX, -f32::MAX, 1e30, -1e30] {
        let alternating: Vec<f32> = (0..9)
            .map(|i| if i % 2 == 0 { value } else { -value })
            .collect();
        for mask in [vec![value; 9], alternating] {
            run(&mask, &mut out).unwrap();
            assert!(out.as_slice().iter().all(|v| v.is_finite()), "{mask:?}");
        }
    }
    run(&[f32::NEG_INFINITY; 9], &mut out).unwrap();
    assert!(out.as_slice().iter().all(|&v| v == 0.0));
    for (bad, value) in [(f32::NAN, "NaN"), (f32::INFINITY, "+inf")] {
        let mut mask = [0.0; 9];
        mask[4] = bad;
        let want = ShapeError::MaskValue { index: 4, value };
        assert_eq!(run(&mask, &mut out), Err(want));
    }
}

/// The public GEMM with non-finite values: a NaN or infinity in one row of `A` reaches only
/// that row of `C` (as IEEE arithmetic has it: `NaN · 0` is NaN), on every instruction set and
/// thread count, bit for bit the same, and across the edge of a microtile.
#[test]
fn gemm_keeps_non_finite_rows_apart() {
    let (m, k, n) = (13, 7, 37);
    let mut a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 5) % 9) as f32 * 0.25 - 1.0)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 7) % 11) as f32 * 0.1 - 0.5)
        .collect();
    a[3 * k + 2] = f32::NAN;
    a[12 * k] = f32::INFINITY;
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        let packed = PackedB::from_row_major(isa, &b, k, n).unwrap();
        // Instruction sets may differ in the last bits; thread counts may not.
        let mut one_thread: Option<Vec<u32>> = None;
        for threads in [1, 2, 3] {
            let mut c = vec![f32::NAN; m * n];
            gemm(&a, m, &packed, &mut c, threads).unwrap();
            for (row, values) in c.chunks(n).enumerate() {
                let finite = values.iter().all(|v| v.is_finite());
                assert_eq!(finite, row != 3 && row != 12, "{isa:?} {threads} row {row}");
            }
            let bits: Vec<u32> = c.iter().map(|v| v.to_bits()).collect();
            let want = one_thread.get_or_insert_with(|| bits.clone());
            assert!(bits == *want, "{isa:?}: {threads} threads differ from 1");
        }
    }
}

/// A decoding step refused for any reason (a full cache, too many tokens for a rolling cache,
/// a rotary position past the largest, an ALiBi bias that overflows, options of the wrong
/// length) leaves the cache as it was and the output untouched, and the cache decodes on.
#[test]
fn a_refused_step_changes_nothing() {
    let p = params::<4>();
    let x = input::<2, 2, 4>(32);
    let plain = Mha::new(&p, 2).unwrap();
    let rotary = Mha::builder(&p, 2).rope(rope(1e4)).build().unwrap();
    let beyond_last = [0, 1, usize::MAX, usize::MAX];
    let steep = Mha::builder(&p, 2)
        .alibi(Alibi::Slopes(vec![1.5e38, 0.5]))
        .build()
        .unwrap();
    let rolling = Mha::builder(&p, 2).sliding_window(2).build().unwrap();
    let bad_lengths = [1, 2, 3];
    let cases: [(&str, Mha<4>, usize, AttendOptions); 5] = [
        ("full", plain, 3, AttendOptions::default()),
        (
            "rotary",
            rotary,
            8,
            AttendOptions {
                positions: Some(&beyond_last),
                ..AttendOptions::default()
            },
        ),
        ("alibi", steep, 8, AttendOptions::default()),
        ("chunk", rolling, 2, AttendOptions::default()),
        (
            "options",
            Mha::new(&p, 2).unwrap(),
            8,
            AttendOptions {
                key_lengths: Some(&bad_lengths),
                ..AttendOptions::default()
            },
        ),
    ];
    for (name, mut layer, capacity, bad) in cases {
        let mut cache = layer.new_cache(2, capacity).unwrap();
        let mut out = Tensor::<2, 2, 4>::zeros();
        layer
            .decode_into(&x, &mut cache, AttendOptions::default(), &mut out)
            .unwrap();
        let before = format!("{cache:?}");
        let mut untouched = Tensor::<2, 2, 4>::from_fn(|_, _, _| 5.0);
        let refused = match name {
            "chunk" => {
                let three = input::<2, 3, 4>(33);
                let mut out3 = Tensor::<2, 3, 4>::from_fn(|_, _, _| 5.0);
                let r = layer.decode_into(&three, &mut cache, bad, &mut out3);
                assert!(out3.as_slice().iter().all(|&v| v == 5.0), "{name}");
                r
            }
            _ => layer.decode_into(&x, &mut cache, bad, &mut untouched),
        };
        assert!(refused.is_err(), "{name}: {refused:?}");
        assert_eq!(format!("{cache:?}"), before, "{name}: the cache changed");
        assert!(untouched.as_slice().iter().all(|&v| v == 5.0), "{name}");
        // One more token fits each (a distance of 2, one slot).
        let one = input::<2, 1, 4>(34);
        let mut step = Tensor::<2, 1, 4>::zeros();
        layer
            .decode_into(&one, &mut cache, AttendOptions::default(), &mut step)
            .unwrap();
        assert_eq!(cache.lengths(), [3, 3], "{name}");
    }
}

/// Look-ups of every index type at `usize::MAX` are `None`, never a panic or an overflow.
#[test]
fn lookups_at_usize_max() {
    let heads = split_heads(&input::<1, 2, 4>(35), 2).unwrap();
    let max = usize::MAX;
    // One index at usize::MAX, the others in range.
    let corners = [
        (max, 0, 0, 0),
        (0, max, 0, 0),
        (0, 0, max, 0),
        (0, 0, 0, max),
    ];
    for (b, h, t, j) in corners {
        assert_eq!(heads.get(b, h, t, j), None);
    }
    assert_eq!(heads.head(0, max), None);
    let mut layer = Mha::new(&params::<4>(), 2).unwrap();
    let mut weights = AttentionWeights::new();
    let mut y = Tensor::<1, 2, 4>::zeros();
    let out = Output::from(&mut y).with_weights(&mut weights);
    layer
        .forward_into(&input::<1, 2, 4>(36), AttendOptions::default(), out)
        .unwrap();
    for (b, h, i, j) in corners {
        assert_eq!(weights.get(b, h, i, j), None);
    }
    assert_eq!((weights.head(max, 0), weights.head(0, max)), (None, None));
    let x = input::<1, 2, 4>(37);
    assert_eq!((x.get(max, 0, 0), x.token(0, max)), (None, None));
    assert_eq!(Matrix::<2, 2>::identity().get(max, 0), None);
    let angles = RopeAngles::new(rope(1e4), 2).unwrap();
    assert_eq!((angles.cos_sin(max, 0), angles.cos_sin(0, 1)), (None, None));
}

/// The safetensors writer at its edges: a single 6-bit element is a partial byte (said so,
/// whatever the data's length), names with quotes, backslashes, control characters and
/// non-ASCII round trip, and so do NaN payloads, infinities and -0.0, bit for bit.
#[test]
fn safetensors_writer_round_trips_odd_names_and_values() {
    use mha::safetensors::{serialize, serialize_raw, Dtype, SafeTensors};
    let err = serialize_raw(&[("f6", Dtype::F6E2M3, &[1], &[0])], &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"tensor "f6" of shape [1] fills 1 bytes, the last only partly, but a safetensors tensor must fill whole bytes"#
    );
    let payload = f32::from_bits(0x7fc0_1234);
    let values = [payload, f32::INFINITY, f32::NEG_INFINITY, -0.0];
    let odd = "\"q\\\u{1}\n\té";
    let bytes = serialize(&[("", &[1], &[1.0]), (odd, &[4], &values)], &[(odd, odd)]).unwrap();
    let st = SafeTensors::parse(&bytes).unwrap();
    assert_eq!(st.names().collect::<Vec<_>>(), ["", odd]);
    assert_eq!(st.metadata()[odd], odd);
    let read = st.vector(odd, 4).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&read), bits(&values));
}
