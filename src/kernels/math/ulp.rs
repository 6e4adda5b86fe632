//! Helpers shared by the unit tests of the vector `exp` and `tanh` paths (the scalar sweeps
//! are `tests/exp.rs` and `tests/tanh.rs`).

/// Position of `x` on the line of floats ordered by value (`-0` and `+0` both at 0).
pub(crate) fn ordinal(x: f32) -> i64 {
    let bits = x.to_bits();
    if bits >> 31 == 1 {
        -i64::from(bits & 0x7fff_ffff)
    } else {
        i64::from(bits)
    }
}

/// Every `step`-th float from bit pattern `lo` to `hi` inclusive.
pub(crate) fn bit_range(lo: u32, hi: u32, step: usize) -> impl Iterator<Item = f32> {
    (lo..=hi).step_by(step).map(f32::from_bits)
}

/// Special values both sweeps end with: zeros, infinities, NaNs, the extremes, the smallest
/// subnormal.
pub(crate) const SPECIAL: [f32; 9] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    -f32::NAN,
    f32::MAX,
    f32::MIN,
    f32::from_bits(1),
];
