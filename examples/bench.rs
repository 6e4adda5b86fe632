//! Times the crate on the benchmark shapes and puts the numbers beside the machine's own FMA
//! peak (measured here, in the same run) and the plain-loop reference.
//!
//! ```text
//! cargo run --release --example bench                      # all shapes, default threads
//! cargo run --release --example bench -- --threads 1,2     # several thread counts
//! taskset -c 0 cargo run --release --example bench -- --threads 1 --shapes gpt2,long
//! ```
//!
//! Options (`--help` lists them with their defaults): `--threads N[,N..]` (0: every CPU the
//! process may use, the default; at most 256), `--shapes tiny,small,gpt2,batch,long`,
//! `--samples N` (7, at least 1),
//! `--no-reference` (skip the slow plain-loop reference), `--once` (one forward per shape, no
//! timing: for measuring peak memory with `/usr/bin/time -v`), `--modes decode,encoder,model`
//! (the attention-mode table after the shapes, and the model-shaped table of
//! `common/model_shaped.rs`; `--modes none` skips them; `serve`, not run by default, the
//! serving table of `common/serve.rs`: ragged batches, paged caches), `--kv-formats f32,bf16,f16,q8_0`
//! (the decode steps' cache formats; `f32` by default), `--weight-formats f32,bf16,f16,q8_0,q4_0` (the
//! layers' projection weights, for the shapes and the decode steps; `f32` by default; a row
//! with 16-bit weights is named `shape/bf16`, and only `f32` rows time the one-shot calls),
//! `--compute f32,int8,bf16` (the projections' arithmetic, `Compute`; rows named
//! `shape/q8_0*int8` or `shape/bf16*bf16`, each for the weight formats it accepts
//! (`Compute::accepts`); `f32` by default), `--attention-compute f32,bf16` (the attention's
//! `Q·Kᵀ` and `P·V`, `LayerBuilder::attention_compute`; rows with `bf16` named `..+attn`;
//! `f32` by default).
//!
//! FMA peak: per kernel table this CPU runs and per thread count, twelve independent
//! multiply-add chains per thread on that table's vectors (sixteen on NEON), each accumulator
//! in a register of its own (the peer kit's `fma_peak` does the same), after a short warm-up,
//! best of 5 runs.
//! `% peak` is of the peak of the table the layers run (`kernels:` line).
//!
//! Timing: one warm-up call, then `samples` samples of as many calls as fill at least 50 ms;
//! the median sample is reported. Useful FLOPs are `8·B·T·D² + 2·B·D·T·(T+1)`. Beside each
//! steady-state layer forward: `new GB/s`, the weights (`4·D²·4` bytes) over the median time
//! of building the layer (`Mha::builder(..).threads(n).build()`, which packs them), and
//! `1-shot ms`, the median time of one `mha_forward` call at the row's thread count when that
//! is `mha_forward`'s own (every CPU the process may use: run the 1-thread row under `taskset
//! -c 0`), else of building a layer with that thread count and running one forward into a
//! new tensor (what `mha_forward` does); `1-shot/layer` is the median ratio
//! over pairs of one-shot and steady-state calls timed back to back (at least 20 ms each).
//!
//! The modes table: a KV-cache decode step (1 new token over a cache of S = 1024 or 4096
//! tokens, D = 768, H = 12, 12 or 4 key/value heads, the layer on a shared `ThreadPool` as a
//! model's layers are, so its workers stay awake between steps): the median of single timed steps (the
//! cache is refilled, untimed, every 8 steps, so it holds S .. S + 7 tokens), GB/s of
//! cached K and V read per step (`B·S·KV·2` values of the cache's format / median), GB/s of all the bytes a step
//! must read (the four weights and the cached K and V) and that as a share of this machine's
//! streaming read bandwidth, measured in the same run (the best of 5 sums over a 256 MB
//! buffer, split between the threads); and a padded encoder batch
//! (B = 8, T = 128, D = 384, H = 12, bidirectional, key lengths 64): the median as above, and
//! GFLOP/s of useful FLOPs `8·B·T·D² + 4·B·T·64·D` (all tokens are projected; attention over
//! the 64 real keys).

use std::time::Instant;

