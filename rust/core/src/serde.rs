//! Arrow IPC into and out of the byte stream of a subpartition.
//!
//! A subpartition's serialized stream is a sequence of *records*, one per batch:
//! `[u64 little-endian length][Arrow IPC stream messages]`. The first record carries the
//! schema message, then each record carries dictionary messages (when they change) and one
//! record-batch message. Records span buffers freely.
//!
//! * [`BatchEncoder`] turns a batch into IPC message parts that still point at the batch's
//!   own Arrow buffers (no copy); the writer copies them straight into segments, which is
//!   the one copy on the sending side.
//! * [`RecordDeserializer`] gathers a record's bytes from however many buffers it spans into
//!   one 64-byte aligned buffer (the one copy on the receiving side) and decodes arrays
//!   zero-copy over it.

use std::collections::VecDeque;

use arrow_array::RecordBatch;
use arrow_buffer::{Buffer, MutableBuffer};
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::StreamEncoder;
use arrow_schema::Schema;

use crate::error::{Error, Result};

/// Bytes of the record length prefix.
pub const RECORD_HEADER_LEN: usize = 8;

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

/// Reassembles records from stream bytes and decodes them.
pub struct RecordDeserializer {
    header: [u8; RECORD_HEADER_LEN],
    header_filled: usize,
    /// The record being gathered and how long it will be.
    body: Option<(MutableBuffer, usize)>,
    decoder: StreamDecoder,
    /// Largest record accepted (guards against a corrupt length).
    max_record: usize,
}

impl RecordDeserializer {
    /// A deserializer accepting records up to `max_record` bytes.
    pub fn new(max_record: usize) -> RecordDeserializer {
        RecordDeserializer {
            header: [0; RECORD_HEADER_LEN],
            header_filled: 0,
            body: None,
            // Validates every array fully (offsets, UTF-8, dictionary keys): the bytes may
            // come from a peer.
            decoder: StreamDecoder::new(),
            max_record,
        }
    }

    /// True when no record is partly gathered.
    pub fn is_at_record_boundary(&self) -> bool {
        self.header_filled == 0 && self.body.is_none()
    }

