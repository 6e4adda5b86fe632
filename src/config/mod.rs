//! Reading a Hugging Face `config.json` into the attention configuration of one layer.
//!
//! [`AttentionConfig::from_json`] reads, with the crate's own JSON reader (no dependencies,
//! `no_std`), what the attention of layer `i` of a Llama, Mistral, Qwen2, Qwen3, Phi-3,
//! GPT-NeoX (Pythia) or OLMo 2 model needs: head counts and width, rotary embedding (theta,
//! partial rotary, `linear` / `llama3` / `yarn` scaling), QK-norm, projection biases and the
//! checkpoint [`Layout`]. Both spellings found in the wild are read: the keys most published
//! checkpoints carry (`rope_theta`, `rope_scaling` with `type` or `rope_type`, GPT-NeoX's
//! `rotary_pct` and `rotary_emb_base`) and the ones current `transformers` writes
//! (`rope_parameters`, possibly nested by layer type, and `layer_types`). Absent keys take the
//! defaults of the family's `transformers` configuration class.
//!
//! Anything the crate does not implement — another `model_type`, a `rope_type` such as
//! `dynamic` or `longrope`, sliding-window attention, partial rotary where the family rotates
//! whole heads — is a [`ConfigError`] naming the key and its value, never ignored.
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
//! The weights of the layer are then read from the checkpoint with
//! [`LayerWeights::from_safetensors`](crate::safetensors::LayerWeights::from_safetensors).

mod error;
mod read;
mod rope;

use alloc::format;
use alloc::string::{String, ToString};
use core::fmt;

pub use error::ConfigError;

use crate::mha::{Mha, MhaBuilder};
use crate::norm::{QkNorm, QkNormSpan};
use crate::options::Masking;
use crate::params::{MhaBiases, MhaParams};
use crate::rope::Rope;
use crate::safetensors::json::{self, Value};
use crate::safetensors::Layout;
use read::{describe, required, Obj};

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
    /// `"gpt_neox"`: GPT-NeoX and Pythia, with fused, per-head interleaved `query_key_value`.
    GptNeox,
    /// `"olmo2"`: OLMo 2, with QK-norm over the whole projection.
    Olmo2,
}

impl ModelType {
    /// Every family, in the order of [`NAMES`](Self::NAMES).
    pub const ALL: [ModelType; 7] = [
        ModelType::Llama,
        ModelType::Mistral,
        ModelType::Qwen2,
        ModelType::Qwen3,
        ModelType::Phi3,
        ModelType::GptNeox,
        ModelType::Olmo2,
    ];

    /// The `model_type` strings read, for messages.
    pub const NAMES: &'static str = "llama, mistral, qwen2, qwen3, phi3, gpt_neox, olmo2";

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
            ModelType::GptNeox => "gpt_neox",
            ModelType::Olmo2 => "olmo2",
        }
    }

    /// The family a `model_type` string names, if it is one of [`ALL`](Self::ALL).
    ///
    /// ```
    /// use mha::ModelType;
    /// assert_eq!(ModelType::from_name("qwen3"), Some(ModelType::Qwen3));
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
            ModelType::GptNeox => Layout::GptNeox,
            ModelType::Llama
            | ModelType::Mistral
            | ModelType::Qwen2
            | ModelType::Qwen3
            | ModelType::Olmo2 => Layout::Llama,
        }
    }

    /// `num_key_value_heads` when absent (the configuration class's default); `None` for
    /// "as many as the query heads".
    fn default_kv_heads(self) -> Option<usize> {
        match self {
            ModelType::Qwen2 | ModelType::Qwen3 => Some(32),
            ModelType::Mistral => Some(8),
            _ => None,
        }
    }

    /// `head_dim` when absent; `None` for `hidden_size / num_attention_heads`.
    fn default_head_dim(self) -> Option<usize> {
        match self {
            ModelType::Qwen3 => Some(128),
            _ => None,
        }
    }

    /// `max_position_embeddings` when absent.
    fn default_max_positions(self) -> usize {
        match self {
            ModelType::Mistral => 131_072,
            ModelType::Qwen2 | ModelType::Qwen3 => 32_768,
            ModelType::Phi3 => 4096,
            ModelType::Llama | ModelType::GptNeox | ModelType::Olmo2 => 2048,
        }
    }

    /// The QK-norm span and the default `rms_norm_eps` of the families that have one.
    fn qk_norm(self) -> Option<(QkNormSpan, f64)> {
        match self {
            ModelType::Qwen3 => Some((QkNormSpan::PerHead, 1e-6)),
            ModelType::Olmo2 => Some((QkNormSpan::Whole, 1e-5)),
            _ => None,
        }
    }
}

