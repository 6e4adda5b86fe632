//! The portable primitives: arrays of `N` lanes and plain per-lane arithmetic, which LLVM
//! vectorises for whatever the build targets. `Lanes<4>` is the portable kernel table (a
//! `4 × 8` microtile), `Lanes<1>` the scalar [`exp`](crate::kernels::math::exp::exp) and
//! [`tanh`](crate::kernels::math::tanh::tanh). They cannot fuse multiply and add (`f32::mul_add` needs
//! `std`), so each is rounded twice.

use crate::kernels::simd::{kernel_table, Rows, RowsMut, Simd};
use crate::kernels::Isa;

/// The portable token: vectors of `N` lanes, `[f32; N]`. Every CPU runs it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lanes<const N: usize>;

/// The portable kernel table's token.
pub(crate) const PORTABLE: Lanes<4> = Lanes;

kernel_table! {
    isa: Isa::Portable,
    token: Lanes<4> = PORTABLE,
    tile: 4 x 2,
    int8_rows: 4,
}

/// `1.5 · 2^23`: adding it rounds an `f32` of magnitude below `2^22` to an integer (ties to
/// even), which then sits in the low bits of the sum's representation.
const ROUNDER: f32 = 12_582_912.0;
/// The sign bit of an `f32`.
const SIGN: u32 = 0x8000_0000;

/// `2^k` for `-126 ≤ k ≤ 127`, from the exponent bits (garbage, never UB, outside).
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits((k.wrapping_add(127) as u32) << 23)
}

/// `f` lane by lane.
#[inline(always)]
fn each<const N: usize, T>(f: impl Fn(usize) -> T) -> [T; N] {
    core::array::from_fn(f)
}

impl<const N: usize> Simd for Lanes<N> {
    type V = [f32; N];
    type M = [bool; N];
    const LANES: usize = N;
    const FLUSHES_TINY_PROBABILITIES: bool = false;
    /// 32 accumulators, which LLVM keeps in registers, instead of one load and store of `c`
    /// per step.
    const GEMV_VECTORS: usize = 8;
    /// Nothing portable asks the cache for data; the hardware prefetchers have to do.
    const GEMV_PREFETCH_STEPS: usize = 0;
    const TILE_PREFETCH_STEPS: usize = 0;
    const TILE_PREFETCHES_C: bool = false;

