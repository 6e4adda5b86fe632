//! Running independent work items on several threads.
//!
//! Every item is computed by exactly the same instructions whichever thread takes it, and no
//! reduction ever crosses items, so results are bit-identical for any thread count. The threads
//! are the caller's and its [`Pool`]'s workers (feature `std`), which stay alive between calls;
//! without `std`, or with one thread, items run in order on the calling thread.

#[cfg(feature = "std")]
pub(crate) use super::pool::Pool;

/// Without `std` there are no other threads: every item runs on the calling thread.
#[cfg(not(feature = "std"))]
#[derive(Debug, Default)]
pub(crate) struct Pool {}

#[cfg(not(feature = "std"))]
impl Pool {
    /// Nothing to park.
    pub(crate) fn rest(&mut self) {}
}

/// Runs `work(item, scratch)` for every item, on up to `scratch.len()` threads (at least one):
/// the calling thread and workers of `pool`, started on first need.
///
/// Each running thread owns one element of `scratch` (its private workspace) for the whole call;
/// items are handed out one at a time in iterator order, so put the most expensive items first.
/// Returns once every item has been computed; a panic in `work` is re-raised here after every
/// thread has stopped using the items and the scratch.
pub(crate) fn for_each_item<I, S, F>(pool: &mut Pool, items: I, scratch: &mut [S], work: F)
where
    I: Iterator + Send,
    I::Item: Send,
    S: Send,
    F: Fn(I::Item, &mut S) + Sync,
{
    // No more helper threads than items beyond the calling thread's first, when the iterator
    // knows how many it has.
    let others = scratch.len().saturating_sub(1);
    let wanted = items
        .size_hint()
        .1
        .map_or(others, |n| n.saturating_sub(1).min(others));
    #[cfg(feature = "std")]
    if wanted > 0 {
        let helpers = pool.start(wanted);
        if helpers > 0 {
            return share(pool, helpers, items, scratch, work);
        }
    }
    #[cfg(not(feature = "std"))]
    let _ = (pool, wanted);
    if let Some(first) = scratch.first_mut() {
        for item in items {
            work(item, first);
        }
    }
}

/// [`for_each_item`] on the calling thread and `helpers` workers: every thread that joins takes
/// one scratch element, then items from the queue until it is empty.
#[cfg(feature = "std")]
fn share<I, S, F>(pool: &mut Pool, helpers: usize, items: I, scratch: &mut [S], work: F)
where
    I: Iterator + Send,
    I::Item: Send,
    S: Send,
    F: Fn(I::Item, &mut S) + Sync,
{
    use std::sync::Mutex;
    let queue = Mutex::new(items);
    let slots = Mutex::new(scratch.iter_mut());
    pool.run(helpers, &|| {
        let Some(scratch) = take(&slots) else {
            return;
        };
        while let Some(item) = take(&queue) {
            work(item, scratch);
        }
    });
}

/// The next element of a shared iterator. A poisoned lock (a `next` that panicked) is read on:
/// that panic is re-raised on the caller anyway.
#[cfg(feature = "std")]
fn take<T: Iterator>(shared: &std::sync::Mutex<T>) -> Option<T::Item> {
    use super::pool::annotate;
    let mut guard = shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    annotate::acquired(shared);
    let next = guard.next();
    annotate::releasing(shared);
    drop(guard);
    next
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
