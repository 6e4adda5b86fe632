//! Loading: model files into layers. `safetensors` (the format: read, check, write),
//! `config` (`config.json` into an `AttentionConfig`), `checkpoint` (a model directory into
//! `Layer`s, reading only the byte ranges asked for) and `json`, the reader they share.

pub(crate) mod checkpoint;
pub(crate) mod config;
pub mod gguf;
pub(crate) mod json;
pub mod safetensors;