use mha::{
    mha_forward, reference, AttendOptions, Compute, Isa, KvCache, KvFormat, Masking, Matrix, Mha,
    MhaParams, Tensor, ThreadPool, WeightFormat,
};

#[path = "common/cli.rs"]
mod cli;
use cli::{compute, kv_format, options_or_exit, positive, threads, weight_format};
#[path = "common/split_mix.rs"]
mod split_mix;
use split_mix::SplitMix;
#[path = "common/model_shaped.rs"]
mod model_shaped;
#[path = "common/serve.rs"]
mod serve;

/// Command-line options.
struct Options {
    threads: Vec<usize>,
    shapes: Vec<String>,
    samples: usize,
    reference: bool,
    once: bool,
    modes: Vec<String>,
    /// The key/value formats of the decode steps' caches.
    kv_formats: Vec<KvFormat>,
    /// The formats of the layers' weights.
    weight_formats: Vec<WeightFormat>,
    /// The arithmetic of the layers' projections.
    computes: Vec<Compute>,
    /// The arithmetic of the layers' attention.
    attention_computes: Vec<Compute>,
}

/// The options, as the header of this file explains them, with their defaults.
const USAGE: &str = "\
usage: bench [options]
  --threads N[,N..]        thread counts to run each table at; 0 = every CPU this process may
                           use (at most 256) (default: 0)
  --shapes S[,S..]         of tiny, small, gpt2, batch, long (default: all)
  --samples N              timed samples per row, at least 1 (default: 7)
  --no-reference           skip the slow plain-loop reference
  --once                   one forward per shape, no timing (for peak memory)
  --modes M[,M..]          tables after the shapes: decode, encoder, model, serve, or none
                           (default: decode,encoder,model)
  --kv-formats F[,F..]     decode steps' cache formats, of f32, bf16, f16, q8_0 (default: f32)
  --weight-formats F[,F..] layers' weight formats, of f32, bf16, f16, q8_0, q4_0 (default:
                           f32)
  --compute C[,C..]        projections' arithmetic, of f32, int8, bf16 (int8: q8_0 and
                           q4_0 weights only; bf16: f32, bf16 and f16) (default: f32)
  --attention-compute C[,C..]  the attention's arithmetic, of f32, bf16 (default: f32)
  -h, --help               this text";

/// The benchmark shapes `--shapes` can name.
const SHAPES: [&str; 5] = ["tiny", "small", "gpt2", "batch", "long"];

/// The tables `--modes` can name (`none`: no table after the shapes).
const MODES: [&str; 5] = ["decode", "encoder", "model", "serve", "none"];

