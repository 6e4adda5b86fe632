//! A loop of forwards through a reused single-threaded layer allocates nothing once the first
//! call has sized its scratch. A counting global allocator (this test binary only) proves it.
//! It counts per thread, so tests running in parallel do not see each other's allocations.
//! (With more than one thread, each forward starts scoped threads, and starting a thread
//! allocates; the kernels themselves still allocate nothing.) A `Checkpoint` parses its
//! `config.json` once: a layer read from it allocates no more for a larger config.

use mha::{Matrix, Mha, MhaParams, Tensor};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{allocations, peak_bytes_during};

fn layer<const D: usize>(heads: usize, threads: usize) -> Mha<D> {
    let w = Matrix::<D, D>::from_fn(|r, c| ((r * 7 + c * 3) % 11) as f32 / 11.0 - 0.5);
    Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), heads)
        .threads(threads)
        .build()
        .expect("valid heads")
}

/// The allocations this thread makes in `rounds` calls of `round`.
fn allocations_in(rounds: usize, mut round: impl FnMut()) -> usize {
    let before = allocations();
    for _ in 0..rounds {
        round();
    }
    allocations() - before
}

/// One plain forward into `out`.
fn forward<const B: usize, const T: usize, const D: usize>(
    layer: &mut Mha<D>,
    x: &Tensor<B, T, D>,
    out: &mut Tensor<B, T, D>,
) {
    layer
        .forward_into(x, mha::AttendOptions::default(), out)
        .expect("matching shapes");
}

#[test]
fn steady_state_forward_allocates_nothing_single_threaded() {
    let mut layer = layer::<48>(4, 1);
    let x = Tensor::<2, 70, 48>::from_fn(|b, t, i| ((b + t * 5 + i) % 13) as f32 / 13.0);
    let mut out = Tensor::zeros();
    forward(&mut layer, &x, &mut out); // sizes the scratch
    let first = out.clone();
    let allocated = allocations_in(5, || forward(&mut layer, &x, &mut out));
    assert_eq!(
        allocated, 0,
        "forward_into allocated {allocated} times in 5 calls"
    );
    assert_eq!(out, first);
}

#[test]
fn tiny_forward_allocates_nothing() {
    let mut layer = layer::<4>(2, 0);
    let x = Tensor::from([[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]]);
    let mut out = Tensor::zeros();
    forward(&mut layer, &x, &mut out);
    assert_eq!(allocations_in(100, || forward(&mut layer, &x, &mut out)), 0);
}

/// A first forward holds its queries, its values (then the merged heads) and the key/value
/// store (keys in panels of 96, values in rows), `4 · T · D` floats that grow with `T`, and
/// the kernels' scratch, whose size depends on the instruction set's tiles but not on `T`. It
/// holds no buffer for its keys: an empty store holds them in its value buffer until they are
/// in the key panels. So the peak of a first forward over `2T` tokens exceeds that over `T` by
/// `4 · T · D` floats; a separate key buffer would make it `5 · T · D`.
#[test]
fn first_forward_keeps_its_keys_in_the_empty_store() {
    const T: usize = 960; // whole key panels of 96
    const D: usize = 64;
    const HEADS: usize = 2; // d = 32: value rows are whole panels for every table
    fn first_peak<const T: usize>() -> usize {
        let mut layer = layer::<D>(HEADS, 1);
        let x = Tensor::<1, T, D>::from_fn(|_, t, i| ((t * 3 + i) % 17) as f32 / 17.0);
        let mut out = Tensor::zeros();
        peak_bytes_during(|| forward(&mut layer, &x, &mut out))
    }
    let growth = first_peak::<{ 2 * T }>() - first_peak::<T>();
    let per_token_row = T * D * size_of::<f32>();
    // Halfway between the 4 rows per token of the design and the 5 of a separate key buffer.
    let bound = 4 * per_token_row + per_token_row / 2;
    assert!(
        growth >= 4 * per_token_row && growth <= bound,
        "{T} more tokens grew a first forward's peak by {growth} bytes, not 4 x {per_token_row} \
         (queries, values, key panels, value rows)"
    );
}

