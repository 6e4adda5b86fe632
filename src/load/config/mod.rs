//! Reading a Hugging Face `config.json` into the attention configuration of one layer.
//!
//! [`AttentionConfig::from_json`] reads, with the crate's own JSON reader (no dependencies,
//! `no_std`), what the attention of layer `i` of a Llama, Mistral, Qwen2, Qwen3, Phi-3, Phi-2,
//! GPT-NeoX (Pythia), OLMo 2, Gemma 2, Gemma 3, BLOOM or gpt-oss model (and the later families
//! of [`ModelType`]) needs: head counts and width, rotary embedding (theta, partial rotary,
//! `linear` / `llama3` / `yarn` / `proportional` scaling, Gemma 3's local base), QK-norm, the
//! value norm, projection biases, the sliding window of the layer (from
//! `layer_types` or the family's rule), soft cap, ALiBi, attention sinks and the checkpoint
//! [`Layout`]. Both spellings found in the wild are read: the keys most published
//! checkpoints carry (`rope_theta`, `rope_scaling` with `type` or `rope_type`, GPT-NeoX's
//! `rotary_pct` and `rotary_emb_base`) and the ones current `transformers` writes
//! (`rope_parameters`, possibly nested by layer type, and `layer_types`). Absent keys take the
//! defaults of the family's `transformers` configuration class.
//!
//! Anything the crate does not implement — another `model_type`, a `rope_type` such as
//! `dynamic` (but Hunyuan's NTK-alpha form, a fixed base) or `longrope`, a layer type other
//! than full or sliding attention, Gemma's bidirectional attention, partial rotary where the
//! family rotates whole heads — is a [`ConfigError`] naming the key and its value, never
//! ignored; the layers of a hybrid stack that are not softmax attention (Mamba-2, linear
//! attention, short convolutions, MLP) are [`ConfigError::NotAttention`] naming their kind.
//!
//! Every number a config yields is checked as the layer takes it: the softmax scale, soft cap
//! and QK-norm epsilon after their conversion to `f32`, YaRN's derived factor and attention
//! factor, and the rotary frequencies over the model's context (`max_position_embeddings`
//! positions) by the same function the builder's rotary table uses, so that a config that
//! loads builds its layer (over weights of its shapes, with a rotary table of at most
//! `max_position_embeddings` positions). Errors name the key at fault and its value as
//! written.
//!
//! ```
//! use mha::{AttentionConfig, ModelType, RopeScaling};
//! let json = r#"{
//!     "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
//!     "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 131072,
//!     "rope_theta": 500000.0,
//!     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
//!                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
//! }"#;
//! let config = AttentionConfig::from_json(json, 0)?;
//! assert_eq!((config.model_type, config.n_heads, config.n_kv_heads, config.head_dim), (ModelType::Llama, 32, 8, 128));
//! let rope = config.rope.unwrap();
//! assert_eq!((rope.theta, rope.rotary_dim), (500000.0, 128));
//! assert!(matches!(rope.scaling, RopeScaling::Llama3 { factor: 8.0, .. }));
//! assert_eq!(config.tensor_prefix(), "model.layers.0.self_attn");
//!
//! let err = AttentionConfig::from_json(&json.replace("llama3", "dynamic"), 0).unwrap_err();
//! assert!(err.to_string().starts_with(r#"config.json: "rope_scaling.rope_type" = "dynamic" is not supported"#));
//! # Ok::<(), mha::ConfigError>(())
//! ```
//!
//! [`Checkpoint`](crate::Checkpoint) reads it with the weights of the layers from a checkpoint
//! directory; [`LayerWeights::from_safetensors`](crate::LayerWeights::from_safetensors) reads
//! one layer's weights from a safetensors buffer.

mod error;
mod gate;
mod gemma4;
mod hybrid;
mod mimo;
mod mla;
mod read;
mod rope;
mod scales;
mod step;

use alloc::format;
use alloc::string::{String, ToString};
use core::fmt;

pub use error::ConfigError;
pub use gate::{GateConfig, GateTensor};
pub use mla::{LoraScales, MlaConfig};
pub use scales::ProjectionScales;

use crate::layer::norm::{QkNormPlacement, QkNormSpan};
use crate::layer::query_scale::{QueryScale, ScalePosition};
use crate::layer::rope::Rope;
use crate::load::json::{self, Value};
use crate::load::safetensors::Layout;
use read::{describe, layer_f32, required, Obj, Range};

type Result<T> = core::result::Result<T, ConfigError>;

/// The model families whose `config.json` this crate reads (`model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ModelType {
    /// `"llama"`: Llama 1–3.
    Llama,
    /// `"mistral"`: Mistral.
    Mistral,
    /// `"qwen2"`: Qwen 2 and 2.5.
    Qwen2,
    /// `"qwen3"`: Qwen 3, with per-head QK-norm.
    Qwen3,
    /// `"phi3"`: Phi-3 and Phi-4-mini, with fused `qkv_proj`.
    Phi3,
    /// `"phi"`: Phi-1, Phi-1.5 and Phi-2, with biases on every projection, a `dense` output
    /// projection and partial rotary.
    Phi,
    /// `"gpt_neox"`: GPT-NeoX and Pythia, with fused, per-head interleaved `query_key_value`.
    GptNeox,
    /// `"olmo2"`: OLMo 2, with QK-norm over the whole projection.
    Olmo2,
    /// `"gemma2"`: Gemma 2, with logit soft-capping, `query_pre_attn_scalar` and sliding
    /// windows on the even layers.
    Gemma2,
    /// `"gemma3_text"`: Gemma 3 (text), with Gemma's `(1 + weight)` per-head QK-norm, a local
    /// rotary base on its sliding layers and `sliding_window_pattern`.
    Gemma3,
    /// `"bloom"`: BLOOM, with ALiBi (no rotary) and a fused, per-head interleaved
    /// `query_key_value`.
    Bloom,
    /// `"gpt_oss"`: gpt-oss, with attention sinks, biases, YaRN and sliding windows on the
    /// even layers.
    GptOss,
    /// `"glm4_moe"`: GLM-4.5, 4.6 and 4.7, with biases on the query, key and value
    /// projections, partial rotary (half of each head by default) and optional per-head QK-norm
    /// (`use_qk_norm`).
    Glm4Moe,
    /// `"smollm3"`: SmolLM3, whose layers listed in `no_rope_layers` with a 0 (every 4th by
    /// default) have no rotary embedding.
    SmolLm3,
    /// `"olmo3"`: OLMo 3, OLMo 2's whole-row QK-norm with 3 sliding layers to 1 full and a
    /// rotary embedding per layer type.
    Olmo3,
    /// `"seed_oss"`: Seed-OSS, with query, key and value biases (`attention_bias`) and an
    /// output bias of its own (`attention_out_bias`).
    SeedOss,
    /// `"ernie4_5"`: ERNIE 4.5 (dense), with interleaved-pair rotary and `use_bias`.
    Ernie45,
    /// `"apertus"`: Apertus, with per-head QK-norm and llama3 rotary scaling.
    Apertus,
    /// `"exaone4"`: EXAONE 4.0, with per-head QK-norm, 3 sliding layers to 1 full, and no
    /// rotary embedding on the full layers of a model with a window.
    Exaone4,
    /// `"cohere2"`: Command R7B and Command A, with interleaved-pair rotary on the sliding
    /// layers and none on the full layers.
    Cohere2,
    /// `"qwen3_next"`: Qwen3-Next, whose attention layers (every 4th; the others are linear
    /// attention, not read) split `q_proj` into the queries and a sigmoid output gate, with
    /// `(1 + weight)` per-head QK-norm and partial rotary (a quarter of each head by default).
    Qwen3Next,
    /// `"qwen3_5_text"`: Qwen3.5 (the text model; `"qwen3_5"` configs nest it in
    /// `text_config`), attention as Qwen3-Next's.
    Qwen35,
    /// `"qwen3_5_moe_text"`: Qwen3.5-MoE (the text model; `"qwen3_5_moe"` configs nest it in
    /// `text_config`), attention as Qwen3-Next's.
    Qwen35Moe,
    /// `"ministral3"`: Ministral 3 (also the text model of `"mistral3"` configs), Mistral's
    /// layout with a position-dependent query scale (`llama_4_scaling_beta`).
    Ministral3,
    /// `"llama4_text"`: Llama 4 (the text model; `"llama4"` configs nest it in `text_config`):
    /// on its rotary layers (`no_rope_layers`) interleaved-pair rotary, a weight-less QK-norm
    /// after it and chunked attention (`attention_chunk_size`); on the others no rotary and
    /// the attention temperature tuning (`attn_temperature_tuning`).
    Llama4,
    /// `"gemma4_text"`: Gemma 4 (the text model; `"gemma4"` configs nest it in `text_config`):
    /// 5 sliding layers to 1 full (the last always full), per-head QK-norm with plain weights,
    /// a weight-less value norm, a softmax scale of 1, on the full layers wider heads and
    /// their own key/value head count (`per_layer_config`, or `global_head_dim` and
    /// `num_global_key_value_heads`), values from the key projection (`attention_k_eq_v`)
    /// and proportional rotary. The last `num_kv_shared_layers` layers attend over the
    /// cache of the last earlier layer of their type ([`AttentionConfig::kv_source`]).
    Gemma4,
    /// `"minimax_m2"`: MiniMax-M2, OLMo 2's whole-row QK-norm with partial rotary (the
    /// `rotary_dim` key read as `partial_rotary_factor = rotary_dim / head_dim`).
    MiniMaxM2,
    /// `"hunyuan_v1_dense"`: Hunyuan dense, per-head QK-norm (`query_layernorm`,
    /// `key_layernorm`) after the rotary embedding, whose `dynamic` type with an `alpha` is
    /// the fixed NTK-alpha base `rope_theta · alpha^(head_dim / (head_dim − 2))`.
    HunyuanDense,
    /// `"lfm2"`: LFM2, whose attention layers (the others are short convolutions, not read)
    /// have an `out_proj` and per-head QK-norm (`q_layernorm`, `k_layernorm`, eps `norm_eps`).
    Lfm2,
    /// `"nemotron_h"`: Nemotron-H, whose attention layers (among Mamba-2, MLP and MoE layers:
    /// `layers_block_type` or `hybrid_override_pattern`) are `backbone.layers.{i}.mixer`,
    /// without rotary embedding.
    NemotronH,
    /// `"granite_swa"`: Granite with sliding windows, a softmax scale of
    /// `attention_multiplier`, attention sinks and a rotary base per layer
    /// (`layer_rope_theta`, 0 for a layer without rotary).
    GraniteSwa,
    /// `"granitemoehybrid"`: Granite 4.0-H, whose attention layers (the others are Mamba-2,
    /// not read) have a softmax scale of `attention_multiplier` and rotary only when
    /// `position_embedding_type` is `"rope"`.
    GraniteMoeHybrid,
    /// `"falcon_h1"`: Falcon-H1, whose layers run attention beside a Mamba-2 mixer (not read),
    /// with `key_multiplier`, `attention_in_multiplier` and `attention_out_multiplier` folded
    /// into the projections ([`ProjectionScales`]).
    FalconH1,
    /// `"laguna"`: Laguna, with a head count per layer (`num_attention_heads_per_layer`),
    /// per-head QK-norm with plain weights, a rotary embedding per layer type (half of each
    /// head on the full layers by default) and a softplus output gate `g_proj` (per head or
    /// per feature, `gating`).
    Laguna,
    /// `"mimo_v2_flash"`: MiMo-V2-Flash: layer 0 and every 6th full, the others sliding (window
    /// 129) with twice the key/value heads and attention sinks; query/key heads of 192
    /// (`head_dim`), value heads of 128 (`v_head_dim`), the values times
    /// `attention_value_scale` (folded into `v_proj` when loaded), partial rotary (a third of
    /// each head) with a rotary base per layer type.
    MiMoV2Flash,
    /// `"gemma3n_text"`: Gemma 3n (the text model; `"gemma3n"` configs nest it in
    /// `text_config`): 4 sliding layers to 1 full (`layer_types`), window 512, per-head
    /// QK-norm with plain weights, a weight-less value norm, a softmax scale of 1, rotary per
    /// layer type (`rope_local_base_freq` 10000 on the sliding layers, `rope_theta` 1000000 on
    /// the full ones, or `rope_parameters` by layer type), and KV sharing: the last
    /// `num_kv_shared_layers` (default 15) attend over the cache of the last earlier layer of
    /// their type ([`AttentionConfig::kv_source`]).
    Gemma3n,
    /// `"step3p5"`: Step 3.5 (the text model; `"step3p7"` configs nest it in `text_config`):
    /// sliding and full layers (`layer_types`), the sliding ones with their own query-head
    /// count (`per_layer_config`, or `num_sliding_attention_heads`), per-head QK-norm with
    /// `(1 + w)` weights, a softmax scale of `query_pre_attn_scalar^-½` (default `head_dim`),
    /// partial rotary by layer type (`rope_parameters` nested by layer type) and a sigmoid
    /// output gate per head from `g_proj`.
    Step35,
}

