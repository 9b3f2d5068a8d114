//! One segment written by a producer while a consumer reads it (Flink's `BufferBuilder` /
//! `BufferConsumer`). The builder appends and *commits* bytes; the consumer reads what has
//! been committed, so a flushed, partly filled buffer can be read before it is finished.
//!
//! Synchronisation: one atomic word holds the committed length and a FINISHED bit. The
//! builder writes bytes past the committed length, then publishes them with a release
//! store; the consumer acquires the word and reads only below it. The two never touch the
//! same bytes at the same time.

use crate::base::sync::{Arc, AtomicUsize, Ordering};
use crate::memory::PooledSegment;

const FINISHED: usize = 1 << (usize::BITS - 1);

struct Shared {
    segment: PooledSegment,
    /// Committed length | FINISHED. Written only by the builder.
    position: AtomicUsize,
}

/// The writing half. Exactly one per segment; dropping it finishes the buffer.
pub struct BufferBuilder {
    shared: Arc<Shared>,
    /// Bytes written (== committed, since `append` commits at once).
    written: usize,
    capacity: usize,
    finished: bool,
}

/// The reading half: reads committed bytes in order.
pub struct BufferConsumer {
    shared: Arc<Shared>,
    read: usize,
}

/// Committed bytes of a buffer, kept alive (and the segment unrecycled) while referenced.
#[derive(Clone)]
pub struct BufferSlice {
    shared: Arc<Shared>,
    start: usize,
    end: usize,
}

/// Creates the two halves over a pooled segment.
pub fn new_buffer(segment: PooledSegment) -> (BufferBuilder, BufferConsumer) {
    new_buffer_limited(segment, usize::MAX)
}

/// Like [`new_buffer`], but the builder takes at most `limit` bytes (clamped to the segment
/// size): the buffer is full, and so finished by its writer, at that size. Buffer debloating
/// cuts buffers this way; the segment itself stays whole.
pub fn new_buffer_limited(segment: PooledSegment, limit: usize) -> (BufferBuilder, BufferConsumer) {
    let capacity = segment.segment().len().min(limit.max(1));
    let shared = Arc::new(Shared {
        segment,
        position: AtomicUsize::new(0),
    });
    (
        BufferBuilder {
            shared: shared.clone(),
            written: 0,
            capacity,
            finished: false,
        },
        BufferConsumer { shared, read: 0 },
    )
}

impl BufferBuilder {
    /// Copies as much of `data` as fits, commits it, and returns how many bytes were taken.
    pub fn append(&mut self, data: &[u8]) -> usize {
        debug_assert!(!self.finished);
        let n = data.len().min(self.capacity - self.written);
        if n == 0 {
            return 0;
        }
        // SAFETY: bytes [written, written + n) are inside the segment (n <= capacity - written)
        // and beyond the committed position, so no consumer reads them until the store below;
        // only this builder writes to the segment.
        unsafe {
            let dst = self.shared.segment.segment().as_ptr().add(self.written);
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst, n);
        }
        self.written += n;
        self.shared.position.store(self.written, Ordering::Release);
        n
    }

    /// Bytes still free.
    pub fn remaining(&self) -> usize {
        self.capacity - self.written
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.written
    }

    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.written == 0
    }

    /// Marks the buffer finished: the consumer may recycle it once it has read everything.
    pub fn finish(mut self) -> usize {
        self.mark_finished();
        self.written
    }

    fn mark_finished(&mut self) {
        if !self.finished {
            self.finished = true;
            self.shared
                .position
                .store(self.written | FINISHED, Ordering::Release);
        }
    }
}

impl Drop for BufferBuilder {
    fn drop(&mut self) {
        self.mark_finished();
    }
}

impl BufferConsumer {
    /// Committed bytes not yet read, as a slice, and whether the buffer is finished (and so,
    /// if the slice was the last of it, fully read).
    pub fn read_available(&mut self) -> (Option<BufferSlice>, bool) {
        let pos = self.shared.position.load(Ordering::Acquire);
        let committed = pos & !FINISHED;
        let finished = pos & FINISHED != 0;
        if committed > self.read {
            let slice = BufferSlice {
                shared: self.shared.clone(),
                start: self.read,
                end: committed,
            };
            self.read = committed;
            (Some(slice), finished)
        } else {
            (None, finished)
        }
    }

