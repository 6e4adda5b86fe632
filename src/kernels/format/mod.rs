//! The element formats, in one place: how keys, values and weights may be stored and
//! everything that depends on the format.
//!
//! - `element.rs`: [`Element`] (`f32`, bf16, f16, `q8_0`) and its scalar rounding and
//!   widening;
//! - `formats.rs`: the public [`KvFormat`] and [`WeightFormat`], each a choice of
//!   [`Element`];
//! - `buffer.rs`: [`Elements`], the owned elements of one format (a key/value store's side,
//!   a [`PackedB`](crate::kernels::PackedB)'s panels), and [`ElementsMut`], a part of one to
//!   write, rounding;
//! - `view.rs`: [`Stored`], a matrix of stored elements as the kernels read it (plain rows,
//!   or the column panels of a packed matrix);
//! - `read.rs`: the [`Read`](read::Read) trait, one implementation per format (whole vectors,
//!   partial vectors, single elements), which every kernel that reads stored elements uses:
//!   `widen.rs` (widening to `f32`) and the GEMM's `gemv` (`gemm/gemv.rs`);
//! - `blocks.rs`: weights kept as ggml's quantized blocks ([`Quant`](blocks::Quant): `q8_0`,
//!   `q4_0`, `q4_K`, `q5_K`, `q6_K`), their rows interleaved a vector's lanes at a time, each
//!   type's dequantization (`BlockFormat`: a step of a group of rows widened through the
//!   `Simd` primitives, the loader's `f32` values too), and
//!   ggml's reference quantizers;
//! - `weights.rs`: [`WeightValues`], a weight matrix's values as a checkpoint stores them
//!   (`f32`, bf16 or f16, or ggml's blocks), and [`MatrixRef`](weights::MatrixRef),
//!   borrowed, which packing reads.
//!
//! A new format is a variant of [`Element`] with its scalar conversions, its arm in
//! [`Elements`], [`ElementsMut`] and [`Slices`], its [`Read`](read::Read) implementation
//! (and arm of `with_reader!`), and the public format(s) that may choose it. A new block
//! type of weights is a variant of [`Quant`](blocks::Quant) with its sizes and binary16
//! fields, its `BlockFormat` (and arm of `with_block_format!`; a quantizer, if any) in
//! `blocks.rs`, and the [`WeightFormat`] that chooses it.

pub(crate) mod blocks;
pub(crate) mod buffer;
pub(crate) mod element;
pub(crate) mod formats;
pub(crate) mod read;
pub(crate) mod view;
pub(crate) mod weights;
pub(crate) mod widen;

pub(crate) use buffer::{Elements, ElementsMut, Place};
pub use formats::{Compute, KvFormat, WeightFormat};
pub(crate) use view::{Panels, Q8Scales, Slices, Stored};
pub use weights::{WeightBlocks, WeightValues};
