//! The layer's worker threads: outputs bit-identical on 1, 2, 3 and 8 threads for forward,
//! cross-attention and decoding (every phase on every thread: `min_work_per_thread(0)`),
//! across many calls on one layer, after the layer moved to another thread; workers joined
//! when the layer is dropped; a steady-state call on several threads allocates nothing on the
//! calling thread (no thread is started).
//!
//! The tests of this file run one at a time (`serial`), so that counting the process's worker
//! threads sees only the current test's.

mod common;

use common::modes::{input, Weights};
use common::threads::{assert_workers, serial, worker_cpu_ns};
use common::{assert_bits_eq, batch_rows};
use mha::{AttendOptions, Isa, Masking, Mha, Output, Tensor, Tokens};

/// The thread counts compared with one thread.
const THREADS: [usize; 3] = [2, 3, 8];

fn supported() -> impl Iterator<Item = Isa> {
    Isa::ALL.into_iter().filter(|isa| isa.is_supported())
}

#[test]
fn forward_is_bit_identical_on_1_2_3_8_threads() {
    let _serial = serial();
    let w = Weights::<64, 64, 32>::random(1, [true; 4]); // 8 heads of 8, 4 key/value heads
    let x = input::<2, 100, 64>(2);
    for isa in supported() {
        for masking in [Masking::Causal, Masking::Bidirectional] {
            let want = w.layer(8, masking, isa, 1).forward(&x).unwrap();
            for threads in THREADS {
                let mut layer = w.layer(8, masking, isa, threads);
                for call in 0..3 {
                    let got = layer.forward(&x).unwrap();
                    let context = format!("{isa:?} {masking:?} threads {threads} call {call}");
                    assert_bits_eq(got.as_slice(), want.as_slice(), &context);
                }
            }
        }
    }
}

/// QK-norm and RoPE run over the projected rows in chunks on every thread (every phase takes
/// all threads here): the chunks must not change a bit.
#[test]
fn rotary_and_qk_norm_are_bit_identical_on_1_2_3_8_threads() {
    use mha::{QkNorm, QkNormSpan, Rope, RopeLayout, RopeScaling};
    let _serial = serial();
    let w = Weights::<64, 64, 32>::random(11, [true; 4]); // 8 heads of 8, 4 key/value heads
    let x = input::<2, 100, 64>(12);
    let rope = Rope {
        theta: 500.0,
        rotary_dim: 6,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    };
    let weight = |shift: f32| (0..8).map(|i| 0.5 + shift + i as f32 * 0.1).collect();
    let norm = QkNorm {
        span: QkNormSpan::PerHead,
        q_weight: weight(0.0),
        k_weight: weight(0.3),
        eps: 1e-5,
    };
    let layer = |isa, threads| {
        w.builder(8, Masking::Causal, isa, threads)
            .rope(rope)
            .qk_norm(norm.clone())
            .min_work_per_thread(0)
            .build()
            .expect("valid layer")
    };
    for isa in supported() {
        let want = layer(isa, 1).forward(&x).unwrap();
        for threads in THREADS {
            let mut layer = layer(isa, threads);
            for call in 0..2 {
                let got = layer.forward(&x).unwrap();
                let context = format!("{isa:?} threads {threads} call {call}");
                assert_bits_eq(got.as_slice(), want.as_slice(), &context);
            }
        }
    }
}

#[test]
fn cross_attention_is_bit_identical_on_1_2_3_8_threads() {
    let _serial = serial();
    let w = Weights::<48, 40, 48>::random(3, [true; 4]);
    let x = input::<3, 20, 48>(4);
    let memory = input::<3, 130, 40>(5);
    let key_lengths = [130, 7, 64];
    let options = AttendOptions {
        key_lengths: Some(&key_lengths),
        ..AttendOptions::default()
    };
    let run = |layer: &mut Mha<48, 40, 48>| {
        let mut out = Tensor::<3, 20, 48>::zeros();
        layer.cross_into(&x, &memory, options, &mut out).unwrap();
        out
    };
    for isa in supported() {
        let want = run(&mut w.layer(6, Masking::Bidirectional, isa, 1));
        for threads in THREADS {
            let mut layer = w.layer(6, Masking::Bidirectional, isa, threads);
            for call in 0..3 {
                let context = format!("{isa:?} threads {threads} call {call}");
                assert_bits_eq(run(&mut layer).as_slice(), want.as_slice(), &context);
            }
        }
    }
}

