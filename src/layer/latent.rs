//! Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi K2, Mistral 4, LongCat-Flash) with
//! absorbed weights:
//! [`MlaLayer`], its weights as a checkpoint stores them ([`MlaWeights`]) and its widths
//! ([`MlaShape`]).
//!
//! Widths: `D` the model width, `H` heads, `n = qk_nope_head_dim`, `p = qk_rope_head_dim`,
//! `r = kv_lora_rank`, `v = v_head_dim`. Per token, on every call (prefill and decode alike):
//!
//! 1. one GEMM of `x (rows, D)` against `[q_a_projᵀ | kv_a_proj_with_mqaᵀ]` gives the query
//!    latent `(rows, q_lora_rank)` and the latent row `(rows, p + r)`; RMSNorm `q_a_layernorm`
//!    on the query latent and a GEMM against `q_b_projᵀ` give the queries `(rows, H, p + n)`
//!    (one GEMM against `q_projᵀ` without a query LoRA). Both weights' output columns are
//!    permuted when packed so that the rotary part comes first: a query head is
//!    `[q_rope (p) | q_nope (n)]` and the latent row `[k_rope (p) | c (r)]`; RMSNorm
//!    `kv_a_layernorm` on `c`.
//! 2. The absorbed query of head `h` is `[q_rope_h | q_nope_h · W_UK_h]` (width `p + r`), with
//!    `W_UK_h (n, r)` head `h`'s key rows of `kv_b_proj`; RoPE (YaRN and its cos/sin factor as
//!    the [`Rope`] says; DeepSeek's pairs are interleaved) turns the first `p` features of each
//!    absorbed query head and of each latent row, by the token's position (`transformers`
//!    writes interleaved pairs back de-interleaved, queries and keys alike: the same scores).
//!    With a [`QueryScale`] (Mistral 4), each absorbed query row is then multiplied by its
//!    token's factor.
//! 3. The latent rows are appended, once, as the keys of a [`KvStore`] of **one key/value head
//!    of width `p + r` whose values are its keys' last `r` columns** (`c`:
//!    [`ValueLayout::InKeys`] from `p`), and the `H` absorbed heads attend over it as one
//!    MQA-shaped attention (the crate's tiled kernels, cache formats and threads) with the
//!    softmax scale `(n + p)^-½ · mscale²` ([`MlaShape::softmax_scale`]). With `P_h` head
//!    `h`'s softmax weights, its output is `P_h · c` (`r` wide).
//! 4. `o_h = (P_h · c) · W_UV_hᵀ` (`W_UV_h (v, r)` head `h`'s value rows of `kv_b_proj`), the
//!    heads concatenated `(rows, H · v)`, then `o_proj`.
//!
//! The scores are those of the naive expansion, `q_nope_h · (c W_UK_hᵀ)ᵀ + q_rope_h · k_rope`,
//! and the outputs `P_h · (c W_UV_hᵀ)`, reassociated. Every step treats each row (a token, or a
//! token's head) on its own with kernels whose results do not depend on the number of rows or
//! threads, so a decoding step through [`MlaLayer::new_cache`] gives the forward's bits.
//!
//! **Cache.** The cache keeps the `p + r` wide latent row once per token, in the cache's
//! format ([`KvCache::bytes`] is `p + r` elements per token and layer, plus `q8_0`'s scales,
//! where expanded heads would hold `H (n + p + v)`): in the key panels of `96` tokens a
//! [`KvCache`] holds for any layer, with no value side; the attention transposes each key
//! block's last `r` rows into value rows as it reads them (the values a value side in the
//! cache's format would hold, so the same bits; decoding, a slice of 64 value columns at a
//! time, which every head reads while it is in L1, and the scores from the keys as stored,
//! widened in registers). The latent layout is one more
//! [`BlockLayout`](crate::kernels::store::layout::BlockLayout) (`values: InKeys`), so a
//! [`PagedCache`](crate::PagedCache) holds it as well.
//!
//! **Calls.** Causal self-attention, each sequence's positions counted from its cached tokens:
//! [`MlaLayer::forward`] (a transient store), [`MlaLayer::decode_into`] (a [`KvCache`]) and
//! [`MlaLayer::decode_paged`] (sequences of a [`PagedCache`] in batches of any composition,
//! forked and truncated as a `Layer`'s: each sequence's bits are those of decoding it alone);
//! the per-call options of [`Layer`](crate::Layer) (masks, padding, explicit positions,
//! windows, attention weights) are not offered yet.

use alloc::vec::Vec;

use crate::error::{check_dimension, ShapeError};
use crate::kernels::attention::flash::{self, AttentionShape, FlashScratch, Operands};
use crate::kernels::attention::mask::Visibility;
use crate::kernels::attention::terms::ScoreTerms;
use crate::kernels::buffer::{element_count, try_filled, try_grow};
use crate::kernels::gemm::packed::PackedB;
use crate::kernels::gemm::{self, GemmScratch, Output as Segment};
use crate::kernels::math::trig::{ln, sqrt};
use crate::kernels::store::kv::{KvStore, NewTokens, StoreShape};
use crate::kernels::store::layout::{BlockLayout, HeadLayout, KvFormats, ValueLayout};
use crate::kernels::store::paged::PagedStore;
use crate::kernels::store::view::KvView;
use crate::kernels::store::Store;
use crate::kernels::threads::parallel::Pool;
use crate::kernels::threads::plan::thread_count;
use crate::kernels::workspace::{Scratch, Workspace};
#[cfg(feature = "std")]
use crate::kernels::ThreadPool;
use crate::kernels::{Isa, Kernels, KvFormat};
use crate::layer::cache::KvCache;
use crate::layer::norm::rms_norm;
use crate::layer::paged::PagedCache;
use crate::layer::query_scale::QueryScale;
use crate::layer::rope::{Rope, RopeAngles, RopePositions, RopeRows};
use crate::layer::tokens::{Output, Tokens};

