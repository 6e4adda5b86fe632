//! Accuracy of `mha::kernels::trig::sin_cos`, the crate's own sine and cosine (the rotary
//! embedding's angles).
//!
//! Reference: the platform's `f64::sin` / `f64::cos` (glibc's are correctly rounded in
//! practice), rounded to `f32` as the rotation rounds. As for `exp`, the double rounding can put
//! that reference one ulp from the correctly rounded `f32` result, so "≤ 1 ulp against this
//! reference" means "≤ 2 ulp against the correctly rounded result" in the worst case, and the
//! assertions allow 2. The `f64` results themselves are also held to an absolute error.
//!
//! Sweeps: a dense grid over `[-1e6, 1e6]` (the angles of a million positions), the angles of
//! real rotary embeddings (`position · theta^(-2i/d)` for several `theta`, `d`), the doubles
//! nearest to multiples of `π/2` up to `1e6` and their neighbours (where the reduction must not
//! cancel), random angles up to `MAX_ANGLE`, `[-1, 1]` finely, tiny and special values.

mod common;
#[path = "common/ulp.rs"]
mod ulp;

use common::Rng;
use mha::kernels::trig::{sin_cos, MAX_ANGLE};
use ulp::ordinal;

/// The worst errors over a sweep: `f32` ulps of sin and cos, and the `f64` absolute error.
#[derive(Default, Debug)]
struct Worst {
    ulps: u64,
    ulps_at: f64,
    /// Results not equal to the rounded reference.
    off: usize,
    abs: f64,
    abs_at: f64,
    count: usize,
}

impl Worst {
    fn add(&mut self, x: f64) {
        let (s, c) = sin_cos(x);
        for (got, want) in [(s, x.sin()), (c, x.cos())] {
            let ulps = ordinal(got as f32).abs_diff(ordinal(want as f32));
            self.off += usize::from(ulps > 0);
            if ulps > self.ulps {
                (self.ulps, self.ulps_at) = (ulps, x);
            }
            let abs = (got - want).abs();
            if abs > self.abs {
                (self.abs, self.abs_at) = (abs, x);
            }
        }
        self.count += 1;
    }

    fn check(&self, name: &str) {
        println!("{name}: {self:?}");
        assert!(
            self.ulps <= 2,
            "{name}: {} ulp at x = {:e}",
            self.ulps,
            self.ulps_at
        );
        assert!(
            self.abs <= 4e-16,
            "{name}: f64 error {:e} at x = {:e}",
            self.abs,
            self.abs_at
        );
    }
}

fn sweep(name: &str, xs: impl Iterator<Item = f64>) {
    let mut worst = Worst::default();
    for x in xs {
        worst.add(x);
        worst.add(-x);
    }
    worst.check(name);
}

#[test]
fn grid_up_to_a_million() {
    // A step that is no simple fraction of π, so every phase occurs.
    sweep(
        "grid",
        (0..2_000_000).map(|i| i as f64 * 0.500_000_123_456_7),
    );
}

#[test]
fn angles_of_rotary_embeddings() {
    let mut angles = Vec::new();
    for theta in [10_000.0f64, 500_000.0, 1_000_000.0] {
        for dim in [128, 18] {
            let inv: Vec<f64> = (0..dim / 2)
                .map(|i| 1.0 / theta.powf((2 * i) as f64 / dim as f64))
                .collect();
            for p in (0..1_000_000).step_by(997).chain(0..2_000) {
                angles.extend(inv.iter().map(|&f| p as f64 * f));
            }
        }
    }
    sweep("rotary", angles.into_iter());
}

#[test]
fn near_multiples_of_half_pi() {
    let xs = (1..1_000_000u64).step_by(7).flat_map(|k| {
        let x = k as f64 * core::f64::consts::FRAC_PI_2;
        (-3i64..=3).map(move |d| f64::from_bits((x.to_bits() as i64 + d) as u64))
    });
    sweep("near k·π/2", xs);
}

#[test]
fn random_up_to_max_angle() {
    let mut rng = Rng::new(7);
    let xs = (0..500_000).map(move |_| {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        // Log-uniform magnitudes from 1 to MAX_ANGLE, and the top of the range.
        let x = MAX_ANGLE.powf(u);
        if u < 0.01 {
            MAX_ANGLE * (1.0 - u)
        } else {
            x
        }
    });
    sweep("random", xs);
}

#[test]
fn small_and_special_values() {
    sweep("unit", (0..=200_000).map(|i| i as f64 * 1e-5));
    sweep(
        "tiny",
        [
            1e-300,
            1e-30,
            1e-10,
            f64::MIN_POSITIVE,
            5e-324,
            2.0f64.powi(-27),
        ]
        .into_iter(),
    );
    assert_eq!(sin_cos(0.0), (0.0, 1.0));
    assert_eq!(sin_cos(-0.0).1, 1.0);
    // The largest angle reduced, within the documented absolute error.
    let (s, c) = sin_cos(MAX_ANGLE);
    assert!((s - MAX_ANGLE.sin()).abs() < 2.3e-16 && (c - MAX_ANGLE.cos()).abs() < 2.3e-16);
    for x in [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        MAX_ANGLE * (1.0 + f64::EPSILON),
        -MAX_ANGLE * 2.0,
        1e300,
    ] {
        let (s, c) = sin_cos(x);
        assert!(s.is_nan() && c.is_nan(), "sin_cos({x:e}) = ({s}, {c})");
    }
}

#[test]
fn pythagoras_and_symmetry() {
    for i in 0..100_000 {
        let x = i as f64 * 12.345_678_9;
        let (s, c) = sin_cos(x);
        assert!((s * s + c * c - 1.0).abs() < 4e-16, "x = {x}");
        let (ns, nc) = sin_cos(-x);
        assert_eq!((ns, nc), (-s, c), "x = {x}");
    }
}
