//! Every error path with its exact message, out-of-range look-ups, the traits of `ShapeError`,
//! and a quickcheck that no public function panics on random head counts and buffer lengths.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use common::{assert_bits_eq, weights, Rng};
use mha::kernels::{gemm, PackedB};
use mha::{attention, causal_mask, merge_heads, mha_forward, split_heads};
use mha::{Heads, Isa, Matrix, Mha, MhaParams, ShapeError, Tensor};
use quickcheck::{QuickCheck, TestResult};

fn params<const D: usize>(seed: u64) -> MhaParams<D> {
    let mut rng = Rng::new(seed);
    let mut m = || Matrix::<D, D>::from_vec(weights(&mut rng, D)).unwrap();
    MhaParams::new(m(), m(), m(), m())
}

fn random_x<const B: usize, const T: usize, const D: usize>(seed: u64) -> Tensor<B, T, D> {
    Tensor::from_vec(Rng::new(seed).vec(B * T * D, 1.0)).unwrap()
}

/// Runs `f`, turning a panic into its message.
fn caught<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// Asserts the error and its exact message.
fn assert_error<V: std::fmt::Debug>(got: Result<V, ShapeError>, want: ShapeError, message: &str) {
    let err = got.expect_err(message);
    assert_eq!(err, want);
    assert_eq!(err.to_string(), message);
}

// ---------------------------------------------------------------------------------------------
// Head counts

const ZERO_HEADS: &str = "n_heads must be at least 1, got 0";

#[test]
fn zero_heads_is_an_error_everywhere() {
    let x = random_x::<2, 3, 4>(1);
    let p = params::<4>(2);
    assert_error(split_heads(&x, 0), ShapeError::ZeroHeads, ZERO_HEADS);
    assert_error(mha_forward(&x, &p, 0), ShapeError::ZeroHeads, ZERO_HEADS);
    assert_error(Mha::new(&p, 0), ShapeError::ZeroHeads, ZERO_HEADS);
    for isa in Isa::ALL {
        // The head count is checked before the instruction set.
        assert_error(
            Mha::builder(&p, 0).isa(isa).build(),
            ShapeError::ZeroHeads,
            ZERO_HEADS,
        );
    }
    assert_error(
        Heads::<2, 3, 4>::from_vec(vec![0.0; 24], 0),
        ShapeError::ZeroHeads,
        ZERO_HEADS,
    );
}

#[test]
fn head_count_not_dividing_d_model_is_an_error_everywhere() {
    let x = random_x::<1, 2, 6>(3);
    let p = params::<6>(4);
    for h in [4, 5, 7, 12, 1000] {
        let want = ShapeError::NotDivisible {
            d_model: 6,
            n_heads: h,
        };
        let message = format!("d_model 6 is not divisible by n_heads {h}");
        assert_error(split_heads(&x, h), want.clone(), &message);
        assert_error(mha_forward(&x, &p, h), want.clone(), &message);
        assert_error(Mha::new(&p, h), want.clone(), &message);
        for isa in Isa::ALL {
            assert_error(Mha::builder(&p, h).isa(isa).build(), want.clone(), &message);
        }
        assert_error(
            Heads::<1, 2, 6>::from_vec(vec![0.0; 12], h),
            want.clone(),
            &message,
        );
    }
    // The seed's example of the message, verbatim.
    assert_eq!(
        split_heads(&x, 4).unwrap_err().to_string(),
        "d_model 6 is not divisible by n_heads 4"
    );
    // Every divisor works.
    for h in [1, 2, 3, 6] {
        assert_eq!(split_heads(&x, h).unwrap().n_heads(), h);
        assert!(mha_forward(&x, &p, h).is_ok());
    }
}

// ---------------------------------------------------------------------------------------------
// Buffer lengths

#[test]
fn tensor_from_vec_with_wrong_length() {
    for len in [0, 1, 23, 25, 48] {
        assert_error(
            Tensor::<2, 3, 4>::from_vec(vec![0.0; len]),
            ShapeError::LengthMismatch {
                what: "Tensor (B, T, D)",
                expected: 24,
                actual: len,
            },
            &format!("Tensor (B, T, D) needs 24 elements, but the buffer has {len}"),
        );
    }
    assert!(Tensor::<2, 3, 4>::from_vec(vec![0.0; 24]).is_ok());
    assert!(Tensor::<0, 3, 4>::from_vec(vec![]).is_ok());
}

