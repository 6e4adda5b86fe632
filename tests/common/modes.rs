//! Crate-facing helpers for the attention-mode tests: random weights with their flat copies
//! for the reference, owned per-call options, and the checks every mode runs on every
//! supported instruction set and thread counts 1 and 2.
//!
//! Tolerance against the f64 reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise for
//! outputs and probabilities (inputs uniform in [-1, 1), weights uniform with variance 1/fan-in,
//! so everything is O(1)).

use mha::{AttendOptions, AttentionWeights, AttnMask, Isa, Masking, Matrix, Mha, MhaBuilder};
use mha::{KvFormat, Layer, MhaBiases, MhaParams, Output, QkNorm, QkNormSpan, ShapeError, Tensor};

use super::{assert_bits_eq, assert_close, Attend, RefMask, RefOut, Rng};
use super::{decode_token_by_token, forward_at};

/// Both attention modes, for tests that run each case under either.
pub const BOTH: [Masking; 2] = [Masking::Causal, Masking::Bidirectional];

/// Absolute tolerance against the f64 reference.
pub const ABS: f64 = 1e-4;
/// Relative tolerance against the f64 reference.
pub const REL: f64 = 1e-4;

/// Every (supported instruction set, thread count) pair the mode tests run.
pub fn configs() -> Vec<(Isa, usize)> {
    let mut out = Vec::new();
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        for threads in [1, 2] {
            out.push((isa, threads));
        }
    }
    assert!(!out.is_empty(), "no supported instruction set");
    out
}

/// Random weights (and optional biases) for a layer `Mha<D, E, KV, Q>`, with flat copies.
pub struct Weights<const D: usize, const E: usize, const KV: usize, const Q: usize = D> {
    pub params: MhaParams<D, E, KV, Q>,
    pub biases: MhaBiases<D, KV, Q>,
    /// The layer's softmax scale; `None`: the default `1/√d`.
    pub scale: Option<f32>,
    /// The layer's QK-norm.
    pub qk_norm: Option<QkNorm>,
}

impl<const D: usize, const E: usize, const KV: usize, const Q: usize> Weights<D, E, KV, Q> {
    /// Weights uniform with variance `1 / fan-in`; biases (those flagged in `bq, bk, bv, bo`
    /// order) uniform in [-0.5, 0.5).
    pub fn random(seed: u64, biases: [bool; 4]) -> Self {
        let mut rng = Rng::new(seed);
        let mut m = |r: usize, c: usize| rng.vec(r * c, (3.0 / r as f32).sqrt());
        let params = MhaParams::from_parts(
            Matrix::from_vec(m(D, Q)).unwrap(),
            Matrix::from_vec(m(E, KV)).unwrap(),
            Matrix::from_vec(m(E, KV)).unwrap(),
            Matrix::from_vec(m(Q, D)).unwrap(),
        );
        let mut row = |on: bool, n: usize| on.then(|| rng.vec(n, 0.5));
        let biases = MhaBiases {
            bq: row(biases[0], Q).map(|v| Matrix::from_vec(v).unwrap()),
            bk: row(biases[1], KV).map(|v| Matrix::from_vec(v).unwrap()),
            bv: row(biases[2], KV).map(|v| Matrix::from_vec(v).unwrap()),
            bo: row(biases[3], D).map(|v| Matrix::from_vec(v).unwrap()),
        };
        Weights {
            params,
            biases,
            scale: None,
            qk_norm: None,
        }
    }

