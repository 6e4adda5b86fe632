//! Running independent work items on several threads.
//!
//! Every item is computed by exactly the same instructions whichever thread takes it, and no
//! reduction ever crosses items, so results are bit-identical for any thread count. Threads come
//! from `std::thread::scope` (feature `std`); without `std`, or with one thread, items run in
//! order on the calling thread.

/// Runs `work(item, scratch)` for every item, on up to `scratch.len()` threads (at least one).
///
/// Each running thread owns one element of `scratch` (its private workspace) for the whole call;
/// items are handed out one at a time in iterator order, so put the most expensive items first.
pub(crate) fn for_each_item<I, S, F>(items: I, scratch: &mut [S], work: F)
where
    I: Iterator + Send,
    I::Item: Send,
    S: Send,
    F: Fn(I::Item, &mut S) + Sync,
{
    let Some((first, others)) = scratch.split_first_mut() else {
        return;
    };
    // No more helper threads than items beyond the calling thread's first, when the iterator
    // knows how many it has.
    #[cfg(feature = "std")]
    let helpers = items
        .size_hint()
        .1
        .map_or(others.len(), |n| n.saturating_sub(1).min(others.len()));
    #[cfg(feature = "std")]
    if helpers > 0 {
        let queue = std::sync::Mutex::new(items);
        let next = || match queue.lock() {
            Ok(mut guard) => guard.next(),
            Err(poisoned) => poisoned.into_inner().next(),
        };
        let run = |scratch: &mut S| {
            while let Some(item) = next() {
                work(item, scratch);
            }
        };
        std::thread::scope(|scope| {
            for scratch in others.iter_mut().take(helpers) {
                // A thread the OS refuses is simply not used: the items it would have taken go
                // to the others, with the same results.
                if std::thread::Builder::new()
                    .spawn_scoped(scope, || run(scratch))
                    .is_err()
                {
                    break;
                }
            }
            run(first);
        });
        return;
    }
    #[cfg(not(feature = "std"))]
    let _ = others;
    for item in items {
        work(item, first);
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
