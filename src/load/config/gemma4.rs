//! What Gemma 4 (`gemma4_text`) sets per layer, as `Gemma4TextConfig` derives it: the heads
//! of its full layers (`per_layer_config`), whether their values come from the key projection
//! (`attention_k_eq_v`), the layer whose keys and values a KV-shared layer reads
//! (`num_kv_shared_layers`), and the setting not read (bidirectional attention).

use alloc::format;
use alloc::string::{String, ToString};

use super::read::{describe, Obj};
use super::{at_least_one, ConfigError, Result};

/// Gemma 4's settings of one layer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Gemma4Layer {
    /// `(num_key_value_heads, head_dim)` of the layer.
    pub heads: (usize, usize),
    /// Whether the values are the key projection's output (a full layer of a model with
    /// `attention_k_eq_v`).
    pub values_from_keys: bool,
    /// The layer whose cache this one attends over: for one of the last
    /// `num_kv_shared_layers` layers, the last earlier layer of its type.
    pub kv_source: Option<usize>,
    /// The keys `heads` were read from, for messages: `num_key_value_heads` or
    /// `num_global_key_value_heads`, `head_dim` or `global_head_dim`.
    keys: [&'static str; 2],
}

impl Gemma4Layer {
    /// `error` naming the key the layer's heads came from where it names the model's
    /// (`head_dim` for a full layer's `global_head_dim`).
    pub(super) fn name_keys(&self, error: ConfigError) -> ConfigError {
        let rename = |key: String| match key.as_str() {
            "num_key_value_heads" => self.keys[0].to_string(),
            "head_dim" => self.keys[1].to_string(),
            _ => key,
        };
        match error {
            ConfigError::Invalid { key, value, reason } => ConfigError::Invalid {
                key: rename(key),
                value,
                reason,
            },
            ConfigError::Unsupported { key, value, reason } => ConfigError::Unsupported {
                key: rename(key),
                value,
                reason,
            },
            other => other,
        }
    }
}

/// The settings of layer `layer` of `layers`, which slides its window (`sliding`) or not,
/// over the model's `(num_key_value_heads, head_dim)`; `slides(i)` tells whether layer `i`
/// does.
///
/// # Errors
/// [`ConfigError::Unsupported`] for `use_bidirectional_attention` `"all"`; the errors of
/// [`kv_source`] and [`layer_heads`].
pub(super) fn read(
    top: &Obj<'_, '_>,
    (layer, layers): (usize, usize),
    (sliding, slides): (bool, &dyn Fn(usize) -> Result<bool>),
    heads: (usize, usize),
) -> Result<Gemma4Layer> {
    refuse_bidirectional(top)?;
    let kv_source = kv_source(top, (layer, layers, 0), slides)?;
    let k_eq_v = top.bool("attention_k_eq_v")?.unwrap_or(false);
    let (heads, keys) = layer_heads(top, layer, sliding, k_eq_v, heads)?;
    Ok(Gemma4Layer {
        heads,
        values_from_keys: k_eq_v && !sliding,
        kv_source,
        keys,
    })
}

/// `use_bidirectional_attention`: `null` or `"vision"` (vision tokens only; text attends
/// causally) are read, `"all"` is not.
fn refuse_bidirectional(top: &Obj<'_, '_>) -> Result<()> {
    let key = "use_bidirectional_attention";
    match top.str(key)? {
        None | Some("vision") => Ok(()),
        Some(_) => Err(ConfigError::Unsupported {
            key: top.key(key),
            value: top.written(key),
            reason: "only causal attention is implemented for config.json layers (\"vision\" \
                     makes only vision tokens bidirectional, and is read)",
        }),
    }
}

