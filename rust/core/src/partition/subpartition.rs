//! A pipelined subpartition: the queue between one partition's writer and the one reader
//! of that subpartition (Flink's `PipelinedSubpartition` + `PipelinedSubpartitionView`).
//!
//! The queue itself is lock-free (a crossbeam `SegQueue`). What crosses it is an [`Entry`]:
//! a serialized buffer (whose bytes may still be growing, see [`super::buffer`]), a whole
//! Arrow batch handed over without serializing (local channels), or an event.
//!
//! Visibility follows Flink: finished entries are readable at once; the bytes of the
//! unfinished buffer at the tail become readable on a *flush* (by `flush()`, the output
//! flusher after `buffer_timeout`, or every write when the timeout is 0).
//!
//! Wake-ups use one atomic word and no lock. `signal` counts publications (in steps of 2)
//! and its low bit says "the reader sleeps". The writer, after publishing, adds 2 and
//! clears the bit in one read-modify-write, and calls the listener if the bit was set. The
//! reader snapshots `signal` before polling; when it finds nothing it sets the bit with a
//! compare-exchange against the snapshot, which fails if anything was published meanwhile,
//! and then polls again. All decisions are RMWs on one location, so no store/load reordering
//! can lose a wake-up; the loom models at the bottom of this file check it.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex as StdMutex;
use std::sync::OnceLock;

use super::buffer::{BufferConsumer, BufferSlice};
use super::handed::Handed;
use crate::base::event::Event;
use crate::base::metrics::{ChannelTransport, Counter};
use crate::base::sync::{AtomicBool, AtomicUsize, Ordering, Queue};
use crate::memory::Reservation;

/// Called by the writer side when a waiting reader has something new to read.
pub type Listener = std::sync::Arc<dyn Fn() + Send + Sync>;

/// An opaque value that travels with a handed-off batch (see `RecordWriter::write_with_token`).
pub type Token = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// A batch handed over without serializing, with the segments that account for its memory.
pub struct LocalBatch {
    /// Travels with the batch when it is the writer's whole input batch.
    pub token: Option<Token>,
    /// The batch itself (shares the writer's Arrow buffers), or a piece not decoded.
    pub batch: Handed,
    /// Arrow bytes of the batch, for metrics.
    pub bytes: usize,
    /// Segments reserved from the partition's pool while the batch is queued; recycled when
    /// the reader takes it.
    pub segments: Reservation,
}

/// What the writer side puts in the queue.
pub enum Entry {
    /// A serialized buffer, possibly still being written.
    Buffer(BufferConsumer),
    /// A whole batch (local zero-copy hand-off).
    Batch(LocalBatch),
    /// An event.
    Event(Event),
}

/// What the reader gets out.
pub enum Polled {
    /// Bytes of the serialized stream (may end or start mid-record).
    Data(BufferSlice),
    /// A whole batch.
    Batch(LocalBatch),
    /// An event.
    Event(Event),
}

/// Shared state of one subpartition.
pub struct Subpartition {
    index: usize,
    queue: Queue<Entry>,
    /// Events that overtake `queue` (unaligned barriers); read before anything in it.
    priority: Queue<Event>,
    /// Finished entries in the queue not yet taken by the reader: Flink's backlog.
    finished: AtomicUsize,
    /// Set by flush, cleared by the reader when it reads the unfinished buffer.
    flush_requested: AtomicBool,
    /// Publication count × 2 | reader-sleeps bit (see the module docs).
    signal: AtomicUsize,
    /// A reader is attached (pipelined subpartitions are read once).
    consumed: AtomicBool,
    /// The reader went away: writes are dropped, the queue drained.
    released: AtomicBool,
    /// The reader's wake-up callback. Locked only to set it and to call it after a
    /// successful `reader_waiting` swap, i.e. only when the reader sleeps.
    listener: StdMutex<Option<Listener>>,
    /// The reader's half-read buffer; touched only by the one reader (the lock is uncontended).
    current: StdMutex<Option<BufferConsumer>>,
    /// An entry the reader took from `queue` and put back behind a priority event that was
    /// added before it (reader only, like `current`).
    stashed: StdMutex<Option<Entry>>,
    /// Buffers (serialized slices or handed-off batches) the reader took.
    buffers_out: Counter,
    /// Bytes the reader took (serialized bytes, or Arrow bytes of handed-off batches).
    bytes_out: Counter,
    /// Set when a remote consumer (a TCP connection) attached: its address and what the
    /// sender side sent it.
    remote: OnceLock<RemoteReaderStats>,
    /// Buffer debloating: the size at which the writer finishes this subpartition's buffers
    /// (and the sender cuts its frames), as announced by the reader's gate; 0 until one
    /// announced a size (whole segments). Written by the reader side, read by the writer
    /// once per new buffer (relaxed: a late size only means one more buffer of the old size).
    buffer_size: AtomicUsize,
    /// Called after the reader took an entry (set by a spilled stream's feeder, which reads
    /// ahead only as far as the reader takes).
    taken: OnceLock<Listener>,
}

