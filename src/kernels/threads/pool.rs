//! Worker threads that stay alive between calls and are lent work that borrows the caller's
//! stack.
//!
//! A [`Workers`] set belongs to one owner: a layer, or a [`SharedWorkers`] set (a
//! [`ThreadPool`](crate::ThreadPool)'s) that any number of layers share behind a mutex, so one
//! job at a time runs on it. It starts its workers when a call first asks for them; between the phases of one call they spin briefly for the next job (so phases hand over
//! without a sleep), and when the owner's call is over ([`Pool::rest`]) or the spin runs out
//! they park on a condition variable, so they burn nothing while the owner does other work.
//! It joins them when dropped (a [`SharedWorkers`]' when its last handle goes). There is no
//! global state: each set's workers see only that set's [`Shared`] block.
//!
//! # Safety argument
//!
//! [`Workers::run`] hands its helpers a [`Job`]: a type-erased pointer to a closure on the
//! caller's stack, whose borrows end when `run` returns. Calling the job is sound because of
//! one invariant:
//!
//! > **`run` does not return, and does not unwind, until every worker that took the job has
//! > returned from it; and no worker can take it afterwards.**
//!
//! It holds because:
//! 1. A worker calls a job only after claiming a ticket, and claims, counts itself in
//!    `running` and copies the job in one critical section of `state`. `finish` revokes the
//!    unclaimed tickets, waits until `running` is zero, and clears the job in critical sections
//!    of the same mutex, so once it returns no worker is inside the job or can enter it.
//! 2. A worker leaves `running` only after the job call has returned — normally or by a
//!    panic caught by `catch_unwind` — and never touches the job (or anything it points to)
//!    again. Its own bookkeeping after that uses only the `Arc`'d [`Shared`], which the pool
//!    keeps alive.
//! 3. Between posting the job and `finish` nothing on the caller's side can unwind: the
//!    caller's own share of the work runs inside `catch_unwind`, lock poisoning is recovered
//!    from (no code panics while holding the lock), and waking and waiting do not panic. A
//!    panic of the work, on any thread, is re-raised on the caller only after `finish`.
//! 4. `run` takes `&mut self`, so one set runs one job at a time: the single job slot is
//!    never overwritten while workers may read it, and the set cannot be dropped mid-job. A
//!    [`SharedWorkers`] set hands out `&mut Workers` only through its mutex's guard, held for the
//!    whole `run`.
//! 5. The closure is `Sync`, so calling it through a shared reference from several threads
//!    at once is what its type allows; the `F` behind the erased pointer is the `F` the
//!    trampoline [`call`] was instantiated with, by construction in [`Job::new`].
//!
//! A leaked set (`mem::forget`) leaves its workers parked forever; they hold no borrowed data,
//! so that is a leak, not a dangling borrow.
//!
//! # Checking it with valgrind
//!
//! Helgrind sees pthread locks but not the futex-based ones of `std::sync`. Built with
//! `RUSTFLAGS="--cfg mha_valgrind"`, every lock the pool's threads share reports its acquires
//! and releases to helgrind ([`annotate`]), so helgrind orders exactly what the locks order and
//! reports any other pair of unordered accesses, e.g. a worker touching borrowed data after the
//! call returned.

use std::any::Any;
use std::boxed::Box;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use std::vec::Vec;

/// How long a worker spins for the next job, and the caller for the workers to finish, before
/// parking on the condition variable: long enough to cover the gap between two phases of a
/// call, including a phase's uneven end (a worker done early waits for the caller's last
/// item). A worker stops spinning as soon as the owner's call is over ([`Pool::rest`]), so the
/// spin costs CPU time only inside a call, never while the owner does other work; a spin
/// shorter than the gap between phases would turn each hand-over into a park and a wake-up.
const SPIN: Duration = Duration::from_micros(200);

/// Worker threads owned by one layer or one [`SharedWorkers`] set; none until a call asks for them.
pub(crate) struct Workers {
    /// The block the workers share with the owner; made with the first worker.
    shared: Option<Arc<Shared>>,
    workers: Vec<JoinHandle<()>>,
    /// How long its threads spin before parking: [`SPIN`] (tests lengthen it).
    spin: Duration,
}