impl fmt::Display for ModelType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
/// let qwen3 = QkNormConfig { span: QkNormSpan::PerHead, eps: 1e-6 };
/// assert_eq!(qwen3.span, QkNormSpan::PerHead);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkNormConfig {
    /// Per head (Qwen3) or over the whole projection (OLMo 2).
    pub span: QkNormSpan,
    /// `rms_norm_eps`.
    pub eps: f32,
}

/// The attention of one layer of a model, as its `config.json` describes it.
///
/// Read with [`from_json`](Self::from_json) (or [`from_file`](Self::from_file)); the fields
/// are public to read and adjust. The layer computes, for `H = n_heads` query heads and
/// `Hkv = n_kv_heads` key/value heads of `head_dim` features each:
/// project (`+ bias` where [`biases`](Self::biases) says) → QK-norm → RoPE on queries and keys →
/// `softmax(scale · q·kᵀ)` causally → output projection.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct AttentionConfig {
    /// The model family (`model_type`).
    pub model_type: ModelType,
    /// The layer index this configuration is for.
    pub layer: usize,
    /// The model width `D` (`hidden_size`).
    pub hidden_size: usize,
    /// The number of query heads `H` (`num_attention_heads`).
    pub n_heads: usize,
    /// The number of key/value heads `Hkv` (`num_key_value_heads`), dividing `H`.
    pub n_kv_heads: usize,
    /// The width of a head (`head_dim` when given, else `hidden_size / num_attention_heads`);
    /// `H · head_dim` may differ from `D` (Qwen3).
    pub head_dim: usize,
    /// The rotary embedding (every supported family has one).
    pub rope: Option<Rope>,
    /// The QK-norm (Qwen3: per head; OLMo 2: whole projection), else `None`.
    pub qk_norm: Option<QkNormConfig>,
    /// The softmax scale, `1/√head_dim`.
    pub scale: f32,
    /// Which projections add a bias.
    pub biases: ProjectionBiases,
    /// `max_position_embeddings`: the context length the model was made for (a natural
    /// capacity for rotary tables and caches).
    pub max_position_embeddings: usize,
}

