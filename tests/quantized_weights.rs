//! Weights kept as ggml's quantized blocks (`WeightFormat::Q8_0`, `Q4_0`, `Q4_K`, `Q5_K`,
//! `Q6_K`): on every supported instruction set,
//! - the GEMM over a matrix given as blocks (`PackedB::from_blocks`) equals, bit for bit, the
//!   GEMM over the `f32` matrix of the values this test dequantizes itself (a scalar
//!   transcription of ggml's `dequantize_row_*`), for a few rows (decoding's row path) and
//!   many (the tile path), on 1 and 3 threads, on odd shapes;
//! - a layer built from `f32` weights in `q8_0` or `q4_0` equals, bit for bit, the `f32` layer
//!   of the weights this test quantizes and dequantizes itself (ggml's reference quantizers,
//!   transcribed), forward and decoding token by token, on 1 and 3 threads;
//! - the crate's quantizers give the blocks of the `gguf` Python package's quantizers on
//!   hand-made rows (halfway cases, zeros, tiny values);
//! - a layer computing in int8 (`Compute::Int8`, q8_0 / q4_0 weights) decodes bit for bit as
//!   it forwards, on 1 and 3 threads, the vector tables giving the same bits, within the
//!   inputs' rounding of the `f32` layer of the same weights; int8 with other weights is an
//!   error naming them;
//! - widths that are not whole blocks, and K formats asked of `f32` weights, are errors
//!   naming the numbers.

mod common;

use common::{assert_bits_eq, forward_and_decode, random_layer, Rng};
use mha::kernels::{gemm, Isa, PackedB};
use mha::{
    Compute, Layer, Projections, Rope, RopeLayout, RopeScaling, ShapeError, WeightFormat, Widths,
};

const BLOCK_FORMATS: [WeightFormat; 5] = [
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q4_K,
    WeightFormat::Q5_K,
    WeightFormat::Q6_K,
];

fn isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
}

/// IEEE binary16 `h` as `f32`, by its definition (finite values only here).
fn half(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((h >> 10) & 0x1f), f64::from(h & 0x3ff));
    let magnitude = match e {
        0 => m * 2f64.powi(-24),
        _ => (1.0 + m / 1024.0) * 2f64.powi(e - 15),
    };
    (sign * magnitude) as f32
}

/// `f32` rounded to binary16 bits (nearest, ties to even) by a search over the finite
/// halves: the one nearest, the even one of two.
fn to_half(x: f32) -> u16 {
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = f64::from(x.abs());
    let (mut lo, mut hi) = (0u16, 0x7bff);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if f64::from(half(mid)) <= a {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let (below, above) = (f64::from(half(lo)), f64::from(half(lo + 1)));
    let up = a - below > above - a || (a - below == above - a && lo % 2 == 1);
    sign | if up { lo + 1 } else { lo }
}

/// `x[at..at + 2]` as binary16.
fn d(x: &[u8], at: usize) -> f32 {
    half(u16::from_le_bytes([x[at], x[at + 1]]))
}

/// `get_scale_min_k4`.
fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// ggml's `dequantize_row_*` for one block of `format`, transcribed from `ggml-quants.c`.
fn dequantize_block(format: WeightFormat, x: &[u8]) -> Vec<f32> {
    let mut y = Vec::new();
    match format {
        WeightFormat::Q8_0 => {
            for j in 0..32 {
                y.push(f32::from(x[2 + j] as i8) * d(x, 0));
            }
        }
        WeightFormat::Q4_0 => {
            y.resize(32, 0.0);
            for j in 0..16 {
                let x0 = (x[2 + j] & 0x0F) as i32 - 8;
                let x1 = (x[2 + j] >> 4) as i32 - 8;
                y[j] = x0 as f32 * d(x, 0);
                y[j + 16] = x1 as f32 * d(x, 0);
            }
        }
        WeightFormat::Q4_K | WeightFormat::Q5_K => {
            let five = format == WeightFormat::Q5_K;
            let (dd, min) = (d(x, 0), d(x, 2));
            let scales = &x[4..16];
            let (qh, mut ql) = (&x[16..48], if five { &x[48..] } else { &x[16..] });
            let (mut is, mut u1, mut u2) = (0, 1u8, 2u8);
            for _ in (0..256).step_by(64) {
                let (sc, m) = get_scale_min_k4(is, scales);
                let (d1, m1) = (dd * f32::from(sc), min * f32::from(m));
                let (sc, m) = get_scale_min_k4(is + 1, scales);
                let (d2, m2) = (dd * f32::from(sc), min * f32::from(m));
                let high = |l: usize, u: u8| if five && qh[l] & u != 0 { 16 } else { 0 };
                for (l, &q) in ql[..32].iter().enumerate() {
                    y.push(d1 * f32::from((q & 0xF) + high(l, u1)) - m1);
                }
                for (l, &q) in ql[..32].iter().enumerate() {
                    y.push(d2 * f32::from((q >> 4) + high(l, u2)) - m2);
                }
                ql = &ql[32..];
                is += 2;
                u1 <<= 2;
                u2 <<= 2;
            }
        }
        _ => {
            y.resize(256, 0.0);
            let dd = d(x, 208);
            for n in 0..2 {
                let (ql, qh, sc) = (&x[64 * n..], &x[128 + 32 * n..], &x[192 + 8 * n..]);
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                    let s = |i: usize| f32::from(sc[is + i] as i8);
                    y[128 * n + l] = dd * s(0) * f32::from(q1);
                    y[128 * n + l + 32] = dd * s(2) * f32::from(q2);
                    y[128 * n + l + 64] = dd * s(4) * f32::from(q3);
                    y[128 * n + l + 96] = dd * s(6) * f32::from(q4);
                }
            }
        }
    }
    y
}

