//! The vector primitives every kernel is written in, and the macro that turns one
//! instruction set's primitives into its [`Kernels`](crate::kernels::Kernels) table.
//!
//! The kernels (`micro.rs`: tile; `gemv.rs`; `gemm/blocks.rs`: `widen_blocks`, `gemv_blocks`;
//! `format/widen.rs`; `softmax.rs`; `exp.rs`; `tanh.rs`; `transpose.rs`) are generic over
//! [`Simd`] and `#[inline(always)]` down to the primitives.
//! [`kernel_table!`] instantiates each of them inside a function compiled for the instruction
//! set (`#[target_feature]`), so the whole kernel, primitives included, is compiled as one
//! function with those features, and every instruction set computes the same operations in the
//! same order by construction. An instruction set is one file: a token type implementing
//! [`Simd`] and one `kernel_table!` call.
//!
//! A token is a zero-sized value that proves the CPU runs its instruction set: the vector
//! types' tokens are made only by a `#[target_feature]` constructor, which safe code can call
//! only from functions compiled with those features, and those in turn only run where the CPU
//! has them (the table is handed out after the CPU check). That is what makes the primitives'
//! own `unsafe` sound.

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
pub(crate) mod portable;

use crate::kernels::format::element::{bf16_to_f32, f16_to_f32};

/// One instruction set's vector of `f32` lanes and the operations the kernels use.
///
/// Unless said otherwise a primitive is exact IEEE arithmetic per lane, rounding to nearest.
/// Where instruction sets differ (which NaN a `max` passes on, whether `mul_add` is fused)
/// the primitive says what the kernels may rely on.
pub(crate) trait Simd: Copy {
    /// A vector of [`Simd::LANES`] floats.
    type V: Copy;
    /// A lane mask, as comparisons give it.
    type M: Copy;
    /// Lanes of one vector.
    const LANES: usize;
    /// Whether softmax probabilities below the smallest normal float become exactly 0 (see
    /// [`crate::kernels::math::exp::probability`]).
    const FLUSHES_TINY_PROBABILITIES: bool;
    /// Most vectors of columns one pass of `gemv` keeps in registers for one row.
    const GEMV_VECTORS: usize;
    /// How many steps ahead `gemv` prefetches the packed panels of `B` (0: never).
    const GEMV_PREFETCH_STEPS: usize;
    /// How many steps ahead the microtile prefetches its rows of `B` (0: never).
    const TILE_PREFETCH_STEPS: usize;
    /// Whether the microtile asks for its rows of `C` before its steps.
    const TILE_PREFETCHES_C: bool;

    /// Every lane `x`.
    fn splat(self, x: f32) -> Self::V;
    /// `src[..LANES]`.
    ///
    /// # Safety
    /// `src` points to `LANES` readable floats (no alignment needed).
    unsafe fn load(self, src: *const f32) -> Self::V;
    /// `dst[..LANES] = v`.
    ///
    /// # Safety
    /// `dst` points to `LANES` writable floats (no alignment needed).
    unsafe fn store(self, dst: *mut f32, v: Self::V);
    /// `src[..n]` in the first `n` lanes (`1 ≤ n ≤ LANES`), zeros in the others; nothing
    /// past `src + n` is read.
    ///
    /// # Safety
    /// `src` points to `n` readable floats.
    unsafe fn load_first(self, src: *const f32, n: usize) -> Self::V;
    /// `dst[..n]` = the first `n` lanes of `v` (`1 ≤ n ≤ LANES`); nothing past `dst + n` is
    /// written.
    ///
    /// # Safety
    /// `dst` points to `n` writable floats.
    unsafe fn store_first(self, dst: *mut f32, n: usize, v: Self::V);
    /// Lane 0.
    fn first(self, v: Self::V) -> f32;