impl AttentionConfig {
    /// A builder of this layer over its weights, loaded with
    /// [`LayerWeights::from_safetensors`](crate::safetensors::LayerWeights::from_safetensors)
    /// and [`into_params`](crate::safetensors::LayerWeights::into_params): causal, with the
    /// config's head count, the biases, softmax scale, rotary embedding (its table holding
    /// `rope_capacity` positions: the longest context the layer will see) and QK-norm. The
    /// thread count and instruction set are left to the builder.
    ///
    /// ```
    /// use mha::safetensors::{serialize, LayerWeights, SafeTensors};
    /// use mha::{AttentionConfig, Tensor};
    /// let config = AttentionConfig::from_json(r#"{"model_type": "llama", "hidden_size": 4, "num_hidden_layers": 1,
    ///     "num_attention_heads": 2, "num_key_value_heads": 1, "rope_theta": 10000.0}"#, 0)?;
    /// // A checkpoint's tensors, (out, in) as PyTorch stores them.
    /// let tensor = |rows: usize| (vec![rows, 4], vec![0.125f32; rows * 4]);
    /// let mut named = Vec::new();
    /// for (name, rows) in [("q_proj", 4), ("k_proj", 2), ("v_proj", 2), ("o_proj", 4)] {
    ///     named.push((format!("{}.{name}.weight", config.tensor_prefix()), tensor(rows)));
    /// }
    /// let views: Vec<_> = named.iter().map(|(n, (s, v))| (n.as_str(), s.as_slice(), v.as_slice())).collect();
    /// let bytes = serialize(&views, &[])?;
    /// let st = SafeTensors::parse(&bytes)?;
    /// let weights = LayerWeights::from_safetensors(&st, &config.tensor_prefix(), &config)?;
    /// let (params, biases, qk_norm) = weights.into_params::<4, 2, 4>()?;
    /// let mut layer = config.builder(&params, biases, qk_norm, 128).threads(1).build()?;
    /// let y = layer.forward(&Tensor::<1, 3, 4>::from_fn(|_, t, i| (t + i) as f32));
    /// assert!(y.as_slice().iter().all(|v| v.is_finite()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder<'p, const D: usize, const KV: usize, const Q: usize>(
        &self,
        params: &'p MhaParams<D, D, KV, Q>,
        biases: MhaBiases<D, KV, Q>,
        qk_norm: Option<QkNorm>,
        rope_capacity: usize,
    ) -> MhaBuilder<'p, D, D, KV, Q> {
        let mut builder = Mha::builder(params, self.n_heads)
            .masking(Masking::Causal)
            .biases(biases)
            .scale(self.scale);
        if let Some(rope) = self.rope {
            builder = builder.rope(rope, rope_capacity);
        }
        if let Some(norm) = qk_norm {
            builder = builder.qk_norm(norm);
        }
        builder
    }

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
    /// assert_eq!(err, ConfigError::LayerOutOfRange { layer: 6, num_hidden_layers: 6 });
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn from_json(text: &str, layer: usize) -> Result<Self> {
        let value = json::parse(text)?;
        let top = Obj::root(&value)?;
        let model_type = read_model_type(&top)?;
        check_layer(&top, model_type, layer)?;
        let (hidden_size, n_heads, n_kv_heads, head_dim) = read_heads(&top, model_type)?;
        let max_position_embeddings = top
            .usize("max_position_embeddings")?
            .unwrap_or(model_type.default_max_positions());
        let mut config = AttentionConfig {
            model_type,
            layer,
            hidden_size,
            n_heads,
            n_kv_heads,
            head_dim,
            rope: None,
            qk_norm: read_qk_norm(&top, model_type)?,
            scale: crate::kernels::flash::score_scale(head_dim),
            biases: read_biases(&top, model_type)?,
            max_position_embeddings,
        };
        config.validate()?;
        config.rope = rope::read(&top, model_type, layer, head_dim, max_position_embeddings)?;
        Ok(config)
    }

    /// Reads `config.json` from `path`, as [`from_json`](Self::from_json).
    ///
    /// # Errors
    /// [`ConfigError::Io`] naming the path, or any error of [`from_json`](Self::from_json).
    ///
    /// ```no_run
    /// let config = mha::AttentionConfig::from_file("Qwen3-0.6B/config.json", 0)?;
    /// # Ok::<(), mha::ConfigError>(())
    /// ```
    #[cfg(feature = "std")]
    pub fn from_file(path: impl AsRef<std::path::Path>, layer: usize) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_json(&text, layer)
    }

    /// How the checkpoint stores this layer's weights ([`ModelType::layout`]).
    pub fn layout(&self) -> Layout {
        self.model_type.layout()
    }

    /// The prefix of this layer's attention tensors in the family's `…ForCausalLM`
    /// checkpoints: `model.layers.{i}.self_attn`, or `gpt_neox.layers.{i}.attention`.
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
        match self.model_type {
            ModelType::GptNeox => format!("gpt_neox.layers.{}.attention", self.layer),
            _ => format!("model.layers.{}.self_attn", self.layer),
        }
    }

    /// Checks that the head counts and widths describe a layer: every count at least 1,
    /// `n_kv_heads` dividing `n_heads`, the projection widths (`n_heads · head_dim`, and
    /// `(n_heads + 2 · n_kv_heads) · head_dim` for the fused layouts) within `usize`, and for
    /// GPT-NeoX `n_kv_heads = n_heads` and `n_heads · head_dim = hidden_size`. [`from_json`](Self::from_json) ends with
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
        self.widths().map(drop)
    }

    /// `(n_heads · head_dim, n_kv_heads · head_dim)`, after the checks of
    /// [`validate`](Self::validate).
    pub(crate) fn widths(&self) -> Result<(usize, usize)> {
        let invalid = |key: &str, value: usize, reason: String| ConfigError::Invalid {
            key: key.to_string(),
            value: value.to_string(),
            reason,
        };
        let at_least_one = |key, value| match value {
            0 => Err(invalid(key, 0, "must be at least 1".to_string())),
            _ => Ok(()),
        };
        at_least_one("hidden_size", self.hidden_size)?;
        at_least_one("num_attention_heads", self.n_heads)?;
        at_least_one("num_key_value_heads", self.n_kv_heads)?;
        at_least_one("head_dim", self.head_dim)?;
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            let reason = format!("must divide num_attention_heads = {}", self.n_heads);
            return Err(invalid("num_key_value_heads", self.n_kv_heads, reason));
        }
        let q = self.n_heads.checked_mul(self.head_dim);
        let kv = self.n_kv_heads.checked_mul(self.head_dim);
        let fused = kv.and_then(|kv| kv.checked_mul(2)?.checked_add(q?));
        let (Some(q), Some(kv), Some(_)) = (q, kv, fused) else {
            let reason = format!("the projection widths of {} heads overflow", self.n_heads);
            return Err(invalid("head_dim", self.head_dim, reason));
        };
        if self.model_type == ModelType::GptNeox && (q != self.hidden_size || kv != q) {
            let reason = format!(
                "GPT-NeoX needs num_attention_heads {} = num_key_value_heads {} and num_attention_heads x head_dim = hidden_size {}",
                self.n_heads, self.n_kv_heads, self.hidden_size
            );
            return Err(invalid("head_dim", self.head_dim, reason));
        }
        Ok((q, kv))
    }
}

