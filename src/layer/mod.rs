//! The run-time core: [`Layer`], an attention layer whose widths are numbers, its builder
//! and the one path every call takes (`pass`).
//!
//! Every entry point checks its tokens' widths against the layer's, then runs the pass:
//! project, append keys and values to a store, attend, project the output. The typed
//! [`Mha`](crate::Mha) is this layer with its widths fixed by its type.

mod builder;
pub(crate) mod cache;
pub(crate) mod gate;
pub(crate) mod latent;
pub(crate) mod norm;
pub(crate) mod options;
pub(crate) mod paged;
pub(crate) mod pass;
mod projections;
pub(crate) mod query_scale;
pub(crate) mod rope;
pub(crate) mod scores;
mod shared;
pub(crate) mod split;
pub(crate) mod tokens;

use alloc::vec::Vec;

pub(crate) use builder::sealed;
pub use builder::{BuiltLayer, LayerBuilder};
pub use projections::{Biases, Projections, Widths};

use crate::error::{check_dimension, ShapeError};
use crate::kernels::buffer::{run_time_len, try_filled};
use crate::kernels::store::kv::{KvStore, Rolling, StoreShape};

use crate::kernels::store::Store;
use crate::kernels::threads::parallel::Pool;
use crate::kernels::workspace::Scratch;
use crate::kernels::{Compute, Isa, KvFormat, WeightFormat};
use crate::layer::cache::KvCache;
use crate::layer::gate::OutputGate;
use crate::layer::norm::QkNorm;
use crate::layer::options::{AttendOptions, Masking};
use crate::layer::rope::RopeAngles;
use crate::layer::scores::AlibiPositions;
use crate::layer::tokens::{Output, Tokens};
use builder::Settings;
use pass::{value_rows, Buffers, Call, Pass};

/// A reusable multi-head attention layer whose widths — model width `D`, memory width `E`,
/// key/value width `KV`, query width `Q` ([`Widths`]) — are numbers known at run time: the
/// weights packed once for the chosen instruction set, the settings, and scratch and worker
/// threads kept between calls, so that a loop of calls allocates nothing once the first call
/// has sized the scratch and started the threads.
///
/// Built by [`Layer::builder`] from borrowed [`Projections`]; the typed [`Mha`](crate::Mha)
/// wraps one.
/// Every option of the layer is here: masks, padding, lengths, positions, windows, ALiBi,
/// soft cap, sinks, QK-norm, RoPE, attention weights on request, KV caches.
///
/// | call | keys and values from | writes into | fails on |
/// |---|---|---|---|
/// | [`forward`](Layer::forward) | `x` | a new `Vec` | shapes, a rotary position past [`RopeAngles::max_position`], memory |
/// | [`forward_into`](Layer::forward_into) | `x` | a caller's [`Output`] | options, shapes |
/// | [`cross_into`](Layer::cross_into) | `memory (B, S, E)` | a caller's [`Output`] | options, shapes |
/// | [`decode_into`](Layer::decode_into) | `x`, appended to a [`KvCache`] | a caller's [`Output`] | options, shapes, a full cache |
///
/// Inputs are [`Tokens`] and outputs [`Output`]s (a `&Tensor` and a `&mut Tensor` convert);
/// a width that is not the layer's is an error naming both. All calls run the same steps with
/// the same kernels, so equal inputs give equal bits whatever their views.
///
/// **Threads.** A call uses the calling thread and, when its work is large enough, the layer's
/// worker threads (up to [`threads`](LayerBuilder::threads)` - 1`). They start when a call
/// first needs them, spin briefly between the phases of a call, park when the call returns (so
/// they burn nothing while the caller does other work), and are joined when the layer is
/// dropped; no thread outlives the layer and none is shared with another layer. A call returns
/// only after every worker has finished with it, also when it panics. The layer is `Send` and
/// `Sync` (every call takes `&mut self`, so a shared reference only reads settings). It is not
/// `Clone`: a copy would need scratch and workers of its own.
///
/// ```
/// use mha::{AttendOptions, Layer, Output, Projections, Tokens, Widths};
/// // D = 8, 4 query heads of 2 sharing 2 key/value heads (KV = 4), weights from anywhere.
/// let widths = Widths::self_attention(8, 4, 8);
/// let weight = |n: usize| (0..n).map(|i| (i % 7) as f32 * 0.05 - 0.15).collect::<Vec<f32>>();
/// let (wq, wk, wv, wo) = (weight(64), weight(32), weight(32), weight(64));
/// let mut layer = Layer::builder(Projections::new(widths, &wq, &wk, &wv, &wo)?, 4).threads(1).build()?;
///
/// let (batch, len) = (2, 3);
/// let x: Vec<f32> = (0..batch * len * 8).map(|i| i as f32 * 0.01).collect();
/// let y = layer.forward(Tokens::new(&x, batch, len, 8)?)?;
/// let mut z = vec![0.0; y.len()];
/// layer.forward_into(Tokens::new(&x, batch, len, 8)?, AttendOptions::default(), Output::new(&mut z, batch, len, 8)?)?;
/// assert_eq!(y, z);
///
/// // Tokens of another width are an error naming both widths.
/// let err = layer.forward(Tokens::new(&x, batch, 4, 6)?).unwrap_err();
/// assert_eq!(err.to_string(), "token width (D) is 6, but the call needs 8");
/// # Ok::<(), mha::ShapeError>(())
/// ```
#[derive(Debug)]
pub struct Layer {
    settings: Settings,
    /// The scratch of its calls: its own, or the shared [`ThreadPool`](crate::ThreadPool)'s.
    scratch: Scratch,
    /// The threads of calls on more than one thread: by default the layer's own workers,
    /// started when a call first needs them, parked between calls, joined when the layer is
    /// dropped; else a shared [`ThreadPool`](crate::ThreadPool)'s or an
    /// [`Executor`](crate::Executor)'s.
    pool: Pool,
}

