//! AVX2 + FMA kernels: 256-bit vectors of 8 `f32`, 16 vector registers.
//!
//! The microtile is `MR × NR = 6 × 16`: each row of the tile is two `ymm` accumulators
//! (12 in all), each step `p` loads one 16-wide row of the packed B panel (two `ymm`) and
//! broadcasts the 6 values of the packed A panel, one fused multiply-add per accumulator.

use core::arch::x86_64::{
    __m256, _mm256_blendv_ps, _mm256_cmp_ps, _mm256_cmpgt_epi32, _mm256_fmadd_ps, _mm256_loadu_ps,
    _mm256_maskload_ps, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_ps,
    _mm256_storeu_ps, _mm_prefetch, _CMP_UNORD_Q, _MM_HINT_T0,
};

use super::{
    check_gemv_operands, check_gemv_panel_operands, check_tile_operands, softmax, Isa, Kernels,
};

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
    gemv_panels,
    softmax_row: softmax::softmax_row_avx2,
    transpose: super::transpose::transpose_avx,
    softcap: super::tanh::softcap_avx2,
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

/// Stores `v` into `dst[..8]`, every NaN lane as the canonical NaN (see [`Kernels::tile`]).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn store(dst: &mut [f32], v: __m256) {
    assert!(dst.len() >= LANES);
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
    let v = _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), nan);
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
    // The tile's rows of C (one or two lines each) are read or written only after the k
    // steps: start fetching them now (Zen 3, interleaved runs on a loaded machine: the
    // projection GEMMs reached 2-10 points more of the FMA peak in 7 of 9 pairs).
    for i in 0..MR {
        _mm_prefetch::<_MM_HINT_T0>(c[i * ldc..].as_ptr().cast());
        _mm_prefetch::<_MM_HINT_T0>(c[i * ldc + NR - 1..].as_ptr().cast());
    }
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

/// See [`Kernels::gemv`]: each column is the chain `acc = fma(a[p], b[p*ldb + j], acc)`,
/// `p` ascending, as in the microtile.
#[target_feature(enable = "avx2,fma")]
fn gemv(k: usize, a: &[f32], b: &[f32], ldb: usize, c: &mut [f32], accumulate: bool) {
    check_gemv_operands(k, a, b, ldb, c.len());
    // SAFETY: checked: row p < k of `b` holds the c.len() columns, NR of them every NR values.
    unsafe { gemv_columns(k, a, b.as_ptr(), ldb, NR, c, accumulate) }
}

/// See [`Kernels::gemv_panels`]: [`gemv`]'s chains, up to 12 vectors of several panels per
/// pass.
#[target_feature(enable = "avx2,fma")]
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

/// Most vectors one pass of [`gemv_columns`] keeps in registers: 12 accumulators, the
/// broadcast of `a[p]` and a loaded tail fit the 16 `ymm` registers, and 12 independent
/// chains keep both FMA pipes busy (it takes 8: two pipes of 4-cycle latency).
const GEMV_VECTORS: usize = 12;
/// How many steps ahead [`gemv_columns`] prefetches its `B` rows: a row-by-row walk over data
/// that comes from L3 or memory otherwise waits for each line (measured: attention `gemv`
/// over 12 heads of 1024 keys, 172 us without, 158 us at 8 steps, 160 us at 16).
const GEMV_PREFETCH_STEPS: usize = 8;

/// `gemv` over columns grouped by [`NR`]: element `(p, j)` of `B` is at
/// `b + (j / NR)·group + p·ldb + j % NR` (`group = NR`: plain rows of stride `ldb`). The
/// columns go in passes of at most [`GEMV_VECTORS`] vectors, whole groups but for the last
/// pass, as even as the groups allow.
///
/// # Safety
/// `a` holds `k` values; for every `p < k` and `j < c.len()` the element above is readable.
#[target_feature(enable = "avx2,fma")]
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
        let full = c.len().is_multiple_of(LANES);
        // SAFETY: the caller's promise for the columns j0 .. j1, which hold more than
        // (vectors-1)·8 and at most vectors·8 values; `full` when the last vector is whole.
        unsafe {
            macro_rules! pass {
                ($($v:literal)*) => {
                    match (vectors, full) {
                        $(
                            ($v, true) => gemv_pass::<$v, false>(k, a, b, ldb, group, c, accumulate),
                            ($v, false) => gemv_pass::<$v, true>(k, a, b, ldb, group, c, accumulate),
                        )*
                        _ => unreachable!("a pass holds 1 to GEMV_VECTORS vectors"),
                    }
                };
            }
            pass!(1 2 3 4 5 6 7 8 9 10 11 12);
        }
    }
}

/// One pass of [`gemv_columns`]: `V` vectors of columns, the last one partial when `MASKED`.
///
/// # Safety
/// `c.len()` is `V·8` when not `MASKED`, else in `(V-1)·8 + 1 .. V·8`; `a` holds `k` values
/// and every element `(p < k, j < c.len())` at `b + (j / NR)·group + p·ldb + j % NR` is
/// readable.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn gemv_pass<const V: usize, const MASKED: bool>(
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
    let tail = c.len() - last;
    // All-ones in the lanes of the last vector's columns.
    let mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(tail as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    let c_ptr = c.as_mut_ptr();
    // SAFETY: (every load and store of C and B below) vectors v < V-1, and the last one when
    // not MASKED, are whole columns of `c` and of row p < k of `b` (the caller's promise);
    // the masked last vector reads only its `tail` lanes and is stored through a copy.
    let load_c = |v: usize| unsafe {
        if MASKED && v == V - 1 {
            _mm256_maskload_ps(c_ptr.add(last), mask)
        } else {
            _mm256_loadu_ps(c_ptr.add(v * LANES))
        }
    };
    let mut acc: [__m256; V] = core::array::from_fn(|v| {
        if accumulate {
            load_c(v)
        } else {
            _mm256_setzero_ps()
        }
    });
    let mut b_step = b;
    for &a_value in &a[..k] {
        // A prefetch never faults, wherever it points.
        let ahead = b_step.wrapping_add(GEMV_PREFETCH_STEPS * ldb);
        for g in 0..V.div_ceil(GROUP_VECTORS) {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(g * group).cast());
        }
        let a_value = _mm256_set1_ps(a_value);
        for (v, sum) in acc.iter_mut().enumerate() {
            // SAFETY: see above.
            let b_value = unsafe {
                if MASKED && v == V - 1 {
                    _mm256_maskload_ps(b_step.add(offset(v)), mask)
                } else {
                    _mm256_loadu_ps(b_step.add(offset(v)))
                }
            };
            *sum = _mm256_fmadd_ps(a_value, b_value, *sum);
        }
        b_step = b_step.wrapping_add(ldb);
    }
    for (v, sum) in acc.iter().enumerate() {
        if MASKED && v == V - 1 {
            // `vmaskmovps` stores are slow on AMD cores: through a copy instead.
            let mut lanes = [0.0f32; LANES];
            store(&mut lanes, *sum);
            c[last..].copy_from_slice(&lanes[..tail]);
        } else {
            store(&mut c[v * LANES..], *sum);
        }
    }
}