    /// True when the builder finished the buffer.
    pub fn is_finished(&self) -> bool {
        self.shared.position.load(Ordering::Acquire) & FINISHED != 0
    }

    /// True when the builder finished the buffer and every byte was read.
    pub fn is_drained(&self) -> bool {
        let pos = self.shared.position.load(Ordering::Acquire);
        pos & FINISHED != 0 && pos & !FINISHED == self.read
    }
}

impl BufferSlice {
    /// A consumer that reads this slice's bytes again, as a finished buffer: a stored chunk
    /// that several readers each read whole. The slice must reach the end of a finished
    /// buffer (the consumer reads on to the committed end).
    pub fn reread(&self) -> BufferConsumer {
        debug_assert_eq!(self.shared.position.load(Ordering::Acquire), self.end | FINISHED);
        BufferConsumer {
            shared: self.shared.clone(),
            read: self.start,
        }
    }

    /// The segment back, if nothing else refers to its buffer any more (else the slice).
    pub fn into_segment(self) -> Result<PooledSegment, BufferSlice> {
        let BufferSlice { shared, start, end } = self;
        Arc::try_unwrap(shared)
            .map(|s| s.segment)
            .map_err(|shared| BufferSlice { shared, start, end })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: [start, end) was committed (release-stored by the builder, acquired by the
        // consumer that made this slice) and the builder never writes below its committed
        // position again; the Arc keeps the segment alive.
        unsafe {
            std::slice::from_raw_parts(
                self.shared.segment.segment().as_ptr().add(self.start),
                self.end - self.start,
            )
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// The bytes `range` of this slice (relative to its start), sharing the segment.
    ///
    /// # Panics
    ///
    /// If `range` is not within `0..len()`.
    pub fn sub(&self, range: std::ops::Range<usize>) -> BufferSlice {
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "sub-slice out of bounds"
        );
        BufferSlice {
            shared: self.shared.clone(),
            start: self.start + range.start,
            end: self.start + range.end,
        }
    }

    /// True for an empty slice.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

impl std::fmt::Debug for BufferSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferSlice")
            .field("start", &self.start)
            .field("end", &self.end)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::base::wait::Wait;
    use crate::memory::GlobalPool;

    #[test]
    fn consumer_reads_committed_bytes_before_finish() {
        let g = GlobalPool::new(4096 * 2, 4096).unwrap();
        let pool = g.create_local_pool("p", 1, 2, "").unwrap();
        let (mut b, mut c) = new_buffer(pool.request(&mut Wait::forever()).unwrap());
        assert_eq!(b.append(b"hello "), 6);
        let (s, fin) = c.read_available();
        assert_eq!(s.unwrap().as_slice(), b"hello ");
        assert!(!fin);
        b.append(b"world");
        b.finish();
        let (s, fin) = c.read_available();
        assert_eq!(s.unwrap().as_slice(), b"world");
        assert!(fin && c.is_drained());
        drop(c);
        assert_eq!(
            pool.stats().in_use,
            0,
            "segment recycled when both halves are gone"
        );
    }

    #[test]
    fn a_limited_buffer_is_full_at_its_limit() {
        let g = GlobalPool::new(4096, 4096).unwrap();
        let pool = g.create_local_pool("p", 1, 1, "").unwrap();
        let (mut b, c) = new_buffer_limited(pool.request(&mut Wait::forever()).unwrap(), 1000);
        assert_eq!(b.append(&[1u8; 5000]), 1000);
        assert_eq!(b.remaining(), 0);
        assert!(pool.try_request().is_none(), "the one segment is still held");
        drop(b);
        drop(c);
        let (b, _c) = new_buffer_limited(pool.request(&mut Wait::forever()).unwrap(), 1 << 20);
        assert_eq!(
            b.remaining(),
            4096,
            "a limit above the segment size is the segment size"
        );
    }

    #[test]
    fn append_stops_at_capacity() {
        let g = GlobalPool::new(4096, 4096).unwrap();
        let pool = g.create_local_pool("p", 1, 1, "").unwrap();
        let (mut b, _c) = new_buffer(pool.request(&mut Wait::forever()).unwrap());
        assert_eq!(b.append(&[1u8; 5000]), 4096);
        assert_eq!(b.remaining(), 0);
        assert_eq!(b.append(&[1u8; 5]), 0);
    }
}