impl Layer {
    /// Starts building a layer over `projections` with `n_heads` query heads of width
    /// `head_dim = Q / n_heads`; the key/value head count is `KV / head_dim`.
    pub fn builder(projections: Projections<'_>, n_heads: usize) -> LayerBuilder<'_> {
        LayerBuilder::new(projections, n_heads)
    }
}

impl<L: BuiltLayer> LayerBuilder<'_, L> {
    /// Checks the head counts and every setting against the widths and packs the weights.
    ///
    /// # Errors
    /// [`ShapeError::ZeroHeads`] or [`ShapeError::NotDivisible`] for a bad `n_heads`
    /// ([`ShapeError::QueryNotDivisible`] when `Q ≠ D`),
    /// [`ShapeError::KvHeads`] when `KV` is not a whole number of heads dividing `n_heads`,
    /// [`ShapeError::ValueWidth`] when `V ≠ KV` is not a whole `dv` per key/value head,
    /// [`ShapeError::Setting`] for a scale or QK-norm `eps` that is not finite or negative,
    /// a non-finite ALiBi slope (or one whose bias overflows in the window: [`Alibi`](crate::Alibi)), a soft
    /// cap that is not finite and positive, a sink that is NaN or `+inf`;
    /// [`ShapeError::LengthMismatch`] for biases, QK-norm weights, ALiBi slopes or sinks of the
    /// wrong length, [`ShapeError::UnsupportedIsa`] when the CPU cannot run the
    /// chosen instruction set, [`ShapeError::ZeroWindow`] for a sliding window of 0,
    /// [`ShapeError::WindowNeedsCausal`] for a window on a bidirectional layer;
    /// for a rotary embedding, what [`RopeAngles::new`] rejects.
    pub fn build(self) -> Result<L, ShapeError> {
        let (settings, pool, scratch) = self.settings()?;
        L::from_layer(Layer {
            settings,
            scratch,
            pool,
        })
    }
}

/// The layer's settings.
impl Layer {
    /// The widths `D`, `E`, `KV`, `Q` and `V`.
    pub fn widths(&self) -> Widths {
        self.settings.widths
    }

    /// The number of query heads `H`.
    pub fn n_heads(&self) -> usize {
        self.settings.n_heads
    }

    /// The number of key/value heads (`H` for plain multi-head attention).
    pub fn n_kv_heads(&self) -> usize {
        self.settings.n_kv_heads
    }

    /// The width of one head, `Q / H` (`D / H` unless the layer's query width differs).
    pub fn head_dim(&self) -> usize {
        self.settings.head_dim
    }

