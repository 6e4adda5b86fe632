//! Products of 8-bit integers ([`Compute::Int8`](crate::Compute::Int8)): a matrix `B` in
//! ggml's `q8_0` or `q4_0` blocks times rows of `A` quantized to `q8_0`, as ggml's
//! `ggml_vec_dot_q8_0_q8_0` / `ggml_vec_dot_q4_0_q8_0` define it (their reference C loop):
//! per block of 32 steps, the exact integer dot product `s` of the two blocks' integers, then
//! `acc += (d_b · d_a) · s` in `f32`, blocks in order, each operation rounded on its own.
//!
//! Layouts (`nr` columns of `B` a panel, `LANES` of them a group, `mr` = `Kernels::int8_mr`
//! rows of `A` a panel; `blocks = k / 32`):
//! - [`Int8Panels`]: panel `p`'s bytes at `p · blocks · 32 · nr`, block by block, each block
//!   its groups in order, each group `32 · LANES` signed bytes with step `t` of column `c` at
//!   `(t / 4) · 4 · LANES + 4c + t % 4` (four steps of a column in one 32-bit lane, as
//!   `vpdpbusd` reads them); its scales at `p · blocks · 2 · nr`, per block the `nr` scales
//!   `d_b` then the `nr` corrections `128 · Σ_t b(t, j)` (exact in `f32`); columns past `n`
//!   are zero.
//! - [`QuantizedRows`]: panel `r`'s bytes at `r · blocks · 32 · mr`, per block `mr` rows of 32
//!   unsigned bytes `q + 128`, and its scales `d_a` at `r · blocks · mr`; rows past the last
//!   are zero (`q = 0`, `d_a = 0`).
//!
//! The kernel sums `(q_a + 128) · q_b` (unsigned times signed, `vpdpbusd`'s operands), then
//! subtracts the correction: the integer `Σ q_a · q_b` exactly.

use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::format::blocks::Quant;
use crate::kernels::format::element::{f16_from_f32, f16_to_f32};
use crate::kernels::gemm::micro::lane_values;
use crate::kernels::operands::fits;
use crate::kernels::simd::Simd;
use crate::kernels::Kernels;

/// Steps per block (of `q8_0` and `q4_0`).
pub(crate) const BLOCK: usize = 32;

/// `1.5 · 2^23`: an integer `r` with `|r| < 2^22` added to it is exact, `r` in the low bits.
const ROUNDER: f32 = 12_582_912.0;

/// One panel of `mr` quantized rows of `A` (see the module's layout): what
/// [`Kernels::int8_tile`](crate::kernels::Kernels::int8_tile) reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowsPanel<'a> {
    /// Blocks of 32 steps.
    pub blocks: usize,
    /// `blocks · mr · 32` bytes, `q + 128`.
    pub bytes: &'a [u8],
    /// `blocks · mr` scales.
    pub scales: &'a [f32],
}

/// One panel of `nr` columns of `B` in 8-bit integers (see the module's layout).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ColumnsPanel<'a> {
    /// `blocks · 32 · nr` bytes.
    pub bytes: &'a [i8],
    /// `blocks · 2 · nr` values: per block the scales, then the corrections.
    pub scales: &'a [f32],
}

