//! KV-cache decoding (`decode_into`): a sequence fed one token at a time, in uneven chunks
//! (3, 1, 5, 2) and across the 96-key block boundary gives the outputs of one full causal
//! forward bit for bit (the crate's claim; asserted with `assert_bits_eq`), also with grouped
//! heads, biases, heads not `D / H` wide, QK-norm and a set scale. Each step is also checked
//! against the general f64 reference, seen as cross-attention of the new tokens over
//! everything cached with causal order aligned bottom-right (and bidirectional). Past capacity
//! is `Err(CacheFull)` leaving the cache as it was; a cache of another layer shape is
//! `Err(CacheMismatch)`; `clear` starts over.
//!
//! Tolerance against the reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{configs, input, qk_norm, Weights, ABS, REL};
use common::{assert_bits_eq, assert_close, batch_rows, reference_attend};
use mha::{AttendOptions, KvCache, Masking, Mha, QkNormSpan, ShapeError, Tensor};

/// Tokens `start .. start + L` of `x`.
fn chunk<const B: usize, const T: usize, const L: usize, const D: usize>(
    x: &Tensor<B, T, D>,
    start: usize,
) -> Tensor<B, L, D> {
    Tensor::from_fn(|b, t, i| x[(b, start + t, i)])
}

/// Feeds tokens `start .. start + L` through `decode`, checks them against the reference
/// (cross-attention of the chunk over the whole prefix) and the full forward's rows bit for
/// bit, and returns them.
#[allow(clippy::too_many_arguments)]
fn step<
    const B: usize,
    const T: usize,
    const L: usize,
    const D: usize,
    const KV: usize,
    const Q: usize,
>(
    w: &Weights<D, D, KV, Q>,
    h: usize,
    masking: Masking,
    layer: &mut Mha<D, D, KV, Q>,
    cache: &mut KvCache,
    x: &Tensor<B, T, D>,
    full: Option<&[f32]>,
    start: usize,
    context: &str,
) {
    let context = format!("{context}: tokens {start}..{}", start + L);
    assert_eq!(cache.len(), start, "{context}: cached before");
    let new = chunk::<B, T, L, D>(x, start);
    let mut out = Tensor::<B, L, D>::from_fn(|_, _, _| f32::NAN);
    layer
        .decode_into(&new, cache, AttendOptions::default(), &mut out)
        .unwrap();
    assert_eq!(cache.len(), start + L, "{context}: cached after");
    let prefix = batch_rows(x.as_slice(), B, D, 0..start + L);
    let a = w.attend(B, L, h, new.as_slice(), Some((start + L, &prefix)), masking);
    let want = reference_attend(&a);
    assert_close(out.as_slice(), &want.y, ABS, REL, &context);
    if let Some(full) = full {
        let rows = batch_rows(full, B, D, start..start + L);
        assert_bits_eq(
            out.as_slice(),
            &rows,
            &format!("{context}: vs full forward"),
        );
    }
}

