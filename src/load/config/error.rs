//! [`ConfigError`]: why a `config.json` was not turned into an [`AttentionConfig`](super::AttentionConfig).

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use crate::load::json::JsonError;

/// Why a `config.json` was rejected.
///
/// Keys are named as written in the file, nested ones with dots (`rope_scaling.factor`,
/// `layer_types[3]`), and values as written (strings quoted), so the message points at the
/// line to look at, e.g. `config.json: "rope_scaling.rope_type" = "dynamic" is not supported:
/// ...`. A setting this crate does not implement is always an error, never ignored: loading
/// would otherwise compute a different model than the one the file describes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The text is not JSON (or nests arrays and objects more than
    /// [`MAX_DEPTH`](crate::load::safetensors::MAX_DEPTH) deep).
    Json {
        /// Byte offset in the text.
        position: usize,
        /// What was expected or found there.
        reason: &'static str,
    },
    /// Memory for the parsed text ran out.
    AllocationFailed {
        /// Byte offset in the text of the value being read.
        position: usize,
        /// The bytes asked for.
        bytes: usize,
    },
    /// An object has the same key twice, so which value counts is ambiguous.
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A key the configuration needs is absent (or `null`).
    Missing {
        /// The key.
        key: String,
    },
    /// A value has the wrong JSON type or range, e.g. a head count that is not a
    /// non-negative integer (an empty key: the file itself is not an object).
    WrongType {
        /// The key.
        key: String,
        /// What the key must hold, e.g. `"a non-negative integer"`.
        expected: &'static str,
        /// The value found, as written (or `an object`, `an array`).
        found: String,
    },
    /// `model_type` names a model family whose attention this crate does not read.
    UnknownModelType {
        /// The `model_type` found.
        model_type: String,
    },
    /// A setting the family allows but this crate does not implement (a `rope_type`, a layer
    /// type, bidirectional attention, partial rotary in a family whose attention rotates whole
    /// heads).
    Unsupported {
        /// The key.
        key: String,
        /// The value, as written.
        value: String,
        /// What is not supported.
        reason: &'static str,
    },
    /// Values that cannot describe an attention layer, alone or together (a zero head count,
    /// key/value heads that do not divide the query heads, an odd rotary width).
    Invalid {
        /// The key.
        key: String,
        /// The value, as written.
        value: String,
        /// Why, naming the other values involved.
        reason: String,
    },
    /// The layer asked for is not a softmax-attention layer but another kind of a hybrid
    /// model (Qwen3.5's and Qwen3-Next's `linear_attention`), which this crate does not
    /// compute.
    NotAttention {
        /// The layer index asked for.
        layer: usize,
        /// Its kind, as `layer_types` (or the family's rule) names it.
        kind: String,
        /// What says so: `layer_types[i]`, or the family's rule without `layer_types`.
        key: String,
        /// The model's attention layers, which load.
        attention_layers: Vec<usize>,
    },
    /// The layer asked for is not in the model.
    LayerOutOfRange {
        /// The layer index asked for.
        layer: usize,
        /// The model's layer count.
        layers: usize,
        /// The key that gave it (`num_hidden_layers`; BLOOM's `n_layer`).
        key: &'static str,
    },
    /// Reading the file failed.
    #[cfg(feature = "std")]
    Io {
        /// The path.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// The file is longer than [`MAX_CONFIG_LEN`](crate::MAX_CONFIG_LEN) bytes, so it is not
    /// read.
    #[cfg(feature = "std")]
    TooLarge {
        /// The path.
        path: String,
        /// Its length in bytes (for a file that grew while read, or is not a regular file,
        /// the bytes read before stopping: one more than the limit).
        len: u64,
        /// The limit, [`MAX_CONFIG_LEN`](crate::MAX_CONFIG_LEN).
        limit: usize,
    },
}

/// `config.json: ` and the error's description (`ConfigError::describe`).
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[cfg(feature = "std")]
        if let ConfigError::Io { .. } | ConfigError::TooLarge { .. } = self {
            return self.describe(f);
        }
        f.write_str("config.json")?;
        self.describe(f)
    }
}

impl ConfigError {
    /// The message after the name of what was read (`config.json`, or the GGUF metadata of
    /// a [`GgufError::Config`](crate::load::gguf::GgufError::Config)): `: "key" ...` (or,
    /// for the file itself, ` must be ...`); an I/O error's whole message, its path first.
    pub(crate) fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ConfigError::*;
        match self {
            Json { position, reason } => {
                write!(f, ": bad JSON at byte {position}: {reason}")
            }
            AllocationFailed { position, bytes } => write!(
                f,
                ": cannot allocate {bytes} bytes for the value at byte {position}"
            ),
            DuplicateKey { key } => write!(f, ": \"{key}\" appears twice"),
            Missing { key } => write!(f, ": \"{key}\" is missing"),
            WrongType {
                key,
                expected,
                found,
            } if key.is_empty() => write!(f, " must be {expected}, found {found}"),
            WrongType {
                key,
                expected,
                found,
            } => write!(f, ": \"{key}\" must be {expected}, found {found}"),
            UnknownModelType { model_type } => write!(
                f,
                ": \"model_type\" = \"{model_type}\" is not supported; supported: {}",
                super::ModelType::NAMES
            ),
            Unsupported { key, value, reason } => {
                write!(f, ": \"{key}\" = {value} is not supported: {reason}")
            }
            Invalid { key, value, reason } => {
                write!(f, ": \"{key}\" = {value}: {reason}")
            }
            NotAttention {
                layer,
                kind,
                key,
                attention_layers,
            } => {
                write!(
                    f,
                    ": layer {layer} is a \"{kind}\" layer ({key}), not softmax \
                     attention (not computed by this crate); the attention layers are \
                     {attention_layers:?}"
                )
            }
            LayerOutOfRange { layer, layers, key } => {
                write!(f, ": layer {layer} is out of range: \"{key}\" = {layers}")
            }
            #[cfg(feature = "std")]
            Io { path, message } => write!(f, "{path}: {message}"),
            #[cfg(feature = "std")]
            TooLarge { path, len, limit } => write!(
                f,
                "{path}: {len} bytes, more than the {limit} a config.json may have"
            ),
        }
    }
}

impl core::error::Error for ConfigError {}

impl ConfigError {
    /// [`ConfigError::Invalid`]: `key` = `value` (as displayed), and why.
    pub(super) fn invalid(
        key: impl Into<String>,
        value: impl fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

impl From<JsonError> for ConfigError {
    fn from(e: JsonError) -> Self {
        match e {
            JsonError::Syntax { position, reason } => ConfigError::Json { position, reason },
            JsonError::AllocationFailed { position, bytes } => {
                ConfigError::AllocationFailed { position, bytes }
            }
        }
    }
}
