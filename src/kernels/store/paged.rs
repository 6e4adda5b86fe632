//! The paged store: a pool of physical key blocks, each holding one [`BlockLayout`] (all
//! key/value heads of [`BLOCK_K`] tokens of one layer, in the store's formats; a layout whose
//! values are its keys' columns, MLA's latent cache, has no value side), and one block table
//! per sequence (logical key block `n` → physical block). The attention walks a
//! sequence's key blocks in the order it walks a contiguous store's, reading each through the
//! table ([`Blocks::Paged`]), so it computes the same bits.
//!
//! - **Pool**: `blocks` blocks reserved when the store is made (it never grows: memory is
//!   fixed up front, as a [`KvCache`](crate::KvCache)'s). A block has a reference count; free
//!   blocks wait on a stack.
//! - **Sequences** are ids into `tables` / `lengths`; a removed id is reused by the next
//!   sequence added. A sequence's length is its position: token `t` is at position `t`.
//! - **Growth**: an append takes a free block for each logical block it starts; a pool without
//!   enough is [`ShapeError::PoolFull`] before anything changes.
//! - **Windows**: with the layer's sliding window `W`, a sequence holding `L` tokens releases,
//!   before its next append, every block whose keys all precede `L + 1 - W` (no later query
//!   sees them): its table entry becomes [`RELEASED`] and the block goes back to the pool.
//! - **Sharing**: a fork shares every block (reference counts); a block is written only while
//!   its count is 1, so an append into a shared partial last block first copies it
//!   (copy on write). Full blocks are never written again, so they stay shared.
//!
//! A call names its sequences (`select`): batch element `b` of the call is sequence
//! `ids[b]`, and the store then reads and appends as a [`Store`] of that batch.

use alloc::vec::Vec;

use crate::error::ShapeError;
use crate::kernels::buffer::try_grow;
use crate::kernels::format::Elements;
use crate::kernels::store::kv::{
    write_keys, write_values, NewTokens, Part, Run, Slots, StoreShape,
};
use crate::kernels::store::layout::{BlockLayout, HeadLayout, BLOCK_K};
use crate::kernels::store::side::HeadSizes;
use crate::kernels::store::view::{Blocks, KvView};
use crate::kernels::store::Store;
use crate::kernels::threads::parallel::Pool;
use crate::kernels::Kernels;

/// The table entry of a logical block a windowed sequence has released.
pub(crate) const RELEASED: u32 = u32::MAX;

/// Blocks of one layout shared by sequences through block tables.
#[derive(Clone)]
pub(crate) struct PagedStore {
    /// What each block holds.
    pub layout: BlockLayout,
    /// Keys and values: block `p`'s head `h` is part `p·Hkv + h` of each side.
    sides: [Elements; 2],
    /// The sizes of one part of each side.
    part_sizes: [HeadSizes; 2],
    /// References per block (0: free).
    refs: Vec<u32>,
    /// The free blocks, the next one last.
    free: Vec<u32>,
    /// Per sequence id: its block table, its length, whether it is live.
    tables: Vec<Vec<u32>>,
    lengths: Vec<usize>,
    live: Vec<bool>,
    /// The sequences of the current call and their lengths (the call's batch).
    call_ids: Vec<usize>,
    call_lengths: Vec<usize>,
    /// The current append's runs, by part.
    runs: Vec<Run>,
}

impl PagedStore {
    /// A pool of `blocks` blocks of `layout`, all free, and no sequence.
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when the pool's size does not fit in memory (or `blocks` in
    /// `u32`), [`ShapeError::AllocationFailed`] when it cannot be allocated.
    pub(crate) fn new(layout: BlockLayout, blocks: usize) -> Result<Self, ShapeError> {
        let too_many = || ShapeError::Overflow {
            what: "paged KV cache blocks",
            dims: alloc::vec![blocks],
        };
        let count = u32::try_from(blocks)
            .ok()
            .filter(|&n| n < RELEASED)
            .ok_or_else(too_many)?;
        let shape = StoreShape::of_blocks(&layout, blocks);
        let (part_sizes, [keys, values]) = shape.sizes()?;
        let mut sides = [Elements::default(), Elements::default()];
        let formats = [layout.formats.keys, layout.formats.values];
        for ((side, format), lens) in sides.iter_mut().zip(formats).zip([keys, values]) {
            side.reset(format.element(), lens, "paged KV cache blocks")?;
        }
        let mut free = Vec::new();
        try_grow(&mut free, blocks, 0, "paged KV cache free list")?;
        for (slot, block) in free.iter_mut().zip((0..count).rev()) {
            *slot = block;
        }
        let mut refs = Vec::new();
        try_grow(&mut refs, blocks, 0, "paged KV cache reference counts")?;
        Ok(PagedStore {
            layout,
            sides,
            part_sizes,
            refs,
            free,
            tables: Vec::new(),
            lengths: Vec::new(),
            live: Vec::new(),
            call_ids: Vec::new(),
            call_lengths: Vec::new(),
            runs: Vec::new(),
        })
    }

