//! A single-producer single-consumer byte ring in a shared region: one process writes, the
//! other reads. Positions are byte counts that only grow (`head`: written, `tail`: read), so
//! `head - tail` is what is readable. Each side also has a "waiting" word it sets before it
//! sleeps, which the other side clears, and then rings the doorbell, after it has moved its
//! position: both sides store their word and then load the other's with a full fence in
//! between, so at least one of them sees the other (no lost wake-up).
//!
//! The peer is another process of the same user: it could write anything into the header.
//! Every index is taken modulo the capacity, so a bad header cannot make this side touch
//! memory outside the ring; a position that makes no sense is reported as corruption.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::region::Region;

/// Bytes of a ring's header (a page; each word on its own cache line).
pub(crate) const RING_HEADER: usize = 4096;
const HEAD: usize = 0;
const TAIL: usize = 64;
const READER_WAITING: usize = 128;
const WRITER_WAITING: usize = 192;
const CLOSED: usize = 256;

/// A ring's positions made no sense (the peer wrote garbage into the header).
#[derive(Debug)]
pub(crate) struct Corrupt;

impl From<Corrupt> for std::io::Error {
    fn from(_: Corrupt) -> Self {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the peer corrupted a shared ring",
        )
    }
}

/// One ring at an offset of a region; either side's view of it.
pub(crate) struct Ring {
    /// Keeps the mapping alive while the ring points into it.
    _region: Arc<Region>,
    header: *mut u8,
    data: *mut u8,
    cap: usize,
}

// SAFETY: the pointers point into `region`, which the ring keeps alive; the shared words are
// atomics, and the data bytes are only written by the one producer in the range the consumer
// has released and only read by the one consumer in the range the producer has published.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

impl Ring {
    /// The ring at `offset` of `region` with `cap` data bytes (a power of two); panics if it
    /// does not fit (the caller lays the region out).
    pub(crate) fn new(region: Arc<Region>, offset: usize, cap: usize) -> Ring {
        assert!(cap.is_power_of_two());
        assert!(offset.is_multiple_of(RING_HEADER) && offset + RING_HEADER + cap <= region.len());
        // SAFETY: in bounds, checked above.
        let header = unsafe { region.base().add(offset) };
        // SAFETY: in bounds, checked above.
        let data = unsafe { header.add(RING_HEADER) };
        Ring {
            _region: region,
            header,
            data,
            cap,
        }
    }

    fn word64(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is one of the header's offsets: in bounds and 8-byte aligned (the
        // region is page aligned); the memory is only ever accessed atomically.
        unsafe { &*(self.header.add(at) as *const AtomicU64) }
    }

    fn word32(&self, at: usize) -> &AtomicU32 {
        // SAFETY: as in `word64`.
        unsafe { &*(self.header.add(at) as *const AtomicU32) }
    }

    /// Readable bytes (consumer side).
    pub(crate) fn readable(&self) -> Result<usize, Corrupt> {
        let head = self.word64(HEAD).load(Ordering::Acquire);
        let tail = self.word64(TAIL).load(Ordering::Relaxed);
        let n = head.wrapping_sub(tail);
        if n > self.cap as u64 {
            return Err(Corrupt);
        }
        Ok(n as usize)
    }

    /// Free bytes (producer side).
    pub(crate) fn writable(&self) -> Result<usize, Corrupt> {
        let head = self.word64(HEAD).load(Ordering::Relaxed);
        let tail = self.word64(TAIL).load(Ordering::Acquire);
        let used = head.wrapping_sub(tail);
        if used > self.cap as u64 {
            return Err(Corrupt);
        }
        Ok(self.cap - used as usize)
    }

    /// Producer: copies as much of `bufs` as fits, in order, and publishes it. Returns the
    /// bytes written.
    pub(crate) fn push(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Corrupt> {
        let head = self.word64(HEAD).load(Ordering::Relaxed);
        let mut free = self.writable()?;
        let mut pos = head;
        for b in bufs {
            if free == 0 {
                break;
            }
            let n = b.len().min(free);
            self.copy_in(pos, &b[..n]);
            pos = pos.wrapping_add(n as u64);
            free -= n;
        }
        self.word64(HEAD).store(pos, Ordering::Release);
        Ok(pos.wrapping_sub(head) as usize)
    }

    /// Consumer: copies up to `dst.len()` readable bytes into `dst` and releases them.
    /// Returns the bytes read (initialized in `dst`).
    pub(crate) fn pop(&self, dst: &mut [MaybeUninit<u8>]) -> Result<usize, Corrupt> {
        let n = self.readable()?.min(dst.len());
        if n == 0 {
            return Ok(0);
        }
        let tail = self.word64(TAIL).load(Ordering::Relaxed);
        self.copy_out(tail, &mut dst[..n]);
        self.word64(TAIL)
            .store(tail.wrapping_add(n as u64), Ordering::Release);
        Ok(n)
    }

    fn copy_in(&self, pos: u64, src: &[u8]) {
        let at = (pos as usize) & (self.cap - 1);
        let first = src.len().min(self.cap - at);
        // SAFETY: `at + first <= cap` and `src.len() - first <= at` (src.len() <= cap), so both
        // copies stay inside the data area; the producer owns the free range it writes (the
        // consumer reads only below `head`, published after this copy).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.data.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.data, src.len() - first);
        }
    }

    fn copy_out(&self, pos: u64, dst: &mut [MaybeUninit<u8>]) {
        let at = (pos as usize) & (self.cap - 1);
        let first = dst.len().min(self.cap - at);
        // SAFETY: as in `copy_in`, within the data area; the bytes below `head` (loaded with
        // Acquire in `readable`) were written before it was published.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data.add(at), dst.as_mut_ptr().cast::<u8>(), first);
            std::ptr::copy_nonoverlapping(
                self.data,
                dst.as_mut_ptr().add(first).cast::<u8>(),
                dst.len() - first,
            );
        }
    }

    /// Consumer, before sleeping: says so; the caller re-checks `readable` afterwards.
    pub(crate) fn set_reader_waiting(&self) {
        self.word32(READER_WAITING).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Consumer, when it found data: no doorbell needed.
    pub(crate) fn clear_reader_waiting(&self) {
        self.word32(READER_WAITING).store(0, Ordering::Relaxed);
    }

    /// Producer, before sleeping on a full ring; the caller re-checks `writable` afterwards.
    pub(crate) fn set_writer_waiting(&self) {
        self.word32(WRITER_WAITING).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Producer, after `push`: whether the consumer sleeps (then the caller rings once).
    pub(crate) fn take_reader_waiting(&self) -> bool {
        fence(Ordering::SeqCst);
        let w = self.word32(READER_WAITING);
        w.load(Ordering::SeqCst) != 0 && w.swap(0, Ordering::SeqCst) != 0
    }

    /// Consumer, after `pop`: whether the producer sleeps on a full ring.
    pub(crate) fn take_writer_waiting(&self) -> bool {
        fence(Ordering::SeqCst);
        let w = self.word32(WRITER_WAITING);
        w.load(Ordering::SeqCst) != 0 && w.swap(0, Ordering::SeqCst) != 0
    }

    /// Producer: no more bytes will come (a clean end of stream once the rest is read).
    pub(crate) fn close(&self) {
        self.word32(CLOSED).store(1, Ordering::SeqCst);
    }

    /// Whether the producer closed the ring.
    pub(crate) fn is_closed(&self) -> bool {
        self.word32(CLOSED).load(Ordering::SeqCst) != 0
    }
}