#[test]
fn matrix_from_vec_with_wrong_length() {
    for len in [0, 11, 13] {
        assert_error(
            Matrix::<3, 4>::from_vec(vec![0.0; len]),
            ShapeError::LengthMismatch {
                what: "Matrix (R, C)",
                expected: 12,
                actual: len,
            },
            &format!("Matrix (R, C) needs 12 elements, but the buffer has {len}"),
        );
    }
    assert!(Matrix::<3, 4>::from_vec(vec![0.0; 12]).is_ok());
}

#[test]
fn heads_from_vec_with_wrong_length() {
    for len in [0, 23, 25] {
        assert_error(
            Heads::<2, 3, 4>::from_vec(vec![0.0; len], 2),
            ShapeError::LengthMismatch {
                what: "Heads (B, H, T, d)",
                expected: 24,
                actual: len,
            },
            &format!("Heads (B, H, T, d) needs 24 elements, but the buffer has {len}"),
        );
    }
    // A bad head count is reported before a bad length.
    assert_error(
        Heads::<2, 3, 4>::from_vec(vec![0.0; 5], 3),
        ShapeError::NotDivisible {
            d_model: 4,
            n_heads: 3,
        },
        "d_model 4 is not divisible by n_heads 3",
    );
}

#[test]
fn shapes_too_large_for_usize() {
    // A const shape whose buffer overflows does not compile (compile_fail doctests in
    // src/tensor.rs and src/heads.rs); an empty one with a huge axis exists, and the (T, T)
    // mask that attention needs for it is too large.
    const HUGE: usize = usize::MAX;
    let message = "mask (T, T) of sizes [18446744073709551615, 18446744073709551615] has more \
                   elements than fit in memory";
    let h = Heads::<0, HUGE, 2>::from_vec(vec![], 1).unwrap();
    let want = ShapeError::Overflow {
        what: "mask (T, T)",
        dims: vec![HUGE, HUGE],
    };
    assert_error(attention(&h, &h, &h, &[]), want, message);
}

// ---------------------------------------------------------------------------------------------
// attention

#[test]
fn attention_with_head_count_mismatch() {
    let x = random_x::<1, 3, 4>(5);
    let two = split_heads(&x, 2).unwrap();
    let four = split_heads(&x, 4).unwrap();
    let one = split_heads(&x, 1).unwrap();
    let mask = causal_mask(3).unwrap();
    assert_error(
        attention(&two, &four, &two, &mask),
        ShapeError::HeadCountMismatch {
            expected: 2,
            actual: 4,
        },
        "head counts differ: queries have 2 heads, another buffer has 4",
    );
    assert_error(
        attention(&two, &two, &one, &mask),
        ShapeError::HeadCountMismatch {
            expected: 2,
            actual: 1,
        },
        "head counts differ: queries have 2 heads, another buffer has 1",
    );
    assert_error(
        attention(&four, &two, &two, &mask),
        ShapeError::HeadCountMismatch {
            expected: 4,
            actual: 2,
        },
        "head counts differ: queries have 4 heads, another buffer has 2",
    );
    assert!(attention(&two, &two, &two, &mask).is_ok());
}

#[test]
fn attention_with_wrong_mask_length() {
    let x = random_x::<2, 3, 4>(6);
    let h = split_heads(&x, 2).unwrap();
    for len in [0, 3, 8, 10, 16] {
        assert_error(
            attention(&h, &h, &h, &vec![true; len]),
            ShapeError::LengthMismatch {
                what: "mask (T, T)",
                expected: 9,
                actual: len,
            },
            &format!("mask (T, T) needs 9 elements, but the buffer has {len}"),
        );
    }
    // causal_mask(t) for the wrong t is the wrong length too.
    assert!(attention(&h, &h, &h, &causal_mask(2).unwrap()).is_err());
    assert!(attention(&h, &h, &h, &causal_mask(3).unwrap()).is_ok());
}