/// The options from the command line: `Ok(None)` for `--help`, `Err` naming a bad argument.
fn parse_options() -> Result<Option<Options>, String> {
    let mut options = Options {
        threads: vec![ThreadPool::new(0).threads()],
        shapes: SHAPES.map(String::from).to_vec(),
        samples: 7,
        reference: true,
        once: false,
        modes: ["decode", "encoder", "model"].map(String::from).to_vec(),
        kv_formats: vec![KvFormat::F32],
        weight_formats: vec![WeightFormat::F32],
        computes: vec![Compute::F32],
        attention_computes: vec![Compute::F32],
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--help" | "-h" => return Ok(None),
            "--threads" => options.threads = list(&value()?, |n| threads(&arg, n))?,
            "--shapes" => options.shapes = list(&value()?, |name| known(&arg, name, &SHAPES))?,
            "--samples" => options.samples = positive(&arg, &value()?)?,
            "--no-reference" => options.reference = false,
            "--once" => options.once = true,
            "--modes" => options.modes = list(&value()?, |name| known(&arg, name, &MODES))?,
            "--kv-formats" => options.kv_formats = list(&value()?, |n| kv_format(&arg, n))?,
            "--weight-formats" => {
                options.weight_formats = list(&value()?, |n| weight_format(&arg, n))?
            }
            "--compute" => options.computes = list(&value()?, |n| compute(&arg, n))?,
            "--attention-compute" => {
                options.attention_computes = list(&value()?, |n| attention_compute(&arg, n))?
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(Some(options))
}

/// The comma-separated items of `value`, each through `item`.
fn list<T>(value: &str, item: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    value.split(',').map(item).collect()
}

/// `name` if it is one of `names`, else an error naming `option` and the choices.
fn known(option: &str, name: &str, names: &[&str]) -> Result<String, String> {
    if names.contains(&name) {
        return Ok(name.to_string());
    }
    let choices = names.join(", ");
    Err(format!("{option}: {name:?} is none of {choices}"))
}

/// Median seconds per call of `f`.
fn time_median(samples: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut reps = 1usize;
    loop {
        let start = Instant::now();
        for _ in 0..reps {
            f();
        }
        if start.elapsed().as_secs_f64() >= 0.05 {
            break;
        }
        reps *= 2;
    }
    let mut times: Vec<f64> = (0..samples.max(1))
        .map(|_| {
            let start = Instant::now();
            for _ in 0..reps {
                f();
            }
            start.elapsed().as_secs_f64() / reps as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// One row of the report for shape `(B, T, D)` with `h` heads.
fn run_shape<const B: usize, const T: usize, const D: usize>(
    name: &str,
    h: usize,
    options: &Options,
    peaks: &[(usize, f64)],
) {
    let mut rng = SplitMix(7);
    let x = Tensor::<B, T, D>::from_fn(|_, _, _| rng.uniform());
    let scale = (3.0 / D as f32).sqrt();
    let mut weight = || Matrix::<D, D>::from_fn(|_, _| rng.uniform() * scale);
    let params = MhaParams::new(weight(), weight(), weight(), weight());
    let (b, t, d) = (B as f64, T as f64, D as f64);
    let flops = 8.0 * b * t * d * d + 2.0 * b * d * t * (t + 1.0);

    let reference_time = (options.reference && !options.once).then(|| {
        let start = Instant::now();
        let y = reference::mha_forward(&x, &params, h).expect("valid heads");
        std::hint::black_box(y);
        start.elapsed().as_secs_f64()
    });
    for &threads in &options.threads {
        // A block format needs every input width (D, and Q = D here) in whole blocks.
        let fits = |f: &WeightFormat| D.is_multiple_of(f.block_values());
        for &format in options.weight_formats.iter().filter(|f| fits(f)) {
            let computes = options.computes.iter().filter(|c| c.accepts(format));
            for (&compute, &attention) in
                computes.flat_map(|c| options.attention_computes.iter().map(move |a| (c, a)))
            {
                let row = ShapeRow {
                    name,
                    h,
                    threads,
                    format,
                    compute: (compute, attention),
                    flops,
                    reference_time,
                };
                run_shape_row(&x, &params, row, options, peaks);
            }
        }
    }
}

/// What one row of the shapes table runs.
struct ShapeRow<'a> {
    name: &'a str,
    /// Query heads.
    h: usize,
    threads: usize,
    format: WeightFormat,
    /// The projections' and the attention's arithmetic.
    compute: (Compute, Compute),
    /// Useful FLOPs of one forward.
    flops: f64,
    /// Seconds of the plain-loop reference, when it ran.
    reference_time: Option<f64>,
}

/// One row of the shapes table: a layer of `params` with `row`'s threads and weight format.
fn run_shape_row<const B: usize, const T: usize, const D: usize>(
    x: &Tensor<B, T, D>,
    params: &MhaParams<D>,
    row: ShapeRow<'_>,
    options: &Options,
    peaks: &[(usize, f64)],
) {
    let (threads, h) = (row.threads, row.h);
    let name = match (row.format, row.compute.0) {
        (WeightFormat::F32, Compute::F32) => String::from(row.name),
        (format, Compute::F32) => format!("{}/{}", row.name, format.name()),
        (format, compute) => format!("{}/{}*{}", row.name, format.name(), compute.name()),
    } + attention_suffix(row.compute.1);
    let mut layer = Mha::builder(params, h)
        .threads(threads)
        .weight_format(row.format)
        .compute(row.compute.0)
        .attention_compute(row.compute.1)
        .build()
        .expect("valid heads");
    let mut out = Tensor::<B, T, D>::zeros();
    if options.once {
        layer
            .forward_into(x, AttendOptions::default(), &mut out)
            .expect("matching shapes");
        println!(
            "{name:>6}  B={B} T={T} D={D} H={h}: one forward done (checksum {:.4})",
            out.as_slice().iter().sum::<f32>()
        );
        return;
    }
    let seconds = time_median(options.samples, || {
        layer
            .forward_into(x, AttendOptions::default(), &mut out)
            .expect("matching shapes")
    });
    let gflops = row.flops / seconds / 1e9;
    let peak = peaks
        .iter()
        .find(|&&(n, _)| n == threads)
        .map_or(f64::NAN, |&(_, p)| p);
    let speedup = row
        .reference_time
        .map_or(String::from("-"), |r| format!("{:.0}x", r / seconds));
    let reference_ms = row
        .reference_time
        .map_or(String::from("-"), |r| format!("{:.4}", r * 1e3));
    let one_shot = match row.format {
        WeightFormat::F32 => {
            let c = one_shot_costs(x, params, &mut layer, options.samples, seconds);
            format!(
                "{:>8.2} {:>11.5} {:>11.2}x",
                c.pack_gbs,
                c.seconds * 1e3,
                c.ratio
            )
        }
        _ => format!("{:>8} {:>11} {:>12}", "-", "-", "-"),
    };
    println!(
        "{name:>6} {threads:>3} {:>12.5} {gflops:>9.1} {:>7.1}% {reference_ms:>12} {speedup:>9} \
         {one_shot}",
        seconds * 1e3,
        100.0 * gflops / peak,
    );
}

/// What a one-shot call costs beside a steady-state forward of `layer` on `x`.
struct OneShot {
    /// GB/s of weights (`4·D²·4` bytes) over the median time of building a layer.
    pack_gbs: f64,
    /// Median seconds of one `mha_forward` call when the layer's thread count is its default
    /// (every CPU the process may use), else of building a layer with that thread count and
    /// running one forward into a new tensor (what `mha_forward` does).
    seconds: f64,
    /// Median of one-shot over steady-state seconds, each pair timed back to back.
    ratio: f64,
}

/// Measures [`OneShot`] for layers like `layer` (same weights, heads and threads): `samples`
/// pairs, each timing as many steady-state forwards of `layer` as fill about 20 ms (at
/// `seconds` per call) and then as many one-shot calls, so that both halves of a pair see the
/// same load on a shared machine.
fn one_shot_costs<const B: usize, const T: usize, const D: usize>(
    x: &Tensor<B, T, D>,
    params: &MhaParams<D>,
    layer: &mut Mha<D>,
    samples: usize,
    seconds: f64,
) -> OneShot {
    let (h, threads) = (layer.n_heads(), layer.threads());
    let build = || {
        Mha::builder(params, h)
            .threads(threads)
            .build()
            .expect("valid heads")
    };
    let construction = time_median(samples, || drop(std::hint::black_box(build())));
    let default_threads = Mha::new(params, h).expect("valid heads").threads();
    let reps = ((0.02 / seconds).ceil() as usize).max(1);
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..reps {
            f();
        }
        start.elapsed().as_secs_f64() / reps as f64
    };
    let mut out = Tensor::<B, T, D>::zeros();
    let (mut once, mut ratios) = (Vec::new(), Vec::new());
    for _ in 0..samples.max(1) {
        let steady = time(&mut || {
            layer
                .forward_into(x, AttendOptions::default(), &mut out)
                .expect("matching shapes")
        });
        let one_shot = time(&mut || {
            let y = if threads == default_threads {
                mha_forward(x, params, h).expect("valid heads")
            } else {
                build().forward(x).expect("a plain layer")
            };
            drop(std::hint::black_box(y))
        });
        once.push(one_shot);
        ratios.push(one_shot / steady);
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    OneShot {
        pack_gbs: (4 * D * D * 4) as f64 / construction / 1e9,
        seconds: median(once),
        ratio: median(ratios),
    }
}

/// Rounds of the FMA chains per timed run (each round is one multiply-add per chain).
const PEAK_ROUNDS: u64 = 20_000_000;
/// Timed runs per kernel table and thread count; the best is kept.
const PEAK_RUNS: usize = 5;

/// The FMA peak of every kernel table this CPU runs, in GFLOP/s for each of `threads`:
/// `(table, [(threads, GFLOP/s)])`.
fn fma_peaks(threads: &[usize]) -> Vec<(Isa, Vec<(usize, f64)>)> {
    Isa::ALL
        .into_iter()
        .filter(|isa| isa.is_supported())
        .map(|isa| {
            (
                isa,
                threads.iter().map(|&n| (n, fma_peak(isa, n))).collect(),
            )
        })
        .collect()
}

/// The best of [`PEAK_RUNS`] runs of `threads` threads each running independent FMA chains
/// with `isa`'s vectors (after one short warm-up run each, for the clock to ramp up): the
/// FLOPs of all threads over the slowest thread's time, in GFLOP/s.
fn fma_peak(isa: Isa, threads: usize) -> f64 {
    let run = || {
        fma_flops(isa, PEAK_ROUNDS / 10);
        let start = Instant::now();
        let flops = fma_flops(isa, PEAK_ROUNDS);
        (flops, start.elapsed().as_secs_f64())
    };
    (0..PEAK_RUNS)
        .map(|_| {
            let results: Vec<(f64, f64)> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads).map(|_| s.spawn(run)).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("FMA thread"))
                    .collect()
            });
            let flops: f64 = results.iter().map(|r| r.0).sum();
            let slowest = results.iter().map(|r| r.1).fold(0.0, f64::max);
            flops / slowest / 1e9
        })
        .fold(0.0, f64::max)
}