    /// Blocks in the pool.
    pub(crate) fn blocks(&self) -> usize {
        self.refs.len()
    }

    /// Blocks no sequence holds.
    pub(crate) fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// The bytes of the pool's keys and values.
    pub(crate) fn bytes(&self) -> usize {
        self.sides[0].bytes() + self.sides[1].bytes()
    }

    /// The tokens sequence `id` holds.
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not a live sequence.
    pub(crate) fn length(&self, id: usize) -> Result<usize, ShapeError> {
        self.check_id(id).map(|()| self.lengths[id])
    }

    /// `Ok` when `id` is a live sequence.
    fn check_id(&self, id: usize) -> Result<(), ShapeError> {
        match self.live.get(id) {
            Some(true) => Ok(()),
            _ => Err(ShapeError::SequenceId {
                id,
                ids: self.live.len(),
            }),
        }
    }
}

/// Sequences: added, forked, truncated, removed.
impl PagedStore {
    /// A new empty sequence's id (the lowest free one).
    ///
    /// # Errors
    /// [`ShapeError::AllocationFailed`] when its entry cannot be had.
    pub(crate) fn add(&mut self) -> Result<usize, ShapeError> {
        if let Some(id) = self.live.iter().position(|&live| !live) {
            self.live[id] = true;
            return Ok(id);
        }
        let id = self.live.len();
        const WHAT: &str = "paged KV cache sequences";
        try_grow(&mut self.tables, id + 1, Vec::new(), WHAT)?;
        try_grow(&mut self.lengths, id + 1, 0, WHAT)?;
        try_grow(&mut self.live, id + 1, true, WHAT)?;
        Ok(id)
    }

    /// A new sequence holding the tokens of `id`, sharing its blocks.
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not live, or as [`PagedStore::add`].
    pub(crate) fn fork(&mut self, id: usize) -> Result<usize, ShapeError> {
        self.check_id(id)?;
        let mut table = Vec::new();
        try_grow(
            &mut table,
            self.tables[id].len(),
            0,
            "paged KV cache block table",
        )?;
        table.copy_from_slice(&self.tables[id]);
        let fork = self.add()?;
        for &block in table.iter().filter(|&&block| block != RELEASED) {
            self.refs[block as usize] += 1;
        }
        (self.tables[fork], self.lengths[fork]) = (table, self.lengths[id]);
        Ok(fork)
    }

    /// Keeps the first `length` tokens of sequence `id`, releasing the blocks past them (a
    /// shared partial last block is copied when next written).
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not live, [`ShapeError::Truncate`] when it
    /// holds fewer tokens, or (with a window) a block the next query would see is released.
    pub(crate) fn truncate(&mut self, id: usize, length: usize) -> Result<(), ShapeError> {
        self.check_id(id)?;
        let held = self.lengths[id];
        let table = &self.tables[id];
        let kept_from = table.iter().take_while(|&&b| b == RELEASED).count() * BLOCK_K;
        let reach = self
            .layout
            .window
            .map_or(0, |w| (length + 1).saturating_sub(w));
        if length > held || (length > 0 && reach < kept_from) {
            return Err(ShapeError::Truncate {
                id,
                length,
                held,
                kept_from,
            });
        }
        let keep = length.div_ceil(BLOCK_K);
        let mut table = core::mem::take(&mut self.tables[id]);
        for block in table.drain(keep.min(table.len())..) {
            self.release(block);
        }
        (self.tables[id], self.lengths[id]) = (table, length);
        Ok(())
    }

    /// Forgets sequence `id` and releases its blocks; its id goes to the next sequence added.
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not live.
    pub(crate) fn remove(&mut self, id: usize) -> Result<(), ShapeError> {
        self.truncate(id, 0)?;
        self.live[id] = false;
        Ok(())
    }