impl Default for Workers {
    fn default() -> Workers {
        Workers {
            shared: None,
            workers: Vec::new(),
            spin: SPIN,
        }
    }
}

impl core::fmt::Debug for Workers {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Workers")
            .field("workers", &self.workers.len())
            .finish()
    }
}

/// What the owner and its workers share.
struct Shared {
    state: Mutex<State>,
    /// Workers wait here for tickets or shutdown.
    work: Condvar,
    /// The owner waits here for `running` to reach zero.
    done: Condvar,
    /// `State::posted`, readable without the lock: what a spinning worker watches.
    posted: AtomicUsize,
    /// `State::running`, readable without the lock: what a spinning owner watches.
    running: AtomicUsize,
    /// How long a thread spins before parking.
    spin: Duration,
}

/// The pool's state, behind `Shared::state`. The atomics in [`Shared`] are hints that end a
/// spin early; every decision is made on these fields, under the lock.
#[derive(Default)]
struct State {
    /// The current job, while tickets may be claimed or workers run it.
    job: Option<Job>,
    /// Workers that may still start the current job.
    tickets: usize,
    /// Workers inside the current job.
    running: usize,
    /// Workers waiting on `Shared::work`.
    parked: usize,
    /// Jobs, rests and the shutdown posted so far, wrapping: a spinning worker waits for it to
    /// change.
    posted: usize,
    /// The first panic caught in a worker during the current job.
    panic: Option<Box<dyn Any + Send>>,
    /// Set when the pool is dropped: workers return.
    shutdown: bool,
}

/// A borrowed `F: Fn() + Sync` with its type erased: the closure's address and the trampoline
/// that calls it as an `F`.
#[derive(Clone, Copy)]
struct Job {
    data: *const (),
    call: unsafe fn(*const ()),
}

// SAFETY: a `Job` is only made from a `&F` with `F: Sync` (`Job::new`), so calling it from
// another thread is calling `&F` there, which `Sync` allows. When it may be called is the
// module's invariant (see the safety argument).
unsafe impl Send for Job {}

impl Job {
    fn new<F: Fn() + Sync>(f: &F) -> Job {
        Job {
            data: (f as *const F).cast(),
            call: call::<F>,
        }
    }
}

/// Calls the `F` at `data`.
///
/// # Safety
/// `data` is the address of an `F` that is alive for the whole call.
unsafe fn call<F: Fn() + Sync>(data: *const ()) {
    // SAFETY: by this function's contract `data` points to a live `F`.
    let f = unsafe { &*data.cast::<F>() };
    f();
}

impl Shared {
    fn new(spin: Duration) -> Arc<Shared> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            done: Condvar::new(),
            posted: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            spin,
        });
        annotate::untracked(&shared.posted);
        annotate::untracked(&shared.running);
        shared
    }

    /// The state, also when a thread panicked holding the lock (no code does: the state is
    /// consistent at every unlock).
    fn lock(&self) -> MutexGuard<'_, State> {
        let guard = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        annotate::acquired(&self.state);
        guard
    }

    /// Releases the state.
    fn unlock(&self, guard: MutexGuard<'_, State>) {
        annotate::releasing(&self.state);
        drop(guard);
    }

    /// Waits on `condvar`, recovering a poisoned lock as [`Shared::lock`] does.
    fn wait<'a>(&self, condvar: &Condvar, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        annotate::releasing(&self.state);
        let guard = condvar
            .wait(guard)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        annotate::acquired(&self.state);
        guard
    }
}

/// Spins until `ready()` or `spin` has passed; whether it became ready.
fn spin_until(spin: Duration, ready: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            core::hint::spin_loop();
        }
        if start.elapsed() >= spin {
            return ready();
        }
    }
}

impl Workers {
    /// Starts workers until there are `helpers` (fewer if the OS refuses a thread: the work
    /// then goes to the others, with the same results); returns how many of them there are.
    pub(crate) fn start(&mut self, helpers: usize) -> usize {
        while self.workers.len() < helpers {
            let spin = self.spin;
            let shared = Arc::clone(self.shared.get_or_insert_with(|| Shared::new(spin)));
            let spawned = std::thread::Builder::new()
                .name("mha-worker".into())
                .spawn(move || worker(&shared));
            match spawned {
                Ok(handle) => self.workers.push(handle),
                Err(_) => break,
            }
        }
        helpers.min(self.workers.len())
    }

