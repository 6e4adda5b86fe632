//! One side of a key/value store, its keys or its values, in the side's [`KvFormat`]: the
//! buffers, the rounding writes of new tokens in the 16- and 8-bit formats, and the blocks the
//! attention reads ([`BlockData`]: `f32` in place, or the stored elements to widen). (The
//! `f32` format's writes are `kv.rs`'s own: the transpose kernel.)
//!
//! A store's heads are `head_len` elements apart and, in [`KvFormat::Q8_0`], `head_scales`
//! scales apart (see [`HeadSizes`]). Within a head the elements are where `kv.rs` puts the
//! `f32` ones: keys in `d × BLOCK_K` panels (feature `p` of the key in slot `t` at
//! [`key_panel_index`]`(d, p, t)`), values as rows of `d` (unpadded: the widened rows get
//! the padding). The `q8_0` scales of a head:
//! - keys: per panel, one row of [`BLOCK_K`] scales for each of the `⌈d / 32⌉` feature
//!   blocks, the scale of block `g` of the key in slot `t` at
//!   `(t / BLOCK_K) · ⌈d / 32⌉ · BLOCK_K + g · BLOCK_K + t % BLOCK_K`;
//! - values: `⌈d / 32⌉` per row, block `g` of slot `t` at `t · ⌈d / 32⌉ + g`.

use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::buffer::try_grow;
use crate::kernels::store::layout::key_panel_index;
use crate::kernels::store::layout::BLOCK_K;
use crate::kernels::store::narrow::{
    bf16_from_f32, bf16_to_f32, f16_from_f32, f16_to_f32, q8_from_f32, q8_scale, q8_to_f32,
    KvFormat, Q8_BLOCK,
};
use crate::kernels::store::widen::{Narrow, Q8Scales};

/// The elements of one side of a store; only the buffers of its format are used.
#[derive(Clone, Default)]
pub(crate) struct Elements {
    /// How the elements are kept.
    pub format: KvFormat,
    /// [`KvFormat::F32`]: the values.
    pub floats: Vec<f32>,
    /// [`KvFormat::Bf16`], [`KvFormat::F16`]: the bits.
    halves: Vec<u16>,
    /// [`KvFormat::Q8_0`]: the integers.
    bytes: Vec<i8>,
    /// [`KvFormat::Q8_0`]: the scales, one per block.
    scales: Vec<f32>,
}

/// The sizes of one head of a side: `elements` values and, in [`KvFormat::Q8_0`], `scales`
/// scales.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HeadSizes {
    pub elements: usize,
    pub scales: usize,
}

