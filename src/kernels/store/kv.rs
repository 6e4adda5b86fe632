//! The key/value store: the keys and values the attention reads, in the layouts its kernels
//! stream. A forward pass fills a transient store from empty; a [`KvCache`](crate::KvCache)
//! is a store that persists between decoding steps. Either way new tokens are appended by
//! [`Store::append`], each batch element's at its own length, and the attention reads the
//! first [`KvStore::lengths`] of them, through the store's [`KvView`].
//!
//! Layout, per batch element `b` and key/value head `h` (head index `b·Hkv + h`), with room
//! for `capacity` tokens:
//! - keys: transposed into panels of [`BLOCK_K`] keys, each panel `d × BLOCK_K` row-major
//!   (`Kᵀ` of one key block), so a score tile streams one panel contiguously;
//! - values: `capacity` rows of `dv` values (`d` unless the layer's value heads differ), so a key block's values are contiguous rows (the
//!   attention's tile path reads them in place when `d` is a whole number of microtile panels,
//!   [`value_stride`], and from a padded copy otherwise); or, in a store whose values are its
//!   keys' columns ([`ValueLayout::InKeys`], MLA's latent cache), no value buffer at all: each
//!   token is stored once, and the attention reads its values out of the key panels.
//!
//! In a 16- or 8-bit [`KvFormat`] (chosen per store, keys and values apart) the elements sit
//! at the same places, rounded when appended; value rows are `dv` wide, and the attention
//! reads each key block's panel and value rows as stored ([`KvView::key_data`],
//! [`KvView::value_data`]): its tile path widens them to `f32` first, its row path
//! (decoding) widens them in registers (`side.rs`; the formats: `format/`).
//!
//! Token `t` of an element lives in slot `t`, except in a rolling store (the cache of a layer
//! with a sliding window, [`Rolling`]): its `capacity` is a whole number of key blocks and
//! token `t` lives in slot `t mod capacity`, so logical key block `n` is physical block
//! `n mod (capacity / BLOCK_K)`, whole. The lengths stay absolute positions; the attention
//! addresses keys by position through [`KvView::locate`] and walks the same blocks in the same
//! order as over a store that keeps every token, so it computes the same bits.

use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::buffer::{buffer_elements, try_grow};
use crate::kernels::format::{Elements, ElementsMut};
use crate::kernels::store::layout::{
    key_panel_index, BlockLayout, HeadLayout, KvFormats, ValueLayout, BLOCK_K,
};

use crate::kernels::store::side::{self, q8_blocks, HeadSizes};
use crate::kernels::store::view::{Blocks, KvView};
use crate::kernels::store::Store;
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
    /// Width of one key head `d`.
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
    /// Position shifts, per batch element (as `lengths`): token `t` is at position
    /// `t + shift` (see [`Store::position_shifts`]).
    shifts: Vec<isize>,
    /// `batch · n_kv_heads` heads of `⌈capacity / BLOCK_K⌉` panels of `d × BLOCK_K` elements
    /// (see [`key_panel_index`]).
    keys: Elements,
    /// `batch · n_kv_heads` heads of `capacity` rows of `dv` elements (none when the values
    /// are in the keys).
    values: Elements,
    /// The formats of `keys` and `values`.
    formats: KvFormats,
    /// Where the values are.
    pub value_layout: ValueLayout,
}

/// The dimensions of a store: everything but its contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoreShape {
    /// Batch elements.
    pub batch: usize,
    /// Key/value heads per batch element.
    pub n_kv_heads: usize,
    /// Width of one key head `d` (a value head's: `values`).
    pub head_dim: usize,
    /// Tokens per batch element (slots).
    pub capacity: usize,
    /// The window and chunk of a rolling store.
    pub rolling: Option<Rolling>,
    /// How keys and values are kept.
    pub formats: KvFormats,
    /// Where the values are.
    pub values: ValueLayout,
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
    /// The shape of `blocks` blocks of `layout` as a contiguous store of `blocks` elements of
    /// [`BLOCK_K`] slots (element `p` is block `p`).
    pub(crate) fn of_blocks(layout: &BlockLayout, blocks: usize) -> Self {
        StoreShape {
            batch: blocks,
            n_kv_heads: layout.n_kv_heads,
            head_dim: layout.head_dim,
            capacity: BLOCK_K,
            rolling: None,
            formats: layout.formats,
            values: layout.values,
        }
    }
}

