//! `RecordWriter`: partition, then hand the pieces to the partition (Flink's `RecordWriter`).

use std::sync::Arc;

use arrow_array::RecordBatch;

use crate::base::error::{Error, Result};
use crate::base::event::{Event, MAX_EVENT_PAYLOAD_LEN};
use crate::base::wait::Wait;
use crate::partition::partitioner::{Partitioner, Piece, Splitter};
use crate::partition::subpartition::Token;
use crate::partition::{EncodedPiece, ResultPartition};

/// Writes batches into one partition through a partitioner.
pub struct RecordWriter {
    partition: Arc<ResultPartition>,
    kind: Partitioner,
    splitter: Option<Splitter>,
    closed: bool,
    /// The id of the last checkpoint barrier sent (ids must increase).
    last_barrier: Option<u64>,
}

impl RecordWriter {
    /// A writer for `partition`.
    pub fn new(partition: Arc<ResultPartition>, partitioner: Partitioner) -> RecordWriter {
        RecordWriter {
            partition,
            kind: partitioner,
            splitter: None,
            closed: false,
            last_barrier: None,
        }
    }

    /// The partition written to.
    pub fn partition(&self) -> &Arc<ResultPartition> {
        &self.partition
    }

    /// Splits `batch` and queues the pieces, blocking while the pool has no room
    /// (backpressure) as `wait` allows.
    pub fn write(&mut self, batch: &RecordBatch, wait: &mut Wait<'_>) -> Result<()> {
        self.write_with_token(batch, None, wait)
    }

    /// Like [`RecordWriter::write`], attaching `token` to every piece that is the whole
    /// batch, for local readers (the Python layer passes the original Python object, so a
    /// reader in the same process gets it back without a conversion).
    pub fn write_with_token(
        &mut self,
        batch: &RecordBatch,
        token: Option<Token>,
        wait: &mut Wait<'_>,
    ) -> Result<()> {
        if self.closed {
            return Err(Error::Closed("record writer"));
        }
        self.partition.check_schema(batch)?;
        let splitter = match self.splitter.as_mut() {
            Some(s) => s,
            None => self
                .splitter
                .insert(Splitter::new(self.kind.clone(), batch.schema_ref())?),
        };
        let pieces = splitter.split(batch, self.partition.num_subpartitions())?;
        self.partition.write_pieces(pieces, token, wait)
    }

    /// Like [`RecordWriter::write_with_token`], but the whole batch goes to subpartition
    /// `subpartition`, whatever the partitioner says (a caller that routes batches itself,
    /// such as a store keeping each source's batches apart).
    pub fn write_to(
        &mut self,
        batch: &RecordBatch,
        token: Option<Token>,
        subpartition: usize,
        wait: &mut Wait<'_>,
    ) -> Result<()> {
        let piece = self.whole_piece(batch, subpartition)?;
        self.partition.write_pieces(vec![piece], token, wait)
    }

    /// [`RecordWriter::write_to`] if it needs no wait: `true` once the batch is queued, `false`
    /// (nothing written) when the partition has no room for it now, or is spillable or
    /// serializing (their writes may wait part-way): the caller then calls `write_to`, on a
    /// thread that may block. For a reader of many links on one thread, which blocks only
    /// when the partition holds it back.
    pub fn try_write_to(
        &mut self,
        batch: &RecordBatch,
        token: Option<Token>,
        subpartition: usize,
    ) -> Result<bool> {
        let piece = self.whole_piece(batch, subpartition)?;
        self.partition.try_write_pieces(vec![piece], token)
    }

    /// Queues `piece` whole in `subpartition` without decoding it, waiting with `wait` for
    /// room, for a partition that hands batches over (a relay's: see
    /// [`crate::partition::Handed`]).
    pub(crate) fn write_encoded_to(
        &mut self,
        piece: EncodedPiece,
        token: Option<Token>,
        subpartition: usize,
        wait: &mut Wait<'_>,
    ) -> Result<()> {
        self.check_target(subpartition)?;
        self.partition.write_encoded(subpartition, piece, token, wait)
    }