    /// The width `dv` of one value head (and of one merged head), `V / n_kv_heads`:
    /// [`head_dim`](Self::head_dim) unless the widths' [`value`](Widths::value) differs from
    /// `KV` ([`Widths::with_value_width`]).
    ///
    /// ```
    /// use mha::{Layer, Projections, Widths};
    /// // 4 query heads of 6 over 2 key/value heads, value heads of 4.
    /// let widths = Widths::self_attention(8, 12, 24).with_value_width(8);
    /// let (wq, wk, wv, wo) = (vec![0.1; 8 * 24], vec![0.1; 8 * 12], vec![0.1; 8 * 8], vec![0.1; 16 * 8]);
    /// let layer = Layer::builder(Projections::new(widths, &wq, &wk, &wv, &wo)?, 4).build()?;
    /// assert_eq!((layer.head_dim(), layer.value_head_dim(), widths.merged()), (6, 4, 16));
    /// // 9 values over 2 key/value heads are no whole value heads.
    /// let odd = Widths::self_attention(8, 12, 24).with_value_width(9);
    /// let (wv, wo) = (vec![0.1; 8 * 9], vec![0.1; 18 * 8]);
    /// let error = Layer::builder(Projections::new(odd, &wq, &wk, &wv, &wo)?, 4).build().unwrap_err();
    /// assert_eq!(
    ///     error.to_string(),
    ///     "value width 9 is not n_kv_heads x dv for the key/value width 12 and query width 24"
    /// );
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn value_head_dim(&self) -> usize {
        self.settings.value_dim
    }

    /// The thread count.
    pub fn threads(&self) -> usize {
        self.settings.threads
    }

    /// The masking mode.
    pub fn masking(&self) -> Masking {
        self.settings.masking
    }

    /// The factor of the attention scores (see [`LayerBuilder::scale`]).
    pub fn scale(&self) -> f32 {
        self.settings.scale
    }

    /// The QK-norm, if the layer has one.
    pub fn qk_norm(&self) -> Option<&QkNorm> {
        self.settings.qk_norm.as_ref()
    }

    /// The `eps` of the value norm, if the layer has one ([`LayerBuilder::value_norm`]).
    pub fn value_norm(&self) -> Option<f32> {
        self.settings.value_norm
    }

    /// The output gate, if the layer has one ([`LayerBuilder::output_gate`]).
    pub fn output_gate(&self) -> Option<&OutputGate> {
        self.settings.gate.as_ref()
    }

    /// The sliding window ([`LayerBuilder::sliding_window`]), if any.
    pub fn sliding_window(&self) -> Option<usize> {
        self.settings.window
    }

    /// The projection biases (on the typed [`Mha`](crate::Mha), its typed
    /// [`biases`](crate::Mha::biases) come first).
    pub fn biases(&self) -> &Biases {
        &self.settings.biases
    }

    /// The rotary embedding, when the layer has one.
    pub fn rope(&self) -> Option<&RopeAngles> {
        self.settings.rope.as_ref()
    }

    /// The ALiBi slopes, one per query head ([`LayerBuilder::alibi`]).
    pub fn alibi_slopes(&self) -> Option<&[f32]> {
        self.settings.score_terms.slopes.as_deref()
    }

    /// Where ALiBi places keys and queries ([`LayerBuilder::alibi_positions`]).
    pub fn alibi_positions(&self) -> AlibiPositions {
        self.settings.alibi_positions
    }

    /// The logit soft cap ([`LayerBuilder::softcap`]).
    pub fn softcap(&self) -> Option<f32> {
        self.settings.score_terms.cap
    }

    /// The attention sinks' logits, one per query head ([`LayerBuilder::sinks`]).
    pub fn sinks(&self) -> Option<&[f32]> {
        self.settings.score_terms.sinks.as_deref()
    }

    /// The instruction set of the kernels.
    pub fn isa(&self) -> Isa {
        self.settings.weights.output.isa()
    }

    /// The format the layer keeps its projection weights in (see
    /// [`LayerBuilder::weight_format`]); `wo`'s when they are kept in several
    /// ([`LayerBuilder::stored_weight_formats`], [`weight_formats`](Self::weight_formats)).
    pub fn weight_format(&self) -> WeightFormat {
        self.settings.weights.output.format()
    }

    /// The formats the layer keeps `wq`, `wk`, `wv` and `wo` in: [`weight_format`](Self::weight_format)
    /// four times, unless built with [`LayerBuilder::stored_weight_formats`] from matrices
    /// stored in several (see its example).
    pub fn weight_formats(&self) -> [WeightFormat; 4] {
        let [q, k, v, o, _] = self.settings.weights.formats;
        [q, k, v, o]
    }

