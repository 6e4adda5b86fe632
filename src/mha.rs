//! Multi-head attention: the parameters, the reusable layer and `mha_forward`.

use alloc::vec::Vec;

use crate::cache::KvCache;
use crate::error::{head_dim, ShapeError};
use crate::kernels::flash::{self, AttentionShape, FlashScratch, HeadLayout, Operands};
use crate::kernels::gemm::{self, GemmScratch, Output};
use crate::kernels::mask::{MaskValues, Visibility};
use crate::kernels::{parallel, weights, Isa, Kernels, PackedB};
use crate::options::{AttendOptions, AttnMask, Masking};
use crate::tensor::{element_count, Matrix, Tensor};

/// The four weight matrices of one attention layer, in the `x @ W` convention (rows are input
/// features, columns output features).
///
/// `D` is the model width (queries and output), `E` the width of the tokens keys and values
/// are computed from (`E = D` for self-attention; the memory's width for cross-attention) and
/// `KV` the key/value width: `D` for plain multi-head attention, `n_kv_heads · D / n_heads` for
/// grouped-query or multi-query attention. `MhaParams<D>` is the plain self-attention case.
///
/// ```
/// use mha::{Matrix, MhaParams};
/// let p = MhaParams::new(Matrix::<4, 4>::identity(), Matrix::identity(), Matrix::identity(), Matrix::identity());
/// assert_eq!(p.wq[(2, 2)], 1.0);
/// ```
///
/// A weight of the wrong size does not compile:
///
/// ```compile_fail
/// use mha::{Matrix, MhaParams};
/// let p: MhaParams<4> = MhaParams::new(Matrix::<4, 4>::zeros(), Matrix::zeros(), Matrix::zeros(), Matrix::<3, 3>::zeros());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MhaParams<const D: usize, const E: usize = D, const KV: usize = D> {
    /// Query projection `Wq`, `(D, D)`: `Q = x · Wq`.
    pub wq: Matrix<D, D>,
    /// Key projection `Wk`, `(E, KV)`: `K = x · Wk` (or `memory · Wk`).
    pub wk: Matrix<E, KV>,
    /// Value projection `Wv`, `(E, KV)`: `V = x · Wv` (or `memory · Wv`).
    pub wv: Matrix<E, KV>,
    /// Output projection `Wo`, `(D, D)`: `y = merged · Wo`.
    pub wo: Matrix<D, D>,
}

impl<const D: usize> MhaParams<D> {
    /// Bundles the four `(D, D)` weight matrices of plain multi-head self-attention.
    pub fn new(wq: Matrix<D, D>, wk: Matrix<D, D>, wv: Matrix<D, D>, wo: Matrix<D, D>) -> Self {
        Self { wq, wk, wv, wo }
    }
}

impl<const D: usize, const E: usize, const KV: usize> MhaParams<D, E, KV> {
    /// Bundles the weights of any shape: cross-attention (`E ≠ D`) and grouped-query attention
    /// (`KV < D`).
    ///
    /// ```
    /// use mha::{Matrix, MhaParams};
    /// // Queries of width 8, keys and values from 6-wide memory tokens, 2 key/value heads of 2.
    /// let p = MhaParams::from_parts(Matrix::<8, 8>::zeros(), Matrix::<6, 4>::zeros(), Matrix::<6, 4>::zeros(), Matrix::<8, 8>::zeros());
    /// assert_eq!(p.wk.as_slice().len(), 24);
    /// ```
    pub fn from_parts(
        wq: Matrix<D, D>,
        wk: Matrix<E, KV>,
        wv: Matrix<E, KV>,
        wo: Matrix<D, D>,
    ) -> Self {
        Self { wq, wk, wv, wo }
    }
}

/// Optional projection biases (BERT and GPT-2 layers have them): `Q = x·Wq + bq`,
/// `K = x·Wk + bk`, `V = x·Wv + bv`, `y = merged·Wo + bo`. Each is a row vector.
///
/// ```
/// use mha::{Matrix, MhaBiases};
/// let biases = MhaBiases::<4> { bq: Some(Matrix::from([[0.1, 0.2, 0.3, 0.4]])), ..MhaBiases::default() };
/// assert!(biases.bo.is_none());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MhaBiases<const D: usize, const KV: usize = D> {
    /// Query bias, `(1, D)`.
    pub bq: Option<Matrix<1, D>>,
    /// Key bias, `(1, KV)`.
    pub bk: Option<Matrix<1, KV>>,
    /// Value bias, `(1, KV)`.
    pub bv: Option<Matrix<1, KV>>,
    /// Output bias, `(1, D)`.
    pub bo: Option<Matrix<1, D>>,
}

