//! The crate's own elementary functions, so that every platform computes the same bits:
//! [`exp`] and [`tanh`] (scalar and generic over `Simd`), [`trig`] (`f64` `sin_cos`, `sqrt`).

pub mod exp;
pub mod tanh;
pub mod trig;
#[cfg(all(test, feature = "std"))]
pub(crate) mod ulp;
