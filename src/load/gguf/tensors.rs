//! Tensor infos: each tensor's name, dimensions, ggml type and offset, and the byte range
//! those give it in the data section, every product and sum checked.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::error::GgufError;
use super::header::{read_vec, Reader};

type Result<T> = core::result::Result<T, GgufError>;

/// The most dimensions a ggml tensor has.
pub const MAX_DIMS: usize = 4;

/// A ggml tensor type: how many values a block holds and how many bytes it takes.
///
/// ```
/// use mha::gguf::GgmlType;
/// let q4_k = GgmlType::from_id(12).unwrap();
/// assert_eq!((q4_k.name(), q4_k.block_len(), q4_k.block_bytes()), ("Q4_K", 256, 144));
/// assert_eq!(q4_k.row_bytes(512), Some(288));
/// assert_eq!(q4_k.row_bytes(100), None); // not a whole number of blocks
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType {
    id: u32,
    name: &'static str,
    block_len: u32,
    block_bytes: u32,
}

/// `(id, name, values per block, bytes per block)` of every ggml type files hold (ggml's
/// `type_traits`; the ids ggml retired are absent).
const TYPES: [(u32, &str, u32, u32); 31] = [
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

impl GgmlType {
    /// `F32`.
    pub const F32: GgmlType = GgmlType::at(0);
    /// `F16`.
    pub const F16: GgmlType = GgmlType::at(1);
    /// `Q4_0`: 32 values in 18 bytes (an f16 scale, 16 bytes of 4-bit values).
    pub const Q4_0: GgmlType = GgmlType::at(2);
    /// `Q4_1`: 32 values in 20 bytes (f16 scale and minimum, 4-bit values).
    pub const Q4_1: GgmlType = GgmlType::at(3);
    /// `Q5_0`: 32 values in 22 bytes (f16 scale, 32 high bits, 4-bit low parts).
    pub const Q5_0: GgmlType = GgmlType::at(4);
    /// `Q5_1`: 32 values in 24 bytes (f16 scale and minimum, high bits, low parts).
    pub const Q5_1: GgmlType = GgmlType::at(5);
    /// `Q8_0`: 32 values in 34 bytes (an f16 scale, 32 `i8`).
    pub const Q8_0: GgmlType = GgmlType::at(6);
    /// `Q4_K`: 256 values in 144 bytes (f16 scale and minimum, 6-bit sub-block scales and
    /// minimums, 4-bit values).
    pub const Q4_K: GgmlType = GgmlType::at(9);
    /// `Q5_K`: 256 values in 176 bytes (as `Q4_K`, plus one high bit per value).
    pub const Q5_K: GgmlType = GgmlType::at(10);
    /// `Q6_K`: 256 values in 210 bytes (4-bit low and 2-bit high parts, 16 `i8` scales, an
    /// f16 scale).
    pub const Q6_K: GgmlType = GgmlType::at(11);
    /// `BF16`.
    pub const BF16: GgmlType = GgmlType::at(27);

    /// The type at index `i` of the table.
    const fn at(i: usize) -> Self {
        let (id, name, block_len, block_bytes) = TYPES[i];
        GgmlType {
            id,
            name,
            block_len,
            block_bytes,
        }
    }

    /// The type of ggml type id `id`, if it is one files hold.
    pub fn from_id(id: u32) -> Option<Self> {
        let i = TYPES.iter().position(|t| t.0 == id)?;
        Some(Self::at(i))
    }

    /// The ggml type id (`GGML_TYPE_*`).
    pub fn id(self) -> u32 {
        self.id
    }

    /// The name, as ggml spells it (`Q4_K`, `BF16`).
    pub fn name(self) -> &'static str {
        self.name
    }

    /// The values per block (1 for the plain types).
    pub fn block_len(self) -> usize {
        self.block_len as usize
    }

    /// The bytes per block.
    pub fn block_bytes(self) -> usize {
        self.block_bytes as usize
    }

    /// The bytes of a row of `len` values: `None` when `len` is not a whole number of blocks
    /// (or the bytes pass `u64`).
    pub fn row_bytes(self, len: u64) -> Option<u64> {
        let block_len = u64::from(self.block_len);
        if !len.is_multiple_of(block_len) {
            return None;
        }
        (len / block_len).checked_mul(u64::from(self.block_bytes))
    }
}