/// With no batch elements there is nothing to compute, but the mask length `T * T` of a huge
/// `T` overflows: that must be an error, not an arithmetic-overflow panic.
#[test]
fn attention_mask_length_overflow_is_an_error_not_a_panic() {
    const T: usize = 1 << 33;
    let q = Heads::<0, T, 4>::from_vec(vec![], 2).unwrap();
    let result = caught(|| attention(&q, &q, &q, &[]).map(|_| ()))
        .unwrap_or_else(|panic| panic!("attention panicked on T = 2^33: {panic}"));
    assert!(
        result.is_err(),
        "no mask of T * T values can exist for T = 2^33"
    );
}

// ---------------------------------------------------------------------------------------------
// Instruction sets

#[test]
fn unsupported_instruction_sets_are_errors() {
    let p = params::<4>(8);
    for isa in Isa::ALL {
        let layer = Mha::builder(&p, 2).isa(isa).build();
        let packed = PackedB::from_row_major(isa, &[1.0; 6], 2, 3);
        if isa.is_supported() {
            assert_eq!(layer.unwrap().isa(), isa);
            assert_eq!(packed.unwrap().isa(), isa);
        } else {
            let message = format!(
                "instruction set {} is not available on this CPU",
                isa.name()
            );
            assert_error(
                layer,
                ShapeError::UnsupportedIsa { isa: isa.name() },
                &message,
            );
            assert_error(
                packed,
                ShapeError::UnsupportedIsa { isa: isa.name() },
                &message,
            );
        }
    }
    assert!(Isa::Portable.is_supported());
    assert!(Isa::detect().is_supported());
}

#[test]
fn gemm_with_wrong_lengths() {
    let b = PackedB::from_row_major(Isa::Portable, &[1.0; 6], 2, 3).unwrap();
    let mut c = [0.0; 6];
    assert_error(
        gemm(&[1.0; 5], 2, &b, &mut c, 1),
        ShapeError::LengthMismatch {
            what: "matrix A (m, k)",
            expected: 4,
            actual: 5,
        },
        "matrix A (m, k) needs 4 elements, but the buffer has 5",
    );
    assert_error(
        gemm(&[1.0; 4], 2, &b, &mut c[..5], 1),
        ShapeError::LengthMismatch {
            what: "matrix C (m, n)",
            expected: 6,
            actual: 5,
        },
        "matrix C (m, n) needs 6 elements, but the buffer has 5",
    );
    assert_error(
        PackedB::from_row_major(Isa::Portable, &[1.0; 5], 2, 3),
        ShapeError::LengthMismatch {
            what: "matrix B (k, n)",
            expected: 6,
            actual: 5,
        },
        "matrix B (k, n) needs 6 elements, but the buffer has 5",
    );
    gemm(&[1.0; 4], 2, &b, &mut c, 1).unwrap();
    assert_eq!(c, [2.0; 6]);
}

// ---------------------------------------------------------------------------------------------
// Degenerate but valid shapes

/// `D = 0` is a valid model width (every head count divides it, and `split_heads` accepts it),
/// so the layer must not panic on it.
#[test]
fn zero_width_model_does_not_panic() {
    let x = Tensor::<1, 2, 0>::zeros();
    assert!(split_heads(&x, 3).is_ok());
    let p = MhaParams::new(
        Matrix::<0, 0>::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
    );
    let layer = caught(|| Mha::new(&p, 1).map(|_| ()));
    layer
        .unwrap_or_else(|panic| panic!("Mha::new panicked for D = 0: {panic}"))
        .unwrap();
    let y = caught(|| mha_forward(&x, &p, 1))
        .unwrap_or_else(|panic| panic!("mha_forward panicked for D = 0: {panic}"))
        .unwrap();
    assert!(y.as_slice().is_empty());
}

/// A `(0, n)` matrix packs, and multiplying by it gives zeros.
#[test]
fn zero_inner_dimension_gemm_does_not_panic() {
    let b = caught(|| PackedB::from_row_major(Isa::Portable, &[], 0, 3))
        .unwrap_or_else(|panic| panic!("PackedB::from_row_major panicked for k = 0: {panic}"))
        .unwrap();
    let mut c = [f32::NAN; 6];
    gemm(&[], 2, &b, &mut c, 1).unwrap();
    assert_eq!(c, [0.0; 6]);
}

