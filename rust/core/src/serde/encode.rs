//! [`BatchEncoder`]: a batch to one record of IPC message parts that still point at the
//! batch's own Arrow buffers (no copy).

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::writer::StreamEncoder;
use arrow_schema::Schema;

use super::framing::RECORD_HEADER_LEN;
use crate::base::error::Result;

/// Encodes the batches of one subpartition's stream.
pub struct BatchEncoder {
    inner: StreamEncoder,
}

/// One encoded record: the length prefix and the IPC parts, ready to be copied out.
pub struct EncodedRecord {
    header: [u8; RECORD_HEADER_LEN],
    parts: Vec<Buffer>,
}

impl EncodedRecord {
    /// Total bytes including the prefix.
    pub fn len(&self) -> usize {
        RECORD_HEADER_LEN + self.parts.iter().map(|p| p.len()).sum::<usize>()
    }

    /// Never empty: the prefix is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The length prefix and the IPC parts (which share the batch's buffers).
    pub fn into_parts(self) -> ([u8; RECORD_HEADER_LEN], Vec<Buffer>) {
        (self.header, self.parts)
    }

    /// The byte chunks in order.
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(&self.header[..]).chain(self.parts.iter().map(|p| p.as_slice()))
    }
}

impl BatchEncoder {
    /// An encoder for a stream of batches with this schema (checked for IPC support).
    pub fn new(schema: &Schema) -> Result<BatchEncoder> {
        Ok(BatchEncoder {
            inner: StreamEncoder::try_new(schema)?,
        })
    }

    /// Encodes one batch as one record.
    pub fn encode(&mut self, batch: &RecordBatch) -> Result<EncodedRecord> {
        let parts = self.inner.encode(batch)?;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        Ok(EncodedRecord {
            header: (len as u64).to_le_bytes(),
            parts,
        })
    }
}
