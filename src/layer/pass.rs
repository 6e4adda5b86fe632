//! The one path every call of a layer takes: check and plan, project, normalise the queries and
//! keys (QK-norm, when the layer has it) and the values (a value norm), rotate the queries and
//! keys (a layer with a rotary embedding), append the new keys and values to a store, attend, project the output.
//!
//! A forward pass or a cross-attention appends to a transient store that starts empty; a
//! decoding step appends to its [`KvCache`](crate::KvCache). Prefill is therefore a decoding
//! step into an empty store, by construction.

use alloc::vec::Vec;

use super::builder::Settings;
use crate::error::{check_dimension, ShapeError};
use crate::kernels::attention::flash::{self, AttentionShape, FlashScratch, Operands};
use crate::kernels::attention::mask::Visibility;
use crate::kernels::attention::weights;
use crate::kernels::buffer::{element_count, run_time_len, try_grow};
use crate::kernels::gemm::{self, GemmScratch, Output as Segment};
use crate::kernels::store::kv::{KvStore, NewTokens, StoreShape};
use crate::kernels::store::layout::{HeadLayout, ValueLayout};
use crate::kernels::store::view::KvView;
use crate::kernels::store::Store;
use crate::kernels::threads::parallel::{self, Pool};
use crate::kernels::threads::plan::{CallSize, Plan, MAX_THREADS};
use crate::kernels::workspace::Workspace;
use crate::kernels::{Compute, Kernels};
use crate::layer::norm::{value_norm, QkNormPlacement};
use crate::layer::options::{AttendOptions, AttentionWeights, Masking};
use crate::layer::rope::{RopePositions, RopeRows};
use crate::layer::scores::AlibiPositions;
use crate::layer::tokens::{Output, Tokens};

/// One call's inputs: `x (batch, queries, D)` (or ragged, `(Σ lengths, D)`) and, for
/// cross-attention, the memory `(batch, new_keys, E)`. Built from [`Tokens`] whose widths the
/// caller checked, so every buffer holds its shape.
pub(crate) struct Call<'a> {
    pub x: &'a [f32],
    pub batch: usize,
    /// Tokens per batch element (ragged: the most of any).
    pub queries: usize,
    /// Ragged tokens: each element's (also its [`AttendOptions::token_lengths`]).
    pub ragged: Option<&'a [usize]>,
    /// The memory's values, when keys and values do not come from `x`.
    pub memory: Option<&'a [f32]>,
    /// Key/value tokens per batch element this call projects and appends.
    pub new_keys: usize,
    pub options: AttendOptions<'a>,
}

impl<'a> Call<'a> {
    /// Self-attention of `x`: keys and values from `x` too. Ragged tokens are a batch whose
    /// token lengths are theirs.
    ///
    /// # Errors
    /// [`ShapeError::Ragged`] for ragged tokens with [`AttendOptions::token_lengths`].
    pub(crate) fn new(x: Tokens<'a>, mut options: AttendOptions<'a>) -> Result<Self, ShapeError> {
        if let Some(lengths) = x.lengths() {
            if options.token_lengths.is_some() {
                return Err(ShapeError::Ragged {
                    what:
                        "with AttendOptions::token_lengths (the ragged lengths are the real tokens)",
                });
            }
            options.token_lengths = Some(lengths);
        }
        Ok(Call {
            x: x.as_slice(),
            batch: x.batch(),
            queries: x.len(),
            ragged: x.lengths(),
            memory: None,
            new_keys: x.len(),
            options,
        })
    }

    /// The tokens each batch element appends to the store: its real tokens of `x`
    /// ([`AttendOptions::token_lengths`]), or all of the memory's; a ragged call's from the
    /// rows `starts` places them at.
    fn new_tokens<'s>(&'s self, starts: Option<&'s [usize]>) -> NewTokens<'s> {
        NewTokens {
            rows: self.new_keys,
            lengths: self.options.token_lengths.filter(|_| self.memory.is_none()),
            starts,
        }
    }

    /// Query rows over the batch: `B · T`, or the ragged lengths' sum.
    ///
    /// # Errors
    /// [`ShapeError::TooLarge`] when `B · T` overflows (zero-width tokens only).
    fn rows(&self) -> Result<usize, ShapeError> {
        match self.ragged {
            Some(lengths) => Ok(lengths.iter().sum()),
            None => element_count(&[self.batch, self.queries]),
        }
    }

    /// The output fits the call: `(B, T)` as its tokens, or ragged of the same lengths.
    ///
    /// # Errors
    /// [`ShapeError::DimensionMismatch`], [`ShapeError::Ragged`] or
    /// [`ShapeError::RaggedOutput`] naming the numbers that differ.
    fn check_output(&self, out: &Output<'_>) -> Result<(), ShapeError> {
        let Some(lengths) = self.ragged else {
            if out.lengths().is_some() {
                return Err(ShapeError::Ragged {
                    what: "as the output of tokens that are not ragged",
                });
            }
            check_dimension("output batch (B)", self.batch, out.batch())?;
            return check_dimension("output length (T)", self.queries, out.len());
        };
        let held = out.lengths().unwrap_or(&[]);
        for (sequence, &tokens) in lengths.iter().enumerate() {
            let output = held.get(sequence).copied();
            if output != Some(tokens) {
                return Err(ShapeError::RaggedOutput {
                    sequence,
                    tokens,
                    output,
                });
            }
        }
        check_dimension("ragged output sequences (B)", self.batch, held.len())
    }

    /// Keys and values from `memory` instead (of `x`'s batch; checked by the caller).
    pub(crate) fn with_memory(self, memory: Tokens<'a>) -> Self {
        Call {
            memory: Some(memory.as_slice()),
            new_keys: memory.len(),
            ..self
        }
    }
}

/// The value rows of a layer's stores: `dv` wide.
pub(crate) fn value_rows(layer: &Settings) -> ValueLayout {
    ValueLayout::Rows {
        dim: layer.value_dim,
    }
}

