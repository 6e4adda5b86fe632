//! Reproducers of bugs found by the fuzz targets in `fuzz/` (`fuzz/run.sh`), made as small as
//! the fuzzer's inputs would shrink. A test marked `#[ignore]` still fails: its doc comment says
//! what is wrong; remove the mark with the fix. Some fail only in optimised builds: run them with
//! `cargo test --release --test fuzz_found -- --include-ignored`.

use mha::{
    AttendOptions, AttentionWeights, Isa, Masking, Matrix, Mha, MhaParams, Output, Tensor, Tokens,
};

/// The weights of a layer of width 0 (`D = 0`: every head is 0 wide).
fn zero_width_params() -> MhaParams<0> {
    MhaParams::new(
        Matrix::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
    )
}

/// Found by `layer_api`. With zero-width heads (`D = 0`, so `D / n_heads = 0`) the attention
/// weights come out NaN: the score scale is `1 / √0 = +inf` and every score is `0 · inf`.
/// [`AttentionWeights`] promises that each row sums to 1, or is all zeros for a query that
/// sees no key; every other call on a `D = 0` layer returns the obvious empty result. Here the
/// causal rows should be `[1, 0]` and `[0.5, 0.5]` (every key scores the same).
#[test]
fn zero_width_heads_give_probabilities() {
    let params = zero_width_params();
    let mut layer = Mha::builder(&params, 1).threads(1).build().unwrap();
    let x = Tensor::<1, 2, 0>::zeros();
    let mut out = Tensor::<1, 2, 0>::zeros();
    let mut weights = AttentionWeights::new();
    layer
        .forward_into(
            &x,
            AttendOptions::default(),
            Output::from(&mut out).with_weights(&mut weights),
        )
        .unwrap();
    assert_eq!(weights.shape(), [1, 1, 2, 2]);
    assert_eq!(weights.as_slice(), &[1.0, 0.0, 0.5, 0.5]);
}

/// A layer of width 8 with one head whose output projection meets two different NaNs in output
/// feature 0: `Wo[0][0]` is NaN (`0x7fc00000`), and the attention output of feature 0 is the
/// NaN of `+inf - inf` (`0xffc00000`), because `Wv[0][0] = f32::MAX` turns the tokens' feature
/// 0 (alternately 2 and -2) into values of `+inf` and `-inf`, which a query seeing both mixes.
fn two_nans() -> MhaParams<8> {
    let wv = Matrix::from_fn(|r, c| if (r, c) == (0, 0) { f32::MAX } else { 0.0 });
    let mut wo = Matrix::identity();
    wo[(0, 0)] = f32::NAN;
    MhaParams::new(Matrix::zeros(), Matrix::zeros(), wv, wo)
}