impl ModelType {
    /// Every family, in the order of [`NAMES`](Self::NAMES).
    pub const ALL: [ModelType; 37] = [
        ModelType::Llama,
        ModelType::Mistral,
        ModelType::Qwen2,
        ModelType::Qwen3,
        ModelType::Phi3,
        ModelType::Phi,
        ModelType::GptNeox,
        ModelType::Olmo2,
        ModelType::Gemma2,
        ModelType::Gemma3,
        ModelType::Bloom,
        ModelType::GptOss,
        ModelType::Glm4Moe,
        ModelType::SmolLm3,
        ModelType::Olmo3,
        ModelType::SeedOss,
        ModelType::Ernie45,
        ModelType::Apertus,
        ModelType::Exaone4,
        ModelType::Cohere2,
        ModelType::Qwen3Next,
        ModelType::Qwen35,
        ModelType::Qwen35Moe,
        ModelType::Ministral3,
        ModelType::Llama4,
        ModelType::Gemma4,
        ModelType::MiniMaxM2,
        ModelType::HunyuanDense,
        ModelType::Lfm2,
        ModelType::NemotronH,
        ModelType::GraniteSwa,
        ModelType::GraniteMoeHybrid,
        ModelType::FalconH1,
        ModelType::Laguna,
        ModelType::MiMoV2Flash,
        ModelType::Gemma3n,
        ModelType::Step35,
    ];

    /// The `model_type` strings read, for messages.
    pub const NAMES: &'static str = "llama, mistral, qwen2, qwen3, phi3, phi, gpt_neox, olmo2, \
         gemma2, gemma3_text, bloom, gpt_oss, glm4_moe, smollm3, olmo3, seed_oss, ernie4_5, \
         apertus, exaone4, cohere2, qwen3_next, qwen3_5_text, qwen3_5_moe_text, ministral3, \
         llama4_text, gemma4_text, minimax_m2, hunyuan_v1_dense, lfm2, nemotron_h, granite_swa, \
         granitemoehybrid, falcon_h1, laguna, mimo_v2_flash, gemma3n_text, step3p5 (and in \
         text_config: qwen3_5, qwen3_5_moe, mistral3, llama4, gemma4, gemma3n, step3p7)";

