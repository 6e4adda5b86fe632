//! Runs the attention of every layer of a checkpoint directory: prefill, then decoding.
//!
//! ```text
//! cargo run --release --example model -- DIR               # config.json + safetensors (sharded or not)
//! cargo run --release --example model                      # a small random Llama-shaped checkpoint
//! cargo run --release --example model -- DIR --prefill 512 --decode 64 --threads 2 --batch 1
//! cargo run --release --example model -- DIR --kv-format q8_0   # caches in f32, bf16, f16 or q8_0
//! cargo run --release --example model -- DIR --weights bf16      # weights in f32, bf16, f16, q8_0 or q4_0
//! cargo run --release --example model -- DIR --weights q8_0 --compute int8   # 8-bit products
//! cargo run --release --example model -- DIR --weights bf16 --compute bf16   # bfloat16 products
//! ```
//!
//! Weights stay in the format the checkpoint stores them in (a bf16 checkpoint's in bf16)
//! unless `--weights` names another. `--help` lists the options and their defaults; a count of
//! 0 tokens or sequences is an error, and `--threads 0` (the default) means every CPU the
//! process may use, as in the bench example.
//!
//! The layers are loaded with `Checkpoint` (only the headers and the attention tensors are
//! read) onto one shared `ThreadPool`, then `N` random tokens are prefilled through every layer and `M` more decoded one at
//! a time (attention only: each layer's output is the next layer's input, where a model would
//! add its residual, norm and MLP). It prints the time of each phase, tokens per second, and
//! the bytes of the weights read and held and of the KV caches. Without `DIR`, it first writes
//! a random checkpoint of 4 Llama layers (`config.json`, two shards and their index, with the
//! crate's own writer, the embedding and MLP weights included) to a temporary directory.

use std::path::{Path, PathBuf};
use std::time::Instant;

use mha::safetensors::{serialize_index, write_file};
use mha::{AttendOptions, Checkpoint, KvCache, KvFormat, Layer, Output, ThreadPool, Tokens};
use mha::{Compute, WeightFormat};

#[path = "common/cli.rs"]
mod cli;
use cli::{compute, kv_format, options_or_exit, positive, process_threads, threads, weight_format};
#[path = "common/split_mix.rs"]
mod split_mix;
use split_mix::SplitMix;

/// Command-line options.
struct Options {
    dir: Option<PathBuf>,
    prefill: usize,
    decode: usize,
    threads: usize,
    batch: usize,
    /// How the layers keep their caches' keys and values.
    kv_format: KvFormat,
    /// How the layers keep their weights, when not as stored.
    weights: Option<WeightFormat>,
    /// The arithmetic of the layers' projections.
    compute: Compute,
}

/// The options, as the header of this file lists them, with their defaults.
const USAGE: &str = "\
usage: model [DIR] [options]
  DIR                a checkpoint directory: config.json and model.safetensors, or shards
                     with their index (default: write a small random Llama-shaped checkpoint
                     to a temporary directory and run that)
  --prefill N        prompt tokens per sequence, at least 1 (default: 128)
  --decode M         tokens then decoded one at a time, at least 1 (default: 32)
  --batch B          sequences run together, at least 1 (default: 1)
  --threads T        threads of the pool all layers share; 0 = every CPU this process may
                     use (at most 256) (default: 0)
  --kv-format F      f32, bf16, f16 or q8_0: how the caches keep keys and values
                     (default: f32)
  --weights F        f32, bf16, f16, q8_0 or q4_0: how the layers keep their weights (default: the
                     checkpoint's own format)
  --compute C        f32, int8 or bf16: the projections' arithmetic (int8 needs q8_0 or
                     q4_0 weights, e.g. --weights q8_0; bf16 f32, bf16 or f16) (default: f32)
  -h, --help         this text";

/// The options from the command line: `Ok(None)` for `--help`, `Err` naming a bad argument.
fn parse_options() -> Result<Option<Options>, String> {
    let mut options = Options {
        dir: None,
        prefill: 128,
        decode: 32,
        threads: ThreadPool::new(0).threads(),
        batch: 1,
        kv_format: KvFormat::F32,
        weights: None,
        compute: Compute::F32,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--help" | "-h" => return Ok(None),
            "--prefill" => options.prefill = positive(&arg, &value()?)?,
            "--decode" => options.decode = positive(&arg, &value()?)?,
            "--threads" => options.threads = threads(&arg, &value()?)?,
            "--batch" => options.batch = positive(&arg, &value()?)?,
            "--kv-format" => options.kv_format = kv_format(&arg, &value()?)?,
            "--weights" => options.weights = Some(weight_format(&arg, &value()?)?),
            "--compute" => options.compute = compute(&arg, &value()?)?,
            _ if arg.starts_with('-') => return Err(format!("unknown option {arg}")),
            _ => match &options.dir {
                Some(dir) => return Err(format!("one DIR only, got {} and {arg}", dir.display())),
                None => options.dir = Some(PathBuf::from(arg)),
            },
        }
    }
    Ok(Some(options))
}

