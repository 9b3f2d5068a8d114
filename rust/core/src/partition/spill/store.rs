//! [`SpillStore`]: what a blocking or hybrid partition keeps of each subpartition's stream,
//! in the partition's pool and, for what does not fit there, in a spill file.
//!
//! Each subpartition has a log: the serialized stream (the same length-prefixed Arrow IPC
//! records a pipelined subpartition carries) cut into chunks of at most one segment, with its
//! events in between. A chunk lives in a pooled segment (`Mem`) until memory runs short, then
//! in the partition's file (`Disk`). The writer never waits for readers: when the store holds
//! its share of segments, it spills one to the file and reuses the segment.
//!
//! Readers never take entries out of the log (except a selective hybrid's one reader, which
//! frees what it has read): each reader walks it from the start with its own cursor
//! ([`super::replay`]), so the stream can be read again until the partition is released.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use arrow_array::RecordBatch;

use super::dir::SpillDir;
use super::file::{Extent, SpillFile};
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::base::metrics::Counter;
use crate::base::wait::Wait;
use crate::memory::{LocalPool, PooledSegment};
use crate::partition::buffer::{new_buffer, BufferBuilder, BufferConsumer, BufferSlice};
use crate::serde::{BatchEncoder, Compression};

/// What a spillable partition does with its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpillKind {
    /// Readers get data once the partition is finished, from the start, as often as they like.
    Blocking,
    /// Readers read while the writer writes; what a slow reader has not read yet spills.
    /// `replay`: everything is kept until release (readers may start again from the start);
    /// otherwise each subpartition is read once and what was read is freed.
    Hybrid {
        /// Keep everything for later or repeated readers (Flink's HYBRID_FULL).
        replay: bool,
    },
}

impl SpillKind {
    /// Whether the stream is kept whole until release (so it can be read again).
    pub fn replays(self) -> bool {
        !matches!(self, SpillKind::Hybrid { replay: false })
    }

    /// Whether readers see data before the partition is finished.
    pub fn reads_while_writing(self) -> bool {
        matches!(self, SpillKind::Hybrid { .. })
    }

    /// The name Python uses.
    pub fn name(self) -> &'static str {
        match self {
            SpillKind::Blocking => "blocking",
            SpillKind::Hybrid { .. } => "hybrid",
        }
    }
}

/// One entry of a subpartition's log.
#[derive(Clone)]
pub(crate) enum Stored {
    /// Stream bytes in memory: a finished buffer, shared with the readers reading it.
    Mem(BufferSlice),
    /// Stream bytes in the spill file.
    Disk(Extent),
    /// An event, in order with the bytes around it.
    Event(Event),
}

/// What a reader at some position of a log gets next.
pub(crate) enum Next {
    /// The entry there (and the file, for a `Disk` one).
    Entry(Stored, Option<Arc<SpillFile>>),
    /// Nothing there yet.
    Wait,
    /// The partition was released, or what was there was freed.
    Gone,
}

/// A failed [`SpillStore::write`].
#[derive(Debug)]
pub(crate) struct WriteFailed {
    /// Why.
    pub error: Error,
    /// Whether part of the batch was stored before it failed.
    pub partial: bool,
}

impl WriteFailed {
    fn before(error: Error) -> WriteFailed {
        WriteFailed {
            error,
            partial: false,
        }
    }
}

/// What [`SpillStore::spill_one`] did.
enum Spilled {
    /// Spilled a chunk nobody else held: here is its segment.
    Free(PooledSegment),
    /// Spilled a chunk a reader is copying: its segment returns to the pool after.
    Shared,
    /// No chunk is in memory.
    Nothing,
}

struct OpenChunk {
    builder: BufferBuilder,
    consumer: BufferConsumer,
}

#[derive(Default)]
struct Log {
    entries: VecDeque<Stored>,
    /// Position of `entries[0]` in the log (a selective hybrid frees what its reader read).
    base: u64,
    open: Option<OpenChunk>,
    encoder: Option<BatchEncoder>,
    /// `Mem` entries in `entries`.
    in_memory: usize,
    /// Readers attached (a selective hybrid allows one).
    readers: usize,
}

struct State {
    logs: Vec<Log>,
    file: Option<Arc<SpillFile>>,
    /// Segments the store holds (open chunks and `Mem` entries).
    segments: usize,
    /// The last event of every log once the partition is finished (or failed).
    end: Option<Event>,
    released: bool,
}

