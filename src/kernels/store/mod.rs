//! The key/value store and the element formats: `kv` (keys as `Kᵀ` panels, values as rows,
//! rolling windows), `layout` (the key block and a head's place in the store), `narrow` (the
//! formats and their scalar rounding and widening), `elements` (one side's buffers) and
//! `widen` (the widening kernels over `Simd` loads).

pub(crate) mod elements;
pub(crate) mod kv;
pub(crate) mod layout;
pub(crate) mod narrow;
pub(crate) mod widen;
