//! The scratch of a layer's calls ([`Workspace`]) and where it lives ([`Scratch`]): in the
//! layer, or in a [`ThreadPool`] that every layer built with it shares. Layers on one pool run
//! one call at a time, so one workspace, sized by the largest of their calls, serves them all:
//! a model whose layers share a pool holds its weights, its caches and one layer's scratch.
//!
//! A call on a shared pool holds the pool's workspace (a mutex) for its whole duration, so
//! calls from several threads of the program take turns call by call; the pool's workers are
//! locked phase by phase inside it (always in that order: workspace, then workers).

use alloc::boxed::Box;
#[cfg(feature = "std")]
use alloc::sync::Arc;
use alloc::vec::Vec;
#[cfg(feature = "std")]
use std::sync::Mutex;

use crate::kernels::attention::flash::FlashScratch;
use crate::kernels::gemm::GemmScratch;
use crate::kernels::store::kv::KvStore;
#[cfg(feature = "std")]
use crate::kernels::threads::parallel::Pool;
#[cfg(feature = "std")]
use crate::kernels::threads::pool::{annotate, SharedWorkers};

/// The float buffers of a workspace: as many as the layer that names the most uses (an
/// `MlaLayer`'s seven).
pub(crate) const FLOAT_BUFFERS: usize = 7;

/// The buffers of a call, kept between calls: each grows to the largest call made with it and
/// is freed only by [`Scratch::release`] (the next call grows it again). The buffers have no
/// meaning of their own: each kind of layer names the ones it uses (a `Layer` four float
/// buffers and the three count buffers, an `MlaLayer` seven float buffers), and every call writes
/// what it reads, so layers of any shapes may take turns with one workspace.
#[derive(Default)]
pub(crate) struct Workspace {
    /// Float buffers (projected rows, merged heads, ...), named by the layer.
    pub floats: [Vec<f32>; FLOAT_BUFFERS],
    /// Count buffers (ALiBi's ranks of the keys, a shared call's tokens before it, where a
    /// call's rows sit), named by the layer.
    pub counts: [Vec<usize>; 3],
    /// The keys and values of a forward pass or cross-attention.
    pub store: KvStore,
    /// Per thread: the GEMM's packing scratch.
    pub gemm: Vec<GemmScratch>,
    /// Per thread: the attention's scratch.
    pub flash: Vec<FlashScratch>,
}

impl Workspace {
    /// The bytes of the buffers that grow with a call's tokens: the float and count buffers
    /// (their capacity) and the transient store's keys and values. The per-thread GEMM and
    /// attention scratch, bounded by the cache blocking whatever the tokens, is not counted.
    pub(crate) fn bytes(&self) -> usize {
        let floats = self.floats.iter().map(Vec::capacity).sum::<usize>();
        let counts = self.counts.iter().map(Vec::capacity).sum::<usize>();
        floats * size_of::<f32>() + counts * size_of::<usize>() + self.store.bytes()
    }
}

impl core::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Workspace")
            .field("bytes", &self.bytes())
            .finish_non_exhaustive()
    }
}

/// Where a layer's calls find their [`Workspace`]: the layer's own, or its shared pool's.
pub(crate) enum Scratch {
    /// The layer's own (a layer with its own workers or an executor's).
    Own(Box<Workspace>),
    /// The workspace of a [`ThreadPool`], shared by every layer built with it.
    #[cfg(feature = "std")]
    Shared(Arc<Mutex<Workspace>>),
}

impl Default for Scratch {
    fn default() -> Scratch {
        Scratch::Own(Box::default())
    }
}

impl core::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Scratch::Own(workspace) => f.debug_tuple("Own").field(workspace).finish(),
            #[cfg(feature = "std")]
            Scratch::Shared(_) => f.write_str("Shared"),
        }
    }
}

impl Scratch {
    /// Runs `f` with the workspace, holding a shared one for the whole of `f` (other callers
    /// of the pool wait).
    pub(crate) fn with<R>(&mut self, f: impl FnOnce(&mut Workspace) -> R) -> R {
        match self {
            Scratch::Own(workspace) => f(workspace),
            #[cfg(feature = "std")]
            Scratch::Shared(shared) => with_locked(shared, f),
        }
    }

    /// Frees every buffer of the workspace (a shared one once the call on it, if any, has
    /// returned); the next call grows them again.
    pub(crate) fn release(&mut self) {
        self.with(|workspace| *workspace = Workspace::default());
    }

    /// [`Workspace::bytes`] of the workspace (a shared one once the call on it, if any, has
    /// returned).
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Scratch::Own(workspace) => workspace.bytes(),
            #[cfg(feature = "std")]
            Scratch::Shared(shared) => with_locked(shared, |workspace| workspace.bytes()),
        }
    }
}

/// Runs `f` on the workspace behind `shared`, holding its lock (recovered if a call panicked
/// under it: every call writes the buffers it reads, so any contents will do).
#[cfg(feature = "std")]
fn with_locked<R>(shared: &Mutex<Workspace>, f: impl FnOnce(&mut Workspace) -> R) -> R {
    let mut workspace = shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    annotate::acquired(shared);
    let result = f(&mut workspace);
    annotate::releasing(shared);
    drop(workspace);
    result
}