    /// The arithmetic of the layer's projections (see [`LayerBuilder::compute`]).
    pub fn compute(&self) -> Compute {
        self.settings.weights.output.compute()
    }

    /// The arithmetic of the layer's attention (see [`LayerBuilder::attention_compute`]).
    pub fn attention_compute(&self) -> Compute {
        self.settings.attention_compute
    }

    /// The formats the layer keeps keys and values in, `(keys, values)`, in its caches and a
    /// forward pass's store (see [`LayerBuilder::kv_format`], [`LayerBuilder::key_format`] and
    /// [`LayerBuilder::value_format`]; `f32` by default). Its caches report the same
    /// ([`KvCache::key_format`], [`KvCache::value_format`]).
    ///
    /// ```
    /// use mha::{KvFormat, Layer, Projections, Widths};
    /// let w = vec![0.1; 16];
    /// let projections = Projections::new(Widths::self_attention(4, 4, 4), &w, &w, &w, &w)?;
    /// assert_eq!(Layer::builder(projections, 2).build()?.kv_format(), (KvFormat::F32, KvFormat::F32));
    /// let layer = Layer::builder(projections, 2)
    ///     .key_format(KvFormat::Bf16)
    ///     .value_format(KvFormat::Q8_0)
    ///     .build()?;
    /// assert_eq!(layer.kv_format(), (KvFormat::Bf16, KvFormat::Q8_0));
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn kv_format(&self) -> (KvFormat, KvFormat) {
        let formats = self.settings.kv_formats;
        (formats.keys, formats.values)
    }

    /// The bytes of the four weight matrices `wq (D, Q)`, `wk (E, KV)`, `wv (E, V)` and
    /// `wo (H·dv, D)` (and an output gate's `wg (D, G)`) in the layer's
    /// [`weight_formats`](Self::weight_formats): their elements times 4 for `f32`, 2 for bf16
    /// and f16, a block's bytes per block in a block format. Biases are not counted, nor what packing for
    /// the kernels adds (see [`packed_bytes`](Self::packed_bytes)), so it is the size of the
    /// tensors a checkpoint stores in those formats. A layer whose values come from its keys
    /// ([`LayerBuilder::values_from_keys`]) has no `wv`; a KV-shared one
    /// ([`Projections::queries_only`]) neither `wk` nor `wv`.
    ///
    /// ```
    /// use mha::{Layer, Projections, WeightFormat, Widths};
    /// // D = Q = 60, 6 query heads of 10 sharing 2 key/value heads (KV = 20).
    /// let widths = Widths::self_attention(60, 20, 60);
    /// let (square, narrow) = (vec![0.01; 60 * 60], vec![0.01; 60 * 20]);
    /// let projections = Projections::new(widths, &square, &narrow, &narrow, &square)?;
    /// let layer = Layer::builder(projections, 6).build()?;
    /// assert_eq!(layer.weight_bytes(), (60 * 60 + 2 * 60 * 20 + 60 * 60) * 4);
    /// let bf16 = Layer::builder(projections, 6).weight_format(WeightFormat::Bf16).build()?;
    /// assert_eq!(bf16.weight_bytes(), (60 * 60 + 2 * 60 * 20 + 60 * 60) * 2);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn weight_bytes(&self) -> usize {
        let widths = self.settings.widths;
        let Widths {
            d_model,
            memory,
            kv,
            query,
            value,
        } = widths;
        // No overflow: the layer holds every one of these elements, packed in these formats,
        // in memory (`packed_bytes`, at least this sum, was allocated).
        let (own_k, own_v) = match (self.settings.kv_shared, self.settings.values_from_keys) {
            (true, _) => (0, 0),
            (false, true) => (memory * kv, 0),
            (false, false) => (memory * kv, memory * value),
        };
        let [fq, fk, fv, fo, fg] = self.settings.weights.formats;
        fq.bytes(d_model * query)
            + fk.bytes(own_k)
            + fv.bytes(own_v)
            + fo.bytes(widths.merged() * d_model)
            + fg.bytes(d_model * self.settings.gate_width())
    }

    /// The bytes the layer holds for its weights: the projections as packed for its kernels
    /// (in whole panels of the kernel table's panel width, the last one zero-padded; the key
    /// and value projections packed a second time when self-attention's query width is not a
    /// multiple of that width) and the `f32` biases. At least
    /// [`weight_bytes`](Self::weight_bytes) plus the biases' bytes, and equal to that when
    /// every width is a multiple of 32 (which every kernel table's panel width divides).
    ///
    /// ```
    /// use mha::{Biases, Layer, Projections, Widths};
    /// let widths = Widths::self_attention(64, 64, 64);
    /// let w = vec![0.01; 64 * 64];
    /// let biases = Biases { bq: Some(vec![0.1; 64]), ..Biases::default() };
    /// let layer = Layer::builder(Projections::new(widths, &w, &w, &w, &w)?, 4).biases(biases).build()?;
    /// assert_eq!(layer.weight_bytes(), 4 * 64 * 64 * 4);
    /// assert_eq!(layer.packed_bytes(), layer.weight_bytes() + 64 * 4);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn packed_bytes(&self) -> usize {
        let weights = &self.settings.weights;
        let memory = weights.memory_projection.as_ref();
        let packed =
            weights.projection.bytes() + memory.map_or(0, |m| m.bytes()) + weights.output.bytes();
        let gate_bias = self.settings.gate.as_ref().and_then(|g| g.bias.as_deref());
        let biases = self
            .settings
            .biases
            .rows()
            .into_iter()
            .flatten()
            .chain(gate_bias);
        packed + biases.map(size_of_val).sum::<usize>()
    }
}