    /// `src[..LANES]`, bfloat16 bits, widened to `f32` (exactly).
    ///
    /// # Safety
    /// `src` points to `LANES` readable values (no alignment needed).
    #[inline(always)]
    unsafe fn load_bf16(self, src: *const u16) -> Self::V {
        // SAFETY: the caller's promise, for lane i < LANES.
        self.load_lanes(|i| bf16_to_f32(unsafe { src.add(i).read_unaligned() }))
    }
    /// `src[..LANES]`, binary16 bits, widened to `f32` (exactly).
    ///
    /// # Safety
    /// `src` points to `LANES` readable values (no alignment needed).
    #[inline(always)]
    unsafe fn load_f16(self, src: *const u16) -> Self::V {
        // SAFETY: the caller's promise, for lane i < LANES.
        self.load_lanes(|i| f16_to_f32(unsafe { src.add(i).read_unaligned() }))
    }
    /// `src[..LANES]`, bfloat16 (`BF16`) or binary16 bits, widened to `f32` (exactly).
    ///
    /// # Safety
    /// `src` points to `LANES` readable values (no alignment needed).
    #[inline(always)]
    unsafe fn load_half<const BF16: bool>(self, src: *const u16) -> Self::V {
        // SAFETY: the caller's promise.
        unsafe {
            if BF16 {
                self.load_bf16(src)
            } else {
                self.load_f16(src)
            }
        }
    }
    /// `src[..LANES]`, integers, as `f32` (exactly).
    ///
    /// # Safety
    /// `src` points to `LANES` readable values.
    #[inline(always)]
    unsafe fn load_i8(self, src: *const i8) -> Self::V {
        // SAFETY: the caller's promise, for lane i < LANES.
        self.load_lanes(|i| f32::from(unsafe { *src.add(i) }))
    }
    /// `src[..LANES]`, bytes, each shifted right by `SHIFT` bits and masked to its low `BITS`
    /// bits, as `f32` (exactly: an integer in `0 .. 2^BITS`). The block formats' packed
    /// integers (nibbles, 2-bit and 1-bit fields) are read this way.
    ///
    /// # Safety
    /// `src` points to `LANES` readable bytes.
    #[inline(always)]
    unsafe fn load_bits<const SHIFT: i32, const BITS: u32>(self, src: *const u8) -> Self::V {
        let mask = (1u32 << BITS) - 1;
        // SAFETY: the caller's promise, for lane i < LANES.
        self.load_lanes(|i| ((u32::from(unsafe { *src.add(i) }) >> SHIFT) & mask) as f32)
    }
    /// The vector of lanes `lane(0), .., lane(LANES - 1)`, through memory (the widening
    /// loads of an instruction set without a conversion instruction).
    #[inline(always)]
    fn load_lanes(self, lane: impl Fn(usize) -> f32) -> Self::V {
        let mut lanes = [0.0f32; MAX_LANES];
        for (i, value) in lanes[..Self::LANES].iter_mut().enumerate() {
            *value = lane(i);
        }
        // SAFETY: `lanes` holds MAX_LANES ≥ LANES floats.
        unsafe { self.load(lanes.as_ptr()) }
    }

    /// `a + b`.
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a - b`.
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a · b`.
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`.
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a · b + c`: fused (rounded once) on the vector tables, `a · b` rounded, then the sum,
    /// on the portable one.
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `c - a · b`, fused or not as [`Simd::mul_add`].
    fn neg_mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// The larger of `a` and `b`, or a NaN when `b` is one (then `b`'s NaN, or, when both
    /// are, either). A NaN `a` with a number `b` gives `b` or `a` as the instruction set has
    /// it, and which of `±0` a tie of zeros gives is the instruction set's too: callers that
    /// need a NaN to win track it with [`Simd::is_nan`].
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// `x` clamped to `[lo, hi]`, with a NaN `x` passed through.
    fn clamp(self, x: Self::V, lo: Self::V, hi: Self::V) -> Self::V;
    /// `x` rounded to an integer, ties to even, for `|x| < 2^22` (NaN stays NaN).
    fn round(self, x: Self::V) -> Self::V;
    /// `x · 2^n` for integral `n` in `[-150, 128]`, rounded once (so a subnormal result is
    /// rounded from `x`, and `n = 128` overflows to infinity); NaN `x` gives NaN.
    fn scale(self, x: Self::V, n: Self::V) -> Self::V;
    /// [`Simd::scale`] where `2^n` and the result are normal floats: `n` in `[-126, 0]`
    /// and `x` in `[0.5, 2]` or NaN.
    fn scale_normal(self, x: Self::V, n: Self::V) -> Self::V;
    /// `|x|`: `x` with its sign bit cleared (NaNs too).
    fn abs(self, x: Self::V) -> Self::V;
    /// The bits of `magnitude` with the sign bit of `x` or-ed in.
    fn with_sign_of(self, magnitude: Self::V, x: Self::V) -> Self::V;

