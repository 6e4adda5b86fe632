//! Products of bfloat16 operands ([`Compute::Bf16`](crate::Compute::Bf16)): the rows of `A`
//! and the weights rounded to bfloat16 (nearest, ties to even; NaN stays NaN), each product
//! exact in `f32`.
//!
//! Without AMX the sum is the `f32` tile's own chain over the rounded values (the rows rounded
//! by [`round_rows`], the weights stored in bfloat16), so every table gives the same bits as
//! the `f32` layer on those operands. With AMX the `B` of a layer is in [`AmxPanels`] and the
//! rows in [`AmxRows`], for the tile of `simd/amx.rs`.
//!
//! Layouts (`amx::TILE` = 32 columns a panel, `steps = ⌈k / 32⌉`, the reduction zero-padded
//! to whole steps):
//! - [`AmxPanels`]: panel `p` at `p · steps · B_STEP`, step by step; a step is two tiles
//!   (columns 0..16, then 16..32 of the panel), each 16 rows of 16 column pairs: value `2r + e`
//!   of the step for column `j` of the tile at `r · 32 + 2j + e`. Columns past `n` are zero.
//! - [`AmxRows`]: row `i` at `i · steps · 32`, [`padded_rows`] rows (the padding zero).

use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::format::element::{bf16_from_f32, bf16_to_f32};
use crate::kernels::format::weights::WeightSlice;

/// Columns of a panel and rows of a tile.
pub(crate) const TILE: usize = 32;
/// Values of the reduction per step.
pub(crate) const STEP: usize = 32;
/// Values of `B` per step of a panel: two tiles of 16 rows of 32.
pub(crate) const B_STEP: usize = 2 * 16 * STEP;

/// The rows the AMX tile reads for `rows` rows: whole tiles of 32, except that a last tile
/// of at most 16 rows is read as those rows only.
pub(crate) fn padded_rows(rows: usize) -> usize {
    match rows % TILE {
        1..=16 => rows,
        _ => rows.next_multiple_of(TILE),
    }
}

/// `B (k × n)` rounded to bfloat16 in AMX's layout (see the module).
#[derive(Clone, Debug)]
pub(crate) struct AmxPanels {
    steps: usize,
    values: Vec<u16>,
}