/// Values and bytes per block.
fn block_shape(format: WeightFormat) -> (usize, usize) {
    match format {
        WeightFormat::Q8_0 => (32, 34),
        WeightFormat::Q4_0 => (32, 18),
        WeightFormat::Q4_K => (256, 144),
        WeightFormat::Q5_K => (256, 176),
        _ => (256, 210),
    }
}

/// The `(k, n)` matrix `B` of `n` rows of blocks (each `k` values), dequantized, row-major.
fn dequantize_matrix(format: WeightFormat, bytes: &[u8], k: usize, n: usize) -> Vec<f32> {
    let (values, block_bytes) = block_shape(format);
    let row_bytes = k / values * block_bytes;
    let mut b = vec![0.0; k * n];
    for j in 0..n {
        let row = &bytes[j * row_bytes..][..row_bytes];
        for (blk, block) in row.chunks_exact(block_bytes).enumerate() {
            for (i, v) in dequantize_block(format, block).into_iter().enumerate() {
                b[(blk * values + i) * n + j] = v;
            }
        }
    }
    b
}

/// Random blocks: every byte random but the binary16 scales, which are random values of
/// about `1 / 64` (so the values stay moderate).
fn random_blocks(rng: &mut Rng, format: WeightFormat, blocks: usize) -> Vec<u8> {
    let (_, block_bytes) = block_shape(format);
    let scale_at: &[usize] = match format {
        WeightFormat::Q8_0 | WeightFormat::Q4_0 => &[0],
        WeightFormat::Q6_K => &[208],
        _ => &[0, 2],
    };
    let mut bytes = Vec::with_capacity(blocks * block_bytes);
    for _ in 0..blocks {
        let mut block: Vec<u8> = (0..block_bytes).map(|_| rng.next_u64() as u8).collect();
        for &at in scale_at {
            let h = to_half(rng.uniform() / 64.0);
            block[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
        bytes.extend(block);
    }
    bytes
}

#[test]
fn the_test_binary16_rounding_is_round_to_nearest_even() {
    assert_eq!(to_half(1.0), 0x3c00);
    assert_eq!(to_half(1.0 + 2f32.powi(-11)), 0x3c00);
    assert_eq!(to_half(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
    assert_eq!(to_half(-0.5), 0xb800);
    assert_eq!(half(0x3555), 0.333_251_95);
}

/// The GEMM over blocks equals the GEMM over this test's dequantized matrix, on every table,
/// for a few rows (1 to 6: decoding's row path, in calls of up to 4 rows) and many, on 1 and 3
/// threads; widths below, at and past one vector, one pass of 4 vectors and several.
#[test]
fn gemm_over_blocks_equals_gemm_over_the_dequantized_matrix() {
    let mut rng = Rng::new(5);
    for format in BLOCK_FORMATS {
        let (values, _) = block_shape(format);
        let shapes = [
            (1, 1),
            (3, 37),
            (2, 70),
            (5, 19),
            (1, 16),
            (2, 64),
            (1, 131),
        ];
        for (k_blocks, n) in shapes {
            let k = k_blocks * values;
            let bytes = random_blocks(&mut rng, format, k_blocks * n);
            let dense = dequantize_matrix(format, &bytes, k, n);
            for isa in isas() {
                let blocks = PackedB::from_blocks(isa, &bytes, k, n, format).unwrap();
                assert_eq!(blocks.format(), format);
                let f32s = PackedB::from_row_major(isa, &dense, k, n).unwrap();
                for m in [1, 2, 3, 4, 5, 6, 13, 40] {
                    let a = rng.vec(m * k, 1.0);
                    let mut want = vec![0.0; m * n];
                    gemm(&a, m, &f32s, &mut want, 1).unwrap();
                    for threads in [1, 3] {
                        let mut got = vec![f32::NAN; m * n];
                        gemm(&a, m, &blocks, &mut got, threads).unwrap();
                        let context = format!("{isa:?} {format:?} k {k} n {n} m {m} t {threads}");
                        assert_bits_eq(&got, &want, &context);
                    }
                }
            }
        }
    }
}

/// ggml's `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref`, transcribed.
fn quantize_block(format: WeightFormat, x: &[f32]) -> Vec<u8> {
    let c_int = |v: f32| {
        if v.abs() < 2_147_483_648.0 {
            v as i32
        } else {
            i32::MIN
        }
    };
    let mut y = Vec::new();
    if format == WeightFormat::Q8_0 {
        let mut amax = 0.0f32;
        for &v in x {
            amax = if amax > v.abs() { amax } else { v.abs() };
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.extend(to_half(d).to_le_bytes());
        for &v in x {
            // roundf: half away from zero.
            let r = v * id;
            let t = c_int(r);
            let r = if (r - t as f32).abs() >= 0.5 {
                t + r.signum() as i32
            } else {
                t
            };
            y.push(r as i8 as u8);
        }
    } else {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.extend(to_half(d).to_le_bytes());
        for j in 0..16 {
            let xi0 = (c_int(x[j] * id + 8.5) as i8).min(15) as u8;
            let xi1 = (c_int(x[16 + j] * id + 8.5) as i8).min(15) as u8;
            y.push(xi0 | (xi1 << 4));
        }
    }
    y
}

/// `w (k, n)` row-major quantized along each column by [`quantize_block`], then
/// dequantized: the weights a layer in `format` computes with.
fn quantized_dense(format: WeightFormat, w: &[f32], k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; k * n];
    for j in 0..n {
        for b0 in (0..k).step_by(32) {
            let x: Vec<f32> = (b0..b0 + 32).map(|p| w[p * n + j]).collect();
            let values = dequantize_block(format, &quantize_block(format, &x));
            for (i, v) in values.into_iter().enumerate() {
                out[(b0 + i) * n + j] = v;
            }
        }
    }
    out
}

/// A layer quantized to q8_0 / q4_0 from `f32` weights equals the `f32` layer of this test's
/// quantized-then-dequantized weights, forward and decoding, on 1 and 3 threads.
#[test]
fn quantized_layers_equal_f32_layers_of_the_dequantized_weights() {
    // D 64, 4 heads of 32 (Q 128), 2 key/value heads (KV 64): every input width whole
    // blocks.
    let widths = Widths::self_attention(64, 64, 128);
    let (w, biases) = random_layer(&mut Rng::new(9), widths);
    let shapes = [(64, 128), (64, 64), (64, 64), (128, 64)];
    let x = Rng::new(10).vec(2 * 7 * 64, 1.0);
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
        let dense: Vec<Vec<f32>> = (0..4)
            .map(|i| quantized_dense(format, &w[i], shapes[i].0, shapes[i].1))
            .collect();
        let [wq, wk, wv, wo] = &w;
        let projections = Projections::new(widths, wq, wk, wv, wo).unwrap();
        let dq = Projections::new(widths, &dense[0], &dense[1], &dense[2], &dense[3]).unwrap();
        for isa in isas() {
            let build = |p: Projections<'_>, format, threads| {
                Layer::builder(p, 4)
                    .biases(biases.clone())
                    .rope(Rope {
                        theta: 10_000.0,
                        rotary_dim: 32,
                        layout: RopeLayout::RotateHalf,
                        scaling: RopeScaling::Default,
                    })
                    .isa(isa)
                    .threads(threads)
                    .min_work_per_thread(0)
                    .weight_format(format)
                    .build()
                    .unwrap()
            };
            let want = forward_and_decode(&mut build(dq, WeightFormat::F32, 1), &x, (2, 7));
            for threads in [1, 3] {
                let mut layer = build(projections, format, threads);
                assert_eq!(layer.weight_format(), format);
                let got = forward_and_decode(&mut layer, &x, (2, 7));
                let context = format!("{isa:?} {format:?} threads {threads}");
                assert_bits_eq(&got.0, &want.0, &format!("{context} forward"));
                assert_bits_eq(&got.1, &want.1, &format!("{context} decode"));
                assert_bits_eq(&got.1, &got.0, &format!("{context} decode = forward"));
            }
        }
    }
}

/// One layer of `format` weights and `compute` products, checked on every table against the
/// `f32` layer of the same weights: decoding equals the forward pass, 3 threads give 1
/// thread's bits, every output is within `tolerance` of the `f32` layer's largest output and
/// the bits are not the `f32` layer's. Returns each table's forward outputs.
fn check_compute_layers(
    seed: u64,
    format: WeightFormat,
    compute: Compute,
    tolerance: f32,
) -> Vec<(Isa, Vec<f32>)> {
    let widths = Widths::self_attention(64, 64, 128);
    let (w, biases) = random_layer(&mut Rng::new(seed), widths);
    let x = Rng::new(seed + 1).vec(2 * 9 * 64, 1.0);
    let [wq, wk, wv, wo] = &w;
    let projections = Projections::new(widths, wq, wk, wv, wo).unwrap();
    let build = |isa, compute, threads| {
        Layer::builder(projections, 4)
            .biases(biases.clone())
            .isa(isa)
            .threads(threads)
            .min_work_per_thread(0)
            .weight_format(format)
            .compute(compute)
            .build()
            .unwrap()
    };
    let mut forwards = Vec::new();
    for isa in isas() {
        let (want, _) = forward_and_decode(&mut build(isa, Compute::F32, 1), &x, (2, 9));
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let mut layer = build(isa, compute, 1);
        assert_eq!(layer.compute(), compute);
        let (forward, decoded) = forward_and_decode(&mut layer, &x, (2, 9));
        let context = format!("{isa:?} {format:?} {compute:?}");
        assert_bits_eq(&decoded, &forward, &format!("{context} decode = forward"));
        let (three, _) = forward_and_decode(&mut build(isa, compute, 3), &x, (2, 9));
        assert_bits_eq(&three, &forward, &format!("{context} 3 threads"));
        for (i, (g, w)) in forward.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= tolerance * scale,
                "{context} {i}: {g} vs {w}"
            );
        }
        assert_ne!(forward, want, "{context}: gave the f32 layer's bits");
        forwards.push((isa, forward));
    }
    forwards
}

