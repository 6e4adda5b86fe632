//! What the attention reads from a store, whichever kind: [`KvView`], the store's two sides
//! (keys as `d × BLOCK_K` `Kᵀ` panels, values as rows, in their formats: `side.rs`; or keys
//! alone, whose columns `from ..` are the values: [`ValueLayout::InKeys`]) and where
//! key block `n` of batch element `b` lives ([`Blocks`]). The attention walks each element's
//! key blocks in order and asks [`KvView::locate`] for each; a contiguous store
//! ([`KvStore`](super::kv::KvStore), the [`KvCache`](crate::KvCache)'s and a forward
//! pass's) answers by arithmetic, a paged store (`paged.rs`) through the element's block
//! table. Both hand the same `side.rs` addressing a *part* (a run of slots of one key/value
//! head) and a slot in it, so the attention computes the same bits over either.
//!
//! The values of a block in [`ValueLayout::InKeys`] are rows `from .. d` of its key panel:
//! [`KvView::value_rows`] transposes them (from the `f32` panel, widened exactly when stored in
//! 16 or 8 bits) into value rows, the same `f32` values a value side in the keys' format would
//! hold, so the attention's arithmetic on them is the arithmetic on stored value rows;
//! [`KvView::value_slice`] transposes some of those columns only.

use core::ops::Range;

use crate::kernels::format::{Elements, Stored};
use crate::kernels::store::layout::BLOCK_K;
use crate::kernels::store::layout::{value_stride, KvFormats, ValueLayout};
use crate::kernels::store::side::{self, HeadSizes};
use crate::kernels::Kernels;

/// A store as the attention reads it.
#[derive(Clone, Copy)]
pub(crate) struct KvView<'a> {
    /// Keys and values, each side's parts `head_sizes[side]` apart.
    pub(crate) sides: [&'a Elements; 2],
    pub(crate) head_sizes: [HeadSizes; 2],
    /// Key/value heads per batch element.
    pub n_kv_heads: usize,
    /// Width of one key head `d`.
    pub head_dim: usize,
    /// Where the values are (their width: [`KvView::value_dim`]).
    pub values: ValueLayout,
    /// How the keys and values are kept.
    pub formats: KvFormats,
    /// Tokens held per batch element of the call (absolute positions).
    pub lengths: &'a [usize],
    /// The window of a store that keeps only the keys a window still reaches (a rolling
    /// contiguous store, or a paged one whose sequences release old blocks): older keys may
    /// be gone, so nothing may read them.
    pub window: Option<usize>,
    pub(crate) blocks: Blocks<'a>,
}

/// Where each batch element's key blocks live.
#[derive(Clone, Copy)]
pub(crate) enum Blocks<'a> {
    /// Part `b·Hkv + h` holds every slot of element `b`'s head `h`: token `t` in slot `t`,
    /// or `t mod ring` in a rolling store of `ring` slots (a whole number of key blocks).
    Contiguous { ring: Option<usize> },
    /// Element `b` is sequence `ids[b]`, whose key block `n` is physical block
    /// `p = tables[ids[b]][n]`; part `p·Hkv + h` holds that block's [`BLOCK_K`] slots of
    /// head `h`, token `t` in slot `t mod BLOCK_K`.
    Paged {
        tables: &'a [alloc::vec::Vec<u32>],
        ids: &'a [usize],
    },
}

/// Where one key block starts: a part of each side and a slot in it (a multiple of
/// [`BLOCK_K`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockAt {
    pub part: usize,
    pub slot: usize,
}

impl<'a> KvView<'a> {
    /// Where the key block holding token `t` (a multiple of [`BLOCK_K`] for a block's start)
    /// of key/value head `h` of batch element `b` lives, and `t`'s slot there.
    pub(crate) fn locate(&self, b: usize, h: usize, t: usize) -> BlockAt {
        let n_kv_heads = self.n_kv_heads;
        match self.blocks {
            Blocks::Contiguous { ring } => BlockAt {
                part: b * n_kv_heads + h,
                slot: ring.map_or(t, |ring| t % ring),
            },
            Blocks::Paged { tables, ids } => BlockAt {
                part: tables[ids[b]][t / BLOCK_K] as usize * n_kv_heads + h,
                slot: t % BLOCK_K,
            },
        }
    }