/// Feeds a random `x` (from `seed`) one token at a time and in chunks 3, 1, 5, 2 (T = 11)
/// through a layer of `w` with `h` heads, comparing with the full causal forward bit for bit.
fn sequence<const D: usize, const KV: usize, const Q: usize>(
    w: &Weights<D, D, KV, Q>,
    h: usize,
    seed: u64,
) {
    const B: usize = 2;
    const T: usize = 11;
    let x = input::<B, T, D>(seed);
    for (isa, threads) in configs() {
        let context = format!("D{D} KV{KV} Q{Q} H{h} {isa:?} threads {threads}");
        let mut layer = w.layer(h, Masking::Causal, isa, threads);
        let full = layer.forward(&x).unwrap().into_vec();
        let c = Masking::Causal;

        let mut cache = layer.new_cache(B, T).unwrap();
        assert!(cache.is_empty());
        assert_eq!(cache.capacity(), T);
        for t in 0..T {
            step::<B, T, 1, D, KV, Q>(
                w,
                h,
                c,
                &mut layer,
                &mut cache,
                &x,
                Some(&full),
                t,
                &context,
            );
        }

        let mut cache = layer.new_cache(B, T + 4).unwrap();
        step::<B, T, 3, D, KV, Q>(
            w,
            h,
            c,
            &mut layer,
            &mut cache,
            &x,
            Some(&full),
            0,
            &context,
        );
        step::<B, T, 1, D, KV, Q>(
            w,
            h,
            c,
            &mut layer,
            &mut cache,
            &x,
            Some(&full),
            3,
            &context,
        );
        step::<B, T, 5, D, KV, Q>(
            w,
            h,
            c,
            &mut layer,
            &mut cache,
            &x,
            Some(&full),
            4,
            &context,
        );
        step::<B, T, 2, D, KV, Q>(
            w,
            h,
            c,
            &mut layer,
            &mut cache,
            &x,
            Some(&full),
            9,
            &context,
        );

        // clear() starts over: the same outputs again.
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(cache.capacity(), T + 4);
        step::<B, T, 5, D, KV, Q>(
            w,
            h,
            c,
            &mut layer,
            &mut cache,
            &x,
            Some(&full),
            0,
            &context,
        );
        step::<B, T, 6, D, KV, Q>(
            w,
            h,
            c,
            &mut layer,
            &mut cache,
            &x,
            Some(&full),
            5,
            &context,
        );
    }
}

#[test]
fn token_by_token_and_uneven_chunks_match_the_full_forward() {
    sequence(&Weights::<12, 12, 12>::random(1, [false; 4]), 3, 2);
}

#[test]
fn with_biases() {
    sequence(&Weights::<12, 12, 12>::random(10, [true; 4]), 3, 11);
}

#[test]
fn with_grouped_and_multi_query_heads() {
    // D = 12, H = 6, d = 2: KV = 4 is 2 kv heads, KV = 2 is one.
    sequence(
        &Weights::<12, 12, 4>::random(20, [true, true, true, false]),
        6,
        21,
    );
    sequence(&Weights::<12, 12, 2>::random(30, [false; 4]), 6, 31);
}

#[test]
fn with_heads_not_d_over_h_wide() {
    // D = 10, H = 3 heads of 6 (Q = 18); one key/value head (KV = 6) and three (KV = 18).
    sequence(&Weights::<10, 10, 6, 18>::random(35, [true; 4]), 3, 36);
    sequence(&Weights::<10, 10, 18, 18>::random(37, [false; 4]), 3, 38);
}

#[test]
fn with_qk_norm_per_head_and_whole() {
    // D = 10, H = 3 heads of 5 (Q = 15), one key/value head; the cache holds normalised keys.
    for span in [QkNormSpan::PerHead, QkNormSpan::Whole] {
        let mut w = Weights::<10, 10, 5, 15>::random(39, [true; 4]);
        w.qk_norm = Some(qk_norm(span, 5, 3, 1, 1e-6, 40));
        sequence(&w, 3, 41);
        w.scale = Some(0.3);
        sequence(&w, 3, 42);
    }
}

#[test]
fn past_the_96_key_block_token_by_token() {
    // The attention's key blocks hold 96 keys (`BLOCK_K` in src/kernels/flash.rs).
    const T: usize = 102;
    const D: usize = 8;
    let w = Weights::<D, D, 4>::random(40, [true; 4]);
    let x = input::<1, T, D>(41);
    let mut layer = w.layer(4, Masking::Causal, mha::Isa::detect(), 1);
    let full = layer.forward(&x).unwrap().into_vec();
    let mut cache = layer.new_cache(1, T).unwrap();
    let c = Masking::Causal;
    for t in 0..90 {
        step::<1, T, 1, D, 4, D>(&w, 4, c, &mut layer, &mut cache, &x, Some(&full), t, "long");
    }
    // A chunk straddling the block boundary, then single tokens to the end.
    step::<1, T, 7, D, 4, D>(
        &w,
        4,
        c,
        &mut layer,
        &mut cache,
        &x,
        Some(&full),
        90,
        "long",
    );
    for t in 97..T {
        step::<1, T, 1, D, 4, D>(&w, 4, c, &mut layer, &mut cache, &x, Some(&full), t, "long");
    }
}

