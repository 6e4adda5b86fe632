//! The paged KV cache (`Layer::new_paged_cache`, `Layer::decode_paged`): sequences decoded in
//! batches of changing composition (different sequences per call, in any order, with
//! different numbers of real tokens) give each sequence's rows bit for bit as decoding that
//! sequence alone through a one-sequence `KvCache` with the same steps (the independent path),
//! in every `KvFormat`, with and without a sliding window and RoPE, on 1 and 3 threads; and
//! within 1e-4 of the f64 reference of the sequence's causal attention for heads of width 2,
//! 10 and 80 across 96-token blocks. A windowed sequence decodes without end in two blocks.
//! A forked or truncated sequence decodes as a fresh prefill of the same tokens would. A full
//! pool, an unknown or repeated sequence and a bad truncation are errors naming the numbers
//! that leave the cache as it was.
//!
//! Tolerance against the reference: |got - want| <= 1e-4 + 1e-4 * |want| elementwise.

mod common;

use common::modes::{Weights, ABS, REL};
use common::{assert_bits_eq, assert_close, reference_attend, Rng};
use mha::PagedCache;
use mha::{AttendOptions, Isa, KvCache, KvFormat, Layer, Masking, Mha, MhaBuilder, Output};
use mha::{Rope, RopeLayout, RopeScaling, ShapeError, Tokens};

/// One call: the sequences (indices into the test's sequences), `T` rows each, and each
/// one's real tokens.
struct Step {
    members: &'static [usize],
    tokens: usize,
    real: &'static [usize],
}

/// Prompts of different lengths, single tokens, calls naming a subset in another order, and
/// long calls that carry sequences across the 96-token blocks (and windows past them).
const SCHEDULE: &[Step] = &[
    Step {
        members: &[0, 1, 2],
        tokens: 7,
        real: &[5, 2, 7],
    },
    Step {
        members: &[1],
        tokens: 1,
        real: &[1],
    },
    Step {
        members: &[2, 0],
        tokens: 100,
        real: &[100, 90],
    },
    Step {
        members: &[0, 1, 2],
        tokens: 1,
        real: &[1, 1, 1],
    },
    Step {
        members: &[1, 2],
        tokens: 120,
        real: &[120, 3],
    },
    Step {
        members: &[0, 2, 1],
        tokens: 1,
        real: &[1, 1, 1],
    },
    Step {
        members: &[2],
        tokens: 2,
        real: &[2],
    },
];
const SEQUENCES: usize = 3;

/// Every supported instruction set on 1 and 3 threads.
fn configs() -> Vec<(Isa, usize)> {
    let isas = Isa::ALL.into_iter().filter(|isa| isa.is_supported());
    isas.flat_map(|isa| [(isa, 1), (isa, 3)]).collect()
}

/// `x (B, T, width)` through `decode_paged` for `ids`; its output.
fn paged(
    layer: &mut Layer,
    cache: &mut PagedCache,
    ids: &[usize],
    (x, tokens): (&[f32], usize),
    real: Option<&[usize]>,
) -> Result<Vec<f32>, ShapeError> {
    let (batch, width) = (ids.len(), layer.widths().d_model);
    let mut out = vec![f32::NAN; x.len()];
    let options = AttendOptions {
        token_lengths: real,
        ..AttendOptions::default()
    };
    let input = Tokens::new(x, batch, tokens, width)?;
    let output = Output::new(&mut out, batch, tokens, width)?;
    layer.decode_paged(input, cache, ids, options, output)?;
    Ok(out)
}

/// `x (1, T, width)` through `decode_into` with a one-sequence cache; its output.
fn alone(layer: &mut Layer, cache: &mut KvCache, x: &[f32]) -> Vec<f32> {
    let width = layer.widths().d_model;
    let tokens = x.len() / width;
    let mut out = vec![f32::NAN; x.len()];
    let input = Tokens::new(x, 1, tokens, width).unwrap();
    let output = Output::new(&mut out, 1, tokens, width).unwrap();
    (layer.decode_into(input, cache, AttendOptions::default(), output)).unwrap();
    out
}

