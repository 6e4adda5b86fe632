//! Loading the attention layers of a published checkpoint: a directory with `config.json` and
//! its weights, one `.safetensors` file or shards listed by `model.safetensors.index.json`
//! ([`Checkpoint`], with `std`), or one layer's weights from a safetensors buffer
//! ([`LayerWeights::from_safetensors`]). Either way the family's tensor names and shapes come
//! from the config ([`AttentionConfig`](crate::AttentionConfig)), every failure is one
//! [`LoadError`] naming the file, the key or tensor, and the numbers, and the result is a
//! run-time [`Layer`](crate::Layer) (or its typed view, [`Mha::try_from`](crate::Mha)); a
//! multi-head latent attention checkpoint's layers are [`MlaLayer`](crate::MlaLayer)s
//! ([`Checkpoint::mla_layer`], `latent.rs`).

#[cfg(feature = "std")]
mod directory;
mod error;
#[cfg(feature = "std")]
mod files;
#[cfg(feature = "std")]
mod latent;
mod sources;
mod typed;
mod weights;

#[cfg(feature = "std")]
pub use directory::Checkpoint;
pub use error::LoadError;
pub use weights::LayerWeights;
