//! Weights kept as ggml's quantized blocks, with exactly the bytes a GGUF tensor holds:
//! [`Quant`] (the block types), [`BlockRows`] (a matrix of them), the widening of one block
//! through the [`Simd`] primitives, and ggml's reference quantizers of `q8_0` and `q4_0`.
//!
//! A matrix `B (k, n)` (rows are input features, as the GEMM reads it) is kept as the `n`
//! rows of the checkpoint's `(out, in)` tensor: row `j` (output `j`) is `k / values` blocks,
//! block `b` holding inputs `b · values ..`, so a GGUF tensor maps byte for byte.
//!
//! Each block widens to the values of ggml's reference `dequantize_row_*` (`ggml-quants.c`):
//! the same `f32` operations in the same order, each rounded on its own (no fused
//! multiply-add). Layouts (`ggml-common.h`, little-endian; `d`, `dmin` binary16):
//!
//! | type | values | bytes | layout | value |
//! |---|---|---|---|---|
//! | q8_0 | 32 | 34 | `d`, `qs: [i8; 32]` | `qs[j] · d` |
//! | q4_0 | 32 | 18 | `d`, `qs: [u8; 16]` (value `j` low nibble, `j + 16` high) | `(q − 8) · d` |
//! | q4_K | 256 | 144 | `d`, `dmin`, `scales: [u8; 12]`, `qs: [u8; 128]` | `(d · sc) · q − dmin · m` |
//! | q5_K | 256 | 176 | `d`, `dmin`, `scales: [u8; 12]`, `qh: [u8; 32]`, `qs: [u8; 128]` | as q4_K, `q` 5 bits |
//! | q6_K | 256 | 210 | `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d` | `(d · sc) · (q − 32)` |
//!
//! (In q4_K and q5_K, group `g < 4` of 64 values is two sub-blocks of 32, sub-block `s`
//! taking the low (`s = 0`) or high nibbles of `qs[32g ..][..32]`, its 6-bit scale `sc` and
//! minimum `m` from `scales` as `get_scale_min_k4` unpacks them, q5_K's fifth bit bit `2g + s`
//! of `qh[l]`. In q6_K, half `h < 2` of 128 values: value `l + 32i` (`i < 4`) takes the low
//! (`i < 2`) or high nibble of `ql[64h + 32(i % 2) + l]`, bits `2i ..` of `qh[32h + l]` above
//! it, scale `scales[8h + l / 16 + 2i]`.)

use crate::kernels::format::element::{f16_from_f32, f16_to_f32};
use crate::kernels::simd::portable::PORTABLE;
use crate::kernels::simd::Simd;

/// One of ggml's block types a weight matrix may be kept in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Quant {
    /// `q8_0`: 32 values, an `i8` each and a binary16 scale.
    Q8_0,
    /// `q4_0`: 32 values, a nibble each (offset 8) and a binary16 scale.
    Q4_0,
    /// `q4_K`: 256 values in 8 sub-blocks with 6-bit scales and minimums.
    Q4K,
    /// `q5_K`: as `q4_K` with a fifth bit per value.
    Q5K,
    /// `q6_K`: 256 values of 6 bits in 16 sub-blocks with 8-bit scales.
    Q6K,
}

