//! The public kernels and functions outside a layer: `gemm` in every weight format on 1, 2
//! and 3 threads; the rounding of weights and of cached values to each format over the whole
//! range; `exp`, `tanh`, `sin_cos` and the 16-bit widenings over sweeps of their inputs;
//! rotary rotation, frequencies and angles; ALiBi slopes; `attention()` with several masks,
//! `split_heads` / `merge_heads`, `mha_forward` and the reference.
use mha::kernels::exp::exp;
use mha::kernels::tanh::tanh;
use mha::kernels::trig::sin_cos;
use mha::kernels::{gemm, PackedB};
use mha::safetensors::{bf16_to_f32, f16_to_f32};
use mha::*;

use crate::layer::{llama3, rope, yarn};
use crate::{hash64, seed_of, show, Rng};

pub fn run() {
    gemms();
    weight_rounding();
    value_rounding();
    scalar_functions();
    rotations();
    slopes();
    heads_case::<2, 97, 30>("heads-a", 3);
    heads_case::<3, 7, 12>("heads-b", 4);
    heads_case::<1, 1, 10>("heads-c", 1);
    heads_case::<1, 131, 64>("heads-d", 2);
}

/// `C = A · B` on odd shapes in every weight format, on 1, 2 and 3 threads.
fn gemms() {
    for (m, k, n) in [
        (1, 37, 53),
        (4, 64, 80),
        (7, 130, 97),
        (97, 61, 200),
        (200, 300, 131),
    ] {
        let name = format!("gemm {m}x{k}x{n}");
        let mut rng = Rng(seed_of(&name));
        let (a, b) = (rng.vec(m * k, 1.0), rng.vec(k * n, 1.0));
        let f32_packed = PackedB::from_row_major(Isa::detect(), &b, k, n).unwrap();
        show(
            &format!("{name} f32-default t1"),
            &product(&a, m, &f32_packed, 1),
        );
        for format in [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16] {
            let packed = PackedB::from_row_major_as(Isa::detect(), &b, k, n, format).unwrap();
            for threads in 1..=3 {
                show(
                    &format!("{name} {} t{threads}", format.name()),
                    &product(&a, m, &packed, threads),
                );
            }
        }
    }
}

/// `a (m, k) · b` on `threads` threads.
fn product(a: &[f32], m: usize, b: &PackedB, threads: usize) -> Vec<f32> {
    let mut c = vec![f32::NAN; m * b.cols()];
    gemm(a, m, b, &mut c, threads).unwrap();
    c
}

/// Finite `f32` values over the whole range (every 16411th bit pattern, both signs), and the
/// values halfway between neighbouring bf16 and f16 values and next to them.
fn sweep() -> Vec<f32> {
    let spread = (0..0x7f80_0000u32).step_by(16411);
    let bf16_ties = (0..0x7f80u32)
        .step_by(37)
        .flat_map(|hi| [0x7fff, 0x8000, 0x8001].map(|lo| hi << 16 | lo));
    let f16_range =
        (100..=143u32).flat_map(|e| (0..1024u32).step_by(7).map(move |m| e << 23 | m << 13));
    let f16_ties = f16_range.flat_map(|bits| [0xfff, 0x1000, 0x1001, 0x1fff].map(|lo| bits | lo));
    let positive: Vec<u32> = spread.chain(bf16_ties).chain(f16_ties).collect();
    positive
        .iter()
        .flat_map(|&bits| [bits, bits | 0x8000_0000])
        .map(f32::from_bits)
        .collect()
}

/// The values of `sweep` below `limit` in magnitude (a format's overflow: about 3.39e38 for
/// bf16, 65520 for f16).
fn in_range(limit: f32) -> Vec<f32> {
    sweep().into_iter().filter(|v| v.abs() < limit).collect()
}

