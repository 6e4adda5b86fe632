//! The typed layer [`Mha`]: a [`Layer`] whose widths are constants of its type, checked once
//! when it is built, its builder, and the one-call [`mha_forward`].

use core::ops::Deref;

use crate::cache::KvCache;
use crate::error::ShapeError;
use crate::kernels::plan::ONE_SHOT_MIN_WORK_PER_THREAD;
#[cfg(feature = "std")]
use crate::kernels::{Executor, ThreadPool};
use crate::kernels::{Isa, KvFormat, WeightFormat};
use crate::layer::{Biases, Layer, LayerBuilder, Projections, Widths};
use crate::norm::QkNorm;
use crate::options::{AttendOptions, Masking};
use crate::params::{MhaBiases, MhaParams};
use crate::rope::Rope;
use crate::scores::{Alibi, AlibiPositions};
use crate::tensor::Tensor;
use crate::tokens::{IntoOutput, IntoTokens};
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
/// values, the key/value store) besides its output, allocated for the call and freed when it
/// returns. Packing costs little next to the forward; the first touch of fresh memory may
/// not: an allocator that returns large blocks to the system when they are freed (as glibc's
/// `malloc` does) makes every call fault their pages in again. A layer keeps its buffers
/// between calls (they only grow), so only a call on a larger shape than before touches fresh
/// memory.
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

/// Settings of an [`Mha`] layer beyond its weights; made by [`Mha::builder`]. The settings
/// are those of [`LayerBuilder`], whose documentation says what each does; the biases are
/// typed.
#[derive(Debug)]
pub struct MhaBuilder<'p, const D: usize, const E: usize, const KV: usize, const Q: usize = D> {
    layer: LayerBuilder<'p>,
    biases: MhaBiases<D, KV, Q>,
}