/// The layer whose keys and values layer `layer` of `layers` attends over: `None` unless it
/// is one of the last `num_kv_shared_layers` (`default` when absent: Gemma 4's 0, Gemma 3n's
/// 15; `kv_sharing_modes` "reuse"), else the last
/// layer before them that slides its window as this one does (`slides`), as
/// `Gemma4TextConfig.kv_sharing_modes` finds it.
///
/// # Errors
/// [`ConfigError::Invalid`] naming `num_kv_shared_layers` when it is more than `layers`, or
/// when no earlier layer has this layer's type.
pub(super) fn kv_source(
    top: &Obj<'_, '_>,
    (layer, layers, default): (usize, usize, usize),
    slides: &dyn Fn(usize) -> Result<bool>,
) -> Result<Option<usize>> {
    let key = "num_kv_shared_layers";
    let shared = top.usize(key)?.unwrap_or(default);
    if shared > layers {
        let reason = format!("is more than num_hidden_layers = {layers}");
        return Err(ConfigError::invalid(top.key(key), shared, reason));
    }
    let first_shared = layers - shared;
    if layer < first_shared {
        return Ok(None);
    }
    let sliding = slides(layer)?;
    for source in (0..first_shared).rev() {
        if slides(source)? == sliding {
            return Ok(Some(source));
        }
    }
    let kind = if sliding { "sliding" } else { "full" };
    let reason =
        format!("leaves no earlier {kind} layer for layer {layer} to share keys and values with");
    Err(ConfigError::invalid(top.key(key), shared, reason))
}

/// The layer's `(num_key_value_heads, head_dim)`: its entry of `per_layer_config` when the
/// config has that map (keys are layer indices, possibly zero-padded; absent layers take the
/// model's `heads`), else on a full layer `global_head_dim` (512 when absent) and, with
/// `attention_k_eq_v`, `num_global_key_value_heads` when given; with the keys they came from.
fn layer_heads(
    top: &Obj<'_, '_>,
    layer: usize,
    sliding: bool,
    k_eq_v: bool,
    (kv_heads, head_dim): (usize, usize),
) -> Result<((usize, usize), [&'static str; 2])> {
    let mut keys = ["num_key_value_heads", "head_dim"];
    let read = "the per-layer settings read are head_dim and num_key_value_heads";
    if let Some([kv, dim]) = per_layer(top, layer, keys, [kv_heads, head_dim], read)? {
        return Ok(((kv, dim), keys));
    }
    if sliding {
        return Ok(((kv_heads, head_dim), keys));
    }
    keys[1] = "global_head_dim";
    let global_head_dim = top.usize(keys[1])?.unwrap_or(512);
    let global_kv = match k_eq_v {
        true => top.usize("num_global_key_value_heads")?,
        false => None,
    };
    if global_kv.is_some() {
        keys[0] = "num_global_key_value_heads";
    }
    Ok(((global_kv.unwrap_or(kv_heads), global_head_dim), keys))
}

/// The layer index a `per_layer_config` key names (decimal digits, possibly zero-padded).
fn index_of(key: &str) -> Option<usize> {
    let digits = !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| key.parse().ok()).flatten()
}

/// Layer `layer`'s settings `names` from `per_layer_config` (keys are layer indices,
/// possibly zero-padded), each at least 1, `model`'s where the layer or the setting is
/// absent; `None` without that map. Another setting in the layer's entry is
/// [`ConfigError::Unsupported`] with `read` as its reason.
pub(super) fn per_layer<const N: usize>(
    top: &Obj<'_, '_>,
    layer: usize,
    names: [&str; N],
    model: [usize; N],
    read: &'static str,
) -> Result<Option<[usize; N]>> {
    let Some(per_layer) = top.object("per_layer_config")? else {
        return Ok(None);
    };
    let Some(key) = per_layer.keys().find(|k| index_of(k) == Some(layer)) else {
        return Ok(Some(model));
    };
    let Some(entry) = per_layer.object(key)? else {
        let found = per_layer.written(key);
        return Err(ConfigError::WrongType {
            key: per_layer.key(key),
            expected: "an object",
            found,
        });
    };
    if let Some(other) = entry.keys().find(|k| !names.contains(k)) {
        let value = entry.raw(other)?.map_or_else(String::new, describe);
        return Err(ConfigError::Unsupported {
            key: entry.key(other),
            value,
            reason: read,
        });
    }
    let mut values = model;
    for (name, value) in names.iter().zip(&mut values) {
        match entry.usize(name)? {
            Some(0) => return Err(at_least_one(&entry.key(name))),
            Some(given) => *value = given,
            None => {}
        }
    }
    Ok(Some(values))
}