/// A call's names for the buffers of its [`Workspace`] (the layer's own or its shared pool's),
/// kept between calls; they only grow.
pub(crate) struct Buffers<'w> {
    /// `(B, T, Q)` queries, i.e. `(B, T, H, d)`: read head by head in place.
    q: &'w mut Vec<f32>,
    /// `(B, S, KV)` keys, as projected, for a cache (the transient store stages them in its
    /// value buffer instead: see [`KeysIn`]); free once appended.
    k: &'w mut Vec<f32>,
    /// `(B, S, V)` values, as projected; once appended, the merged `(B, T, H·dv)` attention
    /// output.
    v_then_merged: &'w mut Vec<f32>,
    /// `(B, T, G)` output gate values, as projected (a layer with an output gate).
    gate: &'w mut Vec<f32>,
    /// The keys and values of a forward pass or cross-attention.
    store: &'w mut KvStore,
    gemm: &'w mut Vec<GemmScratch>,
    flash: &'w mut Vec<FlashScratch>,
    /// ALiBi's ranks of the keys of a call with a padding mask, `(B, S + 1)`.
    ranks: &'w mut Vec<usize>,
    /// A KV-shared layer's call: each sequence's tokens in the source store before the
    /// call's, `(B)`.
    before: &'w mut Vec<usize>,
    /// Where a call's rows sit and their positions, when not by the rectangular rule
    /// ([`RowPlaces`]).
    places: &'w mut Vec<usize>,
}

impl<'w> Buffers<'w> {
    /// The buffers of `workspace` under this call's names.
    pub(crate) fn new(workspace: &'w mut Workspace) -> Buffers<'w> {
        let Workspace {
            floats: [q, k, v_then_merged, gate, ..],
            counts: [ranks, before, places],
            store,
            gemm,
            flash,
        } = workspace;
        Buffers {
            q,
            k,
            v_then_merged,
            gate,
            store,
            gemm,
            flash,
            ranks,
            before,
            places,
        }
    }
    /// Buffers for `rows` query rows of widths `[Q, H·dv]` (queries, merged heads) and of
    /// `gate_width` output gates, and `kv_rows` key/value rows of widths `[KV, V]` (the keys
    /// in the workspace unless `keys_in` stages them in the store), and scratch for `threads`
    /// threads. The sizes come from the caller's tokens, so they are reserved fallibly.
    ///
    /// # Errors
    /// [`ShapeError::AllocationFailed`] when a buffer cannot be had (the call writes nothing).
    fn reserve(
        &mut self,
        (rows, [q_width, merged_width], gate_width): (usize, [usize; 2], usize),
        (kv_rows, [kv_width, v_width]): (usize, [usize; 2]),
        keys_in: KeysIn,
        threads: usize,
    ) -> Result<(), ShapeError> {
        let queries = rows.saturating_mul(q_width);
        try_grow(self.q, queries, 0.0, "queries (B, T, Q)")?;
        let gates = rows.saturating_mul(gate_width);
        try_grow(self.gate, gates, 0.0, "output gates (B, T, G)")?;
        if keys_in == KeysIn::Workspace {
            let kv_len = kv_rows.saturating_mul(kv_width);
            try_grow(self.k, kv_len, 0.0, "keys (B, S, KV)")?;
        }
        let values = kv_rows.saturating_mul(v_width);
        let merged = values.max(rows.saturating_mul(merged_width));
        try_grow(self.v_then_merged, merged, 0.0, "values and merged heads")?;
        let threads = threads.max(self.gemm.len());
        self.gemm.resize_with(threads, GemmScratch::default);
        self.flash.resize_with(threads, FlashScratch::default);
        Ok(())
    }
}

/// One call's view of its layer: the settings it reads, the scratch and the workers it uses.
pub(crate) struct Pass<'l> {
    pub settings: &'l Settings,
    pub workspace: Buffers<'l>,
    pub pool: &'l mut Pool,
}