    /// The `model_type` string.
    ///
    /// ```
    /// assert_eq!(mha::ModelType::GptNeox.name(), "gpt_neox");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            ModelType::Llama => "llama",
            ModelType::Mistral => "mistral",
            ModelType::Qwen2 => "qwen2",
            ModelType::Qwen3 => "qwen3",
            ModelType::Phi3 => "phi3",
            ModelType::Phi => "phi",
            ModelType::GptNeox => "gpt_neox",
            ModelType::Olmo2 => "olmo2",
            ModelType::Gemma2 => "gemma2",
            ModelType::Gemma3 => "gemma3_text",
            ModelType::Bloom => "bloom",
            ModelType::GptOss => "gpt_oss",
            ModelType::Glm4Moe => "glm4_moe",
            ModelType::SmolLm3 => "smollm3",
            ModelType::Olmo3 => "olmo3",
            ModelType::SeedOss => "seed_oss",
            ModelType::Ernie45 => "ernie4_5",
            ModelType::Apertus => "apertus",
            ModelType::Exaone4 => "exaone4",
            ModelType::Cohere2 => "cohere2",
            ModelType::Qwen3Next => "qwen3_next",
            ModelType::Qwen35 => "qwen3_5_text",
            ModelType::Qwen35Moe => "qwen3_5_moe_text",
            ModelType::Ministral3 => "ministral3",
            ModelType::Llama4 => "llama4_text",
            ModelType::Gemma4 => "gemma4_text",
            ModelType::MiniMaxM2 => "minimax_m2",
            ModelType::HunyuanDense => "hunyuan_v1_dense",
            ModelType::Lfm2 => "lfm2",
            ModelType::NemotronH => "nemotron_h",
            ModelType::GraniteSwa => "granite_swa",
            ModelType::GraniteMoeHybrid => "granitemoehybrid",
            ModelType::FalconH1 => "falcon_h1",
            ModelType::Laguna => "laguna",
            ModelType::MiMoV2Flash => "mimo_v2_flash",
            ModelType::Gemma3n => "gemma3n_text",
            ModelType::Step35 => "step3p5",
        }
    }

    /// The family a `model_type` string names, if it is one of [`ALL`](Self::ALL).
    ///
    /// ```
    /// use mha::ModelType;
    /// assert_eq!(ModelType::from_name("qwen3"), Some(ModelType::Qwen3));
    /// assert_eq!(ModelType::from_name("gemma3_text"), Some(ModelType::Gemma3));
    /// assert_eq!(ModelType::from_name("gemma"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// How the family's checkpoints store the attention weights.
    ///
    /// ```
    /// use mha::{safetensors::Layout, ModelType};
    /// assert_eq!(ModelType::Qwen3.layout(), Layout::Llama);
    /// assert_eq!(ModelType::Phi3.layout(), Layout::Phi3);
    /// ```
    pub fn layout(self) -> Layout {
        match self {
            ModelType::Phi3 => Layout::Phi3,
            ModelType::Phi => Layout::Phi,
            ModelType::GptNeox | ModelType::Bloom => Layout::GptNeox,
            _ => Layout::Llama,
        }
    }

    /// `num_key_value_heads` when absent (the configuration class's default); `None` for
    /// "as many as the query heads".
    fn default_kv_heads(self) -> Option<usize> {
        match self {
            ModelType::Qwen2 | ModelType::Qwen3 | ModelType::Exaone4 => Some(32),
            ModelType::Mistral
            | ModelType::GptOss
            | ModelType::Glm4Moe
            | ModelType::SeedOss
            | ModelType::Ministral3
            | ModelType::Llama4
            | ModelType::MiniMaxM2
            | ModelType::Lfm2
            | ModelType::NemotronH
            | ModelType::FalconH1
            | ModelType::Laguna
            | ModelType::Step35 => Some(8),
            ModelType::GraniteSwa => Some(4),
            ModelType::Gemma2 | ModelType::Gemma3 | ModelType::Qwen35 | ModelType::Gemma4 => {
                Some(4)
            }
            ModelType::Ernie45
            | ModelType::Qwen3Next
            | ModelType::Qwen35Moe
            | ModelType::Gemma3n => Some(2),
            ModelType::MiMoV2Flash => Some(4),
            _ => None,
        }
    }

    /// `head_dim` when absent; `None` for `hidden_size / num_attention_heads`.
    fn default_head_dim(self) -> Option<usize> {
        match self {
            ModelType::Qwen3
            | ModelType::SeedOss
            | ModelType::Ernie45
            | ModelType::Ministral3
            | ModelType::Llama4
            | ModelType::MiniMaxM2
            | ModelType::NemotronH
            | ModelType::Laguna
            | ModelType::Step35 => Some(128),
            ModelType::Gemma2
            | ModelType::Gemma3
            | ModelType::Gemma4
            | ModelType::Gemma3n
            | ModelType::Qwen3Next
            | ModelType::Qwen35
            | ModelType::Qwen35Moe => Some(256),
            ModelType::GptOss => Some(64),
            ModelType::MiMoV2Flash => Some(192),
            _ => None,
        }
    }

    /// `max_position_embeddings` when absent.
    fn default_max_positions(self) -> usize {
        match self {
            ModelType::Mistral
            | ModelType::Gemma3
            | ModelType::GptOss
            | ModelType::Glm4Moe
            | ModelType::Ernie45
            | ModelType::Llama4
            | ModelType::Gemma4
            | ModelType::Laguna
            | ModelType::MiMoV2Flash => 131_072,
            ModelType::SeedOss => 524_288,
            ModelType::Ministral3 => 262_144,
            ModelType::Apertus => 65_536,
            ModelType::Qwen2
            | ModelType::Qwen3
            | ModelType::SmolLm3
            | ModelType::Qwen3Next
            | ModelType::Qwen35
            | ModelType::Qwen35Moe
            | ModelType::Gemma3n => 32_768,
            ModelType::Gemma2
            | ModelType::Cohere2
            | ModelType::GraniteSwa
            | ModelType::FalconH1 => 8192,
            ModelType::MiniMaxM2 => 196_608,
            ModelType::Lfm2 | ModelType::Step35 => 128_000,
            ModelType::NemotronH => 4096,
            ModelType::Phi3 => 4096,
            ModelType::Llama
            | ModelType::Phi
            | ModelType::GptNeox
            | ModelType::Olmo2
            | ModelType::Bloom
            | ModelType::Olmo3
            | ModelType::Exaone4
            | ModelType::HunyuanDense
            | ModelType::GraniteMoeHybrid => 2048,
        }
    }

    /// The QK-norm span, the default `rms_norm_eps` and the weight offset of the families
    /// that have one (GLM-4.5's when `use_qk_norm`).
    fn qk_norm(self) -> Option<(QkNormSpan, f64, f32)> {
        match self {
            ModelType::Qwen3 | ModelType::Gemma4 | ModelType::Laguna | ModelType::Gemma3n => {
                Some((QkNormSpan::PerHead, 1e-6, 0.0))
            }
            ModelType::Olmo2 | ModelType::Olmo3 => Some((QkNormSpan::Whole, 1e-5, 0.0)),
            ModelType::MiniMaxM2 => Some((QkNormSpan::Whole, 1e-6, 0.0)),
            ModelType::HunyuanDense | ModelType::Lfm2 => Some((QkNormSpan::PerHead, 1e-5, 0.0)),
            ModelType::Gemma3 | ModelType::Qwen3Next | ModelType::Qwen35 | ModelType::Qwen35Moe => {
                Some((QkNormSpan::PerHead, 1e-6, 1.0))
            }
            ModelType::Step35 => Some((QkNormSpan::PerHead, 1e-5, 1.0)),
            ModelType::Glm4Moe | ModelType::Apertus | ModelType::Exaone4 | ModelType::Llama4 => {
                Some((QkNormSpan::PerHead, 1e-5, 0.0))
            }
            _ => None,
        }
    }

    /// The key of the head count (BLOOM spells it `n_head`).
    fn heads_key(self) -> &'static str {
        match self {
            ModelType::Bloom => "n_head",
            _ => "num_attention_heads",
        }
    }

    /// The key of the layer count (BLOOM spells it `n_layer`).
    fn layers_key(self) -> &'static str {
        match self {
            ModelType::Bloom => "n_layer",
            _ => "num_hidden_layers",
        }
    }

    /// `sliding_window` when absent (the configuration class's default).
    fn default_window(self) -> Option<usize> {
        match self {
            ModelType::Mistral
            | ModelType::Qwen2
            | ModelType::Qwen3
            | ModelType::Gemma2
            | ModelType::Gemma3
            | ModelType::Olmo3
            | ModelType::Exaone4
            | ModelType::Cohere2 => Some(4096),
            ModelType::GptOss | ModelType::GraniteSwa => Some(128),
            ModelType::Gemma4 | ModelType::Laguna | ModelType::Gemma3n => Some(512),
            ModelType::MiMoV2Flash => Some(129),
            _ => None,
        }
    }

    /// Whether layer `layer` slides its window when the config lists no `layer_types` (the
    /// list each configuration class derives): every layer of Mistral and Phi-3, Qwen's from
    /// `max_window_layers` on when `use_sliding_window`, the even layers of Gemma 2 and
    /// gpt-oss, all but every `sliding_window_pattern`-th of Gemma 3 (6), EXAONE 4 and
    /// Command R7B (4), all but every 4th of OLMo 3, SmolLM3's layers without rotary when
    /// `use_sliding_window`.
    fn sliding_by_default(self, top: &Obj<'_, '_>, layer: usize) -> Result<bool> {
        Ok(match self {
            ModelType::Mistral | ModelType::Phi3 | ModelType::Ministral3 => true,
            ModelType::Qwen2 | ModelType::Qwen3 => {
                let on = top.bool("use_sliding_window")?.unwrap_or(false);
                on && layer >= top.usize("max_window_layers")?.unwrap_or(28)
            }
            ModelType::Gemma2 | ModelType::GptOss => layer.is_multiple_of(2),
            ModelType::Gemma3 => every_nth_full(top, layer, 6)?,
            // Gemma4TextConfig: 5 sliding to 1 full, whatever sliding_window_pattern says.
            ModelType::Gemma4 => !(layer + 1).is_multiple_of(6),
            // Gemma3nTextConfig: 4 sliding to 1 full.
            ModelType::Gemma3n => !(layer + 1).is_multiple_of(5),
            ModelType::Cohere2 => every_nth_full(top, layer, 4)?,
            // Exaone4Config: no window, no sliding layers.
            ModelType::Exaone4 if top.get("sliding_window")?.is_none() => false,
            ModelType::Exaone4 => every_nth_full(top, layer, 4)?,
            ModelType::Olmo3 => !(layer + 1).is_multiple_of(4),
            // GraniteSWAConfig: layers 0, 4, 8, ... full, the others sliding.
            ModelType::GraniteSwa => !layer.is_multiple_of(4),
            // MiMoV2FlashConfig: layer 0 and every 6th full.
            ModelType::MiMoV2Flash => layer != 0 && !(layer + 1).is_multiple_of(6),
            ModelType::SmolLm3 => {
                let windowed = top.get("sliding_window")?.is_some();
                windowed && !rope_by_index(top, self, layer)?
            }
            _ => false,
        })
    }

    /// Whether layer `layer` (after [`sliding_by_default`](Self::sliding_by_default) or
    /// `layer_types` said whether it slides, `sliding`) rotates its queries and keys: SmolLM3's
    /// by `no_rope_layers`, EXAONE 4's and Cohere 2's sliding layers only (EXAONE 4's all
    /// when it has no window), Granite SWA's by `layer_rope_theta` (0 or `null`: none),
    /// Granite 4.0-H's when `position_embedding_type` is `"rope"`, none of BLOOM's and
    /// Nemotron-H's, every layer of the other families.
    fn has_rope(self, top: &Obj<'_, '_>, layer: usize, sliding: bool) -> Result<bool> {
        Ok(match self {
            ModelType::Bloom | ModelType::NemotronH => false,
            ModelType::GraniteSwa => rope::layer_theta(top, layer)?.is_none_or(|t| t != 0.0),
            ModelType::GraniteMoeHybrid => rope::position_embedding_is_rope(top)?,
            ModelType::SmolLm3 | ModelType::Llama4 => rope_by_index(top, self, layer)?,
            ModelType::Exaone4 => sliding || top.get("sliding_window")?.is_none(),
            ModelType::Cohere2 => sliding,
            _ => true,
        })
    }

    /// Whether a sliding layer of the family applies its window: SmolLM3's only when
    /// `use_sliding_window` (its attention ignores `layer_types` otherwise).
    fn applies_window(self, top: &Obj<'_, '_>) -> Result<bool> {
        match self {
            ModelType::SmolLm3 => Ok(top.bool("use_sliding_window")?.unwrap_or(false)),
            _ => Ok(true),
        }
    }
}

/// Whether layer `layer` slides under `sliding_window_pattern` (`default` when absent): every
/// `pattern`-th layer (counting from 1) is full, the others slide. A pattern written as a
/// string (EXAONE 4's `"LLLG"`) is an error unless the config lists `layer_types`.
fn every_nth_full(top: &Obj<'_, '_>, layer: usize, default: usize) -> Result<bool> {
    let key = "sliding_window_pattern";
    let pattern = top.usize(key)?.unwrap_or(default);
    if pattern == 0 {
        return Err(at_least_one(key));
    }
    Ok(!(layer + 1).is_multiple_of(pattern))
}