    /// How many workers are running.
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        self.workers.len()
    }

    /// The owner's call is over: workers spinning for its next phase park now, so they burn
    /// nothing while the owner does other work between calls.
    pub(crate) fn rest(&mut self) {
        if let Some(shared) = &self.shared {
            let mut state = shared.lock();
            post(shared, &mut state);
            shared.unlock(state);
        }
    }

    /// Calls `job` on the calling thread and on up to `helpers` workers at once, and returns
    /// when every call has returned. Workers that have not started the job by the time the
    /// caller's own call returns are not waited for: they skip it. A panic in any call is
    /// re-raised here, after all calls have returned.
    pub(crate) fn run<F: Fn() + Sync>(&mut self, helpers: usize, job: &F) {
        let helpers = helpers.min(self.workers.len());
        let Some(shared) = self.shared.as_deref().filter(|_| helpers > 0) else {
            job();
            return;
        };
        let mut state = shared.lock();
        state.job = Some(Job::new(job));
        state.tickets = helpers;
        post(shared, &mut state);
        // No worker is inside a job now, so those not parked are spinning or about to look at
        // the state: they take tickets without being woken.
        let wake = helpers.saturating_sub(self.workers.len() - state.parked);
        shared.unlock(state);
        for _ in 0..wake {
            shared.work.notify_one();
        }
        let own = panic::catch_unwind(AssertUnwindSafe(job));
        let helper_panic = finish(shared);
        if let Err(payload) = own {
            panic::resume_unwind(payload);
        }
        if let Some(payload) = helper_panic {
            panic::resume_unwind(payload);
        }
    }
}

/// Counts a new job, a rest or the shutdown as posted, which ends the workers' spin.
fn post(shared: &Shared, state: &mut State) {
    state.posted = state.posted.wrapping_add(1);
    shared.posted.store(state.posted, Ordering::Release);
}

/// Ends the current job: revokes the tickets not yet claimed, waits (spinning first) until no
/// worker is inside the job, clears it, and returns a worker's panic, if any.
fn finish(shared: &Shared) -> Option<Box<dyn Any + Send>> {
    let mut state = shared.lock();
    state.tickets = 0;
    if state.running > 0 {
        shared.unlock(state);
        spin_until(shared.spin, || shared.running.load(Ordering::Acquire) == 0);
        state = shared.lock();
    }
    while state.running > 0 {
        state = shared.wait(&shared.done, state);
    }
    state.job = None;
    let panic = state.panic.take();
    shared.unlock(state);
    panic
}

/// A worker's life: claim a ticket and run the job, or park; return on shutdown.
fn worker(shared: &Shared) {
    let mut state = shared.lock();
    loop {
        if state.shutdown {
            return shared.unlock(state);
        }
        let Some(job) = state.job.filter(|_| state.tickets > 0) else {
            state.parked += 1;
            state = shared.wait(&shared.work, state);
            state.parked -= 1;
            continue;
        };
        state.tickets -= 1;
        state.running += 1;
        shared.running.store(state.running, Ordering::Release);
        let posted = state.posted;
        shared.unlock(state);
        let result = panic::catch_unwind(move || {
            // SAFETY: the ticket was claimed and `running` counted in one critical section
            // while the job was posted, so the owner's `finish` waits for this call to return
            // before the closure's borrows end (invariant 1 of the module's safety argument).
            unsafe { (job.call)(job.data) }
        });
        state = shared.lock();
        let late_panic = match result {
            Ok(()) => None,
            Err(payload) if state.panic.is_none() => {
                state.panic = Some(payload);
                None
            }
            Err(payload) => Some(payload),
        };
        state.running -= 1;
        shared.running.store(state.running, Ordering::Release);
        let last = state.running == 0;
        shared.unlock(state);
        if last {
            shared.done.notify_one();
        }
        // Dropped unlocked: a payload's destructor is foreign code.
        drop(late_panic);
        spin_until(shared.spin, || {
            shared.posted.load(Ordering::Acquire) != posted
        });
        state = shared.lock();
    }
}

