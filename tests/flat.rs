//! Ragged (flat, variable-length) batches: `Tokens::ragged` holds each sequence's new tokens
//! one after another with no padding rows. Through a paged cache, calls mixing prompts, single
//! tokens and sequences adding nothing give each sequence the bits of decoding it alone
//! through a one-sequence `KvCache` (every `KvFormat`, with a window and RoPE, chunked
//! attention, ALiBi with a soft cap and sinks; every instruction set, 1 and 3 threads). A
//! ragged forward pass gives each sequence the bits of its own forward pass and is within
//! 1e-4 of the f64 reference; a ragged decoding step through a `KvCache` gives the bits of the
//! padded call with `token_lengths`, with default and explicit positions; its attention
//! weights are each sequence's own. Combinations the calls cannot take are errors naming the
//! numbers.

mod common;

use common::modes::{configs, Weights, ABS, REL};
use common::{assert_bits_eq, assert_close, reference_attend, Rng};
use mha::{Alibi, AttendOptions, AttentionWeights, KvCache, KvFormat, Layer, Masking};
use mha::{MhaBuilder, Output, PagedCache, Rope, RopeLayout, RopeScaling, ShapeError, Tokens};

const D: usize = 12;
const KV: usize = 4;
/// 6 query heads of width 2 over 2 key/value heads.
const H: usize = 6;

/// One ragged call: the sequences it names (indices into the test's) and each one's tokens.
struct Step {
    members: &'static [usize],
    tokens: &'static [usize],
}

/// Prompts of different lengths beside single tokens, a sequence adding nothing, subsets in
/// another order, and long prompts that carry sequences across the 96-token blocks.
const SCHEDULE: &[Step] = &[
    Step {
        members: &[0, 1, 2, 3],
        tokens: &[5, 1, 7, 0],
    },
    Step {
        members: &[1],
        tokens: &[1],
    },
    Step {
        members: &[2, 0, 3],
        tokens: &[100, 1, 130],
    },
    Step {
        members: &[0, 1, 2, 3],
        tokens: &[1, 1, 1, 1],
    },
    Step {
        members: &[3, 1, 2],
        tokens: &[1, 120, 0],
    },
    Step {
        members: &[0, 2, 1, 3],
        tokens: &[3, 1, 1, 2],
    },
];
const SEQUENCES: usize = 4;