    /// The reference description of a call of `h` heads: `x (b, t, D)`, keys from `memory
    /// (b, s, E)` or from `x`.
    pub fn attend<'a>(
        &'a self,
        b: usize,
        t: usize,
        h: usize,
        x: &'a [f32],
        memory: Option<(usize, &'a [f32])>,
        masking: Masking,
    ) -> Attend<'a> {
        let p = &self.params;
        let w = [
            p.wq.as_slice(),
            p.wk.as_slice(),
            p.wv.as_slice(),
            p.wo.as_slice(),
        ];
        let mut a = Attend::new(b, t, D, KV, h, x, w);
        a.qw = Q;
        if let Some((s, memory)) = memory {
            a.s = s;
            a.e = E;
            a.memory = Some(memory);
        }
        a.causal = masking == Masking::Causal;
        a.scale = self.scale;
        a.qk_norm = self.qk_norm.as_ref();
        let bias = &self.biases;
        a.bq = bias.bq.as_ref().map(|m| m.as_slice());
        a.bk = bias.bk.as_ref().map(|m| m.as_slice());
        a.bv = bias.bv.as_ref().map(|m| m.as_slice());
        a.bo = bias.bo.as_ref().map(|m| m.as_slice());
        a
    }

    /// A layer with these weights, biases and settings.
    pub fn layer(&self, h: usize, masking: Masking, isa: Isa, threads: usize) -> Mha<D, E, KV, Q> {
        self.builder(h, masking, isa, threads)
            .build()
            .expect("valid layer")
    }

    /// The builder of [`Weights::layer`], for further settings.
    pub fn builder(
        &self,
        h: usize,
        masking: Masking,
        isa: Isa,
        threads: usize,
    ) -> MhaBuilder<'_, D, E, KV, Q> {
        let mut builder = Mha::builder(&self.params, h);
        if let Some(scale) = self.scale {
            builder = builder.scale(scale);
        }
        if let Some(norm) = &self.qk_norm {
            builder = builder.qk_norm(norm.clone());
        }
        builder
            .masking(masking)
            .biases(self.biases.clone())
            .isa(isa)
            .threads(threads)
            .min_work_per_thread(0)
    }
}

/// An owned general mask.
#[derive(Clone, Debug)]
pub enum Mask {
    Bool(Vec<bool>),
    Additive(Vec<f32>),
}

/// Owned per-call options.
#[derive(Clone, Debug, Default)]
pub struct Opts {
    pub key_lengths: Option<Vec<usize>>,
    pub key_padding_mask: Option<Vec<bool>>,
    pub mask: Option<Mask>,
}

impl Opts {
    /// The crate's options borrowing these.
    pub fn options(&self) -> AttendOptions<'_> {
        AttendOptions {
            key_lengths: self.key_lengths.as_deref(),
            key_padding_mask: self.key_padding_mask.as_deref(),
            mask: self.mask.as_ref().map(|m| match m {
                Mask::Bool(m) => AttnMask::Bool(m),
                Mask::Additive(m) => AttnMask::Additive(m),
            }),
            ..AttendOptions::default()
        }
    }

    /// Adds these options to a reference description.
    pub fn apply<'a>(&'a self, a: &mut Attend<'a>) {
        a.key_lengths = self.key_lengths.as_deref();
        a.key_padding_mask = self.key_padding_mask.as_deref();
        a.mask = self.mask.as_ref().map(|m| match m {
            Mask::Bool(m) => RefMask::Bool(m),
            Mask::Additive(m) => RefMask::Additive(m),
        });
    }
}

/// Checks attention probabilities against the reference: shape, values within tolerance, every
/// row summing to the reference's sum (1, or less with a sink) or all zero (exactly zero where
/// the reference row is), the mean over heads.
pub fn check_weights(got: &AttentionWeights, want: &RefOut, shape: [usize; 4], context: &str) {
    let [b, h, t, s] = shape;
    assert_eq!(got.shape(), shape, "{context}: weights shape");
    assert_close(
        got.as_slice(),
        &want.probs,
        ABS,
        REL,
        &format!("{context}: weights"),
    );
    for row in 0..b * h * t {
        let got_row = &got.as_slice()[row * s..][..s];
        let want_row = &want.probs[row * s..][..s];
        let sum: f64 = got_row.iter().map(|&p| p as f64).sum();
        if want_row.iter().all(|&p| p == 0.0) {
            assert!(
                got_row.iter().all(|&p| p == 0.0),
                "{context}: row {row} sees no key but has weights {got_row:?}"
            );
        } else {
            let want_sum: f64 = want_row.iter().sum();
            assert!(
                (sum - want_sum).abs() < 1e-5,
                "{context}: row {row} sums to {sum}, want {want_sum}"
            );
        }
        for (j, (&g, &w)) in got_row.iter().zip(want_row).enumerate() {
            if w == 0.0 {
                assert_eq!(g, 0.0, "{context}: row {row} key {j} is hidden");
            }
        }
    }
    let mean = got.mean_over_heads();
    assert_eq!(mean.len(), b * t * s, "{context}: mean_over_heads length");
    let mut want_mean = vec![0.0; b * t * s];
    for bi in 0..b {
        for hi in 0..h {
            for e in 0..t * s {
                want_mean[bi * t * s + e] += want.probs[(bi * h + hi) * t * s + e] / h as f64;
            }
        }
    }
    assert_close(
        &mean,
        &want_mean,
        ABS,
        REL,
        &format!("{context}: mean_over_heads"),
    );
    for bi in 0..b {
        for hi in 0..h {
            let head = got.head(bi, hi).expect("head in range");
            assert_eq!(head, &got.as_slice()[(bi * h + hi) * t * s..][..t * s]);
        }
    }
}