impl Pass<'_> {
    /// Runs `call` with its keys and values appended to `cache` (a decoding step, into a
    /// [`KvCache`](crate::KvCache)'s store or a paged cache's sequences) or to the
    /// workspace's transient store (a forward pass or cross-attention).
    pub(crate) fn run(
        &mut self,
        call: Call<'_>,
        cache: Option<&mut dyn Store>,
        mut out: Output<'_>,
    ) -> Result<(), ShapeError> {
        call.check_output(&out)?;
        let mut transient = core::mem::take(self.workspace.store);
        let done = match cache {
            Some(cache) => self
                .check_cache(&call, cache)
                .and_then(|()| self.pass(&call, Keys::Append(cache, KeysIn::Workspace), &mut out)),
            None => self.reset_transient(&call, &mut transient).and_then(|()| {
                self.pass(&call, Keys::Append(&mut transient, KeysIn::Store), &mut out)
            }),
        };
        *self.workspace.store = transient;
        self.pool.rest();
        done
    }

    /// Runs the call of a KV-shared layer: its queries attend over `source`, a store another
    /// layer has already appended this call's keys and values to (the last
    /// `token_lengths[b]`, or `T`, tokens of each sequence), read in place.
    pub(crate) fn run_shared(
        &mut self,
        call: Call<'_>,
        source: &dyn Store,
        mut out: Output<'_>,
    ) -> Result<(), ShapeError> {
        call.check_output(&out)?;
        let mut before = core::mem::take(self.workspace.before);
        let done = self
            .check_shared(&call, source.view(), &mut before)
            .and_then(|()| self.check_shared_reach(source, &before))
            .and_then(|()| self.pass(&call, Keys::Shared(source, &before), &mut out));
        *self.workspace.before = before;
        self.pool.rest();
        done
    }

    /// A source store fits a KV-shared layer's call when it has the layer's key/value heads,
    /// head width, formats and value rows, a rolling window only if it is the layer's, the
    /// call's batch, and in each sequence at least the call's tokens; `before` gets each
    /// sequence's tokens before them.
    fn check_shared(
        &self,
        call: &Call<'_>,
        source: KvView<'_>,
        before: &mut Vec<usize>,
    ) -> Result<(), ShapeError> {
        use alloc::string::ToString;
        let layer = self.settings;
        let mismatch = |what, needed: &dyn ToString, held: &dyn ToString| ShapeError::SharedCache {
            what,
            needed: needed.to_string(),
            held: held.to_string(),
        };
        let (needed, held) = (layer.n_kv_heads, source.n_kv_heads);
        if needed != held {
            return Err(mismatch("key/value heads", &needed, &held));
        }
        let (needed, held) = (layer.head_dim, source.head_dim);
        if needed != held {
            return Err(mismatch("heads of width", &needed, &held));
        }
        let formats = |f: crate::kernels::store::layout::KvFormats| {
            alloc::format!("{:?}", (f.keys, f.values))
        };
        if source.formats != layer.kv_formats || source.values != value_rows(layer) {
            let (needed, held) = (formats(layer.kv_formats), formats(source.formats));
            return Err(mismatch("key/value formats", &needed, &held));
        }
        if source.window.is_some() && source.window != layer.reach() {
            let window = |w: Option<usize>| alloc::format!("{w:?}");
            let (needed, held) = (window(layer.reach()), window(source.window));
            return Err(mismatch("a rolling window of", &needed, &held));
        }
        check_dimension(
            "shared KV cache batch (B)",
            call.batch,
            source.lengths.len(),
        )?;
        call.options.check_token_lengths(call.batch, call.queries)?;
        let new = call.new_tokens(None);
        before.clear();
        try_grow(before, call.batch, 0, "shared KV cache call")?;
        for (b, (&held, before)) in source.lengths.iter().zip(before).enumerate() {
            *before = held.checked_sub(new.of(b)).ok_or_else(|| {
                let needed = alloc::format!("at least {} (this call's) in sequence {b}", new.of(b));
                mismatch(
                    "tokens:",
                    &needed,
                    &alloc::format!("{held} in sequence {b}"),
                )
            })?;
        }
        Ok(())
    }

    /// A layer with a reach ([`Settings::reach`]: a window or a chunk) has each sequence's
    /// first query (at `before[b]`) see no key before `before[b] + 1 - reach`: the source
    /// store must still hold those (a rolling ring or a paged sequence drops earlier ones as
    /// its own calls move on, so a shared call may not have more tokens than the source's last
    /// call appended).
    fn check_shared_reach(&self, source: &dyn Store, before: &[usize]) -> Result<(), ShapeError> {
        let Some(reach) = self.settings.reach() else {
            return Ok(());
        };
        for (b, &first) in before.iter().enumerate() {
            let (needed, held) = ((first + 1).saturating_sub(reach), source.first_held(b));
            if needed < held {
                return Err(ShapeError::SharedCache {
                    what: "keys from",
                    needed: alloc::format!("{needed} on (more tokens than the source's last call)"),
                    held: alloc::format!("{held} on (sequence {b})"),
                });
            }
        }
        Ok(())
    }

    fn kernels(&self) -> &'static Kernels {
        self.settings.weights.kernels()
    }

    /// A cache fits a call when a layer of this shape, instruction set (and reach, for a
    /// rolling cache: [`Settings::reach`]) made it for the call's batch (so it keeps value rows: not an
    /// [`MlaLayer`](crate::MlaLayer)'s latent cache).
    fn check_cache(&self, call: &Call<'_>, cache: &dyn Store) -> Result<(), ShapeError> {
        let (layer, cache) = (self.settings, cache.view());
        if cache.n_kv_heads != layer.n_kv_heads
            || cache.head_dim != layer.head_dim
            || cache.values != value_rows(layer)
            || cache.formats != layer.kv_formats
            || cache.window.is_some_and(|w| Some(w) != layer.reach())
        {
            return Err(ShapeError::CacheMismatch);
        }
        check_dimension("KV cache batch (B)", call.batch, cache.lengths.len())
    }

    /// Makes the transient store empty with room for the call's keys.
    fn reset_transient(&self, call: &Call<'_>, store: &mut KvStore) -> Result<(), ShapeError> {
        let shape = StoreShape {
            batch: call.batch,
            n_kv_heads: self.settings.n_kv_heads,
            head_dim: self.settings.head_dim,
            capacity: call.new_keys,
            rolling: None,
            formats: self.settings.kv_formats,
            values: value_rows(self.settings),
        };
        store.reset(shape)
    }

    /// Check and plan, then [`steps`](Self::steps): project, QK-norm, rotate, append, attend,
    /// project the output.
    fn pass(
        &mut self,
        call: &Call<'_>,
        keys: Keys<'_>,
        out: &mut Output<'_>,
    ) -> Result<(), ShapeError> {
        let layer = self.settings;
        call.options.check_token_lengths(call.batch, call.queries)?;
        let new = call.new_tokens(None);
        if let Keys::Append(store, _) = &keys {
            // Before any work: a full cache is an error that costs nothing.
            store.check_room(new)?;
        }
        let (store, before) = keys.before();
        let shape = AttentionShape {
            batch: call.batch,
            n_heads: layer.n_heads,
            n_kv_heads: layer.n_kv_heads,
            q_len: call.queries,
            kv_len: keys_after(before, new, call.queries)?,
            head_dim: layer.head_dim,
        };
        let rows = call.rows()?;
        let mask_batch_stride = call
            .options
            .check(shape.batch, shape.q_len, shape.kv_len, rows)?;
        size_weights(shape, &store, out.parts().1)?;
        let terms = &layer.score_terms;
        terms.check_call_reach(layer.window, || farthest_distance(before, new, call))?;
        // A KV-shared layer projects no keys or values; a ragged call's keys are its rows.
        let kv_rows = match keys {
            Keys::Append(..) if call.ragged.is_some() => rows,
            Keys::Append(..) => element_count(&[call.batch, new.rows])?,
            Keys::Shared(..) => 0,
        };
        let plan = self.plan(shape, rows, kv_rows);
        // The ranks and the rows' places are scratch the steps borrow: out of the workspace
        // while they run.
        let mut ranks = core::mem::take(self.workspace.ranks);
        let mut places = core::mem::take(self.workspace.places);
        let shifts = keys.shifts();
        let done = alibi_ranks(layer, call, shape.kv_len, &mut ranks)
            .and_then(|alibi| Ok((alibi, row_places(call, (before, shifts), &mut places)?)))
            .and_then(|(alibi_ranks, places)| {
                let checked = Checked {
                    shape,
                    rows: (rows, kv_rows),
                    places,
                    plan,
                    mask_batch_stride,
                    alibi_ranks,
                };
                match keys {
                    Keys::Append(store, keys_in) => {
                        self.steps(call, (store, keys_in), checked, out)
                    }
                    Keys::Shared(source, before) => {
                        self.shared_steps(call, (source, before), checked, out)
                    }
                }
            });
        *self.workspace.ranks = ranks;
        *self.workspace.places = places;
        done
    }

    /// Project, QK-norm, rotate, append, attend, project the output, for a call that passed
    /// the checks of [`pass`](Self::pass).
    fn steps(
        &mut self,
        call: &Call<'_>,
        (store, keys_in): (&mut dyn Store, KeysIn),
        checked: Checked<'_>,
        out: &mut Output<'_>,
    ) -> Result<(), ShapeError> {
        let layer = self.settings;
        let (places, starts) = (checked.places, checked.places.starts);
        let (new, (rows, kv_rows), plan) = (call.new_tokens(starts), checked.rows, &checked.plan);
        let (q_width, kv_width) = (layer.widths.query, layer.widths.kv);
        let (v_width, merged) = (layer.widths.value, layer.widths.merged());
        let kv_len = kv_rows.saturating_mul(kv_width);
        let keys_in = match keys_in {
            KeysIn::Store if store.staging(kv_len).0.is_some() => KeysIn::Store,
            _ => KeysIn::Workspace,
        };
        let sizes = (rows, kv_rows);
        let gate_width = layer.gate_width();
        self.workspace.reserve(
            (rows, [q_width, merged], gate_width),
            (kv_rows, [kv_width, v_width]),
            keys_in,
            plan.most(),
        )?;
        // The workspace's key buffer leaves it while the projections borrow the workspace.
        let mut own_keys = core::mem::take(self.workspace.k);
        let (keys, cached) = match keys_in {
            KeysIn::Store => match store.staging(kv_len) {
                (Some(room), cached) => (room, cached),
                (None, cached) => (&mut own_keys[..kv_len], cached),
            },
            KeysIn::Workspace => (&mut own_keys[..kv_len], store.view().lengths),
        };
        self.project(call, sizes, keys, plan);
        let prepared = self.normalise_and_rotate(call, (cached, places), sizes, keys, plan);
        let layouts =
            [(layer.head_dim, kv_width), (layer.value_dim, v_width)].map(|(d, w)| HeadLayout {
                batch: new.rows * w,
                head: d,
                row: w,
            });
        let (kernels, v) = (self.kernels(), &self.workspace.v_then_merged[..]);
        let (threads, pool) = (plan.append, &mut *self.pool);
        let k = (keys_in == KeysIn::Workspace).then_some(&own_keys[..]);
        let appended =
            prepared.and_then(|()| store.append(kernels, k, v, layouts, new, threads, pool));
        *self.workspace.k = own_keys;
        appended?;
        keep_positions(call, starts, store);
        let visibility = visibility(layer, call, &checked, store.view().lengths);
        let rows = (rows, starts);
        self.execute((checked.shape, rows), store.view(), visibility, plan, out)
    }

    /// Project, normalise and rotate the queries of a KV-shared layer's call that passed the
    /// checks of [`pass`](Self::pass), then attend over `source` (where each sequence held
    /// `before[b]` tokens before the call's) and project the output.
    fn shared_steps(
        &mut self,
        call: &Call<'_>,
        (source, before): (&dyn Store, &[usize]),
        checked: Checked<'_>,
        out: &mut Output<'_>,
    ) -> Result<(), ShapeError> {
        let layer = self.settings;
        let (rows, plan) = (checked.rows.0, &checked.plan);
        let widths = layer.widths;
        let queries = (rows, [widths.query, widths.merged()], layer.gate_width());
        let no_keys = (0, [widths.kv, widths.value]);
        self.workspace
            .reserve(queries, no_keys, KeysIn::Store, plan.most())?;
        self.project(call, (rows, 0), &mut [], plan);
        let places = checked.places;
        self.normalise_and_rotate(call, (before, places), (rows, 0), &mut [], plan)?;
        let visibility = visibility(layer, call, &checked, source.view().lengths);
        let rows = (rows, places.starts);
        self.execute((checked.shape, rows), source.view(), visibility, plan, out)
    }

    /// The threads of each phase (see [`Plan`]).
    fn plan(&self, shape: AttentionShape, rows: usize, kv_rows: usize) -> Plan {
        let layer = self.settings;
        let size = CallSize {
            queries: shape.q_len,
            rows,
            keys: shape.kv_len,
            kv_rows,
            d_model: layer.widths.d_model,
            q_width: layer.widths.query,
            kv_source: layer.widths.memory,
            kv_width: layer.widths.kv,
            n_heads: layer.n_heads,
            head_dim: layer.head_dim,
        };
        Plan::new(
            self.kernels(),
            size,
            layer.threads,
            layer.min_work_per_thread,
        )
    }
}