impl<const D: usize, const KV: usize> Default for MhaBiases<D, KV> {
    fn default() -> Self {
        Self {
            bq: None,
            bk: None,
            bv: None,
            bo: None,
        }
    }
}

/// Causal multi-head self-attention, the seed's five steps:
///
/// 1. `Q = x·Wq`, `K = x·Wk`, `V = x·Wv`, each `(B, T, D)`;
/// 2. split into heads, `(B, T, D) -> (B, T, H, d) -> (B, H, T, d)`;
/// 3. causal attention in every head: `softmax(Q Kᵀ / √d)` with key `j > i` masked, times `V`;
/// 4. merge heads, `(B, H, T, d) -> (B, T, D)`;
/// 5. `y = merged · Wo`.
///
/// This convenience packs the weights on every call; build an [`Mha`] layer once to reuse
/// them (and its scratch) across calls, and for the other modes (masks, padding,
/// cross-attention, biases, grouped heads, a KV cache).
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
/// a multiple of `n_heads`.
pub fn mha_forward<const B: usize, const T: usize, const D: usize>(
    x: &Tensor<B, T, D>,
    params: &MhaParams<D>,
    n_heads: usize,
) -> Result<Tensor<B, T, D>, ShapeError> {
    Ok(Mha::new(params, n_heads)?.forward(x))
}

/// Settings of an [`Mha`] layer beyond its weights; made by [`Mha::builder`].
#[derive(Debug)]
pub struct MhaBuilder<'p, const D: usize, const E: usize, const KV: usize> {
    params: &'p MhaParams<D, E, KV>,
    n_heads: usize,
    masking: Masking,
    biases: MhaBiases<D, KV>,
    threads: usize,
    min_work_per_thread: usize,
    isa: Isa,
}

impl<const D: usize, const E: usize, const KV: usize> MhaBuilder<'_, D, E, KV> {
    /// Causal (the default) or bidirectional attention.
    pub fn masking(mut self, masking: Masking) -> Self {
        self.masking = masking;
        self
    }

    /// Projection biases (none by default).
    pub fn biases(mut self, biases: MhaBiases<D, KV>) -> Self {
        self.biases = biases;
        self
    }

    /// The thread count (0, the default, means every CPU; at most 256). Results are
    /// bit-identical for every thread count.
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// How many multiply-adds each thread of a phase (a projection, the attention, the output
    /// projection) must get before the phase uses another thread; default 8 Mi (starting a
    /// thread costs about what a core does with that). 0 always uses every thread. Results are
    /// bit-identical either way.
    pub fn min_work_per_thread(mut self, multiply_adds: usize) -> Self {
        self.min_work_per_thread = multiply_adds;
        self
    }

    /// The instruction set of the kernels (default: [`Isa::detect`]).
    pub fn isa(mut self, isa: Isa) -> Self {
        self.isa = isa;
        self
    }

    /// Checks the head counts and packs the weights.
    ///
    /// # Errors
    /// [`ShapeError::ZeroHeads`] or [`ShapeError::NotDivisible`] for a bad `n_heads`,
    /// [`ShapeError::KvHeads`] when `KV` is not a whole number of heads dividing `n_heads`,
    /// [`ShapeError::UnsupportedIsa`] when the CPU cannot run the chosen instruction set.
    pub fn build(self) -> Result<Mha<D, E, KV>, ShapeError> {
        let head_dim = head_dim(D, self.n_heads)?;
        let kv_error = ShapeError::KvHeads {
            kv_width: KV,
            head_dim,
            n_heads: self.n_heads,
        };
        let n_kv_heads = KV.checked_div(head_dim).unwrap_or(self.n_heads);
        if KV != n_kv_heads * head_dim
            || n_kv_heads == 0
            || !self.n_heads.is_multiple_of(n_kv_heads)
        {
            return Err(kv_error);
        }
        let kernels = self.isa.kernels()?;
        let p = self.params;
        let (wq, wk, wv) = (p.wq.as_slice(), p.wk.as_slice(), p.wv.as_slice());
        // Self-attention (E = D): one packed [Wq | Wk | Wv], D × (D + 2·KV). Otherwise Wq alone.
        let projection = if E == D {
            PackedB::pack(kernels, D, D + 2 * KV, |r, c| match c {
                c if c < D => wq[r * D + c],
                c if c < D + KV => wk[r * KV + c - D],
                c => wv[r * KV + c - D - KV],
            })
        } else {
            PackedB::pack(kernels, D, D, |r, c| wq[r * D + c])
        };
        // Keys and values from another sequence use [Wk | Wv]: a window of the fused matrix
        // when it starts on a panel boundary, else its own packed copy.
        let memory_projection = (E != D || !D.is_multiple_of(kernels.nr)).then(|| {
            PackedB::pack(kernels, E, 2 * KV, |r, c| {
                if c < KV {
                    wk[r * KV + c]
                } else {
                    wv[r * KV + c - KV]
                }
            })
        });
        let output = PackedB::pack(kernels, D, D, |r, c| p.wo.as_slice()[r * D + c]);
        let row = |m: &Option<Matrix<1, D>>| m.as_ref().map(|m| m.as_slice().to_vec());
        let kv_row = |m: &Option<Matrix<1, KV>>| m.as_ref().map(|m| m.as_slice().to_vec());
        let threads = parallel::thread_count(self.threads);
        Ok(Mha {
            n_heads: self.n_heads,
            n_kv_heads,
            masking: self.masking,
            threads,
            min_work_per_thread: self.min_work_per_thread,
            projection,
            memory_projection,
            output,
            biases: Biases {
                q: row(&self.biases.bq),
                k: kv_row(&self.biases.bk),
                v: kv_row(&self.biases.bv),
                o: row(&self.biases.bo),
            },
            workspace: Workspace::default(),
        })
    }
}

