//! The reusable attention layer [`Mha`], its builder, and the one-call [`mha_forward`].
//!
//! Every entry point checks its shapes and options, then runs the one path of `pass.rs`:
//! project, append keys and values to a store, attend, project the output.

use alloc::vec::Vec;

use crate::cache::KvCache;
use crate::error::{finite_non_negative, head_dim, ShapeError};
use crate::kernels::flash::score_scale;
use crate::kernels::gemm::Columns;
use crate::kernels::kv::{KvStore, Rolling, StoreShape};
use crate::kernels::parallel::{self, Pool};
use crate::kernels::plan::{MIN_WORK_PER_THREAD, ONE_SHOT_MIN_WORK_PER_THREAD};
#[cfg(feature = "std")]
use crate::kernels::{Executor, ThreadPool};
use crate::kernels::{Isa, Kernels, PackedB};
use crate::norm::QkNorm;
use crate::options::{AttendOptions, Masking};
use crate::params::{MhaBiases, MhaParams};
use crate::pass::{Call, Workspace};
use crate::rope::{Rope, RopeAngles};
use crate::scores::{Alibi, ScoreTerms};
use crate::tensor::Tensor;
use crate::tokens::{Output, Tokens};
#[cfg(feature = "std")]
use alloc::sync::Arc;

/// Causal multi-head self-attention, the five steps:
///
/// 1. `Q = x·Wq`, `K = x·Wk`, `V = x·Wv`, each `(B, T, D)`;
/// 2. split into heads, `(B, T, D) -> (B, T, H, d) -> (B, H, T, d)`;
/// 3. causal attention in every head: `softmax(Q Kᵀ / √d)` with key `j > i` masked, times `V`;
/// 4. merge heads, `(B, H, T, d) -> (B, T, D)`;
/// 5. `y = merged · Wo`.
///
/// This convenience packs the weights on every call and starts its threads for that call
/// alone, so it uses another thread only for a share of at least 16 Mi multiply-adds (a
/// small input runs on the calling thread); build an [`Mha`] layer once to reuse them (and
/// its scratch and threads) across calls, and for the other modes (masks, padding,
/// cross-attention, biases, grouped heads, a KV cache).
///
/// A call needs about `4·D² + 4·B·T·D` floats of fresh memory (packed weights, queries,
/// values, the key/value store) besides its output. Packing costs little next to the
/// forward; the first touch of fresh memory may not: on Linux, glibc's `malloc` returns large
/// blocks to the system when they are freed, so each call faults its pages in again (measured
/// on a KVM guest: 3 to 5 µs per 4 KiB page, about a fifth of a `1 × 1024 × 768` forward). A
/// loop of one-shot calls on such a system runs at a layer's speed when the allocator keeps
/// freed memory, e.g. with
/// `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295`.
///
/// ```
/// use mha::{mha_forward, Matrix, MhaParams, Tensor};
/// let x = Tensor::from([[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]]);
/// let id = Matrix::<4, 4>::identity();
/// let p = MhaParams::new(id.clone(), id.clone(), id.clone(), id);
/// let y = mha_forward(&x, &p, 2)?;
/// // The first token sees only itself.
/// assert_eq!(y.token(0, 0).unwrap(), &[0.0, 1.0, 2.0, 3.0]);
/// # Ok::<(), mha::ShapeError>(())
/// ```
///
/// # Errors
/// [`ShapeError::ZeroHeads`] when `n_heads == 0`, [`ShapeError::NotDivisible`] when `D` is not
/// a multiple of `n_heads`; [`ShapeError::Overflow`] or [`ShapeError::AllocationFailed`] when
/// the call's buffers cannot be had (as [`Mha::forward`]).
pub fn mha_forward<const B: usize, const T: usize, const D: usize>(
    x: &Tensor<B, T, D>,
    params: &MhaParams<D>,
    n_heads: usize,
) -> Result<Tensor<B, T, D>, ShapeError> {
    let layer = Mha::builder(params, n_heads).min_work_per_thread(ONE_SHOT_MIN_WORK_PER_THREAD);
    layer.build()?.forward(x)
}

/// Settings of an [`Mha`] layer beyond its weights; made by [`Mha::builder`].
#[derive(Debug)]
pub struct MhaBuilder<'p, const D: usize, const E: usize, const KV: usize, const Q: usize = D> {
    params: &'p MhaParams<D, E, KV, Q>,
    n_heads: usize,
    masking: Masking,
    window: Option<usize>,
    biases: MhaBiases<D, KV, Q>,
    scale: Option<f32>,
    qk_norm: Option<QkNorm>,
    threads: usize,
    /// Whose threads the layer's calls run on: its own workers unless set.
    pool: Pool,
    min_work_per_thread: usize,
    isa: Isa,
    rope: Option<Rope>,
    alibi: Option<Alibi>,
    softcap: Option<f32>,
    sinks: Option<Vec<f32>>,
}

