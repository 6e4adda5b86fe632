//! Unit tests of the kernel tables: detection and every table against the portable one.

/// congruential sequence started at `seed`.
pub(crate) fn values(n: usize, seed: u32) -> alloc::vec::Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 8) as f32 / (1 << 23) as f32 - 1.0
        })
        .collect()
}

use alloc::vec::Vec;
use alloc::{format, vec};

use crate::kernels::format::{Panels, Slices, Stored};
use crate::kernels::{Isa, Kernels};

/// `C = A · B` through the GEMM on `threads` scratch slots (one thread: the caller's), `C`
/// starting as NaNs so that an element not written shows.
pub(crate) fn gemm_product(
    b: &crate::kernels::PackedB,
    a: &[f32],
    m: usize,
    threads: usize,
) -> Vec<f32> {
    use crate::kernels::gemm::{gemm_with, GemmScratch, Output};
    let mut c = vec![f32::NAN; m * b.cols()];
    let mut scratch: Vec<GemmScratch> = (0..threads).map(|_| GemmScratch::default()).collect();
    let out = [Output::new(&mut c, b.cols())];
    let pool = &mut crate::kernels::threads::parallel::Pool::default();
    gemm_with(a, b.rows(), m, b, 0, out, &mut scratch, pool);
    c
}

/// Every kernel table this CPU runs: each instruction set's, and the AVX2 and AVX-512 variants
/// that [`Isa::kernels`] passes over on a CPU with VNNI or AMX.
pub(crate) fn every_table() -> Vec<&'static Kernels> {
    let tables = Isa::ALL.into_iter().filter_map(|isa| isa.kernels().ok());
    tables.chain(passed_over()).collect()
}

/// The x86-64 tables [`Isa::kernels`] passes over on this CPU.
#[cfg(target_arch = "x86_64")]
fn passed_over() -> Vec<&'static Kernels> {
    use crate::kernels::isa::{has_avx512_vnni, has_avx_vnni};
    use crate::kernels::simd::{amx, avx2, avx512};
    let mut tables: Vec<&'static Kernels> = Vec::new();
    if Isa::Avx2.is_supported() && has_avx_vnni() {
        tables.push(&avx2::KERNELS);
    }
    if Isa::Avx512.is_supported() {
        tables.push(&avx512::KERNELS);
        if has_avx512_vnni() && amx::usable() {
            tables.push(&avx512::vnni::KERNELS);
        }
    }
    tables
}

/// None elsewhere.
#[cfg(not(target_arch = "x86_64"))]
fn passed_over() -> Vec<&'static Kernels> {
    Vec::new()
}

/// One row of `gemv_stored` over the `f32` rows `b` (`ldb` apart) into `c`.
fn gemv(
    kernels: &Kernels,
    k: usize,
    a: &[f32],
    (b, ldb): (&[f32], usize),
    c: &mut [f32],
    accumulate: bool,
) {
    let n = c.len();
    // SAFETY: the tests' tables come from `Isa::kernels`; the kernel checks its operands.
    unsafe { (kernels.gemv_stored)(k, a, k, Stored::floats(b, ldb), c, n, n, 1, accumulate) }
}