/// One head of a side, to write.
pub(crate) enum HeadMut<'a> {
    /// [`KvFormat::F32`] values.
    F32(&'a mut [f32]),
    /// The elements of a 16- or 8-bit format.
    Narrow(NarrowMut<'a>),
}

/// One head of a side in a 16- or 8-bit format, to write.
pub(crate) enum NarrowMut<'a> {
    /// bfloat16 (`bf16` true) or binary16 bits.
    Half { bits: &'a mut [u16], bf16: bool },
    /// `q8_0` integers and scales.
    Q8 {
        values: &'a mut [i8],
        scales: &'a mut [f32],
    },
}

/// The blocks of [`KvFormat::Q8_0`] in a head of width `d`.
pub(crate) fn q8_blocks(d: usize) -> usize {
    d.div_ceil(Q8_BLOCK)
}

impl Elements {
    /// Makes the side `format` with room for `heads` heads of `sizes`, growing (never
    /// shrinking) that format's buffers.
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] or [`ShapeError::AllocationFailed`] (naming `what`).
    pub(crate) fn reset(
        &mut self,
        format: KvFormat,
        [elements, scales]: [usize; 2],
        what: &'static str,
    ) -> Result<(), ShapeError> {
        self.format = format;
        match format {
            KvFormat::F32 => try_grow(&mut self.floats, elements, 0.0, what),
            KvFormat::Bf16 | KvFormat::F16 => try_grow(&mut self.halves, elements, 0, what),
            KvFormat::Q8_0 => try_grow(&mut self.bytes, elements, 0, what)
                .and_then(|()| try_grow(&mut self.scales, scales, 0.0, what)),
        }
    }

    /// The bytes of the format's buffers (their lengths, not their spare capacity).
    pub(crate) fn bytes(&self) -> usize {
        match self.format {
            KvFormat::F32 => self.floats.len() * size_of::<f32>(),
            KvFormat::Bf16 | KvFormat::F16 => self.halves.len() * size_of::<u16>(),
            KvFormat::Q8_0 => self.bytes.len() + self.scales.len() * size_of::<f32>(),
        }
    }

    /// The first `count` heads of `sizes`, each once, to write (one work item each).
    pub(crate) fn heads_mut(
        &mut self,
        count: usize,
        sizes: HeadSizes,
    ) -> impl Iterator<Item = HeadMut<'_>> + Send {
        let format = self.format;
        let count_if = |on: bool| if on { count } else { 0 };
        let (len, scales_len) = (sizes.elements.max(1), sizes.scales.max(1));
        let floats = self
            .floats
            .chunks_mut(len)
            .take(count_if(format == KvFormat::F32));
        let half = matches!(format, KvFormat::Bf16 | KvFormat::F16);
        let halves = self.halves.chunks_mut(len).take(count_if(half));
        let q8 = (self.bytes.chunks_mut(len))
            .zip(self.scales.chunks_mut(scales_len))
            .take(count_if(format == KvFormat::Q8_0));
        let bf16 = format == KvFormat::Bf16;
        floats.map(HeadMut::F32).chain(
            (halves.map(move |bits| NarrowMut::Half { bits, bf16 }))
                .chain(q8.map(|(values, scales)| NarrowMut::Q8 { values, scales }))
                .map(HeadMut::Narrow),
        )
    }

    /// The `rows × cols` matrix of head `head` from element `view.start` (row stride
    /// `view.stride`; `q8_0` scales as `view` says): `f32` values in place, or the stored
    /// elements.
    fn block(&self, head: usize, sizes: HeadSizes, view: View) -> BlockData<'_> {
        let start = head * sizes.elements + view.start;
        let len = match view.rows {
            0 => 0,
            rows => (rows - 1) * view.stride + view.cols,
        };
        let half = || &self.halves[start..][..len];
        let stride = view.stride;
        BlockData::Stored(match self.format {
            KvFormat::F32 => return BlockData::F32(&self.floats[start..][..len]),
            KvFormat::Bf16 => Narrow::Bf16 {
                bits: half(),
                stride,
            },
            KvFormat::F16 => Narrow::F16 {
                bits: half(),
                stride,
            },
            KvFormat::Q8_0 => {
                let scales = &self.scales[head * sizes.scales + view.scale_start..];
                let scale_stride = view.scale_stride;
                Narrow::Q8 {
                    values: &self.bytes[start..][..len],
                    stride,
                    scales: match view.scale_rows {
                        true => Q8Scales::Rows {
                            scales,
                            stride: scale_stride,
                        },
                        false => Q8Scales::Columns {
                            scales,
                            stride: scale_stride,
                        },
                    },
                }
            }
        })
    }

    /// The key panel (`d × BLOCK_K`) of head `head` holding slot `slot` (a multiple of
    /// [`BLOCK_K`]).
    pub(crate) fn key_panel(
        &self,
        (head, sizes, d): (usize, HeadSizes, usize),
        slot: usize,
    ) -> BlockData<'_> {
        let view = View {
            start: key_panel_index(d, 0, slot),
            rows: d,
            cols: BLOCK_K,
            stride: BLOCK_K,
            scale_start: slot / BLOCK_K * q8_blocks(d) * BLOCK_K,
            scale_rows: false,
            scale_stride: BLOCK_K,
        };
        self.block(head, sizes, view)
    }

    /// Value rows `slot .. slot + len` of head `head` (rows of `f32_stride` floats in
    /// [`KvFormat::F32`], of `d` elements in the others).
    pub(crate) fn value_rows(
        &self,
        (head, sizes, d): (usize, HeadSizes, usize),
        (slot, len, f32_stride): (usize, usize, usize),
    ) -> BlockData<'_> {
        let stride = if self.format == KvFormat::F32 {
            f32_stride
        } else {
            d
        };
        let blocks = q8_blocks(d);
        let view = View {
            start: slot * stride,
            rows: len,
            cols: stride,
            stride,
            scale_start: slot * blocks,
            scale_rows: true,
            scale_stride: blocks,
        };
        self.block(head, sizes, view)
    }

    /// Feature `p` of the key in slot `slot` of head `head`, widened.
    pub(crate) fn key(
        &self,
        (head, sizes, d): (usize, HeadSizes, usize),
        p: usize,
        slot: usize,
    ) -> f32 {
        let index = head * sizes.elements + key_panel_index(d, p, slot);
        match self.format {
            KvFormat::F32 => self.floats[index],
            KvFormat::Bf16 => bf16_to_f32(self.halves[index]),
            KvFormat::F16 => f16_to_f32(self.halves[index]),
            KvFormat::Q8_0 => {
                let blocks = q8_blocks(d);
                let g = p / Q8_BLOCK;
                let scale = slot / BLOCK_K * blocks * BLOCK_K + g * BLOCK_K + slot % BLOCK_K;
                q8_to_f32(self.bytes[index], self.scales[head * sizes.scales + scale])
            }
        }
    }
}

