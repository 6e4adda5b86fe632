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
//! - **Sequences** are ids into `tables` / `lengths` / `shifts`; a removed id is reused by the
//!   next sequence added. Token `t` of a sequence is at position `t + shift` (0 until a call
//!   places its tokens at explicit positions or [`PagedStore::shift`] moves them).
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
    shift_to, write_keys, write_values, NewTokens, Part, Run, Slots, StoreShape,
};
use crate::kernels::store::layout::{BlockLayout, HeadLayout, BLOCK_K};
use crate::kernels::store::side::{self, HeadSizes};
use crate::kernels::store::view::{Blocks, KvView};
use crate::kernels::store::Store;
use crate::kernels::threads::parallel::Pool;
use crate::kernels::Kernels;

/// What [`PagedStore::shift`] does to each moved key's `d` features (widened).
pub(crate) type KeyTurn<'t> = &'t dyn Fn(&mut [f32]);

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
    /// Per sequence id: its position shift (token `t` at position `t + shift`).
    shifts: Vec<isize>,
    live: Vec<bool>,
    /// The sequences of the current call, their lengths and shifts (the call's batch).
    call_ids: Vec<usize>,
    call_lengths: Vec<usize>,
    call_shifts: Vec<isize>,
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
            shifts: Vec::new(),
            live: Vec::new(),
            call_ids: Vec::new(),
            call_lengths: Vec::new(),
            call_shifts: Vec::new(),
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

    /// The position of sequence `id`'s next token (its length plus its shift).
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not a live sequence.
    pub(crate) fn position(&self, id: usize) -> Result<usize, ShapeError> {
        self.check_id(id)?;
        // A shift keeps every held position at least 0 (checked where it is set).
        Ok(self.lengths[id].saturating_add_signed(self.shifts[id]))
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
            self.shifts[id] = 0;
            return Ok(id);
        }
        let id = self.live.len();
        const WHAT: &str = "paged KV cache sequences";
        try_grow(&mut self.tables, id + 1, Vec::new(), WHAT)?;
        try_grow(&mut self.lengths, id + 1, 0, WHAT)?;
        try_grow(&mut self.shifts, id + 1, 0, WHAT)?;
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
        self.shifts[fork] = self.shifts[id];
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

    /// Moves the positions of sequence `id`'s tokens from index `from` on, and of those to
    /// come, by `delta`, turning each of those keys by `turn` (its `d` features, widened, then
    /// rounded back) after copying the blocks holding them that other sequences share;
    /// without `turn` only the next position moves. (A key carries its position in its
    /// rotation; the store keeps only the next token's.)
    ///
    /// # Errors
    /// [`ShapeError::SequenceId`] when `id` is not live; [`ShapeError::PositionShift`] when
    /// `from` is past its tokens or its next token would be at a negative position;
    /// [`ShapeError::PoolFull`] when the pool cannot hold copies of the shared blocks;
    /// [`ShapeError::AllocationFailed`] for the keys' scratch. Nothing changes on an error.
    pub(crate) fn shift(
        &mut self,
        id: usize,
        (from, delta): (usize, isize),
        turn: Option<KeyTurn<'_>>,
    ) -> Result<(), ShapeError> {
        let next = self.position(id)?;
        let refuse = |reason| ShapeError::PositionShift { id, delta, reason };
        if from > self.lengths[id] {
            return Err(refuse("the tokens to move start past its length"));
        }
        if next.checked_add_signed(delta).is_none() {
            return Err(refuse("its next token would be at a negative position"));
        }
        let moved = next
            .checked_add_signed(delta)
            .filter(|&p| p <= isize::MAX as usize);
        let Some(shift) = moved.and_then(|_| self.shifts[id].checked_add(delta)) else {
            return Err(refuse("its next token would be past isize::MAX"));
        };
        if let Some(turn) = turn.filter(|_| self.layout.head_dim > 0) {
            let mut key = Vec::new();
            let d = self.layout.head_dim;
            try_grow(&mut key, d, 0.0, "paged KV cache: a shifted key")?;
            self.own_from(id, from)?;
            self.turn_keys((id, from), turn, &mut key);
        }
        self.shifts[id] = shift;
        Ok(())
    }

    /// Makes the blocks holding sequence `id`'s tokens from `from` on its own (copies of the
    /// shared ones).
    ///
    /// # Errors
    /// [`ShapeError::PoolFull`] when the pool has too few free blocks (nothing changes).
    fn own_from(&mut self, id: usize, from: usize) -> Result<(), ShapeError> {
        let first = from / BLOCK_K;
        let held = self.tables[id].iter().skip(first);
        let needed = held
            .filter(|&&b| b != RELEASED && self.refs[b as usize] > 1)
            .count();
        if needed > self.free.len() {
            return Err(ShapeError::PoolFull {
                needed,
                free: self.free.len(),
                blocks: self.blocks(),
            });
        }
        let mut table = core::mem::take(&mut self.tables[id]);
        for entry in table.iter_mut().skip(first) {
            if *entry != RELEASED {
                *entry = self.own(*entry);
            }
        }
        self.tables[id] = table;
        Ok(())
    }

    /// Turns the keys of sequence `id` from index `from` on (in blocks it holds alone) by
    /// `turn`, each widened into `key` (`d` floats) and rounded back.
    fn turn_keys(&mut self, (id, from): (usize, usize), turn: KeyTurn<'_>, key: &mut [f32]) {
        let (d, heads) = (self.layout.head_dim, self.layout.n_kv_heads);
        let (sizes, length) = (self.part_sizes[0], self.lengths[id]);
        for (n, &block) in self.tables[id].iter().enumerate().skip(from / BLOCK_K) {
            if block == RELEASED {
                continue;
            }
            let slots = from.saturating_sub(n * BLOCK_K)..(length - n * BLOCK_K).min(BLOCK_K);
            for part in block as usize * heads..(block as usize + 1) * heads {
                for slot in slots.clone() {
                    for (p, feature) in key.iter_mut().enumerate() {
                        *feature = side::key(&self.sides[0], (part, sizes, d), p, slot);
                    }
                    turn(key);
                    let one = [part].into_iter();
                    let sizes = [sizes.elements, sizes.scales];
                    let mut region = self.sides[0].parts_at_mut(one, sizes).next();
                    let region = region.as_mut().expect("a part of the pool");
                    side::write_key(region, key, slot);
                }
            }
        }
    }

    /// The first token sequence `id` still holds (blocks before it released by its window).
    fn first_held_of(&self, id: usize) -> usize {
        let released = self.tables[id].iter().take_while(|&&b| b == RELEASED);
        released.count() * BLOCK_K
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
        self.call_shifts.clear();
        try_grow(&mut self.call_ids, ids.len(), 0, WHAT)?;
        try_grow(&mut self.call_lengths, ids.len(), 0, WHAT)?;
        try_grow(&mut self.call_shifts, ids.len(), 0, WHAT)?;
        self.call_ids.copy_from_slice(ids);
        for (b, &id) in ids.iter().enumerate() {
            (self.call_lengths[b], self.call_shifts[b]) = (self.lengths[id], self.shifts[id]);
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
            if !length.is_multiple_of(BLOCK_K) {
                let last = &mut table[length / BLOCK_K];
                *last = self.own(*last);
            }
            let last = (length + new - 1) / BLOCK_K + 1;
            while table.len() < last {
                let block = self.take_block();
                table.push(block);
            }
        }
        self.tables[id] = table;
    }

    /// `block` held once: itself, or (when other sequences hold it too) a copy taken from
    /// the pool (which has room: the caller checked), the reference to `block` dropped.
    fn own(&mut self, block: u32) -> u32 {
        if self.refs[block as usize] == 1 {
            return block;
        }
        let parts = self.layout.n_kv_heads;
        let copy = self.take_block();
        let sizes = self.part_sizes.map(|s| [s.elements, s.scales]);
        let moved = (block as usize * parts, copy as usize * parts, parts);
        for (side, sizes) in self.sides.iter_mut().zip(sizes) {
            side.copy_parts(moved, sizes);
        }
        self.release(block);
        copy
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
    fn position_shifts(&self) -> &[isize] {
        &self.call_shifts
    }

    fn set_next_position(&mut self, b: usize, next: usize) {
        let id = self.call_ids[b];
        self.shifts[id] = shift_to(next, self.lengths[id]);
        self.call_shifts[b] = self.shifts[id];
    }

    fn first_held(&self, b: usize) -> usize {
        let Some(&id) = self.call_ids.get(b) else {
            return 0;
        };
        self.first_held_of(id)
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