#[derive(Default)]
struct Metrics {
    spilled_bytes: Counter,
    spilled_chunks: Counter,
    read_back_bytes: Counter,
    read_back_chunks: Counter,
    stream_bytes: Counter,
}

/// A snapshot of a spillable partition's numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillMetrics {
    /// `"blocking"` or `"hybrid"`.
    pub kind: &'static str,
    /// Whether the stream is kept for repeated reads.
    pub replay: bool,
    /// Stream bytes written (after compression).
    pub stream_bytes: u64,
    /// Bytes written to the spill file.
    pub spilled_bytes: u64,
    /// Chunks written to the spill file.
    pub spilled_chunks: u64,
    /// Bytes read back from the spill file (by every reader).
    pub read_back_bytes: u64,
    /// Chunks read back from the spill file.
    pub read_back_chunks: u64,
    /// Bytes the spill file holds now (0 once released).
    pub disk_bytes: u64,
    /// Segments of the pool the store holds now.
    pub memory_segments: usize,
    /// Spill files open now (0 or 1).
    pub files: usize,
}

/// The stored streams of one spillable partition.
pub struct SpillStore {
    id: String,
    kind: SpillKind,
    dir: Arc<SpillDir>,
    compression: Option<Compression>,
    /// Segments of the pool left to each reader (never held by the store): its read-ahead.
    reader_reserve: usize,
    /// Readers feeding their views now ([`SpillStore::reader_started`]).
    readers: AtomicUsize,
    state: Mutex<State>,
    /// Signalled when a log grows, the partition ends or is released.
    changed: Condvar,
    /// Signalled when a reader frees memory (a writer waiting at `max_spill` may go on).
    room: Condvar,
    metrics: Metrics,
}

impl SpillStore {
    /// A store for `num_subpartitions` logs; spill files go to `dir`.
    pub fn new(
        id: &str,
        num_subpartitions: usize,
        kind: SpillKind,
        dir: Arc<SpillDir>,
        compression: Option<Compression>,
        reader_reserve: usize,
    ) -> SpillStore {
        SpillStore {
            id: id.to_string(),
            kind,
            dir,
            compression,
            reader_reserve,
            readers: AtomicUsize::new(0),
            state: Mutex::new(State {
                logs: (0..num_subpartitions).map(|_| Log::default()).collect(),
                file: None,
                segments: 0,
                end: None,
                released: false,
            }),
            changed: Condvar::new(),
            room: Condvar::new(),
            metrics: Metrics::default(),
        }
    }

