//! Projection weights kept in 16 bits (`LayerBuilder::weight_format`,
//! `PackedB::from_row_major_as`): on every supported instruction set,
//! - a layer built from `f32` weights in bf16 or f16 gives, bit for bit, the outputs of the
//!   `f32` layer built from the same weights rounded here (to nearest, ties to even, by the
//!   test's own f64 code), through the GEMM's tile path (many rows) and row path (a few rows:
//!   decoding), for thread counts 1, 2 and 3, with biases, GQA, RoPE, cross-attention and
//!   head widths that are not multiples of any vector; and it is within the f32 tolerance of
//!   the f64 reference computed from the rounded weights;
//! - decoding token by token equals the forward pass bit for bit;
//! - the packed GEMM on odd shapes equals the GEMM of the rounded matrix;
//! - the layer holds half the bytes; `Layer::weight_bytes` counts the four matrices alone (no
//!   biases, no padding: checked at width 60), `packed_bytes` what the layer holds;
//! - a finite weight that would round to an infinity is an error naming the matrix, the
//!   element and the value; weights that are already infinite or NaN are kept.

mod common;

use common::{assert_bits_eq, assert_close, random_layer, reference_attend, Attend, Rng};
use mha::kernels::{gemm, Isa, PackedB};
use mha::{
    AttendOptions, Biases, Layer, LayerBuilder, Output, Projections, Rope, RopeLayout, RopeScaling,
    ShapeError, Tokens, WeightFormat, WeightValues, Widths,
};

const ABS: f64 = 1e-4;
const REL: f64 = 1e-4;
const HALF_FORMATS: [WeightFormat; 2] = [WeightFormat::Bf16, WeightFormat::F16];

/// The rotary embedding of the shapes with one: theta 10,000 over the whole head.
fn rope(d: usize) -> Rope {
    Rope {
        theta: 10_000.0,
        rotary_dim: d,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    }
}

fn isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
}

/// `x` rounded to the nearest value with `bits` significant bits (ties to the even
/// significand), no exponent below `min_exponent` (binary16's subnormals), in f64.
fn round_significand(x: f32, bits: i32, min_exponent: i32) -> f32 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let x = x as f64;
    let exponent = (x.abs().log2().floor() as i32).max(min_exponent);
    let ulp = 2f64.powi(exponent - (bits - 1));
    let units = x / ulp;
    let mut rounded = units.round();
    if (units - units.trunc()).abs() == 0.5 && rounded % 2.0 != 0.0 {
        rounded -= units.signum();
    }
    (rounded * ulp) as f32
}

/// `x` as the format keeps it.
fn rounded(format: WeightFormat, x: f32) -> f32 {
    match format {
        WeightFormat::F32 => x,
        WeightFormat::Bf16 => round_significand(x, 8, -126),
        WeightFormat::F16 => round_significand(x, 11, -14),
        _ => unreachable!("a 16-bit format"),
    }
}

fn rounded_all(format: WeightFormat, v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| rounded(format, x)).collect()
}

#[test]
fn the_rounding_here_is_round_to_nearest_even() {
    // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: to the even one, 1.
    assert_eq!(rounded(WeightFormat::Bf16, 1.0 + 1.0 / 256.0), 1.0);
    assert_eq!(
        rounded(WeightFormat::Bf16, 1.0 + 3.0 / 256.0),
        1.0 + 4.0 / 256.0
    );
    assert_eq!(rounded(WeightFormat::F16, 1.0 + 1.0 / 2048.0), 1.0);
    assert_eq!(rounded(WeightFormat::F16, 65504.0), 65504.0);
    // binary16's smallest subnormal is 2^-24.
    assert_eq!(rounded(WeightFormat::F16, 1.4e-8), 0.0);
    assert_eq!(rounded(WeightFormat::F16, 4e-8), 2f32.powi(-24));
}

/// One layer's shape and settings.
#[derive(Clone, Copy, Debug)]
struct Shape {
    d_model: usize,
    memory: usize,
    h: usize,
    h_kv: usize,
    d: usize,
    biases: bool,
    rope: bool,
}