impl StoreShape {
    /// The sizes of one head's keys and of one head's values, and the elements and scales of
    /// all heads of each, or [`ShapeError::Overflow`] when a store of this shape does not fit
    /// in memory.
    pub(crate) fn sizes(&self) -> Result<([HeadSizes; 2], [[usize; 2]; 2]), ShapeError> {
        let (d, capacity) = (self.head_dim, self.capacity);
        let (panels, blocks) = (capacity.div_ceil(BLOCK_K), q8_blocks(d));
        let value_dim = self.values.stored_dim();
        // Per head: keys, key scales, values, value scales. A head's sizes are used only when
        // the store has heads, and then they fit since the totals do.
        let per_head = [
            [d, BLOCK_K, panels],
            [blocks, BLOCK_K, panels],
            [value_dim, capacity, 1],
            [q8_blocks(value_dim), capacity, 1],
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
        try_grow(&mut self.shifts, shape.batch, 0, "key/value store: shifts")?;
        self.shifts[..shape.batch].fill(0);
        self.batch = shape.batch;
        self.n_kv_heads = shape.n_kv_heads;
        self.head_dim = shape.head_dim;
        self.capacity = shape.capacity;
        self.rolling = shape.rolling;
        self.value_layout = shape.values;
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

    /// Where each batch element's next token goes by default: its length plus its shift.
    pub(crate) fn next_positions(&self) -> impl Iterator<Item = usize> + '_ {
        let shifts = &self.shifts[..self.batch];
        // A shift keeps every held position at least 0 (checked where it is set).
        (self.lengths().iter().zip(shifts))
            .map(|(&length, &shift)| length.saturating_add_signed(shift))
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
            Some(b) => (self.lengths[b], self.shifts[b]) = (0, 0),
            None => {
                self.lengths.fill(0);
                self.shifts.fill(0);
            }
        }
    }
}

/// Appending the new tokens of a call. A forward pass's store starts empty, and its value
/// buffer lends room for the call's projected keys ([`Store::staging`]), so a call into an
/// empty store needs no key buffer of its own: the keys go out into the panels before the
/// values come in.
impl Store for KvStore {
    fn position_shifts(&self) -> &[isize] {
        &self.shifts[..self.batch]
    }

    fn set_next_position(&mut self, b: usize, next: usize) {
        self.shifts[b] = shift_to(next, self.lengths[b]);
    }

    fn first_held(&self, b: usize) -> usize {
        // A ring of `capacity` slots holds the last `capacity` tokens.
        let held = self.lengths().get(b).copied().unwrap_or(0);
        self.rolling
            .map_or(0, |_| held.saturating_sub(self.capacity))
    }

    fn view(&self) -> KvView<'_> {
        KvView {
            sides: [&self.keys, &self.values],
            head_sizes: self.head_sizes,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            formats: self.formats,
            lengths: self.lengths(),
            window: self.rolling.map(|r| r.window),
            values: self.value_layout,
            blocks: Blocks::Contiguous {
                ring: self.slots().ring,
            },
        }
    }

    /// # Errors
    /// [`ShapeError::CacheFull`] naming the first element that has no room, its tokens held,
    /// the new ones and the capacity; for a rolling store [`ShapeError::WindowChunk`] naming
    /// the first element that appends more than a chunk.
    fn check_room(&self, new: NewTokens<'_>) -> Result<(), ShapeError> {
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

    /// The first `len` values of the value buffer when the store is empty and that buffer
    /// holds them (in `f32`).
    fn staging(&mut self, len: usize) -> (Option<&mut [f32]>, &[usize]) {
        let empty = self.lengths().iter().all(|&length| length == 0);
        let room = match &mut self.values {
            Elements::F32(floats) if empty && floats.len() >= len => Some(&mut floats[..len]),
            _ => None,
        };
        (room, &self.lengths[..self.batch])
    }

    fn append(
        &mut self,
        kernels: &Kernels,
        k: Option<&[f32]>,
        v: &[f32],
        [key_layout, value_layout]: [HeadLayout; 2],
        new: NewTokens<'_>,
        threads: usize,
        pool: &mut Pool,
    ) -> Result<(), ShapeError> {
        self.check_room(new)?;
        match k {
            Some(k) => self.append_keys(kernels, k, key_layout, new, threads, pool),
            None => {
                let floats = self.values.floats_mut().expect("a store that staged keys");
                let staged = core::mem::take(floats);
                self.append_keys(kernels, &staged, key_layout, new, threads, pool);
                self.values = Elements::F32(staged);
            }
        }
        if self.value_layout.is_rows() {
            self.append_values(v, value_layout, new, threads, pool);
        }
        self.advance(new);
        Ok(())
    }
}