/// Independent chains `c = c · a + b`, one per accumulator named (each a local of its own, so
/// a register: nothing goes through memory inside the loop), `rounds` rounds; `$fma(c, a, b)`
/// is one vector multiply-add. No start is the chains' fixed point `b / (1 - a) = 0.1`, which
/// the compiler would fold away. Evaluates to the number of chains.
macro_rules! fma_chains {
    ($rounds:expr, $splat:expr, $fma:expr; $($c:ident = $start:literal),+) => {{
        let (a, b) = ($splat(0.999_999), $splat(1e-7));
        $(let mut $c = $splat($start);)+
        for _ in 0..$rounds {
            $($c = $fma($c, a, b);)+
        }
        std::hint::black_box([$($c),+]).len() as u64
    }};
}

/// Twelve chains (the peer kit's `fma_peak` runs twelve): enough for two FMA pipes of up to
/// 6 cycles' latency.
macro_rules! twelve_chains {
    ($rounds:expr, $splat:expr, $fma:expr) => {
        fma_chains!($rounds, $splat, $fma; c0 = 1.0, c1 = 1.1, c2 = 1.2, c3 = 1.3, c4 = 1.4,
            c5 = 1.5, c6 = 1.6, c7 = 1.7, c8 = 1.8, c9 = 1.9, c10 = 2.0, c11 = 2.1)
    };
}