const SHAPES: [Shape; 4] = [
    // D 33, heads of 11, GQA 3:1, biases.
    Shape {
        d_model: 33,
        memory: 33,
        h: 3,
        h_kv: 1,
        d: 11,
        biases: true,
        rope: false,
    },
    // D 40 with 5 heads of 12 (Q = 60 ≠ D), RoPE, GQA 5:1.
    Shape {
        d_model: 40,
        memory: 40,
        h: 5,
        h_kv: 1,
        d: 12,
        biases: false,
        rope: true,
    },
    // A reduction longer than one kc block of every table, and more columns than panels.
    Shape {
        d_model: 520,
        memory: 520,
        h: 4,
        h_kv: 2,
        d: 26,
        biases: true,
        rope: true,
    },
    // Cross-attention: memory width 19.
    Shape {
        d_model: 24,
        memory: 19,
        h: 2,
        h_kv: 2,
        d: 12,
        biases: true,
        rope: false,
    },
];

impl Shape {
    fn widths(self) -> Widths {
        Widths {
            d_model: self.d_model,
            memory: self.memory,
            kv: self.h_kv * self.d,
            query: self.h * self.d,
            value: self.h_kv * self.d,
        }
    }
}

/// Random weights and biases of a shape.
struct Weights {
    shape: Shape,
    w: [Vec<f32>; 4],
    biases: Biases,
}

impl Weights {
    fn new(shape: Shape, seed: u64) -> Self {
        let (w, biases) = random_layer(&mut Rng::new(seed), shape.widths());
        let biases = if shape.biases {
            biases
        } else {
            Biases::default()
        };
        Weights { shape, w, biases }
    }

    /// The same weights rounded to `format` (biases unchanged).
    fn rounded(&self, format: WeightFormat) -> Weights {
        Weights {
            shape: self.shape,
            w: self.w.each_ref().map(|w| rounded_all(format, w)),
            biases: self.biases.clone(),
        }
    }

    fn builder(&self) -> LayerBuilder<'_> {
        let [wq, wk, wv, wo] = &self.w;
        let projections = Projections::new(self.shape.widths(), wq, wk, wv, wo).unwrap();
        let mut builder = Layer::builder(projections, self.shape.h)
            .biases(self.biases.clone())
            .min_work_per_thread(0);
        if self.shape.rope {
            builder = builder.rope(rope(self.shape.d));
        }
        builder
    }

    fn layer(&self, isa: Isa, threads: usize, format: WeightFormat) -> Layer {
        self.builder()
            .isa(isa)
            .threads(threads)
            .weight_format(format)
            .build()
            .unwrap()
    }
}

/// The layer's output on `x (b, t, D)` (self-attention) or against `memory (b, s, E)`.
fn run(
    layer: &mut Layer,
    x: &[f32],
    b: usize,
    t: usize,
    memory: Option<(&[f32], usize)>,
) -> Vec<f32> {
    let d = layer.widths().d_model;
    let tokens = Tokens::new(x, b, t, d).unwrap();
    match memory {
        None => layer.forward(tokens).unwrap(),
        Some((m, s)) => {
            let e = layer.widths().memory;
            let memory = Tokens::new(m, b, s, e).unwrap();
            let mut y = vec![0.0; b * t * d];
            let out = Output::new(&mut y, b, t, d).unwrap();
            layer
                .cross_into(tokens, memory, AttendOptions::default(), out)
                .unwrap();
            y
        }
    }
}

