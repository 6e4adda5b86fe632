//! The AVX2 + FMA (+ F16C, for binary16 keys and values) primitives: 256-bit vectors of 8
//! `f32`, 16 vector registers. The table's
//! microtile is `6 × 16`: 12 `ymm` accumulators, two `ymm` of `B` and a broadcast per step.
//! Two tables: [`KERNELS`], and [`vnni::KERNELS`] for CPUs with AVX-VNNI (the VEX encoding of
//! `vpdpbusd`), whose int8 tile sums bytes with it (the same exact integers the other computes
//! by widening them, so the same bits; every other entry is the same code).

use core::arch::x86_64::*;

use crate::kernels::simd::{
    int8_block_dot, int8_block_widened, kernel_table, one_intrinsic_each, DotBytes, Rows, RowsMut,
    Simd,
};
use crate::kernels::Isa;

/// The AVX2 + FMA + F16C token, and with `VNNI` AVX-VNNI: only [`Avx2::new`] and
/// [`Avx2::with_vnni`] make one, and only code compiled with those features can call them
/// safely.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2<const VNNI: bool = false>(());

impl Avx2 {
    /// The token, in code compiled for AVX2, FMA and F16C (which runs only where the CPU has
    /// them).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn new() -> Avx2 {
        Avx2(())
    }
}

impl Avx2<true> {
    /// The token with AVX-VNNI, in code compiled for it too.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub(crate) fn with_vnni() -> Avx2<true> {
        Avx2(())
    }
}

kernel_table! {
    #[target_feature(enable = "avx2,fma,f16c")]
    isa: Isa::Avx2,
    token: Avx2 = Avx2::new(),
    tile: 6 x 2,
    int8_rows: 4,
}

/// The table for CPUs with AVX-VNNI as well.
pub(crate) mod vnni {
    use super::*;

    kernel_table! {
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        isa: Isa::Avx2,
        token: Avx2<true> = Avx2::with_vnni(),
        tile: 6 x 2,
        int8_rows: 4,
    }
}

/// Round to nearest (ties to even), exceptions suppressed.
const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

/// Runs AVX2 + FMA code: the `unsafe` of calling a `#[target_feature]` function from a
/// function without those features is sound because an [`Avx2`] token exists.
macro_rules! avx2 {
    ($e:expr) => {
        // SAFETY: an `Avx2` token exists, so the CPU runs AVX2 and FMA (see `Avx2::new`).
        unsafe { $e }
    };
}

/// `2^k` per lane for `-126 ≤ k ≤ 127`, from the exponent bits.
#[inline(always)]
fn pow2<const VNNI: bool>(_: Avx2<VNNI>, k: __m256i) -> __m256 {
    avx2!(_mm256_castsi256_ps(_mm256_slli_epi32::<23>(
        _mm256_add_epi32(k, _mm256_set1_epi32(127))
    )))
}