#[test]
fn decoding_is_bit_identical_on_1_2_3_8_threads() {
    const B: usize = 2;
    const T: usize = 30;
    const D: usize = 96;
    let _serial = serial();
    let w = Weights::<D, D, 32>::random(6, [true; 4]); // 12 heads of 8, 4 key/value heads
    let x = input::<B, T, D>(7);
    for isa in supported() {
        let full = w.layer(12, Masking::Causal, isa, 1).forward(&x).unwrap();
        for threads in [1].into_iter().chain(THREADS) {
            let mut layer = w.layer(12, Masking::Causal, isa, threads);
            let mut cache = layer.new_cache(B, T).unwrap();
            // A prefill of 17 tokens, then one token per step.
            let steps = [(0, 17)].into_iter().chain((17..T).map(|t| (t, 1)));
            for (start, len) in steps {
                let tokens = batch_rows(x.as_slice(), B, D, start..start + len);
                let mut out = vec![f32::NAN; B * len * D];
                layer
                    .decode_into(
                        Tokens::new(&tokens, B, len, D).unwrap(),
                        &mut cache,
                        AttendOptions::default(),
                        Output::new(&mut out, B, len, D).unwrap(),
                    )
                    .unwrap();
                let context = format!("{isa:?} threads {threads} tokens {start}..+{len}");
                assert_bits_eq(
                    &out,
                    &batch_rows(full.as_slice(), B, D, start..start + len),
                    &context,
                );
            }
        }
    }
}

#[test]
fn many_calls_on_one_layer() {
    let _serial = serial();
    let w = Weights::<32, 32, 32>::random(8, [false, true, false, true]);
    let (short, long) = (input::<1, 3, 32>(9), input::<2, 70, 32>(10));
    let mut one = w.layer(4, Masking::Causal, Isa::detect(), 1);
    let (want_short, want_long) = (one.forward(&short).unwrap(), one.forward(&long).unwrap());
    let mut layer = w.layer(4, Masking::Causal, Isa::detect(), 2);
    for call in 0..500 {
        let context = format!("call {call}");
        if call % 3 == 0 {
            assert_bits_eq(
                layer.forward(&short).unwrap().as_slice(),
                want_short.as_slice(),
                &context,
            );
        } else {
            assert_bits_eq(
                layer.forward(&long).unwrap().as_slice(),
                want_long.as_slice(),
                &context,
            );
        }
    }
}

#[test]
fn a_layer_moved_to_another_thread_works_there_and_joins_on_drop() {
    fn assert_send<T: Send>() {}
    fn assert_sync<T: Sync>() {}
    assert_send::<Mha<64>>();
    assert_sync::<Mha<64>>();

    let _serial = serial();
    // Every test here holds `serial()` and drops its layers before it ends, so once the
    // earlier test's exiting workers are gone none is left.
    let before = 0;
    assert_workers(before, "no worker left by an earlier test");
    let w = Weights::<64, 64, 64>::random(11, [false; 4]);
    let x = input::<1, 80, 64>(12);
    let want = w
        .layer(4, Masking::Causal, Isa::detect(), 1)
        .forward(&x)
        .unwrap();
    let mut layer = w.layer(4, Masking::Causal, Isa::detect(), 3);
    assert_bits_eq(
        layer.forward(&x).unwrap().as_slice(),
        want.as_slice(),
        "on the building thread",
    );
    let (layer, got) = std::thread::spawn(move || {
        let got = layer.forward(&x).unwrap();
        (layer, got)
    })
    .join()
    .unwrap();
    assert_bits_eq(got.as_slice(), want.as_slice(), "on another thread");
    // Dropped on a third thread, after use on two others.
    std::thread::spawn(move || drop(layer)).join().unwrap();
    assert_workers(before, "joined on drop");
}