/// One row of `gemv_stored` over the `nr`-column panels `panels` (`panel_len` apart) into `c`.
fn gemv_panels(
    kernels: &Kernels,
    k: usize,
    a: &[f32],
    (panels, panel_len): (Slices<'_>, usize),
    c: &mut [f32],
    accumulate: bool,
) {
    let (n, nr) = (c.len(), kernels.nr);
    let b = Stored {
        slices: panels,
        stride: nr,
        panels: Some(Panels {
            width: nr,
            len: panel_len,
        }),
    };
    // SAFETY: as for `gemv`.
    unsafe { (kernels.gemv_stored)(k, a, k, b, c, n, n, 1, accumulate) }
}

#[cfg(all(target_arch = "x86_64", feature = "std"))]
#[test]
fn cpuid_detection_agrees_with_std() {
    for isa in Isa::ALL {
        assert_eq!(
            crate::kernels::isa::cpuid::supports(isa),
            isa.is_supported(),
            "{isa:?}"
        );
    }
    assert_eq!(
        crate::kernels::isa::cpuid::has_avx512_vnni(),
        std::is_x86_feature_detected!("avx512vnni")
    );
    assert_eq!(
        crate::kernels::isa::cpuid::has_avx_vnni(),
        std::is_x86_feature_detected!("avxvnni")
    );
}

/// The AVX-512 table has the AMX tile exactly when AMX is usable, and only it has one.
#[test]
fn only_the_amx_table_has_the_bf16_tile() {
    #[cfg(target_arch = "x86_64")]
    if let Ok(kernels) = Isa::Avx512.kernels() {
        let amx = crate::kernels::isa::has_avx512_vnni() && crate::kernels::simd::amx::usable();
        assert_eq!(kernels.bf16_tile.is_some(), amx);
    }
    for isa in [Isa::Portable, Isa::Avx2, Isa::Neon] {
        if let Ok(kernels) = isa.kernels() {
            assert!(kernels.bf16_tile.is_none(), "{isa:?}");
        }
    }
}

/// A row computed by `gemv` has the bits of the same row computed by `tile`, for every
/// width (vector tails included), strided operands, with and without accumulation.
#[test]
fn gemv_matches_tile_rows_bit_for_bit() {
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
        let kernels = isa.kernels().unwrap();
        let (mr, nr) = (kernels.mr, kernels.nr);
        for k in [0, 1, 5, 64, 100] {
            for accumulate in [false, true] {
                let (lda, ldb, ldc) = (mr + 2, nr + 3, nr + 1);
                let a = values(k.max(1) * lda, 6);
                let b = values(k.max(1) * ldb + nr, 7);
                let mut c = values(mr * ldc, 8);
                let start = c.clone();
                // SAFETY: checked table; the operands have the documented lengths.
                unsafe { (kernels.tile)(k, &a, lda, &b, ldb, &mut c, ldc, accumulate) };
                for i in 0..mr {
                    let a_row: Vec<f32> = (0..k).map(|p| a[p * lda + i]).collect();
                    for width in [1, nr / 2 + 1, nr] {
                        let mut row = start[i * ldc..][..width].to_vec();
                        gemv(kernels, k, &a_row, (&b, ldb), &mut row, accumulate);
                        let got: Vec<u32> = row.iter().map(|x| x.to_bits()).collect();
                        let want: Vec<u32> =
                            c[i * ldc..][..width].iter().map(|x| x.to_bits()).collect();
                        assert_eq!(got, want, "{isa:?} k {k} row {i} width {width}");
                    }
                }
            }
        }
    }
}

/// `values`, with about one in five replaced by a NaN (both signs, several payloads), an
/// infinity or a signed zero, so that `inf · 0` makes NaNs as well.
fn values_with_specials(n: usize, seed: u32) -> Vec<f32> {
    const SPECIALS: [u32; 8] = [
        0x7fc0_0000,
        0xffc0_0000,
        0x7fc1_2345,
        0xff80_0001,
        0x7f80_0000,
        0xff80_0000,
        0x0000_0000,
        0x8000_0000,
    ];
    let mut x = seed;
    values(n, seed)
        .into_iter()
        .map(|v| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            match x >> 24 {
                r if r % 5 == 0 => f32::from_bits(SPECIALS[(r / 5) as usize % 8]),
                _ => v,
            }
        })
        .collect()
}

