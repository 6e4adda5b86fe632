//! Sliding-window attention (`MhaBuilder::sliding_window`) and its rolling cache: forwards
//! against the f64 reference on odd shapes (windows of 1, 3, 95, 96, 97 and longer than the
//! sequence; GQA, biases, attention weights); decoding through the rolling cache gives the
//! forward's bits token by token and in uneven chunks, far past the window, with no
//! allocation after its first step; ragged batches; cross-attention; a window of at least `T`
//! is no window; and the errors.

mod common;

use common::modes::{check_all, configs, Weights, ABS, REL};
use common::{assert_bits_eq, assert_close, batch_rows, reference_attend, Rng};
use mha::{AttendOptions, Isa, KvCache, Masking, Mha, Output, ShapeError, Tokens};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

const D: usize = 12;
const KV: usize = 4;
/// 6 query heads of width 2 over 2 key/value heads.
const H: usize = 6;

fn weights() -> Weights<D, D, KV> {
    Weights::random(13, [true; 4])
}

fn layer(w: &Weights<D, D, KV>, window: usize, isa: Isa, threads: usize) -> Mha<D, D, KV> {
    w.builder(H, Masking::Causal, isa, threads)
        .sliding_window(window)
        .build()
        .expect("valid window")
}

/// A forward of `x (b, t, D)` with `options`.
fn forward(layer: &mut Mha<D, D, KV>, x: &[f32], b: usize, options: AttendOptions<'_>) -> Vec<f32> {
    let t = x.len() / (b * D);
    let mut out = vec![f32::NAN; x.len()];
    let input = Tokens::new(x, b, t, D).unwrap();
    layer
        .forward_into(input, options, Output::new(&mut out, b, t, D).unwrap())
        .unwrap();
    out
}

/// One decoding step of `x (b, t, D)`.
fn decode(
    layer: &mut Mha<D, D, KV>,
    cache: &mut KvCache,
    x: &[f32],
    b: usize,
    options: AttendOptions<'_>,
) -> Result<Vec<f32>, ShapeError> {
    let t = x.len() / (b * D);
    let mut out = vec![f32::NAN; x.len()];
    let input = Tokens::new(x, b, t, D)?;
    layer.decode_into(input, cache, options, Output::new(&mut out, b, t, D)?)?;
    Ok(out)
}

/// Forward with windows of 1, 3, 95, 96, 97 and past `T` on odd lengths (one key block, and
/// several, so that whole blocks are skipped), against the reference, with the attention
/// weights, on every instruction set and thread count.
#[test]
fn forward_matches_reference() {
    let w = weights();
    let mut rng = Rng::new(5);
    for (b, t) in [(2, 1), (3, 7), (2, 200), (1, 389)] {
        let x = rng.vec(b * t * D, 1.0);
        for window in [1, 3, 95, 96, 97, 250, t + 5] {
            let context = format!("b {b} t {t} window {window}");
            let mut want = w.attend(b, t, H, &x, None, Masking::Causal);
            want.window = Some(window);
            let want = reference_attend(&want);
            check_all(
                &want,
                [b, H, t, t],
                |isa, threads| layer(&w, window, isa, threads),
                |layer, weights| {
                    let mut out = vec![f32::NAN; x.len()];
                    let mut output = Output::new(&mut out, b, t, D)?;
                    if let Some(weights) = weights {
                        output = output.with_weights(weights);
                    }
                    let input = Tokens::new(&x, b, t, D)?;
                    layer.forward_into(input, AttendOptions::default(), output)?;
                    Ok(out)
                },
                &context,
            );
        }
    }
}

/// The window combines with key lengths and a padding mask (the reference applies all rules).
#[test]
fn forward_with_padding_matches_reference() {
    let w = weights();
    let (b, t, window) = (2, 150, 40);
    let x = Rng::new(6).vec(b * t * D, 1.0);
    let lengths = [150, 101];
    let padding: Vec<bool> = (0..b * t).map(|e| e % 7 != 3).collect();
    let options = AttendOptions {
        key_lengths: Some(&lengths),
        key_padding_mask: Some(&padding),
        ..AttendOptions::default()
    };
    let mut want = w.attend(b, t, H, &x, None, Masking::Causal);
    want.window = Some(window);
    want.key_lengths = Some(&lengths);
    want.key_padding_mask = Some(&padding);
    let want = reference_attend(&want);
    for (isa, threads) in configs() {
        let got = forward(&mut layer(&w, window, isa, threads), &x, b, options);
        assert_close(&got, &want.y, ABS, REL, &format!("{isa:?} {threads}"));
    }
}

