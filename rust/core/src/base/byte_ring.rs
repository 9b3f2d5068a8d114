//! A single-producer single-consumer byte ring over memory someone else owns (the shared
//! region of a same-host link, or a test's allocation): one side writes, the other reads.
//! Positions are byte counts that only grow (`head`: written, `tail`: read), so `head - tail`
//! is what is readable.
//!
//! Sleeping without losing a wake-up: each side has a "waiting" word. A side about to sleep
//! stores 1 into its word, fences, and re-checks the ring; a side that moved its position
//! fences and then loads the other's word, and if it was set, clears it and rings the doorbell
//! (the link's wake-up, outside this file). With a sequentially consistent fence between the
//! store and the load on both sides, at least one of them sees the other: either the sleeper's
//! re-check sees the new position, or the mover sees "waiting" and rings. The loom model at
//! the end of this file checks exactly that with a doorbell that wakes only when rung.
//!
//! The peer may be another process that writes anything into the header. Every index is
//! taken modulo the capacity, so a bad header cannot make this side touch memory outside the
//! ring; a position that makes no sense is reported as [`Corrupt`].

use std::io::IoSlice;
use std::mem::MaybeUninit;

use crate::base::sync::{fence, AtomicU32, AtomicU64, Ordering};

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

/// One word on its own cache line, so the two sides' words never share one.
#[repr(C, align(64))]
pub(crate) struct Line<T>(T);

/// A ring's shared words, laid out as the peer expects: `head` at byte 0, `tail` at 64,
/// the reader's waiting word at 128, the writer's at 192, `closed` at 256.
#[repr(C)]
pub(crate) struct RingHeader {
    head: Line<AtomicU64>,
    tail: Line<AtomicU64>,
    reader_waiting: Line<AtomicU32>,
    writer_waiting: Line<AtomicU32>,
    closed: Line<AtomicU32>,
}

impl RingHeader {
    /// A header of an empty, open ring (tests and models; a shared region starts zeroed,
    /// which is the same state).
    #[cfg(any(test, loom))]
    pub(crate) fn new() -> RingHeader {
        RingHeader {
            head: Line(AtomicU64::new(0)),
            tail: Line(AtomicU64::new(0)),
            reader_waiting: Line(AtomicU32::new(0)),
            writer_waiting: Line(AtomicU32::new(0)),
            closed: Line(AtomicU32::new(0)),
        }
    }
}

/// What a ring holds for its consumer now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReaderState {
    /// Bytes to read.
    Data,
    /// Closed, and every byte read: a clean end of stream.
    Closed,
    /// Nothing yet.
    Empty,
}

/// Either side's view of one ring: its header and `cap` data bytes.
pub(crate) struct ByteRing {
    header: *const RingHeader,
    data: *mut u8,
    cap: usize,
}

// SAFETY: the shared words are atomics; the data bytes are only written by the one producer
// in the range the consumer has released and only read by the one consumer in the range the
// producer has published. Whoever builds the ring keeps the memory alive (see `from_raw`).
unsafe impl Send for ByteRing {}
// SAFETY: as above.
unsafe impl Sync for ByteRing {}

impl ByteRing {
    /// A view of the ring whose header is at `header` and whose `cap` data bytes (a power of
    /// two) start at `data`.
    ///
    /// # Safety
    /// Both ranges must stay valid (mapped, not freed) for as long as the ring is used, the
    /// header must be aligned for [`RingHeader`], and at most one producer and one consumer
    /// may use the rings built on them.
    pub(crate) unsafe fn from_raw(header: *const RingHeader, data: *mut u8, cap: usize) -> ByteRing {
        assert!(cap.is_power_of_two());
        assert!((header as usize).is_multiple_of(std::mem::align_of::<RingHeader>()));
        ByteRing { header, data, cap }
    }

    fn words(&self) -> &RingHeader {
        // SAFETY: valid and aligned for as long as `self` is used (`from_raw`'s contract);
        // every field is an atomic, so a peer's concurrent writes are no data race.
        unsafe { &*self.header }
    }

    /// Readable bytes (consumer side).
    pub(crate) fn readable(&self) -> Result<usize, Corrupt> {
        let head = self.words().head.0.load(Ordering::Acquire);
        let tail = self.words().tail.0.load(Ordering::Relaxed);
        let n = head.wrapping_sub(tail);
        if n > self.cap as u64 {
            return Err(Corrupt);
        }
        Ok(n as usize)
    }

