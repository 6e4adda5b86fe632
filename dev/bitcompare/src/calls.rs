//! The calls every run-time layer gets: forward passes with each set of per-call options and
//! the attention weights, cross-attention, and decoding through a cache in steps of several
//! sizes, with options, weights, ragged batches and a restarted sequence.
use mha::*;

use crate::layer::Shape;
use crate::{show, weights_hash, Rng};

/// How many calls a layer gets.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Every option set and every way of decoding.
    Full,
    /// The forward pass, with all options at once and the weights, and decoding by 1, 7 and
    /// 3 tokens (with options and weights).
    Light,
}

/// The input of a case: `x (b, t, D)` and, for cross-attention, `memory (b, s, E)`.
pub struct Input {
    pub b: usize,
    pub t: usize,
    pub d: usize,
    pub x: Vec<f32>,
    pub s: usize,
    pub e: usize,
    pub memory: Vec<f32>,
}

impl Input {
    pub fn random(shape: &Shape, rng: &mut Rng) -> Self {
        let (b, t, s) = (shape.b, shape.t, shape.s);
        let (d, e) = (shape.widths.d_model, shape.widths.memory);
        let x = rng.vec(b * t * d, 1.0);
        let memory = if e == d {
            Vec::new()
        } else {
            rng.vec(b * s * e, 1.0)
        };
        Input {
            b,
            t,
            d,
            x,
            s,
            e,
            memory,
        }
    }

    /// Tokens `t0 .. t0 + len` of every sequence, `(b, len, D)`.
    fn rows(&self, t0: usize, len: usize) -> Vec<f32> {
        let d = self.d;
        (0..self.b)
            .flat_map(|b| &self.x[(b * self.t + t0) * d..][..len * d])
            .copied()
            .collect()
    }
}

/// Per-call limits and masks of `b` sequences of `t` queries over `s` keys, from formulas
/// (holes, -inf entries, far rotary positions), the rotary positions continuing from `start`.
struct Masks {
    key_lengths: Vec<usize>,
    padding: Vec<bool>,
    key_starts: Vec<usize>,
    bool_shared: Vec<bool>,
    bool_per_batch: Vec<bool>,
    additive_shared: Vec<f32>,
    additive_per_batch: Vec<f32>,
    token_lengths: Vec<usize>,
    positions: Vec<usize>,
}

/// An additive mask entry: `-inf` for some, else a small finite value.
fn additive(k: usize) -> f32 {
    match k % 6 {
        0 => f32::NEG_INFINITY,
        _ => (k % 17) as f32 * 0.1 - 0.8,
    }
}

/// The rotary position of token `t` of sequence `b`: continuing from `start` shifted by 5,
/// left-padded by 3, or far on.
fn position(b: usize, t: usize, start: usize) -> usize {
    match b % 3 {
        0 => start + t + 5,
        1 => (start + t).saturating_sub(3),
        _ => 1_000_003 + start + t,
    }
}

impl Masks {
    fn new(b: usize, t: usize, s: usize, start: usize) -> Self {
        // Entry k of a (b, t, s) grid: (batch element, query, key).
        let grid = |n: usize| (0..n).map(move |k| (k / (t * s), k / s % t, k % s));
        Masks {
            key_lengths: (0..b).map(|i| s - (3 * i + 1) % s).collect(),
            padding: (0..b * s)
                .map(|k| !(k * 7 + k / s * 3 + 1).is_multiple_of(5))
                .collect(),
            key_starts: (0..b)
                .map(|i| (3 * i + 1).min(s.saturating_sub(1)))
                .collect(),
            bool_shared: grid(t * s)
                .map(|(_, i, j)| (i * 11 + j * 3) % 4 != 0)
                .collect(),
            bool_per_batch: grid(b * t * s)
                .map(|(n, i, j)| (n + i * 5 + j * 7) % 3 != 0)
                .collect(),
            additive_shared: grid(t * s)
                .map(|(_, i, j)| additive(i * 7 + j * 13 + 1))
                .collect(),
            additive_per_batch: grid(b * t * s)
                .map(|(n, i, j)| additive(n * 5 + i * 3 + j * 11))
                .collect(),
            token_lengths: (0..b).map(|i| t - (2 * i) % t).collect(),
            positions: (0..b * t).map(|k| position(k / t, k % t, start)).collect(),
        }
    }