/// Causal cross-attention is aligned bottom-right; the window counts back from that diagonal.
#[test]
fn cross_attention_with_window() {
    let w = weights();
    let (b, t, s, window) = (2, 5, 130, 20);
    let mut rng = Rng::new(12);
    let (x, memory) = (rng.vec(b * t * D, 1.0), rng.vec(b * s * D, 1.0));
    let mut want = w.attend(b, t, H, &x, Some((s, &memory)), Masking::Causal);
    want.window = Some(window);
    let want = reference_attend(&want);
    for (isa, threads) in configs() {
        let mut out = vec![f32::NAN; x.len()];
        let (input, source) = (
            Tokens::new(&x, b, t, D).unwrap(),
            Tokens::new(&memory, b, s, D).unwrap(),
        );
        let output = Output::new(&mut out, b, t, D).unwrap();
        layer(&w, window, isa, threads)
            .cross_into(input, source, AttendOptions::default(), output)
            .unwrap();
        assert_close(&out, &want.y, ABS, REL, &format!("{isa:?} {threads}"));
    }
}

/// Decodes `x (b, t, D)` in steps of `chunks` (cycled) through a rolling cache taking
/// `chunk_limit` tokens per call; returns the outputs of every step, concatenated per row.
fn decode_in_chunks(
    layer: &mut Mha<D, D, KV>,
    x: &[f32],
    b: usize,
    chunks: &[usize],
    chunk_limit: usize,
) -> Vec<f32> {
    let t = x.len() / (b * D);
    let mut cache = layer.new_cache(b, chunk_limit).unwrap();
    let mut steps = Vec::new();
    let mut t0 = 0;
    for &chunk in chunks.iter().cycle() {
        if t0 == t {
            break;
        }
        let end = (t0 + chunk).min(t);
        let step = batch_rows(x, b, D, t0..end);
        steps.push((
            t0..end,
            decode(layer, &mut cache, &step, b, AttendOptions::default()),
        ));
        t0 = end;
    }
    assert_eq!(cache.lengths(), vec![t; b], "positions are absolute");
    assert_eq!(cache.capacity(), chunk_limit);
    // Back to (b, t, D).
    let mut out = vec![f32::NAN; x.len()];
    for (range, step) in steps {
        let step = step.unwrap();
        for bi in 0..b {
            let len = range.len();
            out[(bi * t + range.start) * D..][..len * D]
                .copy_from_slice(&step[bi * len * D..][..len * D]);
        }
    }
    out
}

/// Decoding through the rolling cache, token by token and in uneven chunks (crossing and
/// filling 96-key blocks), past twice the window: the forward's bits.
#[test]
fn decode_equals_forward_bit_for_bit() {
    let w = weights();
    let (b, t) = (2, 520);
    let x = Rng::new(7).vec(b * t * D, 1.0);
    for (isa, threads) in configs() {
        for window in [1, 3, 95, 96, 97, 140] {
            let context = format!("{isa:?} threads {threads} window {window}");
            let mut layer = layer(&w, window, isa, threads);
            let full = forward(&mut layer, &x, b, AttendOptions::default());
            let ones = decode_in_chunks(&mut layer, &x, b, &[1], 1);
            assert_bits_eq(&ones, &full, &format!("{context}: token by token"));
            let uneven = [5, 96, 2, 97, 1, 40, 13];
            let chunks = decode_in_chunks(&mut layer, &x, b, &uneven, 97);
            assert_bits_eq(&chunks, &full, &format!("{context}: uneven chunks"));
        }
    }
}