impl Quant {
    /// Its name, as ggml spells it: `q8_0`, `q4_0`, `q4_K`, `q5_K`, `q6_K`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Quant::Q8_0 => "q8_0",
            Quant::Q4_0 => "q4_0",
            Quant::Q4K => "q4_K",
            Quant::Q5K => "q5_K",
            Quant::Q6K => "q6_K",
        }
    }

    /// Values per block: 32, or 256 for the K types.
    pub(crate) const fn values(self) -> usize {
        match self {
            Quant::Q8_0 | Quant::Q4_0 => 32,
            Quant::Q4K | Quant::Q5K | Quant::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub(crate) const fn bytes(self) -> usize {
        match self {
            Quant::Q8_0 => 34,
            Quant::Q4_0 => 18,
            Quant::Q4K => 144,
            Quant::Q5K => 176,
            Quant::Q6K => 210,
        }
    }

    /// Whether `f32` weights can be quantized to it here (ggml's reference quantizers of
    /// `q8_0` and `q4_0`).
    pub(crate) fn quantizes(self) -> bool {
        matches!(self, Quant::Q8_0 | Quant::Q4_0)
    }

    /// The largest magnitude a weight quantized to it may have: beyond, its block's scale
    /// rounds to a binary16 infinity (`max|x| / 127` for `q8_0`, `max|x| / 8` for `q4_0`).
    pub(crate) fn overflows(self, x: f32) -> bool {
        let scale = match self {
            Quant::Q8_0 => x.abs() / 127.0,
            Quant::Q4_0 => x.abs() / 8.0,
            _ => return false,
        };
        f16_to_f32(f16_from_f32(scale)).is_infinite()
    }

    /// Quantizes `src` (whole blocks) into `dst` (its blocks' bytes) with ggml's reference
    /// quantizer; a type without one ([`Quant::quantizes`]) leaves `dst` as it is.
    ///
    /// # Panics
    /// When `dst` holds fewer than `src.len() / values` blocks.
    pub(crate) fn quantize(self, src: &[f32], dst: &mut [u8]) {
        let blocks = src
            .chunks_exact(self.values())
            .zip(dst.chunks_exact_mut(self.bytes()));
        for (x, y) in blocks {
            match self {
                Quant::Q8_0 => quantize_q8_0(x, y),
                Quant::Q4_0 => quantize_q4_0(x, y),
                _ => {}
            }
        }
    }
}

/// `quantize_row_q8_0_ref` on one block: `d = amax / 127` (`amax` by ggml's `MAX` macro),
/// `qs[j] = roundf(x[j] · (1 / d))` (0 where `d` is 0), halfway cases away from zero.
fn quantize_q8_0(x: &[f32], y: &mut [u8]) {
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y[..2].copy_from_slice(&f16_from_f32(d).to_le_bytes());
    for (q, &v) in y[2..].iter_mut().zip(x) {
        *q = round_half_away(v * id) as i8 as u8;
    }
}

/// `quantize_row_q4_0_ref` on one block: `max` the first value of largest magnitude,
/// `d = max / -8`, value `j` `min(15, (i8)(x[j] · (1 / d) + 8.5))` (truncated), the first
/// 16 in the low nibbles.
fn quantize_q4_0(x: &[f32], y: &mut [u8]) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y[..2].copy_from_slice(&f16_from_f32(d).to_le_bytes());
    let nibble = |v: f32| (c_int(v * id + 8.5) as i8).min(15) as u8;
    for (j, q) in y[2..18].iter_mut().enumerate() {
        *q = nibble(x[j]) | (nibble(x[16 + j]) << 4);
    }
}

/// C's `roundf` followed by the conversion to an integer: to nearest, halfway cases away from
/// zero, converted as [`c_int`] converts.
fn round_half_away(x: f32) -> i32 {
    let whole = c_int(x);
    if whole == i32::MIN {
        return whole;
    }
    // Exact: |x| < 2^31, and below 2^23 `x` has a fraction (above, `rest` is 0).
    let rest = x - whole as f32;
    if rest >= 0.5 {
        whole + 1
    } else if rest <= -0.5 {
        whole - 1
    } else {
        whole
    }
}

/// C's conversion of `x` to an integer, truncating, as x86-64's `cvttss2si` does it (C
/// leaves the other cases undefined): a NaN or a value beyond the `i32` range gives
/// `i32::MIN`, whose low byte is 0. (It matters only for a block whose scale's reciprocal
/// overflows: a largest magnitude below about `2^-120`.)
fn c_int(x: f32) -> i32 {
    if x.abs() < 2_147_483_648.0 {
        x as i32
    } else {
        i32::MIN
    }
}

/// A `(k, n)` matrix kept as the blocks of its `n` rows of `k` values (see the module docs):
/// row `j` is `bytes[j · row_bytes ..][..row_bytes]`, `row_bytes = k / values · bytes`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockRows<'a> {
    pub quant: Quant,
    pub bytes: &'a [u8],
    /// Values per row (a multiple of the block's).
    pub k: usize,
}

impl<'a> BlockRows<'a> {
    /// Bytes per row.
    pub(crate) fn row_bytes(self) -> usize {
        self.k / self.quant.values() * self.quant.bytes()
    }

    /// Row `j`'s blocks.
    ///
    /// # Panics
    /// When the matrix has no row `j`.
    pub(crate) fn row(self, j: usize) -> &'a [u8] {
        let len = self.row_bytes();
        &self.bytes[j * len..][..len]
    }
}

