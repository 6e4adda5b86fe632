//! Multi-head self-attention: the parameters, the reusable layer and `mha_forward`.

use alloc::vec::Vec;

use crate::error::{head_dim, ShapeError};
use crate::kernels::flash::{self, AttentionShape, FlashScratch, HeadLayout, Operands, Visibility};
use crate::kernels::gemm::{self, GemmScratch};
use crate::kernels::{parallel, Isa, PackedB};
use crate::tensor::{Matrix, Tensor};

/// The four weight matrices of one attention layer, in the `x @ W` convention (rows are input
/// features, columns output features).
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
pub struct MhaParams<const D: usize> {
    /// Query projection `Wq`, `(D, D)`: `Q = x · Wq`.
    pub wq: Matrix<D, D>,
    /// Key projection `Wk`, `(D, D)`: `K = x · Wk`.
    pub wk: Matrix<D, D>,
    /// Value projection `Wv`, `(D, D)`: `V = x · Wv`.
    pub wv: Matrix<D, D>,
    /// Output projection `Wo`, `(D, D)`: `y = merged · Wo`.
    pub wo: Matrix<D, D>,
}

impl<const D: usize> MhaParams<D> {
    /// Bundles the four weight matrices.
    pub fn new(wq: Matrix<D, D>, wk: Matrix<D, D>, wv: Matrix<D, D>, wo: Matrix<D, D>) -> Self {
        Self { wq, wk, wv, wo }
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
/// them (and its scratch) across calls.
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

/// A reusable causal self-attention layer: the weights packed once for the chosen instruction
/// set, a thread count, and scratch that is kept between calls, so that a loop of
/// [`Mha::forward_into`] calls allocates nothing once the first call has sized the scratch.
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
pub struct Mha<const D: usize> {
    n_heads: usize,
    threads: usize,
    /// `[Wq | Wk | Wv]`, `(D, 3D)`, packed.
    qkv_weights: PackedB,
    /// `Wo`, `(D, D)`, packed.
    out_weights: PackedB,
    workspace: Workspace,
}

/// Buffers kept between forward calls.
#[derive(Default)]
struct Workspace {
    /// `(B, T, D)` queries, i.e. `(B, T, H, d)`: read head by head in place.
    q: Vec<f32>,
    /// `(B, T, D)` keys; once transposed into `keys_t`, reused for the merged attention output.
    k_then_merged: Vec<f32>,
    /// `(B, T, D)` values, read head by head in place.
    v: Vec<f32>,
    /// The keys of every head transposed, `(B, H, d, S + padding)`.
    keys_t: Vec<f32>,
    gemm: Vec<GemmScratch>,
    flash: Vec<FlashScratch>,
}

impl core::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Workspace")
            .field(
                "activations",
                &(self.q.len() + self.k_then_merged.len() + self.v.len() + self.keys_t.len()),
            )
            .finish()
    }
}

/// Below this many multiply-adds a forward pass runs on one thread: starting threads would
/// cost more than it saves. (The result is the same for any thread count.)
const MIN_WORK_PER_THREAD: usize = 1 << 20;

impl<const D: usize> Mha<D> {
    /// Packs `params` for [`Isa::detect`] and uses every CPU ([`Mha::with_threads`] changes it).
    ///
    /// # Errors
    /// [`ShapeError::ZeroHeads`] or [`ShapeError::NotDivisible`] for a bad `n_heads`.
    pub fn new(params: &MhaParams<D>, n_heads: usize) -> Result<Self, ShapeError> {
        Self::with_isa(params, n_heads, Isa::detect())
    }

    /// Like [`Mha::new`], with the kernels of a chosen instruction set.
    ///
    /// # Errors
    /// As [`Mha::new`], and [`ShapeError::UnsupportedIsa`] when the CPU cannot run `isa`.
    pub fn with_isa(params: &MhaParams<D>, n_heads: usize, isa: Isa) -> Result<Self, ShapeError> {
        head_dim(D, n_heads)?;
        let kernels = isa.kernels()?;
        let weights = [&params.wq, &params.wk, &params.wv];
        let qkv_weights = PackedB::pack(kernels, D, 3 * D, |p, j| {
            weights[j / D].as_slice()[p * D + j % D]
        });
        let out_weights = PackedB::pack(kernels, D, D, |p, j| params.wo.as_slice()[p * D + j]);
        Ok(Self {
            n_heads,
            threads: parallel::default_threads(),
            qkv_weights,
            out_weights,
            workspace: Workspace::default(),
        })
    }

