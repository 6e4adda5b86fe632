//! Weights kept as ggml's quantized blocks, with exactly the bytes a GGUF tensor holds:
//! [`Quant`] (the block types), [`BlockRows`] (a matrix of them, its rows interleaved a
//! vector's lanes at a time), [`BlockFormat`] (the one definition of each type's
//! dequantization: the kernels widen through it over the [`Simd`] primitives, and
//! [`dequantize`] gives the loader's `f32` values on one portable lane), and ggml's reference
//! quantizers of `q8_0` and `q4_0`.
//!
//! A matrix `B (k, n)` (rows are input features, as the GEMM reads it) is kept as the `n`
//! rows of the checkpoint's `(out, in)` tensor: row `j` (output `j`) is `k / values` blocks,
//! block `b` holding inputs `b · values ..`, so a GGUF tensor holds the same bytes (packed,
//! they are interleaved so that one step of a group of rows is one vector).
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

/// A `(k, n)` matrix kept as the blocks of its `n` rows of `k` values (see the module docs),
/// `group` rows interleaved: the rows are in groups of `group` (the last padded with rows of
/// zero bytes), group `g` at `g · group · row_bytes`, its block `b` (of each of its rows) at
/// `b · group · bytes` from there, a "superblock" of `group` blocks interleaved field by field:
/// the byte (or binary16) at offset `x` of row `c`'s block at `group · x + c` (or `group · x +
/// 2c`). So the `group` values of one step are next to each other, as a vector's lanes; a
/// group of 1 is GGUF's layout.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockRows<'a> {
    pub quant: Quant,
    pub bytes: &'a [u8],
    /// Values per row (a multiple of the block's).
    pub k: usize,
    /// Rows per interleaved group.
    pub group: usize,
}

impl<'a> BlockRows<'a> {
    /// Bytes per row.
    pub(crate) fn row_bytes(self) -> usize {
        self.k / self.quant.values() * self.quant.bytes()
    }

    /// Row `j`'s blocks, in a matrix of GGUF's layout (`group` 1).
    ///
    /// # Panics
    /// When the matrix has no row `j`.
    pub(crate) fn row(self, j: usize) -> &'a [u8] {
        debug_assert_eq!(
            self.group, 1,
            "rows of an interleaved matrix are not contiguous"
        );
        let len = self.row_bytes();
        &self.bytes[j * len..][..len]
    }

    /// Whether it holds the groups of rows `0 .. rows`.
    pub(crate) fn holds(self, rows: usize) -> bool {
        let groups = rows.div_ceil(self.group.max(1));
        groups
            .checked_mul(self.group)
            .and_then(|rows| rows.checked_mul(self.row_bytes()))
            .is_some_and(|len| len <= self.bytes.len())
    }
}

impl Quant {
    /// The bytes of a block that are binary16 values (`d`, and `dmin`); every other field is
    /// bytes.
    fn halves(self) -> core::ops::Range<usize> {
        match self {
            Quant::Q8_0 | Quant::Q4_0 => 0..2,
            Quant::Q4K | Quant::Q5K => 0..4,
            Quant::Q6K => 208..210,
        }
    }

    /// The bytes of `rows` rows of `k` values in GGUF's layout (`src`, row after row)
    /// interleaved in groups of `group` rows into `dst` (see [`BlockRows`]; `dst` holds
    /// `rows.div_ceil(group) · group` rows, the padding rows zeros).
    ///
    /// # Panics
    /// When `src` or `dst` is shorter.
    pub(crate) fn interleave(self, src: &[u8], k: usize, group: usize, dst: &mut [u8]) {
        let (bytes, blocks) = (self.bytes(), k / self.values());
        let row_bytes = blocks * bytes;
        let rows = src.len() / row_bytes.max(1);
        dst[..rows.div_ceil(group) * group * row_bytes].fill(0);
        for (j, row) in src.chunks_exact(row_bytes.max(1)).enumerate() {
            let (g, c) = (j / group, j % group);
            for (b, block) in row.chunks_exact(bytes).enumerate() {
                let superblock = &mut dst[(g * blocks + b) * group * bytes..][..group * bytes];
                for (x, &byte) in block.iter().enumerate() {
                    let at = match self.halves().contains(&x) {
                        true => group * (x & !1) + 2 * c + (x & 1),
                        false => group * x + c,
                    };
                    superblock[at] = byte;
                }
            }
        }
    }
}

