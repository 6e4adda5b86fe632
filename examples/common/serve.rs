//! The serving table of the bench example (`--modes serve`): the Qwen2.5-0.5B-shaped layers of
//! `model_shaped.rs` (24 layers on one shared `ThreadPool`, RoPE, f32) serving many sequences
//! through paged caches (`Layer::new_paged_cache`, one per layer).
//!
//! - **Mixed batch**: one sequence prefilling 512 tokens beside 15 decoding one token each
//!   (each holding 256 tokens), through all 24 layers, as one rectangular call (`16 × 512`
//!   rows, `token_lengths` marking the real ones: every padding row is projected and attended)
//!   and as one ragged call (`Tokens::ragged`: the 527 real rows). The median of 3 calls each
//!   (the sequences are truncated back after each, untimed); useful tokens per second (527
//!   per call) and the ragged call's speed-up.
//! - **Cache bytes**: 64 sequences of lengths drawn from 16 to 4,096 in one layer's pool: the
//!   bytes of the blocks they hold over the bytes of their tokens.
//! - **Shared prefix**: 16 sequences forked from one 2,048-token prompt, each then decoding one
//!   token: the blocks held, against 16 unshared copies.
//! - **Single sequence**: a decoding step of one sequence holding 1,024 tokens through the
//!   24 layers, with paged caches and with contiguous `KvCache`s: medians of 3 alternating
//!   rounds of 32 steps (each round truncates or clears back, untimed), and their ratio.

use std::time::Instant;

use mha::{
    AttendOptions, KvCache, KvFormat, Layer, Output, PagedCache, ThreadPool, Tokens, WeightFormat,
};

use super::model_shaped::{layers, params, Setup, D, LAYERS};
use super::split_mix::SplitMix;

/// The mixed batch: the prefilling sequence's tokens, then the decoding ones' (one each).
const PROMPT: usize = 512;
const DECODING: usize = 15;
/// Tokens each decoding sequence holds before the timed calls.
const HELD: usize = 256;

/// Prints the serving table for each thread count.
pub fn run_serve(threads: &[usize]) {
    println!("\nserve: Qwen2.5-0.5B-shaped attention, {LAYERS} layers on one pool, paged caches");
    let mut rng = SplitMix(2027);
    let all: Vec<_> = (0..LAYERS).map(|_| params(&mut rng)).collect();
    let setup = Setup {
        shared: true,
        rotate: true,
        weights: WeightFormat::F32,
        cache: KvFormat::F32,
    };
    for &n in threads {
        let pool = ThreadPool::new(n);
        let model = layers(&all, n, Some(&pool), setup);
        let mut model: Vec<Layer> = model.into_iter().map(|l| l.into_layer()).collect();
        mixed_batch(&mut model, n, &mut rng);
        single_sequence(&mut model, n, &mut rng);
    }
    let one = layers(&all[..1], 1, None, setup).remove(0);
    let mut one = one.into_layer();
    cache_bytes(&mut one, &mut rng);
    shared_prefix(&mut one, &mut rng);
}

/// `x`, ragged by `lengths` (or `(B, T)` with `lengths` as token lengths when `padded_to` is
/// `Some(T)`), through every layer for the sequences `ids`, each into its paged cache.
fn through_all(
    model: &mut [Layer],
    caches: &mut [PagedCache],
    (ids, lengths, padded_to): (&[usize], &[usize], Option<usize>),
    x: &[f32],
) {
    let (mut h, mut out) = (x.to_vec(), vec![0.0; x.len()]);
    for (layer, cache) in model.iter_mut().zip(caches.iter_mut()) {
        let done = match padded_to {
            Some(tokens) => {
                let options = AttendOptions {
                    token_lengths: Some(lengths),
                    ..AttendOptions::default()
                };
                let input = Tokens::new(&h, ids.len(), tokens, D).expect("whole tokens");
                let output = Output::new(&mut out, ids.len(), tokens, D).expect("whole tokens");
                layer.decode_paged(input, cache, ids, options, output)
            }
            None => {
                let input = Tokens::ragged(&h, lengths, D).expect("whole tokens");
                let output = Output::ragged(&mut out, lengths, D).expect("whole tokens");
                layer.decode_paged(input, cache, ids, AttendOptions::default(), output)
            }
        };
        done.expect("the pools have room");
        std::mem::swap(&mut h, &mut out);
    }
}

/// Paged caches of `blocks` blocks for every layer, each with `sequences` sequences.
fn paged_caches(model: &[Layer], blocks: usize, sequences: usize) -> (Vec<PagedCache>, Vec<usize>) {
    let mut caches: Vec<PagedCache> = model
        .iter()
        .map(|layer| layer.new_paged_cache(blocks).expect("a pool"))
        .collect();
    let mut ids = Vec::new();
    for cache in &mut caches {
        ids = (0..sequences)
            .map(|_| cache.add_sequence().expect("an id"))
            .collect();
    }
    (caches, ids)
}