    /// The kind.
    pub fn kind(&self) -> SpillKind {
        self.kind
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Appends `batch` to subpartition `sub`'s log. Waits only when memory is short and
    /// nothing can be spilled (a selective hybrid at `max_spill`: backpressure). On failure
    /// says whether part of the batch was stored (the stream is then broken).
    pub(crate) fn write(
        &self,
        pool: &LocalPool,
        sub: usize,
        batch: &RecordBatch,
        wait: &mut Wait<'_>,
    ) -> std::result::Result<(), WriteFailed> {
        let mut st = self.lock();
        if st.released {
            return Err(WriteFailed::before(Error::Closed("partition")));
        }
        let log = &mut st.logs[sub];
        let encoder = match log.encoder.as_mut() {
            Some(e) => e,
            None => log.encoder.insert(
                BatchEncoder::with_compression(&batch.schema(), self.compression)
                    .map_err(WriteFailed::before)?,
            ),
        };
        let record = encoder.encode(batch).map_err(WriteFailed::before)?;
        let (header, parts) = record.into_parts();
        let mut stored = 0;
        for chunk in std::iter::once(&header[..]).chain(parts.iter().map(|p| p.as_slice())) {
            if let Err(error) = self.append(&mut st, pool, sub, chunk, wait, &mut stored) {
                return Err(WriteFailed {
                    error,
                    partial: stored > 0,
                });
            }
        }
        self.metrics.stream_bytes.add(stored as u64);
        Ok(())
    }

    /// Appends bytes to `sub`'s open chunk, closing full chunks and opening new ones.
    fn append(
        &self,
        st: &mut MutexGuard<'_, State>,
        pool: &LocalPool,
        sub: usize,
        mut data: &[u8],
        wait: &mut Wait<'_>,
        stored: &mut usize,
    ) -> Result<()> {
        while !data.is_empty() {
            if st.logs[sub].open.is_none() {
                let seg = self.segment(st, pool, wait)?;
                let (builder, consumer) = new_buffer(seg);
                st.logs[sub].open = Some(OpenChunk { builder, consumer });
            }
            let open = st.logs[sub].open.as_mut().expect("open chunk");
            let n = open.builder.append(data);
            *stored += n;
            data = &data[n..];
            if open.builder.remaining() == 0 {
                self.close_chunk(st, sub);
            }
        }
        Ok(())
    }

    /// Moves `sub`'s open chunk (if it holds anything) into its log and wakes readers.
    fn close_chunk(&self, st: &mut State, sub: usize) {
        let log = &mut st.logs[sub];
        let Some(OpenChunk {
            builder,
            mut consumer,
        }) = log.open.take()
        else {
            return;
        };
        builder.finish();
        match consumer.read_available().0 {
            Some(bytes) => {
                log.entries.push_back(Stored::Mem(bytes));
                log.in_memory += 1;
                if self.kind.reads_while_writing() {
                    self.changed.notify_all();
                }
            }
            None => st.segments -= 1, // empty: the segment goes back to the pool
        }
    }

    /// A segment for a new chunk: a free one while the store holds less than its share,
    /// else one freed by spilling a chunk. When nothing can be spilled (every chunk is on
    /// disk or being read, or a selective hybrid is at `max_spill`), waits until a reader
    /// frees memory (backpressure), as long as `wait` allows.
    fn segment(
        &self,
        st: &mut MutexGuard<'_, State>,
        pool: &LocalPool,
        wait: &mut Wait<'_>,
    ) -> Result<PooledSegment> {
        /// Longest sleep before looking at the pool again (segments a reader recycles are
        /// not signalled here).
        const NAP: Duration = Duration::from_millis(5);
        loop {
            if st.released {
                return Err(Error::Closed("partition"));
            }
            let share = pool.stats().share;
            if st.segments + self.reader_room(share) < share {
                if let Some(seg) = pool.try_request() {
                    st.segments += 1;
                    return Ok(seg);
                }
            }
            match self.spill_one(st) {
                Ok(Spilled::Free(seg)) => return Ok(seg),
                Ok(Spilled::Shared) => continue,
                Ok(Spilled::Nothing) => {}
                Err(e @ Error::Spill(_))
                    if self.kind == (SpillKind::Hybrid { replay: false }) && self.dir.used() > 0 =>
                {
                    log::debug!("creditflow: partition {:?}: {e}; waiting for the reader", self.id);
                }
                Err(e) => return Err(e),
            }
            // Not under the store's lock: the tick may check for Ctrl-C, which takes the GIL,
            // and a Python thread holding the GIL may be waiting for this lock (metrics()).
            let nap = MutexGuard::unlocked(st, || wait.tick())?.min(NAP);
            self.room.wait_for(st, nap);
        }
    }

    /// Spills chunks until the store holds no more than its share of the pool leaves it
    /// (the share shrinks when other pools are created), so readers get segments.
    pub(crate) fn fit(&self, pool: &LocalPool) -> Result<()> {
        let mut st = self.lock();
        loop {
            let share = pool.stats().share;
            if st.released || st.segments + self.reader_room(share) <= share {
                break;
            }
            match self.spill_one(&mut st)? {
                Spilled::Free(seg) => {
                    st.segments -= 1;
                    drop(seg);
                }
                Spilled::Shared => {}
                Spilled::Nothing => break,
            }
        }
        Ok(())
    }

    /// A reader needs a segment to read a spilled chunk back into and the pool has none
    /// free: spills in-memory chunks until one is. The readers' room may be overdrawn (a
    /// reader that started alone read ahead more than its part once others started), and
    /// the reader being waited on must not wait for those that are not.
    pub(crate) fn make_room(&self, pool: &LocalPool) {
        let mut st = self.lock();
        while !st.released {
            let stats = pool.stats();
            if stats.in_use < stats.share {
                break;
            }
            match self.spill_one(&mut st) {
                Ok(Spilled::Free(seg)) => {
                    st.segments -= 1;
                    drop(seg);
                }
                Ok(Spilled::Shared) => {}
                // Nothing in memory, or the disk is full (`max_spill`): the reader waits for
                // a segment as before; the writer meets the error, if it is one.
                Ok(Spilled::Nothing) | Err(_) => break,
            }
        }
    }

    /// A reader starts feeding its view (until [`SpillStore::reader_done`]).
    pub(crate) fn reader_started(&self) {
        self.readers.fetch_add(1, Ordering::SeqCst);
    }

    /// A reader stopped feeding its view.
    pub(crate) fn reader_done(&self) {
        self.readers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Segments of a pool of `share` the store leaves to its readers: each reader's
    /// read-ahead, but at most half the share (the writer keeps the rest). Several readers
    /// of spilled data at once (an epoch that interleaves runs) each need segments to read
    /// into; one whose consumer waits on another must not hold them all.
    fn reader_room(&self, share: usize) -> usize {
        let readers = self.readers.load(Ordering::SeqCst).max(1);
        (readers * self.reader_reserve).min(share / 2).max(1)
    }

    /// How many finished entries each reader may queue ahead of its consumer now: its part
    /// of the readers' room, at least one.
    pub(crate) fn read_ahead(&self, share: usize) -> usize {
        let readers = self.readers.load(Ordering::SeqCst).max(1);
        (self.reader_room(share) / readers).clamp(1, self.reader_reserve.max(1))
    }

    /// Writes one in-memory chunk to the spill file: the newest one of the log with the most
    /// chunks in memory (readers read oldest first, so that is read last).
    fn spill_one(&self, st: &mut State) -> Result<Spilled> {
        let Some(sub) = (0..st.logs.len())
            .filter(|&i| st.logs[i].in_memory > 0)
            .max_by_key(|&i| st.logs[i].in_memory)
        else {
            return Ok(Spilled::Nothing);
        };
        let file = match &st.file {
            Some(f) => f.clone(),
            None => st
                .file
                .insert(Arc::new(SpillFile::create(&self.dir, &self.id)?))
                .clone(),
        };
        let log = &mut st.logs[sub];
        let at = log
            .entries
            .iter()
            .rposition(|e| matches!(e, Stored::Mem(_)))
            .expect("in_memory > 0");
        let extent = match &log.entries[at] {
            Stored::Mem(chunk) => file.append(chunk.as_slice())?,
            _ => unreachable!("a Mem entry"),
        };
        let Stored::Mem(chunk) = std::mem::replace(&mut log.entries[at], Stored::Disk(extent)) else {
            unreachable!("a Mem entry")
        };
        log.in_memory -= 1;
        self.metrics.spilled_bytes.add(u64::from(extent.len));
        self.metrics.spilled_chunks.add(1);
        match chunk.into_segment() {
            Ok(seg) => Ok(Spilled::Free(seg)),
            Err(_) => {
                // A reader is copying it: the segment goes back to the pool when it is done.
                st.segments -= 1;
                Ok(Spilled::Shared)
            }
        }
    }

    /// Closes every open chunk of a hybrid partition, so its bytes become readable; and
    /// spills down to the store's share of the pool, which shrinks when other pools are
    /// created (the environment's flusher calls this every `buffer_timeout`, so an idle
    /// finished partition gives memory back too).
    pub(crate) fn flush(&self, pool: &LocalPool) {
        if self.kind.reads_while_writing() {
            let mut st = self.lock();
            for sub in 0..st.logs.len() {
                self.close_chunk(&mut st, sub);
            }
        }
        if let Err(e) = self.fit(pool) {
            // Nothing is lost: the chunks stay in memory, and the writer meets the error.
            log::warn!(
                "creditflow: partition {:?}: could not spill down to its share: {e}",
                self.id
            );
        }
    }

    /// Appends `event` to `sub`'s log (every log when `None`), after the bytes before it.
    pub(crate) fn add_event(&self, sub: Option<usize>, event: &Event) {
        let mut st = self.lock();
        for i in 0..st.logs.len() {
            if sub.is_some_and(|s| s != i) {
                continue;
            }
            self.close_chunk(&mut st, i);
            st.logs[i].entries.push_back(Stored::Event(event.clone()));
        }
        self.changed.notify_all();
    }

    /// Ends every log with `event` (end-of-partition or the failure); readers of a blocking
    /// partition may start.
    pub(crate) fn end(&self, event: Event) {
        let mut st = self.lock();
        if st.end.is_some() {
            return;
        }
        for i in 0..st.logs.len() {
            self.close_chunk(&mut st, i);
        }
        st.end = Some(event);
        self.changed.notify_all();
    }

    /// Registers a reader of `sub`. A selective hybrid's subpartition is read once.
    pub(crate) fn attach(&self, sub: usize) -> Result<()> {
        let mut st = self.lock();
        if st.released {
            return Err(Error::PartitionNotFound(self.id.clone()));
        }
        let log = &mut st.logs[sub];
        if !self.kind.replays() && log.readers > 0 {
            return Err(Error::AlreadyConsumed {
                partition: self.id.clone(),
                index: sub,
            });
        }
        log.readers += 1;
        Ok(())
    }

    /// What a reader of `sub` at position `pos` gets next, waiting up to `timeout` for it.
    /// A blocking partition's readers see nothing before the end; after a failure they see
    /// only the failure (nothing partial is delivered as complete).
    pub(crate) fn next(&self, sub: usize, pos: u64, timeout: Duration) -> Next {
        let mut st = self.lock();
        let mut waited = false;
        loop {
            if st.released {
                return Next::Gone;
            }
            let ready = self.kind.reads_while_writing() || st.end.is_some();
            if ready {
                if let Some(Event::ProducerFailed(m)) = &st.end {
                    if !self.kind.reads_while_writing() {
                        return Next::Entry(Stored::Event(Event::ProducerFailed(m.clone())), None);
                    }
                }
                let log = &st.logs[sub];
                if pos < log.base {
                    return Next::Gone;
                }
                let i = (pos - log.base) as usize;
                if let Some(e) = log.entries.get(i) {
                    let file = matches!(e, Stored::Disk(_)).then(|| st.file.clone()).flatten();
                    return Next::Entry(e.clone(), file);
                }
                if let Some(end) = &st.end {
                    return Next::Entry(Stored::Event(end.clone()), None);
                }
            }
            if waited {
                return Next::Wait;
            }
            self.changed.wait_for(&mut st, timeout);
            waited = true;
        }
    }

    /// A selective hybrid's reader of `sub` is past position `pos`: frees the entries before.
    pub(crate) fn consumed(&self, sub: usize, pos: u64) {
        if self.kind.replays() {
            return;
        }
        let mut st = self.lock();
        let mut freed = 0;
        let log = &mut st.logs[sub];
        while log.base < pos {
            match log.entries.pop_front() {
                Some(Stored::Mem(_)) => {
                    log.in_memory -= 1;
                    freed += 1;
                }
                Some(_) => {}
                None => break,
            }
            log.base += 1;
        }
        st.segments -= freed;
        if freed > 0 {
            self.room.notify_all();
        }
    }

    /// Counts a chunk read back from the file.
    pub(crate) fn count_read_back(&self, bytes: usize) {
        self.metrics.read_back_bytes.add(bytes as u64);
        self.metrics.read_back_chunks.add(1);
    }

    /// Frees memory and removes the spill file; readers stop. Idempotent.
    pub(crate) fn release(&self) {
        let mut st = self.lock();
        st.released = true;
        for log in &mut st.logs {
            log.entries.clear();
            log.open = None;
            log.encoder = None;
            log.in_memory = 0;
        }
        st.segments = 0;
        // Readers hold the file only while reading one chunk: it goes (and is unlinked) then.
        st.file = None;
        self.changed.notify_all();
        self.room.notify_all();
    }

    /// A snapshot of the numbers.
    pub fn metrics(&self) -> SpillMetrics {
        let st = self.lock();
        SpillMetrics {
            kind: self.kind.name(),
            replay: self.kind.replays(),
            stream_bytes: self.metrics.stream_bytes.get(),
            spilled_bytes: self.metrics.spilled_bytes.get(),
            spilled_chunks: self.metrics.spilled_chunks.get(),
            read_back_bytes: self.metrics.read_back_bytes.get(),
            read_back_chunks: self.metrics.read_back_chunks.get(),
            disk_bytes: st.file.as_ref().map_or(0, |f| f.len()),
            memory_segments: st.segments,
            files: usize::from(st.file.is_some()),
        }
    }
}

impl std::fmt::Debug for SpillStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillStore")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .finish()
    }
}