impl KvStore {
    /// Counts the appended tokens.
    fn advance(&mut self, new: NewTokens<'_>) {
        for (b, length) in self.lengths[..self.batch].iter_mut().enumerate() {
            *length += new.of(b);
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
        let runs = element_runs(self.n_kv_heads, self.runs(new), &self.lengths, layout, new);
        let part = Part {
            sizes: self.head_sizes[0],
            head_dim: self.head_dim,
            slots: self.slots(),
        };
        write_keys(
            kernels,
            (&mut self.keys, part),
            (k, layout.row),
            runs,
            (threads, pool),
        );
    }

    /// Writes the values of the new tokens into the value rows at the slots of each batch
    /// element's positions `lengths[b] ..` (rounded to the values' format).
    fn append_values(
        &mut self,
        v: &[f32],
        layout: HeadLayout,
        new: NewTokens<'_>,
        threads: usize,
        pool: &mut Pool,
    ) {
        let runs = element_runs(self.n_kv_heads, self.runs(new), &self.lengths, layout, new);
        let part = Part {
            sizes: self.head_sizes[1],
            head_dim: self.value_layout.stored_dim(),
            slots: self.slots(),
        };
        write_values(
            (&mut self.values, part),
            (v, layout.row),
            runs,
            (threads, pool),
        );
    }

    /// The number of runs (heads) to write when appending `new` tokens.
    fn runs(&self, new: NewTokens<'_>) -> usize {
        if self.head_dim == 0 || new.rows == 0 {
            0
        } else {
            self.batch * self.n_kv_heads
        }
    }
}

/// The shift that places the next token of a sequence holding `length` tokens at `next`
/// (positions past `isize::MAX` are kept as `isize::MAX`; lengths are at most that).
pub(crate) fn shift_to(next: usize, length: usize) -> isize {
    let next = isize::try_from(next).unwrap_or(isize::MAX);
    next.saturating_sub(isize::try_from(length).unwrap_or(isize::MAX))
}

/// Where tokens live in a store: slot `t`, or `t mod ring` in a rolling store of `ring` slots.
#[derive(Clone, Copy)]
pub(crate) struct Slots {
    pub ring: Option<usize>,
}

impl Slots {
    /// The slot of token `t`.
    pub(crate) fn of(self, t: usize) -> usize {
        self.ring.map_or(t, |ring| t % ring)
    }
}

/// How many tokens each batch element appends: the source holds `rows` per element, of which
/// element `b` appends the first `lengths[b]` (all `rows` without `lengths`); or, ragged, the
/// source holds element `b`'s `lengths[b]` rows from row `starts[b]` on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NewTokens<'a> {
    /// Rows per batch element in the source (ragged: the most of any element).
    pub rows: usize,
    /// Rows each element appends (each at most `rows`), when they differ.
    pub lengths: Option<&'a [usize]>,
    /// Ragged sources: the first row of each element (`B + 1` ascending, the last the rows
    /// in all); `None`: element `b`'s rows start at `b · rows`.
    pub starts: Option<&'a [usize]>,
}

impl NewTokens<'_> {
    /// The tokens batch element `b` appends.
    pub(crate) fn of(&self, b: usize) -> usize {
        self.lengths.map_or(self.rows, |lengths| lengths[b])
    }

    /// Where batch element `b`'s rows start in a source laid out by `layout`.
    pub(crate) fn source(&self, b: usize, layout: HeadLayout) -> usize {
        self.starts
            .map_or(b * layout.batch, |starts| starts[b] * layout.row)
    }
}

/// One run of new tokens into one part of a side (slots of one key/value head): the tokens
/// at positions `first .. first + count`, whose rows start at `source` in the source.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    pub part: usize,
    pub source: usize,
    pub first: usize,
    pub count: usize,
}