impl Drop for Workers {
    /// Tells the workers to return and joins them.
    fn drop(&mut self) {
        let Some(shared) = &self.shared else {
            return;
        };
        let mut state = shared.lock();
        state.shutdown = true;
        post(shared, &mut state);
        shared.unlock(state);
        shared.work.notify_all();
        for worker in self.workers.drain(..) {
            // A worker returns only on shutdown; an `Err` would be a panic outside any job
            // (none is possible), and there is nothing left to do with it.
            let _ = worker.join();
        }
    }
}

/// The workers of a [`ThreadPool`](crate::ThreadPool): one [`Workers`] set behind a mutex,
/// shared by every layer built with the pool (cloning is a reference count), joined when the
/// last handle goes.
#[derive(Clone)]
pub(crate) struct SharedWorkers {
    workers: Arc<Mutex<Workers>>,
    threads: usize,
}

impl SharedWorkers {
    /// A set of `threads` threads, counting the calling one (0 means every CPU the process may
    /// use; at most 256), with no worker started yet.
    pub(crate) fn new(threads: usize) -> SharedWorkers {
        SharedWorkers {
            workers: Arc::new(Mutex::new(Workers::default())),
            threads: crate::kernels::threads::plan::thread_count(threads),
        }
    }

    /// How many threads a call on this set uses at most, the calling one included.
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// How many handles share the set.
    pub(crate) fn handles(&self) -> usize {
        Arc::strong_count(&self.workers)
    }

    /// Runs `f` on the set's workers, holding the set's lock (recovered if a call panicked
    /// under it: [`Workers::run`] re-raises only once its job has ended, so the set is
    /// consistent).
    pub(crate) fn with_workers<R>(&self, f: impl FnOnce(&mut Workers) -> R) -> R {
        let mut workers = self
            .workers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        annotate::acquired(&*self.workers);
        let result = f(&mut workers);
        annotate::releasing(&*self.workers);
        drop(workers);
        result
    }
}

/// Happens-before annotations for valgrind's helgrind (see "Checking it with valgrind" above):
/// client requests when built with `--cfg mha_valgrind` on x86-64, nothing otherwise.
#[allow(unexpected_cfgs)]
pub(crate) mod annotate {
    /// Helgrind's `_VG_USERREQ__HG_USERSO_SEND_PRE` (`ANNOTATE_HAPPENS_BEFORE`).
    const HAPPENS_BEFORE: usize = 0x4847_0121;
    /// `_VG_USERREQ__HG_USERSO_RECV_POST` (`ANNOTATE_HAPPENS_AFTER`).
    const HAPPENS_AFTER: usize = 0x4847_0122;
    /// `_VG_USERREQ__HG_ARANGE_MAKE_UNTRACKED` (`VALGRIND_HG_DISABLE_CHECKING`).
    const UNTRACKED: usize = 0x4847_0127;

    /// Call right after acquiring `lock`: whatever any thread did before releasing it happens
    /// before what follows.
    pub(crate) fn acquired<T: ?Sized>(lock: &T) {
        request(HAPPENS_AFTER, (lock as *const T).cast::<()>() as usize, 0);
    }

    /// Call right before releasing `lock`.
    pub(crate) fn releasing<T: ?Sized>(lock: &T) {
        request(HAPPENS_BEFORE, (lock as *const T).cast::<()>() as usize, 0);
    }

    /// `value` is read and written by several threads without a lock, by design: not checked.
    pub(crate) fn untracked<T>(value: &T) {
        let address = (value as *const T).cast::<()>() as usize;
        request(UNTRACKED, address, size_of::<T>());
    }

