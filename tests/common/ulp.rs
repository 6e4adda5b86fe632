//! Helpers for the ulp sweeps (`tests/exp.rs`, `tests/tanh.rs`, `tests/trig.rs`), included with
//! `#[path = "common/ulp.rs"] mod ulp;`.
#![allow(dead_code)]

/// Position of `x` on the line of floats ordered by value (`-0` and `+0` both at 0).
pub fn ordinal(x: f32) -> i64 {
    let bits = x.to_bits();
    if bits >> 31 == 1 {
        -i64::from(bits & 0x7fff_ffff)
    } else {
        i64::from(bits)
    }
}

/// A sweep's stride over bit patterns: the environment variable `var` (for slow runs such as
/// valgrind), 61 by default, at least 1.
pub fn stride(var: &str) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(61)
        .max(1)
}
