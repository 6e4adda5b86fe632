//! [`Read`]: how the kernels read one element format into `f32` vectors (whole vectors
//! through the [`Simd`] loads of 16- and 8-bit elements, partial ones and single elements by
//! the scalar conversions of `element.rs`, which give the same values: widening is exact, and
//! a `q8_0` value is one `f32` product either way), one implementation per format, and
//! [`with_reader!`], which picks the one of a [`Stored`](crate::kernels::format::Stored)
//! matrix.

use crate::kernels::format::element::{half_to_f32, q8_to_f32, Q8_BLOCK};
use crate::kernels::simd::{Simd, MAX_LANES};

/// A stored matrix as the kernels read it, element `(r, c)` at `r · stride + c` (`c` a
/// position in the row: [`Stored::column`](crate::kernels::format::Stored::column) of the
/// column), widened to `f32`. Made only by [`with_reader!`] from a matrix that holds the
/// rows and columns read.
pub(crate) trait Read: Copy {
    /// Bytes per stored element (prefetches go a cache line at a time).
    const BYTES: usize;
    /// Elements `c .. c + LANES` of row `r`.
    ///
    /// # Safety
    /// They are inside the matrix.
    unsafe fn vector<S: Simd>(self, s: S, r: usize, c: usize) -> S::V;
    /// Element `(r, c)` (the same value as its lane of [`Read::vector`]).
    ///
    /// # Safety
    /// It is inside the matrix.
    unsafe fn element(self, r: usize, c: usize) -> f32;
    /// Elements `c .. c + n` of row `r` in the first `n < LANES` lanes, zeros in the others.
    ///
    /// # Safety
    /// They are inside the matrix.
    #[inline(always)]
    unsafe fn partial<S: Simd>(self, s: S, r: usize, c: usize, n: usize) -> S::V {
        let mut lanes = [0.0f32; MAX_LANES];
        for (i, lane) in lanes[..n].iter_mut().enumerate() {
            // SAFETY: the caller's promise, for i < n.
            *lane = unsafe { self.element(r, c + i) };
        }
        // SAFETY: `lanes` holds MAX_LANES ≥ LANES floats.
        unsafe { s.load(lanes.as_ptr()) }
    }
    /// A hint to bring the cache line of element `(r, c)` into L1 (anywhere: a prefetch
    /// never faults).
    fn prefetch<S: Simd>(self, s: S, r: usize, c: usize);
}

/// `f32` values, rows `stride` apart.
#[derive(Clone, Copy)]
pub(crate) struct Floats {
    pub values: *const f32,
    pub stride: usize,
}

impl Read for Floats {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn vector<S: Simd>(self, s: S, r: usize, c: usize) -> S::V {
        // SAFETY: the caller's promise.
        unsafe { s.load(self.values.add(r * self.stride + c)) }
    }
    #[inline(always)]
    unsafe fn element(self, r: usize, c: usize) -> f32 {
        // SAFETY: the caller's promise.
        unsafe { *self.values.add(r * self.stride + c) }
    }
    #[inline(always)]
    unsafe fn partial<S: Simd>(self, s: S, r: usize, c: usize, n: usize) -> S::V {
        // SAFETY: the caller's promise.
        unsafe { s.load_first(self.values.add(r * self.stride + c), n) }
    }
    #[inline(always)]
    fn prefetch<S: Simd>(self, s: S, r: usize, c: usize) {
        s.prefetch(self.values.wrapping_add(r * self.stride + c));
    }
}

/// bfloat16 (`BF16`) or binary16 bits, rows `stride` apart.
#[derive(Clone, Copy)]
pub(crate) struct Halves<const BF16: bool> {
    pub bits: *const u16,
    pub stride: usize,
}

impl<const BF16: bool> Read for Halves<BF16> {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn vector<S: Simd>(self, s: S, r: usize, c: usize) -> S::V {
        // SAFETY: the caller's promise.
        unsafe { s.load_half::<BF16>(self.bits.add(r * self.stride + c)) }
    }
    #[inline(always)]
    unsafe fn element(self, r: usize, c: usize) -> f32 {
        // SAFETY: the caller's promise.
        half_to_f32::<BF16>(unsafe { *self.bits.add(r * self.stride + c) })
    }
    #[inline(always)]
    fn prefetch<S: Simd>(self, s: S, r: usize, c: usize) {
        s.prefetch(self.bits.wrapping_add(r * self.stride + c).cast());
    }
}

