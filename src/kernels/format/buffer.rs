//! [`Elements`]: a buffer of stored elements in one [`Element`] format (with its `q8_0`
//! scales), as a key/value store's side and a packed matrix keep them; [`ElementsMut`]: a
//! part of one to write, rounding `f32` values into it.

use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::buffer::try_grow;
use crate::kernels::format::element::{
    bf16_from_f32, bf16_to_f32, f16_from_f32, f16_to_f32, q8_from_f32, q8_scale, q8_to_f32,
    Element, Q8_BLOCK,
};
use crate::kernels::format::{Q8Scales, Slices, Stored};

/// Stored elements of one format; where each one sits is its owner's layout.
#[derive(Clone)]
pub(crate) enum Elements {
    /// [`Element::F32`] values.
    F32(Vec<f32>),
    /// [`Element::Bf16`] bits.
    Bf16(Vec<u16>),
    /// [`Element::F16`] bits.
    F16(Vec<u16>),
    /// [`Element::Q8_0`] integers and the scales of their blocks.
    Q8_0 { values: Vec<i8>, scales: Vec<f32> },
}

impl Default for Elements {
    fn default() -> Self {
        Elements::F32(Vec::new())
    }
}

/// A part of an [`Elements`] buffer, to write.
pub(crate) enum ElementsMut<'a> {
    /// [`Element::F32`] values.
    F32(&'a mut [f32]),
    /// [`Element::Bf16`] bits.
    Bf16(&'a mut [u16]),
    /// [`Element::F16`] bits.
    F16(&'a mut [u16]),
    /// [`Element::Q8_0`] integers and scales.
    Q8_0 {
        values: &'a mut [i8],
        scales: &'a mut [f32],
    },
}

/// Where a matrix lies in an [`Elements`] buffer: `rows × cols` elements from `start`, rows
/// `stride` apart, and (in [`Element::Q8_0`]) its scales, as [`Q8Scales`] addresses them from
/// `scale_start`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place {
    pub start: usize,
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
    pub scale_start: usize,
    /// Blocks along the rows (`true`, [`Q8Scales::Rows`]) or down the columns.
    pub scale_rows: bool,
    pub scale_stride: usize,
}

impl Elements {
    /// Its format.
    pub(crate) fn element(&self) -> Element {
        match self {
            Elements::F32(_) => Element::F32,
            Elements::Bf16(_) => Element::Bf16,
            Elements::F16(_) => Element::F16,
            Elements::Q8_0 { .. } => Element::Q8_0,
        }
    }

    /// Makes it `element` with room for `elements` elements and `scales` scales, growing
    /// (never shrinking) its buffers; a buffer of another format is replaced.
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] or [`ShapeError::AllocationFailed`] (naming `what`).
    pub(crate) fn reset(
        &mut self,
        element: Element,
        [elements, scales]: [usize; 2],
        what: &'static str,
    ) -> Result<(), ShapeError> {
        if self.element() != element {
            *self = match element {
                Element::F32 => Elements::F32(Vec::new()),
                Element::Bf16 => Elements::Bf16(Vec::new()),
                Element::F16 => Elements::F16(Vec::new()),
                Element::Q8_0 => Elements::Q8_0 {
                    values: Vec::new(),
                    scales: Vec::new(),
                },
            };
        }
        match self {
            Elements::F32(v) => try_grow(v, elements, 0.0, what),
            Elements::Bf16(v) | Elements::F16(v) => try_grow(v, elements, 0, what),
            Elements::Q8_0 { values, scales: s } => {
                try_grow(values, elements, 0, what).and_then(|()| try_grow(s, scales, 0.0, what))
            }
        }
    }

    /// The bytes of its buffers (their lengths, not their spare capacity).
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Elements::F32(v) => v.len() * size_of::<f32>(),
            Elements::Bf16(v) | Elements::F16(v) => v.len() * size_of::<u16>(),
            Elements::Q8_0 { values, scales } => values.len() + scales.len() * size_of::<f32>(),
        }
    }

    /// The number of elements (scales not counted).
    pub(crate) fn len(&self) -> usize {
        match self {
            Elements::F32(v) => v.len(),
            Elements::Bf16(v) | Elements::F16(v) => v.len(),
            Elements::Q8_0 { values, .. } => values.len(),
        }
    }

    /// The `f32` buffer, in [`Element::F32`].
    pub(crate) fn floats_mut(&mut self) -> Option<&mut Vec<f32>> {
        match self {
            Elements::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The parts `parts` (ascending, distinct) of `len` elements and `scales` scales each,
    /// part `i` from element `i · len` and scale `i · scales` on, to write (one work item
    /// each).
    ///
    /// # Panics
    /// When a part is not ascending or not inside the buffer.
    pub(crate) fn parts_at_mut(
        &mut self,
        parts: impl Iterator<Item = usize> + Clone + Send,
        [len, scales]: [usize; 2],
    ) -> impl Iterator<Item = ElementsMut<'_>> + Send {
        // One iterator per format, all but this one's empty.
        let (mut f32s, mut bf16s, mut f16s, mut q8s) = (None, None, None, None);
        match self {
            Elements::F32(v) => f32s = Some(carve(v, len, parts).map(ElementsMut::F32)),
            Elements::Bf16(v) => bf16s = Some(carve(v, len, parts).map(ElementsMut::Bf16)),
            Elements::F16(v) => f16s = Some(carve(v, len, parts).map(ElementsMut::F16)),
            Elements::Q8_0 { values, scales: s } => {
                let both = carve(values, len, parts.clone()).zip(carve(s, scales, parts));
                q8s = Some(both.map(|(values, scales)| ElementsMut::Q8_0 { values, scales }));
            }
        }
        let chained = f32s
            .into_iter()
            .flatten()
            .chain(bf16s.into_iter().flatten());
        let chained = chained.chain(f16s.into_iter().flatten());
        chained.chain(q8s.into_iter().flatten())
    }

    /// Copies parts `from .. from + count` onto parts `to ..` (parts of `len` elements and
    /// `scales` scales, as [`Elements::parts_at_mut`]).
    ///
    /// # Panics
    /// When a part is outside the buffer.
    pub(crate) fn copy_parts(
        &mut self,
        (from, to, count): (usize, usize, usize),
        [len, scales]: [usize; 2],
    ) {
        fn copy<T: Copy>(v: &mut [T], len: usize, (from, to, count): (usize, usize, usize)) {
            v.copy_within(from * len..(from + count) * len, to * len);
        }
        let parts = (from, to, count);
        match self {
            Elements::F32(v) => copy(v, len, parts),
            Elements::Bf16(v) | Elements::F16(v) => copy(v, len, parts),
            Elements::Q8_0 { values, scales: s } => {
                copy(values, len, parts);
                copy(s, scales, parts);
            }
        }
    }

    /// The matrix at `place`, to read.
    ///
    /// # Panics
    /// When it does not lie inside the buffer (its scales may: the kernels check them).
    pub(crate) fn matrix(&self, place: Place) -> Stored<'_> {
        let len = match place.rows {
            0 => 0,
            rows => (rows - 1) * place.stride + place.cols,
        };
        let start = place.start;
        let slices = match self {
            Elements::F32(v) => Slices::F32(&v[start..][..len]),
            Elements::Bf16(v) => Slices::Bf16(&v[start..][..len]),
            Elements::F16(v) => Slices::F16(&v[start..][..len]),
            Elements::Q8_0 { values, scales } => {
                let (scales, stride) = (&scales[place.scale_start..], place.scale_stride);
                Slices::Q8_0 {
                    values: &values[start..][..len],
                    scales: match place.scale_rows {
                        true => Q8Scales::Rows { scales, stride },
                        false => Q8Scales::Columns { scales, stride },
                    },
                }
            }
        };
        Stored::rows(slices, place.stride)
    }

    /// Element `index` widened to `f32` (in [`Element::Q8_0`] with the scale at
    /// `scale_index`).
    ///
    /// # Panics
    /// When either is outside the buffer.
    pub(crate) fn widened(&self, index: usize, scale_index: usize) -> f32 {
        match self {
            Elements::F32(v) => v[index],
            Elements::Bf16(v) => bf16_to_f32(v[index]),
            Elements::F16(v) => f16_to_f32(v[index]),
            Elements::Q8_0 { values, scales } => q8_to_f32(values[index], scales[scale_index]),
        }
    }
}