/// `t` tokens of width 8: feature 0 alternately 2 and -2, the rest 0.
fn alternating(t: usize) -> Vec<f32> {
    (0..t * 8)
        .map(|i| match (i % 8, i / 8 % 2) {
            (0, 0) => 2.0,
            (0, _) => -2.0,
            _ => 0.0,
        })
        .collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Found by `layer_api` (1 thread against 3). With the portable kernels in an optimised build,
/// a bidirectional forward of 6 tokens gives output feature 0 of tokens 4 and 5 as
/// `0xffc00000` on 1 thread and `0x7fc00000` on 2 or 3 (18 tokens: tokens 10 and 11 on 3
/// threads): the rows that end a thread's block take another code path (`gemv` rather than the
/// tile) whose compiled code takes the other NaN operand. The crate promises bit-identical
/// results for every thread count, NaN payloads included; the test of
/// commit a8762a0 passes because its NaNs come from the input alone. Debug builds (`cargo
/// test`) pass by the order the unoptimised code happens to keep; AVX2 passes.
#[test]
fn nan_bits_do_not_depend_on_the_thread_count() {
    let params = two_nans();
    for t in [6, 18] {
        let x = alternating(t);
        let run = |threads: usize| {
            let mut layer = Mha::builder(&params, 1)
                .masking(Masking::Bidirectional)
                .threads(threads)
                .min_work_per_thread(0)
                .isa(Isa::Portable)
                .build()
                .unwrap();
            let mut out = vec![0.0; t * 8];
            let tokens = Tokens::new(&x, 1, t, 8).unwrap();
            let output = Output::new(&mut out, 1, t, 8).unwrap();
            layer
                .forward_into(tokens, AttendOptions::default(), output)
                .unwrap();
            bits(&out)
        };
        let one = run(1);
        assert_eq!(one, run(2), "{t} tokens: 1 and 2 threads");
        assert_eq!(one, run(3), "{t} tokens: 1 and 3 threads");
    }
}

/// Found by `layer_api` (decoding a causal layer's tokens against its forward). With the same
/// weights and the portable kernels in an optimised build, decoding 3 tokens one at a time
/// gives output feature 0 of tokens 1 and 2 as `0x7fc00000` where the forward gives
/// `0xffc00000` (decoding one row takes `gemv`, the forward the tile). The crate promises that
/// a forward equals decoding its tokens in steps of any sizes, bit for bit. Debug builds pass;
/// AVX2 passes.
#[test]
fn decoding_token_by_token_gives_the_forward_nan_bits() {
    let params = two_nans();
    let t = 3;
    let x = alternating(t);
    let mut layer = Mha::builder(&params, 1)
        .threads(1)
        .isa(Isa::Portable)
        .build()
        .unwrap();
    let mut forward = vec![0.0; t * 8];
    let tokens = Tokens::new(&x, 1, t, 8).unwrap();
    let output = Output::new(&mut forward, 1, t, 8).unwrap();
    layer
        .forward_into(tokens, AttendOptions::default(), output)
        .unwrap();
    let mut cache = layer.new_cache(1, t).unwrap();
    for (i, token) in x.chunks(8).enumerate() {
        let mut out = vec![0.0; 8];
        let tokens = Tokens::new(token, 1, 1, 8).unwrap();
        let output = Output::new(&mut out, 1, 1, 8).unwrap();
        layer
            .decode_into(tokens, &mut cache, AttendOptions::default(), output)
            .unwrap();
        assert_eq!(bits(&out), bits(&forward[i * 8..][..8]), "token {i}");
    }
}

/// Found by `layer_api` (the inputs are `fuzz/seeds/layer_api/empty_batch_decode`
/// and `empty_batch_past_capacity`), wrong expectations of the target rather than of the
/// crate: a decoding step on a cache of no sequences (batch 0) is `Ok`, and the cache's length,
/// its longest sequence's, stays 0 however many tokens per sequence the steps have, past the
/// capacity too (no sequence holds any). The target expected every `Ok` step to add its tokens
/// and a step past the capacity to fail; it now expects both of non-empty batches only.
#[test]
fn decoding_an_empty_batch_adds_no_tokens() {
    let params = zero_width_params();
    let mut layer = Mha::builder(&params, 1).threads(1).build().unwrap();
    // Capacity 4, and the steps give 1 + 2 + 3 tokens per sequence.
    let mut cache = layer.new_cache(0, 4).unwrap();
    for step in 1..=3 {
        let mut out: Vec<f32> = Vec::new();
        let tokens = Tokens::new(&[], 0, step, 0).unwrap();
        let output = Output::new(&mut out, 0, step, 0).unwrap();
        layer
            .decode_into(tokens, &mut cache, AttendOptions::default(), output)
            .unwrap();
        assert_eq!((cache.len(), cache.lengths()), (0, &[][..]), "step {step}");
    }
}

/// Found by `layer_api`. A decoding step that asks for attention weights whose shape
/// `(B, H, T, S)` overflows (`usize::MAX` heads of width 0) was refused with
/// [`ShapeError::Overflow`], but only after its keys were appended: the cache held one more
/// token than before the failed call. An `Err` must leave the cache as it was (as every other
/// refused step does: the weights' size belongs to the first step, "check and plan", of
/// `ARCHITECTURE.md`).
#[test]
fn a_step_refused_for_its_weights_leaves_the_cache_as_it_was() {
    let params = zero_width_params();
    let mut layer = Mha::builder(&params, usize::MAX)
        .threads(1)
        .build()
        .unwrap();
    let mut cache = layer.new_cache(3, 60).unwrap();
    let mut out: Vec<f32> = Vec::new();
    let mut weights = AttentionWeights::new();
    let tokens = Tokens::new(&[], 3, 1, 0).unwrap();
    let output = Output::new(&mut out, 3, 1, 0)
        .unwrap()
        .with_weights(&mut weights);
    let result = layer.decode_into(tokens, &mut cache, AttendOptions::default(), output);
    assert!(
        matches!(result, Err(mha::ShapeError::Overflow { .. })),
        "{result:?}"
    );
    assert_eq!(cache.len(), 0, "a refused step appended its tokens");
}

/// Found by `layer_api`, a fault of the target's own check, not of the crate (its input is the
/// seed `fuzz/seeds/layer_api/empty_cross_weights_of_huge_heads`, which `fuzz/run.sh --replay`
/// runs): a cross-attention of 2 queries over a memory of no keys, with `usize::MAX` heads of
/// width 0, asking for the attention weights, is `Ok` with weights of shape
/// `[1, usize::MAX, 2, 0]`, which hold nothing. The target multiplied the shape out
/// (`1 · usize::MAX · 2` overflows before the `· 0`); this pins the crate's side of it.
#[test]
fn empty_weights_of_usize_max_heads_over_no_keys() {
    let params = MhaParams::<0, 2, 0>::from_parts(
        Matrix::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
    );
    let mut layer = Mha::builder(&params, usize::MAX)
        .threads(1)
        .build()
        .unwrap();
    let mut out: Vec<f32> = Vec::new();
    let mut weights = AttentionWeights::new();
    let x = Tokens::new(&[], 1, 2, 0).unwrap();
    let memory = Tokens::new(&[], 1, 0, 2).unwrap();
    let output = Output::new(&mut out, 1, 2, 0)
        .unwrap()
        .with_weights(&mut weights);
    layer
        .cross_into(x, memory, AttendOptions::default(), output)
        .unwrap();
    assert_eq!(weights.shape(), [1, usize::MAX, 2, 0]);
    assert!(weights.as_slice().is_empty());
}