/// SmolLM3's and Llama 4's rotary flag of layer `layer`: `no_rope_layers[layer]` (1: rotary, 0: none), or
/// without that list all but every `no_rope_layer_interval`-th layer (4) rotate.
fn rope_by_index(top: &Obj<'_, '_>, model_type: ModelType, layer: usize) -> Result<bool> {
    let Some(flags) = top.array("no_rope_layers")? else {
        let key = "no_rope_layer_interval";
        let interval = top.usize(key)?.unwrap_or(4);
        if interval == 0 {
            return Err(at_least_one(key));
        }
        return Ok(!(layer + 1).is_multiple_of(interval));
    };
    let key = format!("no_rope_layers[{layer}]");
    match flags.get(layer) {
        Some(Value::Number(n)) if n == "1" => Ok(true),
        Some(Value::Number(n)) if n == "0" => Ok(false),
        Some(v) => Err(ConfigError::WrongType {
            key,
            expected: "0 or 1",
            found: describe(v),
        }),
        None => Err(ConfigError::invalid(
            top.key("no_rope_layers"),
            format!("{} entries", flags.len()),
            format!(
                "needs one per layer ({} = {} or more), layer {layer} asked for",
                model_type.layers_key(),
                layer + 1
            ),
        )),
    }
}

impl fmt::Display for ModelType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A composite (vision-language) model whose `config.json` nests the text model under
/// `text_config`: the attention is read from there, and the checkpoint keeps the text model's
/// layers under a prefix of its own.
///
/// ```
/// let json = r#"{"model_type": "mistral3", "text_config": {"model_type": "mistral",
///     "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1}}"#;
/// let config = mha::AttentionConfig::from_json(json, 0)?;
/// assert_eq!(config.wrapper, Some(mha::Wrapper::Mistral3));
/// assert_eq!(config.tensor_prefix(), "language_model.model.layers.0.self_attn");
/// # Ok::<(), mha::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Wrapper {
    /// `"qwen3_5"`: Qwen3.5 (text model `qwen3_5_text`), layers under
    /// `model.language_model.layers`.
    Qwen35,
    /// `"qwen3_5_moe"`: Qwen3.5-MoE (text model `qwen3_5_moe_text`), layers under
    /// `model.language_model.layers`.
    Qwen35Moe,
    /// `"mistral3"`: Mistral Small 3.x and its kin (text model `mistral` or `ministral3`),
    /// layers under `language_model.model.layers` (as `save_pretrained` writes them).
    Mistral3,
    /// `"llama4"`: Llama 4 Scout and Maverick (text model `llama4_text`), layers under
    /// `language_model.model.layers` (as `save_pretrained` writes them).
    Llama4,
    /// `"gemma4"`: Gemma 4 (text model `gemma4_text`), layers under
    /// `model.language_model.layers`.
    Gemma4,
    /// `"gemma3n"`: Gemma 3n (text model `gemma3n_text`), layers under
    /// `model.language_model.layers`.
    Gemma3n,
    /// `"step3p7"`: Step 3.7 Flash (text model `step3p5`), layers under
    /// `model.language_model.layers`.
    Step3p7,
}

impl Wrapper {
    /// Every wrapper read.
    pub const ALL: [Wrapper; 7] = [
        Wrapper::Qwen35,
        Wrapper::Qwen35Moe,
        Wrapper::Mistral3,
        Wrapper::Llama4,
        Wrapper::Gemma4,
        Wrapper::Gemma3n,
        Wrapper::Step3p7,
    ];

    /// The `model_type` string of the composite model.
    pub fn name(self) -> &'static str {
        match self {
            Wrapper::Qwen35 => "qwen3_5",
            Wrapper::Qwen35Moe => "qwen3_5_moe",
            Wrapper::Mistral3 => "mistral3",
            Wrapper::Llama4 => "llama4",
            Wrapper::Gemma4 => "gemma4",
            Wrapper::Gemma3n => "gemma3n",
            Wrapper::Step3p7 => "step3p7",
        }
    }

    /// Where the checkpoint keeps the text model's layers.
    fn layers_prefix(self) -> &'static str {
        match self {
            Wrapper::Qwen35
            | Wrapper::Qwen35Moe
            | Wrapper::Gemma4
            | Wrapper::Gemma3n
            | Wrapper::Step3p7 => "model.language_model.layers",
            Wrapper::Mistral3 | Wrapper::Llama4 => "language_model.model.layers",
        }
    }
}

/// Which of the four projections of a layer add a bias.
///
/// ```
/// let qwen2 = mha::ProjectionBiases { q: true, k: true, v: true, o: false };
/// assert_ne!(qwen2, mha::ProjectionBiases::default()); // the default: no bias at all
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProjectionBiases {
    /// The query projection.
    pub q: bool,
    /// The key projection.
    pub k: bool,
    /// The value projection.
    pub v: bool,
    /// The output projection.
    pub o: bool,
}

impl ProjectionBiases {
    /// The same answer for all four.
    const fn all(on: bool) -> Self {
        ProjectionBiases {
            q: on,
            k: on,
            v: on,
            o: on,
        }
    }
}

/// The QK-norm of a layer, as the config states it (the weights are in the checkpoint).
///
/// ```
/// use mha::{QkNormConfig, QkNormSpan};
/// let qwen3 = QkNormConfig {
///     span: QkNormSpan::PerHead,
///     eps: 1e-6,
///     weight_offset: 0.0,
///     learned: true,
///     placement: mha::QkNormPlacement::BeforeRope,
/// };
/// assert_eq!(qwen3.span, QkNormSpan::PerHead);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkNormConfig {
    /// Per head (Qwen3) or over the whole projection (OLMo 2).
    pub span: QkNormSpan,
    /// `rms_norm_eps`.
    pub eps: f32,
    /// Added to the stored weights when loading: 1 for Gemma 3, whose RMSNorm multiplies by
    /// `1 + weight`; 0 for the others.
    pub weight_offset: f32,
    /// Whether the checkpoint stores the weights (`q_norm.weight`, `k_norm.weight`); Llama 4's
    /// norm has none (weights of 1).
    pub learned: bool,
    /// Before RoPE (most families) or after it (Llama 4).
    pub placement: QkNormPlacement,
}

/// The attention of one layer of a model, as its `config.json` describes it.
///
/// Read with [`from_json`](Self::from_json) (or [`from_file`](Self::from_file)); the fields
/// are public to read and adjust. The layer computes, for `H = n_heads` query heads and
/// `Hkv = n_kv_heads` key/value heads of `head_dim` features each:
/// project (`+ bias` where [`biases`](Self::biases) says; the
/// [`projection_scales`](Self::projection_scales) folded in) → QK-norm → RoPE on queries and
/// keys (the QK-norm after it where [`QkNormConfig::placement`] says) →
/// `softmax(scale · q·kᵀ)` causally → output projection.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct AttentionConfig {
    /// The model family (`model_type`).
    pub model_type: ModelType,
    /// The layer index this configuration is for.
    pub layer: usize,
    /// The number of layers of the model (`num_hidden_layers`; BLOOM's `n_layer`).
    pub num_hidden_layers: usize,
    /// The model width `D` (`hidden_size`).
    pub hidden_size: usize,
    /// The number of query heads `H` (`num_attention_heads`).
    pub n_heads: usize,
    /// The number of key/value heads `Hkv` (`num_key_value_heads`), dividing `H`.
    pub n_kv_heads: usize,
    /// The width of a head (`head_dim` when given, else `hidden_size / num_attention_heads`);
    /// `H · head_dim` may differ from `D` (Qwen3).
    pub head_dim: usize,
    /// The rotary embedding of this layer; `None` for a layer without one (BLOOM, SmolLM3's
    /// layers listed in `no_rope_layers`, the full layers of EXAONE 4 and Command R7B).
    pub rope: Option<Rope>,
    /// The QK-norm (Qwen3: per head; OLMo 2: whole projection), else `None`.
    pub qk_norm: Option<QkNormConfig>,
    /// The softmax scale: `1/√head_dim`, or `query_pre_attn_scalar^-½` (Gemma 2/3).
    pub scale: f32,
    /// The sliding window of this layer: query `i` sees keys `j` with `i − window < j ≤ i`
    /// (as `transformers` masks), or `None` for causal attention over every earlier token.
    pub sliding_window: Option<usize>,
    /// The logit soft cap, `attn_logit_softcapping` (Gemma 2/3).
    pub softcap: Option<f32>,
    /// Whether the layer adds ALiBi with the standard slopes (BLOOM), placing keys at their
    /// rank among the real tokens ([`AlibiPositions::RealTokens`](crate::AlibiPositions)).
    pub alibi: bool,
    /// Whether the layer has attention sinks, one learned logit per head, stored in the
    /// checkpoint as `{prefix}.sinks` (gpt-oss).
    pub sinks: bool,
    /// Which projections add a bias.
    pub biases: ProjectionBiases,
    /// `max_position_embeddings`: the context length the model was made for (a natural
    /// capacity for rotary tables and caches).
    pub max_position_embeddings: usize,
    /// The composite model whose `text_config` this is, if any.
    pub wrapper: Option<Wrapper>,
    /// The output gate: Qwen3.5's and Qwen3-Next's sigmoid per feature, stored in `q_proj`
    /// after each head's query rows (`[q_h | gate_h]` per head `h`); Laguna's softplus in
    /// `g_proj`.
    pub output_gate: Option<GateConfig>,
    /// The position-dependent query scale: Ministral 3's `llama_4_scaling_beta` (from the
    /// rope dictionary, with its `original_max_position_embeddings` as the period), Llama 4's
    /// attention temperature tuning on its layers without rotary (`attn_scale`, `floor_scale`).
    pub query_scale: Option<QueryScale>,
    /// Chunked attention's chunk (`attention_chunk_size`: Llama 4's `chunked_attention` layers).
    pub attention_chunk_size: Option<usize>,
    /// The `eps` of the weight-less RMSNorm of each value head (Gemma 4's `v_norm`, from
    /// `rms_norm_eps`), else `None`.
    pub value_norm: Option<f32>,
    /// Whether the values are the key projection's output (Gemma 4's full layers with
    /// `attention_k_eq_v`): the checkpoint has no `v_proj`; the weights are loaded with `Wk`
    /// (and its bias) as `Wv`, and the layer built with
    /// [`values_from_keys`](crate::LayerBuilder::values_from_keys) (`Wk` packed once, its output
    /// the values, before the key's QK-norm and rotary).
    pub values_from_keys: bool,
    /// Factors folded into the projections when the weights are loaded (Falcon-H1's
    /// multipliers, MiMo-V2-Flash's `attention_value_scale`; all 1 for the other families).
    pub projection_scales: ProjectionScales,
    /// The width of a value head `dv` (MiMo-V2-Flash's `v_head_dim`; `head_dim` for the
    /// other families): `v_proj` has `n_kv_heads · dv` outputs and `o_proj` `n_heads · dv`
    /// inputs ([`Widths::with_value_width`](crate::Widths::with_value_width)).
    pub v_head_dim: usize,
    /// The layer whose cache this layer attends over, for a KV-shared layer (Gemma 4's last
    /// `num_kv_shared_layers` layers, each reading the last earlier layer of its type): the
    /// checkpoint has no key or value projection for it, and it is built from
    /// [`Projections::queries_only`](crate::Projections::queries_only) (see
    /// [`Checkpoint::kv_source`](crate::Checkpoint::kv_source)). `None` for a layer with its
    /// own keys and values.
    pub kv_source: Option<usize>,
}