impl AmxPanels {
    /// The columns of `parts` (each `(values, width)`: row-major `k × width`), side by side.
    ///
    /// # Errors
    /// [`ShapeError::AllocationFailed`] when the panels cannot be allocated.
    pub(crate) fn from_columns(
        k: usize,
        parts: &[(WeightSlice<'_>, usize)],
    ) -> Result<Self, ShapeError> {
        let n: usize = parts.iter().map(|&(_, width)| width).sum();
        let steps = k.div_ceil(STEP);
        let len = n.div_ceil(TILE) * steps * B_STEP;
        let mut values = zeros(len, "matrix B in AMX panels")?;
        let mut j = 0;
        for &(part, width) in parts {
            for col in 0..width {
                let panel = &mut values[j / TILE * steps * B_STEP..];
                let (group, c) = (j % TILE / 16, j % 16);
                for p in 0..k {
                    let (step, t) = (p / STEP, p % STEP);
                    let at = step * B_STEP + group * (B_STEP / 2) + t / 2 * 32 + 2 * c + t % 2;
                    panel[at] = bf16_from_f32(part.get(p * width + col));
                }
                j += 1;
            }
        }
        Ok(AmxPanels { steps, values })
    }

    /// Steps of 32 values of the reduction.
    pub(crate) fn steps(&self) -> usize {
        self.steps
    }

    /// Panel `p` (columns `32p ..`), every step.
    pub(crate) fn panel(&self, p: usize) -> &[u16] {
        &self.values[p * self.steps * B_STEP..][..self.steps * B_STEP]
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.values.len() * 2
    }
}

/// Rows of `A` rounded to bfloat16 in AMX's layout (see the module), reused between calls.
#[derive(Clone, Debug, Default)]
pub(crate) struct AmxRows {
    lda: usize,
    values: Vec<u16>,
}

impl AmxRows {
    /// Holds `rows` rows of `a` (row stride `lda_in`, `k` values each) rounded (on the AMX
    /// table only: the rounding runs in AVX-512).
    pub(crate) fn round(&mut self, (a, lda_in): (&[f32], usize), rows: usize, k: usize) {
        self.lda = k.div_ceil(STEP) * STEP;
        let len = padded_rows(rows) * self.lda;
        self.values.resize(len, 0);
        let (filled, padding) = self.values[..len].split_at_mut(rows * self.lda);
        for (i, row) in filled.chunks_exact_mut(self.lda).enumerate() {
            let (values, tail) = row.split_at_mut(k);
            // SAFETY: the rows are rounded for AMX's tile only, on an AVX-512 table.
            unsafe { round_run(values, &a[i * lda_in..][..k]) };
            tail.fill(0);
        }
        padding.fill(0);
    }

    /// The row stride.
    pub(crate) fn lda(&self) -> usize {
        self.lda
    }

    /// The rows ([`padded_rows`] of them, row stride [`lda`](Self::lda)).
    pub(crate) fn rows(&self) -> &[u16] {
        &self.values
    }
}

/// `rows` rows of `a` (row stride `lda`, `k` values each) rounded to bfloat16 and widened back,
/// into `dst` (`rows · k` values, row stride `k`).
pub(crate) fn round_rows(dst: &mut Vec<f32>, (a, lda): (&[f32], usize), rows: usize, k: usize) {
    dst.clear();
    for i in 0..rows {
        let row = &a[i * lda..][..k];
        dst.extend(row.iter().map(|&x| bf16_to_f32(bf16_from_f32(x))));
    }
}

/// `B (k × n)`, row `p` at `src[p · ld ..]`, rounded to bfloat16 into `panels` panels of
/// `steps` steps in AMX's layout (see the module): `out` holds `panels · steps · B_STEP`
/// values, zero past `k` and past `n`. Compiled for AVX-512 on x86-64 (it lays out the
/// operands of AMX's tile, which change with every key block of the attention).
///
/// # Safety
/// On x86-64, the CPU has AVX-512 F and AVX2 (every CPU whose table has AMX's tile).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx2"))]
pub(crate) unsafe fn pair_panels(
    (src, ld): (&[f32], usize),
    (k, n): (usize, usize),
    (steps, panels): (usize, usize),
    out: &mut [u16],
) {
    debug_assert!(k <= steps * STEP && n <= panels * TILE);
    let out = &mut out[..panels * steps * B_STEP];
    out.fill(0);
    for p in (0..k).step_by(2) {
        let (step, t) = (p / STEP, p % STEP);
        let even = &src[p * ld..][..n];
        let odd = if p + 1 < k {
            &src[(p + 1) * ld..][..n]
        } else {
            &[]
        };
        for j0 in (0..n).step_by(16) {
            let at = j0 / TILE * steps * B_STEP + step * B_STEP + j0 % TILE / 16 * (B_STEP / 2);
            let pairs: &mut [u16; 32] = (&mut out[at + t / 2 * 32..][..32]).try_into().unwrap();
            match (even.get(j0..j0 + 16), odd.get(j0..j0 + 16)) {
                (Some(e), Some(o)) => {
                    interleave(pairs, e.try_into().unwrap(), o.try_into().unwrap())
                }
                _ => interleave(pairs, &column_run(even, j0), &column_run(odd, j0)),
            }
        }
    }
}

/// `dst[i] = bf16(src[i])`; whether any of them is not finite. Compiled for AVX-512 on
/// x86-64, as [`pair_panels`].
///
/// # Safety
/// As [`pair_panels`].
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx2"))]
pub(crate) unsafe fn round_run(dst: &mut [u16], src: &[f32]) -> bool {
    let mut any_non_finite = false;
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = bf16_nearest(x);
        any_non_finite |= *d & 0x7f80 == 0x7f80;
    }
    any_non_finite
}

/// Up to 16 values of `row` from `j0` on, zeros past its end.
#[inline(always)]
fn column_run(row: &[f32], j0: usize) -> [f32; 16] {
    let mut run = [0.0; 16];
    if let Some(values) = row.get(j0..) {
        let len = values.len().min(16);
        run[..len].copy_from_slice(&values[..len]);
    }
    run
}

/// `pairs[2c] = even[c]`, `pairs[2c + 1] = odd[c]`, rounded.
#[inline(always)]
fn interleave(pairs: &mut [u16; 32], even: &[f32; 16], odd: &[f32; 16]) {
    for c in 0..16 {
        pairs[2 * c] = bf16_nearest(even[c]);
        pairs[2 * c + 1] = bf16_nearest(odd[c]);
    }
}

/// [`bf16_from_f32`] without branches (so that a loop of it vectorises): the same bits.
#[inline(always)]
pub(crate) fn bf16_nearest(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
    let quiet = ((bits >> 16) as u16) | 0x0040;
    if x.is_nan() {
        quiet
    } else {
        rounded
    }
}

/// `len` zeros, or an allocation error naming `what`.
fn zeros(len: usize, what: &'static str) -> Result<Vec<u16>, ShapeError> {
    let mut values = Vec::new();
    values
        .try_reserve_exact(len)
        .map_err(|_| ShapeError::AllocationFailed {
            what,
            bytes: len.saturating_mul(2),
        })?;
    values.resize(len, 0);
    Ok(values)
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::kernels::format::weights::MatrixRef;
    use crate::kernels::format::{Compute, WeightFormat};
    use crate::kernels::gemm::packed::Part;
    use crate::kernels::tests::{every_table, gemm_product, values};
    use crate::kernels::{Kernels, PackedB};

    /// `b` (`k × n`, row-major) packed for `kernels` with `compute`.
    fn packed(
        kernels: &'static Kernels,
        b: &[f32],
        k: usize,
        n: usize,
        compute: Compute,
    ) -> PackedB {
        let parts = [Part {
            values: MatrixRef::Values(WeightSlice::F32(b)),
            width: n,
        }];
        PackedB::pack(kernels, k, &parts, WeightFormat::F32, compute).unwrap()
    }

    /// `x` rounded to bfloat16.
    fn rounded(x: &[f32]) -> Vec<f32> {
        x.iter().map(|&v| bf16_to_f32(bf16_from_f32(v))).collect()
    }

    /// Rows: one short tile (at most 16 rows), a padded full tile (27), full tiles and a short
    /// last one (33, 40, 70); reductions of one and of several passes (k 300).
    const SHAPES: [(usize, usize, usize); 8] = [
        (40, 300, 33),
        (1, 1, 1),
        (27, 40, 50),
        (3, 31, 17),
        (33, 33, 33),
        (70, 100, 65),
        (5, 64, 96),
        (40, 7, 3),
    ];

    /// Operands of mixed magnitudes (no subnormals: AMX reads those as zero).
    fn operands(m: usize, k: usize, n: usize, seed: u32) -> (Vec<f32>, Vec<f32>) {
        let scale = |v: Vec<f32>| -> Vec<f32> {
            v.iter()
                .enumerate()
                .map(|(i, x)| x * [1.0, 30.0, 0.01][i % 3])
                .collect()
        };
        (scale(values(m * k, seed)), scale(values(k * n, seed + 1)))
    }

    #[test]
    fn the_branchless_rounding_is_the_rounding() {
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            f32::INFINITY,
        ];
        let bits = (0..1u32 << 20).map(|i| f32::from_bits(i.wrapping_mul(4099)));
        for x in specials
            .into_iter()
            .chain(bits)
            .chain([f32::NAN, -f32::NAN])
        {
            assert_eq!(bf16_nearest(x), bf16_from_f32(x), "{:#x}", x.to_bits());
        }
    }