/// Without causal order a token would see the tokens of later steps, so its output would
/// depend on how the sequence is cut into steps: decoding a bidirectional layer is an error
/// that leaves the cache and the output untouched.
#[test]
fn decoding_a_bidirectional_layer_is_an_error() {
    const T: usize = 9;
    let w = Weights::<12, 12, 12>::random(50, [true; 4]);
    let x = input::<2, T, 12>(51);
    let mut layer = w.layer(3, Masking::Bidirectional, mha::Isa::detect(), 1);
    let mut cache = layer.new_cache(2, T).unwrap();
    let mut out = Tensor::<2, 4, 12>::from_fn(|_, _, _| 7.0);
    let err = layer
        .decode_into(
            &chunk::<2, T, 4, 12>(&x, 0),
            &mut cache,
            AttendOptions::default(),
            &mut out,
        )
        .unwrap_err();
    assert_eq!(err, ShapeError::DecodeNeedsCausal);
    assert_eq!(
        err.to_string(),
        "decoding needs a causal layer: a bidirectional one would let tokens see later ones"
    );
    assert!(cache.is_empty());
    assert!(out.as_slice().iter().all(|&v| v == 7.0), "output untouched");
}

#[test]
fn past_capacity_is_an_error_and_changes_nothing() {
    const B: usize = 2;
    const T: usize = 8;
    let w = Weights::<12, 12, 6>::random(60, [true; 4]);
    let x = input::<B, T, 12>(61);
    let c = Masking::Causal;
    let mut layer = w.layer(6, c, mha::Isa::detect(), 1);
    let full = layer.forward(&x).unwrap().into_vec();
    let mut cache = layer.new_cache(B, 5).unwrap();
    step::<B, T, 3, 12, 6, 12>(
        &w,
        6,
        c,
        &mut layer,
        &mut cache,
        &x,
        Some(&full),
        0,
        "capacity",
    );

    let mut out = Tensor::<B, 3, 12>::from_fn(|_, _, _| 7.0);
    let too_many = chunk::<B, T, 3, 12>(&x, 3);
    let err = layer
        .decode_into(&too_many, &mut cache, AttendOptions::default(), &mut out)
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError::CacheFull {
            sequence: 0,
            capacity: 5,
            cached: 3,
            new: 3
        }
    );
    assert_eq!(
        err.to_string(),
        "KV cache of capacity 5 holds 3 tokens of sequence 0 and cannot take 3 more"
    );
    assert_eq!(cache.len(), 3);
    assert!(out.as_slice().iter().all(|&v| v == 7.0), "output untouched");

    // The cache still works: the next two tokens fill it exactly, with the right outputs.
    step::<B, T, 2, 12, 6, 12>(
        &w,
        6,
        c,
        &mut layer,
        &mut cache,
        &x,
        Some(&full),
        3,
        "capacity",
    );
    let mut one = Tensor::<B, 1, 12>::zeros();
    let err = layer
        .decode_into(
            &chunk::<B, T, 1, 12>(&x, 5),
            &mut cache,
            AttendOptions::default(),
            &mut one,
        )
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError::CacheFull {
            sequence: 0,
            capacity: 5,
            cached: 5,
            new: 1
        }
    );
    assert_eq!(cache.len(), 5);

    // A zero-capacity cache takes no token.
    let mut empty = layer.new_cache(B, 0).unwrap();
    let err = layer.decode_into(
        &chunk::<B, T, 1, 12>(&x, 0),
        &mut empty,
        AttendOptions::default(),
        &mut one,
    );
    assert_eq!(
        err,
        Err(ShapeError::CacheFull {
            sequence: 0,
            capacity: 0,
            cached: 0,
            new: 1
        })
    );
    // An empty chunk fits in a cache with room.
    let mut cache = layer.new_cache(B, 2).unwrap();
    let mut none = Tensor::<B, 0, 12>::zeros();
    layer
        .decode_into(
            &Tensor::<B, 0, 12>::zeros(),
            &mut cache,
            AttendOptions::default(),
            &mut none,
        )
        .unwrap();
    assert!(cache.is_empty());
}

