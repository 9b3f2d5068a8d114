//! [`AttachedWriter`]: a `RecordWriter` whose partition the host service holds. The task checks
//! each batch's schema, splits it with the partitioner and encodes each piece onto the
//! writer's link (into the heap, or through the ring); the service queues the pieces in their
//! subpartitions. A batch's frame goes into the link's ring from the calling thread when the
//! ring has room for all of it and nothing is queued before it (no thread is woken for it);
//! otherwise it goes to the link's I/O task through a channel of one, which is where a writer
//! the service holds back waits. Either way a frame goes whole or not at all.

use std::io::IoSlice;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use tokio::sync::mpsc;

use super::client::Session;
use super::codec::{RecordHead, Signal};
use super::link::{self, HeapEnd, LinkEnd};
use super::records::{rows_piece, small, Frame, RecordSender};
use super::runtime::block_on;
use crate::base::error::{Error, Result};
use crate::base::event::MAX_EVENT_PAYLOAD_LEN;
use crate::base::wait::Wait;
use crate::net::shm::{HeapWriter, ShmWriter};
use crate::partition::partitioner::{Piece, Route, Splitter};
use crate::partition::Partitioner;
use crate::serde::RowsEncoder;

/// Writes batches into a partition the host service holds.
pub struct AttachedWriter {
    session: Arc<Session>,
    partition: String,
    partitioner: Partitioner,
    /// The partitioner bound to the partition's schema, once the first batch came.
    splitter: Option<Splitter>,
    /// Writes split pieces straight into the heap, once the first batch came (inner `None`:
    /// the schema has a column it does not write).
    rows: Option<Option<RowsEncoder>>,
    subpartitions: usize,
    /// The schema of the partition's first batch (shared with the partition's handle).
    schema: Arc<Mutex<Option<SchemaRef>>>,
    /// Frames to the link's I/O task; dropped by it when the link breaks.
    frames: Option<mpsc::Sender<Frame>>,
    /// The ring the frames go into, shared with the I/O task (which holds it while it writes).
    ring: Arc<tokio::sync::Mutex<ShmWriter>>,
    /// Frames handed to the I/O task and not yet in the ring: while any are, a frame cannot
    /// go into the ring directly (it would overtake them).
    queued: Arc<AtomicUsize>,
    /// What the service says back: acknowledgements and errors.
    back: mpsc::UnboundedReceiver<Signal>,
    /// Why the link broke, as the I/O task saw it.
    broken: Arc<Mutex<Option<String>>>,
    heap: HeapWriter,
    sender: RecordSender,
    closed: bool,
    last_barrier: Option<u64>,
    io: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for AttachedWriter {
    fn drop(&mut self) {
        // A writer dropped without close: what it wrote still goes out, then the link ends and
        // the service fails the partition, so no reader takes it for complete. The I/O task
        // ends once it has written the frames queued (or the link broke).
        self.frames = None;
        if let Some(back) = self.io.get(1) {
            back.abort();
        }
    }
}

impl AttachedWriter {
    pub(crate) fn start(
        session: Arc<Session>,
        partition: String,
        partitioner: Partitioner,
        subpartitions: usize,
        schema: Arc<Mutex<Option<SchemaRef>>>,
        end: LinkEnd,
    ) -> Result<AttachedWriter> {
        let LinkEnd {
            mut reader,
            writer,
            heap,
            bell: _,
            heaps: _,
            table: _,
        } = end;
        let HeapEnd::Writer(heap) = heap else {
            return Err(Error::Protocol(
                "a writer's link whose heap the task does not write".into(),
            ));
        };
        let (frames, mut rx) = mpsc::channel::<Frame>(1);
        let (back_tx, back) = mpsc::unbounded_channel();
        let broken = Arc::new(Mutex::new(None));
        let ring = Arc::new(tokio::sync::Mutex::new(writer));
        let queued = Arc::new(AtomicUsize::new(0));
        let out = {
            let (broken, ring, queued) = (broken.clone(), ring.clone(), queued.clone());
            session.handle.spawn(async move {
                while let Some(frame) = rx.recv().await {
                    let mut writer = ring.lock().await;
                    let written = link::write_all(&mut *writer, &frame).await;
                    queued.fetch_sub(1, Ordering::SeqCst);
                    if let Err(e) = written {
                        broken.lock().unwrap().get_or_insert(e.to_string());
                        return;
                    }
                }
            })
        };
        let inbound = {
            let broken = broken.clone();
            session.handle.spawn(async move {
                loop {
                    let frame = async {
                        let (len, ty) = link::read_header(&mut reader, 1 << 20)
                            .await?
                            .ok_or_else(|| Error::ConnectionLost("the link closed".into()))?;
                        let body = link::read_body(&mut reader, len - super::codec::FRAME_HEADER).await?;
                        Signal::decode(ty, &body)
                    };
                    match frame.await {
                        Ok(s) => {
                            if back_tx.send(s).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            broken.lock().unwrap().get_or_insert(e.to_string());
                            return;
                        }
                    }
                }
            })
        };
        Ok(AttachedWriter {
            session,
            partition,
            partitioner,
            splitter: None,
            rows: None,
            subpartitions,
            schema,
            frames: Some(frames),
            ring,
            queued,
            back,
            broken,
            heap,
            sender: RecordSender::new(None),
            closed: false,
            last_barrier: None,
            io: vec![out, inbound],
        })
    }