    /// Sets the thread count (0 means the default, every CPU). The output is bit-identical for
    /// every thread count.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = if threads == 0 {
            parallel::default_threads()
        } else {
            threads
        };
        self
    }

    /// The number of heads `H`.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// The width of one head, `D / H`.
    pub fn head_dim(&self) -> usize {
        D / self.n_heads
    }

    /// The thread count.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The instruction set of the kernels.
    pub fn isa(&self) -> Isa {
        self.qkv_weights.isa()
    }

    /// Runs the layer on `x` and returns the output `(B, T, D)`.
    pub fn forward<const B: usize, const T: usize>(
        &mut self,
        x: &Tensor<B, T, D>,
    ) -> Tensor<B, T, D> {
        let mut out = Tensor::zeros();
        self.forward_into(x, &mut out);
        out
    }

    /// Runs the layer on `x`, writing the output into `out`. Allocates nothing once the
    /// layer has run on a shape at least this large with the same thread count.
    pub fn forward_into<const B: usize, const T: usize>(
        &mut self,
        x: &Tensor<B, T, D>,
        out: &mut Tensor<B, T, D>,
    ) {
        let rows = B * T;
        let d = self.head_dim();
        let kernels = self.qkv_weights.kernels();
        let work = rows * D * 4 * D + B * self.n_heads * T * T * d;
        let threads = self.threads.min(work / MIN_WORK_PER_THREAD).max(1);
        let shape = AttentionShape {
            batch: B,
            n_heads: self.n_heads,
            q_len: T,
            kv_len: T,
            head_dim: d,
        };
        // (B, T, D) seen as (B, T, H, d): head h of token t starts at t·D + h·d.
        let layout = HeadLayout {
            batch: T * D,
            head: d,
            row: D,
        };

        let ws = &mut self.workspace;
        for buffer in [&mut ws.q, &mut ws.k_then_merged, &mut ws.v] {
            gemm::grow(buffer, rows * D);
        }
        gemm::grow(&mut ws.keys_t, shape.keys_len(kernels));
        ws.gemm
            .resize_with(threads.max(ws.gemm.len()), GemmScratch::default);
        ws.flash
            .resize_with(threads.max(ws.flash.len()), FlashScratch::default);
        let (q, k, v) = (
            &mut ws.q[..rows * D],
            &mut ws.k_then_merged[..rows * D],
            &mut ws.v[..rows * D],
        );

        // Steps 1 and 2: one GEMM against [Wq | Wk | Wv], writing Q, K and V to their own
        // (B, T, D) buffers: each is the split-heads layout (B, T, H, d) before the transpose,
        // which the attention reads in place through `layout`.
        gemm::gemm_with(
            x.as_slice(),
            D,
            rows,
            &self.qkv_weights,
            [&mut *q, &mut *k, &mut *v],
            [D; 3],
            &mut ws.gemm[..threads],
        );
        flash::transpose_keys(kernels, shape, k, layout, &mut ws.keys_t, threads);

        // Steps 3 and 4: attention in every head, writing merged (B, T, D) rows into the
        // keys' buffer, which the transpose has freed.
        let operands = Operands {
            q,
            q_layout: layout,
            keys_t: &ws.keys_t,
            v,
            v_layout: layout,
        };
        let merged = k;
        flash::attention(
            kernels,
            shape,
            operands,
            Visibility::Causal { offset: 0 },
            merged,
            &mut ws.flash[..threads],
        );

        // Step 5: the output projection.
        gemm::gemm_with(
            merged,
            D,
            rows,
            &self.out_weights,
            [out.as_mut_slice()],
            [D],
            &mut ws.gemm[..threads],
        );
    }
}