/// The small model written when no directory is given: Llama-shaped, D 512, 8 query heads and
/// 2 key/value heads of 64, 4 layers, RoPE.
const SMALL_CONFIG: &str = r#"{"model_type": "llama", "hidden_size": 512, "intermediate_size": 768,
    "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 4,
    "max_position_embeddings": 4096, "rope_theta": 10000.0, "vocab_size": 1000}"#;

/// Writes the small random model to `dir`: `config.json`, two shards (layers 0 and 1 and the
/// query and key of layer 2 in the first, the rest of layer 2, layer 3 and the embedding in
/// the second) and `model.safetensors.index.json`.
fn write_small_checkpoint(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("config.json"), SMALL_CONFIG)?;
    let (d, kv, mlp) = (512, 2 * 64, 768);
    let mut rng = SplitMix(20);
    let mut tensors: Vec<(String, Vec<usize>)> = Vec::new();
    for layer in 0..4 {
        let p = format!("model.layers.{layer}");
        for (name, rows, cols) in [
            ("self_attn.q_proj", d, d),
            ("self_attn.k_proj", kv, d),
            ("self_attn.v_proj", kv, d),
            ("self_attn.o_proj", d, d),
            ("mlp.gate_proj", mlp, d),
            ("mlp.up_proj", mlp, d),
            ("mlp.down_proj", d, mlp),
        ] {
            tensors.push((format!("{p}.{name}.weight"), vec![rows, cols]));
        }
    }
    tensors.push((String::from("model.embed_tokens.weight"), vec![1000, d]));
    let values: Vec<Vec<f32>> = tensors
        .iter()
        .map(|(_, shape)| rng.vec(shape[0] * shape[1], (3.0 / shape[1] as f32).sqrt()))
        .collect();
    // Layers 0, 1 and the first two tensors of layer 2 in the first shard.
    let split = 2 * 7 + 2;
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let mut weight_map = Vec::new();
    for (shard, range) in [0..split, split..tensors.len()].into_iter().enumerate() {
        let views: Vec<(&str, &[usize], &[f32])> = range
            .clone()
            .map(|t| {
                (
                    tensors[t].0.as_str(),
                    tensors[t].1.as_slice(),
                    values[t].as_slice(),
                )
            })
            .collect();
        write_file(dir.join(names[shard]), &views, &[("format", "pt")])
            .map_err(std::io::Error::other)?;
        weight_map.extend(range.map(|t| (tensors[t].0.as_str(), names[shard])));
    }
    let total: usize = values.iter().map(|v| v.len() * 4).sum();
    let index = serialize_index(&weight_map, total as u64);
    std::fs::write(dir.join("model.safetensors.index.json"), index)
}

/// Runs `tokens (B, T, D)` through every layer, each appending to its cache (a KV-shared
/// layer, `sources[i]` the layer whose cache it reads, attends over that one); returns the
/// last layer's output.
fn through_layers(
    layers: &mut [Layer],
    (caches, sources): (&mut [Option<KvCache>], &[Option<usize>]),
    tokens: &[f32],
    batch: usize,
) -> Vec<f32> {
    let d = layers[0].widths().d_model;
    let len = tokens.len() / (batch * d).max(1);
    let mut x = tokens.to_vec();
    let mut y = vec![0.0; x.len()];
    for (i, layer) in layers.iter_mut().enumerate() {
        let input = Tokens::new(&x, batch, len, d).expect("tokens of the model's width");
        let output = Output::new(&mut y, batch, len, d).expect("an output of the same shape");
        let options = AttendOptions::default();
        let done = match sources[i] {
            Some(source) => {
                let cache = caches[source].as_ref().expect("a source layer's cache");
                layer.decode_shared_into(input, cache, options, output)
            }
            None => {
                let cache = caches[i]
                    .as_mut()
                    .expect("a layer with keys and values has a cache");
                layer.decode_into(input, cache, options, output)
            }
        };
        done.unwrap_or_else(|e| panic!("decoding: {e}"));
        std::mem::swap(&mut x, &mut y);
    }
    x
}