/// `model_type`, one of [`ModelType::ALL`].
fn read_model_type(top: &Obj<'_, '_>) -> Result<ModelType> {
    let name = required(top, "model_type", top.str("model_type")?)?;
    ModelType::from_name(name).ok_or_else(|| ConfigError::UnknownModelType {
        model_type: name.to_string(),
    })
}

/// Checks that `layer` exists and uses full attention: `layer_types[layer]` is
/// `"full_attention"` when the config lists layer types; otherwise no sliding window applies
/// to it (Mistral and Phi-3: `sliding_window` is `null`; Qwen: `use_sliding_window` is false
/// or the layer is below `max_window_layers`).
fn check_layer(top: &Obj<'_, '_>, model_type: ModelType, layer: usize) -> Result<()> {
    let layers = required(top, "num_hidden_layers", top.usize("num_hidden_layers")?)?;
    if layer >= layers {
        return Err(ConfigError::LayerOutOfRange {
            layer,
            num_hidden_layers: layers,
        });
    }
    if let Some(types) = top.array("layer_types")? {
        return check_layer_type(top, types, layer, layers);
    }
    let window = match model_type {
        ModelType::Mistral | ModelType::Phi3 => top.raw("sliding_window")?,
        ModelType::Qwen2 | ModelType::Qwen3 => {
            let on = top.bool("use_sliding_window")?.unwrap_or(false);
            let below = top.usize("max_window_layers")?.unwrap_or(28);
            top.raw("sliding_window")?.filter(|_| on && layer >= below)
        }
        _ => None,
    };
    match window {
        None | Some(Value::Null) => Ok(()),
        Some(w) => Err(ConfigError::Unsupported {
            key: "sliding_window".to_string(),
            value: describe(w),
            reason: "sliding-window attention is not implemented (issue 13); null disables it",
        }),
    }
}

