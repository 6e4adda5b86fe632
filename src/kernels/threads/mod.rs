//! Threads: how many each phase of a call uses (`plan`), the queue of work items the caller
//! and the workers drain (`parallel`), and the workers themselves (`pool`, the one module with
//! the threading `unsafe`).

pub(crate) mod parallel;
pub(crate) mod plan;
#[cfg(feature = "std")]
pub(crate) mod pool;