/// The biases as plain rows.
#[derive(Clone, Debug, Default)]
struct Biases {
    q: Option<Vec<f32>>,
    k: Option<Vec<f32>>,
    v: Option<Vec<f32>>,
    o: Option<Vec<f32>>,
}

/// A reusable multi-head attention layer: the weights packed once for the chosen instruction
/// set, the settings, and scratch kept between calls, so that a loop of
/// [`Mha::forward_into`] calls on one thread allocates nothing once the first call has sized
/// the scratch.
///
/// `Mha<D>` is self-attention with `D`-wide weights; `E` and `KV` are as in [`MhaParams`].
///
/// ```
/// use mha::{Matrix, Mha, MhaParams, Tensor};
/// let w = Matrix::<8, 8>::from_fn(|r, c| ((r * 8 + c) % 5) as f32 * 0.1);
/// let mut layer = Mha::new(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)?.with_threads(1);
/// let x = Tensor::<1, 3, 8>::from_fn(|_, t, i| (t + i) as f32 * 0.01);
/// let mut y = Tensor::zeros();
/// layer.forward_into(&x, &mut y);
/// assert_eq!(y, layer.forward(&x));
/// # Ok::<(), mha::ShapeError>(())
/// ```
#[derive(Debug)]
pub struct Mha<const D: usize, const E: usize = D, const KV: usize = D> {
    n_heads: usize,
    n_kv_heads: usize,
    masking: Masking,
    threads: usize,
    min_work_per_thread: usize,
    /// `[Wq | Wk | Wv]` when `E = D`, else `Wq`; packed.
    projection: PackedB,
    /// `[Wk | Wv]` packed, when it is not a window of `projection`.
    memory_projection: Option<PackedB>,
    /// `Wo`, packed.
    output: PackedB,
    biases: Biases,
    workspace: Workspace,
}

/// Buffers kept between forward calls; they only grow.
#[derive(Default)]
struct Workspace {
    /// `(B, T, D)` queries, i.e. `(B, T, H, d)`: read head by head in place.
    q: Vec<f32>,
    /// `(B, S, KV)` keys; once transposed into `keys_t`, reused for the value panels.
    k_then_values: Vec<f32>,
    /// `(B, S, KV)` values; once copied into panels (or the KV cache), reused for the merged
    /// attention output.
    v_then_merged: Vec<f32>,
    /// The keys of every key/value head transposed: per head, `d × BLOCK_K` panels of keys
    /// (see `flash::key_panels_len`).
    keys_t: Vec<f32>,
    gemm: Vec<GemmScratch>,
    flash: Vec<FlashScratch>,
}

impl Workspace {
    /// Per-thread scratch for up to `threads` threads (it only grows).
    fn reserve_threads(&mut self, threads: usize) {
        let threads = threads.max(self.gemm.len());
        self.gemm.resize_with(threads, GemmScratch::default);
        self.flash.resize_with(threads, FlashScratch::default);
    }
}

impl core::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let floats =
            self.q.len() + self.k_then_values.len() + self.v_then_merged.len() + self.keys_t.len();
        f.debug_struct("Workspace")
            .field("floats", &floats)
            .finish()
    }
}