/// `LANES` binary16 values at `b`, widened (unaligned: through bytes on the tables that read
/// 16-bit lanes with 16-bit loads).
///
/// # Safety
/// The `2 · LANES` bytes are readable.
#[inline(always)]
unsafe fn halves<S: Simd>(s: S, b: *const u8) -> S::V {
    // SAFETY: the caller's promise; `load_f16` reads LANES values, unaligned.
    unsafe { s.load_f16(b.cast()) }
}

/// Values of a block that share their constants (a `q8_0` / `q4_0` block, a K type's
/// sub-block; `q6_K`'s two scales of 16 values): the unit [`BlockFormat::constants`] are
/// computed for.
pub(crate) const RUN: usize = 32;

/// One block type as the kernels read it: a superblock of [`Simd::LANES`] interleaved blocks
/// (one per lane; [`BlockRows`]), one step of all of them at a time, each value computed by
/// the `f32` operations of ggml's reference `dequantize_row_*`, in its order. One zero-sized
/// type per [`Quant`]; [`with_block_format!`] picks it. The byte at offset `x` of the lanes'
/// blocks is at `LANES · x` of the superblock.
pub(crate) trait BlockFormat: Copy {
    /// Values per block.
    const VALUES: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// The constants of run `run` (values `RUN · run ..` of each block), as ggml computes
    /// them: a scale and, for some types, a minimum or a second scale.
    ///
    /// # Safety
    /// `b` points to one superblock's readable bytes; `run < VALUES / RUN`.
    unsafe fn constants<S: Simd>(s: S, b: *const u8, run: usize) -> [S::V; 2];
    /// Value `RUN · run + t` (`t < RUN`) of every lane's block, from the run's `constants`.
    ///
    /// # Safety
    /// As [`BlockFormat::constants`].
    unsafe fn step<S: Simd>(s: S, b: *const u8, run: usize, t: usize, k: &[S::V; 2]) -> S::V;
}

/// `q8_0`: `qs[j] · d` (`dequantize_row_q8_0`).
#[derive(Clone, Copy)]
pub(crate) struct Q8_0;

impl BlockFormat for Q8_0 {
    const VALUES: usize = 32;
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn constants<S: Simd>(s: S, b: *const u8, _: usize) -> [S::V; 2] {
        // SAFETY: the caller's promise; `d` is the blocks' first two bytes.
        [unsafe { halves(s, b) }, s.zero()]
    }
    #[inline(always)]
    unsafe fn step<S: Simd>(s: S, b: *const u8, _: usize, t: usize, k: &[S::V; 2]) -> S::V {
        // SAFETY: the caller's promise; `qs[t]` is byte 2 + t.
        s.mul(unsafe { s.load_i8(b.add(S::LANES * (2 + t)).cast()) }, k[0])
    }
}

/// `q4_0`: `(q − 8) · d`, value `j` the low nibble of `qs[j]`, value `16 + j` its high one
/// (`dequantize_row_q4_0`).
#[derive(Clone, Copy)]
pub(crate) struct Q4_0;