/// Chunked attention keeps a rolling cache too (a query sees no further back than its chunk's
/// start): token by token and in uneven chunks, past several ring lengths, the forward's bits,
/// in the ring of a window as long as the chunk; the forward against the reference.
#[test]
fn chunked_attention_rolls_as_a_window_of_the_chunk() {
    let w = weights();
    let (b, t) = (2, 430);
    let x = Rng::new(17).vec(b * t * D, 1.0);
    for (isa, threads) in configs() {
        for chunk in [1, 7, 96, 97, 150] {
            let context = format!("{isa:?} threads {threads} chunk {chunk}");
            let chunked = |window: Option<usize>| {
                let builder = w
                    .builder(H, Masking::Causal, isa, threads)
                    .chunked_attention(chunk);
                let builder = match window {
                    Some(window) => builder.sliding_window(window),
                    None => builder,
                };
                builder.build().expect("valid chunk")
            };
            let mut layer = chunked(None);
            let full = forward(&mut layer, &x, b, AttendOptions::default());
            if threads == 1 {
                let mut want = w.attend(b, t, H, &x, None, Masking::Causal);
                want.chunk = Some(chunk);
                let want = reference_attend(&want).y;
                assert_close(&full, &want, ABS, REL, &context);
            }
            let ones = decode_in_chunks(&mut layer, &x, b, &[1], 1);
            assert_bits_eq(&ones, &full, &format!("{context}: token by token"));
            let uneven = [5, 96, 2, 97, 1, 40, 13];
            let chunks = decode_in_chunks(&mut layer, &x, b, &uneven, 97);
            assert_bits_eq(&chunks, &full, &format!("{context}: uneven chunks"));
            let ring = layer.new_cache(b, 97).unwrap().bytes();
            let window = self::layer(&w, chunk, isa, threads)
                .new_cache(b, 97)
                .unwrap();
            assert_eq!(
                ring,
                window.bytes(),
                "{context}: the ring of a window of {chunk}"
            );
            // With a window too, the nearer bound sizes the ring.
            let both = chunked(Some(3)).new_cache(b, 97).unwrap();
            let three = self::layer(&w, 3.min(chunk), isa, threads).new_cache(b, 97);
            assert_eq!(both.bytes(), three.unwrap().bytes(), "{context}");
        }
    }
}

/// Ten times the window's length, one token at a time: the forward's bits, and after the
/// first step no allocation at all (the ring was reserved by `new_cache` and never grows).
#[test]
fn ten_windows_in_constant_memory() {
    let w = weights();
    for window in [5, 96] {
        let t = 10 * window + 3;
        let x = Rng::new(8).vec(t * D, 1.0);
        let mut layer = layer(&w, window, Isa::detect(), 1);
        let full = forward(&mut layer, &x, 1, AttendOptions::default());
        let mut cache = layer.new_cache(1, 1).unwrap();
        let shape = format!("{cache:?}").replace(", lengths: [0]", "");
        let mut decoded = vec![f32::NAN; t * D];
        let first = decode(&mut layer, &mut cache, &x[..D], 1, AttendOptions::default());
        decoded[..D].copy_from_slice(&first.unwrap());
        let before = allocations();
        for (step, out) in x.chunks_exact(D).zip(decoded.chunks_exact_mut(D)).skip(1) {
            let input = Tokens::new(step, 1, 1, D).unwrap();
            let output = Output::new(out, 1, 1, D).unwrap();
            layer
                .decode_into(input, &mut cache, AttendOptions::default(), output)
                .unwrap();
        }
        assert_eq!(
            allocations(),
            before,
            "window {window}: the decoding loop allocated"
        );
        assert_bits_eq(&decoded, &full, &format!("window {window}"));
        assert_eq!(cache.lengths(), [t]);
        let after = format!("{cache:?}").replace(&format!(", lengths: [{t}]"), "");
        assert_eq!(after, shape, "the cache's shape and slots did not change");
        // The ring: whole key blocks, bounded by the window, not the sequence.
        let slots = window.div_ceil(96) * 96;
        assert!(shape.contains(&format!("slots: {slots}")), "{shape}");
    }
}

