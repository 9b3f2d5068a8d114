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
//! * [`RecordAssembler`] gathers a record's bytes from however many buffers it spans into
//!   one 64-byte aligned buffer: copied out of a local channel's segments (the one copy on
//!   the receiving side), or read from the socket straight into it for a remote channel
//!   (the kernel's copy is then the only one).
//! * [`RecordDeserializer`] decodes a gathered record's arrays zero-copy over that buffer.

use std::collections::VecDeque;
use std::mem::MaybeUninit;

use arrow_array::RecordBatch;
use arrow_buffer::{Buffer, MutableBuffer};
use std::sync::Arc;

use arrow_buffer::ArrowNativeType;
use arrow_data::ArrayData;
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::writer::StreamEncoder;
use arrow_ipc::{Block, MessageHeader};
use arrow_schema::{ArrowError, DataType, Schema};

use crate::base::error::{Error, Result};

/// Starts every IPC message of the stream format.
const CONTINUATION_MARKER: [u8; 4] = [0xff; 4];

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

/// A record's length prefix as it arrives in pieces.
#[derive(Clone, Debug, Default)]
struct LengthPrefix {
    bytes: [u8; RECORD_HEADER_LEN],
    filled: usize,
}

impl LengthPrefix {
    /// Bytes of the prefix still to come.
    fn missing(&self) -> usize {
        RECORD_HEADER_LEN - self.filled
    }

    /// Takes what it still needs from the front of `bytes` (advancing it); returns the
    /// record length once the prefix is complete, and starts over.
    fn take(&mut self, bytes: &mut &[u8]) -> Option<u64> {
        let n = self.missing().min(bytes.len());
        self.bytes[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
        self.filled += n;
        *bytes = &bytes[n..];
        if self.filled < RECORD_HEADER_LEN {
            return None;
        }
        self.filled = 0;
        Some(u64::from_le_bytes(self.bytes))
    }
}

/// Where a subpartition's byte stream stands between records, without keeping its bytes:
/// the sending side's view of what the receiver's [`RecordAssembler`] holds at the same point
/// of the stream. It tells which buffers are *record body buffers*, which need no credit (see
/// [`crate::protocol::credit`]): both ends decide that from the stream alone, so they agree.
#[derive(Clone, Debug, Default)]
pub struct RecordFraming {
    prefix: LengthPrefix,
    body_missing: u64,
}

impl RecordFraming {
    /// Bytes of the body in progress still to come (0 at a record boundary or inside a
    /// length prefix).
    pub fn body_missing(&self) -> u64 {
        self.body_missing
    }

    /// Whether a payload of `len` bytes sent next lies wholly inside the record in progress
    /// without completing it (the receiver has its length prefix, so its body is allocated).
    pub fn is_record_body(&self, len: usize) -> bool {
        (len as u64) < self.body_missing
    }

    /// The stream moves on by `bytes`. Body bytes are only counted; a length prefix is read.
    /// A length of 0 starts no body (the receiver refuses it; nothing here is then a record
    /// body buffer).
    pub fn advance(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.body_missing > 0 {
                let n = self.body_missing.min(bytes.len() as u64);
                self.body_missing -= n;
                // `n` is at most `bytes.len()`, so it fits in usize.
                bytes = &bytes[n as usize..];
                continue;
            }
            if let Some(len) = self.prefix.take(&mut bytes) {
                self.body_missing = len;
            }
        }
    }
}

/// Gathers the records of a subpartition's byte stream, each into one 64-byte aligned buffer
/// of exactly its length (the length prefix is not kept). Two ways in, freely mixed:
///
/// * [`RecordAssembler::push`] copies stream bytes in (a local channel's buffers, or the
///   length prefixes and small pieces of a remote one);
/// * [`RecordAssembler::body_spare`] and [`RecordAssembler::commit_body`] let a reader put
///   the body bytes of the record in progress straight where they belong, so a remote
///   channel's socket reads land in the record without a copy out of a segment.
pub struct RecordAssembler {
    prefix: LengthPrefix,
    /// The record being gathered and how long it will be.
    body: Option<(MutableBuffer, usize)>,
    /// Largest record accepted (guards against a corrupt length).
    max_record: usize,
}