impl<const D: usize, const E: usize, const KV: usize, const Q: usize> MhaBuilder<'_, D, E, KV, Q> {
    /// Causal (the default) or bidirectional attention.
    pub fn masking(mut self, masking: Masking) -> Self {
        self.masking = masking;
        self
    }

    /// Sliding-window attention (Mistral, Qwen2, Gemma's local layers): query `i` sees only the
    /// keys `j` with `i - window < j <= i`, its own and the `window - 1` before it, on top of
    /// causal order and the call's options (none by default). The attention skips the key
    /// blocks wholly before a window, and [`Mha::new_cache`] makes a rolling cache whose memory
    /// is bounded by the window, not by the sequence.
    ///
    /// ```
    /// use mha::{Matrix, Mha, MhaParams, ShapeError, Tensor};
    /// let w = Matrix::<4, 4>::identity();
    /// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
    /// let mut layer = Mha::builder(&params, 2).sliding_window(1).build()?;
    /// assert_eq!(layer.sliding_window(), Some(1));
    /// // A window of one key: each token sees only itself, so the output is its value.
    /// let x = Tensor::<1, 3, 4>::from_fn(|_, t, i| (t * 4 + i) as f32);
    /// assert_eq!(layer.forward(&x)?, x);
    /// assert_eq!(Mha::builder(&params, 2).sliding_window(0).build().err(), Some(ShapeError::ZeroWindow));
    /// # Ok::<(), ShapeError>(())
    /// ```
    pub fn sliding_window(mut self, window: usize) -> Self {
        self.window = Some(window);
        self
    }

    /// Projection biases (none by default).
    pub fn biases(mut self, biases: MhaBiases<D, KV, Q>) -> Self {
        self.biases = biases;
        self
    }

    /// The factor of the attention scores, `softmax(scale · q·k)`: by default `1/√head_dim`;
    /// Gemma's is `query_pre_attn_scalar^-0.5`, T5-style models use 1. It must be finite and
    /// not negative (checked by [`build`](MhaBuilder::build)); 0 gives every visible key the
    /// same weight.
    ///
    /// ```
    /// use mha::{Matrix, Mha, MhaParams, ShapeError};
    /// let w = Matrix::<4, 4>::identity();
    /// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
    /// assert_eq!(Mha::builder(&params, 2).build()?.scale(), 1.0 / 2f32.sqrt());
    /// assert_eq!(Mha::builder(&params, 2).scale(1.0).build()?.scale(), 1.0);
    /// let error = Mha::builder(&params, 2).scale(f32::NAN).build().unwrap_err();
    /// assert_eq!(error.to_string(), "softmax scale is NaN, but must be finite and >= 0");
    /// # Ok::<(), ShapeError>(())
    /// ```
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// RMSNorm of every query and key (per head or over the whole row) right after the
    /// projections and their biases, before the keys are cached (none by default); see
    /// [`QkNorm`]. Its weights and `eps` are checked by [`build`](MhaBuilder::build).
    pub fn qk_norm(mut self, norm: QkNorm) -> Self {
        self.qk_norm = Some(norm);
        self
    }

    /// The thread count (0, the default, means every CPU; at most 256): the calling thread and
    /// up to `threads - 1` worker threads that the layer starts when a call first needs them,
    /// keeps parked between calls, and joins when it is dropped. Results are bit-identical for
    /// every thread count.
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Runs the layer's calls on `pool`'s threads, shared with every other layer built with
    /// it, instead of workers of the layer's own; the thread count becomes the pool's
    /// ([`ThreadPool::threads`]). Results are bit-identical either way.
    #[cfg(feature = "std")]
    pub fn thread_pool(mut self, pool: &ThreadPool) -> Self {
        self.threads = pool.threads();
        self.pool = Pool::shared(pool);
        self
    }

    /// Runs the layer's calls on the program's own threads through `executor`, which is
    /// offered up to [`threads`](MhaBuilder::threads) `- 1` calls beside the caller's share
    /// (see [`Executor`]). Results are bit-identical to the layer's own threads.
    #[cfg(feature = "std")]
    pub fn executor(mut self, executor: Arc<dyn Executor>) -> Self {
        self.pool = Pool::external(executor);
        self
    }

    /// How many multiply-adds each thread of a phase (a projection, the attention, the output
    /// projection) must get before the phase uses another thread; default 1 Mi (about 0.1 ms
    /// of a core's work, well above what handing a phase to a worker thread costs). 0 always
    /// uses every thread. Results are bit-identical either way.
    pub fn min_work_per_thread(mut self, multiply_adds: usize) -> Self {
        self.min_work_per_thread = multiply_adds;
        self
    }

    /// The instruction set of the kernels (default: [`Isa::detect`]).
    pub fn isa(mut self, isa: Isa) -> Self {
        self.isa = isa;
        self
    }

    /// A rotary position embedding (none by default), applied to the queries and keys of
    /// self-attention after their projection and biases, before the keys are cached (the cache
    /// holds rotated keys). No table is built: each row's angles are computed as it is
    /// rotated ([`RopeAngles`]), so memory does not grow with the positions reached, and every
    /// position up to [`RopeAngles::max_position`] (at least `2^31 - 1`) works; beyond it a
    /// call is an error. Token `t` of a call is at `cached + t` unless
    /// [`AttendOptions::positions`] says otherwise, so decoding continues where the cache ends
    /// (a rolling cache's count of tokens ever appended, so it decodes for ever). [`Mha::cross_into`] is an error on such a layer.
    ///
    /// ```
    /// use mha::{AttendOptions, Matrix, Mha, MhaParams, Rope, RopeLayout, RopeScaling, Tensor};
    /// let w = Matrix::<8, 8>::from_fn(|r, c| ((r * 8 + c) % 5) as f32 * 0.1);
    /// let rope = Rope { theta: 10_000.0, rotary_dim: 4, layout: RopeLayout::RotateHalf, scaling: RopeScaling::Default };
    /// let mut layer = Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)
    ///     .rope(rope)
    ///     .build()?;
    /// let x = Tensor::<1, 3, 8>::from_fn(|_, t, i| (t + i) as f32 * 0.01);
    /// let full = layer.forward(&x)?;
    /// // Decoding continues from the cache length: token 2 is at position 2.
    /// let mut cache = layer.new_cache(1, 3)?;
    /// let mut out = Tensor::<1, 1, 8>::zeros();
    /// for t in 0..3 {
    ///     let token = Tensor::<1, 1, 8>::from_fn(|_, _, i| x[(0, t, i)]);
    ///     layer.decode_into(&token, &mut cache, AttendOptions::default(), &mut out)?;
    ///     assert_eq!(out.token(0, 0), full.token(0, t));
    /// }
    /// // Explicit positions: the same tokens placed far out, and beyond the last one.
    /// let mut y = Tensor::<1, 3, 8>::zeros();
    /// let last = layer.rope().unwrap().max_position();
    /// let options = AttendOptions { positions: Some(&[last - 2, last - 1, last]), ..AttendOptions::default() };
    /// layer.forward_into(&x, options, &mut y)?;
    /// let beyond = AttendOptions { positions: Some(&[last - 1, last, last + 1]), ..AttendOptions::default() };
    /// assert!(layer.forward_into(&x, beyond, &mut y).is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn rope(mut self, rope: Rope) -> Self {
        self.rope = Some(rope);
        self
    }

    /// ALiBi (BLOOM, MPT; none by default): head `h` adds `-slope_h · (i - j)` to the scaled
    /// (and soft-capped) score of query position `i` and key position `j`, before the mask.
    /// Positions count as causal order does (a query's is its sequence's cached tokens plus its
    /// index in the call), so decoding gives the forward's bits. Checked by
    /// [`build`](Self::build): given slopes must be `n_heads` finite values, and with a
    /// sliding window each bias must be finite at the window's reach; a layer without one
    /// checks each call's reach (see [`Alibi`]).
    ///
    /// ```
    /// use mha::{Alibi, Matrix, Mha, MhaParams, ShapeError};
    /// let w = Matrix::<6, 6>::identity();
    /// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
    /// let layer = Mha::builder(&params, 3).alibi(Alibi::Standard).build()?;
    /// assert_eq!(layer.alibi_slopes(), Some(&[0.0625, 0.00390625, 0.25][..]));
    /// let wrong = Mha::builder(&params, 3).alibi(Alibi::Slopes(vec![0.5; 2])).build();
    /// assert!(matches!(wrong, Err(ShapeError::LengthMismatch { expected: 3, actual: 2, .. })));
    /// # Ok::<(), ShapeError>(())
    /// ```
    pub fn alibi(mut self, alibi: Alibi) -> Self {
        self.alibi = Some(alibi);
        self
    }

    /// Logit soft-capping (Gemma 2; none by default): every scaled score `s` becomes
    /// `cap · tanh(s / cap)` (the crate's own [`tanh`](crate::kernels::tanh::tanh)) before
    /// ALiBi and the mask. Checked by [`build`](Self::build): `cap` must be finite and
    /// positive.
    ///
    /// ```
    /// use mha::{Matrix, Mha, MhaParams, ShapeError};
    /// let w = Matrix::<4, 4>::identity();
    /// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
    /// let layer = Mha::builder(&params, 2).softcap(50.0).build()?;
    /// assert_eq!(layer.softcap(), Some(50.0));
    /// assert!(matches!(Mha::builder(&params, 2).softcap(0.0).build(), Err(ShapeError::Setting { .. })));
    /// # Ok::<(), ShapeError>(())
    /// ```
    pub fn softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// Attention sinks (gpt-oss; none by default): head `h`'s learned logit `sinks[h]` joins
    /// the denominator of each of its rows' softmax, so it takes probability mass and adds no
    /// value (the weights of a row's keys sum to less than 1). `-inf` is no sink for that
    /// head. Checked by [`build`](Self::build): `n_heads` values, each finite or `-inf`.
    ///
    /// ```
    /// use mha::{AttendOptions, AttentionWeights, Matrix, Mha, MhaParams, Output, Tensor};
    /// let w = Matrix::<4, 4>::identity();
    /// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
    /// let mut layer = Mha::builder(&params, 2).sinks(vec![0.0, f32::NEG_INFINITY]).build()?;
    /// let x = Tensor::<1, 1, 4>::zeros();
    /// let (mut y, mut weights) = (Tensor::<1, 1, 4>::zeros(), AttentionWeights::new());
    /// layer.forward_into(&x, AttendOptions::default(), Output::from(&mut y).with_weights(&mut weights))?;
    /// // One key of score 0 beside a sink of logit 0 gets half; head 1 has no sink.
    /// assert_eq!(weights.get(0, 0, 0, 0), Some(0.5));
    /// assert_eq!(weights.get(0, 1, 0, 0), Some(1.0));
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn sinks(mut self, sinks: Vec<f32>) -> Self {
        self.sinks = Some(sinks);
        self
    }

    /// Checks the head counts and packs the weights.
    ///
    /// # Errors
    /// [`ShapeError::ZeroHeads`] or [`ShapeError::NotDivisible`] for a bad `n_heads`
    /// ([`ShapeError::QueryNotDivisible`] when `Q ≠ D`),
    /// [`ShapeError::KvHeads`] when `KV` is not a whole number of heads dividing `n_heads`,
    /// [`ShapeError::Setting`] for a scale or QK-norm `eps` that is not finite or negative,
    /// a non-finite ALiBi slope (or one whose bias overflows in the window: [`Alibi`]), a soft
    /// cap that is not finite and positive, a sink that is NaN or `+inf`; [`ShapeError::LengthMismatch`] for QK-norm weights, ALiBi slopes or sinks of
    /// the wrong length, [`ShapeError::UnsupportedIsa`] when the CPU cannot run the chosen
    /// instruction set, [`ShapeError::ZeroWindow`] for a sliding window of 0,
    /// [`ShapeError::WindowNeedsCausal`] for a window on a bidirectional layer;
    /// for a rotary embedding, what [`RopeAngles::new`] rejects.
    pub fn build(self) -> Result<Mha<D, E, KV, Q>, ShapeError> {
        let head_dim = query_head_dim(D, Q, self.n_heads)?;
        let n_kv_heads = kv_heads(KV, head_dim, self.n_heads)?;
        self.check_window()?;
        let scale = match self.scale {
            Some(scale) => finite_non_negative("softmax scale", scale)?,
            None => score_scale(head_dim),
        };
        if let Some(norm) = &self.qk_norm {
            norm.check(head_dim, self.n_heads, n_kv_heads)?;
        }
        let kernels = self.isa.kernels()?;
        let rope = self
            .rope
            .map(|rope| RopeAngles::new(rope, head_dim))
            .transpose()?;
        let score_terms = ScoreTerms::new(self.alibi, self.softcap, self.sinks, self.n_heads)?;
        score_terms.check_window_reach(self.window)?;
        Ok(Mha {
            n_heads: self.n_heads,
            n_kv_heads,
            masking: self.masking,
            scale,
            qk_norm: self.qk_norm,
            window: self.window,
            threads: parallel::thread_count(self.threads),
            min_work_per_thread: self.min_work_per_thread,
            weights: PackedWeights::new(kernels, self.params),
            biases: self.biases,
            rope,
            score_terms,
            workspace: Workspace::default(),
            pool: self.pool,
        })
    }

    /// A window must be at least 1 and needs causal order.
    fn check_window(&self) -> Result<(), ShapeError> {
        match self.window {
            Some(0) => Err(ShapeError::ZeroWindow),
            Some(window) if self.masking != Masking::Causal => {
                Err(ShapeError::WindowNeedsCausal { window })
            }
            _ => Ok(()),
        }
    }
}