impl AttentionConfig {
    /// Reads the attention of layer `layer` from the text of a `config.json`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key and value at fault: bad JSON (with its byte position),
    /// a missing or mistyped key, an unknown `model_type`, an unsupported setting, values that
    /// do not fit together, or a layer past `num_hidden_layers`.
    ///
    /// ```
    /// use mha::{AttentionConfig, ConfigError};
    /// let pythia = r#"{"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8,
    ///                  "num_hidden_layers": 6, "rotary_pct": 0.25, "rotary_emb_base": 10000}"#;
    /// let config = AttentionConfig::from_json(pythia, 5)?;
    /// assert_eq!(config.rope.unwrap().rotary_dim, 16); // a quarter of the 64-wide heads
    /// assert!(config.biases.q && config.biases.o);
    ///
    /// let err = AttentionConfig::from_json(pythia, 6).unwrap_err();
    /// let key = "num_hidden_layers";
    /// assert_eq!(err, ConfigError::LayerOutOfRange { layer: 6, layers: 6, key });
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn from_json(text: &str, layer: usize) -> Result<Self> {
        Self::from_value(&json::parse(text)?, layer)
    }

    /// Reads the attention of layer `layer` from a parsed `config.json`, as
    /// [`from_json`](Self::from_json).
    fn from_value(value: &Value<'_>, layer: usize) -> Result<Self> {
        let (top, wrapper) = text_model(Obj::root(value)?)?;
        let model_type = read_model_type(&top)?;
        let (num_hidden_layers, sliding, sliding_window) = read_window(&top, model_type, layer)?;
        let (hidden_size, n_heads, n_kv_heads, head_dim) = read_heads(&top, model_type)?;
        let n_heads = match model_type {
            ModelType::Step35 => step::heads(&top, layer, sliding, n_heads)?,
            _ => heads_of_layer(&top, (layer, num_hidden_layers), n_heads)?,
        };
        let gemma4 = match model_type {
            ModelType::Gemma4 => {
                let heads = (n_kv_heads, head_dim);
                let slides = |i| read_window(&top, model_type, i).map(|(_, sliding, _)| sliding);
                Some(gemma4::read(
                    &top,
                    (layer, num_hidden_layers),
                    (sliding, &slides),
                    heads,
                )?)
            }
            _ => None,
        };
        let (n_kv_heads, head_dim) = gemma4.map_or((n_kv_heads, head_dim), |g| g.heads);
        let mimo = match model_type {
            ModelType::MiMoV2Flash => Some(mimo::read(&top, sliding, n_kv_heads)?),
            _ => None,
        };
        let n_kv_heads = mimo.map_or(n_kv_heads, |m| m.n_kv_heads);
        let kv_source = match model_type {
            ModelType::Gemma3n => {
                let slides = |i| read_window(&top, model_type, i).map(|(_, sliding, _)| sliding);
                gemma4::kv_source(&top, (layer, num_hidden_layers, 15), &slides)?
            }
            _ => None,
        };
        let kinds = (model_type, wrapper);
        let window = (layer, sliding, sliding_window);
        let heads = (
            num_hidden_layers,
            hidden_size,
            n_heads,
            n_kv_heads,
            head_dim,
        );
        let read = match (Self::read_layer(&top, kinds, window, heads), &gemma4) {
            (Ok(config), Some(gemma4)) => Ok(AttentionConfig {
                values_from_keys: gemma4.values_from_keys,
                kv_source: gemma4.kv_source,
                ..config
            }),
            (Err(error), Some(gemma4)) => Err(gemma4.name_keys(error)),
            (read, None) => read.map(|config| AttentionConfig {
                kv_source,
                ..config
            }),
        };
        let config = read.map(|config| mimo.map_or(config, |m| m.apply(config)))?;
        config.validate()?;
        Ok(config)
    }

    /// The rest of [`from_value`](Self::from_value): layer `layer` (which slides its window,
    /// `sliding`, of `sliding_window`) of `(num_hidden_layers, hidden_size, n_heads,
    /// n_kv_heads, head_dim)`; the values from the value projection.
    fn read_layer(
        top: &Obj<'_, '_>,
        (model_type, wrapper): (ModelType, Option<Wrapper>),
        (layer, sliding, sliding_window): (usize, bool, Option<usize>),
        heads: (usize, usize, usize, usize, usize),
    ) -> Result<Self> {
        let (num_hidden_layers, hidden_size, n_heads, n_kv_heads, head_dim) = heads;
        let value_norm = matches!(model_type, ModelType::Gemma4 | ModelType::Gemma3n);
        let max_position_embeddings = top
            .usize("max_position_embeddings")?
            .unwrap_or(model_type.default_max_positions());
        if max_position_embeddings == 0 {
            return Err(at_least_one("max_position_embeddings"));
        }
        let qk_norm = read_qk_norm(top, model_type)?;
        let mut config = AttentionConfig {
            model_type,
            layer,
            num_hidden_layers,
            hidden_size,
            n_heads,
            n_kv_heads,
            head_dim,
            rope: None,
            qk_norm,
            scale: read_scale(top, model_type, head_dim)?,
            sliding_window,
            softcap: read_softcap(top, model_type)?,
            alibi: model_type == ModelType::Bloom,
            sinks: matches!(model_type, ModelType::GptOss | ModelType::GraniteSwa),
            biases: read_biases(top, model_type)?,
            max_position_embeddings,
            wrapper,
            output_gate: gate::read(top, model_type)?,
            query_scale: None,
            attention_chunk_size: None,
            value_norm: qk_norm.filter(|_| value_norm).map(|norm| norm.eps),
            values_from_keys: false,
            projection_scales: scales::read(top, model_type)?,
            v_head_dim: head_dim,
            kv_source: None,
        };
        config.validate()?;
        if model_type.has_rope(top, layer, sliding)? {
            let kind = (layer, sliding);
            let rope = rope::read(top, model_type, kind, head_dim, max_position_embeddings)?;
            config.rope = Some(rope);
        } else if model_type == ModelType::Llama4 {
            // Llama 4's layers without rotary have no QK-norm.
            config.qk_norm = None;
        }
        config.query_scale = read_query_scale(top, model_type, config.rope.is_some())?;
        config.attention_chunk_size = read_chunk(top, model_type, layer, config.rope.is_some())?;
        Ok(config)
    }

    /// Reads `config.json` from `path`, as [`from_json`](Self::from_json).
    ///
    /// # Errors
    /// [`ConfigError::Io`] naming the path, [`ConfigError::TooLarge`] for a file longer than
    /// [`MAX_CONFIG_LEN`] (not read), or any error of [`from_json`](Self::from_json).
    ///
    /// ```no_run
    /// let config = mha::AttentionConfig::from_file("Qwen3-0.6B/config.json", 0)?;
    /// # Ok::<(), mha::ConfigError>(())
    /// ```
    #[cfg(feature = "std")]
    pub fn from_file(path: impl AsRef<std::path::Path>, layer: usize) -> Result<Self> {
        let path = path.as_ref();
        let shown = || path.display().to_string();
        let text = read_file(path, MAX_CONFIG_LEN).map_err(|e| match e {
            FileError::Io(e) => ConfigError::Io {
                path: shown(),
                message: e.to_string(),
            },
            FileError::TooLarge { len } => ConfigError::TooLarge {
                path: shown(),
                len,
                limit: MAX_CONFIG_LEN,
            },
        })?;
        Self::from_json(&text, layer)
    }