/// Runs `run` (one call of the layer) for every configuration, with and without attention
/// weights: outputs within tolerance of `want`, bit-identical across thread counts (within one
/// instruction set: FMA and non-FMA kernels round differently) and with or without weights,
/// and the weights checked. Returns the output of the first configuration.
pub fn check_all<L>(
    want: &RefOut,
    shape: [usize; 4],
    mut make: impl FnMut(Isa, usize) -> L,
    mut run: impl FnMut(&mut L, WeightsOut<'_>) -> Result<Vec<f32>, ShapeError>,
    context: &str,
) -> Vec<f32> {
    let mut first: Option<Vec<f32>> = None;
    let mut first_of_isa: Option<(Isa, Vec<f32>)> = None;
    for (isa, threads) in configs() {
        let context = format!("{context} {isa:?} threads {threads}");
        let mut layer = make(isa, threads);
        let y = run(&mut layer, None).unwrap_or_else(|e| panic!("{context}: {e}"));
        assert_close(&y, &want.y, ABS, REL, &context);
        let mut weights = AttentionWeights::new();
        let with = run(&mut layer, Some(&mut weights)).unwrap();
        assert_bits_eq(
            &with,
            &y,
            &format!("{context}: output with weights requested"),
        );
        check_weights(&weights, want, shape, &context);
        match &first_of_isa {
            Some((same, f)) if *same == isa => {
                assert_bits_eq(&y, f, &format!("{context}: vs 1 thread"));
            }
            _ => first_of_isa = Some((isa, y.clone())),
        }
        first.get_or_insert(y);
    }
    first.expect("at least one configuration")
}

/// The optional weights buffer handed to one run of [`check_all`].
pub type WeightsOut<'a> = Option<&'a mut AttentionWeights>;

/// `out` as a call's output, asking for the weights when given.
pub fn output<'a, const B: usize, const T: usize, const D: usize>(
    out: &'a mut Tensor<B, T, D>,
    weights: WeightsOut<'a>,
) -> Output<'a> {
    match weights {
        Some(w) => Output::from(out).with_weights(w),
        None => Output::from(out),
    }
}

/// Self-attention through `forward_into`, checked by [`check_all`] against the reference.
pub fn check_self<
    const B: usize,
    const T: usize,
    const D: usize,
    const KV: usize,
    const Q: usize,
>(
    w: &Weights<D, D, KV, Q>,
    h: usize,
    masking: Masking,
    x: &Tensor<B, T, D>,
    opts: &Opts,
    context: &str,
) -> Vec<f32> {
    let mut a = w.attend(B, T, h, x.as_slice(), None, masking);
    opts.apply(&mut a);
    let want = super::reference_attend(&a);
    let context = format!("{context} self B{B} T{T} D{D} KV{KV} Q{Q} H{h} {masking:?}");
    check_all(
        &want,
        [B, h, T, T],
        |isa, threads| w.layer(h, masking, isa, threads),
        |layer, weights| {
            let mut out = Tensor::<B, T, D>::from_fn(|_, _, _| f32::NAN);
            layer.forward_into(x, opts.options(), output(&mut out, weights))?;
            Ok(out.into_vec())
        },
        &context,
    )
}