/// A left-padded batch (7 pads before sequence 0's tokens, none before sequence 1's) decodes
/// token by token through a rolling cache with the same two `key_starts` on every step: no
/// mask that grows, no allocation after the first step, the bits of a forward pass with the
/// same `key_starts`, and the f64 reference that hides the pads with a `(B, S)` padding mask,
/// on every instruction set and thread count.
#[test]
fn left_padding_on_a_rolling_cache_in_constant_memory() {
    let w = weights();
    let (b, t, window) = (2, 300, 40);
    let starts = [7, 0];
    let x = Rng::new(31).vec(b * t * D, 1.0);
    let padding: Vec<bool> = (0..b * t).map(|e| e % t >= starts[e / t]).collect();
    let mut want = w.attend(b, t, H, &x, None, Masking::Causal);
    want.window = Some(window);
    want.key_padding_mask = Some(&padding);
    let want = reference_attend(&want);
    let options = AttendOptions {
        key_starts: Some(&starts),
        ..AttendOptions::default()
    };
    for (isa, threads) in configs() {
        let context = format!("{isa:?} threads {threads}");
        let mut layer = layer(&w, window, isa, threads);
        let full = forward(&mut layer, &x, b, options);
        assert_close(&full, &want.y, ABS, REL, &context);
        let mut cache = layer.new_cache(b, 1).unwrap();
        let mut decoded = vec![f32::NAN; b * t * D];
        let (mut tokens, mut out) = (vec![0.0; b * D], vec![0.0; b * D]);
        let mut before = 0;
        for step in 0..t {
            for bi in 0..b {
                tokens[bi * D..][..D].copy_from_slice(&x[(bi * t + step) * D..][..D]);
            }
            let input = Tokens::new(&tokens, b, 1, D).unwrap();
            let output = Output::new(&mut out, b, 1, D).unwrap();
            layer
                .decode_into(input, &mut cache, options, output)
                .unwrap();
            if step == 0 {
                before = allocations();
            }
            for bi in 0..b {
                decoded[(bi * t + step) * D..][..D].copy_from_slice(&out[bi * D..][..D]);
            }
        }
        if threads == 1 {
            assert_eq!(
                allocations(),
                before,
                "{context}: the decoding loop allocated"
            );
        }
        assert_bits_eq(&decoded, &full, &format!("{context}: decoded"));
    }
    let three = AttendOptions {
        key_starts: Some(&[0, 1, 2]),
        ..AttendOptions::default()
    };
    let mut one = layer(&w, window, Isa::detect(), 1);
    let mut cache = one.new_cache(b, 1).unwrap();
    let err = decode(&mut one, &mut cache, &x[..b * D], b, three);
    assert_eq!(
        err.unwrap_err().to_string(),
        "key_starts (B) needs 2 elements, but the buffer has 3"
    );
    assert_eq!(cache.lengths(), [0, 0]);
}

/// The attention weights of a decoding loop through a rolling cache, in steps of 1 and of 3
/// tokens, ten windows long: each step's weights keep only the last `window + L - 1` keys'
/// columns (`L` the step's tokens) and match the f64 reference's probabilities of those keys;
/// once the window is full their buffer, like the cache, never grows, and nothing allocates.
#[test]
fn attention_weights_of_a_rolling_cache_in_constant_memory() {
    let w = weights();
    for (window, step) in [(5, 1), (5, 3), (96, 1), (97, 3)] {
        let t = 10 * window + 3;
        let x = Rng::new(9).vec(t * D, 1.0);
        let mut want = w.attend(1, t, H, &x, None, Masking::Causal);
        want.window = Some(window);
        let want = reference_attend(&want);
        let mut layer = layer(&w, window, Isa::detect(), 1);
        let mut cache = layer.new_cache(1, step).unwrap();
        let mut weights = mha::AttentionWeights::new();
        let mut out = vec![0.0; step * D];
        let mut steady_steps = 0;
        for start in (0..t).step_by(step) {
            let l = step.min(t - start);
            let input = Tokens::new(&x[start * D..][..l * D], 1, l, D).unwrap();
            let output = Output::new(&mut out[..l * D], 1, l, D).unwrap();
            let output = output.with_weights(&mut weights);
            let before = allocations();
            layer
                .decode_into(input, &mut cache, AttendOptions::default(), output)
                .unwrap();
            let allocated = allocations() - before;
            let context = format!("window {window} step {step} at {start}");
            // Past a full window (and a first full step), nothing grows.
            if start >= window + step {
                assert_eq!(allocated, 0, "{context}: the step allocated");
                steady_steps += 1;
            }
            let keys = start + l;
            let columns = keys.min(window + l - 1);
            assert_eq!(weights.shape(), [1, H, l, columns], "{context}");
            let first = keys - columns;
            for h in 0..H {
                for i in 0..l {
                    let row = &want.probs[(h * t + start + i) * t..][first..keys];
                    let got = &weights.head(0, h).unwrap()[i * columns..][..columns];
                    assert_close(got, row, ABS, REL, &format!("{context} head {h} row {i}"));
                }
            }
        }
        assert!(
            steady_steps > 8 * window / step,
            "window {window} step {step}"
        );
    }
}