/// How a side's parts are laid out: their sizes, the head width, and the slot of a token
/// within its part.
#[derive(Clone, Copy)]
pub(crate) struct Part {
    pub sizes: HeadSizes,
    pub head_dim: usize,
    pub slots: Slots,
}

/// The runs of an append to a contiguous store: part `b·Hkv + h` (the first `count`) takes
/// element `b`'s new tokens of head `h` at its length, from `b * layout.batch + h *
/// layout.head` in the source.
fn element_runs<'l>(
    n_kv_heads: usize,
    count: usize,
    lengths: &'l [usize],
    layout: HeadLayout,
    new: NewTokens<'l>,
) -> impl Iterator<Item = Run> + Clone + Send + 'l {
    (0..count).map(move |part| {
        let (b, h) = (part / n_kv_heads, part % n_kv_heads);
        Run {
            part,
            source: new.source(b, layout) + h * layout.head,
            first: lengths[b],
            count: new.of(b),
        }
    })
}

/// Writes the keys of `runs` (parts ascending and distinct) from `k` (rows `row` apart) into
/// `keys`' parts laid out by `part`: transposed into the panels (rounded to the keys' format).
/// The runs are independent work items on up to `threads` threads (the calling one and
/// `pool`'s workers).
pub(crate) fn write_keys(
    kernels: &Kernels,
    (keys, part): (&mut Elements, Part),
    (k, row): (&[f32], usize),
    runs: impl Iterator<Item = Run> + Clone + Send,
    (threads, pool): (usize, &mut Pool),
) {
    let (d, slots) = (part.head_dim, part.slots);
    let sizes = [part.sizes.elements, part.sizes.scales];
    let regions = keys.parts_at_mut(runs.clone().map(|run| run.part), sizes);
    for_each_run(runs.zip(regions), threads, pool, |(run, mut region)| {
        let ElementsMut::F32(panels) = region else {
            for t in 0..run.count {
                let key = &k[run.source + t * row..][..d];
                side::write_key(&mut region, key, slots.of(run.first + t));
            }
            return;
        };
        // Panel by panel: the keys of one panel are its columns.
        let mut t0 = 0;
        while t0 < run.count {
            let key = run.first + t0;
            let len = (run.count - t0).min(BLOCK_K - key % BLOCK_K);
            let src = &k[run.source + t0 * row..];
            let dst = &mut panels[key_panel_index(d, 0, slots.of(key))..];
            // SAFETY: a checked kernel table; `src` holds `len` keys of `d` values at stride
            // `row`, and the panel `d` rows of BLOCK_K from this key's column.
            unsafe { (kernels.transpose)(src, row, len, d, dst, BLOCK_K, 1.0) };
            t0 += len;
        }
    });
}

/// Writes the values of `runs` (parts ascending and distinct) from `v` (rows `row` apart)
/// into `values`' parts laid out by `part`, as rows at their slots (rounded to the values'
/// format); on up to `threads` threads as [`write_keys`].
pub(crate) fn write_values(
    (values, part): (&mut Elements, Part),
    (v, row): (&[f32], usize),
    runs: impl Iterator<Item = Run> + Clone + Send,
    (threads, pool): (usize, &mut Pool),
) {
    let (d, slots) = (part.head_dim, part.slots);
    let sizes = [part.sizes.elements, part.sizes.scales];
    let regions = values.parts_at_mut(runs.clone().map(|run| run.part), sizes);
    for_each_run(runs.zip(regions), threads, pool, |(run, mut region)| {
        for t in 0..run.count {
            let (value, slot) = (&v[run.source + t * row..][..d], slots.of(run.first + t));
            side::write_value(&mut region, value, slot, d);
        }
    });
}

/// Runs `write` for every item on up to `threads` threads: the calling one and `pool`'s
/// workers (each item is one part's alone).
fn for_each_run<I: Send>(
    items: impl Iterator<Item = I> + Send,
    threads: usize,
    pool: &mut Pool,
    write: impl Fn(I) + Sync,
) {
    let mut workers = [(); MAX_THREADS];
    let threads = threads.clamp(1, workers.len());
    parallel::for_each_item(pool, items, &mut workers[..threads], |item, ()| write(item));
}