#[test]
fn dropping_an_idle_layer_joins_its_workers() {
    let _serial = serial();
    // Every test here holds `serial()` and drops its layers before it ends, so once the
    // earlier test's exiting workers are gone none is left.
    let before = 0;
    assert_workers(before, "no worker left by an earlier test");
    let w = Weights::<32, 32, 32>::random(13, [false; 4]);
    let x = input::<1, 40, 32>(14);
    let mut layer = w.layer(4, Masking::Causal, Isa::detect(), 4);
    // Without `std` every call runs on the calling thread.
    let workers = if cfg!(feature = "std") { 3 } else { 0 };
    assert_workers(before, "no worker before a call needs one");
    layer.forward(&x).unwrap();
    assert_workers(before + workers, "three workers beside the caller");
    layer.forward(&x).unwrap();
    assert_workers(before + workers, "the same workers again");
    drop(layer);
    assert_workers(before, "joined on drop");

    // A layer whose calls never need a second thread never starts one.
    let w = Weights::<8, 8, 8>::random(15, [false; 4]);
    let mut tiny = Mha::builder(&w.params, 2).threads(8).build().unwrap();
    tiny.forward(&input::<1, 2, 8>(16)).unwrap();
    assert_workers(before, "a tiny layer");
}

#[test]
fn idle_workers_use_no_cpu_between_calls() {
    let _serial = serial();
    let w = Weights::<64, 64, 64>::random(20, [false; 4]);
    let x = input::<1, 96, 64>(21);
    let mut layer = w.layer(4, Masking::Causal, Isa::detect(), 2);
    let mut gaps = Vec::new();
    for _ in 0..5 {
        layer.forward(&x).unwrap();
        // A thread's CPU time in /proc is brought up to date when it is switched out, so read
        // it once the worker has parked (after any spin, which is bounded).
        std::thread::sleep(std::time::Duration::from_millis(10));
        let Some(before) = worker_cpu_ns() else {
            return; // no /proc to read CPU time from
        };
        // The caller does other things for 50 ms: the worker stays parked.
        std::thread::sleep(std::time::Duration::from_millis(50));
        gaps.push(worker_cpu_ns().unwrap() - before);
    }
    // A worker that never parked would use the whole gap; the median leaves out one in which
    // the machine charged it for something else.
    gaps.sort_unstable();
    assert!(
        gaps[gaps.len() / 2] < 1_000_000,
        "worker CPU per idle gap, ns: {gaps:?}"
    );
}

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

#[test]
fn a_steady_state_call_on_several_threads_allocates_nothing_on_the_caller() {
    let _serial = serial();
    let w = Weights::<48, 48, 48>::random(17, [true; 4]);
    let x = input::<2, 70, 48>(18);
    let mut layer = w.layer(4, Masking::Causal, Isa::detect(), 3);
    let mut out = Tensor::<2, 70, 48>::zeros();
    let mut cache = layer.new_cache(2, 8).unwrap();
    let token = input::<2, 1, 48>(19);
    let mut step = Tensor::<2, 1, 48>::zeros();
    let mut run = |layer: &mut Mha<48>| {
        layer
            .forward_into(&x, AttendOptions::default(), &mut out)
            .unwrap();
        layer
            .decode_into(&token, &mut cache, AttendOptions::default(), &mut step)
            .unwrap();
    };
    run(&mut layer); // sizes the scratch and starts the workers
    let before = allocations();
    for _ in 0..5 {
        run(&mut layer);
    }
    assert_eq!(allocations() - before, 0);
}
