//! # mha — multi-head self-attention on the CPU, with no dependencies
//!
//! Multi-head attention for `f32`, in plain Rust: typed shapes in front, a run-time core
//! ([`Layer`], whose widths are numbers) under them, and a small kernel layer (packed SIMD
//! GEMM, vectorised `exp` and online softmax, flash-style attention) behind; a published
//! checkpoint's attention layers load in one call ([`Checkpoint`]). `#![no_std]` + `alloc`;
//! the default `std` feature adds threads and reading checkpoint directories.
//!
//! ## The five steps, with shapes
//!
//! The input `x` is `(B, T, D)`: `B` sequences of `T` tokens of `D` features. The weights
//! `Wq, Wk, Wv, Wo` are `(D, D)`, used as `x · W`. With `H` heads of width `d = D / H`:
//!
//! 1. **Project**: `Q = x·Wq`, `K = x·Wk`, `V = x·Wv`, each `(B, T, D)`.
//! 2. **Split heads**: `(B, T, D) -> (B, T, H, d) -> (B, H, T, d)`; head `h` takes features
//!    `h·d ..= (h+1)·d - 1` of every token ([`split_heads`]).
//! 3. **Causal attention** in every head at once: `softmax(Q Kᵀ / √d) V` over the last two
//!    axes, key `j > i` masked ([`attention`], [`causal_mask`]). A layer can set another
//!    factor than `1/√d` ([`MhaBuilder::scale`]).
//! 4. **Merge heads**: `(B, H, T, d) -> (B, T, H, d) -> (B, T, D)`, the exact inverse of step 2
//!    ([`merge_heads`]).
//! 5. **Output projection**: `y = merged · Wo`.
//!
//! [`mha_forward`] does all five; [`Mha`] is the same as a reusable layer.
//!
//! Models whose heads are not `D / H` wide (Qwen3, Gemma) set the head width `d` apart: the
//! query width `Q = H · d` differs from `D`, `Wq` is `(D, Q)`, `Q` and the merged heads are
//! `(B, T, Q)` and `Wo` is `(Q, D)`, so the output is `(B, T, D)` again ([`MhaParams`]'s
//! fourth width). Grouped-query attention narrows `Wk` and `Wv` to `(D, KV)`, `KV = Hkv · d`.
//!
//! ## Splitting, with numbers
//!
//! One text, `T = 2` tokens, `D = 4`, `H = 2` heads of `d = 2`. Head 0 takes the first two
//! numbers of every token, head 1 the last two:
//!
//! ```
//! use mha::{merge_heads, split_heads, Tensor};
//! let x = Tensor::from([[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]]);
//! let heads = split_heads(&x, 2)?;
//! assert_eq!(heads.head(0, 0).unwrap(), &[0.0, 1.0, 4.0, 5.0]); // [[0, 1], [4, 5]]
//! assert_eq!(heads.head(0, 1).unwrap(), &[2.0, 3.0, 6.0, 7.0]); // [[2, 3], [6, 7]]
//! // Reading the buffer as (B, H, T, d) without the transpose would give head 0 =
//! // [[0, 1], [2, 3]]: the two halves of token 0, as if they were two tokens.
//! assert_ne!(heads.head(0, 0).unwrap(), &x.as_slice()[..4]);
//! assert_eq!(merge_heads(&heads), x);
//! # Ok::<(), mha::ShapeError>(())
//! ```
//!
//! ## The layer and its calls
//!
//! [`Mha::builder`] reaches the configurations real models use: [`Masking::Bidirectional`]
//! encoders, projection biases ([`MhaBiases`]), grouped-query and multi-query attention
//! ([`MhaParams::from_parts`] with a narrower key/value width), cross-attention, key padding,
//! boolean or additive masks ([`AttendOptions`]), rotary position embeddings ([`Rope`],
//! [`MhaBuilder::rope`]), attention probabilities on request ([`AttentionWeights`]),
//! incremental decoding with a [`KvCache`] (whose sequences may hold different numbers of
//! tokens: [`AttendOptions::token_lengths`], [`KvCache::lengths`]), sliding-window attention
//! ([`MhaBuilder::sliding_window`]) with a rolling cache whose memory the window bounds, heads
//! not `D / H` wide (a query width `Q`, above), a softmax scale other than `1/√d`
//! ([`MhaBuilder::scale`]), RMSNorm of the queries and keys ([`QkNorm`]) and, in the score
//! stage, ALiBi ([`MhaBuilder::alibi`], [`Alibi`]), logit soft-capping
//! ([`MhaBuilder::softcap`]) and attention sinks ([`MhaBuilder::sinks`]). [`safetensors`] reads
//! checkpoints (PyTorch, BERT and GPT-2 layouts) without dependencies.
//!
//! In [`Mha`] the model width `D` (and so the weights) is a compile-time constant; the batch
//! size and the sequence length may be either: a `&Tensor<B, T, D>` converts into the calls'
//! input [`Tokens`], and [`Tokens::new`] wraps a slice whose shape is known only at run time.
//!
//! ## Widths known at run time
//!
//! [`Layer`] is the same layer with every width a number ([`Widths`]: `D`, `E`, `KV`, `Q`),
//! built by [`Layer::builder`] from borrowed [`Projections`] with the same settings
//! ([`LayerBuilder`]) and called with the same entry points and options; its [`Tokens`] and
//! [`Output`]s carry their width, checked when called. [`Mha`] is a `Layer` whose widths its
//! type fixes (checked once, when it is built: [`Mha::try_from`] gives any layer its typed
//! view), so both give the same bits. [`Checkpoint`] opens a model directory as Hugging Face
//! publishes it (`config.json` and one `model.safetensors`, or shards with
//! `model.safetensors.index.json`) and builds the layers asked for, reading only their
//! tensors' bytes; every failure is a [`LoadError`] naming the file, the key or tensor, and
//! the numbers.
//!
//! | call | keys and values | input | writes into | `Err` when |
//! |---|---|---|---|---|
//! | [`mha_forward`] | from `x` | `&Tensor` | a new `Tensor` | bad head count, memory |
//! | [`Mha::forward`] | from `x` | `&Tensor` | a new `Tensor` | a rotary position past [`RopeAngles::max_position`], memory |
//! | [`Mha::forward_into`] | from `x` | [`Tokens`] | [`Output`] | options or shapes disagree |
//! | [`Mha::cross_into`] | from `memory` | [`Tokens`] ×2 | [`Output`] | options or shapes disagree |
//! | [`Mha::decode_into`] | from `x`, appended to a [`KvCache`] | [`Tokens`] | [`Output`] | as above, a full or foreign cache, a bidirectional layer |
//!
//! The three `_into` calls take the same plain, reusable [`AttendOptions`], allocate nothing
//! in steady state on one thread, and write the attention weights only when their [`Output`]
//! asks ([`Output::with_weights`]). They run the same steps (project, append the keys and
//! values to a store, attend, project the output), so a forward pass equals decoding its
//! tokens in steps of any sizes, bit for bit.
//!
//! ## Errors, not panics
//!
//! A head count that is zero or does not divide `D`, or a buffer of the wrong length, is a
//! [`ShapeError`] whose message names the numbers (`d_model 6 is not divisible by n_heads 4`).
//! Shapes known at compile time are checked by the compiler: see
//! [`Tensor::split_heads_const`] and [`MhaParams`].
#![no_std]
#![deny(missing_docs)]
// Without `std` the items that read files and run threads (`Checkpoint`, `ThreadPool`, ...) do
// not exist, so the docs' links to them render as plain text; with `std` (the default, which CI
// documents with `-D warnings`) every link is checked.
#![cfg_attr(not(feature = "std"), allow(rustdoc::broken_intra_doc_links))]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