    /// How the checkpoint stores this layer's weights ([`ModelType::layout`]).
    pub fn layout(&self) -> Layout {
        self.model_type.layout()
    }

    /// The prefix of this layer's attention tensors in the family's `…ForCausalLM`
    /// checkpoints: `model.layers.{i}.self_attn`, `gpt_neox.layers.{i}.attention`,
    /// (BLOOM) `transformer.h.{i}.self_attention` or (Nemotron-H) `backbone.layers.{i}.mixer`.
    /// Checkpoints of the bare model drop the first component;
    /// [`Layout::prefixes_in`] lists the prefixes a file holds.
    ///
    /// ```
    /// # let json = r#"{"model_type": "gpt_neox", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 4}"#;
    /// let config = mha::AttentionConfig::from_json(json, 3)?;
    /// assert_eq!(config.tensor_prefix(), "gpt_neox.layers.3.attention");
    /// # Ok::<(), mha::ConfigError>(())
    /// ```
    pub fn tensor_prefix(&self) -> String {
        if let Some(wrapper) = self.wrapper {
            return format!("{}.{}.self_attn", wrapper.layers_prefix(), self.layer);
        }
        match self.model_type {
            ModelType::GptNeox => format!("gpt_neox.layers.{}.attention", self.layer),
            ModelType::Bloom => format!("transformer.h.{}.self_attention", self.layer),
            // As save_pretrained (and the published checkpoints) name Nemotron-H's layers.
            ModelType::NemotronH => format!("backbone.layers.{}.mixer", self.layer),
            _ => format!("model.layers.{}.self_attn", self.layer),
        }
    }

    /// Checks that the head counts and widths describe a layer: every count at least 1,
    /// `n_kv_heads` dividing `n_heads`, the projection widths (`n_heads · head_dim`, and
    /// `(n_heads + 2 · n_kv_heads) · head_dim` for the fused layouts) within `usize`, the
    /// weights (`hidden_size · (2 · n_heads + 2 · n_kv_heads) · head_dim` floats) within
    /// `isize::MAX` bytes, and for
    /// GPT-NeoX and BLOOM (fused per head) `n_kv_heads = n_heads` and `n_heads · head_dim = hidden_size`. [`from_json`](Self::from_json) ends with
    /// it, and loading the weights repeats it, as the fields may have been changed.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the config key and value.
    ///
    /// ```
    /// # let json = r#"{"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1}"#;
    /// let mut config = mha::AttentionConfig::from_json(json, 0)?;
    /// config.n_kv_heads = 3;
    /// assert_eq!(
    ///     config.validate().unwrap_err().to_string(),
    ///     r#"config.json: "num_key_value_heads" = 3: must divide num_attention_heads = 2"#
    /// );
    /// # Ok::<(), mha::ConfigError>(())
    /// ```
    pub fn validate(&self) -> Result<()> {
        self.widths()?;
        self.value_widths().map(drop)
    }

    /// `(n_kv_heads · v_head_dim, n_heads · v_head_dim)`: the widths of the values and of the
    /// merged heads.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `v_head_dim` when it is 0 or the widths overflow.
    pub(crate) fn value_widths(&self) -> Result<(usize, usize)> {
        let dv = self.v_head_dim;
        if dv == 0 {
            return Err(at_least_one("v_head_dim"));
        }
        let widths = (
            self.n_kv_heads.checked_mul(dv),
            self.n_heads.checked_mul(dv),
        );
        let (Some(value), Some(merged)) = widths else {
            let reason = format!("with {} heads, the value widths overflow", self.n_heads);
            return Err(ConfigError::invalid("v_head_dim", dv, reason));
        };
        Ok((value, merged))
    }

    /// `(n_heads · head_dim, n_kv_heads · head_dim)`, after the checks of
    /// [`validate`](Self::validate).
    pub(crate) fn widths(&self) -> Result<(usize, usize)> {
        let heads_key = self.model_type.heads_key();
        for (key, value) in [
            ("hidden_size", self.hidden_size),
            (heads_key, self.n_heads),
            ("num_key_value_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
        ] {
            if value == 0 {
                return Err(at_least_one(key));
            }
        }
        let invalid = ConfigError::invalid;
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            let reason = format!("must divide {heads_key} = {}", self.n_heads);
            return Err(invalid("num_key_value_heads", self.n_kv_heads, reason));
        }
        let q = self.n_heads.checked_mul(self.head_dim);
        let kv = self.n_kv_heads.checked_mul(self.head_dim);
        let fused = kv.and_then(|kv| kv.checked_mul(2)?.checked_add(q?));
        let (Some(q), Some(kv), Some(fused)) = (q, kv, fused) else {
            let reason = format!(
                "with {heads_key} = {}, num_key_value_heads = {} and hidden_size = {}, the projection widths overflow",
                self.n_heads, self.n_kv_heads, self.hidden_size
            );
            return Err(invalid("head_dim", self.head_dim, reason));
        };
        // `[Wq | Wk | Wv]` and `Wo`: `D · (Q + 2·KV) + Q · D` floats.
        let bytes = fused
            .checked_add(q)
            .and_then(|n| n.checked_mul(self.hidden_size)?.checked_mul(4));
        if bytes.is_none_or(|bytes| bytes > isize::MAX as usize) {
            let reason = format!(
                "with {heads_key} = {}, num_key_value_heads = {} and head_dim = {}, the weights pass isize::MAX bytes",
                self.n_heads, self.n_kv_heads, self.head_dim
            );
            return Err(invalid("hidden_size", self.hidden_size, reason));
        }
        if self.layout() == Layout::GptNeox && (q != self.hidden_size || kv != q) {
            let reason = format!(
                "{} needs {heads_key} {} = num_key_value_heads {} and {heads_key} x head_dim = hidden_size {}",
                self.model_type, self.n_heads, self.n_kv_heads, self.hidden_size
            );
            return Err(invalid("head_dim", self.head_dim, reason));
        }
        Ok((q, kv))
    }
}

/// The longest `config.json` read from a file, in bytes: 16 MB ([`AttentionConfig::from_file`]
/// and [`Checkpoint::open`](crate::Checkpoint::open) refuse a longer one before reading it). The
/// configs of the families read here take a few kilobytes; a list of labels makes one longer.
pub const MAX_CONFIG_LEN: usize = 16_000_000;

/// Why [`read_file`] read no text.
#[cfg(feature = "std")]
#[derive(Debug)]
pub(crate) enum FileError {
    /// Opening or reading the file failed (or it is not UTF-8).
    Io(std::io::Error),
    /// The file is longer than the limit: its length, or (one that grew while read, or is not a
    /// regular file) the bytes read before stopping.
    TooLarge { len: u64 },
}

/// The text of the file at `path`, which must hold at most `limit` bytes: its length is checked
/// before anything is read, and no more than `limit + 1` bytes are read.
#[cfg(feature = "std")]
pub(crate) fn read_file(
    path: &std::path::Path,
    limit: usize,
) -> core::result::Result<String, FileError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(FileError::Io)?;
    let len = file.metadata().map_err(FileError::Io)?.len();
    let limit = limit as u64;
    if len > limit {
        return Err(FileError::TooLarge { len });
    }
    let mut text = String::new();
    (file.take(limit + 1))
        .read_to_string(&mut text)
        .map_err(FileError::Io)?;
    match text.len() as u64 {
        read if read > limit => Err(FileError::TooLarge { len: read }),
        _ => Ok(text),
    }
}

/// A `config.json` parsed once and kept (its JSON tree, borrowing nothing), from which each
/// layer's [`AttentionConfig`] is read without parsing the text again (for
/// [`Checkpoint`](crate::Checkpoint)).
#[cfg(feature = "std")]
#[derive(Clone, Debug)]
pub(crate) struct ParsedConfig {
    value: Value<'static>,
}

#[cfg(feature = "std")]
impl ParsedConfig {
    /// Parses the text of a `config.json`.
    ///
    /// # Errors
    /// [`ConfigError::Json`] or [`ConfigError::AllocationFailed`], as
    /// [`AttentionConfig::from_json`].
    pub(crate) fn parse(text: &str) -> Result<Self> {
        let value = json::parse(text)?.into_owned();
        Ok(ParsedConfig { value })
    }

    /// The attention of layer `layer`, as [`AttentionConfig::from_json`] reads it.
    ///
    /// # Errors
    /// As [`AttentionConfig::from_json`], but for the JSON syntax.
    pub(crate) fn layer(&self, layer: usize) -> Result<AttentionConfig> {
        AttentionConfig::from_value(&self.value, layer)
    }

    /// The attention of the model's first attention layer: layer 0, or in a hybrid stack whose
    /// layer 0 is of another kind ([`ConfigError::NotAttention`]) the first that is attention.
    ///
    /// # Errors
    /// As [`layer`](Self::layer) (the error of layer 0 when the model has no attention layer).
    pub(crate) fn first_attention_layer(&self) -> Result<AttentionConfig> {
        match self.layer(0) {
            Err(ConfigError::NotAttention {
                attention_layers, ..
            }) if !attention_layers.is_empty() => self.layer(attention_layers[0]),
            first => first,
        }
    }
}

/// The object describing the text model: `text_config` of a [`Wrapper`], else `root`.
fn text_model<'v, 'a>(root: Obj<'v, 'a>) -> Result<(Obj<'v, 'a>, Option<Wrapper>)> {
    let name = root.str("model_type")?;
    let Some(wrapper) = Wrapper::ALL.into_iter().find(|w| Some(w.name()) == name) else {
        return Ok((root, None));
    };
    let key = "text_config";
    let text = required(&root, key, root.object(key)?)?;
    Ok((text, Some(wrapper)))
}

