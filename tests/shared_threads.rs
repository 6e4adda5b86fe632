//! Threads shared by many layers: a [`ThreadPool`] that a 32-layer model runs on (the process
//! keeps the pool's workers and no more), and an [`Executor`] that lends the program's own
//! threads. Every output is bit-identical to the same layers on one thread of their own.
//!
//! The tests of this file run one at a time (`serial`), so that counting the process's worker
//! threads sees only the current test's. The pool and the executor exist only with the `std`
//! feature.
#![cfg(feature = "std")]

mod common;

use std::sync::Arc;

use common::modes::{input, Weights};
use common::threads::{assert_workers, serial};
use common::{assert_bits_eq, batch_rows};
use mha::{
    AttendOptions, Executor, Isa, KvCache, Masking, Mha, MhaBuilder, Output, Rope, RopeLayout,
    RopeScaling, ThreadPool, Tokens,
};

const B: usize = 2;
const D: usize = 64;
/// Key/value width: 8 query heads of 8 over 4 key/value heads.
const KV: usize = 32;
const HEADS: usize = 8;
const PREFILL: usize = 20;
const STEPS: usize = 4;
const LAYERS: usize = 32;

type Layer = Mha<D, D, KV, D>;

/// The weights of layer `l` of the test model.
fn weights(l: usize) -> Weights<D, D, KV> {
    Weights::random(
        100 + l as u64,
        [l.is_multiple_of(2), true, false, l.is_multiple_of(3)],
    )
}

/// Layer `l`'s builder: grouped-query attention with RoPE, every phase on every thread.
fn builder(w: &Weights<D, D, KV>, threads: usize) -> MhaBuilder<'_, D, D, KV, D> {
    let rope = Rope {
        theta: 10_000.0,
        rotary_dim: 8,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    };
    w.builder(HEADS, Masking::Causal, Isa::detect(), threads)
        .rope(rope)
}

/// The model's output after the prefill and after each decoding step: every layer's output is
/// the next one's input (attention only, no residual).
fn run_model(layers: &mut [Layer]) -> Vec<Vec<f32>> {
    let x = input::<B, { PREFILL + STEPS }, D>(7);
    let mut caches: Vec<KvCache> = layers
        .iter()
        .map(|l| l.new_cache(B, PREFILL + STEPS).unwrap())
        .collect();
    let steps = [(0, PREFILL)]
        .into_iter()
        .chain((PREFILL..PREFILL + STEPS).map(|t| (t, 1)));
    let mut outputs = Vec::new();
    for (start, len) in steps {
        let mut h = batch_rows(x.as_slice(), B, D, start..start + len);
        for (layer, cache) in layers.iter_mut().zip(&mut caches) {
            let mut out = vec![f32::NAN; B * len * D];
            let tokens = Tokens::new(&h, B, len, D).unwrap();
            let output = Output::new(&mut out, B, len, D).unwrap();
            layer
                .decode_into(tokens, cache, AttendOptions::default(), output)
                .unwrap();
            h = out;
        }
        outputs.push(h);
    }
    outputs
}

fn assert_same_outputs(got: &[Vec<f32>], want: &[Vec<f32>], context: &str) {
    for (step, (got, want)) in got.iter().zip(want).enumerate() {
        assert_bits_eq(got, want, &format!("{context}, step {step}"));
    }
}

#[test]
fn a_32_layer_model_runs_on_one_pool_of_n_threads() {
    let _serial = serial();
    assert_workers(0, "no worker before the test");
    let all: Vec<_> = (0..LAYERS).map(weights).collect();
    let want = run_model(
        &mut all
            .iter()
            .map(|w| builder(w, 1).build().unwrap())
            .collect::<Vec<_>>(),
    );
    assert_workers(0, "one-thread layers start no worker");
    for threads in [2, 3, 5] {
        let pool = ThreadPool::new(threads);
        assert_eq!(pool.threads(), threads);
        let mut layers: Vec<Layer> = all
            .iter()
            .map(|w| builder(w, 1).thread_pool(&pool).build().unwrap())
            .collect();
        assert!(layers.iter().all(|l| l.threads() == threads));
        let got = run_model(&mut layers);
        assert_same_outputs(&got, &want, &format!("pool of {threads}"));
        // The calling thread and threads - 1 workers, whatever the layer count.
        assert_workers(threads - 1, "the pool's workers, shared by 32 layers");
        drop(layers);
        assert_workers(threads - 1, "the pool's handle keeps its workers");
        drop(pool);
        assert_workers(0, "joined with the last handle");
    }
}

#[test]
fn the_last_layer_of_a_pool_joins_its_workers() {
    let _serial = serial();
    assert_workers(0, "no worker before the test");
    let w = weights(0);
    let mut layers: Vec<Layer> = {
        let pool = ThreadPool::new(3);
        (0..2)
            .map(|_| builder(&w, 1).thread_pool(&pool).build().unwrap())
            .collect()
    };
    run_model(&mut layers);
    assert_workers(2, "two workers for the pool of 3");
    layers.pop();
    assert_workers(2, "one layer still holds the pool");
    layers.pop();
    assert_workers(0, "joined with the last layer");
}

/// Layers on two threads of the program at once, sharing one pool: they take turns, and each
/// gets the bits of a one-thread layer.
#[test]
fn two_callers_share_a_pool() {
    let _serial = serial();
    let all: Vec<_> = (0..4).map(weights).collect();
    let want = run_model(
        &mut all
            .iter()
            .map(|w| builder(w, 1).build().unwrap())
            .collect::<Vec<_>>(),
    );
    let pool = ThreadPool::new(3);
    std::thread::scope(|s| {
        for caller in 0..2 {
            let (all, want, pool) = (&all, &want, &pool);
            s.spawn(move || {
                for round in 0..5 {
                    let mut layers: Vec<Layer> = all
                        .iter()
                        .map(|w| builder(w, 1).thread_pool(pool).build().unwrap())
                        .collect();
                    let context = format!("caller {caller} round {round}");
                    assert_same_outputs(&run_model(&mut layers), want, &context);
                }
            });
        }
    });
    assert_workers(2, "one pool's workers for both callers");
}

/// An executor on `std::thread::scope` that makes at most `calls` calls of each job.
struct Scoped {
    calls: usize,
}

impl Executor for Scoped {
    fn run(&self, copies: usize, job: &(dyn Fn() + Sync)) {
        let calls = self.calls.min(copies);
        std::thread::scope(|s| {
            for _ in 1..calls {
                s.spawn(job);
            }
            if calls > 0 {
                job();
            }
        });
    }
}

#[test]
fn an_executor_gives_the_bits_of_one_thread() {
    let _serial = serial();
    let all: Vec<_> = (0..3).map(weights).collect();
    let want = run_model(
        &mut all
            .iter()
            .map(|w| builder(w, 1).build().unwrap())
            .collect::<Vec<_>>(),
    );
    for calls in [0, 1, 2, 8] {
        for threads in [2, 3, 8] {
            let executor: Arc<dyn Executor> = Arc::new(Scoped { calls });
            let mut layers: Vec<Layer> = all
                .iter()
                .map(|w| {
                    builder(w, threads)
                        .executor(Arc::clone(&executor))
                        .build()
                        .unwrap()
                })
                .collect();
            let got = run_model(&mut layers);
            let context = format!("executor making {calls} calls, {threads} threads");
            assert_same_outputs(&got, &want, &context);
        }
    }
    assert_workers(0, "an executor's layers start no worker of their own");
}