impl BlockFormat for Q4_0 {
    const VALUES: usize = 32;
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn constants<S: Simd>(s: S, b: *const u8, _: usize) -> [S::V; 2] {
        // SAFETY: the caller's promise; `d` is the blocks' first two bytes.
        [unsafe { halves(s, b) }, s.zero()]
    }
    #[inline(always)]
    unsafe fn step<S: Simd>(s: S, b: *const u8, _: usize, t: usize, k: &[S::V; 2]) -> S::V {
        // SAFETY: the caller's promise; `qs[t % 16]` is byte 2 + t % 16.
        let q = unsafe {
            let src = b.add(S::LANES * (2 + t % 16));
            match t < 16 {
                true => s.load_bits::<0, 4>(src),
                false => s.load_bits::<4, 4>(src),
            }
        };
        s.mul(s.sub(q, s.splat(8.0)), k[0])
    }
}

/// `q4_K` (or, when `FIVE`, `q5_K`): sub-block `run = 2g + h` of group `g` is `d1 · q − m1`
/// with `d1 = d · sc`, `m1 = dmin · m` (`get_scale_min_k4`'s 6-bit `sc` and `m`), `q` the
/// low (`h = 0`) or high nibbles of `qs[32g ..][..32]`, plus 16 where q5_K's bit `run` of
/// `qh[l]` is set (`dequantize_row_q4_K`, `dequantize_row_q5_K`).
#[derive(Clone, Copy)]
pub(crate) struct QK<const FIVE: bool>;

impl<const FIVE: bool> BlockFormat for QK<FIVE> {
    const VALUES: usize = 256;
    const BYTES: usize = if FIVE { 176 } else { 144 };
    #[inline(always)]
    unsafe fn constants<S: Simd>(s: S, b: *const u8, run: usize) -> [S::V; 2] {
        // SAFETY: the caller's promise; `d`, `dmin` and the 12 bytes of `scales` start the
        // blocks.
        unsafe {
            let (sc, m) = scale_min(s, run, b.add(4 * S::LANES));
            let (d, dmin) = (halves(s, b), halves(s, b.add(2 * S::LANES)));
            [s.mul(d, sc), s.mul(dmin, m)]
        }
    }
    #[inline(always)]
    unsafe fn step<S: Simd>(s: S, b: *const u8, run: usize, t: usize, k: &[S::V; 2]) -> S::V {
        let qs = if FIVE { 48 } else { 16 };
        // SAFETY: the caller's promise; `qs[32g + t]` and `qh[t]` lie inside the blocks'
        // layout (module docs).
        unsafe {
            let src = b.add(S::LANES * (qs + 32 * (run / 2) + t));
            let mut q = match run % 2 {
                0 => s.load_bits::<0, 4>(src),
                _ => s.load_bits::<4, 4>(src),
            };
            if FIVE {
                let high = bit(s, b.add(S::LANES * (16 + t)), run);
                q = s.add(q, s.mul(high, s.splat(16.0)));
            }
            s.sub(s.mul(k[0], q), k[1])
        }
    }
}

/// `q6_K`: run `4h + i` (half `h`, quarter `i`) holds values `128h + 32i + l`, each
/// `(d · sc) · (q − 32)`, `q` the low (`i < 2`) or high nibble of `ql[64h + 32(i % 2) + l]`
/// with bits `2i ..` of `qh[32h + l]` above it, `sc = scales[8h + l / 16 + 2i]`
/// (`dequantize_row_q6_K`).
#[derive(Clone, Copy)]
pub(crate) struct Q6K;