impl<'p, const D: usize, const E: usize, const KV: usize, const Q: usize>
    MhaBuilder<'p, D, E, KV, Q>
{
    /// The builder with one setting of the run-time builder changed.
    fn with(self, set: impl FnOnce(LayerBuilder<'p>) -> LayerBuilder<'p>) -> Self {
        MhaBuilder {
            layer: set(self.layer),
            ..self
        }
    }

    /// Causal (the default) or bidirectional attention ([`LayerBuilder::masking`]).
    pub fn masking(self, masking: Masking) -> Self {
        self.with(|b| b.masking(masking))
    }

    /// Sliding-window attention: query `i` sees only the keys `j` with `i - window < j <= i`
    /// ([`LayerBuilder::sliding_window`]).
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
    pub fn sliding_window(self, window: usize) -> Self {
        self.with(|b| b.sliding_window(window))
    }

    /// Projection biases (none by default), of the layer's widths.
    pub fn biases(self, biases: MhaBiases<D, KV, Q>) -> Self {
        MhaBuilder { biases, ..self }
    }

    /// The factor of the attention scores, by default `1/√head_dim`
    /// ([`LayerBuilder::scale`]).
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
    pub fn scale(self, scale: f32) -> Self {
        self.with(|b| b.scale(scale))
    }

    /// RMSNorm of every query and key ([`LayerBuilder::qk_norm`]; see [`QkNorm`]).
    pub fn qk_norm(self, norm: QkNorm) -> Self {
        self.with(|b| b.qk_norm(norm))
    }

    /// The thread count (0, the default, means every CPU; see [`LayerBuilder::threads`]).
    pub fn threads(self, threads: usize) -> Self {
        self.with(|b| b.threads(threads))
    }

    /// Runs the layer's calls on `pool`'s threads, shared with every other layer built with
    /// it ([`LayerBuilder::thread_pool`]).
    #[cfg(feature = "std")]
    pub fn thread_pool(self, pool: &ThreadPool) -> Self {
        self.with(|b| b.thread_pool(pool))
    }

    /// Runs the layer's calls on the program's own threads through `executor`
    /// ([`LayerBuilder::executor`]).
    #[cfg(feature = "std")]
    pub fn executor(self, executor: Arc<dyn Executor>) -> Self {
        self.with(|b| b.executor(executor))
    }

    /// How many multiply-adds each thread of a phase must get before the phase uses another
    /// thread ([`LayerBuilder::min_work_per_thread`]).
    pub fn min_work_per_thread(self, multiply_adds: usize) -> Self {
        self.with(|b| b.min_work_per_thread(multiply_adds))
    }

    /// The instruction set of the kernels (default: [`Isa::detect`]).
    pub fn isa(self, isa: Isa) -> Self {
        self.with(|b| b.isa(isa))
    }

    /// A rotary position embedding, its angles computed per position
    /// ([`LayerBuilder::rope`]).
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
    pub fn rope(self, rope: Rope) -> Self {
        self.with(|b| b.rope(rope))
    }

    /// ALiBi: head `h` adds `-slope_h · (i - j)` to the scores ([`LayerBuilder::alibi`]).
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
    pub fn alibi(self, alibi: Alibi) -> Self {
        self.with(|b| b.alibi(alibi))
    }

    /// Where ALiBi places keys and queries ([`LayerBuilder::alibi_positions`]).
    pub fn alibi_positions(self, positions: AlibiPositions) -> Self {
        self.with(|b| b.alibi_positions(positions))
    }

    /// Logit soft-capping, `cap · tanh(s / cap)` ([`LayerBuilder::softcap`]).
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
    pub fn softcap(self, cap: f32) -> Self {
        self.with(|b| b.softcap(cap))
    }

    /// Attention sinks, one learned logit per query head ([`LayerBuilder::sinks`]).
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
    pub fn sinks(self, sinks: alloc::vec::Vec<f32>) -> Self {
        self.with(|b| b.sinks(sinks))
    }

    /// How caches keep keys and values ([`LayerBuilder::kv_format`]).
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
        self.with(|b| b.kv_format(format))
    }

    /// How the layer keeps its projection weights ([`LayerBuilder::weight_format`]).
    pub fn weight_format(self, format: WeightFormat) -> Self {
        self.with(|b| b.weight_format(format))
    }

    /// How caches keep keys ([`LayerBuilder::key_format`]).
    pub fn key_format(self, format: KvFormat) -> Self {
        self.with(|b| b.key_format(format))
    }

    /// How caches keep values ([`LayerBuilder::value_format`]).
    pub fn value_format(self, format: KvFormat) -> Self {
        self.with(|b| b.value_format(format))
    }

    /// Checks the head counts and every setting and packs the weights.
    ///
    /// # Errors
    /// As [`LayerBuilder::build`].
    pub fn build(self) -> Result<Mha<D, E, KV, Q>, ShapeError> {
        let biases = Biases::from(self.biases.clone());
        let layer = self.layer.biases(biases).build()?;
        Ok(Mha {
            layer,
            biases: self.biases,
        })
    }
}

/// A reusable multi-head attention layer whose widths are constants: a [`Layer`] (whose
/// settings it shows through `Deref`) taking only tokens of its widths.
///
/// `Mha<D>` is self-attention with `D`-wide weights; `E`, `KV` and `Q` are as in
/// [`MhaParams`]. Inputs and outputs are `D` wide whatever the query width: a `&Tensor` or
/// `&mut Tensor` of another width does not compile, and [`Tokens`](crate::Tokens) and
/// [`Output`](crate::Output) views are checked when called. The calls, their threads and
/// their bits are the [`Layer`]'s; [`Mha::try_from`] gives a layer built at run time (e.g.
/// from a checkpoint) its typed view.
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
    layer: Layer,
    /// The layer's biases, typed.
    biases: MhaBiases<D, KV, Q>,
}

impl<const D: usize, const E: usize, const KV: usize, const Q: usize> Deref for Mha<D, E, KV, Q> {
    type Target = Layer;

