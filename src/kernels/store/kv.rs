//! The key/value store: the keys and values the attention reads, in the layouts its kernels
//! stream. A forward pass fills a transient store from empty; a [`KvCache`](crate::KvCache)
//! is a store that persists between decoding steps. Either way new tokens are appended by
//! [`KvStore::append`], each batch element's at its own length, and the attention reads the
//! first [`KvStore::lengths`] of them.
//!
//! Layout, per batch element `b` and key/value head `h` (head index `b·Hkv + h`), with room
//! for `capacity` tokens:
//! - keys: transposed into panels of [`BLOCK_K`] keys, each panel `d × BLOCK_K` row-major
//!   (`Kᵀ` of one key block), so a score tile streams one panel contiguously;
//! - values: `capacity` rows of `d` values, so a key block's values are contiguous rows (the
//!   attention's tile path reads them in place when `d` is a whole number of microtile panels,
//!   [`value_stride`], and from a padded copy otherwise).
//!
//! In a 16- or 8-bit [`KvFormat`] (chosen per store, keys and values apart) the elements sit
//! at the same places, rounded when appended; value rows are `d` wide, and the attention
//! reads each key block's panel and value rows as stored ([`KvStore::key_data`],
//! [`KvStore::value_data`]): its tile path widens them to `f32` first, its row path
//! (decoding) widens them in registers (`side.rs`; the formats: `format/`).
//!
//! Token `t` of an element lives in slot `t`, except in a rolling store (the cache of a layer
//! with a sliding window, [`Rolling`]): its `capacity` is a whole number of key blocks and
//! token `t` lives in slot `t mod capacity`, so logical key block `n` is physical block
//! `n mod (capacity / BLOCK_K)`, whole. The lengths stay absolute positions; the attention
//! addresses keys by position through [`KvStore::slot`] and walks the same blocks in the same
//! order as over a store that keeps every token, so it computes the same bits.

use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::buffer::{buffer_elements, try_grow};
use crate::kernels::format::{Elements, ElementsMut, KvFormat, Stored};
use crate::kernels::store::layout::{key_panel_index, HeadLayout, BLOCK_K};
use crate::kernels::store::side::{self, q8_blocks, HeadSizes};
use crate::kernels::threads::parallel::{self, Pool};
use crate::kernels::threads::plan::MAX_THREADS;
use crate::kernels::Kernels;

/// Keys (as `Kᵀ` panels) and values (as value panels) of up to `capacity` tokens per batch
/// element, of which element `b`'s first `lengths[b]` are filled.
#[derive(Clone, Default)]
pub(crate) struct KvStore {
    /// Batch elements.
    pub batch: usize,
    /// Key/value heads per batch element.
    pub n_kv_heads: usize,
    /// Width of one head `d`.
    pub head_dim: usize,
    /// Tokens per batch element the buffers have room for (slots).
    pub capacity: usize,
    /// The window and chunk of a rolling store.
    pub rolling: Option<Rolling>,
    /// The sizes of one head of keys and of one head of values.
    head_sizes: [HeadSizes; 2],
    /// Tokens filled so far, per batch element (the first `batch` entries; the vector only
    /// grows, so a transient store reset to a smaller batch allocates nothing).
    lengths: Vec<usize>,
    /// `batch · n_kv_heads` heads of `⌈capacity / BLOCK_K⌉` panels of `d × BLOCK_K` elements
    /// (see [`key_panel_index`]).
    keys: Elements,
    /// `batch · n_kv_heads` heads of `capacity` rows of `d` elements.
    values: Elements,
    /// The formats of `keys` and `values`.
    formats: KvFormats,
}

/// The formats of a store's keys and of its values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KvFormats {
    pub keys: KvFormat,
    pub values: KvFormat,
}

/// The dimensions of a store: everything but its contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoreShape {
    /// Batch elements.
    pub batch: usize,
    /// Key/value heads per batch element.
    pub n_kv_heads: usize,
    /// Width of one head `d`.
    pub head_dim: usize,
    /// Tokens per batch element (slots).
    pub capacity: usize,
    /// The window and chunk of a rolling store.
    pub rolling: Option<Rolling>,
    /// How keys and values are kept.
    pub formats: KvFormats,
}

/// The bounds of a rolling store: each query of a call sees at most the `window` keys ending
/// at its own, and a call appends at most `chunk` tokens per batch element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rolling {
    /// The layer's sliding window.
    pub window: usize,
    /// The most tokens one call appends per batch element.
    pub chunk: usize,
}