impl ElementsMut<'_> {
    /// Rounds `src` into elements `at + i · step` (`i < src.len()`); in [`Element::Q8_0`]
    /// block `g` of `src` (values `g · Q8_BLOCK ..`) gets its scale at
    /// `scale_at + g · scale_step`.
    ///
    /// # Panics
    /// When an element or scale is outside the part.
    pub(crate) fn write(
        &mut self,
        src: &[f32],
        (at, step): (usize, usize),
        (scale_at, scale_step): (usize, usize),
    ) {
        match self {
            ElementsMut::F32(dst) => round_into(dst, src, (at, step), |x| x),
            ElementsMut::Bf16(dst) => round_into(dst, src, (at, step), bf16_from_f32),
            ElementsMut::F16(dst) => round_into(dst, src, (at, step), f16_from_f32),
            ElementsMut::Q8_0 { values, scales } => {
                for (g, block) in src.chunks(Q8_BLOCK).enumerate() {
                    let scale = q8_scale(block);
                    scales[scale_at + g * scale_step] = scale;
                    let at = at + g * Q8_BLOCK * step;
                    round_into(values, block, (at, step), |x| q8_from_f32(x, scale));
                }
            }
        }
    }
}

/// The parts `parts` (ascending, distinct) of `len` values each of `rest`, part `i` from
/// value `i · len` on.
fn carve<T: Send>(
    mut rest: &mut [T],
    len: usize,
    parts: impl Iterator<Item = usize> + Send,
) -> impl Iterator<Item = &mut [T]> + Send {
    let mut at = 0;
    parts.map(move |part| {
        let tail = core::mem::take(&mut rest).split_at_mut(part * len - at).1;
        let (mine, tail) = tail.split_at_mut(len);
        (rest, at) = (tail, (part + 1) * len);
        mine
    })
}

/// `dst[at + i · step] = round(src[i])` for every `i`.
fn round_into<T>(dst: &mut [T], src: &[f32], (at, step): (usize, usize), round: impl Fn(f32) -> T) {
    for (i, &x) in src.iter().enumerate() {
        dst[at + i * step] = round(x);
    }
}