    /// Drops one reference to `block` (nothing for [`RELEASED`]); a block no sequence holds
    /// goes back to the pool.
    fn release(&mut self, block: u32) {
        if block == RELEASED {
            return;
        }
        let refs = &mut self.refs[block as usize];
        *refs -= 1;
        if *refs == 0 {
            self.free.push(block);
        }
    }

    /// Makes `ids` the batch of the next call: batch element `b` is sequence `ids[b]`.
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] for an id that is not live, [`ShapeError::RepeatedSequence`]
    /// for one named twice, [`ShapeError::AllocationFailed`] when the batch's lengths cannot
    /// be had.
    pub(crate) fn select(&mut self, ids: &[usize]) -> Result<(), ShapeError> {
        for (b, &id) in ids.iter().enumerate() {
            self.check_id(id)?;
            if let Some(first) = ids[..b].iter().position(|&other| other == id) {
                return Err(ShapeError::RepeatedSequence {
                    id,
                    elements: [first, b],
                });
            }
        }
        const WHAT: &str = "paged KV cache call";
        self.call_ids.clear();
        self.call_lengths.clear();
        try_grow(&mut self.call_ids, ids.len(), 0, WHAT)?;
        try_grow(&mut self.call_lengths, ids.len(), 0, WHAT)?;
        self.call_ids.copy_from_slice(ids);
        for (length, &id) in self.call_lengths.iter_mut().zip(ids) {
            *length = self.lengths[id];
        }
        Ok(())
    }
}

/// Appending a call's new tokens.
impl PagedStore {
    /// The blocks sequence `id` holding `length` tokens no longer needs (all of whose keys
    /// precede the window of its next query): the logical blocks before the returned one.
    fn reach(&self, length: usize) -> usize {
        let first = self
            .layout
            .window
            .map_or(0, |w| (length + 1).saturating_sub(w));
        first / BLOCK_K
    }

    /// The blocks appending `new` tokens to sequence `id` takes from the pool (new blocks,
    /// and a copy of a shared partial last block), and those it gives back (before its window).
    fn block_needs(&self, id: usize, new: usize) -> (usize, usize) {
        let (table, length) = (&self.tables[id], self.lengths[id]);
        let before = self.reach(length).min(table.len());
        let freed = table[..before]
            .iter()
            .filter(|&&b| b != RELEASED && self.refs[b as usize] == 1)
            .count();
        if new == 0 {
            return (0, freed);
        }
        let last = (length + new - 1) / BLOCK_K + 1;
        let fresh = last.saturating_sub(table.len());
        let partial = (!length.is_multiple_of(BLOCK_K))
            .then(|| table[length / BLOCK_K])
            .filter(|&b| self.refs[b as usize] > 1);
        (fresh + usize::from(partial.is_some()), freed)
    }

    /// Releases the blocks before sequence `id`'s window, copies its shared partial last
    /// block and takes blocks for `new` more tokens (the pool has room: see
    /// [`Store::check_room`]).
    fn prepare(&mut self, id: usize, new: usize) {
        let mut table = core::mem::take(&mut self.tables[id]);
        let length = self.lengths[id];
        let before = self.reach(length).min(table.len());
        for entry in &mut table[..before] {
            self.release(core::mem::replace(entry, RELEASED));
        }
        if new > 0 {
            let parts = self.layout.n_kv_heads;
            if !length.is_multiple_of(BLOCK_K) {
                let shared = table[length / BLOCK_K];
                if self.refs[shared as usize] > 1 {
                    let copy = self.take_block();
                    let sizes = self.part_sizes.map(|s| [s.elements, s.scales]);
                    let moved = (shared as usize * parts, copy as usize * parts, parts);
                    for (side, sizes) in self.sides.iter_mut().zip(sizes) {
                        side.copy_parts(moved, sizes);
                    }
                    self.release(shared);
                    table[length / BLOCK_K] = copy;
                }
            }
            let last = (length + new - 1) / BLOCK_K + 1;
            while table.len() < last {
                let block = self.take_block();
                table.push(block);
            }
        }
        self.tables[id] = table;
    }

    /// A free block, now held once.
    fn take_block(&mut self) -> u32 {
        let block = self.free.pop().expect("a pool checked to have room");
        self.refs[block as usize] = 1;
        block
    }