/// An empty chunk into a zero-capacity cache (where the append's `chunks_exact_mut(capacity
/// · d)` would get a chunk size of 0) appends nothing and returns `Ok`, without a panic.
#[test]
fn empty_chunk_into_zero_capacity_cache_does_not_panic() {
    let id = mha::Matrix::<4, 4>::identity();
    let params = mha::MhaParams::new(id.clone(), id.clone(), id.clone(), id);
    let mut layer = Mha::new(&params, 2).unwrap();
    let mut cache = layer.new_cache(1, 0).unwrap();
    let mut out = Tensor::<1, 0, 4>::zeros();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        layer.decode_into(
            &Tensor::<1, 0, 4>::zeros(),
            &mut cache,
            AttendOptions::default(),
            &mut out,
        )
    }));
    assert!(
        result.is_ok(),
        "decode of 0 tokens into a 0-capacity cache panicked"
    );
    assert_eq!(result.unwrap(), Ok(()));
    assert!(cache.is_empty());
}

#[test]
fn cache_of_another_layer_shape_is_an_error() {
    let a = Weights::<12, 12, 12>::random(70, [false; 4]);
    let b = Weights::<12, 12, 4>::random(71, [false; 4]);
    let isa = mha::Isa::detect();
    let mut plain = a.layer(3, Masking::Causal, isa, 1); // 3 kv heads of 4
    let mut grouped = b.layer(3, Masking::Causal, isa, 1); // 1 kv head of 4
    let mut narrow = a.layer(6, Masking::Causal, isa, 1); // 6 kv heads of 2
    let x = input::<1, 1, 12>(72);
    let mut out = Tensor::<1, 1, 12>::zeros();
    for (mut cache, name) in [
        (
            grouped.new_cache(1, 4).unwrap(),
            "grouped cache in plain layer",
        ),
        (
            narrow.new_cache(1, 4).unwrap(),
            "narrow cache in plain layer",
        ),
    ] {
        let err = plain
            .decode_into(&x, &mut cache, AttendOptions::default(), &mut out)
            .unwrap_err();
        assert_eq!(err, ShapeError::CacheMismatch, "{name}");
        assert_eq!(
            err.to_string(),
            "KV cache was made by a layer with other key/value heads, head width, instruction set or key/value formats"
        );
        assert!(cache.is_empty(), "{name}");
    }
    let mut cache = plain.new_cache(1, 4).unwrap();
    assert_eq!(
        grouped.decode_into(&x, &mut cache, AttendOptions::default(), &mut out),
        Err(ShapeError::CacheMismatch)
    );
    assert_eq!(
        narrow.decode_into(&x, &mut cache, AttendOptions::default(), &mut out),
        Err(ShapeError::CacheMismatch)
    );
    assert!(cache.is_empty());
    plain
        .decode_into(&x, &mut cache, AttendOptions::default(), &mut out)
        .unwrap();
    assert_eq!(cache.len(), 1);
}