/// The widths of one MLA layer (`config.json`'s names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaShape {
    /// Model width `D` (`hidden_size`).
    pub d_model: usize,
    /// Query heads `H` (`num_attention_heads`).
    pub n_heads: usize,
    /// The query latent's width (`q_lora_rank`), or `None` for one `q_proj` (DeepSeek-V2-Lite).
    pub q_lora_rank: Option<usize>,
    /// The key/value latent's width `r` (`kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// The query and key features without rotation, per head, `n` (`qk_nope_head_dim`).
    pub qk_nope_head_dim: usize,
    /// The rotated query features per head and the shared rotated key's width `p`
    /// (`qk_rope_head_dim`, even).
    pub qk_rope_head_dim: usize,
    /// The value width per head `v` (`v_head_dim`).
    pub v_head_dim: usize,
}

impl MlaShape {
    /// The softmax scale `(n + p)^-½`, times `mscale²` for YaRN with `mscale_all_dim`:
    /// `mscale = 0.1 · mscale_all_dim · ln(factor) + 1` when `factor > 1` and `mscale_all_dim`
    /// is nonzero (`yarn` is `Some((factor, mscale_all_dim))`), as `transformers` scales
    /// DeepSeek-V2/V3's scores; computed in `f64`, rounded once.
    ///
    /// ```
    /// use mha::MlaShape;
    /// let shape = MlaShape { d_model: 64, n_heads: 4, q_lora_rank: Some(24), kv_lora_rank: 24,
    ///     qk_nope_head_dim: 16, qk_rope_head_dim: 8, v_head_dim: 12 };
    /// assert_eq!(shape.softmax_scale(None), (24f64.powf(-0.5)) as f32);
    /// let m = 0.1 * 0.8 * 4f64.ln() + 1.0;
    /// assert_eq!(shape.softmax_scale(Some((4.0, 0.8))), (24f64.powf(-0.5) * m * m) as f32);
    /// ```
    pub fn softmax_scale(&self, yarn: Option<(f64, f64)>) -> f32 {
        let head = (self.qk_nope_head_dim + self.qk_rope_head_dim) as f64;
        let mscale = match yarn {
            Some((factor, all)) if factor > 1.0 && all != 0.0 => 0.1 * all * ln(factor) + 1.0,
            _ => 1.0,
        };
        (mscale * mscale / sqrt(head)) as f32
    }

    /// The width `p + r` of a latent row, of an absorbed query head and of the cache's one head
    /// (saturating: exact for the widths [`check`](Self::check) accepts).
    pub fn latent_width(&self) -> usize {
        self.qk_rope_head_dim.saturating_add(self.kv_lora_rank)
    }

    /// The query width per head as projected, `n + p` (saturating, as `latent_width`).
    pub(crate) fn q_head(&self) -> usize {
        self.qk_nope_head_dim.saturating_add(self.qk_rope_head_dim)
    }