    /// `a < b` (false when either is NaN).
    fn lt(self, a: Self::V, b: Self::V) -> Self::M;
    /// `a == b` (false when either is NaN; `-0 == +0`).
    fn eq(self, a: Self::V, b: Self::V) -> Self::M;
    /// Whether `x` is a NaN.
    fn is_nan(self, x: Self::V) -> Self::M;
    /// Lanes set in `a` or `b`.
    fn or(self, a: Self::M, b: Self::M) -> Self::M;
    /// `a` in the lanes of `m`, `b` in the others.
    fn select(self, m: Self::M, a: Self::V, b: Self::V) -> Self::V;
    /// `v` with 0 in the lanes of `m`.
    fn zero_where(self, m: Self::M, v: Self::V) -> Self::V;
    /// `v` with a NaN in the lanes of `m` (a lane that already holds a NaN may keep it).
    #[inline(always)]
    fn set_nan(self, v: Self::V, m: Self::M) -> Self::V {
        self.select(m, self.splat(f32::NAN), v)
    }
    /// `v` with every NaN lane the canonical NaN `f32::NAN` (see
    /// [`Kernels::tile`](crate::kernels::Kernels::tile)).
    #[inline(always)]
    fn canonical_nan(self, v: Self::V) -> Self::V {
        self.set_nan(v, self.is_nan(v))
    }

    /// A hint to bring the cache line holding `data` into L1 (never faults).
    fn prefetch(self, data: *const f32);
    /// A hint to bring the cache line holding `data` into L2 (never faults).
    fn prefetch_l2(self, data: *const f32);

    /// `dst[p * dst_stride + t] = scale * src[t * src_stride + p]` for `t < H`, `p < 8`
    /// (`H` is 4 or 8), with `src = (src, src_stride)` and `dst = (dst, dst_stride)`: one block of [`crate::kernels::gemm::transpose`]'s walk, in whatever registers the
    /// instruction set has, one multiply per value.
    ///
    /// # Panics
    /// When `src` holds fewer than `(H-1)·src_stride + 8` values or `dst` fewer than
    /// `7·dst_stride + H`.
    fn transpose_block<const H: usize>(self, src: Rows<'_>, dst: RowsMut<'_>, scale: f32);

    /// The lane `f` of one float: `f` on a vector of `x`, lane 0.
    #[inline(always)]
    fn on_one(self, x: f32, f: impl FnOnce(Self::V) -> Self::V) -> f32 {
        self.first(f(self.splat(x)))
    }

    /// Zeros.
    #[inline(always)]
    fn zero(self) -> Self::V {
        self.splat(0.0)
    }

    /// The integer sums of one 32-step block of an `R × G`-vector int8 tile:
    /// `sums[i][g]` lane `c` is `Σ_{t<32} a[i·32 + t] · b[g·32·LANES + (t/4)·4·LANES + 4c + t%4]`
    /// (bytes `a` unsigned, `b` signed), exactly, as floats: every sum is below `2^24` in
    /// magnitude (at most `32 · 255 · 128`), so the order of the additions does not matter
    /// and every instruction set gives the same values. `b`'s layout is the one `vpdpbusd`
    /// reads: four consecutive steps of a column in each 32-bit lane. Emulated with `f32`
    /// multiply-adds of the widened bytes; the AVX-512 table with VNNI overrides it.
    ///
    /// # Safety
    /// `a` points to `R · 32` readable bytes, `b` to `G · 32 · LANES`.
    #[inline(always)]
    unsafe fn int8_block<const R: usize, const G: usize>(
        self,
        a: *const u8,
        b: *const i8,
    ) -> [[Self::V; G]; R] {
        // SAFETY: the caller's promise, passed on.
        unsafe { int8_block_widened(self, a, b) }
    }