/// Row `row` (whole blocks of `quant`) dequantized into `out[..values]` as ggml's reference
/// `dequantize_row_*` does (the portable table's widening, which every table's equals).
///
/// # Panics
/// When `out` is shorter than the row's values.
pub(crate) fn dequantize_row(quant: Quant, row: &[u8], out: &mut [f32]) {
    let blocks = row.chunks_exact(quant.bytes());
    for (block, out) in blocks.zip(out.chunks_exact_mut(quant.values())) {
        widen_block(PORTABLE, quant, block, out);
    }
}

/// The binary16 at `b[at ..][..2]`, widened.
///
/// # Safety
/// The two bytes are readable.
#[inline(always)]
unsafe fn half(b: *const u8, at: usize) -> f32 {
    // SAFETY: the caller's promise.
    f16_to_f32(u16::from_le_bytes(unsafe { [*b.add(at), *b.add(at + 1)] }))
}

/// Widens the block `block` (its `quant.bytes()` bytes) into `out[..quant.values()]`.
///
/// # Panics
/// When `block` or `out` is shorter.
#[inline(always)]
pub(crate) fn widen_block<S: Simd>(s: S, quant: Quant, block: &[u8], out: &mut [f32]) {
    assert!(block.len() >= quant.bytes() && out.len() >= quant.values());
    debug_assert!(16 % S::LANES == 0);
    let (b, y) = (block.as_ptr(), out.as_mut_ptr());
    // SAFETY: `b` holds one block of `quant` and `y` its values (checked above).
    unsafe {
        match quant {
            Quant::Q8_0 => widen_q8_0(s, b, y),
            Quant::Q4_0 => widen_q4_0(s, b, y),
            Quant::Q4K | Quant::Q5K => widen_k::<S>(s, quant == Quant::Q5K, b, y),
            Quant::Q6K => widen_q6_k(s, b, y),
        }
    }
}

/// `dequantize_row_q8_0` on one block: `qs[j] · d`.
///
/// # Safety
/// `b` holds 34 readable bytes, `y` 32 writable floats.
#[inline(always)]
unsafe fn widen_q8_0<S: Simd>(s: S, b: *const u8, y: *mut f32) {
    // SAFETY: the caller's promise; vectors of LANES (dividing 16) inside the 32 values.
    unsafe {
        let d = s.splat(half(b, 0));
        for c in (0..32).step_by(S::LANES) {
            s.store(y.add(c), s.mul(s.load_i8(b.add(2 + c).cast()), d));
        }
    }
}

/// `dequantize_row_q4_0` on one block: `(nibble − 8) · d`.
///
/// # Safety
/// `b` holds 18 readable bytes, `y` 32 writable floats.
#[inline(always)]
unsafe fn widen_q4_0<S: Simd>(s: S, b: *const u8, y: *mut f32) {
    // SAFETY: the caller's promise; vectors of LANES (dividing 16) inside the 16 bytes.
    unsafe {
        let (d, eight) = (s.splat(half(b, 0)), s.splat(8.0));
        for c in (0..16).step_by(S::LANES) {
            let low = s.load_bits::<0, 4>(b.add(2 + c));
            let high = s.load_bits::<4, 4>(b.add(2 + c));
            s.store(y.add(c), s.mul(s.sub(low, eight), d));
            s.store(y.add(16 + c), s.mul(s.sub(high, eight), d));
        }
    }
}

/// `get_scale_min_k4`: the 6-bit scale and minimum of sub-block `j < 8` of `scales`.
///
/// # Safety
/// `scales` holds 12 readable bytes.
#[inline(always)]
unsafe fn scale_min(j: usize, scales: *const u8) -> (f32, f32) {
    // SAFETY: the caller's promise; every index is below 12.
    let q = |i: usize| unsafe { *scales.add(i) };
    let (sc, m) = if j < 4 {
        (q(j) & 63, q(j + 4) & 63)
    } else {
        (
            (q(j + 4) & 0x0F) | ((q(j - 4) >> 6) << 4),
            (q(j + 4) >> 4) | ((q(j) >> 6) << 4),
        )
    };
    (f32::from(sc), f32::from(m))
}