/// What the sender side of a connection did for a subpartition's remote reader (metrics).
#[derive(Debug)]
pub struct RemoteReaderStats {
    /// Address of the connection's peer (`host:port`).
    pub peer: String,
    /// Whether the connection's frames go through TCP or shared memory.
    pub transport: ChannelTransport,
    credit: AtomicU64,
    buffers_sent: Counter,
    bytes_sent: Counter,
}

impl RemoteReaderStats {
    /// Records the sender's credit for this reader (buffers it may still send).
    pub fn set_credit(&self, credit: u64) {
        self.credit.store(credit, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one data buffer of `bytes` payload bytes written to the connection.
    pub fn count_sent(&self, bytes: usize) {
        self.buffers_sent.add(1);
        self.bytes_sent.add(bytes as u64);
    }

    /// The sender's credit for this reader.
    pub fn credit(&self) -> u64 {
        self.credit.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Data buffers sent.
    pub fn buffers_sent(&self) -> u64 {
        self.buffers_sent.get()
    }

    /// Payload bytes sent.
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent.get()
    }
}

impl Subpartition {
    /// An empty subpartition.
    pub fn new(index: usize) -> Subpartition {
        Subpartition {
            index,
            queue: Queue::new(),
            priority: Queue::new(),
            finished: AtomicUsize::new(0),
            flush_requested: AtomicBool::new(false),
            signal: AtomicUsize::new(0),
            consumed: AtomicBool::new(false),
            released: AtomicBool::new(false),
            listener: StdMutex::new(None),
            current: StdMutex::new(None),
            stashed: StdMutex::new(None),
            buffers_out: Counter::default(),
            bytes_out: Counter::default(),
            remote: OnceLock::new(),
            buffer_size: AtomicUsize::new(0),
            taken: OnceLock::new(),
        }
    }

    /// Buffer debloating: from now on, buffers of this subpartition are finished once they
    /// hold `size` bytes (at most a segment; 0 restores whole segments).
    pub fn set_buffer_size(&self, size: usize) {
        self.buffer_size.store(size, Ordering::Relaxed);
    }

    /// Bytes a buffer of this subpartition holds: the announced size, or `full` (the segment
    /// size) when none was announced or it is larger.
    #[inline]
    pub fn buffer_size(&self, full: usize) -> usize {
        match self.buffer_size.load(Ordering::Relaxed) {
            0 => full,
            n => n.min(full),
        }
    }

    /// Sets the callback run after the reader took an entry (once; later calls are ignored).
    pub fn set_taken_listener(&self, listener: Listener) {
        let _ = self.taken.set(listener);
    }

    /// Buffers the reader took.
    pub fn buffers_out(&self) -> u64 {
        self.buffers_out.get()
    }

    /// Bytes the reader took.
    pub fn bytes_out(&self) -> u64 {
        self.bytes_out.get()
    }

    /// Marks the reader as remote, at `peer` over `transport`; returns its stats (set once:
    /// the first peer stays, as a subpartition is read once).
    pub fn set_remote_reader(&self, peer: &str, transport: ChannelTransport) -> &RemoteReaderStats {
        self.remote.get_or_init(|| RemoteReaderStats {
            peer: peer.to_string(),
            transport,
            credit: AtomicU64::new(0),
            buffers_sent: Counter::default(),
            bytes_sent: Counter::default(),
        })
    }

    /// The remote reader's stats, if the reader is remote.
    pub fn remote_reader(&self) -> Option<&RemoteReaderStats> {
        self.remote.get()
    }

    /// Whether a reader attached.
    pub fn is_consumed(&self) -> bool {
        self.consumed.load(Ordering::SeqCst)
    }

    /// Its index in the partition.
    pub fn index(&self) -> usize {
        self.index
    }

    // ---- writer side ----

    /// Adds the consumer of a new, unfinished buffer (not yet counted in the backlog).
    pub fn add_unfinished_buffer(&self, consumer: BufferConsumer) {
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        self.queue.push(Entry::Buffer(consumer));
    }

    /// Counts the tail buffer as finished and wakes the reader.
    pub fn buffer_finished(&self) {
        self.finished.fetch_add(1, Ordering::SeqCst);
        self.notify();
    }

    /// Adds a finished entry (batch or event) and wakes the reader.
    pub fn add_finished(&self, entry: Entry) {
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        self.finished.fetch_add(1, Ordering::SeqCst);
        self.queue.push(entry);
        self.notify();
    }

    /// Adds an event that the reader gets before anything already queued, even before the
    /// rest of a half-read buffer (Flink's priority events: unaligned barriers). Counted in
    /// the backlog like any finished entry.
    pub fn add_priority(&self, event: Event) {
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        self.finished.fetch_add(1, Ordering::SeqCst);
        self.priority.push(event);
        self.notify();
    }

    /// Makes the committed bytes of the unfinished tail buffer readable.
    pub fn flush(&self) {
        self.flush_requested.store(true, Ordering::SeqCst);
        self.notify();
    }

    fn notify(&self) {
        let old = self
            .signal
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                Some(s.wrapping_add(2) & !1)
            })
            .expect("the closure always returns Some");
        if old & 1 == 1 {
            let listener = self.listener.lock().unwrap().clone();
            if let Some(l) = listener {
                l();
            }
        }
    }