    /// Checks that the widths make a layer whose every weight and row has a size that fits in
    /// `usize`, so that the layer's arithmetic on them cannot overflow.
    ///
    /// ```
    /// use mha::{MlaShape, ShapeError};
    /// let shape = MlaShape { d_model: 64, n_heads: 4, q_lora_rank: None, kv_lora_rank: 24,
    ///     qk_nope_head_dim: 16, qk_rope_head_dim: 8, v_head_dim: 12 };
    /// assert_eq!(shape.check(), Ok(()));
    /// assert_eq!(MlaShape { n_heads: 0, ..shape }.check(), Err(ShapeError::ZeroHeads));
    /// assert_eq!(MlaShape { v_head_dim: usize::MAX, ..shape }.check(), Err(ShapeError::TooLarge));
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::ZeroHeads`] for no heads, [`ShapeError::TooLarge`] when a width or size
    /// overflows.
    pub fn check(&self) -> Result<(), ShapeError> {
        let (d, h, r, v) = (
            self.d_model,
            self.n_heads,
            self.kv_lora_rank,
            self.v_head_dim,
        );
        if h == 0 {
            return Err(ShapeError::ZeroHeads);
        }
        let sum = |a: usize, b: usize| a.checked_add(b).ok_or(ShapeError::TooLarge);
        let latent = sum(self.qk_rope_head_dim, r)?;
        let q_width = element_count(&[h, sum(self.qk_nope_head_dim, self.qk_rope_head_dim)?])?;
        let first = sum(self.q_lora_rank.unwrap_or(q_width), latent)?;
        element_count(&[h, sum(self.qk_nope_head_dim, v)?, r])?;
        element_count(&[h, latent])?;
        element_count(&[d, first])?;
        element_count(&[d, h, v])?;
        element_count(&[self.q_lora_rank.unwrap_or(0), q_width]).map(drop)
    }
}

/// The weights of one MLA layer as a checkpoint stores them: every matrix `(out, in)`
/// row-major (PyTorch's `nn.Linear.weight`), every norm weight one value per feature.
#[derive(Clone, Copy, Debug)]
pub struct MlaWeights<'a> {
    /// The widths.
    pub shape: MlaShape,
    /// `q_a_proj (q_lora_rank, D)` and `q_a_layernorm (q_lora_rank)`; `None` without a query
    /// LoRA.
    pub q_a: Option<(&'a [f32], &'a [f32])>,
    /// `q_b_proj (H · (n + p), q_lora_rank)`, or `q_proj (H · (n + p), D)` without a query LoRA;
    /// each head's rows `[nope | rope]`.
    pub q_b: &'a [f32],
    /// `kv_a_proj_with_mqa (r + p, D)`: rows `[c | k_rope]`.
    pub kv_a: &'a [f32],
    /// `kv_a_layernorm (r)`.
    pub kv_a_norm: &'a [f32],
    /// `kv_b_proj (H · (n + v), r)`: each head's rows `[k_nope (n) | v (v)]`.
    pub kv_b: &'a [f32],
    /// `o_proj (D, H · v)`.
    pub o: &'a [f32],
}

/// An MLA layer's weights packed for the kernels (see the module doc for the column orders).
#[derive(Debug)]
struct MlaPacked {
    /// `[q_a_projᵀ | kv_a_proj_with_mqaᵀ]` (`D`, `q_lora_rank + p + r`), or `[q_projᵀ | ...]`.
    first: PackedB,
    /// `q_b_projᵀ (q_lora_rank, H · (p + n))`, with a query LoRA.
    q_b: Option<PackedB>,
    /// `q_a_layernorm` and `kv_a_layernorm`.
    q_norm: Vec<f32>,
    kv_norm: Vec<f32>,
    /// Per head `W_UK_h (n, r)`.
    uk: Vec<PackedB>,
    /// Per head `W_UV_hᵀ (r, v)`.
    uv: Vec<PackedB>,
    /// `o_projᵀ (H · v, D)`.
    o: PackedB,
}

/// A call's names for the buffers of its [`Workspace`] (the layer's own or its shared pool's),
/// kept between calls; they only grow.
struct MlaBuffers<'w> {
    /// The query latent `(rows, q_lora_rank)`, or the queries without a query LoRA.
    first: &'w mut Vec<f32>,
    /// The latent rows `(rows, p + r)`.
    latent: &'w mut Vec<f32>,
    /// The queries `(rows, H, p + n)`.
    q: &'w mut Vec<f32>,
    /// The absorbed queries `(rows, H, p + r)`.
    absorbed: &'w mut Vec<f32>,
    /// The attention's output `(rows, H, r)`.
    merged: &'w mut Vec<f32>,
    /// One head's GEMM output `(rows, max(r, v))`.
    head: &'w mut Vec<f32>,
    /// The heads' outputs `(rows, H · v)`.
    heads: &'w mut Vec<f32>,
    /// The latent rows of a forward pass.
    store: &'w mut KvStore,
    gemm: &'w mut Vec<GemmScratch>,
    flash: &'w mut Vec<FlashScratch>,
}

impl<'w> MlaBuffers<'w> {
    /// The buffers of `workspace` under an MLA call's names.
    fn new(workspace: &'w mut Workspace) -> MlaBuffers<'w> {
        let Workspace {
            floats: [first, latent, q, absorbed, merged, head, heads],
            counts: _,
            store,
            gemm,
            flash,
        } = workspace;
        MlaBuffers {
            first,
            latent,
            q,
            absorbed,
            merged,
            head,
            heads,
            store,
            gemm,
            flash,
        }
    }
}

/// One call's view of an [`MlaLayer`]: its settings, the buffers of its scratch (a shared
/// pool's, held for the whole call) and its threads.
struct MlaPass<'c> {
    shape: MlaShape,
    packed: &'c MlaPacked,
    angles: &'c RopeAngles,
    scale: f32,
    query_scale: Option<QueryScale>,
    eps: f32,
    threads: usize,
    ws: MlaBuffers<'c>,
    pool: &'c mut Pool,
}

/// A multi-head latent attention layer (DeepSeek-V2/V3, Kimi K2): causal self-attention whose
/// keys and values are one latent row per token, run with absorbed weights.
///
/// Per token: the latent row `[k_rope | c]` (`p + r` values: `kv_a_proj_with_mqa`, RMSNorm on
/// `c`, RoPE on `k_rope`) is appended to the cache; each head's query absorbs `kv_b_proj`'s key
/// half, `[q_rope_h | q_nope_h · W_UK_h]`, and the `H` heads attend over the latent rows as one
/// multi-query attention of head width `p + r` (the crate's kernels, cache formats and threads);
/// head `h`'s `(p · c)_h` goes through `kv_b_proj`'s value half, `W_UV_hᵀ`, and the heads through
/// `o_proj`. Prefill and decode run these steps in this order, so decoding gives the forward's
/// bits. The cache keeps the latent row once ([`KvCache::bytes`]: `p + r` values per token),
/// the attention reading the values `c` out of it.
///
/// ```
/// use mha::{KvFormat, MlaLayer, MlaShape, MlaWeights, Output, Rope, RopeLayout, RopeScaling, Tokens};
/// let shape = MlaShape { d_model: 8, n_heads: 2, q_lora_rank: Some(4), kv_lora_rank: 6,
///     qk_nope_head_dim: 2, qk_rope_head_dim: 2, v_head_dim: 3 };
/// let w = |n: usize| (0..n).map(|i| (i % 5) as f32 * 0.1 - 0.2).collect::<Vec<f32>>();
/// let (qa, qb, kva, kvb, o) = (w(4 * 8), w(2 * 4 * 4), w(8 * 8), w(2 * 5 * 6), w(8 * 6));
/// let (qn, kvn) = (vec![1.0; 4], vec![1.0; 6]);
/// let weights = MlaWeights { shape, q_a: Some((&qa, &qn)), q_b: &qb, kv_a: &kva,
///     kv_a_norm: &kvn, kv_b: &kvb, o: &o };
/// let rope = Rope { theta: 10_000.0, rotary_dim: 2, layout: RopeLayout::Interleaved,
///     scaling: RopeScaling::Default };
/// let mut layer = MlaLayer::builder(weights, rope).threads(1).build()?;
/// let x: Vec<f32> = (0..3 * 8).map(|i| (i % 7) as f32 * 0.1).collect();
/// let y = layer.forward(Tokens::new(&x, 1, 3, 8)?)?;
/// // Token by token through the latent cache: the same bits.
/// let mut cache = layer.new_cache(1, 3)?;
/// for t in 0..3 {
///     let mut out = [0.0; 8];
///     let token = Tokens::new(&x[t * 8..][..8], 1, 1, 8)?;
///     layer.decode_into(token, &mut cache, Output::new(&mut out, 1, 1, 8)?)?;
///     assert_eq!(out[..], y[t * 8..][..8]);
/// }
/// // One latent row of p + r = 8 floats per token, stored once (in whole blocks of 96 tokens).
/// assert_eq!(layer.shape().latent_width(), 8);
/// assert_eq!(cache.bytes(), 96 * 8 * 4);
/// # Ok::<(), mha::ShapeError>(())
/// ```
#[derive(Debug)]
pub struct MlaLayer {
    shape: MlaShape,
    packed: MlaPacked,
    angles: RopeAngles,
    scale: f32,
    query_scale: Option<QueryScale>,
    eps: f32,
    threads: usize,
    formats: KvFormats,
    /// The scratch of its calls: its own, or the shared [`ThreadPool`](crate::ThreadPool)'s.
    scratch: Scratch,
    /// Its own workers, or a shared [`ThreadPool`](crate::ThreadPool)'s.
    pool: Pool,
}

/// Builds an [`MlaLayer`] ([`MlaLayer::builder`]).
#[derive(Debug)]
pub struct MlaBuilder<'a> {
    weights: MlaWeights<'a>,
    rope: Rope,
    scale: Option<f32>,
    query_scale: Option<QueryScale>,
    eps: f32,
    threads: usize,
    kv_format: KvFormat,
    isa: Isa,
    pool: Pool,
    scratch: Scratch,
}