/// A block of keys or values as the store holds them.
#[derive(Clone, Copy, Debug)]
pub(crate) enum BlockData<'a> {
    /// [`KvFormat::F32`]: the values, in place.
    F32(&'a [f32]),
    /// A 16- or 8-bit format: the elements, to widen.
    Stored(Narrow<'a>),
}

/// A part of a head (see [`Elements::block`]).
#[derive(Clone, Copy)]
struct View {
    start: usize,
    rows: usize,
    cols: usize,
    stride: usize,
    scale_start: usize,
    /// Scales along the rows (values) rather than down the columns (keys).
    scale_rows: bool,
    scale_stride: usize,
}

/// The writes of new tokens in the 16- and 8-bit formats, one token at a time.
impl NarrowMut<'_> {
    /// The key `key` (its `d` features) rounded into slot `slot` of the head's panels.
    pub(crate) fn write_key(&mut self, key: &[f32], slot: usize) {
        let d = key.len();
        match self {
            NarrowMut::Half { bits, bf16 } => {
                let round = if *bf16 { bf16_from_f32 } else { f16_from_f32 };
                for (p, &x) in key.iter().enumerate() {
                    bits[key_panel_index(d, p, slot)] = round(x);
                }
            }
            NarrowMut::Q8 { values, scales } => {
                let panel_scales = slot / BLOCK_K * q8_blocks(d) * BLOCK_K + slot % BLOCK_K;
                for (g, block) in key.chunks(Q8_BLOCK).enumerate() {
                    let scale = q8_scale(block);
                    scales[panel_scales + g * BLOCK_K] = scale;
                    for (i, &x) in block.iter().enumerate() {
                        values[key_panel_index(d, g * Q8_BLOCK + i, slot)] = q8_from_f32(x, scale);
                    }
                }
            }
        }
    }

    /// The value row `value` (its `d` values) rounded into slot `slot`.
    pub(crate) fn write_value(&mut self, value: &[f32], slot: usize) {
        let d = value.len();
        match self {
            NarrowMut::Half { bits, bf16 } => {
                let round = if *bf16 { bf16_from_f32 } else { f16_from_f32 };
                for (stored, &x) in bits[slot * d..][..d].iter_mut().zip(value) {
                    *stored = round(x);
                }
            }
            NarrowMut::Q8 { values, scales } => {
                let blocks = q8_blocks(d);
                let row = &mut values[slot * d..][..d];
                let row_blocks = row.chunks_mut(Q8_BLOCK).zip(value.chunks(Q8_BLOCK));
                for (g, (stored, block)) in row_blocks.enumerate() {
                    let scale = q8_scale(block);
                    scales[slot * blocks + g] = scale;
                    for (q, &x) in stored.iter_mut().zip(block) {
                        *q = q8_from_f32(x, scale);
                    }
                }
            }
        }
    }
}
