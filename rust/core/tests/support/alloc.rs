//! A global allocator that counts what each thread allocates, for tests that assert a code
//! path allocates nothing (or nothing big). A test crate installs it with
//! `#[global_allocator] static GLOBAL: CountingAlloc = CountingAlloc;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Requests of at least this many bytes are counted as large: glibc's allocator serves them
/// from its sorted bins, consolidating every small free chunk first.
pub const LARGE: usize = 1024;

/// Forwards to the system allocator, counting per thread the bytes and the large requests.
pub struct CountingAlloc;

thread_local! {
    static BYTES: Cell<usize> = const { Cell::new(0) };
    static LARGE_ONES: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are
// const-initialized thread-local `Cell`s that never allocate themselves.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: `ptr` was allocated by `System` with `layout`; the caller upholds the rest.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (see `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn count(size: usize) {
    let _ = BYTES.try_with(|a| a.set(a.get() + size));
    if size >= LARGE {
        let _ = LARGE_ONES.try_with(|a| a.set(a.get() + 1));
    }
}

/// Bytes allocated by this thread while running `f`.
pub fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = BYTES.with(Cell::get);
    let value = f();
    (value, BYTES.with(Cell::get) - before)
}

/// Requests of [`LARGE`] bytes or more made by this thread while running `f`.
pub fn large_allocations_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LARGE_ONES.with(Cell::get);
    let value = f();
    (value, LARGE_ONES.with(Cell::get) - before)
}
