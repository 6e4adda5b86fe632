//! The main job: the seed's split example, then one GPT-2-sized causal attention layer.
//!
//! Run with `cargo run --release --example demo`.

use std::time::Instant;

use mha::{merge_heads, mha_forward, split_heads, Matrix, MhaParams, Tensor};

#[path = "common/split_mix.rs"]
mod split_mix;
use split_mix::SplitMix;

fn main() -> Result<(), mha::ShapeError> {
    // 1. The worked example: one text, T = 2 tokens, D = 4, H = 2 heads of d = 2.
    let x = Tensor::from([[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]]);
    let heads = split_heads(&x, 2)?;
    println!("split_heads([[[0, 1, 2, 3], [4, 5, 6, 7]]], 2):");
    for h in 0..heads.n_heads() {
        let head = heads.head(0, h).expect("head index in range");
        let rows: Vec<&[f32]> = head.chunks(heads.head_dim()).collect();
        println!("  head {h}: {rows:?}");
    }
    assert_eq!(merge_heads(&heads), x, "merge is the inverse of split");
    println!("  merge_heads(split_heads(x)) == x");

    // 2. A GPT-2-sized layer: D = 768, 12 heads, T = 1024 tokens, seeded random weights.
    const T: usize = 1024;
    const D: usize = 768;
    const H: usize = 12;
    let mut rng = SplitMix(2026);
    let x = Tensor::<1, T, D>::from_fn(|_, _, _| rng.uniform());
    let scale = (3.0 / D as f32).sqrt(); // uniform weights with variance 1/D
    let mut weight = || Matrix::<D, D>::from_fn(|_, _| rng.uniform() * scale);
    let params = MhaParams::new(weight(), weight(), weight(), weight());

    let start = Instant::now();
    let y = mha_forward(&x, &params, H)?;
    let seconds = start.elapsed().as_secs_f64();

    let (b, t, d) = (1.0, T as f64, D as f64);
    let flops = 8.0 * b * t * d * d + 2.0 * b * d * t * (t + 1.0);
    let checksum: f64 = y.as_slice().iter().map(|&v| v as f64).sum();
    let abs_sum: f64 = y.as_slice().iter().map(|&v| (v as f64).abs()).sum();
    println!(
        "\nmha_forward: B = 1, T = {T}, D = {D}, H = {H} (kernels: {:?})",
        mha::Isa::detect()
    );
    println!("  checksum (sum of outputs): {checksum:.6}   sum of |outputs|: {abs_sum:.6}");
    println!(
        "  time: {:.2} ms   {:.1} GFLOP/s (useful FLOPs 8·B·T·D² + 2·B·D·T·(T+1) = {:.2} G)",
        seconds * 1e3,
        flops / seconds / 1e9,
        flops / 1e9
    );
    Ok(())
}