/// The calls.
impl Layer {
    /// Self-attention on `x (B, T, D)`, returning the output `(B, T, D)` in a new buffer (a
    /// forward pass with default options; see [`forward_into`](Self::forward_into)).
    ///
    /// # Errors
    /// As [`forward_into`](Self::forward_into); [`ShapeError::AllocationFailed`] when the
    /// output cannot be allocated.
    pub fn forward<'a>(&mut self, x: impl Into<Tokens<'a>>) -> Result<Vec<f32>, ShapeError> {
        let x = x.into();
        const WHAT: &str = "output (B, T, D)";
        let width = self.settings.widths.d_model;
        let mut y = try_filled(WHAT, run_time_len::<f32>(WHAT, &[x.rows(), width])?, 0.0)?;
        let out = match x.lengths() {
            Some(lengths) => Output::ragged(&mut y, lengths, width)?,
            None => Output::new(&mut y, x.batch(), x.len(), width)?,
        };
        self.forward_into(x, AttendOptions::default(), out)?;
        Ok(y)
    }

    /// Self-attention on `x (B, T, D)` with per-call options, writing `(B, T, D)` into `out`
    /// (and the attention weights, when `out` asks for them). Allocates nothing once the layer
    /// has run on a shape at least this large (that first call also starts the worker threads
    /// it needs, which allocates).
    ///
    /// # Errors
    /// [`ShapeError::DimensionMismatch`] when `x` or `out` is not `D` wide, `out` is not
    /// `x`'s shape, or the layer's keys come from memory of another width (`E ≠ D`); when an
    /// option does not match `B` and `T` (see [`AttendOptions`]); [`ShapeError::RopePosition`]
    /// for a rotary position past [`RopeAngles::max_position`]; [`ShapeError::Setting`] for an
    /// ALiBi bias that
    /// overflows over the call's positions; [`ShapeError::TooLarge`] when `B · T` overflows
    /// (possible only for zero-width tokens); [`ShapeError::Overflow`] or
    /// [`ShapeError::AllocationFailed`] when the call's buffers cannot be had.
    pub fn forward_into<'a>(
        &mut self,
        x: impl Into<Tokens<'a>>,
        options: AttendOptions<'_>,
        out: impl Into<Output<'a>>,
    ) -> Result<(), ShapeError> {
        self.check_own_keys("forward_into")?;
        let (x, out) = (x.into(), out.into());
        self.check_self_attention(x, &out)?;
        self.run(Call::new(x, options)?, None, out)
    }

    /// Cross-attention: queries from `x (B, T, D)`, keys and values from `memory (B, S, E)`,
    /// with the layer's masking (causal is aligned bottom-right) and the options.
    ///
    /// # Errors
    /// [`ShapeError::DimensionMismatch`] when `x`, `memory` or `out` are not `D`, `E` and `D`
    /// wide, or `memory` or `out` do not match `x`'s batch (and `out` its length); when an
    /// option does not match `B`, `T` and `S` (see [`AttendOptions`]);
    /// [`ShapeError::RopeCrossAttention`] for a layer with a rotary embedding; an ALiBi bias
    /// that overflows or buffers that cannot be had, as [`forward_into`](Self::forward_into).
    pub fn cross_into<'a>(
        &mut self,
        x: impl Into<Tokens<'a>>,
        memory: impl Into<Tokens<'a>>,
        options: AttendOptions<'_>,
        out: impl Into<Output<'a>>,
    ) -> Result<(), ShapeError> {
        self.check_own_keys("cross_into")?;
        if self.settings.rope.is_some() {
            return Err(ShapeError::RopeCrossAttention);
        }
        let (x, memory, out) = (x.into(), memory.into(), out.into());
        if [x.lengths(), memory.lengths(), out.lengths()]
            .iter()
            .any(Option::is_some)
        {
            return Err(ShapeError::Ragged {
                what: "with cross-attention",
            });
        }
        let widths = self.settings.widths;
        check_dimension("token width (D)", widths.d_model, x.width())?;
        check_dimension("memory width (E)", widths.memory, memory.width())?;
        check_dimension("output width (D)", widths.d_model, out.width())?;
        check_dimension("memory batch (B)", x.batch(), memory.batch())?;
        let call = Call::new(x, options)?.with_memory(memory);
        self.run(call, None, out)
    }

    /// An empty KV cache for this layer holding up to `capacity` tokens for each of `batch`
    /// sequences, its memory reserved now.
    ///
    /// With a sliding window the cache is *rolling*: `capacity` is the most tokens one call
    /// may add to a sequence, and the cache keeps only the key blocks a window can still
    /// reach, in memory bounded by `window + capacity` tokens, so a sequence decodes for as
    /// long as it likes in constant memory (see [`KvCache::capacity`]).
    ///
    /// ```
    /// use mha::{AttendOptions, Matrix, Mha, MhaParams, Tensor};
    /// let w = Matrix::<4, 4>::from_fn(|r, c| if r == c { 0.5 } else { 0.1 });
    /// let mut layer = Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)
    ///     .sliding_window(3)
    ///     .build()?;
    /// let x = Tensor::<1, 200, 4>::from_fn(|_, t, i| ((t * 4 + i) % 7) as f32 * 0.1);
    /// let full = layer.forward(&x)?;
    /// // One token per call, 200 tokens through a cache that never holds them all.
    /// let mut cache = layer.new_cache(1, 1)?;
    /// let mut out = Tensor::<1, 1, 4>::zeros();
    /// for t in 0..200 {
    ///     let token = Tensor::<1, 1, 4>::from_fn(|_, _, i| x[(0, t, i)]);
    ///     layer.decode_into(&token, &mut cache, AttendOptions::default(), &mut out)?;
    ///     assert_eq!(out.token(0, 0), full.token(0, t));
    /// }
    /// assert_eq!((cache.len(), cache.capacity()), (200, 1));
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when the cache's size does not fit in memory,
    /// [`ShapeError::AllocationFailed`] when it cannot be allocated (nothing aborts).
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache, ShapeError> {
        let settings = &self.settings;
        let rolling = settings.reach().map(|window| Rolling {
            window,
            chunk: capacity,
        });
        let shape = StoreShape {
            batch,
            n_kv_heads: settings.n_kv_heads,
            head_dim: settings.head_dim,
            capacity: match rolling {
                Some(rolling) => rolling.slots()?,
                None => capacity,
            },
            rolling,
            formats: settings.kv_formats,
            values: value_rows(settings),
        };
        Ok(KvCache {
            store: KvStore::new(shape)?,
        })
    }

    /// One step of incremental decoding: appends the keys and values of the new tokens
    /// `x (B, L, D)` to `cache` and attends over everything cached. New query `i` sees cached
    /// key `j` iff `j <= i + cached`, where `cached` counts the tokens before this call, so
    /// feeding a sequence in steps of any sizes gives the outputs of one causal forward over
    /// it, bit for bit (with a sliding window, of one forward with the window). The options are
    /// those of a forward over the `S = cached + L` keys (key lengths and padding per batch
    /// element, masks `(L, S)` or `(B, L, S)`), and `out` can ask for the weights
    /// `(B, H, L, S)` (through a rolling cache, only the last `window + L - 1` keys' columns:
    /// see [`AttentionWeights`](crate::AttentionWeights)).
    ///
    /// # Errors
    /// [`ShapeError::DecodeNeedsCausal`] for a bidirectional layer,
    /// [`ShapeError::CacheFull`] when the new tokens do not fit (the cache is unchanged),
    /// [`ShapeError::WindowChunk`] when they are more than a rolling cache takes in one call,
    /// [`ShapeError::CacheMismatch`] for a cache made by a layer of another shape or other
    /// key/value formats,
    /// [`ShapeError::DimensionMismatch`] when `x` or `out` is not `D` wide, the layer's keys
    /// come from memory of another width, or `x`, `cache` and `out` disagree on the batch or
    /// `out` on the length; when an option does not match `B`, `L` and `S`; a rotary position
    /// past [`RopeAngles::max_position`] (counting from the cached tokens), an ALiBi bias that overflows or buffers that cannot be had, as
    /// [`forward_into`](Self::forward_into).
    pub fn decode_into<'a>(
        &mut self,
        x: impl Into<Tokens<'a>>,
        cache: &mut KvCache,
        options: AttendOptions<'_>,
        out: impl Into<Output<'a>>,
    ) -> Result<(), ShapeError> {
        self.check_own_keys("decode_into")?;
        if self.settings.masking != Masking::Causal {
            return Err(ShapeError::DecodeNeedsCausal);
        }
        let (x, out) = (x.into(), out.into());
        self.check_self_attention(x, &out)?;
        self.run(Call::new(x, options)?, Some(&mut cache.store), out)
    }

    /// The widths of a self-attention call: keys and values from `x`, so `E = D`, and `x` and
    /// `out` `D` wide.
    fn check_self_attention(&self, x: Tokens<'_>, out: &Output<'_>) -> Result<(), ShapeError> {
        let widths = self.settings.widths;
        check_dimension(
            "memory width (E) for self-attention",
            widths.d_model,
            widths.memory,
        )?;
        check_dimension("token width (D)", widths.d_model, x.width())?;
        check_dimension("output width (D)", widths.d_model, out.width())
    }

    /// Runs `call` with its keys and values appended to `cache` or to a transient store.
    fn run(
        &mut self,
        call: Call<'_>,
        cache: Option<&mut dyn Store>,
        out: Output<'_>,
    ) -> Result<(), ShapeError> {
        self.with_pass(|pass| pass.run(call, cache, out))
    }

    /// Runs `f` on a call's view of the layer: its settings, scratch (a shared pool's held
    /// for the whole call) and workers.
    fn with_pass<R>(&mut self, f: impl FnOnce(&mut Pass<'_>) -> R) -> R {
        let (settings, pool) = (&self.settings, &mut self.pool);
        self.scratch.with(|workspace| {
            f(&mut Pass {
                settings,
                workspace: Buffers::new(workspace),
                pool,
            })
        })
    }
}