/// The steps of a call, after its checks and plan.
impl Pass<'_> {
    /// Steps 1 and 2: `Q (B, T, Q)`, `K (B, S, KV)` (into `keys`) and `V (B, S, V)`, each
    /// the split-heads layout `(B, T, H, d)` (values `(B, S, Hkv, dv)`) before its transpose, and the output gates
    /// `(B, T, G)` of a gated layer. Self-attention projects all of them with one GEMM against
    /// `[Wq | Wk | Wv (| Wg)]`; cross-attention projects `Q` (and the gates) from `x` and
    /// `K, V` from the memory; a KV-shared layer only `Q` (and the gates). A layer whose values
    /// are its keys packs no `Wv`: `K` is copied to `V` after the product (the same bits).
    fn project(
        &mut self,
        call: &Call<'_>,
        (rows, kv_rows): (usize, usize),
        keys: &mut [f32],
        plan: &Plan,
    ) {
        let layer = self.settings;
        let widths = layer.widths;
        let (q_width, kv_width, v_width) = (widths.query, widths.kv, widths.value);
        let ws = &mut self.workspace;
        let scratch = &mut ws.gemm[..plan.projection];
        let [bq, bk, bv, _] = layer.biases.rows();
        let q = segment(&mut ws.q[..rows * q_width], q_width, bq);
        let k = segment(&mut *keys, kv_width, bk);
        let v = segment(&mut ws.v_then_merged[..kv_rows * v_width], v_width, bv);
        let gate_width = layer.gate_width();
        let g = layer.gate.as_ref().map(|gate| {
            let gates = &mut ws.gate[..rows * gate_width];
            segment(gates, gate_width, gate.bias.as_deref())
        });
        let (packed, pool) = (&layer.weights, &mut *self.pool);
        let (x, d_model, projection) = (call.x, widths.d_model, &packed.projection);
        // `x` projects keys and values too unless they come from the memory or a source layer.
        let x_projects_kv = call.memory.is_none() && !layer.kv_shared;
        // Values from the keys: `Wv` is not packed; the keys are copied after the product.
        let from_keys = layer.values_from_keys;
        match (x_projects_kv, g) {
            (true, None) if from_keys => {
                gemm::gemm_pieces(x, d_model, rows, projection, 0, [q, k], scratch, pool)
            }
            (true, Some(g)) if from_keys => {
                gemm::gemm_pieces(x, d_model, rows, projection, 0, [q, k, g], scratch, pool)
            }
            (true, None) => {
                gemm::gemm_pieces(x, d_model, rows, projection, 0, [q, k, v], scratch, pool)
            }
            (true, Some(g)) => {
                gemm::gemm_pieces(x, d_model, rows, projection, 0, [q, k, v, g], scratch, pool)
            }
            (false, g) => {
                match g {
                    None => gemm::gemm_pieces(x, d_model, rows, projection, 0, [q], scratch, pool),
                    Some(g) => {
                        gemm::gemm_pieces(x, d_model, rows, projection, 0, [q, g], scratch, pool)
                    }
                }
                if let Some(memory) = call.memory {
                    project_memory(layer, (memory, kv_rows), (k, v), scratch, pool);
                }
            }
        }
        if from_keys && !layer.kv_shared {
            let len = kv_rows * kv_width;
            ws.v_then_merged[..len].copy_from_slice(&keys[..len]);
        }
    }

    /// Step 2b: QK-norm (when the layer has it) before or after RoPE (a layer with a rotary
    /// embedding), then the position-dependent query scale (a layer with one), of the
    /// projected queries (`rows`) and keys (`kv_rows`) in place, and the value norm of the
    /// values (`kv_rows`; a layer with one), before the append, so the store holds
    /// normalised, rotated keys and normalised values. Token `t` of sequence `b` is at its
    /// explicit position, or at `cached[b] + t` (its tokens before the call) moved by the
    /// sequence's shift; its index is `cached[b] + t` (`places` holds them when the call is
    /// ragged or shifted). Every check comes first: an error (a position beyond the table)
    /// leaves everything unchanged. Each row is one work item's alone, so the rows go to
    /// `plan.per_row` threads in chunks.
    ///
    /// # Errors
    /// As [`RopeAngles::rotate`].
    fn normalise_and_rotate(
        &mut self,
        call: &Call<'_>,
        (cached, places): (&[usize], RowPlaces<'_>),
        (rows, kv_rows): (usize, usize),
        keys: &mut [f32],
        plan: &Plan,
    ) -> Result<(), ShapeError> {
        let (positions, index) = rope_positions(call, cached, places);
        let layer = self.settings;
        let (q_width, kv_width, v_width) =
            (layer.widths.query, layer.widths.kv, layer.widths.value);
        let q_rows = rope_rows(rows, layer.n_heads, q_width);
        let k_rows = rope_rows(kv_rows, layer.n_kv_heads, kv_width);
        let v_rows = rope_rows(kv_rows, layer.n_kv_heads, v_width);
        if let Some(angles) = &layer.rope {
            angles.check(rows * q_width, q_rows, positions)?;
            if !layer.kv_shared {
                angles.check(kv_rows * kv_width, k_rows, positions)?;
            }
        } else if layer.qk_norm.is_none()
            && layer.query_scale.is_none()
            && layer.value_norm.is_none()
        {
            return Ok(());
        }
        let threads = plan.per_row.clamp(1, MAX_THREADS);
        let chunk = rows.max(kv_rows).div_ceil(4 * threads).max(1);
        let ws = &mut self.workspace;
        // The values join the items only when the layer normalises them.
        let values: &mut [f32] = match layer.value_norm {
            Some(_) => &mut ws.v_then_merged[..kv_rows * v_width],
            None => &mut [],
        };
        let parts = [
            (&mut ws.q[..rows * q_width], Part::Queries, q_rows),
            (keys, Part::Keys, k_rows),
            (values, Part::Values, v_rows),
        ];
        let items = parts.into_iter().flat_map(|(buffer, kind, all)| {
            let chunks = buffer.chunks_mut(chunk * all.row_stride.max(1));
            chunks
                .enumerate()
                .map(move |(i, part)| (part, i * chunk, all, kind))
        });
        let mut workers = [(); MAX_THREADS];
        parallel::for_each_item(
            self.pool,
            items,
            &mut workers[..threads],
            |(part, first, all, kind), ()| {
                let count = part.len() / all.row_stride.max(1);
                let rows = (all, first..first + count, kind);
                prepare_rows(layer, part, rows, (positions, index));
            },
        );
        Ok(())
    }

    /// Steps 3 to 5: attention of the queries over the store's keys (and the weights when
    /// `out` asks for them), then the output projection into `out`.
    fn execute(
        &mut self,
        (shape, (rows, starts)): (AttentionShape, (usize, Option<&[usize]>)),
        store: KvView<'_>,
        visibility: Visibility<'_>,
        plan: &Plan,
        out: &mut Output<'_>,
    ) -> Result<(), ShapeError> {
        let layer = self.settings;
        let (d_model, q_width) = (layer.widths.d_model, layer.widths.query);
        let merged_width = layer.widths.merged();
        let kernels = self.kernels();
        let ws = &mut self.workspace;
        let (out, weights_out) = out.parts();
        let operands = Operands {
            q: &ws.q[..rows * q_width],
            q_layout: HeadLayout {
                batch: shape.q_len * q_width,
                head: shape.head_dim,
                row: q_width,
            },
            q_starts: starts,
            scale: layer.scale,
            store,
            terms: &layer.score_terms,
            bf16: layer.attention_compute == Compute::Bf16,
        };
        let merged = &mut ws.v_then_merged[..rows * merged_width];
        let scratch = &mut ws.flash[..plan.attention];
        let pool = &mut *self.pool;
        attend(
            kernels,
            shape,
            operands,
            visibility,
            weights_out,
            merged,
            scratch,
            pool,
        );
        if let Some(gate) = &layer.gate {
            let gates = &ws.gate[..rows * layer.gate_width()];
            gate.apply(merged, gates, layer.value_dim);
        }
        let [_, _, _, bo] = layer.biases.rows();
        let output = [segment(out, d_model, bo)];
        let scratch = &mut ws.gemm[..plan.output];
        let packed = &layer.weights.output;
        gemm::gemm_with(merged, merged_width, rows, packed, 0, output, scratch, pool);
        Ok(())
    }
}

