//! The NEON primitives (AArch64 Advanced SIMD, part of every AArch64 CPU): 128-bit vectors of
//! 4 `f32`, 32 vector registers, fused multiply-add. The table's microtile is `12 × 8`: 24
//! accumulators, two vectors of `B` and three of `A` per step, each `A` value taken from its
//! vector lane by `fmla` (by element) instead of being broadcast from memory.

use core::arch::aarch64::*;
use core::arch::asm;

use crate::kernels::simd::{kernel_table, one_intrinsic_each, Rows, RowsMut, Simd};
use crate::kernels::Isa;

/// The NEON token: only [`Neon::new`] makes one, and only code compiled with NEON can call it
/// safely (every AArch64 target has it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Neon(());

impl Neon {
    /// The token, in code compiled for NEON.
    #[inline]
    #[target_feature(enable = "neon")]
    pub(crate) fn new() -> Neon {
        Neon(())
    }
}

kernel_table! {
    #[target_feature(enable = "neon")]
    isa: Isa::Neon,
    token: Neon = Neon::new(),
    tile: 12 x 2,
    int8_rows: 4,
}

/// Runs NEON code: the `unsafe` of calling a `#[target_feature]` function from a function
/// without that feature listed is sound because a [`Neon`] token exists.
macro_rules! neon {
    ($e:expr) => {
        // SAFETY: a `Neon` token exists, so the CPU runs NEON (see `Neon::new`).
        unsafe { $e }
    };
}

/// The sign bit of an `f32`.
const SIGN: u32 = 0x8000_0000;

/// `2^k` per lane for `-126 ≤ k ≤ 127`, from the exponent bits.
#[inline(always)]
fn pow2(_: Neon, k: int32x4_t) -> float32x4_t {
    neon!(vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(
        k,
        vdupq_n_s32(127)
    ))))
}

impl Simd for Neon {
    type V = float32x4_t;
    type M = uint32x4_t;
    const LANES: usize = 4;
    const FLUSHES_TINY_PROBABILITIES: bool = true;
    /// 24 accumulators and the broadcast fit the 32 registers with room for the loads, and
    /// give more independent chains than four FMA pipes of 4-cycle latency need.
    const GEMV_VECTORS: usize = 24;
    /// None: an 8-wide row of a packed panel is half a cache line, so a request per step
    /// would ask for every line twice, one load slot each; the hardware prefetchers follow
    /// these streams (not measured on ARM hardware).
    const GEMV_PREFETCH_STEPS: usize = 0;
    /// As for `gemv`.
    const TILE_PREFETCH_STEPS: usize = 0;
    const TILE_PREFETCHES_C: bool = false;

    /// Lane by lane through a local array (NEON has no masked loads).
    #[inline(always)]
    unsafe fn load_first(self, src: *const f32, n: usize) -> float32x4_t {
        let mut lanes = [0.0f32; 4];
        for (i, lane) in lanes.iter_mut().enumerate() {
            if i < n {
                // SAFETY: the caller's promise: n readable floats, of which lane i < n reads
                // one.
                *lane = unsafe { *src.add(i) };
            }
        }
        // SAFETY: `lanes` holds 4 floats.
        unsafe { self.load(lanes.as_ptr()) }
    }
    /// Lane by lane through a local array (NEON has no masked stores).
    #[inline(always)]
    unsafe fn store_first(self, dst: *mut f32, n: usize, v: float32x4_t) {
        let mut lanes = [0.0f32; 4];
        // SAFETY: `lanes` holds 4 floats.
        unsafe { self.store(lanes.as_mut_ptr(), v) };
        for (i, &lane) in lanes.iter().enumerate() {
            if i < n {
                // SAFETY: the caller's promise: n writable floats, of which lane i < n
                // writes one.
                unsafe { *dst.add(i) = lane };
            }
        }
    }