    /// The partition written to.
    pub fn partition_id(&self) -> &str {
        &self.partition
    }

    /// Chunks of the link's heap in use: placed and not yet freed by whoever read them.
    #[cfg(test)]
    pub(crate) fn heap_chunks_in_use(&self) -> usize {
        self.heap.chunks_in_use()
    }

    fn lost(&self) -> Error {
        let why = self
            .broken
            .lock()
            .unwrap()
            .clone()
            .or_else(|| self.session.ended())
            .unwrap_or_else(|| "the writer's link broke".into());
        self.session.lost(&why)
    }

    /// An error the service sent back since the last call, if any.
    fn check_back(&mut self) -> Result<()> {
        while let Ok(s) = self.back.try_recv() {
            if let Signal::Error(e) = s {
                self.closed = true;
                return Err(e);
            }
        }
        Ok(())
    }

    fn check_open(&mut self) -> Result<()> {
        if self.closed {
            return Err(Error::Closed("record writer"));
        }
        self.check_back()
    }

    /// Puts `frame` into the ring now if it fits whole and nothing is queued before it:
    /// `Ok(None)` once written, else the frame back.
    fn try_direct(&self, frame: Frame) -> Result<Option<Frame>> {
        let Ok(mut ring) = self.ring.try_lock() else {
            return Ok(Some(frame));
        };
        if self.queued.load(Ordering::SeqCst) != 0 {
            return Ok(Some(frame));
        }
        let parts: Vec<IoSlice<'_>> = frame.iter().map(|b| IoSlice::new(b.as_slice())).collect();
        match ring.try_write_whole(&parts) {
            Ok(true) => Ok(None),
            Ok(false) => Ok(Some(frame)),
            Err(e) => {
                self.broken.lock().unwrap().get_or_insert(e.to_string());
                Err(self.lost())
            }
        }
    }

    /// Hands `frame` to the link, waiting while the service holds the writer back.
    fn send(&mut self, frame: Frame, wait: &mut Wait<'_>) -> Result<()> {
        let Some(tx) = self.frames.clone() else {
            return Err(self.lost());
        };
        let Some(frame) = self.try_direct(frame)? else {
            return Ok(());
        };
        let sent = match block_on(&self.session.handle, tx.reserve(), wait)? {
            Ok(permit) => {
                self.queued.fetch_add(1, Ordering::SeqCst);
                permit.send(frame);
                true
            }
            Err(_) => false,
        };
        match sent {
            true => Ok(()),
            false => {
                self.frames = None;
                // The service may have said why before the link went.
                self.check_back()?;
                Err(self.lost())
            }
        }
    }

    /// Waits for the service's acknowledgement of the last frame.
    fn ack(&mut self, wait: &mut Wait<'_>) -> Result<Vec<u64>> {
        match block_on(&self.session.handle, self.back.recv(), wait)? {
            Some(Signal::Ack { overtaken }) => Ok(overtaken),
            Some(Signal::Error(e)) => {
                self.closed = true;
                Err(e)
            }
            Some(other) => Err(Error::Protocol(format!(
                "attach: {other:?} instead of an acknowledgement"
            ))),
            None => Err(self.lost()),
        }
    }