    /// The runs of the call's new tokens, one per (touched block, head), by part: element
    /// `b`'s head `h` from `b · layout.batch + h · layout.head` in the source.
    fn collect_runs(&mut self, layout: HeadLayout, new: NewTokens<'_>) {
        self.runs.clear();
        let n_kv_heads = self.layout.n_kv_heads;
        for (b, &id) in self.call_ids.iter().enumerate() {
            let (start, end) = (self.lengths[id], self.lengths[id] + new.of(b));
            let mut first = start;
            while first < end && self.layout.head_dim > 0 {
                let count = (end - first).min(BLOCK_K - first % BLOCK_K);
                let block = self.tables[id][first / BLOCK_K] as usize;
                for h in 0..n_kv_heads {
                    self.runs.push(Run {
                        part: block * n_kv_heads + h,
                        source: new.source(b, layout)
                            + h * layout.head
                            + (first - start) * layout.row,
                        first,
                        count,
                    });
                }
                first += count;
            }
        }
        self.runs.sort_unstable_by_key(|run| run.part);
    }
}

impl Store for PagedStore {
    fn first_held(&self, b: usize) -> usize {
        let Some(&id) = self.call_ids.get(b) else {
            return 0;
        };
        let released = self.tables[id]
            .iter()
            .take_while(|&&block| block == RELEASED);
        released.count() * BLOCK_K
    }

    fn view(&self) -> KvView<'_> {
        KvView {
            sides: [&self.sides[0], &self.sides[1]],
            head_sizes: self.part_sizes,
            n_kv_heads: self.layout.n_kv_heads,
            head_dim: self.layout.head_dim,
            formats: self.layout.formats,
            lengths: &self.call_lengths,
            window: self.layout.window,
            values: self.layout.values,
            blocks: Blocks::Paged {
                tables: &self.tables,
                ids: &self.call_ids,
            },
        }
    }

    /// # Errors
    /// [`ShapeError::PoolFull`] when the call's sequences need more blocks than are free
    /// (counting those they release before their windows).
    fn check_room(&self, new: NewTokens<'_>) -> Result<(), ShapeError> {
        let (mut needed, mut freed) = (0, 0);
        for (b, &id) in self.call_ids.iter().enumerate() {
            let (takes, gives) = self.block_needs(id, new.of(b));
            (needed, freed) = (needed + takes, freed + gives);
        }
        let free = self.free.len() + freed;
        if needed > free {
            return Err(ShapeError::PoolFull {
                needed,
                free,
                blocks: self.blocks(),
            });
        }
        Ok(())
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
        let k = k.expect("a paged store stages no keys");
        // Room for the runs before anything changes: at most one per head of each block.
        let most = self.call_ids.iter().enumerate().map(|(b, &id)| {
            let (start, end) = (self.lengths[id], self.lengths[id] + new.of(b));
            (end.div_ceil(BLOCK_K) - start / BLOCK_K) * self.layout.n_kv_heads
        });
        let most = most.sum();
        let empty = Run {
            part: 0,
            source: 0,
            first: 0,
            count: 0,
        };
        try_grow(&mut self.runs, most, empty, "paged KV cache runs")?;
        for b in 0..self.call_ids.len() {
            self.prepare(self.call_ids[b], new.of(b));
        }
        let part = |side: usize, head_dim| Part {
            sizes: self.part_sizes[side],
            head_dim,
            slots: Slots {
                ring: Some(BLOCK_K),
            },
        };
        let keys = part(0, self.layout.head_dim);
        let values = part(1, self.layout.values.stored_dim());
        self.collect_runs(key_layout, new);
        let runs = self.runs.iter().copied();
        let pool = &mut *pool;
        write_keys(
            kernels,
            (&mut self.sides[0], keys),
            (k, key_layout.row),
            runs,
            (threads, pool),
        );
        if self.layout.values.is_rows() {
            // The same runs, their sources in the value rows.
            self.collect_runs(value_layout, new);
            let (v, runs) = ((v, value_layout.row), self.runs.iter().copied());
            write_values((&mut self.sides[1], values), v, runs, (threads, pool));
        }
        for (b, &id) in self.call_ids.iter().enumerate() {
            self.lengths[id] += new.of(b);
            self.call_lengths[b] = self.lengths[id];
        }
        Ok(())
    }
}