    /// Finished entries waiting for the reader (Flink's backlog).
    pub fn backlog(&self) -> usize {
        // The writer counts a buffer just after finishing it, so the reader may drain it and
        // uncount it first: for that moment the counter is one below zero, which is none
        // waiting.
        let n = self.finished.load(Ordering::SeqCst);
        if n > isize::MAX as usize {
            0
        } else {
            n
        }
    }

    /// Whether the reader released this subpartition (the writer may stop writing to it).
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    // ---- reader side ----

    /// Attaches the one reader. `false` if a reader was attached before.
    pub fn attach_reader(&self, listener: Listener) -> bool {
        if self.consumed.swap(true, Ordering::SeqCst) {
            return false;
        }
        *self.listener.lock().unwrap() = Some(listener);
        true
    }

    /// Takes the next readable item; `None` when nothing is readable now. After `None`, the
    /// listener is called once something becomes readable.
    pub fn poll(&self) -> Option<Polled> {
        loop {
            let snapshot = self.signal.load(Ordering::Acquire);
            if let Some(item) = self.poll_once() {
                match &item {
                    Polled::Data(slice) => {
                        self.buffers_out.add(1);
                        self.bytes_out.add(slice.len() as u64);
                    }
                    Polled::Batch(b) => {
                        self.buffers_out.add(1);
                        self.bytes_out.add(b.bytes as u64);
                    }
                    Polled::Event(_) => {}
                }
                if let Some(taken) = self.taken.get() {
                    taken();
                }
                return Some(item);
            }
            // Sleep only if nothing was published since the snapshot; otherwise look again.
            if self
                .signal
                .compare_exchange(snapshot, snapshot | 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return None;
            }
        }
    }

