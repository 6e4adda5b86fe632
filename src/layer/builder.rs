//! [`LayerBuilder`], the settings of a layer beyond its weights, and the checked, immutable
//! [`Settings`] it builds: everything a call reads but its scratch and threads.

use alloc::vec::Vec;
use core::marker::PhantomData;

use super::projections::{Biases, PackedWeights, Projections, WeightFormats, Widths};
use super::Layer;
use crate::error::{finite_non_negative, head_dim, ShapeError};
use crate::kernels::attention::flash::score_scale;
use crate::kernels::attention::terms::ScoreTerms;
use crate::kernels::store::layout::KvFormats;
use crate::kernels::threads::parallel::Pool;
use crate::kernels::threads::plan::{thread_count, MIN_WORK_PER_THREAD};
use crate::kernels::workspace::Scratch;
use crate::kernels::{Compute, Isa, KvFormat, WeightFormat};
#[cfg(feature = "std")]
use crate::kernels::{Executor, ThreadPool};
use crate::layer::gate::OutputGate;
use crate::layer::norm::{QkNorm, QkNormPlacement};
use crate::layer::options::Masking;
use crate::layer::query_scale::QueryScale;
use crate::layer::rope::{Rope, RopeAngles};
use crate::layer::scores::{Alibi, AlibiPositions};
#[cfg(feature = "std")]
use alloc::sync::Arc;

/// Settings of a [`Layer`](crate::Layer) beyond its weights; made by
/// [`Layer::builder`](crate::Layer::builder), which takes the weights and the query head
/// count, turned into a layer by [`build`](LayerBuilder::build). Every setting is checked
/// there, against the widths of the weights.
///
/// ```
/// use mha::{Layer, Masking, Projections, Widths};
/// // An encoder layer of width 6 with 3 query heads of 2 and one key/value head.
/// let widths = Widths::self_attention(6, 2, 6);
/// let (wq, wk, wo) = (vec![0.1; 36], vec![0.2; 12], vec![0.3; 36]);
/// let projections = Projections::new(widths, &wq, &wk, &wk, &wo)?;
/// let layer = Layer::builder(projections, 3).masking(Masking::Bidirectional).threads(1).build()?;
/// assert_eq!((layer.head_dim(), layer.n_kv_heads(), layer.widths()), (2, 1, widths));
/// # Ok::<(), mha::ShapeError>(())
/// ```
///
/// The typed [`Mha::builder`](crate::Mha::builder) makes the same builder, typed by what it
/// builds (`L`, see [`BuiltLayer`]): its settings are these, its biases are typed, and
/// [`build`](Self::build) gives an [`Mha`](crate::Mha).
#[derive(Debug)]
pub struct LayerBuilder<'p, L: BuiltLayer = Layer> {
    projections: Projections<'p>,
    n_heads: usize,
    masking: Masking,
    window: Option<usize>,
    biases: Biases,
    scale: Option<f32>,
    qk_norm: Option<QkNorm>,
    qk_norm_placement: QkNormPlacement,
    value_norm: Option<f32>,
    values_from_keys: bool,
    query_scale: Option<QueryScale>,
    chunk: Option<usize>,
    gate: Option<OutputGate>,
    threads: usize,
    /// Whose threads the layer's calls run on: its own workers unless set.
    pool: Pool,
    /// Whose scratch the layer's calls use: its own unless it shares a pool's.
    scratch: Scratch,
    min_work_per_thread: usize,
    isa: Isa,
    rope: Option<Rope>,
    alibi: Option<Alibi>,
    alibi_positions: AlibiPositions,
    softcap: Option<f32>,
    sinks: Option<Vec<f32>>,
    kv_formats: KvFormats,
    weight_formats: WeightFormats,
    compute: Compute,
    attention_compute: Compute,
    built: PhantomData<fn() -> L>,
}

/// What a [`LayerBuilder`] builds from the checked run-time [`Layer`]: the layer itself, or a
/// typed [`Mha`](crate::Mha) (whose widths are those of its type by construction). Sealed: it
/// is implemented by these two only.
pub trait BuiltLayer: sealed::Sealed + Sized {
    /// The projection biases the builder takes: [`Biases`] of run-time lengths, or the typed
    /// [`MhaBiases`](crate::MhaBiases) whose lengths the compiler checks.
    type Biases: Into<Biases>;
    /// The built layer, from the run-time one.
    ///
    /// # Errors
    /// When `layer`'s widths are not those of the type (never for a layer the type's own
    /// builder built).
    fn from_layer(layer: Layer) -> Result<Self, ShapeError>;
}

