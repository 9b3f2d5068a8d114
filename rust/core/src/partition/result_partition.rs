//! A result partition: N pipelined subpartitions fed by one writer through one local pool
//! (Flink's `PipelinedResultPartition`).
//!
//! Two ways a batch enters a subpartition:
//! * **hand-off** (default for readers in the same environment): the batch itself is queued,
//!   holding as many segments of the partition's pool as its Arrow memory needs, so the
//!   queue stays within the same memory budget without copying anything;
//! * **serialized**: the batch is Arrow-IPC encoded straight into segments through a
//!   [`BufferBuilder`]; a flushed, partly filled buffer is readable before it is full. Record
//!   bodies are IPC-compressed when the environment sets `wire_compression` (the writer
//!   cannot tell a local serialized reader from a remote one, so it applies to both).
//!
//! A write that finds no free segment blocks: that is backpressure, and the time is
//! measured ([`PartitionMetrics::backpressured_ms_per_second`](super::PartitionMetrics::backpressured_ms_per_second)).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use super::buffer::{new_buffer_limited, BufferBuilder};
use super::metrics::{PartitionMetrics, RemoteReaderMetrics, SubpartitionMetrics};
use super::partitioner::Piece;
use super::spill::{replay, SpillStore};
use super::subpartition::{Entry, Listener, Subpartition, Token};
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::base::metrics::{Counter, TimeMeter};
use crate::base::wait::Wait;
use crate::memory::{LocalPool, PooledSegment};
use crate::serde::{batch_bytes, BatchEncoder, Compression};

mod handoff;

/// Where partitions are registered, so that they can unregister when done.
pub(crate) type Registry = Mutex<std::collections::HashMap<String, Arc<ResultPartition>>>;

/// How batches are put into subpartitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// Queue the batch itself (zero copy), accounted in segments.
    Batch,
    /// Serialize into segments (what remote readers need).
    Serialized,
}

/// Per-subpartition writer state of the serialized path.
#[derive(Default)]
struct SerialState {
    builder: Option<BufferBuilder>,
    encoder: Option<BatchEncoder>,
    /// Bytes appended to the stream so far (to tell whether a failed write left half a record).
    stream_bytes: u64,
}

/// A partition with `n` subpartitions.
pub struct ResultPartition {
    id: String,
    subpartitions: Vec<Arc<Subpartition>>,
    pool: LocalPool,
    handoff: Handoff,
    /// IPC body compression of the serialized path (the environment's `wire_compression`).
    compression: Option<Compression>,
    flush_every_write: bool,
    /// Schema of the first batch; every later batch must match it.
    schema: OnceLock<SchemaRef>,
    /// Builders and encoders of the serialized path; also serializes concurrent writers.
    serial: Mutex<Vec<SerialState>>,
    /// Subpartitions whose `SerialState::builder` is open (each holds a segment until more
    /// is written to it). Changed only with `serial` locked.
    open_builders: AtomicUsize,
    /// End-of-partition was sent: no more writes.
    finished: AtomicBool,
    /// Set when a write failed half-way; later writes fail with it.
    failed: Mutex<Option<String>>,
    /// Set when a remote consumer went away without cancelling; later writes fail with it.
    lost: Mutex<Option<String>>,
    /// The producer's first `fail` message, also one given after `finish`: what a release
    /// tells the readers it cuts off (the cause rather than the release itself).
    cause: Mutex<Option<String>>,
    /// Subpartitions whose reader saw the end or went away.
    done: AtomicUsize,
    released: AtomicBool,
    registry: Weak<Registry>,
    metrics: Metrics,
    /// The stored streams of a blocking or hybrid partition (`None`: pipelined).
    spill: Option<SpillStore>,
}

#[derive(Default)]
struct Metrics {
    batches: Counter,
    buffers: Counter,
    bytes: Counter,
    rows: Counter,
    backpressure: TimeMeter,
}