/// Cross-attention through `cross_into`, checked by [`check_all`] against the reference.
#[allow(clippy::too_many_arguments)]
pub fn check_cross<
    const B: usize,
    const T: usize,
    const S: usize,
    const D: usize,
    const E: usize,
    const KV: usize,
    const Q: usize,
>(
    w: &Weights<D, E, KV, Q>,
    h: usize,
    masking: Masking,
    x: &Tensor<B, T, D>,
    memory: &Tensor<B, S, E>,
    opts: &Opts,
    context: &str,
) -> Vec<f32> {
    let mut a = w.attend(B, T, h, x.as_slice(), Some((S, memory.as_slice())), masking);
    opts.apply(&mut a);
    let want = super::reference_attend(&a);
    let context = format!("{context} cross B{B} T{T} S{S} D{D} E{E} KV{KV} Q{Q} H{h} {masking:?}");
    check_all(
        &want,
        [B, h, T, S],
        |isa, threads| w.layer(h, masking, isa, threads),
        |layer, weights| {
            let mut out = Tensor::<B, T, D>::from_fn(|_, _, _| f32::NAN);
            layer.cross_into(x, memory, opts.options(), output(&mut out, weights))?;
            Ok(out.into_vec())
        },
        &context,
    )
}

/// A norm of `span` for heads of `head_dim`, `n_heads` query and `n_kv` key heads, with
/// weights uniform in [0.5, 1.5) from `seed`.
pub fn qk_norm(
    span: QkNormSpan,
    head_dim: usize,
    n_heads: usize,
    n_kv: usize,
    eps: f32,
    seed: u64,
) -> QkNorm {
    let mut rng = Rng::new(seed);
    let (q, k) = match span {
        QkNormSpan::PerHead => (head_dim, head_dim),
        QkNormSpan::Whole => (n_heads * head_dim, n_kv * head_dim),
    };
    let mut weight = |n| rng.vec(n, 0.5).into_iter().map(|w| w + 1.0).collect();
    QkNorm {
        span,
        q_weight: weight(q),
        k_weight: weight(k),
        eps,
    }
}

/// Random `(B, T, D)` input in [-1, 1).
pub fn input<const B: usize, const T: usize, const D: usize>(seed: u64) -> Tensor<B, T, D> {
    Tensor::from_vec(Rng::new(seed).vec(B * T * D, 1.0)).unwrap()
}

/// The layer `build(isa, threads, cache format)` makes, on every supported instruction set and
/// thread count: the forward of `x (b, t, D)` at `positions` within the tolerance of `want`,
/// decoding token by token bit-identical to it, 3 threads bit-identical to 1; then bf16 and
/// q8_0 caches decoding bit-identical to their forward.
pub fn check_every_table(
    build: impl Fn(Isa, usize, KvFormat) -> Layer,
    x: &[f32],
    (b, t): (usize, usize),
    positions: Option<&[usize]>,
    want: &[f64],
    context: &str,
) {
    let mut first = None;
    for (isa, threads) in configs() {
        let mut layer = build(isa, threads, KvFormat::F32);
        let y = forward_at(&mut layer, x, (b, t), positions);
        assert_close(&y, want, ABS, REL, context);
        let decoded = decode_token_by_token(&mut layer, x, (b, t), positions);
        assert_bits_eq(&decoded, &y, &format!("{context} decoded"));
        if threads == 1 {
            let mut three = build(isa, 3, KvFormat::F32);
            let y3 = forward_at(&mut three, x, (b, t), positions);
            assert_bits_eq(&y3, &y, &format!("{context} 3 threads"));
        }
        first.get_or_insert(isa);
    }
    for format in [KvFormat::Bf16, KvFormat::Q8_0] {
        let mut layer = build(first.unwrap(), 2, format);
        let y = forward_at(&mut layer, x, (b, t), positions);
        let decoded = decode_token_by_token(&mut layer, x, (b, t), positions);
        assert_bits_eq(&decoded, &y, &format!("{context} {format:?}"));
    }
}