/// The f64 reference of the layer of `weights` (already rounded) on `x`.
fn reference(
    weights: &Weights,
    x: &[f32],
    b: usize,
    t: usize,
    memory: Option<(&[f32], usize)>,
) -> Vec<f64> {
    let shape = weights.shape;
    let Widths {
        d_model,
        memory: e,
        kv,
        query,
        ..
    } = shape.widths();
    let [wq, wk, wv, wo] = weights.w.each_ref().map(|w| w.as_slice());
    let mut a = Attend::new(b, t, d_model, kv, shape.h, x, [wq, wk, wv, wo]);
    a.qw = query;
    a.e = e;
    a.bq = weights.biases.bq.as_deref();
    a.bk = weights.biases.bk.as_deref();
    a.bv = weights.biases.bv.as_deref();
    a.bo = weights.biases.bo.as_deref();
    if let Some((m, s)) = memory {
        a.memory = Some(m);
        a.s = s;
    }
    // theta^(-2i/d) for the pairs (i, i + d/2).
    let inv_freq: Vec<f64> = (0..shape.d / 2)
        .map(|i| 10_000f64.powf(-2.0 * i as f64 / shape.d as f64))
        .collect();
    if shape.rope {
        a.rope = Some(common::RefRope {
            rotary_dim: shape.d,
            interleaved: false,
            inv_freq: &inv_freq,
            attention_factor: 1.0,
            positions: None,
        });
    }
    reference_attend(&a).y
}

#[test]
fn sixteen_bit_layers_equal_f32_layers_of_the_rounded_weights() {
    for isa in isas() {
        for (i, &shape) in SHAPES.iter().enumerate() {
            let weights = Weights::new(shape, 40 + i as u64);
            let cross = shape.memory != shape.d_model;
            let mut rng = Rng::new(7 + i as u64);
            // Few rows (the row path) and many (the tile path).
            for (b, t) in [(1, 1), (2, 3), (2, 29)] {
                let x = rng.vec(b * t * shape.d_model, 1.0);
                let s = t + 4;
                let m = rng.vec(b * s * shape.memory, 1.0);
                let memory = cross.then_some((m.as_slice(), s));
                for format in HALF_FORMATS {
                    let context = format!("{isa:?} {shape:?} {format:?} b {b} t {t}");
                    let rounded = weights.rounded(format);
                    let want = run(
                        &mut rounded.layer(isa, 1, WeightFormat::F32),
                        &x,
                        b,
                        t,
                        memory,
                    );
                    for threads in [1, 2, 3] {
                        let mut layer = weights.layer(isa, threads, format);
                        assert_eq!(layer.weight_format(), format);
                        let got = run(&mut layer, &x, b, t, memory);
                        assert_bits_eq(&got, &want, &format!("{context} threads {threads}"));
                    }
                    let reference = reference(&rounded, &x, b, t, memory);
                    assert_close(&want, &reference, ABS, REL, &context);
                }
            }
        }
    }
}

#[test]
fn decoding_with_16_bit_weights_equals_the_forward_pass() {
    for isa in isas() {
        let shape = SHAPES[1];
        let weights = Weights::new(shape, 3);
        let (b, t) = (2, 13);
        let x = Rng::new(11).vec(b * t * shape.d_model, 1.0);
        for format in HALF_FORMATS {
            for threads in [1, 2] {
                let mut layer = weights.layer(isa, threads, format);
                let full = layer
                    .forward(Tokens::new(&x, b, t, shape.d_model).unwrap())
                    .unwrap();
                let mut cache = layer.new_cache(b, t).unwrap();
                let mut steps = vec![0.0; full.len()];
                let d = shape.d_model;
                for j in 0..t {
                    let token: Vec<f32> = (0..b)
                        .flat_map(|bi| x[(bi * t + j) * d..][..d].iter().copied())
                        .collect();
                    let mut y = vec![0.0; b * d];
                    let out = Output::new(&mut y, b, 1, d).unwrap();
                    let tokens = Tokens::new(&token, b, 1, d).unwrap();
                    layer
                        .decode_into(tokens, &mut cache, AttendOptions::default(), out)
                        .unwrap();
                    for bi in 0..b {
                        steps[(bi * t + j) * d..][..d].copy_from_slice(&y[bi * d..][..d]);
                    }
                }
                let context = format!("{isa:?} {format:?} threads {threads}");
                assert_bits_eq(&steps, &full, &context);
            }
        }
    }
}