    /// Checks `batch` against the partition's schema (the first batch's, which the
    /// partitioner must be able to split when it is to split it) as `RecordWriter::write` does.
    fn check_schema(&self, batch: &RecordBatch, split: bool) -> Result<()> {
        let mut schema = self.schema.lock().unwrap();
        match schema.as_ref() {
            Some(s) if s.as_ref() == batch.schema_ref().as_ref() => Ok(()),
            Some(s) => Err(Error::SchemaMismatch {
                partition: self.partition.clone(),
                expected: s.to_string(),
                actual: batch.schema_ref().to_string(),
            }),
            None => {
                if split {
                    self.partitioner.check_schema(batch.schema_ref())?;
                }
                *schema = Some(batch.schema());
                Ok(())
            }
        }
    }

    /// Writes a batch; blocks while the service holds the writer back (backpressure), as
    /// `wait` allows.
    pub fn write(&mut self, batch: &RecordBatch, wait: &mut Wait<'_>) -> Result<()> {
        self.check_open()?;
        self.check_schema(batch, true)?;
        let n = self.subpartitions;
        let splitter = match self.splitter.as_mut() {
            Some(s) => s,
            None => self
                .splitter
                .insert(Splitter::new(self.partitioner.clone(), batch.schema_ref())?),
        };
        let to = match splitter.route(batch, n)? {
            Route::Whole(to) => to,
            Route::Rows => {
                let encoder = match self.rows.as_mut() {
                    Some(e) => e,
                    None => self.rows.insert(RowsEncoder::new(batch.schema_ref())?),
                };
                let direct = encoder
                    .as_mut()
                    .and_then(|e| direct_frames(splitter, e, batch, n, &self.heap));
                return match direct {
                    Some((frame, placed)) => self.send_frame(frame, placed, wait),
                    None => {
                        let pieces = splitter.split_routed(batch, n)?;
                        self.send_pieces(pieces, wait)
                    }
                };
            }
        };
        let pieces = to.into_iter().map(|p| Piece::whole(p, batch)).collect();
        self.send_pieces(pieces, wait)
    }

    /// Writes a batch whole to `subpartition` (the partitioner is not asked), as
    /// `RecordWriter::write_to` does.
    pub fn write_to(&mut self, batch: &RecordBatch, subpartition: usize, wait: &mut Wait<'_>) -> Result<()> {
        let n = self.subpartitions;
        if subpartition >= n {
            return Err(Error::InvalidArgument(format!(
                "subpartition {subpartition} out of range: the partition has {n}"
            )));
        }
        self.check_open()?;
        self.check_schema(batch, false)?;
        let piece = Piece {
            subpartition,
            batch: batch.clone(),
            whole: true,
        };
        self.send_pieces(vec![piece], wait)
    }

    /// Sends a batch's pieces as one frame: the service gets all of them or none (a write
    /// that timed out may be retried).
    fn send_pieces(&mut self, pieces: Vec<Piece>, wait: &mut Wait<'_>) -> Result<()> {
        if pieces.is_empty() {
            return Ok(());
        }
        let mut frame = Vec::new();
        let mut placed = Vec::new();
        let mut encoded = Ok(());
        for p in pieces {
            let head = RecordHead {
                channel: p.subpartition as u32,
                in_flight: Vec::new(),
            };
            match self.sender.piece(head, &p.batch, &self.heap) {
                Ok((f, item)) => {
                    frame.extend(f);
                    placed.extend(item);
                }
                Err(e) => {
                    encoded = Err(e);
                    break;
                }
            }
        }
        match encoded {
            Ok(()) => self.send_frame(frame, placed, wait),
            Err(e) => {
                self.take_back(placed);
                Err(e)
            }
        }
    }