/// A ragged batch (`token_lengths`) through a rolling cache: each sequence's real rows are the
/// bits of that sequence's own windowed forward.
#[test]
fn ragged_batch_with_window() {
    let w = weights();
    let window = 50;
    // Per step: tokens per sequence and each sequence's real ones.
    let schedule: [(usize, [usize; 3]); 6] = [
        (7, [5, 2, 7]),
        (1, [1, 1, 1]),
        (60, [60, 0, 31]),
        (1, [1, 1, 0]),
        (60, [60, 60, 60]),
        (33, [2, 33, 17]),
    ];
    for (isa, threads) in configs() {
        let mut rng = Rng::new(9);
        let mut layer = layer(&w, window, isa, threads);
        let mut cache = layer.new_cache(3, 60).unwrap();
        let (mut tokens, mut outputs) = (vec![Vec::new(); 3], vec![Vec::new(); 3]);
        for (t, real) in schedule {
            let x = rng.vec(3 * t * D, 1.0);
            let options = AttendOptions {
                token_lengths: Some(&real),
                ..AttendOptions::default()
            };
            let y = decode(&mut layer, &mut cache, &x, 3, options).unwrap();
            for b in 0..3 {
                let rows = b * t * D..(b * t + real[b]) * D;
                tokens[b].extend_from_slice(&x[rows.clone()]);
                outputs[b].extend_from_slice(&y[rows]);
            }
        }
        for b in 0..3 {
            assert_eq!(cache.lengths()[b] * D, tokens[b].len());
            let alone = forward(&mut layer, &tokens[b], 1, AttendOptions::default());
            let context = format!("{isa:?} threads {threads} sequence {b}");
            assert_bits_eq(&outputs[b], &alone, &context);
        }
    }
}

/// Property: a window of at least `T` keys is no window, bit for bit, on random shapes, in a
/// forward and in decoding.
#[test]
fn window_of_at_least_t_is_no_window() {
    let w = weights();
    let mut rng = Rng::new(10);
    for case in 0..12 {
        let b = 1 + rng.next_u64() as usize % 3;
        let t = 1 + rng.next_u64() as usize % 250;
        let window = t + rng.next_u64() as usize % 3 * (rng.next_u64() as usize % 200);
        let x = rng.vec(b * t * D, 1.0);
        let isa = Isa::detect();
        let mut plain = w.layer(H, Masking::Causal, isa, 2);
        let mut windowed = layer(&w, window, isa, 2);
        let context = format!("case {case}: b {b} t {t} window {window}");
        let want = forward(&mut plain, &x, b, AttendOptions::default());
        let got = forward(&mut windowed, &x, b, AttendOptions::default());
        assert_bits_eq(&got, &want, &context);
        let decoded = decode_in_chunks(&mut windowed, &x, b, &[1 + t / 3], 1 + t / 3);
        assert_bits_eq(&decoded, &want, &format!("{context}: decoded"));
    }
}

