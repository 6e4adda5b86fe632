//! Widening stored keys and values to `f32` ([`Kernels::widen`](crate::kernels::Kernels::widen)) and
//! `gemv` straight over them ([`Kernels::gemv_stored`](crate::kernels::Kernels::gemv_stored)), once
//! for every instruction set: whole vectors through the [`Simd`] loads of 16- and 8-bit
//! elements (`Simd::load_bf16`, `load_f16`, `load_i8`), the rest of a row by the scalar
//! conversions of `narrow`, which give the same values (widening is exact, and a
//! [`KvFormat::Q8_0`](crate::kernels::store::narrow::KvFormat::Q8_0) value is one `f32` product either way).

use crate::kernels::simd::{Simd, MAX_LANES};
use crate::kernels::store::narrow::{half_to_f32, q8_to_f32, Q8_BLOCK};

/// A `rows × cols` matrix of stored elements, row `r` from `r · stride`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Narrow<'a> {
    /// bfloat16 bits.
    Bf16 { bits: &'a [u16], stride: usize },
    /// binary16 bits.
    F16 { bits: &'a [u16], stride: usize },
    /// `q8_0` integers and where their scales are.
    Q8 {
        values: &'a [i8],
        stride: usize,
        scales: Q8Scales<'a>,
    },
}

/// Where the scale of element `(r, c)` of a [`Narrow::Q8`] matrix is.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Q8Scales<'a> {
    /// Blocks down the columns (a key panel: rows are features, columns keys):
    /// `scales[(r / 32) · stride + c]`.
    Columns { scales: &'a [f32], stride: usize },
    /// Blocks along the rows (value rows): `scales[r · stride + c / 32]`.
    Rows { scales: &'a [f32], stride: usize },
}

impl<'a> Narrow<'a> {
    /// The matrix from row `r` on (its rows `r ..` as rows `0 ..`).
    ///
    /// # Panics
    /// When it has fewer rows.
    pub(crate) fn skip_rows(self, r: usize) -> Narrow<'a> {
        match self {
            Narrow::Bf16 { bits, stride } => Narrow::Bf16 {
                bits: &bits[r * stride..],
                stride,
            },
            Narrow::F16 { bits, stride } => Narrow::F16 {
                bits: &bits[r * stride..],
                stride,
            },
            Narrow::Q8 {
                values,
                stride,
                scales,
            } => Narrow::Q8 {
                values: &values[r * stride..],
                stride,
                scales: match scales {
                    // Whole blocks of rows only (keys are never read from a later feature).
                    Q8Scales::Columns { scales, stride } => Q8Scales::Columns {
                        scales: &scales[r / Q8_BLOCK * stride..],
                        stride,
                    },
                    Q8Scales::Rows { scales, stride } => Q8Scales::Rows {
                        scales: &scales[r * stride..],
                        stride,
                    },
                },
            },
        }
    }

    /// Whether it holds `rows × cols` elements (and their scales).
    fn holds(self, rows: usize, cols: usize) -> bool {
        let last = rows.saturating_sub(1);
        let fits = |len: usize, stride: usize, width: usize| {
            crate::kernels::operands::fits(len, last, stride, width)
        };
        rows == 0
            || cols == 0
            || match self {
                Narrow::Bf16 { bits, stride } | Narrow::F16 { bits, stride } => {
                    fits(bits.len(), stride, cols)
                }
                Narrow::Q8 {
                    values,
                    stride,
                    scales,
                } => {
                    fits(values.len(), stride, cols)
                        && match scales {
                            Q8Scales::Columns { scales, stride } => crate::kernels::operands::fits(
                                scales.len(),
                                last / Q8_BLOCK,
                                stride,
                                cols,
                            ),
                            Q8Scales::Rows { scales, stride } => {
                                fits(scales.len(), stride, cols.div_ceil(Q8_BLOCK))
                            }
                        }
                }
            }
    }
}

/// A stored matrix as [`widen`] and [`gemv`] read it, element `(r, c)` widened. Made only
/// from a [`Narrow`] that holds the rows and columns read.
trait Stored: Copy {
    /// Columns `c .. c + LANES` of row `r`.
    ///
    /// # Safety
    /// They are inside the matrix.
    unsafe fn vector<S: Simd>(self, s: S, r: usize, c: usize) -> S::V;
    /// Element `(r, c)` (the same value as its lane of [`Stored::vector`]).
    ///
    /// # Safety
    /// It is inside the matrix.
    unsafe fn element(self, r: usize, c: usize) -> f32;
    /// Columns `c .. c + n` of row `r` in the first `n < LANES` lanes, zeros in the others.
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
}

/// bfloat16 (`BF16`) or binary16 bits, rows `stride` apart.
#[derive(Clone, Copy)]
struct Halves<const BF16: bool> {
    bits: *const u16,
    stride: usize,
}

impl<const BF16: bool> Stored for Halves<BF16> {
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
}

/// `q8_0` integers, rows `stride` apart, with scales down the columns (`ROWS` false: of
/// `(r, c)` at `(r / 32) · scale_stride + c`) or along the rows (at `r · scale_stride + c /
/// 32`).
#[derive(Clone, Copy)]
struct Q8<const ROWS: bool> {
    values: *const i8,
    stride: usize,
    scales: *const f32,
    scale_stride: usize,
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

impl<const ROWS: bool> Stored for Q8<ROWS> {
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
}

/// Runs `$body` with `$view` bound to the [`Stored`] reader of `$src`.
macro_rules! with_stored {
    ($src:expr, |$view:ident| $body:expr) => {
        match $src {
            Narrow::Bf16 { bits, stride } => {
                let $view = Halves::<true> {
                    bits: bits.as_ptr(),
                    stride,
                };
                $body
            }
            Narrow::F16 { bits, stride } => {
                let $view = Halves::<false> {
                    bits: bits.as_ptr(),
                    stride,
                };
                $body
            }
            Narrow::Q8 {
                values,
                stride,
                scales:
                    Q8Scales::Columns {
                        scales,
                        stride: scale_stride,
                    },
            } => {
                let $view = Q8::<false> {
                    values: values.as_ptr(),
                    stride,
                    scales: scales.as_ptr(),
                    scale_stride,
                };
                $body
            }
            Narrow::Q8 {
                values,
                stride,
                scales:
                    Q8Scales::Rows {
                        scales,
                        stride: scale_stride,
                    },
            } => {
                let $view = Q8::<true> {
                    values: values.as_ptr(),
                    stride,
                    scales: scales.as_ptr(),
                    scale_stride,
                };
                $body
            }
        }
    };
}

/// See [`Kernels::widen`](crate::kernels::Kernels::widen).
///
/// # Panics
/// When `src` or `dst` is too short for `rows × cols` (callers size them).
#[inline(always)]
pub(crate) fn widen<S: Simd>(
    s: S,
    src: Narrow<'_>,
    rows: usize,
    cols: usize,
    (dst, dst_stride): (&mut [f32], usize),
) {
    debug_assert!(Q8_BLOCK.is_multiple_of(S::LANES));
    assert!(
        src.holds(rows, cols),
        "widen: the stored matrix is too short"
    );
    let whole = cols - cols % S::LANES;
    for r in 0..rows {
        let out = &mut dst[r * dst_stride..][..cols];
        with_stored!(src, |view| {
            for c in (0..whole).step_by(S::LANES) {
                // SAFETY: (r, c .. c + LANES) is inside the matrix (checked above) and `out`.
                unsafe { s.store(out.as_mut_ptr().add(c), view.vector(s, r, c)) };
            }
            for (c, value) in out.iter_mut().enumerate().skip(whole) {
                // SAFETY: (r, c) is inside the matrix.
                *value = unsafe { view.element(r, c) };
            }
        })
    }
}

/// The most rows one [`gemv`] call takes (the GQA heads of one key/value head that share
/// each widened element).
pub(crate) const STORED_ROWS: usize = 4;

/// Accumulators one pass of [`gemv`] keeps in registers, over all its rows.
const PASS_ACCUMULATORS: usize = 12;

/// See [`Kernels::gemv_stored`](crate::kernels::Kernels::gemv_stored): for each of `rows` rows,
/// [`micro::gemv`]'s chains (`acc = a[p] · b(p, j) + acc`, `p` ascending) over the stored
/// matrix `b`, each element widened in registers as [`widen`] widens it, once for all the
/// rows, so the bits are those of `gemv` over the widened matrix, row by row. The columns go
/// in passes of 8, 4, 2 and 1 vectors, at most [`PASS_ACCUMULATORS`] accumulators in all
/// (the chains do not depend on the passes).
///
/// # Panics
/// When `rows` exceeds [`STORED_ROWS`], or an operand is shorter than `rows` rows of `k`
/// values of `a` (`lda` apart), `k × n` elements of `b` and `rows` rows of `n` values of `c`
/// (`ldc` apart).
///
/// [`micro::gemv`]: crate::kernels::gemm::micro::gemv
#[inline(always)]
pub(crate) fn gemv<S: Simd>(
    s: S,
    k: usize,
    (a, lda): (&[f32], usize),
    b: Narrow<'_>,
    (c, ldc, n): (&mut [f32], usize, usize),
    rows: usize,
    accumulate: bool,
) {
    let last = rows.saturating_sub(1);
    assert!(
        rows <= STORED_ROWS
            && (rows == 0
                || (crate::kernels::operands::fits(a.len(), last, lda, k)
                    && crate::kernels::operands::fits(c.len(), last, ldc, n)))
            && b.holds(k, n),
        "gemv_stored operands shorter than the contract"
    );
    let a = (k, a, lda);
    let c = (c, ldc, n);
    with_stored!(b, |view| match rows {
        0 => {}
        1 => gemv_rows::<S, _, 1>(s, view, a, c, accumulate),
        2 => gemv_rows::<S, _, 2>(s, view, a, c, accumulate),
        3 => gemv_rows::<S, _, 3>(s, view, a, c, accumulate),
        _ => gemv_rows::<S, _, 4>(s, view, a, c, accumulate),
    })
}

/// [`gemv`] for `R` rows: the column passes.
#[inline(always)]
fn gemv_rows<S: Simd, B: Stored, const R: usize>(
    s: S,
    b: B,
    (k, a, lda): (usize, &[f32], usize),
    (c, ldc, n): (&mut [f32], usize, usize),
    accumulate: bool,
) {
    let lanes = S::LANES;
    let whole = n / lanes;
    let a_rows: [*const f32; R] = core::array::from_fn(|r| a[r * lda..].as_ptr());
    let c_rows: [*mut f32; R] = core::array::from_fn(|r| c[r * ldc..].as_mut_ptr());
    let fits = |v: usize| v * R <= PASS_ACCUMULATORS;
    let mut v = 0;
    while v < whole {
        let j0 = v * lanes;
        let ka = (k, a_rows);
        let cj = (c_rows, j0, lanes);
        // SAFETY: (each pass) columns j0 .. j0 + width·LANES are whole vectors of every row
        // of `c` and of every row p < k of `b`, and each row of `a` holds k values (checked
        // by `gemv`), width ≤ whole - v.
        v += unsafe {
            match whole - v {
                8.. if fits(8) => gemv_pass::<S, _, 8, R>(s, b, ka, cj, accumulate),
                4.. if fits(4) => gemv_pass::<S, _, 4, R>(s, b, ka, cj, accumulate),
                2.. => gemv_pass::<S, _, 2, R>(s, b, ka, cj, accumulate),
                _ => gemv_pass::<S, _, 1, R>(s, b, ka, cj, accumulate),
            }
        };
    }
    if whole * lanes < n {
        let (j0, tail) = (whole * lanes, n - whole * lanes);
        // SAFETY: the last `n % LANES` columns, inside every row of `c` and `b`.
        unsafe { gemv_pass::<S, _, 1, R>(s, b, (k, a_rows), (c_rows, j0, tail), accumulate) };
    }
}

/// Columns `j0 .. j0 + (V - 1)·LANES + last` of [`gemv`] for `R` rows: `V` vectors, the
/// last of `last` lanes (`last == LANES`: whole); returns `V`.
///
/// # Safety
/// Those columns are inside every row of `c` and every row `p < k` of `b`; every row of `a`
/// holds `k` values.
#[inline(always)]
unsafe fn gemv_pass<S: Simd, B: Stored, const V: usize, const R: usize>(
    s: S,
    b: B,
    (k, a): (usize, [*const f32; R]),
    (c, j0, last): ([*mut f32; R], usize, usize),
    accumulate: bool,
) -> usize {
    let lanes = S::LANES;
    let partial = last < lanes;
    let mut acc = [[s.zero(); V]; R];
    if accumulate {
        for (row, c) in acc.iter_mut().zip(c) {
            for (v, sum) in row.iter_mut().enumerate() {
                let src = c.wrapping_add(j0 + v * lanes);
                // SAFETY: the caller's promise; a partial last vector reads its `last` columns.
                *sum = unsafe {
                    if partial && v == V - 1 {
                        s.load_first(src, last)
                    } else {
                        s.load(src)
                    }
                };
            }
        }
    }
    for p in 0..k {
        // SAFETY: the caller's promise: p < k values in every row of `a`.
        let x: [S::V; R] = core::array::from_fn(|r| s.splat(unsafe { *a[r].add(p) }));
        for v in 0..V {
            let j = j0 + v * lanes;
            // SAFETY: the caller's promise; a partial last vector reads its `last` columns.
            let element = unsafe {
                if partial && v == V - 1 {
                    b.partial(s, p, j, last)
                } else {
                    b.vector(s, p, j)
                }
            };
            for (row, &x) in acc.iter_mut().zip(&x) {
                row[v] = s.mul_add(x, element, row[v]);
            }
        }
    }
    for (row, c) in acc.iter().zip(c) {
        for (v, &sum) in row.iter().enumerate() {
            let sum = s.canonical_nan(sum);
            let dst = c.wrapping_add(j0 + v * lanes);
            // SAFETY: the caller's promise; a partial last vector writes its `last` columns.
            unsafe {
                if partial && v == V - 1 {
                    s.store_first(dst, last, sum);
                } else {
                    s.store(dst, sum);
                }
            }
        }
    }
    V
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use super::*;
    use crate::kernels::store::narrow::{bf16_to_f32, f16_to_f32, Q8_MAX_SCALE};
    use crate::kernels::Isa;

    /// Every table's `widen` of all 65,536 bfloat16 and binary16 bit patterns (zeros,
    /// subnormals, infinities, NaNs) and of every `i8` (at scale 0.75 and at the largest
    /// q8_0 scale) gives the scalar conversions' values (NaN for NaN: a vector conversion may
    /// quiet a signalling NaN).
    #[test]
    fn vector_widening_equals_the_scalar_conversions() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let bytes: Vec<i8> = (i8::MIN..=i8::MAX).collect();
        let same = |got: f32, want: f32| {
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
        };
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            let mut out = vec![0.0f32; all.len()];
            for (bf16, name) in [(true, "bf16"), (false, "f16")] {
                let src = if bf16 {
                    Narrow::Bf16 {
                        bits: &all,
                        stride: all.len(),
                    }
                } else {
                    Narrow::F16 {
                        bits: &all,
                        stride: all.len(),
                    }
                };
                // SAFETY: a checked table; one row of all.len() values in and out.
                unsafe { (kernels.widen)(src, 1, all.len(), &mut out, all.len()) };
                for (&bits, &got) in all.iter().zip(&out) {
                    let want = if bf16 {
                        bf16_to_f32(bits)
                    } else {
                        f16_to_f32(bits)
                    };
                    assert!(
                        same(got, want),
                        "{isa:?} {name} {bits:#06x}: {got} ({:#x}), want {want}",
                        got.to_bits()
                    );
                }
            }
            for scale in [0.75, Q8_MAX_SCALE] {
                let scales = [scale; 8];
                let src = Narrow::Q8 {
                    values: &bytes,
                    stride: bytes.len(),
                    scales: Q8Scales::Rows {
                        scales: &scales,
                        stride: scales.len(),
                    },
                };
                // SAFETY: as above, 256 values.
                unsafe { (kernels.widen)(src, 1, bytes.len(), &mut out, bytes.len()) };
                for (&q, &got) in bytes.iter().zip(&out) {
                    // Equal, and finite for the integers stored (within ±127).
                    let ok = same(got, q8_to_f32(q, scale)) && (got.is_finite() || q == i8::MIN);
                    assert!(ok, "{isa:?} q8 {q} * {scale:e}: {got}");
                }
            }
        }
    }
}
