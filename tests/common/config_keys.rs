//! The keys of `config.json` the crate reads and the values `tests/abuse.rs` and the
//! `config_load` fuzz target (`fuzz/`) set them to. Include it with
//! `#[path = "common/config_keys.rs"] mod config_keys;`.
#![allow(dead_code)]

/// The values each key is set to: sizes 0 to 3, negative, fractional, tiny and huge floats
/// (1e-300 and 1e300 are 0 and inf in f32, 1e-40 is subnormal there, 1e39 just past its
/// largest, 5e-324 the least double, 1e400 past f64, 2^53 + 1 not a double, 2^64 - 1 and 2^64
/// at usize's end), other JSON types, and `NaN` and `Infinity`, which JSON does not have.
pub const CONFIG_VALUES: [&str; 29] = [
    "0",
    "-0",
    "1",
    "2",
    "3",
    "-1",
    "0.5",
    "1e-300",
    "1e-50",
    "1e-40",
    "1e-7",
    "1e20",
    "1e39",
    "1e300",
    "-1e300",
    "1e400",
    "5e-324",
    "9007199254740993",
    "18446744073709551615",
    "18446744073709551616",
    "null",
    "true",
    "\"1\"",
    "\"yarn\"",
    "[]",
    "{}",
    "NaN",
    "Infinity",
    "-Infinity",
];

/// The top-level keys the crate reads, each tried whether or not a fixture has it.
pub const CONFIG_KEYS: [&str; 31] = [
    "attention_bias",
    "attention_k_eq_v",
    "attn_logit_softcapping",
    "global_head_dim",
    "head_dim",
    "hidden_size",
    "layer_types",
    "max_position_embeddings",
    "max_window_layers",
    "model_type",
    "n_head",
    "n_layer",
    "num_attention_heads",
    "num_hidden_layers",
    "num_global_key_value_heads",
    "num_key_value_heads",
    "num_kv_shared_layers",
    "partial_rotary_factor",
    "per_layer_config",
    "query_pre_attn_scalar",
    "rms_norm_eps",
    "rope_local_base_freq",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "rotary_emb_base",
    "rotary_pct",
    "sliding_window",
    "sliding_window_pattern",
    "use_bidirectional_attention",
    "use_sliding_window",
];

/// The keys of a rope dictionary, tried in the fixtures that have one.
pub const ROPE_KEYS: [&str; 14] = [
    "rope_type",
    "type",
    "factor",
    "original_max_position_embeddings",
    "low_freq_factor",
    "high_freq_factor",
    "attention_factor",
    "mscale",
    "mscale_all_dim",
    "beta_fast",
    "beta_slow",
    "truncate",
    "rope_theta",
    "partial_rotary_factor",
];
