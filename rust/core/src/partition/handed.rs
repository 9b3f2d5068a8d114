//! What a subpartition hands a local reader whole: a batch, or a piece that is still the IPC
//! record its writer encoded (the host service queues a writer link's pieces as they lie and
//! passes them on undecoded; whoever needs the columns decodes the record).

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_schema::SchemaRef;

use crate::base::error::Result;
use crate::serde::SelfContainedDecoder;

/// The most bytes a piece's batch may take decoded, as on a host service's links.
pub const MAX_PIECE: usize = 2 << 30;

/// A whole batch handed over, decoded or not.
#[derive(Clone, Debug)]
pub enum Handed {
    /// The batch (shares the writer's Arrow buffers).
    Batch(RecordBatch),
    /// An encoded piece, not decoded.
    Piece(EncodedPiece),
}

/// One IPC record that begins with its schema message (what [`SelfContainedDecoder`] reads),
/// with the schema and row count its framing states; its columns were not decoded or checked.
#[derive(Clone, Debug)]
pub struct EncodedPiece {
    record: Buffer,
    schema: SchemaRef,
    rows: usize,
}

impl EncodedPiece {
    /// Reads `record`'s schema and row count with `decoder` (see
    /// [`SelfContainedDecoder::peek`]): an error when its framing is not a piece's.
    pub fn peek(record: Buffer, decoder: &mut SelfContainedDecoder) -> Result<EncodedPiece> {
        let (schema, rows) = decoder.peek(&record)?;
        Ok(EncodedPiece { record, schema, rows })
    }

    /// The record's bytes (without a length prefix).
    pub fn record(&self) -> &Buffer {
        &self.record
    }

    /// The schema its first message holds.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Rows of its batch.
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// The batch, decoded and checked by `decoder`.
    pub fn decode(&self, decoder: &mut SelfContainedDecoder) -> Result<RecordBatch> {
        decoder.decode(self.record.clone())
    }
}

impl Handed {
    /// Rows of the batch.
    pub fn num_rows(&self) -> usize {
        match self {
            Handed::Batch(b) => b.num_rows(),
            Handed::Piece(p) => p.rows,
        }
    }

    /// The batch's schema.
    pub fn schema(&self) -> &SchemaRef {
        match self {
            Handed::Batch(b) => b.schema_ref(),
            Handed::Piece(p) => &p.schema,
        }
    }

    /// The bytes it holds in memory: the Arrow buffers of a batch, the record of a piece.
    pub fn bytes(&self) -> usize {
        match self {
            Handed::Batch(b) => b.get_array_memory_size(),
            Handed::Piece(p) => p.record.len(),
        }
    }

    /// The batch; a piece is decoded (and checked) by `decoder`.
    pub fn decode(self, decoder: &mut SelfContainedDecoder) -> Result<RecordBatch> {
        match self {
            Handed::Batch(b) => Ok(b),
            Handed::Piece(p) => p.decode(decoder),
        }
    }
}