/// Keeps [`BuiltLayer`] to the crate's layer types.
pub(crate) mod sealed {
    /// Implemented by the layer types a [`LayerBuilder`](super::LayerBuilder) builds.
    pub trait Sealed {}
}

impl sealed::Sealed for Layer {}

impl BuiltLayer for Layer {
    type Biases = Biases;
    fn from_layer(layer: Layer) -> Result<Self, ShapeError> {
        Ok(layer)
    }
}

impl<'p, L: BuiltLayer> LayerBuilder<'p, L> {
    /// The default settings for a layer of `projections` with `n_heads` query heads.
    pub(crate) fn new(projections: Projections<'p>, n_heads: usize) -> Self {
        LayerBuilder {
            projections,
            n_heads,
            masking: Masking::Causal,
            window: None,
            biases: Biases::default(),
            scale: None,
            qk_norm: None,
            qk_norm_placement: QkNormPlacement::BeforeRope,
            value_norm: None,
            values_from_keys: false,
            query_scale: None,
            chunk: None,
            gate: None,
            threads: 0,
            pool: Pool::default(),
            scratch: Scratch::default(),
            min_work_per_thread: MIN_WORK_PER_THREAD,
            isa: Isa::detect(),
            rope: None,
            alibi: None,
            alibi_positions: AlibiPositions::Index,
            softcap: None,
            sinks: None,
            kv_formats: KvFormats::default(),
            weight_formats: WeightFormats::In(WeightFormat::F32),
            compute: Compute::F32,
            attention_compute: Compute::F32,
            built: PhantomData,
        }
    }

    /// Causal (the default) or bidirectional attention.
    pub fn masking(mut self, masking: Masking) -> Self {
        self.masking = masking;
        self
    }

    /// Sliding-window attention (Mistral, Qwen2, Gemma's local layers): query `i` sees only the
    /// keys `j` with `i - window < j <= i`, its own and the `window - 1` before it, on top of
    /// causal order and the call's options (none by default). The attention skips the key
    /// blocks wholly before a window, and the layer's `new_cache` makes a rolling cache whose
    /// memory is bounded by the window, not by the sequence. A window of 0, or one on a
    /// bidirectional layer, is an error of [`build`](Self::build).
    pub fn sliding_window(mut self, window: usize) -> Self {
        self.window = Some(window);
        self
    }

