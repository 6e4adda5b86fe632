//! The table of kernels each instruction set fills (one generic kernel per entry, instantiated
//! by `kernel_table!` in each instruction set's file) and its function types.

use crate::kernels::format::blocks::BlockRows;
use crate::kernels::format::Stored;
use crate::kernels::gemm::int8::{ColumnsPanel, RowsPanel};
use crate::kernels::Isa;

/// `c[i*ldc + j] (+)= Σ_p a[p*lda + i] · b[p*ldb + j]` for an `mr × nr` tile: see [`Kernels::tile`].
pub(crate) type TileFn = unsafe fn(
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
);
/// An int8 tile, `C (int8_mr × nr) (+)= A · B` over 8-bit blocks: see [`Kernels::int8_tile`].
pub(crate) type Int8TileFn =
    unsafe fn(a: RowsPanel<'_>, b: ColumnsPanel<'_>, c: &mut [f32], ldc: usize, accumulate: bool);
/// A row quantized to `q8_0` for the int8 tile: see [`Kernels::int8_quantize`].
pub(crate) type Int8QuantizeFn =
    unsafe fn(x: &[f32], bytes: &mut [u8], scales: &mut [f32], stride: usize);
/// Columns of bfloat16 tiles on AMX, `C (rows × 32·panels) (+)= A · B`: see
/// [`Kernels::bf16_tile`].
pub(crate) type Bf16TileFn = unsafe fn(
    a: (&[u16], usize),
    rows: usize,
    b: (&[u16], usize, usize),
    steps: usize,
    c: (&mut [f32], usize),
    accumulate: bool,
);
/// The online-softmax update of one key block: see [`Kernels::softmax_block`].
pub(crate) type SoftmaxBlockFn = unsafe fn(
    scores: &mut [f32],
    lds: usize,
    keys: usize,
    max: &mut [f32],
    sum: &mut [f32],
    rescale: &mut [f32],
);
/// The online-softmax update of one query: see [`Kernels::softmax_row`].
pub(crate) type SoftmaxRowFn = unsafe fn(row: &mut [f32], max: &mut f32, sum: &mut f32) -> f32;
/// See [`Kernels::softcap`].
pub(crate) type SoftcapFn = unsafe fn(values: &mut [f32], cap: f32);
/// A hint to bring `data` into L2: see [`Kernels::prefetch`].
pub(crate) type PrefetchFn = unsafe fn(data: &[f32]);
/// Stored elements widened to `f32`: see [`Kernels::widen`].
pub(crate) type WidenFn =
    unsafe fn(src: Stored<'_>, rows: usize, cols: usize, dst: &mut [f32], dst_stride: usize);
/// A few rows of a microtile over a stored matrix, any width: see [`Kernels::gemv_stored`].
pub(crate) type GemvStoredFn = unsafe fn(
    k: usize,
    a: &[f32],
    lda: usize,
    b: Stored<'_>,
    c: &mut [f32],
    ldc: usize,
    n: usize,
    rows: usize,
    accumulate: bool,
);
/// A micro-panel of a matrix in ggml's blocks widened to `f32`: see
/// [`Kernels::widen_blocks`].
pub(crate) type WidenBlocksFn = unsafe fn(
    src: BlockRows<'_>,
    j0: usize,
    width: usize,
    p0: usize,
    kc: usize,
    dst: &mut [f32],
    nr: usize,
);
/// A few rows times a matrix in ggml's blocks, widened in registers: see
/// [`Kernels::gemv_blocks`].
pub(crate) type GemvBlocksFn = unsafe fn(
    b: BlockRows<'_>,
    j0: usize,
    n: usize,
    a: &[f32],
    lda: usize,
    c: &mut [f32],
    ldc: usize,
    rows: usize,
    accumulate: bool,
);
/// A scaled out-of-place transpose: see [`Kernels::transpose`].
pub(crate) type TransposeFn = unsafe fn(
    src: &[f32],
    src_stride: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    dst_stride: usize,
    scale: f32,
);

/// The microkernels of one instruction set. Every function pointer is `unsafe` only because it
/// may be compiled with `#[target_feature]`; a `Kernels` value is handed out only by
/// [`Isa::kernels`], after checking that the CPU supports its instruction set, which makes every
/// call through it sound.
#[derive(Debug)]
pub(crate) struct Kernels {
    /// Which instruction set this table is for.
    pub isa: Isa,
    /// Rows of a microtile.
    pub mr: usize,
    /// Columns of a microtile.
    pub nr: usize,
    /// Rows of an int8 tile ([`Kernels::int8_tile`]; its columns are `nr`).
    pub int8_mr: usize,
    /// Lanes of one vector (`nr` is whole vectors): the rows a matrix in blocks interleaves
    /// ([`BlockRows`]).
    pub lanes: usize,
    /// The GEMM microtile, `C (mr × nr) (+)= A (mr × k) · B (k × nr)`, on "k-major" operands:
    /// element `(i, p)` of `A` is `a[p*lda + i]` and element `(p, j)` of `B` is `b[p*ldb + j]`
    /// (a packed panel is the case `lda = mr`, `ldb = nr`), with `lda ≥ mr`, `ldb ≥ nr`, `a`
    /// holding at least `(k-1)*lda + mr` values and `b` at least `(k-1)*ldb + nr` when `k > 0`.
    /// `c` is the tile with row stride `ldc ≥ nr`, at least `(mr-1)*ldc + nr` values. For every
    /// `(i, j)` it starts from `c[i*ldc + j]` when `accumulate` is true (else from 0), adds
    /// `a(i, p) * b(p, j)` for `p = 0, 1, .., k-1` in that order (fused multiply-add on FMA
    /// instruction sets) and stores the result. The order is part of the contract:
    /// `gemv_stored` repeats it for a few rows, so both paths give the same bits, and a chain
    /// split between a tile and a `gemv_stored` (or two calls) is the same chain. Every value stored that is a NaN is
    /// the canonical quiet NaN `f32::NAN` (`0x7fc00000`): when two NaNs meet in an add or
    /// multiply-add, which one an instruction passes on depends on the operand order the
    /// compiler picked, so NaN payloads would otherwise differ between the kernels.
    pub tile: TileFn,
    /// The int8 tile (`gemm/int8.rs`): `C (int8_mr × nr) (+)= A · B` where `A` is `int8_mr`
    /// rows and `B` `nr` columns, both in blocks of 32 steps of 8-bit integers with an `f32`
    /// scale each (`a` as [`RowsPanel`], `b` as [`ColumnsPanel`], the same number of
    /// blocks). For every `(i, j)` it starts from `c[i*ldc + j]` when `accumulate` is true
    /// (else from 0) and adds, block by block in order, `(da · db) · s` where `s` is the
    /// block's exact integer dot product of row `i` and column `j`, each product and the sum
    /// rounded on their own (no fused multiply-add), so every instruction set gives the same
    /// bits. `c` holds `(int8_mr-1)*ldc + nr` values, `ldc ≥ nr`; NaNs are stored as
    /// `f32::NAN`, as by [`tile`](Self::tile).
    pub int8_tile: Int8TileFn,
    /// One row of `A` quantized to `q8_0` for the int8 tile: block `b` of `x` (whole blocks
    /// of 32) by ggml's reference `quantize_row_q8_0`, its integers plus 128 into
    /// `bytes[b·stride·32 ..][..32]` and its scale (binary16, widened; NaN when the block
    /// holds a NaN) into `scales[b·stride]`. Plain code compiled for the table's features
    /// (exact operations: the same bytes on every table).
    pub int8_quantize: Int8QuantizeFn,
    /// The AMX tile of [`Compute::Bf16`](crate::Compute::Bf16) (`simd/amx.rs`, whose
    /// `bf16_tile` states the layouts and the arithmetic), on the table for CPUs with AMX-BF16
    /// only: the others compute that mode with [`tile`](Self::tile) on rounded operands.
    /// Stored NaNs are any NaN (the GEMM makes them `f32::NAN`).
    pub bf16_tile: Option<Bf16TileFn>,
    /// The online-softmax update for one block of `keys` keys against `q = max.len()` queries,
    /// scores stored key-major: `scores[j*lds + i]` is query `i`'s score for key `j`
    /// (`lds ≥ q`; `sum` and `rescale` also hold `q` values). For each query `i`:
    /// `new = max(max[i], max_j scores[j][i])`; `rescale[i] = exp(max[i] - new)`, or exactly 1
    /// when `max[i] == new` (also when both are `-inf`); `sum[i] *= rescale[i]`; `max[i] = new`;
    /// then for `j = 0, 1, ..` in order `scores[j][i] = exp(scores[j][i] - new)` (0 when `new` is
    /// `-inf`) and `sum[i] += scores[j][i]`. A NaN score makes that query's outputs NaN.
    pub softmax_block: SoftmaxBlockFn,
    /// `softmax_block` for one query whose scores against a key block are the contiguous
    /// `row`: the same operations and order, so the same bits (`max` and `sum` are the query's
    /// running values; returns its rescale factor).
    pub softmax_row: SoftmaxRowFn,
    /// `dst[p * dst_stride + t] = scale * src[t * src_stride + p]` for `t < rows`, `p < cols`
    /// (a scale of 1 copies exactly): `transpose::transpose_scaled`, or on x86-64 its AVX
    /// version, whose blocks are vector shuffles (both walk the matrix the same way).
    pub transpose: TransposeFn,
    /// Logit soft-capping in place, `v = cap · tanh(v / cap)` for every value (`cap > 0`,
    /// finite): `tanh::softcap` or its vector version. Each value takes the same arithmetic
    /// wherever it sits in the slice, so a score capped in a key-major column (the tile path)
    /// and in a query's row (the row path) gets the same bits.
    pub softcap: SoftcapFn,
    /// Asks for every cache line of `data` to be brought into L2 (`prefetcht1` on x86-64;
    /// nothing in the portable table): the attention requests its next key block this way.
    pub prefetch: PrefetchFn,
    /// `dst[r * dst_stride + c]` = element `(r, c)` of the stored `rows × cols` matrix `src`
    /// (plain rows, any format) widened to `f32`, exactly as the scalar conversions of
    /// `format::element` widen it (a `q8_0` value is its integer times its block's scale,
    /// one `f32` product), for `r < rows`, `c < cols`; other values of `dst` are untouched.
    /// The attention widens a key block's panel and value rows this way, the GEMM a 16-bit
    /// micro-panel.
    pub widen: WidenFn,
    /// Rows of `tile` over a stored `k × n` matrix `b`, any width, for `rows ≤
    /// gemv::STORED_ROWS` rows at once: row `r` is `a[r·lda ..][..k]` into `c[r·ldc ..][..n]`;
    /// for each `j < n` it starts from `c` when `accumulate` (else 0) and adds `a[p] · b(p,
    /// j)` for `p = 0, 1, .., k-1` in that order, the tile's arithmetic (NaNs stored
    /// canonical), so a row computed either way has the same bits. `b` is plain rows or the
    /// `nr`-column panels of a [`PackedB`](crate::kernels::PackedB) (column `j` is column
    /// `j % nr` of panel `j / nr`), in any format, each element widened in registers exactly
    /// as `widen` widens it, once for all the rows: the bits of the same matrix widened to
    /// `f32` first. It avoids the empty rows of a tile for a few rows: decoding's projections
    /// (weights streamed panel by panel, prefetched ahead) and the attention's row path (the
    /// query heads of one key/value head together, each stored key and value widened once
    /// for all of them), and near the causal diagonal one row's chain over the keys only
    /// that row sees.
    pub gemv_stored: GemvStoredFn,
    /// Steps `p0 .. p0 + kc` of output rows `j0 .. j0 + width` of a matrix kept in ggml's
    /// blocks (`format::blocks`, rows interleaved `lanes` at a time; `p0` and `kc` whole
    /// blocks, `j0` whole groups, `width ≤ nr`) widened into the
    /// `kc × nr` panel `dst`: `dst[p · nr + c]` is value `p0 + p` of row `j0 + c`, exactly as
    /// ggml's reference dequantization computes it, and 0 for `c ≥ width`. The GEMM widens the
    /// micro-panels of a [`PackedB`](crate::kernels::PackedB) in a block format this way for
    /// the microtile (prefill): the bits of the `f32` matrix of the dequantized weights.
    pub widen_blocks: WidenBlocksFn,
    /// `gemv_stored` over a `k × n`-column slice of a matrix `b` kept in ggml's blocks (`b.k`
    /// steps, columns `j0 .. j0 + n`, `j0` whole groups of `lanes`), for `rows ≤ gemm::blocks::BLOCK_ROWS` rows at once:
    /// row `r` is `a[r·lda ..][..k]` into `c[r·ldc ..][..n]`, each output the tile's chain
    /// over `p = 0 .. k` from `c` when `accumulate` (else 0), NaNs stored canonical. Each
    /// value is widened in registers as `widen_blocks` widens it, once for all the rows: the
    /// bits of the `f32` matrix of the dequantized weights, with no widened panel stored
    /// (decoding's projections over block weights).
    pub gemv_blocks: GemvBlocksFn,
    /// The table's vector `exp` of every value in place (the unit tests' access to it).
    #[cfg(all(test, feature = "std"))]
    pub exp: unsafe fn(&mut [f32]),
    /// The table's softmax-probability `exp` of every value in place (for the unit tests).
    #[cfg(all(test, feature = "std"))]
    pub probability: unsafe fn(&mut [f32]),
}

impl Kernels {
    /// Whether `rows` rows are few enough to go row by row (`gemv`, `softmax_row`) rather than
    /// through mostly empty `mr`-row tiles: at most half a tile. The GEMM, the attention and
    /// the thread choice all use this one rule.
    pub(crate) fn few_rows(&self, rows: usize) -> bool {
        2 * rows <= self.mr
    }
}