/// The width of the heads of `q_width`-wide queries in a layer of model width `d_model`: the
/// error names `Q` when it differs from `D`.
fn query_head_dim(d_model: usize, q_width: usize, n_heads: usize) -> Result<usize, ShapeError> {
    head_dim(q_width, n_heads).map_err(|error| match error {
        ShapeError::NotDivisible { .. } if q_width != d_model => {
            ShapeError::QueryNotDivisible { q_width, n_heads }
        }
        error => error,
    })
}

/// The key/value head count of `KV`-wide keys and values with heads of `head_dim`: a divisor
/// of `n_heads` (for zero-width heads, `n_heads`).
fn kv_heads(kv_width: usize, head_dim: usize, n_heads: usize) -> Result<usize, ShapeError> {
    let n_kv_heads = kv_width.checked_div(head_dim).unwrap_or(n_heads);
    if kv_width != n_kv_heads * head_dim || n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return Err(ShapeError::KvHeads {
            kv_width,
            head_dim,
            n_heads,
        });
    }
    Ok(n_kv_heads)
}

/// The weights packed for the kernels.
#[derive(Debug)]
pub(crate) struct PackedWeights {
    /// `[Wq | Wk | Wv]` (`(D, Q + 2·KV)`) when `E = D`, else `Wq`.
    pub projection: PackedB,
    /// `[Wk | Wv]`, when it is not a window of `projection` (a window must start on a panel
    /// boundary).
    pub memory_projection: Option<PackedB>,
    /// `Wo`, `(Q, D)`.
    pub output: PackedB,
}