/// A forward that fails after its keys were projected into the store's value buffer (a
/// rotary position beyond the largest) leaves the layer as it was: the next forward allocates
/// nothing and computes what it did before the error.
#[test]
fn a_failed_forward_leaves_the_layer_as_it_was() {
    use mha::{AttendOptions, Rope, RopeLayout, RopeScaling, ShapeError};
    let rope = Rope {
        theta: 10_000.0,
        rotary_dim: 8,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    };
    let w = Matrix::<16, 16>::from_fn(|r, c| ((r * 5 + c * 3) % 7) as f32 / 7.0 - 0.5);
    let mut layer = Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)
        .threads(1)
        .rope(rope)
        .build()
        .expect("valid settings");
    let beyond_last = layer.rope().unwrap().max_position() + 1;
    let x = Tensor::<1, 3, 16>::from_fn(|_, t, i| ((t * 7 + i) % 5) as f32 / 5.0);
    let mut out = Tensor::zeros();
    forward(&mut layer, &x, &mut out);
    let first = out.clone();
    let before = allocations();
    let beyond = AttendOptions {
        positions: Some(&[0, 1, beyond_last]),
        ..AttendOptions::default()
    };
    let err = layer.forward_into(&x, beyond, &mut out).unwrap_err();
    assert!(
        matches!(err, ShapeError::RopePosition { position, .. } if position == beyond_last),
        "{err}"
    );
    forward(&mut layer, &x, &mut out);
    assert_eq!(allocations() - before, 0);
    assert_eq!(out, first);
}

/// A small deterministic `(R, C)` weight.
fn small<const R: usize, const C: usize>(k: usize) -> Matrix<R, C> {
    Matrix::from_fn(|i, j| (((i * 7 + j * 3 + k) % 11) as f32 / 11.0 - 0.5) / R as f32)
}

/// A single-threaded loop of `forward_into` with every option but the attention weights
/// (key lengths, a padding mask, an additive mask; grouped heads and biases), cross-attention
/// and KV-cache decode steps (of the causal twin of the layer) allocates nothing once each has
/// run once.
#[test]
fn steady_state_options_and_decode_allocate_nothing() {
    use mha::{AttendOptions, AttnMask, Masking, MhaBiases};
    const B: usize = 2;
    const T: usize = 9;
    const D: usize = 24;
    const KV: usize = 8; // 6 heads of 4, 2 kv heads
    let params = MhaParams::<D, D, KV>::from_parts(small(1), small(2), small(3), small(4));
    let biases = MhaBiases {
        bq: Some(Matrix::from_fn(|_, c| c as f32 * 0.01)),
        bk: Some(Matrix::from_fn(|_, c| c as f32 * -0.02)),
        bv: Some(Matrix::from_fn(|_, c| c as f32 * 0.03)),
        bo: Some(Matrix::from_fn(|_, c| c as f32 * 0.04)),
    };
    let mut layer = Mha::builder(&params, 6)
        .masking(Masking::Bidirectional)
        .biases(biases.clone())
        .threads(1)
        .build()
        .unwrap();
    let mut decoder = Mha::builder(&params, 6)
        .biases(biases)
        .threads(1)
        .build()
        .unwrap();
    let cross_params = MhaParams::<D, 5, KV>::from_parts(small(5), small(6), small(7), small(8));
    let mut cross = Mha::builder(&cross_params, 6).threads(1).build().unwrap();

    let x = Tensor::<B, T, D>::from_fn(|b, t, i| ((b + t * 5 + i) % 13) as f32 / 13.0);
    let memory = Tensor::<B, 4, 5>::from_fn(|b, s, i| ((b + s * 3 + i) % 7) as f32 / 7.0);
    let tokens: Vec<Tensor<B, 1, D>> = (0..T)
        .map(|t| Tensor::from_fn(|b, _, i| x[(b, t, i)]))
        .collect();
    let lengths = [7, 3];
    let padding: Vec<bool> = (0..B * T).map(|e| e % 4 != 1).collect();
    let additive: Vec<f32> = (0..T * T)
        .map(|e| if e % 5 == 0 { f32::NEG_INFINITY } else { 0.1 })
        .collect();
    let mut out = Tensor::<B, T, D>::zeros();
    let mut cross_out = Tensor::<B, T, D>::zeros();
    let mut step_out = Tensor::<B, 1, D>::zeros();
    let mut cache = decoder.new_cache(B, T).unwrap();

    let mut round = |layer: &mut Mha<D, D, KV>, cache: &mut mha::KvCache| {
        let options = AttendOptions {
            key_lengths: Some(&lengths),
            key_padding_mask: Some(&padding),
            mask: Some(AttnMask::Additive(&additive)),
            ..AttendOptions::default()
        };
        layer.forward_into(&x, options, &mut out).unwrap();
        let options = AttendOptions {
            key_lengths: Some(&[4, 2]),
            ..AttendOptions::default()
        };
        cross
            .cross_into(&x, &memory, options, &mut cross_out)
            .unwrap();
        cache.clear();
        for token in &tokens {
            decoder
                .decode_into(token, cache, AttendOptions::default(), &mut step_out)
                .unwrap();
        }
    };
    round(&mut layer, &mut cache); // sizes the scratch
    let allocated = allocations_in(3, || round(&mut layer, &mut cache));
    assert_eq!(allocated, 0, "allocated {allocated} times in 3 rounds");
    assert_eq!(cache.len(), T);
}

