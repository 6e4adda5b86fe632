//! A loop of forwards through a reused single-threaded layer allocates nothing once the first
//! call has sized its scratch. A counting global allocator (this test binary only) proves it.
//! It counts per thread, so tests running in parallel do not see each other's allocations.
//! (With more than one thread, each forward starts scoped threads, and starting a thread
//! allocates; the kernels themselves still allocate nothing.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use mha::{Matrix, Mha, MhaParams, Tensor};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    ALLOCATIONS.with(|n| n.set(n.get() + 1));
}

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: forwards every call to the system allocator unchanged; only counts them.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn layer<const D: usize>(heads: usize) -> Mha<D> {
    let w = Matrix::<D, D>::from_fn(|r, c| ((r * 7 + c * 3) % 11) as f32 / 11.0 - 0.5);
    Mha::new(&MhaParams::new(w.clone(), w.clone(), w.clone(), w), heads).expect("valid heads")
}

#[test]
fn steady_state_forward_allocates_nothing_single_threaded() {
    let mut layer = layer::<48>(4).with_threads(1);
    let x = Tensor::<2, 70, 48>::from_fn(|b, t, i| ((b + t * 5 + i) % 13) as f32 / 13.0);
    let mut out = Tensor::zeros();
    layer.forward_into(&x, &mut out); // sizes the scratch
    let first = out.clone();
    let before = allocations();
    for _ in 0..5 {
        layer.forward_into(&x, &mut out);
    }
    let after = allocations();
    assert_eq!(
        after - before,
        0,
        "forward_into allocated {} times in 5 calls",
        after - before
    );
    assert_eq!(out, first);
}

#[test]
fn tiny_forward_allocates_nothing() {
    let mut layer = layer::<4>(2);
    let x = Tensor::from([[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]]);
    let mut out = Tensor::zeros();
    layer.forward_into(&x, &mut out);
    let before = allocations();
    for _ in 0..100 {
        layer.forward_into(&x, &mut out);
    }
    assert_eq!(allocations() - before, 0);
}