    /// Chunked attention (Llama 4's RoPE layers; none by default): the keys are cut into
    /// chunks of `chunk` tokens from each sequence's first token, and query `i` sees only the
    /// keys `j <= i` of its own chunk, `⌊j / chunk⌋ = ⌊i / chunk⌋` (positions counted as
    /// causal order counts them, so a decoding step continues its sequence's chunk), on top of
    /// a window and the call's options. The attention skips the key blocks before a query's
    /// chunk, and a cache keeps only the last `chunk` keys (rolling, as for a window of
    /// `chunk`: a query never sees further back). A chunk of 0, or one on a bidirectional
    /// layer, is an error of [`build`](Self::build).
    ///
    /// ```
    /// use mha::{AttendOptions, AttentionWeights, Matrix, Mha, MhaParams, Output, Tensor};
    /// let w = Matrix::<4, 4>::identity();
    /// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
    /// let mut layer = Mha::builder(&params, 2).chunked_attention(2).build()?;
    /// let x = Tensor::<1, 3, 4>::zeros();
    /// let (mut y, mut weights) = (Tensor::<1, 3, 4>::zeros(), AttentionWeights::new());
    /// layer.forward_into(&x, AttendOptions::default(), Output::from(&mut y).with_weights(&mut weights))?;
    /// // Query 2 starts the second chunk: it sees itself alone.
    /// assert_eq!(weights.get(0, 0, 2, 1), Some(0.0));
    /// assert_eq!(weights.get(0, 0, 2, 2), Some(1.0));
    /// assert_eq!(weights.get(0, 0, 1, 0), Some(0.5));
    /// assert!(Mha::builder(&params, 2).chunked_attention(0).build().is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn chunked_attention(mut self, chunk: usize) -> Self {
        self.chunk = Some(chunk);
        self
    }

    /// Projection biases (none by default): [`Biases`], whose lengths are checked by
    /// [`build`](Self::build), or for the typed builder [`MhaBiases`](crate::MhaBiases) of
    /// the layer's widths.
    pub fn biases(mut self, biases: L::Biases) -> Self {
        self.biases = biases.into();
        self
    }

    /// The factor of the attention scores, `softmax(scale · q·k)`: by default `1/√head_dim`;
    /// Gemma's is `query_pre_attn_scalar^-0.5`, T5-style models use 1. It must be finite and
    /// not negative (checked by [`build`](Self::build)); 0 gives every visible key the same
    /// weight.
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
    /// [`QkNorm`]. Its weights and `eps` are checked by [`build`](Self::build).
    pub fn qk_norm(mut self, norm: QkNorm) -> Self {
        self.qk_norm = Some(norm);
        self
    }

    /// Where the QK-norm sits: before RoPE (the default) or after it (Llama 4, Hunyuan). The
    /// keys are cached after both either way.
    pub fn qk_norm_placement(mut self, placement: QkNormPlacement) -> Self {
        self.qk_norm_placement = placement;
        self
    }

    /// RMSNorm without weights of every value head (Gemma 4's and Gemma 3n's `v_norm`; none by
    /// default): each head's `dv` projected values (`head_dim` unless [`Widths::value`] differs; after their bias) become
    /// `v / sqrt(mean(v²) + eps)`, in `f32` with the squares summed in feature order, before
    /// they are cached, so a [`KvCache`](crate::KvCache) holds normalised values. `eps` must be
    /// finite and not negative (checked by [`build`](Self::build)); a head of zeros with
    /// `eps = 0` stays zeros. (Gemma 4's global layers take their values from the key
    /// projection: [`values_from_keys`](Self::values_from_keys).)
    ///
    /// ```
    /// use mha::{AttendOptions, Matrix, Mha, MhaParams, Tensor};
    /// let w = Matrix::<4, 4>::from_fn(|r, c| ((r + 2 * c) % 3) as f32 * 0.5);
    /// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), Matrix::identity());
    /// let mut layer = Mha::builder(&params, 2).value_norm(1e-6).build()?;
    /// assert_eq!(layer.value_norm(), Some(1e-6));
    /// // One token attends to itself: its output is its value, normalised per head.
    /// let x = Tensor::<1, 1, 4>::from_fn(|_, _, i| i as f32);
    /// let y = layer.forward(&x)?;
    /// let head = &y.as_slice()[..2];
    /// let mean_square = (head[0] * head[0] + head[1] * head[1]) / 2.0;
    /// assert!((mean_square - 1.0).abs() < 1e-5);
    /// assert!(Mha::builder(&params, 2).value_norm(f32::NAN).build().is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn value_norm(mut self, eps: f32) -> Self {
        self.value_norm = Some(eps);
        self
    }

    /// Values that are the key projection's output (Gemma 4's global layers with
    /// `attention_k_eq_v`; off by default): each token's values are its projected keys,
    /// `x·Wk (+ bk)`, taken before the keys' QK-norm and RoPE (then the value norm, if any).
    /// `Wk` is packed and multiplied once; the `wv` and `bv` given are not used (a
    /// checkpoint's loader gives `Wk` and `bk` there). The bits are those of the layer given
    /// `Wk` as `Wv` and `bk` as `bv`.
    ///
    /// ```
    /// use mha::{Layer, Projections, Widths};
    /// let widths = Widths::self_attention(4, 4, 4);
    /// let w: Vec<f32> = (0..16).map(|i| (i % 5) as f32 * 0.1).collect();
    /// let projections = Projections::new(widths, &w, &w, &w, &w)?;
    /// let mut shared = Layer::builder(projections, 2).values_from_keys().build()?;
    /// let mut twice = Layer::builder(projections, 2).build()?;
    /// assert_eq!(shared.weight_bytes() + 16 * 4, twice.weight_bytes());
    /// let x = [0.5, -1.0, 0.25, 2.0, 1.0, 0.0, -0.5, 0.75];
    /// let tokens = mha::Tokens::new(&x, 1, 2, 4)?;
    /// assert_eq!(shared.forward(tokens)?, twice.forward(tokens)?);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn values_from_keys(mut self) -> Self {
        self.values_from_keys = true;
        self
    }

    /// A position-dependent query scale (Ministral 3, Llama 4's NoPE layers; none by default):
    /// each token's queries are multiplied by a factor of its position after QK-norm and
    /// RoPE; see [`QueryScale`]. Checked by [`build`](Self::build).
    ///
    /// ```
    /// use mha::{AttendOptions, Matrix, Mha, MhaParams, QueryScale, ScalePosition, Tensor};
    /// let w = Matrix::<4, 4>::from_fn(|r, c| ((r + 2 * c) % 3) as f32 * 0.5);
    /// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
    /// let scale = QueryScale { beta: 0.5, period: 2.0, offset: 0, from: ScalePosition::Position };
    /// let mut layer = Mha::builder(&params, 2).query_scale(scale).build()?;
    /// let x = Tensor::<1, 5, 4>::from_fn(|_, t, i| (t + i) as f32 * 0.1);
    /// let full = layer.forward(&x)?;
    /// // Decoding token by token reads the same positions: the same bits.
    /// let mut cache = layer.new_cache(1, 5)?;
    /// let mut steps = Tensor::<1, 5, 4>::zeros();
    /// for t in 0..5 {
    ///     let token = Tensor::<1, 1, 4>::from_fn(|_, _, i| x[(0, t, i)]);
    ///     let mut out = Tensor::<1, 1, 4>::zeros();
    ///     layer.decode_into(&token, &mut cache, AttendOptions::default(), &mut out)?;
    ///     assert_eq!(out.token(0, 0), full.token(0, t));
    /// }
    /// let bad = QueryScale { period: 0.0, ..scale };
    /// assert!(Mha::builder(&params, 2).query_scale(bad).build().is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn query_scale(mut self, scale: QueryScale) -> Self {
        self.query_scale = Some(scale);
        self
    }

    /// A sigmoid output gate (Qwen3.5, Qwen3-Next; none by default): each token's merged
    /// attention output is multiplied by `σ(x·Wg + bg)`, per feature or per head, before the
    /// output projection; see [`OutputGate`]. Its lengths are checked by
    /// [`build`](Self::build).
    pub fn output_gate(mut self, gate: OutputGate) -> Self {
        self.gate = Some(gate);
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
    /// ([`ThreadPool::threads`]). The layer's calls also use the pool's scratch, shared with
    /// those layers, instead of scratch of their own. Results are bit-identical either way.
    #[cfg(feature = "std")]
    pub fn thread_pool(mut self, pool: &ThreadPool) -> Self {
        self.threads = pool.threads();
        self.pool = pool.pool();
        self.scratch = pool.scratch();
        self
    }

    /// Runs the layer's calls on the program's own threads through `executor`, which is
    /// offered up to [`threads`](Self::threads) `- 1` calls beside the caller's share (see
    /// [`Executor`]). Results are bit-identical to the layer's own threads.
    #[cfg(feature = "std")]
    pub fn executor(mut self, executor: Arc<dyn Executor>) -> Self {
        self.pool = Pool::external(executor);
        self.scratch = Scratch::default();
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
}

/// Where tokens sit and what the scores add: RoPE, ALiBi, soft cap, sinks.
impl<L: BuiltLayer> LayerBuilder<'_, L> {
    /// A rotary position embedding (none by default), applied to the queries and keys of
    /// self-attention after their projection and biases, before the keys are cached (the cache
    /// holds rotated keys). No table is built: each row's angles are computed as it is
    /// rotated ([`RopeAngles`]), so memory does not grow with the positions reached, and every
    /// position up to [`RopeAngles::max_position`] (at least `2^31 - 1`) works; beyond it a
    /// call is an error. Token `t` of a call is at `cached + t` unless
    /// [`AttendOptions::positions`](crate::AttendOptions::positions) says otherwise, so
    /// decoding continues where the cache ends (a rolling cache's count of tokens ever
    /// appended, so it decodes for ever). Cross-attention is an error on such a layer.
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

    /// Where ALiBi places keys and queries (by default at their index; BLOOM's at their rank
    /// among the real keys of a call's padding mask): see [`AlibiPositions`].
    pub fn alibi_positions(mut self, positions: AlibiPositions) -> Self {
        self.alibi_positions = positions;
        self
    }

    /// Logit soft-capping (Gemma 2; none by default): every scaled score `s` becomes
    /// `cap · tanh(s / cap)` (the crate's own [`tanh`](crate::kernels::math::tanh::tanh)) before
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
}

