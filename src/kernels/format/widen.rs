//! Widening stored elements to `f32` ([`Kernels::widen`](crate::kernels::Kernels::widen)),
//! once for every instruction set, through the [`Read`] of the matrix's format.

use crate::kernels::format::read::{with_reader, Read};
use crate::kernels::format::Stored;
use crate::kernels::simd::Simd;

/// See [`Kernels::widen`](crate::kernels::Kernels::widen).
///
/// # Panics
/// When `src` is in panels, or `src` or `dst` is too short for `rows × cols` (callers size
/// them).
#[inline(always)]
pub(crate) fn widen<S: Simd>(
    s: S,
    src: Stored<'_>,
    rows: usize,
    cols: usize,
    (dst, dst_stride): (&mut [f32], usize),
) {
    debug_assert!(crate::kernels::format::element::Q8_BLOCK.is_multiple_of(S::LANES));
    assert!(
        src.panels.is_none() && src.holds(rows, cols),
        "widen: the stored matrix is too short"
    );
    with_reader!(src, |reader| widen_rows(
        s,
        reader,
        rows,
        cols,
        (dst, dst_stride)
    ))
}

/// [`widen`] with the matrix's reader.
#[inline(always)]
fn widen_rows<S: Simd, R: Read>(
    s: S,
    src: R,
    rows: usize,
    cols: usize,
    (dst, dst_stride): (&mut [f32], usize),
) {
    let whole = cols - cols % S::LANES;
    for r in 0..rows {
        let out = &mut dst[r * dst_stride..][..cols];
        for c in (0..whole).step_by(S::LANES) {
            // SAFETY: (r, c .. c + LANES) is inside the matrix (checked by `widen`) and `out`.
            unsafe { s.store(out.as_mut_ptr().add(c), src.vector(s, r, c)) };
        }
        for (c, value) in out.iter_mut().enumerate().skip(whole) {
            // SAFETY: (r, c) is inside the matrix.
            *value = unsafe { src.element(r, c) };
        }
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use super::*;
    use crate::kernels::format::element::{bf16_to_f32, f16_to_f32, q8_to_f32, Q8_MAX_SCALE};
    use crate::kernels::format::view::{Q8Scales, Slices};
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
                let slices = if bf16 {
                    Slices::Bf16(&all)
                } else {
                    Slices::F16(&all)
                };
                let src = Stored::rows(slices, all.len());
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
                let scales = Q8Scales::Rows {
                    scales: &scales,
                    stride: scales.len(),
                };
                let src = Stored::rows(
                    Slices::Q8_0 {
                        values: &bytes,
                        scales,
                    },
                    bytes.len(),
                );
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