    /// Sends a batch's frame; the heap items it names are taken back if it does not go.
    fn send_frame(&mut self, frame: Frame, placed: Vec<(u64, usize)>, wait: &mut Wait<'_>) -> Result<()> {
        let sent = self.send(frame, wait);
        if sent.is_err() {
            self.take_back(placed);
        }
        sent
    }

    /// Frees heap items whose frame the service never saw.
    fn take_back(&self, placed: Vec<(u64, usize)>) {
        for (start, len) in placed {
            self.heap.take_back(start, len);
        }
    }

    /// Makes partly filled buffers readable now (in order with the batches before).
    pub fn flush(&mut self, wait: &mut Wait<'_>) -> Result<()> {
        self.check_open()?;
        self.send(small(Signal::Flush.encode()), wait)
    }

    /// Sends a user event to subpartition `target` (every one when `None`), after the
    /// batches written before it.
    pub fn send_event(&mut self, target: Option<usize>, payload: &[u8], wait: &mut Wait<'_>) -> Result<()> {
        self.check_open()?;
        if payload.len() > MAX_EVENT_PAYLOAD_LEN {
            return Err(Error::InvalidArgument(format!(
                "an event payload is at most {MAX_EVENT_PAYLOAD_LEN} bytes, got {}",
                payload.len()
            )));
        }
        let target = target
            .map(|t| u32::try_from(t).map_err(|_| Error::InvalidArgument(format!("subpartition {t}"))))
            .transpose()?;
        let signal = Signal::Event {
            target,
            payload: payload.to_vec(),
        };
        self.send(small(signal.encode()), wait)
    }

    /// Sends checkpoint barrier `checkpoint_id` to every subpartition; returns what an
    /// unaligned one overtook per subpartition (see `RecordWriter::broadcast_barrier`).
    pub fn broadcast_barrier(
        &mut self,
        checkpoint_id: u64,
        unaligned: bool,
        wait: &mut Wait<'_>,
    ) -> Result<Vec<usize>> {
        self.check_open()?;
        if let Some(last) = self.last_barrier.filter(|&last| checkpoint_id <= last) {
            return Err(Error::InvalidArgument(format!(
                "checkpoint ids must increase: barrier {checkpoint_id} after barrier {last}"
            )));
        }
        let signal = Signal::Barrier {
            id: checkpoint_id,
            unaligned,
        };
        self.send(small(signal.encode()), wait)?;
        let overtaken = self.ack(wait)?;
        self.last_barrier = Some(checkpoint_id);
        Ok(overtaken.into_iter().map(|n| n as usize).collect())
    }

    /// Sends end-of-partition; returns once the service has finished the partition.
    /// Idempotent.
    pub fn close(&mut self, wait: &mut Wait<'_>) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.check_back()?;
        self.send(small(Signal::Close.encode()), wait)?;
        self.closed = true;
        self.ack(wait).map(drop)
    }

    /// Ends the partition with an error: readers raise `ProducerFailed(message)` after the
    /// data written before.
    pub fn fail(&mut self, message: &str, wait: &mut Wait<'_>) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let signal = Signal::Fail {
            message: message.to_string(),
        };
        self.send(small(signal.encode()), wait)?;
        self.ack(wait).map(drop)
    }
}

/// The frame of a batch that `splitter` routed by rows, each piece written by `encoder`
/// straight into `heap` (or its frame), and the heap items placed; `None` when a column has
/// nulls, before anything is placed (the batch is then split the two-step way).
fn direct_frames(
    splitter: &Splitter,
    encoder: &mut RowsEncoder,
    batch: &RecordBatch,
    n: usize,
    heap: &HeapWriter,
) -> Option<(Frame, Vec<(u64, usize)>)> {
    let mut layouts = Vec::new();
    for p in 0..n {
        let rows = splitter.rows(p);
        if !rows.is_empty() {
            layouts.push((p, encoder.layout(batch, rows)?));
        }
    }
    let mut frame = Vec::new();
    let mut placed = Vec::new();
    for (p, layout) in layouts {
        let head = RecordHead {
            channel: p as u32,
            in_flight: Vec::new(),
        };
        let (f, item) = rows_piece(head, encoder, &layout, batch, splitter.rows(p), heap);
        frame.extend(f);
        placed.extend(item);
    }
    Some((frame, placed))
}