impl<L: BuiltLayer> LayerBuilder<'_, L> {
    /// Checks every setting against the widths and packs the weights (the work of
    /// [`build`](Self::build)); the threads the layer's calls run on and their scratch.
    pub(crate) fn settings(self) -> Result<(Settings, Pool, Scratch), ShapeError> {
        let widths = self.projections.widths();
        let head_dim = query_head_dim(widths, self.n_heads)?;
        let n_kv_heads = kv_heads(widths.kv, head_dim, self.n_heads)?;
        let value_dim = value_heads(widths, head_dim, n_kv_heads)?;
        self.check_window()?;
        let scale = match self.scale {
            Some(scale) => finite_non_negative("softmax scale", scale)?,
            None => score_scale(head_dim),
        };
        if let Some(norm) = &self.qk_norm {
            norm.check(head_dim, self.n_heads, n_kv_heads)?;
        }
        if let Some(scale) = &self.query_scale {
            scale.check()?;
        }
        if let Some(eps) = self.value_norm {
            finite_non_negative("value norm eps", eps)?;
        }
        self.biases.check(widths)?;
        self.check_kv_shared()?;
        self.check_values_from_keys()?;
        let gate_width = self.gate.as_ref().map(|g| g.width(self.n_heads, value_dim));
        if let (Some(gate), Some(width)) = (&self.gate, gate_width) {
            gate.check(widths.d_model, width)?;
        }
        let kernels = self.isa.kernels()?;
        let rope = self
            .rope
            .map(|rope| RopeAngles::new(rope, head_dim))
            .transpose()?;
        let score_terms = ScoreTerms::new(self.alibi, self.softcap, self.sinks, self.n_heads)?;
        score_terms.check_window_reach(self.window)?;
        let attention_compute = check_attention_compute(self.attention_compute)?;
        let settings = Settings {
            widths,
            n_heads: self.n_heads,
            n_kv_heads,
            head_dim,
            value_dim,
            masking: self.masking,
            scale,
            qk_norm: self.qk_norm,
            qk_norm_placement: self.qk_norm_placement,
            value_norm: self.value_norm,
            values_from_keys: self.values_from_keys,
            query_scale: self.query_scale,
            window: self.window,
            chunk: self.chunk,
            threads: thread_count(self.threads),
            min_work_per_thread: self.min_work_per_thread,
            weights: PackedWeights::new(
                kernels,
                (&self.projections, self.values_from_keys),
                self.gate
                    .as_ref()
                    .zip(gate_width)
                    .map(|(g, w)| (&g.weight[..], w)),
                self.weight_formats,
                self.compute,
            )?,
            gate: self.gate,
            biases: self.biases,
            rope,
            score_terms,
            alibi_positions: self.alibi_positions,
            kv_formats: self.kv_formats,
            attention_compute,
            kv_shared: self.projections.is_kv_shared(),
        };
        Ok((settings, self.pool, self.scratch))
    }

    /// A KV-shared layer ([`Projections::queries_only`]) projects no keys or values, so it
    /// takes no key or value bias.
    fn check_kv_shared(&self) -> Result<(), ShapeError> {
        let biases = [("bk", &self.biases.bk), ("bv", &self.biases.bv)];
        match biases.iter().find(|(_, bias)| bias.is_some()) {
            Some((name, _)) if self.projections.is_kv_shared() => Err(ShapeError::Setting {
                what: "key/value bias of a KV-shared layer",
                value: alloc::format!("{name} given"),
                expected: "none: its keys and values are its source layer's",
            }),
            _ => Ok(()),
        }
    }

    /// Values from the keys need value heads as wide as the key heads (`V = KV`).
    fn check_values_from_keys(&self) -> Result<(), ShapeError> {
        let widths = self.projections.widths();
        if !self.values_from_keys || widths.value == widths.kv {
            return Ok(());
        }
        Err(ShapeError::Setting {
            what: "values from the keys",
            value: alloc::format!("V = {} beside KV = {}", widths.value, widths.kv),
            expected: "value heads as wide as the key heads (V = KV)",
        })
    }

    /// A window must be at least 1 and needs causal order; so does a chunk.
    fn check_window(&self) -> Result<(), ShapeError> {
        match self.window {
            Some(0) => return Err(ShapeError::ZeroWindow),
            Some(window) if self.masking != Masking::Causal => {
                return Err(ShapeError::WindowNeedsCausal { window })
            }
            _ => {}
        }
        let expected = match self.chunk {
            Some(0) => "at least 1",
            Some(_) if self.masking != Masking::Causal => "on a causal layer",
            _ => return Ok(()),
        };
        Err(ShapeError::Setting {
            what: "attention chunk size",
            value: alloc::format!("{:?}", self.chunk.unwrap_or(0)),
            expected,
        })
    }
}