impl BlockFormat for Q6K {
    const VALUES: usize = 256;
    const BYTES: usize = 210;
    /// `d · sc` of the run's values `l < 16` and `l ≥ 16`.
    #[inline(always)]
    unsafe fn constants<S: Simd>(s: S, b: *const u8, run: usize) -> [S::V; 2] {
        let (h, i) = (run / 4, run % 4);
        // SAFETY: the caller's promise; `scales` are bytes 192 .. 208, `d` 208 .. 210.
        unsafe {
            let (d, sc) = (halves(s, b.add(208 * S::LANES)), 192 + 8 * h + 2 * i);
            let scale = |x: usize| s.mul(d, s.load_i8(b.add(S::LANES * x).cast()));
            [scale(sc), scale(sc + 1)]
        }
    }
    #[inline(always)]
    unsafe fn step<S: Simd>(s: S, b: *const u8, run: usize, t: usize, k: &[S::V; 2]) -> S::V {
        let (h, i) = (run / 4, run % 4);
        // SAFETY: the caller's promise; `ql[64h + 32(i % 2) + t]` and `qh[32h + t]` lie
        // inside the blocks' layout (module docs).
        unsafe {
            let src = b.add(S::LANES * (64 * h + 32 * (i % 2) + t));
            let low = match i / 2 {
                0 => s.load_bits::<0, 4>(src),
                _ => s.load_bits::<4, 4>(src),
            };
            let high = two_bits(s, b.add(S::LANES * (128 + 32 * h + t)), 2 * i);
            let q = s.sub(s.add(low, s.mul(high, s.splat(16.0))), s.splat(32.0));
            s.mul(k[t / 16], q)
        }
    }
}

/// Runs `$body` with the type `$format` bound to the [`BlockFormat`] of the [`Quant`]
/// `$quant`.
macro_rules! with_block_format {
    ($quant:expr, |$format:ident| $body:expr) => {{
        use $crate::kernels::format::blocks::{Quant, Q4_0, Q6K, Q8_0, QK};
        match $quant {
            Quant::Q8_0 => {
                type $format = Q8_0;
                $body
            }
            Quant::Q4_0 => {
                type $format = Q4_0;
                $body
            }
            Quant::Q4K => {
                type $format = QK<false>;
                $body
            }
            Quant::Q5K => {
                type $format = QK<true>;
                $body
            }
            Quant::Q6K => {
                type $format = Q6K;
                $body
            }
        }
    }};
}

pub(crate) use with_block_format;

/// Appends ggml's reference dequantization of `data` (whole blocks of `quant` in GGUF's
/// layout; a partial last block is left out) to `out`: the scalar `f32` operations of
/// `dequantize_row_*`, through the [`BlockFormat`] readers on one portable lane (the kernels'
/// own definition, so the values the kernels multiply by).
pub(crate) fn dequantize(quant: Quant, data: &[u8], out: &mut alloc::vec::Vec<f32>) {
    let s = crate::kernels::simd::portable::Lanes::<1>;
    with_block_format!(quant, |F| {
        for block in data.chunks_exact(F::BYTES) {
            let b = block.as_ptr();
            for run in 0..F::VALUES / RUN {
                // SAFETY: `block` is one whole block, a superblock of one lane; run <
                // VALUES / RUN, t < RUN.
                unsafe {
                    let k = F::constants(s, b, run);
                    out.extend((0..RUN).map(|t| s.first(F::step(s, b, run, t, &k))));
                }
            }
        }
    })
}

/// `get_scale_min_k4` of every lane: the 6-bit scale and minimum of sub-block `j < 8` of the
/// `scales` (12 bytes of `LANES` lanes each).
///
/// # Safety
/// `scales` holds `12 · LANES` readable bytes.
#[inline(always)]
unsafe fn scale_min<S: Simd>(s: S, j: usize, scales: *const u8) -> (S::V, S::V) {
    let q = |i: usize| scales.wrapping_add(i * S::LANES);
    let sixteen = s.splat(16.0);
    // SAFETY: the caller's promise; every byte index is below 12.
    unsafe {
        if j < 4 {
            (s.load_bits::<0, 6>(q(j)), s.load_bits::<0, 6>(q(j + 4)))
        } else {
            let high = |i: usize| s.mul(s.load_bits::<6, 2>(q(i)), sixteen);
            (
                s.add(s.load_bits::<0, 4>(q(j + 4)), high(j - 4)),
                s.add(s.load_bits::<4, 4>(q(j + 4)), high(j)),
            )
        }
    }
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
