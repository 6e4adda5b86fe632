//! The run-time `Layer` with each setting of its builder (masking, scale, RoPE of each layout
//! and scaling, QK-norm of each span, sliding windows with rolling caches, ALiBi of both
//! placements, soft cap, sinks), every key and value format and weight format,
//! cross-attention, the typed `Mha` over the same settings, and a shared thread pool and an
//! executor; each on 1, 2 and 3 threads.
use std::sync::Arc;

use mha::*;

use crate::calls::{cross_calls, self_calls, Depth, Input};
use crate::layer::{
    base, bidirectional, full_rope, llama3, rope, yarn, Setup, Shape, Slopes, Weights,
};
use crate::{seed_of, show, Rng};

/// GQA: 4 query heads of 10 over 2 key/value heads, `Q = 40 ≠ D = 36`, 101 tokens (two
/// 96-row blocks, three of 48 or four of 32).
const GQA: Shape = Shape::of_self(2, 101, 36, 20, 40, 4);
/// MQA: 2 query heads of 80 over one (`Q = 160 ≠ D = 64`), 97 tokens.
const WIDE: Shape = Shape::of_self(1, 97, 64, 80, 160, 2);
/// 4 heads of 3, 3 sequences of 7 tokens.
const TINY: Shape = Shape::of_self(3, 7, 12, 12, 12, 4);
/// One token: 2 query heads of 10 over one.
const ONE: Shape = Shape::of_self(2, 1, 20, 10, 20, 2);
/// 200 tokens (three blocks), 2 heads of 24.
const LONG: Shape = Shape::of_self(1, 200, 48, 48, 48, 2);
/// 97 queries 24 wide over 131 memory tokens 18 wide, 4 query heads of 10 over 2.
const CROSS: Shape = Shape::of_self(2, 97, 24, 20, 40, 4).cross(131, 18);
/// 7 queries over one memory token 30 wide, 2 query heads of 5 over one.
const CROSS_SHORT: Shape = Shape::of_self(3, 7, 16, 5, 10, 2).cross(1, 30);

pub fn run() {
    for (name, shape, setup) in self_cases() {
        self_case(name, shape, &setup, Depth::Full);
    }
    for (name, shape, setup) in format_cases() {
        self_case(&name, shape, &setup, Depth::Light);
    }
    for (name, shape, setup, depth) in cross_cases() {
        cross_case(&name, shape, &setup, depth);
    }
    typed("typed");
    shared_threads("pool");
    executor("executor");
}

/// Random weights and input for the case `name`.
fn weights_and_input(name: &str, shape: &Shape) -> (Weights, Input) {
    let mut rng = Rng(seed_of(name));
    (
        Weights::random(shape.widths, &mut rng),
        Input::random(shape, &mut rng),
    )
}

/// A self-attention layer's calls on 1, 2 and 3 threads.
fn self_case(name: &str, shape: Shape, setup: &Setup, depth: Depth) {
    let (weights, input) = weights_and_input(name, &shape);
    for threads in 1..=3 {
        let mut layer = setup.build(&weights, &shape, threads);
        self_calls(&format!("{name} t{threads}"), &mut layer, &input, depth);
    }
}

/// A cross-attention layer's calls on 1, 2 and 3 threads.
fn cross_case(name: &str, shape: Shape, setup: &Setup, depth: Depth) {
    let (weights, input) = weights_and_input(name, &shape);
    for threads in 1..=3 {
        let mut layer = setup.build(&weights, &shape, threads);
        cross_calls(&format!("{name} t{threads}"), &mut layer, &input, depth);
    }
}

/// Each setting of the builder, alone and together, on shapes that cross blocks.
fn self_cases() -> Vec<(&'static str, Shape, Setup)> {
    let mut cases = vec![
        ("rt-gqa", GQA, base()),
        ("rt-gqa-bi", GQA, bidirectional()),
        ("rt-wide", WIDE, base()),
        ("rt-wide-bi", WIDE, bidirectional()),
        ("rt-tiny", TINY, base()),
        ("rt-tiny-bi", TINY, bidirectional()),
        ("rt-one", ONE, base()),
        ("rt-long-nobias", LONG, Setup::default()),
        ("scale0", GQA, base().scale(0.0)),
        ("scale1", TINY, bidirectional().scale(1.0)),
    ];
    cases.extend(rope_cases());
    cases.extend(score_cases());
    cases
}