/// `B = 0` or `T = 0`: nothing to compute, an empty output, no panic.
#[test]
fn empty_batches_and_sequences_work() {
    let p = params::<4>(9);
    let mut panicked = Vec::new();
    let mut check = |name: &str, run: &dyn Fn() -> usize| match caught(run) {
        Ok(len) => assert_eq!(len, 0, "{name}"),
        Err(panic) => panicked.push(format!("{name}: {panic}")),
    };
    check("mha_forward B = 0", &|| {
        mha_forward(&Tensor::<0, 3, 4>::zeros(), &p, 2)
            .unwrap()
            .into_vec()
            .len()
    });
    check("mha_forward T = 0", &|| {
        mha_forward(&Tensor::<2, 0, 4>::zeros(), &p, 2)
            .unwrap()
            .into_vec()
            .len()
    });
    check("Mha::forward_into T = 0", &|| {
        let mut out = Tensor::<2, 0, 4>::zeros();
        Mha::new(&p, 4)
            .unwrap()
            .forward_into(
                &Tensor::<2, 0, 4>::zeros(),
                mha::AttendOptions::default(),
                &mut out,
            )
            .unwrap();
        out.into_vec().len()
    });
    check("split_heads T = 0", &|| {
        split_heads(&Tensor::<2, 0, 4>::zeros(), 4)
            .unwrap()
            .into_vec()
            .len()
    });
    check("attention T = 0", &|| {
        let h = split_heads(&Tensor::<2, 0, 4>::zeros(), 4).unwrap();
        attention(&h, &h, &h, &causal_mask(0).unwrap())
            .unwrap()
            .into_vec()
            .len()
    });
    check("attention B = 0", &|| {
        let h = split_heads(&Tensor::<0, 5, 4>::zeros(), 2).unwrap();
        attention(&h, &h, &h, &causal_mask(5).unwrap())
            .unwrap()
            .into_vec()
            .len()
    });
    check("causal_mask(0)", &|| causal_mask(0).unwrap().len());
    assert!(panicked.is_empty(), "panicked: {panicked:?}");
}

// ---------------------------------------------------------------------------------------------
// Out-of-range look-ups

#[test]
fn get_returns_none_out_of_range() {
    let x = Tensor::<2, 3, 4>::from_fn(|b, t, i| (b * 100 + t * 10 + i) as f32);
    assert_eq!(x.get(1, 2, 3), Some(123.0));
    assert_eq!(x.get(2, 0, 0), None);
    assert_eq!(x.get(0, 3, 0), None);
    assert_eq!(x.get(0, 0, 4), None);
    assert_eq!(x.get(usize::MAX, usize::MAX, usize::MAX), None);
    assert_eq!(x.token(1, 2), Some(&[120.0, 121.0, 122.0, 123.0][..]));
    assert_eq!(x.token(2, 0), None);
    assert_eq!(x.token(0, 3), None);

    let m = Matrix::<2, 3>::from_fn(|r, c| (r * 10 + c) as f32);
    assert_eq!(m.get(1, 2), Some(12.0));
    assert_eq!(m.get(2, 0), None);
    assert_eq!(m.get(0, 3), None);
    assert_eq!(m.transpose().get(2, 1), Some(12.0));
    assert_eq!(m.transpose().get(1, 2), None);

    let h = split_heads(&x, 2).unwrap();
    assert_eq!(h.get(1, 1, 2, 1), Some(123.0));
    assert_eq!(h.get(2, 0, 0, 0), None);
    assert_eq!(h.get(0, 2, 0, 0), None);
    assert_eq!(h.get(0, 0, 3, 0), None);
    assert_eq!(
        h.get(0, 0, 0, 2),
        None,
        "j must be below the head width d = 2, not D"
    );
    assert_eq!(
        h.head(1, 1),
        Some(&[102.0, 103.0, 112.0, 113.0, 122.0, 123.0][..])
    );
    assert_eq!(h.head(2, 0), None);
    assert_eq!(h.head(0, 2), None);
}

fn panic_message(result: Result<(), String>) -> String {
    result.expect_err("expected a panic")
}

#[test]
fn indexing_out_of_range_panics_with_the_shape() {
    let mut x = Tensor::<1, 2, 4>::zeros();
    let message = panic_message(caught(|| {
        let _ = Tensor::<1, 2, 4>::zeros()[(0, 2, 0)];
    }));
    assert_eq!(message, "index (0, 2, 0) out of range for Tensor (1, 2, 4)");
    let message = panic_message(caught(|| x[(0, 0, 4)] = 1.0));
    assert_eq!(message, "index (0, 0, 4) out of range for Tensor (1, 2, 4)");
    let mut m = Matrix::<2, 3>::zeros();
    let message = panic_message(caught(|| {
        let _ = Matrix::<2, 3>::zeros()[(2, 0)];
    }));
    assert_eq!(message, "index (2, 0) out of range for Matrix (2, 3)");
    let message = panic_message(caught(|| m[(0, 3)] = 1.0));
    assert_eq!(message, "index (0, 3) out of range for Matrix (2, 3)");
}

