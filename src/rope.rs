//! Rotary position embedding (RoPE): the settings a model's `config.json` states.
//!
//! Query and key features of each head are rotated in pairs by an angle proportional to the
//! token's position: pair `i` of a head (of `rotary_dim / 2` pairs) turns by
//! `position · inv_freq[i]`, `inv_freq[i] = theta^(-2i / rotary_dim)` before any
//! [`RopeScaling`]. Features `rotary_dim ..` of a head are left as they are (partial rotary).

/// Which two features of a head form a rotated pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pairs `(i, i + rotary_dim / 2)`: Llama, Mistral, Qwen, Gemma, GPT-NeoX, Phi-3
    /// (`rotate_half` in Hugging Face `transformers`).
    #[default]
    RotateHalf,
    /// Pairs `(2i, 2i + 1)`: GPT-J and its descendants.
    Interleaved,
}

/// How the rotation frequencies are rescaled for contexts longer than the model was trained
/// on (`rope_scaling` / `rope_parameters` in `config.json`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum RopeScaling {
    /// `inv_freq` as defined by `theta`.
    #[default]
    Default,
    /// Positions divided by `factor` (`"rope_type": "linear"`).
    Linear {
        /// The divisor of every position.
        factor: f64,
    },
    /// Llama 3.1's frequency-dependent rescaling (`"rope_type": "llama3"`).
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are divided
        /// by `factor`.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was trained with.
        original_max_position_embeddings: f64,
    },
    /// YaRN (`"rope_type": "yarn"`): frequencies blended between interpolation and
    /// extrapolation, and cos/sin multiplied by an attention factor.
    Yarn {
        /// Context extension factor.
        factor: f64,
        /// The context length the model was trained with.
        original_max_position_embeddings: f64,
        /// Fast boundary of the blend, in rotations (32 when the config omits it).
        beta_fast: f64,
        /// Slow boundary of the blend, in rotations (1 when the config omits it).
        beta_slow: f64,
        /// The factor cos and sin are multiplied by (`0.1 · ln(factor) + 1` when the config
        /// omits it and gives no `mscale`).
        attention_factor: f64,
        /// Whether the blend boundaries are rounded to whole dimensions (`truncate`, true when
        /// the config omits it).
        truncate: bool,
    },
}

/// The rotary embedding of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// The base of the frequencies (`rope_theta`; 10,000 in the original paper).
    pub theta: f64,
    /// How many leading features of each head rotate (even, at most the head width); the head
    /// width for full rotary, less for partial rotary (`rotary_pct`, `partial_rotary_factor`).
    pub rotary_dim: usize,
    /// Which features pair up.
    pub layout: RopeLayout,
    /// Frequency rescaling.
    pub scaling: RopeScaling,
}
