//! One scratch per pool: layers that share a [`ThreadPool`] share one workspace, sized by the
//! largest call any of them made. Layers of different shapes — widths, heads, a sliding window
//! and RoPE; an output gate, value heads of another width and bf16 keys and values; an MLA
//! layer — take turns on one pool with interleaved forward, decode and paged decode calls, and
//! every output is bit-identical to the same layers with threads and scratch of their own, on
//! 1 and 3 threads; a released workspace (through the pool or a layer) grows again with the
//! same bits; two threads of the program calling layers on one pool take turns call by call,
//! also while a third releases the scratch.
#![cfg(feature = "std")]

mod common;

use common::{assert_bits_eq, Rng};
use mha::{
    AttendOptions, GateActivation, GateSpan, KvCache, KvFormat, Layer, MlaLayer, MlaShape,
    MlaWeights, Output, OutputGate, PagedCache, Projections, Rope, RopeLayout, RopeScaling,
    ThreadPool, Tokens, Widths,
};

/// Layer A: D 24, 6 query heads of 4 over 2 key/value heads, RoPE, a window of 16.
const A_WIDTHS: (usize, usize, usize) = (24, 8, 24);
/// Layer B: D 20, 4 query heads of 6 over 2 key/value heads, value heads of 10, a gate.
const B_HEADS: (usize, usize, usize, usize) = (4, 2, 6, 10);
const B_D: usize = 20;
/// The MLA layer.
const MLA: MlaShape = MlaShape {
    d_model: 16,
    n_heads: 3,
    q_lora_rank: Some(8),
    kv_lora_rank: 12,
    qk_nope_head_dim: 4,
    qk_rope_head_dim: 4,
    v_head_dim: 6,
};
/// Sequences of the caches.
const B: usize = 2;

/// Where the layers' threads and scratch come from.
#[derive(Clone, Copy, Debug)]
enum Threads {
    /// Each layer's own workers and scratch.
    Own(usize),
    /// One pool's.
    Pool(usize),
}

/// The weights of the three layers, owned.
struct Weights {
    a: [Vec<f32>; 4],
    b: [Vec<f32>; 4],
    gate: OutputGate,
    mla: [Vec<f32>; 7],
}

impl Weights {
    fn new(seed: u64) -> Weights {
        let mut rng = Rng::new(seed);
        let (d, kv, q) = A_WIDTHS;
        let a = [d * q, d * kv, d * kv, q * d].map(|n| rng.vec(n, 0.4));
        let (h, h_kv, hd, dv) = B_HEADS;
        let b =
            [B_D * h * hd, B_D * h_kv * hd, B_D * h_kv * dv, h * dv * B_D].map(|n| rng.vec(n, 0.4));
        let gate = OutputGate {
            span: GateSpan::PerHead,
            activation: GateActivation::Sigmoid,
            weight: rng.vec(B_D * h, 1.0),
            bias: Some(rng.vec(h, 0.5)),
        };
        let s = MLA;
        let (dm, r, p, n, v) = (
            s.d_model,
            s.kv_lora_rank,
            s.qk_rope_head_dim,
            s.qk_nope_head_dim,
            s.v_head_dim,
        );
        let rank = s.q_lora_rank.unwrap();
        let sizes = [
            rank * dm,
            rank,
            s.n_heads * (n + p) * rank,
            (r + p) * dm,
            r,
            s.n_heads * (n + v) * r,
            dm * s.n_heads * v,
        ];
        let mut mla = sizes.map(|len| rng.vec(len, 0.3));
        for norm in [1, 4] {
            mla[norm].iter_mut().for_each(|w| *w += 1.0);
        }
        Weights { a, b, gate, mla }
    }

    /// The three layers on `threads`.
    fn layers(&self, threads: Threads, pool: Option<&ThreadPool>) -> Layers {
        let rope = |dim| Rope {
            theta: 10_000.0,
            rotary_dim: dim,
            layout: RopeLayout::RotateHalf,
            scaling: RopeScaling::Default,
        };
        let (d, kv, q) = A_WIDTHS;
        let [wq, wk, wv, wo] = &self.a;
        let a = Layer::builder(
            Projections::new(Widths::self_attention(d, kv, q), wq, wk, wv, wo).unwrap(),
            6,
        )
        .rope(rope(4))
        .sliding_window(16);
        let (h, h_kv, hd, dv) = B_HEADS;
        let widths = Widths::self_attention(B_D, h_kv * hd, h * hd).with_value_width(h_kv * dv);
        let [wq, wk, wv, wo] = &self.b;
        let b = Layer::builder(Projections::new(widths, wq, wk, wv, wo).unwrap(), h)
            .output_gate(self.gate.clone())
            .kv_format(KvFormat::Bf16);
        let w = &self.mla;
        let weights = MlaWeights {
            shape: MLA,
            q_a: Some((&w[0], &w[1])),
            q_b: &w[2],
            kv_a: &w[3],
            kv_a_norm: &w[4],
            kv_b: &w[5],
            o: &w[6],
        };
        let mla = MlaLayer::builder(
            weights,
            Rope {
                layout: RopeLayout::Interleaved,
                ..rope(4)
            },
        );
        let (a, b, mla) = match (threads, pool) {
            (Threads::Pool(_), Some(pool)) => (
                a.thread_pool(pool),
                b.thread_pool(pool),
                mla.thread_pool(pool),
            ),
            (Threads::Own(n), _) | (Threads::Pool(n), None) => {
                (a.threads(n), b.threads(n), mla.threads(n))
            }
        };
        let (a, b) = (
            a.min_work_per_thread(0).build().unwrap(),
            b.min_work_per_thread(0).build().unwrap(),
        );
        Layers {
            a,
            b,
            mla: mla.build().unwrap(),
        }
    }
}