    fn deref(&self) -> &Layer {
        &self.layer
    }
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

/// The widths `D, E, KV, Q` of a typed layer.
const fn typed_widths<const D: usize, const E: usize, const KV: usize, const Q: usize>() -> Widths {
    Widths {
        d_model: D,
        memory: E,
        kv: KV,
        query: Q,
    }
}

/// A layer built at run time, typed: its widths checked against `D, E, KV, Q`.
///
/// ```
/// use mha::{Layer, Mha, Projections, Widths};
/// let w = vec![0.25; 16];
/// let layer = Layer::builder(Projections::new(Widths::self_attention(4, 4, 4), &w, &w, &w, &w)?, 2).build()?;
/// let typed = Mha::<4>::try_from(layer)?;
/// assert_eq!(typed.n_heads(), 2);
/// let layer = typed.into_layer();
/// assert_eq!(
///     Mha::<4, 4, 2>::try_from(layer).unwrap_err().to_string(),
///     "converting a Layer to Mha<4, 4, 2, 4>: the layer's key/value width (KV) is 4, not 2 \
///      (it converts to Mha<4, 4, 4, 4>)"
/// );
/// # Ok::<(), mha::ShapeError>(())
/// ```
///
/// # Errors
/// [`ShapeError::TypedWidths`], naming each width of the layer that is not the type's.
impl<const D: usize, const E: usize, const KV: usize, const Q: usize> TryFrom<Layer>
    for Mha<D, E, KV, Q>
{
    type Error = ShapeError;

    fn try_from(layer: Layer) -> Result<Self, ShapeError> {
        let (want, have) = (typed_widths::<D, E, KV, Q>(), layer.widths());
        if have != want {
            let numbers = |w: Widths| [w.d_model, w.memory, w.kv, w.query];
            return Err(ShapeError::TypedWidths {
                layer: numbers(have),
                typed: numbers(want),
            });
        }
        let biases = MhaBiases::try_from(layer.biases())?;
        Ok(Mha { layer, biases })
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
        let widths = typed_widths::<D, E, KV, Q>();
        let matrices = [
            params.wq.as_slice(),
            params.wk.as_slice(),
            params.wv.as_slice(),
            params.wo.as_slice(),
        ];
        MhaBuilder {
            layer: Layer::builder(Projections::of_typed(widths, matrices), n_heads),
            biases: MhaBiases::default(),
        }
    }

    /// The projection biases.
    pub fn biases(&self) -> &MhaBiases<D, KV, Q> {
        &self.biases
    }

    /// The run-time layer, for code that takes any width.
    pub fn into_layer(self) -> Layer {
        self.layer
    }

    /// Cross-attention: queries from `x (B, T, D)`, keys and values from `memory (B, S, E)`
    /// ([`Layer::cross_into`]).
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
    /// As [`Layer::cross_into`].
    pub fn cross_into<'a>(
        &mut self,
        x: impl IntoTokens<'a, D>,
        memory: impl IntoTokens<'a, E>,
        options: AttendOptions<'_>,
        out: impl IntoOutput<'a, D>,
    ) -> Result<(), ShapeError> {
        self.layer.cross_into(x, memory, options, out)
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
    /// ([`Layer::forward_into`]).
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
    /// let tokens = Tokens::new(x.as_slice(), 2, 3, 4)?;
    /// layer.forward_into(tokens, options, Output::new(&mut flat, 2, 3, 4)?)?;
    /// assert_eq!(flat, out.as_slice());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// As [`Layer::forward_into`].
    pub fn forward_into<'a>(
        &mut self,
        x: impl IntoTokens<'a, D>,
        options: AttendOptions<'_>,
        out: impl IntoOutput<'a, D>,
    ) -> Result<(), ShapeError> {
        self.layer.forward_into(x, options, out)
    }

    /// One step of incremental decoding through `cache` ([`Layer::decode_into`]; the cache
    /// comes from [`Layer::new_cache`]).
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
    /// As [`Layer::decode_into`].
    pub fn decode_into<'a>(
        &mut self,
        x: impl IntoTokens<'a, D>,
        cache: &mut KvCache,
        options: AttendOptions<'_>,
        out: impl IntoOutput<'a, D>,
    ) -> Result<(), ShapeError> {
        self.layer.decode_into(x, cache, options, out)
    }
}