impl RecordAssembler {
    /// An assembler accepting records up to `max_record` bytes.
    pub fn new(max_record: usize) -> RecordAssembler {
        RecordAssembler {
            prefix: LengthPrefix::default(),
            body: None,
            max_record,
        }
    }

    /// True when no record is partly gathered.
    pub fn is_at_record_boundary(&self) -> bool {
        self.prefix.filled == 0 && self.body.is_none()
    }

    /// Bytes of the length prefix still to come (0 while a body is being gathered).
    pub fn header_missing(&self) -> usize {
        if self.body.is_some() {
            0
        } else {
            self.prefix.missing()
        }
    }

    /// Bytes of the body in progress still to come (0 while a length prefix is expected).
    pub fn body_missing(&self) -> usize {
        self.body.as_ref().map_or(0, |(buf, want)| want - buf.len())
    }

    /// The space the next [`RecordAssembler::body_missing`] body bytes go into (empty while
    /// a length prefix is expected). Write a prefix of it, then call
    /// [`RecordAssembler::commit_body`].
    pub fn body_spare(&mut self) -> &mut [MaybeUninit<u8>] {
        let Some((buf, want)) = self.body.as_mut() else {
            return &mut [];
        };
        let (len, want) = (buf.len(), *want);
        debug_assert!(buf.capacity() >= want);
        // SAFETY: the buffer was allocated with capacity `want` and holds `len` bytes, so
        // `len..want` lies inside the allocation; `&mut self` makes this the only access, and
        // `MaybeUninit` allows the bytes to be uninitialized.
        unsafe {
            std::slice::from_raw_parts_mut(buf.as_mut_ptr().add(len).cast::<MaybeUninit<u8>>(), want - len)
        }
    }

    /// Marks the first `n` bytes of [`RecordAssembler::body_spare`] as written; returns the
    /// record if that completed it.
    ///
    /// # Safety
    /// The first `n` bytes of the slice `body_spare` returned must have been initialized,
    /// and `n` must not exceed [`RecordAssembler::body_missing`] (checked: panics).
    pub unsafe fn commit_body(&mut self, n: usize) -> Option<Buffer> {
        assert!(n <= self.body_missing(), "commit_body past the end of the record");
        let (buf, want) = self.body.as_mut()?;
        // SAFETY: the caller initialized these `n` bytes, within the capacity (checked above).
        unsafe { buf.set_len(buf.len() + n) };
        if buf.len() < *want {
            return None;
        }
        self.body.take().map(|(buf, _)| buf.into())
    }