// ---------------------------------------------------------------------------------------------
// ShapeError itself

#[test]
fn shape_error_traits() {
    fn assert_traits<E>()
    where
        E: std::error::Error + Clone + PartialEq + Eq + std::fmt::Debug + Send + Sync + 'static,
    {
    }
    assert_traits::<ShapeError>();

    let errors = [
        ShapeError::ZeroHeads,
        ShapeError::NotDivisible {
            d_model: 6,
            n_heads: 4,
        },
        ShapeError::LengthMismatch {
            what: "mask (T, T)",
            expected: 9,
            actual: 8,
        },
        ShapeError::HeadCountMismatch {
            expected: 2,
            actual: 4,
        },
        ShapeError::TooLarge,
        ShapeError::UnsupportedIsa { isa: "avx512" },
    ];
    for (i, e) in errors.iter().enumerate() {
        assert_eq!(e.clone(), *e);
        for (j, other) in errors.iter().enumerate() {
            assert_eq!(i == j, e == other, "{e:?} vs {other:?}");
        }
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e.clone());
        assert_eq!(boxed.to_string(), e.to_string());
        assert!(boxed.source().is_none());
        assert!(!format!("{e:?}").is_empty());
    }
    // Variants differing only in a number are different errors.
    assert_ne!(
        ShapeError::NotDivisible {
            d_model: 6,
            n_heads: 4
        },
        ShapeError::NotDivisible {
            d_model: 6,
            n_heads: 5
        }
    );
    // `?` converts it into a boxed error.
    fn boxed() -> Result<(), Box<dyn std::error::Error>> {
        split_heads(&Tensor::<1, 1, 6>::zeros(), 4)?;
        Ok(())
    }
    assert_eq!(
        boxed().unwrap_err().to_string(),
        "d_model 6 is not divisible by n_heads 4"
    );
}

// ---------------------------------------------------------------------------------------------
// No public function panics on random head counts and buffer lengths

/// A length near `exact` (exact, one off either way, empty) or anything up to `2 * exact + 2`.
fn pick_len(pick: u16, exact: usize) -> usize {
    match pick % 5 {
        0 => exact,
        1 => exact + 1,
        2 => exact.saturating_sub(1),
        3 => 0,
        _ => usize::from(pick / 5) % (2 * exact + 3),
    }
}

fn is_head_error(err: &ShapeError, d_model: usize, n_heads: usize) -> bool {
    match err {
        ShapeError::ZeroHeads => n_heads == 0,
        ShapeError::NotDivisible {
            d_model: dm,
            n_heads: h,
        } => *dm == d_model && *h == n_heads && n_heads != 0 && !d_model.is_multiple_of(n_heads),
        _ => false,
    }
}

fn is_length_error(err: &ShapeError, expected: usize, actual: usize) -> bool {
    matches!(err, ShapeError::LengthMismatch { expected: e, actual: a, .. }
        if *e == expected && *a == actual && expected != actual)
}