/// The median of `samples`' times in seconds.
fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// The mixed batch, rectangular then ragged.
fn mixed_batch(model: &mut [Layer], n: usize, rng: &mut SplitMix) {
    let blocks = 2 * (PROMPT + (DECODING * (HELD + 1))).div_ceil(PagedCache::BLOCK) + 16;
    let (mut caches, ids) = paged_caches(model, blocks, 1 + DECODING);
    let held = vec![HELD; DECODING];
    let context: Vec<f32> = (0..DECODING * HELD * D).map(|_| rng.uniform()).collect();
    through_all(model, &mut caches, (&ids[1..], &held, None), &context);
    let mut lengths = vec![1; 1 + DECODING];
    lengths[0] = PROMPT;
    let useful = PROMPT + DECODING;
    let ragged_x: Vec<f32> = (0..useful * D).map(|_| rng.uniform()).collect();
    // The same rows padded: the prompt's, then each decoding token followed by padding.
    let mut padded_x = vec![0.0; (1 + DECODING) * PROMPT * D];
    padded_x[..PROMPT * D].copy_from_slice(&ragged_x[..PROMPT * D]);
    for b in 1..=DECODING {
        let row = &ragged_x[(PROMPT + b - 1) * D..][..D];
        padded_x[b * PROMPT * D..][..D].copy_from_slice(row);
    }
    println!(
        "{:>3} {:>12} {:>7} {:>11} {:>14} {:>9}",
        "thr", "mixed batch", "rows", "ms / call", "useful tok/s", "speed-up"
    );
    let mut times = [0.0; 2];
    for (i, (name, x, padded)) in [
        ("rectangular", &padded_x, Some(PROMPT)),
        ("ragged", &ragged_x, None),
    ]
    .into_iter()
    .enumerate()
    {
        let samples = (0..3)
            .map(|_| {
                let start = Instant::now();
                through_all(model, &mut caches, (&ids, &lengths, padded), x);
                let time = start.elapsed().as_secs_f64();
                for cache in &mut caches {
                    cache.truncate(ids[0], 0).expect("a live sequence");
                    for &id in &ids[1..] {
                        cache.truncate(id, HELD).expect("a live sequence");
                    }
                }
                time
            })
            .collect();
        times[i] = median(samples);
        let rows = x.len() / D;
        let speed_up = if i == 1 {
            format!("{:.1}x", times[0] / times[1])
        } else {
            String::new()
        };
        println!(
            "{n:>3} {name:>12} {rows:>7} {:>11.1} {:>14.0} {speed_up:>9}",
            times[i] * 1e3,
            useful as f64 / times[i]
        );
    }
}

/// One sequence holding 1,024 tokens decodes 32 steps through paged caches and through
/// contiguous caches, alternating 3 rounds.
fn single_sequence(model: &mut [Layer], n: usize, rng: &mut SplitMix) {
    const HELD: usize = 1024;
    const STEPS: usize = 32;
    let prompt: Vec<f32> = (0..HELD * D).map(|_| rng.uniform()).collect();
    let steps: Vec<f32> = (0..STEPS * D).map(|_| rng.uniform()).collect();
    let blocks = (HELD + STEPS).div_ceil(PagedCache::BLOCK);
    let (mut paged, ids) = paged_caches(model, blocks, 1);
    through_all(model, &mut paged, (&ids, &[HELD], None), &prompt);
    let mut contiguous: Vec<KvCache> = model
        .iter()
        .map(|l| l.new_cache(1, HELD + STEPS).expect("a cache"))
        .collect();
    prefill_contiguous(model, &mut contiguous, &prompt);
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..3 {
        let start = Instant::now();
        for step in steps.chunks_exact(D) {
            through_all(model, &mut paged, (&ids, &[1], None), step);
        }
        times[0].push(start.elapsed().as_secs_f64() / STEPS as f64);
        for cache in &mut paged {
            cache.truncate(ids[0], HELD).expect("a live sequence");
        }
        let start = Instant::now();
        for step in steps.chunks_exact(D) {
            decode_contiguous(model, &mut contiguous, step);
        }
        times[1].push(start.elapsed().as_secs_f64() / STEPS as f64);
        contiguous.iter_mut().for_each(KvCache::clear);
        prefill_contiguous(model, &mut contiguous, &prompt);
    }
    let [paged, contiguous] = times.map(median);
    println!(
        "{n:>3} one sequence of {HELD} tokens, ms / token: paged {:.3}, contiguous {:.3} \
         (paged / contiguous {:.3})",
        paged * 1e3,
        contiguous * 1e3,
        paged / contiguous
    );
}