/// See [`Kernels::int8_tile`](crate::kernels::Kernels::int8_tile), for an `MR × NV`-vector tile.
///
/// # Panics
/// When an operand is shorter than the contract.
#[inline(always)]
pub(crate) fn tile<S: Simd, const MR: usize, const NV: usize>(
    s: S,
    a: RowsPanel<'_>,
    b: ColumnsPanel<'_>,
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    let (lanes, blocks) = (S::LANES, a.blocks);
    let nr = NV * lanes;
    let ok = fits(a.bytes.len(), blocks, MR * BLOCK, 0)
        && fits(a.scales.len(), blocks, MR, 0)
        && fits(b.bytes.len(), blocks, nr * BLOCK, 0)
        && fits(b.scales.len(), blocks, 2 * nr, 0)
        && ldc >= nr
        && fits(c.len(), MR - 1, ldc, nr);
    assert!(ok, "int8 tile operands shorter than the contract");
    let c_at = |i: usize, v: usize| i * ldc + v * lanes;
    let mut acc = [[s.zero(); NV]; MR];
    if accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            for (v, sum) in row.iter_mut().enumerate() {
                // SAFETY: `c` holds (MR-1)·ldc + nr values (checked above).
                *sum = unsafe { s.load(c.as_ptr().add(c_at(i, v))) };
            }
        }
    }
    for block in 0..blocks {
        // SAFETY: block < blocks of MR rows of 32 bytes and of NV groups of 32·LANES bytes
        // (checked above).
        let sums = unsafe {
            s.int8_block::<MR, NV>(
                a.bytes.as_ptr().add(block * MR * BLOCK),
                b.bytes.as_ptr().add(block * nr * BLOCK),
            )
        };
        let scales = &b.scales[block * 2 * nr..][..2 * nr];
        let (mut d_b, mut correction) = ([s.zero(); NV], [s.zero(); NV]);
        for v in 0..NV {
            // SAFETY: `scales` holds 2·nr values.
            d_b[v] = unsafe { s.load(scales.as_ptr().add(v * lanes)) };
            // SAFETY: as above.
            correction[v] = unsafe { s.load(scales.as_ptr().add(nr + v * lanes)) };
        }
        for (i, row) in acc.iter_mut().enumerate() {
            let d_a = s.splat(a.scales[block * MR + i]);
            for (v, sum) in row.iter_mut().enumerate() {
                let dot = s.sub(sums[i][v], correction[v]);
                *sum = s.add(*sum, s.mul(s.mul(d_b[v], d_a), dot));
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (v, &sum) in row.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { s.store(c.as_mut_ptr().add(c_at(i, v)), s.canonical_nan(sum)) };
        }
    }
}

/// A `(k, n)` matrix `B` packed for the int8 tile of one kernel table (see the module's
/// layout).
#[derive(Clone)]
pub(crate) struct Int8Panels {
    blocks: usize,
    nr: usize,
    bytes: Vec<i8>,
    scales: Vec<f32>,
}

impl Int8Panels {
    /// The panels of the `n` columns whose blocks are `plain` (column `j`'s `k / 32` blocks
    /// of `quant`, `q8_0` or `q4_0`, at `j · k / 32 · quant.bytes()`: a GGUF tensor's rows).
    ///
    /// # Errors
    /// [`ShapeError::AllocationFailed`] when the panels cannot be allocated.
    ///
    /// # Panics
    /// When `quant` is not `q8_0` or `q4_0` or `plain` holds fewer blocks.
    pub(crate) fn from_blocks(
        kernels: &Kernels,
        quant: Quant,
        k: usize,
        n: usize,
        plain: &[u8],
    ) -> Result<Self, ShapeError> {
        assert!(matches!(quant, Quant::Q8_0 | Quant::Q4_0));
        let (nr, lanes, blocks) = (kernels.nr, kernels.lanes, k / BLOCK);
        let panels = n.div_ceil(nr);
        let bytes_len = panels * blocks * BLOCK * nr;
        let too_large = |what, bytes| ShapeError::AllocationFailed { what, bytes };
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(bytes_len)
            .map_err(|_| too_large("int8 panels of matrix B", bytes_len))?;
        bytes.resize(bytes_len, 0i8);
        let mut scales = Vec::new();
        let scales_len = panels * blocks * 2 * nr;
        scales
            .try_reserve_exact(scales_len)
            .map_err(|_| too_large("scales of int8 panels", scales_len * 4))?;
        scales.resize(scales_len, 0.0f32);
        let row_bytes = blocks * quant.bytes();
        for j in 0..n {
            let (panel, column) = (j / nr, j % nr);
            let (group, lane) = (column / lanes, column % lanes);
            for block in 0..blocks {
                let src = &plain[j * row_bytes + block * quant.bytes()..][..quant.bytes()];
                let (d, values) = block_integers(quant, src);
                let at = (panel * blocks + block) * BLOCK * nr + group * BLOCK * lanes;
                for (t, &q) in values.iter().enumerate() {
                    bytes[at + t / 4 * 4 * lanes + 4 * lane + t % 4] = q;
                }
                let sum: i32 = values.iter().map(|&q| i32::from(q)).sum();
                let scale_at = (panel * blocks + block) * 2 * nr;
                scales[scale_at + column] = d;
                scales[scale_at + nr + column] = (128 * sum) as f32;
            }
        }
        Ok(Int8Panels {
            blocks,
            nr,
            bytes,
            scales,
        })
    }

    /// Panel `p` (columns `p · nr ..`).
    pub(crate) fn panel(&self, p: usize) -> ColumnsPanel<'_> {
        let nr = self.nr;
        ColumnsPanel {
            bytes: &self.bytes[p * self.blocks * BLOCK * nr..][..self.blocks * BLOCK * nr],
            scales: &self.scales[p * self.blocks * 2 * nr..][..self.blocks * 2 * nr],
        }
    }

    /// The bytes it holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.len() + self.scales.len() * size_of::<f32>()
    }
}