/// With 16-bit weights and 16- or 8-bit caches (whose widening buffers are scratch too), a
/// single-threaded loop of forwards (many rows: the GEMM's tiles widen each 16-bit panel into
/// scratch) and decode steps allocates nothing once each has run once.
#[test]
fn reduced_formats_allocate_nothing_in_the_steady_state() {
    use mha::{AttendOptions, KvFormat, WeightFormat};
    const B: usize = 2;
    const T: usize = 70;
    const D: usize = 48;
    let w = Matrix::<D, D>::from_fn(|r, c| ((r * 7 + c * 3) % 11) as f32 / 11.0 - 0.5);
    let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
    let x = Tensor::<B, T, D>::from_fn(|b, t, i| ((b + t * 5 + i) % 13) as f32 / 13.0);
    let tokens: Vec<Tensor<B, 1, D>> = (0..8)
        .map(|t| Tensor::from_fn(|b, _, i| x[(b, t, i)]))
        .collect();
    let formats = [
        (WeightFormat::Bf16, KvFormat::Bf16),
        (WeightFormat::F16, KvFormat::Q8_0),
        (WeightFormat::Bf16, KvFormat::F32),
        (WeightFormat::F32, KvFormat::F16),
    ];
    for (weights, cache_format) in formats {
        let mut layer = Mha::builder(&params, 4)
            .weight_format(weights)
            .kv_format(cache_format)
            .threads(1)
            .build()
            .unwrap();
        let mut cache = layer.new_cache(B, tokens.len()).unwrap();
        let (mut out, mut step_out) = (Tensor::zeros(), Tensor::<B, 1, D>::zeros());
        let mut round = |layer: &mut Mha<D>, cache: &mut mha::KvCache| {
            forward(layer, &x, &mut out);
            cache.clear();
            for token in &tokens {
                layer
                    .decode_into(token, cache, AttendOptions::default(), &mut step_out)
                    .unwrap();
            }
        };
        round(&mut layer, &mut cache); // sizes the scratch
        let allocated = allocations_in(3, || round(&mut layer, &mut cache));
        assert_eq!(
            allocated, 0,
            "{weights:?} {cache_format:?}: {allocated} allocations in 3 rounds"
        );
    }
}