/// Below this many multiply-adds per thread a phase of a call uses fewer threads: starting and
/// joining a thread costs tens of microseconds, about what a core does with this much work.
/// (The result is the same for any thread count.)
const MIN_WORK_PER_THREAD: usize = 1 << 23;

/// How many tile multiply-adds one streamed multiply-add is worth when choosing threads: a
/// few rows against the weights (a decoding step's projections) or a single query against the
/// keys and values read an operand from memory for each multiply-add or few, about 10-30 times
/// slower than the register-blocked tiles (measured: ~0.15-0.4 ns against ~0.013 ns).
const STREAMED: usize = 16;

/// The threads each phase of one call uses (see [`Mha::plan`]).
struct Plan {
    projection: usize,
    transpose: usize,
    attention: usize,
    output: usize,
}

impl Plan {
    /// The most threads any phase uses: how many scratch spaces to reserve.
    fn most(&self) -> usize {
        self.projection
            .max(self.transpose)
            .max(self.attention)
            .max(self.output)
    }
}

/// Where the keys and values of a call come from.
enum KeySource<'a> {
    /// From `x` itself: one fused projection.
    SelfAttention,
    /// From another sequence `(B, S, E)`.
    Memory(&'a [f32]),
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

    /// Like [`Mha::new`], with the kernels of a chosen instruction set.
    ///
    /// # Errors
    /// As [`Mha::new`], and [`ShapeError::UnsupportedIsa`] when the CPU cannot run `isa`.
    pub fn with_isa(params: &MhaParams<D>, n_heads: usize, isa: Isa) -> Result<Self, ShapeError> {
        Mha::builder(params, n_heads).isa(isa).build()
    }
}