impl ResultPartition {
    #[cfg(not(loom))] // only the environment, the gates and the network call it: not in loom builds
    #[allow(clippy::too_many_arguments)] // one per setting the environment hands its partitions
    pub(crate) fn new(
        id: String,
        num_subpartitions: usize,
        pool: LocalPool,
        handoff: Handoff,
        compression: Option<Compression>,
        flush_every_write: bool,
        registry: Weak<Registry>,
        spill: Option<SpillStore>,
    ) -> ResultPartition {
        ResultPartition {
            id,
            subpartitions: (0..num_subpartitions)
                .map(|i| Arc::new(Subpartition::new(i)))
                .collect(),
            pool,
            handoff,
            compression,
            flush_every_write,
            schema: OnceLock::new(),
            serial: Mutex::new((0..num_subpartitions).map(|_| SerialState::default()).collect()),
            open_builders: AtomicUsize::new(0),
            finished: AtomicBool::new(false),
            failed: Mutex::new(None),
            lost: Mutex::new(None),
            cause: Mutex::new(None),
            done: AtomicUsize::new(0),
            released: AtomicBool::new(false),
            registry,
            metrics: Metrics::default(),
            spill,
        }
    }

    /// The id it is registered under.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Number of subpartitions.
    pub fn num_subpartitions(&self) -> usize {
        self.subpartitions.len()
    }

    /// One subpartition.
    pub fn subpartition(&self, index: usize) -> Result<&Arc<Subpartition>> {
        self.subpartitions
            .get(index)
            .ok_or_else(|| Error::SubpartitionOutOfRange {
                partition: self.id.clone(),
                index,
                count: self.subpartitions.len(),
            })
    }

    /// Attaches a reader to subpartition `index`; `listener` is called when it has something
    /// new to read. A pipelined subpartition has one reader ([`Error::AlreadyConsumed`] for
    /// a second); a blocking or replaying hybrid one gets a fresh view that reads the stored
    /// stream from the start, as many times as readers ask.
    #[cfg(not(loom))] // only the gates and the network call it: not in loom builds
    pub(crate) fn open_reader(
        self: &Arc<Self>,
        index: usize,
        listener: Listener,
    ) -> Result<Arc<Subpartition>> {
        let base = self.subpartition(index)?;
        let Some(store) = &self.spill else {
            return if base.attach_reader(listener) {
                Ok(base.clone())
            } else {
                Err(Error::AlreadyConsumed {
                    partition: self.id.clone(),
                    index,
                })
            };
        };
        store.attach(index)?;
        let view = Arc::new(Subpartition::new(index));
        view.attach_reader(listener);
        replay::spawn(self.clone(), index, view.clone())?;
        Ok(view)
    }

    /// The schema of the first batch written, if any.
    pub fn schema(&self) -> Option<SchemaRef> {
        self.schema.get().cloned()
    }

    /// Checks (or, for the first batch, records) the schema.
    pub(crate) fn check_schema(&self, batch: &RecordBatch) -> Result<()> {
        self.check_schema_of(batch.schema_ref())
    }

