//! A layer's [`AttentionConfig`] from a GGUF file's `{arch}.*` metadata: the crate's one
//! parsed-config representation, built here from llama.cpp's keys instead of `config.json`'s.
//!
//! What the file does not say is the architecture's rule, as llama.cpp applies it: `llama`
//! files hold Q and K with the rows of each head permuted by llama.cpp's converter so that
//! rotary pairs are adjacent features (interleaved RoPE); `qwen2` and `qwen3` keep
//! `transformers`' order (rotate-half). The softmax scale is `key_length^-½`. Biases are the
//! ones the file holds.

use alloc::format;
use alloc::string::{String, ToString};

use super::error::GgufError;
use super::metadata::{Metadata, Value};
use super::Gguf;
use crate::layer::norm::{QkNormPlacement, QkNormSpan};
use crate::layer::rope::{Rope, RopeLayout, RopeScaling};
use crate::load::config::{
    AttentionConfig, ConfigError, ModelType, ProjectionBiases, QkNormConfig,
};

type Result<T> = core::result::Result<T, GgufError>;

/// The architectures read: `general.architecture`, the family, and the rotary pairing of
/// the file's Q and K rows.
const ARCHITECTURES: [(&str, ModelType, RopeLayout); 5] = [
    ("llama", ModelType::Llama, RopeLayout::Interleaved),
    ("qwen2", ModelType::Qwen2, RopeLayout::RotateHalf),
    ("qwen3", ModelType::Qwen3, RopeLayout::RotateHalf),
    ("phi3", ModelType::Phi3, RopeLayout::RotateHalf),
    ("olmo2", ModelType::Olmo2, RopeLayout::RotateHalf),
];

/// The architectures read, for messages.
const NAMES: &str = "the architectures read are llama, qwen2, qwen3, phi3 and olmo2";

/// Typed look-ups of `{arch}.*` keys, naming the key when a value is missing or mistyped.
pub(crate) struct Keys<'m> {
    metadata: &'m Metadata,
    arch: &'m str,
}

impl<'m> Keys<'m> {
    /// The keys of `metadata`, whose `general.architecture` must be one of [`ARCHITECTURES`].
    pub(crate) fn new(metadata: &'m Metadata) -> Result<(Self, ModelType, RopeLayout)> {
        let key = "general.architecture";
        let arch = match metadata.get(key) {
            None => return Err(missing(key)),
            Some(Value::String(arch)) => arch.as_str(),
            Some(other) => return Err(wrong(key, "a string", other)),
        };
        let Some(&(_, model_type, layout)) = ARCHITECTURES.iter().find(|a| a.0 == arch) else {
            return Err(GgufError::Config(ConfigError::Unsupported {
                key: String::from(key),
                value: format!("\"{arch}\""),
                reason: NAMES,
            }));
        };
        Ok((Keys { metadata, arch }, model_type, layout))
    }

    /// `{arch}.{suffix}`.
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// The value of `{arch}.{suffix}`, if present.
    fn get(&self, suffix: &str) -> Option<&'m Value> {
        self.metadata.get(&self.key(suffix))
    }

    /// A non-negative integer; for a per-layer array (as some files give head counts), its
    /// entry `layer`.
    fn usize(&self, suffix: &str, layer: usize) -> Result<Option<usize>> {
        let n = match self.get(suffix) {
            None => return Ok(None),
            Some(Value::Array(a)) => a.get_u64(layer),
            Some(v) => v.as_u64(),
        };
        let expected = "a non-negative integer (or an array of them, one per layer)";
        match n.map(usize::try_from) {
            Some(Ok(n)) => Ok(Some(n)),
            _ => Err(wrong(
                &self.key(suffix),
                expected,
                self.get(suffix).unwrap_or(&Value::Bool(false)),
            )),
        }
    }

    /// A required non-negative integer.
    fn required(&self, suffix: &str, layer: usize) -> Result<usize> {
        self.usize(suffix, layer)?
            .ok_or_else(|| missing(&self.key(suffix)))
    }

    /// A float (`float32` or `float64`).
    fn f64(&self, suffix: &str) -> Result<Option<f64>> {
        match self.get(suffix) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| wrong(&self.key(suffix), "a float", v)),
        }
    }

    /// A string.
    fn str(&self, suffix: &str) -> Result<Option<&'m str>> {
        match self.get(suffix) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| wrong(&self.key(suffix), "a string", v)),
        }
    }

    /// The number of layers, `{arch}.block_count`.
    pub(crate) fn block_count(&self) -> Result<usize> {
        self.required("block_count", 0)
    }

    /// [`ConfigError::Invalid`] for `{arch}.{suffix}` = `value`.
    fn invalid(&self, suffix: &str, value: impl ToString, reason: impl Into<String>) -> GgufError {
        GgufError::Config(ConfigError::Invalid {
            key: self.key(suffix),
            value: value.to_string(),
            reason: reason.into(),
        })
    }

    /// [`ConfigError::Unsupported`] for `{arch}.{suffix}` = `value`.
    fn unsupported(&self, suffix: &str, value: impl ToString, reason: &'static str) -> GgufError {
        GgufError::Config(ConfigError::Unsupported {
            key: self.key(suffix),
            value: value.to_string(),
            reason,
        })
    }
}