    /// The option sets of a call: name, options, and whether the call writes the weights
    /// too (the weights of one option at a time are kept to the masks that need most care:
    /// the holes of a padding mask and a shared boolean mask).
    fn options(&self, depth: Depth) -> Vec<(&'static str, AttendOptions<'_>, bool)> {
        let none = AttendOptions::default();
        let all = AttendOptions {
            key_lengths: Some(&self.key_lengths),
            key_padding_mask: Some(&self.padding),
            key_starts: Some(&self.key_starts),
            mask: Some(AttnMask::Additive(&self.additive_per_batch)),
            token_lengths: Some(&self.token_lengths),
            positions: Some(&self.positions),
        };
        if depth == Depth::Light {
            return vec![("all", all, true)];
        }
        let (mut lens, mut pad, mut starts, mut bmask) = (none, none, none, none);
        lens.key_lengths = all.key_lengths;
        pad.key_padding_mask = all.key_padding_mask;
        starts.key_starts = all.key_starts;
        bmask.mask = Some(AttnMask::Bool(&self.bool_shared));
        let (mut bmask_b, mut amask, mut toklens) = (none, none, none);
        bmask_b.mask = Some(AttnMask::Bool(&self.bool_per_batch));
        amask.mask = Some(AttnMask::Additive(&self.additive_shared));
        amask.key_lengths = all.key_lengths;
        toklens.token_lengths = all.token_lengths;
        toklens.positions = all.positions;
        vec![
            ("lens", lens, false),
            ("pad", pad, true),
            ("starts", starts, false),
            ("bmask", bmask, true),
            ("bmask-b", bmask_b, false),
            ("amask+lens", amask, false),
            ("toklens+pos", toklens, false),
            ("all", all, true),
        ]
    }

    /// The options of a decoding step: key starts, a boolean mask and rotary positions.
    fn step(&self) -> AttendOptions<'_> {
        AttendOptions {
            key_starts: Some(&self.key_starts),
            mask: Some(AttnMask::Bool(&self.bool_per_batch)),
            positions: Some(&self.positions),
            ..AttendOptions::default()
        }
    }
}

/// Every call of `depth` on a self-attention layer: forward passes, then (causal layers)
/// decoding.
pub fn self_calls(tag: &str, layer: &mut Layer, input: &Input, depth: Depth) {
    forward(tag, layer, input, depth);
    if layer.masking() == Masking::Causal {
        decode(tag, layer, input, depth);
    }
}

/// The forward pass with default options, then with each option set.
fn forward(tag: &str, layer: &mut Layer, input: &Input, depth: Depth) {
    let (b, t, d) = (input.b, input.t, input.d);
    let x = || Tokens::new(&input.x, b, t, d).unwrap();
    show(&format!("{tag} forward"), &layer.forward(x()).unwrap());
    each_option_set(&format!("{tag} "), input, t, depth, |options, out| {
        layer.forward_into(x(), options, out).unwrap()
    });
}

/// Cross-attention with default options, then with each option set.
pub fn cross_calls(tag: &str, layer: &mut Layer, input: &Input, depth: Depth) {
    let (b, t, d, s, e) = (input.b, input.t, input.d, input.s, input.e);
    let x = || Tokens::new(&input.x, b, t, d).unwrap();
    let memory = || Tokens::new(&input.memory, b, s, e).unwrap();
    let mut y = vec![f32::NAN; b * t * d];
    let out = Output::new(&mut y, b, t, d).unwrap();
    layer
        .cross_into(x(), memory(), AttendOptions::default(), out)
        .unwrap();
    show(&format!("{tag} cross"), &y);
    each_option_set(&format!("{tag} cross-"), input, s, depth, |options, out| {
        layer.cross_into(x(), memory(), options, out).unwrap()
    });
}

/// Calls `call` with each option set of `depth` for `input`'s queries over `s` keys and an
/// output (asking for the weights where the set says), and prints what it wrote.
fn each_option_set(
    tag: &str,
    input: &Input,
    s: usize,
    depth: Depth,
    mut call: impl FnMut(AttendOptions<'_>, Output<'_>),
) {
    let (b, t, d) = (input.b, input.t, input.d);
    let masks = Masks::new(b, t, s, 0);
    for (name, options, with_weights) in masks.options(depth) {
        let mut y = vec![f32::NAN; b * t * d];
        let mut w = AttentionWeights::new();
        let mut out = Output::new(&mut y, b, t, d).unwrap();
        if with_weights {
            out = out.with_weights(&mut w);
        }
        call(options, out);
        let weights = if with_weights {
            weights_hash(&w)
        } else {
            String::from("-")
        };
        show(&format!("{tag}{name} {weights}"), &y);
    }
}

/// How a decoding run feeds its steps.
#[derive(Clone, Copy)]
struct Steps {
    /// Tokens per call (the last call of a sequence takes what is left).
    size: usize,
    /// Each step with key starts, a mask and explicit rotary positions.
    options: bool,
    /// Each step writing the attention weights.
    weights: bool,
}

