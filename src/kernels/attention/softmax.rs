//! The online-softmax updates of one key block
//! ([`Kernels::softmax_block`](crate::kernels::Kernels::softmax_block)) and of one query
//! ([`Kernels::softmax_row`](crate::kernels::Kernels::softmax_row)), once for every instruction set.
//!
//! Block scores are key-major (`scores[j*lds + i]`: query `i`, key `j`), so the block runs
//! down the key axis with the *queries* in the vector lanes: no horizontal reductions, and
//! each query's sum is accumulated in key order exactly as the contract says. Per lane group
//! of queries: the new maximum (a NaN score or running max wins and stays: it is tracked apart
//! from [`Simd::max`], which may drop it), the rescale factor (exactly 1 when the maximum is
//! unchanged), then `exp(s - new)` in place (0 when `new` is `-inf`) and the running sum. A
//! whole lane group goes through plain loads and stores, the last partial one through
//! [`Simd::load_first`] and [`Simd::store_first`]. Nothing outside `scores[j*lds .. j*lds +
//! q]` is read or written. The row takes the same steps with the keys in the lanes for `exp`
//! and the sum in key order.
//!
//! The rescale factors use the full [`exp_vector`]; the probabilities use [`probability`], which on
//! the vector tables gives exactly 0 below the smallest normal float (masked `-inf` scores
//! among them): that avoids slow subnormal arithmetic and cannot change a sum of at least 1.
//! The portable table is not fused, so its results may differ from the vector tables' in the
//! last bit; the vector tables agree bit for bit.

use crate::kernels::gemm::micro::lane_values;
use crate::kernels::math::exp::{exp_vector, probability};
use crate::kernels::simd::portable::PORTABLE;
use crate::kernels::simd::Simd;

/// [`Kernels::softmax_row`](crate::kernels::Kernels::softmax_row) of the portable table (for the
/// attention-weights path, which runs off the fast path on every table).
pub(crate) fn softmax_row(row: &mut [f32], max: &mut f32, sum: &mut f32) -> f32 {
    self::row(PORTABLE, row, max, sum)
}

/// Checks the slice lengths the contract promises, so the pointer arithmetic below stays
/// inside the slices (a violation panics instead of reading out of bounds).
fn check(scores: &[f32], lds: usize, keys: usize, q: usize, sum: &[f32], rescale: &[f32]) {
    assert!(lds >= q && sum.len() >= q && rescale.len() >= q);
    if keys > 0 && q > 0 {
        assert!(crate::kernels::operands::fits(
            scores.len(),
            keys - 1,
            lds,
            q
        ));
    }
}

/// See [`Kernels::softmax_block`](crate::kernels::Kernels::softmax_block): `LANES` queries per lane
/// group, a partial last group.
#[inline(always)]
pub(crate) fn block<S: Simd>(
    s: S,
    (scores, lds, keys): (&mut [f32], usize, usize),
    max: &mut [f32],
    sum: &mut [f32],
    rescale: &mut [f32],
) {
    let q = max.len();
    check(scores, lds, keys, q, sum, rescale);
    let s_ptr = scores.as_mut_ptr();
    let (m_ptr, sum_ptr, r_ptr) = (max.as_mut_ptr(), sum.as_mut_ptr(), rescale.as_mut_ptr());
    for i0 in (0..q).step_by(S::LANES) {
        let lanes = (q - i0).min(S::LANES);
        // SAFETY: `check` proved that max, sum, rescale hold queries i0 .. i0 + lanes and
        // scores holds j*lds + i for those queries and j < keys.
        unsafe {
            let ptrs = (s_ptr.add(i0), m_ptr.add(i0), sum_ptr.add(i0), r_ptr.add(i0));
            if lanes == S::LANES {
                lane_group::<S, false>(s, ptrs, lds, keys, lanes);
            } else {
                lane_group::<S, true>(s, ptrs, lds, keys, lanes);
            }
        }
    }
}