/// On inputs with NaNs, infinities and zeros, `tile`, `gemv` and `gemv_panels` give the
/// same bits for a row, NaN payloads included (every NaN stored is `f32::NAN`), and a chain
/// split between a tile and `gemv` is still the chain of one tile.
#[test]
fn tile_and_gemv_agree_on_nan_payloads() {
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
        let kernels = isa.kernels().unwrap();
        let (mr, nr) = (kernels.mr, kernels.nr);
        for (k, k1) in [(0, 0), (1, 0), (5, 2), (64, 13), (100, 99)] {
            for accumulate in [false, true] {
                let seed = (k * 2 + usize::from(accumulate)) as u32;
                let ldc = nr + 1;
                let a = values_with_specials(k.max(1) * mr, 40 + seed);
                let b = values_with_specials(k.max(1) * nr, 41 + seed);
                let start = values_with_specials(mr * ldc, 42 + seed);
                let mut whole = start.clone();
                let mut split = start.clone();
                // SAFETY: checked table; the panels hold k·mr and k·nr values, the tile
                // (mr-1)·ldc + nr.
                unsafe {
                    (kernels.tile)(k, &a, mr, &b, nr, &mut whole, ldc, accumulate);
                    (kernels.tile)(k1, &a, mr, &b, nr, &mut split, ldc, accumulate);
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                let canonical = f32::NAN.to_bits();
                for i in 0..mr {
                    let context = format!("{isa:?} k {k} accumulate {accumulate} row {i}");
                    let want = bits(&whole[i * ldc..][..nr]);
                    assert!(
                        want.iter()
                            .all(|&x| !f32::from_bits(x).is_nan() || x == canonical),
                        "{context}: tile stored a NaN other than f32::NAN"
                    );
                    let a_row: Vec<f32> = (0..k).map(|p| a[p * mr + i]).collect();
                    for width in [1, nr / 2 + 1, nr] {
                        let mut row = start[i * ldc..][..width].to_vec();
                        let mut panel_row = row.clone();
                        gemv(kernels, k, &a_row, (&b, nr), &mut row, accumulate);
                        let panels = (Slices::F32(&b), k * nr);
                        gemv_panels(kernels, k, &a_row, panels, &mut panel_row, accumulate);
                        assert_eq!(bits(&row), want[..width], "{context} width {width}");
                        assert_eq!(bits(&panel_row), want[..width], "{context} panels");
                    }
                    let rest = &mut split[i * ldc..][..nr];
                    let b_rest = (&b[k1 * nr..], nr);
                    gemv(
                        kernels,
                        k - k1,
                        &a_row[k1..],
                        b_rest,
                        rest,
                        accumulate || k1 > 0,
                    );
                    assert_eq!(bits(rest), want, "{context}: tile to step {k1}, then gemv");
                }
            }
        }
    }
}

/// `gemv` on every width up to past two 64-column chunks, against the scalar chain it
/// promises: fused on the FMA instruction sets, separately rounded on the portable one.
#[cfg(feature = "std")]
#[test]
fn gemv_matches_the_scalar_chain_on_every_width() {
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
        let kernels = isa.kernels().unwrap();
        for k in [0, 1, 3, 17] {
            for width in 0..150 {
                for accumulate in [false, true] {
                    let ldb = width + 7;
                    let a = values(k, 20);
                    let b = values(k.max(1) * ldb, 21);
                    let start = values(width, 22);
                    let mut got = start.clone();
                    gemv(kernels, k, &a, (&b, ldb), &mut got, accumulate);
                    for j in 0..width {
                        let mut want = if accumulate { start[j] } else { 0.0 };
                        for p in 0..k {
                            want = match isa {
                                Isa::Portable => want + a[p] * b[p * ldb + j],
                                _ => a[p].mul_add(b[p * ldb + j], want),
                            };
                        }
                        let context = format!("{isa:?} k {k} width {width} column {j}");
                        assert_eq!(got[j].to_bits(), want.to_bits(), "{context}");
                    }
                }
            }
        }
    }
}

/// `gemv_panels` has the bits of one `gemv` per panel, for every width up to past two
/// 12-vector passes, with and without accumulation.
#[test]
fn gemv_panels_matches_gemv_per_panel() {
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
        let kernels = isa.kernels().unwrap();
        let nr = kernels.nr;
        for k in [0, 1, 5, 40] {
            // Panels k·nr + 3 apart: the gap must not be read as columns.
            let panel_len = k * nr + 3;
            for n in (0..=26 * nr + 1).filter(|n| n % nr < 3 || n % nr > nr - 3) {
                for accumulate in [false, true] {
                    let a = values(k, 30);
                    let panels = values(n.div_ceil(nr).max(1) * panel_len, 31);
                    let start = values(n, 32);
                    let mut got = start.clone();
                    let stored = (Slices::F32(&panels), panel_len);
                    gemv_panels(kernels, k, &a, stored, &mut got, accumulate);
                    check_16_bit_panels(kernels, (k, &a), (&panels, panel_len), &start, accumulate);
                    let mut want = start;
                    for (q, c) in want.chunks_mut(nr).enumerate() {
                        gemv(
                            kernels,
                            k,
                            &a,
                            (&panels[q * panel_len..], nr),
                            c,
                            accumulate,
                        );
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{isa:?} k {k} n {n} {accumulate}");
                }
            }
        }
    }
}