impl Rolling {
    /// The slots of a ring that holds every key a call's queries see: a call of `n ≤ chunk`
    /// tokens after position `L` sees keys `L + 1 - window ..= L + n - 1`, which must not share
    /// a slot, so `window + chunk - 1` slots rounded up to whole key blocks (at least one).
    /// A key block the attention reads may then also hold slots of other tokens (older ones
    /// before the window, or not yet overwritten ones after the call's last key): their
    /// queries do not see them, so their scores become `-inf` and their values are skipped.
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when the count does not fit in `usize`.
    pub(crate) fn slots(&self) -> Result<usize, ShapeError> {
        let blocks = (self.window.checked_add(self.chunk))
            .map(|span| span.saturating_sub(1).div_ceil(BLOCK_K).max(1))
            .and_then(|blocks| blocks.checked_mul(BLOCK_K));
        blocks.ok_or_else(|| ShapeError::Overflow {
            what: "rolling key/value store (window + chunk)",
            dims: alloc::vec![self.window, self.chunk],
        })
    }
}

impl StoreShape {
    /// The sizes of one head's keys and of one head's values, and the elements and scales of
    /// all heads of each, or [`ShapeError::Overflow`] when a store of this shape does not fit
    /// in memory.
    fn sizes(&self) -> Result<([HeadSizes; 2], [[usize; 2]; 2]), ShapeError> {
        let (d, capacity) = (self.head_dim, self.capacity);
        let (panels, blocks) = (capacity.div_ceil(BLOCK_K), q8_blocks(d));
        // Per head: keys, key scales, values, value scales. A head's sizes are used only when
        // the store has heads, and then they fit since the totals do.
        let per_head = [
            [d, BLOCK_K, panels],
            [blocks, BLOCK_K, panels],
            [d, capacity, 1],
            [blocks, capacity, 1],
        ];
        let mut totals = [0; 4];
        for (total, dims) in totals.iter_mut().zip(per_head) {
            // Width first: a store of zero-width heads is empty whatever its other dimensions.
            let all = [dims[0], dims[1], dims[2], self.batch, self.n_kv_heads];
            // Every buffer must also be addressable as bytes (as f32, the widest).
            *total =
                buffer_elements(&all, size_of::<f32>()).ok_or_else(|| ShapeError::Overflow {
                    what: "key/value store (B, Hkv, capacity, d)",
                    dims: alloc::vec![self.batch, self.n_kv_heads, self.capacity, self.head_dim],
                })?;
        }
        let [keys, key_scales, values, value_scales] =
            per_head.map(|[a, b, c]| a.saturating_mul(b).saturating_mul(c));
        let heads = [
            HeadSizes {
                elements: keys,
                scales: key_scales,
            },
            HeadSizes {
                elements: values,
                scales: value_scales,
            },
        ];
        Ok((heads, [[totals[0], totals[1]], [totals[2], totals[3]]]))
    }
}

impl KvStore {
    /// An empty store of this shape, its memory reserved up front (a cache).
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when the buffers' sizes do not fit in memory,
    /// [`ShapeError::AllocationFailed`] when they cannot be allocated.
    pub(crate) fn new(shape: StoreShape) -> Result<Self, ShapeError> {
        let mut store = KvStore::default();
        store.reset(shape)?;
        Ok(store)
    }

    /// Empties the store and makes it this shape, growing its buffers when they are too small
    /// (a forward pass's transient store, reused between calls).
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when the buffers' sizes do not fit in memory,
    /// [`ShapeError::AllocationFailed`] when they cannot be allocated.
    pub(crate) fn reset(&mut self, shape: StoreShape) -> Result<(), ShapeError> {
        let ([keys, values], [key_lens, value_lens]) = shape.sizes()?;
        let formats = shape.formats;
        let keys_what = "key/value store: keys";
        (self.keys).reset(formats.keys.element(), key_lens, keys_what)?;
        (self.values).reset(
            formats.values.element(),
            value_lens,
            "key/value store: values",
        )?;
        self.formats = formats;
        try_grow(
            &mut self.lengths,
            shape.batch,
            0,
            "key/value store: lengths",
        )?;
        self.lengths[..shape.batch].fill(0);
        self.batch = shape.batch;
        self.n_kv_heads = shape.n_kv_heads;
        self.head_dim = shape.head_dim;
        self.capacity = shape.capacity;
        self.rolling = shape.rolling;
        self.head_sizes = [keys, values];
        Ok(())
    }

    /// The bytes its key panels and value rows hold (the buffers' lengths, not their
    /// spare capacity).
    pub(crate) fn bytes(&self) -> usize {
        self.keys.bytes() + self.values.bytes()
    }