/// Runs `rounds` rounds of FMA chains on the vectors of `isa` (a supported table); returns
/// the FLOPs done (2 per lane and multiply-add).
fn fma_flops(isa: Isa, rounds: u64) -> f64 {
    let lanes_per_round = match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `fma_peaks` measures supported tables only.
        Isa::Avx512 => unsafe { x86::chains_avx512(rounds) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::chains_avx2(rounds) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: every AArch64 CPU has NEON.
        Isa::Neon => unsafe { aarch64::chains_neon(rounds) },
        _ => portable_chains(rounds),
    };
    (rounds * lanes_per_round) as f64 * 2.0
}

/// The portable table's peak: twelve chains of four-lane arrays (SSE on x86-64), multiply
/// then add, as the portable kernels compute (they cannot fuse without `std`). Returns the
/// lanes per round.
fn portable_chains(rounds: u64) -> u64 {
    #[inline(always)]
    fn mul_add(c: [f32; 4], a: [f32; 4], b: [f32; 4]) -> [f32; 4] {
        core::array::from_fn(|i| c[i] * a[i] + b[i])
    }
    twelve_chains!(rounds, |x: f32| [x; 4], mul_add) * 4
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Twelve chains of 16-lane FMAs (AVX-512F); returns the lanes per round.
    #[target_feature(enable = "avx512f")]
    pub fn chains_avx512(rounds: u64) -> u64 {
        twelve_chains!(rounds, _mm512_set1_ps, _mm512_fmadd_ps) * 16
    }

    /// Twelve chains of 8-lane FMAs (AVX2 + FMA); returns the lanes per round.
    #[target_feature(enable = "avx2,fma")]
    pub fn chains_avx2(rounds: u64) -> u64 {
        twelve_chains!(rounds, _mm256_set1_ps, _mm256_fmadd_ps) * 8
    }
}

