//! The run-time layer (`Layer`): widths chosen at run time, against the general f64 reference
//! (`tests/common`), on odd widths — grouped heads, heads not `D / H` wide, cross-attention
//! from memory of another width — with biases and masks; decoding equals the forward bit for
//! bit; the typed `Mha` built from the same weights gives the same bits; widths that disagree
//! are errors naming both numbers. Every supported instruction set, 1 and 2 threads.
//!
//! Tolerance: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{check_all, configs, Mask, Opts};
use common::{assert_bits_eq, random_layer, reference_attend, Attend, Rng};
use mha::{
    AttendOptions, Biases, Isa, Layer, Masking, Matrix, Mha, MhaParams, Output, Projections,
    ShapeError, Tokens, Widths,
};

/// Random weights of a layer of `widths` and their biases, owned.
struct RunTimeWeights {
    widths: Widths,
    matrices: [Vec<f32>; 4],
    biases: Biases,
}

impl RunTimeWeights {
    /// Weights uniform with variance `1 / fan-in`, biases uniform in [-0.5, 0.5).
    fn random(widths: Widths, seed: u64) -> Self {
        let (matrices, biases) = random_layer(&mut Rng::new(seed), widths);
        RunTimeWeights {
            widths,
            matrices,
            biases,
        }
    }

    fn projections(&self) -> Projections<'_> {
        let [wq, wk, wv, wo] = &self.matrices;
        Projections::new(self.widths, wq, wk, wv, wo).unwrap()
    }

    fn layer(&self, h: usize, masking: Masking, isa: Isa, threads: usize) -> Layer {
        Layer::builder(self.projections(), h)
            .masking(masking)
            .biases(self.biases.clone())
            .isa(isa)
            .threads(threads)
            .min_work_per_thread(0)
            .build()
            .unwrap()
    }

    /// The reference description of a call of `h` heads on `x (b, t, D)` (keys from
    /// `memory (b, s, E)` when given).
    fn attend<'a>(
        &'a self,
        (b, t, h): (usize, usize, usize),
        x: &'a [f32],
        memory: Option<(usize, &'a [f32])>,
        masking: Masking,
    ) -> Attend<'a> {
        let [wq, wk, wv, wo] = &self.matrices;
        let w = self.widths;
        let mut a = Attend::new(b, t, w.d_model, w.kv, h, x, [wq, wk, wv, wo]);
        a.qw = w.query;
        a.e = w.memory;
        if let Some((s, memory)) = memory {
            a.s = s;
            a.memory = Some(memory);
        }
        a.causal = masking == Masking::Causal;
        a.bq = self.biases.bq.as_deref();
        a.bk = self.biases.bk.as_deref();
        a.bv = self.biases.bv.as_deref();
        a.bo = self.biases.bo.as_deref();
        a
    }
}

/// Self-attention cases `(D, KV, Q, H)`: plain, grouped with 2 and 1 key/value heads, heads
/// wider than `D / H`, a width of one and a head count that crosses nothing.
const SELF_CASES: [(usize, usize, usize, usize); 5] = [
    (20, 20, 20, 4),
    (13, 6, 18, 6),
    (9, 3, 9, 3),
    (7, 2, 14, 7),
    (1, 1, 1, 1),
];

/// Forward passes with and without options, then token by token through a cache.
#[test]
fn self_attention_of_run_time_widths_matches_the_reference() {
    for (case, &(d, kv, q, h)) in SELF_CASES.iter().enumerate() {
        let w = RunTimeWeights::random(Widths::self_attention(d, kv, q), 10 + case as u64);
        let (b, t) = (2, 7 + case);
        let x = Rng::new(case as u64).vec(b * t * d, 1.0);
        let opts = Opts {
            key_lengths: Some(vec![t, t - 3]),
            mask: Some(Mask::Bool((0..t * t).map(|e| e % 5 != 2).collect())),
            ..Opts::default()
        };
        for masking in [Masking::Causal, Masking::Bidirectional] {
            for opts in [&Opts::default(), &opts] {
                let context = format!("D {d} KV {kv} Q {q} H {h} {masking:?}");
                let mut a = w.attend((b, t, h), &x, None, masking);
                opts.apply(&mut a);
                let want = reference_attend(&a);
                let run = |layer: &mut Layer, weights: Option<&mut mha::AttentionWeights>| {
                    let mut y = vec![f32::NAN; b * t * d];
                    let mut out = Output::new(&mut y, b, t, d)?;
                    if let Some(weights) = weights {
                        out = out.with_weights(weights);
                    }
                    let input = Tokens::new(&x, b, t, d)?;
                    layer.forward_into(input, opts.options(), out).map(|()| y)
                };
                let make = |isa, threads| w.layer(h, masking, isa, threads);
                check_all(&want, [b, h, t, t], make, run, &context);
            }
        }
        let mut layer = w.layer(h, Masking::Causal, Isa::detect(), 1);
        let forward = layer.forward(Tokens::new(&x, b, t, d).unwrap()).unwrap();
        let mut cache = layer.new_cache(b, t).unwrap();
        let mut decoded = vec![0.0; b * t * d];
        for step in 0..t {
            let token = common::batch_rows(&x, b, d, step..step + 1);
            let mut y = vec![0.0; b * d];
            let out = Output::new(&mut y, b, 1, d).unwrap();
            let input = Tokens::new(&token, b, 1, d).unwrap();
            layer
                .decode_into(input, &mut cache, AttendOptions::default(), out)
                .unwrap();
            for s in 0..b {
                decoded[(s * t + step) * d..][..d].copy_from_slice(&y[s * d..][..d]);
            }
        }
        assert_bits_eq(&decoded, &forward, &format!("D {d} Q {q}: decoded"));
    }
}

