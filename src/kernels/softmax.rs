//! The online-softmax row step ([`Kernels::softmax_row`](super::Kernels::softmax_row)) for each
//! instruction set.
//!
//! Two passes over the row: the maximum, then `exp(row[j] - new_max)` in place with its sum.
//! Every version has the same semantics, NaN included:
//!
//! - `new_max = max(running_max, max(row))`, except that it is NaN when `running_max` or any
//!   score is NaN (a NaN is never silently dropped by the maximum);
//! - if `new_max` is `-inf` (every score so far masked) the row becomes zeros and the result
//!   is `(-inf, 0)`;
//! - otherwise `row[j] = exp(row[j] - new_max)` and the result is `(new_max, Σ row[j])`. With a
//!   NaN maximum every probability and the sum are NaN, so one NaN score poisons its whole query
//!   row (as it does in `softmax` computed any other way), and through the running maximum the
//!   rest of the row's key blocks too.
//!
//! The sum is accumulated lane-wise (16 lanes portable and AVX-512, 8 AVX2) and then reduced, so
//! its rounding differs between instruction sets; the probabilities agree bit for bit between
//! AVX2 and AVX-512 and differ from the portable ones by at most an ulp (unfused arithmetic).

use super::exp::exp;

/// Lanes of the portable accumulators: wide enough for LLVM to keep a few vectors in flight.
const LANES: usize = 16;

/// `max(running_max, max(row))`, NaN if any of them is NaN.
///
/// Lane-wise accumulators so that LLVM vectorises it; the select keeps a NaN once it is in a
/// lane (`v > NaN` and `v != v` are both false for a number `v`).
fn portable_max(row: &[f32], running_max: f32) -> f32 {
    #[inline]
    fn step(m: f32, v: f32) -> f32 {
        if v > m || v.is_nan() {
            v
        } else {
            m
        }
    }
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = step(*m, v);
        }
    }
    for (m, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *m = step(*m, v);
    }
    lanes.into_iter().fold(running_max, step)
}

/// See [`Kernels::softmax_row`](super::Kernels::softmax_row) and the module documentation.
/// Plain loops that LLVM vectorises for the build's baseline target.
pub(crate) fn softmax_row(row: &mut [f32], running_max: f32) -> (f32, f32) {
    let new_max = portable_max(row, running_max);
    if new_max == f32::NEG_INFINITY {
        row.fill(0.0);
        return (new_max, 0.0);
    }
    for s in row.iter_mut() {
        *s = exp(*s - new_max);
    }
    let mut lanes = [0.0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (acc, &p) in lanes.iter_mut().zip(chunk) {
            *acc += p;
        }
    }
    for (acc, &p) in lanes.iter_mut().zip(chunks.remainder()) {
        *acc += p;
    }
    (new_max, lanes.into_iter().sum())
}

// Not yet referenced by the AVX2 / AVX-512 kernel tables (wired in when those land); remove
// the `allow`s then.
#[cfg(target_arch = "x86_64")]
#[allow(unused_imports)]
pub(crate) use x86::{softmax_row_avx2, softmax_row_avx512};

/// The AVX2 and AVX-512 versions.
#[cfg(target_arch = "x86_64")]
#[allow(dead_code)]
mod x86 {
    use core::arch::x86_64::*;

    use super::super::exp::{exp_avx2, exp_avx512};

    /// The new maximum from a lane-wise maximum (NaN lanes ignored by the reduction) and whether
    /// any score was NaN.
    #[inline]
    fn combine(row_max: f32, any_nan: bool, running_max: f32) -> f32 {
        if any_nan || running_max.is_nan() {
            f32::NAN
        } else if row_max > running_max {
            row_max
        } else {
            running_max
        }
    }

