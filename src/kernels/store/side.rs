//! Where one side of a key/value store, its keys or its values, keeps a head's elements in
//! the side's [`Elements`] (in its [`KvFormat`](crate::KvFormat)): the blocks the attention
//! reads (as [`Stored`] matrices) and the rounding writes of new tokens.
//!
//! A store's heads are `head_len` elements apart and, in [`Element::Q8_0`], `head_scales`
//! scales apart (see [`HeadSizes`]). Within a head the elements are where `kv.rs` puts the
//! `f32` ones: keys in `d × BLOCK_K` panels (feature `p` of the key in slot `t` at
//! [`key_panel_index`]`(d, p, t)`), values as rows of `d` (unpadded: the widened rows get
//! the padding). The `q8_0` scales of a head:
//! - keys: per panel, one row of [`BLOCK_K`] scales for each of the `⌈d / 32⌉` feature
//!   blocks, the scale of block `g` of the key in slot `t` at
//!   `(t / BLOCK_K) · ⌈d / 32⌉ · BLOCK_K + g · BLOCK_K + t % BLOCK_K`;
//! - values: `⌈d / 32⌉` per row, block `g` of slot `t` at `t · ⌈d / 32⌉ + g`.

use crate::kernels::format::element::{Element, Q8_BLOCK};
use crate::kernels::format::{Elements, ElementsMut, Place, Stored};
use crate::kernels::store::layout::{key_panel_index, BLOCK_K};

/// The sizes of one head of a side: `elements` values and, in [`Element::Q8_0`], `scales`
/// scales.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HeadSizes {
    pub elements: usize,
    pub scales: usize,
}

/// One head of a side: its index, the side's [`HeadSizes`] and the head width `d`.
pub(crate) type Head = (usize, HeadSizes, usize);

/// The blocks of [`Element::Q8_0`] in a head of width `d`.
pub(crate) fn q8_blocks(d: usize) -> usize {
    d.div_ceil(Q8_BLOCK)
}

/// Where the scales of the key in slot `slot` start (its block `g` is `g · BLOCK_K` on).
fn key_scales(d: usize, slot: usize) -> usize {
    slot / BLOCK_K * q8_blocks(d) * BLOCK_K + slot % BLOCK_K
}

/// The key panel (`d × BLOCK_K`) of head `head` holding slot `slot` (a multiple of
/// [`BLOCK_K`]).
pub(crate) fn key_panel(keys: &Elements, (head, sizes, d): Head, slot: usize) -> Stored<'_> {
    keys.matrix(Place {
        start: head * sizes.elements + key_panel_index(d, 0, slot),
        rows: d,
        cols: BLOCK_K,
        stride: BLOCK_K,
        scale_start: head * sizes.scales + key_scales(d, slot),
        scale_rows: false,
        scale_stride: BLOCK_K,
    })
}

/// Value rows `slot .. slot + len` of head `head` (rows of `f32_stride` floats in
/// [`Element::F32`], of `d` elements in the others).
pub(crate) fn value_rows(
    values: &Elements,
    (head, sizes, d): Head,
    (slot, len, f32_stride): (usize, usize, usize),
) -> Stored<'_> {
    let stride = match values.element() {
        Element::F32 => f32_stride,
        _ => d,
    };
    let blocks = q8_blocks(d);
    values.matrix(Place {
        start: head * sizes.elements + slot * stride,
        rows: len,
        cols: stride,
        stride,
        scale_start: head * sizes.scales + slot * blocks,
        scale_rows: true,
        scale_stride: blocks,
    })
}

/// Feature `p` of the key in slot `slot` of head `head`, widened.
pub(crate) fn key(keys: &Elements, (head, sizes, d): Head, p: usize, slot: usize) -> f32 {
    let index = head * sizes.elements + key_panel_index(d, p, slot);
    let scale = head * sizes.scales + key_scales(d, slot) + p / Q8_BLOCK * BLOCK_K;
    keys.widened(index, scale)
}

/// The key `key` (its `d` features) rounded into slot `slot` of a head's panels.
pub(crate) fn write_key(head: &mut ElementsMut<'_>, key: &[f32], slot: usize) {
    let d = key.len();
    let at = (key_panel_index(d, 0, slot), BLOCK_K);
    head.write(key, at, (key_scales(d, slot), BLOCK_K));
}

/// The value row `value` (its `d` values) rounded into slot `slot` of a head's rows of
/// `stride` elements (`d` but in [`Element::F32`]; the rest of the row is left as it is).
pub(crate) fn write_value(head: &mut ElementsMut<'_>, value: &[f32], slot: usize, stride: usize) {
    let blocks = q8_blocks(value.len());
    head.write(value, (slot * stride, 1), (slot * blocks, 1));
}
