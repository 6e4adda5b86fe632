//! The Hugging Face fixtures (`tests/fixtures/hf`) with 16- and 8-bit KV caches: per case read
//! as a checkpoint (GPT-J, whose config is not read, is left out) and per format, on the
//! widest kernel table at 2 threads: decoding token by token equals the forward pass bit for
//! bit, and the forward's error against the `transformers` float64 output is within the
//! format's bound `16 · u · max(1, max|want|)` (`u` the format's relative step: 2^-8 for
//! bfloat16, 2^-11 for binary16, 2^-7 for q8_0, whose step is 1/127 of its block's largest
//! magnitude). Prints, per case and format, the largest error and the largest ratio of error to
//! the `f32` tests' tolerance `1e-4 + 1e-4·|want|` (the table in `docs/performance.md`:
//! `cargo test --test kv_formats_hf -- --nocapture`).

#![cfg(feature = "std")]

mod common;
#[path = "common/hf_fixture.rs"]
mod hf_fixture;

use common::assert_bits_eq;
use mha::{Checkpoint, Isa, KvFormat};

/// The relative step of a format (see the module docs).
fn unit(format: KvFormat) -> f64 {
    match format {
        KvFormat::F32 => 2f64.powi(-23),
        KvFormat::Bf16 => 2f64.powi(-8),
        KvFormat::F16 => 2f64.powi(-11),
        KvFormat::Q8_0 => 2f64.powi(-7),
    }
}

#[test]
fn hf_fixtures_in_every_format() {
    let isa = Isa::detect();
    let mut checked = 0;
    for name in hf_fixture::case_names() {
        let case = hf_fixture::load(&name);
        let Ok(checkpoint) = Checkpoint::open(&case.dir) else {
            continue;
        };
        let mut row = format!("| {name}");
        for format in KvFormat::ALL {
            let built = checkpoint.layer_with(case.layer_index, |b| {
                b.isa(isa)
                    .threads(2)
                    .min_work_per_thread(0)
                    .kv_format(format)
            });
            let Ok(mut layer) = built else {
                row.clear();
                break;
            };
            let got = hf_fixture::forward(&mut layer, &case, &case.x, None);
            let most = case.expected.iter().fold(1.0f64, |m, w| m.max(w.abs()));
            let (mut error, mut ratio) = (0.0f64, 0.0f64);
            for (&g, &w) in got.iter().zip(&case.expected) {
                let e = (g as f64 - w).abs();
                error = error.max(e);
                ratio = ratio.max(e / (1e-4 + 1e-4 * w.abs()));
            }
            let bound = 16.0 * unit(format) * most + 1e-4;
            assert!(
                error <= bound,
                "{name} {format:?}: error {error:e} over {bound:e}"
            );
            let decoded = hf_fixture::token_by_token(&mut layer, &case);
            assert_bits_eq(&decoded, &got, &format!("{name} {format:?}: decoded"));
            row += &format!(" | {error:.1e} ({ratio:.1})");
        }
        if !row.is_empty() {
            checked += 1;
            println!("{row} |");
        }
    }
    assert!(checked >= 20, "only {checked} fixtures read as checkpoints");
}