/// All-ones in the first `n` lanes.
#[inline(always)]
fn first_lanes<const VNNI: bool>(_: Avx2<VNNI>, n: usize) -> __m256i {
    avx2!(_mm256_cmpgt_epi32(
        _mm256_set1_epi32(n as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
    ))
}

impl<const VNNI: bool> DotBytes for Avx2<VNNI> {
    type I = __m256i;

    #[inline(always)]
    fn zero_i(self) -> __m256i {
        avx2!(_mm256_setzero_si256())
    }

    #[inline(always)]
    fn splat_i(self, x: i32) -> __m256i {
        avx2!(_mm256_set1_epi32(x))
    }

    #[inline(always)]
    unsafe fn load_i(self, src: *const i8) -> __m256i {
        // SAFETY: the caller's promise; the token's features.
        unsafe { _mm256_loadu_si256(src.cast()) }
    }

    #[inline(always)]
    unsafe fn dot_bytes(self, sum: __m256i, x: __m256i, v: __m256i) -> __m256i {
        // SAFETY: the caller's promise (a VNNI token exists only where the CPU has AVX-VNNI).
        unsafe { _mm256_dpbusd_avx_epi32(sum, x, v) }
    }

    #[inline(always)]
    fn to_floats(self, i: __m256i) -> __m256 {
        avx2!(_mm256_cvtepi32_ps(i))
    }
}

impl<const VNNI: bool> Simd for Avx2<VNNI> {
    type V = __m256;
    type M = __m256;
    const LANES: usize = 8;
    const FLUSHES_TINY_PROBABILITIES: bool = true;
    /// 12 accumulators, the broadcast of `a[p]` and a loaded tail fit the 16 `ymm` registers,
    /// and 12 independent chains keep both FMA pipes busy (it takes 8: two pipes of 4-cycle
    /// latency).
    const GEMV_VECTORS: usize = 12;
    /// A row-by-row walk over data that comes from L3 or memory otherwise waits for each
    /// line: each row is requested 8 rows before its multiply-adds.
    const GEMV_PREFETCH_STEPS: usize = 8;
    /// 16 steps of a 16-wide packed panel: the micro-panel is requested 1 KiB (in `f32`)
    /// ahead of the multiply-adds that read it.
    const TILE_PREFETCH_STEPS: usize = 16;
    /// The tile's 6 rows of `C` (one or two lines each) are requested before its steps, so
    /// that loading and storing them after the last step finds them in the cache.
    const TILE_PREFETCHES_C: bool = true;

    /// `vmaskmovps`: masked-off lanes are not read.
    #[inline(always)]
    unsafe fn load_first(self, src: *const f32, n: usize) -> __m256 {
        // SAFETY: the caller's promise (n readable floats); the mask enables those only.
        unsafe { _mm256_maskload_ps(src, first_lanes(self, n)) }
    }
    /// In pieces of 4, 2 and 1 lanes: `vmaskmovps` stores are slow on AMD cores, and a copy
    /// through memory would be a `memcpy` call.
    #[inline(always)]
    unsafe fn store_first(self, dst: *mut f32, n: usize, v: __m256) {
        let (mut part, mut dst, mut n) = (avx2!(_mm256_castps256_ps128(v)), dst, n);
        // SAFETY: (every store) the caller's promise: n ≤ 8 writable floats at `dst`, of
        // which each piece writes the next ones.
        unsafe {
            if n >= 4 {
                _mm_storeu_ps(dst, part);
                part = _mm256_extractf128_ps::<1>(v);
                (dst, n) = (dst.add(4), n - 4);
            }
            if n >= 4 {
                _mm_storeu_ps(dst, part);
                return;
            }
            if n >= 2 {
                _mm_storel_epi64(dst.cast(), _mm_castps_si128(part));
                part = _mm_movehl_ps(part, part);
                (dst, n) = (dst.add(2), n - 2);
            }
            if n == 1 {
                _mm_store_ss(dst, part);
            }
        }
    }
    /// Zero-extended to 32 bits, then shifted into the top half.
    #[inline(always)]
    unsafe fn load_bf16(self, src: *const u16) -> __m256 {
        // SAFETY: the caller's promise (8 readable values, 16 bytes); the token's features.
        unsafe {
            let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(src.cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
        }
    }
    /// `vcvtph2ps` (F16C).
    #[inline(always)]
    unsafe fn load_f16(self, src: *const u16) -> __m256 {
        // SAFETY: the caller's promise (8 readable values, 16 bytes); the token's features.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(src.cast())) }
    }
    #[inline(always)]
    unsafe fn load_i8(self, src: *const i8) -> __m256 {
        // SAFETY: the caller's promise (8 readable bytes); the token's features.
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(src.cast()))) }
    }

    /// With VNNI, one `vpdpbusd` per four steps of each row and group, in `i32` lanes.
    #[inline(always)]
    unsafe fn int8_block<const R: usize, const G: usize>(
        self,
        a: *const u8,
        b: *const i8,
    ) -> [[__m256; G]; R] {
        // SAFETY: the caller's promise, passed on; with VNNI the token's CPU has the
        // instruction.
        unsafe {
            match VNNI {
                true => int8_block_dot(self, a, b),
                false => int8_block_widened(self, a, b),
            }
        }
    }

    #[inline(always)]
    unsafe fn load_bits<const SHIFT: i32, const BITS: u32>(self, src: *const u8) -> __m256 {
        // SAFETY: the caller's promise (8 readable bytes); the token's features.
        unsafe {
            let bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.cast()));
            let mask = _mm256_set1_epi32(((1u32 << BITS) - 1) as i32);
            let fields = _mm256_and_si256(_mm256_srli_epi32::<SHIFT>(bytes), mask);
            _mm256_cvtepi32_ps(fields)
        }
    }

    one_intrinsic_each! {
        avx2;
        splat: _mm256_set1_ps; first: _mm256_cvtss_f32;
        load: _mm256_loadu_ps; store: _mm256_storeu_ps;
        binary: add => _mm256_add_ps, sub => _mm256_sub_ps, mul => _mm256_mul_ps,
            div => _mm256_div_ps, max => _mm256_max_ps;
        ternary: mul_add => _mm256_fmadd_ps, neg_mul_add => _mm256_fnmadd_ps;
        compare: lt => _mm256_cmp_ps::<_CMP_LT_OQ>, eq => _mm256_cmp_ps::<_CMP_EQ_OQ>;
    }
    /// `min(hi, max(lo, x))`: `vmaxps`/`vminps` return their second operand, `x`, when it is
    /// NaN (and `max` is `vmaxps`: `b` unless `a > b`, so a NaN in either gives `b`, and ties
    /// give `b`).
    #[inline(always)]
    fn clamp(self, x: __m256, lo: __m256, hi: __m256) -> __m256 {
        avx2!(_mm256_min_ps(hi, _mm256_max_ps(lo, x)))
    }
    #[inline(always)]
    fn round(self, x: __m256) -> __m256 {
        avx2!(_mm256_round_ps::<NEAREST>(x))
    }
    /// `(x · 2^n1) · 2^n2`, `n1 = n >> 1`, `n2 = n - n1` (NaN lanes of `n` give garbage
    /// exponents, but `x` is NaN there).
    #[inline(always)]
    fn scale(self, x: __m256, n: __m256) -> __m256 {
        let n = avx2!(_mm256_cvtps_epi32(n));
        let n1 = avx2!(_mm256_srai_epi32::<1>(n));
        let n2 = avx2!(_mm256_sub_epi32(n, n1));
        self.mul(self.mul(x, pow2(self, n1)), pow2(self, n2))
    }
    #[inline(always)]
    fn scale_normal(self, x: __m256, n: __m256) -> __m256 {
        self.mul(x, pow2(self, avx2!(_mm256_cvtps_epi32(n))))
    }
    #[inline(always)]
    fn abs(self, x: __m256) -> __m256 {
        avx2!(_mm256_andnot_ps(_mm256_set1_ps(-0.0), x))
    }
    #[inline(always)]
    fn with_sign_of(self, magnitude: __m256, x: __m256) -> __m256 {
        avx2!(_mm256_or_ps(
            magnitude,
            _mm256_and_ps(_mm256_set1_ps(-0.0), x)
        ))
    }

    #[inline(always)]
    fn is_nan(self, x: __m256) -> __m256 {
        avx2!(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
    }
    #[inline(always)]
    fn or(self, a: __m256, b: __m256) -> __m256 {
        avx2!(_mm256_or_ps(a, b))
    }
    #[inline(always)]
    fn select(self, m: __m256, a: __m256, b: __m256) -> __m256 {
        avx2!(_mm256_blendv_ps(b, a, m))
    }
    #[inline(always)]
    fn zero_where(self, m: __m256, v: __m256) -> __m256 {
        avx2!(_mm256_andnot_ps(m, v))
    }
    #[inline(always)]
    fn prefetch(self, data: *const f32) {
        avx2!(_mm_prefetch::<_MM_HINT_T0>(data.cast()));
    }
    #[inline(always)]
    fn prefetch_l2(self, data: *const f32) {
        avx2!(_mm_prefetch::<_MM_HINT_T1>(data.cast()));
    }

    #[inline(always)]
    fn transpose_block<const H: usize>(self, src: Rows<'_>, dst: RowsMut<'_>, scale: f32) {
        let ((src, src_stride), (dst, dst_stride)) = (src, dst);
        if H == 8 {
            block8(self, src, src_stride, dst, dst_stride, scale);
        } else {
            block4(self, src, src_stride, dst, dst_stride, scale);
        }
    }
}