mod error;
mod front;
pub mod kernels;
mod layer;
mod load;

pub use front::reference;
pub use load::gguf;
pub use load::safetensors;

pub use error::ShapeError;
pub use front::attention::{attention, causal_mask};
pub use front::heads::{merge_heads, split_heads, Heads};
pub use front::mha::{mha_forward, Mha, MhaBuilder};
pub use front::params::{MhaBiases, MhaParams};
pub use front::tensor::{IntoOutput, IntoTokens};
pub use front::tensor::{Matrix, Tensor};
pub use kernels::{Compute, Isa, KvFormat, WeightBlocks, WeightFormat, WeightValues};
#[cfg(feature = "std")]
pub use kernels::{Executor, ThreadPool};
pub use layer::cache::KvCache;
pub use layer::gate::{GateActivation, GateSpan, OutputGate};
pub use layer::latent::{MlaBuilder, MlaLayer, MlaShape, MlaWeights};
pub use layer::norm::{QkNorm, QkNormPlacement, QkNormSpan};
pub use layer::options::{AttendOptions, AttentionWeights, AttnMask, Masking};
pub use layer::paged::PagedCache;
pub use layer::query_scale::{QueryScale, ScalePosition};
pub use layer::rope::{Rope, RopeAngles, RopeLayout, RopePositions, RopeRows, RopeScaling};
pub use layer::scores::{Alibi, AlibiPositions};
pub use layer::tokens::{Output, Tokens};
pub use layer::{Biases, BuiltLayer, Layer, LayerBuilder, Projections, Widths};
#[cfg(feature = "std")]
pub use load::checkpoint::Checkpoint;
pub use load::checkpoint::{LayerWeights, LoadError};
pub use load::config::{
    AttentionConfig, ConfigError, GateConfig, GateTensor, LoraScales, MlaConfig, ModelType,
    ProjectionBiases, ProjectionScales, QkNormConfig, Wrapper, MAX_CONFIG_LEN,
};

/// The README's snippets, compiled and run as doctests (with `std`: one reads a checkpoint
/// directory).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "std"))]
pub struct ReadmeDoctests;