    /// How its keys and values are kept.
    pub(crate) fn formats(&self) -> KvFormats {
        self.formats
    }

    /// Tokens filled so far, per batch element.
    pub(crate) fn lengths(&self) -> &[usize] {
        &self.lengths[..self.batch]
    }

    /// The slot of token `t` (see the module docs).
    pub(crate) fn slot(&self, t: usize) -> usize {
        self.slots().of(t)
    }

    /// Where this store's tokens live.
    fn slots(&self) -> Slots {
        Slots {
            ring: self.rolling.map(|_| self.capacity),
        }
    }

    /// The most tokens any batch element holds (0 for an empty batch).
    pub(crate) fn longest(&self) -> usize {
        self.lengths().iter().copied().max().unwrap_or(0)
    }

    /// Forgets batch element `b`'s tokens, or every element's when `b` is `None`.
    pub(crate) fn clear(&mut self, b: Option<usize>) {
        match b {
            Some(b) => self.lengths[b] = 0,
            None => self.lengths.fill(0),
        }
    }
}

/// Appending the new tokens of a call.
impl KvStore {
    /// Appends tokens per batch element: keys `k` and values `v`, both laid out by `layout`
    /// (`(B, rows, Hkv, d)` as the projections write them), of which element `b` appends its
    /// first `new.of(b)` rows at its own length; on up to `threads` threads (the calling one
    /// and `pool`'s workers).
    ///
    /// # Errors
    /// [`ShapeError::CacheFull`] when they do not fit; the store is unchanged.
    pub(crate) fn append(
        &mut self,
        kernels: &Kernels,
        [k, v]: [&[f32]; 2],
        layout: HeadLayout,
        new: NewTokens<'_>,
        threads: usize,
        pool: &mut Pool,
    ) -> Result<(), ShapeError> {
        self.check_room(new)?;
        self.append_keys(kernels, k, layout, new, threads, pool);
        self.append_values(v, layout, new, threads, pool);
        self.advance(new);
        Ok(())
    }

    /// Whether the store is empty and its value buffer holds at least `len` values: room for
    /// a call's projected keys (see [`KvStore::staging`]).
    pub(crate) fn can_stage(&self, len: usize) -> bool {
        let values = &self.values;
        let floats = matches!(values, Elements::F32(floats) if floats.len() >= len);
        floats && self.lengths().iter().all(|&length| length == 0)
    }

    /// For a store that [can stage](KvStore::can_stage) `len` keys: the first `len` values
    /// of its value buffer, as room for a call's projected keys `(B, rows, Hkv, d)` (so a
    /// call into an empty store, a forward pass, needs no buffer of its own for them), and
    /// the lengths (all 0). [`KvStore::append_staged`] appends them.
    pub(crate) fn staging(&mut self, len: usize) -> (&mut [f32], &[usize]) {
        debug_assert!(self.can_stage(len));
        let floats = self.values.floats_mut().expect("a store that can stage");
        (&mut floats[..len], &self.lengths[..self.batch])
    }

    /// [`KvStore::append`] with the keys in the [staging](KvStore::staging) room: they are
    /// transposed into the panels first, then the value buffer receives the values.
    ///
    /// # Errors
    /// As [`KvStore::append`].
    pub(crate) fn append_staged(
        &mut self,
        kernels: &Kernels,
        v: &[f32],
        layout: HeadLayout,
        new: NewTokens<'_>,
        threads: usize,
        pool: &mut Pool,
    ) -> Result<(), ShapeError> {
        self.check_room(new)?;
        let floats = self.values.floats_mut().expect("a store that can stage");
        let staged = core::mem::take(floats);
        self.append_keys(kernels, &staged, layout, new, threads, pool);
        self.values = Elements::F32(staged);
        self.append_values(v, layout, new, threads, pool);
        self.advance(new);
        Ok(())
    }

    /// Counts the appended tokens.
    fn advance(&mut self, new: NewTokens<'_>) {
        for (b, length) in self.lengths[..self.batch].iter_mut().enumerate() {
            *length += new.of(b);
        }
    }