/// Rows `t` of `src[t * src_stride..][..8]` for `t < N`, loaded.
///
/// # Panics
/// When `src` holds fewer than `(N-1)·src_stride + 8` values.
#[inline(always)]
fn load_rows<const N: usize, const VNNI: bool>(
    s: Avx2<VNNI>,
    src: &[f32],
    src_stride: usize,
) -> [__m256; N] {
    assert!(src.len() >= (N - 1) * src_stride + 8);
    let mut rows = [s.zero(); N];
    for (t, row) in rows.iter_mut().enumerate() {
        // SAFETY: row t < N starts at t·src_stride and holds 8 values, inside `src` by the
        // assertion.
        *row = unsafe { s.load(src.as_ptr().add(t * src_stride)) };
    }
    rows
}

/// An `8 × 8` block: column `p` of the 8 rows of `src` becomes `dst[p * dst_stride..][..8]`.
#[inline(always)]
fn block8<const VNNI: bool>(
    s: Avx2<VNNI>,
    src: &[f32],
    src_stride: usize,
    dst: &mut [f32],
    dst_stride: usize,
    scale: f32,
) {
    let [r0, r1, r2, r3, r4, r5, r6, r7] = load_rows::<8, VNNI>(s, src, src_stride);
    // Pairs of rows interleaved: (a0 b0 a1 b1 | a4 b4 a5 b5), (a2 b2 a3 b3 | a6 b6 a7 b7).
    let (t0, t1) = avx2!((_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1)));
    let (t2, t3) = avx2!((_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3)));
    let (t4, t5) = avx2!((_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5)));
    let (t6, t7) = avx2!((_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7)));
    // Quads: s0 = (a0 b0 c0 d0 | a4 b4 c4 d4), s1 columns 1 | 5, s2 2 | 6, s3 3 | 7;
    // s4 .. s7 the same for rows 4 .. 7.
    let quads = avx2!([
        _mm256_shuffle_ps::<0x44>(t0, t2),
        _mm256_shuffle_ps::<0xEE>(t0, t2),
        _mm256_shuffle_ps::<0x44>(t1, t3),
        _mm256_shuffle_ps::<0xEE>(t1, t3),
        _mm256_shuffle_ps::<0x44>(t4, t6),
        _mm256_shuffle_ps::<0xEE>(t4, t6),
        _mm256_shuffle_ps::<0x44>(t5, t7),
        _mm256_shuffle_ps::<0xEE>(t5, t7),
    ]);
    // Column p: the low halves (p < 4) or high halves (p ≥ 4) of the two quads.
    let columns = avx2!([
        _mm256_permute2f128_ps::<0x20>(quads[0], quads[4]),
        _mm256_permute2f128_ps::<0x20>(quads[1], quads[5]),
        _mm256_permute2f128_ps::<0x20>(quads[2], quads[6]),
        _mm256_permute2f128_ps::<0x20>(quads[3], quads[7]),
        _mm256_permute2f128_ps::<0x31>(quads[0], quads[4]),
        _mm256_permute2f128_ps::<0x31>(quads[1], quads[5]),
        _mm256_permute2f128_ps::<0x31>(quads[2], quads[6]),
        _mm256_permute2f128_ps::<0x31>(quads[3], quads[7]),
    ]);
    assert!(dst.len() >= 7 * dst_stride + 8);
    let scale = s.splat(scale);
    for (p, column) in columns.into_iter().enumerate() {
        // SAFETY: column p < 8 goes to p·dst_stride .. + 8, inside `dst` by the assertion.
        unsafe { s.store(dst.as_mut_ptr().add(p * dst_stride), s.mul(scale, column)) };
    }
}