impl<const D: usize, const E: usize, const KV: usize> Mha<D, E, KV> {
    /// Starts building a layer with `n_heads` query heads; the key/value head count is
    /// `KV / (D / n_heads)`.
    ///
    /// ```
    /// use mha::{Masking, Matrix, Mha, MhaParams, Tensor};
    /// // Grouped-query attention: 4 query heads of width 2 share 2 key/value heads (KV = 4).
    /// let params = MhaParams::from_parts(Matrix::<8, 8>::identity(), Matrix::<8, 4>::zeros(), Matrix::<8, 4>::zeros(), Matrix::identity());
    /// let layer = Mha::builder(&params, 4).masking(Masking::Bidirectional).threads(1).build()?;
    /// assert_eq!(layer.n_kv_heads(), 2);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn builder(params: &MhaParams<D, E, KV>, n_heads: usize) -> MhaBuilder<'_, D, E, KV> {
        MhaBuilder {
            params,
            n_heads,
            masking: Masking::Causal,
            biases: MhaBiases::default(),
            threads: 0,
            min_work_per_thread: MIN_WORK_PER_THREAD,
            isa: Isa::detect(),
        }
    }

    /// Sets the thread count (0 means every CPU; at most 256). The output is bit-identical for
    /// every thread count.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = parallel::thread_count(threads);
        self
    }

    /// Sets the work a thread of a phase needs before the phase uses another thread (see
    /// [`MhaBuilder::min_work_per_thread`]; 0 always uses every thread).
    pub fn with_min_work_per_thread(mut self, multiply_adds: usize) -> Self {
        self.min_work_per_thread = multiply_adds;
        self
    }

    /// The number of query heads `H`.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// The number of key/value heads (`H` for plain multi-head attention).
    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    /// The width of one head, `D / H`.
    pub fn head_dim(&self) -> usize {
        D / self.n_heads
    }

    /// The thread count.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The masking mode.
    pub fn masking(&self) -> Masking {
        self.masking
    }

    /// The instruction set of the kernels.
    pub fn isa(&self) -> Isa {
        self.output.isa()
    }

    fn kernels(&self) -> &'static Kernels {
        self.output.kernels()
    }

    /// Cross-attention: queries from `x`, keys and values from `memory` (`S` tokens of width
    /// `E`), with the layer's masking (causal is aligned bottom-right) and the options.
    ///
    /// ```
    /// use mha::{AttendOptions, Masking, Matrix, Mha, MhaParams, Tensor};
    /// let params = MhaParams::from_parts(Matrix::<4, 4>::identity(), Matrix::<6, 4>::identity(), Matrix::<6, 4>::identity(), Matrix::identity());
    /// let mut layer = Mha::builder(&params, 2).masking(Masking::Bidirectional).build()?;
    /// let x = Tensor::<1, 2, 4>::zeros();
    /// let memory = Tensor::<1, 5, 6>::from_fn(|_, s, i| (s + i) as f32);
    /// let mut out = Tensor::zeros();
    /// layer.cross(&x, &memory, AttendOptions::default(), &mut out)?;
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// When an option's length does not match `B`, `T` and `S` (see [`AttendOptions`]).
    pub fn cross<const B: usize, const T: usize, const S: usize>(
        &mut self,
        x: &Tensor<B, T, D>,
        memory: &Tensor<B, S, E>,
        options: AttendOptions<'_>,
        out: &mut Tensor<B, T, D>,
    ) -> Result<(), ShapeError> {
        self.run::<B, T>(
            x.as_slice(),
            KeySource::Memory(memory.as_slice()),
            S,
            options,
            out.as_mut_slice(),
        )
    }

    /// The threads to use for `work` multiply-adds.
    fn threads_for(&self, work: usize) -> usize {
        match work.checked_div(self.min_work_per_thread) {
            Some(threads) => threads.clamp(1, self.threads),
            None => self.threads,
        }
    }

    /// The threads of each phase of a call: `rows` query rows of width `D` and `kv_rows` key
    /// and value rows projected from width `E`, `queries` per batch element against `keys`.
    /// Each phase starts its own threads, so small phases stay on one; memory-bound work is
    /// weighted up (saturating: the counts only pick a thread count).
    fn plan<const B: usize>(
        &self,
        rows: usize,
        kv_rows: usize,
        queries: usize,
        keys: usize,
    ) -> Plan {
        let kernels = self.kernels();
        // A few rows share each streamed weight: STREAMED / rows per multiply-add.
        let streamed = |rows: usize| {
            if rows > 0 && kernels.few_rows(rows) {
                STREAMED / rows
            } else {
                1
            }
        };
        let work = |factors: &[usize]| factors.iter().fold(1usize, |w, &f| w.saturating_mul(f));
        let projection = work(&[rows, D, D]).saturating_add(work(&[kv_rows, E, 2, KV]));
        // One query streams the keys and values, and its heads are separate work items.
        let one_query = if queries == 1 { STREAMED } else { 1 };
        let attention = work(&[B, self.n_heads, queries, keys, self.head_dim(), one_query]);
        Plan {
            projection: self.threads_for(projection.saturating_mul(streamed(rows.max(kv_rows)))),
            // The key transpose and value copy move each K/V value through memory twice, about
            // what a core does with 64 multiply-adds in the same time (~1.2 ns per value).
            transpose: self.threads_for(work(&[kv_rows, KV, 64])),
            attention: self.threads_for(attention),
            output: self.threads_for(work(&[rows, D, D, streamed(rows)])),
        }
    }

    /// Builds the visibility rule of a call with `t` queries and `s` keys, checking the options.
    fn visibility<'o, const B: usize>(
        &self,
        t: usize,
        s: usize,
        options: &AttendOptions<'o>,
    ) -> Result<Visibility<'o>, ShapeError> {
        let mismatch = |what, expected, actual| ShapeError::LengthMismatch {
            what,
            expected,
            actual,
        };
        if let Some(lengths) = options.key_lengths {
            if lengths.len() != B {
                return Err(mismatch("key_lengths (B)", B, lengths.len()));
            }
            if let Some((batch, &length)) = lengths.iter().enumerate().find(|&(_, &l)| l > s) {
                return Err(ShapeError::KeyLength {
                    batch,
                    length,
                    keys: s,
                });
            }
        }
        if let Some(padding) = options.key_padding_mask {
            let expected = element_count(&[B, s])?;
            if padding.len() != expected {
                return Err(mismatch("key_padding_mask (B, S)", expected, padding.len()));
            }
        }
        let mask = match options.mask {
            None => None,
            Some(mask) => {
                let (values, len) = match mask {
                    AttnMask::Bool(m) => (MaskValues::Bool(m), m.len()),
                    AttnMask::Additive(m) => (MaskValues::Additive(m), m.len()),
                };
                let shared = element_count(&[t, s])?;
                let per_batch = element_count(&[B, t, s])?;
                let batch_stride = if len == shared {
                    0
                } else if len == per_batch {
                    shared
                } else {
                    return Err(mismatch("mask (T, S) or (B, T, S)", shared, len));
                };
                Some((values, batch_stride))
            }
        };
        Ok(Visibility {
            causal: (self.masking == Masking::Causal).then_some(s as isize - t as isize),
            key_lens: options.key_lengths,
            key_mask: options.key_padding_mask,
            mask,
        })
    }

    /// The attention steps shared by every entry point: `x (B, T, D)` attends to keys and
    /// values from `source` (`s` tokens), writing `(B, T, D)` into `out`.
    fn run<const B: usize, const T: usize>(
        &mut self,
        x: &[f32],
        source: KeySource<'_>,
        s: usize,
        mut options: AttendOptions<'_>,
        out: &mut [f32],
    ) -> Result<(), ShapeError> {
        let visibility = self.visibility::<B>(T, s, &options)?;
        let (rows, kv_rows) = (B * T, B * s);
        let d = self.head_dim();
        let kernels = self.kernels();
        let shape = AttentionShape {
            batch: B,
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            q_len: T,
            kv_len: s,
            head_dim: d,
        };
        let plan = self.plan::<B>(rows, kv_rows, T, s);

        let ws = &mut self.workspace;
        gemm::grow(&mut ws.q, rows * D);
        let value_stride = flash::value_stride(kernels, d);
        let value_panels = B * self.n_kv_heads * s * value_stride;
        gemm::grow(&mut ws.k_then_values, (kv_rows * KV).max(value_panels));
        gemm::grow(&mut ws.v_then_merged, (kv_rows * KV).max(rows * D));
        gemm::grow(&mut ws.keys_t, shape.keys_len());
        ws.reserve_threads(plan.most());
        let (q, k, v) = (
            &mut ws.q[..rows * D],
            &mut ws.k_then_values[..],
            &mut ws.v_then_merged[..],
        );
        let (bq, bk, bv) = (
            self.biases.q.as_deref(),
            self.biases.k.as_deref(),
            self.biases.v.as_deref(),
        );

        // Steps 1 and 2: the projections write Q (B, T, D) and K, V (B, S, KV): each is the
        // split-heads layout (B, T, H, d) before its transpose, read in place below.
        match source {
            KeySource::SelfAttention => project_self::<D, KV>(
                &self.projection,
                &self.biases,
                x,
                rows,
                [q, &mut k[..kv_rows * KV], &mut v[..kv_rows * KV]],
                &mut ws.gemm[..plan.projection],
            ),
            KeySource::Memory(memory) => {
                let q_out = [Output {
                    buffer: q,
                    width: D,
                    bias: bq,
                }];
                gemm::gemm_with(
                    x,
                    D,
                    rows,
                    &self.projection,
                    0,
                    q_out,
                    &mut ws.gemm[..plan.projection],
                );
                let kv_out = [
                    Output {
                        buffer: &mut k[..kv_rows * KV],
                        width: KV,
                        bias: bk,
                    },
                    Output {
                        buffer: &mut v[..kv_rows * KV],
                        width: KV,
                        bias: bv,
                    },
                ];
                let (packed, first_col) = match &self.memory_projection {
                    Some(packed) => (packed, 0),
                    None => (&self.projection, D),
                };
                gemm::gemm_with(
                    memory,
                    E,
                    kv_rows,
                    packed,
                    first_col,
                    kv_out,
                    &mut ws.gemm[..plan.projection],
                );
            }
        }
        let kv_layout = HeadLayout {
            batch: s * KV,
            head: d,
            row: KV,
        };
        flash::transpose_keys(
            kernels,
            shape,
            k,
            kv_layout,
            &mut ws.keys_t,
            s,
            0,
            plan.transpose,
        );
        // The values into panels, in the keys' buffer, which the transpose has freed.
        flash::copy_values(shape, v, kv_layout, k, value_stride, s, 0, plan.transpose);
        let value_layout = HeadLayout::value_panels(self.n_kv_heads, s, value_stride);

        // Steps 3 and 4: attention in every head, writing merged (B, T, D) rows into the
        // values' buffer, which the copy has freed.
        let operands = Operands {
            q,
            q_layout: HeadLayout {
                batch: T * D,
                head: d,
                row: D,
            },
            keys_t: &ws.keys_t,
            key_capacity: s,
            v: &k[..value_panels],
            v_layout: value_layout,
        };
        if let Some(weights_out) = options.weights.take() {
            let len = element_count(&[B, self.n_heads, T, s])?;
            weights_out.data.resize(len, 0.0);
            weights_out.shape = [B, self.n_heads, T, s];
            weights::attention_weights(shape, &operands, &visibility, &mut weights_out.data);
        }
        let merged = &mut v[..rows * D];
        flash::attention(
            kernels,
            shape,
            operands,
            visibility,
            merged,
            &mut ws.flash[..plan.attention],
        );

        // Step 5: the output projection.
        project_output::<D>(
            &self.output,
            self.biases.o.as_deref(),
            merged,
            rows,
            out,
            &mut ws.gemm[..plan.output],
        );
        Ok(())
    }
}