    /// One step of an `MR × NV`-vector microtile: `acc[i][v] = a[i] · b[v] + acc[i][v]`
    /// (one [`Simd::mul_add`] each) for `i < MR`, `v < NV`, with `a[i]` broadcast from
    /// `a_step[i]`. An instruction set may spell the broadcasts differently; the arithmetic is
    /// this.
    ///
    /// # Safety
    /// `a_step` points to `MR` readable floats.
    #[inline(always)]
    unsafe fn tile_step<const MR: usize, const NV: usize>(
        self,
        acc: &mut [[Self::V; NV]; MR],
        a_step: *const f32,
        b: &[Self::V; NV],
    ) {
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: the caller's promise, with i < MR.
            let a = self.splat(unsafe { *a_step.add(i) });
            for (sum, &b) in row.iter_mut().zip(b) {
                *sum = self.mul_add(a, b, *sum);
            }
        }
    }
}

/// [`Simd::int8_block`] by `f32` multiply-adds of the widened bytes (exact: every product
/// and partial sum is an integer below `2^24`).
///
/// # Safety
/// As [`Simd::int8_block`].
#[inline(always)]
pub(crate) unsafe fn int8_block_widened<S: Simd, const R: usize, const G: usize>(
    s: S,
    a: *const u8,
    b: *const i8,
) -> [[S::V; G]; R] {
    let lanes = S::LANES;
    let mut sums = [[s.zero(); G]; R];
    for t in 0..32 {
        let mut b_step = [s.zero(); G];
        for (g, v) in b_step.iter_mut().enumerate() {
            let step = b.wrapping_add(g * 32 * lanes + t / 4 * 4 * lanes + t % 4);
            // SAFETY: the caller's promise: lane c < LANES of step t of group g < G.
            *v = s.load_lanes(|c| f32::from(unsafe { *step.add(4 * c) }));
        }
        for (i, row) in sums.iter_mut().enumerate() {
            // SAFETY: the caller's promise: byte t < 32 of row i < R.
            let x = s.splat(f32::from(unsafe { *a.add(i * 32 + t) }));
            for (sum, &v) in row.iter_mut().zip(&b_step) {
                *sum = s.mul_add(x, v, *sum);
            }
        }
    }
    sums
}

/// The byte dot products of `vpdpbusd` (AVX512-VNNI, AVX-VNNI) over a token's vectors: the
/// integer vector type and the steps of [`int8_block_dot`].
#[cfg(target_arch = "x86_64")]
pub(crate) trait DotBytes: Simd {
    /// A vector of [`Simd::LANES`] 32-bit integers.
    type I: Copy;
    /// Every lane 0.
    fn zero_i(self) -> Self::I;
    /// Every lane the four bytes of `x`.
    fn splat_i(self, x: i32) -> Self::I;
    /// `4 · LANES` bytes from `src`.
    ///
    /// # Safety
    /// `src` points to `4 · LANES` readable bytes.
    unsafe fn load_i(self, src: *const i8) -> Self::I;
    /// Per lane, `sum` plus the four products of the unsigned bytes of `x` and the signed
    /// bytes of `v` (exact: `vpdpbusd`).
    ///
    /// # Safety
    /// The CPU has the instruction (a VNNI token).
    unsafe fn dot_bytes(self, sum: Self::I, x: Self::I, v: Self::I) -> Self::I;
    /// Each lane as `f32` (exact below `2^24`).
    fn to_floats(self, i: Self::I) -> Self::V;
}

