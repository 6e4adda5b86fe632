//! The layer kinds of hybrid stacks whose configs do not list them in `layer_types`:
//! Nemotron-H's `layers_block_type` or `hybrid_override_pattern` (which also give the layer
//! count), LFM2's `full_attn_idxs`, Granite 4.0-H's `layers_block_type` (every layer Mamba-2
//! when absent). The attention layers load; the others are [`ConfigError::NotAttention`].

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use super::read::{describe, Obj};
use super::{is_attention_kind, ConfigError, ModelType, Result, NOT_ATTENTION};
use crate::load::json::Value;

/// The kind of every layer of a model, as its config gives them, and where from.
pub(super) struct LayerKinds {
    /// The kinds, in `transformers`' names (`full_attention`, `linear_attention` for
    /// Mamba-2, `conv`, `mlp`, `moe`, ...).
    kinds: Kinds,
    /// The key they come from, for messages and for the layer count.
    pub key: &'static str,
    /// How layer `i`'s entry is named in messages.
    entry: Entry,
}

/// The kinds of a model's layers: listed one per layer, or by a rule (nothing allocated per
/// layer: the layer count comes from the config, which may be any number).
enum Kinds {
    /// One per layer.
    Listed(Vec<String>),
    /// `layers` layers: those in `attention` (sorted) `full_attention`, the others `other`.
    Rule {
        attention: Vec<usize>,
        layers: usize,
        other: &'static str,
    },
}

impl Kinds {
    /// The number of layers.
    fn len(&self) -> usize {
        match self {
            Kinds::Listed(kinds) => kinds.len(),
            Kinds::Rule { layers, .. } => *layers,
        }
    }

    /// The kind of layer `layer`, if there is one.
    fn get(&self, layer: usize) -> Option<&str> {
        match self {
            Kinds::Listed(kinds) => kinds.get(layer).map(String::as_str),
            Kinds::Rule { layers, .. } if layer >= *layers => None,
            Kinds::Rule {
                attention, other, ..
            } => Some(match attention.binary_search(&layer) {
                Ok(_) => "full_attention",
                Err(_) => other,
            }),
        }
    }

    /// The attention layers among the first `layers`.
    fn attention_layers(&self, layers: usize) -> Vec<usize> {
        match self {
            Kinds::Listed(kinds) => (0..kinds.len().min(layers))
                .filter(|&i| is_attention_kind(&kinds[i]))
                .collect(),
            Kinds::Rule { attention, .. } => {
                attention.iter().copied().filter(|&i| i < layers).collect()
            }
        }
    }
}

/// How one layer's kind is named in messages.
#[derive(Clone, Copy)]
enum Entry {
    /// `key[i]`.
    Indexed,
    /// `key[i] = "c"`: one character of a pattern string.
    Character,
    /// `key (layer i not listed)`: a list of the attention layers' indices.
    Unlisted,
    /// The configuration class's default, without any key.
    Default,
}

impl LayerKinds {
    /// The layer kinds of `model_type` when its config gives them outside `layer_types`:
    /// Nemotron-H's `layers_block_type` (or `layer_types`, its alias) or
    /// `hybrid_override_pattern` (`M` Mamba-2, `*` attention, `-` MLP, `E` MoE; one is
    /// required), LFM2's `full_attn_idxs` without `layer_types`, Granite 4.0-H's
    /// `layers_block_type` without `layer_types` (every layer Mamba-2 without either). `None`
    /// for the other families and configs.
    pub(super) fn read(top: &Obj<'_, '_>, model_type: ModelType) -> Result<Option<Self>> {
        let listed = top.array("layer_types")?.is_some();
        match model_type {
            ModelType::NemotronH => nemotron_h(top).map(Some),
            ModelType::Lfm2 if !listed => lfm2(top),
            ModelType::GraniteMoeHybrid if !listed => granite_hybrid(top).map(Some),
            _ => Ok(None),
        }
    }