/// A block's scale and its 32 integers: `q8_0`'s as stored, `q4_0`'s nibbles minus 8 (value
/// `t < 16` the low nibble of byte `t`, `t + 16` its high nibble).
fn block_integers(quant: Quant, block: &[u8]) -> (f32, [i8; BLOCK]) {
    let d = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
    let mut values = [0i8; BLOCK];
    match quant {
        Quant::Q4_0 => {
            for (t, &byte) in block[2..2 + BLOCK / 2].iter().enumerate() {
                values[t] = (byte & 0x0f) as i8 - 8;
                values[t + BLOCK / 2] = (byte >> 4) as i8 - 8;
            }
        }
        _ => {
            for (v, &byte) in values.iter_mut().zip(&block[2..2 + BLOCK]) {
                *v = byte as i8;
            }
        }
    }
    (d, values)
}

/// See [`Kernels::int8_quantize`](crate::kernels::Kernels::int8_quantize): block `b` of `x`
/// quantized by [`quantize_block`] into `bytes[b · stride · 32 ..][..32]`, its scale into
/// `scales[b · stride]`.
///
/// # Panics
/// When `x` is not whole blocks or `bytes` or `scales` is shorter than that.
#[inline(always)]
pub(crate) fn quantize_row<S: Simd>(
    s: S,
    x: &[f32],
    bytes: &mut [u8],
    scales: &mut [f32],
    stride: usize,
) {
    let blocks = x.len() / BLOCK;
    let ok = x.len().is_multiple_of(BLOCK)
        && (blocks == 0
            || (fits(bytes.len(), blocks - 1, stride * BLOCK, BLOCK)
                && fits(scales.len(), blocks - 1, stride, 1)));
    assert!(ok, "int8 quantize operands shorter than the contract");
    // Two passes, so that one block's chain (its maximum, two divisions, its integers) does
    // not wait for the previous block's: first every block's largest magnitude, then each
    // block's integers and scale.
    for (block, values) in x.chunks_exact(BLOCK).enumerate() {
        scales[block * stride] = largest_magnitude(s, values);
    }
    for (block, values) in x.chunks_exact(BLOCK).enumerate() {
        let q = &mut bytes[block * stride * BLOCK..][..BLOCK];
        scales[block * stride] = quantize_block(s, values, scales[block * stride], q);
    }
}

/// The largest `|x|` of one block of 32 values by ggml's `MAX` (`a > b ? a : b`, whose
/// result does not depend on the order for numbers), or NaN when a value is NaN.
#[inline(always)]
fn largest_magnitude<S: Simd>(s: S, x: &[f32]) -> f32 {
    let lanes = S::LANES;
    let (mut largest, mut nan) = (s.zero(), s.zero());
    for v in 0..BLOCK / lanes {
        // SAFETY: `x` holds 32 values, and LANES divides 32.
        let values = unsafe { s.load(x.as_ptr().add(v * lanes)) };
        let magnitude = s.abs(values);
        largest = s.select(s.lt(largest, magnitude), magnitude, largest);
        nan = s.select(s.is_nan(values), s.splat(1.0), nan);
    }
    let (mut largest, nan) = (lane_values(s, largest), lane_values(s, nan));
    // A tree over the lanes, then the NaN flags without a branch per lane.
    let mut width = lanes / 2;
    while width > 0 {
        for i in 0..width {
            if largest[i + width] > largest[i] {
                largest[i] = largest[i + width];
            }
        }
        width /= 2;
    }
    let any_nan = nan[..lanes]
        .iter()
        .fold(false, |any, &flag| any | (flag != 0.0));
    if any_nan {
        f32::NAN
    } else {
        largest[0]
    }
}