#[cfg(target_arch = "aarch64")]
mod aarch64 {
    use std::arch::aarch64::*;

    /// `c + a · b` (`fmla` accumulates into its addend, so the chain runs through it: one
    /// instruction per link, as on x86). The starts stay below 2, where adding `a · b ≈ 1e-7`
    /// still changes `c` (from 2 on it rounds back, a fixed point the compiler would fold).
    #[inline(always)]
    fn fma(c: float32x4_t, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: every AArch64 CPU has NEON.
        unsafe { vfmaq_f32(c, a, b) }
    }

    /// Sixteen chains of 4-lane FMAs (NEON; the 32 registers hold them, and cores with four
    /// FMA pipes of 4 cycles' latency need sixteen); returns the lanes per round.
    #[target_feature(enable = "neon")]
    pub fn chains_neon(rounds: u64) -> u64 {
        let chains = fma_chains!(rounds, vdupq_n_f32, fma; c0 = 0.4, c1 = 0.5, c2 = 0.6,
            c3 = 0.7, c4 = 0.8, c5 = 0.9, c6 = 1.0, c7 = 1.1, c8 = 1.2, c9 = 1.3, c10 = 1.4,
            c11 = 1.5, c12 = 1.6, c13 = 1.7, c14 = 1.8, c15 = 1.9);
        chains * 4
    }
}

fn main() {
    let options = options_or_exit(parse_options(), USAGE);
    let isa = Isa::detect();
    let all_peaks = if options.once {
        Vec::new()
    } else {
        fma_peaks(&options.threads)
    };
    println!("kernels: {isa:?}");
    for (table, peaks) in &all_peaks {
        for &(n, p) in peaks {
            println!(
                "FMA peak, {:>8} table, {n} thread(s): {p:6.1} GFLOP/s (measured now)",
                table.name()
            );
        }
    }
    // `% peak` is of the peak of the table the layers run.
    let peaks: Vec<(usize, f64)> = all_peaks
        .into_iter()
        .find(|&(table, _)| table == isa)
        .map_or_else(Vec::new, |(_, peaks)| peaks);
    println!(
        "{:>6} {:>3} {:>12} {:>9} {:>8} {:>12} {:>9} {:>8} {:>11} {:>12}",
        "shape",
        "thr",
        "median ms",
        "GFLOP/s",
        "% peak",
        "ref ms",
        "speed-up",
        "new GB/s",
        "1-shot ms",
        "1-shot/layer"
    );
    for shape in &options.shapes {
        match shape.as_str() {
            "tiny" => run_shape::<1, 2, 4>("tiny", 2, &options, &peaks),
            "small" => run_shape::<1, 128, 256>("small", 4, &options, &peaks),
            "gpt2" => run_shape::<1, 1024, 768>("gpt2", 12, &options, &peaks),
            "batch" => run_shape::<8, 256, 512>("batch", 8, &options, &peaks),
            "long" => run_shape::<1, 4096, 512>("long", 8, &options, &peaks),
            other => unreachable!("parse_options checked the shape {other}"),
        }
    }
    if !options.once {
        run_modes(&options);
    }
    if !options.once && options.modes.iter().any(|m| m == "model") {
        let formats: Vec<(WeightFormat, KvFormat)> = options
            .weight_formats
            .iter()
            .flat_map(|&w| options.kv_formats.iter().map(move |&c| (w, c)))
            .collect();
        model_shaped::run_model(&options.threads, &formats);
    }
    if !options.once && options.modes.iter().any(|m| m == "serve") {
        serve::run_serve(&options.threads);
    }
}

/// Decode steps between cache refills.
const STEPS_PER_FILL: usize = 8;