/// `q8_0` integers, rows `stride` apart, with scales down the columns (`ROWS` false: of
/// `(r, c)` at `(r / 32) · scale_stride + c`) or along the rows (at `r · scale_stride + c /
/// 32`).
#[derive(Clone, Copy)]
pub(crate) struct Q8<const ROWS: bool> {
    pub values: *const i8,
    pub stride: usize,
    pub scales: *const f32,
    pub scale_stride: usize,
}

impl<const ROWS: bool> Q8<ROWS> {
    /// Where the scale of `(r, c)` is.
    #[inline(always)]
    fn scale_index(self, r: usize, c: usize) -> usize {
        if ROWS {
            r * self.scale_stride + c / Q8_BLOCK
        } else {
            r / Q8_BLOCK * self.scale_stride + c
        }
    }
}

impl<const ROWS: bool> Read for Q8<ROWS> {
    const BYTES: usize = 1;
    #[inline(always)]
    unsafe fn vector<S: Simd>(self, s: S, r: usize, c: usize) -> S::V {
        // SAFETY: the caller's promise, for the integers and (the matrix holds its scales) for
        // the scales; with scales along the rows a vector starts at a multiple of LANES, which
        // divides 32, so it lies in one block.
        unsafe {
            let scales = self.scales.add(self.scale_index(r, c));
            let scale = if ROWS {
                s.splat(*scales)
            } else {
                s.load(scales)
            };
            s.mul(s.load_i8(self.values.add(r * self.stride + c)), scale)
        }
    }
    #[inline(always)]
    unsafe fn element(self, r: usize, c: usize) -> f32 {
        // SAFETY: the caller's promise.
        unsafe {
            let q = *self.values.add(r * self.stride + c);
            q8_to_f32(q, *self.scales.add(self.scale_index(r, c)))
        }
    }
    #[inline(always)]
    fn prefetch<S: Simd>(self, s: S, r: usize, c: usize) {
        s.prefetch(self.values.wrapping_add(r * self.stride + c).cast());
    }
}

/// Runs `$body` with `$reader` bound to the [`Read`] implementation of the
/// [`Stored`](crate::kernels::format::Stored) matrix `$stored` (its slices' pointers, its
/// strides). The body must read only what the matrix holds.
macro_rules! with_reader {
    ($stored:expr, |$reader:ident| $body:expr) => {{
        use $crate::kernels::format::read::{Floats, Halves, Q8};
        use $crate::kernels::format::view::{Q8Scales, Slices};
        let stored: $crate::kernels::format::Stored<'_> = $stored;
        let stride = stored.stride;
        match stored.slices {
            Slices::F32(values) => {
                let $reader = Floats {
                    values: values.as_ptr(),
                    stride,
                };
                $body
            }
            Slices::Bf16(bits) => {
                let $reader = Halves::<true> {
                    bits: bits.as_ptr(),
                    stride,
                };
                $body
            }
            Slices::F16(bits) => {
                let $reader = Halves::<false> {
                    bits: bits.as_ptr(),
                    stride,
                };
                $body
            }
            Slices::Q8_0 {
                values,
                scales:
                    Q8Scales::Columns {
                        scales,
                        stride: scale_stride,
                    },
            } => {
                let $reader = Q8::<false> {
                    values: values.as_ptr(),
                    stride,
                    scales: scales.as_ptr(),
                    scale_stride,
                };
                $body
            }
            Slices::Q8_0 {
                values,
                scales:
                    Q8Scales::Rows {
                        scales,
                        stride: scale_stride,
                    },
            } => {
                let $reader = Q8::<true> {
                    values: values.as_ptr(),
                    stride,
                    scales: scales.as_ptr(),
                    scale_stride,
                };
                $body
            }
        }
    }};
}

pub(crate) use with_reader;