/// Runs [`SCHEDULE`] through a paged cache of `layer`; checks each sequence's real rows
/// against its chunks alone through a `KvCache`, bit for bit, and returns each sequence's
/// tokens and outputs.
fn schedule(layer: &mut Layer, context: &str) -> Vec<(Vec<f32>, Vec<f32>)> {
    let width = layer.widths().d_model;
    let mut rng = Rng::new(5);
    let mut cache = layer.new_paged_cache(12).unwrap();
    let ids: Vec<usize> = (0..SEQUENCES)
        .map(|_| cache.add_sequence().unwrap())
        .collect();
    let mut seen = vec![(Vec::new(), Vec::new()); SEQUENCES];
    let mut chunks = vec![Vec::new(); SEQUENCES];
    for step in SCHEDULE {
        let x = rng.vec(step.members.len() * step.tokens * width, 1.0);
        let call_ids: Vec<usize> = step.members.iter().map(|&s| ids[s]).collect();
        let y = paged(
            layer,
            &mut cache,
            &call_ids,
            (&x, step.tokens),
            Some(step.real),
        )
        .unwrap();
        for (b, (&s, &real)) in step.members.iter().zip(step.real).enumerate() {
            let rows = b * step.tokens * width..(b * step.tokens + real) * width;
            seen[s].0.extend_from_slice(&x[rows.clone()]);
            seen[s].1.extend_from_slice(&y[rows.clone()]);
            chunks[s].push(x[rows].to_vec());
        }
    }
    for s in 0..SEQUENCES {
        assert_eq!(
            cache.len(ids[s]).unwrap(),
            seen[s].0.len() / width,
            "{context}"
        );
        let mut kv = layer.new_cache(1, 400).unwrap();
        let want: Vec<f32> = chunks[s]
            .iter()
            .flat_map(|x| alone(layer, &mut kv, x))
            .collect();
        assert_bits_eq(&seen[s].1, &want, &format!("{context}, sequence {s}"));
    }
    seen
}

const FORMATS: [KvFormat; 4] = [KvFormat::F32, KvFormat::Bf16, KvFormat::F16, KvFormat::Q8_0];

/// 6 query heads of width 2 over 2 key/value heads; every format, with and without a window,
/// RoPE and a value norm, every instruction set, 1 and 3 threads.
#[test]
fn each_sequence_as_if_alone() {
    let weights = Weights::<12, 12, 4>::random(7, [true; 4]);
    let rope = Rope {
        theta: 500.0,
        rotary_dim: 2,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    };
    for (isa, threads) in configs() {
        for format in FORMATS {
            for windowed in [false, true] {
                let mut builder = weights.builder(6, Masking::Causal, isa, threads);
                builder = builder.key_format(format).value_format(format);
                if windowed {
                    builder = builder.sliding_window(50).rope(rope).value_norm(1e-6);
                }
                let mut layer = builder.build().unwrap().into_layer();
                let context = format!("{isa:?}, {threads} threads, {format:?}, window {windowed}");
                schedule(&mut layer, &context);
            }
        }
    }
}

/// Each sequence's outputs against the f64 reference of its causal attention, for heads of
/// width `KV` (one key/value head) under 2 query heads.
fn against_reference<const D: usize, const KV: usize>(seed: u64) {
    let weights = Weights::<D, D, KV>::random(seed, [true; 4]);
    for (isa, threads) in configs() {
        let mut layer = weights.layer(2, Masking::Causal, isa, threads).into_layer();
        let context = format!("d {KV}, {isa:?}, {threads} threads");
        for (s, (tokens, out)) in schedule(&mut layer, &context).iter().enumerate() {
            let len = tokens.len() / D;
            let a = weights.attend(1, len, 2, tokens, None, Masking::Causal);
            let want = reference_attend(&a).y;
            assert_close(out, &want, ABS, REL, &format!("{context}, sequence {s}"));
        }
    }
}

#[test]
fn odd_head_widths_match_the_reference() {
    against_reference::<20, 10>(11);
    against_reference::<160, 80>(13);
}

/// A small layer (2 heads of 2) on the detected instruction set.
fn small(window: Option<usize>) -> (Weights<4, 4, 4>, Layer) {
    small_with(|builder| match window {
        Some(window) => builder.sliding_window(window),
        None => builder,
    })
}

