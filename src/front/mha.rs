//! The typed layer [`Mha`]: a [`Layer`] whose widths are constants of its type, checked once
//! when it is built, its builder, and the one-call [`mha_forward`].

use core::ops::Deref;

use crate::error::ShapeError;
use crate::front::params::{MhaBiases, MhaParams};
use crate::front::tensor::Tensor;
use crate::front::tensor::{IntoOutput, IntoTokens};
use crate::kernels::threads::plan::ONE_SHOT_MIN_WORK_PER_THREAD;
use crate::layer::cache::KvCache;
use crate::layer::options::AttendOptions;
use crate::layer::{sealed, BuiltLayer, Layer, LayerBuilder, Projections, Widths};

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

/// The builder of an [`Mha`] layer, made by [`Mha::builder`]: the run-time [`LayerBuilder`]
/// (whose documentation says what each setting does), typed by the layer it builds, so that
/// its biases are [`MhaBiases`] of the layer's widths and [`build`](LayerBuilder::build)
/// gives an [`Mha`].
///
/// ```
/// use mha::{Matrix, Mha, MhaBiases, MhaParams, ShapeError, Tensor};
/// let w = Matrix::<4, 4>::identity();
/// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
/// let biases = MhaBiases { bo: Some(Matrix::from_fn(|_, c| c as f32)), ..MhaBiases::default() };
/// let mut layer = Mha::builder(&params, 2).sliding_window(1).biases(biases).build()?;
/// assert_eq!(layer.sliding_window(), Some(1));
/// // A window of one key: each token sees only itself, so the output is its value plus `bo`.
/// let x = Tensor::<1, 3, 4>::from_fn(|_, t, i| (t * 4 + i) as f32);
/// assert_eq!(layer.forward(&x)?, Tensor::from_fn(|_, t, i| (t * 4 + 2 * i) as f32));
/// assert_eq!(Mha::builder(&params, 2).sliding_window(0).build().err(), Some(ShapeError::ZeroWindow));
/// # Ok::<(), ShapeError>(())
/// ```
pub type MhaBuilder<'p, const D: usize, const E: usize, const KV: usize, const Q: usize = D> =
    LayerBuilder<'p, Mha<D, E, KV, Q>>;

impl<const D: usize, const E: usize, const KV: usize, const Q: usize> sealed::Sealed
    for Mha<D, E, KV, Q>
{
}

impl<const D: usize, const E: usize, const KV: usize, const Q: usize> BuiltLayer
    for Mha<D, E, KV, Q>
{
    type Biases = MhaBiases<D, KV, Q>;
    fn from_layer(layer: Layer) -> Result<Self, ShapeError> {
        Mha::try_from(layer)
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
    /// A causal self-attention layer: packs `params` for [`Isa::detect`](crate::Isa::detect) and uses every CPU.
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
        value: KV,
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
/// [`ShapeError::TypedWidths`], naming each width of the layer that is not the type's;
/// [`ShapeError::Setting`] for a layer whose value heads are not as wide as its key heads.
impl<const D: usize, const E: usize, const KV: usize, const Q: usize> TryFrom<Layer>
    for Mha<D, E, KV, Q>
{
    type Error = ShapeError;

    fn try_from(layer: Layer) -> Result<Self, ShapeError> {
        let (want, have) = (typed_widths::<D, E, KV, Q>(), layer.widths());
        if have.value != have.kv {
            return Err(ShapeError::Setting {
                what: "value width V of a Layer converted to Mha",
                value: alloc::format!("{} (key/value width KV {})", have.value, have.kv),
                expected: "KV: a typed Mha's value heads are as wide as its key heads",
            });
        }
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
        LayerBuilder::new(Projections::of_typed(widths, matrices), n_heads)
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
