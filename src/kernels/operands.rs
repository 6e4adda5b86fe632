//! The operand checks the kernels rely on: each kernel's contract on slice lengths, checked
//! before any pointer load (see the [`Kernels`](crate::kernels::Kernels) entries).

/// Checks the operand lengths of a `k`-step microtile (see [`Kernels::tile`]): afterwards step
/// `p < k` may read `a[p*lda .. p*lda + mr]` and `b[p*ldb .. p*ldb + nr]`, and the tile
/// `c[.. (mr-1)*ldc + nr]` exists. The SIMD tiles rely on it for their pointer loads.
///
/// # Panics
/// When an operand is shorter than the contract requires (a bug in the caller).
#[inline(always)]
pub(crate) fn check_tile_operands(
    k: usize,
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&[f32], usize),
    mr: usize,
    nr: usize,
) {
    let ok = (k == 0
        || (lda >= mr
            && ldb >= nr
            && fits(a.len(), k - 1, lda, mr)
            && fits(b.len(), k - 1, ldb, nr)))
        && ldc >= nr
        && fits(c.len(), mr - 1, ldc, nr);
    assert!(ok, "microtile operands shorter than the contract");
}

/// Whether `len` values hold `steps` rows of stride `stride` followed by `width` more: the
/// extent `steps · stride + width`, with overflow counting as too long.
pub(crate) fn fits(len: usize, steps: usize, stride: usize, width: usize) -> bool {
    steps
        .checked_mul(stride)
        .and_then(|n| n.checked_add(width))
        .is_some_and(|n| n <= len)
}