/// Bad windows and chunks are errors naming the numbers; a refused chunk leaves the cache as
/// it was.
#[test]
fn errors() {
    let w = weights();
    let isa = Isa::detect();
    let zero = w
        .builder(H, Masking::Causal, isa, 1)
        .sliding_window(0)
        .build();
    assert_eq!(zero.err(), Some(ShapeError::ZeroWindow));
    let bidirectional = w
        .builder(H, Masking::Bidirectional, isa, 1)
        .sliding_window(4);
    let err = bidirectional.build().unwrap_err();
    assert_eq!(err, ShapeError::WindowNeedsCausal { window: 4 });
    assert!(err.to_string().contains("window 4"), "{err}");

    let mut layer = layer(&w, 10, isa, 1);
    let mut cache = layer.new_cache(2, 3).unwrap();
    let x = Rng::new(11).vec(2 * 4 * D, 1.0);
    decode(
        &mut layer,
        &mut cache,
        &batch_rows(&x, 2, D, 0..3),
        2,
        AttendOptions::default(),
    )
    .unwrap();
    let err = decode(&mut layer, &mut cache, &x, 2, AttendOptions::default()).unwrap_err();
    let want = ShapeError::WindowChunk {
        sequence: 0,
        new: 4,
        chunk: 3,
        window: 10,
    };
    assert_eq!(err, want);
    let text = err.to_string();
    for number in ["window 10", "at most 3", "sequence 0", "appends 4"] {
        assert!(text.contains(number), "{text}");
    }
    assert_eq!(cache.lengths(), [3, 3], "the refused call appended nothing");
    // Per sequence: the second appends too many.
    let options = AttendOptions {
        token_lengths: Some(&[2, 4]),
        ..AttendOptions::default()
    };
    let err = decode(&mut layer, &mut cache, &x, 2, options).unwrap_err();
    assert!(
        matches!(
            err,
            ShapeError::WindowChunk {
                sequence: 1,
                new: 4,
                ..
            }
        ),
        "{err}"
    );

    // A rolling cache belongs to its window.
    let mut other = self::layer(&w, 11, isa, 1);
    let step = batch_rows(&x, 2, D, 0..1);
    let err = decode(&mut other, &mut cache, &step, 2, AttendOptions::default()).unwrap_err();
    assert_eq!(err, ShapeError::CacheMismatch);
    // A plain layer's cache is not rolling, and works with a windowed layer within capacity.
    let mut plain_cache = w.layer(H, Masking::Causal, isa, 1).new_cache(2, 4).unwrap();
    assert!(decode(
        &mut layer,
        &mut plain_cache,
        &x,
        2,
        AttendOptions::default()
    )
    .is_ok());
}

/// A rolling cache under every position-dependent setting at once (ALiBi, RoPE) and the other
/// score terms (soft cap, sinks): decoding past twice the window gives the forward's bits, and
/// the forward matches the f64 reference with the window and the terms (RoPE left out of the
/// reference comparison: its own tests cover it).
#[test]
fn rolling_cache_with_alibi_softcap_sinks_and_rope() {
    let w = weights();
    let (b, t, window) = (2, 230, 40);
    let x = Rng::new(21).vec(b * t * D, 1.0);
    let sinks = vec![0.5, -1.0, f32::NEG_INFINITY, 0.0, 2.0, -0.25];
    let rope = mha::Rope {
        theta: 1000.0,
        rotary_dim: 2,
        layout: mha::RopeLayout::RotateHalf,
        scaling: mha::RopeScaling::Default,
    };
    for (isa, threads) in configs() {
        let context = format!("{isa:?} threads {threads}");
        let build = |with_rope: bool| {
            let builder = w
                .builder(H, Masking::Causal, isa, threads)
                .sliding_window(window)
                .alibi(mha::Alibi::Standard)
                .softcap(3.0)
                .sinks(sinks.clone());
            let builder = if with_rope {
                builder.rope(rope)
            } else {
                builder
            };
            builder.build().unwrap()
        };
        for with_rope in [false, true] {
            let mut layer = build(with_rope);
            let full = forward(&mut layer, &x, b, AttendOptions::default());
            let ones = decode_in_chunks(&mut layer, &x, b, &[1], 1);
            let context = format!("{context}, RoPE {with_rope}");
            assert_bits_eq(&ones, &full, &format!("{context}: token by token"));
            let chunks = decode_in_chunks(&mut layer, &x, b, &[7, 33, 1, 96], 96);
            assert_bits_eq(&chunks, &full, &format!("{context}: chunks"));
            if !with_rope {
                let slopes = layer.alibi_slopes().unwrap().to_vec();
                let mut want = w.attend(b, t, H, &x, None, Masking::Causal);
                want.window = Some(window);
                want.terms.slopes = Some(&slopes);
                want.terms.cap = Some(3.0);
                want.terms.sinks = Some(&sinks);
                let want = reference_attend(&want);
                assert_close(&full, &want.y, ABS, REL, &context);
            }
        }
    }
}