/// Weights rounded to each format when packed, read back through `gemm` by `1 · B`.
fn weight_rounding() {
    for (format, limit) in [
        (WeightFormat::Bf16, 3.38e38),
        (WeightFormat::F16, 65519.0),
        (WeightFormat::F32, f32::MAX),
    ] {
        let values = in_range(limit);
        let packed =
            PackedB::from_row_major_as(Isa::detect(), &values, 1, values.len(), format).unwrap();
        show(
            &format!("round-weights {} {}", format.name(), values.len()),
            &product(&[1.0], 1, &packed, 1),
        );
    }
}

/// Values rounded to each cache format, read back through a layer whose every sequence holds
/// one token: zero query and key projections, identity value and output projections, so each
/// output row is its token's stored value, widened.
fn value_rounding() {
    const W: usize = 64;
    let identity: Vec<f32> = (0..W * W)
        .map(|k| if k / W == k % W { 1.0 } else { 0.0 })
        .collect();
    let zero = vec![0.0; W * W];
    let widths = Widths::self_attention(W, W, W);
    let projections = Projections::new(widths, &zero, &zero, &identity, &identity).unwrap();
    for (format, limit) in [
        (KvFormat::Bf16, 3.38e38),
        (KvFormat::F16, 65519.0),
        (KvFormat::Q8_0, f32::MAX),
        (KvFormat::F32, f32::MAX),
    ] {
        let mut values = in_range(limit);
        values.truncate(values.len() / W * W);
        let mut layer = Layer::builder(projections, 1)
            .value_format(format)
            .threads(2)
            .build()
            .unwrap();
        let y = layer
            .forward(Tokens::new(&values, values.len() / W, 1, W).unwrap())
            .unwrap();
        show(
            &format!("round-values {} {}", format.name(), values.len()),
            &y,
        );
    }
}

/// `exp` and `tanh` of every 1021st `f32` bit pattern; `sin_cos` over a sweep of `f64`s; the
/// widening of every bf16 and f16 value.
fn scalar_functions() {
    let inputs: Vec<f32> = (0..=u32::MAX).step_by(1021).map(f32::from_bits).collect();
    show("exp", &inputs.iter().map(|&x| exp(x)).collect::<Vec<_>>());
    show("tanh", &inputs.iter().map(|&x| tanh(x)).collect::<Vec<_>>());
    let step = 0x7ff0_0000_0000_0000u64 / 100_003;
    let angles = (0..100_003u64)
        .map(|i| f64::from_bits(i * step))
        .chain((0..100_000).map(|i| i as f64 * 0.37 - 1e4));
    let sin_cos: Vec<f64> = angles
        .flat_map(|x| [x, -x])
        .flat_map(|x| <[f64; 2]>::from(sin_cos(x)))
        .collect();
    println!("sin_cos {:016x}", hash64(&sin_cos));
    let all: Vec<u16> = (0..=u16::MAX).collect();
    show(
        "bf16_to_f32",
        &all.iter().map(|&b| bf16_to_f32(b)).collect::<Vec<_>>(),
    );
    show(
        "f16_to_f32",
        &all.iter().map(|&b| f16_to_f32(b)).collect::<Vec<_>>(),
    );
}

/// The rotary embeddings of the cases: frequencies, attention factor, angles and rotations of
/// rows of 3 heads (and 5 more columns) by sequence and by explicit positions.
fn rotations() {
    use RopeLayout::{Interleaved, RotateHalf};
    let ropes = [
        (rope(10, RotateHalf, RopeScaling::Default), 10),
        (
            rope(6, Interleaved, RopeScaling::Linear { factor: 2.0 }),
            10,
        ),
        (rope(80, RotateHalf, yarn(true)), 80),
        (rope(10, Interleaved, yarn(false)), 10),
        (rope(16, RotateHalf, llama3()), 24),
        (rope(0, RotateHalf, RopeScaling::Default), 4),
    ];
    for (i, (rope, head_dim)) in ropes.into_iter().enumerate() {
        let angles = RopeAngles::new(rope, head_dim).unwrap();
        let inv = rope.inverse_frequencies().unwrap();
        let factor = rope.scaling.attention_factor();
        println!(
            "rope{i} inv {:016x} factor {factor:?} max {}",
            hash64(&inv),
            angles.max_position()
        );
        let cos_sin: Vec<f32> = [0, 1, 7, 96, 4095, 1 << 20, (1 << 31) - 1]
            .into_iter()
            .flat_map(|p| (0..rope.rotary_dim / 2).map(move |pair| (p, pair)))
            .flat_map(|(p, pair)| <[f32; 2]>::from(angles.cos_sin(p, pair).unwrap()))
            .collect();
        show(&format!("rope{i} cos_sin"), &cos_sin);
        rotate_rows(&format!("rope{i}"), &angles, head_dim);
    }
}