    /// Feeds stream bytes (copied); each completed record's body is passed to `done`, in
    /// order. A length of 0 or over the maximum is a [`Error::Protocol`].
    pub fn push(&mut self, mut bytes: &[u8], mut done: impl FnMut(Buffer) -> Result<()>) -> Result<()> {
        while !bytes.is_empty() {
            match self.body.as_mut() {
                None => {
                    if let Some(len) = self.prefix.take(&mut bytes) {
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
                        done(buf.into())?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Reassembles records from stream bytes and decodes them.
pub struct RecordDeserializer {
    assembler: RecordAssembler,
    /// Set by the schema message at the start of the stream.
    decoder: Option<FileDecoder>,
}

impl RecordDeserializer {
    /// A deserializer accepting records up to `max_record` bytes.
    pub fn new(max_record: usize) -> RecordDeserializer {
        RecordDeserializer {
            assembler: RecordAssembler::new(max_record),
            decoder: None,
        }
    }

    /// True when no record is partly gathered.
    pub fn is_at_record_boundary(&self) -> bool {
        self.assembler.is_at_record_boundary()
    }

    /// Feeds stream bytes; complete batches are appended to `out` in order.
    pub fn push(&mut self, bytes: &[u8], out: &mut VecDeque<RecordBatch>) -> Result<()> {
        let RecordDeserializer { assembler, decoder } = self;
        assembler.push(bytes, |record| decode_record(decoder, record, out))
    }

    /// Decodes one whole record (its body, without the length prefix), gathered elsewhere by
    /// a [`RecordAssembler`]; its batch is appended to `out`.
    pub fn push_record(&mut self, record: Buffer, out: &mut VecDeque<RecordBatch>) -> Result<()> {
        decode_record(&mut self.decoder, record, out)
    }
}

/// Decodes the IPC messages of one record: the schema (first record only, which creates
/// `decoder`), dictionaries, then one record batch. Each message is `0xFFFFFFFF`, an i32
/// metadata length, the flatbuffer metadata, then the body the metadata declares.
fn decode_record(
    decoder_slot: &mut Option<FileDecoder>,
    buf: Buffer,
    out: &mut VecDeque<RecordBatch>,
) -> Result<()> {
    let bad = |what: String| Error::Protocol(format!("invalid Arrow IPC data: {what}"));
    let mut produced = false;
    let mut pos = 0usize;
    while pos < buf.len() {
        let prefix = buf
            .get(pos..pos + 8)
            .ok_or_else(|| bad("a record ends inside a message prefix".into()))?;
        if prefix[..4] != CONTINUATION_MARKER {
            return Err(bad("missing continuation marker".into()));
        }
        let meta_len = i32::from_le_bytes(prefix[4..8].try_into().expect("4 bytes"));
        let meta_len = usize::try_from(meta_len)
            .ok()
            .filter(|&n| n > 0 && pos + 8 + n <= buf.len())
            .ok_or_else(|| bad(format!("metadata length {meta_len} out of range")))?;
        let meta = &buf[pos + 8..pos + 8 + meta_len];
        let message = arrow_ipc::root_as_message(meta).map_err(|e| bad(format!("bad message: {e}")))?;
        let body_len = usize::try_from(message.bodyLength())
            .ok()
            .filter(|&n| n <= buf.len() - pos - 8 - meta_len)
            .ok_or_else(|| bad(format!("body length {} out of range", message.bodyLength())))?;
        let total = 8 + meta_len + body_len;
        let block = Block::new(0, (8 + meta_len) as i32, body_len as i64);
        let message_buf = buf.slice_with_length(pos, total);
        match message.header_type() {
            MessageHeader::Schema => {
                if decoder_slot.is_some() {
                    return Err(bad("a second schema message".into()));
                }
                let schema = message
                    .header_as_schema()
                    .ok_or_else(|| bad("schema message without a schema".into()))?;
                let schema = guarded(|| Ok(arrow_ipc::convert::fb_to_schema(schema)))?;
                let decoder = FileDecoder::new(Arc::new(schema), message.version());
                // SAFETY: every batch this decoder produces goes through `validate_batch`,
                // which checks what Arrow's validation would (see there), before use.
                *decoder_slot = Some(unsafe { decoder.with_skip_validation(true) });
            }
            MessageHeader::DictionaryBatch => {
                let decoder = decoder_slot
                    .as_mut()
                    .ok_or_else(|| bad("dictionary before schema".into()))?;
                guarded(|| decoder.read_dictionary(&block, &message_buf))?;
            }
            MessageHeader::RecordBatch => {
                let decoder = decoder_slot
                    .as_ref()
                    .ok_or_else(|| bad("batch before schema".into()))?;
                let batch = guarded(|| decoder.read_record_batch(&block, &message_buf))?
                    .ok_or_else(|| bad("empty record batch message".into()))?;
                validate_batch(&batch)?;
                out.push_back(batch);
                produced = true;
            }
            other => return Err(bad(format!("unexpected message {other:?}"))),
        }
        pos += total;
    }
    if !produced {
        return Err(Error::Protocol("a record held no record batch".into()));
    }
    Ok(())
}

/// Runs an arrow-ipc decoding step, turning its errors and its panics into protocol errors:
/// the reader asserts on some malformed inputs (buffer slices past the end, short validity
/// bitmaps) instead of returning an error, and a peer's bytes must never take the process
/// down. The channel fails after an error; the decoder is not used again.
fn guarded<T>(f: impl FnOnce() -> std::result::Result<T, ArrowError>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| Error::Protocol(format!("invalid Arrow IPC data: {e}"))),
        Err(_) => Err(Error::Protocol(
            "malformed Arrow IPC message (the decoder rejected it)".into(),
        )),
    }
}

/// Checks a batch decoded without Arrow's validation as strictly as Arrow would have:
/// `RecordBatch::try_new`'s checks (column count, types, lengths, no nulls in non-nullable
/// columns) and `ArrayData::validate_full` of every column — except that the values check of
/// flat string and binary columns, which Arrow does with a slow per-offset iterator and which
/// dominates decoding, is done here in one pass (offsets in range and non-decreasing; for
/// strings, valid UTF-8 and every offset on a character boundary).
fn validate_batch(batch: &RecordBatch) -> Result<()> {
    let schema = batch.schema();
    let bad = |what: String| Err(Error::Protocol(format!("invalid record batch: {what}")));
    if batch.num_columns() != schema.fields().len() {
        return bad(format!(
            "{} columns for {} fields",
            batch.num_columns(),
            schema.fields().len()
        ));
    }
    for (col, field) in batch.columns().iter().zip(schema.fields()) {
        if col.data_type() != field.data_type() {
            return bad(format!(
                "column {:?} is {} but the schema says {}",
                field.name(),
                col.data_type(),
                field.data_type()
            ));
        }
        if col.len() != batch.num_rows() {
            return bad(format!(
                "column {:?} has {} rows, the batch {}",
                field.name(),
                col.len(),
                batch.num_rows()
            ));
        }
        if !field.is_nullable() && col.null_count() > 0 {
            return bad(format!("non-nullable column {:?} has nulls", field.name()));
        }
        if let Err(e) = validate_array(&col.to_data()) {
            return bad(format!("column {:?}: {e}", field.name()));
        }
    }
    Ok(())
}

fn validate_array(d: &ArrayData) -> std::result::Result<(), ArrowError> {
    let (utf8, wide) = match d.data_type() {
        DataType::Utf8 => (true, false),
        DataType::LargeUtf8 => (true, true),
        DataType::Binary => (false, false),
        DataType::LargeBinary => (false, true),
        _ => return d.validate_full(),
    };
    d.validate()?;
    d.validate_nulls()?;
    let values = d.buffers()[1].as_slice();
    if wide {
        check_offsets(offsets::<i64>(d)?, values, utf8)
    } else {
        check_offsets(offsets::<i32>(d)?, values, utf8)
    }
}

/// The `len + 1` offsets of a variable-size array (already checked to fit by `validate`).
fn offsets<O: ArrowNativeType>(d: &ArrayData) -> std::result::Result<&[O], ArrowError> {
    let all: &[O] = d.buffers()[0].typed_data();
    all.get(d.offset()..d.offset() + d.len() + 1)
        .ok_or_else(|| ArrowError::InvalidArgumentError("offsets buffer too short".into()))
}

fn check_offsets<O: ArrowNativeType>(
    offsets: &[O],
    values: &[u8],
    utf8: bool,
) -> std::result::Result<(), ArrowError> {
    let err = |m: &str| Err(ArrowError::InvalidArgumentError(m.into()));
    let (Some(&first), Some(&last)) = (offsets.first(), offsets.last()) else {
        return err("no offsets");
    };
    let (first, last) = (first.to_i64().unwrap_or(-1), last.to_i64().unwrap_or(-1));
    if first < 0 || last < first || last as u64 > values.len() as u64 {
        return err("offsets out of range of the values buffer");
    }
    let mut monotonic = true;
    for w in offsets.windows(2) {
        monotonic &= w[0] <= w[1];
    }
    if !monotonic {
        return err("offsets are not non-decreasing");
    }
    if utf8 {
        let used = &values[first as usize..last as usize];
        if std::str::from_utf8(used).is_err() {
            return err("invalid UTF-8 in a string column");
        }
        // Every offset inside the values must start a character (not a continuation byte).
        let mut boundaries = true;
        for &o in offsets {
            let i = o.as_usize();
            if i < values.len() {
                boundaries &= (values[i] as i8) >= -0x40;
            }
        }
        if !boundaries {
            return err("a string offset splits a UTF-8 character");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::types::Int32Type;
    use arrow_array::{ArrayRef, DictionaryArray, Int64Array, StringArray};
    use std::sync::Arc;

    proptest::proptest! {
        /// The sending side's framing and the receiving side's assembler agree on the record
        /// in progress at every point of any stream cut into any pieces: that is what lets both
        /// ends tell record body buffers apart without a word about them.
        #[test]
        fn framing_agrees_with_the_assembler_at_every_cut(
            lens in proptest::collection::vec(1usize..3000, 1..12),
            cuts in proptest::collection::vec(1usize..700, 1..64),
        ) {
            let mut stream = Vec::new();
            for (i, len) in lens.iter().enumerate() {
                stream.extend_from_slice(&(*len as u64).to_le_bytes());
                stream.extend(std::iter::repeat_n(i as u8, *len));
            }
            let mut framing = RecordFraming::default();
            let mut assembler = RecordAssembler::new(1 << 20);
            let mut done = 0;
            let mut rest = &stream[..];
            for cut in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let n = (*cut).min(rest.len());
                proptest::prop_assert_eq!(framing.is_record_body(n), n < assembler.body_missing());
                framing.advance(&rest[..n]);
                assembler.push(&rest[..n], |_| { done += 1; Ok(()) }).unwrap();
                rest = &rest[n..];
                proptest::prop_assert_eq!(framing.body_missing(), assembler.body_missing() as u64);
            }
            proptest::prop_assert_eq!(done, lens.len());
            proptest::prop_assert_eq!(framing.body_missing(), 0);
        }
    }

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

    /// Every flat variable-width type the fast validator handles, with nulls, multi-byte
    /// characters and a sliced column.
    fn variable_width_batch(n: usize) -> RecordBatch {
        use arrow_array::{BinaryArray, LargeBinaryArray, LargeStringArray};
        let text = |i: usize| (!i.is_multiple_of(5)).then(|| format!("é{i}ü"));
        let s: ArrayRef = Arc::new(LargeStringArray::from_iter((0..n).map(text)));
        let b: ArrayRef = Arc::new(BinaryArray::from_iter(
            (0..n).map(|i| text(i).map(String::into_bytes)),
        ));
        let lb: ArrayRef = Arc::new(LargeBinaryArray::from_iter_values(
            (0..n).map(|i| vec![i as u8; i % 4]),
        ));
        let sliced: ArrayRef = Arc::new(StringArray::from_iter((0..n + 7).map(text)).slice(7, n));
        RecordBatch::try_from_iter([("s", s), ("b", b), ("lb", lb), ("sliced", sliced)]).unwrap()
    }

    #[test]
    fn variable_width_columns_round_trip() {
        let b = variable_width_batch(100);
        let mut out = VecDeque::new();
        RecordDeserializer::new(1 << 20)
            .push(&record_bytes(&b), &mut out)
            .unwrap();
        assert_eq!(out.pop_front().unwrap(), b);
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
            matches!(err, Error::Protocol(_)) && err.to_string().contains("UTF-8"),
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

    #[test]
    fn a_direct_write_completes_the_record_and_the_boundary_is_tracked() {
        let b = batch(0, 20);
        let bytes = record_bytes(&b);
        let mut asm = RecordAssembler::new(1 << 20);
        assert!(asm.is_at_record_boundary());
        assert_eq!((asm.header_missing(), asm.body_missing()), (RECORD_HEADER_LEN, 0));
        assert!(asm.body_spare().is_empty());
        asm.push(&bytes[..3], |_| unreachable!()).unwrap();
        assert!(!asm.is_at_record_boundary());
        assert_eq!(asm.header_missing(), RECORD_HEADER_LEN - 3);
        asm.push(&bytes[3..RECORD_HEADER_LEN], |_| unreachable!())
            .unwrap();
        let body = &bytes[RECORD_HEADER_LEN..];
        assert_eq!((asm.header_missing(), asm.body_missing()), (0, body.len()));
        let spare = asm.body_spare();
        assert_eq!(spare.len(), body.len());
        for (d, s) in spare.iter_mut().zip(body) {
            d.write(*s);
        }
        // SAFETY: all of the spare bytes were written just above.
        let record = unsafe { asm.commit_body(body.len()) }.expect("the record is complete");
        assert!(asm.is_at_record_boundary());
        let mut out = VecDeque::new();
        RecordDeserializer::new(1 << 20)
            .push_record(record, &mut out)
            .unwrap();
        assert_eq!(out.pop_front(), Some(b));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Records gathered from any mix of copied pieces and direct body writes, cut
        /// anywhere, decode to the batches that were encoded.
        #[test]
        fn copied_and_direct_pieces_assemble_the_same_records(
            cuts in proptest::collection::vec((1usize..3000, proptest::prelude::any::<bool>()), 1..64),
        ) {
            let batches: Vec<RecordBatch> = (0..4).map(|i| batch(i * 100, 37 + 50 * i)).collect();
            let mut enc = BatchEncoder::new(&batches[0].schema()).unwrap();
            let stream: Vec<u8> =
                batches.iter().flat_map(|b| enc.encode(b).unwrap().chunks().flatten().copied().collect::<Vec<u8>>()).collect();
            let mut asm = RecordAssembler::new(1 << 20);
            let mut de = RecordDeserializer::new(1 << 20);
            let mut out = VecDeque::new();
            let (mut pos, mut i) = (0, 0);
            while pos < stream.len() {
                let (len, direct) = cuts[i % cuts.len()];
                i += 1;
                let piece = &stream[pos..(pos + len).min(stream.len())];
                if direct && asm.body_missing() > 0 {
                    let m = piece.len().min(asm.body_missing());
                    for (d, s) in asm.body_spare()[..m].iter_mut().zip(piece) {
                        d.write(*s);
                    }
                    // SAFETY: these `m` bytes were written just above.
                    if let Some(record) = unsafe { asm.commit_body(m) } {
                        de.push_record(record, &mut out).unwrap();
                    }
                    pos += m;
                } else {
                    asm.push(piece, |record| de.push_record(record, &mut out)).unwrap();
                    pos += piece.len();
                }
            }
            proptest::prop_assert!(asm.is_at_record_boundary());
            proptest::prop_assert_eq!(out.len(), batches.len());
            for (got, want) in out.iter().zip(&batches) {
                proptest::prop_assert_eq!(got, want);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]

        /// Whatever bytes are flipped, the deserializer never accepts a batch that Arrow's
        /// own full validation rejects (and never panics).
        #[test]
        fn corrupted_records_never_pass_as_invalid_batches(
            flips in proptest::collection::vec((0usize..10_000, proptest::prelude::any::<u8>()), 1..4),
            wide in proptest::prelude::any::<bool>(),
        ) {
            let b = if wide { variable_width_batch(48) } else { batch(0, 64) };
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