/// `gemv_panels` over the panels rounded to bfloat16 and to binary16 has the bits of
/// `gemv_panels` over the rounded values widened to `f32` first.
fn check_16_bit_panels(
    kernels: &Kernels,
    (k, a): (usize, &[f32]),
    (panels, panel_len): (&[f32], usize),
    start: &[f32],
    accumulate: bool,
) {
    use crate::kernels::format::element::{bf16_from_f32, bf16_to_f32, f16_from_f32, f16_to_f32};
    let bf16: Vec<u16> = panels.iter().map(|&x| bf16_from_f32(x)).collect();
    let f16: Vec<u16> = panels.iter().map(|&x| f16_from_f32(x)).collect();
    let cases = [
        (
            "bf16",
            Slices::Bf16(&bf16),
            bf16.iter().map(|&b| bf16_to_f32(b)).collect::<Vec<_>>(),
        ),
        (
            "f16",
            Slices::F16(&f16),
            f16.iter().map(|&b| f16_to_f32(b)).collect(),
        ),
    ];
    for (format, stored, widened) in cases {
        let (mut got, mut want) = (start.to_vec(), start.to_vec());
        gemv_panels(kernels, k, a, (stored, panel_len), &mut got, accumulate);
        let widened = (Slices::F32(&widened), panel_len);
        gemv_panels(kernels, k, a, widened, &mut want, accumulate);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let n = start.len();
        assert_eq!(
            bits(&got),
            bits(&want),
            "{:?} {format} k {k} n {n}",
            kernels.isa
        );
    }
}

/// `softmax_row` has the bits `softmax_block` gives a single query, NaN and -inf included.
#[test]
fn softmax_row_matches_block_bit_for_bit() {
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
        let kernels = isa.kernels().unwrap();
        for keys in [0, 1, 5, 16, 17, 96] {
            for (case, old_max) in [f32::NEG_INFINITY, 0.3, 5.0, f32::NAN]
                .into_iter()
                .enumerate()
            {
                let mut scores: Vec<f32> = values(keys, 9 + case as u32)
                    .iter()
                    .map(|v| v * 4.0)
                    .collect();
                if case == 1 && keys > 2 {
                    scores[1] = f32::NEG_INFINITY;
                }
                if case == 2 && keys > 3 {
                    scores[2] = f32::NAN;
                }
                let (mut block, mut row) = (scores.clone(), scores);
                let (mut max_b, mut sum_b, mut rescale) = ([old_max], [1.5f32], [0.0f32]);
                let (mut max_r, mut sum_r) = (old_max, 1.5f32);
                // SAFETY: checked table; one query, `keys` keys at stride 1.
                let factor = unsafe {
                    (kernels.softmax_block)(
                        &mut block,
                        1,
                        keys,
                        &mut max_b,
                        &mut sum_b,
                        &mut rescale,
                    );
                    (kernels.softmax_row)(&mut row, &mut max_r, &mut sum_r)
                };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                let context = format!("{isa:?} keys {keys} case {case}");
                assert_eq!(bits(&row), bits(&block), "{context}: probabilities");
                assert_eq!(
                    bits(&[max_r, sum_r, factor]),
                    bits(&[max_b[0], sum_b[0], rescale[0]]),
                    "{context}"
                );
            }
        }
    }
}