impl MlaLayer {
    /// Starts building a layer over `weights` whose rotary embedding is `rope` (its
    /// `rotary_dim` must be `qk_rope_head_dim`; DeepSeek-V3 uses [`RopeLayout::Interleaved`]).
    ///
    /// [`RopeLayout::Interleaved`]: crate::RopeLayout::Interleaved
    pub fn builder(weights: MlaWeights<'_>, rope: Rope) -> MlaBuilder<'_> {
        MlaBuilder {
            weights,
            rope,
            scale: None,
            query_scale: None,
            eps: 1e-6,
            threads: 1,
            kv_format: KvFormat::F32,
            isa: Isa::detect(),
            pool: Pool::default(),
            scratch: Scratch::default(),
        }
    }

    /// The widths.
    pub fn shape(&self) -> MlaShape {
        self.shape
    }

    /// The softmax scale.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The position-dependent query scale ([`MlaBuilder::query_scale`]), if any.
    pub fn query_scale(&self) -> Option<QueryScale> {
        self.query_scale
    }

    /// The thread count.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The rotary embedding of the `p` rotated features.
    pub fn rope(&self) -> &RopeAngles {
        &self.angles
    }

    /// The format the latent cache keeps its rows in ([`MlaBuilder::kv_format`]).
    pub fn kv_format(&self) -> KvFormat {
        self.formats.keys
    }
}

impl<'a> MlaBuilder<'a> {
    /// The softmax scale (default [`MlaShape::softmax_scale`] without YaRN, `(n + p)^-½`).
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// A position-dependent query scale (Mistral 4's `llama_4_scaling_beta`; default none):
    /// every absorbed query head of a token is multiplied by `scale.factor(position)` after
    /// RoPE, the token's position being its index in its sequence (both [`ScalePosition`]s
    /// read it: these calls take no explicit positions). The queries are linear in it, so this
    /// is `transformers`' scaling of `[q_nope | q_rope]` before the keys are formed.
    ///
    /// [`ScalePosition`]: crate::ScalePosition
    pub fn query_scale(mut self, scale: QueryScale) -> Self {
        self.query_scale = Some(scale);
        self
    }

    /// The `eps` of both RMSNorms (`rms_norm_eps`; default `1e-6`).
    pub fn eps(mut self, eps: f32) -> Self {
        self.eps = eps;
        self
    }

    /// The thread count (default 1; 0 means every CPU the process may use).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Runs the layer's calls on `pool`'s threads and with its scratch, shared with every
    /// other layer built with it (a `Layer` or an `MlaLayer`), instead of threads and scratch
    /// of the layer's own; the thread count becomes the pool's ([`ThreadPool::threads`]).
    /// Results are bit-identical either way.
    ///
    #[cfg(feature = "std")]
    pub fn thread_pool(mut self, pool: &ThreadPool) -> Self {
        self.threads = pool.threads();
        self.pool = pool.pool();
        self.scratch = pool.scratch();
        self
    }

    /// The format of the latent cache's rows (keys and values alike; default `f32`).
    pub fn kv_format(mut self, format: KvFormat) -> Self {
        self.kv_format = format;
        self
    }

    /// The instruction set of the kernels (default [`Isa::detect`]).
    pub fn isa(mut self, isa: Isa) -> Self {
        self.isa = isa;
        self
    }