/// Cross-attention from memory of another width `E`, with key lengths.
#[test]
fn cross_attention_of_run_time_widths_matches_the_reference() {
    for (case, &(d, e, kv, q, h)) in [(10, 7, 4, 8, 4), (6, 11, 6, 6, 3)].iter().enumerate() {
        let widths = Widths {
            d_model: d,
            memory: e,
            kv,
            query: q,
            value: kv,
        };
        let w = RunTimeWeights::random(widths, 30 + case as u64);
        let (b, t, s) = (2, 5, 9);
        let mut rng = Rng::new(40 + case as u64);
        let (x, memory) = (rng.vec(b * t * d, 1.0), rng.vec(b * s * e, 1.0));
        let opts = Opts {
            key_lengths: Some(vec![4, 9]),
            ..Opts::default()
        };
        for masking in [Masking::Causal, Masking::Bidirectional] {
            let mut a = w.attend((b, t, h), &x, Some((s, &memory)), masking);
            opts.apply(&mut a);
            let want = reference_attend(&a);
            let run = |layer: &mut Layer, weights: Option<&mut mha::AttentionWeights>| {
                let mut y = vec![f32::NAN; b * t * d];
                let mut out = Output::new(&mut y, b, t, d)?;
                if let Some(weights) = weights {
                    out = out.with_weights(weights);
                }
                let (input, source) = (Tokens::new(&x, b, t, d)?, Tokens::new(&memory, b, s, e)?);
                layer
                    .cross_into(input, source, opts.options(), out)
                    .map(|()| y)
            };
            let make = |isa, threads| w.layer(h, masking, isa, threads);
            let context = format!("cross D {d} E {e} {masking:?}");
            check_all(&want, [b, h, t, s], make, run, &context);
        }
    }
}

/// The typed layer is the run-time layer: the same weights give the same bits through either,
/// for every call.
#[test]
fn typed_and_run_time_layers_give_the_same_bits() {
    const D: usize = 12;
    const KV: usize = 4;
    let w = RunTimeWeights::random(Widths::self_attention(D, KV, D), 7);
    let [wq, wk, wv, wo] = w.matrices.clone();
    let params = MhaParams::<D, D, KV>::from_parts(
        Matrix::from_vec(wq).unwrap(),
        Matrix::from_vec(wk).unwrap(),
        Matrix::from_vec(wv).unwrap(),
        Matrix::from_vec(wo).unwrap(),
    );
    let typed_biases = mha::MhaBiases::try_from(&w.biases).unwrap();
    let x = mha::Tensor::<2, 9, D>::from_fn(|b, t, i| ((b * 31 + t * 7 + i) % 13) as f32 * 0.1);
    for (isa, threads) in configs() {
        let mut typed = Mha::builder(&params, 6)
            .biases(typed_biases.clone())
            .isa(isa)
            .threads(threads)
            .min_work_per_thread(0)
            .build()
            .unwrap();
        let mut layer = w.layer(6, Masking::Causal, isa, threads);
        let context = format!("{isa:?} {threads} threads");
        let want = typed.forward(&x).unwrap();
        let got = layer.forward(&x).unwrap();
        assert_bits_eq(&got, want.as_slice(), &context);
        let (mut typed_cache, mut cache) = (
            typed.new_cache(2, 9).unwrap(),
            layer.new_cache(2, 9).unwrap(),
        );
        let mut want = mha::Tensor::<2, 9, D>::zeros();
        typed
            .decode_into(&x, &mut typed_cache, AttendOptions::default(), &mut want)
            .unwrap();
        let mut got = mha::Tensor::<2, 9, D>::zeros();
        layer
            .decode_into(&x, &mut cache, AttendOptions::default(), &mut got)
            .unwrap();
        assert_bits_eq(
            got.as_slice(),
            want.as_slice(),
            &format!("{context}: decode"),
        );
        // The layer's typed view is the same layer.
        let mut viewed = Mha::<D, D, KV>::try_from(layer).unwrap();
        assert_eq!(viewed.biases(), &typed_biases);
        assert_bits_eq(
            viewed.forward(&x).unwrap().as_slice(),
            typed.forward(&x).unwrap().as_slice(),
            &context,
        );
    }
}

