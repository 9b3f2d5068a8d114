//! [`RecordDeserializer`]: a gathered record's IPC messages decoded zero-copy over its
//! buffer, and the checks that make a batch from a peer safe to use.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_buffer::{ArrowNativeType, Buffer};
use arrow_data::ArrayData;
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::{Block, MessageHeader};
use arrow_schema::{ArrowError, DataType, SchemaRef};

use super::assemble::RecordAssembler;
use crate::base::error::{Error, Result};

/// Starts every IPC message of the stream format.
const CONTINUATION_MARKER: [u8; 4] = [0xff; 4];

/// The bytes of a batch's data: its buffers as far as its rows reach, as pyarrow's `nbytes`
/// counts them. A batch decoded over a record shares the record's memory, whose whole size
/// `get_array_memory_size` would count once for each of its column buffers.
pub fn batch_bytes(batch: &RecordBatch) -> usize {
    batch.columns().iter().map(|c| column_bytes(c.as_ref())).sum()
}

/// One column's share of [`batch_bytes`], as `ArrayData::get_slice_memory_size` counts it.
/// Fixed-width and string or binary columns (what batches mostly hold) are counted from the
/// array itself: building a column's `ArrayData` to ask it costs more than the count, and
/// this runs for every batch written and read.
pub(crate) fn column_bytes(c: &dyn Array) -> usize {
    // `ArrayData` keeps a validity buffer only where a row is null.
    let validity = if c.nulls().is_some_and(|n| n.null_count() > 0) {
        c.len().div_ceil(8)
    } else {
        0
    };
    let own = c
        .data_type()
        .primitive_width()
        .map(|w| c.len() * w)
        .or_else(|| match c.data_type() {
            DataType::Utf8 => c.as_string_opt::<i32>().map(|a| offsets_bytes(a.value_offsets())),
            DataType::LargeUtf8 => c.as_string_opt::<i64>().map(|a| offsets_bytes(a.value_offsets())),
            DataType::Binary => c.as_binary_opt::<i32>().map(|a| offsets_bytes(a.value_offsets())),
            DataType::LargeBinary => c.as_binary_opt::<i64>().map(|a| offsets_bytes(a.value_offsets())),
            _ => None,
        });
    match own {
        Some(n) => n + validity,
        None => c
            .to_data()
            .get_slice_memory_size()
            .unwrap_or_else(|_| c.get_array_memory_size()),
    }
}

/// The offsets of a string or binary column's rows and the values between its first and last.
fn offsets_bytes<O: ArrowNativeType>(offsets: &[O]) -> usize {
    let (first, last) = (offsets[0].as_usize(), offsets[offsets.len() - 1].as_usize());
    std::mem::size_of_val(offsets) + (last - first)
}

/// Reassembles records from stream bytes and decodes them.
pub struct RecordDeserializer {
    assembler: RecordAssembler,
    /// Set by the schema message at the start of the stream.
    decoder: Option<FileDecoder>,
    /// The most bytes one record may take, compressed as sent or decompressed.
    max_record: usize,
}

impl RecordDeserializer {
    /// A deserializer accepting records up to `max_record` bytes.
    pub fn new(max_record: usize) -> RecordDeserializer {
        RecordDeserializer {
            assembler: RecordAssembler::new(max_record),
            decoder: None,
            max_record,
        }
    }

    /// True when no record is partly gathered.
    pub fn is_at_record_boundary(&self) -> bool {
        self.assembler.is_at_record_boundary()
    }

    /// Feeds stream bytes; complete batches are appended to `out` in order.
    pub fn push(&mut self, bytes: &[u8], out: &mut VecDeque<RecordBatch>) -> Result<()> {
        let RecordDeserializer {
            assembler,
            decoder,
            max_record,
        } = self;
        assembler.push(bytes, |record| {
            decode_record(decoder, *max_record, true, record, out)
        })
    }

