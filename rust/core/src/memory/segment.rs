//! A segment: one fixed-size, 64-byte aligned block of memory (Flink's `MemorySegment`).

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;

/// Alignment of every segment: enough for any Arrow buffer and for SIMD loads.
pub const SEGMENT_ALIGN: usize = 64;

/// Smallest segment size accepted (below it framing overhead dominates).
pub const MIN_SEGMENT_SIZE: usize = 4096;

/// One fixed-size aligned block. Owned by exactly one holder at a time: a pool's free list,
/// a [`crate::memory::PooledSegment`], or (through it) a buffer being written and read.
pub struct Segment {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Segment owns its allocation exclusively (like a Box<[u8]>); moving it between
// threads moves that ownership.
unsafe impl Send for Segment {}
// SAFETY: &Segment only gives out `&[u8]` (shared reads) or raw pointers whose users document
// their own synchronisation (see `partition::buffer`).
unsafe impl Sync for Segment {}

impl Segment {
    /// Allocates a zero-filled segment of `len` bytes (`len > 0`).
    pub fn allocate(len: usize) -> Segment {
        let layout = Self::layout(len);
        // SAFETY: layout has non-zero size (asserted in `layout`).
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        Segment { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        assert!(len > 0, "segment size must be positive");
        Layout::from_size_align(len, SEGMENT_ALIGN).expect("segment size overflows a Layout")
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: segments have a positive size.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Start of the block. Writes through it must not overlap reads of the same bytes.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The whole block, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated in `allocate` with exactly this layout, and is freed once.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_aligned_and_writable() {
        let mut s = Segment::allocate(32 * 1024);
        assert_eq!(s.as_ptr() as usize % SEGMENT_ALIGN, 0);
        s.as_mut_slice()[32 * 1024 - 1] = 7;
        assert_eq!(s.as_mut_slice()[32 * 1024 - 1], 7);
    }
}