#[test]
fn packed_gemm_in_16_bits_equals_the_gemm_of_the_rounded_matrix() {
    let mut rng = Rng::new(21);
    for isa in isas() {
        for (m, k, n) in [
            (1, 1, 1),
            (2, 7, 33),
            (3, 300, 17),
            (40, 65, 97),
            (13, 520, 40),
        ] {
            let a = rng.vec(m * k, 1.0);
            let b = rng.vec(k * n, 1.0);
            for format in HALF_FORMATS {
                let packed = PackedB::from_row_major_as(isa, &b, k, n, format).unwrap();
                assert_eq!(packed.format(), format);
                let exact = PackedB::from_row_major(isa, &rounded_all(format, &b), k, n).unwrap();
                for threads in [1, 2] {
                    let (mut got, mut want) = (vec![0.0; m * n], vec![0.0; m * n]);
                    gemm(&a, m, &packed, &mut got, threads).unwrap();
                    gemm(&a, m, &exact, &mut want, threads).unwrap();
                    let context = format!("{isa:?} {format:?} m {m} k {k} n {n} threads {threads}");
                    assert_bits_eq(&got, &want, &context);
                }
            }
        }
    }
}

#[test]
fn a_16_bit_layer_holds_half_the_bytes() {
    let weights = Weights::new(SHAPES[1], 1); // no biases
    let f32_bytes = weights
        .layer(Isa::detect(), 1, WeightFormat::F32)
        .weight_bytes();
    for format in HALF_FORMATS {
        let layer = weights.layer(Isa::detect(), 1, format);
        assert_eq!(2 * layer.weight_bytes(), f32_bytes, "{format:?}");
    }
}

/// `Layer::weight_bytes` is the bytes of the four matrices in the layer's format, without the
/// biases or the packing's padding, whatever the instruction set; `packed_bytes` (what the
/// layer holds) is at least that plus the biases, and equal to it at widths of whole panels.
#[test]
fn weight_bytes_count_the_matrices_alone() {
    // D = Q = 60 (no panel width divides it), 6 query heads of 10, 2 key/value heads (KV = 20).
    let (d, kv) = (60, 20);
    let widths = Widths::self_attention(d, kv, d);
    let square: Vec<f32> = (0..d * d).map(|i| (i % 7) as f32 * 0.01).collect();
    let narrow: Vec<f32> = (0..d * kv).map(|i| (i % 5) as f32 * 0.01).collect();
    let projections = Projections::new(widths, &square, &narrow, &narrow, &square).unwrap();
    let biases = Biases {
        bq: Some(vec![0.1; d]),
        bk: Some(vec![0.1; kv]),
        bv: Some(vec![0.1; kv]),
        bo: Some(vec![0.1; d]),
    };
    // wq (60, 60) + wk (60, 20) + wv (60, 20) + wo (60, 60) = 3600 + 1200 + 1200 + 3600
    // = 9600 weights; the biases are 60 + 20 + 20 + 60 = 160 floats.
    let (weights, bias_bytes) = (9600, 160 * 4);
    for isa in isas() {
        for (format, bytes) in [
            (WeightFormat::F32, 4),
            (WeightFormat::Bf16, 2),
            (WeightFormat::F16, 2),
        ] {
            let layer = Layer::builder(projections, 6)
                .biases(biases.clone())
                .weight_format(format)
                .isa(isa)
                .threads(1)
                .build()
                .unwrap();
            let context = format!("{isa:?} {format:?}");
            assert_eq!(layer.weight_bytes(), weights * bytes, "{context}");
            assert!(
                layer.packed_bytes() >= weights * bytes + bias_bytes,
                "{context}: {}",
                layer.packed_bytes()
            );
        }
        // At D = KV = Q = 64 every panel is whole: the layer holds the matrices and biases.
        let w = vec![0.01; 64 * 64];
        let whole = Projections::new(Widths::self_attention(64, 64, 64), &w, &w, &w, &w).unwrap();
        let bo = Biases {
            bo: Some(vec![0.1; 64]),
            ..Biases::default()
        };
        let layer = Layer::builder(whole, 4)
            .biases(bo)
            .isa(isa)
            .threads(1)
            .build()
            .unwrap();
        assert_eq!(layer.weight_bytes(), 4 * 64 * 64 * 4, "{isa:?}");
        assert_eq!(layer.packed_bytes(), 4 * 64 * 64 * 4 + 64 * 4, "{isa:?}");
    }
}