impl<const D: usize, const KV: usize> Mha<D, D, KV> {
    /// Runs the layer on `x` and returns the output `(B, T, D)`.
    pub fn forward<const B: usize, const T: usize>(
        &mut self,
        x: &Tensor<B, T, D>,
    ) -> Tensor<B, T, D> {
        let mut out = Tensor::zeros();
        self.forward_into(x, &mut out);
        out
    }

    /// Runs the layer on `x`, writing the output into `out`. Allocates nothing once the layer
    /// has run on a shape at least this large (with one thread; starting threads allocates).
    pub fn forward_into<const B: usize, const T: usize>(
        &mut self,
        x: &Tensor<B, T, D>,
        out: &mut Tensor<B, T, D>,
    ) {
        // Without options nothing can fail: the shapes are checked by the types.
        let done = self.run::<B, T>(
            x.as_slice(),
            KeySource::SelfAttention,
            T,
            AttendOptions::default(),
            out.as_mut_slice(),
        );
        debug_assert!(done.is_ok());
    }

    /// Self-attention with per-call options: key padding, masks, attention weights.
    ///
    /// ```
    /// use mha::{AttendOptions, AttentionWeights, Masking, Matrix, Mha, MhaParams, Tensor};
    /// let w = Matrix::<4, 4>::identity();
    /// let mut layer = Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)
    ///     .masking(Masking::Bidirectional)
    ///     .build()?;
    /// let x = Tensor::<2, 3, 4>::from_fn(|b, t, i| (b + t + i) as f32 * 0.1);
    /// let mut weights = AttentionWeights::new();
    /// let mut out = Tensor::zeros();
    /// // Batch element 0 has 2 real tokens, element 1 has 3.
    /// let options = AttendOptions { key_lengths: Some(&[2, 3]), weights: Some(&mut weights), ..AttendOptions::default() };
    /// layer.forward_with(&x, options, &mut out)?;
    /// assert_eq!(weights.get(0, 0, 0, 2), Some(0.0)); // padding gets no weight
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// When an option's length does not match `B` and `T` (see [`AttendOptions`]).
    pub fn forward_with<const B: usize, const T: usize>(
        &mut self,
        x: &Tensor<B, T, D>,
        options: AttendOptions<'_>,
        out: &mut Tensor<B, T, D>,
    ) -> Result<(), ShapeError> {
        self.run::<B, T>(
            x.as_slice(),
            KeySource::SelfAttention,
            T,
            options,
            out.as_mut_slice(),
        )
    }

