//! Accuracy of `mha::kernels::exp::exp` in ulps.
//!
//! Reference: `f64::exp` (the platform libm, accurate to well under 1 f64 ulp) rounded to
//! `f32`. That is the correctly rounded `f32` result except when `e^x` lies within ~2^-29
//! relative of a midpoint between two floats, where the double rounding can be off by one ulp;
//! so "≤ 1 ulp against this reference" means "≤ 2 ulp against the correctly rounded result" in
//! the worst case, and the assertion allows 2.
//!
//! The sweep (`MHA_EXP_STRIDE`, default 61, sets its density for slow runs such as valgrind):
//! every `stride`-th bit pattern (a stride coprime to 64, so all low-bit patterns occur) over
//! `[-104, 89]`, i.e. every input whose result is finite and nonzero; every float in `[-104, -103]`
//! (subnormal results and the underflow edge) and in `[88, 89]` (the overflow edge); `[-1, 1]` in
//! steps of 1e-4; the special values. The exhaustive check of all 2^32 inputs is `#[ignore]`d:
//! `cargo test --release --test exp -- --ignored`.

#[path = "common/ulp.rs"]
mod ulp;

use mha::kernels::exp::exp;
use ulp::ordinal;

/// The reference: `f64::exp` rounded to `f32`.
fn reference(x: f32) -> f32 {
    f64::from(x).exp() as f32
}

/// Ulps between `exp(x)` and the reference; `None` when both are NaN.
fn ulp_error(x: f32) -> Option<u64> {
    let (got, want) = (exp(x), reference(x));
    if want.is_nan() {
        assert!(got.is_nan(), "exp({x:e}) = {got:e}, expected NaN");
        return None;
    }
    assert!(!got.is_nan(), "exp({x:e}) = NaN, expected {want:e}");
    Some(ordinal(got).abs_diff(ordinal(want)))
}

/// The sweep's inputs, in no particular order.
fn sweep() -> impl Iterator<Item = f32> {
    let stride = ulp::stride("MHA_EXP_STRIDE");
    let positive = (0..=89.0f32.to_bits()).step_by(stride).map(f32::from_bits);
    let negative = (0x8000_0000..=(-104.0f32).to_bits())
        .step_by(stride)
        .map(f32::from_bits);
    let range = |lo: f32, hi: f32| (lo.to_bits()..=hi.to_bits()).map(f32::from_bits);
    let underflow_edge = range(-103.0, -104.0);
    let overflow_edge = range(88.0, 89.0);
    let unit = (-10_000..=10_000).map(|i| i as f32 * 1e-4);
    positive
        .chain(negative)
        .chain(underflow_edge)
        .chain(overflow_edge)
        .chain(unit)
        .chain(special_values())
}

/// Zeros, infinities, NaNs, extremes, subnormal arguments, and the edges of the clamp.
fn special_values() -> impl Iterator<Item = f32> {
    [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7fa0_0000), // a signalling NaN
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::EPSILON,
        -f32::EPSILON,
        1.0,
        -1.0,
        88.722_84,
        88.722_83,
        -103.972_08,
        -103.972_07,
        -87.336_55, // the smallest normal result
        -104.0,
        89.0,
        -104.000_01,
        89.000_01,
        1e10,
        -1e10,
    ]
    .into_iter()
}

#[test]
fn max_ulp_error_over_the_sweep() {
    let (mut worst, mut worst_x, mut count) = (0, 0.0f32, 0u64);
    for x in sweep() {
        if let Some(ulps) = ulp_error(x) {
            if ulps > worst {
                (worst, worst_x) = (ulps, x);
            }
        }
        count += 1;
    }
    println!(
        "exp: max error {worst} ulp (at x = {worst_x:e}: {:e} vs {:e}) over {count} inputs",
        exp(worst_x),
        reference(worst_x)
    );
    assert!(worst <= 2, "max error {worst} ulp at x = {worst_x:e}");
}

#[test]
fn special_values_are_exact() {
    assert_eq!(exp(0.0), 1.0);
    assert_eq!(exp(-0.0), 1.0);
    assert_eq!(exp(f32::NEG_INFINITY).to_bits(), 0);
    assert_eq!(exp(f32::INFINITY), f32::INFINITY);
    assert!(exp(f32::NAN).is_nan());
    assert!(exp(-f32::NAN).is_nan());
    assert!(exp(f32::from_bits(0x7fa0_0000)).is_nan());
    assert_eq!(exp(f32::MAX), f32::INFINITY);
    assert_eq!(exp(f32::MIN).to_bits(), 0);
    // Overflow and underflow exactly at the thresholds of the correctly rounded function.
    for x in [88.0f32, 88.5, 88.722_83, 88.722_84, 88.73, 89.0, 100.0] {
        assert_eq!(exp(x), reference(x), "exp({x})");
    }
    for x in [
        -103.0f32,
        -103.5,
        -103.972_07,
        -103.972_08,
        -103.98,
        -104.0,
        -200.0,
    ] {
        assert_eq!(exp(x).to_bits(), reference(x).to_bits(), "exp({x})");
    }
    // Tiny arguments give exactly 1.
    for x in [f32::from_bits(1), 1e-30, -1e-30, 1e-9, -1e-9] {
        assert_eq!(exp(x), 1.0, "exp({x:e})");
    }
}

#[test]
fn results_are_monotonic_near_one() {
    let mut previous = 0.0f32;
    for i in -100_000..=100_000 {
        let y = exp(i as f32 * 1e-5);
        assert!(y >= previous, "exp not monotonic at {}", i as f32 * 1e-5);
        previous = y;
    }
}

/// Every `f32`, on all cores. A few minutes in release mode.
#[test]
#[ignore = "exhaustive over 2^32 inputs: run with --release -- --ignored"]
fn exhaustive_max_ulp_error() {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let per = (1u64 << 32).div_ceil(threads);
    let results: Vec<(u64, f32)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let (mut worst, mut worst_x) = (0, 0.0f32);
                    for bits in (t * per)..((t + 1) * per).min(1 << 32) {
                        let x = f32::from_bits(bits as u32);
                        if let Some(ulps) = ulp_error(x) {
                            if ulps > worst {
                                (worst, worst_x) = (ulps, x);
                            }
                        }
                    }
                    (worst, worst_x)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (worst, worst_x) = results.into_iter().max_by_key(|r| r.0).unwrap();
    println!("exp, all 2^32 inputs: max error {worst} ulp (at x = {worst_x:e})");
    assert!(worst <= 2);
}
