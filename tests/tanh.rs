//! Accuracy of `mha::kernels::tanh::tanh` in ulps.
//!
//! Reference: `f64::tanh` rounded to `f32` (the correctly rounded result except within ~2^-29
//! of a midpoint, where the double rounding can be off by one ulp). The sweep
//! (`MHA_TANH_STRIDE`, default 61): every `stride`-th bit pattern of either sign up to
//! `|x| = 10` (past 9.01 the result rounds to ±1, checked separately), every float within 5,000
//! of the switch between the polynomial and the `exp` formula at 0.625, `[-1, 1]` in steps of
//! 1e-4, large arguments, signed zeros, subnormals, infinities and NaN. The bound asserted is
//! 2 ulp; the measured maximum is printed.

#[path = "common/ulp.rs"]
mod ulp;

use mha::kernels::tanh::tanh;
use ulp::ordinal;

/// The reference: `f64::tanh` rounded to `f32`.
fn reference(x: f32) -> f32 {
    f64::from(x).tanh() as f32
}

/// Ulps between `tanh(x)` and the reference (NaN to NaN is 0; a zero of the wrong sign fails).
fn ulp_error(x: f32) -> u64 {
    let (got, want) = (tanh(x), reference(x));
    if want.is_nan() {
        assert!(got.is_nan(), "tanh({x:e}) = {got:e}, expected NaN");
        return 0;
    }
    assert_eq!(
        got.is_sign_negative(),
        want.is_sign_negative(),
        "tanh({x:e}) = {got:e}: sign"
    );
    ordinal(got).abs_diff(ordinal(want))
}

#[test]
fn max_ulp_error_over_the_sweep() {
    let s = ulp::stride("MHA_TANH_STRIDE");
    let bits = |lo: f32, hi: f32, step: usize| {
        (lo.to_bits()..=hi.to_bits())
            .step_by(step)
            .map(f32::from_bits)
    };
    let switch = 0.625f32.to_bits();
    let near_switch = (switch - 5000..=switch + 5000).map(f32::from_bits);
    let xs = bits(0.0, 10.0, s)
        .chain(bits(-0.0, -10.0, s))
        .chain(near_switch.clone().map(|x| -x))
        .chain(near_switch)
        .chain((-10_000..=10_000).map(|i| i as f32 * 1e-4));
    let (mut worst, mut worst_x, mut count) = (0, 0.0f32, 0u64);
    for x in xs {
        let ulps = ulp_error(x);
        if ulps > worst {
            (worst, worst_x) = (ulps, x);
        }
        count += 1;
    }
    println!(
        "tanh: max error {worst} ulp (at x = {worst_x:e}: {:e} vs {:e}) over {count} inputs",
        tanh(worst_x),
        reference(worst_x)
    );
    assert!(worst <= 2, "max error {worst} ulp at x = {worst_x:e}");
}

#[test]
fn special_values_are_exact() {
    assert_eq!(tanh(0.0).to_bits(), 0.0f32.to_bits());
    assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(tanh(f32::INFINITY), 1.0);
    assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
    for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7fa0_0000)] {
        assert!(tanh(nan).is_nan());
    }
    // Subnormal and tiny arguments give themselves, with their sign.
    for x in [
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        1e-30,
        -1e-20,
        1e-6,
    ] {
        assert_eq!(tanh(x).to_bits(), x.to_bits(), "tanh({x:e})");
    }
    // Past 9.01 the result rounds to ±1; the exp inside overflows past 44.4.
    for x in [9.1f32, 20.0, 44.0, 44.5, 89.0, 1e10, f32::MAX] {
        assert_eq!(tanh(x), 1.0, "tanh({x:e})");
        assert_eq!(tanh(-x), -1.0, "tanh({:e})", -x);
    }
}

#[test]
fn odd_and_monotonic() {
    let mut previous = -1.0f32;
    for i in -200_000..=200_000 {
        let x = i as f32 * 5e-5;
        let y = tanh(x);
        assert_eq!(tanh(-x).to_bits(), (-y).to_bits(), "tanh not odd at {x}");
        assert!(y >= previous, "tanh not monotonic at {x}");
        previous = y;
    }
}