/// RoPE of each layout and scaling, partial and none, and QK-norm of each span.
fn rope_cases() -> Vec<(&'static str, Shape, Setup)> {
    use QkNormSpan::{PerHead, Whole};
    use RopeScaling::Linear;
    let half = |dim, scaling| base().rope(rope(dim, RopeLayout::RotateHalf, scaling));
    let pairs = |dim, scaling| base().rope(rope(dim, RopeLayout::Interleaved, scaling));
    let none = RopeScaling::Default;
    let bidirectional_rope = bidirectional().rope(full_rope(8));
    vec![
        ("rope-half", GQA, half(10, none)),
        ("rope-interleaved", GQA, pairs(10, none)),
        ("rope-partial", GQA, half(6, none)),
        ("rope-partial-pairs", GQA, pairs(4, Linear { factor: 2.0 })),
        ("rope-zero", TINY, half(0, none)),
        ("rope-linear", GQA, half(10, Linear { factor: 4.0 })),
        ("rope-llama3", GQA, half(10, llama3())),
        ("rope-yarn", WIDE, half(80, yarn(true))),
        ("rope-yarn-notrunc", GQA, pairs(10, yarn(false))),
        ("rope-bi", GQA, bidirectional_rope),
        ("qknorm-head", GQA, base().qk_norm(PerHead, 1e-6)),
        ("qknorm-whole", GQA, base().qk_norm(Whole, 1e-5)),
        ("qknorm-eps0", TINY, base().qk_norm(Whole, 0.0)),
        ("qknorm-rope", WIDE, half(80, none).qk_norm(PerHead, 1e-6)),
    ]
}

/// Sliding windows (rolling caches), ALiBi, soft cap and sinks, and everything at once.
fn score_cases() -> Vec<(&'static str, Shape, Setup)> {
    use AlibiPositions::{Index, RealTokens};
    use Slopes::{Given, Standard};
    let window = |window| base().window(window);
    let gemma2 = window(7).softcap(20.0).scale(0.25).rope(full_rope(10));
    let gpt_oss = window(33)
        .sinks()
        .rope(rope(80, RopeLayout::RotateHalf, yarn(false)));
    let everything = window(40)
        .scale(0.2)
        .rope(rope(6, RopeLayout::Interleaved, RopeScaling::Default))
        .qk_norm(QkNormSpan::Whole, 1e-6)
        .alibi(Given, RealTokens)
        .softcap(5.0)
        .sinks()
        .kv(KvFormat::Bf16, KvFormat::Q8_0)
        .weights(WeightFormat::F16);
    vec![
        ("window5", GQA, window(5)),
        ("window96", LONG, window(96)),
        ("window100-rope", LONG, window(100).rope(full_rope(24))),
        ("window1", TINY, window(1)),
        ("alibi", GQA, base().alibi(Standard, Index)),
        ("alibi-ranks", GQA, base().alibi(Standard, RealTokens)),
        ("alibi-given-bi", TINY, bidirectional().alibi(Given, Index)),
        ("alibi-window", LONG, window(50).alibi(Standard, RealTokens)),
        ("softcap1", GQA, base().softcap(1.0)),
        ("softcap-gemma2", GQA, gemma2),
        ("sinks", GQA, base().sinks()),
        ("sinks-bi", TINY, bidirectional().sinks()),
        ("sinks-gpt-oss", WIDE, gpt_oss),
        ("everything", GQA, everything),
    ]
}