fn missing(key: &str) -> GgufError {
    GgufError::MissingKey {
        key: String::from(key),
    }
}

fn wrong(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: String::from(key),
        expected,
        found: found.type_name(),
    }
}

/// What a layer's config needs from the file beyond its metadata: whether it holds a tensor.
pub(crate) trait Holds {
    /// Whether the file holds the tensor `name`.
    fn holds(&self, name: &str) -> bool;
}

impl Holds for Gguf {
    fn holds(&self, name: &str) -> bool {
        self.tensor(name).is_some()
    }
}

impl AttentionConfig {
    /// Reads the attention of layer `layer` from a GGUF file's header: the `{arch}.*`
    /// metadata of architectures `llama`, `qwen2`, `qwen3`, `phi3` and `olmo2` (`block_count`,
    /// `embedding_length`, `context_length`, `attention.head_count` and `head_count_kv`
    /// (numbers, or arrays of one per layer), `attention.key_length` and `value_length`,
    /// `attention.layer_norm_rms_epsilon`, `rope.freq_base`, `rope.dimension_count`,
    /// `rope.scaling.type` `none`, `linear` or `yarn` with its `factor`,
    /// `original_context_length`, `yarn_beta_fast` and `yarn_beta_slow`), and from its
    /// tensors which projections have biases. The softmax scale is `key_length^-½`, as
    /// llama.cpp computes it; `llama` files rotate interleaved pairs (their Q and K rows are
    /// permuted by llama.cpp's converter), the others rotate halves (`phi3` the first
    /// `rope.dimension_count` features of each head). `qwen3` normalises each head of Q and
    /// K, `olmo2` the whole rows (`attn_q_norm`, `attn_k_norm`); every `phi3` layer slides
    /// its `attention.sliding_window`, as `transformers`' Phi-3 does.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`], [`ConfigError::Invalid`] naming the
    /// key and value; [`ConfigError::Unsupported`] for another architecture, rope scaling type,
    /// partial rotary (but `phi3`'s), a sliding window (but `phi3`'s: the others' layer
    /// patterns are not implemented), a `rope_freqs.weight` tensor (llama3 scaling), a `rope_factors_long.weight`
    /// or `rope_factors_short.weight` tensor (longrope).
    pub fn from_gguf(gguf: &Gguf, layer: usize) -> Result<Self> {
        attention_config(gguf.metadata(), gguf, layer)
    }
}