    /// Widened to 32 bits by a shift into the top half (`ushll`).
    #[inline(always)]
    unsafe fn load_bf16(self, src: *const u16) -> float32x4_t {
        // SAFETY: the caller's promise (4 readable values, 8 bytes, read as bytes: no
        // alignment needed); NEON is there.
        unsafe {
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vreinterpret_u16_u8(vld1_u8(src.cast()))))
        }
    }
    /// In integer lanes, exactly: the magnitude's exponent and significand shifted into
    /// place (`m << 13`, read as an `f32`, is `m`'s value times `2^-112`, normal or
    /// subnormal), scaled by `2^112` (exact), an infinity or NaN (exponent 31) given the
    /// all-ones exponent instead, then the sign.
    #[inline(always)]
    unsafe fn load_f16(self, src: *const u16) -> float32x4_t {
        // SAFETY: the caller's promise (4 readable values, 8 bytes, read as bytes: no
        // alignment needed); NEON is there.
        unsafe {
            let bits = vmovl_u16(vreinterpret_u16_u8(vld1_u8(src.cast())));
            let magnitude = vandq_u32(bits, vdupq_n_u32(0x7fff));
            let shifted = vshlq_n_u32::<13>(magnitude);
            let finite = vmulq_f32(
                vreinterpretq_f32_u32(shifted),
                vdupq_n_f32(f32::from_bits(0x7780_0000)), // 2^112
            );
            let special = vorrq_u32(shifted, vdupq_n_u32(0x7f80_0000));
            let is_special = vcgeq_u32(magnitude, vdupq_n_u32(0x7c00));
            let unsigned = vbslq_u32(is_special, special, vreinterpretq_u32_f32(finite));
            let sign = vshlq_n_u32::<16>(vandq_u32(bits, vdupq_n_u32(0x8000)));
            vreinterpretq_f32_u32(vorrq_u32(unsigned, sign))
        }
    }
    /// Sign-extended twice (`sxtl`), then converted.
    #[inline(always)]
    unsafe fn load_i8(self, src: *const i8) -> float32x4_t {
        // SAFETY: the caller's promise (4 readable bytes, read as one unaligned u32); NEON
        // is there.
        unsafe {
            let four = vreinterpret_s8_u32(vdup_n_u32(src.cast::<u32>().read_unaligned()));
            vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(four))))
        }
    }

    #[inline(always)]
    unsafe fn load_bits<const SHIFT: i32, const BITS: u32>(self, src: *const u8) -> float32x4_t {
        // SAFETY: the caller's promise (4 readable bytes, read as one unaligned u32); NEON
        // is there.
        unsafe {
            let four = vreinterpret_u8_u32(vdup_n_u32(src.cast::<u32>().read_unaligned()));
            let bytes = vmovl_u16(vget_low_u16(vmovl_u8(four)));
            let mask = vdupq_n_u32((1u32 << BITS) - 1);
            vcvtq_f32_u32(vandq_u32(vshlq_u32(bytes, vdupq_n_s32(-SHIFT)), mask))
        }
    }

    one_intrinsic_each! {
        neon;
        splat: vdupq_n_f32; first: vgetq_lane_f32::<0>;
        load: vld1q_f32; store: vst1q_f32;
        binary: add => vaddq_f32, sub => vsubq_f32, mul => vmulq_f32, div => vdivq_f32,
            max => vmaxq_f32;
        ternary: ;
        compare: lt => vcltq_f32, eq => vceqq_f32;
    }
    /// `fmla`: `c + a · b`, rounded once.
    #[inline(always)]
    fn mul_add(self, a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        neon!(vfmaq_f32(c, a, b))
    }
    /// `fmls`: `c - a · b`, rounded once.
    #[inline(always)]
    fn neg_mul_add(self, a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        neon!(vfmsq_f32(c, a, b))
    }
    /// `fmax`/`fmin` give a NaN when an operand is one (and `max` is `fmax`: a NaN in either
    /// gives a NaN; `+0` is larger than `-0`).
    #[inline(always)]
    fn clamp(self, x: float32x4_t, lo: float32x4_t, hi: float32x4_t) -> float32x4_t {
        neon!(vminq_f32(vmaxq_f32(x, lo), hi))
    }
    /// `frintn`: to nearest, ties to even.
    #[inline(always)]
    fn round(self, x: float32x4_t) -> float32x4_t {
        neon!(vrndnq_f32(x))
    }
    /// `(x · 2^n1) · 2^n2`, `n1 = n >> 1`, `n2 = n - n1` (a NaN lane of `n` converts to 0,
    /// but `x` is NaN there).
    #[inline(always)]
    fn scale(self, x: float32x4_t, n: float32x4_t) -> float32x4_t {
        let n = neon!(vcvtq_s32_f32(n));
        let n1 = neon!(vshrq_n_s32::<1>(n));
        let n2 = neon!(vsubq_s32(n, n1));
        self.mul(self.mul(x, pow2(self, n1)), pow2(self, n2))
    }
    #[inline(always)]
    fn scale_normal(self, x: float32x4_t, n: float32x4_t) -> float32x4_t {
        self.mul(x, pow2(self, neon!(vcvtq_s32_f32(n))))
    }
    #[inline(always)]
    fn abs(self, x: float32x4_t) -> float32x4_t {
        neon!(vabsq_f32(x))
    }
    #[inline(always)]
    fn with_sign_of(self, magnitude: float32x4_t, x: float32x4_t) -> float32x4_t {
        neon!(vreinterpretq_f32_u32(vorrq_u32(
            vreinterpretq_u32_f32(magnitude),
            vandq_u32(vreinterpretq_u32_f32(x), vdupq_n_u32(SIGN))
        )))
    }

    #[inline(always)]
    fn is_nan(self, x: float32x4_t) -> uint32x4_t {
        neon!(vmvnq_u32(vceqq_f32(x, x)))
    }
    #[inline(always)]
    fn or(self, a: uint32x4_t, b: uint32x4_t) -> uint32x4_t {
        neon!(vorrq_u32(a, b))
    }
    #[inline(always)]
    fn select(self, m: uint32x4_t, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        neon!(vbslq_f32(m, a, b))
    }
    #[inline(always)]
    fn zero_where(self, m: uint32x4_t, v: float32x4_t) -> float32x4_t {
        neon!(vreinterpretq_f32_u32(vbicq_u32(
            vreinterpretq_u32_f32(v),
            m
        )))
    }

    /// `prfm pldl1keep`.
    #[inline(always)]
    fn prefetch(self, data: *const f32) {
        // SAFETY: a prefetch is a hint: it never faults and changes no memory or register.
        unsafe {
            asm!("prfm pldl1keep, [{0}]", in(reg) data, options(nostack, readonly, preserves_flags))
        };
    }
    /// `prfm pldl2keep`.
    #[inline(always)]
    fn prefetch_l2(self, data: *const f32) {
        // SAFETY: as for `prefetch`.
        unsafe {
            asm!("prfm pldl2keep, [{0}]", in(reg) data, options(nostack, readonly, preserves_flags))
        };
    }

    /// Per 4 rows and 4 columns: 4 row loads, a `4 × 4` transpose by `trn1`/`trn2` on 32-
    /// then 64-bit lanes, 4 column stores.
    #[inline(always)]
    fn transpose_block<const H: usize>(self, src: Rows<'_>, dst: RowsMut<'_>, scale: f32) {
        let ((src, src_stride), (dst, dst_stride)) = (src, dst);
        assert!(src.len() >= (H - 1) * src_stride + 8 && dst.len() >= 7 * dst_stride + H);
        let scale = self.splat(scale);
        for t0 in (0..H).step_by(4) {
            for p0 in [0, 4] {
                let mut rows = [scale; 4];
                for (t, row) in rows.iter_mut().enumerate() {
                    // SAFETY: row t0 + t < H holds columns p0 .. p0+4 ≤ 8 inside `src` by the
                    // assertion.
                    *row = unsafe { self.load(src.as_ptr().add((t0 + t) * src_stride + p0)) };
                }
                let columns = transpose4(self, rows);
                for (p, column) in columns.into_iter().enumerate() {
                    let at = (p0 + p) * dst_stride + t0;
                    // SAFETY: column p0 + p < 8 gets rows t0 .. t0+4 ≤ H, inside `dst` by the
                    // assertion.
                    unsafe { self.store(dst.as_mut_ptr().add(at), self.mul(scale, column)) };
                }
            }
        }
    }

    /// `fmla` by element: `A`'s step loaded 4 values to a vector, each row's value taken from
    /// its lane (rows past the last whole 4 broadcast).
    #[inline(always)]
    unsafe fn tile_step<const MR: usize, const NV: usize>(
        self,
        acc: &mut [[float32x4_t; NV]; MR],
        a_step: *const f32,
        b: &[float32x4_t; NV],
    ) {
        for g in 0..MR / 4 {
            // SAFETY: the caller's promise: MR readable floats, of which this group reads
            // 4g .. 4g+4 ≤ MR.
            let a = unsafe { self.load(a_step.add(4 * g)) };
            let rows = &mut acc[4 * g..4 * g + 4];
            for (v, &b) in b.iter().enumerate() {
                rows[0][v] = neon!(vfmaq_laneq_f32::<0>(rows[0][v], b, a));
                rows[1][v] = neon!(vfmaq_laneq_f32::<1>(rows[1][v], b, a));
                rows[2][v] = neon!(vfmaq_laneq_f32::<2>(rows[2][v], b, a));
                rows[3][v] = neon!(vfmaq_laneq_f32::<3>(rows[3][v], b, a));
            }
        }
        for i in MR / 4 * 4..MR {
            // SAFETY: the caller's promise, with i < MR.
            let a = self.splat(unsafe { *a_step.add(i) });
            for (sum, &b) in acc[i].iter_mut().zip(b) {
                *sum = self.mul_add(a, b, *sum);
            }
        }
    }
}

/// Columns `p < 4` of the rows `r`: `(r0[p], r1[p], r2[p], r3[p])`.
#[inline(always)]
fn transpose4(_: Neon, [r0, r1, r2, r3]: [float32x4_t; 4]) -> [float32x4_t; 4] {
    // SAFETY: a `Neon` token exists (see `Neon::new`).
    unsafe {
        // (a0 b0 a2 b2), (a1 b1 a3 b3), (c0 d0 c2 d2), (c1 d1 c3 d3), as pairs of floats.
        let t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1));
        let t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
        let t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3));
        let t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
        [
            vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)),
            vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)),
            vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)),
            vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)),
        ]
    }
}