/// A layer computing in int8 decodes as it forwards (bit for bit, 1 and 3 threads), every
/// vector table gives the same bits (the integer sums are exact and the `f32` steps the same
/// operations), and it stays within the inputs' rounding of the `f32` layer of the same
/// weights: each projection input rounded to `max|x| / 127` per 32 values, about 0.4 % of a
/// block's largest value, through two projections and the attention's averages; 3 % of the
/// output's largest value bounds that with room for the softmax's sensitivity.
#[test]
fn int8_layers_decode_as_they_forward_near_the_f32_layer() {
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
        let forwards = check_compute_layers(19, format, Compute::Int8, 0.03);
        let mut vector = forwards.iter().filter(|(isa, _)| *isa != Isa::Portable);
        if let Some((_, first)) = vector.next() {
            for (isa, forward) in vector {
                let context = format!("{isa:?} {format:?} = the first vector table");
                assert_bits_eq(forward, first, &context);
            }
        }
    }
    let widths = Widths::self_attention(64, 64, 128);
    let (w, _) = random_layer(&mut Rng::new(19), widths);
    let [wq, wk, wv, wo] = &w;
    let projections = Projections::new(widths, wq, wk, wv, wo).unwrap();
    let err = Layer::builder(projections, 4)
        .weight_format(WeightFormat::Bf16)
        .compute(Compute::Int8)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "compute is int8 with bf16 weights, but must be int8 only with q8_0 or q4_0 weights, \
         bf16 only with f32, bf16 or f16 weights"
    );
}