/// One tensor of a GGUF file, as its info in the header describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// The dimensions in ggml's order: `dims[0]` is the row length (contiguous), so a
    /// PyTorch `(out, in)` weight is `[in, out]`.
    pub dims: Vec<u64>,
    /// The type.
    pub ggml_type: GgmlType,
    /// The offset of its bytes from the start of the data section (a multiple of the
    /// alignment).
    pub offset: u64,
    /// Its byte size: the rows' bytes (`dims[0]` values each) times the other dimensions.
    pub bytes: u64,
}

impl TensorInfo {
    /// The shape in row-major order, as PyTorch and numpy give it (`dims` reversed).
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// The number of values.
    pub fn len(&self) -> u64 {
        // Checked to fit when read from a file; saturating for an info built otherwise.
        self.dims.iter().fold(1, |n, &d| n.saturating_mul(d))
    }

    /// Whether the tensor has no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reads `count` tensor infos, checking each shape against its type.
pub(super) fn read_infos(r: &mut Reader<'_>, count: usize) -> Result<Vec<TensorInfo>> {
    read_vec(count, || read_info(r))
}

/// One tensor info: name, dimension count, dimensions, type, offset.
fn read_info(r: &mut Reader<'_>) -> Result<TensorInfo> {
    let name = r.string("a tensor name")?;
    let n_dims = r.u32("a tensor's dimension count")?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::BadShape {
            tensor: name,
            reason: format!("{n_dims} dimensions, more than ggml's {MAX_DIMS}"),
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(r.u64("a tensor dimension")?);
    }
    let type_id = r.u32("a tensor's type")?;
    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownType {
            tensor: name,
            type_id,
        });
    };
    let offset = r.u64("a tensor's offset")?;
    let bytes = tensor_bytes(&name, &dims, ggml_type)?;
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        bytes,
    })
}

/// The byte size of a tensor of `dims` of `ty`: whole blocks per row, every product checked.
fn tensor_bytes(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64> {
    let bad = |reason: String| GgufError::BadShape {
        tensor: String::from(name),
        reason,
    };
    let row = dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(ty.block_len() as u64) {
        return Err(bad(format!(
            "a row of {row} values is not a whole number of {} blocks of {} values",
            ty.name(),
            ty.block_len()
        )));
    }
    let values = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    let rows = dims.iter().skip(1).try_fold(1u64, |n, &d| n.checked_mul(d));
    let bytes = ty
        .row_bytes(row)
        .zip(rows)
        .and_then(|(r, n)| r.checked_mul(n));
    match (values, bytes) {
        (Some(_), Some(bytes)) => Ok(bytes),
        _ => Err(bad(format!("the dimensions {dims:?} overflow u64"))),
    }
}

#[cfg(test)]
mod tests {
    use super::GgmlType;

    /// The named constants are the types of their ggml ids.
    #[test]
    fn constants_have_their_ids() {
        let named = [
            (GgmlType::F32, 0, "F32"),
            (GgmlType::F16, 1, "F16"),
            (GgmlType::Q4_0, 2, "Q4_0"),
            (GgmlType::Q4_1, 3, "Q4_1"),
            (GgmlType::Q5_0, 6, "Q5_0"),
            (GgmlType::Q5_1, 7, "Q5_1"),
            (GgmlType::Q8_0, 8, "Q8_0"),
            (GgmlType::Q4_K, 12, "Q4_K"),
            (GgmlType::Q5_K, 13, "Q5_K"),
            (GgmlType::Q6_K, 14, "Q6_K"),
            (GgmlType::BF16, 30, "BF16"),
        ];
        for (ty, id, name) in named {
            assert_eq!((ty.id(), ty.name()), (id, name));
            assert_eq!(GgmlType::from_id(id), Some(ty));
        }
        assert_eq!(GgmlType::from_id(4), None); // retired by ggml
    }
}