    /// Mask of the first `rem` (< 8) lanes for `vmaskmovps`: all ones where the lane is used.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn tail_mask_avx2(rem: usize) -> __m256i {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(rem as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    /// [`softmax_row`](super::softmax_row) with AVX2 + FMA: eight lanes, a masked tail.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn softmax_row_avx2(row: &mut [f32], running_max: f32) -> (f32, f32) {
        const W: usize = 8;
        let len = row.len();
        let full = len - len % W;
        let mask = tail_mask_avx2(len % W);
        let ptr = row.as_mut_ptr();
        let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);

        // Pass 1: the maximum, and whether any score is NaN (unordered with itself).
        let mut vmax = neg_inf;
        let mut nan = _mm256_setzero_ps();
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= len, so the 8 floats at ptr + i are inside `row`.
            let v = unsafe { _mm256_loadu_ps(ptr.add(i)) };
            vmax = _mm256_max_ps(vmax, v);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            i += W;
        }
        if full < len {
            // SAFETY: `mask` selects the len - full < 8 lanes at ptr + full, all inside `row`;
            // masked-off lanes are not accessed.
            let v = unsafe { _mm256_maskload_ps(ptr.add(full), mask) };
            let v = _mm256_blendv_ps(neg_inf, v, _mm256_castsi256_ps(mask));
            vmax = _mm256_max_ps(vmax, v);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        }
        let halves = _mm_max_ps(
            _mm256_castps256_ps128(vmax),
            _mm256_extractf128_ps::<1>(vmax),
        );
        let pairs = _mm_max_ps(halves, _mm_movehl_ps(halves, halves));
        let one = _mm_max_ss(pairs, _mm_shuffle_ps::<0b01>(pairs, pairs));
        let any_nan = _mm256_movemask_ps(nan) != 0;
        let new_max = combine(_mm_cvtss_f32(one), any_nan, running_max);
        if new_max == f32::NEG_INFINITY {
            row.fill(0.0);
            return (new_max, 0.0);
        }

        // Pass 2: exp in place and the sum.
        let vm = _mm256_set1_ps(new_max);
        let mut sum = _mm256_setzero_ps();
        let mut i = 0;
        while i < full {
            // SAFETY: as in pass 1, the 8 floats at ptr + i are inside `row`.
            let v = unsafe { _mm256_loadu_ps(ptr.add(i)) };
            let p = exp_avx2(_mm256_sub_ps(v, vm));
            // SAFETY: the same 8 floats, which `row` lets us write.
            unsafe { _mm256_storeu_ps(ptr.add(i), p) };
            sum = _mm256_add_ps(sum, p);
            i += W;
        }
        if full < len {
            // SAFETY: as in pass 1, only the lanes inside `row` are read.
            let v = unsafe { _mm256_maskload_ps(ptr.add(full), mask) };
            let p = exp_avx2(_mm256_sub_ps(v, vm));
            // SAFETY: only the lanes inside `row` are written.
            unsafe { _mm256_maskstore_ps(ptr.add(full), mask, p) };
            sum = _mm256_add_ps(sum, _mm256_and_ps(p, _mm256_castsi256_ps(mask)));
        }
        let halves = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps::<1>(sum));
        let pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
        let one = _mm_add_ss(pairs, _mm_shuffle_ps::<0b01>(pairs, pairs));
        (new_max, _mm_cvtss_f32(one))
    }

    /// [`softmax_row`](super::softmax_row) with AVX-512F: sixteen lanes, a masked tail.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn softmax_row_avx512(row: &mut [f32], running_max: f32) -> (f32, f32) {
        const W: usize = 16;
        let len = row.len();
        let full = len - len % W;
        let mask: __mmask16 = ((1u32 << (len % W)) - 1) as __mmask16;
        let ptr = row.as_mut_ptr();
        let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);

        // Pass 1: the maximum, and whether any score is NaN (unordered with itself).
        let mut vmax = neg_inf;
        let mut nan: __mmask16 = 0;
        let mut i = 0;
        while i < full {
            // SAFETY: i + 16 <= full <= len, so the 16 floats at ptr + i are inside `row`.
            let v = unsafe { _mm512_loadu_ps(ptr.add(i)) };
            vmax = _mm512_max_ps(vmax, v);
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            i += W;
        }
        if full < len {
            // SAFETY: `mask` selects the len - full < 16 lanes at ptr + full, all inside `row`;
            // masked-off lanes are not accessed (no fault, -inf instead).
            let v = unsafe { _mm512_mask_loadu_ps(neg_inf, mask, ptr.add(full)) };
            vmax = _mm512_max_ps(vmax, v);
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        }
        let new_max = combine(_mm512_reduce_max_ps(vmax), nan != 0, running_max);
        if new_max == f32::NEG_INFINITY {
            row.fill(0.0);
            return (new_max, 0.0);
        }

        // Pass 2: exp in place and the sum.
        let vm = _mm512_set1_ps(new_max);
        let mut sum = _mm512_setzero_ps();
        let mut i = 0;
        while i < full {
            // SAFETY: as in pass 1, the 16 floats at ptr + i are inside `row`.
            let v = unsafe { _mm512_loadu_ps(ptr.add(i)) };
            let p = exp_avx512(_mm512_sub_ps(v, vm));
            // SAFETY: the same 16 floats, which `row` lets us write.
            unsafe { _mm512_storeu_ps(ptr.add(i), p) };
            sum = _mm512_add_ps(sum, p);
            i += W;
        }
        if full < len {
            // SAFETY: as in pass 1, only the lanes inside `row` are read (the rest are zero).
            let v = unsafe { _mm512_maskz_loadu_ps(mask, ptr.add(full)) };
            let p = exp_avx512(_mm512_sub_ps(v, vm));
            // SAFETY: only the lanes inside `row` are written.
            unsafe { _mm512_mask_storeu_ps(ptr.add(full), mask, p) };
            sum = _mm512_mask_add_ps(sum, mask, sum, p);
        }
        (new_max, _mm512_reduce_add_ps(sum))
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    //! Every version against an `f64` reference, with the vector versions called directly
    //! (guarded by run-time feature detection).
    use super::*;
    use alloc::format;
    use alloc::vec;
    use alloc::vec::Vec;
    use std::println;

    type RowFn = unsafe fn(&mut [f32], f32) -> (f32, f32);

    const LENGTHS: [usize; 15] = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65];

    /// The versions this CPU runs.
    fn versions() -> Vec<(&'static str, RowFn)> {
        let mut v: Vec<(&'static str, RowFn)> = vec![("portable", softmax_row as RowFn)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                v.push(("avx2", softmax_row_avx2 as RowFn));
            }
            if std::is_x86_feature_detected!("avx512f") {
                v.push(("avx512", softmax_row_avx512 as RowFn));
            }
        }
        v
    }

    /// The contract in `f64`: `(new_max, probabilities, sum)`.
    fn reference(row: &[f32], running_max: f32) -> (f32, Vec<f64>, f64) {
        let mut m = running_max;
        for &s in row {
            if s.is_nan() || m.is_nan() {
                m = f32::NAN;
            } else if s > m {
                m = s;
            }
        }
        if m == f32::NEG_INFINITY {
            return (m, vec![0.0; row.len()], 0.0);
        }
        let p: Vec<f64> = row
            .iter()
            .map(|&s| (f64::from(s) - f64::from(m)).exp())
            .collect();
        let sum = p.iter().sum();
        (m, p, sum)
    }

    /// A small deterministic generator of values in [-1, 1).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// The test rows of one length: `(description, row, running_max)`.
    fn cases(len: usize) -> Vec<(&'static str, Vec<f32>, f32)> {
        let mut rng = Lcg(len as u64 + 1);
        let uniform: Vec<f32> = (0..len).map(|_| rng.next() * 8.0).collect();
        let with = |f: &dyn Fn(usize, f32) -> f32| -> Vec<f32> {
            uniform.iter().enumerate().map(|(j, &s)| f(j, s)).collect()
        };
        let ninf = f32::NEG_INFINITY;
        let mut c = vec![
            ("uniform", uniform.clone(), ninf),
            ("uniform, finite running max", uniform.clone(), -3.0),
            ("running max above the row", uniform.clone(), 20.0),
            ("running max far above the row", uniform.clone(), 95.0),
            (
                "-inf entries",
                with(&|j, s| if j % 3 == 1 { ninf } else { s }),
                ninf,
            ),
            ("all -inf", vec![ninf; len], ninf),
            ("all -inf, finite running max", vec![ninf; len], 2.5),
            (
                "large values",
                with(&|j, s| if j % 2 == 0 { s * 1250.0 } else { -1e4 }),
                ninf,
            ),
            (
                "±1e4",
                with(&|j, _| if j % 5 == 2 { 1e4 } else { -1e4 }),
                ninf,
            ),
            ("near 1e4", with(&|_, s| 1e4 + s), 0.0),
            ("NaN running max", uniform.clone(), f32::NAN),
        ];
        if len > 0 {
            for at in [0, len / 2, len - 1] {
                let mut row = uniform.clone();
                row[at] = f32::NAN;
                c.push(("NaN entry", row, ninf));
                let mut row = vec![ninf; len];
                row[at] = f32::NAN;
                c.push(("NaN among -inf", row, ninf));
            }
            let mut row = uniform.clone();
            row[len - 1] = f32::INFINITY;
            c.push(("+inf entry", row, ninf));
        }
        c
    }

    /// Runs `f` on a copy of `row` inside guard values and checks the result against the
    /// reference; returns the probabilities.
    fn check(name: &str, f: RowFn, what: &str, row: &[f32], running_max: f32) -> Vec<f32> {
        const GUARD: f32 = 12345.0;
        let mut buf = vec![GUARD; row.len() + 2];
        buf[1..=row.len()].copy_from_slice(row);
        // SAFETY: `versions` only lists the versions this CPU supports.
        let (m, sum) = unsafe { f(&mut buf[1..=row.len()], running_max) };
        let ctx = || {
            format!(
                "{name}, len {}, {what}, running max {running_max}",
                row.len()
            )
        };
        assert_eq!(buf[0], GUARD, "{}: wrote before the row", ctx());
        assert_eq!(buf[row.len() + 1], GUARD, "{}: wrote past the row", ctx());
        let got = &buf[1..=row.len()];
        let (want_m, want_p, want_sum) = reference(row, running_max);
        assert!(
            m.to_bits() == want_m.to_bits() || (m.is_nan() && want_m.is_nan()),
            "{}: max {m} != {want_m}",
            ctx()
        );
        for (j, (&s, (&p, &q))) in row.iter().zip(got.iter().zip(&want_p)).enumerate() {
            if q.is_nan() {
                assert!(p.is_nan(), "{}: p[{j}] = {p}, expected NaN", ctx());
                continue;
            }
            // Rounding of `s - new_max` in f32 (≤ 2^-24 |s - m| relative after exp), of exp
            // (≤ 2 ulp), and absolute slack for subnormal results.
            let d = (f64::from(s) - f64::from(m)).abs();
            let d = if d.is_finite() { d } else { 0.0 };
            let tol = q * (d + 4.0) * f64::from(f32::EPSILON) / 2.0 + 2.0 * 1.4e-45;
            assert!(
                (f64::from(p) - q).abs() <= tol,
                "{}: p[{j}] = {p:e}, expected {q:e}",
                ctx()
            );
        }
        if want_sum.is_nan() {
            assert!(sum.is_nan(), "{}: sum {sum}, expected NaN", ctx());
        } else {
            let tol = want_sum * 2e-5 + row.len() as f64 * 3e-45;
            assert!(
                (f64::from(sum) - want_sum).abs() <= tol,
                "{}: sum {sum:e}, expected {want_sum:e}",
                ctx()
            );
        }
        got.to_vec()
    }

    #[test]
    fn every_version_matches_the_reference() {
        for (name, f) in versions() {
            for len in LENGTHS {
                for (what, row, running_max) in cases(len) {
                    check(name, f, what, &row, running_max);
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
        for len in LENGTHS {
            for (what, row, running_max) in cases(len) {
                let a = check(v[1].0, v[1].1, what, &row, running_max);
                let b = check(v[2].0, v[2].1, what, &row, running_max);
                for (x, y) in a.iter().zip(&b) {
                    assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
                }
            }
        }
    }

    #[test]
    fn a_row_sums_to_one_after_normalising() {
        for (name, f) in versions() {
            let mut rng = Lcg(7);
            let mut row: Vec<f32> = (0..64).map(|_| rng.next() * 30.0).collect();
            // SAFETY: `versions` only lists the versions this CPU supports.
            let (_, sum) = unsafe { f(&mut row, f32::NEG_INFINITY) };
            let total: f32 = row.iter().map(|p| p / sum).sum();
            assert!((total - 1.0).abs() < 1e-5, "{name}: {total}");
        }
    }

    /// The best of five runs of `reps` calls of `f`, in ns per element of a 64-float row.
    fn time(reps: usize, mut f: impl FnMut()) -> f64 {
        (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    f();
                }
                t.elapsed().as_secs_f64() * 1e9 / (reps * 64) as f64
            })
            .fold(f64::INFINITY, f64::min)
    }

    /// Throughput of `exp` (out of place) and of the whole row step (in place, on a fresh copy
    /// of the row each time) over one 64-float row, per version.
    #[test]
    #[ignore = "timing: run with --release -- --ignored --nocapture"]
    fn timing_64_float_row() {
        use core::hint::black_box;
        const REPS: usize = 2_000_000;
        let mut rng = Lcg(3);
        let mut row = [0.0f32; 64];
        row.iter_mut().for_each(|x| *x = rng.next() * 10.0 - 5.0);
        let mut out = [0.0f32; 64];
        for (name, f) in versions() {
            let ns = time(REPS, || {
                out = row;
                // SAFETY: `versions` only lists the versions this CPU supports.
                black_box(unsafe { f(black_box(&mut out), f32::NEG_INFINITY) });
            });
            println!("softmax_row {name}: {ns:.3} ns/element (64-float row)");
        }
        let ns = time(REPS, || {
            for (o, &x) in black_box(&mut out).iter_mut().zip(black_box(&row)) {
                *o = exp(x);
            }
        });
        println!("exp portable: {ns:.3} ns/element (64-float row)");
        #[cfg(target_arch = "x86_64")]
        {
            use super::super::exp::{exp_avx2, exp_avx512};
            use core::arch::x86_64::*;
            /// `out = exp(row)`, eight lanes at a time.
            #[target_feature(enable = "avx2,fma")]
            fn avx2(row: &[f32; 64], out: &mut [f32; 64]) {
                for (o, x) in out.chunks_exact_mut(8).zip(row.chunks_exact(8)) {
                    // SAFETY: `o` and `x` hold 8 floats each.
                    unsafe {
                        _mm256_storeu_ps(o.as_mut_ptr(), exp_avx2(_mm256_loadu_ps(x.as_ptr())))
                    };
                }
            }
            /// `out = exp(row)`, sixteen lanes at a time.
            #[target_feature(enable = "avx512f")]
            fn avx512(row: &[f32; 64], out: &mut [f32; 64]) {
                for (o, x) in out.chunks_exact_mut(16).zip(row.chunks_exact(16)) {
                    // SAFETY: `o` and `x` hold 16 floats each.
                    unsafe {
                        _mm512_storeu_ps(o.as_mut_ptr(), exp_avx512(_mm512_loadu_ps(x.as_ptr())))
                    };
                }
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                // SAFETY: AVX2 and FMA detected.
                let ns = time(REPS, || unsafe {
                    avx2(black_box(&row), black_box(&mut out))
                });
                println!("exp avx2: {ns:.3} ns/element (64-float row)");
            }
            if std::is_x86_feature_detected!("avx512f") {
                // SAFETY: AVX-512F detected.
                let ns = time(REPS, || unsafe {
                    avx512(black_box(&row), black_box(&mut out))
                });
                println!("exp avx512: {ns:.3} ns/element (64-float row)");
            }
        }
    }
}