/// Calls every public entry point with a random head count (0..40), random buffer lengths and
/// random indices, and checks each returns Ok exactly when the arguments are valid, and the
/// right error otherwise, without panicking.
#[allow(clippy::too_many_arguments)]
fn exercise<const B: usize, const T: usize, const D: usize>(
    heads: u8,
    other_heads: u8,
    len: u16,
    mask_len: u16,
    indices: Vec<u8>,
    threads: u8,
    seed: u64,
) {
    let n = B * T * D;
    let h = usize::from(heads % 40);
    let hk = usize::from(other_heads % 40);
    let valid = |h: usize| h != 0 && D.is_multiple_of(h);

    // Constructors.
    let l = pick_len(len, n);
    match Tensor::<B, T, D>::from_vec(vec![0.5; l]) {
        Ok(x) => assert!(l == n && x.as_slice().len() == n),
        Err(e) => assert!(is_length_error(&e, n, l), "{e:?}"),
    }
    let lm = pick_len(len, D * D);
    match Matrix::<D, D>::from_vec(vec![0.5; lm]) {
        Ok(_) => assert_eq!(lm, D * D),
        Err(e) => assert!(is_length_error(&e, D * D, lm), "{e:?}"),
    }
    match Heads::<B, T, D>::from_vec(vec![0.5; l], h) {
        Ok(heads) => assert!(valid(h) && l == n && heads.n_heads() == h),
        Err(e) if !valid(h) => assert!(is_head_error(&e, D, h), "{e:?}"),
        Err(e) => assert!(is_length_error(&e, n, l), "{e:?}"),
    }

    // Splitting, the layer and mha_forward.
    let x = random_x::<B, T, D>(seed);
    let p = params::<D>(seed.wrapping_add(1));
    match split_heads(&x, h) {
        Ok(split) => {
            assert!(valid(h));
            assert_eq!(merge_heads(&split), x);
        }
        Err(e) => assert!(is_head_error(&e, D, h), "{e:?}"),
    }
    let forward = mha_forward(&x, &p, h);
    match &forward {
        Ok(y) => {
            assert!(valid(h));
            assert!(y.as_slice().iter().all(|v| v.is_finite()));
        }
        Err(e) => assert!(is_head_error(e, D, h), "{e:?}"),
    }
    match Mha::builder(&p, h)
        .threads(usize::from(threads % 9))
        .build()
    {
        Ok(mut layer) => {
            let y = layer.forward(&x).unwrap();
            assert_bits_eq(
                y.as_slice(),
                forward.unwrap().as_slice(),
                "layer vs mha_forward",
            );
        }
        Err(e) => assert!(is_head_error(&e, D, h), "{e:?}"),
    }
    for isa in Isa::ALL {
        match Mha::builder(&p, h).isa(isa).build() {
            Ok(layer) => assert!(valid(h) && isa.is_supported() && layer.isa() == isa),
            Err(e) if !valid(h) => assert!(is_head_error(&e, D, h), "{e:?}"),
            Err(e) => assert_eq!(e, ShapeError::UnsupportedIsa { isa: isa.name() }),
        }
    }

    // attention with possibly different head counts and a possibly wrong mask.
    let mask = vec![true; pick_len(mask_len, T * T)];
    if valid(h) {
        let q = split_heads(&x, h).unwrap();
        let k_heads = if valid(hk) { hk } else { h };
        let k = split_heads(&x, k_heads).unwrap();
        match attention(&q, &k, &k, &mask) {
            Ok(out) => assert!(k_heads == h && mask.len() == T * T && out.n_heads() == h),
            Err(ShapeError::HeadCountMismatch { expected, actual }) => {
                assert!(expected == h && actual == k_heads && k_heads != h)
            }
            Err(e) => assert!(
                k_heads == h && is_length_error(&e, T * T, mask.len()),
                "{e:?}"
            ),
        }
        match attention(&q, &q, &k, &causal_mask(T).unwrap()) {
            Ok(_) => assert_eq!(k_heads, h),
            Err(e) => assert_eq!(
                e,
                ShapeError::HeadCountMismatch {
                    expected: h,
                    actual: k_heads
                }
            ),
        }
    }
    let t = usize::from(mask_len % 50);
    assert_eq!(causal_mask(t).unwrap().len(), t * t);

    // Look-ups at random indices, in or out of range.
    let at = |k: usize| usize::from(indices.get(k).copied().unwrap_or(0) % 16);
    let (b, t, i, j) = (at(0), at(1), at(2), at(3));
    assert_eq!(x.get(b, t, i).is_some(), b < B && t < T && i < D);
    assert_eq!(x.token(b, t).is_some(), b < B && t < T);
    assert_eq!(p.wq.get(i, j).is_some(), i < D && j < D);
    if valid(h) {
        let split = split_heads(&x, h).unwrap();
        let d = D / h;
        assert_eq!(
            split.get(b, j, t, i).is_some(),
            b < B && j < h && t < T && i < d
        );
        assert_eq!(split.head(b, j).is_some(), b < B && j < h);
    }
}

type Exercise = fn(u8, u8, u16, u16, Vec<u8>, u8, u64) -> TestResult;

