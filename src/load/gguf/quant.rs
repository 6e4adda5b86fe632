//! ggml's reference dequantization (`dequantize_row_*` of `ggml-quants.c`), scalar: each
//! value is computed by the same `f32` operations in the same order as ggml's C, each rounded
//! on its own (Rust never contracts `a * b - c` into a fused multiply-add), so the values are
//! bit for bit those of ggml's reference functions. The types a layer may keep as weights
//! (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) are dequantized by the kernels' own definition
//! (`kernels::format::blocks`, the values the kernels multiply by); Q4_1, Q5_0 and Q5_1 here.
//! Block layouts (`ggml-common.h`), all little-endian, `d`/`dmin`/`m` binary16:
//!
//! | type | values | bytes | layout |
//! |---|---|---|---|
//! | Q8_0 | 32 | 34 | `d`, `qs: [i8; 32]` |
//! | Q4_0 | 32 | 18 | `d`, `qs: [u8; 16]` (value `j` low nibble, `j + 16` high) |
//! | Q4_1 | 32 | 20 | `d`, `m`, `qs: [u8; 16]` |
//! | Q5_0 | 32 | 22 | `d`, `qh: u32` (bit `j`: fifth bit of value `j`), `qs: [u8; 16]` |
//! | Q5_1 | 32 | 24 | `d`, `m`, `qh: u32`, `qs: [u8; 16]` |
//! | Q4_K | 256 | 144 | `d`, `dmin`, `scales: [u8; 12]` (8 six-bit scales and minimums), `qs: [u8; 128]` |
//! | Q5_K | 256 | 176 | `d`, `dmin`, `scales: [u8; 12]`, `qh: [u8; 32]`, `qs: [u8; 128]` |
//! | Q6_K | 256 | 210 | `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d` |

use alloc::string::String;
use alloc::vec::Vec;

use super::error::GgufError;
use super::tensors::GgmlType;
use crate::kernels::format::blocks::{dequantize as dequantize_blocks, Quant};
use crate::load::safetensors::{bf16_to_f32, f16_to_f32};

/// The binary16 at bytes `at..at + 2` of a block, widened exactly.
fn half<const B: usize>(block: &[u8; B], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]))
}

/// `dequantize_row_q4_1`: `nibble · d + m`.
fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (j, &q) in b[4..].iter().enumerate() {
        y[j] = f32::from(q & 0x0F) * d + m;
        y[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// The 5-bit values of a Q5_0 / Q5_1 block: low nibbles `qs`, fifth bits `qh`.
fn five_bit(qh: u32, qs: &[u8], mut out: impl FnMut(usize, u8, u8)) {
    for (j, &q) in qs.iter().enumerate() {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        out(j, (q & 0x0F) | h0, (q >> 4) | h1);
    }
}

/// `dequantize_row_q5_0`: `(value − 16) · d`.
fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = half(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    five_bit(qh, &b[6..], |j, x0, x1| {
        y[j] = (i32::from(x0) - 16) as f32 * d;
        y[j + 16] = (i32::from(x1) - 16) as f32 * d;
    });
}

/// `dequantize_row_q5_1`: `value · d + m`.
fn q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    five_bit(qh, &b[8..], |j, x0, x1| {
        y[j] = f32::from(x0) * d + m;
        y[j + 16] = f32::from(x1) * d + m;
    });
}

/// Every block of `data` (a whole number of `B`-byte blocks) dequantized by `f`, appended.
fn each<const B: usize, const L: usize>(
    data: &[u8],
    out: &mut Vec<f32>,
    f: fn(&[u8; B], &mut [f32; L]),
) {
    let mut y = [0.0; L];
    for block in data.as_chunks::<B>().0 {
        f(block, &mut y);
        out.extend_from_slice(&y);
    }
}

/// The values of a tensor of type `ty` whose bytes are `data`, as `f32`: F32 as stored,
/// F16 and BF16 widened exactly, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K
/// dequantized as ggml's reference `dequantize_row_*` does, bit for bit.
///
/// ```
/// use mha::gguf::{dequantize, GgmlType};
/// // One Q8_0 block: scale 0.5 (binary16 0x3800), values 0, 1, ..., 31.
/// let mut block = vec![0x00, 0x38];
/// block.extend((0..32).map(|q: u8| q));
/// let values = dequantize("w", GgmlType::Q8_0, &block)?;
/// assert_eq!(values[3], 1.5);
/// assert!(dequantize("w", GgmlType::Q8_0, &block[..33]).is_err()); // not whole blocks
/// # Ok::<(), mha::gguf::GgufError>(())
/// ```
///
/// # Errors
/// [`GgufError::NotConvertible`] for another type, [`GgufError::BadShape`] when `data` is
/// not a whole number of blocks, [`GgufError::AllocationFailed`] when the values do not fit
/// in memory.
pub fn dequantize(tensor: &str, ty: GgmlType, data: &[u8]) -> Result<Vec<f32>, GgufError> {
    let not_convertible = || GgufError::NotConvertible {
        tensor: String::from(tensor),
        ggml_type: ty.name(),
    };
    let convertible = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    if !convertible.contains(&ty) {
        return Err(not_convertible());
    }
    if !data.len().is_multiple_of(ty.block_bytes()) {
        return Err(GgufError::BadShape {
            tensor: String::from(tensor),
            reason: alloc::format!(
                "{} bytes are not a whole number of {} blocks of {} bytes",
                data.len(),
                ty.name(),
                ty.block_bytes()
            ),
        });
    }
    let len = data.len() / ty.block_bytes() * ty.block_len();
    let mut out = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|_| GgufError::AllocationFailed {
            bytes: len.saturating_mul(size_of::<f32>()),
        })?;
    widen(ty, data, &mut out);
    Ok(out)
}

/// Appends the values of `data` (whole blocks of `ty`, one of the types
/// [`dequantize`] converts) to `out`.
fn widen(ty: GgmlType, data: &[u8], out: &mut Vec<f32>) {
    let halves = |widen: fn(u16) -> f32| {
        let chunks = data.as_chunks::<2>().0;
        chunks.iter().map(move |&h| widen(u16::from_le_bytes(h)))
    };
    match ty {
        GgmlType::F32 => out.extend(
            data.as_chunks::<4>()
                .0
                .iter()
                .map(|&b| f32::from_le_bytes(b)),
        ),
        GgmlType::F16 => out.extend(halves(f16_to_f32)),
        GgmlType::BF16 => out.extend(halves(bf16_to_f32)),
        GgmlType::Q4_1 => each(data, out, q4_1),
        GgmlType::Q5_0 => each(data, out, q5_0),
        GgmlType::Q5_1 => each(data, out, q5_1),
        GgmlType::Q8_0 => dequantize_blocks(Quant::Q8_0, data, out),
        GgmlType::Q4_0 => dequantize_blocks(Quant::Q4_0, data, out),
        GgmlType::Q4_K => dequantize_blocks(Quant::Q4K, data, out),
        GgmlType::Q5_K => dequantize_blocks(Quant::Q5K, data, out),
        _ => dequantize_blocks(Quant::Q6K, data, out),
    }
}
