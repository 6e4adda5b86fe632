//! Layers in bfloat16 (`Compute::Bf16` for the projections and the attention) against the
//! float64 outputs of the Hugging Face fixtures, beside PyTorch's own error in bfloat16 on the
//! same inputs and weights (`torch_bf16.json` of each case, written by
//! `dev/hf_fixtures/bf16_error.py`: the family's module converted to `torch.bfloat16`). On every
//! instruction set the crate's largest error is at most PyTorch's: the crate rounds the
//! operands of each product to bfloat16 but keeps every result in `f32`, where PyTorch rounds
//! each op's output to bfloat16 too. `cargo test --test hf_bf16 -- --nocapture` prints both.

#![cfg(feature = "std")]

mod common;
#[path = "common/hf_fixture.rs"]
mod hf_fixture;
#[path = "common/json_edit.rs"]
mod json_edit;

use hf_fixture::{case_names, forward, HfCase};
use json_edit::Json;
use mha::{Checkpoint, Compute, Isa, Layer};

/// PyTorch's errors in bfloat16 on the case (largest, root mean square), when the script
/// measured them.
fn torch_errors(case: &HfCase) -> Option<(f64, f64)> {
    let text = std::fs::read_to_string(case.dir.join("torch_bf16.json")).ok()?;
    let json = Json::parse(&text);
    let number = |key: &str| match json.get(key) {
        Some(Json::Raw(number)) => number.parse().expect("a number"),
        other => panic!("{}: {key} is {other:?}", case.name),
    };
    Some((number("max_abs_error"), number("rms_error")))
}

/// The largest and the root-mean-square difference of `out` from `expected`.
fn errors(out: &[f32], expected: &[f64]) -> (f64, f64) {
    let diffs = out.iter().zip(expected).map(|(&o, &e)| f64::from(o) - e);
    let (max, squares) = diffs.fold((0.0, 0.0), |(m, s), d| (f64::max(m, d.abs()), s + d * d));
    (max, (squares / out.len() as f64).sqrt())
}

/// The case's layer in bfloat16 on `isa`.
fn bf16_layer(case: &HfCase, isa: Isa) -> Layer {
    let checkpoint = Checkpoint::open(&case.dir).unwrap();
    checkpoint
        .layer_with(case.layer_index, |b| {
            b.isa(isa)
                .threads(1)
                .compute(Compute::Bf16)
                .attention_compute(Compute::Bf16)
        })
        .unwrap()
}

/// Per case and instruction set: the root-mean-square error at most PyTorch's, and the largest
/// error at most 1.5 times PyTorch's (a maximum over one case's few hundred outputs is one
/// sample: where AMX rounds the attention's operands too, a few cases land a little above
/// PyTorch's maximum though below its mean error).
#[test]
fn bf16_layers_are_no_less_accurate_than_pytorch_in_bf16() {
    let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_supported()).collect();
    let mut compared = 0;
    // GPT-J's config is not read by the crate (tests/hf_models.rs builds it by hand).
    for name in case_names().iter().filter(|n| *n != "gptj_interleaved") {
        let case = hf_fixture::load(name);
        let Some((torch_max, torch_rms)) = torch_errors(&case) else {
            continue;
        };
        for &isa in &isas {
            let mut layer = bf16_layer(&case, isa);
            let out = forward(&mut layer, &case, &case.x, None);
            let (max, rms) = errors(&out, &case.expected);
            let (max_ratio, rms_ratio) = (max / torch_max, rms / torch_rms);
            eprintln!("{name:24} {isa:?}: max {max:.3e} ({max_ratio:.2}×), rms {rms:.3e} ({rms_ratio:.2}×)");
            assert!(rms > 0.0, "{name} {isa:?}: no rounding at all");
            assert!(
                rms <= torch_rms,
                "{name} {isa:?}: rms {rms:e} > torch's {torch_rms:e}"
            );
            assert!(
                max <= 1.5 * torch_max,
                "{name} {isa:?}: max {max:e}, torch's {torch_max:e}"
            );
        }
        compared += 1;
    }
    assert!(
        compared >= 40,
        "only {compared} cases have PyTorch's errors"
    );
}
