//! The kernel layer: slices with run-time dimensions, one set of microkernels per instruction
//! set, and the one place where the instruction set is chosen. It imports nothing from the
//! layers above it (the run-time core in `layer`, the typed front, the loaders).
//!
//! - [`gemm()`] (`gemm/`): `C = A · B` in the BLIS shape (packed panels, cache blocking, a
//!   register-blocked microtile), with `B` packed once ([`PackedB`]).
//! - `attention/`: attention in the FlashAttention-2 shape (online softmax over key blocks),
//!   causal or not, with key lengths, padding, masks and the score terms.
//! - `format/`: the element formats ([`KvFormat`], [`WeightFormat`] and the `Element`s
//!   behind them) in one place: rounding when stored, the buffers, the view of a stored
//!   matrix and the widening reads every kernel uses.
//! - `store/`: the key/value store.
//! - `threads/`: thread counts per phase, the item queue and the workers.
//! - `workspace.rs`: the scratch of a layer's calls, its own or shared by the layers of a
//!   [`ThreadPool`] (the pool's workers and workspace).
//! - `math/`: the crate's own accurate [`exp`] and [`tanh`] (scalar and vectorised) and
//!   [`trig`] (`f64` `sin`, `cos`, `sqrt` for RoPE angles).
//! - `simd/`: the `Simd` trait of vector primitives and one file of primitives per instruction
//!   set (portable, AVX2, AVX-512, NEON), each filling the one `Kernels` table (`table.rs`)
//!   with the generic kernels instantiated for it; [`Isa::detect`] (`isa.rs`) picks the widest
//!   one this CPU runs, once.

pub(crate) mod attention;
pub(crate) mod buffer;
pub(crate) mod format;
pub mod gemm;
pub(crate) mod isa;
pub(crate) mod math;
pub(crate) mod operands;
pub(crate) mod simd;
pub(crate) mod store;
pub(crate) mod table;
#[cfg(test)]
mod tests;
pub(crate) mod threads;
pub(crate) mod workspace;

pub use format::{Compute, KvFormat, WeightBlocks, WeightFormat, WeightValues};
pub use gemm::gemm;
pub use gemm::packed::PackedB;
pub use isa::Isa;
pub use math::{exp, tanh, trig};
#[cfg(feature = "std")]
pub use threads::parallel::Executor;
#[cfg(feature = "std")]
pub use workspace::ThreadPool;

pub(crate) use table::Kernels;