    /// Feeds stream bytes; complete batches are appended to `out` in order.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut VecDeque<RecordBatch>) -> Result<()> {
        while !bytes.is_empty() {
            match self.body.as_mut() {
                None => {
                    let n = (RECORD_HEADER_LEN - self.header_filled).min(bytes.len());
                    self.header[self.header_filled..self.header_filled + n].copy_from_slice(&bytes[..n]);
                    self.header_filled += n;
                    bytes = &bytes[n..];
                    if self.header_filled == RECORD_HEADER_LEN {
                        self.header_filled = 0;
                        let len = u64::from_le_bytes(self.header);
                        if len > self.max_record as u64 || len == 0 {
                            return Err(Error::Protocol(format!(
                                "record length {len} outside 1..={} bytes",
                                self.max_record
                            )));
                        }
                        self.body = Some((MutableBuffer::with_capacity(len as usize), len as usize));
                    }
                }
                Some((buf, want)) => {
                    let n = (*want - buf.len()).min(bytes.len());
                    buf.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if buf.len() == *want {
                        let (buf, _) = self.body.take().expect("body present");
                        self.decode_record(buf.into(), out)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn decode_record(&mut self, mut buf: Buffer, out: &mut VecDeque<RecordBatch>) -> Result<()> {
        let mut produced = false;
        while !buf.is_empty() {
            if let Some(batch) = decode_guarded(&mut self.decoder, &mut buf)? {
                out.push_back(batch);
                produced = true;
            }
        }
        if !produced {
            // A record batch message with an empty body (0 rows of fixed-width columns, or
            // only null-typed columns) ends exactly at the record's end, and the decoder only
            // completes a message when offered more bytes. Offer a few it will not consume:
            // it needs none for an empty body.
            let mut nudge = Buffer::from(vec![0u8; 8]);
            if let Some(batch) = decode_guarded(&mut self.decoder, &mut nudge)? {
                if nudge.len() != 8 {
                    return Err(Error::Protocol("a record ended inside an IPC message".into()));
                }
                out.push_back(batch);
                produced = true;
            }
        }
        if !produced {
            return Err(Error::Protocol("a record held no record batch".into()));
        }
        Ok(())
    }
}

/// `decoder.decode`, with a panic turned into a protocol error: arrow-ipc's reader asserts on
/// some malformed inputs (buffer slices past the end, short validity bitmaps) instead of
/// returning an error, and a peer's bytes must never take the process down. The decoder is
/// not used again after an error (the channel fails).
fn decode_guarded(decoder: &mut StreamDecoder, buf: &mut Buffer) -> Result<Option<RecordBatch>> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decoder.decode(buf))) {
        Ok(r) => r.map_err(|e| Error::Protocol(format!("invalid Arrow IPC data: {e}"))),
        Err(_) => Err(Error::Protocol(
            "malformed Arrow IPC message (the decoder rejected it)".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::types::Int32Type;
    use arrow_array::{ArrayRef, DictionaryArray, Int64Array, StringArray};
    use std::sync::Arc;

    fn batch(start: i64, n: i64) -> RecordBatch {
        let a: ArrayRef = Arc::new(Int64Array::from_iter_values(start..start + n));
        let s: ArrayRef = Arc::new(StringArray::from_iter_values(
            (start..start + n).map(|i| format!("v{i}")),
        ));
        let d: ArrayRef = Arc::new(
            (start..start + n)
                .map(|i| if i % 2 == 0 { "even" } else { "odd" })
                .collect::<DictionaryArray<Int32Type>>(),
        );
        RecordBatch::try_from_iter([("a", a), ("s", s), ("d", d)]).unwrap()
    }

    #[test]
    fn records_round_trip_across_arbitrary_chunking() {
        let batches: Vec<RecordBatch> = (0..5).map(|i| batch(i * 100, 37 + i)).collect();
        let mut enc = BatchEncoder::new(&batches[0].schema()).unwrap();
        let mut stream = Vec::new();
        for b in &batches {
            let rec = enc.encode(b).unwrap();
            let before = stream.len();
            for c in rec.chunks() {
                stream.extend_from_slice(c);
            }
            assert_eq!(stream.len() - before, rec.len());
        }
        for chunk in [1usize, 3, 7, 64, 4096, stream.len()] {
            let mut de = RecordDeserializer::new(1 << 20);
            let mut out = VecDeque::new();
            for piece in stream.chunks(chunk) {
                de.push(piece, &mut out).unwrap();
            }
            assert!(de.is_at_record_boundary());
            assert_eq!(out.len(), batches.len());
            for (got, want) in out.iter().zip(&batches) {
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn batches_with_an_empty_ipc_body_round_trip() {
        let empty: ArrayRef = Arc::new(Int64Array::from(Vec::<i64>::new()));
        let nulls: ArrayRef = Arc::new(arrow_array::NullArray::new(3));
        for b in [
            RecordBatch::try_from_iter([("e", empty)]).unwrap(),
            RecordBatch::try_from_iter([("n", nulls)]).unwrap(),
        ] {
            let mut enc = BatchEncoder::new(&b.schema()).unwrap();
            let mut de = RecordDeserializer::new(1 << 20);
            let mut out = VecDeque::new();
            for _ in 0..3 {
                let rec = enc.encode(&b).unwrap();
                for c in rec.chunks() {
                    de.push(c, &mut out).unwrap();
                }
            }
            assert_eq!(out.len(), 3);
            assert!(out.iter().all(|got| got == &b));
        }
    }

    #[test]
    fn oversized_or_zero_length_records_are_protocol_errors() {
        let mut de = RecordDeserializer::new(100);
        let err = de.push(&1000u64.to_le_bytes(), &mut VecDeque::new()).unwrap_err();
        assert!(matches!(err, Error::Protocol(_)));
        let mut de = RecordDeserializer::new(100);
        assert!(de.push(&0u64.to_le_bytes(), &mut VecDeque::new()).is_err());
    }

    #[test]
    fn garbage_records_are_errors_not_panics() {
        let mut de = RecordDeserializer::new(1 << 20);
        let mut bytes = 16u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0xAB; 16]);
        assert!(de.push(&bytes, &mut VecDeque::new()).is_err());
    }

    fn record_bytes(b: &RecordBatch) -> Vec<u8> {
        let mut enc = BatchEncoder::new(&b.schema()).unwrap();
        enc.encode(b).unwrap().chunks().flatten().copied().collect()
    }

    fn find(hay: &[u8], needle: &[u8]) -> usize {
        hay.windows(needle.len())
            .position(|w| w == needle)
            .expect("pattern in the record")
    }

    #[test]
    fn invalid_utf8_and_offsets_are_protocol_errors() {
        let b = batch(0, 40);
        let good = record_bytes(&b);
        // A string value byte made invalid UTF-8.
        let mut bad = good.clone();
        let at = find(&bad, b"v12");
        bad[at + 1] = 0xFF;
        let err = RecordDeserializer::new(1 << 20)
            .push(&bad, &mut VecDeque::new())
            .unwrap_err();
        assert!(
            matches!(err, Error::Protocol(_)) && err.to_string().contains("UTF8"),
            "{err}"
        );
        // Offsets 0, 2, 4, ... of column s: make one go backwards.
        let mut bad = good.clone();
        let offs: Vec<u8> = [0i32, 2, 4, 6].iter().flat_map(|o| o.to_le_bytes()).collect();
        let at = find(&bad, &offs);
        bad[at + 8..at + 12].copy_from_slice(&1i32.to_le_bytes());
        let err = RecordDeserializer::new(1 << 20)
            .push(&bad, &mut VecDeque::new())
            .unwrap_err();
        assert!(matches!(err, Error::Protocol(_)), "{err}");
        // An offset past the values buffer.
        let mut bad = good;
        bad[at + 8..at + 12].copy_from_slice(&100_000i32.to_le_bytes());
        assert!(RecordDeserializer::new(1 << 20)
            .push(&bad, &mut VecDeque::new())
            .is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Whatever bytes are flipped, the deserializer never accepts a batch that Arrow's
        /// own full validation rejects (and never panics).
        #[test]
        fn corrupted_records_never_pass_as_invalid_batches(
            flips in proptest::collection::vec((0usize..10_000, proptest::prelude::any::<u8>()), 1..4)
        ) {
            let b = batch(0, 64);
            let mut bytes = record_bytes(&b);
            for (pos, val) in flips {
                let i = RECORD_HEADER_LEN + pos % (bytes.len() - RECORD_HEADER_LEN);
                bytes[i] = val;
            }
            let mut out = VecDeque::new();
            if RecordDeserializer::new(1 << 20).push(&bytes, &mut out).is_ok() {
                for got in &out {
                    for col in got.columns() {
                        proptest::prop_assert!(col.to_data().validate_full().is_ok());
                    }
                }
            }
        }
    }
}