    fn poll_once(&self) -> Option<Polled> {
        let mut current = self.current.lock().unwrap();
        if let Some(e) = self.priority.pop() {
            self.finished.fetch_sub(1, Ordering::SeqCst);
            return Some(Polled::Event(e));
        }
        loop {
            if let Some(cur) = current.as_mut() {
                if !cur.is_finished() {
                    // The unfinished tail buffer is read only after a flush. The flag is
                    // consumed before the committed bytes are looked at, so a flush after
                    // this point is not lost.
                    if !self.flush_requested.swap(false, Ordering::SeqCst) {
                        return None;
                    }
                }
                let (slice, finished) = cur.read_available();
                if finished && cur.is_drained() {
                    *current = None;
                    self.finished.fetch_sub(1, Ordering::SeqCst);
                }
                match slice {
                    Some(s) => return Some(Polled::Data(s)),
                    None if finished => continue,
                    None => return None,
                }
            }
            let mut stashed = self.stashed.lock().unwrap();
            let entry = match stashed.take() {
                Some(e) => e,
                None => {
                    let e = self.queue.pop()?;
                    // A priority event added before this entry (the writer adds an unaligned
                    // barrier, then its position marker) must come out first.
                    if let Some(p) = self.priority.pop() {
                        *stashed = Some(e);
                        self.finished.fetch_sub(1, Ordering::SeqCst);
                        return Some(Polled::Event(p));
                    }
                    e
                }
            };
            drop(stashed);
            match entry {
                Entry::Buffer(c) => *current = Some(c),
                Entry::Batch(b) => {
                    self.finished.fetch_sub(1, Ordering::SeqCst);
                    return Some(Polled::Batch(b));
                }
                Entry::Event(e) => {
                    self.finished.fetch_sub(1, Ordering::SeqCst);
                    return Some(Polled::Event(e));
                }
            }
        }
    }

    /// The producer goes away while a reader is attached: the reader gets `event` (a
    /// `ProducerFailed`) before anything still queued, and later writes are dropped. The
    /// reader's side releases the subpartition once it has taken the event.
    pub fn fail_reader(&self, event: Event) {
        self.add_priority(event);
        self.released.store(true, Ordering::SeqCst);
    }

