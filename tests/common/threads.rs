//! Counting and serialising the crate's worker threads in tests (Linux `/proc`; elsewhere the counts
//! are `None` and the checks pass vacuously).

use std::sync::{Mutex, MutexGuard};

/// Serialises the tests of one binary that count worker threads, so a count sees only the
/// current test's.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Threads of this process named as the layers' workers (Linux; elsewhere `None`).
pub fn count_workers() -> Option<usize> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let is_worker = |task: &std::fs::DirEntry| {
        std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.trim() == "mha-worker")
    };
    Some(tasks.flatten().filter(is_worker).count())
}

/// CPU nanoseconds used so far by the process's worker threads (Linux; elsewhere `None`).
pub fn worker_cpu_ns() -> Option<u64> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let mut total = 0;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == "mha-worker" {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(total)
}

/// Asserts that `want` worker threads are alive, once the count settles (a joined thread's
/// `/proc` entry may outlive the join by a moment, longer under emulation). Without `/proc`,
/// checks nothing.
pub fn assert_workers(want: usize, context: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while count_workers().is_some_and(|n| n != want) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    if let Some(count) = count_workers() {
        assert_eq!(count, want, "{context}");
    }
}