    /// An empty KV cache for this layer holding up to `capacity` tokens per batch element.
    pub fn new_cache<const B: usize>(&self, capacity: usize) -> KvCache<B> {
        let d = self.head_dim();
        KvCache::new(
            self.n_kv_heads,
            d,
            flash::value_stride(self.kernels(), d),
            capacity,
        )
    }

    /// Incremental decoding: appends the keys and values of the `L` new tokens `x` to `cache`
    /// and attends over everything cached (causal order aligned bottom-right: new query `i`
    /// sees cached key `j` iff `j <= i + cached`, where `cached` counts the tokens before this
    /// call). Feeding a sequence in chunks of any size gives the outputs of one causal forward
    /// over it, bit for bit.
    ///
    /// ```
    /// use mha::{Matrix, Mha, MhaParams, Tensor};
    /// let w = Matrix::<4, 4>::from_fn(|r, c| if r == c { 0.5 } else { 0.1 });
    /// let mut layer = Mha::new(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)?;
    /// let x = Tensor::<1, 3, 4>::from_fn(|_, t, i| (t * 4 + i) as f32 * 0.1);
    /// let full = layer.forward(&x);
    /// let mut cache = layer.new_cache::<1>(8);
    /// let mut out = Tensor::<1, 1, 4>::zeros();
    /// for t in 0..3 {
    ///     let token = Tensor::<1, 1, 4>::from_fn(|_, _, i| x[(0, t, i)]);
    ///     layer.decode(&token, &mut cache, &mut out)?;
    ///     assert_eq!(out.token(0, 0), full.token(0, t));
    /// }
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::CacheFull`] when the new tokens do not fit (the cache is unchanged),
    /// [`ShapeError::CacheMismatch`] for a cache made by a layer of another shape.
    pub fn decode<const B: usize, const L: usize>(
        &mut self,
        x: &Tensor<B, L, D>,
        cache: &mut KvCache<B>,
        out: &mut Tensor<B, L, D>,
    ) -> Result<(), ShapeError> {
        let d = self.head_dim();
        let kernels = self.kernels();
        if cache.n_kv_heads != self.n_kv_heads
            || cache.head_dim != d
            || cache.value_stride != flash::value_stride(kernels, d)
        {
            return Err(ShapeError::CacheMismatch);
        }
        let cached = cache.len;
        if L > cache.capacity - cached {
            return Err(ShapeError::CacheFull {
                capacity: cache.capacity,
                cached,
                new: L,
            });
        }
        let s = cached + L;
        let rows = B * L;
        let shape = AttentionShape {
            batch: B,
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            q_len: L,
            kv_len: s,
            head_dim: d,
        };
        let plan = self.plan::<B>(rows, rows, L, s);
        // Causal order aligned bottom-right: the new rows sit after the `cached` keys.
        let visibility = self.visibility::<B>(L, s, &AttendOptions::default())?;

        let ws = &mut self.workspace;
        gemm::grow(&mut ws.q, rows * D);
        gemm::grow(&mut ws.k_then_values, rows * KV);
        gemm::grow(&mut ws.v_then_merged, (rows * KV).max(rows * D));
        ws.reserve_threads(plan.most());
        let (q, k, v) = (
            &mut ws.q[..rows * D],
            &mut ws.k_then_values[..],
            &mut ws.v_then_merged[..],
        );
        project_self::<D, KV>(
            &self.projection,
            &self.biases,
            x.as_slice(),
            rows,
            [q, &mut k[..rows * KV], &mut v[..rows * KV]],
            &mut ws.gemm[..plan.projection],
        );

        // Append: keys transposed at columns cached.., values at rows cached.. of each head.
        let new_layout = HeadLayout {
            batch: L * KV,
            head: d,
            row: KV,
        };
        let new_shape = AttentionShape { kv_len: L, ..shape };
        flash::transpose_keys(
            kernels,
            new_shape,
            k,
            new_layout,
            &mut cache.keys_t,
            cache.capacity,
            cached,
            plan.transpose,
        );
        flash::copy_values(
            new_shape,
            v,
            new_layout,
            &mut cache.values,
            cache.value_stride,
            cache.capacity,
            cached,
            plan.transpose,
        );
        cache.len = s;

        let operands = Operands {
            q,
            q_layout: HeadLayout {
                batch: L * D,
                head: d,
                row: D,
            },
            keys_t: &cache.keys_t,
            key_capacity: cache.capacity,
            v: &cache.values,
            v_layout: HeadLayout::value_panels(self.n_kv_heads, cache.capacity, cache.value_stride),
        };
        let merged = &mut v[..rows * D];
        flash::attention(
            kernels,
            shape,
            operands,
            visibility,
            merged,
            &mut ws.flash[..plan.attention],
        );
        project_output::<D>(
            &self.output,
            self.biases.o.as_deref(),
            merged,
            rows,
            out.as_mut_slice(),
            &mut ws.gemm[..plan.output],
        );
        Ok(())
    }
}

/// Steps 1 and 2 for self-attention: one GEMM of `x` (`rows × D`) against the packed
/// `[Wq | Wk | Wv]`, writing `Q` (`rows × D`), `K` and `V` (`rows × KV`) to their own buffers,
/// biases added.
fn project_self<const D: usize, const KV: usize>(
    projection: &PackedB,
    biases: &Biases,
    x: &[f32],
    rows: usize,
    [q, k, v]: [&mut [f32]; 3],
    scratch: &mut [GemmScratch],
) {
    let outputs = [
        Output {
            buffer: q,
            width: D,
            bias: biases.q.as_deref(),
        },
        Output {
            buffer: k,
            width: KV,
            bias: biases.k.as_deref(),
        },
        Output {
            buffer: v,
            width: KV,
            bias: biases.v.as_deref(),
        },
    ];
    gemm::gemm_with(x, D, rows, projection, 0, outputs, scratch);
}

/// Step 5: `out (rows × D) = merged · Wo + bo`.
fn project_output<const D: usize>(
    output: &PackedB,
    bias: Option<&[f32]>,
    merged: &[f32],
    rows: usize,
    out: &mut [f32],
    scratch: &mut [GemmScratch],
) {
    let outputs = [Output {
        buffer: out,
        width: D,
        bias,
    }];
    gemm::gemm_with(merged, D, rows, output, 0, outputs, scratch);
}
