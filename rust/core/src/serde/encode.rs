//! [`BatchEncoder`]: a batch to one record of IPC message parts that still point at the
//! batch's own Arrow buffers (no copy).

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow_ipc::CompressionType;
use arrow_schema::Schema;

use super::framing::RECORD_HEADER_LEN;
use crate::base::error::{Error, Result};

/// Arrow IPC body compression of encoded batches (arrow-rs's own codecs; readers decompress
/// whatever the IPC message says, so only the writer chooses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// LZ4 frame: fast, moderate ratio.
    Lz4,
    /// Zstandard: slower, better ratio.
    Zstd,
}

impl Compression {
    /// `None`, `"lz4"` or `"zstd"` as Python spells them; an error names the choices.
    pub fn parse(name: Option<&str>) -> Result<Option<Compression>> {
        match name {
            None | Some("none") => Ok(None),
            Some("lz4") => Ok(Some(Compression::Lz4)),
            Some("zstd") => Ok(Some(Compression::Zstd)),
            Some(other) => Err(Error::InvalidArgument(format!(
                "compression must be None, \"lz4\" or \"zstd\", not {other:?}"
            ))),
        }
    }

    /// The name Python uses.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }

    fn ipc(self) -> CompressionType {
        match self {
            Compression::Lz4 => CompressionType::LZ4_FRAME,
            Compression::Zstd => CompressionType::ZSTD,
        }
    }
}

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

    /// An encoder whose record bodies are compressed with `compression` (`None`: plain).
    pub fn with_compression(schema: &Schema, compression: Option<Compression>) -> Result<BatchEncoder> {
        let options = IpcWriteOptions::default().try_with_compression(compression.map(Compression::ipc))?;
        Ok(BatchEncoder {
            inner: StreamEncoder::try_new_with_options(schema, options)?,
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