#[test]
fn a_weight_that_rounds_to_infinity_is_an_error() {
    let shape = SHAPES[0];
    let mut weights = Weights::new(shape, 2);
    let build = |w: &Weights, format| w.builder().weight_format(format).build();
    weights.w[1][5] = 70000.0;
    let err = build(&weights, WeightFormat::F16).unwrap_err();
    assert_eq!(
        err,
        ShapeError::WeightRange {
            what: "key projection wk (E, KV)",
            index: 5,
            value: "70000".into(),
            format: "f16",
        }
    );
    assert_eq!(
        err.to_string(),
        "key projection wk (E, KV) element 5 is 70000, which is an infinity in f16"
    );
    // The largest binary16 is kept; bf16 and f32 hold 70000.
    weights.w[1][5] = 65504.0;
    assert!(build(&weights, WeightFormat::F16).is_ok());
    weights.w[1][5] = 70000.0;
    assert!(build(&weights, WeightFormat::Bf16).is_ok());
    // f32::MAX is past the largest bfloat16 after rounding.
    weights.w[3][0] = f32::MAX;
    let err = build(&weights, WeightFormat::Bf16).unwrap_err();
    assert!(
        matches!(
            err,
            ShapeError::WeightRange {
                what: "output projection wo (H·dv, D)",
                index: 0,
                format: "bf16",
                ..
            }
        ),
        "{err}"
    );
    assert!(weights.builder().build().is_ok());
    // Weights already non-finite are the user's, kept as they are.
    weights.w[1][5] = 0.5;
    weights.w[3][0] = f32::INFINITY;
    weights.w[0][1] = f32::NAN;
    for format in HALF_FORMATS {
        assert!(build(&weights, format).is_ok(), "{format:?}");
    }
    let err = PackedB::from_row_major_as(Isa::Portable, &[1.0, -1e6], 1, 2, WeightFormat::F16)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ShapeError::WeightRange {
                what: "matrix B (k, n)",
                index: 1,
                ..
            }
        ),
        "{err}"
    );
}

/// `outputs` rows of `inputs` values (whole blocks of 32) in random `q8_0` blocks, scale 0.01.
fn random_q8_0(rng: &mut Rng, inputs: usize, outputs: usize) -> WeightValues {
    let mut bytes = Vec::new();
    for _ in 0..outputs * inputs / 32 {
        bytes.extend(0x211fu16.to_le_bytes());
        bytes.extend((0..32).map(|_| (rng.next_u64() >> 56) as u8));
    }
    WeightValues::blocks(WeightFormat::Q8_0, inputs, bytes).unwrap()
}

/// `n` random 16-bit values of `format` (bf16 or f16), normal, of magnitude 2^-7 .. 2^-3.
fn random_half(rng: &mut Rng, format: WeightFormat, n: usize) -> WeightValues {
    // (exponent bits, mantissa bits, exponent field of 2^-7).
    let (exponent, mantissa, low) = match format {
        WeightFormat::Bf16 => (8, 7, 120),
        _ => (5, 10, 8),
    };
    let mut value = || {
        let r = rng.next_u64();
        let field = low + (r >> 40) % 4;
        (((r >> 63) << (exponent + mantissa)) | (field << mantissa) | (r & ((1 << mantissa) - 1)))
            as u16
    };
    let bits: Vec<u16> = (0..n).map(|_| value()).collect();
    match format {
        WeightFormat::Bf16 => WeightValues::Bf16(bits),
        _ => WeightValues::F16(bits),
    }
}

