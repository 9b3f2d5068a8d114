//! `RecordWriter`: partition, then hand the pieces to the partition (Flink's `RecordWriter`).

use std::sync::Arc;

use arrow_array::RecordBatch;

use crate::error::{Error, Result};
use crate::partition::subpartition::Token;
use crate::partition::ResultPartition;
use crate::partitioner::{Partitioner, Splitter};
use crate::wait::Wait;

/// Writes batches into one partition through a partitioner.
pub struct RecordWriter {
    partition: Arc<ResultPartition>,
    kind: Partitioner,
    splitter: Option<Splitter>,
    closed: bool,
}

impl RecordWriter {
    /// A writer for `partition`.
    pub fn new(partition: Arc<ResultPartition>, partitioner: Partitioner) -> RecordWriter {
        RecordWriter {
            partition,
            kind: partitioner,
            splitter: None,
            closed: false,
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

    /// Makes partly filled buffers visible to readers now.
    pub fn flush(&self) {
        self.partition.flush();
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