    /// Consumer: whether there is data, a clean end, or nothing yet. `closed` is read before
    /// the position: the producer closes after its last push, so a ring seen closed and then
    /// empty has nothing more to come (read the other way round, the last bytes pushed just
    /// before the close could be missed).
    pub(crate) fn reader_state(&self) -> Result<ReaderState, Corrupt> {
        let closed = self.is_closed();
        if self.readable()? > 0 {
            self.clear_reader_waiting();
            return Ok(ReaderState::Data);
        }
        Ok(if closed {
            ReaderState::Closed
        } else {
            ReaderState::Empty
        })
    }

    /// Free bytes (producer side).
    pub(crate) fn writable(&self) -> Result<usize, Corrupt> {
        let head = self.words().head.0.load(Ordering::Relaxed);
        let tail = self.words().tail.0.load(Ordering::Acquire);
        let used = head.wrapping_sub(tail);
        if used > self.cap as u64 {
            return Err(Corrupt);
        }
        Ok(self.cap - used as usize)
    }

    /// Producer: copies as much of `bufs` as fits, in order, and publishes it. Returns the
    /// bytes written.
    pub(crate) fn push(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Corrupt> {
        let head = self.words().head.0.load(Ordering::Relaxed);
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
        self.words().head.0.store(pos, Ordering::Release);
        Ok(pos.wrapping_sub(head) as usize)
    }

    /// Consumer: copies up to `dst.len()` readable bytes into `dst` and releases them.
    /// Returns the bytes read (initialized in `dst`).
    pub(crate) fn pop(&self, dst: &mut [MaybeUninit<u8>]) -> Result<usize, Corrupt> {
        let n = self.readable()?.min(dst.len());
        if n == 0 {
            return Ok(0);
        }
        let tail = self.words().tail.0.load(Ordering::Relaxed);
        self.copy_out(tail, &mut dst[..n]);
        self.words()
            .tail
            .0
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
        self.words().reader_waiting.0.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Consumer, when it found data: no doorbell needed.
    pub(crate) fn clear_reader_waiting(&self) {
        self.words().reader_waiting.0.store(0, Ordering::Relaxed);
    }

    /// Producer, before sleeping on a full ring; the caller re-checks `may_write` afterwards.
    pub(crate) fn set_writer_waiting(&self) {
        self.words().writer_waiting.0.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Producer, after `push` (or `close`): whether the consumer sleeps (then the caller
    /// rings once).
    pub(crate) fn take_reader_waiting(&self) -> bool {
        fence(Ordering::SeqCst);
        let w = &self.words().reader_waiting.0;
        w.load(Ordering::SeqCst) != 0 && w.swap(0, Ordering::SeqCst) != 0
    }

    /// Producer: whether a write of `need` bytes goes ahead now: all of them fit, or at least
    /// half the ring is free (then as much as fits goes). Otherwise the producer sleeps until
    /// half the ring is free, so that a ring the consumer drains slowly is refilled in large
    /// writes, one wake-up each, instead of a frame per wake-up.
    pub(crate) fn may_write(&self, need: usize) -> Result<bool, Corrupt> {
        Ok(self.writable()? >= need.min(self.cap / 2).max(1))
    }

    /// Consumer, after `pop`: whether to wake the producer, which sleeps until half the ring
    /// is free (see `may_write`). The consumer pops until the ring is empty before it sleeps,
    /// so the pop that frees the half always comes.
    pub(crate) fn take_writer_waiting(&self) -> bool {
        fence(Ordering::SeqCst);
        let w = &self.words().writer_waiting.0;
        w.load(Ordering::SeqCst) != 0
            && self.writable().map_or(true, |free| free >= self.cap / 2)
            && w.swap(0, Ordering::SeqCst) != 0
    }

    /// Producer: no more bytes will come (a clean end of stream once the rest is read).
    pub(crate) fn close(&self) {
        self.words().closed.0.store(1, Ordering::SeqCst);
    }

    /// Whether the producer closed the ring.
    pub(crate) fn is_closed(&self) -> bool {
        self.words().closed.0.load(Ordering::SeqCst) != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_header_layout_is_the_one_the_peer_expects() {
        let h = RingHeader::new();
        let base = &h as *const RingHeader as usize;
        assert_eq!(&h.head as *const _ as usize - base, 0);
        assert_eq!(&h.tail as *const _ as usize - base, 64);
        assert_eq!(&h.reader_waiting as *const _ as usize - base, 128);
        assert_eq!(&h.writer_waiting as *const _ as usize - base, 192);
        assert_eq!(&h.closed as *const _ as usize - base, 256);
        assert!(std::mem::size_of::<RingHeader>() <= 4096);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! The wake-up protocol of both sides, as the link's reader and writer halves run it
    //! (`net::shm::stream`), around a doorbell that wakes a sleeper only when rung after it
    //! registered: if a wake-up could be lost, some interleaving leaves both sides asleep and
    //! loom reports the deadlock.

    use super::*;
    use loom::sync::{Arc, Condvar, Mutex};

    /// The doorbell: a count of rings. A sleeper registers (reads the count) before saying
    /// "waiting", then sleeps until the count moves past what it read.
    struct Bell {
        rings: Mutex<u64>,
        cv: Condvar,
    }

    impl Bell {
        fn register(&self) -> u64 {
            *self.rings.lock().unwrap()
        }
        fn ring(&self) {
            *self.rings.lock().unwrap() += 1;
            self.cv.notify_all();
        }
        fn sleep(&self, seen: u64) {
            let mut n = self.rings.lock().unwrap();
            while *n == seen {
                n = self.cv.wait(n).unwrap();
            }
        }
    }

    struct Shared {
        header: RingHeader,
        data: std::cell::UnsafeCell<[u8; 4]>,
        bell: Bell,
    }

    // SAFETY: the data bytes follow the ring's discipline, the rest is loom's sync types.
    unsafe impl Send for Shared {}
    // SAFETY: as above.
    unsafe impl Sync for Shared {}

    fn ring(s: &Shared, cap: usize) -> ByteRing {
        // SAFETY: the memory lives in `s`, which the caller's `Arc` keeps alive.
        unsafe { ByteRing::from_raw(&s.header, s.data.get().cast::<u8>(), cap) }
    }

    /// The producer writes `messages` through a ring of `cap` bytes and closes it, as the
    /// link's writer half does (waiting until `may_write`); the consumer reads one byte at a
    /// time, as the link's reader half does, and then sees the close. Each side sleeps when
    /// it cannot go on; a lost wake-up leaves both asleep, which loom reports.
    fn producer_and_consumer(cap: usize, messages: &'static [&'static [u8]]) {
        let s = Arc::new(Shared {
            header: RingHeader::new(),
            data: std::cell::UnsafeCell::new([0; 4]),
            bell: Bell {
                rings: Mutex::new(0),
                cv: Condvar::new(),
            },
        });
        let p = s.clone();
        let producer = loom::thread::spawn(move || {
            let r = ring(&p, cap);
            for m in messages {
                let mut sent = 0;
                while sent < m.len() {
                    let rest = &m[sent..];
                    if r.may_write(rest.len()).unwrap() {
                        let n = r.push(&[IoSlice::new(rest)]).unwrap();
                        if n > 0 {
                            sent += n;
                            if r.take_reader_waiting() {
                                p.bell.ring();
                            }
                            continue;
                        }
                    }
                    let seen = p.bell.register();
                    r.set_writer_waiting();
                    if r.may_write(rest.len()).unwrap() {
                        continue;
                    }
                    p.bell.sleep(seen);
                }
            }
            r.close();
            if r.take_reader_waiting() {
                p.bell.ring();
            }
        });
        let r = ring(&s, cap);
        let mut got = Vec::new();
        loop {
            let state = r.reader_state().unwrap();
            if state == ReaderState::Data {
                let mut b = [MaybeUninit::uninit(); 1];
                assert_eq!(r.pop(&mut b).unwrap(), 1);
                // SAFETY: `pop` initialized it.
                got.push(unsafe { b[0].assume_init() });
                if r.take_writer_waiting() {
                    s.bell.ring();
                }
                continue;
            }
            if state == ReaderState::Closed {
                break;
            }
            let seen = s.bell.register();
            r.set_reader_waiting();
            if r.reader_state().unwrap() != ReaderState::Empty {
                continue;
            }
            s.bell.sleep(seen);
        }
        producer.join().unwrap();
        let want: Vec<u8> = messages.iter().flat_map(|m| m.iter().copied()).collect();
        assert_eq!(got, want);
    }

    /// Three one-byte writes through a two-byte ring.
    #[test]
    fn loom_ring_wake_ups_are_never_lost() {
        loom::model(|| producer_and_consumer(2, &[&[1], &[2], &[3]]));
    }

    /// Two-byte writes through a four-byte ring read a byte at a time: the producer waits for
    /// half the ring, the consumer wakes it only then.
    #[test]
    fn loom_ring_writer_waits_for_half_the_ring_without_losing_a_wake_up() {
        loom::model(|| producer_and_consumer(4, &[&[1, 2], &[3, 4], &[5, 6]]));
    }
}