/// The attention-mode table: decode steps and the padded encoder batch.
fn run_modes(options: &Options) {
    let wanted = |name: &str| options.modes.iter().any(|m| m == name);
    if !wanted("decode") && !wanted("encoder") {
        return;
    }
    println!();
    let bandwidths: Vec<f64> = options.threads.iter().map(|&n| read_bandwidth(n)).collect();
    for (threads, bandwidth) in options.threads.iter().zip(&bandwidths) {
        println!(
            "streaming read bandwidth, {threads} thread(s): {bandwidth:.1} GB/s (measured now)"
        );
    }
    println!(
        "{:>30} {:>3} {:>11} {:>9} {:>9} {:>8} {:>9}",
        "mode", "thr", "median ms", "GB/s K/V", "GB/s all", "% read", "GFLOP/s"
    );
    for (&threads, &bandwidth) in options.threads.iter().zip(&bandwidths) {
        let formats = options.weight_formats.iter().flat_map(|&weights| {
            let computes = options.computes.iter().copied();
            let computes = computes.filter(move |&c| c.accepts(weights));
            let attentions = options.attention_computes.iter();
            let computes = computes.flat_map(move |c| attentions.clone().map(move |&a| (c, a)));
            computes.flat_map(move |compute| {
                let caches = options.kv_formats.iter();
                caches.map(move |&cache| Formats {
                    weights,
                    compute,
                    cache,
                })
            })
        });
        for formats in formats.filter(|_| wanted("decode")) {
            run_decode::<1024, 768>(threads, options.samples, (bandwidth, formats));
            run_decode::<1024, 256>(threads, options.samples, (bandwidth, formats));
            run_decode::<4096, 768>(threads, options.samples, (bandwidth, formats));
            run_decode::<4096, 256>(threads, options.samples, (bandwidth, formats));
        }
        if wanted("encoder") {
            run_padded_encoder(threads, options.samples);
        }
    }
}