    #[inline(always)]
    fn splat(self, x: f32) -> [f32; N] {
        [x; N]
    }
    #[inline(always)]
    unsafe fn load(self, src: *const f32) -> [f32; N] {
        // SAFETY: the caller's promise: N readable floats.
        unsafe { src.cast::<[f32; N]>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut f32, v: [f32; N]) {
        // SAFETY: the caller's promise: N writable floats.
        unsafe { dst.cast::<[f32; N]>().write_unaligned(v) }
    }
    /// Lane by lane (a copy of `n` values would be a `memcpy` call).
    #[inline(always)]
    unsafe fn load_first(self, src: *const f32, n: usize) -> [f32; N] {
        // SAFETY: the caller's promise: n ≤ N readable floats, of which lane i < n reads one.
        each(|i| if i < n { unsafe { *src.add(i) } } else { 0.0 })
    }
    /// Lane by lane (a copy of `n` values would be a `memcpy` call).
    #[inline(always)]
    unsafe fn store_first(self, dst: *mut f32, n: usize, v: [f32; N]) {
        for (i, &v) in v.iter().enumerate() {
            if i < n {
                // SAFETY: the caller's promise: n ≤ N writable floats, of which lane i < n
                // writes one.
                unsafe { *dst.add(i) = v };
            }
        }
    }
    #[inline(always)]
    fn first(self, v: [f32; N]) -> f32 {
        v[0]
    }

    #[inline(always)]
    fn add(self, a: [f32; N], b: [f32; N]) -> [f32; N] {
        each(|i| a[i] + b[i])
    }
    #[inline(always)]
    fn sub(self, a: [f32; N], b: [f32; N]) -> [f32; N] {
        each(|i| a[i] - b[i])
    }
    #[inline(always)]
    fn mul(self, a: [f32; N], b: [f32; N]) -> [f32; N] {
        each(|i| a[i] * b[i])
    }
    #[inline(always)]
    fn div(self, a: [f32; N], b: [f32; N]) -> [f32; N] {
        each(|i| a[i] / b[i])
    }
    #[inline(always)]
    fn mul_add(self, a: [f32; N], b: [f32; N], c: [f32; N]) -> [f32; N] {
        each(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    fn neg_mul_add(self, a: [f32; N], b: [f32; N], c: [f32; N]) -> [f32; N] {
        each(|i| c[i] - a[i] * b[i])
    }
    /// `b` when it is larger or a NaN, else `a` (a NaN `a` stays; ties keep `a`).
    #[inline(always)]
    fn max(self, a: [f32; N], b: [f32; N]) -> [f32; N] {
        each(|i| {
            if b[i] > a[i] || b[i].is_nan() {
                b[i]
            } else {
                a[i]
            }
        })
    }
    #[inline(always)]
    fn clamp(self, x: [f32; N], lo: [f32; N], hi: [f32; N]) -> [f32; N] {
        // Comparisons with NaN are false, so NaN passes through.
        each(|i| {
            let x = if x[i] < lo[i] { lo[i] } else { x[i] };
            if x > hi[i] {
                hi[i]
            } else {
                x
            }
        })
    }
    #[inline(always)]
    fn round(self, x: [f32; N]) -> [f32; N] {
        each(|i| (x[i] + ROUNDER) - ROUNDER)
    }
    #[inline(always)]
    fn scale(self, x: [f32; N], n: [f32; N]) -> [f32; N] {
        each(|i| {
            // n is an integer in [-150, 128] (a NaN lane gives 0, but x is NaN there).
            let n = n[i] as i32;
            let n1 = n >> 1;
            x[i] * pow2(n1) * pow2(n - n1)
        })
    }
    #[inline(always)]
    fn scale_normal(self, x: [f32; N], n: [f32; N]) -> [f32; N] {
        each(|i| x[i] * pow2(n[i] as i32))
    }
    #[inline(always)]
    fn abs(self, x: [f32; N]) -> [f32; N] {
        each(|i| f32::from_bits(x[i].to_bits() & !SIGN))
    }
    #[inline(always)]
    fn with_sign_of(self, magnitude: [f32; N], x: [f32; N]) -> [f32; N] {
        each(|i| f32::from_bits(magnitude[i].to_bits() | (x[i].to_bits() & SIGN)))
    }

    #[inline(always)]
    fn lt(self, a: [f32; N], b: [f32; N]) -> [bool; N] {
        each(|i| a[i] < b[i])
    }
    #[inline(always)]
    fn eq(self, a: [f32; N], b: [f32; N]) -> [bool; N] {
        each(|i| a[i] == b[i])
    }
    #[inline(always)]
    fn is_nan(self, x: [f32; N]) -> [bool; N] {
        each(|i| x[i].is_nan())
    }
    #[inline(always)]
    fn or(self, a: [bool; N], b: [bool; N]) -> [bool; N] {
        each(|i| a[i] | b[i])
    }
    #[inline(always)]
    fn select(self, m: [bool; N], a: [f32; N], b: [f32; N]) -> [f32; N] {
        each(|i| if m[i] { a[i] } else { b[i] })
    }
    #[inline(always)]
    fn zero_where(self, m: [bool; N], v: [f32; N]) -> [f32; N] {
        each(|i| if m[i] { 0.0 } else { v[i] })
    }
    /// A lane that already holds a NaN keeps it.
    #[inline(always)]
    fn set_nan(self, v: [f32; N], m: [bool; N]) -> [f32; N] {
        each(|i| {
            if m[i] && !v[i].is_nan() {
                f32::NAN
            } else {
                v[i]
            }
        })
    }
    /// Selected on the bits, which no floating-point reasoning may fold away.
    #[inline(always)]
    fn canonical_nan(self, v: [f32; N]) -> [f32; N] {
        each(|i| {
            f32::from_bits(if v[i].is_nan() {
                f32::NAN.to_bits()
            } else {
                v[i].to_bits()
            })
        })
    }

    #[inline(always)]
    fn prefetch(self, _data: *const f32) {}
    #[inline(always)]
    fn prefetch_l2(self, _data: *const f32) {}

    /// `H` row loads into a local array, then 8 stores of `H` values, each a scaled column.
    #[inline(always)]
    fn transpose_block<const H: usize>(self, src: Rows<'_>, dst: RowsMut<'_>, scale: f32) {
        let ((src, src_stride), (dst, dst_stride)) = (src, dst);
        const WIDTH: usize = crate::kernels::gemm::transpose::WIDTH;
        let block: [[f32; WIDTH]; H] = each(|t| {
            let row = &src[t * src_stride..][..WIDTH];
            each(|p| row[p])
        });
        for p in 0..WIDTH {
            let column: [f32; H] = each(|t| scale * block[t][p]);
            dst[p * dst_stride..][..H].copy_from_slice(&column);
        }
    }
}
