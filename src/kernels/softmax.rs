//! The online-softmax update of one key block
//! ([`Kernels::softmax_block`](super::Kernels::softmax_block)) for each instruction set.
//!
//! Scores are key-major (`scores[j*lds + i]`: query `i`, key `j`), so every version runs down
//! the key axis with the *queries* in the vector lanes: no horizontal reductions, and each
//! query's sum is accumulated in key order exactly as the contract says. Per lane-group of
//! queries: the new maximum (a NaN score or running max wins and stays: it is tracked apart
//! from the NaN-ignoring `max` instructions), the rescale factor (exactly 1 when the maximum is
//! unchanged), then `exp(s - new)` in place (0 when `new` is `-inf`) and the running sum.
//! Every lane group goes through AVX-512 masks (all lanes enabled but in the tail); on AVX2 a
//! whole group through plain loads and stores, a partial one through `vmaskmovps`. Nothing
//! outside `scores[j*lds .. j*lds + q]` is read or written.
//!
//! The vector versions use the fused `exp` of [`super::exp`], so their probabilities may differ
//! from the portable ones in the last bit; AVX2 and AVX-512 agree bit for bit. They give
//! exactly 0 for probabilities below the smallest normal float (masked `-inf` scores among
//! them), which avoids slow subnormal arithmetic and cannot change a sum of at least 1.

use super::exp::exp;

/// See [`Kernels::softmax_block`](super::Kernels::softmax_block). Plain loops over the query
/// axis, which LLVM vectorises for the build's baseline target.
pub(crate) fn softmax_block(
    scores: &mut [f32],
    lds: usize,
    keys: usize,
    max: &mut [f32],
    sum: &mut [f32],
    rescale: &mut [f32],
) {
    let q = max.len();
    let (sum, rescale) = (&mut sum[..q], &mut rescale[..q]);
    // The new running max goes into `rescale` first.
    rescale.copy_from_slice(max);
    for row in scores.chunks_mut(lds).take(keys) {
        for (new, &s) in rescale.iter_mut().zip(&row[..q]) {
            // A NaN score must win and stay, so that it reaches the output.
            if s > *new || s.is_nan() {
                *new = s;
            }
        }
    }
    for ((old, new), total) in max.iter_mut().zip(rescale.iter_mut()).zip(sum.iter_mut()) {
        let factor = if *old == *new { 1.0 } else { exp(*old - *new) };
        *old = *new;
        *new = factor;
        *total *= factor;
    }
    for row in scores.chunks_mut(lds).take(keys) {
        for ((s, &m), total) in row[..q].iter_mut().zip(max.iter()).zip(sum.iter_mut()) {
            *s = if m == f32::NEG_INFINITY {
                0.0
            } else {
                exp(*s - m)
            };
            *total += *s;
        }
    }
}

/// See [`Kernels::softmax_row`](super::Kernels::softmax_row): `softmax_block` for one query,
/// the same operations in the same order.
pub(crate) fn softmax_row(row: &mut [f32], max: &mut f32, sum: &mut f32) -> f32 {
    let old = *max;
    let mut new = old;
    for &s in row.iter() {
        if s > new || s.is_nan() {
            new = s;
        }
    }
    let factor = rescale_factor(old, new, exp);
    *max = new;
    let mut total = *sum * factor;
    for s in row.iter_mut() {
        *s = if new == f32::NEG_INFINITY {
            0.0
        } else {
            exp(*s - new)
        };
        total += *s;
    }
    *sum = total;
    factor
}

/// `exp(old - new)` as `softmax_block` computes it, without calling `exp` in the two cases
/// whose value is known: exactly 1 when the maximum is unchanged, exactly 0 when the old one is
/// `-inf` and the new one is not (every `exp` here gives 0 for `-inf`).
#[inline(always)]
fn rescale_factor(old: f32, new: f32, exp: impl Fn(f32) -> f32) -> f32 {
    if old == new {
        1.0
    } else if old == f32::NEG_INFINITY && !new.is_nan() {
        0.0
    } else {
        exp(old - new)
    }
}