    /// Valgrind's client request `code(a, b)`.
    #[cfg(all(mha_valgrind, target_arch = "x86_64"))]
    fn request(code: usize, a: usize, b: usize) {
        let args = [code, a, b, 0, 0, 0];
        // SAFETY: valgrind's x86-64 client-request sequence (valgrind.h): the rotations of `rdi`
        // add up to 128 bits and leave it as it was, `xchg rbx, rbx` changes nothing, so
        // natively it does nothing; under valgrind it reads the six words at `rax` (alive on
        // this stack) and writes a result to `rdx`, declared clobbered.
        unsafe {
            core::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                in("rax") args.as_ptr(),
                inout("rdx") 0usize => _,
                options(nostack),
            );
        }
    }

    /// Without the cfg: nothing.
    #[cfg(not(all(mha_valgrind, target_arch = "x86_64")))]
    fn request(_: usize, _: usize, _: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::thread;

    /// Whether the current thread is one of a pool's workers.
    fn on_worker() -> bool {
        thread::current().name() == Some("mha-worker")
    }

    /// The message of a caught panic.
    fn message(payload: &(dyn Any + Send)) -> &str {
        payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| {
                payload
                    .downcast_ref::<std::string::String>()
                    .map(|s| s.as_str())
            })
            .unwrap_or("")
    }

    /// Runs `job` on the caller and one worker, with the caller's share waiting until the
    /// worker is inside the job (it holds a ticket until the caller's share returns).
    fn with_worker_inside(pool: &mut Workers, job: impl Fn(bool) + Sync) {
        assert_eq!(pool.start(1), 1);
        let entered = AtomicBool::new(false);
        annotate::untracked(&entered); // a spin flag
        pool.run(1, &|| {
            if on_worker() {
                entered.store(true, Ordering::SeqCst);
            } else {
                while !entered.load(Ordering::SeqCst) {
                    thread::yield_now();
                }
            }
            job(on_worker());
        });
    }

    #[test]
    fn a_worker_panic_is_raised_on_the_caller() {
        let mut pool = Workers::default();
        let caught = panic::catch_unwind(AssertUnwindSafe(|| {
            with_worker_inside(&mut pool, |worker| assert!(!worker, "worker fails"));
        }));
        assert_eq!(message(&*caught.expect_err("re-raised")), "worker fails");
        let mut calls = AtomicUsize::new(0);
        annotate::untracked(&calls); // counted by both threads
        pool.run(1, &|| {
            calls.fetch_add(1, Ordering::SeqCst);
        });
        assert!((1..=2).contains(calls.get_mut()));
    }

    #[test]
    fn a_caller_panic_waits_for_the_worker_before_unwinding() {
        let mut pool = Workers::default();
        // Borrowed by the job; the worker writes to it well after the caller's share has
        // panicked (`resume_unwind`: no hook, so the caller unwinds at once). Relaxed accesses
        // are plain loads and stores: only the pool orders them, which is what helgrind checks.
        let written = AtomicBool::new(false);
        let caught = panic::catch_unwind(AssertUnwindSafe(|| {
            with_worker_inside(&mut pool, |worker| {
                if !worker {
                    panic::resume_unwind(Box::new("caller fails"));
                }
                thread::sleep(Duration::from_millis(200));
                written.store(true, Ordering::Relaxed);
            });
        }));
        assert_eq!(message(&*caught.expect_err("re-raised")), "caller fails");
        assert!(
            written.load(Ordering::Relaxed),
            "the caller returned before its worker"
        );
    }

    #[test]
    fn rest_parks_a_spinning_worker_at_once() {
        // A spin far longer than the test: only `rest` can make the worker park.
        let mut pool = Workers::default();
        pool.spin = Duration::from_secs(60);
        with_worker_inside(&mut pool, |_| {});
        pool.rest();
        let shared = pool.shared.as_deref().expect("started");
        let start = Instant::now();
        loop {
            let state = shared.lock();
            let parked = state.parked;
            shared.unlock(state);
            if parked == 1 {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "still spinning");
            thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn dropping_an_idle_pool_joins_its_workers() {
        let mut pool = Workers::default();
        assert_eq!(pool.start(3), 3);
        pool.run(3, &|| {});
        let shared = Arc::downgrade(pool.shared.as_ref().expect("started"));
        assert_eq!(shared.strong_count(), 4, "the pool and its three workers");
        drop(pool);
        // Joined: no worker holds the shared block any more.
        assert_eq!(shared.strong_count(), 0);
    }

    #[test]
    fn a_pool_that_never_ran_a_job_drops() {
        drop(Workers::default());
        let mut pool = Workers::default();
        assert_eq!(pool.start(2), 2);
        drop(pool);
    }
}
