//! AVX-512F kernels: 512-bit vectors of 16 `f32`, 32 vector registers.
//!
//! The microtile is `MR × NR = 12 × 32`: each row of the tile is two `zmm` accumulators
//! (24 in all), each step `p` loads one 32-wide row of the packed B panel (two `zmm`) and
//! broadcasts the 12 values of the A panel, one fused multiply-add per accumulator.

use core::arch::x86_64::{
    __m512, __mmask16, _mm512_cmp_ps_mask, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_blend_ps,
    _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
    _mm512_storeu_ps, _mm_prefetch, _CMP_UNORD_Q, _MM_HINT_T0,
};

use super::{
    check_gemv_operands, check_gemv_panel_operands, check_tile_operands, softmax, Isa, Kernels,
};

/// Rows of the microtile.
const MR: usize = 12;
/// Columns of the microtile: two vectors.
const NR: usize = 32;
/// Lanes of one vector.
const LANES: usize = 16;
/// How many steps ahead the microtile prefetches its `B` rows (2 KiB of a packed panel;
/// measured 2-6 % faster per layer than none, 8 steps about the same).
const PREFETCH_STEPS: usize = 16;

/// The AVX-512 kernel table.
pub(crate) static KERNELS: Kernels = Kernels {
    isa: Isa::Avx512,
    mr: MR,
    nr: NR,
    tile,
    softmax_block: softmax::softmax_block_avx512,
    gemv,
    gemv_panels,
    softmax_row: softmax::softmax_row_avx512,
    transpose: super::transpose::transpose_avx,
    softcap: super::tanh::softcap_avx512,
    prefetch: super::prefetch_x86,
};

/// Loads `src[..16]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn load(src: &[f32]) -> __m512 {
    assert!(src.len() >= LANES);
    // SAFETY: `src` holds at least 16 values; the load is unaligned.
    unsafe { _mm512_loadu_ps(src.as_ptr()) }
}

/// Stores `v` into `dst[..16]`, every NaN lane as the canonical NaN (see [`Kernels::tile`]).
#[inline]
#[target_feature(enable = "avx512f")]
fn store(dst: &mut [f32], v: __m512) {
    assert!(dst.len() >= LANES);
    // SAFETY: `dst` holds at least 16 values; the store is unaligned.
    unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), canonical_nan(v)) }
}

/// `v` with every NaN lane replaced by the canonical NaN `f32::NAN`.
#[inline]
#[target_feature(enable = "avx512f")]
fn canonical_nan(v: __m512) -> __m512 {
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    _mm512_mask_blend_ps(nan, v, _mm512_set1_ps(f32::NAN))
}

/// See [`Kernels::tile`]: `c[i*ldc + j] (+)= Σ_p a[p*lda + i] · b[p*ldb + j]`, `p`
/// ascending, fused.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
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
    // acc[i] = row i of the tile, columns 0..16 and 16..32.
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    if accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            *row = [load(&c[i * ldc..]), load(&c[i * ldc + LANES..])];
        }
    }
    // Step p reads a[p*lda..][..MR] and b[p*ldb..][..NR] through pointers: the slice
    // iterators' per-step checks would compete with the FMAs for execution ports.
    let (mut a_step, mut b_step) = (a.as_ptr(), b.as_ptr());
    for _ in 0..k {
        // B's row PREFETCH_STEPS steps ahead, into L1: a panel arriving from memory does not
        // stall the first tile that streams it (a prefetch never faults, wherever it points).
        let ahead = b_step.wrapping_add(PREFETCH_STEPS * ldb);
        _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(LANES).cast());
        // SAFETY: `check_tile_operands` proved that every step p < k has NR values of `b`
        // at p*ldb and MR values of `a` at p*lda; the pointers advance by exactly that.
        let (b_lo, b_hi) = unsafe { (_mm512_loadu_ps(b_step), _mm512_loadu_ps(b_step.add(LANES))) };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: as above, with i < MR.
            let a_value = _mm512_set1_ps(unsafe { *a_step.add(i) });
            row[0] = _mm512_fmadd_ps(a_value, b_lo, row[0]);
            row[1] = _mm512_fmadd_ps(a_value, b_hi, row[1]);
        }
        a_step = a_step.wrapping_add(lda);
        b_step = b_step.wrapping_add(ldb);
    }
    for (i, row) in acc.iter().enumerate() {
        store(&mut c[i * ldc..], row[0]);
        store(&mut c[i * ldc + LANES..], row[1]);
    }
}

/// See [`Kernels::gemv`]: each column is the chain `acc = fma(a[p], b[p*ldb + j], acc)`,
/// `p` ascending, as in the microtile.
#[target_feature(enable = "avx512f")]
fn gemv(k: usize, a: &[f32], b: &[f32], ldb: usize, c: &mut [f32], accumulate: bool) {
    check_gemv_operands(k, a, b, ldb, c.len());
    // SAFETY: checked: row p < k of `b` holds the c.len() columns, NR of them every NR values.
    unsafe { gemv_columns(k, a, b.as_ptr(), ldb, NR, c, accumulate) }
}