struct Layers {
    a: Layer,
    b: Layer,
    mla: MlaLayer,
}

/// The caches of a schedule: one `KvCache` and one paged cache of two sequences per layer.
struct Caches {
    a: KvCache,
    b: KvCache,
    mla: KvCache,
    paged: [PagedCache; 3],
}

impl Caches {
    fn new(layers: &Layers) -> Caches {
        let paged = |cache: PagedCache| {
            let mut cache = cache;
            for id in 0..B {
                assert_eq!(cache.add_sequence().unwrap(), id);
            }
            cache
        };
        Caches {
            a: layers.a.new_cache(B, 40).unwrap(),
            b: layers.b.new_cache(B, 200).unwrap(),
            mla: layers.mla.new_cache(B, 200).unwrap(),
            paged: [
                paged(layers.a.new_paged_cache(8).unwrap()),
                paged(layers.b.new_paged_cache(8).unwrap()),
                paged(layers.mla.new_paged_cache(8).unwrap()),
            ],
        }
    }
}

/// `(batch, tokens, width)` inputs, different for every call.
fn tokens(rng: &mut Rng, batch: usize, len: usize, width: usize) -> Vec<f32> {
    rng.vec(batch * len * width, 1.0)
}

/// One call of the schedule.
#[derive(Clone, Copy, Debug)]
enum Call {
    Forward(Which, usize, usize),
    Decode(Which, usize),
    Paged(Which, &'static [usize], usize),
    /// Frees the scratch (through the pool when there is one, else through layer A).
    Release,
}

#[derive(Clone, Copy, Debug)]
enum Which {
    A,
    B,
    Mla,
}

use Call::{Decode, Forward, Paged, Release};
use Which::{Mla, A};

/// Forward, decode and paged decode calls of the three layers, interleaved, small and large,
/// with releases between them.
const SCHEDULE: &[Call] = &[
    Forward(A, 2, 30),
    Decode(Which::B, 17),
    Forward(Mla, 2, 25),
    Paged(A, &[0, 1], 5),
    Forward(Which::B, 1, 140),
    Decode(A, 3),
    Decode(Mla, 7),
    Release,
    Paged(Which::B, &[1, 0], 1),
    Forward(A, 1, 3),
    Paged(Mla, &[1], 100),
    Decode(Which::B, 1),
    Forward(Mla, 1, 2),
    Paged(A, &[1], 20),
    Release,
    Decode(Mla, 1),
    Forward(Which::B, 2, 9),
    Paged(Mla, &[0, 1], 2),
];

/// Runs `SCHEDULE` on `layers`; every call's output. When the layers are `alone` on their
/// threads, checks that a release leaves no scratch and a call grows it.
fn run(layers: &mut Layers, pool: Option<&ThreadPool>, alone: bool, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    let mut caches = Caches::new(layers);
    let mut outputs = Vec::new();
    for &call in SCHEDULE {
        let width = |which| match which {
            A => A_WIDTHS.0,
            Which::B => B_D,
            Mla => MLA.d_model,
        };
        let (which, batch, len) = match call {
            Forward(w, batch, len) => (w, batch, len),
            Decode(w, len) => (w, B, len),
            Paged(w, ids, len) => (w, ids.len(), len),
            Release => {
                match pool {
                    Some(pool) => pool.release_scratch(),
                    None => layers.a.release_scratch(),
                }
                assert!(!alone || layers.a.scratch_bytes() == 0, "released");
                continue;
            }
        };
        let d = width(which);
        let x = tokens(&mut rng, batch, len, d);
        let mut y = vec![f32::NAN; x.len()];
        let (x, out) = (
            Tokens::new(&x, batch, len, d).unwrap(),
            Output::new(&mut y, batch, len, d).unwrap(),
        );
        let options = AttendOptions::default();
        let done = match (call, which) {
            (Forward(..), A) => layers.a.forward_into(x, options, out),
            (Forward(..), Which::B) => layers.b.forward_into(x, options, out),
            (Forward(..), Mla) => layers.mla.forward_into(x, out),
            (Decode(..), A) => layers.a.decode_into(x, &mut caches.a, options, out),
            (Decode(..), Which::B) => layers.b.decode_into(x, &mut caches.b, options, out),
            (Decode(..), Mla) => layers.mla.decode_into(x, &mut caches.mla, out),
            (Paged(_, ids, _), A) => {
                layers
                    .a
                    .decode_paged(x, &mut caches.paged[0], ids, options, out)
            }
            (Paged(_, ids, _), Which::B) => {
                layers
                    .b
                    .decode_paged(x, &mut caches.paged[1], ids, options, out)
            }
            (Paged(_, ids, _), Mla) => layers.mla.decode_paged(x, &mut caches.paged[2], ids, out),
            (Release, _) => unreachable!(),
        };
        done.unwrap_or_else(|e| panic!("{call:?}: {e}"));
        let grown = match which {
            A => layers.a.scratch_bytes(),
            Which::B => layers.b.scratch_bytes(),
            Mla => layers.mla.scratch_bytes(),
        } > 0;
        assert!(!alone || grown, "{call:?} left no scratch");
        outputs.push(y);
    }
    outputs
}

fn assert_same(got: &[Vec<f32>], want: &[Vec<f32>], context: &str) {
    assert_eq!(got.len(), want.len());
    let calls = SCHEDULE.iter().filter(|c| !matches!(c, Release));
    for ((got, want), call) in got.iter().zip(want).zip(calls) {
        assert_bits_eq(got, want, &format!("{context}: {call:?}"));
    }
}

#[test]
fn layers_of_different_shapes_take_turns_with_one_scratch() {
    let weights = Weights::new(11);
    let want = run(&mut weights.layers(Threads::Own(1), None), None, true, 5);
    for threads in [Threads::Own(3), Threads::Pool(1), Threads::Pool(3)] {
        let pool = match threads {
            Threads::Pool(n) => Some(ThreadPool::new(n)),
            Threads::Own(_) => None,
        };
        let mut layers = weights.layers(threads, pool.as_ref());
        let got = run(&mut layers, pool.as_ref(), true, 5);
        assert_same(&got, &want, &format!("{threads:?}"));
    }
}

/// The shared workspace is each buffer's largest size over the layers: at least any one
/// layer's own, less than all of theirs together.
#[test]
fn a_pool_holds_one_scratch_for_all_its_layers() {
    let weights = Weights::new(12);
    let calls = |layers: &mut Layers| {
        let mut rng = Rng::new(3);
        for (len, d) in [(64, A_WIDTHS.0), (32, B_D), (48, MLA.d_model)] {
            let x = tokens(&mut rng, 1, len, d);
            let x = Tokens::new(&x, 1, len, d).unwrap();
            match d {
                24 => drop(layers.a.forward(x).unwrap()),
                20 => drop(layers.b.forward(x).unwrap()),
                _ => drop(layers.mla.forward(x).unwrap()),
            }
        }
    };
    let mut own = weights.layers(Threads::Own(1), None);
    calls(&mut own);
    let each = [
        own.a.scratch_bytes(),
        own.b.scratch_bytes(),
        own.mla.scratch_bytes(),
    ];
    let pool = ThreadPool::new(2);
    let mut shared = weights.layers(Threads::Pool(2), Some(&pool));
    calls(&mut shared);
    let one = pool.scratch_bytes();
    assert_eq!(shared.a.scratch_bytes(), one);
    assert_eq!(shared.mla.scratch_bytes(), one);
    let (largest, sum) = (*each.iter().max().unwrap(), each.iter().sum::<usize>());
    assert!(largest <= one && one < sum, "own {each:?}, shared {one}");
    shared.mla.release_scratch();
    assert_eq!((pool.scratch_bytes(), shared.b.scratch_bytes()), (0, 0));
}

/// Two threads of the program run the schedule on layers of their own that share one pool
/// (while a third releases the pool's scratch now and then): they take turns call by call,
/// and each gets the bits of layers with their own threads and scratch.
#[test]
fn two_callers_take_turns_with_one_scratch() {
    let weights = Weights::new(13);
    let want = run(&mut weights.layers(Threads::Own(1), None), None, true, 9);
    let pool = ThreadPool::new(3);
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for caller in 0..2 {
            let (weights, want, pool, done) = (&weights, &want, &pool, &done);
            s.spawn(move || {
                for round in 0..3 {
                    let mut layers = weights.layers(Threads::Pool(3), Some(pool));
                    let got = run(&mut layers, Some(pool), false, 9);
                    assert_same(&got, want, &format!("caller {caller} round {round}"));
                }
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        let (pool, done) = (&pool, &done);
        s.spawn(move || {
            while done.load(std::sync::atomic::Ordering::SeqCst) < 2 {
                pool.release_scratch();
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
    });
}