/// A `Checkpoint` parses `config.json` once, when opened: reading a layer's config and building
/// the layer afterwards allocate as often with a 1 MB `config.json` (an unused `id2label` of
/// 40,000 labels) as with one of 200 bytes. (It kept the text and parsed all of it again for
/// every layer, allocating each label each time.)
#[cfg(feature = "std")]
#[test]
fn a_checkpoint_parses_its_config_once() {
    use mha::safetensors::write_file;
    use mha::Checkpoint;
    // The first layer built reads MHA_ISA (an allocation when set): not in what is counted.
    mha::Isa::detect();
    let dir = std::env::temp_dir().join(format!("mha-alloc-config-{}", std::process::id()));
    let per_layer = [0, 40_000].map(|labels| {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let id2label: Vec<String> = (0..labels)
            .map(|i| format!("\"{i}\": \"label {i}\""))
            .collect();
        let config = format!(
            r#"{{"model_type": "llama", "hidden_size": 4, "num_attention_heads": 2,
            "num_key_value_heads": 1, "num_hidden_layers": 2, "id2label": {{{}}}}}"#,
            id2label.join(", ")
        );
        std::fs::write(dir.join("config.json"), config).unwrap();
        let mut tensors = Vec::new();
        for layer in 0..2 {
            for (name, rows) in [("q_proj", 4), ("k_proj", 2), ("v_proj", 2), ("o_proj", 4)] {
                let name = format!("model.layers.{layer}.self_attn.{name}.weight");
                tensors.push((name, vec![rows, 4], vec![0.125f32; rows * 4]));
            }
        }
        let views: Vec<_> = (tensors.iter())
            .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
            .collect();
        write_file(dir.join("model.safetensors"), &views, &[]).unwrap();
        let checkpoint = Checkpoint::open(&dir).unwrap();
        let before = allocations();
        let config = checkpoint.config(1).unwrap();
        let layer = checkpoint.layer_with(1, |b| b.threads(1)).unwrap();
        let allocated = allocations() - before;
        assert_eq!((config.layer, layer.widths().kv), (1, 2));
        allocated
    });
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        per_layer[0], per_layer[1],
        "allocations for layer 1 with a config of 0 and of 40,000 labels"
    );
}

/// Two layers of different widths that share a pool (of one thread: starting workers
/// allocates) take turns with one scratch, which their first calls size: then neither
/// allocates. (Shared pools need `std`.)
#[cfg(feature = "std")]
#[test]
fn layers_sharing_a_pool_allocate_nothing_in_the_steady_state() {
    let pool = mha::ThreadPool::new(1);
    let (w, v) = (small::<48, 48>(1), small::<32, 32>(2));
    let mut wide = Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 4)
        .thread_pool(&pool)
        .build()
        .expect("valid heads");
    let mut narrow = Mha::builder(&MhaParams::new(v.clone(), v.clone(), v.clone(), v), 2)
        .thread_pool(&pool)
        .build()
        .expect("valid heads");
    let x = Tensor::<2, 40, 48>::from_fn(|b, t, i| ((b + t * 5 + i) % 13) as f32 / 13.0);
    let z = Tensor::<1, 90, 32>::from_fn(|_, t, i| ((t * 3 + i) % 7) as f32 / 7.0);
    let (mut y, mut u) = (Tensor::zeros(), Tensor::zeros());
    let mut round = || {
        forward(&mut wide, &x, &mut y);
        forward(&mut narrow, &z, &mut u);
    };
    round(); // sizes the one scratch
    let allocated = allocations_in(5, round);
    assert_eq!(allocated, 0, "{allocated} allocations in 5 rounds");
    assert_eq!(wide.scratch_bytes(), pool.scratch_bytes(), "one scratch");
    assert_eq!(narrow.scratch_bytes(), pool.scratch_bytes(), "one scratch");
}