impl PackedWeights {
    /// Packs the weights of `p` from their row-major matrices.
    fn new<const D: usize, const E: usize, const KV: usize, const Q: usize>(
        kernels: &'static Kernels,
        p: &MhaParams<D, E, KV, Q>,
    ) -> Self {
        let columns = |values, width| Columns { values, width };
        let wq = columns(p.wq.as_slice(), Q);
        let wk = columns(p.wk.as_slice(), KV);
        let wv = columns(p.wv.as_slice(), KV);
        let projection = if E == D {
            PackedB::pack(kernels, D, &[wq, wk, wv])
        } else {
            PackedB::pack(kernels, D, &[wq])
        };
        let memory_projection =
            (E != D || !Q.is_multiple_of(kernels.nr)).then(|| PackedB::pack(kernels, E, &[wk, wv]));
        let output = PackedB::pack(kernels, Q, &[columns(p.wo.as_slice(), D)]);
        PackedWeights {
            projection,
            memory_projection,
            output,
        }
    }

    /// The packed `[Wk | Wv]` and the column it starts at (after the `q_width` columns of
    /// `Wq`).
    pub(crate) fn key_value(&self, q_width: usize) -> (&PackedB, usize) {
        match &self.memory_projection {
            Some(packed) => (packed, 0),
            None => (&self.projection, q_width),
        }
    }
}