/// The attention of layer `layer` of the GGUF model whose metadata is `metadata` and whose
/// tensors `tensors` tells apart.
pub(crate) fn attention_config(
    metadata: &Metadata,
    tensors: &impl Holds,
    layer: usize,
) -> Result<AttentionConfig> {
    let (keys, model_type, layout) = Keys::new(metadata)?;
    let layers = keys.block_count()?;
    if layer >= layers {
        let reason = format!("layer {layer} is out of range");
        return Err(keys.invalid("block_count", layers, reason));
    }
    let sliding_window = sliding_window(&keys, model_type)?;
    let factors = [
        "rope_freqs.weight",
        "rope_factors_long.weight",
        "rope_factors_short.weight",
    ];
    if let Some(name) = factors.into_iter().find(|name| tensors.holds(name)) {
        return Err(GgufError::Config(ConfigError::Unsupported {
            key: String::from(name),
            value: String::from("a tensor"),
            reason: "rotary frequencies scaled by a tensor (llama3 scaling's rope_freqs, \
                     longrope's rope_factors_long / rope_factors_short) are not implemented",
        }));
    }
    let (hidden_size, n_heads, n_kv_heads, head_dim) = heads(&keys, layer)?;
    let has = |name: &str| tensors.holds(&format!("blk.{layer}.attn_{name}.bias"));
    let qk_norm = match model_type {
        ModelType::Qwen3 => Some(qk_norm(&keys, QkNormSpan::PerHead)?),
        ModelType::Olmo2 => Some(qk_norm(&keys, QkNormSpan::Whole)?),
        _ => None,
    };
    let mut config = AttentionConfig {
        model_type,
        layer,
        num_hidden_layers: layers,
        hidden_size,
        n_heads,
        n_kv_heads,
        head_dim,
        rope: None,
        qk_norm,
        scale: crate::kernels::attention::flash::score_scale(head_dim),
        sliding_window,
        softcap: None,
        alibi: false,
        sinks: false,
        biases: ProjectionBiases {
            q: has("q"),
            k: has("k"),
            v: has("v"),
            o: has("output"),
        },
        max_position_embeddings: keys.required("context_length", layer)?,
        wrapper: None,
        output_gate: None,
        query_scale: None,
        attention_chunk_size: None,
        value_norm: None,
        values_from_keys: false,
        projection_scales: crate::load::config::ProjectionScales::default(),
        v_head_dim: head_dim,
        kv_source: None,
    };
    config.validate().map_err(|e| {
        keys.invalid(
            "attention.head_count",
            n_heads,
            format!("the widths do not make a layer: {e}"),
        )
    })?;
    config.rope = Some(rope(&keys, (model_type, layout), head_dim)?);
    Ok(config)
}

/// `(embedding_length, head_count, head_count_kv, key_length)`, checked: counts at least 1,
/// `head_count_kv` dividing `head_count`, `value_length` equal to `key_length`.
fn heads(keys: &Keys<'_>, layer: usize) -> Result<(usize, usize, usize, usize)> {
    let hidden = keys.required("embedding_length", layer)?;
    let heads = keys.required("attention.head_count", layer)?;
    let kv_heads = keys
        .usize("attention.head_count_kv", layer)?
        .unwrap_or(heads);
    for (suffix, n) in [
        ("embedding_length", hidden),
        ("attention.head_count", heads),
        ("attention.head_count_kv", kv_heads),
    ] {
        if n == 0 {
            return Err(keys.invalid(suffix, n, "must be at least 1"));
        }
    }
    if !heads.is_multiple_of(kv_heads) {
        let reason = format!("must divide attention.head_count = {heads}");
        return Err(keys.invalid("attention.head_count_kv", kv_heads, reason));
    }
    let head_dim = match keys.usize("attention.key_length", layer)? {
        Some(d) => d,
        None if hidden.is_multiple_of(heads) => hidden / heads,
        None => {
            let reason = format!(
                "must divide embedding_length = {hidden} when attention.key_length is absent"
            );
            return Err(keys.invalid("attention.head_count", heads, reason));
        }
    };
    let value_dim = keys
        .usize("attention.value_length", layer)?
        .unwrap_or(head_dim);
    if value_dim != head_dim {
        let reason =
            format!("must equal attention.key_length = {head_dim}: the layer has one head width");
        return Err(keys.invalid("attention.value_length", value_dim, reason));
    }
    Ok((hidden, heads, kv_heads, head_dim))
}

/// The window of every layer of an architecture whose layers all slide (`phi3`:
/// `attention.sliding_window`, as `transformers`' Phi-3 applies it); `None` when absent.
///
/// # Errors
/// [`ConfigError::Unsupported`] for the key in another architecture (which layers slide is
/// the architecture's rule, not in the file), [`ConfigError::Invalid`] for a window of 0.
fn sliding_window(keys: &Keys<'_>, model_type: ModelType) -> Result<Option<usize>> {
    let key = "attention.sliding_window";
    let Some(value) = keys.get(key) else {
        return Ok(None);
    };
    if model_type != ModelType::Phi3 {
        let reason =
            "which layers slide their window is the architecture's rule, not known for this one";
        return Err(keys.unsupported(key, format!("{value:?}"), reason));
    }
    match keys.usize(key, 0)? {
        Some(0) => Err(keys.invalid(key, 0, "a window holds at least one key")),
        window => Ok(window),
    }
}