/// `x`, ragged by `tokens`, through `decode_paged` for `ids`; its ragged output.
fn paged(
    layer: &mut Layer,
    cache: &mut PagedCache,
    ids: &[usize],
    (x, tokens): (&[f32], &[usize]),
) -> Result<Vec<f32>, ShapeError> {
    let width = layer.widths().d_model;
    let mut out = vec![f32::NAN; x.len()];
    let input = Tokens::ragged(x, tokens, width)?;
    let output = Output::ragged(&mut out, tokens, width)?;
    layer.decode_paged(input, cache, ids, AttendOptions::default(), output)?;
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

/// Runs [`SCHEDULE`] as ragged calls through a paged cache of `layer` and checks each
/// sequence's rows against its chunks decoded alone through a `KvCache`, bit for bit.
fn schedule(layer: &mut Layer, context: &str) {
    let width = layer.widths().d_model;
    let mut rng = Rng::new(5);
    let mut cache = layer.new_paged_cache(16).unwrap();
    let ids: Vec<usize> = (0..SEQUENCES)
        .map(|_| cache.add_sequence().unwrap())
        .collect();
    let mut seen = vec![Vec::new(); SEQUENCES];
    let mut chunks = vec![Vec::new(); SEQUENCES];
    for step in SCHEDULE {
        let rows: usize = step.tokens.iter().sum();
        let x = rng.vec(rows * width, 1.0);
        let call_ids: Vec<usize> = step.members.iter().map(|&s| ids[s]).collect();
        let y = paged(layer, &mut cache, &call_ids, (&x, step.tokens)).unwrap();
        let mut row = 0;
        for (&s, &tokens) in step.members.iter().zip(step.tokens) {
            let rows = row * width..(row + tokens) * width;
            seen[s].extend_from_slice(&y[rows.clone()]);
            if tokens > 0 {
                chunks[s].push(x[rows].to_vec());
            }
            row += tokens;
        }
    }
    for s in 0..SEQUENCES {
        let mut kv = layer.new_cache(1, 400).unwrap();
        let want: Vec<f32> = chunks[s]
            .iter()
            .flat_map(|x| alone(layer, &mut kv, x))
            .collect();
        assert_eq!(cache.len(ids[s]).unwrap(), want.len() / width, "{context}");
        assert_bits_eq(&seen[s], &want, &format!("{context}, sequence {s}"));
    }
}

const ROPE: Rope = Rope {
    theta: 500.0,
    rotary_dim: 2,
    layout: RopeLayout::RotateHalf,
    scaling: RopeScaling::Default,
};

/// The settings the ragged calls are checked with, by name.
type Settings = fn(MhaBuilder<'_, D, D, KV>) -> MhaBuilder<'_, D, D, KV>;
const SETTINGS: [(&str, Settings); 4] = [
    ("plain", |b| b),
    ("window 50, RoPE, value norm", |b| {
        b.sliding_window(50).rope(ROPE).value_norm(1e-6)
    }),
    ("chunks of 40, RoPE", |b| b.chunked_attention(40).rope(ROPE)),
    ("ALiBi, soft cap, sinks", |b| {
        b.alibi(Alibi::Standard).softcap(3.0).sinks(vec![
            0.5,
            -1.0,
            2.0,
            f32::NEG_INFINITY,
            0.0,
            1.0,
        ])
    }),
];

#[test]
fn each_sequence_of_a_ragged_batch_as_if_alone() {
    let weights = Weights::<D, D, KV>::random(7, [true; 4]);
    for (isa, threads) in configs() {
        for format in [KvFormat::F32, KvFormat::Bf16, KvFormat::F16, KvFormat::Q8_0] {
            for (name, set) in SETTINGS {
                let builder = weights.builder(H, Masking::Causal, isa, threads);
                let builder = set(builder.key_format(format).value_format(format));
                let mut layer = builder.build().unwrap().into_layer();
                schedule(
                    &mut layer,
                    &format!("{isa:?}, {threads} threads, {format:?}, {name}"),
                );
            }
        }
    }
}

/// A ragged forward pass gives each sequence its own forward pass's bits, and the f64
/// reference's values, causal and bidirectional.
#[test]
fn a_ragged_forward_is_each_sequence_alone() {
    let weights = Weights::<D, D, KV>::random(11, [true; 4]);
    let lengths = [5, 0, 130, 1, 17];
    let rows: usize = lengths.iter().sum();
    let x = Rng::new(3).vec(rows * D, 1.0);
    for (isa, threads) in configs() {
        for masking in [Masking::Causal, Masking::Bidirectional] {
            let mut layer = weights.layer(H, masking, isa, threads).into_layer();
            let got = layer
                .forward(Tokens::ragged(&x, &lengths, D).unwrap())
                .unwrap();
            let context = format!("{isa:?}, {threads} threads, {masking:?}");
            let mut row = 0;
            for (s, &len) in lengths.iter().enumerate() {
                let (xs, ys) = (&x[row * D..][..len * D], &got[row * D..][..len * D]);
                let alone = layer.forward(Tokens::new(xs, 1, len, D).unwrap()).unwrap();
                let context = format!("{context}, sequence {s}");
                assert_bits_eq(ys, &alone, &context);
                let want = reference_attend(&weights.attend(1, len, H, xs, None, masking)).y;
                assert_close(ys, &want, ABS, REL, &context);
                row += len;
            }
        }
    }
}

/// The attention weights of a ragged forward pass: each sequence's rows are those of its own
/// forward pass (bit for bit), the rows past a shorter sequence's length zeros.
#[test]
fn a_ragged_call_writes_each_sequences_weights() {
    let weights = Weights::<D, D, KV>::random(19, [false; 4]);
    let lengths = [3, 0, 5, 1];
    let rows: usize = lengths.iter().sum();
    let x = Rng::new(6).vec(rows * D, 1.0);
    let (longest, keys) = (5, 5);
    for (isa, threads) in configs() {
        let mut layer = weights.layer(H, Masking::Causal, isa, threads).into_layer();
        let mut all = AttentionWeights::new();
        let mut y = vec![0.0; rows * D];
        let out = Output::ragged(&mut y, &lengths, D).unwrap();
        let x_ragged = Tokens::ragged(&x, &lengths, D).unwrap();
        let none = AttendOptions::default();
        layer
            .forward_into(x_ragged, none, out.with_weights(&mut all))
            .unwrap();
        assert_eq!(all.shape(), [4, H, longest, keys]);
        let mut row = 0;
        for (b, &len) in lengths.iter().enumerate() {
            let mut alone = AttentionWeights::new();
            let mut y = vec![0.0; len * D];
            let out = Output::new(&mut y, 1, len, D).unwrap();
            let x_alone = Tokens::new(&x[row * D..][..len * D], 1, len, D).unwrap();
            layer
                .forward_into(x_alone, none, out.with_weights(&mut alone))
                .unwrap();
            for h in 0..H {
                for (i, j) in (0..longest).flat_map(|i| (0..keys).map(move |j| (i, j))) {
                    let real = i < len && j < len;
                    let want = if real {
                        alone.get(0, h, i, j)
                    } else {
                        Some(0.0)
                    };
                    let got = all.get(b, h, i, j);
                    let context = format!("{isa:?}, {threads} threads, ({b}, {h}, {i}, {j})");
                    assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "{context}");
                }
            }
            row += len;
        }
    }
}

/// A ragged decoding step through a `KvCache` gives the bits of the same step padded to the
/// longest sequence with `token_lengths` (default positions, then explicit ones).
#[test]
fn a_ragged_step_equals_the_padded_one() {
    let weights = Weights::<D, D, KV>::random(13, [true; 4]);
    let lengths = [1, 3, 0, 2];
    let (batch, longest, rows) = (4, 3, 6);
    let mut rng = Rng::new(4);
    let prompt = rng.vec(batch * 4 * D, 1.0);
    let ragged_x = rng.vec(rows * D, 1.0);
    let ragged_positions = [40, 7, 8, 9, 20, 21];
    // The same rows and positions padded: sequence b's first, zeros (position 0) after.
    let mut padded_x = vec![0.0; batch * longest * D];
    let mut padded_positions = vec![0; batch * longest];
    let mut row = 0;
    for (b, &len) in lengths.iter().enumerate() {
        padded_x[b * longest * D..][..len * D].copy_from_slice(&ragged_x[row * D..][..len * D]);
        padded_positions[b * longest..][..len].copy_from_slice(&ragged_positions[row..][..len]);
        row += len;
    }
    for (isa, threads) in configs() {
        let mut layer = weights
            .builder(H, Masking::Causal, isa, threads)
            .rope(ROPE)
            .build()
            .unwrap()
            .into_layer();
        for explicit in [false, true] {
            let run = |layer: &mut Layer, ragged: bool| {
                let mut cache = layer.new_cache(batch, 10).unwrap();
                let mut prefill = vec![0.0; prompt.len()];
                let (x, out) = (
                    Tokens::new(&prompt, batch, 4, D),
                    Output::new(&mut prefill, batch, 4, D),
                );
                let none = AttendOptions::default();
                layer
                    .decode_into(x.unwrap(), &mut cache, none, out.unwrap())
                    .unwrap();
                let mut y = vec![f32::NAN; if ragged { rows } else { batch * longest } * D];
                let options = AttendOptions {
                    token_lengths: (!ragged).then_some(&lengths[..]),
                    positions: explicit.then_some(match ragged {
                        true => &ragged_positions[..],
                        false => &padded_positions[..],
                    }),
                    ..AttendOptions::default()
                };
                let (x, out) = match ragged {
                    true => (
                        Tokens::ragged(&ragged_x, &lengths, D),
                        Output::ragged(&mut y, &lengths, D),
                    ),
                    false => (
                        Tokens::new(&padded_x, batch, longest, D),
                        Output::new(&mut y, batch, longest, D),
                    ),
                };
                layer
                    .decode_into(x.unwrap(), &mut cache, options, out.unwrap())
                    .unwrap();
                (y, cache.lengths().to_vec())
            };
            let (ragged, ragged_lengths) = run(&mut layer, true);
            let (padded, padded_lengths) = run(&mut layer, false);
            assert_eq!(ragged_lengths, [5, 7, 4, 6]);
            assert_eq!(ragged_lengths, padded_lengths);
            let context = format!("{isa:?}, {threads} threads, explicit positions {explicit}");
            let mut row = 0;
            for (b, &len) in lengths.iter().enumerate() {
                let want = &padded[b * longest * D..][..len * D];
                let got = &ragged[row * D..][..len * D];
                assert_bits_eq(got, want, &format!("{context}, sequence {b}"));
                row += len;
            }
        }
    }
}

/// What ragged tokens cannot be combined with, and outputs that do not hold the same
/// sequences, are errors naming the numbers; the cache is unchanged.
#[test]
fn ragged_errors_name_the_numbers() {
    let weights = Weights::<D, D, KV>::random(17, [false; 4]);
    let mut layer = weights
        .layer(H, Masking::Causal, mha::Isa::detect(), 1)
        .into_layer();
    let x = vec![0.5; 4 * D];
    let lengths = [3, 1];
    let ragged = || Tokens::ragged(&x, &lengths, D).unwrap();
    let mut y = vec![0.0; 4 * D];
    let mut cache = layer.new_cache(2, 8).unwrap();
    let with_lengths = AttendOptions {
        token_lengths: Some(&[3, 1]),
        ..AttendOptions::default()
    };
    let out = Output::ragged(&mut y, &lengths, D).unwrap();
    let err = layer
        .decode_into(ragged(), &mut cache, with_lengths, out)
        .unwrap_err();
    assert!(matches!(err, ShapeError::Ragged { .. }), "{err}");
    let out = Output::new(&mut y, 2, 2, D).unwrap();
    let err = layer.decode_into(ragged(), &mut cache, AttendOptions::default(), out);
    assert_eq!(
        err.unwrap_err(),
        ShapeError::RaggedOutput {
            sequence: 0,
            tokens: 3,
            output: None
        }
    );
    let out = Output::ragged(&mut y, &[2, 2], D).unwrap();
    let err = layer.decode_into(ragged(), &mut cache, AttendOptions::default(), out);
    let err = err.unwrap_err();
    let want = ShapeError::RaggedOutput {
        sequence: 0,
        tokens: 3,
        output: Some(2),
    };
    assert_eq!(err, want);
    assert_eq!(
        err.to_string(),
        "sequence 0 of the ragged tokens has 3 rows, but its output has 2"
    );
    assert_eq!(cache.lengths(), [0, 0]);
    let out = Output::ragged(&mut y, &lengths, D).unwrap();
    let err = layer.cross_into(ragged(), ragged(), AttendOptions::default(), out);
    assert_eq!(
        err.unwrap_err().to_string(),
        "ragged tokens (a length per sequence) cannot be used with cross-attention"
    );
    let uniform = Tokens::new(&x, 2, 2, D).unwrap();
    let out = Output::ragged(&mut y, &lengths, D).unwrap();
    let err = layer.forward_into(uniform, AttendOptions::default(), out);
    assert!(matches!(err, Err(ShapeError::Ragged { .. })));
    assert!(matches!(
        Tokens::ragged(&x, &[usize::MAX, 2], D),
        Err(ShapeError::Overflow { .. })
    ));
}