/// A `4 × 8` block: column `p` of the 4 rows of `src` becomes `dst[p * dst_stride..][..4]`.
#[inline(always)]
fn block4<const VNNI: bool>(
    s: Avx2<VNNI>,
    src: &[f32],
    src_stride: usize,
    dst: &mut [f32],
    dst_stride: usize,
    scale: f32,
) {
    let [r0, r1, r2, r3] = load_rows::<4, VNNI>(s, src, src_stride);
    let (t0, t1) = avx2!((_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1)));
    let (t2, t3) = avx2!((_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3)));
    // Quads: columns 0 | 4, 1 | 5, 2 | 6, 3 | 7.
    let quads = avx2!([
        _mm256_shuffle_ps::<0x44>(t0, t2),
        _mm256_shuffle_ps::<0xEE>(t0, t2),
        _mm256_shuffle_ps::<0x44>(t1, t3),
        _mm256_shuffle_ps::<0xEE>(t1, t3),
    ]);
    assert!(dst.len() >= 7 * dst_stride + 4);
    let scale = avx2!(_mm_set1_ps(scale));
    for (p, quad) in quads.into_iter().enumerate() {
        let (low, high) = avx2!((
            _mm_mul_ps(scale, _mm256_castps256_ps128(quad)),
            _mm_mul_ps(scale, _mm256_extractf128_ps::<1>(quad))
        ));
        // SAFETY: columns p and p + 4 (< 8) go to their dst_stride rows, 4 values each,
        // inside `dst` by the assertion.
        unsafe {
            _mm_storeu_ps(dst.as_mut_ptr().add(p * dst_stride), low);
            _mm_storeu_ps(dst.as_mut_ptr().add((p + 4) * dst_stride), high);
        }
    }
}