    /// [`RecordWriter::write_encoded_to`] if it needs no wait: `true` once queued, `false`
    /// (nothing queued) when the partition has no room for it now.
    pub(crate) fn try_write_encoded_to(
        &mut self,
        piece: EncodedPiece,
        token: Option<Token>,
        subpartition: usize,
    ) -> Result<bool> {
        self.check_target(subpartition)?;
        self.partition.try_write_encoded(subpartition, piece, token)
    }

    /// That this writer is open and `subpartition` one of its partition's.
    fn check_target(&self, subpartition: usize) -> Result<()> {
        if self.closed {
            return Err(Error::Closed("record writer"));
        }
        let n = self.partition.num_subpartitions();
        if subpartition >= n {
            return Err(Error::InvalidArgument(format!(
                "subpartition {subpartition} out of range: the partition has {n}"
            )));
        }
        Ok(())
    }

    /// `batch` as a piece for `subpartition`, checked as `write_to` checks it.
    fn whole_piece(&self, batch: &RecordBatch, subpartition: usize) -> Result<Piece> {
        self.check_target(subpartition)?;
        self.partition.check_schema(batch)?;
        Ok(Piece {
            subpartition,
            batch: batch.clone(),
            whole: true,
        })
    }

    /// Makes partly filled buffers visible to readers now.
    pub fn flush(&self) {
        self.partition.flush();
    }

    /// Sends a user event to every subpartition, after the data written before it (a partly
    /// filled buffer is finished first). Events need no buffer and no credit. `payload` is
    /// at most [`MAX_EVENT_PAYLOAD_LEN`] bytes.
    pub fn broadcast_event(&mut self, payload: &[u8]) -> Result<()> {
        self.send_event(None, payload)
    }

    /// Like [`RecordWriter::broadcast_event`], to subpartition `subpartition` only.
    pub fn emit_event(&mut self, payload: &[u8], subpartition: usize) -> Result<()> {
        self.send_event(Some(subpartition), payload)
    }

    fn send_event(&mut self, target: Option<usize>, payload: &[u8]) -> Result<()> {
        if self.closed {
            return Err(Error::Closed("record writer"));
        }
        if payload.len() > MAX_EVENT_PAYLOAD_LEN {
            return Err(Error::InvalidArgument(format!(
                "an event payload is at most {MAX_EVENT_PAYLOAD_LEN} bytes, got {}",
                payload.len()
            )));
        }
        self.partition
            .add_event(target, Event::User(payload.to_vec()), None)
            .map(drop)
    }

    /// Sends checkpoint barrier `checkpoint_id` to every subpartition. Ids must increase
    /// from one barrier to the next.
    ///
    /// An aligned barrier (`unaligned == false`) is in order with the data; a remote reader's
    /// subpartition pauses after sending it until the gate has aligned the checkpoint.
    /// An unaligned barrier overtakes the data queued in each subpartition (it is read
    /// first) and a position marker stays at its original place, so the gate can tell which
    /// batches it overtook. Returns, per subpartition, the entries the barrier overtook at the
    /// time of the call (empty for an aligned barrier).
    pub fn broadcast_barrier(&mut self, checkpoint_id: u64, unaligned: bool) -> Result<Vec<usize>> {
        if self.closed {
            return Err(Error::Closed("record writer"));
        }
        if let Some(last) = self.last_barrier.filter(|&last| checkpoint_id <= last) {
            return Err(Error::InvalidArgument(format!(
                "checkpoint ids must increase: barrier {checkpoint_id} after barrier {last}"
            )));
        }
        let barrier = Event::Barrier {
            id: checkpoint_id,
            unaligned,
        };
        let overtaken = if unaligned {
            self.partition
                .add_event(None, Event::BarrierPosition(checkpoint_id), Some(barrier))?
        } else {
            self.partition.add_event(None, barrier, None)?
        };
        self.last_barrier = Some(checkpoint_id);
        Ok(overtaken)
    }

    /// Sends end-of-partition to every subpartition. Idempotent.
    pub fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.partition.finish()
    }
}