    /// `Ok` when every batch element's new tokens fit.
    ///
    /// # Errors
    /// [`ShapeError::CacheFull`] naming the first element that has no room, its tokens held,
    /// the new ones and the capacity; for a rolling store [`ShapeError::WindowChunk`] naming
    /// the first element that appends more than a chunk.
    pub(crate) fn check_room(&self, new: NewTokens<'_>) -> Result<(), ShapeError> {
        if let Some(Rolling { window, chunk }) = self.rolling {
            return match (0..self.batch).find(|&b| new.of(b) > chunk) {
                None => Ok(()),
                Some(sequence) => Err(ShapeError::WindowChunk {
                    sequence,
                    new: new.of(sequence),
                    chunk,
                    window,
                }),
            };
        }
        let full = (0..self.batch).find(|&b| new.of(b) > self.capacity - self.lengths[b]);
        match full {
            None => Ok(()),
            Some(sequence) => Err(ShapeError::CacheFull {
                sequence,
                capacity: self.capacity,
                cached: self.lengths[sequence],
                new: new.of(sequence),
            }),
        }
    }

    /// Writes the keys of the new tokens, transposed into the key panels at each batch
    /// element's columns `lengths[b] ..` (rounded to the keys' format).
    fn append_keys(
        &mut self,
        kernels: &Kernels,
        k: &[f32],
        layout: HeadLayout,
        new: NewTokens<'_>,
        threads: usize,
        pool: &mut Pool,
    ) {
        let d = self.head_dim;
        let (heads, lengths, slots) = (self.heads(layout, new), &self.lengths[..], self.slots());
        let sizes = self.head_sizes[0];
        let regions = self
            .keys
            .parts_mut(heads.count, [sizes.elements, sizes.scales]);
        for_each_head(heads, regions, threads, pool, |mut region, b, base| {
            let (first, new) = (lengths[b], new.of(b));
            let ElementsMut::F32(panels) = region else {
                for t in 0..new {
                    let key = &k[base + t * layout.row..][..d];
                    side::write_key(&mut region, key, slots.of(first + t));
                }
                return;
            };
            // Panel by panel: the keys of one panel are its columns.
            let mut t0 = 0;
            while t0 < new {
                let key = first + t0;
                let run = (new - t0).min(BLOCK_K - key % BLOCK_K);
                let src = &k[base + t0 * layout.row..];
                let dst = &mut panels[key_panel_index(d, 0, slots.of(key))..];
                // SAFETY: a checked kernel table; `src` holds `run` keys of `d` values at stride
                // `row`, and the panel `d` rows of BLOCK_K from this key's column.
                unsafe { (kernels.transpose)(src, layout.row, run, d, dst, BLOCK_K, 1.0) };
                t0 += run;
            }
        });
    }

    /// Writes the values of the new tokens into the value rows at the slots of each batch
    /// element's positions `lengths[b] ..`: zero-padded in `f32`, rounded to the values'
    /// format in the others.
    fn append_values(
        &mut self,
        v: &[f32],
        layout: HeadLayout,
        new: NewTokens<'_>,
        threads: usize,
        pool: &mut Pool,
    ) {
        let d = self.head_dim;
        let (heads, lengths, slots) = (self.heads(layout, new), &self.lengths[..], self.slots());
        let sizes = self.head_sizes[1];
        let regions = self
            .values
            .parts_mut(heads.count, [sizes.elements, sizes.scales]);
        for_each_head(heads, regions, threads, pool, |mut region, b, base| {
            for t in 0..new.of(b) {
                let (value, slot) = (&v[base + t * layout.row..][..d], slots.of(lengths[b] + t));
                side::write_value(&mut region, value, slot, d);
            }
        });
    }

    /// The heads to write when appending `new` tokens from a source laid out by `layout`.
    fn heads(&self, layout: HeadLayout, new: NewTokens<'_>) -> SourceHeads {
        SourceHeads {
            n_kv_heads: self.n_kv_heads,
            count: if self.head_dim == 0 || new.rows == 0 {
                0
            } else {
                self.batch * self.n_kv_heads
            },
            layout,
        }
    }
}