/// The contract flash attention relies on near the causal diagonal: a tile over the first
/// `k1` steps, then `gemv` per row over the remaining steps (accumulating), gives the bits
/// of one tile over all `k` steps.
#[test]
fn tile_then_gemv_continues_the_chain_bit_for_bit() {
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
        let kernels = isa.kernels().unwrap();
        let (mr, nr) = (kernels.mr, kernels.nr);
        for (k1, k) in [(0, 1), (1, 5), (3, 11), (64, 64), (40, 96)] {
            let ldc = nr + 3;
            let a = values(k * mr, 1);
            let b = values(k * nr, 2);
            let mut whole = values((mr - 1) * ldc + nr, 3);
            let mut split = whole.clone();
            // SAFETY: the table came from `Isa::kernels`; the slices have the documented
            // lengths (a k1-step tile reads a prefix of the same operands).
            unsafe {
                (kernels.tile)(k, &a, mr, &b, nr, &mut whole, ldc, true);
                (kernels.tile)(k1, &a, mr, &b, nr, &mut split, ldc, true);
            }
            for i in 0..mr {
                let a_rest: Vec<f32> = (k1..k).map(|p| a[p * mr + i]).collect();
                let row = &mut split[i * ldc..][..nr];
                gemv(kernels, k - k1, &a_rest, (&b[k1 * nr..], nr), row, true);
            }
            for i in 0..mr {
                let bits = |c: &[f32]| -> Vec<u32> {
                    c[i * ldc..][..nr].iter().map(|x| x.to_bits()).collect()
                };
                assert_eq!(bits(&split), bits(&whole), "{isa:?} k1 {k1} k {k} row {i}");
            }
        }
    }
}

/// `gemv_stored` over 1 to 4 rows at once has, row by row, the bits of one row at a time
/// over the matrix widened to `f32` first, in every format (`q8_0` with its scales along the
/// rows and down the columns), for widths past a whole pass.
#[test]
fn gemv_stored_rows_match_one_row_over_the_widened_matrix() {
    use crate::kernels::format::element::{bf16_from_f32, f16_from_f32, Q8_BLOCK};
    use crate::kernels::format::Q8Scales;
    let (k, ld, lda, ldc) = (40, 200, 43, 201);
    let b = values(k * ld, 50);
    let bf16: Vec<u16> = b.iter().map(|&x| bf16_from_f32(x)).collect();
    let f16: Vec<u16> = b.iter().map(|&x| f16_from_f32(x)).collect();
    // Any integers and scales: both sides read the same ones.
    let scales: Vec<f32> = values(k * ld, 53);
    let q8: Vec<i8> = (0..k * ld).map(|i| (i % 255) as i8).collect();
    let formats = [
        Slices::F32(&b),
        Slices::Bf16(&bf16),
        Slices::F16(&f16),
        Slices::Q8_0 {
            values: &q8,
            scales: Q8Scales::Rows {
                scales: &scales,
                stride: ld / Q8_BLOCK + 1,
            },
        },
        Slices::Q8_0 {
            values: &q8,
            scales: Q8Scales::Columns {
                scales: &scales,
                stride: ld,
            },
        },
    ];
    let a = values(4 * lda, 51);
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
        let kernels = isa.kernels().unwrap();
        for slices in formats {
            let stored = Stored::rows(slices, ld);
            let mut widened = vec![0.0f32; k * ld];
            // SAFETY: a checked table; `stored` holds k rows of ld elements, as does `widened`.
            unsafe { (kernels.widen)(stored, k, ld, &mut widened, ld) };
            for (rows, n, accumulate) in [
                (1, 200, false),
                (2, 97, true),
                (3, 64, true),
                (4, 33, false),
            ] {
                let mut got = values(rows * ldc, 52);
                let mut want = got.clone();
                // SAFETY: as above; `a` holds rows rows of k values, `got` rows rows of n.
                unsafe {
                    (kernels.gemv_stored)(k, &a, lda, stored, &mut got, ldc, n, rows, accumulate)
                };
                for r in 0..rows {
                    let c = &mut want[r * ldc..][..n];
                    gemv(
                        kernels,
                        k,
                        &a[r * lda..][..k],
                        (&widened, ld),
                        c,
                        accumulate,
                    );
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{isa:?} {slices:?} rows {rows} n {n}"
                );
            }
        }
    }
}
