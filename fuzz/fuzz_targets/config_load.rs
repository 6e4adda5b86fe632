//! `AttentionConfig::from_json` on fuzzed configs. The first byte chooses the layer (its low
//! two bits) and the mode (its top bit): clear, the rest is the text of a `config.json` (seeds:
//! the Hugging Face fixtures' files and two published ones, dictionary `config.dict`); set, the
//! rest picks one of the fixtures' configs and up to 6 of its keys (`tests/common/config_keys.rs`)
//! to set to values from `CONFIG_VALUES`, to numbers made of 8 bytes, or to leave out. An `Err`
//! must display; an `Ok` config must validate and, at shapes whose weights fit in memory,
//! build a layer over made-up weights whose forward pass of finite input is finite
//! (unless a huge scale or attention factor may carry that input's scores past `f32`'s range).
#![no_main]

#[path = "../../tests/common/config_keys.rs"]
mod config_keys;
#[path = "../../tests/common/config_layer.rs"]
mod config_layer;
#[path = "../../tests/common/json_edit.rs"]
mod json_edit;

use config_keys::{CONFIG_KEYS, CONFIG_VALUES, ROPE_KEYS};
use config_layer::{made_up_weights, Run};
use json_edit::Json;
use libfuzzer_sys::fuzz_target;
use mha::AttentionConfig;
use mha_fuzz::Input;

/// The `config.json` of every fixture the crate reads.
const FIXTURES: [&str; 23] = [
    include_str!("../../tests/fixtures/hf/bloom_alibi4/config.json"),
    include_str!("../../tests/fixtures/hf/bloom_alibi6/config.json"),
    include_str!("../../tests/fixtures/hf/gemma2_global/config.json"),
    include_str!("../../tests/fixtures/hf/gemma2_local/config.json"),
    include_str!("../../tests/fixtures/hf/gemma3_global/config.json"),
    include_str!("../../tests/fixtures/hf/gemma3_local/config.json"),
    include_str!("../../tests/fixtures/hf/gpt_neox/config.json"),
    include_str!("../../tests/fixtures/hf/gpt_oss_full/config.json"),
    include_str!("../../tests/fixtures/hf/gpt_oss_sliding/config.json"),
    include_str!("../../tests/fixtures/hf/llama_gqa/config.json"),
    include_str!("../../tests/fixtures/hf/llama_linear/config.json"),
    include_str!("../../tests/fixtures/hf/llama_llama3/config.json"),
    include_str!("../../tests/fixtures/hf/llama_positions/config.json"),
    include_str!("../../tests/fixtures/hf/llama_yarn/config.json"),
    include_str!("../../tests/fixtures/hf/mistral/config.json"),
    include_str!("../../tests/fixtures/hf/mistral_window/config.json"),
    include_str!("../../tests/fixtures/hf/olmo2_qknorm/config.json"),
    include_str!("../../tests/fixtures/hf/phi3_partial/config.json"),
    include_str!("../../tests/fixtures/hf/qwen2_bias/config.json"),
    include_str!("../../tests/fixtures/hf/qwen2_window_full/config.json"),
    include_str!("../../tests/fixtures/hf/qwen2_window_sliding/config.json"),
    include_str!("../../tests/fixtures/hf/qwen2_yarn/config.json"),
    include_str!("../../tests/fixtures/hf/qwen3_qknorm/config.json"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let layer = usize::from(first & 3);
    if first & 0x80 == 0 {
        if let Ok(text) = std::str::from_utf8(rest) {
            check(text, layer);
        }
    } else {
        check(&mutated(&mut Input::new(rest)), layer);
    }
});

/// A fixture's config with up to 6 keys set or left out as the bytes say.
fn mutated(input: &mut Input<'_>) -> String {
    let mut json = Json::parse(FIXTURES[input.below(FIXTURES.len())]);
    for _ in 0..=input.below(6) {
        let value = match input.below(CONFIG_VALUES.len() + 3) {
            i if i < CONFIG_VALUES.len() => Some(CONFIG_VALUES[i].to_string()),
            i if i == CONFIG_VALUES.len() => None,
            i => {
                let bits = u64::from_le_bytes(core::array::from_fn(|_| input.byte()));
                let float = f64::from_bits(bits);
                match i - CONFIG_VALUES.len() {
                    1 if float.is_finite() => Some(format!("{float:e}")),
                    _ => Some(format!("{bits}")),
                }
            }
        };
        let value = value.map(Json::Raw);
        let key = input.below(CONFIG_KEYS.len() + ROPE_KEYS.len());
        match key.checked_sub(CONFIG_KEYS.len()) {
            None => json.set(CONFIG_KEYS[key], value),
            Some(rope_key) => {
                for dict in ["rope_scaling", "rope_parameters"] {
                    if let Some(rope @ Json::Obj(_)) = json.get_mut(dict) {
                        rope.set(ROPE_KEYS[rope_key], value.clone());
                    }
                }
            }
        }
    }
    json.write()
}

/// Reads `text` for `layer`: an `Err` displays; an `Ok` config validates, builds and runs.
fn check(text: &str, layer: usize) {
    let config = match AttentionConfig::from_json(text, layer) {
        Ok(config) => config,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    if let Err(e) = config.validate() {
        panic!("a config that loads validates: {e}");
    }
    let d = config.hidden_size;
    let (q, kv) = (
        config.n_heads * config.head_dim,
        config.n_kv_heads * config.head_dim,
    );
    if d.saturating_mul(q.max(kv)) > 1 << 24 {
        return; // weights too large to make up
    }
    let weights = made_up_weights(&config, &mut spread);
    let x = spread(2 * 9 * d, 1.0);
    let run = Run {
        config: &config,
        weights,
        x: &x,
        context: "config_load",
    };
    if let Err(failure) = run.go() {
        panic!("{failure}\n{text}");
    }
}

/// `n` values spread over `[-scale, scale]` by a multiplicative hash of their index.
fn spread(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761) >> 8;
            (h % 2001) as f32 / 1000.0 - 1.0
        })
        .map(|v| v * scale)
        .collect()
}