/// Widths that disagree, at build time and at call time, are errors naming both numbers; a
/// failed call writes nothing.
#[test]
fn widths_that_disagree_are_errors() {
    let w = RunTimeWeights::random(Widths::self_attention(8, 4, 8), 3);
    let mut layer = w.layer(4, Masking::Causal, Isa::detect(), 1);
    let x = vec![0.5; 2 * 3 * 8];
    let mut y = vec![7.0; 2 * 3 * 8];
    let err = |e: ShapeError| e.to_string();
    let six = Tokens::new(&x, 2, 4, 6).unwrap();
    let out = Output::new(&mut y, 2, 3, 8).unwrap();
    let e = layer
        .forward_into(six, AttendOptions::default(), out)
        .unwrap_err();
    assert_eq!(err(e), "token width (D) is 6, but the call needs 8");
    let out = Output::new(&mut y, 2, 4, 6).unwrap();
    let input = Tokens::new(&x, 2, 3, 8).unwrap();
    let e = layer
        .forward_into(input, AttendOptions::default(), out)
        .unwrap_err();
    assert_eq!(err(e), "output width (D) is 6, but the call needs 8");
    let mut cache = layer.new_cache(2, 4).unwrap();
    let out = Output::new(&mut y, 2, 4, 6).unwrap();
    let e = layer
        .decode_into(six, &mut cache, AttendOptions::default(), out)
        .unwrap_err();
    assert_eq!(err(e), "token width (D) is 6, but the call needs 8");
    assert!(cache.is_empty());
    let out = Output::new(&mut y, 2, 3, 8).unwrap();
    let e = layer
        .cross_into(input, six, AttendOptions::default(), out)
        .unwrap_err();
    assert_eq!(err(e), "memory width (E) is 6, but the call needs 8");
    assert!(y.iter().all(|&v| v == 7.0), "nothing written");

    // A cross-attention layer (E = 5) has no self-attention calls.
    let widths = Widths {
        d_model: 8,
        memory: 5,
        kv: 4,
        query: 8,
        value: 4,
    };
    let cross = RunTimeWeights::random(widths, 4);
    let mut layer = cross.layer(4, Masking::Causal, Isa::detect(), 1);
    let e = layer
        .forward(Tokens::new(&x, 2, 3, 8).unwrap())
        .unwrap_err();
    assert_eq!(
        err(e),
        "memory width (E) for self-attention is 5, but the call needs 8"
    );
    // Typed views of another width, weights of the wrong length, biases of the wrong width.
    assert_eq!(
        err(Mha::<8, 8, 4>::try_from(layer).unwrap_err()),
        "converting a Layer to Mha<8, 8, 4, 8>: the layer's memory width (E) is 5, not 8 \
         (it converts to Mha<8, 5, 4, 8>)"
    );
    let [wq, wk, wv, _] = &w.matrices;
    let e = Projections::new(Widths::self_attention(8, 4, 8), wq, wk, wv, wk).unwrap_err();
    assert_eq!(
        err(e),
        "output projection wo (H·dv, D) needs 64 elements, but the buffer has 32"
    );
    let short = Biases {
        bk: Some(vec![0.0; 8]),
        ..Biases::default()
    };
    let e = Layer::builder(w.projections(), 4)
        .biases(short)
        .build()
        .unwrap_err();
    assert_eq!(
        err(e),
        "key bias bk (KV) needs 4 elements, but the buffer has 8"
    );
    let e = Layer::builder(w.projections(), 3).build().unwrap_err();
    assert_eq!(err(e), "d_model 8 is not divisible by n_heads 3");
}