/// The QK-norm of Qwen3 (per head) or OLMo 2 (`span` [`QkNormSpan::Whole`]), before the
/// rotary embedding, its epsilon `attention.layer_norm_rms_epsilon` (1e-6 when absent).
fn qk_norm(keys: &Keys<'_>, span: QkNormSpan) -> Result<QkNormConfig> {
    let suffix = "attention.layer_norm_rms_epsilon";
    let eps = keys.f64(suffix)?.unwrap_or(1e-6);
    let eps32 = eps as f32;
    if !(eps32.is_finite() && eps32 >= 0.0) {
        return Err(keys.invalid(suffix, eps, "must be finite and >= 0 in f32"));
    }
    Ok(QkNormConfig {
        span,
        eps: eps32,
        weight_offset: 0.0,
        learned: true,
        placement: QkNormPlacement::BeforeRope,
    })
}

/// The rotary embedding: `rope.freq_base` (10,000 when absent) over `rope.dimension_count`
/// features (the whole head, or for `phi3` the first features of each head, as its
/// `partial_rotary_factor`), paired as `layout`, scaled as `rope.scaling.type` says.
fn rope(
    keys: &Keys<'_>,
    (model_type, layout): (ModelType, RopeLayout),
    head_dim: usize,
) -> Result<Rope> {
    let theta = keys.f64("rope.freq_base")?.unwrap_or(10_000.0);
    let rotary_dim = keys.usize("rope.dimension_count", 0)?.unwrap_or(head_dim);
    if rotary_dim != head_dim && model_type != ModelType::Phi3 {
        let reason = "this architecture rotates whole heads (attention.key_length features)";
        return Err(keys.unsupported("rope.dimension_count", rotary_dim, reason));
    }
    let rope = Rope {
        theta,
        rotary_dim,
        layout,
        scaling: scaling(keys)?,
    };
    rope.check(head_dim)
        .map_err(|e| keys.invalid("rope.freq_base", theta, format!("{e}")))?;
    Ok(rope)
}

/// `rope.scaling.type`: `none` (or absent), `linear` (`rope.scaling.factor`) or `yarn`
/// (`rope.scaling.factor`, `original_context_length`, `yarn_beta_fast` 32 and
/// `yarn_beta_slow` 1 when absent, the attention factor `0.1 · ln(factor) + 1` as ggml's
/// rope computes it, and whole correction dimensions as ggml rounds them).
fn scaling(keys: &Keys<'_>) -> Result<RopeScaling> {
    let kind = keys.str("rope.scaling.type")?.unwrap_or("none");
    let factor = || {
        let f = keys.f64("rope.scaling.factor")?;
        match f {
            Some(f) if f > 0.0 => Ok(f),
            Some(f) => Err(keys.invalid("rope.scaling.factor", f, "must be positive")),
            None => Err(missing(&keys.key("rope.scaling.factor"))),
        }
    };
    match kind {
        "none" => Ok(RopeScaling::Default),
        "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
        "yarn" => {
            if keys
                .f64("rope.scaling.attn_factor")?
                .is_some_and(|a| a != 1.0)
            {
                let reason = "a YaRN attention factor other than 1 is not implemented";
                return Err(keys.unsupported("rope.scaling.attn_factor", "not 1", reason));
            }
            let factor = factor()?;
            let original = keys.required("rope.scaling.original_context_length", 0)?;
            Ok(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original as f64,
                beta_fast: keys.f64("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                beta_slow: keys.f64("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                attention_factor: RopeScaling::yarn_attention_factor(factor, None, None),
                truncate: true,
            })
        }
        other => Err(keys.unsupported(
            "rope.scaling.type",
            format!("\"{other}\""),
            "the scaling types read are none, linear and yarn",
        )),
    }
}