    /// Decodes one whole record (its body, without the length prefix), gathered elsewhere by
    /// a [`RecordAssembler`]; its batch is appended to `out`.
    pub fn push_record(&mut self, record: Buffer, out: &mut VecDeque<RecordBatch>) -> Result<()> {
        decode_record(&mut self.decoder, self.max_record, true, record, out)
    }
}

/// Decodes records that each begin with their schema (the pieces a writer split, each of which
/// can be read alone), parsing a schema only when its bytes differ from the last record's: the
/// batches of one schema then share one `SchemaRef`, and the schema's flatbuffer is verified and
/// converted once.
pub struct SelfContainedDecoder {
    /// The last schema message parsed, and the decoder made from it.
    schema_message: Vec<u8>,
    decoder: Option<FileDecoder>,
    max_record: usize,
    /// Whether string values are checked to be UTF-8.
    utf8: bool,
    /// The last schema message [`SelfContainedDecoder::peek`] parsed, and its schema.
    peeked: Option<(Vec<u8>, SchemaRef)>,
}

impl SelfContainedDecoder {
    /// A decoder accepting records up to `max_record` bytes, checking every batch as
    /// [`RecordDeserializer`] does.
    pub fn new(max_record: usize) -> SelfContainedDecoder {
        SelfContainedDecoder {
            schema_message: Vec::new(),
            decoder: None,
            max_record,
            utf8: true,
            peeked: None,
        }
    }

    /// A decoder for a relay that passes the batches on as bytes and never reads a string
    /// value as text: it checks everything but whether string values are UTF-8 (offsets,
    /// lengths, nulls, dictionary keys: what reading the bytes safely needs), which whoever
    /// finally decodes them checks. That check reads every string byte.
    pub fn relay(max_record: usize) -> SelfContainedDecoder {
        SelfContainedDecoder {
            utf8: false,
            ..SelfContainedDecoder::new(max_record)
        }
    }

    /// The one batch of `record` (its body, without the length prefix), which must begin with
    /// its schema message.
    pub fn decode(&mut self, record: Buffer) -> Result<RecordBatch> {
        let mut out = VecDeque::with_capacity(1);
        let schema_len = first_message_len(&record);
        let same =
            schema_len.is_some_and(|n| self.decoder.is_some() && record[..n] == self.schema_message[..]);
        match schema_len {
            Some(n) if same => decode_record(
                &mut self.decoder,
                self.max_record,
                self.utf8,
                record.slice(n),
                &mut out,
            )?,
            _ => {
                let mut decoder = None;
                decode_record(&mut decoder, self.max_record, self.utf8, record.clone(), &mut out)?;
                if decoder.is_none() {
                    return Err(Error::Protocol("a piece without its schema".into()));
                }
                self.decoder = decoder;
                self.schema_message = schema_len.map(|n| record[..n].to_vec()).unwrap_or_default();
            }
        }
        match (out.pop_front(), out.is_empty()) {
            (Some(batch), true) => Ok(batch),
            _ => Err(Error::Protocol("a piece holds more than one batch".into())),
        }
    }
}

