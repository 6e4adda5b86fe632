//! The AVX-512F primitives: 512-bit vectors of 16 `f32`, 32 vector registers, lane masks in
//! `k` registers. The table's microtile is `12 × 32`: 24 `zmm` accumulators, two `zmm` of `B`
//! and a broadcast per step. Three tables: [`KERNELS`]; [`vnni::KERNELS`] for CPUs with
//! AVX512-VNNI, whose int8 tile sums bytes with `vpdpbusd` (the same exact integers the other
//! computes by widening them, so the same bits; every other entry is the same code); and
//! [`with_amx::KERNELS`], that one plus the AMX tile of `Compute::Bf16` (`amx.rs`).

use core::arch::x86_64::*;

use crate::kernels::simd::avx2::Avx2;
use crate::kernels::simd::{
    int8_block_dot, int8_block_widened, kernel_table, one_intrinsic_each, DotBytes, Rows, RowsMut,
    Simd,
};
use crate::kernels::Isa;

/// The AVX-512F token (with the AVX2 + FMA one: every CPU the table runs on has those, see
/// [`Isa::is_supported`]), and with `VNNI` AVX512-VNNI: only [`Avx512::new`] and
/// [`Avx512::with_vnni`] make one, and only code compiled with those features can call them
/// safely.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512<const VNNI: bool = false>(Avx2);

impl Avx512 {
    /// The token, in code compiled for AVX-512F, AVX2 and FMA (which runs only where the CPU
    /// has them).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(crate) fn new() -> Avx512 {
        Avx512(Avx2::new())
    }
}

impl Avx512<true> {
    /// The token with VNNI, in code compiled for AVX512-VNNI too.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni,avx2,fma,f16c")]
    pub(crate) fn with_vnni() -> Avx512<true> {
        Avx512(Avx2::new())
    }
}

kernel_table! {
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    isa: Isa::Avx512,
    token: Avx512 = Avx512::new(),
    tile: 12 x 2,
    int8_rows: 6,
}

/// The table for CPUs with AVX512-VNNI as well.
pub(crate) mod vnni {
    use super::*;

    kernel_table! {
        #[target_feature(enable = "avx512f,avx512vnni,avx2,fma,f16c")]
        isa: Isa::Avx512,
        token: Avx512<true> = Avx512::with_vnni(),
        tile: 12 x 2,
        int8_rows: 6,
    }
}

/// The table for CPUs with AVX512-VNNI and AMX-BF16 whose OS grants the tile state
/// ([`amx::usable`](crate::kernels::simd::amx::usable)): the VNNI table plus the AMX tile of
/// `Compute::Bf16`.
pub(crate) mod with_amx {
    use super::*;

    kernel_table! {
        #[target_feature(enable = "avx512f,avx512vnni,avx2,fma,f16c")]
        isa: Isa::Avx512,
        token: Avx512<true> = Avx512::with_vnni(),
        tile: 12 x 2,
        int8_rows: 6,
        bf16_tile: crate::kernels::simd::amx::bf16_tile,
    }
}

/// Round to nearest (ties to even), exceptions suppressed.
const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

/// Runs AVX-512F code: the `unsafe` of calling a `#[target_feature]` function from a function
/// without those features is sound because an [`Avx512`] token exists.
macro_rules! avx512 {
    ($e:expr) => {
        // SAFETY: an `Avx512` token exists, so the CPU runs AVX-512F (see `Avx512::new`).
        unsafe { $e }
    };
}

/// The sign bits, as integers (AVX-512F has no float `and`/`andnot`).
#[inline(always)]
fn sign<const VNNI: bool>(_: Avx512<VNNI>) -> __m512i {
    avx512!(_mm512_set1_epi32(i32::MIN))
}