/// Checks `layer_types[layer]`.
fn check_layer_type(
    top: &Obj<'_, '_>,
    types: &[Value<'_>],
    layer: usize,
    layers: usize,
) -> Result<()> {
    let key = format!("layer_types[{layer}]");
    match types.get(layer) {
        Some(Value::String(kind)) if kind == "full_attention" => Ok(()),
        Some(v @ Value::String(_)) => Err(ConfigError::Unsupported {
            key,
            value: describe(v),
            reason: "only full_attention layers are implemented (sliding windows: issue 13)",
        }),
        Some(v) => Err(ConfigError::WrongType {
            key,
            expected: "a string",
            found: describe(v),
        }),
        None => Err(ConfigError::Invalid {
            key: top.key("layer_types"),
            value: format!("{} entries", types.len()),
            reason: format!("needs one per layer, num_hidden_layers = {layers}"),
        }),
    }
}

/// `(hidden_size, num_attention_heads, num_key_value_heads, head_dim)`.
fn read_heads(top: &Obj<'_, '_>, model_type: ModelType) -> Result<(usize, usize, usize, usize)> {
    let hidden = required(top, "hidden_size", top.usize("hidden_size")?)?;
    let heads = required(
        top,
        "num_attention_heads",
        top.usize("num_attention_heads")?,
    )?;
    let kv_heads = match top.usize("num_key_value_heads")? {
        // GPTNeoXConfig has no such key; a null one means "as many as the query heads".
        _ if model_type == ModelType::GptNeox => heads,
        Some(kv_heads) => kv_heads,
        None if top.raw("num_key_value_heads")?.is_some() => heads,
        None => model_type.default_kv_heads().unwrap_or(heads),
    };
    let head_dim = match top.usize("head_dim")?.or(model_type.default_head_dim()) {
        Some(head_dim) => head_dim,
        None if heads > 0 && hidden.is_multiple_of(heads) => hidden / heads,
        None => {
            return Err(ConfigError::Invalid {
                key: "num_attention_heads".to_string(),
                value: heads.to_string(),
                reason: format!("must divide hidden_size = {hidden} when head_dim is absent"),
            })
        }
    };
    Ok((hidden, heads, kv_heads, head_dim))
}

/// The QK-norm of the families that have one, with `rms_norm_eps`.
fn read_qk_norm(top: &Obj<'_, '_>, model_type: ModelType) -> Result<Option<QkNormConfig>> {
    let Some((span, default_eps)) = model_type.qk_norm() else {
        return Ok(None);
    };
    let eps = top.f64("rms_norm_eps")?.unwrap_or(default_eps);
    if eps < 0.0 {
        return Err(ConfigError::Invalid {
            key: "rms_norm_eps".to_string(),
            value: format!("{eps}"),
            reason: "must not be negative".to_string(),
        });
    }
    Ok(Some(QkNormConfig {
        span,
        eps: eps as f32,
    }))
}

/// The biases each family's attention module creates: Mistral and Phi-3 none, Qwen2 on the
/// query, key and value projections only, the others on all four as `attention_bias` says
/// (default false; true for GPT-NeoX).
fn read_biases(top: &Obj<'_, '_>, model_type: ModelType) -> Result<ProjectionBiases> {
    Ok(match model_type {
        ModelType::Mistral | ModelType::Phi3 => ProjectionBiases::default(),
        ModelType::Qwen2 => ProjectionBiases {
            o: false,
            ..ProjectionBiases::all(true)
        },
        ModelType::GptNeox => ProjectionBiases::all(top.bool("attention_bias")?.unwrap_or(true)),
        ModelType::Llama | ModelType::Qwen3 | ModelType::Olmo2 => {
            ProjectionBiases::all(top.bool("attention_bias")?.unwrap_or(false))
        }
    })
}