/// What the checks of a call found: its shape and rows, the threads of its phases, and the
/// parts of its visibility rule computed before any step.
struct Checked<'r> {
    shape: AttentionShape,
    /// Query rows and key/value rows over the batch.
    rows: (usize, usize),
    /// Where the rows sit and their positions, beyond the rectangular rule.
    places: RowPlaces<'r>,
    plan: Plan,
    mask_batch_stride: usize,
    /// ALiBi's ranks of the keys, `S + 1` per batch element ([`alibi_ranks`]).
    alibi_ranks: Option<&'r [usize]>,
}

/// Where a call's rows sit and which positions they take, where the rectangular rule
/// (element `b`'s `T` rows from `b · T`, token `t` at position `cached[b] + t`) does not
/// say: a ragged call's `starts` (element `b`'s rows from `starts[b]` to `starts[b + 1]`) and
/// each row's `index` in its sequence; a shifted call's (a store shifting some sequence's
/// positions: [`Store::position_shifts`]) `first` position of each sequence and, ragged, each row's
/// `positions`.
#[derive(Clone, Copy, Default)]
struct RowPlaces<'r> {
    starts: Option<&'r [usize]>,
    index: Option<&'r [usize]>,
    first: Option<&'r [usize]>,
    positions: Option<&'r [usize]>,
}

