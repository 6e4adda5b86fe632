//! Running independent work items on several threads.
//!
//! Every item is computed by exactly the same instructions whichever thread takes it, and no
//! reduction ever crosses items, so results are bit-identical for any thread count. The threads
//! are the caller's and its [`Pool`]'s workers (feature `std`), which stay alive between calls;
//! without `std`, or with one thread, items run in order on the calling thread.

#[cfg(feature = "std")]
use crate::kernels::threads::pool::{SharedWorkers, Workers};
#[cfg(feature = "std")]
use alloc::sync::Arc;

/// Runs the crate's work on threads a program already has (rayon, a job system, an async
/// runtime's blocking pool), for layers built with [`MhaBuilder::executor`].
///
/// [`run`](Executor::run) should call `job` up to `copies` times, at once on as many threads as
/// it likes (the calling thread may be one of them), and return when every call has returned
/// (safe code cannot do otherwise: `job` is borrowed for the call). It may also make fewer calls
/// or make them one after another: each call takes work items from one queue until it is
/// empty, and the layer runs `job` once more on the calling thread afterwards, so the work is
/// done however many calls ran, with the same bits. `job` never unwinds: a panic in the work
/// is caught inside it and re-raised on the layer's caller once `run` has returned.
///
/// With `std::thread::scope` (a scoped-thread executor; rayon's `scope` and `s.spawn` have the
/// same shape):
///
/// ```
/// use std::sync::Arc;
/// use mha::{Executor, Matrix, Mha, MhaParams, Tensor};
///
/// struct Scoped;
/// impl Executor for Scoped {
///     fn run(&self, copies: usize, job: &(dyn Fn() + Sync)) {
///         std::thread::scope(|s| {
///             for _ in 1..copies {
///                 s.spawn(job);
///             }
///             job(); // the calling thread takes a share too
///         });
///     }
/// }
///
/// let w = Matrix::<8, 8>::from_fn(|r, c| ((r * 3 + c) % 5) as f32 * 0.1);
/// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
/// let x = Tensor::<2, 5, 8>::from_fn(|b, t, i| (b + t + i) as f32 * 0.1);
/// let mut own = Mha::builder(&params, 2).threads(1).build()?;
/// let mut lent = Mha::builder(&params, 2)
///     .executor(Arc::new(Scoped))
///     .threads(3)
///     .min_work_per_thread(0)
///     .build()?;
/// assert_eq!(lent.forward(&x), own.forward(&x)); // bit for bit
/// # Ok::<(), mha::ShapeError>(())
/// ```
///
/// [`MhaBuilder::executor`]: crate::MhaBuilder::executor
#[cfg(feature = "std")]
pub trait Executor: Send + Sync {
    /// Calls `job` up to `copies` times, possibly at once on several threads, and returns when
    /// every call has returned.
    fn run(&self, copies: usize, job: &(dyn Fn() + Sync));
}

/// The threads a layer's work items run on beside the calling one: its own workers (the
/// default), a shared [`ThreadPool`](crate::ThreadPool)'s, or a program's [`Executor`]. Without `std` there are
/// none: every item runs on the calling thread.
#[derive(Default)]
pub(crate) struct Pool {
    #[cfg(feature = "std")]
    lender: Lender,
}

/// Who lends a [`Pool`] its threads.
#[cfg(feature = "std")]
enum Lender {
    /// Workers of this pool's owner alone, parked at the end of each of its calls.
    Own(Workers),
    /// A shared pool's workers, left spinning at the end of a call for the next layer's.
    Shared(SharedWorkers),
    /// The program's threads.
    External(Arc<dyn Executor>),
}

#[cfg(feature = "std")]
impl Default for Lender {
    fn default() -> Lender {
        Lender::Own(Workers::default())
    }
}

impl core::fmt::Debug for Pool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        #[cfg(feature = "std")]
        let lender = match &self.lender {
            Lender::Own(_) => "own workers",
            Lender::Shared(_) => "a shared ThreadPool",
            Lender::External(_) => "an Executor",
        };
        #[cfg(not(feature = "std"))]
        let lender = "the calling thread";
        f.debug_struct("Pool").field("threads", &lender).finish()
    }
}

impl Pool {
    /// The workers of `pool`, shared with every other layer built with it.
    #[cfg(feature = "std")]
    pub(crate) fn shared(pool: &SharedWorkers) -> Pool {
        Pool {
            lender: Lender::Shared(pool.clone()),
        }
    }

    /// The threads of `executor`.
    #[cfg(feature = "std")]
    pub(crate) fn external(executor: Arc<dyn Executor>) -> Pool {
        Pool {
            lender: Lender::External(executor),
        }
    }

    /// The owner's call is over: its own workers park now, so they burn nothing while the
    /// owner does other work between calls. A shared pool's keep spinning for a while, since
    /// the next call is likely another layer's.
    pub(crate) fn rest(&mut self) {
        #[cfg(feature = "std")]
        if let Lender::Own(workers) = &mut self.lender {
            workers.rest();
        }
    }

    /// Calls `job` on the calling thread and on up to `wanted` other threads at once, and
    /// returns when every call has returned (a panic in any is re-raised here after that).
    /// Fewer threads may join, or none; see [`share`] for why that leaves the work done.
    #[cfg(feature = "std")]
    fn run<F: Fn() + Sync>(&mut self, wanted: usize, job: &F) {
        match &mut self.lender {
            Lender::Own(workers) => {
                let helpers = workers.start(wanted);
                workers.run(helpers, job);
            }
            Lender::Shared(pool) => pool.with_workers(|workers| {
                let helpers = workers.start(wanted.min(pool.threads() - 1));
                workers.run(helpers, job);
            }),
            Lender::External(executor) => lend_to(&**executor, wanted, job),
        }
    }