/// Every pair of key and value formats; each format on wide heads, rolling caches and heads
/// of 3; every weight format, alone and with reduced caches.
fn format_cases() -> Vec<(String, Shape, Setup)> {
    let mut cases = Vec::new();
    for keys in KvFormat::ALL {
        for values in KvFormat::ALL {
            let name = format!("kv-{}-{}", keys.name(), values.name());
            cases.push((name, GQA, base().kv(keys, values).rope(full_rope(10))));
        }
    }
    for format in KvFormat::ALL {
        let name = |what: &str| format!("kv-{what}-{}", format.name());
        let setup = base().kv(format, format);
        cases.push((name("wide"), WIDE, setup.clone()));
        cases.push((name("window"), LONG, setup.clone().window(40)));
        cases.push((name("tiny"), TINY, setup));
    }
    for format in [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16] {
        let name = |what: &str| format!("weights-{what}-{}", format.name());
        let setup = base().weights(format);
        let interleaved = rope(80, RopeLayout::Interleaved, RopeScaling::Default);
        cases.push((name("gqa"), GQA, setup.clone()));
        cases.push((name("wide"), WIDE, setup.clone().rope(interleaved)));
        cases.push((name("one"), ONE, setup.clone()));
        let reduced = setup.kv(KvFormat::Q8_0, KvFormat::F16).window(9);
        cases.push((name("kv"), GQA, reduced));
    }
    cases
}

/// Cross-attention with each setting that applies to it, every format.
fn cross_cases() -> Vec<(String, Shape, Setup, Depth)> {
    let case = |name: &str, shape, setup, depth| (name.to_string(), shape, setup, depth);
    let full = |name, shape, setup| case(name, shape, setup, Depth::Full);
    let alibi = bidirectional().alibi(Slopes::Standard, AlibiPositions::RealTokens);
    let qk_norm = bidirectional().qk_norm(QkNormSpan::PerHead, 1e-6);
    let mut cases = vec![
        full("cross", CROSS, base()),
        full("cross-bi", CROSS, bidirectional()),
        full("cross-short", CROSS_SHORT, base()),
        full("cross-short-bi", CROSS_SHORT, bidirectional()),
        full("cross-alibi", CROSS, alibi),
        full("cross-softcap-sinks", CROSS, base().softcap(3.0).sinks()),
        full("cross-qknorm", CROSS, qk_norm),
        full("cross-scale", CROSS_SHORT, base().scale(0.5)),
        full("cross-window", CROSS, base().window(9)),
    ];
    for format in KvFormat::ALL {
        let name = format!("cross-kv-{}", format.name());
        cases.push(case(
            &name,
            CROSS,
            bidirectional().kv(format, format),
            Depth::Light,
        ));
    }
    for format in [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16] {
        let name = format!("cross-weights-{}", format.name());
        cases.push(case(&name, CROSS, base().weights(format), Depth::Light));
    }
    cases
}

/// The settings of the typed case: every builder setting at once.
fn typed_setup() -> Setup {
    base()
        .scale(0.3)
        .window(20)
        .rope(rope(8, RopeLayout::RotateHalf, yarn(true)))
        .qk_norm(QkNormSpan::PerHead, 1e-6)
        .alibi(Slopes::Standard, AlibiPositions::RealTokens)
        .softcap(10.0)
        .sinks()
        .kv(KvFormat::F16, KvFormat::Bf16)
        .weights(WeightFormat::Bf16)
}

/// The typed `Mha` with every `MhaBuilder` setting (the GQA shape): forward, forward_into and
/// decode_into on tensors, then the layer it wraps; and a run-time layer viewed as an `Mha`.
fn typed(name: &str) {
    let (w, input) = weights_and_input(name, &GQA);
    let setup = typed_setup();
    let [wq, wk, wv, wo] = &w.matrices;
    let params =
        MhaParams::<36, 36, 20, 40>::from_parts(matrix(wq), matrix(wk), matrix(wv), matrix(wo));
    let x = Tensor::<2, 101, 36>::from_vec(input.x.clone()).unwrap();
    for threads in 1..=3 {
        let tag = format!("{name} t{threads}");
        let mut mha = typed_builder(&params, &w, &setup)
            .threads(threads)
            .min_work_per_thread(0)
            .build()
            .unwrap();
        show(
            &format!("{tag} forward"),
            mha.forward(&x).unwrap().as_slice(),
        );
        let mut y = Tensor::<2, 101, 36>::zeros();
        mha.forward_into(&x, AttendOptions::default(), &mut y)
            .unwrap();
        show(&format!("{tag} forward_into"), y.as_slice());
        show(&format!("{tag} decode"), &typed_decode(&mut mha, &x));
        self_calls(
            &format!("{tag} layer"),
            &mut mha.into_layer(),
            &input,
            Depth::Light,
        );
        let layer = setup.build(&w, &GQA, threads);
        let mut view = Mha::<36, 36, 20, 40>::try_from(layer).unwrap();
        show(&format!("{tag} view"), view.forward(&x).unwrap().as_slice());
    }
}