/// The places of `call`'s rows, kept in `buffer`; `before[b]` counts sequence `b`'s tokens
/// before the call's (checked by [`keys_after`]: the indices fit) and `shifts[b]` moves its
/// positions (they stay at least 0: see [`Store::position_shifts`]).
///
/// # Errors
/// [`ShapeError::Overflow`] or [`ShapeError::AllocationFailed`] when the buffer cannot be had.
fn row_places<'r>(
    call: &Call<'_>,
    (before, shifts): (&[usize], &[isize]),
    buffer: &'r mut Vec<usize>,
) -> Result<RowPlaces<'r>, ShapeError> {
    let batch = call.batch;
    let shifted = shifts.iter().any(|&shift| shift != 0);
    let rows = call.ragged.map_or(0, |lengths| lengths.iter().sum());
    let ragged = call.ragged.map_or(0, |_| batch + 1 + rows);
    let (first_len, positions_len) = match (shifted, call.ragged.is_some()) {
        (false, _) => (0, 0),
        (true, ragged) => (batch, if ragged { rows } else { 0 }),
    };
    const WHAT: &str = "row places (B + 1 + Σ lengths, B, Σ lengths)";
    let len = ragged
        .saturating_add(first_len)
        .saturating_add(positions_len);
    try_grow(buffer, run_time_len::<usize>(WHAT, &[len])?, 0, WHAT)?;
    let (ragged, shifted_part) = buffer[..len].split_at_mut(ragged);
    let (first, positions) = shifted_part.split_at_mut(first_len);
    for ((first, &held), &shift) in first.iter_mut().zip(before).zip(shifts) {
        *first = held.saturating_add_signed(shift);
    }
    let first = shifted.then_some(&*first);
    let Some(lengths) = call.ragged else {
        return Ok(RowPlaces {
            first,
            ..RowPlaces::default()
        });
    };
    let (starts, index) = ragged.split_at_mut(batch + 1);
    let mut row = 0;
    for (b, &tokens) in lengths.iter().enumerate() {
        starts[b] = row;
        for (t, slot) in index[row..row + tokens].iter_mut().enumerate() {
            *slot = before[b] + t;
        }
        if let Some(first) = first {
            for (t, slot) in positions[row..row + tokens].iter_mut().enumerate() {
                *slot = first[b] + t;
            }
        }
        row += tokens;
    }
    starts[batch] = row;
    Ok(RowPlaces {
        starts: Some(starts),
        index: Some(index),
        first,
        positions: shifted.then_some(&*positions),
    })
}

/// After a call that placed its tokens at explicit positions, each sequence's next token
/// follows its last one (unless it added none).
fn keep_positions(call: &Call<'_>, starts: Option<&[usize]>, store: &mut dyn Store) {
    let Some(positions) = call.options.positions.filter(|_| call.memory.is_none()) else {
        return;
    };
    let new = call.new_tokens(starts);
    for b in 0..call.batch {
        let tokens = new.of(b);
        if tokens > 0 {
            let first = starts.map_or(b * call.queries, |starts| starts[b]);
            store.set_next_position(b, positions[first + tokens - 1].saturating_add(1));
        }
    }
}