    /// How many threads of its own this pool has started.
    #[cfg(all(test, feature = "std"))]
    pub(crate) fn own_workers(&self) -> usize {
        match &self.lender {
            Lender::Own(workers) => workers.count(),
            _ => 0,
        }
    }
}

/// Calls `job` through `executor` up to `wanted + 1` times, then once on the calling thread
/// (which finds the work done unless the executor made no call). A panic in a call is caught
/// there, so the executor never unwinds, and re-raised here once the executor has returned.
#[cfg(feature = "std")]
fn lend_to<F: Fn() + Sync>(executor: &dyn Executor, wanted: usize, job: &F) {
    use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
    let panic = std::sync::Mutex::new(None);
    let guarded = || {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(job)) {
            let mut first = panic.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert(payload);
        }
    };
    executor.run(wanted + 1, &guarded);
    if let Some(payload) = panic.into_inner().unwrap_or_else(|p| p.into_inner()) {
        resume_unwind(payload);
    }
    job();
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
        return share(pool, wanted, items, scratch, work);
    }
    #[cfg(not(feature = "std"))]
    let _ = (pool, wanted);
    if let Some(first) = scratch.first_mut() {
        for item in items {
            work(item, first);
        }
    }
}

/// [`for_each_item`] on the calling thread and up to `wanted` others: every call of the job
/// takes one scratch element, then items from the queue until it is empty. So however many
/// calls run (one is enough), once any call has returned with a scratch element the queue is
/// empty, and a call that finds no element left returns at once.
#[cfg(feature = "std")]
fn share<I, S, F>(pool: &mut Pool, wanted: usize, items: I, scratch: &mut [S], work: F)
where
    I: Iterator + Send,
    I::Item: Send,
    S: Send,
    F: Fn(I::Item, &mut S) + Sync,
{
    use std::sync::Mutex;
    let queue = Mutex::new(items);
    let slots = Mutex::new(scratch.iter_mut());
    pool.run(wanted, &|| {
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
    use crate::kernels::threads::pool::annotate;
    let mut guard = shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    annotate::acquired(shared);
    let next = guard.next();
    annotate::releasing(shared);
    drop(guard);
    next
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use std::panic::{self, AssertUnwindSafe};
    use std::vec;

    /// An executor on scoped threads that makes `calls` calls (clamped to what it is offered),
    /// the first on the calling thread.
    struct Scoped {
        calls: usize,
    }

    impl Executor for Scoped {
        fn run(&self, copies: usize, job: &(dyn Fn() + Sync)) {
            std::thread::scope(|s| {
                for _ in 1..self.calls.min(copies) {
                    s.spawn(job);
                }
                if self.calls > 0 {
                    job();
                }
            });
        }
    }

    /// Every kind of lender, with two threads besides the caller where it has threads.
    fn lenders() -> [Pool; 5] {
        let external = |calls| Pool::external(Arc::new(Scoped { calls }));
        [
            Pool::default(),
            Pool::shared(&SharedWorkers::new(3)),
            external(0),
            external(1),
            external(3),
        ]
    }

    #[test]
    fn every_item_runs_once_whoever_lends_the_threads() {
        for mut pool in lenders() {
            let mut scratch = vec![0u64; 3];
            for round in 0..300u64 {
                scratch.fill(0);
                let items = (0..round % 7).map(|i| i * round);
                for_each_item(&mut pool, items, &mut scratch, |item, sum| *sum += item);
                let want: u64 = (0..round % 7).map(|i| i * round).sum();
                assert_eq!(scratch.iter().sum::<u64>(), want, "{pool:?}, round {round}");
            }
        }
        let mut own = Pool::default();
        for_each_item(&mut own, 0..10, &mut [0, 0, 0], |_, _| {});
        assert_eq!(own.own_workers(), 2);
    }

    #[test]
    fn a_panic_in_one_item_reaches_the_caller_after_every_thread_stopped() {
        for mut pool in lenders() {
            for panicking in [0, 5, 31] {
                let mut scratch = vec![0usize; 3];
                let caught = panic::catch_unwind(AssertUnwindSafe(|| {
                    for_each_item(&mut pool, 0..32, &mut scratch, |item, ran| {
                        if item == panicking {
                            panic!("item {item} fails");
                        }
                        *ran += 1;
                    });
                }));
                let payload = caught.expect_err("the item's panic is re-raised");
                let message = payload.downcast_ref::<std::string::String>().unwrap();
                assert_eq!(*message, std::format!("item {panicking} fails"));
                // The items that ran are counted in the threads' scratch, and nothing runs
                // after the call has returned.
                let ran: usize = scratch.iter().sum();
                assert!(ran < 32);
                std::thread::sleep(std::time::Duration::from_millis(5));
                assert_eq!(scratch.iter().sum::<usize>(), ran);
            }
            // The threads still work after the panics.
            let mut scratch = vec![0usize; 3];
            for_each_item(&mut pool, 0..100, &mut scratch, |item, sum| *sum += item);
            assert_eq!(scratch.iter().sum::<usize>(), 4950, "{pool:?}");
        }
    }
}