    /// Checks (or, for the first batch, records) `schema` as the schema of a batch written.
    pub(crate) fn check_schema_of(&self, schema: &SchemaRef) -> Result<()> {
        let expected = self.schema.get_or_init(|| schema.clone());
        if expected.as_ref() != schema.as_ref() {
            return Err(Error::SchemaMismatch {
                partition: self.id.clone(),
                expected: expected.to_string(),
                actual: schema.to_string(),
            });
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<()> {
        if self.released.load(Ordering::SeqCst) {
            return Err(Error::Closed("partition"));
        }
        if self.finished.load(Ordering::SeqCst) {
            return Err(Error::Closed("partition (end-of-partition already sent)"));
        }
        if let Some(msg) = self.failed.lock().unwrap().as_ref() {
            return Err(Error::ProducerFailed(msg.clone()));
        }
        if let Some(msg) = self.lost.lock().unwrap().as_ref() {
            return Err(Error::ConnectionLost(msg.clone()));
        }
        Ok(())
    }

    /// A remote consumer of one of the subpartitions disappeared (its connection broke):
    /// the data written for it is lost, so the writer fails from its next write on.
    #[cfg(not(loom))] // only the environment, the gates and the network call it: not in loom builds
    pub(crate) fn consumer_lost(&self, message: &str) {
        let mut lost = self.lost.lock().unwrap();
        if lost.is_none() {
            *lost = Some(message.to_string());
        }
    }

    /// Writes pieces already split by a partitioner. With hand-off, all pieces are queued or
    /// none (a timeout loses nothing and the write may be retried).
    pub(crate) fn write_pieces(
        &self,
        pieces: Vec<Piece>,
        token: Option<Token>,
        wait: &mut Wait<'_>,
    ) -> Result<()> {
        self.check_writable()?;
        if let Some(store) = &self.spill {
            return self.write_spillable(store, pieces, wait);
        }
        match self.handoff {
            Handoff::Batch => self.write_handoff(pieces, token, wait),
            Handoff::Serialized => self.write_serialized(pieces, wait),
        }?;
        self.after_write()
    }

    fn after_write(&self) -> Result<()> {
        // A consumer that went away while this write waited for buffers: its share is lost.
        if let Some(msg) = self.lost.lock().unwrap().as_ref() {
            return Err(Error::ConnectionLost(msg.clone()));
        }
        if self.flush_every_write {
            self.flush();
        }
        Ok(())
    }

    /// Appends pieces to a blocking or hybrid partition's store. A failure after a piece was
    /// partly stored, or of the disk, fails the partition: its readers get `ProducerFailed`,
    /// never a stream that looks complete.
    fn write_spillable(&self, store: &SpillStore, pieces: Vec<Piece>, wait: &mut Wait<'_>) -> Result<()> {
        for Piece {
            subpartition: sp,
            batch,
            ..
        } in pieces
        {
            if let Err(f) = store.write(&self.pool, sp, &batch, wait) {
                // Half a batch in the log, or the disk refused it: readers must not take
                // what is stored for complete. Otherwise (a timeout before anything was
                // stored) the write may be retried.
                if f.partial || matches!(f.error, Error::Spill(_)) {
                    self.fail(&format!("write to partition {:?} failed: {}", self.id, f.error));
                }
                return Err(f.error);
            }
            self.metrics.batches.add(1);
            self.metrics.bytes.add(batch_bytes(&batch) as u64);
            self.metrics.rows.add(batch.num_rows() as u64);
        }
        if self.flush_every_write {
            store.flush(&self.pool);
        }
        Ok(())
    }

    fn write_serialized(&self, pieces: Vec<Piece>, wait: &mut Wait<'_>) -> Result<()> {
        let mut serial = self.serial.lock().unwrap();
        for Piece {
            subpartition: sp,
            batch,
            ..
        } in pieces
        {
            let sub = &self.subpartitions[sp];
            if sub.is_released() {
                continue;
            }
            let state = &mut serial[sp];
            let encoder = match state.encoder.as_mut() {
                Some(e) => e,
                None => state
                    .encoder
                    .insert(BatchEncoder::with_compression(&batch.schema(), self.compression)?),
            };
            let record = encoder.encode(&batch)?;
            // Reserve the segments the record needs before writing any of it, so that a
            // timeout or interrupt loses nothing and the write can be retried. A record
            // larger than half the pool's share streams through segment by segment instead
            // (the segments it needs may only free up as the reader consumes its first part);
            // if that is interrupted half-way, the partition fails (see below).
            let free_in_builder = state.builder.as_ref().map_or(0, |b| b.remaining());
            let needed = record
                .len()
                .saturating_sub(free_in_builder)
                .div_ceil(sub.buffer_size(self.pool.segment_size()));
            // Segments held by the other subpartitions' open builders cannot be waited for:
            // they free up only when this writer writes there (smaller, debloated buffers
            // make `needed` large enough for that to matter).
            let open_elsewhere =
                self.open_builders.load(Ordering::Relaxed) - usize::from(state.builder.is_some());
            let room = self.pool.stats().share.saturating_sub(open_elsewhere);
            let mut reserved = if needed == 0 || needed * 2 > room {
                Vec::new()
            } else {
                match self.pool.try_request_many(needed) {
                    Some(s) => s,
                    None => {
                        let _blocked = self.metrics.backpressure.start();
                        self.pool.request_many(needed, wait)?
                    }
                }
            };
            let start = state.stream_bytes;
            for chunk in record.chunks() {
                if let Err(e) = self.append(sub, state, &mut reserved, chunk, start, wait) {
                    if state.stream_bytes != start {
                        // Half a record is in the stream: the reader cannot continue.
                        let msg = format!("write to partition {:?} failed mid-batch: {e}", self.id);
                        *self.failed.lock().unwrap() = Some(msg.clone());
                        self.end_stream(sub, state, Event::ProducerFailed(msg));
                    }
                    return Err(e);
                }
            }
            self.metrics.batches.add(1);
            self.metrics.bytes.add(batch_bytes(&batch) as u64);
            self.metrics.rows.add(batch.num_rows() as u64);
        }
        Ok(())
    }

    /// Appends bytes to a subpartition's stream, starting buffers as needed. Once the record
    /// that began at stream offset `record_start` is partly written, an exhausted pool lends
    /// overdraft segments to finish it before the writer blocks.
    fn append(
        &self,
        sub: &Subpartition,
        state: &mut SerialState,
        reserved: &mut Vec<PooledSegment>,
        mut data: &[u8],
        record_start: u64,
        wait: &mut Wait<'_>,
    ) -> Result<()> {
        let builder = &mut state.builder;
        while !data.is_empty() {
            let b = match builder {
                Some(b) => b,
                None => {
                    let mid_record = state.stream_bytes != record_start;
                    let seg = match reserved
                        .pop()
                        .or_else(|| self.pool.try_request())
                        .or_else(|| mid_record.then(|| self.pool.try_request_overdraft()).flatten())
                    {
                        Some(s) => s,
                        None => {
                            let _blocked = self.metrics.backpressure.start();
                            self.pool.request(wait)?
                        }
                    };
                    let limit = sub.buffer_size(usize::MAX);
                    let (b, c) = new_buffer_limited(seg, limit);
                    sub.add_unfinished_buffer(c);
                    self.open_builders.fetch_add(1, Ordering::Relaxed);
                    builder.insert(b)
                }
            };
            let n = b.append(data);
            state.stream_bytes += n as u64;
            data = &data[n..];
            if b.remaining() == 0 {
                builder.take().expect("builder").finish();
                self.open_builders.fetch_sub(1, Ordering::Relaxed);
                self.metrics.buffers.add(1);
                sub.buffer_finished();
            }
        }
        Ok(())
    }

    /// Makes partly filled buffers readable now.
    pub fn flush(&self) {
        if let Some(store) = &self.spill {
            store.flush(&self.pool);
        } else if self.handoff == Handoff::Serialized {
            for s in &self.subpartitions {
                s.flush();
            }
        }
    }

    /// Finishes open buffers and sends end-of-partition to every subpartition. Idempotent.
    pub fn finish(&self) -> Result<()> {
        if self.finished.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.end_all(Event::EndOfPartition);
        Ok(())
    }

    /// Ends the partition with an error instead of end-of-partition: every reader fails
    /// with `ProducerFailed(message)` after the data written before. Idempotent. After
    /// [`ResultPartition::finish`] the readers keep their end-of-partition; `message` is then
    /// only what a later [`ResultPartition::release`] gives the readers it cuts off.
    pub fn fail(&self, message: &str) {
        self.cause
            .lock()
            .unwrap()
            .get_or_insert_with(|| message.to_string());
        if self.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        *self.failed.lock().unwrap() = Some(message.to_string());
        self.end_all(Event::ProducerFailed(message.to_string()));
    }

    /// Ends every subpartition's stream with `event` (see [`ResultPartition::end_stream`]).
    fn end_all(&self, event: Event) {
        if let Some(store) = &self.spill {
            store.end(event);
            if !store.kind().replays() {
                self.maybe_release();
            }
            return;
        }
        let mut serial = self.serial.lock().unwrap();
        for (sub, state) in self.subpartitions.iter().zip(serial.iter_mut()) {
            self.end_stream(sub, state, event.clone());
        }
        drop(serial);
        self.maybe_release();
    }

    /// Finishes a subpartition's open buffer (its bytes become readable) and queues `event`
    /// after it.
    fn end_stream(&self, sub: &Subpartition, state: &mut SerialState, event: Event) {
        self.finish_open_buffer(sub, state);
        sub.add_finished(Entry::Event(event));
    }

    /// Finishes a subpartition's partly filled buffer, so that what follows is ordered
    /// after its bytes (Flink finishes the current buffer builder before an event too).
    fn finish_open_buffer(&self, sub: &Subpartition, state: &mut SerialState) {
        if let Some(b) = state.builder.take() {
            b.finish();
            self.open_builders.fetch_sub(1, Ordering::Relaxed);
            self.metrics.buffers.add(1);
            sub.buffer_finished();
        }
    }

    /// Queues `event` on subpartition `target` (every subpartition when `None`), after the
    /// data written before it; it needs no buffer and no credit. With `priority`, the event
    /// is put in front of the queued data (see [`Subpartition::add_priority`]) and `event`
    /// marks its original place. Returns, per subpartition written to when `priority` is
    /// given, the entries it overtook at the time of the call (finished buffers, handed-off
    /// batches and events still queued, plus the unfinished tail buffer).
    pub(crate) fn add_event(
        &self,
        target: Option<usize>,
        event: Event,
        priority: Option<Event>,
    ) -> Result<Vec<usize>> {
        self.check_writable()?;
        if let Some(t) = target {
            self.subpartition(t)?;
        }
        if let Some(store) = &self.spill {
            if priority.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "partition {:?} is {}: unaligned barriers need a pipelined partition",
                    self.id,
                    store.kind().name()
                )));
            }
            store.add_event(target, &event);
            return Ok(Vec::new());
        }
        let mut serial = self.serial.lock().unwrap();
        let mut overtaken = Vec::new();
        for (i, (sub, state)) in self.subpartitions.iter().zip(serial.iter_mut()).enumerate() {
            if target.is_some_and(|t| t != i) {
                continue;
            }
            if let Some(p) = &priority {
                overtaken.push(sub.backlog() + usize::from(state.builder.is_some()));
                sub.add_priority(p.clone());
            }
            self.finish_open_buffer(sub, state);
            sub.add_finished(Entry::Event(event.clone()));
        }
        Ok(overtaken)
    }

    /// Whether end-of-partition was sent.
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// A subpartition's reader reached the end or went away.
    #[cfg(not(loom))] // only the environment, the gates and the network call it: not in loom builds
    pub(crate) fn subpartition_done(&self) {
        if self.replays() {
            return; // kept for later readers until released
        }
        self.done.fetch_add(1, Ordering::SeqCst);
        self.maybe_release();
    }

    fn maybe_release(&self) {
        if self.is_finished() && self.done.load(Ordering::SeqCst) >= self.subpartitions.len() {
            self.release();
        }
    }

    /// Whether it ended with [`ResultPartition::fail`].
    pub fn is_failed(&self) -> bool {
        self.failed.lock().unwrap().is_some()
    }

    /// Whether it keeps what was written for later readers until released (blocking, or
    /// hybrid with replay).
    pub fn replays(&self) -> bool {
        self.spill.as_ref().is_some_and(|s| s.kind().replays())
    }

    /// Drops all queued data, gives the pool back and unregisters the partition. Writers
    /// fail with `Closed` afterwards. Idempotent.
    pub fn release(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        // A reader still attached has not had everything (a partition read whole releases
        // itself): it fails rather than wait for an end that will not come, with the
        // producer's own failure when it failed the partition first (its cause, not the echo).
        let why = self.cause.lock().unwrap().clone().unwrap_or_else(|| {
            format!(
                "partition {:?} was released by its producer before this reader had all of it",
                self.id
            )
        });
        for s in &self.subpartitions {
            if s.is_consumed() && !s.is_released() {
                s.fail_reader(Event::ProducerFailed(why.clone()));
            } else {
                s.release();
            }
        }
        if let Some(store) = &self.spill {
            store.release();
        }
        // Destroy the pool first: it wakes a writer blocked on a segment (with `Closed`),
        // which then lets go of the serializer lock taken next.
        self.pool.destroy();
        for state in self.serial.lock().unwrap().iter_mut() {
            // The consumers went with the queues; dropping the builders recycles their
            // half-filled segments now rather than when the writer goes away.
            if state.builder.take().is_some() {
                self.open_builders.fetch_sub(1, Ordering::Relaxed);
            }
        }
        if let Some(reg) = self.registry.upgrade() {
            let mut reg = reg.lock().unwrap();
            if reg.get(&self.id).is_some_and(|p| std::ptr::eq(p.as_ref(), self)) {
                reg.remove(&self.id);
            }
        }
    }

    /// Whether the partition was released.
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// Blocks until the partition is released: after end-of-partition (or a failure), every
    /// subpartition's reader received everything and went away (or the partition was
    /// released explicitly). A producer that must outlive its consumers' reads (a Spark task
    /// whose process may be reused or stopped) waits here before it lets go of its
    /// environment. Fails with `Timeout` when `wait` runs out, and with `ConnectionLost`
    /// when a consumer went away before it had read everything (its process ended, its
    /// connection broke): what it had not read is lost, which its producer must not take for
    /// a delivery.
    pub fn wait_consumed(&self, wait: &mut Wait<'_>) -> Result<()> {
        const POLL: std::time::Duration = std::time::Duration::from_millis(2);
        while !self.is_released() {
            let slice = wait.tick()?;
            std::thread::sleep(slice.min(POLL));
        }
        match self.lost.lock().unwrap().as_ref() {
            Some(msg) => Err(Error::ConnectionLost(msg.clone())),
            None => Ok(()),
        }
    }

    #[cfg(not(loom))] // only the environment, the gates and the network call it: not in loom builds
    pub(crate) fn tick(&self) {
        self.metrics.backpressure.tick();
    }

    /// A snapshot of the metrics.
    pub fn metrics(&self) -> PartitionMetrics {
        PartitionMetrics {
            id: self.id.clone(),
            num_subpartitions: self.subpartitions.len(),
            pool: self.pool.stats(),
            backlog: self.subpartitions.iter().map(|s| s.backlog()).collect(),
            batches_written: self.metrics.batches.get(),
            buffers_written: self.metrics.buffers.get(),
            bytes_written: self.metrics.bytes.get(),
            rows_written: self.metrics.rows.get(),
            backpressured_ms_per_second: self.metrics.backpressure.ms_per_second(),
            backpressured_total: self.metrics.backpressure.total(),
            finished: self.is_finished(),
            spill: self.spill.as_ref().map(SpillStore::metrics),
            subpartitions: self
                .subpartitions
                .iter()
                .map(|s| SubpartitionMetrics {
                    index: s.index(),
                    backlog: s.backlog(),
                    consumed: s.is_consumed(),
                    buffers_out: s.buffers_out(),
                    bytes_out: s.bytes_out(),
                    remote: s.remote_reader().map(|r| RemoteReaderMetrics {
                        peer: r.peer.clone(),
                        transport: r.transport,
                        credit: r.credit(),
                        buffers_sent: r.buffers_sent(),
                        bytes_sent: r.bytes_sent(),
                    }),
                })
                .collect(),
        }
    }

    /// The partition's pool (tests and metrics).
    pub fn pool(&self) -> &LocalPool {
        &self.pool
    }
}

impl std::fmt::Debug for ResultPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultPartition")
            .field("id", &self.id)
            .field("subpartitions", &self.subpartitions.len())
            .finish()
    }
}

impl replay::Source for ResultPartition {
    fn store(&self) -> &SpillStore {
        self.spill.as_ref().expect("a spillable partition")
    }

    fn pool(&self) -> &LocalPool {
        &self.pool
    }

    fn id(&self) -> &str {
        &self.id
    }
}