/// `model_type`, one of [`ModelType::ALL`].
fn read_model_type(top: &Obj<'_, '_>) -> Result<ModelType> {
    let name = required(top, "model_type", top.str("model_type")?)?;
    ModelType::from_name(name).ok_or_else(|| ConfigError::UnknownModelType {
        model_type: name.to_string(),
    })
}

/// The number of layers, whether `layer` is a sliding-attention layer, and its window, after
/// checking that the layer exists. A layer slides when
/// `layer_types[layer]` is `"sliding_attention"` or, without `layer_types`, as the family
/// derives it ([`ModelType::sliding_by_default`]); its window is `sliding_window` (the
/// family's default when absent, none when `null`).
fn read_window(
    top: &Obj<'_, '_>,
    model_type: ModelType,
    layer: usize,
) -> Result<(usize, bool, Option<usize>)> {
    let kinds = hybrid::LayerKinds::read(top, model_type)?;
    let (layers_key, layers) = match &kinds {
        // Nemotron-H counts its layers by their kinds (num_hidden_layers is ignored).
        Some(kinds) if model_type == ModelType::NemotronH => (kinds.key, kinds.len()),
        _ => {
            let key = model_type.layers_key();
            (key, required(top, key, top.usize(key)?)?)
        }
    };
    if layer >= layers {
        return Err(ConfigError::LayerOutOfRange {
            layer,
            layers,
            key: layers_key,
        });
    }
    let sliding = match (kinds, top.array("layer_types")?) {
        (Some(kinds), _) => kinds.slides(top, layer, (layers_key, layers))?,
        (None, Some(types)) => layer_slides(top, types, layer, (layers_key, layers))?,
        (None, None) => {
            refuse_default_linear(top, model_type, layer, layers)?;
            model_type.sliding_by_default(top, layer)?
        }
    };
    // Gemma4TextConfig makes the last layer full, whatever layer_types says.
    let sliding = sliding && !(model_type == ModelType::Gemma4 && layer + 1 == layers);
    if !sliding {
        return Ok((layers, false, None));
    }
    if !model_type.applies_window(top)? {
        return Ok((layers, true, None));
    }
    // Gemma's key; `null` (Gemma 2's default) is false.
    let bidirectional = "use_bidirectional_attention";
    let flag = model_type != ModelType::Gemma4 && top.get(bidirectional)?.is_some();
    if flag && top.bool(bidirectional)? == Some(true) {
        return Err(ConfigError::Unsupported {
            key: bidirectional.to_string(),
            value: "true".to_string(),
            reason: "only causal attention is implemented for config.json layers",
        });
    }
    let window = match top.raw("sliding_window")? {
        None => model_type.default_window(),
        Some(_) => top.usize("sliding_window")?,
    };
    match window {
        Some(0) => Err(at_least_one("sliding_window")),
        window => Ok((layers, true, window)),
    }
}

/// [`ConfigError::Invalid`]: `key` = 0 must be at least 1.
fn at_least_one(key: &str) -> ConfigError {
    ConfigError::invalid(key, 0, "must be at least 1")
}

/// The layer kinds of hybrid models that are not softmax attention (`mamba` is the legacy
/// name of `linear_attention`; `mlp` and `moe` are Nemotron-H's feed-forward layers).
const NOT_ATTENTION: [&str; 5] = ["linear_attention", "mamba", "conv", "mlp", "moe"];

/// Whether a layer kind is an attention layer's (`attention`: the legacy name of
/// `full_attention`, which `transformers` renames).
fn is_attention_kind(kind: &str) -> bool {
    let kinds = [
        "full_attention",
        "sliding_attention",
        "chunked_attention",
        "attention",
    ];
    kinds.contains(&kind)
}

/// Whether a `layer_types` entry is an attention layer's.
fn is_attention(kind: &Value<'_>) -> bool {
    matches!(kind, Value::String(k) if is_attention_kind(k))
}

/// For Qwen3.5 and Qwen3-Next without `layer_types`: [`ConfigError::NotAttention`] unless
/// `layer` is one of every `full_attention_interval`-th (4) layers, counting from 1.
fn refuse_default_linear(
    top: &Obj<'_, '_>,
    model_type: ModelType,
    layer: usize,
    layers: usize,
) -> Result<()> {
    if !matches!(
        model_type,
        ModelType::Qwen3Next | ModelType::Qwen35 | ModelType::Qwen35Moe
    ) {
        return Ok(());
    }
    let key = "full_attention_interval";
    let interval = top.usize(key)?.unwrap_or(4);
    if interval == 0 {
        return Err(at_least_one(key));
    }
    if (layer + 1).is_multiple_of(interval) {
        return Ok(());
    }
    let attention_layers = (0..layers)
        .filter(|i| (i + 1).is_multiple_of(interval))
        .collect();
    Err(ConfigError::NotAttention {
        layer,
        kind: String::from("linear_attention"),
        key: format!("no layer_types: {key} = {interval}"),
        attention_layers,
    })
}