/// The new running maximum of a row for [`Kernels::softmax_row`](super::Kernels::softmax_row):
/// `max(old, row)`, or NaN when `old` or any score is NaN.
fn row_max(old: f32, row: &[f32]) -> f32 {
    let mut new = old;
    let mut nan = old.is_nan();
    for &s in row {
        nan |= s.is_nan();
        if s > new {
            new = s;
        }
    }
    if nan {
        f32::NAN
    } else {
        new
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{
    softmax_block_avx2, softmax_block_avx512, softmax_row_avx2, softmax_row_avx512,
};

/// The AVX2 and AVX-512 versions.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    use super::super::exp::{
        exp_probability_avx2 as exp_avx2, exp_probability_avx512 as exp_avx512,
    };

    /// Checks the slice lengths the contract promises, so the pointer arithmetic below stays
    /// inside the slices (a violation panics instead of reading out of bounds).
    fn check(scores: &[f32], lds: usize, keys: usize, q: usize, sum: &[f32], rescale: &[f32]) {
        assert!(lds >= q && sum.len() >= q && rescale.len() >= q);
        if keys > 0 && q > 0 {
            assert!(super::super::fits(scores.len(), keys - 1, lds, q));
        }
    }

    /// [`softmax_block`](super::softmax_block) with AVX2 + FMA: eight queries per vector, a
    /// `vmaskmovps` tail.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn softmax_block_avx2(
        scores: &mut [f32],
        lds: usize,
        keys: usize,
        max: &mut [f32],
        sum: &mut [f32],
        rescale: &mut [f32],
    ) {
        const W: usize = 8;
        let q = max.len();
        check(scores, lds, keys, q, sum, rescale);
        let s_ptr = scores.as_mut_ptr();
        let (m_ptr, sum_ptr, r_ptr) = (max.as_mut_ptr(), sum.as_mut_ptr(), rescale.as_mut_ptr());
        let mut i0 = 0;
        while i0 < q {
            let lanes = (q - i0).min(W);
            // SAFETY: `check` proved that max, sum, rescale hold queries i0 .. i0 + lanes and
            // scores holds j*lds + i for those queries and j < keys.
            unsafe {
                let ptrs = (s_ptr.add(i0), m_ptr.add(i0), sum_ptr.add(i0), r_ptr.add(i0));
                if lanes == W {
                    block_lanes_avx2::<false>(ptrs, lds, keys, W);
                } else {
                    block_lanes_avx2::<true>(ptrs, lds, keys, lanes);
                }
            }
            i0 += W;
        }
    }

    /// [`softmax_block_avx2`] for the queries `0 .. lanes` (`lanes ≤ 8`) from the pointers
    /// `(scores, max, sum, rescale)`: plain loads and stores for eight, else `vmaskmovps`
    /// (`MASKED`), which AMD cores microcode.
    ///
    /// # Safety
    /// AVX2 and FMA; `max`, `sum`, `rescale` hold `lanes` values and `scores` `lanes` values
    /// at `j*lds` for every `j < keys`; `lanes == 8` unless `MASKED`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block_lanes_avx2<const MASKED: bool>(
        (s_ptr, m_ptr, sum_ptr, r_ptr): (*mut f32, *mut f32, *mut f32, *mut f32),
        lds: usize,
        keys: usize,
        lanes: usize,
    ) {
        // All-ones in the lanes of the queries.
        let mask = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(lanes as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        // SAFETY: (every load and store below) the caller's promise; masked-off lanes are
        // not accessed.
        let load = |p: *const f32| unsafe {
            if MASKED {
                _mm256_maskload_ps(p, mask)
            } else {
                _mm256_loadu_ps(p)
            }
        };
        // SAFETY: as for `load`.
        let store = |p: *mut f32, v: __m256| unsafe {
            if MASKED {
                _mm256_maskstore_ps(p, mask, v)
            } else {
                _mm256_storeu_ps(p, v)
            }
        };
        let old = load(m_ptr);
        let mut new = old;
        let mut nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(old, old);
        for j in 0..keys {
            // SAFETY: see above.
            let s = load(unsafe { s_ptr.add(j * lds) });
            new = _mm256_max_ps(new, s);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(s, s));
        }
        let new = _mm256_blendv_ps(new, _mm256_set1_ps(f32::NAN), nan);
        let same = _mm256_cmp_ps::<_CMP_EQ_OQ>(old, new);
        let factor = _mm256_blendv_ps(exp_avx2(_mm256_sub_ps(old, new)), _mm256_set1_ps(1.0), same);
        let mut total = _mm256_mul_ps(load(sum_ptr), factor);
        store(m_ptr, new);
        store(r_ptr, factor);
        // Lanes whose maximum is -inf get probability 0 (and-not with this mask).
        let masked = _mm256_cmp_ps::<_CMP_EQ_OQ>(new, _mm256_set1_ps(f32::NEG_INFINITY));
        for j in 0..keys {
            // SAFETY: see above.
            let row = unsafe { s_ptr.add(j * lds) };
            let p = _mm256_andnot_ps(masked, exp_avx2(_mm256_sub_ps(load(row), new)));
            store(row, p);
            total = _mm256_add_ps(total, p);
        }
        store(sum_ptr, total);
    }

    /// [`softmax_block`](super::softmax_block) with AVX-512F: sixteen queries per vector, a
    /// masked tail.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn softmax_block_avx512(
        scores: &mut [f32],
        lds: usize,
        keys: usize,
        max: &mut [f32],
        sum: &mut [f32],
        rescale: &mut [f32],
    ) {
        const W: usize = 16;
        let q = max.len();
        check(scores, lds, keys, q, sum, rescale);
        let s_ptr = scores.as_mut_ptr();
        let (m_ptr, sum_ptr, r_ptr) = (max.as_mut_ptr(), sum.as_mut_ptr(), rescale.as_mut_ptr());
        let mut i0 = 0;
        while i0 < q {
            // The lanes of queries i0 .. min(i0 + 16, q).
            let mask: __mmask16 = ((1u32 << (q - i0).min(W)) - 1) as __mmask16;
            // SAFETY: (every load/store below) `mask` selects only queries i < q, and for those
            // max, sum, rescale hold index i and scores holds j*lds + i for j < keys (checked
            // by `check`); masked-off lanes are not accessed (no fault).
            let old = unsafe { _mm512_maskz_loadu_ps(mask, m_ptr.add(i0)) };
            let mut new = old;
            let mut nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(old, old);
            for j in 0..keys {
                // SAFETY: see above.
                let s = unsafe { _mm512_maskz_loadu_ps(mask, s_ptr.add(j * lds + i0)) };
                new = _mm512_max_ps(new, s);
                nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(s, s);
            }
            let new = _mm512_mask_blend_ps(nan, new, _mm512_set1_ps(f32::NAN));
            let same = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(old, new);
            let factor = _mm512_mask_blend_ps(
                same,
                exp_avx512(_mm512_sub_ps(old, new)),
                _mm512_set1_ps(1.0),
            );
            // SAFETY: see above.
            let mut total = unsafe { _mm512_maskz_loadu_ps(mask, sum_ptr.add(i0)) };
            total = _mm512_mul_ps(total, factor);
            // SAFETY: see above.
            unsafe {
                _mm512_mask_storeu_ps(m_ptr.add(i0), mask, new);
                _mm512_mask_storeu_ps(r_ptr.add(i0), mask, factor);
            }
            // Lanes whose maximum is -inf get probability 0.
            let live = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(new, _mm512_set1_ps(f32::NEG_INFINITY));
            for j in 0..keys {
                // SAFETY: see above.
                let s = unsafe { _mm512_maskz_loadu_ps(mask, s_ptr.add(j * lds + i0)) };
                let p = _mm512_maskz_mov_ps(live, exp_avx512(_mm512_sub_ps(s, new)));
                // SAFETY: see above.
                unsafe { _mm512_mask_storeu_ps(s_ptr.add(j * lds + i0), mask, p) };
                total = _mm512_add_ps(total, p);
            }
            // SAFETY: see above.
            unsafe { _mm512_mask_storeu_ps(sum_ptr.add(i0), mask, total) };
            i0 += W;
        }
    }

    /// [`softmax_row`](super::softmax_row) with AVX2 + FMA: keys in the lanes for `exp`, the
    /// sum in key order.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn softmax_row_avx2(row: &mut [f32], max: &mut f32, sum: &mut f32) -> f32 {
        let old = *max;
        let new = super::row_max(old, row);
        let factor =
            super::rescale_factor(old, new, |x| _mm256_cvtss_f32(exp_avx2(_mm256_set1_ps(x))));
        *max = new;
        if new == f32::NEG_INFINITY {
            row.fill(0.0);
            *sum *= factor;
            return factor;
        }
        // exp(s - new), keys in the lanes, the sum in key order from a copy of the lanes;
        // a partial last chunk is read through a lane mask and written through the copy
        // (`vmaskmovps` stores are microcoded on AMD cores).
        let mut total = *sum * factor;
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for chunk in row.chunks_mut(8) {
            let mut lanes = [0.0f32; 8];
            // SAFETY: a whole chunk holds 8 values; for a partial one `mask` enables its
            // lanes only and masked-off lanes are not read; `lanes` holds 8 values.
            unsafe {
                let s = if chunk.len() == 8 {
                    _mm256_loadu_ps(chunk.as_ptr())
                } else {
                    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(chunk.len() as i32), lane);
                    _mm256_maskload_ps(chunk.as_ptr(), mask)
                };
                let p = exp_avx2(_mm256_sub_ps(s, _mm256_set1_ps(new)));
                _mm256_storeu_ps(lanes.as_mut_ptr(), p);
            }
            let lanes = &lanes[..chunk.len()];
            chunk.copy_from_slice(lanes);
            for &p in lanes {
                total += p;
            }
        }
        *sum = total;
        factor
    }

    /// [`softmax_row`](super::softmax_row) with AVX-512F: keys in the lanes for `exp`, the sum
    /// in key order.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn softmax_row_avx512(row: &mut [f32], max: &mut f32, sum: &mut f32) -> f32 {
        let old = *max;
        let new = super::row_max(old, row);
        let factor = super::rescale_factor(old, new, |x| {
            _mm512_cvtss_f32(exp_avx512(_mm512_set1_ps(x)))
        });
        *max = new;
        if new == f32::NEG_INFINITY {
            row.fill(0.0);
            *sum *= factor;
            return factor;
        }
        // exp(s - new), keys in the lanes, a lane mask for the tail; the sum in key order,
        // from a plain copy of the lanes (a masked store does not forward to later loads).
        let mut total = *sum * factor;
        for chunk in row.chunks_mut(16) {
            let mask = ((1u32 << chunk.len()) - 1) as __mmask16;
            let mut lanes = [0.0f32; 16];
            // SAFETY: `mask` enables the lanes of `chunk`'s (at most 16) values only;
            // masked-off lanes are neither read nor written; `lanes` holds 16 values.
            unsafe {
                let s = _mm512_maskz_loadu_ps(mask, chunk.as_ptr());
                let p = exp_avx512(_mm512_sub_ps(s, _mm512_set1_ps(new)));
                _mm512_mask_storeu_ps(chunk.as_mut_ptr(), mask, p);
                _mm512_storeu_ps(lanes.as_mut_ptr(), p);
            }
            for &p in &lanes[..chunk.len()] {
                total += p;
            }
        }
        *sum = total;
        factor
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    //! Every version against an `f64` reference of the contract, with the vector versions
    //! called directly (guarded by run-time feature detection).
    use super::*;
    use crate::kernels::test_values;
    use alloc::format;
    use alloc::vec;
    use alloc::vec::Vec;
    use std::println;

    type BlockFn = unsafe fn(&mut [f32], usize, usize, &mut [f32], &mut [f32], &mut [f32]);

    /// Query counts (the vector axis).
    const QUERIES: [usize; 15] = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65];
    /// Key counts (the loop axis).
    const KEYS: [usize; 5] = [0, 1, 2, 7, 64];
    /// Poison in the padding of `scores` and after `max`, `sum`, `rescale`.
    const GUARD: f32 = 12345.0;

    /// The versions this CPU runs.
    fn versions() -> Vec<(&'static str, BlockFn)> {
        let mut v: Vec<(&'static str, BlockFn)> = vec![("portable", softmax_block as BlockFn)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                v.push(("avx2", softmax_block_avx2 as BlockFn));
            }
            if std::is_x86_feature_detected!("avx512f") {
                v.push(("avx512", softmax_block_avx512 as BlockFn));
            }
        }
        v
    }

    /// One test input: key-major scores (`keys × q`, dense), running max and running sum.
    struct Case {
        what: &'static str,
        scores: Vec<f32>,
        max: Vec<f32>,
        sum: Vec<f32>,
    }

    /// The cases for `q` queries and `keys` keys. Each special pattern hits a few queries
    /// (first, middle, last) so the tails see it too.
    fn cases(q: usize, keys: usize) -> Vec<Case> {
        let n = q * keys;
        let seed = (q * 131 + keys) as u32 + 1;
        let uniform: Vec<f32> = test_values(n, seed).iter().map(|v| v * 8.0).collect();
        let ninf = f32::NEG_INFINITY;
        let at = |i: usize| q > 0 && (i == 0 || i == q / 2 || i == q - 1);
        let each = |f: &dyn Fn(usize, usize, f32) -> f32| -> Vec<f32> {
            (0..n)
                .map(|k| f(k / q.max(1), k % q.max(1), uniform[k]))
                .collect()
        };
        let sums: Vec<f32> = (0..q).map(|i| 0.5 + i as f32).collect();
        vec![
            Case {
                what: "uniform, fresh",
                scores: uniform.clone(),
                max: vec![ninf; q],
                sum: vec![0.0; q],
            },
            Case {
                what: "uniform, running max and sum",
                scores: uniform.clone(),
                max: (0..q).map(|i| (i % 5) as f32 - 2.0).collect(),
                sum: sums.clone(),
            },
            Case {
                what: "running max above the block",
                scores: uniform.clone(),
                max: (0..q).map(|i| 20.0 + 40.0 * (i % 3) as f32).collect(),
                sum: sums.clone(),
            },
            Case {
                what: "-inf entries",
                scores: each(&|j, i, s| if (i + j) % 3 == 1 { ninf } else { s }),
                max: vec![ninf; q],
                sum: vec![0.0; q],
            },
            Case {
                what: "all -inf for some queries",
                scores: each(&|_, i, s| if at(i) { ninf } else { s }),
                max: vec![ninf; q],
                sum: vec![0.0; q],
            },
            Case {
                what: "all -inf for some queries, finite running max",
                scores: each(&|_, i, s| if at(i) { ninf } else { s }),
                max: vec![1.5; q],
                sum: sums.clone(),
            },
            Case {
                what: "NaN scores",
                scores: each(&|j, i, s| if at(i) && j == keys / 2 { f32::NAN } else { s }),
                max: vec![ninf; q],
                sum: vec![0.0; q],
            },
            Case {
                what: "NaN among -inf",
                scores: each(&|j, i, _| if at(i) && j == 0 { f32::NAN } else { ninf }),
                max: vec![ninf; q],
                sum: vec![0.0; q],
            },
            Case {
                what: "NaN running max",
                scores: uniform.clone(),
                max: (0..q).map(|i| if at(i) { f32::NAN } else { 0.0 }).collect(),
                sum: sums.clone(),
            },
            Case {
                what: "±1e4",
                scores: each(&|j, i, s| match (i + j) % 4 {
                    0 => 1e4,
                    1 => -1e4,
                    _ => s * 1250.0,
                }),
                max: vec![ninf; q],
                sum: vec![0.0; q],
            },
            Case {
                what: "near 1e4, running max 1e4",
                scores: each(&|_, _, s| 1e4 + s),
                max: vec![1e4; q],
                sum: sums.clone(),
            },
            Case {
                what: "+inf score",
                scores: each(&|j, i, s| if at(i) && j == 0 { f32::INFINITY } else { s }),
                max: vec![ninf; q],
                sum: vec![0.0; q],
            },
        ]
    }

    /// The contract in `f64`: `(max, rescale, sum, probabilities)`.
    fn reference(case: &Case, q: usize, keys: usize) -> (Vec<f32>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut new = case.max.clone();
        for row in case.scores.chunks_exact(q.max(1)).take(keys) {
            for (m, &s) in new.iter_mut().zip(row) {
                if s > *m || s.is_nan() {
                    *m = s;
                }
            }
        }
        let mut rescale = vec![0.0f64; q];
        let mut sum = vec![0.0f64; q];
        for i in 0..q {
            let (old, m) = (f64::from(case.max[i]), f64::from(new[i]));
            rescale[i] = if case.max[i] == new[i] {
                1.0
            } else {
                (old - m).exp()
            };
            sum[i] = f64::from(case.sum[i]) * rescale[i];
        }
        let mut p = vec![0.0f64; q * keys];
        for j in 0..keys {
            for i in 0..q {
                let m = new[i];
                p[j * q + i] = if m == f32::NEG_INFINITY {
                    0.0
                } else {
                    (f64::from(case.scores[j * q + i]) - f64::from(m)).exp()
                };
                sum[i] += p[j * q + i];
            }
        }
        (new, rescale, sum, p)
    }

    /// `got` is within rounding of `want` (f32 arguments `x` rounded with error ≤ 2^-24 |x|,
    /// a 2-ulp exp, subnormal slack), or both NaN.
    fn close(got: f32, want: f64, arg: f64, rel: f64) -> bool {
        if want.is_nan() {
            return got.is_nan();
        }
        let arg = if arg.is_finite() { arg.abs() } else { 0.0 };
        // The absolute floor: the vector versions give 0 for probabilities below the smallest
        // normal float.
        let tol = want.abs() * ((arg + 4.0) * f64::from(f32::EPSILON) / 2.0 + rel)
            + f64::from(f32::MIN_POSITIVE);
        (f64::from(got) - want).abs() <= tol || f64::from(got) == want
    }

    /// Runs `f` on `case` laid out with stride `q + 3` and guards; checks it against the
    /// reference; returns the probabilities.
    fn run(name: &str, f: BlockFn, case: &Case, q: usize, keys: usize) -> Vec<f32> {
        let lds = q + 3;
        let mut scores = vec![GUARD; keys * lds + 1];
        for j in 0..keys {
            scores[j * lds..][..q].copy_from_slice(&case.scores[j * q..][..q]);
        }
        let mut max = case.max.clone();
        let mut sum = case.sum.clone();
        sum.push(GUARD);
        let mut rescale = vec![GUARD; q + 1];
        // SAFETY: `versions` only lists the versions this CPU supports.
        unsafe { f(&mut scores, lds, keys, &mut max, &mut sum, &mut rescale) };
        let ctx = || format!("{name}, q {q}, keys {keys}, {}", case.what);
        assert_eq!(sum[q], GUARD, "{}: wrote past sum", ctx());
        assert_eq!(rescale[q], GUARD, "{}: wrote past rescale", ctx());
        for j in 0..keys {
            assert!(
                scores[j * lds + q..][..3].iter().all(|&g| g == GUARD),
                "{}: wrote into the padding after key {j}",
                ctx()
            );
        }
        let (want_max, want_rescale, want_sum, want_p) = reference(case, q, keys);
        let mut probs = Vec::new();
        for i in 0..q {
            let (m, wm) = (max[i], want_max[i]);
            assert!(
                m.to_bits() == wm.to_bits() || (m.is_nan() && wm.is_nan()),
                "{}: max[{i}] {m} != {wm}",
                ctx()
            );
            let arg = f64::from(case.max[i]) - f64::from(wm);
            assert!(
                close(rescale[i], want_rescale[i], arg, 0.0),
                "{}: rescale[{i}] {:e} != {:e}",
                ctx(),
                rescale[i],
                want_rescale[i]
            );
            assert!(
                close(sum[i], want_sum[i], 0.0, 2e-5),
                "{}: sum[{i}] {:e} != {:e}",
                ctx(),
                sum[i],
                want_sum[i]
            );
            for j in 0..keys {
                let (p, wp) = (scores[j * lds + i], want_p[j * q + i]);
                let arg = f64::from(case.scores[j * q + i]) - f64::from(wm);
                assert!(
                    close(p, wp, arg, 0.0),
                    "{}: p[{j}][{i}] {p:e} != {wp:e}",
                    ctx()
                );
                probs.push(p);
            }
        }
        probs
    }

    #[test]
    fn every_version_matches_the_reference() {
        for (name, f) in versions() {
            for q in QUERIES {
                for keys in KEYS {
                    for case in cases(q, keys) {
                        run(name, f, &case, q, keys);
                    }
                }
            }
        }
    }

    #[test]
    fn vector_versions_agree_bit_for_bit() {
        let v = versions();
        if v.len() < 3 {
            return;
        }
        for q in QUERIES {
            for keys in KEYS {
                for case in cases(q, keys) {
                    let a = run(v[1].0, v[1].1, &case, q, keys);
                    let b = run(v[2].0, v[2].1, &case, q, keys);
                    for (x, y) in a.iter().zip(&b) {
                        assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
                    }
                }
            }
        }
    }

    /// Throughput of one 64-key × 64-query block, per version, in ns per score.
    #[test]
    #[ignore = "timing: run with --release -- --ignored --nocapture"]
    fn timing_64_by_64_block() {
        use core::hint::black_box;
        const REPS: usize = 50_000;
        let block: Vec<f32> = test_values(64 * 64, 3).iter().map(|v| v * 5.0).collect();
        let mut scores = block.clone();
        let (mut max, mut sum, mut rescale) = ([0.0f32; 64], [0.0f32; 64], [0.0f32; 64]);
        for (name, f) in versions() {
            let ns = (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    for _ in 0..REPS {
                        scores.copy_from_slice(&block);
                        max.fill(f32::NEG_INFINITY);
                        sum.fill(0.0);
                        // SAFETY: `versions` only lists the versions this CPU supports.
                        unsafe {
                            f(
                                black_box(&mut scores),
                                64,
                                64,
                                &mut max,
                                &mut sum,
                                &mut rescale,
                            )
                        };
                        black_box((&scores, &sum));
                    }
                    t.elapsed().as_secs_f64() * 1e9 / (REPS * 64 * 64) as f64
                })
                .fold(f64::INFINITY, f64::min);
            println!("softmax_block {name}: {ns:.3} ns/score (64 × 64 block, incl. copy)");
        }
    }
}