/// GB/s of the best of 5 sums over a 256 MB buffer, each of `threads` threads summing its own
/// contiguous part: the most a memory-bound step can stream.
fn read_bandwidth(threads: usize) -> f64 {
    const LEN: usize = 64 << 20;
    let buffer = vec![1.0f32; LEN];
    let part = LEN.div_ceil(threads.max(1));
    let sum_part = |values: &[f32]| {
        // 16 independent lanes: the loop vectorises and is bound by memory, not add latency.
        let mut lanes = [0.0f32; 16];
        for chunk in values.chunks_exact(16) {
            for (lane, v) in lanes.iter_mut().zip(chunk) {
                *lane += v;
            }
        }
        lanes.iter().sum::<f32>()
    };
    (0..5)
        .map(|_| {
            let start = Instant::now();
            let total: f32 = std::thread::scope(|s| {
                let handles: Vec<_> = buffer
                    .chunks(part)
                    .map(|values| s.spawn(move || sum_part(values)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("sum thread"))
                    .sum()
            });
            std::hint::black_box(total);
            (LEN * 4) as f64 / start.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

/// How a decode row's layer keeps its weights and its cache.
#[derive(Clone, Copy)]
struct Formats {
    weights: WeightFormat,
    /// The projections' and the attention's arithmetic.
    compute: (Compute, Compute),
    cache: KvFormat,
}

/// One decode step over a cache of `S` tokens: D = 768, H = 12, `KV / 64` key/value heads;
/// `bandwidth` is the machine's streaming read bandwidth at this thread count, in GB/s; the
/// layer keeps its weights and its cache's keys and values in `formats`.
fn run_decode<const S: usize, const KV: usize>(
    threads: usize,
    samples: usize,
    (bandwidth, formats): (f64, Formats),
) {
    let format = formats.cache;
    const D: usize = 768;
    let mut rng = SplitMix(11);
    let scale = (3.0 / D as f32).sqrt();
    let wq = Matrix::<D, D>::from_fn(|_, _| rng.uniform() * scale);
    let wk = Matrix::<D, KV>::from_fn(|_, _| rng.uniform() * scale);
    let wv = Matrix::<D, KV>::from_fn(|_, _| rng.uniform() * scale);
    let wo = Matrix::<D, D>::from_fn(|_, _| rng.uniform() * scale);
    let params = MhaParams::from_parts(wq, wk, wv, wo);
    // On a shared pool, as the layers of a model are: its workers stay awake between calls.
    let pool = ThreadPool::new(threads);
    let mut layer = Mha::builder(&params, 12)
        .thread_pool(&pool)
        .kv_format(format)
        .weight_format(formats.weights)
        .compute(formats.compute.0)
        .attention_compute(formats.compute.1)
        .build()
        .expect("valid heads");
    let prefix = Tensor::<1, S, D>::from_fn(|_, _, _| rng.uniform());
    let tokens: Vec<Tensor<1, 1, D>> = (0..STEPS_PER_FILL)
        .map(|_| Tensor::from_fn(|_, _, _| rng.uniform()))
        .collect();
    let mut filled: KvCache = layer.new_cache(1, S + STEPS_PER_FILL).expect("cache fits");
    let mut prefix_out = Tensor::<1, S, D>::zeros();
    layer
        .decode_into(
            &prefix,
            &mut filled,
            AttendOptions::default(),
            &mut prefix_out,
        )
        .expect("prefix fits");
    let mut cache = filled.clone();
    let mut out = Tensor::<1, 1, D>::zeros();
    // At least 8 refills and samples · 8 steps, and about half a second of steps.
    let mut times = Vec::new();
    let mut spent = 0.0;
    while times.len() < (samples.max(8) * STEPS_PER_FILL) || spent < 0.5 {
        cache.clone_from(&filled);
        for token in &tokens {
            let start = Instant::now();
            layer
                .decode_into(token, &mut cache, AttendOptions::default(), &mut out)
                .expect("room");
            let seconds = start.elapsed().as_secs_f64();
            times.push(seconds);
            spent += seconds;
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let cached_bytes = (S * KV * 2) as f64 * format.bytes_per_value();
    let weight_bytes = (2 * D * D + 2 * D * KV) as f64 * formats.weights.bytes_per_value();
    let all_gbs = (cached_bytes + weight_bytes) / median / 1e9;
    let weights = match formats.compute.0 {
        Compute::F32 => String::from(formats.weights.name()),
        compute => format!("{}*{}", formats.weights.name(), compute.name()),
    };
    let name = match (formats.weights, formats.compute.0) {
        (WeightFormat::F32, Compute::F32) => {
            format!("decode S={S} kv={} {}", KV / 64, format.name())
        }
        _ => format!("decode S={S} kv={} {weights}/{}", KV / 64, format.name()),
    } + attention_suffix(formats.compute.1);
    println!(
        "{name:>30} {threads:>3} {:>11.4} {:>9.1} {:>9.1} {:>7.0}% {:>9}",
        median * 1e3,
        cached_bytes / median / 1e9,
        all_gbs,
        100.0 * all_gbs / bandwidth,
        "-"
    );
}

/// The padded encoder batch: B = 8, T = 128, D = 384, H = 12, bidirectional, key lengths 64.
fn run_padded_encoder(threads: usize, samples: usize) {
    const B: usize = 8;
    const T: usize = 128;
    const D: usize = 384;
    const VALID: usize = 64;
    let mut rng = SplitMix(13);
    let x = Tensor::<B, T, D>::from_fn(|_, _, _| rng.uniform());
    let scale = (3.0 / D as f32).sqrt();
    let mut weight = || Matrix::<D, D>::from_fn(|_, _| rng.uniform() * scale);
    let params = MhaParams::new(weight(), weight(), weight(), weight());
    let mut layer = Mha::builder(&params, 12)
        .masking(Masking::Bidirectional)
        .threads(threads)
        .build()
        .expect("valid heads");
    let lengths = [VALID; B];
    let mut out = Tensor::<B, T, D>::zeros();
    let seconds = time_median(samples, || {
        let options = AttendOptions {
            key_lengths: Some(&lengths),
            ..AttendOptions::default()
        };
        layer
            .forward_into(&x, options, &mut out)
            .expect("valid lengths");
    });
    let flops = (8 * B * T * D * D + 4 * B * T * VALID * D) as f64;
    println!(
        "{:>30} {threads:>3} {:>11.4} {:>9} {:>9} {:>8} {:>9.1}",
        "encoder B8 T128 len64",
        seconds * 1e3,
        "-",
        "-",
        "-",
        flops / seconds / 1e9
    );
}

/// The attention's arithmetic named by `--attention-compute`: `f32` or `bf16`.
fn attention_compute(option: &str, name: &str) -> Result<Compute, String> {
    match compute(option, name)? {
        Compute::Int8 => Err(format!("{option}: int8 is not an attention arithmetic")),
        other => Ok(other),
    }
}

/// What a row's name ends with for the attention's arithmetic.
fn attention_suffix(attention: Compute) -> &'static str {
    match attention {
        Compute::F32 => "",
        _ => "+attn",
    }
}