/// How the layer stores its weights and its keys and values.
impl<L: BuiltLayer> LayerBuilder<'_, L> {
    /// How the layer's key/value caches and a forward pass's transient store keep keys and
    /// values ([`KvFormat::F32`] by default): rounded to `format` when appended, widened
    /// exactly when attended, so a forward pass equals decoding its tokens one by one in
    /// every format. Sets keys and values alike; see [`key_format`](Self::key_format) and
    /// [`value_format`](Self::value_format).
    ///
    /// ```
    /// use mha::{AttendOptions, KvFormat, Matrix, Mha, MhaParams, Tensor};
    /// let w = Matrix::<64, 64>::identity();
    /// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
    /// let f32_bytes = Mha::new(&params, 2)?.new_cache(1, 96)?.bytes();
    /// let mut layer = Mha::builder(&params, 2).kv_format(KvFormat::Bf16).build()?;
    /// let mut cache = layer.new_cache(1, 96)?;
    /// assert_eq!(2 * cache.bytes(), f32_bytes);
    /// // A forward pass rounds its keys and values as the cache does: decoding gives its bits.
    /// let x = Tensor::<1, 3, 64>::from_fn(|_, t, i| (t * i) as f32 * 0.01);
    /// let full = layer.forward(&x)?;
    /// let mut steps = Tensor::<1, 3, 64>::zeros();
    /// layer.decode_into(&x, &mut cache, AttendOptions::default(), &mut steps)?;
    /// assert_eq!(steps.as_slice(), full.as_slice());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn kv_format(self, format: KvFormat) -> Self {
        self.key_format(format).value_format(format)
    }

    /// How the layer stores keys (see [`kv_format`](Self::kv_format)).
    pub fn key_format(mut self, format: KvFormat) -> Self {
        self.kv_formats.keys = format;
        self
    }

    /// How the layer stores values (see [`kv_format`](Self::kv_format)).
    pub fn value_format(mut self, format: KvFormat) -> Self {
        self.kv_formats.values = format;
        self
    }

    /// How the layer keeps its projection weights ([`WeightFormat::F32`] by default; a
    /// checkpoint's [`LayerWeights::builder`](crate::LayerWeights::builder) sets the format
    /// it was stored in). A 16-bit format rounds each weight once when the layer is built
    /// (to nearest, ties to even) and halves the bytes the layer holds and each decoding step
    /// reads; the outputs are bit for bit those of an `f32` layer built from the rounded
    /// weights. Biases stay `f32`. Checked by [`build`](Self::build): no finite weight may
    /// round to an infinity.
    ///
    /// ```
    /// use mha::{Layer, Projections, WeightFormat, Widths};
    /// let widths = Widths::self_attention(4, 4, 4);
    /// let w = vec![0.1; 16];
    /// let projections = Projections::new(widths, &w, &w, &w, &w)?;
    /// let f32_layer = Layer::builder(projections, 2).threads(1).build()?;
    /// let bf16_layer = Layer::builder(projections, 2)
    ///     .weight_format(WeightFormat::Bf16)
    ///     .threads(1)
    ///     .build()?;
    /// assert_eq!(bf16_layer.weight_format(), WeightFormat::Bf16);
    /// assert_eq!(2 * bf16_layer.weight_bytes(), f32_layer.weight_bytes());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn weight_format(mut self, format: WeightFormat) -> Self {
        self.weight_formats = WeightFormats::In(format);
        self
    }

    /// Keeps each projection in the format it is given in (instead of one
    /// [`weight_format`](Self::weight_format)): `f32`, bf16 or f16 values as they are, ggml's
    /// blocks ([`WeightValues::blocks`](crate::WeightValues::blocks)) as their blocks, an
    /// output gate's `f32` weights in `f32`. A GGUF `Q4_K_M` layer (q4_K `wq`, `wk`, `wo`
    /// beside a q6_K `wv`) then holds exactly its file's bytes
    /// ([`Layer::weight_bytes`](crate::Layer::weight_bytes)), and its outputs are bit for bit
    /// those of the `f32` layer of the matrices' widened values (ggml's dequantized ones for
    /// blocks). When the formats differ, each matrix is multiplied on its own;
    /// [`Layer::weight_formats`](crate::Layer::weight_formats) says which format each is in.
    ///
    /// ```
    /// use mha::{Layer, Projections, WeightFormat, WeightValues, Widths};
    /// let widths = Widths::self_attention(32, 32, 32);
    /// let f32s = WeightValues::from(vec![0.01; 32 * 32]);
    /// // Wv in q8_0: 32 outputs of one block of 32 inputs (scale 0.5, integers 2).
    /// let mut block = vec![0x00, 0x38];
    /// block.extend([2u8; 32]);
    /// let q8 = WeightValues::blocks(WeightFormat::Q8_0, 32, block.repeat(32)).unwrap();
    /// let projections = Projections::from_values(widths, [&f32s, &f32s, &q8, &f32s])?;
    /// let layer = Layer::builder(projections, 2).stored_weight_formats().build()?;
    /// assert_eq!(layer.weight_formats()[2], WeightFormat::Q8_0);
    /// assert_eq!(layer.weight_bytes(), 3 * 32 * 32 * 4 + 32 * 34);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn stored_weight_formats(mut self) -> Self {
        self.weight_formats = WeightFormats::AsStored;
        self
    }

    /// The arithmetic of the layer's projections ([`Compute::F32`] by default; see
    /// [`Compute::Int8`], which needs [`weight_format`](Self::weight_format) `q8_0` or `q4_0`:
    /// [`build`](Self::build) says otherwise with a [`ShapeError::Setting`]). The attention's
    /// own is [`attention_compute`](Self::attention_compute).
    pub fn compute(mut self, compute: Compute) -> Self {
        self.compute = compute;
        self
    }

    /// The arithmetic of the attention's `Q·Kᵀ` and `P·V`: [`Compute::F32`] (the default), or
    /// [`Compute::Bf16`] — on a CPU with AMX-BF16, queries (times the scale), keys,
    /// probabilities and values rounded to bfloat16 and multiplied on AMX's tiles, in AMX's
    /// own order of each step of 32 products (the softmax stays `f32`); elsewhere the setting
    /// changes nothing. Decoding still equals the forward pass and threads change no bit.
    /// It pays for long prefills; a decoding step repacks the whole cache for the tiles and
    /// runs several times slower. [`Compute::Int8`] is a [`ShapeError::Setting`] of
    /// [`build`](Self::build).
    ///
    /// ```
    /// use mha::{Compute, Layer, Projections, Widths};
    /// let w = vec![0.01f32; 64 * 64];
    /// let projections = Projections::new(Widths::self_attention(64, 64, 64), &w, &w, &w, &w)?;
    /// let layer = Layer::builder(projections, 4)
    ///     .compute(Compute::Bf16)
    ///     .attention_compute(Compute::Bf16)
    ///     .build()?;
    /// assert_eq!(layer.attention_compute(), Compute::Bf16);
    /// let int8 = Layer::builder(projections, 4).attention_compute(Compute::Int8).build();
    /// assert!(int8.is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn attention_compute(mut self, compute: Compute) -> Self {
        self.attention_compute = compute;
        self
    }
}

