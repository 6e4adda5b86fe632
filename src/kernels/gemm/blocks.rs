//! Widening a micro-panel of a matrix kept in ggml's blocks
//! ([`Kernels::widen_blocks`](crate::kernels::Kernels::widen_blocks)), once for every
//! instruction set: the blocks of a few output rows widened by their format's Simd widening
//! (`format/blocks.rs`) into a small row-major group, then transposed into the `f32` panel the
//! microtile and `gemv_stored` read (steps `p` as rows, outputs `j` as columns).

use crate::kernels::format::blocks::{widen_block, BlockRows};
use crate::kernels::gemm::micro::LINE_BYTES;
use crate::kernels::gemm::transpose::transpose;
use crate::kernels::simd::Simd;

/// Steps widened per group (a multiple of every block's values).
pub(crate) const CHUNK: usize = 256;
/// Output rows widened per group (one transposed block of rows).
const GROUP: usize = 8;

/// See [`Kernels::widen_blocks`](crate::kernels::Kernels::widen_blocks): `dst[p · nr + c]`
/// = value `p0 + p` of output row `j0 + c` for `p < kc`, `c < width`, 0 for `width ≤ c < nr`.
///
/// # Panics
/// When `p0` or `kc` is not a whole number of blocks, the rows or steps are not in `src`,
/// `width > nr` or `dst` holds fewer than `kc · nr` values.
#[inline(always)]
pub(crate) fn widen_panel<S: Simd>(
    s: S,
    src: BlockRows<'_>,
    (j0, width): (usize, usize),
    (p0, kc): (usize, usize),
    (dst, nr): (&mut [f32], usize),
) {
    let (quant, row_bytes) = (src.quant, src.row_bytes());
    let values = quant.values();
    assert!(
        p0.is_multiple_of(values)
            && kc.is_multiple_of(values)
            && p0 + kc <= src.k
            && width <= nr
            && (j0 + width) * row_bytes <= src.bytes.len()
            && dst.len() >= kc * nr,
        "widen_blocks operands shorter than the contract"
    );
    let mut group = [0.0f32; GROUP * CHUNK];
    for c0 in (0..kc).step_by(CHUNK) {
        let steps = CHUNK.min(kc - c0);
        let bytes = (p0 + c0) / values * quant.bytes()..(p0 + c0 + steps) / values * quant.bytes();
        for r0 in (0..width).step_by(GROUP) {
            let rows = GROUP.min(width - r0);
            for (r, out) in group.chunks_exact_mut(CHUNK).take(rows).enumerate() {
                // The same steps of the row a group later (the next panel's, past the
                // panel's last rows), a line at a time: the rows are streamed from memory.
                let ahead = (j0 + r0 + r + GROUP) * row_bytes + bytes.start;
                for line in (0..bytes.len()).step_by(LINE_BYTES) {
                    s.prefetch(src.bytes.as_ptr().wrapping_add(ahead + line).cast());
                }
                let blocks = src.row(j0 + r0 + r)[bytes.clone()].chunks_exact(quant.bytes());
                for (block, out) in blocks.zip(out.chunks_exact_mut(values)) {
                    widen_block(s, quant, block, out);
                }
            }
            let dst = &mut dst[c0 * nr + r0..];
            transpose(s, (&group, CHUNK), rows, steps, (dst, nr), 1.0);
        }
        if width < nr {
            for step in dst[c0 * nr..].chunks_exact_mut(nr).take(steps) {
                step[width..].fill(0.0);
            }
        }
    }
}