impl SelfContainedDecoder {
    /// The schema and row count of `record` (as [`SelfContainedDecoder::decode`] takes it)
    /// without decoding its columns, for a relay that queues the record as it lies and leaves
    /// decoding, and every check of the columns, to whoever reads it. Checks the record's
    /// framing: its schema message first, then dictionaries and exactly one record batch, each
    /// message's metadata and body inside the record. A schema is parsed only when its bytes
    /// differ from the last record's.
    pub fn peek(&mut self, record: &Buffer) -> Result<(SchemaRef, usize)> {
        let bad = |what: String| Error::Protocol(format!("invalid Arrow IPC data: {what}"));
        let schema_len = first_message_len(record).ok_or_else(|| bad("a piece without its schema".into()))?;
        let known = self
            .peeked
            .as_ref()
            .filter(|(message, _)| record[..schema_len] == message[..])
            .map(|(_, schema)| schema.clone());
        let schema = match known {
            Some(schema) => schema,
            None => {
                let message = arrow_ipc::root_as_message(&record[8..schema_len])
                    .map_err(|e| bad(format!("bad message: {e}")))?;
                let fb = message
                    .header_as_schema()
                    .ok_or_else(|| bad("a piece without its schema".into()))?;
                let schema = Arc::new(guarded(|| Ok(arrow_ipc::convert::fb_to_schema(fb)))?);
                self.peeked = Some((record[..schema_len].to_vec(), schema.clone()));
                schema
            }
        };
        let mut rows = None;
        let mut pos = schema_len;
        while pos < record.len() {
            let (message, total) = message_at(record, pos)?;
            match message.header_type() {
                MessageHeader::DictionaryBatch if rows.is_none() => {}
                MessageHeader::RecordBatch if rows.is_none() => {
                    let n = message
                        .header_as_record_batch()
                        .map(|b| b.length())
                        .ok_or_else(|| bad("record batch message without its header".into()))?;
                    rows = Some(usize::try_from(n).map_err(|_| bad(format!("a batch of {n} rows")))?);
                }
                other => return Err(bad(format!("unexpected message {other:?} in a piece"))),
            }
            pos += total;
        }
        let rows = rows.ok_or_else(|| Error::Protocol("a record held no record batch".into()))?;
        Ok((schema, rows))
    }
}

/// The IPC message at `pos` of `buf` and its bytes (prefix, metadata and body), each checked
/// to lie inside `buf`.
fn message_at(buf: &[u8], pos: usize) -> Result<(arrow_ipc::Message<'_>, usize)> {
    let bad = |what: String| Error::Protocol(format!("invalid Arrow IPC data: {what}"));
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
    Ok((message, 8 + meta_len + body_len))
}

/// Bytes of a record's first IPC message when it has no body (a schema's): the marker, the
/// metadata length and the metadata; `None` when the prefix does not say so plausibly.
fn first_message_len(record: &[u8]) -> Option<usize> {
    let prefix = record.get(..8)?;
    if prefix[..4] != CONTINUATION_MARKER {
        return None;
    }
    let meta_len = usize::try_from(i32::from_le_bytes(prefix[4..8].try_into().expect("4 bytes"))).ok()?;
    let end = 8usize.checked_add(meta_len)?;
    (meta_len > 0 && end <= record.len()).then_some(end)
}