/// Worker threads and call scratch that any number of layers share
/// ([`MhaBuilder::thread_pool`], [`MlaBuilder::thread_pool`]).
///
/// A pool of `threads` runs a call on the calling thread and up to `threads - 1` workers,
/// started when a call first needs them; between calls they spin briefly (so the next layer's
/// call finds them awake) and then park. Cloning a pool is cheap (a reference count); the
/// workers belong to the pool and are joined when its last handle (a clone, or a layer built
/// with it) is dropped. There is no global state: two pools never share a worker. Calls from
/// several threads at once on layers that share a pool take turns, one call at a time.
/// Results are bit-identical to a layer's own threads and to any thread count.
///
/// The layers of a pool also share one scratch workspace (projected rows, merged heads, a
/// forward pass's keys and values, the kernels' per-thread scratch): it grows to the largest
/// call any of them has made and is kept between calls, so a model on one pool holds its
/// weights, its caches and one layer's scratch, not one per layer.
/// [`release_scratch`](Self::release_scratch) frees it.
///
/// ```
/// use mha::{AttendOptions, Matrix, Mha, MhaParams, Tensor, ThreadPool};
/// let pool = ThreadPool::new(2);
/// let w = Matrix::<8, 8>::from_fn(|r, c| ((r * 3 + c) % 5) as f32 * 0.1);
/// let params = MhaParams::new(w.clone(), w.clone(), w.clone(), w);
/// let mut layers: Vec<Mha<8>> = (0..4)
///     .map(|_| Mha::builder(&params, 2).thread_pool(&pool).build())
///     .collect::<Result<_, _>>()?;
/// let mut x = Tensor::<1, 3, 8>::from_fn(|_, t, i| (t + i) as f32 * 0.1);
/// for layer in &mut layers {
///     x = layer.forward(&x)?; // every layer's work on the same two threads
/// }
/// assert_eq!(layers[0].threads(), 2);
/// // One scratch for the four layers.
/// assert_eq!(layers[3].scratch_bytes(), pool.scratch_bytes());
/// # Ok::<(), mha::ShapeError>(())
/// ```
///
/// [`MhaBuilder::thread_pool`]: crate::MhaBuilder::thread_pool
/// [`MlaBuilder::thread_pool`]: crate::MlaBuilder::thread_pool
#[cfg(feature = "std")]
#[derive(Clone)]
pub struct ThreadPool {
    workers: SharedWorkers,
    workspace: Arc<Mutex<Workspace>>,
}

#[cfg(feature = "std")]
impl ThreadPool {
    /// A pool of `threads` threads, counting the calling one (0 means every CPU the process may
    /// use; at most 256), with no worker started and no scratch yet.
    pub fn new(threads: usize) -> ThreadPool {
        ThreadPool {
            workers: SharedWorkers::new(threads),
            workspace: Arc::default(),
        }
    }

    /// How many threads a call on this pool uses at most, the calling one included.
    pub fn threads(&self) -> usize {
        self.workers.threads()
    }

    /// Frees the scratch the pool's layers share (once the call running on it, if any, has
    /// returned); the next call grows it again, to that call's size. Results are unchanged.
    ///
    /// ```
    /// use mha::{Matrix, Mha, MhaParams, Tensor, ThreadPool};
    /// let pool = ThreadPool::new(2);
    /// let w = Matrix::<8, 8>::from_fn(|r, c| ((r * 3 + c) % 5) as f32 * 0.1);
    /// let mut layer = Mha::builder(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), 2)
    ///     .thread_pool(&pool)
    ///     .build()?;
    /// let x = Tensor::<1, 64, 8>::from_fn(|_, t, i| ((t + i) % 9) as f32 * 0.1);
    /// let y = layer.forward(&x)?;
    /// assert!(pool.scratch_bytes() >= 64 * 8 * 4); // at least the queries of 64 tokens
    /// pool.release_scratch();
    /// assert_eq!(pool.scratch_bytes(), 0);
    /// assert_eq!(layer.forward(&x)?, y); // grown again, the same bits
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn release_scratch(&self) {
        with_locked(&self.workspace, |workspace| {
            *workspace = Workspace::default()
        });
    }

    /// The bytes of the scratch the pool's layers share that grow with a call's tokens:
    /// projected rows, merged heads, a forward pass's keys and values, each buffer as large
    /// as the largest call that used it (the kernels' per-thread scratch, bounded by the cache
    /// blocking whatever the tokens, is not counted). Waits for a running call.
    pub fn scratch_bytes(&self) -> usize {
        with_locked(&self.workspace, |workspace| workspace.bytes())
    }

    /// The threads of a layer built with the pool: the pool's workers.
    pub(crate) fn pool(&self) -> Pool {
        Pool::shared(&self.workers)
    }

    /// The scratch of a layer built with the pool: the pool's workspace.
    pub(crate) fn scratch(&self) -> Scratch {
        Scratch::Shared(Arc::clone(&self.workspace))
    }
}

#[cfg(feature = "std")]
impl core::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("threads", &self.threads())
            .field("handles", &self.workers.handles())
            .finish()
    }
}