/// ggml's reference `quantize_row_q8_0` of one block of 32 values whose largest magnitude
/// is `amax` (the bytes of `Quant::quantize`, which the tests hold it to): `d = amax / 127`,
/// the integers `round(x · (1 / d))` half away from zero (0 where `d` is 0) into `bytes` as
/// `q + 128`; returns `d` rounded to binary16. A block holding a NaN (`amax` NaN; ggml's
/// `MAX` may pass over one) gets the integers 0 and a NaN scale, which keeps it in its row's
/// results.
#[inline(always)]
fn quantize_block<S: Simd>(s: S, x: &[f32], amax: f32, bytes: &mut [u8]) -> f32 {
    if amax.is_nan() {
        bytes.fill(128);
        return f32::NAN;
    }
    let lanes = S::LANES;
    let d = amax / 127.0;
    let id = s.splat(if d != 0.0 { 1.0 / d } else { 0.0 });
    let mut rounded = [0.0f32; BLOCK];
    for v in 0..BLOCK / lanes {
        // SAFETY: `x` holds 32 values, and LANES divides 32.
        let y = s.mul(unsafe { s.load(x.as_ptr().add(v * lanes)) }, id);
        // Ties to even, then the ties (y − r = ±0.5, exact below 2^22) away from zero.
        let even = s.round(y);
        let tie = s.eq(s.abs(s.sub(y, even)), s.splat(0.5));
        let away = s.add(y, s.with_sign_of(s.splat(0.5), y));
        // The integer r (|r| ≤ 127) plus 128 + 1.5 · 2^23: exact, r + 128 in the low byte.
        // (An infinite x times 1 / d = 0 is NaN: its integer is 0, as `roundf` cast gives.)
        let r = s.select(tie, away, even);
        let shifted = s.add(s.zero_where(s.is_nan(r), r), s.splat(ROUNDER + 128.0));
        // SAFETY: `rounded` holds 32 values.
        unsafe { s.store(rounded.as_mut_ptr().add(v * lanes), shifted) };
    }
    let low_bytes: [u8; BLOCK] = core::array::from_fn(|t| rounded[t].to_bits() as u8);
    bytes.copy_from_slice(&low_bytes);
    f16_to_f32(f16_from_f32(d))
}

/// Rows of `A` quantized to `q8_0` for the int8 tile (scratch of the GEMM; see the module's
/// layout).
#[derive(Default)]
pub(crate) struct QuantizedRows {
    bytes: Vec<u8>,
    scales: Vec<f32>,
    blocks: usize,
    mr: usize,
}

impl QuantizedRows {
    /// Quantizes `rows` rows of `k` values of `a` (`lda` apart; `k` whole blocks) into
    /// `kernels.int8_mr`-row panels, each block by ggml's reference `quantize_row_q8_0`
    /// (scale rounded to binary16, integers rounded half away from zero); a block holding a
    /// NaN gets a NaN scale, so that its row's results are NaN.
    pub(crate) fn quantize(
        &mut self,
        kernels: &Kernels,
        (a, lda): (&[f32], usize),
        rows: usize,
        k: usize,
    ) {
        let (mr, blocks) = (kernels.int8_mr, k / BLOCK);
        let panels = rows.div_ceil(mr);
        (self.blocks, self.mr) = (blocks, mr);
        if self.bytes.len() < panels * blocks * BLOCK * mr {
            self.bytes.resize(panels * blocks * BLOCK * mr, 0);
        }
        if self.scales.len() < panels * blocks * mr {
            self.scales.resize(panels * blocks * mr, 0.0);
        }
        for i in 0..panels * mr {
            let (panel, row) = (i / mr, i % mr);
            let at = panel * blocks * mr + row;
            let bytes = &mut self.bytes[at * BLOCK..];
            let scales = &mut self.scales[at..];
            if i < rows {
                // SAFETY: a checked kernel table; row i holds k values, and `bytes` and
                // `scales` hold the row's blocks `mr` apart (the panels' size above).
                unsafe { (kernels.int8_quantize)(&a[i * lda..][..k], bytes, scales, mr) };
            } else {
                for block in 0..blocks {
                    bytes[block * mr * BLOCK..][..BLOCK].fill(128);
                    scales[block * mr] = 0.0;
                }
            }
        }
    }

    /// Panel `r` (rows `r · int8_mr ..`) of the last [`quantize`](Self::quantize).
    pub(crate) fn panel(&self, r: usize) -> RowsPanel<'_> {
        let (blocks, mr) = (self.blocks, self.mr);
        RowsPanel {
            blocks,
            bytes: &self.bytes[r * blocks * BLOCK * mr..][..blocks * BLOCK * mr],
            scales: &self.scales[r * blocks * mr..][..blocks * mr],
        }
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use super::*;
    use crate::kernels::format::blocks::BlockRows;
    use crate::kernels::format::weights::MatrixRef;
    use crate::kernels::format::{Compute, WeightFormat};
    use crate::kernels::gemm::packed::Part;
    use crate::kernels::tests::{every_table, gemm_product};
    use crate::kernels::{Isa, PackedB};