/// Layers in bfloat16 products (`Compute::Bf16`): on every table decoding equals the forward
/// pass and three threads give one thread's bits; the outputs are within 2 % of the largest
/// output of the `f32` layer's: each operand of both projections rounds by at most 2^-9
/// relative, through the softmax's sensitivity.
#[test]
fn bf16_layers_decode_as_they_forward_near_the_f32_layer() {
    for format in [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16] {
        check_compute_layers(23, format, Compute::Bf16, 0.02);
    }
    let widths = Widths::self_attention(64, 64, 128);
    let (w, _) = random_layer(&mut Rng::new(23), widths);
    let [wq, wk, wv, wo] = &w;
    let projections = Projections::new(widths, wq, wk, wv, wo).unwrap();
    let err = Layer::builder(projections, 4)
        .weight_format(WeightFormat::Q8_0)
        .compute(Compute::Bf16)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "compute is bf16 with q8_0 weights, but must be int8 only with q8_0 or q4_0 weights, \
         bf16 only with f32, bf16 or f16 weights"
    );
}

/// Hand-made rows: 64 values `((37 i mod 101) - 50) / 7.3`, 32 zeros, `127, -127` and the
/// halfway values `-14.5 .. 14.5`, 32 tiny values of alternating sign.
fn hand_made_rows() -> Vec<f32> {
    let mut x: Vec<f32> = (0..64)
        .map(|i| (((i * 37) % 101) as f32 - 50.0) / 7.3)
        .collect();
    x.extend([0.0; 32]);
    x.extend([127.0, -127.0]);
    x.extend((0..30).map(|j| (j as f32 - 15.0) + 0.5));
    x.extend((0..32).map(|i| match i % 2 {
        0 => i as f32 * 0.001,
        _ => i as f32 * -0.001,
    }));
    x
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// The blocks of [`hand_made_rows`] as the `gguf` Python package (0.17, `gguf.quants.quantize`)
/// quantizes them.
const GGUF_Q8_0: &str = "e72a81df3d9af856b41270cd2b89e745a2005ebb1977d53390ee4caa0866c3217fdcc42a3c96f656b0106fca2984e3439efd5db71777d1318beb4ba50565bf1f7fd9399300000000000000000000000000000000000000000000000000000000000000000000003c7f81f1f2f3f4f5f6f7f8f9fafbfcfdfeff0102030405060708090a0b0c0d0e0f000c00fc08f410ec19e321db29d331cb39c342ba4ab252aa5aa2629a6b9173897b81";
const GGUF_Q4_0: &str = "d93ae046acf258bd1379df358be046acf268b6ba740fb953fd9731eb852fca640ea842fd008088888888888888888888888888888888f0cb808f8989898989898978787878787878f01bc848d937d937ea26ea26fb15fb15fc04";

/// The crate's quantizers give the `gguf` package's blocks (and this test's transcription
/// of ggml's does too), seen through a one-column matrix `B (160, 1)`.
#[test]
fn quantizers_give_the_gguf_packages_blocks() {
    let x = hand_made_rows();
    let k = x.len();
    for (format, want) in [
        (WeightFormat::Q8_0, GGUF_Q8_0),
        (WeightFormat::Q4_0, GGUF_Q4_0),
    ] {
        let want = hex(want);
        let mine: Vec<u8> = x
            .chunks(32)
            .flat_map(|b| quantize_block(format, b))
            .collect();
        assert_eq!(mine, want, "{format:?}: the test's transcription");
        let dense = dequantize_matrix(format, &want, k, 1);
        for isa in isas() {
            let quantized = PackedB::from_row_major_as(isa, &x, k, 1, format).unwrap();
            let from_blocks = PackedB::from_blocks(isa, &want, k, 1, format).unwrap();
            // Each row of the identity reads one weight.
            for p in 0..k {
                let mut a = vec![0.0; k];
                a[p] = 1.0;
                let (mut got, mut given) = ([0.0], [0.0]);
                gemm(&a, 1, &quantized, &mut got, 1).unwrap();
                gemm(&a, 1, &from_blocks, &mut given, 1).unwrap();
                // The chain from +0: the weight, but +0 for -0.
                let (want, context) = (dense[p] + 0.0, format!("{isa:?} {format:?} value {p}"));
                assert_eq!(got[0].to_bits(), want.to_bits(), "{context}");
                assert_eq!(given[0].to_bits(), want.to_bits(), "{context}");
            }
        }
    }
}

#[test]
fn widths_that_are_not_whole_blocks_are_errors_naming_them() {
    let isa = Isa::detect();
    let err = PackedB::from_blocks(isa, &[0; 34], 40, 1, WeightFormat::Q8_0).unwrap_err();
    assert!(
        matches!(
            err,
            ShapeError::BlockWidth {
                width: 40,
                block: 32,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "matrix B has input width 40, not a multiple of q8_0's blocks of 32 values"
    );
    let err = PackedB::from_blocks(isa, &[0; 144], 128, 1, WeightFormat::Q4_K).unwrap_err();
    assert!(
        err.to_string().contains("128") && err.to_string().contains("256"),
        "{err}"
    );
    let err = PackedB::from_blocks(isa, &[0; 33], 32, 1, WeightFormat::Q8_0).unwrap_err();
    assert!(
        matches!(
            err,
            ShapeError::LengthMismatch {
                expected: 34,
                actual: 33,
                ..
            }
        ),
        "{err}"
    );
    let err = PackedB::from_blocks(isa, &[0; 4], 1, 1, WeightFormat::F32).unwrap_err();
    assert!(matches!(err, ShapeError::BlockWidth { .. }), "{err}");
    let err = PackedB::from_row_major_as(isa, &[0.0; 256], 256, 1, WeightFormat::Q4_K);
    assert!(
        matches!(err, Err(ShapeError::NotQuantizable { format: "q4_K" })),
        "{err:?}"
    );
    // A layer: D 60 is not whole blocks of 32.
    let widths = Widths::self_attention(60, 20, 60);
    let (square, narrow) = (vec![0.01; 60 * 60], vec![0.01; 60 * 20]);
    let projections = Projections::new(widths, &square, &narrow, &narrow, &square).unwrap();
    let err = Layer::builder(projections, 6)
        .weight_format(WeightFormat::Q4_0)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "query projection wq (D, Q) has input width 60, not a multiple of q4_0's blocks of 32 values"
    );
    // A weight whose block's scale overflows binary16.
    let err = PackedB::from_row_major_as(isa, &[1e7; 32], 32, 1, WeightFormat::Q8_0).unwrap_err();
    assert!(
        matches!(err, ShapeError::WeightRange { index: 0, .. }),
        "{err}"
    );
}