/// The mask of the first `n ≤ 16` lanes.
#[inline(always)]
fn first_lanes(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

impl<const VNNI: bool> DotBytes for Avx512<VNNI> {
    type I = __m512i;

    #[inline(always)]
    fn zero_i(self) -> __m512i {
        avx512!(_mm512_setzero_si512())
    }

    #[inline(always)]
    fn splat_i(self, x: i32) -> __m512i {
        avx512!(_mm512_set1_epi32(x))
    }

    #[inline(always)]
    unsafe fn load_i(self, src: *const i8) -> __m512i {
        // SAFETY: the caller's promise; the token's features.
        unsafe { _mm512_loadu_si512(src.cast()) }
    }

    #[inline(always)]
    unsafe fn dot_bytes(self, sum: __m512i, x: __m512i, v: __m512i) -> __m512i {
        // SAFETY: the caller's promise (a VNNI token exists only where the CPU has AVX512-VNNI).
        unsafe { _mm512_dpbusd_epi32(sum, x, v) }
    }

    #[inline(always)]
    fn to_floats(self, i: __m512i) -> __m512 {
        avx512!(_mm512_cvtepi32_ps(i))
    }
}

impl<const VNNI: bool> Simd for Avx512<VNNI> {
    type V = __m512;
    type M = __mmask16;
    const LANES: usize = 16;
    const FLUSHES_TINY_PROBABILITIES: bool = true;
    /// 12 independent chains keep both FMA pipes busy (as in the AVX2 table).
    const GEMV_VECTORS: usize = 12;
    /// As in the AVX2 table.
    const GEMV_PREFETCH_STEPS: usize = 8;
    /// 16 steps of a 32-wide packed panel: the micro-panel is requested 2 KiB (in `f32`)
    /// ahead of the multiply-adds that read it (as in the AVX2 table).
    const TILE_PREFETCH_STEPS: usize = 16;
    const TILE_PREFETCHES_C: bool = false;

    #[inline(always)]
    unsafe fn load_first(self, src: *const f32, n: usize) -> __m512 {
        // SAFETY: the caller's promise (n readable floats); masked-off lanes are not read.
        unsafe { _mm512_maskz_loadu_ps(first_lanes(n), src) }
    }
    #[inline(always)]
    unsafe fn store_first(self, dst: *mut f32, n: usize, v: __m512) {
        // SAFETY: the caller's promise (n writable floats); masked-off lanes are not written.
        unsafe { _mm512_mask_storeu_ps(dst, first_lanes(n), v) }
    }
    /// Zero-extended to 32 bits, then shifted into the top half.
    #[inline(always)]
    unsafe fn load_bf16(self, src: *const u16) -> __m512 {
        // SAFETY: the caller's promise (16 readable values, 32 bytes); the token's features.
        unsafe {
            let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(src.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
        }
    }
    /// `vcvtph2ps` (AVX-512F).
    #[inline(always)]
    unsafe fn load_f16(self, src: *const u16) -> __m512 {
        // SAFETY: the caller's promise (16 readable values, 32 bytes); the token's features.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(src.cast())) }
    }
    #[inline(always)]
    unsafe fn load_i8(self, src: *const i8) -> __m512 {
        // SAFETY: the caller's promise (16 readable bytes); the token's features.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(src.cast()))) }
    }

    /// With VNNI, one `vpdpbusd` per four steps of each row and group, in `i32` lanes.
    #[inline(always)]
    unsafe fn int8_block<const R: usize, const G: usize>(
        self,
        a: *const u8,
        b: *const i8,
    ) -> [[__m512; G]; R] {
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
    unsafe fn load_bits<const SHIFT: i32, const BITS: u32>(self, src: *const u8) -> __m512 {
        // SAFETY: the caller's promise (16 readable bytes); the token's features.
        unsafe {
            let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(src.cast()));
            let mask = _mm512_set1_epi32(((1u32 << BITS) - 1) as i32);
            let fields = _mm512_and_si512(_mm512_srl_epi32(bytes, _mm_cvtsi32_si128(SHIFT)), mask);
            _mm512_cvtepi32_ps(fields)
        }
    }

    one_intrinsic_each! {
        avx512;
        splat: _mm512_set1_ps; first: _mm512_cvtss_f32;
        load: _mm512_loadu_ps; store: _mm512_storeu_ps;
        binary: add => _mm512_add_ps, sub => _mm512_sub_ps, mul => _mm512_mul_ps,
            div => _mm512_div_ps, max => _mm512_max_ps;
        ternary: mul_add => _mm512_fmadd_ps, neg_mul_add => _mm512_fnmadd_ps;
        compare: lt => _mm512_cmp_ps_mask::<_CMP_LT_OQ>, eq => _mm512_cmp_ps_mask::<_CMP_EQ_OQ>;
    }
    /// As the AVX2 table's (`vmaxps`, `vminps`).
    #[inline(always)]
    fn clamp(self, x: __m512, lo: __m512, hi: __m512) -> __m512 {
        avx512!(_mm512_min_ps(hi, _mm512_max_ps(lo, x)))
    }
    #[inline(always)]
    fn round(self, x: __m512) -> __m512 {
        avx512!(_mm512_roundscale_ps::<NEAREST>(x))
    }
    /// One `vscalefps`, which rounds once like the two-step product.
    #[inline(always)]
    fn scale(self, x: __m512, n: __m512) -> __m512 {
        avx512!(_mm512_scalef_ps(x, n))
    }
    #[inline(always)]
    fn scale_normal(self, x: __m512, n: __m512) -> __m512 {
        self.scale(x, n)
    }
    #[inline(always)]
    fn abs(self, x: __m512) -> __m512 {
        avx512!(_mm512_castsi512_ps(_mm512_andnot_si512(
            sign(self),
            _mm512_castps_si512(x)
        )))
    }
    #[inline(always)]
    fn with_sign_of(self, magnitude: __m512, x: __m512) -> __m512 {
        avx512!(_mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(magnitude),
            _mm512_and_si512(sign(self), _mm512_castps_si512(x))
        )))
    }

    #[inline(always)]
    fn is_nan(self, x: __m512) -> __mmask16 {
        avx512!(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x))
    }
    #[inline(always)]
    fn or(self, a: __mmask16, b: __mmask16) -> __mmask16 {
        a | b
    }
    #[inline(always)]
    fn select(self, m: __mmask16, a: __m512, b: __m512) -> __m512 {
        avx512!(_mm512_mask_blend_ps(m, b, a))
    }
    #[inline(always)]
    fn zero_where(self, m: __mmask16, v: __m512) -> __m512 {
        avx512!(_mm512_maskz_mov_ps(!m, v))
    }
    #[inline(always)]
    fn prefetch(self, data: *const f32) {
        self.0.prefetch(data);
    }
    #[inline(always)]
    fn prefetch_l2(self, data: *const f32) {
        self.0.prefetch_l2(data);
    }

    /// The AVX2 table's 256-bit shuffles.
    #[inline(always)]
    fn transpose_block<const H: usize>(self, src: Rows<'_>, dst: RowsMut<'_>, scale: f32) {
        self.0.transpose_block::<H>(src, dst, scale);
    }
}