    /// A small deterministic generator: values in `[-1, 1)`.
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// `n` rows of `k / 32` blocks of `quant` with random scales and integers (some scales
    /// tiny, some large, integers over the whole range), and each row's dequantized values.
    fn random_blocks(quant: Quant, k: usize, n: usize, rng: &mut Lcg) -> Vec<u8> {
        let mut bytes = Vec::new();
        for _ in 0..n * k / BLOCK {
            let d = 2f32.powi((rng.next() * 12.0) as i32) * (1.0 + rng.next().abs());
            bytes.extend(f16_from_f32(d).to_le_bytes());
            match quant {
                Quant::Q4_0 => bytes.extend((0..16).map(|_| (rng.next().to_bits() >> 9) as u8)),
                _ => bytes.extend((0..32).map(|_| (rng.next() * 128.0) as i8 as u8)),
            }
        }
        bytes
    }

    /// The integers and scale of block `b` of row `j`, read here by ggml's layouts.
    fn block(quant: Quant, bytes: &[u8], k: usize, j: usize, b: usize) -> (f32, Vec<i32>) {
        let src = &bytes[(j * k / BLOCK + b) * quant.bytes()..][..quant.bytes()];
        let d = f16_to_f32(u16::from_le_bytes([src[0], src[1]]));
        let q = match quant {
            Quant::Q4_0 => (0..32)
                .map(|t| i32::from((src[2 + t % 16] >> (4 * (t / 16))) & 15) - 8)
                .collect(),
            _ => src[2..34].iter().map(|&q| i32::from(q as i8)).collect(),
        };
        (d, q)
    }