/// `values` as a typed matrix.
fn matrix<const R: usize, const C: usize>(values: &[f32]) -> Matrix<R, C> {
    Matrix::from_vec(values.to_vec()).unwrap()
}

/// `setup` through the typed builder.
fn typed_builder<'p>(
    params: &'p MhaParams<36, 36, 20, 40>,
    w: &Weights,
    setup: &Setup,
) -> MhaBuilder<'p, 36, 36, 20, 40> {
    let (slopes, positions) = setup.alibi.unwrap();
    Mha::builder(params, GQA.h)
        .biases(MhaBiases::try_from(&w.biases).unwrap())
        .scale(setup.scale.unwrap())
        .sliding_window(setup.window.unwrap())
        .rope(setup.rope.unwrap())
        .qk_norm(setup.qk_norm_of(&GQA).unwrap())
        .alibi(crate::layer::alibi(slopes, GQA.h))
        .alibi_positions(positions)
        .softcap(setup.softcap.unwrap())
        .sinks(crate::layer::sinks(GQA.h))
        .kv_format(KvFormat::Q8_0)
        .key_format(setup.keys)
        .value_format(setup.values)
        .weight_format(setup.weights)
}

/// Token by token through a typed layer's (rolling) cache.
fn typed_decode(mha: &mut Mha<36, 36, 20, 40>, x: &Tensor<2, 101, 36>) -> Vec<f32> {
    let mut cache = mha.new_cache(2, 1).unwrap();
    let mut all = Vec::new();
    for t in 0..GQA.t {
        let token = Tensor::<2, 1, 36>::from_fn(|b, _, i| x[(b, t, i)]);
        let mut y = Tensor::<2, 1, 36>::zeros();
        mha.decode_into(&token, &mut cache, AttendOptions::default(), &mut y)
            .unwrap();
        all.extend_from_slice(y.as_slice());
    }
    all
}

/// Two layers on one shared `ThreadPool` of 1, 2 and 3 threads, their calls interleaved.
fn shared_threads(name: &str) {
    let (w, input) = weights_and_input(name, &GQA);
    let setups = [typed_setup(), base().rope(full_rope(10))];
    for threads in 1..=3 {
        let pool = ThreadPool::new(threads);
        let mut layers: Vec<Layer> = setups
            .iter()
            .map(|s| s.build_with(&w, &GQA, |b| b.thread_pool(&pool).min_work_per_thread(0)))
            .collect();
        for round in 0..2 {
            for (i, layer) in layers.iter_mut().enumerate() {
                self_calls(
                    &format!("{name} t{threads} layer{i} round{round}"),
                    layer,
                    &input,
                    Depth::Light,
                );
            }
        }
    }
}

/// Lends scoped threads of its own, as a program's executor would.
struct Scoped;
impl Executor for Scoped {
    fn run(&self, copies: usize, job: &(dyn Fn() + Sync)) {
        std::thread::scope(|s| {
            for _ in 1..copies {
                s.spawn(job);
            }
            job();
        });
    }
}

/// A layer on an executor's threads, 1, 2 and 3 of them.
fn executor(name: &str) {
    let (w, input) = weights_and_input(name, &GQA);
    for threads in 1..=3 {
        let setup = typed_setup();
        let mut layer = setup.build_with(&w, &GQA, |b| {
            b.executor(Arc::new(Scoped))
                .threads(threads)
                .min_work_per_thread(0)
        });
        self_calls(
            &format!("{name} t{threads}"),
            &mut layer,
            &input,
            Depth::Light,
        );
    }
}
