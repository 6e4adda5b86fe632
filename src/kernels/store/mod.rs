//! The key/value stores and what they share: `kv` (a contiguous store: keys as `Kᵀ` panels,
//! values as rows, rolling windows), `paged` (a pool of key blocks and per-sequence block
//! tables), `layout` (the key block, a head's place in the store, [`BlockLayout`]: what one
//! block holds, and `ValueLayout`: value rows of their own, or values that are the keys' last
//! columns, MLA's latent stored once), `side` (where a part's keys or values, and `q8_0` scales, sit in a
//! side's elements, in its format: `format/`) and `view` (what the attention reads, and where
//! each key block lives). A call appends to and attends over any [`Store`].
//!
//! [`BlockLayout`]: layout::BlockLayout

use crate::error::ShapeError;
use crate::kernels::store::kv::NewTokens;
use crate::kernels::store::layout::HeadLayout;
use crate::kernels::store::view::KvView;
use crate::kernels::threads::parallel::Pool;
use crate::kernels::Kernels;

pub(crate) mod kv;
pub(crate) mod layout;
pub(crate) mod paged;
pub(crate) mod side;
pub(crate) mod view;

/// A store a call appends its new keys and values to, then attends over: batch element `b`
/// of the call appends `new.of(b)` tokens at its length (`view().lengths[b]`).
pub(crate) trait Store {
    /// The store as the attention reads it (for the call's batch elements).
    fn view(&self) -> KvView<'_>;

    /// `Ok` when every batch element's new tokens fit.
    ///
    /// # Errors
    /// An error naming the element and the numbers when one does not; the store is unchanged.
    fn check_room(&self, new: NewTokens<'_>) -> Result<(), ShapeError>;

    /// The position shift of each of the call's batch elements: its token `t` is at position
    /// `t + shift` unless a call places it (0 until a call does: [`Store::set_next_position`],
    /// or the sequence's positions are shifted).
    fn position_shifts(&self) -> &[isize];

    /// Places the call's batch element `b`'s next token at position `next` (after a call that
    /// placed its tokens at explicit positions, the last at `next - 1`).
    fn set_next_position(&mut self, b: usize, next: usize);

    /// The first token of the call's batch element `b` the store still holds: 0, unless a
    /// rolling store's ring or a windowed sequence's released blocks have dropped earlier ones.
    fn first_held(&self, b: usize) -> usize;

    /// Room for `len` projected keys `(B, rows, Hkv, d)` inside the store (an empty
    /// transient store lends its value buffer), when it has it, and the lengths.
    fn staging(&mut self, _len: usize) -> (Option<&mut [f32]>, &[usize]) {
        (None, self.view().lengths)
    }

    /// Appends the new tokens: keys `k` (or, `None`, the keys left in the
    /// [staging](Store::staging) room) and values `v` (not read by a store whose values are
    /// its keys' columns, [`ValueLayout::InKeys`](layout::ValueLayout::InKeys)), laid out by
    /// `layouts` (the keys', the values': value heads may be narrower or wider than key
    /// heads), element `b`'s first `new.of(b)` rows at its length; on up to `threads` threads
    /// (the calling one and `pool`'s workers).
    ///
    /// # Errors
    /// As [`Store::check_room`]; the store is unchanged.
    #[allow(clippy::too_many_arguments)]
    fn append(
        &mut self,
        kernels: &Kernels,
        k: Option<&[f32]>,
        v: &[f32],
        layouts: [HeadLayout; 2],
        new: NewTokens<'_>,
        threads: usize,
        pool: &mut Pool,
    ) -> Result<(), ShapeError>;
}