/// The layer's scratch.
impl Layer {
    /// The bytes of the scratch the layer's calls use that grow with a call's tokens
    /// (projected rows, merged heads, a forward pass's keys and values; see
    /// [`ThreadPool::scratch_bytes`](crate::ThreadPool::scratch_bytes)): the layer's own,
    /// or, for a layer built with a [`ThreadPool`](crate::ThreadPool), the pool's, shared with
    /// its other layers.
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.bytes()
    }

    /// Frees the scratch the layer's calls use (for a layer built with a
    /// [`ThreadPool`](crate::ThreadPool), the pool's, which its other layers share); the
    /// next call grows it again. Results are unchanged.
    ///
    /// ```
    /// use mha::{Layer, Projections, Tokens, Widths};
    /// let w = vec![0.1; 64];
    /// let projections = Projections::new(Widths::self_attention(8, 8, 8), &w, &w, &w, &w)?;
    /// let mut layer = Layer::builder(projections, 2).build()?;
    /// let x: Vec<f32> = (0..100 * 8).map(|i| (i % 13) as f32 * 0.1).collect();
    /// let y = layer.forward(Tokens::new(&x, 1, 100, 8)?)?;
    /// assert!(layer.scratch_bytes() >= 100 * 8 * 4); // at least the queries of 100 tokens
    /// layer.release_scratch();
    /// assert_eq!(layer.scratch_bytes(), 0);
    /// assert_eq!(layer.forward(Tokens::new(&x, 1, 100, 8)?)?, y);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn release_scratch(&mut self) {
        self.scratch.release();
    }
}
