//! The typed front: fixed-shape tensors and parameters whose widths are const generics
//! ([`Tensor`](tensor::Tensor), [`Matrix`](tensor::Matrix), [`MhaParams`](params::MhaParams)), the
//! typed layer [`Mha`](mha::Mha) over the run-time core, and the teaching exercise's steps
//! (split / merge heads, `attention()`, the plain-loop `reference`).

pub(crate) mod attention;
pub(crate) mod heads;
pub(crate) mod mha;
pub(crate) mod params;
pub mod reference;
pub(crate) mod tensor;