fn no_panic<const B: usize, const T: usize, const D: usize>(
    heads: u8,
    other_heads: u8,
    len: u16,
    mask_len: u16,
    indices: Vec<u8>,
    threads: u8,
    seed: u64,
) -> TestResult {
    match caught(|| exercise::<B, T, D>(heads, other_heads, len, mask_len, indices, threads, seed))
    {
        Ok(()) => TestResult::passed(),
        Err(panic) => TestResult::error(format!("B{B} T{T} D{D}: {panic}")),
    }
}

macro_rules! no_panic_shapes {
    ($($b:literal $t:literal $d:literal),+ $(,)?) => {
        $(
            QuickCheck::new()
                .tests(60)
                .quickcheck(no_panic::<$b, $t, $d> as Exercise);
        )+
    };
}

#[test]
fn no_public_function_panics() {
    no_panic_shapes![
        1 1 1,
        1 2 4,
        2 3 6,
        1 5 12,
        3 2 7,
        2 4 9,
        1 3 30,
        2 1 36,
        1 9 24,
    ];
}

/// The same with an empty batch or an empty sequence.
#[test]
fn no_public_function_panics_on_empty_shapes() {
    no_panic_shapes![0 3 4, 1 0 6, 0 0 2];
}

/// Counts of one take the singular, from real calls: "1 token", not "1 tokens".
#[test]
fn messages_count_one_in_the_singular() {
    let p = params::<4>(40);
    let mut layer = Mha::new(&p, 2).unwrap();
    let x = random_x::<1, 1, 4>(41);
    let mut out = Tensor::<1, 1, 4>::zeros();
    let key_lengths = mha::AttendOptions {
        key_lengths: Some(&[2]),
        ..Default::default()
    };
    assert_error(
        layer.forward_into(&x, key_lengths, &mut out),
        ShapeError::KeyLength {
            batch: 0,
            length: 2,
            keys: 1,
        },
        "key length 2 of batch element 0 is longer than the 1 key",
    );
    let token_lengths = mha::AttendOptions {
        token_lengths: Some(&[2]),
        ..Default::default()
    };
    assert_error(
        layer.forward_into(&x, token_lengths, &mut out),
        ShapeError::TokenLength {
            batch: 0,
            length: 2,
            tokens: 1,
        },
        "token length 2 of batch element 0 is longer than the call's 1 token",
    );
    let mut cache = layer.new_cache(1, 1).unwrap();
    let options = mha::AttendOptions::default();
    layer
        .decode_into(&x, &mut cache, options, &mut out)
        .unwrap();
    assert_error(
        layer.decode_into(&x, &mut cache, options, &mut out),
        ShapeError::CacheFull {
            sequence: 0,
            capacity: 1,
            cached: 1,
            new: 1,
        },
        "KV cache of capacity 1 holds 1 token of sequence 0 and cannot take 1 more",
    );
    assert_error(
        cache.clear_sequence(1),
        ShapeError::SequenceIndex {
            sequence: 1,
            batch: 1,
        },
        "sequence 1 is past the batch of 1 sequence",
    );
    let mut windowed = Mha::builder(&p, 2).sliding_window(4).build().unwrap();
    let mut rolling = windowed.new_cache(1, 1).unwrap();
    let two = random_x::<1, 2, 4>(42);
    assert_error(
        windowed.decode_into(&two, &mut rolling, options, &mut Tensor::<1, 2, 4>::zeros()),
        ShapeError::WindowChunk {
            sequence: 0,
            new: 2,
            chunk: 1,
            window: 4,
        },
        "rolling KV cache of window 4 takes at most 1 token per call, but sequence 0 appends 2",
    );
    assert_error(
        Tensor::<1, 1, 1>::from_vec(vec![]),
        ShapeError::LengthMismatch {
            what: "Tensor (B, T, D)",
            expected: 1,
            actual: 0,
        },
        "Tensor (B, T, D) needs 1 element, but the buffer has 0",
    );
    let one = split_heads(&random_x::<1, 2, 4>(43), 1).unwrap();
    let two_heads = split_heads(&random_x::<1, 2, 4>(44), 2).unwrap();
    assert_error(
        attention(&one, &two_heads, &one, &causal_mask(2).unwrap()),
        ShapeError::HeadCountMismatch {
            expected: 1,
            actual: 2,
        },
        "head counts differ: queries have 1 head, another buffer has 2",
    );
}