    /// The number of layers the kinds describe.
    pub(super) fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Whether layer `layer` (of `layers`, as the config's layer count says) is a sliding
    /// attention layer (else a full one); a kind of [`NOT_ATTENTION`] is
    /// [`ConfigError::NotAttention`], another kind [`ConfigError::Unsupported`].
    pub(super) fn slides(
        &self,
        top: &Obj<'_, '_>,
        layer: usize,
        (layers_key, layers): (&str, usize),
    ) -> Result<bool> {
        let Some(kind) = self.kinds.get(layer) else {
            return Err(ConfigError::invalid(
                top.key(self.key),
                format!("{} layers", self.kinds.len()),
                format!("needs one per layer, {layers_key} = {layers}"),
            ));
        };
        match kind {
            "sliding_attention" => Ok(true),
            kind if is_attention_kind(kind) => Ok(false),
            kind if NOT_ATTENTION.contains(&kind) => Err(ConfigError::NotAttention {
                layer,
                kind: kind.to_string(),
                key: self.entry_key(top, layer),
                attention_layers: self.kinds.attention_layers(layers),
            }),
            kind => Err(ConfigError::Unsupported {
                key: self.entry_key(top, layer),
                value: format!("\"{kind}\""),
                reason: "the layer kinds read are full_attention, sliding_attention, linear_attention (Mamba-2), conv, mlp and moe",
            }),
        }
    }

    /// How layer `layer`'s entry is named in messages.
    fn entry_key(&self, top: &Obj<'_, '_>, layer: usize) -> String {
        let key = top.key(self.key);
        match self.entry {
            Entry::Indexed => format!("{key}[{layer}]"),
            Entry::Character => {
                let kind = self.kinds.get(layer);
                let c = PATTERN.iter().find(|(_, k)| Some(*k) == kind);
                format!("{key}[{layer}] = \"{}\"", c.map_or('?', |(c, _)| *c))
            }
            Entry::Unlisted => format!("{key} (layer {layer} not listed)"),
            Entry::Default => format!("no layer_types: {}", self.key),
        }
    }
}

/// Nemotron-H's pattern characters and the layer kinds they stand for.
const PATTERN: [(char, &str); 4] = [
    ('M', "linear_attention"),
    ('*', "full_attention"),
    ('-', "mlp"),
    ('E', "moe"),
];

/// Nemotron-H: `layers_block_type` (or its alias `layer_types`), else `hybrid_override_pattern`.
fn nemotron_h(top: &Obj<'_, '_>) -> Result<LayerKinds> {
    for key in ["layers_block_type", "layer_types"] {
        if let Some(list) = top.array(key)? {
            return Ok(LayerKinds {
                kinds: Kinds::Listed(strings(top, key, list)?),
                key,
                entry: Entry::Indexed,
            });
        }
    }
    let key = "hybrid_override_pattern";
    let Some(pattern) = top.str(key)? else {
        return Err(ConfigError::Missing {
            key: String::from("layers_block_type (or hybrid_override_pattern)"),
        });
    };
    let kinds = pattern
        .chars()
        .map(|c| match PATTERN.iter().find(|(p, _)| *p == c) {
            Some((_, kind)) => Ok(kind.to_string()),
            None => Err(ConfigError::invalid(
                top.key(key),
                format!("\"{pattern}\""),
                format!("'{c}' is none of M (Mamba-2), * (attention), - (MLP), E (MoE)"),
            )),
        });
    Ok(LayerKinds {
        kinds: Kinds::Listed(kinds.collect::<Result<_>>()?),
        key,
        entry: Entry::Character,
    })
}

/// LFM2 without `layer_types`: the layers `full_attn_idxs` lists are attention, the others
/// short convolutions; without either, every layer is attention (`None`).
fn lfm2(top: &Obj<'_, '_>) -> Result<Option<LayerKinds>> {
    let key = "full_attn_idxs";
    let Some(indices) = top.array(key)? else {
        return Ok(None);
    };
    let layers = top.usize("num_hidden_layers")?.unwrap_or(0);
    let mut attention = Vec::new();
    for (i, index) in indices.iter().enumerate() {
        match index {
            Value::Number(n) => match n.parse::<usize>() {
                Ok(index) => attention.push(index),
                Err(_) => return Err(wrong_index(top, key, i, index)),
            },
            _ => return Err(wrong_index(top, key, i, index)),
        }
    }
    attention.sort_unstable();
    attention.dedup();
    Ok(Some(LayerKinds {
        kinds: Kinds::Rule {
            attention,
            layers,
            other: "conv",
        },
        key,
        entry: Entry::Unlisted,
    }))
}

/// [`ConfigError::WrongType`] for entry `i` of the list of layer indices `key`.
fn wrong_index(top: &Obj<'_, '_>, key: &str, i: usize, found: &Value<'_>) -> ConfigError {
    ConfigError::WrongType {
        key: format!("{}[{i}]", top.key(key)),
        expected: "a layer index",
        found: describe(found),
    }
}

/// Granite 4.0-H without `layer_types`: `layers_block_type`, else every layer Mamba-2 (as
/// `GraniteMoeHybridConfig` defaults).
fn granite_hybrid(top: &Obj<'_, '_>) -> Result<LayerKinds> {
    let key = "layers_block_type";
    if let Some(list) = top.array(key)? {
        return Ok(LayerKinds {
            kinds: Kinds::Listed(strings(top, key, list)?),
            key,
            entry: Entry::Indexed,
        });
    }
    let layers = top.usize("num_hidden_layers")?.unwrap_or(0);
    Ok(LayerKinds {
        kinds: Kinds::Rule {
            attention: Vec::new(),
            layers,
            other: "linear_attention",
        },
        key: "every layer linear_attention (Mamba-2), GraniteMoeHybridConfig's default",
        entry: Entry::Default,
    })
}

/// The strings of the list `key`, with the legacy names `transformers` renames (`mamba` is
/// `linear_attention`, `attention` is `full_attention`).
fn strings(top: &Obj<'_, '_>, key: &str, list: &[Value<'_>]) -> Result<Vec<String>> {
    let legacy = |kind: &str| match kind {
        "mamba" => String::from("linear_attention"),
        "attention" => String::from("full_attention"),
        kind => kind.to_string(),
    };
    list.iter()
        .enumerate()
        .map(|(i, entry)| match entry {
            Value::String(kind) => Ok(legacy(kind)),
            other => Err(ConfigError::WrongType {
                key: format!("{}[{i}]", top.key(key)),
                expected: "a string",
                found: describe(other),
            }),
        })
        .collect()
}