/// The attention's arithmetic, when the attention has it: `f32` or `bf16`.
fn check_attention_compute(compute: Compute) -> Result<Compute, ShapeError> {
    match compute {
        Compute::F32 | Compute::Bf16 => Ok(compute),
        Compute::Int8 => Err(ShapeError::Setting {
            what: "attention compute",
            value: alloc::string::String::from(compute.name()),
            expected: "f32 or bf16",
        }),
    }
}

/// What a built layer is: its widths, head counts and every checked setting, with the weights
/// packed for its instruction set. Read by every call, never changed.
#[derive(Debug)]
pub(crate) struct Settings {
    pub widths: Widths,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// `Q / n_heads`.
    pub head_dim: usize,
    /// `V / n_kv_heads`: the width of a value head and of a merged head (`head_dim` unless
    /// the widths' value width differs from `KV`).
    pub value_dim: usize,
    pub masking: Masking,
    /// The factor of the scores.
    pub scale: f32,
    /// RMSNorm of the projected queries and keys, checked against the head counts.
    pub qk_norm: Option<QkNorm>,
    /// Whether the QK-norm comes before or after RoPE.
    pub qk_norm_placement: QkNormPlacement,
    /// The `eps` of the weight-less RMSNorm of each value head, when the layer has one.
    pub value_norm: Option<f32>,
    /// Values from the key projection's output (`Wv` not packed).
    pub values_from_keys: bool,
    /// The position-dependent factor of the queries, checked.
    pub query_scale: Option<QueryScale>,
    /// The output gate, its lengths checked; `Wg` is packed after `[Wq | Wk | Wv]` (or `Wq`).
    pub gate: Option<OutputGate>,
    pub window: Option<usize>,
    /// Chunked attention's chunk (at least 1, on a causal layer).
    pub chunk: Option<usize>,
    pub threads: usize,
    pub min_work_per_thread: usize,
    pub weights: PackedWeights,
    /// Checked against the widths.
    pub biases: Biases,
    /// The rotary embedding, when the layer has one.
    pub rope: Option<RopeAngles>,
    /// Soft cap, ALiBi slopes and sinks.
    pub score_terms: ScoreTerms,
    /// Where ALiBi places keys and queries.
    pub alibi_positions: AlibiPositions,
    /// How caches and the transient store keep keys and values.
    pub kv_formats: KvFormats,
    /// The arithmetic of `Q·Kᵀ` and `P·V`: `f32` or `bf16`.
    pub attention_compute: Compute,
    /// A KV-shared layer: no key/value projections; it attends over a source layer's cache
    /// (`Layer::decode_shared_into`), and its other calls are refused.
    pub kv_shared: bool,
}