/// [`Simd::int8_block`] by [`DotBytes::dot_bytes`]: per step of four bytes, each row's four
/// bytes broadcast against the step's `B` vectors; the exact integer sums as `f32` (the same
/// values [`int8_block_widened`] computes).
///
/// # Safety
/// As [`Simd::int8_block`], and as [`DotBytes::dot_bytes`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn int8_block_dot<S: DotBytes, const R: usize, const G: usize>(
    s: S,
    a: *const u8,
    b: *const i8,
) -> [[S::V; G]; R] {
    let lanes = S::LANES;
    let mut sums = [[s.zero_i(); G]; R];
    for q in 0..8 {
        let mut b_step = [s.zero_i(); G];
        for (g, v) in b_step.iter_mut().enumerate() {
            // SAFETY: the caller's promise: bytes 4q · LANES .. of group g < G.
            *v = unsafe { s.load_i(b.add(g * 32 * lanes + q * 4 * lanes)) };
        }
        for (i, row) in sums.iter_mut().enumerate() {
            // SAFETY: the caller's promise: bytes 4q .. 4q + 4 of row i < R.
            let x = s.splat_i(unsafe { a.add(i * 32 + 4 * q).cast::<i32>().read_unaligned() });
            for (sum, &v) in row.iter_mut().zip(&b_step) {
                // SAFETY: the caller's promise.
                *sum = unsafe { s.dot_bytes(*sum, x, v) };
            }
        }
    }
    // Plain loops (`array::map` may be left out of line, compiled without the features).
    let mut floats = [[s.zero(); G]; R];
    for (float_row, row) in floats.iter_mut().zip(&sums) {
        for (float, &sum) in float_row.iter_mut().zip(row) {
            *float = s.to_floats(sum);
        }
    }
    floats
}

/// Implements the [`Simd`] methods that are one intrinsic each, called through the
/// instruction set's `unsafe` wrapper macro `$wrap` (which states why the call is sound):
/// `splat`, `first`, the whole-vector `load` and `store` (unaligned), then `binary` methods
/// `(a, b) -> V`, `ternary` ones `(a, b, c) -> V` and `compare` ones `(a, b) -> M`, each as
/// `method => intrinsic` with the intrinsic's operands in the method's order.
macro_rules! one_intrinsic_each {
    (
        $wrap:ident;
        splat: $splat:path; first: $first:path; load: $load:path; store: $store:path;
        binary: $($binary:ident => $binary_intrinsic:path),*;
        ternary: $($ternary:ident => $ternary_intrinsic:path),*;
        compare: $($compare:ident => $compare_intrinsic:path),* $(;)?
    ) => {
        #[inline(always)]
        fn splat(self, x: f32) -> Self::V {
            $wrap!($splat(x))
        }
        #[inline(always)]
        fn first(self, v: Self::V) -> f32 {
            $wrap!($first(v))
        }
        #[inline(always)]
        unsafe fn load(self, src: *const f32) -> Self::V {
            // SAFETY: the caller's promise (LANES readable floats); the token's features.
            unsafe { $load(src) }
        }
        #[inline(always)]
        unsafe fn store(self, dst: *mut f32, v: Self::V) {
            // SAFETY: the caller's promise (LANES writable floats); the token's features.
            unsafe { $store(dst, v) }
        }
        $(
            #[inline(always)]
            fn $binary(self, a: Self::V, b: Self::V) -> Self::V {
                $wrap!($binary_intrinsic(a, b))
            }
        )*
        $(
            #[inline(always)]
            fn $ternary(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
                $wrap!($ternary_intrinsic(a, b, c))
            }
        )*
        $(
            #[inline(always)]
            fn $compare(self, a: Self::V, b: Self::V) -> Self::M {
                $wrap!($compare_intrinsic(a, b))
            }
        )*
    };
}

pub(crate) use one_intrinsic_each;