    /// Checks the widths, the weights' lengths and the settings, and packs the weights.
    ///
    /// # Errors
    /// What [`MlaShape::check`] rejects, [`ShapeError::RotaryDim`] when the rope's
    /// `rotary_dim` is not `qk_rope_head_dim` (or odd), [`ShapeError::LengthMismatch`] naming a
    /// weight of the wrong length and both lengths, [`ShapeError::Setting`] for a scale or `eps`
    /// that is not finite (or negative), or a query scale whose `beta` or `period` is not
    /// finite (or whose factor is not, at some position), what [`RopeAngles::new`] rejects,
    /// [`ShapeError::UnsupportedIsa`] when the CPU cannot run the instruction set.
    pub fn build(self) -> Result<MlaLayer, ShapeError> {
        let shape = self.weights.shape;
        shape.check()?;
        let p = shape.qk_rope_head_dim;
        if self.rope.rotary_dim != p {
            return Err(ShapeError::RotaryDim {
                rotary_dim: self.rope.rotary_dim,
                head_dim: p,
            });
        }
        let angles = RopeAngles::new(self.rope, shape.latent_width())?;
        let scale = self.scale.unwrap_or_else(|| shape.softmax_scale(None));
        setting("MLA softmax scale", scale, scale.is_finite(), "finite")?;
        let eps_ok = self.eps.is_finite() && self.eps >= 0.0;
        setting("MLA rms_norm_eps", self.eps, eps_ok, "finite and >= 0")?;
        if let Some(query_scale) = &self.query_scale {
            query_scale.check()?;
        }
        Ok(MlaLayer {
            shape,
            packed: MlaPacked::new(self.isa, &self.weights)?,
            angles,
            scale,
            query_scale: self.query_scale,
            eps: self.eps,
            threads: thread_count(self.threads),
            formats: KvFormats {
                keys: self.kv_format,
                values: self.kv_format,
            },
            scratch: self.scratch,
            pool: self.pool,
        })
    }
}

/// [`ShapeError::Setting`] naming `what`, `value` and `expected` unless `ok`.
fn setting(
    what: &'static str,
    value: f32,
    ok: bool,
    expected: &'static str,
) -> Result<(), ShapeError> {
    if ok {
        return Ok(());
    }
    Err(ShapeError::Setting {
        what,
        value: alloc::format!("{value:?}"),
        expected,
    })
}

/// Checks that `w` holds `(rows, cols)`.
fn check_len(what: &'static str, w: &[f32], rows: usize, cols: usize) -> Result<(), ShapeError> {
    let expected = element_count(&[rows, cols])?;
    if w.len() != expected {
        return Err(ShapeError::LengthMismatch {
            what,
            expected,
            actual: w.len(),
        });
    }
    Ok(())
}

/// `(in, out)` row-major from the `(out, in)` rows `w` (of `cols` inputs): column `j` of the
/// result is row `row_of(j)` of `w`, for `j < outs`.
fn transposed(w: &[f32], cols: usize, outs: usize, row_of: impl Fn(usize) -> usize) -> Vec<f32> {
    let mut t = alloc::vec![0.0; cols * outs];
    for j in 0..outs {
        let row = &w[row_of(j) * cols..][..cols];
        for (i, &value) in row.iter().enumerate() {
            t[i * outs + j] = value;
        }
    }
    t
}

/// The query row of output column `j` of a head laid out `[rope (p) | nope (n)]`, from the
/// stored `[nope | rope]`.
fn rope_first(j: usize, first: usize, second: usize) -> usize {
    let (head, k) = (j / (first + second), j % (first + second));
    let within = if k < first { second + k } else { k - first };
    head * (first + second) + within
}

impl MlaPacked {
    /// Checks every weight's length against `weights.shape` and packs them (see the fields).
    fn new(isa: Isa, weights: &MlaWeights<'_>) -> Result<Self, ShapeError> {
        let s = weights.shape;
        let (d, h, p, r) = (s.d_model, s.n_heads, s.qk_rope_head_dim, s.kv_lora_rank);
        let (n, v, qh) = (s.qk_nope_head_dim, s.v_head_dim, s.q_head());
        let q_width = element_count(&[h, qh])?;
        check_len("kv_a_proj_with_mqa (r + p, D)", weights.kv_a, r + p, d)?;
        check_len("kv_a_layernorm (r)", weights.kv_a_norm, 1, r)?;
        check_len("kv_b_proj (H (n + v), r)", weights.kv_b, h * (n + v), r)?;
        check_len("o_proj (D, H v)", weights.o, d, h * v)?;
        let (first_rows, q_norm) = match (s.q_lora_rank, weights.q_a) {
            (Some(rank), Some((q_a, norm))) => {
                check_len("q_a_proj (q_lora_rank, D)", q_a, rank, d)?;
                check_len("q_a_layernorm (q_lora_rank)", norm, 1, rank)?;
                check_len(
                    "q_b_proj (H (n + p), q_lora_rank)",
                    weights.q_b,
                    q_width,
                    rank,
                )?;
                (transposed(q_a, d, rank, |j| j), norm.to_vec())
            }
            (None, None) => {
                check_len("q_proj (H (n + p), D)", weights.q_b, q_width, d)?;
                let q = transposed(weights.q_b, d, q_width, |j| rope_first(j, p, n));
                (q, Vec::new())
            }
            (rank, _) => {
                return Err(ShapeError::Setting {
                    what: "q_lora_rank and q_a_proj / q_a_layernorm",
                    value: alloc::format!("q_lora_rank {rank:?} without q_a weights"),
                    expected: "q_a weights exactly when q_lora_rank is set",
                })
            }
        };
        let first_width = s.q_lora_rank.unwrap_or(q_width);
        let kv_a = transposed(weights.kv_a, d, p + r, |j| rope_first(j, p, r));
        let first = concat_columns(d, [(&first_rows, first_width), (&kv_a, p + r)]);
        let q_b = match s.q_lora_rank {
            Some(rank) => {
                let q_b = transposed(weights.q_b, rank, q_width, |j| rope_first(j, p, n));
                Some(PackedB::from_row_major(isa, &q_b, rank, q_width)?)
            }
            None => None,
        };
        let kv_b = |head: usize| &weights.kv_b[head * (n + v) * r..][..(n + v) * r];
        let uk = (0..h)
            .map(|head| PackedB::from_row_major(isa, &kv_b(head)[..n * r], n, r))
            .collect::<Result<Vec<_>, _>>()?;
        let uv = (0..h)
            .map(|head| {
                PackedB::from_row_major(isa, &transposed(&kv_b(head)[n * r..], r, v, |j| j), r, v)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MlaPacked {
            first: PackedB::from_row_major(isa, &first, d, first_width + p + r)?,
            q_b,
            q_norm,
            kv_norm: weights.kv_a_norm.to_vec(),
            uk,
            uv,
            o: PackedB::from_row_major(isa, &transposed(weights.o, h * v, d, |j| j), h * v, d)?,
        })
    }
}

/// The first `count` rows of the row-major `buffer` of rows `width` wide (empty rows for a
/// width of 0). Mutable rows are `chunks_exact_mut(width.max(1))`: a width of 0 has nothing to
/// write.
fn row_slices(buffer: &[f32], width: usize, count: usize) -> impl Iterator<Item = &[f32]> {
    (0..count).map(move |i| &buffer[i * width..][..width])
}

/// The `(rows, a + b)` row-major matrix `[A | B]` of `(rows, a)` and `(rows, b)` ones.
fn concat_columns(rows: usize, parts: [(&[f32], usize); 2]) -> Vec<f32> {
    let width = parts[0].1 + parts[1].1;
    let mut out = Vec::with_capacity(rows * width);
    for i in 0..rows {
        for (m, w) in parts {
            out.extend_from_slice(&m[i * w..][..w]);
        }
    }
    out
}

/// The calls.
impl MlaLayer {
    /// Causal self-attention on `x (B, T, D)`, returning `(B, T, D)` in a new buffer.
    ///
    /// # Errors
    /// As [`forward_into`](Self::forward_into); [`ShapeError::AllocationFailed`] when the
    /// output cannot be allocated.
    pub fn forward<'a>(&mut self, x: impl Into<Tokens<'a>>) -> Result<Vec<f32>, ShapeError> {
        let x = x.into();
        let d = self.shape.d_model;
        let len = element_count(&[x.batch(), x.len(), d])?;
        let mut y = try_filled("output (B, T, D)", len, 0.0)?;
        self.forward_into(x, Output::new(&mut y, x.batch(), x.len(), d)?)?;
        Ok(y)
    }

    /// Causal self-attention on `x (B, T, D)`, writing `(B, T, D)` into `out`; the latent rows
    /// go to a transient store, so this is a decoding step into an empty cache.
    ///
    /// # Errors
    /// [`ShapeError::DimensionMismatch`] when `x` or `out` is not `D` wide or they differ in
    /// batch or length, [`ShapeError::RopePosition`] for a position past
    /// [`RopeAngles::max_position`], [`ShapeError::Overflow`] or
    /// [`ShapeError::AllocationFailed`] when the call's buffers cannot be had.
    pub fn forward_into<'a>(
        &mut self,
        x: impl Into<Tokens<'a>>,
        out: impl Into<Output<'a>>,
    ) -> Result<(), ShapeError> {
        let x = x.into();
        let shape = self.store_shape(x.batch(), x.len());
        self.with_pass(|pass| pass.forward(x, shape, out.into()))
    }