    #[test]
    fn tables_without_amx_give_the_f32_bits_of_the_rounded_operands() {
        for (m, k, n) in SHAPES {
            let (a, b) = operands(m, k, n, 3);
            for kernels in every_table().into_iter().filter(|t| t.bf16_tile.is_none()) {
                let want = gemm_product(
                    &packed(kernels, &rounded(&b), k, n, Compute::F32),
                    &rounded(&a),
                    m,
                    1,
                );
                let bf16 = packed(kernels, &b, k, n, Compute::Bf16);
                assert_eq!(
                    (bf16.compute(), bf16.format()),
                    (Compute::Bf16, WeightFormat::Bf16)
                );
                for threads in [1, 3] {
                    let got = gemm_product(&bf16, &a, m, threads);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(g, w)| g.to_bits() == w.to_bits());
                    assert!(same, "{:?} {m}x{k}x{n} threads {threads}", kernels.isa);
                }
            }
        }
    }

    #[test]
    fn every_table_is_near_the_f64_product_of_the_rounded_operands() {
        for (m, k, n) in SHAPES {
            let (a, b) = operands(m, k, n, 5);
            let (ra, rb) = (rounded(&a), rounded(&b));
            for kernels in every_table() {
                let got = gemm_product(&packed(kernels, &b, k, n, Compute::Bf16), &a, m, 2);
                for i in 0..m {
                    for j in 0..n {
                        let (mut want, mut magnitude) = (0.0f64, 0.0f64);
                        for p in 0..k {
                            let term = f64::from(ra[i * k + p]) * f64::from(rb[p * n + j]);
                            want += term;
                            magnitude += term.abs();
                        }
                        // k roundings of a sum, each at most 2^-24 of the partial sums.
                        let bound = (k + 1) as f64 * 2f64.powi(-24) * magnitude;
                        let err = (f64::from(got[i * n + j]) - want).abs();
                        assert!(
                            err <= bound,
                            "{:?} {m}x{k}x{n} ({i}, {j}): {err} > {bound}",
                            kernels.isa
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_has_the_same_bits_alone_and_for_any_thread_count() {
        // k of 10 steps: two passes of AMX tiles, a tile of C kept in memory between them.
        let (m, k, n) = (45, 300, 40);
        let (mut a, b) = operands(m, k, n, 9);
        a[7 * k + 3] = f32::NAN;
        a[9 * k + 1] = f32::INFINITY;
        for kernels in every_table() {
            let bf16 = packed(kernels, &b, k, n, Compute::Bf16);
            let all = gemm_product(&bf16, &a, m, 1);
            assert_eq!(
                gemm_product(&bf16, &a, m, 3)
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>(),
                all.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{:?}",
                kernels.isa
            );
            for i in [0, 7, 8, 44] {
                let alone = gemm_product(&bf16, &a[i * k..][..k], 1, 2);
                let same = alone
                    .iter()
                    .zip(&all[i * n..])
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{:?} row {i}", kernels.isa);
            }
            assert!(all[7 * n..][..n]
                .iter()
                .all(|x| x.to_bits() == f32::NAN.to_bits()));
            let finite = |r: usize| all[r * n..][..n].iter().all(|x| x.is_finite());
            assert!(finite(6) && finite(8), "{:?}", kernels.isa);
        }
    }
}