/// Where a call's keys and values come from.
enum Keys<'s> {
    /// Projected from the call's tokens and appended to this store (the keys waiting where
    /// [`KeysIn`] says).
    Append(&'s mut dyn Store, KeysIn),
    /// Already in a source layer's store (a KV-shared layer), which held `before[b]` tokens
    /// of sequence `b` before the call's.
    Shared(&'s dyn Store, &'s [usize]),
}

impl Keys<'_> {
    /// The position shifts of the call's sequences.
    fn shifts(&self) -> &[isize] {
        match self {
            Keys::Append(store, _) => store.position_shifts(),
            Keys::Shared(store, _) => store.position_shifts(),
        }
    }

    /// The store's view and each sequence's tokens before the call's.
    fn before(&self) -> (KvView<'_>, &[usize]) {
        match self {
            Keys::Append(store, _) => {
                let view = store.view();
                (view, view.lengths)
            }
            Keys::Shared(store, before) => (store.view(), before),
        }
    }
}

/// Which keys each query of `call` sees in a store whose sequences hold `lengths` keys once
/// the call's are in: the layer's masking, window and chunk, the call's masks, the checked
/// ALiBi ranks.
fn visibility<'v>(
    layer: &Settings,
    call: &'v Call<'_>,
    checked: &Checked<'v>,
    lengths: &'v [usize],
) -> Visibility<'v> {
    Visibility {
        causal: layer.masking == Masking::Causal,
        window: layer.window,
        chunk: layer.chunk,
        queries: call.queries,
        element_keys: Some(lengths),
        masks: call.options.masks(),
        mask_batch_stride: checked.mask_batch_stride,
        alibi_ranks: checked.alibi_ranks,
    }
}

/// The ranks ALiBi places the call's keys at (see
/// [`AlibiPositions::RealTokens`](crate::AlibiPositions::RealTokens)), in `ranks`: for each
/// batch element, `S + 1` counts of its real keys before each position of its padding mask.
/// `None` (keys at their index) unless the layer has ALiBi by rank and the call a padding mask.
///
/// # Errors
/// [`ShapeError::Overflow`] or [`ShapeError::AllocationFailed`] when the counts cannot be had.
fn alibi_ranks<'r>(
    layer: &Settings,
    call: &Call<'_>,
    kv_len: usize,
    ranks: &'r mut Vec<usize>,
) -> Result<Option<&'r [usize]>, ShapeError> {
    let by_rank = layer.alibi_positions == AlibiPositions::RealTokens;
    let mask = call.options.key_padding_mask;
    let Some(mask) = mask.filter(|_| by_rank && layer.score_terms.slopes.is_some()) else {
        return Ok(None);
    };
    const WHAT: &str = "ALiBi ranks (B, S + 1)";
    // `kv_len` is at most isize::MAX (see `keys_after`).
    let per_element = kv_len + 1;
    let len = run_time_len::<usize>(WHAT, &[call.batch, per_element])?;
    try_grow(ranks, len, 0, WHAT)?;
    for (b, before) in ranks[..len].chunks_exact_mut(per_element).enumerate() {
        let real = &mask[b * kv_len..][..kv_len];
        let mut count = 0;
        before[0] = 0;
        for (slot, &is_real) in before[1..].iter_mut().zip(real) {
            count += usize::from(is_real);
            *slot = count;
        }
    }
    Ok(Some(&ranks[..len]))
}

/// Where a call's projected keys wait for the append.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KeysIn {
    /// The workspace's key buffer: a cache's calls, so that a decoding loop's first call sizes
    /// every buffer the loop needs.
    Workspace,
    /// The [staging](Store::staging) room of the store, which is empty (the transient
    /// store of a forward pass or cross-attention), when it is large enough: a call needs no
    /// key buffer of its own.
    Store,
}

/// The call's key axis `S`: the most keys any batch element holds once `new` is appended.
///
/// # Errors
/// [`ShapeError::Overflow`] when a batch element's keys or the call's `queries` would pass
/// `isize::MAX`, beyond the signed positions the attention places queries and keys at
/// (reachable only with zero-width tokens, or through a rolling cache after 2^63 tokens).
fn keys_after(lengths: &[usize], new: NewTokens<'_>, queries: usize) -> Result<usize, ShapeError> {
    const MOST: usize = isize::MAX as usize;
    if queries > MOST && !lengths.is_empty() {
        return Err(ShapeError::Overflow {
            what: "query positions (T)",
            dims: alloc::vec![queries],
        });
    }
    let mut most = None;
    for (b, &held) in lengths.iter().enumerate() {
        let after = held.checked_add(new.of(b)).filter(|&keys| keys <= MOST);
        let after = after.ok_or_else(|| ShapeError::Overflow {
            what: "key positions (cached + new tokens)",
            dims: alloc::vec![held, new.of(b)],
        })?;
        most = most.max(Some(after));
    }
    Ok(most.unwrap_or(new.rows))
}

/// The largest `|j - i|` between the position `i` of one of the call's queries and a key `j`
/// of its batch element, over the batch: element `b`'s keys are `0 .. keys_b` (with `new`
/// appended) and its `T` query rows are at `keys_b - real_b + t`, `real_b` its real tokens
/// (as [`Visibility`] places them), so the corners of that rectangle decide.
fn farthest_distance(lengths: &[usize], new: NewTokens<'_>, call: &Call<'_>) -> usize {
    let farthest_in = |(b, &held): (usize, &usize)| {
        let keys = (held + new.of(b)) as i128;
        if keys == 0 || call.queries == 0 {
            return 0;
        }
        let real = call.options.token_lengths.map_or(call.queries, |l| l[b]);
        let first = keys - real as i128;
        // A ragged call has only its real rows.
        let rows = if call.ragged.is_some() {
            real
        } else {
            call.queries
        };
        if rows == 0 {
            return 0;
        }
        let last = first + rows as i128 - 1;
        let corners = [first, last].map(|i| i.abs().max((keys - 1 - i).abs()));
        corners[0].max(corners[1]).unsigned_abs()
    };
    let farthest = lengths.iter().enumerate().map(farthest_in).max();
    usize::try_from(farthest.unwrap_or(0)).unwrap_or(usize::MAX)
}

