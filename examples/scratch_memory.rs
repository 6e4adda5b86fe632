//! The memory of a model's attention after a long prefill: `L` Llama-shaped layers on one
//! shared `ThreadPool` (or each on threads of its own, `--own`), a prefill of `T` tokens
//! through every layer into its KV cache (attention only: each layer's output is the next
//! layer's input), then the process's peak and current resident memory (Linux:
//! `/proc/self/status` `VmHWM`, `VmRSS`) against what the model must hold: the packed weights
//! (`Layer::packed_bytes`), the caches (`KvCache::bytes`), the prefill's input and output
//! rows, and one layer's scratch (`Layer::scratch_bytes`, the buffers that grow with a call's
//! tokens). Layers on one pool share one scratch, so the resident memory above the process's
//! start should be about weights + caches + rows + one layer's scratch; layers with threads of
//! their own hold one scratch each. Then the scratch is released (`ThreadPool::release_scratch`
//! or `Layer::release_scratch`) and the current resident memory read again.
//!
//! ```text
//! cargo run --release --example scratch_memory                      # 32 layers, D 1024, 4096 tokens
//! cargo run --release --example scratch_memory -- --own             # a scratch per layer
//! cargo run --release --example scratch_memory -- --d-model 4096 --heads 32 --kv-heads 8  # Llama-3.1-8B's widths
//! ```
//!
//! The default shape is Llama-3.1-8B's attention with its width divided by 4: heads of 128,
//! four query heads per key/value head (8 over 2), RoPE; `--d-model 4096 --heads 32
//! --kv-heads 8` is the model's own (its weights alone are 5 GiB in `f32`).

use mha::{AttendOptions, KvCache, Layer, Output, Projections, Rope, RopeLayout, RopeScaling};
use mha::{ThreadPool, Tokens, Widths};

#[allow(dead_code)] // the helpers other examples use
#[path = "common/cli.rs"]
mod cli;
use cli::{options_or_exit, positive, threads};
#[path = "common/split_mix.rs"]
mod split_mix;
use split_mix::SplitMix;

/// Command-line options.
struct Options {
    layers: usize,
    d_model: usize,
    heads: usize,
    kv_heads: usize,
    tokens: usize,
    threads: usize,
    /// Each layer on threads (and scratch) of its own.
    own: bool,
}

const USAGE: &str = "\
usage: scratch_memory [options]
  --layers L      layers (default: 32)
  --d-model D     model width (default: 1024)
  --heads H       query heads, of D / H each (default: 8)
  --kv-heads K    key/value heads (default: 2)
  --tokens T      prefill tokens (default: 4096)
  --threads N     threads per call; 0 = every CPU this process may use (default: 1)
  --own           each layer on threads and scratch of its own, not one shared pool
  -h, --help      this text";

/// The options from the command line: `Ok(None)` for `--help`, `Err` naming a bad argument.
fn parse_options() -> Result<Option<Options>, String> {
    let mut options = Options {
        layers: 32,
        d_model: 1024,
        heads: 8,
        kv_heads: 2,
        tokens: 4096,
        threads: 1,
        own: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--help" | "-h" => return Ok(None),
            "--layers" => options.layers = positive(&arg, &value()?)?,
            "--d-model" => options.d_model = positive(&arg, &value()?)?,
            "--heads" => options.heads = positive(&arg, &value()?)?,
            "--kv-heads" => options.kv_heads = positive(&arg, &value()?)?,
            "--tokens" => options.tokens = positive(&arg, &value()?)?,
            "--threads" => options.threads = threads(&arg, &value()?)?,
            "--own" => options.own = true,
            _ => return Err(format!("unknown option {arg}")),
        }
    }
    Ok(Some(options))
}