    /// The key panel (`d × BLOCK_K`, row-major) of the block at `at`, as stored.
    pub(crate) fn key_data(&self, at: BlockAt) -> Stored<'a> {
        side::key_panel(self.sides[0], self.head(0, at), at.slot)
    }

    /// The width of one value head.
    pub(crate) fn value_dim(&self) -> usize {
        self.values.value_dim(self.head_dim)
    }

    /// The block's first `len` value rows (rows of `dv`), as stored: `None` when the values
    /// are in the keys.
    pub(crate) fn value_data(&self, at: BlockAt, len: usize) -> Option<Stored<'a>> {
        let dv = self.values.stored_dim();
        let rows = || side::value_rows(self.sides[1], self.head(1, at), (at.slot, len, dv));
        self.values.is_rows().then(rows)
    }

    /// [`KvView::key_data`] as `f32`: in place, or widened into `widened` (at least
    /// `d · BLOCK_K` floats).
    pub(crate) fn key_panel<'w>(
        &self,
        kernels: &Kernels,
        at: BlockAt,
        widened: &'w mut [f32],
    ) -> &'w [f32]
    where
        'a: 'w,
    {
        let (d, src) = (self.head_dim, self.key_data(at));
        if let Some(panel) = src.as_f32() {
            return panel;
        }
        let widened = &mut widened[..d * BLOCK_K];
        // SAFETY: a checked kernel table; `src` holds the d × BLOCK_K panel and `widened` as
        // many values.
        unsafe { (kernels.widen)(src, d, BLOCK_K, widened, BLOCK_K) };
        widened
    }

    /// The block's first `len` value rows as `f32` rows of [`value_stride`] floats, zeros
    /// after each row's [`value_dim`](Self::value_dim) values: [`KvView::value_data`] in place
    /// (`f32` rows whose `d` is that stride) or widened (copied) into `widened` (at least `len
    /// · value_stride` floats); in [`ValueLayout::InKeys`], rows `from ..` of `panel` (the
    /// block's key panel as `f32`, [`KvView::key_panel`]) transposed into `widened`.
    pub(crate) fn value_rows<'w>(
        &self,
        kernels: &Kernels,
        (at, len): (BlockAt, usize),
        panel: &'w [f32],
        widened: &'w mut [f32],
    ) -> &'w [f32]
    where
        'a: 'w,
    {
        let (d, stride) = (self.value_dim(), value_stride(kernels, self.value_dim()));
        let src = self.value_data(at, len);
        if let Some(rows) = src.and_then(Stored::as_f32).filter(|_| stride == d) {
            return rows;
        }
        let widened = &mut widened[..len * stride];
        match src {
            // SAFETY: a checked kernel table; `src` holds `len` rows of `d` values and
            // `widened` `len` rows of `stride ≥ d`.
            Some(src) => unsafe { (kernels.widen)(src, len, d, widened, stride) },
            None => {
                self.value_slice(kernels, (panel, len, 0..d), (widened, stride));
            }
        }
        for row in widened.chunks_exact_mut(stride.max(1)) {
            row[d..].fill(0.0);
        }
        widened
    }

    /// In [`ValueLayout::InKeys`], the value columns `cols` of the block's first `len` keys:
    /// rows `from + cols` of `panel` (the block's key panel as `f32`, [`KvView::key_panel`])
    /// transposed into `slice`, `len` rows `stride ≥ cols.len()` apart (the values of those
    /// columns [`KvView::value_rows`] gives; the row path takes a few columns at a time, a
    /// slice small enough to stay in L1 while every head reads it).
    pub(crate) fn value_slice<'w>(
        &self,
        kernels: &Kernels,
        (panel, len, cols): (&[f32], usize, Range<usize>),
        (slice, stride): (&'w mut [f32], usize),
    ) -> &'w [f32] {
        let (from, width) = (self.head_dim - self.value_dim(), cols.len());
        assert!(
            width <= stride,
            "value slice rows narrower than its columns"
        );
        let slice = &mut slice[..len * stride];
        // SAFETY: a checked kernel table; `panel` holds rows `from + cols` of BLOCK_K ≥ len
        // keys, `slice` `len` rows of `stride ≥ width`.
        unsafe {
            (kernels.transpose)(
                &panel[(from + cols.start) * BLOCK_K..],
                BLOCK_K,
                width,
                len,
                slice,
                stride,
                1.0,
            )
        };
        slice
    }

    /// Feature `p` of token `t`'s key in key/value head `h` of batch element `b`, as `f32`.
    pub(crate) fn key(&self, (b, h): (usize, usize), p: usize, t: usize) -> f32 {
        let at = self.locate(b, h, t);
        side::key(self.sides[0], self.head(0, at), p, at.slot)
    }

    /// Side `side`'s part of `at`, as `side.rs` addresses it (heads `d` wide for the keys,
    /// `dv` for the values).
    fn head(&self, side: usize, at: BlockAt) -> side::Head {
        let width = [self.head_dim, self.values.stored_dim()][side];
        (at.part, self.head_sizes[side], width)
    }
}