/// See [`Kernels::gemv_panels`]: [`gemv`]'s chains, up to 12 vectors of several panels per
/// pass.
#[target_feature(enable = "avx512f")]
fn gemv_panels(
    k: usize,
    a: &[f32],
    panels: &[f32],
    panel_len: usize,
    c: &mut [f32],
    accumulate: bool,
) {
    check_gemv_panel_operands(k, a, panels, panel_len, NR, c.len());
    // SAFETY: checked: column j at step p < k is at (j / NR)·panel_len + p·NR + j % NR.
    unsafe { gemv_columns(k, a, panels.as_ptr(), NR, panel_len, c, accumulate) }
}

/// Most vectors one pass of [`gemv_columns`] keeps in registers: 12 independent chains keep
/// both FMA pipes busy (as in the AVX2 table).
const GEMV_VECTORS: usize = 12;
/// How many steps ahead [`gemv_columns`] prefetches its `B` rows (as in the AVX2 table).
const GEMV_PREFETCH_STEPS: usize = 8;

/// `gemv` over columns grouped by [`NR`]: element `(p, j)` of `B` is at
/// `b + (j / NR)·group + p·ldb + j % NR` (`group = NR`: plain rows of stride `ldb`). The
/// columns go in passes of at most [`GEMV_VECTORS`] vectors, whole groups but for the last
/// pass, as even as the groups allow.
///
/// # Safety
/// `a` holds `k` values; for every `p < k` and `j < c.len()` the element above is readable.
#[target_feature(enable = "avx512f")]
unsafe fn gemv_columns(
    k: usize,
    a: &[f32],
    b: *const f32,
    ldb: usize,
    group: usize,
    c: &mut [f32],
    accumulate: bool,
) {
    const GROUP_VECTORS: usize = NR / LANES;
    let n = c.len();
    let groups = n.div_ceil(NR);
    let passes = groups.div_ceil(GEMV_VECTORS / GROUP_VECTORS);
    for pass in 0..passes {
        let (g0, g1) = (pass * groups / passes, (pass + 1) * groups / passes);
        let (j0, j1) = (g0 * NR, (g1 * NR).min(n));
        let b = b.wrapping_add(g0 * group);
        let c = &mut c[j0..j1];
        let vectors = c.len().div_ceil(LANES);
        // SAFETY: the caller's promise for the columns j0 .. j1, which hold more than
        // (vectors-1)·16 and at most vectors·16 values.
        unsafe {
            macro_rules! pass {
                ($($v:literal)*) => {
                    match vectors {
                        $($v => gemv_pass::<$v>(k, a, b, ldb, group, c, accumulate),)*
                        _ => unreachable!("a pass holds 1 to GEMV_VECTORS vectors"),
                    }
                };
            }
            pass!(1 2 3 4 5 6 7 8 9 10 11 12);
        }
    }
}

/// One pass of [`gemv_columns`]: `V` vectors of columns, the last one possibly partial.
///
/// # Safety
/// `c.len()` is in `(V-1)·16 + 1 ..= V·16`; `a` holds `k` values and every element
/// `(p < k, j < c.len())` at `b + (j / NR)·group + p·ldb + j % NR` is readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn gemv_pass<const V: usize>(
    k: usize,
    a: &[f32],
    b: *const f32,
    ldb: usize,
    group: usize,
    c: &mut [f32],
    accumulate: bool,
) {
    const GROUP_VECTORS: usize = NR / LANES;
    // Where vector v starts in a row of B.
    let offset = |v: usize| (v / GROUP_VECTORS) * group + (v % GROUP_VECTORS) * LANES;
    let last = (V - 1) * LANES;
    // The lanes of the last vector's columns (all of them for the others).
    let tail = ((1u32 << (c.len() - last)) - 1) as __mmask16;
    let mask = |v: usize| if v == V - 1 { tail } else { !0 };
    let c_ptr = c.as_mut_ptr();
    // SAFETY: (every load and store of C and B below) the enabled lanes are columns < c.len()
    // of `c` and of row p < k of `b` (the caller's promise); masked-off lanes are not accessed.
    let mut acc: [__m512; V] = core::array::from_fn(|v| {
        if accumulate {
            // SAFETY: as above; the enabled lanes of vector v are columns of `c`.
            unsafe { _mm512_maskz_loadu_ps(mask(v), c_ptr.add(v * LANES)) }
        } else {
            _mm512_setzero_ps()
        }
    });
    let mut b_step = b;
    for &a_value in &a[..k] {
        // A prefetch never faults, wherever it points.
        let ahead = b_step.wrapping_add(GEMV_PREFETCH_STEPS * ldb);
        for g in 0..V.div_ceil(GROUP_VECTORS) {
            for line in 0..GROUP_VECTORS {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(g * group + line * LANES).cast());
            }
        }
        let a_value = _mm512_set1_ps(a_value);
        for (v, sum) in acc.iter_mut().enumerate() {
            // SAFETY: see above.
            let b_value = unsafe { _mm512_maskz_loadu_ps(mask(v), b_step.add(offset(v))) };
            *sum = _mm512_fmadd_ps(a_value, b_value, *sum);
        }
        b_step = b_step.wrapping_add(ldb);
    }
    for (v, sum) in acc.iter().enumerate() {
        // SAFETY: see above.
        unsafe { _mm512_mask_storeu_ps(c_ptr.add(v * LANES), mask(v), canonical_nan(*sum)) };
    }
}