/// `Mha::<D, E, KV, Q>::try_from(layer)` with widths that are not the layer's (here the
/// generic arguments in the wrong order) is an error that says it is a conversion and names
/// every width that differs, and the type the layer converts to.
#[test]
fn a_conversion_to_mha_of_other_widths_names_them() {
    // D = Q = 60, 6 query heads of 10 sharing 2 key/value heads (KV = 20).
    let w = RunTimeWeights::random(Widths::self_attention(60, 20, 60), 9);
    let layer = || w.layer(6, Masking::Causal, Isa::detect(), 1);
    let e = Mha::<60, 20, 60, 60>::try_from(layer()).unwrap_err();
    assert_eq!(
        e,
        ShapeError::TypedWidths {
            layer: [60, 60, 20, 60],
            typed: [60, 20, 60, 60],
        }
    );
    assert_eq!(
        e.to_string(),
        "converting a Layer to Mha<60, 20, 60, 60>: the layer's memory width (E) is 60, not 20; \
         its key/value width (KV) is 20, not 60 (it converts to Mha<60, 60, 20, 60>)"
    );
    let e = Mha::<20, 20, 20, 20>::try_from(layer()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "converting a Layer to Mha<20, 20, 20, 20>: the layer's model width (D) is 60, not 20; \
         its memory width (E) is 60, not 20; its query width (Q) is 60, not 20 \
         (it converts to Mha<60, 60, 20, 60>)"
    );
    let typed = Mha::<60, 60, 20, 60>::try_from(layer()).unwrap();
    assert_eq!((typed.n_heads(), typed.n_kv_heads()), (6, 2));
}

/// A layer of model width 0 builds, runs and gives no values.
#[test]
fn a_zero_width_layer_gives_nothing() {
    let widths = Widths::self_attention(0, 0, 0);
    let projections = Projections::new(widths, &[], &[], &[], &[]).unwrap();
    let mut layer = Layer::builder(projections, 2).build().unwrap();
    let y = layer.forward(Tokens::new(&[], 3, 5, 0).unwrap()).unwrap();
    assert!(y.is_empty());
}

/// ALiBi by rank among the real tokens (BLOOM's): the same bits as by index without a padding
/// mask and with left padding (the ranks shift a query's distances together); different with a
/// hole in the mask; and decoding with the mask of the keys so far gives the forward's bits.
/// (Against `transformers` itself: `tests/hf_models.rs`, `bloom_holes`.)
#[test]
fn alibi_by_rank_of_real_tokens() {
    let (d, h, b, t) = (12, 4, 2, 9);
    let w = RunTimeWeights::random(Widths::self_attention(d, d, d), 21);
    let layer = |positions| {
        Layer::builder(w.projections(), h)
            .alibi(mha::Alibi::Standard)
            .alibi_positions(positions)
            .threads(1)
            .build()
            .unwrap()
    };
    let (mut by_index, mut by_rank) = (
        layer(mha::AlibiPositions::Index),
        layer(mha::AlibiPositions::RealTokens),
    );
    assert_eq!(by_rank.alibi_positions(), mha::AlibiPositions::RealTokens);
    let x = Rng::new(22).vec(b * t * d, 1.0);
    let run = |layer: &mut Layer, mask: Option<&[bool]>| {
        let mut y = vec![0.0; b * t * d];
        let options = AttendOptions {
            key_padding_mask: mask,
            ..AttendOptions::default()
        };
        let (input, out) = (
            Tokens::new(&x, b, t, d).unwrap(),
            Output::new(&mut y, b, t, d).unwrap(),
        );
        layer.forward_into(input, options, out).unwrap();
        y
    };
    assert_bits_eq(
        &run(&mut by_rank, None),
        &run(&mut by_index, None),
        "no mask",
    );
    let left: Vec<bool> = (0..b * t).map(|i| i % t > 2 * (i / t)).collect();
    assert_bits_eq(
        &run(&mut by_rank, Some(&left)),
        &run(&mut by_index, Some(&left)),
        "left padding",
    );
    let holes: Vec<bool> = (0..b * t).map(|i| !matches!(i % t, 2 | 3 | 6)).collect();
    let forward = run(&mut by_rank, Some(&holes));
    assert_ne!(
        forward,
        run(&mut by_index, Some(&holes)),
        "a hole moves the ranks"
    );
    let mut cache = by_rank.new_cache(b, t).unwrap();
    let mut decoded = vec![0.0; b * t * d];
    for step in 0..t {
        let token = common::batch_rows(&x, b, d, step..step + 1);
        let mask: Vec<bool> = (0..b)
            .flat_map(|s| holes[s * t..][..=step].to_vec())
            .collect();
        let options = AttendOptions {
            key_padding_mask: Some(&mask),
            ..AttendOptions::default()
        };
        let mut y = vec![0.0; b * d];
        let (input, out) = (
            Tokens::new(&token, b, 1, d).unwrap(),
            Output::new(&mut y, b, 1, d).unwrap(),
        );
        by_rank
            .decode_into(input, &mut cache, options, out)
            .unwrap();
        for s in 0..b {
            decoded[(s * t + step) * d..][..d].copy_from_slice(&y[s * d..][..d]);
        }
    }
    assert_bits_eq(&decoded, &forward, "decoded with the mask so far");
}
