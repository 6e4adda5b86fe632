//! Widening stored keys and values to `f32` ([`Kernels::widen`](super::Kernels::widen)), once
//! for every instruction set: whole vectors through the [`Simd`] loads of 16- and 8-bit
//! elements (`Simd::load_bf16`, `load_f16`, `load_i8`), the rest of a row by the scalar
//! conversions of `narrow`, which give the same values (widening is exact, and a
//! [`KvFormat::Q8_0`](super::narrow::KvFormat::Q8_0) value is one `f32` product either way).

use super::narrow::{bf16_to_f32, f16_to_f32, q8_to_f32, Q8_BLOCK};
use super::simd::Simd;

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

/// See [`Kernels::widen`](super::Kernels::widen).
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
    for r in 0..rows {
        let out = &mut dst[r * dst_stride..][..cols];
        match src {
            Narrow::Bf16 { bits, stride } => {
                let row = &bits[r * stride..][..cols];
                // SAFETY: `widen_row` asks for whole vectors inside the row only.
                let vector = |c: usize| unsafe { s.load_bf16(row.as_ptr().add(c)) };
                widen_row(s, out, vector, |c| bf16_to_f32(row[c]));
            }
            Narrow::F16 { bits, stride } => {
                let row = &bits[r * stride..][..cols];
                // SAFETY: as above.
                let vector = |c: usize| unsafe { s.load_f16(row.as_ptr().add(c)) };
                widen_row(s, out, vector, |c| f16_to_f32(row[c]));
            }
            Narrow::Q8 {
                values,
                stride,
                scales,
            } => widen_q8_row(s, &values[r * stride..][..cols], scales, r, out),
        }
    }
}

/// Row `r` of a [`Narrow::Q8`] matrix, its integers `row`, into `out`.
#[inline(always)]
fn widen_q8_row<S: Simd>(s: S, row: &[i8], scales: Q8Scales<'_>, r: usize, out: &mut [f32]) {
    let cols = row.len();
    match scales {
        Q8Scales::Columns { scales, stride } => {
            let scales = &scales[(r / Q8_BLOCK) * stride..][..cols];
            // SAFETY: `widen_row` asks for whole vectors inside the row, and `scales` has
            // as many values as the row.
            let vector = |c: usize| unsafe {
                let scale = s.load(scales.as_ptr().add(c));
                s.mul(s.load_i8(row.as_ptr().add(c)), scale)
            };
            widen_row(s, out, vector, |c| q8_to_f32(row[c], scales[c]));
        }
        Q8Scales::Rows { scales, stride } => {
            let scales = &scales[r * stride..][..cols.div_ceil(Q8_BLOCK)];
            // SAFETY: as above; a whole vector starts at a multiple of LANES, which divides
            // 32, so it lies in one block.
            let vector = |c: usize| unsafe {
                let scale = s.splat(scales[c / Q8_BLOCK]);
                s.mul(s.load_i8(row.as_ptr().add(c)), scale)
            };
            widen_row(s, out, vector, |c| q8_to_f32(row[c], scales[c / Q8_BLOCK]));
        }
    }
}

/// `out[c..c + LANES] = vector(c)` for every whole vector of `out`, `out[c] = scalar(c)` for
/// the rest.
#[inline(always)]
fn widen_row<S: Simd>(
    s: S,
    out: &mut [f32],
    vector: impl Fn(usize) -> S::V,
    scalar: impl Fn(usize) -> f32,
) {
    let whole = out.len() - out.len() % S::LANES;
    for c in (0..whole).step_by(S::LANES) {
        // SAFETY: c + LANES ≤ whole ≤ out.len().
        unsafe { s.store(out.as_mut_ptr().add(c), vector(c)) };
    }
    for (c, value) in out.iter_mut().enumerate().skip(whole) {
        *value = scalar(c);
    }
}