/// A reusable multi-head attention layer: the weights packed once for the chosen instruction
/// set, the settings, and scratch and worker threads kept between calls, so that a loop of
/// calls allocates nothing once the first call has sized the scratch and started the threads.
///
/// `Mha<D>` is self-attention with `D`-wide weights; `E`, `KV` and `Q` are as in
/// [`MhaParams`]. Inputs and outputs are `D` wide whatever the query width.
///
/// | call | keys and values from | writes into | fails on |
/// |---|---|---|---|
/// | [`forward`](Mha::forward) | `x` | a new `Tensor<B, T, D>` | a rotary table too short, memory |
/// | [`forward_into`](Mha::forward_into) | `x` | a caller's [`Output`] | options, shapes |
/// | [`cross_into`](Mha::cross_into) | `memory (B, S, E)` | a caller's [`Output`] | options, shapes |
/// | [`decode_into`](Mha::decode_into) | `x`, appended to a [`KvCache`] | a caller's [`Output`] | options, shapes, a full cache |
///
/// Inputs are [`Tokens`] (a `&Tensor` converts into them); outputs an [`Output`] (a
/// `&mut Tensor` converts), which can also take the attention weights. All three `_into`
/// calls run the same steps with the same kernels, so equal inputs give equal bits whether
/// their shapes are compile-time tensors or run-time token views.
///
/// **Threads.** A call uses the calling thread and, when its work is large enough, the layer's
/// worker threads (up to [`threads`](MhaBuilder::threads)` - 1`). They start when a call first
/// needs them, spin briefly between the phases of a call, park when the call returns (so
/// they burn nothing while the caller does other work), and are joined when the layer is
/// dropped; no thread outlives the layer and none is shared with another layer. A call returns only after every
/// worker has finished with it, also when it panics. The layer is `Send` (it can move to
/// another thread, its workers follow it) and `Sync` (every call takes `&mut self`, so a
/// shared reference only reads settings). It is not `Clone`: a copy would need scratch and
/// workers of its own, so build another layer from the same [`MhaParams`].
///
/// ```
/// use mha::{AttendOptions, Matrix, Mha, MhaParams, Tensor};
/// let w = Matrix::<8, 8>::from_fn(|r, c| ((r * 8 + c) % 5) as f32 * 0.1);
/// let mut layer = Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)
///     .threads(1)
///     .build()?;
/// let x = Tensor::<1, 3, 8>::from_fn(|_, t, i| (t + i) as f32 * 0.01);
/// let mut y = Tensor::zeros();
/// layer.forward_into(&x, AttendOptions::default(), &mut y)?;
/// assert_eq!(y, layer.forward(&x)?);
/// # Ok::<(), mha::ShapeError>(())
/// ```
#[derive(Debug)]
pub struct Mha<const D: usize, const E: usize = D, const KV: usize = D, const Q: usize = D> {
    pub(crate) n_heads: usize,
    pub(crate) n_kv_heads: usize,
    pub(crate) masking: Masking,
    /// The factor of the scores.
    pub(crate) scale: f32,
    /// RMSNorm of the projected queries and keys, checked against the head counts.
    pub(crate) qk_norm: Option<QkNorm>,
    pub(crate) window: Option<usize>,
    pub(crate) threads: usize,
    pub(crate) min_work_per_thread: usize,
    pub(crate) weights: PackedWeights,
    pub(crate) biases: MhaBiases<D, KV, Q>,
    /// The rotary embedding's table, when the layer has one.
    pub(crate) rope: Option<RopeAngles>,
    /// Soft cap, ALiBi slopes and sinks.
    pub(crate) score_terms: ScoreTerms,
    pub(crate) workspace: Workspace,
    /// The threads of calls on more than one thread: by default the layer's own workers,
    /// started when a call first needs them, parked between calls, joined when the layer is
    /// dropped; else a shared [`ThreadPool`]'s or an [`Executor`]'s.
    pub(crate) pool: Pool,
}