/// Reading the keys and values of a head `b·Hkv + h`.
impl KvStore {
    /// The key panel (`d × BLOCK_K`, row-major) of head `head` holding slot `slot` (a
    /// multiple of [`BLOCK_K`]), as stored.
    pub(crate) fn key_data(&self, head: usize, slot: usize) -> Stored<'_> {
        side::key_panel(&self.keys, (head, self.head_sizes[0], self.head_dim), slot)
    }

    /// Value rows `slot .. slot + len` of head `head`, as stored (rows of `d`).
    pub(crate) fn value_data(&self, head: usize, slot: usize, len: usize) -> Stored<'_> {
        let head = (head, self.head_sizes[1], self.head_dim);
        side::value_rows(&self.values, head, (slot, len, self.head_dim))
    }

    /// [`KvStore::key_data`] as `f32`: in place, or widened into `widened` (at least
    /// `d · BLOCK_K` floats).
    pub(crate) fn key_panel<'a>(
        &'a self,
        kernels: &Kernels,
        head: usize,
        slot: usize,
        widened: &'a mut [f32],
    ) -> &'a [f32] {
        let (d, src) = (self.head_dim, self.key_data(head, slot));
        if let Some(panel) = src.as_f32() {
            return panel;
        }
        let widened = &mut widened[..d * BLOCK_K];
        // SAFETY: a checked kernel table; `src` holds the d × BLOCK_K panel and `widened` as
        // many values.
        unsafe { (kernels.widen)(src, d, BLOCK_K, widened, BLOCK_K) };
        widened
    }

    /// [`KvStore::value_data`] as `f32` rows of [`value_stride`] floats: in place (`f32`
    /// rows whose `d` is that stride), or widened (copied) into `widened` (at least `len ·
    /// value_stride` floats), zeros after each row's `d` values.
    pub(crate) fn value_rows<'a>(
        &'a self,
        kernels: &Kernels,
        head: usize,
        (slot, len): (usize, usize),
        widened: &'a mut [f32],
    ) -> &'a [f32] {
        let (d, stride) = (self.head_dim, value_stride(kernels, self.head_dim));
        let src = self.value_data(head, slot, len);
        if let Some(rows) = src.as_f32().filter(|_| stride == d) {
            return rows;
        }
        let widened = &mut widened[..len * stride];
        // SAFETY: a checked kernel table; `src` holds `len` rows of `d` values and `widened`
        // `len` rows of `stride ≥ d`.
        unsafe { (kernels.widen)(src, len, d, widened, stride) };
        for row in widened.chunks_exact_mut(stride.max(1)) {
            row[d..].fill(0.0);
        }
        widened
    }

    /// Feature `p` of the key in slot `slot` of head `head`, as `f32`.
    pub(crate) fn key(&self, head: usize, p: usize, slot: usize) -> f32 {
        side::key(
            &self.keys,
            (head, self.head_sizes[0], self.head_dim),
            p,
            slot,
        )
    }
}

/// Where tokens live in a store: slot `t`, or `t mod ring` in a rolling store of `ring` slots.
#[derive(Clone, Copy)]
struct Slots {
    ring: Option<usize>,
}

impl Slots {
    fn of(self, t: usize) -> usize {
        self.ring.map_or(t, |ring| t % ring)
    }
}

/// How many tokens each batch element appends: the source holds `rows` per element, of which
/// element `b` appends the first `lengths[b]` (all `rows` without `lengths`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct NewTokens<'a> {
    /// Rows per batch element in the source.
    pub rows: usize,
    /// Rows each element appends (each at most `rows`), when they differ.
    pub lengths: Option<&'a [usize]>,
}

impl NewTokens<'_> {
    /// The tokens batch element `b` appends.
    pub(crate) fn of(&self, b: usize) -> usize {
        self.lengths.map_or(self.rows, |lengths| lengths[b])
    }
}

/// The source heads of an append: `count` heads `b·Hkv + h`, head `h` of batch element `b`
/// starting at `b * layout.batch + h * layout.head`.
struct SourceHeads {
    n_kv_heads: usize,
    count: usize,
    layout: HeadLayout,
}

/// Runs `write(region, b, base)` for every head of `heads`: `region` is that head's part of
/// the buffer (the next item of `regions`), `b` its batch element, `base` where the head
/// starts in the source. The heads are independent work items on up to `threads` threads:
/// the calling one and `pool`'s workers.
fn for_each_head<R: Send>(
    heads: SourceHeads,
    regions: impl Iterator<Item = R> + Send,
    threads: usize,
    pool: &mut Pool,
    write: impl Fn(R, usize, usize) + Sync,
) {
    if heads.count == 0 {
        return;
    }
    let items = regions.take(heads.count).enumerate();
    let mut workers = [(); MAX_THREADS];
    let threads = threads.clamp(1, workers.len());
    parallel::for_each_item(
        pool,
        items,
        &mut workers[..threads],
        |(head, region), ()| {
            let (b, h) = (head / heads.n_kv_heads, head % heads.n_kv_heads);
            write(region, b, b * heads.layout.batch + h * heads.layout.head);
        },
    );
}

/// The row stride of a value panel for head width `d`: `d` rounded up to whole `nr`-wide
/// microtile panels, so a tile never reads past a row.
pub(crate) fn value_stride(kernels: &Kernels, d: usize) -> usize {
    d.div_ceil(kernels.nr) * kernels.nr
}