/// `prompt` (one sequence) into every layer's empty contiguous cache, each layer's input the
/// prompt itself (the table times only the steps after it).
fn prefill_contiguous(model: &mut [Layer], caches: &mut [KvCache], prompt: &[f32]) {
    let tokens = prompt.len() / D;
    let mut out = vec![0.0; prompt.len()];
    for (layer, cache) in model.iter_mut().zip(caches.iter_mut()) {
        let x = Tokens::new(prompt, 1, tokens, D).expect("whole tokens");
        let y = Output::new(&mut out, 1, tokens, D).expect("whole tokens");
        let options = AttendOptions::default();
        layer.decode_into(x, cache, options, y).expect("room");
    }
}

/// One token of one sequence through every layer's contiguous cache.
fn decode_contiguous(model: &mut [Layer], caches: &mut [KvCache], x: &[f32]) {
    let (mut h, mut out) = (x.to_vec(), vec![0.0; D]);
    for (layer, cache) in model.iter_mut().zip(caches.iter_mut()) {
        let (input, output) = (Tokens::new(&h, 1, 1, D), Output::new(&mut out, 1, 1, D));
        let options = AttendOptions::default();
        let done = layer.decode_into(input.unwrap(), cache, options, output.unwrap());
        done.expect("the cache has room");
        std::mem::swap(&mut h, &mut out);
    }
}

/// 64 sequences of lengths from 16 to 4,096 in a pool of exactly the blocks they need: the
/// bytes of the blocks held over the bytes of the tokens.
fn cache_bytes(layer: &mut Layer, rng: &mut SplitMix) {
    let lengths: Vec<usize> = (0..64)
        .map(|_| 16 + (rng.uniform().abs() * 4080.0) as usize)
        .collect();
    let blocks = lengths.iter().map(|l| l.div_ceil(PagedCache::BLOCK)).sum();
    let mut cache = layer.new_paged_cache(blocks).expect("a pool");
    let ids: Vec<usize> = lengths
        .iter()
        .map(|_| cache.add_sequence().unwrap())
        .collect();
    // Eight sequences a call.
    for (ids, lengths) in ids.chunks(8).zip(lengths.chunks(8)) {
        let rows: usize = lengths.iter().sum();
        let x: Vec<f32> = (0..rows * D).map(|_| rng.uniform()).collect();
        let mut out = vec![0.0; x.len()];
        let (input, output) = (
            Tokens::ragged(&x, lengths, D),
            Output::ragged(&mut out, lengths, D),
        );
        let options = AttendOptions::default();
        let done = layer.decode_paged(input.unwrap(), &mut cache, ids, options, output.unwrap());
        done.expect("the pool has room");
    }
    let tokens: usize = lengths.iter().sum();
    let per_block = cache.bytes() / cache.blocks();
    let held = (cache.blocks() - cache.free_blocks()) * per_block;
    let token_bytes = tokens * per_block / PagedCache::BLOCK;
    println!(
        "cache bytes, 64 sequences of 16 to 4096 tokens ({tokens} in all), one layer: blocks \
         held {:.1} MB, tokens {:.1} MB (ratio {:.3})",
        held as f64 / 1e6,
        token_bytes as f64 / 1e6,
        held as f64 / token_bytes as f64
    );
}

/// 16 sequences forked from one 2,048-token prompt, each decoding one token of its own.
fn shared_prefix(layer: &mut Layer, rng: &mut SplitMix) {
    const PREFIX: usize = 2048;
    const FORKS: usize = 16;
    let per_copy = (PREFIX + 1).div_ceil(PagedCache::BLOCK);
    let mut cache = layer.new_paged_cache(FORKS * per_copy).expect("a pool");
    let first = cache.add_sequence().unwrap();
    let prompt: Vec<f32> = (0..PREFIX * D).map(|_| rng.uniform()).collect();
    let mut out = vec![0.0; prompt.len()];
    let (input, output) = (
        Tokens::new(&prompt, 1, PREFIX, D),
        Output::new(&mut out, 1, PREFIX, D),
    );
    let options = AttendOptions::default();
    let done = layer.decode_paged(
        input.unwrap(),
        &mut cache,
        &[first],
        options,
        output.unwrap(),
    );
    done.expect("the pool has room");
    let mut ids = vec![first];
    ids.extend((1..FORKS).map(|_| cache.fork(first).expect("a fork")));
    let x: Vec<f32> = (0..FORKS * D).map(|_| rng.uniform()).collect();
    let mut out = vec![0.0; x.len()];
    let (input, output) = (
        Tokens::new(&x, FORKS, 1, D),
        Output::new(&mut out, FORKS, 1, D),
    );
    let done = layer.decode_paged(input.unwrap(), &mut cache, &ids, options, output.unwrap());
    done.expect("the pool has room");
    println!(
        "shared prefix: {FORKS} sequences of a {PREFIX}-token prompt + 1 token each hold {} \
         blocks ({} unshared; {} full prompt blocks held once)",
        cache.blocks() - cache.free_blocks(),
        FORKS * per_copy,
        PREFIX / PagedCache::BLOCK
    );
}