/// `VmHWM` and `VmRSS` of `/proc/self/status`, in bytes (0 where unreadable).
fn resident() -> (usize, usize) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name));
        let kib = line.and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok());
        kib.unwrap_or(0) * 1024
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn mib(bytes: usize) -> String {
    format!("{:8.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// The layers, all from one set of random weights (each packs its own copy).
fn layers(options: &Options, pool: Option<&ThreadPool>) -> Vec<Layer> {
    let (d, head_dim) = (options.d_model, options.d_model / options.heads);
    let kv = options.kv_heads * head_dim;
    let widths = Widths::self_attention(d, kv, d);
    let mut rng = SplitMix(7);
    let scale = (3.0 / d as f32).sqrt();
    let mut matrix = |n: usize| rng.vec(n, scale);
    let (wq, wk, wv, wo) = (matrix(d * d), matrix(d * kv), matrix(d * kv), matrix(d * d));
    let projections = Projections::new(widths, &wq, &wk, &wv, &wo).expect("whole matrices");
    let rope = Rope {
        theta: 500_000.0,
        rotary_dim: head_dim,
        layout: RopeLayout::RotateHalf,
        scaling: RopeScaling::Default,
    };
    (0..options.layers)
        .map(|_| {
            let builder = Layer::builder(projections, options.heads).rope(rope);
            match pool {
                Some(pool) => builder.thread_pool(pool),
                None => builder.threads(options.threads),
            }
            .build()
            .expect("a valid layer")
        })
        .collect()
}

fn main() {
    let options = options_or_exit(parse_options(), USAGE);
    let (_, start) = resident();
    let pool = (!options.own).then(|| ThreadPool::new(options.threads));
    let mut layers = layers(&options, pool.as_ref());
    let (t, d) = (options.tokens, options.d_model);
    let mut caches: Vec<KvCache> = layers
        .iter()
        .map(|layer| layer.new_cache(1, t).expect("room for the cache"))
        .collect();
    let mut rng = SplitMix(11);
    let mut h = rng.vec(t * d, 1.0);
    let mut out = vec![0.0; t * d];
    let began = std::time::Instant::now();
    for (layer, cache) in layers.iter_mut().zip(&mut caches) {
        let x = Tokens::new(&h, 1, t, d).expect("whole tokens");
        let y = Output::new(&mut out, 1, t, d).expect("whole tokens");
        let options = AttendOptions::default();
        layer
            .decode_into(x, cache, options, y)
            .expect("the cache has room");
        std::mem::swap(&mut h, &mut out);
    }
    let seconds = began.elapsed().as_secs_f64();
    let (peak, now) = resident();
    let weights: usize = layers.iter().map(Layer::packed_bytes).sum();
    let cache_bytes: usize = caches.iter().map(KvCache::bytes).sum();
    let rows = 2 * t * d * size_of::<f32>();
    let scratch: Vec<usize> = layers.iter().map(Layer::scratch_bytes).collect();
    let one = scratch.iter().copied().max().unwrap_or(0);
    let held = match pool {
        Some(_) => one,
        None => scratch.iter().sum(),
    };
    let owner = if options.own { "its own" } else { "one pool's" };
    println!(
        "{} layers (D {d}, {} heads over {} key/value heads), prefill {t} tokens in {seconds:.1} s, \
         {} thread(s), each layer on {owner} threads and scratch",
        options.layers, options.heads, options.kv_heads, options.threads
    );
    let needed = weights + cache_bytes + rows;
    println!("weights (packed)             {}", mib(weights));
    println!("KV caches                    {}", mib(cache_bytes));
    println!("prefill rows in and out      {}", mib(rows));
    println!("one layer's scratch          {}", mib(one));
    println!("scratch held (all layers)    {}", mib(held));
    println!("weights + caches + rows      {}", mib(needed));
    println!("  + 1.2 x one scratch        {}", mib(needed + one * 6 / 5));
    let above = |rss: usize| rss.saturating_sub(start);
    println!("RSS at start                 {}", mib(start));
    println!("peak RSS above start         {}", mib(above(peak)));
    println!("RSS above start              {}", mib(above(now)));
    let excess = above(peak) as f64 - needed as f64;
    println!(
        "peak above weights + caches + rows: {} = {:.2} x one layer's scratch",
        mib(excess.max(0.0) as usize),
        excess / one.max(1) as f64
    );
    match &pool {
        Some(pool) => pool.release_scratch(),
        None => layers.iter_mut().for_each(Layer::release_scratch),
    }
    println!("RSS above start, released    {}", mib(above(resident().1)));
}