    /// An empty latent cache for `batch` sequences of up to `capacity` tokens: one key/value
    /// head of width `p + r` ([`MlaShape::latent_width`]) in the layer's
    /// [`kv_format`](Self::kv_format).
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when its size does not fit in memory,
    /// [`ShapeError::AllocationFailed`] when it cannot be allocated.
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache, ShapeError> {
        Ok(KvCache {
            store: KvStore::new(self.store_shape(batch, capacity))?,
        })
    }

    /// One decoding step: appends the latent rows of `x (B, L, D)` to `cache` and attends over
    /// everything cached (new query `i` sees cached key `j` iff `j <= i + cached`), writing
    /// `(B, L, D)` into `out`; the bits of one forward over the whole sequence.
    ///
    /// # Errors
    /// [`ShapeError::CacheMismatch`] for a cache made by a layer of another latent width,
    /// rotary width or format, or by a [`Layer`](crate::Layer);
    /// [`ShapeError::CacheFull`] when the tokens do not fit (the cache is unchanged);
    /// otherwise as [`forward_into`](Self::forward_into), also for a cache of another batch.
    pub fn decode_into<'a>(
        &mut self,
        x: impl Into<Tokens<'a>>,
        cache: &mut KvCache,
        out: impl Into<Output<'a>>,
    ) -> Result<(), ShapeError> {
        self.check_cache(cache.store.view())?;
        self.run(x.into(), &mut cache.store, out.into())
    }

    /// An empty paged latent cache: a pool of `blocks` blocks of
    /// [`PagedCache::BLOCK`] latent rows (each row once, in the layer's
    /// [`kv_format`](Self::kv_format)), its memory reserved now, and no sequence; sequences
    /// are added, forked, truncated and removed as for any [`PagedCache`].
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when the pool's size does not fit in memory,
    /// [`ShapeError::AllocationFailed`] when it cannot be allocated.
    pub fn new_paged_cache(&self, blocks: usize) -> Result<PagedCache, ShapeError> {
        Ok(PagedCache {
            store: PagedStore::new(self.block_layout(), blocks)?,
        })
    }

    /// One decoding step of the sequences `sequences` of `cache`: row `b` of `x (B, L, D)`
    /// holds new tokens of sequence `sequences[b]`, appended at that sequence's length; each
    /// sequence's outputs are the bits of decoding it alone through a [`KvCache`]
    /// ([`decode_into`](Self::decode_into)), whatever else the batch holds.
    ///
    /// # Errors
    /// [`ShapeError::CacheMismatch`] for a cache made by a layer of another latent layout or
    /// format, or by a [`Layer`](crate::Layer); [`ShapeError::SequenceId`] or
    /// [`ShapeError::RepeatedSequence`] for bad `sequences`; [`ShapeError::PoolFull`] when the
    /// new tokens need more blocks than are free (the cache is unchanged); otherwise as
    /// [`forward_into`](Self::forward_into).
    pub fn decode_paged<'a>(
        &mut self,
        x: impl Into<Tokens<'a>>,
        cache: &mut PagedCache,
        sequences: &[usize],
        out: impl Into<Output<'a>>,
    ) -> Result<(), ShapeError> {
        self.check_cache(cache.store.view())?;
        cache.store.select(sequences)?;
        self.run(x.into(), &mut cache.store, out.into())
    }

    /// What one block of 96 tokens of this layer's latent cache holds: one head of `p + r`
    /// keys in the layer's format, whose values are their last `r` features.
    fn block_layout(&self) -> BlockLayout {
        BlockLayout {
            n_kv_heads: 1,
            head_dim: self.shape.latent_width(),
            formats: self.formats,
            window: None,
            values: ValueLayout::InKeys {
                from: self.shape.qk_rope_head_dim,
            },
        }
    }

    /// A cache fits when this layer's [`block_layout`](Self::block_layout) made it.
    fn check_cache(&self, cache: KvView<'_>) -> Result<(), ShapeError> {
        let layout = self.block_layout();
        if cache.n_kv_heads != layout.n_kv_heads
            || cache.head_dim != layout.head_dim
            || cache.formats != layout.formats
            || cache.values != layout.values
            || cache.window.is_some()
        {
            return Err(ShapeError::CacheMismatch);
        }
        Ok(())
    }

    /// The store of `batch` sequences of `capacity` latent rows.
    fn store_shape(&self, batch: usize, capacity: usize) -> StoreShape {
        StoreShape {
            capacity,
            ..StoreShape::of_blocks(&self.block_layout(), batch)
        }
    }

    /// Runs the steps of the module doc with `store` (see [`MlaPass::run`]).
    fn run(
        &mut self,
        x: Tokens<'_>,
        store: &mut dyn Store,
        out: Output<'_>,
    ) -> Result<(), ShapeError> {
        self.with_pass(|pass| pass.run(x, store, out))
    }

    /// Runs `f` on a call's view of the layer: its settings, scratch (a shared pool's held
    /// for the whole call) and workers.
    fn with_pass<R>(&mut self, f: impl FnOnce(&mut MlaPass<'_>) -> R) -> R {
        let (shape, packed, angles) = (self.shape, &self.packed, &self.angles);
        let (scale, eps, threads, pool) = (self.scale, self.eps, self.threads, &mut self.pool);
        let query_scale = self.query_scale;
        self.scratch.with(|workspace| {
            f(&mut MlaPass {
                shape,
                packed,
                angles,
                scale,
                query_scale,
                eps,
                threads,
                ws: MlaBuffers::new(workspace),
                pool,
            })
        })
    }

    /// The bytes of the scratch the layer's calls use that grow with a call's tokens: the
    /// layer's own, or, for a layer built with a [`ThreadPool`](crate::ThreadPool), the
    /// pool's (as [`Layer::scratch_bytes`](crate::Layer::scratch_bytes)).
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.bytes()
    }

    /// Frees the scratch the layer's calls use (a shared pool's, for a layer built with a
    /// [`ThreadPool`](crate::ThreadPool)); the next call grows it again. Results are
    /// unchanged.
    ///
    /// ```
    /// use mha::{MlaLayer, MlaShape, MlaWeights, Rope, RopeLayout, RopeScaling, Tokens};
    /// let shape = MlaShape { d_model: 8, n_heads: 2, q_lora_rank: None, kv_lora_rank: 6,
    ///     qk_nope_head_dim: 2, qk_rope_head_dim: 2, v_head_dim: 3 };
    /// let w = |n: usize| (0..n).map(|i| (i % 5) as f32 * 0.1 - 0.2).collect::<Vec<f32>>();
    /// let (q, kva, kvb, o, kvn) = (w(2 * 4 * 8), w(8 * 8), w(2 * 5 * 6), w(8 * 6), vec![1.0; 6]);
    /// let weights = MlaWeights { shape, q_a: None, q_b: &q, kv_a: &kva, kv_a_norm: &kvn,
    ///     kv_b: &kvb, o: &o };
    /// let rope = Rope { theta: 10_000.0, rotary_dim: 2, layout: RopeLayout::Interleaved,
    ///     scaling: RopeScaling::Default };
    /// let mut layer = MlaLayer::builder(weights, rope).build()?;
    /// let x: Vec<f32> = (0..50 * 8).map(|i| (i % 7) as f32 * 0.1).collect();
    /// let y = layer.forward(Tokens::new(&x, 1, 50, 8)?)?;
    /// assert!(layer.scratch_bytes() > 0);
    /// layer.release_scratch();
    /// assert_eq!(layer.scratch_bytes(), 0);
    /// assert_eq!(layer.forward(Tokens::new(&x, 1, 50, 8)?)?, y);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn release_scratch(&mut self) {
        self.scratch.release();
    }
}

