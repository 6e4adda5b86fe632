//! AVX2 + FMA kernels: 256-bit vectors of 8 `f32`, 16 vector registers.
//!
//! The microtile is `MR × NR = 6 × 16`: each row of the tile is two `ymm` accumulators
//! (12 in all), each step `p` loads one 16-wide row of the packed B panel (two `ymm`) and
//! broadcasts the 6 values of the packed A panel, one fused multiply-add per accumulator.

use core::arch::x86_64::{
    __m256, __m256i, _mm256_cmpgt_epi32, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_maskload_ps,
    _mm256_maskstore_ps, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_ps,
    _mm256_storeu_ps, _mm_prefetch, _MM_HINT_T0,
};

use super::{check_gemv_operands, check_tile_operands, softmax, Isa, Kernels};

/// Rows of the microtile.
const MR: usize = 6;
/// Columns of the microtile: two vectors.
const NR: usize = 16;
/// Lanes of one vector.
const LANES: usize = 8;
/// How many steps ahead the microtile prefetches its `B` rows (1 KiB of a packed panel;
/// measured 0-3 % faster per layer than none).
const PREFETCH_STEPS: usize = 16;

/// The AVX2 kernel table.
pub(crate) static KERNELS: Kernels = Kernels {
    isa: Isa::Avx2,
    mr: MR,
    nr: NR,
    tile,
    softmax_block: softmax::softmax_block_avx2,
    gemv,
    softmax_row: softmax::softmax_row_avx2,
    transpose: super::transpose::transpose_avx,
    prefetch: super::prefetch_x86,
};

/// Loads `src[..8]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn load(src: &[f32]) -> __m256 {
    assert!(src.len() >= LANES);
    // SAFETY: `src` holds at least 8 values; the load is unaligned.
    unsafe { _mm256_loadu_ps(src.as_ptr()) }
}

/// Stores `v` into `dst[..8]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn store(dst: &mut [f32], v: __m256) {
    assert!(dst.len() >= LANES);
    // SAFETY: `dst` holds at least 8 values; the store is unaligned.
    unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v) }
}

/// See [`Kernels::tile`]: `c[i*ldc + j] (+)= Σ_p a[p*lda + i] · b[p*ldb + j]`, `p`
/// ascending, fused.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
fn tile(
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    check_tile_operands(k, (a, lda), (b, ldb), (c, ldc), MR, NR);
    let c = &mut c[..(MR - 1) * ldc + NR];
    // acc[i] = row i of the tile, columns 0..8 and 8..16.
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    if accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            *row = [load(&c[i * ldc..]), load(&c[i * ldc + LANES..])];
        }
    }
    // Step p reads a[p*lda..][..MR] and b[p*ldb..][..NR] through pointers: the slice
    // iterators' per-step checks would compete with the FMAs for execution ports.
    let (mut a_step, mut b_step) = (a.as_ptr(), b.as_ptr());
    for _ in 0..k {
        // B's row PREFETCH_STEPS steps ahead, into L1 (a prefetch never faults).
        _mm_prefetch::<_MM_HINT_T0>(b_step.wrapping_add(PREFETCH_STEPS * ldb).cast());
        // SAFETY: `check_tile_operands` proved that every step p < k has NR values of `b`
        // at p*ldb and MR values of `a` at p*lda; the pointers advance by exactly that.
        let (b_lo, b_hi) = unsafe { (_mm256_loadu_ps(b_step), _mm256_loadu_ps(b_step.add(LANES))) };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: as above, with i < MR.
            let a_value = _mm256_set1_ps(unsafe { *a_step.add(i) });
            row[0] = _mm256_fmadd_ps(a_value, b_lo, row[0]);
            row[1] = _mm256_fmadd_ps(a_value, b_hi, row[1]);
        }
        a_step = a_step.wrapping_add(lda);
        b_step = b_step.wrapping_add(ldb);
    }
    for (i, row) in acc.iter().enumerate() {
        store(&mut c[i * ldc..], row[0]);
        store(&mut c[i * ldc + LANES..], row[1]);
    }
}

/// See [`Kernels::gemv`]: 32 columns (four vectors) at a time, `vmaskmovps` for the tail;
/// each column is the chain `acc = fma(a[p], b[p*ldb + j], acc)`, `p` ascending.
#[target_feature(enable = "avx2,fma")]
fn gemv(k: usize, a: &[f32], b: &[f32], ldb: usize, c: &mut [f32], accumulate: bool) {
    let n = c.len();
    check_gemv_operands(k, a, b, ldb, n);
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for j0 in (0..n).step_by(4 * LANES) {
        // All-ones in the lanes of columns j0 + 8v + lane < n.
        let masks: [__m256i; 4] = core::array::from_fn(|v| {
            let width = n.saturating_sub(j0 + v * LANES).min(LANES);
            _mm256_cmpgt_epi32(_mm256_set1_epi32(width as i32), lane)
        });
        let c_ptr = c.as_mut_ptr().wrapping_add(j0);
        // SAFETY (loads and stores of C, B below): masked-off lanes are neither read nor
        // written, and the enabled ones are columns < n of `c`, or of row p < k of `b`, which
        // `check_gemv_operands` keeps in bounds.
        let mut acc: [__m256; 4] = core::array::from_fn(|v| {
            if accumulate {
                unsafe { _mm256_maskload_ps(c_ptr.wrapping_add(v * LANES), masks[v]) }
            } else {
                _mm256_setzero_ps()
            }
        });
        let mut b_step = b.as_ptr().wrapping_add(j0);
        for &a_value in &a[..k] {
            let a_value = _mm256_set1_ps(a_value);
            for (v, sum) in acc.iter_mut().enumerate() {
                // SAFETY: see above.
                let b_value =
                    unsafe { _mm256_maskload_ps(b_step.wrapping_add(v * LANES), masks[v]) };
                *sum = _mm256_fmadd_ps(a_value, b_value, *sum);
            }
            b_step = b_step.wrapping_add(ldb);
        }
        for (v, sum) in acc.iter().enumerate() {
            // SAFETY: see above.
            unsafe { _mm256_maskstore_ps(c_ptr.wrapping_add(v * LANES), masks[v], *sum) };
        }
    }
}
