//! Heap accounting: a global-allocator wrapper that keeps the bytes currently allocated and their peak, so the
//! batch-size finder can measure what a training step needs on the CPU (the counterpart of CUDA's
//! `max_memory_allocated`). The `train` binary installs it around mimalloc; elsewhere the counters stay zero.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Wraps an allocator and counts live bytes.
pub struct Counting<A>(pub A);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Relaxed) + by;
    // Read first: the shared peak is written only when it moves, so threads do not fight over it.
    if now > PEAK.load(Relaxed) {
        PEAK.fetch_max(now, Relaxed);
    }
}

// SAFETY: every call is forwarded to the wrapped allocator unchanged; only counters are updated.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { self.0.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Relaxed);
            }
        }
        p
    }
}

/// Bytes allocated now.
pub fn current() -> usize {
    CURRENT.load(Relaxed)
}

/// The most bytes allocated at once since the last `reset_peak`.
pub fn peak() -> usize {
    PEAK.load(Relaxed)
}

/// Start a new peak measurement from the current level; returns that level.
pub fn reset_peak() -> usize {
    let now = current();
    PEAK.store(now, Relaxed);
    now
}

/// Whether the counting allocator is installed in this process (the counters move).
pub fn is_counting() -> bool {
    let probe = vec![0u8; 64];
    let counting = current() >= probe.len();
    drop(probe);
    counting
}