impl Steps {
    fn of(size: usize) -> Self {
        Steps {
            size,
            options: false,
            weights: false,
        }
    }

    fn with_options(self) -> Self {
        Steps {
            options: true,
            ..self
        }
    }

    fn with_weights(self) -> Self {
        Steps {
            weights: true,
            ..self
        }
    }
}

/// Decoding in steps of several sizes, with options and weights (all but the steps of 5 when
/// `Light`), and a ragged batch (`Full`).
fn decode(tag: &str, layer: &mut Layer, input: &Input, depth: Depth) {
    let runs = [
        ("decode1", Steps::of(1)),
        ("decode7", Steps::of(7)),
        ("decode5w", Steps::of(5).with_weights()),
        ("decode3m", Steps::of(3).with_options().with_weights()),
    ];
    for (name, steps) in runs {
        if depth == Depth::Light && steps.size == 5 {
            continue;
        }
        let (y, w) = decode_in_steps(layer, input, steps);
        let weights = if steps.weights {
            format!("w {:016x}", crate::hash(&w))
        } else {
            String::from("-")
        };
        show(&format!("{tag} {name} {weights}"), &y);
    }
    if depth == Depth::Full {
        show(&format!("{tag} ragged"), &ragged(layer, input));
    }
}

/// A new cache for `layer` taking calls of up to `step` tokens of `input`.
fn cache_for(layer: &Layer, input: &Input, step: usize) -> KvCache {
    let capacity = match layer.sliding_window() {
        Some(_) => step,
        None => input.t + 8,
    };
    layer.new_cache(input.b, capacity).unwrap()
}

/// Decodes `input` through a new cache as `steps` says: the outputs `(b, t, D)` (the
/// forward's bits, without options), and every step's weights in order.
fn decode_in_steps(layer: &mut Layer, input: &Input, steps: Steps) -> (Vec<f32>, Vec<f32>) {
    let (b, t, d) = (input.b, input.t, input.d);
    let mut cache = cache_for(layer, input, steps.size);
    let (mut all, mut all_weights) = (vec![f32::NAN; b * t * d], Vec::new());
    for t0 in (0..t).step_by(steps.size) {
        let len = steps.size.min(t - t0);
        let x = input.rows(t0, len);
        let masks = Masks::new(b, len, t0 + len, t0);
        let options = if steps.options {
            masks.step()
        } else {
            AttendOptions::default()
        };
        let mut y = vec![f32::NAN; b * len * d];
        let mut w = AttentionWeights::new();
        let mut out = Output::new(&mut y, b, len, d).unwrap();
        if steps.weights {
            out = out.with_weights(&mut w);
        }
        layer
            .decode_into(
                Tokens::new(&x, b, len, d).unwrap(),
                &mut cache,
                options,
                out,
            )
            .unwrap();
        for (sequence, rows) in y.chunks_exact(len * d).enumerate() {
            all[(sequence * t + t0) * d..][..len * d].copy_from_slice(rows);
        }
        all_weights.extend_from_slice(w.as_slice());
    }
    (all, all_weights)
}

/// A ragged batch: a prefill in which sequence `i` has `2i` fewer real tokens, then the
/// rest token by token, then the last sequence restarted for 3 more tokens, then every
/// sequence restarted for 2.
fn ragged(layer: &mut Layer, input: &Input) -> Vec<f32> {
    let (b, d) = (input.b, input.d);
    let prefill = input.t.min(10);
    let mut cache = cache_for(layer, input, prefill);
    let mut all = Vec::new();
    let mut step = |layer: &mut Layer, cache: &mut KvCache, t0: usize, len: usize, options| {
        let x = input.rows(t0, len);
        let mut y = vec![f32::NAN; b * len * d];
        let out = Output::new(&mut y, b, len, d).unwrap();
        layer
            .decode_into(Tokens::new(&x, b, len, d).unwrap(), cache, options, out)
            .unwrap();
        all.extend_from_slice(&y);
    };
    let lengths: Vec<usize> = (0..b)
        .map(|i| prefill.saturating_sub(2 * i).max(1))
        .collect();
    let options = AttendOptions {
        token_lengths: Some(&lengths),
        ..AttendOptions::default()
    };
    step(layer, &mut cache, 0, prefill, options);
    for t0 in prefill..input.t {
        step(layer, &mut cache, t0, 1, AttendOptions::default());
    }
    cache.clear_sequence(b - 1).unwrap();
    for t0 in 0..input.t.min(3) {
        step(layer, &mut cache, t0, 1, AttendOptions::default());
    }
    cache.clear();
    for t0 in 0..input.t.min(2) {
        step(layer, &mut cache, t0, 1, AttendOptions::default());
    }
    all.extend(cache.lengths().iter().map(|&l| l as f32));
    all
}