impl<const D: usize> Mha<D> {
    /// A causal self-attention layer: packs `params` for [`Isa::detect`] and uses every CPU.
    /// [`Mha::builder`] reaches the other settings.
    ///
    /// # Errors
    /// [`ShapeError::ZeroHeads`] or [`ShapeError::NotDivisible`] for a bad `n_heads`.
    pub fn new(params: &MhaParams<D>, n_heads: usize) -> Result<Self, ShapeError> {
        Mha::builder(params, n_heads).build()
    }
}

impl<const D: usize, const E: usize, const KV: usize, const Q: usize> Mha<D, E, KV, Q> {
    /// Starts building a layer with `n_heads` query heads of width `head_dim = Q / n_heads`;
    /// the key/value head count is `KV / head_dim`.
    ///
    /// ```
    /// use mha::{Masking, Matrix, Mha, MhaParams, Tensor};
    /// // Grouped-query attention: 4 query heads of width 2 share 2 key/value heads (KV = 4).
    /// let params = MhaParams::from_parts(Matrix::<8, 8>::identity(), Matrix::<8, 4>::zeros(), Matrix::<8, 4>::zeros(), Matrix::identity());
    /// let layer = Mha::builder(&params, 4).masking(Masking::Bidirectional).threads(1).build()?;
    /// assert_eq!(layer.n_kv_heads(), 2);
    ///
    /// // Qwen3-style heads wider than D / H: model width 4, 3 query heads of 2 (Q = 6) and
    /// // 1 key/value head (KV = 2).
    /// let params = MhaParams::from_parts(Matrix::<4, 6>::zeros(), Matrix::<4, 2>::zeros(), Matrix::<4, 2>::zeros(), Matrix::<6, 4>::zeros());
    /// let mut layer = Mha::builder(&params, 3).build()?;
    /// assert_eq!((layer.head_dim(), layer.n_kv_heads()), (2, 1));
    /// let y = layer.forward(&Tensor::<1, 2, 4>::zeros())?;
    /// assert_eq!(y, Tensor::zeros());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn builder(params: &MhaParams<D, E, KV, Q>, n_heads: usize) -> MhaBuilder<'_, D, E, KV, Q> {
        MhaBuilder {
            params,
            n_heads,
            masking: Masking::Causal,
            window: None,
            biases: MhaBiases::default(),
            scale: None,
            qk_norm: None,
            threads: 0,
            pool: Pool::default(),
            min_work_per_thread: MIN_WORK_PER_THREAD,
            isa: Isa::detect(),
            rope: None,
            alibi: None,
            softcap: None,
            sinks: None,
        }
    }

    /// The number of query heads `H`.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// The number of key/value heads (`H` for plain multi-head attention).
    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    /// The width of one head, `Q / H` (`D / H` unless the layer's query width differs).
    pub fn head_dim(&self) -> usize {
        Q / self.n_heads
    }

    /// The thread count.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The masking mode.
    pub fn masking(&self) -> Masking {
        self.masking
    }

    /// The factor of the attention scores (see [`MhaBuilder::scale`]).
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The QK-norm, if the layer has one.
    pub fn qk_norm(&self) -> Option<&QkNorm> {
        self.qk_norm.as_ref()
    }

    /// The sliding window ([`MhaBuilder::sliding_window`]), if any.
    pub fn sliding_window(&self) -> Option<usize> {
        self.window
    }

    /// The projection biases.
    pub fn biases(&self) -> &MhaBiases<D, KV, Q> {
        &self.biases
    }

    /// The rotary embedding's table, when the layer has one.
    pub fn rope(&self) -> Option<&RopeAngles> {
        self.rope.as_ref()
    }

    /// The ALiBi slopes, one per query head ([`MhaBuilder::alibi`]).
    pub fn alibi_slopes(&self) -> Option<&[f32]> {
        self.score_terms.slopes.as_deref()
    }

    /// The logit soft cap ([`MhaBuilder::softcap`]).
    pub fn softcap(&self) -> Option<f32> {
        self.score_terms.cap
    }

    /// The attention sinks' logits, one per query head ([`MhaBuilder::sinks`]).
    pub fn sinks(&self) -> Option<&[f32]> {
        self.score_terms.sinks.as_deref()
    }

    /// The instruction set of the kernels.
    pub fn isa(&self) -> Isa {
        self.weights.output.isa()
    }

    pub(crate) fn kernels(&self) -> &'static Kernels {
        self.weights.output.kernels()
    }

    /// Cross-attention: queries from `x (B, T, D)`, keys and values from `memory (B, S, E)`,
    /// with the layer's masking (causal is aligned bottom-right) and the options.
    ///
    /// ```
    /// use mha::{AttendOptions, Masking, Matrix, Mha, MhaParams, Tensor};
    /// let params = MhaParams::from_parts(Matrix::<4, 4>::identity(), Matrix::<6, 4>::identity(), Matrix::<6, 4>::identity(), Matrix::identity());
    /// let mut layer = Mha::builder(&params, 2).masking(Masking::Bidirectional).build()?;
    /// let x = Tensor::<1, 2, 4>::zeros();
    /// let memory = Tensor::<1, 5, 6>::from_fn(|_, s, i| (s + i) as f32);
    /// let mut out = Tensor::<1, 2, 4>::zeros();
    /// layer.cross_into(&x, &memory, AttendOptions::default(), &mut out)?;
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::DimensionMismatch`] when `memory` or `out` do not match `x`'s batch (and
    /// `out` its length); when an option does not match `B`, `T` and `S` (see
    /// [`AttendOptions`]); [`ShapeError::RopeCrossAttention`] for a layer with a rotary
    /// embedding; an ALiBi bias that overflows or buffers that cannot be had, as
    /// [`Mha::forward`].
    pub fn cross_into<'a>(
        &mut self,
        x: impl Into<Tokens<'a, D>>,
        memory: impl Into<Tokens<'a, E>>,
        options: AttendOptions<'_>,
        out: impl Into<Output<'a, D>>,
    ) -> Result<(), ShapeError> {
        if self.rope.is_some() {
            return Err(ShapeError::RopeCrossAttention);
        }
        let (x, memory) = (x.into(), memory.into());
        check_dimension("memory batch (B)", x.batch(), memory.batch())?;
        let call = Call::new(x, options).with_memory(memory);
        self.run(call, None, out.into())
    }
}

impl<const D: usize, const KV: usize, const Q: usize> Mha<D, D, KV, Q> {
    /// Runs the layer on `x` and returns the output `(B, T, D)`: [`Mha::forward_into`] with
    /// the default options, into a new tensor.
    ///
    /// ```
    /// use mha::{Alibi, Matrix, Mha, MhaParams, ShapeError, Tensor};
    /// let w = Matrix::<4, 4>::identity();
    /// let mut layer = Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)
    ///     .alibi(Alibi::Slopes(vec![1e38, 0.5]))
    ///     .build()?;
    /// assert!(layer.forward(&Tensor::<1, 3, 4>::zeros()).is_ok());
    /// // A slope of 1e38 overflows f32 at a distance of 4 positions: an error, not infinities.
    /// assert!(matches!(
    ///     layer.forward(&Tensor::<1, 5, 4>::zeros()),
    ///     Err(ShapeError::Setting { .. })
    /// ));
    /// # Ok::<(), ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::Setting`] when an ALiBi slope's bias overflows `f32` over the `T`
    /// positions (see [`MhaBuilder::alibi`]); [`ShapeError::Overflow`] or
    /// [`ShapeError::AllocationFailed`] when the call's buffers cannot be had (e.g. a length
    /// per sequence for `B = 2^62` sequences of zero-width tokens). The shapes themselves are
    /// checked by the types.
    pub fn forward<const B: usize, const T: usize>(
        &mut self,
        x: &Tensor<B, T, D>,
    ) -> Result<Tensor<B, T, D>, ShapeError> {
        let mut out = Tensor::zeros();
        self.forward_into(x, AttendOptions::default(), &mut out)?;
        Ok(out)
    }

    /// Self-attention on `x (B, T, D)` with per-call options, writing `(B, T, D)` into `out`
    /// (and the attention weights, when `out` asks for them). Allocates nothing once the layer
    /// has run on a shape at least this large (that first call also starts the worker threads
    /// it needs, which allocates).
    ///
    /// ```
    /// use mha::{AttendOptions, AttentionWeights, Masking, Matrix, Mha, MhaParams, Output, Tensor, Tokens};
    /// let w = Matrix::<4, 4>::identity();
    /// let mut layer = Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)
    ///     .masking(Masking::Bidirectional)
    ///     .build()?;
    /// let x = Tensor::<2, 3, 4>::from_fn(|b, t, i| (b + t + i) as f32 * 0.1);
    /// let mut weights = AttentionWeights::new();
    /// let mut out = Tensor::<2, 3, 4>::zeros();
    /// // Batch element 0 has 2 real tokens, element 1 has 3.
    /// let options = AttendOptions { key_lengths: Some(&[2, 3]), ..AttendOptions::default() };
    /// layer.forward_into(&x, options, Output::from(&mut out).with_weights(&mut weights))?;
    /// assert_eq!(weights.get(0, 0, 0, 2), Some(0.0)); // padding gets no weight
    ///
    /// // The same call on buffers whose length is known at run time gives the same bits.
    /// let mut flat = vec![0.0; 2 * 3 * 4];
    /// let tokens = Tokens::new(x.as_slice(), 2, 3)?;
    /// layer.forward_into(tokens, options, Output::new(&mut flat, 2, 3)?)?;
    /// assert_eq!(flat, out.as_slice());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::DimensionMismatch`] when `out` is not `x`'s shape; when an option does not
    /// match `B` and `T` (see [`AttendOptions`]); [`ShapeError::TooLarge`] when `B · T`
    /// overflows (possible only for zero-width tokens); a rotary position past the table, an
    /// ALiBi bias that overflows or buffers that cannot be had, as [`Mha::forward`].
    pub fn forward_into<'a>(
        &mut self,
        x: impl Into<Tokens<'a, D>>,
        options: AttendOptions<'_>,
        out: impl Into<Output<'a, D>>,
    ) -> Result<(), ShapeError> {
        let call = Call::new(x.into(), options);
        self.run(call, None, out.into())
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
        let rolling = self.window.map(|window| Rolling {
            window,
            chunk: capacity,
        });
        let shape = StoreShape {
            batch,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim(),
            capacity: match rolling {
                Some(rolling) => rolling.slots()?,
                None => capacity,
            },
            rolling,
        };
        Ok(KvCache {
            store: KvStore::new(self.kernels(), shape)?,
        })
    }

    /// One step of incremental decoding: appends the keys and values of the new tokens
    /// `x (B, L, D)` to `cache` and attends over everything cached. New query `i` sees cached
    /// key `j` iff `j <= i + cached`, where `cached` counts the tokens before this call, so
    /// feeding a sequence in steps of any sizes gives the outputs of one causal forward over it,
    /// bit for bit (with a sliding window, of one forward with the window). The options are those of a forward over the `S = cached + L` keys (key
    /// lengths and padding per batch element, masks `(L, S)` or `(B, L, S)`), and `out` can ask
    /// for the weights `(B, H, L, S)` (through a rolling cache, only the last
    /// `window + L - 1` keys' columns: see [`AttentionWeights`](crate::AttentionWeights)).
    ///
    /// ```
    /// use mha::{AttendOptions, Matrix, Mha, MhaParams, Tensor};
    /// let w = Matrix::<4, 4>::from_fn(|r, c| if r == c { 0.5 } else { 0.1 });
    /// let mut layer = Mha::new(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)?;
    /// let x = Tensor::<1, 3, 4>::from_fn(|_, t, i| (t * 4 + i) as f32 * 0.1);
    /// let full = layer.forward(&x)?;
    /// let mut cache = layer.new_cache(1, 8)?;
    /// let mut out = Tensor::<1, 1, 4>::zeros();
    /// for t in 0..3 {
    ///     let token = Tensor::<1, 1, 4>::from_fn(|_, _, i| x[(0, t, i)]);
    ///     layer.decode_into(&token, &mut cache, AttendOptions::default(), &mut out)?;
    ///     assert_eq!(out.token(0, 0), full.token(0, t));
    /// }
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::DecodeNeedsCausal`] for a bidirectional layer,
    /// [`ShapeError::CacheFull`] when the new tokens do not fit (the cache is unchanged),
    /// [`ShapeError::WindowChunk`] when they are more than a rolling cache takes in one call,
    /// [`ShapeError::CacheMismatch`] for a cache made by a layer of another shape,
    /// [`ShapeError::DimensionMismatch`] when `x`, `cache` and `out` disagree on the batch or
    /// `out` on the length; when an option does not match `B`, `L` and `S`; a rotary position
    /// past the table, an ALiBi bias that overflows or buffers that cannot be had, as
    /// [`Mha::forward`].
    pub fn decode_into<'a>(
        &mut self,
        x: impl Into<Tokens<'a, D>>,
        cache: &mut KvCache,
        options: AttendOptions<'_>,
        out: impl Into<Output<'a, D>>,
    ) -> Result<(), ShapeError> {
        if self.masking != Masking::Causal {
            return Err(ShapeError::DecodeNeedsCausal);
        }
        let call = Call::new(x.into(), options);
        self.run(call, Some(&mut cache.store), out.into())
    }
}

/// `Err(DimensionMismatch)` unless `actual == expected`.
pub(crate) fn check_dimension(
    what: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), ShapeError> {
    if actual == expected {
        Ok(())
    } else {
        Err(ShapeError::DimensionMismatch {
            what,
            expected,
            actual,
        })
    }
}