/// Whether `layer_types[layer]` is `"sliding_attention"` (else `"full_attention"`); a kind of
/// [`NOT_ATTENTION`] is [`ConfigError::NotAttention`].
fn layer_slides(
    top: &Obj<'_, '_>,
    types: &[Value<'_>],
    layer: usize,
    (layers_key, layers): (&str, usize),
) -> Result<bool> {
    let key = format!("layer_types[{layer}]");
    match types.get(layer) {
        Some(Value::String(kind))
            if kind == "full_attention" || kind == "chunked_attention" || kind == "attention" =>
        {
            Ok(false)
        }
        Some(Value::String(kind)) if kind == "sliding_attention" => Ok(true),
        Some(Value::String(kind)) if NOT_ATTENTION.contains(&&**kind) => {
            Err(ConfigError::NotAttention {
                layer,
                kind: kind.to_string(),
                key: top.key(&key),
                attention_layers: (0..types.len())
                    .filter(|&i| is_attention(&types[i]))
                    .collect(),
            })
        }
        Some(v @ Value::String(_)) => Err(ConfigError::Unsupported {
            key,
            value: describe(v),
            reason: "the layer types implemented are full_attention and sliding_attention",
        }),
        Some(v) => Err(ConfigError::WrongType {
            key,
            expected: "a string",
            found: describe(v),
        }),
        None => Err(ConfigError::invalid(
            top.key("layer_types"),
            format!("{} entries", types.len()),
            format!("needs one per layer, {layers_key} = {layers}"),
        )),
    }
}

/// `(hidden_size, num_attention_heads, num_key_value_heads, head_dim)`.
fn read_heads(top: &Obj<'_, '_>, model_type: ModelType) -> Result<(usize, usize, usize, usize)> {
    let hidden = required(top, "hidden_size", top.usize("hidden_size")?)?;
    let heads_key = model_type.heads_key();
    let heads = required(top, heads_key, top.usize(heads_key)?)?;
    let kv_heads = match top.usize("num_key_value_heads")? {
        // GPTNeoXConfig and BloomConfig have no such key; a null one means "as many as the
        // query heads".
        _ if model_type.layout() == Layout::GptNeox => heads,
        Some(kv_heads) => kv_heads,
        None if top.raw("num_key_value_heads")?.is_some() => heads,
        None => model_type.default_kv_heads().unwrap_or(heads),
    };
    // Cohere2Config sets head_dim to hidden_size / num_attention_heads, whatever is written.
    let given = match model_type {
        ModelType::Cohere2 => None,
        _ => top.usize("head_dim")?,
    };
    let head_dim = match given.or(model_type.default_head_dim()) {
        Some(head_dim) => head_dim,
        None if heads == 0 => return Err(at_least_one(heads_key)),
        None if hidden.is_multiple_of(heads) => hidden / heads,
        None => {
            return Err(ConfigError::invalid(
                heads_key,
                heads,
                format!("must divide hidden_size = {hidden} when head_dim is absent"),
            ))
        }
    };
    Ok((hidden, heads, kv_heads, head_dim))
}

/// Layer `layer`'s query heads: `num_attention_heads_per_layer[layer]` when the config lists
/// them (Laguna; one entry per layer, each at least 1), else the model's `n_heads`.
fn heads_of_layer(
    top: &Obj<'_, '_>,
    (layer, layers): (usize, usize),
    n_heads: usize,
) -> Result<usize> {
    let key = "num_attention_heads_per_layer";
    let Some(list) = top.array(key)? else {
        return Ok(n_heads);
    };
    if list.len() != layers {
        let reason = format!("needs one entry per layer, num_hidden_layers = {layers}");
        return Err(ConfigError::invalid(
            top.key(key),
            format!("{} entries", list.len()),
            reason,
        ));
    }
    let entry = format!("{key}[{layer}]");
    match &list[layer] {
        Value::Number(n) => match n.parse::<usize>() {
            Ok(0) => Err(at_least_one(&top.key(&entry))),
            Ok(heads) => Ok(heads),
            Err(_) => Err(ConfigError::invalid(
                top.key(&entry),
                describe(&list[layer]),
                "must be a whole number",
            )),
        },
        v => Err(ConfigError::WrongType {
            key: top.key(&entry),
            expected: "a positive integer",
            found: describe(v),
        }),
    }
}

/// The QK-norm of the families that have one, with `rms_norm_eps`.
fn read_qk_norm(top: &Obj<'_, '_>, model_type: ModelType) -> Result<Option<QkNormConfig>> {
    if model_type == ModelType::Phi && top.bool("qk_layernorm")? == Some(true) {
        return Err(ConfigError::Unsupported {
            key: String::from("qk_layernorm"),
            value: String::from("true"),
            reason: "Phi's LayerNorm of the queries and keys (with a bias) is not implemented",
        });
    }
    let Some((span, default_eps, weight_offset)) = model_type.qk_norm() else {
        return Ok(None);
    };
    if model_type == ModelType::Glm4Moe && top.bool("use_qk_norm")? != Some(true) {
        return Ok(None);
    }
    // LFM2 names its epsilon norm_eps.
    let key = match model_type {
        ModelType::Lfm2 => "norm_eps",
        _ => "rms_norm_eps",
    };
    let eps = top.f64(key)?.unwrap_or(default_eps);
    if eps < 0.0 {
        let written = top.written(key);
        return Err(ConfigError::invalid(key, written, "must not be negative"));
    }
    let llama4 = model_type == ModelType::Llama4;
    if llama4 && top.bool("use_qk_norm")? == Some(false) {
        return Ok(None);
    }
    Ok(Some(QkNormConfig {
        span,
        eps: layer_f32(top, key, "the QK-norm eps", eps, Range::NonNegative)?,
        weight_offset,
        learned: !llama4,
        // Llama 4's weight-less norm and Hunyuan's weighted one follow the rotary embedding.
        placement: match model_type {
            ModelType::Llama4 | ModelType::HunyuanDense => QkNormPlacement::AfterRope,
            _ => QkNormPlacement::BeforeRope,
        },
    }))
}

/// The biases each family's attention module creates: Mistral, Phi-3, EXAONE 4 none, Qwen2 on
/// the query, key and value projections only, Phi and BLOOM on all four, GLM-4.5 on the query,
/// key and value projections as `attention_bias` says, Seed-OSS on those as `attention_bias`
/// says (default true) and on the output as `attention_out_bias` says, ERNIE 4.5 on all four
/// as `use_bias` says, the others on all four as `attention_bias` says (default false; true
/// for GPT-NeoX and gpt-oss).
fn read_biases(top: &Obj<'_, '_>, model_type: ModelType) -> Result<ProjectionBiases> {
    let flag = |key, default| Ok::<_, ConfigError>(top.bool(key)?.unwrap_or(default));
    let inputs = |on: bool, o: bool| ProjectionBiases {
        o,
        ..ProjectionBiases::all(on)
    };
    Ok(match model_type {
        // MiniMax-M2's, LFM2's and Nemotron-H's attention modules build their projections
        // without biases, whatever the config says.
        ModelType::Mistral
        | ModelType::Phi3
        | ModelType::Exaone4
        | ModelType::Ministral3
        | ModelType::MiniMaxM2
        | ModelType::Lfm2
        | ModelType::NemotronH => ProjectionBiases::default(),
        ModelType::Qwen2 => inputs(true, false),
        ModelType::Phi | ModelType::Bloom => ProjectionBiases::all(true),
        ModelType::GptNeox | ModelType::GptOss => {
            ProjectionBiases::all(flag("attention_bias", true)?)
        }
        ModelType::Glm4Moe => inputs(flag("attention_bias", false)?, false),
        ModelType::SeedOss => inputs(
            flag("attention_bias", true)?,
            flag("attention_out_bias", false)?,
        ),
        ModelType::Ernie45 => ProjectionBiases::all(flag("use_bias", false)?),
        ModelType::Llama
        | ModelType::Qwen3
        | ModelType::Olmo2
        | ModelType::Gemma2
        | ModelType::Gemma3
        | ModelType::SmolLm3
        | ModelType::Olmo3
        | ModelType::Apertus
        | ModelType::Cohere2
        | ModelType::Qwen3Next
        | ModelType::Qwen35
        | ModelType::Qwen35Moe
        | ModelType::Llama4
        | ModelType::Gemma4
        | ModelType::HunyuanDense
        | ModelType::GraniteSwa
        | ModelType::GraniteMoeHybrid
        | ModelType::FalconH1
        | ModelType::Laguna
        | ModelType::Gemma3n
        | ModelType::Step35 => ProjectionBiases::all(flag("attention_bias", false)?),
        // MiMoV2FlashAttention: o_proj has no bias.
        ModelType::MiMoV2Flash => inputs(flag("attention_bias", false)?, false),
    })
}

/// The softmax scale: `query_pre_attn_scalar^-½` for Gemma 2/3 (default 256) and Step 3.5
/// (default `head_dim`), 1 for Gemma 4,
/// `attention_multiplier` for the Granite families (default 1), else `1/√head_dim`.
fn read_scale(top: &Obj<'_, '_>, model_type: ModelType, head_dim: usize) -> Result<f32> {
    if matches!(model_type, ModelType::Gemma4 | ModelType::Gemma3n) {
        return Ok(1.0);
    }
    if matches!(
        model_type,
        ModelType::GraniteSwa | ModelType::GraniteMoeHybrid
    ) {
        let key = "attention_multiplier";
        let scale = top.f64(key)?.unwrap_or(1.0);
        return layer_f32(top, key, "the softmax scale", scale, Range::NonNegative);
    }
    let default = match model_type {
        ModelType::Gemma2 | ModelType::Gemma3 => 256.0,
        // Step3p7TextConfig: head_dim when absent.
        ModelType::Step35 => head_dim as f64,
        _ => return Ok(crate::kernels::attention::flash::score_scale(head_dim)),
    };
    let key = "query_pre_attn_scalar";
    match top.f64(key)?.unwrap_or(default) {
        x if x > 0.0 => {
            let scale = 1.0 / crate::kernels::math::trig::sqrt(x);
            layer_f32(top, key, "the softmax scale", scale, Range::Positive)
        }
        _ => Err(ConfigError::invalid(
            key,
            top.written(key),
            "must be positive",
        )),
    }
}

/// `attn_logit_softcapping` of Gemma 2 (default 50) and Gemma 3 (default none); `null` is no
/// cap.
fn read_softcap(top: &Obj<'_, '_>, model_type: ModelType) -> Result<Option<f32>> {
    let key = "attn_logit_softcapping";
    let cap = match model_type {
        ModelType::Gemma2 if top.raw(key)?.is_none() => Some(50.0),
        ModelType::Gemma2 | ModelType::Gemma3 => top.f64(key)?,
        _ => None,
    };
    match cap {
        Some(cap) if cap <= 0.0 => Err(ConfigError::invalid(
            key,
            top.written(key),
            "must be positive",
        )),
        Some(cap) => layer_f32(top, key, "the soft cap", cap, Range::Positive).map(Some),
        None => Ok(None),
    }
}

/// The position-dependent query scale: Ministral 3's from `llama_4_scaling_beta` and
/// `original_max_position_embeddings` of its rope dictionary (both required, as its attention
/// reads them), Llama 4's on a layer without rotary (`rope` false) when
/// `attn_temperature_tuning` (default true): `attn_scale` (0.1), `floor_scale` (8192), from
/// the token index plus 1.
fn read_query_scale(
    top: &Obj<'_, '_>,
    model_type: ModelType,
    rope: bool,
) -> Result<Option<QueryScale>> {
    let scale = match model_type {
        ModelType::Ministral3 => rope::llama_4_scaling(top)?,
        ModelType::Llama4 if !rope && top.bool("attn_temperature_tuning")? != Some(false) => {
            let beta = top.f64("attn_scale")?.unwrap_or(0.1);
            let period = top.f64("floor_scale")?.unwrap_or(8192.0);
            if period <= 0.0 {
                let written = top.written("floor_scale");
                return Err(ConfigError::invalid(
                    "floor_scale",
                    written,
                    "must be positive",
                ));
            }
            QueryScale {
                beta,
                period,
                offset: 1,
                from: ScalePosition::Index,
            }
        }
        _ => return Ok(None),
    };
    scale.check().map_err(|error| {
        // The factor grows with beta over the period: the reason names the other.
        let (key, period) = match model_type {
            ModelType::Llama4 => ("attn_scale", "floor_scale"),
            _ => ("llama_4_scaling_beta", "original_max_position_embeddings"),
        };
        let reason = format!("with {period} = {:?}: {error}", scale.period);
        ConfigError::invalid(key, scale.beta, reason)
    })?;
    Ok(Some(scale))
}

/// Llama 4's chunk of layer `layer`: a `chunked_attention` layer (`layer_types[layer]`, or
/// without that list a layer with rotary) has `attention_chunk_size` (8192 when absent). A
/// `chunked_attention` layer of another family is [`ConfigError::Unsupported`].
fn read_chunk(
    top: &Obj<'_, '_>,
    model_type: ModelType,
    layer: usize,
    rope: bool,
) -> Result<Option<usize>> {
    let listed = top
        .array("layer_types")?
        .and_then(|types| match types.get(layer) {
            Some(Value::String(kind)) => Some(kind == "chunked_attention"),
            _ => None,
        });
    if model_type != ModelType::Llama4 {
        return match listed {
            Some(true) => Err(ConfigError::Unsupported {
                key: top.key(&format!("layer_types[{layer}]")),
                value: String::from("\"chunked_attention\""),
                reason: "chunked attention is read for llama4_text only",
            }),
            _ => Ok(None),
        };
    }
    if !listed.unwrap_or(rope) {
        return Ok(None);
    }
    let key = "attention_chunk_size";
    let chunk = match top.raw(key)? {
        None => 8192,
        Some(_) => required(top, key, top.usize(key)?)?,
    };
    match chunk {
        0 => Err(at_least_one(key)),
        chunk => Ok(Some(chunk)),
    }
}