/// The steps of a call.
impl MlaPass<'_> {
    /// A forward pass: the latent rows into the workspace's transient store, reset to
    /// `shape` (empty).
    fn forward(
        &mut self,
        x: Tokens<'_>,
        shape: StoreShape,
        out: Output<'_>,
    ) -> Result<(), ShapeError> {
        let mut store = core::mem::take(self.ws.store);
        let done = store
            .reset(shape)
            .and_then(|()| self.run(x, &mut store, out));
        *self.ws.store = store;
        done
    }

    /// Checks `x`, `out` and the room in `store`, then runs the steps of the module doc.
    fn run(
        &mut self,
        x: Tokens<'_>,
        store: &mut dyn Store,
        mut out: Output<'_>,
    ) -> Result<(), ShapeError> {
        if x.lengths().is_some() || out.lengths().is_some() {
            return Err(ShapeError::Ragged {
                what: "with an MlaLayer",
            });
        }
        let d = self.shape.d_model;
        check_dimension("token width (D)", d, x.width())?;
        check_dimension("output width (D)", d, out.width())?;
        check_dimension("output batch (B)", x.batch(), out.batch())?;
        check_dimension("output length (T)", x.len(), out.len())?;
        check_dimension("KV cache batch (B)", x.batch(), store.view().lengths.len())?;
        let new = NewTokens {
            rows: x.len(),
            lengths: None,
            starts: None,
        };
        store.check_room(new)?;
        let rows = element_count(&[x.batch(), x.len()])?;
        self.reserve(rows)?;
        self.project(x.as_slice(), rows);
        self.absorb(rows);
        let positions = RopePositions::PerSequence {
            starts: store.view().lengths,
            len: x.len(),
        };
        self.rotate(rows, positions)?;
        self.scale_queries(rows, positions);
        let done = self.attend(x.batch(), x.len(), store, new);
        if done.is_ok() {
            self.output(rows, out.parts().0);
        }
        self.pool.rest();
        done
    }

    /// Grows the buffers for `rows` tokens and the scratch for the threads.
    fn reserve(&mut self, rows: usize) -> Result<(), ShapeError> {
        let s = self.shape;
        let (h, pr) = (s.n_heads, s.latent_width());
        let first = s.q_lora_rank.unwrap_or(h * s.q_head());
        let ws = &mut self.ws;
        let size = |width: usize| element_count(&[rows, width]);
        try_grow(ws.first, size(first)?, 0.0, "MLA query latents")?;
        try_grow(ws.latent, size(pr)?, 0.0, "MLA latent rows")?;
        try_grow(ws.q, size(h * s.q_head())?, 0.0, "MLA queries")?;
        try_grow(ws.absorbed, size(h * pr)?, 0.0, "MLA absorbed queries")?;
        try_grow(
            ws.merged,
            size(h * s.kv_lora_rank)?,
            0.0,
            "MLA attention output",
        )?;
        let widest = s.kv_lora_rank.max(s.v_head_dim);
        try_grow(ws.head, size(widest)?, 0.0, "MLA head output")?;
        try_grow(ws.heads, size(h * s.v_head_dim)?, 0.0, "MLA heads")?;
        // A shared workspace may hold more threads' scratch: the calls take their first ones.
        let threads = self.threads.max(ws.gemm.len());
        ws.gemm.resize_with(threads, GemmScratch::default);
        ws.flash.resize_with(threads, FlashScratch::default);
        Ok(())
    }

    /// Step 1: the query latents (normalised) and queries, and the latent rows (`c`
    /// normalised).
    fn project(&mut self, x: &[f32], rows: usize) {
        let s = self.shape;
        let (d, pr, q_width) = (s.d_model, s.latent_width(), s.n_heads * s.q_head());
        let (packed, ws, pool) = (&self.packed, &mut self.ws, &mut self.pool);
        let first_width = s.q_lora_rank.unwrap_or(q_width);
        let segments = [
            Segment::new(&mut ws.first[..rows * first_width], first_width),
            Segment::new(&mut ws.latent[..rows * pr], pr),
        ];
        gemm::gemm_with(
            x,
            d,
            rows,
            &packed.first,
            0,
            segments,
            &mut ws.gemm[..self.threads],
            pool,
        );
        for row in ws.latent[..rows * pr].chunks_exact_mut(pr.max(1)) {
            rms_norm(&mut row[s.qk_rope_head_dim..], &packed.kv_norm, self.eps);
        }
        let q = &mut ws.q[..rows * q_width];
        match (&packed.q_b, s.q_lora_rank) {
            (Some(q_b), Some(rank)) => {
                let latents = &mut ws.first[..rows * rank];
                rms_norm(latents, &packed.q_norm, self.eps);
                let segment = [Segment::new(q, q_width)];
                gemm::gemm_with(
                    latents,
                    rank,
                    rows,
                    q_b,
                    0,
                    segment,
                    &mut ws.gemm[..self.threads],
                    pool,
                );
            }
            _ => q.copy_from_slice(&ws.first[..rows * q_width]),
        }
    }

    /// Step 2: the absorbed queries `[q_rope_h | q_nope_h · W_UK_h]`, head by head.
    fn absorb(&mut self, rows: usize) {
        let s = self.shape;
        let (h, p, r, qh, pr) = (
            s.n_heads,
            s.qk_rope_head_dim,
            s.kv_lora_rank,
            s.q_head(),
            s.latent_width(),
        );
        let (ws, pool) = (&mut self.ws, &mut self.pool);
        for (head, uk) in self.packed.uk.iter().enumerate() {
            let q = &ws.q[head * qh..];
            let out = [Segment::new(&mut ws.head[..rows * r], r)];
            gemm::gemm_with(
                &q[p..],
                h * qh,
                rows,
                uk,
                0,
                out,
                &mut ws.gemm[..self.threads],
                pool,
            );
            let absorbed = ws.absorbed[..rows * h * pr].chunks_exact_mut((h * pr).max(1));
            let sources = row_slices(ws.q, h * qh, rows).zip(row_slices(ws.head, r, rows));
            for (row, (q, nope)) in absorbed.zip(sources) {
                let target = &mut row[head * pr..][..pr];
                target[..p].copy_from_slice(&q[head * qh..][..p]);
                target[p..].copy_from_slice(nope);
            }
        }
    }

    /// Step 2, RoPE: the first `p` features of every absorbed query head and latent row.
    fn rotate(&mut self, rows: usize, positions: RopePositions<'_>) -> Result<(), ShapeError> {
        let (h, pr) = (self.shape.n_heads, self.shape.latent_width());
        let ws = &mut self.ws;
        let queries = RopeRows {
            rows,
            heads: h,
            row_stride: h * pr,
        };
        let keys = RopeRows {
            rows,
            heads: 1,
            row_stride: pr,
        };
        self.angles.check(rows * h * pr, queries, positions)?;
        self.angles
            .rotate(&mut ws.latent[..rows * pr], keys, positions)?;
        self.angles
            .rotate(&mut ws.absorbed[..rows * h * pr], queries, positions)
    }

    /// Step 2, the query scale (if any): every absorbed query row `(H, p + r)` times its
    /// token's factor.
    fn scale_queries(&mut self, rows: usize, positions: RopePositions<'_>) {
        let Some(scale) = self.query_scale else {
            return;
        };
        let width = self.shape.n_heads * self.shape.latent_width();
        let queries = &mut self.ws.absorbed[..rows * width];
        scale.scale_rows(queries, width, (positions, positions), 0..rows);
    }

    /// Step 3: appends the latent rows (once: the store's values are their last `r` columns)
    /// and attends.
    fn attend(
        &mut self,
        batch: usize,
        len: usize,
        store: &mut dyn Store,
        new: NewTokens<'_>,
    ) -> Result<(), ShapeError> {
        let (h, pr) = (self.shape.n_heads, self.shape.latent_width());
        let kernels: &Kernels = self.packed.o.kernels();
        let ws = &mut self.ws;
        let rows = batch * len;
        let latent = &ws.latent[..rows * pr];
        let layout = HeadLayout {
            batch: len * pr,
            head: pr,
            row: pr,
        };
        let (threads, pool) = (self.threads, &mut self.pool);
        store.append(
            kernels,
            Some(latent),
            latent,
            [layout; 2],
            new,
            threads,
            pool,
        )?;
        let store = store.view();
        let kv_len = store.lengths.iter().copied().max().unwrap_or(0);
        let shape = AttentionShape {
            batch,
            n_heads: h,
            n_kv_heads: 1,
            q_len: len,
            kv_len,
            head_dim: pr,
        };
        let terms = ScoreTerms::default();
        let operands = Operands {
            q: &ws.absorbed[..rows * h * pr],
            q_starts: None,
            q_layout: HeadLayout {
                batch: len * h * pr,
                head: pr,
                row: h * pr,
            },
            scale: self.scale,
            store,
            terms: &terms,
            bf16: false,
        };
        let visibility = Visibility {
            causal: true,
            queries: len,
            element_keys: Some(store.lengths),
            ..Visibility::default()
        };
        let merged = &mut ws.merged[..rows * h * self.shape.kv_lora_rank];
        flash::attention(
            kernels,
            shape,
            operands,
            visibility,
            merged,
            &mut ws.flash[..threads],
            pool,
        );
        Ok(())
    }

    /// Step 4: `o_h = (p · c)_h · W_UV_hᵀ` per head into `(rows, H · v)`, then `o_proj` into
    /// `out`.
    fn output(&mut self, rows: usize, out: &mut [f32]) {
        let s = self.shape;
        let (h, r, v) = (s.n_heads, s.kv_lora_rank, s.v_head_dim);
        let (ws, pool) = (&mut self.ws, &mut self.pool);
        for (head, uv) in self.packed.uv.iter().enumerate() {
            let merged = &ws.merged[head * r..];
            let segment = [Segment::new(&mut ws.head[..rows * v], v)];
            gemm::gemm_with(
                merged,
                h * r,
                rows,
                uv,
                0,
                segment,
                &mut ws.gemm[..self.threads],
                pool,
            );
            let heads = ws.heads[..rows * h * v].chunks_exact_mut((h * v).max(1));
            for (row, value) in heads.zip(row_slices(ws.head, v, rows)) {
                row[head * v..][..v].copy_from_slice(value);
            }
        }
        let segment = [Segment::new(&mut out[..rows * s.d_model], s.d_model)];
        let heads = &ws.heads[..rows * h * v];
        gemm::gemm_with(
            heads,
            h * v,
            rows,
            &self.packed.o,
            0,
            segment,
            &mut ws.gemm[..self.threads],
            pool,
        );
    }
}
