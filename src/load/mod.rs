//! Loading: model files into layers. `safetensors` (the format: read, check, write),
//! `gguf` (llama.cpp's format: header, metadata, tensors, ggml's dequantization), `config`
//! (`config.json` into an `AttentionConfig`), `checkpoint` (a model directory or GGUF file into
//! `Layer`s, reading only the byte ranges asked for) and `json`, the reader they share.

pub(crate) mod checkpoint;
pub(crate) mod config;
pub mod gguf;
pub(crate) mod json;
pub mod safetensors;