/// [`small`] with the settings `set` adds.
fn small_with(
    set: impl FnOnce(MhaBuilder<'_, 4, 4, 4>) -> MhaBuilder<'_, 4, 4, 4>,
) -> (Weights<4, 4, 4>, Layer) {
    let weights = Weights::<4, 4, 4>::random(3, [false; 4]);
    let builder = set(Mha::builder(&weights.params, 2).threads(1));
    let layer = builder.build().unwrap().into_layer();
    (weights, layer)
}

/// One sequence decodes 500 tokens one at a time in a pool of two blocks (it gives back each
/// block no query can reach again), to the bits of a rolling `KvCache`: with a window of 10,
/// and with chunks of 10 (chunked attention).
#[test]
fn a_window_or_a_chunk_decodes_for_ever_in_two_blocks() {
    let window = small(Some(10)).1;
    let chunked = small_with(|builder| builder.chunked_attention(10)).1;
    for (name, mut layer) in [("window", window), ("chunk", chunked)] {
        let mut cache = layer.new_paged_cache(2).unwrap();
        let id = cache.add_sequence().unwrap();
        let mut kv = layer.new_cache(1, 1).unwrap();
        let mut rng = Rng::new(9);
        for t in 0..500 {
            let x = rng.vec(4, 1.0);
            let got = paged(&mut layer, &mut cache, &[id], (&x, 1), None).unwrap();
            let context = format!("{name}: token {t}");
            assert_bits_eq(&got, &alone(&mut layer, &mut kv, &x), &context);
        }
        assert_eq!(cache.len(id).unwrap(), 500);
        // The last 10 keys lie in one block (480..500).
        assert_eq!(cache.free_blocks(), 1, "{name}");
    }
}

/// Tokens `x (T, 4)` of a fresh sequence, prefilled in one call through a `KvCache`, then
/// `next`: the outputs for `next`.
fn fresh(layer: &mut Layer, prefix: &[f32], next: &[f32]) -> Vec<f32> {
    let mut kv = layer.new_cache(1, 400).unwrap();
    alone(layer, &mut kv, prefix);
    alone(layer, &mut kv, next)
}

/// A fork shares its prompt's blocks and continues as a fresh prefill of the prompt would;
/// so does the original, and a truncated sequence continues as a fresh prefill of its kept
/// tokens. Removing every sequence frees every block.
#[test]
fn forks_and_truncations_decode_as_fresh_prefills() {
    let (_, mut layer) = small(None);
    let mut rng = Rng::new(21);
    let prompt = rng.vec(130 * 4, 1.0);
    let mut cache = layer.new_paged_cache(6).unwrap();
    let a = cache.add_sequence().unwrap();
    paged(&mut layer, &mut cache, &[a], (&prompt, 130), None).unwrap();
    let b = cache.fork(a).unwrap();
    assert_eq!((cache.len(b).unwrap(), cache.free_blocks()), (130, 4));
    // Both append to the shared partial block: each copies it for itself... the first to
    // write does, the other then holds the original alone.
    let (xa, xb) = (rng.vec(5 * 4, 1.0), rng.vec(5 * 4, 1.0));
    let both = [xa.clone(), xb.clone()].concat();
    let got = paged(&mut layer, &mut cache, &[b, a], (&both, 5), None).unwrap();
    assert_eq!(cache.free_blocks(), 3);
    assert_bits_eq(&got[..20], &fresh(&mut layer, &prompt, &xa), "fork");
    assert_bits_eq(&got[20..], &fresh(&mut layer, &prompt, &xb), "original");
    // Roll the original back past its own tokens and into the prompt's first block.
    cache.truncate(a, 90).unwrap();
    assert_eq!(cache.free_blocks(), 4);
    let xc = rng.vec(3 * 4, 1.0);
    let got = paged(&mut layer, &mut cache, &[a], (&xc, 3), None).unwrap();
    assert_bits_eq(
        &got,
        &fresh(&mut layer, &prompt[..90 * 4], &xc),
        "truncated",
    );
    // The fork still decodes from its own tokens.
    let xd = rng.vec(4, 1.0);
    let got = paged(&mut layer, &mut cache, &[b], (&xd, 1), None).unwrap();
    let kept = [&prompt[..], &xa].concat();
    assert_bits_eq(
        &got,
        &fresh(&mut layer, &kept, &xd),
        "fork after truncation",
    );
    cache.remove_sequence(a).unwrap();
    cache.remove_sequence(b).unwrap();
    assert_eq!(cache.free_blocks(), 6);
    assert_eq!(cache.add_sequence().unwrap(), 0, "ids are reused");
}

/// A full pool, unknown and repeated ids and bad truncations are errors naming the numbers,
/// and leave the cache as it was.
#[test]
fn errors_name_the_numbers() {
    let (_, mut layer) = small(None);
    let mut cache = layer.new_paged_cache(2).unwrap();
    let a = cache.add_sequence().unwrap();
    let x = vec![0.5; 200 * 4];
    let err = paged(&mut layer, &mut cache, &[a], (&x, 200), None).unwrap_err();
    let full = ShapeError::PoolFull {
        needed: 3,
        free: 2,
        blocks: 2,
    };
    assert_eq!(err, full);
    assert_eq!(
        err.to_string(),
        "paged KV cache of 2 blocks has 2 free, but the call needs 3"
    );
    assert_eq!((cache.len(a).unwrap(), cache.free_blocks()), (0, 2));
    let err = paged(&mut layer, &mut cache, &[a, a], (&x[..8], 1), None).unwrap_err();
    assert_eq!(
        err,
        ShapeError::RepeatedSequence {
            id: a,
            elements: [0, 1]
        }
    );
    let err = paged(&mut layer, &mut cache, &[5], (&x[..4], 1), None).unwrap_err();
    assert_eq!(err, ShapeError::SequenceId { id: 5, ids: 1 });
    paged(&mut layer, &mut cache, &[a], (&x[..40], 10), None).unwrap();
    let err = cache.truncate(a, 11).unwrap_err();
    let truncate = ShapeError::Truncate {
        id: a,
        length: 11,
        held: 10,
        kept_from: 0,
    };
    assert_eq!(err, truncate);
    assert_eq!(cache.len(a).unwrap(), 10);
    let other = small(Some(3)).1.new_paged_cache(1).unwrap();
    let mut other = other;
    let b = other.add_sequence().unwrap();
    let err = paged(&mut layer, &mut other, &[b], (&x[..4], 1), None).unwrap_err();
    assert_eq!(err, ShapeError::CacheMismatch);
}
