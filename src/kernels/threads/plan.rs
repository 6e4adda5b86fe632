//! How many threads a layer has (`thread_count`) and each phase of a call uses.
//!
//! Each phase (projection, key/value append, attention, output projection) hands its items to
//! the calling thread and the layer's workers. Handing a phase to a worker costs a few
//! microseconds when it is spinning after the previous phase and tens when it must be woken,
//! and the caller then waits for the worker's last item, so a phase uses another thread only
//! when each gets at least `min_work_per_thread` multiply-adds. Work that streams an operand
//! from memory instead of reusing it from registers is weighted up. The results are the same
//! for any thread count; only the time changes.

use crate::kernels::Kernels;

/// The default `min_work_per_thread`: 1 Mi multiply-adds, 0.1 ms or so of a core's tiles, well
/// above a handover. (2 vCPUs of an EPYC, quiet machine, `small` (1, 128, 256, 4) at 2 threads
/// over 1: 0.62-0.69 of the time with this, 0.79-0.83 with 8 Mi; a decoding step over 1024
/// cached tokens: 0.54 against 0.80.)
pub(crate) const MIN_WORK_PER_THREAD: usize = 1 << 20;

/// `min_work_per_thread` of a one-shot call ([`mha_forward`](crate::mha_forward)), whose layer
/// lives for one call: each worker is a thread started and joined (tens of microseconds) with
/// scratch faulted in afresh, so another thread joins only when its share is 16 Mi
/// multiply-adds or more (half a millisecond or so of a core's tiles).
pub(crate) const ONE_SHOT_MIN_WORK_PER_THREAD: usize = 16 << 20;

/// How many tile multiply-adds one streamed multiply-add is worth: a few rows against the
/// weights (a decoding step's projections) or a single query against the keys and values read
/// an operand from memory for each multiply-add or few, about 10-30 times slower than the
/// register-blocked tiles (~0.15-0.4 ns against ~0.013 ns).
const STREAMED: usize = 16;

/// What one key/value value costs in the append (a transpose or copy through memory, about
/// 1.2 ns), in multiply-adds; a QK-norm or rotary pass over a projected value costs about as
/// much.
const APPENDED: usize = 64;

/// The dimensions of one call that decide its thread counts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallSize {
    /// Query rows per batch element `T` (new tokens, for a decoding step; the most of any
    /// element in a ragged call).
    pub queries: usize,
    /// Query rows over the batch: `B · T`, or fewer in a ragged call.
    pub rows: usize,
    /// Keys per batch element the attention reads `S`.
    pub keys: usize,
    /// Key/value rows projected and appended in this call, over the whole batch.
    pub kv_rows: usize,
    /// Model width `D`.
    pub d_model: usize,
    /// Query width `Q = n_heads · head_dim`.
    pub q_width: usize,
    /// Width of the tokens keys and values are projected from `E`.
    pub kv_source: usize,
    /// Key/value width `KV`.
    pub kv_width: usize,
    /// Query heads `H`.
    pub n_heads: usize,
    /// Width of one head `d`.
    pub head_dim: usize,
}

/// The threads each phase of one call uses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    /// The Q, K, V projections.
    pub projection: usize,
    /// The key transpose and value copy into the store.
    pub append: usize,
    /// The passes over each projected query and key row (QK-norm, RoPE).
    pub per_row: usize,
    /// The attention.
    pub attention: usize,
    /// The output projection.
    pub output: usize,
}

impl Plan {
    /// The plan for `size` on at most `threads` threads, one more thread per
    /// `min_work_per_thread` multiply-adds (0: every thread). Products saturate: they only
    /// pick a thread count.
    pub(crate) fn new(
        kernels: &Kernels,
        size: CallSize,
        threads: usize,
        min_work_per_thread: usize,
    ) -> Plan {
        let threads_for = |work: usize| match work.checked_div(min_work_per_thread) {
            Some(n) => n.clamp(1, threads),
            None => threads,
        };
        let work = |factors: &[usize]| factors.iter().fold(1usize, |w, &f| w.saturating_mul(f));
        // A few rows share each streamed weight: STREAMED / rows per multiply-add. (A few are
        // at most `mr`: zero-width tokens can make `rows` anything, even `usize::MAX`.)
        let streamed = |rows: usize| {
            if (1..=kernels.mr).contains(&rows) && kernels.few_rows(rows) {
                STREAMED / rows
            } else {
                1
            }
        };
        let (rows, d_model) = (size.rows, size.d_model);
        let projection = work(&[rows, d_model, size.q_width]).saturating_add(work(&[
            size.kv_rows,
            size.kv_source,
            2,
            size.kv_width,
        ]));
        // One query streams the keys and values, and its heads are separate work items.
        let one_query = if size.queries == 1 { STREAMED } else { 1 };
        let attention = work(&[rows, size.n_heads, size.keys, size.head_dim, one_query]);
        Plan {
            projection: threads_for(projection.saturating_mul(streamed(rows.max(size.kv_rows)))),
            append: threads_for(work(&[size.kv_rows, size.kv_width, APPENDED])),
            per_row: threads_for(work(&[rows, size.q_width, APPENDED]).saturating_add(work(&[
                size.kv_rows,
                size.kv_width,
                APPENDED,
            ]))),
            attention: threads_for(attention),
            output: threads_for(work(&[rows, size.q_width, d_model, streamed(rows)])),
        }
    }

    /// The most threads any phase uses: how many scratch spaces to reserve.
    pub(crate) fn most(&self) -> usize {
        self.projection
            .max(self.append)
            .max(self.per_row)
            .max(self.attention)
            .max(self.output)
    }
}

/// The most threads a layer uses, whatever it is asked for (each brings its own scratch).
pub(crate) const MAX_THREADS: usize = 256;

/// The thread count for a request of `threads`: 0 means the number of CPUs the OS lets this
/// process use (1 without `std`); at most [`MAX_THREADS`].
pub(crate) fn thread_count(threads: usize) -> usize {
    let threads = if threads == 0 {
        default_threads()
    } else {
        threads
    };
    threads.min(MAX_THREADS)
}

/// The number of CPUs the OS lets this process use when first asked (1 without `std`).
fn default_threads() -> usize {
    #[cfg(feature = "std")]
    {
        // Asked once: the OS answer reads affinity and cgroup limits, costlier than a small call.
        static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
    #[cfg(not(feature = "std"))]
    {
        1
    }
}