/// A layer keeping its matrices in their stored formats, mixed — `q8_0` blocks, bf16, f16,
/// `f32` — (self-attention whose Q is no whole panels, cross-attention, with biases) equals bit
/// for bit the `f32` layer of the matrices' values on every table, 1 and 3 threads, and holds
/// each matrix in its own format.
#[test]
fn mixed_stored_formats_equal_the_f32_layer_of_their_values() {
    use WeightFormat::{Bf16, F16, F32, Q8_0};
    let mut rng = Rng::new(21);
    let (b, t, s) = (2, 5, 7);
    // (D, E, KV, Q, heads), formats of wq, wk, wv, wo.
    let cases = [
        ((64, 64, 24, 72, 6), [Q8_0, Bf16, F16, F32]),
        ((64, 96, 24, 48, 4), [F16, Q8_0, F32, Bf16]),
        ((64, 64, 32, 64, 4), [Q8_0, Q8_0, Bf16, Q8_0]),
    ];
    for ((d, e, kv, q, h), formats) in cases {
        let widths = Widths {
            memory: e,
            ..Widths::self_attention(d, kv, q)
        };
        let shapes = [(d, q), (e, kv), (e, kv), (q, d)];
        let stored: Vec<WeightValues> = (0..4)
            .map(|i| {
                let (inputs, outputs) = shapes[i];
                match formats[i] {
                    Q8_0 => random_q8_0(&mut rng, inputs, outputs),
                    F32 => WeightValues::F32(rng.vec(inputs * outputs, 0.2)),
                    half => random_half(&mut rng, half, inputs * outputs),
                }
            })
            .collect();
        let values: Vec<Vec<f32>> = stored.iter().map(WeightValues::to_f32).collect();
        let biases = Biases {
            bq: Some(rng.vec(q, 0.1)),
            bv: Some(rng.vec(kv, 0.1)),
            ..Biases::default()
        };
        let x = rng.vec(b * t * d, 1.0);
        let memory = (e != d).then(|| rng.vec(b * s * e, 1.0));
        let memory = memory.as_deref().map(|m| (m, s));
        let stored_refs = [&stored[0], &stored[1], &stored[2], &stored[3]];
        let context = format!("{formats:?} E {e} Q {q}");
        for isa in isas() {
            let mut one_thread = None;
            for threads in [1, 3] {
                fn build<'a>(p: Projections<'a>, h: usize, biases: &Biases) -> LayerBuilder<'a> {
                    Layer::builder(p, h).biases(biases.clone())
                }
                let p = Projections::from_values(widths, stored_refs).unwrap();
                let got = build(p, h, &biases).isa(isa).threads(threads);
                let mut got = got.stored_weight_formats().build().unwrap();
                assert_eq!(got.weight_formats(), formats, "{context}");
                let elements = shapes.map(|(i, o)| i * o);
                let bytes: usize = (0..4).map(|i| format_bytes(formats[i], elements[i])).sum();
                assert_eq!(got.weight_bytes(), bytes, "{context}");
                let [wq, wk, wv, wo] = [0, 1, 2, 3].map(|i| &values[i][..]);
                let p = Projections::new(widths, wq, wk, wv, wo).unwrap();
                let want = build(p, h, &biases).isa(isa).threads(threads);
                let mut want = want.build().unwrap();
                let y = run(&mut got, &x, b, t, memory);
                let context = format!("{context} {isa:?} {threads} threads");
                assert_bits_eq(&y, &run(&mut want, &x, b, t, memory), &context);
                assert_bits_eq(&y, one_thread.get_or_insert_with(|| y.clone()), &context);
                if memory.is_none() {
                    let decoded = common::decode_token_by_token(&mut got, &x, (b, t), None);
                    assert_bits_eq(&decoded, &y, &format!("{context} decoded"));
                }
            }
        }
    }
}

/// The bytes of `elements` values in `format`.
fn format_bytes(format: WeightFormat, elements: usize) -> usize {
    (format.bytes_per_value() * elements as f64) as usize
}