/// Decodes the IPC messages of one record: the schema (first record only, which creates
/// `decoder`), dictionaries, then one record batch. Each message is `0xFFFFFFFF`, an i32
/// metadata length, the flatbuffer metadata, then the body the metadata declares. Bodies may
/// be IPC-compressed (LZ4 frame or ZSTD, as the message says); their buffers then decompress
/// into new allocations, which the decoder aligns as it does unaligned ones, and which must
/// declare at most `max_record` bytes together. `utf8`: whether string values are checked to
/// be UTF-8 (see [`SelfContainedDecoder::relay`]).
fn decode_record(
    decoder_slot: &mut Option<FileDecoder>,
    max_record: usize,
    utf8: bool,
    buf: Buffer,
    out: &mut VecDeque<RecordBatch>,
) -> Result<()> {
    let bad = |what: String| Error::Protocol(format!("invalid Arrow IPC data: {what}"));
    let mut produced = false;
    let mut pos = 0usize;
    while pos < buf.len() {
        let (message, total) = message_at(&buf, pos)?;
        let meta_len = total - 8 - usize::try_from(message.bodyLength()).expect("checked");
        let body_len = total - 8 - meta_len;
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
                let data = message.header_as_dictionary_batch().and_then(|d| d.data());
                check_decompressed(data, body(&message_buf), max_record)?;
                guarded(|| decoder.read_dictionary(&block, &message_buf))?;
            }
            MessageHeader::RecordBatch => {
                let decoder = decoder_slot
                    .as_ref()
                    .ok_or_else(|| bad("batch before schema".into()))?;
                check_decompressed(message.header_as_record_batch(), body(&message_buf), max_record)?;
                let batch = guarded(|| decoder.read_record_batch(&block, &message_buf))?
                    .ok_or_else(|| bad("empty record batch message".into()))?;
                validate_batch(&batch, utf8)?;
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

/// The body of one IPC message (already checked to hold its metadata and body).
fn body(message: &Buffer) -> &[u8] {
    let meta_len = i32::from_le_bytes(message[4..8].try_into().expect("4 bytes")) as usize;
    &message[8 + meta_len..]
}

/// Refuses a compressed record batch body whose buffers declare more than `max_record`
/// decompressed bytes together, before anything is decompressed: the decoder allocates what
/// each buffer's 8-byte prefix declares, so a peer could otherwise have it allocate any size
/// from a small record. (An LZ4 frame may still decompress past its declared length; arrow's
/// reader does not stop there, so that output is bounded by LZ4's ratio, at most about 255:1.)
/// Buffers out of the body's range are left to the decoder, which rejects them.
fn check_decompressed(
    batch: Option<arrow_ipc::RecordBatch<'_>>,
    body: &[u8],
    max_record: usize,
) -> Result<()> {
    let Some(batch) = batch else { return Ok(()) };
    if batch.compression().is_none() {
        return Ok(());
    }
    let mut declared = 0u64;
    for b in batch.buffers().into_iter().flatten() {
        let (Ok(offset), Ok(len)) = (usize::try_from(b.offset()), usize::try_from(b.length())) else {
            continue;
        };
        let Some(prefix) = offset
            .checked_add(8)
            .filter(|_| len >= 8)
            .and_then(|end| body.get(offset..end))
        else {
            continue;
        };
        let n = i64::from_le_bytes(prefix.try_into().expect("8 bytes"));
        declared = declared.saturating_add(u64::try_from(n).unwrap_or(0));
    }
    if declared > max_record as u64 {
        return Err(Error::Protocol(format!(
            "invalid Arrow IPC data: a compressed record declares {declared} bytes decompressed, \
             more than the {max_record} a record may take"
        )));
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
fn validate_batch(batch: &RecordBatch, utf8: bool) -> Result<()> {
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
        if let Err(e) = validate_array(&col.to_data(), utf8) {
            return bad(format!("column {:?}: {e}", field.name()));
        }
    }
    Ok(())
}

fn validate_array(d: &ArrayData, check_utf8: bool) -> std::result::Result<(), ArrowError> {
    let (utf8, wide) = match d.data_type() {
        DataType::Utf8 => (check_utf8, false),
        DataType::LargeUtf8 => (check_utf8, true),
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
pub(super) fn offsets<O: ArrowNativeType>(d: &ArrayData) -> std::result::Result<&[O], ArrowError> {
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
        if used.is_ascii() {
            // Valid UTF-8, and every byte starts a character, so every offset (all of them
            // lie in `first..=last`) is on a boundary: nothing more to check.
            return Ok(());
        }
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
    use super::check_offsets;

    #[test]
    fn strings_are_checked_per_character_unless_all_ascii() {
        assert!(check_offsets(&[0i32, 2, 3, 6], b"abcdef", true).is_ok());
        // "a", "é", "€", "b": 1, 2, 3 and 1 bytes.
        let s = "aé€b".as_bytes();
        assert!(check_offsets(&[0i32, 1, 3, 6, 7], s, true).is_ok());
        let split = check_offsets(&[0i32, 2, 7], s, true).unwrap_err();
        assert!(split.to_string().contains("splits"), "{split}");
        // Binary values are not characters.
        assert!(check_offsets(&[0i32, 2, 7], s, false).is_ok());
        let bad = check_offsets(&[0i32, 2], &[0x61, 0xff], true).unwrap_err();
        assert!(bad.to_string().contains("UTF-8"), "{bad}");
        // An ASCII range still has its offsets checked for order and range.
        assert!(check_offsets(&[0i32, 3, 2], b"abc", true).is_err());
        assert!(check_offsets(&[0i32, 4], b"abc", true).is_err());
    }
}