/// `n` and `noun`, in the plural unless `n` is 1.
fn counted(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// `bytes` in MB.
fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn main() {
    let options = options_or_exit(parse_options(), USAGE);
    if let Err(e) = run(options) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(options: Options) -> Result<(), Box<dyn std::error::Error>> {
    let dir = match &options.dir {
        Some(dir) => dir.clone(),
        None => {
            let dir =
                std::env::temp_dir().join(format!("mha-model-example-{}", std::process::id()));
            write_small_checkpoint(&dir)?;
            println!(
                "wrote a random Llama-shaped checkpoint (4 layers, 2 shards + index) to {}",
                dir.display()
            );
            dir
        }
    };
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let files: u64 = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum();
    let (n, m, batch) = (options.prefill, options.decode, options.batch);

    let start = Instant::now();
    let checkpoint = Checkpoint::open(&dir)?;
    let headers = checkpoint.bytes_read();
    // One set of worker threads for every layer.
    let pool = ThreadPool::new(options.threads);
    let format = options.kv_format;
    let mut layers = checkpoint.layers_with(.., |b| {
        let b = b
            .thread_pool(&pool)
            .kv_format(format)
            .compute(options.compute);
        match options.weights {
            Some(weights) => b.weight_format(weights),
            None => b,
        }
    })?;
    let load = start.elapsed().as_secs_f64();
    let config = checkpoint.config(0)?;
    let first = &layers[0];
    println!(
        "{}: {}, layers {}, D {}, {} query heads and {} key/value heads of {}; kernels {:?}, calls on up to {} (one pool for all layers)",
        dir.display(),
        config.model_type,
        layers.len(),
        first.widths().d_model,
        first.n_heads(),
        first.n_kv_heads(),
        first.head_dim(),
        first.isa(),
        counted(pool.threads(), "thread"),
    );
    let weights: usize = layers.iter().map(Layer::packed_bytes).sum();
    println!(
        "load     {:8.3} s   read {:.2} MB of {:.2} MB of weights files (headers {} bytes, then the attention tensors); layers hold {:.2} MB of packed weights in {}, computing in {}",
        load,
        mb(checkpoint.bytes_read()),
        mb(files),
        headers,
        mb(weights as u64),
        first.weight_format().name(),
        first.compute().name()
    );

    // One cache per layer with keys and values of its own: a rolling one (window plus one
    // call's tokens) for a windowed layer. A KV-shared layer reads its source layer's.
    let sources = (0..layers.len())
        .map(|i| checkpoint.kv_source(i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut caches = layers
        .iter()
        .map(|l| {
            let capacity = if l.sliding_window().is_some() {
                n.max(1)
            } else {
                n + m
            };
            (!l.is_kv_shared())
                .then(|| l.new_cache(batch, capacity))
                .transpose()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let d = layers[0].widths().d_model;
    let mut rng = SplitMix(7);
    let prompt = rng.vec(batch * n * d, 1.0);
    let start = Instant::now();
    let mut last = through_layers(&mut layers, (&mut caches, &sources), &prompt, batch);
    let prefill = start.elapsed().as_secs_f64();
    println!(
        "prefill  {:8.3} s   {} × {batch}: {:.0} tokens/s",
        prefill,
        counted(n, "token"),
        (n * batch) as f64 / prefill
    );

    let start = Instant::now();
    for _ in 0..m {
        let token = rng.vec(batch * d, 1.0);
        last = through_layers(&mut layers, (&mut caches, &sources), &token, batch);
    }
    let decode = start.elapsed().as_secs_f64();
    println!(
        "decode   {:8.3} s   {} × {batch}: {:.0} tokens/s, {:.3} ms per token through {}",
        decode,
        counted(m, "token"),
        (m * batch) as f64 / decode,
        decode * 1e3 / m as f64,
        counted(layers.len(), "layer")
    );
    let own: Vec<&KvCache> = caches.iter().flatten().collect();
    let cache_bytes: usize = own.iter().map(|c| c.bytes()).sum();
    println!(
        "caches   {:.2} MB ({}) for {} × {batch} in {}; last output's mean |y| {:.4}",
        mb(cache_bytes as u64),
        format.name(),
        counted(own[0].len(), "token"),
        counted(own.len(), "layer"),
        last.iter().map(|v| v.abs() as f64).sum::<f64>() / last.len() as f64
    );
    // The threads the process runs: this one and the pool's workers that calls have started.
    if let Some(running) = process_threads() {
        println!(
            "threads  {} in the process after the run (the pool has {})",
            running,
            counted(pool.threads(), "thread")
        );
    }
    if options.dir.is_none() {
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}
