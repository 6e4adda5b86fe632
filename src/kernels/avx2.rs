//! AVX2 + FMA kernels: 256-bit vectors of 8 `f32`, 16 vector registers.
//!
//! The microtile is `MR × NR = 6 × 16`: each row of the tile is two `ymm` accumulators
//! (12 in all), each step `p` loads one 16-wide row of the packed B panel (two `ymm`) and
//! broadcasts the 6 values of the packed A panel, one fused multiply-add per accumulator.

use core::arch::x86_64::{
    __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    _mm_cvtss_f32, _mm_fmadd_ss, _mm_set_ss,
};

use super::{check_tile_operands, softmax, Isa, Kernels};

/// Rows of the microtile.
const MR: usize = 6;
/// Columns of the microtile: two vectors.
const NR: usize = 16;
/// Lanes of one vector.
const LANES: usize = 8;

/// The AVX2 kernel table.
pub(crate) static KERNELS: Kernels = Kernels {
    isa: Isa::Avx2,
    mr: MR,
    nr: NR,
    tile,
    softmax_block: softmax::softmax_block_avx2,
    axpy,
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

/// See [`Kernels::axpy`]: `o[j] = fma(p, v[j], o[j])`, the tail one fused scalar at a time.
#[target_feature(enable = "avx2,fma")]
fn axpy(p: f32, v: &[f32], o: &mut [f32]) {
    let v = &v[..o.len()];
    let p_vec = _mm256_set1_ps(p);
    let (o_chunks, o_tail) = o.as_chunks_mut::<LANES>();
    let (v_chunks, v_tail) = v.as_chunks::<LANES>();
    for (o, v) in o_chunks.iter_mut().zip(v_chunks) {
        let sum = _mm256_fmadd_ps(p_vec, load(v), load(o));
        store(o, sum);
    }
    for (o, &v) in o_tail.iter_mut().zip(v_tail) {
        *o = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(p), _mm_set_ss(v), _mm_set_ss(*o)));
    }
}