/// A matrix in a slice and the distance between its rows.
pub(crate) type Rows<'a> = (&'a [f32], usize);
/// A matrix in a mutable slice and the distance between its rows.
pub(crate) type RowsMut<'a> = (&'a mut [f32], usize);

/// The most lanes any instruction set's vector has (AVX-512's 16): room for one vector in a
/// local array.
pub(crate) const MAX_LANES: usize = 16;

/// Defines, in an instruction set's module, the kernel table `KERNELS` of the token type
/// `$token` (a [`Simd`]) with an `$mr × $nv`-vector microtile (and an `$int8_mr × $nv`-vector
/// int8 tile): one function per entry,
/// each with the given attributes (`#[target_feature(enable = "...")]` for the instruction
/// set's features) and each instantiating the one generic kernel with the token `$make`
/// (an expression that needs those features).
macro_rules! kernel_table {
    (@option) => { None };
    (@option $value:expr) => { Some($value) };
    (
        $(#[$features:meta])*
        isa: $isa:expr,
        token: $token:ty = $make:expr,
        tile: $mr:literal x $nv:literal,
        int8_rows: $int8_mr:literal
        $(, bf16_tile: $bf16_tile:expr)? $(,)?
    ) => {
        /// This instruction set's kernel table: the generic kernels instantiated for its
        /// token type.
        pub(crate) static KERNELS: $crate::kernels::Kernels = $crate::kernels::Kernels {
            isa: $isa,
            mr: $mr,
            lanes: <$token as $crate::kernels::simd::Simd>::LANES,
            nr: $nv * <$token as $crate::kernels::simd::Simd>::LANES,
            int8_mr: $int8_mr,
            tile: table::tile,
            int8_tile: table::int8_tile,
            int8_quantize: table::int8_quantize,
            bf16_tile: $crate::kernels::simd::kernel_table!(@option $($bf16_tile)?),
            softmax_block: table::softmax_block,
            softmax_row: table::softmax_row,
            transpose: table::transpose,
            softcap: table::softcap,
            prefetch: table::prefetch,
            widen: table::widen,
            gemv_stored: table::gemv_stored,
            widen_blocks: table::widen_blocks,
            gemv_blocks: table::gemv_blocks,
            #[cfg(all(test, feature = "std"))]
            exp: table::exp,
            #[cfg(all(test, feature = "std"))]
            probability: table::probability,
        };

        /// The entries of [`KERNELS`]: each the generic kernel, compiled for this
        /// instruction set.
        mod table {
            #[allow(unused_imports)]
            use super::*;
            use $crate::kernels::attention::softmax;
            use $crate::kernels::format::{blocks::BlockRows, widen as widening, Stored};
            use $crate::kernels::gemm::{blocks, gemv as row, int8, micro, transpose as walk};
            use $crate::kernels::math::tanh;

            // The parameters are those of the `Kernels` function types (see there).

            /// See [`Kernels::tile`]($crate::kernels::Kernels::tile).
            #[allow(clippy::too_many_arguments)]
            $(#[$features])*
            pub(super) fn tile(k: usize, a: &[f32], lda: usize, b: &[f32], ldb: usize,
                               c: &mut [f32], ldc: usize, accumulate: bool) {
                let (a, b, c) = ((a, lda), (b, ldb), (c, ldc));
                micro::tile::<$token, $mr, $nv>($make, k, a, b, c, accumulate)
            }

            /// See [`Kernels::int8_tile`]($crate::kernels::Kernels::int8_tile).
            $(#[$features])*
            pub(super) fn int8_tile(a: int8::RowsPanel<'_>, b: int8::ColumnsPanel<'_>,
                                    c: &mut [f32], ldc: usize, accumulate: bool) {
                int8::tile::<$token, $int8_mr, $nv>($make, a, b, (c, ldc), accumulate)
            }

            /// See [`Kernels::int8_quantize`]($crate::kernels::Kernels::int8_quantize).
            $(#[$features])*
            pub(super) fn int8_quantize(x: &[f32], bytes: &mut [u8], scales: &mut [f32],
                                        stride: usize) {
                int8::quantize_row($make, x, bytes, scales, stride)
            }

            /// See [`Kernels::softmax_block`]($crate::kernels::Kernels::softmax_block).
            $(#[$features])*
            pub(super) fn softmax_block(scores: &mut [f32], lds: usize, keys: usize,
                                        max: &mut [f32], sum: &mut [f32], rescale: &mut [f32]) {
                softmax::block($make, (scores, lds, keys), max, sum, rescale)
            }

            /// See [`Kernels::softmax_row`]($crate::kernels::Kernels::softmax_row).
            $(#[$features])*
            pub(super) fn softmax_row(row: &mut [f32], max: &mut f32, sum: &mut f32) -> f32 {
                softmax::row($make, row, max, sum)
            }

            /// See [`Kernels::transpose`]($crate::kernels::Kernels::transpose).
            $(#[$features])*
            pub(super) fn transpose(src: &[f32], src_stride: usize, rows: usize, cols: usize,
                                    dst: &mut [f32], dst_stride: usize, scale: f32) {
                walk::transpose($make, (src, src_stride), rows, cols, (dst, dst_stride), scale)
            }

            /// See [`Kernels::softcap`]($crate::kernels::Kernels::softcap).
            $(#[$features])*
            pub(super) fn softcap(values: &mut [f32], cap: f32) {
                tanh::softcap($make, values, cap)
            }

            /// See [`Kernels::prefetch`]($crate::kernels::Kernels::prefetch).
            $(#[$features])*
            pub(super) fn prefetch(data: &[f32]) {
                micro::prefetch_l2($make, data)
            }

            /// See [`Kernels::widen`]($crate::kernels::Kernels::widen).
            $(#[$features])*
            pub(super) fn widen(src: Stored<'_>, rows: usize, cols: usize,
                                dst: &mut [f32], dst_stride: usize) {
                widening::widen($make, src, rows, cols, (dst, dst_stride))
            }

            /// See [`Kernels::gemv_stored`]($crate::kernels::Kernels::gemv_stored).
            #[allow(clippy::too_many_arguments)]
            $(#[$features])*
            pub(super) fn gemv_stored(k: usize, a: &[f32], lda: usize, b: Stored<'_>,
                                      c: &mut [f32], ldc: usize, n: usize, rows: usize,
                                      accumulate: bool) {
                row::gemv::<_, $nv>($make, k, (a, lda), b, (c, ldc, n), rows, accumulate)
            }

            /// See [`Kernels::widen_blocks`]($crate::kernels::Kernels::widen_blocks).
            $(#[$features])*
            pub(super) fn widen_blocks(src: BlockRows<'_>, j0: usize, width: usize, p0: usize,
                                       kc: usize, dst: &mut [f32], nr: usize) {
                blocks::widen_panel($make, src, (j0, width), (p0, kc), (dst, nr))
            }

            /// See [`Kernels::gemv_blocks`]($crate::kernels::Kernels::gemv_blocks).
            #[allow(clippy::too_many_arguments)]
            $(#[$features])*
            pub(super) fn gemv_blocks(b: BlockRows<'_>, j0: usize, n: usize, a: &[f32],
                                      lda: usize, c: &mut [f32], ldc: usize, rows: usize,
                                      accumulate: bool) {
                blocks::gemv_blocks($make, b, (j0, n), (a, lda), (c, ldc), rows, accumulate)
            }

            /// `exp` of every value in place (the tests' access to the vector `exp`).
            #[cfg(all(test, feature = "std"))]
            $(#[$features])*
            pub(super) fn exp(values: &mut [f32]) {
                $crate::kernels::math::exp::exp_in_place($make, values)
            }

            /// The softmax's probability `exp` of every value in place (for the tests).
            #[cfg(all(test, feature = "std"))]
            $(#[$features])*
            pub(super) fn probability(values: &mut [f32]) {
                $crate::kernels::math::exp::probability_in_place($make, values)
            }
        }
    };
}

pub(crate) use kernel_table;