/// The chunked decode on two threads (every phase uses them: `min_work_per_thread(0)`) is
/// still bit-identical to a single-threaded full forward.
#[test]
fn two_threads_chunks_match_one_thread_full_forward() {
    const B: usize = 2;
    const T: usize = 40;
    const D: usize = 128;
    let w = Weights::<D, D, 32>::random(80, [true; 4]); // 8 heads of 16, 2 kv heads
    let x = input::<B, T, D>(81);
    let full = w
        .layer(8, Masking::Causal, mha::Isa::detect(), 1)
        .forward(&x)
        .unwrap()
        .into_vec();
    let mut layer = w.layer(8, Masking::Causal, mha::Isa::detect(), 2);
    let mut cache = layer.new_cache(B, T).unwrap();
    let mut start = 0;
    let mut feed = |out: &[f32], len: usize| {
        let want = batch_rows(&full, B, D, start..start + len);
        assert_bits_eq(out, &want, &format!("tokens {start}..{}", start + len));
        start += len;
    };
    let mut out16 = Tensor::<B, 16, D>::zeros();
    layer
        .decode_into(
            &chunk::<B, T, 16, D>(&x, 0),
            &mut cache,
            AttendOptions::default(),
            &mut out16,
        )
        .unwrap();
    feed(out16.as_slice(), 16);
    layer
        .decode_into(
            &chunk::<B, T, 16, D>(&x, 16),
            &mut cache,
            AttendOptions::default(),
            &mut out16,
        )
        .unwrap();
    feed(out16.as_slice(), 16);
    let mut out8 = Tensor::<B, 8, D>::zeros();
    layer
        .decode_into(
            &chunk::<B, T, 8, D>(&x, 32),
            &mut cache,
            AttendOptions::default(),
            &mut out8,
        )
        .unwrap();
    feed(out8.as_slice(), 8);
}

/// Decoding one token at a time on two threads splits the step's few rows of projections into
/// column blocks and the attention into one item per head; both must give the bits of a
/// single-threaded full forward. Odd widths put segment boundaries inside microtile panels;
/// biases and grouped key/value heads are on.
#[test]
fn two_threads_token_by_token_match_one_thread_full_forward() {
    fn case<const B: usize, const D: usize, const KV: usize>(h: usize, seed: u64) {
        const T: usize = 11;
        let w = Weights::<D, D, KV>::random(seed, [true; 4]);
        let x = input::<B, T, D>(seed + 1);
        for isa in mha::Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            let full = w
                .layer(h, Masking::Causal, isa, 1)
                .forward(&x)
                .unwrap()
                .into_vec();
            let mut layer = w.layer(h, Masking::Causal, isa, 2);
            let mut cache = layer.new_cache(B, T).unwrap();
            let mut out = Tensor::<B, 1, D>::zeros();
            for t in 0..T {
                layer
                    .decode_into(
                        &chunk::<B, T, 1, D>(&x, t),
                        &mut cache,
                        AttendOptions::default(),
                        &mut out,
                    )
                    .unwrap();
                let want = batch_rows(&full, B, D, t..t + 1);
                let context = format!("{isa:?} B{B} D{D} token {t}");
                assert_bits_eq(out.as_slice(), &want, &context);
            }
        }
    }
    case::<1, 128, 32>(8, 90); // 8 heads of 16, 2 kv heads
    case::<1, 20, 10>(4, 92); // 4 heads of 5, 2 kv heads
    case::<1, 96, 96>(3, 94); // 3 heads of 32
    case::<2, 128, 32>(8, 96); // two rows per step
    case::<3, 20, 10>(4, 98); // three rows, odd widths
}

/// A cache too large for the machine is an error, never an abort or a wrapped size.
#[test]
fn huge_caches_are_errors() {
    let w = Weights::<12, 12, 12>::random(100, [false; 4]);
    let layer = w.layer(3, Masking::Causal, mha::Isa::detect(), 1);
    for (batch, capacity) in [(1, usize::MAX), (2, 1 << 61), (usize::MAX, 2)] {
        match layer.new_cache(batch, capacity) {
            Err(ShapeError::Overflow { what, dims }) => {
                assert_eq!(what, "key/value store (B, Hkv, capacity, d)");
                assert_eq!(dims, vec![batch, 3, capacity, 4]);
            }
            other => panic!("batch {batch} capacity {capacity}: {other:?}"),
        }
    }
    // Representable but far beyond the address space: the allocation fails, reported.
    match layer.new_cache(1, 1 << 44) {
        Err(ShapeError::AllocationFailed { what, bytes }) => {
            assert_eq!(what, "key/value store: keys");
            assert!(bytes >= (4 * 3 * 4) << 44, "{bytes}");
        }
        other => panic!("capacity 1 << 44: {other:?}"),
    }
    let cache = layer.new_cache(0, 0).unwrap();
    assert_eq!((cache.batch(), cache.capacity(), cache.len()), (0, 0, 0));
}