/// Rows of 3 heads (and 5 more columns) rotated by sequence and by explicit positions.
fn rotate_rows(tag: &str, angles: &RopeAngles, head_dim: usize) {
    let (len, heads) = (37, 3);
    let rows = RopeRows {
        rows: 3 * len,
        heads,
        row_stride: heads * head_dim + 5,
    };
    let original = Rng(seed_of(tag)).vec(rows.rows * rows.row_stride, 1.0);
    let starts = [0, 1000, 123_456_789];
    let explicit: Vec<usize> = (0..rows.rows).map(|r| (r * 7919) % 100_003).collect();
    let positions = [
        (
            "sequences",
            RopePositions::PerSequence {
                starts: &starts,
                len,
            },
        ),
        ("explicit", RopePositions::Explicit(&explicit)),
    ];
    for (name, positions) in positions {
        let mut buffer = original.clone();
        angles.rotate(&mut buffer, rows, positions).unwrap();
        show(&format!("{tag} rotate-{name}"), &buffer);
    }
}

/// The standard ALiBi slopes of 1 to 80 heads.
fn slopes() {
    let all: Vec<f32> = (1..=80)
        .flat_map(|h| Alibi::standard_slopes(h).unwrap())
        .collect();
    show("alibi-slopes", &all);
}

/// `split_heads`, `merge_heads`, `attention()` with a causal, a bidirectional and a holed
/// mask, `mha_forward` and the reference's on `(B, T, D)` with `h` heads.
fn heads_case<const B: usize, const T: usize, const D: usize>(name: &str, h: usize) {
    let mut rng = Rng(seed_of(name));
    let mut tensor = || Tensor::<B, T, D>::from_vec(rng.vec(B * T * D, 1.0)).unwrap();
    let (q, k, v) = (tensor(), tensor(), tensor());
    let heads = |x: &Tensor<B, T, D>| split_heads(x, h).unwrap();
    let (qh, kh, vh) = (heads(&q), heads(&k), heads(&v));
    show(&format!("{name} split"), qh.as_slice());
    show(&format!("{name} merge"), merge_heads(&vh).as_slice());
    let masks = [
        ("causal", causal_mask(T).unwrap()),
        ("all", vec![true; T * T]),
        (
            "holes",
            (0..T * T)
                .map(|k| (k * 7 + 3) % 5 != 0 || k % (T + 1) == 0)
                .collect(),
        ),
    ];
    for (mask_name, mask) in masks {
        let out = attention(&qh, &kh, &vh, &mask).unwrap();
        show(&format!("{name} attention-{mask_name}"), out.as_slice());
    }
    let matrix = |rng: &mut Rng| Matrix::<D, D>::from_vec(rng.vec(D * D, 0.3)).unwrap();
    let params = MhaParams::new(
        matrix(&mut rng),
        matrix(&mut rng),
        matrix(&mut rng),
        matrix(&mut rng),
    );
    show(
        &format!("{name} mha_forward"),
        mha_forward(&q, &params, h).unwrap().as_slice(),
    );
    show(
        &format!("{name} reference"),
        reference::mha_forward(&q, &params, h).unwrap().as_slice(),
    );
}
