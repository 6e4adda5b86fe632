//! `AttentionConfig::from_json` on any text, its first byte choosing the layer (0 to 3); the
//! seeds are the `config.json` files of the Hugging Face fixtures (`tests/fixtures/hf`), the
//! dictionary `config.dict` the keys and values they hold. An `Err` must display; an `Ok`
//! config must validate and, at the shapes `tests/common/config_layer.rs` instantiates, build a
//! layer over made-up weights whose forward pass of finite input is finite (unless a huge scale
//! or attention factor may carry that input's scores past `f32`'s range).
#![no_main]

#[path = "../../tests/common/config_layer.rs"]
mod config_layer;

use config_layer::{made_up_weights, run_shape, Run};
use libfuzzer_sys::fuzz_target;
use mha::AttentionConfig;

fuzz_target!(|data: &[u8]| {
    let Some((&layer, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let config = match AttentionConfig::from_json(text, usize::from(layer % 4)) {
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
        return; // none of the instantiated shapes
    }
    let weights = made_up_weights(&config, &mut spread);
    let x = spread(2 * 9 * d, 1.0);
    let run = Run {
        config: &config,
        weights,
        x: &x,
        context: "config_load",
    };
    if let Some(Err(failure)) = run_shape(run, d, kv, q) {
        panic!("{failure}\n{config:?}");
    }
});

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