impl Settings {
    /// The output gates per token, `G` (0 without a gate).
    pub(crate) fn gate_width(&self) -> usize {
        let width = |gate: &OutputGate| gate.width(self.n_heads, self.value_dim);
        self.gate.as_ref().map_or(0, width)
    }

    /// How far back a query sees, when bounded: a query at position `p` sees no key before
    /// `p + 1 - reach` (the window's and the chunk's bound, the nearer of the two). A cache
    /// keeps only that many keys plus one call's (rolling, or releasing its old blocks).
    pub(crate) fn reach(&self) -> Option<usize> {
        match (self.window, self.chunk) {
            (Some(window), Some(chunk)) => Some(window.min(chunk)),
            (window, chunk) => window.or(chunk),
        }
    }
}

/// The width of the heads of the query width `Q` split into `n_heads`: the error names `Q`
/// when it differs from `D`.
fn query_head_dim(widths: Widths, n_heads: usize) -> Result<usize, ShapeError> {
    let (d_model, q_width) = (widths.d_model, widths.query);
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

/// The width `dv` of the value heads of `widths` over `n_kv_heads` key/value heads of
/// `head_dim`: `head_dim` when `V = KV`.
fn value_heads(widths: Widths, head_dim: usize, n_kv_heads: usize) -> Result<usize, ShapeError> {
    if widths.value == widths.kv {
        return Ok(head_dim);
    }
    let dv = widths.value / n_kv_heads;
    if head_dim == 0 || dv * n_kv_heads != widths.value || widths.merged() == 0 {
        return Err(ShapeError::ValueWidth {
            value_width: widths.value,
            kv_width: widths.kv,
            q_width: widths.query,
        });
    }
    Ok(dv)
}