/// [`block`] for the queries `0 .. lanes` from the pointers `(scores, max, sum, rescale)`:
/// plain loads and stores for a whole group, else through the first `lanes` lanes
/// (`PARTIAL`).
///
/// # Safety
/// `max`, `sum`, `rescale` hold `lanes` values and `scores` `lanes` values at `j*lds` for
/// every `j < keys`; `lanes == LANES` unless `PARTIAL`.
#[inline(always)]
unsafe fn lane_group<S: Simd, const PARTIAL: bool>(
    s: S,
    (s_ptr, m_ptr, sum_ptr, r_ptr): (*mut f32, *mut f32, *mut f32, *mut f32),
    lds: usize,
    keys: usize,
    lanes: usize,
) {
    // SAFETY: (every load and store below) the caller's promise; a partial group touches
    // its first `lanes` values only.
    let load = |p: *const f32| unsafe {
        if PARTIAL {
            s.load_first(p, lanes)
        } else {
            s.load(p)
        }
    };
    // SAFETY: as for `load`.
    let store = |p: *mut f32, v: S::V| unsafe {
        if PARTIAL {
            s.store_first(p, lanes, v)
        } else {
            s.store(p, v)
        }
    };
    let old = load(m_ptr);
    let mut new = old;
    let mut nan = s.is_nan(old);
    for j in 0..keys {
        let x = load(s_ptr.wrapping_add(j * lds));
        new = s.max(new, x);
        nan = s.or(nan, s.is_nan(x));
    }
    let new = s.set_nan(new, nan);
    let same = s.eq(old, new);
    let factor = s.select(same, s.splat(1.0), exp_vector(s, s.sub(old, new)));
    let mut total = s.mul(load(sum_ptr), factor);
    store(m_ptr, new);
    store(r_ptr, factor);
    // Queries whose maximum is -inf get probability 0.
    let dead = s.eq(new, s.splat(f32::NEG_INFINITY));
    for j in 0..keys {
        let row = s_ptr.wrapping_add(j * lds);
        let p = s.zero_where(dead, probability(s, s.sub(load(row), new)));
        store(row, p);
        total = s.add(total, p);
    }
    store(sum_ptr, total);
}

/// See [`Kernels::softmax_row`](crate::kernels::Kernels::softmax_row): [`block`] for one query, the
/// same operations in the same order (keys in the lanes for `exp`, the sum in key order).
#[inline(always)]
pub(crate) fn row<S: Simd>(s: S, row: &mut [f32], max: &mut f32, sum: &mut f32) -> f32 {
    let old = *max;
    let new = row_max(s, old, row);
    let factor = rescale_factor(old, new, |x| s.on_one(x, |v| exp_vector(s, v)));
    *max = new;
    if new == f32::NEG_INFINITY {
        row.fill(0.0);
        *sum *= factor;
        return factor;
    }
    let mut total = *sum * factor;
    let new = s.splat(new);
    for chunk in row.chunks_mut(S::LANES) {
        let (n, ptr) = (chunk.len(), chunk.as_mut_ptr());
        // SAFETY: `chunk` holds n ≤ LANES values; a partial one is read and written through
        // its first n lanes only.
        let p = unsafe {
            let x = if n == S::LANES {
                s.load(ptr)
            } else {
                s.load_first(ptr, n)
            };
            let p = probability(s, s.sub(x, new));
            if n == S::LANES {
                s.store(ptr, p);
            } else {
                s.store_first(ptr, n, p);
            }
            p
        };
        for &p in &lane_values(s, p)[..n] {
            total += p;
        }
    }
    *sum = total;
    factor
}

/// `exp(old - new)` as [`block`] computes it, without calling `exp` in the two cases whose
/// value is known: exactly 1 when the maximum is unchanged, exactly 0 when the old one is
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

/// The new running maximum of a row for [`row`]: [`block`]'s steps on one lane, so
/// `max(old, row)` with [`Simd::max`]'s ties, and a NaN when `old` or any score is NaN.
#[inline(always)]
fn row_max<S: Simd>(s: S, old: f32, row: &[f32]) -> f32 {
    let mut new = s.splat(old);
    let mut nan = s.is_nan(new);
    for &x in row {
        let x = s.splat(x);
        new = s.max(new, x);
        nan = s.or(nan, s.is_nan(x));
    }
    s.first(s.set_nan(new, nan))
}

#[cfg(all(test, feature = "std"))]
mod tests {
    //! Every table's version against an `f64` reference of the contract.
    use crate::kernels::tests::values as test_values;
    use crate::kernels::Isa;
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

    /// The kernel tables this CPU runs: name and `softmax_block`.
    fn versions() -> Vec<(&'static str, BlockFn)> {
        Isa::ALL
            .into_iter()
            .filter(|isa| isa.is_supported())
            .map(|isa| (isa.name(), isa.kernels().unwrap().softmax_block))
            .collect()
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

    /// The vector tables (all but the portable one) agree bit for bit.
    #[test]
    fn vector_versions_agree_bit_for_bit() {
        let vector: Vec<_> = versions()
            .into_iter()
            .filter(|&(name, _)| name != Isa::Portable.name())
            .collect();
        for pair in vector.windows(2) {
            for q in QUERIES {
                for keys in KEYS {
                    for case in cases(q, keys) {
                        let a = run(pair[0].0, pair[0].1, &case, q, keys);
                        let b = run(pair[1].0, pair[1].1, &case, q, keys);
                        for (x, y) in a.iter().zip(&b) {
                            assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
                        }
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