    /// ggml's `quantize_row_q8_0_ref` of one block, written out again: scale and integers.
    fn quantize_block(x: &[f32]) -> (f32, Vec<i32>) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = x.iter().map(|&v| (v * id).round() as i32).collect();
        (f16_to_f32(f16_from_f32(d)), q)
    }

    /// The `n` rows of `k` values in `quant`'s `bytes` packed for `kernels` with int8 products.
    fn packed_int8(kernels: &'static Kernels, quant: Quant, bytes: &[u8], k: usize) -> PackedB {
        let rows = BlockRows {
            quant,
            bytes,
            k,
            group: 1,
        };
        let parts = [Part {
            values: MatrixRef::Blocks(rows),
            width: rows.rows(),
        }];
        let format = match quant {
            Quant::Q4_0 => WeightFormat::Q4_0,
            _ => WeightFormat::Q8_0,
        };
        let packed = PackedB::pack(kernels, k, &parts, format, Compute::Int8).unwrap();
        assert_eq!(packed.compute(), Compute::Int8);
        packed
    }

    /// `C = A · B` by the definition of `Compute::Int8`, one element at a time.
    fn by_definition(quant: Quant, a: &[f32], m: usize, b: &[u8], k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f32;
                for blk in 0..k / BLOCK {
                    let (d_a, q_a) = quantize_block(&a[i * k + blk * BLOCK..][..BLOCK]);
                    let (d_b, q_b) = block(quant, b, k, j, blk);
                    let s: i32 = q_a.iter().zip(&q_b).map(|(x, y)| x * y).sum();
                    acc += d_b * d_a * s as f32;
                }
                c[i * n + j] = acc;
            }
        }
        c
    }

    #[test]
    fn every_table_computes_the_definition_bit_for_bit() {
        let mut rng = Lcg(7);
        for quant in [Quant::Q8_0, Quant::Q4_0] {
            for (m, k, n) in [
                (1, 32, 1),
                (5, 96, 17),
                (13, 64, 45),
                (40, 320, 70),
                (7, 32, 33),
            ] {
                let b = random_blocks(quant, k, n, &mut rng);
                let mut a: Vec<f32> = (0..m * k).map(|_| rng.next() * 3.0).collect();
                a[k.min(m * k - 1)] = 0.0;
                let want = by_definition(quant, &a, m, &b, k, n);
                for kernels in every_table() {
                    let packed = packed_int8(kernels, quant, &b, k);
                    for threads in [1, 3] {
                        let got = gemm_product(&packed, &a, m, threads);
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(g, w)| g.to_bits() == w.to_bits());
                        assert!(
                            same,
                            "{:?} {quant:?} {m}x{k}x{n} threads {threads}",
                            kernels.isa
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_product_is_close_to_the_dequantized_one() {
        // f64 of the quantized operands: only the f32 roundings of the scales and the sum
        // over blocks separate them.
        let mut rng = Lcg(11);
        let (m, k, n) = (9, 256, 21);
        let b = random_blocks(Quant::Q8_0, k, n, &mut rng);
        let a: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
        let packed = packed_int8(Isa::detect().kernels().unwrap(), Quant::Q8_0, &b, k);
        let got = gemm_product(&packed, &a, m, 1);
        for i in 0..m {
            for j in 0..n {
                let (mut want, mut magnitude) = (0.0f64, 0.0f64);
                for blk in 0..k / BLOCK {
                    let (d_a, q_a) = quantize_block(&a[i * k + blk * BLOCK..][..BLOCK]);
                    let (d_b, q_b) = block(Quant::Q8_0, &b, k, j, blk);
                    for (x, y) in q_a.iter().zip(&q_b) {
                        let term = f64::from(d_a) * f64::from(*x) * f64::from(d_b) * f64::from(*y);
                        want += term;
                        magnitude += term.abs();
                    }
                }
                // Per block 3 roundings of at most 2^-24 relative, k / 32 blocks.
                let bound = magnitude * 4.0 * (k / BLOCK) as f64 * f64::from(f32::EPSILON);
                let error = (f64::from(got[i * n + j]) - want).abs();
                assert!(error <= bound, "({i}, {j}): {} vs {want}", got[i * n + j]);
            }
        }
    }

    #[test]
    fn the_row_quantizer_gives_ggml_reference_blocks() {
        let mut rng = Lcg(5);
        let mut rows: Vec<Vec<f32>> = (0..400)
            .map(|r| {
                (0..32)
                    .map(|_| rng.next() * 2f32.powi(r % 40 - 20))
                    .collect()
            })
            .collect();
        // Halfway cases (127 / 127 · (n + 0.5)), values just below them, zeros, a lone
        // nonzero, subnormals, infinities.
        rows.push(
            (0..32)
                .map(|t| if t == 0 { 127.0 } else { t as f32 - 15.5 })
                .collect(),
        );
        rows.push(
            (0..32)
                .map(|t| if t == 0 { 127.0 } else { 0.49999997 * t as f32 })
                .collect(),
        );
        rows.push(vec![0.0; 32]);
        rows.push((0..32).map(|t| if t == 7 { -3.0 } else { 0.0 }).collect());
        rows.push((0..32).map(|t| f32::from_bits(t as u32 + 1)).collect());
        rows.push(
            (0..32)
                .map(|t| if t == 3 { f32::INFINITY } else { 1.0 })
                .collect(),
        );
        for x in rows {
            let mut stored = [0u8; 34];
            Quant::Q8_0.quantize(&x, &mut stored);
            let mut bytes = [0u8; 32];
            let portable = crate::kernels::simd::portable::PORTABLE;
            let amax = largest_magnitude(portable, &x);
            let d = super::quantize_block(portable, &x, amax, &mut bytes);
            let want_d = f16_to_f32(u16::from_le_bytes([stored[0], stored[1]]));
            assert_eq!(d.to_bits(), want_d.to_bits(), "{x:?}");
            let want: Vec<u8> = stored[2..].iter().map(|q| q ^ 0x80).collect();
            assert_eq!(&bytes[..], &want[..], "{x:?}");
            for kernels in every_table() {
                let (mut table_bytes, mut scale) = ([0u8; 32], [0.0f32]);
                // SAFETY: a checked kernel table; one block, stride 1.
                unsafe { (kernels.int8_quantize)(&x, &mut table_bytes, &mut scale, 1) };
                assert_eq!(
                    (table_bytes, scale[0].to_bits()),
                    (bytes, d.to_bits()),
                    "{x:?}"
                );
            }
        }
    }

    #[test]
    fn a_non_finite_row_stays_in_its_row() {
        let mut rng = Lcg(3);
        let (m, k, n) = (6, 64, 5);
        let b = random_blocks(Quant::Q8_0, k, n, &mut rng);
        let mut a: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
        a[2 * k + 40] = f32::INFINITY;
        a[4 * k + 3] = f32::NAN;
        for kernels in every_table() {
            let packed = packed_int8(kernels, Quant::Q8_0, &b, k);
            let got = gemm_product(&packed, &a, m, 1);
            for (i, row) in got.chunks(n).enumerate() {
                let finite = row.iter().all(|v| v.is_finite());
                assert_eq!(
                    finite,
                    i != 2 && i != 4,
                    "{:?} row {i}: {row:?}",
                    kernels.isa
                );
            }
        }
    }
}