/// The rotary positions of `call`'s rows and their indices: token `t` of sequence `b` at
/// its explicit position, else at `cached[b] + t` moved by the sequence's shift; its index
/// `cached[b] + t` (per row in `places` when the call is ragged or shifted).
fn rope_positions<'p>(
    call: &Call<'p>,
    cached: &'p [usize],
    places: RowPlaces<'p>,
) -> (RopePositions<'p>, RopePositions<'p>) {
    let per_sequence = |starts| RopePositions::PerSequence {
        starts,
        len: call.queries,
    };
    let index = places
        .index
        .map_or(per_sequence(cached), RopePositions::Explicit);
    let shifted = match (places.positions, places.first) {
        (Some(positions), _) => RopePositions::Explicit(positions),
        (None, Some(first)) => per_sequence(first),
        (None, None) => index,
    };
    let positions = call.options.positions;
    (positions.map_or(shifted, RopePositions::Explicit), index)
}

/// Which projected rows a work item of step 2b holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Queries,
    Keys,
    Values,
}

/// Step 2b on the rows `range` of `all` (`part` starts at row `range.start`) of `kind`:
/// QK-norm before or after RoPE as the layer places it, then the query scale of the queries;
/// the value norm of the values. Each row on its own. `positions` are RoPE's, `index` each
/// token's index.
fn prepare_rows(
    layer: &Settings,
    part: &mut [f32],
    (all, range, kind): (RopeRows, core::ops::Range<usize>, Part),
    (positions, index): (RopePositions<'_>, RopePositions<'_>),
) {
    if kind == Part::Values {
        if let Some(eps) = layer.value_norm {
            value_norm(part, layer.value_dim, eps);
        }
        return;
    }
    let normalise = |part: &mut [f32]| match &layer.qk_norm {
        Some(norm) if kind == Part::Keys => norm.keys(part),
        Some(norm) => norm.queries(part),
        None => {}
    };
    let placement = layer.qk_norm_placement;
    if placement == QkNormPlacement::BeforeRope {
        normalise(part);
    }
    if let Some(angles) = &layer.rope {
        angles.rotate_rows(part, all, positions, range.clone());
    }
    if placement == QkNormPlacement::AfterRope {
        normalise(part);
    }
    if let Some(scale) = layer.query_scale.as_ref().filter(|_| kind == Part::Queries) {
        scale.scale_rows(part, all.row_stride, (positions, index), range);
    }
}

/// `rows` rows of `heads` heads, `width` floats apart.
fn rope_rows(rows: usize, heads: usize, width: usize) -> RopeRows {
    RopeRows {
        rows,
        heads,
        row_stride: width,
    }
}

/// Cross-attention's `K` and `V` (only `K` when the layer's values are its keys) from the
/// memory's `kv_rows` rows.
fn project_memory(
    layer: &Settings,
    (memory, kv_rows): (&[f32], usize),
    (k, v): (Segment<'_>, Segment<'_>),
    scratch: &mut [GemmScratch],
    pool: &mut Pool,
) {
    let (kv, first_col) = layer.weights.key_value(layer.widths.query);
    let e = layer.widths.memory;
    match layer.values_from_keys {
        true => gemm::gemm_pieces(memory, e, kv_rows, kv, first_col, [k], scratch, pool),
        false => gemm::gemm_pieces(memory, e, kv_rows, kv, first_col, [k, v], scratch, pool),
    }
}

/// One output segment of a GEMM.
fn segment<'a>(buffer: &'a mut [f32], width: usize, bias: Option<&'a [f32]>) -> Segment<'a> {
    Segment {
        buffer,
        width,
        bias,
    }
}

/// Steps 3 and 4: `merged (B, T, H·d) = softmax(scale · Q Kᵀ, masked) V` over the store's keys,
/// and the attention weights `(B, H, T, S)` into `weights` when given, sized by
/// [`size_weights`] (`S` as [`weights::columns`]: bounded by the window through a rolling
/// store); on one thread per `scratch` entry, the calling one and `pool`'s workers.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    kernels: &Kernels,
    shape: AttentionShape,
    operands: Operands<'_>,
    visibility: Visibility<'_>,
    weights: Option<&mut AttentionWeights>,
    merged: &mut [f32],
    scratch: &mut [FlashScratch],
    pool: &mut Pool,
) {
    if let Some(weights_out) = weights {
        let data = &mut weights_out.data;
        weights::attention_weights(kernels, shape, &operands, &visibility, data);
    }
    flash::attention(kernels, shape, operands, visibility, merged, scratch, pool);
}

/// Sizes `weights`, when a call asks for them, as the `(B, H, T, S)` weights of a call of
/// `shape` over `store` (`S` as [`weights::columns`]), before anything is appended: a size
/// that overflows or cannot be allocated refuses the call with the store as it was.
fn size_weights(
    shape: AttentionShape,
    store: &KvView<'_>,
    weights: Option<&mut AttentionWeights>,
) -> Result<(), ShapeError> {
    let Some(weights) = weights else {
        return Ok(());
    };
    const WHAT: &str = "attention weights (B, H, T, S)";
    let columns = weights::columns(shape, store);
    let dims = [shape.batch, shape.n_heads, shape.q_len, columns];
    let len = run_time_len::<f32>(WHAT, &dims)?;
    // Every entry is written by `attend`: the buffer only needs the length.
    weights.data.truncate(len);
    try_grow(&mut weights.data, len, 0.0, WHAT)?;
    weights.shape = dims;
    Ok(())
}