/// Bit `shift < 8` of `LANES` bytes, as `0.0` or `1.0`.
///
/// # Safety
/// `src` points to `LANES` readable bytes.
#[inline(always)]
unsafe fn bit<S: Simd>(s: S, src: *const u8, shift: usize) -> S::V {
    // SAFETY: the caller's promise.
    unsafe {
        match shift {
            0 => s.load_bits::<0, 1>(src),
            1 => s.load_bits::<1, 1>(src),
            2 => s.load_bits::<2, 1>(src),
            3 => s.load_bits::<3, 1>(src),
            4 => s.load_bits::<4, 1>(src),
            5 => s.load_bits::<5, 1>(src),
            6 => s.load_bits::<6, 1>(src),
            _ => s.load_bits::<7, 1>(src),
        }
    }
}

/// `dequantize_row_q4_K` (or `q5_K` when `FIVE`) on one block: sub-block `s` of group `g`
/// is `d1 · q − m1` with `d1 = d · sc`, `m1 = dmin · m`, `q` the nibble (plus 16 where
/// q5_K's bit `2g + s` of `qh[l]` is set).
///
/// # Safety
/// `b` holds one block's readable bytes (144, or 176 when `five`), `y` 256 writable floats.
#[inline(always)]
unsafe fn widen_k<S: Simd>(s: S, five: bool, b: *const u8, y: *mut f32) {
    // SAFETY: the caller's promise; every offset lies inside the block's layout (module
    // docs), vectors of LANES (dividing 16) inside each sub-block's 32 bytes.
    unsafe {
        let (d, dmin) = (half(b, 0), half(b, 2));
        let (scales, qh, qs) = (b.add(4), b.add(16), b.add(if five { 48 } else { 16 }));
        for g in 0..4 {
            for sub in 0..2 {
                let (sc, m) = scale_min(2 * g + sub, scales);
                let (d1, m1) = (s.splat(d * sc), s.splat(dmin * m));
                for c in (0..32).step_by(S::LANES) {
                    let src = qs.add(32 * g + c);
                    let mut q = match sub {
                        0 => s.load_bits::<0, 4>(src),
                        _ => s.load_bits::<4, 4>(src),
                    };
                    if five {
                        let high = bit(s, qh.add(c), 2 * g + sub);
                        q = s.add(q, s.mul(high, s.splat(16.0)));
                    }
                    s.store(y.add(64 * g + 32 * sub + c), s.sub(s.mul(d1, q), m1));
                }
            }
        }
    }
}

/// Bits `shift .. shift + 2` (`shift` even, below 8) of `LANES` bytes, as `f32`.
///
/// # Safety
/// `src` points to `LANES` readable bytes.
#[inline(always)]
unsafe fn two_bits<S: Simd>(s: S, src: *const u8, shift: usize) -> S::V {
    // SAFETY: the caller's promise.
    unsafe {
        match shift {
            0 => s.load_bits::<0, 2>(src),
            2 => s.load_bits::<2, 2>(src),
            4 => s.load_bits::<4, 2>(src),
            _ => s.load_bits::<6, 2>(src),
        }
    }
}

/// `dequantize_row_q6_K` on one block: value `l + 32i` of half `h` is
/// `(d · sc) · (q − 32)`, `q` the nibble with two bits of `qh` above it.
///
/// # Safety
/// `b` holds 210 readable bytes, `y` 256 writable floats.
#[inline(always)]
unsafe fn widen_q6_k<S: Simd>(s: S, b: *const u8, y: *mut f32) {
    // SAFETY: the caller's promise; every offset lies inside the block's layout (module
    // docs), vectors of LANES (dividing 16) inside each run of 16 values of one scale.
    unsafe {
        let d = half(b, 208);
        let (sixteen, offset) = (s.splat(16.0), s.splat(32.0));
        for h in 0..2 {
            let (ql, qh, sc) = (b.add(64 * h), b.add(128 + 32 * h), b.add(192 + 8 * h));
            for i in 0..4 {
                for c in (0..32).step_by(S::LANES) {
                    let src = ql.add(32 * (i % 2) + c);
                    let low = match i / 2 {
                        0 => s.load_bits::<0, 4>(src),
                        _ => s.load_bits::<4, 4>(src),
                    };
                    let high = two_bits(s, qh.add(c), 2 * i);
                    let q = s.sub(s.add(low, s.mul(high, sixteen)), offset);
                    let scale = d * f32::from(*sc.add(c / 16 + 2 * i) as i8);
                    s.store(y.add(128 * h + 32 * i + c), s.mul(s.splat(scale), q));
                }
            }
        }
    }
}