    /// The reader goes away: later writes are dropped and queued entries recycled.
    pub fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
        *self.listener.lock().unwrap() = None;
        *self.current.lock().unwrap() = None;
        *self.stashed.lock().unwrap() = None;
        while self.queue.pop().is_some() {}
        while self.priority.pop().is_some() {}
        self.finished.store(0, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Subpartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subpartition")
            .field("index", &self.index)
            .field("backlog", &self.backlog())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::base::wait::Wait;
    use crate::memory::GlobalPool;
    use crate::partition::buffer::new_buffer;
    use std::sync::Arc;

    /// The reader drains a finished buffer before the writer has counted it: the backlog
    /// reads 0 in between, not the counter's wrap-around (which overflowed the sender's
    /// backlog arithmetic under load).
    #[test]
    fn backlog_is_zero_while_a_drained_buffer_is_still_being_counted() {
        let g = GlobalPool::new(4096, 4096).unwrap();
        let pool = g.create_local_pool("p", 1, 1, "").unwrap();
        let sub = Subpartition::new(0);
        assert!(sub.attach_reader(Arc::new(|| {})));
        let (mut b, c) = new_buffer(pool.request(&mut Wait::forever()).unwrap());
        sub.add_unfinished_buffer(c);
        b.append(b"ab");
        b.finish();
        assert!(matches!(sub.poll(), Some(Polled::Data(_))));
        assert_eq!(sub.backlog(), 0);
        sub.buffer_finished();
        assert_eq!(sub.backlog(), 0);
        assert!(sub.poll().is_none());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::base::wait::Wait;
    use crate::memory::GlobalPool;
    use crate::partition::buffer::new_buffer;
    use loom::sync::Notify;
    use std::sync::Arc;

    /// Reads until end-of-partition, sleeping on the listener whenever `poll` finds nothing.
    /// A lost wake-up makes loom report a deadlock.
    fn read_all(sub: &Subpartition, wake: &Notify) -> (Vec<u8>, usize) {
        let mut bytes = Vec::new();
        let mut events = 0;
        loop {
            match sub.poll() {
                Some(Polled::Data(s)) => bytes.extend_from_slice(s.as_slice()),
                Some(Polled::Event(Event::EndOfPartition)) => return (bytes, events + 1),
                Some(Polled::Event(_)) | Some(Polled::Batch(_)) => events += 1,
                None => {
                    eprintln!("WAIT backlog={}", sub.backlog());
                    wake.wait()
                }
            }
        }
    }

    fn attach(sub: &Arc<Subpartition>) -> Arc<Notify> {
        let wake = Arc::new(Notify::new());
        let w = wake.clone();
        assert!(sub.attach_reader(Arc::new(move || w.notify())));
        wake
    }

    /// A writer fills a buffer in two appends with a flush in between, finishes it and ends
    /// the partition; the reader never misses a wake-up and sees every byte once, in order.
    #[test]
    fn loom_subpartition_flush_finish_and_end_wake_the_reader() {
        loom::model(|| {
            let g = GlobalPool::new(4096, 4096).unwrap();
            let pool = g.create_local_pool("p", 1, 1, "").unwrap();
            let sub = Arc::new(Subpartition::new(0));
            let wake = attach(&sub);
            let seg = pool.request(&mut Wait::forever()).unwrap();
            let writer = {
                let sub = sub.clone();
                loom::thread::spawn(move || {
                    let (mut b, c) = new_buffer(seg);
                    sub.add_unfinished_buffer(c);
                    b.append(b"ab");
                    sub.flush();
                    b.append(b"cd");
                    b.finish();
                    sub.buffer_finished();
                    sub.add_finished(Entry::Event(Event::EndOfPartition));
                })
            };
            let (bytes, events) = read_all(&sub, &wake);
            writer.join().unwrap();
            assert_eq!(bytes, b"abcd");
            assert_eq!(events, 1);
            assert_eq!(sub.backlog(), 0);
        });
    }

    /// A priority event (unaligned barrier) added while the reader polls: no wake-up is lost,
    /// it never comes after an entry queued after it, end-of-partition stays last, and the
    /// backlog returns to zero.
    #[test]
    fn loom_priority_event_overtakes_without_losing_a_wake_up() {
        loom::model(|| {
            let sub = Arc::new(Subpartition::new(0));
            let wake = attach(&sub);
            let writer = {
                let sub = sub.clone();
                loom::thread::spawn(move || {
                    sub.add_finished(Entry::Event(Event::User(vec![1])));
                    sub.add_priority(Event::Barrier {
                        id: 1,
                        unaligned: true,
                    });
                    sub.add_finished(Entry::Event(Event::BarrierPosition(1)));
                    sub.add_finished(Entry::Event(Event::EndOfPartition));
                })
            };
            let mut seen = Vec::new();
            loop {
                match sub.poll() {
                    Some(Polled::Event(Event::EndOfPartition)) => break,
                    Some(Polled::Event(e)) => seen.push(e),
                    Some(_) => panic!("no data was written"),
                    None => wake.wait(),
                }
            }
            writer.join().unwrap();
            let barrier = seen.iter().position(|e| matches!(e, Event::Barrier { .. }));
            let position = seen.iter().position(|e| matches!(e, Event::BarrierPosition(1)));
            assert_eq!(seen.len(), 3);
            assert!(barrier.unwrap() < position.unwrap());
            assert_eq!(sub.backlog(), 0);
        });
    }

    /// Two finished entries pushed concurrently with polling: both arrive, in order, and the
    /// backlog returns to zero.
    #[test]
    fn loom_subpartition_events_arrive_in_order() {
        loom::model(|| {
            let sub = Arc::new(Subpartition::new(0));
            let wake = attach(&sub);
            let writer = {
                let sub = sub.clone();
                loom::thread::spawn(move || {
                    sub.add_finished(Entry::Event(Event::ProducerFailed("x".into())));
                    sub.add_finished(Entry::Event(Event::EndOfPartition));
                })
            };
            let (_, events) = read_all(&sub, &wake);
            writer.join().unwrap();
            assert_eq!(events, 2);
            assert_eq!(sub.backlog(), 0);
        });
    }
}
