//! [`RowsEncoder`]: some rows of a batch straight to one IPC record that holds its schema (the
//! schema message, then the batch's), the column values gathered into the destination as the
//! record is written. A split batch's piece is then copied once on its way out, where taking
//! its rows first (a new batch) and encoding that after copies every byte twice.
//!
//! Columns without nulls of fixed width (integers, floats, decimals, dates, times), strings
//! and binary, as the partitioner's own one-pass split takes them; for any other batch
//! [`RowsEncoder::layout`] says no and the piece goes the two-step way. The record is what
//! Arrow's IPC writer makes of the same rows (64-byte aligned buffers, an empty validity
//! buffer for a column without nulls), so any IPC reader takes it.

use arrow_array::{Array, RecordBatch};
use arrow_buffer::ArrowNativeType;
use arrow_ipc::writer::{write_message, DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
use arrow_schema::{DataType, Schema};
use flatbuffers::FlatBufferBuilder;

use super::decode::offsets;
use crate::base::error::Result;

/// Every buffer and message starts on this boundary of the record (Arrow's own default).
const ALIGN: usize = 64;
/// An encapsulated message's prefix: the continuation marker and the metadata's length.
const MESSAGE_PREFIX: usize = 8;

/// How a column's values are laid out.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// One buffer of values this many bytes wide.
    Fixed(usize),
    /// Offsets (8 bytes each when `wide`, else 4) and the values they point into.
    Bytes { wide: bool },
}

/// Encodes selections of rows of batches of one schema.
pub struct RowsEncoder {
    kinds: Vec<Kind>,
    /// The schema message, encapsulated and padded, as every record starts.
    schema_message: Vec<u8>,
    fbb: FlatBufferBuilder<'static>,
}

/// Where one selection's bytes go: what [`RowsEncoder::write`] writes, and its length.
pub struct RowsLayout {
    rows: usize,
    /// The record batch message's metadata, encapsulated and padded.
    meta: Vec<u8>,
    /// Per column, the bytes of its values (for a byte column, of the selected values).
    values: Vec<usize>,
    body: usize,
    /// Where the batch message starts: after the schema message.
    meta_at: usize,
}

impl RowsLayout {
    /// Bytes of the record (without a length prefix).
    pub fn len(&self) -> usize {
        self.body_start() + self.body
    }

    /// Never true: the schema message is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn body_start(&self) -> usize {
        self.meta_at + self.meta.len()
    }
}

impl RowsEncoder {
    /// An encoder for batches of `schema`, or `None` when a column's type is not one it
    /// writes directly (the caller splits and encodes such batches the two-step way).
    pub fn new(schema: &Schema) -> Result<Option<RowsEncoder>> {
        let kinds: Option<Vec<Kind>> = schema.fields().iter().map(|f| kind(f.data_type())).collect();
        let Some(kinds) = kinds else {
            return Ok(None);
        };
        let options = IpcWriteOptions::default();
        let encoded = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(
            schema,
            &mut DictionaryTracker::new(false),
            &options,
        );
        let mut schema_message = Vec::new();
        write_message(&mut schema_message, encoded, &options)?;
        Ok(Some(RowsEncoder {
            kinds,
            schema_message,
            fbb: FlatBufferBuilder::new(),
        }))
    }

    /// The layout of the record holding rows `rows` (indices into `batch`, which has this
    /// encoder's schema) in that order, or `None` when a column has nulls.
    pub fn layout(&mut self, batch: &RecordBatch, rows: &[u32]) -> Option<RowsLayout> {
        let n = rows.len();
        let mut nodes = Vec::with_capacity(self.kinds.len());
        let mut buffers = Vec::with_capacity(self.kinds.len() * 3);
        let mut values = Vec::with_capacity(self.kinds.len());
        let mut at = 0usize;
        let mut push = |len: usize, buffers: &mut Vec<arrow_ipc::Buffer>| {
            buffers.push(arrow_ipc::Buffer::new(at as i64, len as i64));
            at += len.next_multiple_of(ALIGN);
        };
        for (col, kind) in batch.columns().iter().zip(&self.kinds) {
            if col.null_count() != 0 {
                return None;
            }
            nodes.push(arrow_ipc::FieldNode::new(n as i64, 0));
            push(0, &mut buffers); // no nulls: an empty validity buffer
            let bytes = match *kind {
                Kind::Fixed(width) => n * width,
                Kind::Bytes { wide } => {
                    push((n + 1) * if wide { 8 } else { 4 }, &mut buffers);
                    if wide {
                        selected_bytes::<i64>(col.as_ref(), rows)
                    } else {
                        selected_bytes::<i32>(col.as_ref(), rows)
                    }
                }
            };
            push(bytes, &mut buffers);
            values.push(bytes);
        }
        let body = at;
        let fbb = &mut self.fbb;
        fbb.reset();
        let buffers = fbb.create_vector(&buffers);
        let nodes = fbb.create_vector(&nodes);
        let header = {
            let mut b = arrow_ipc::RecordBatchBuilder::new(fbb);
            b.add_length(n as i64);
            b.add_nodes(nodes);
            b.add_buffers(buffers);
            b.finish().as_union_value()
        };
        let mut m = arrow_ipc::MessageBuilder::new(fbb);
        m.add_version(arrow_ipc::MetadataVersion::V5);
        m.add_header_type(arrow_ipc::MessageHeader::RecordBatch);
        m.add_bodyLength(body as i64);
        m.add_header(header);
        let root = m.finish();
        fbb.finish(root, None);
        let fb = fbb.finished_data();
        let padded = (MESSAGE_PREFIX + fb.len()).next_multiple_of(ALIGN);
        let mut meta = Vec::with_capacity(padded);
        meta.extend_from_slice(&[0xff; 4]);
        meta.extend_from_slice(&((padded - MESSAGE_PREFIX) as i32).to_le_bytes());
        meta.extend_from_slice(fb);
        meta.resize(padded, 0);
        Some(RowsLayout {
            rows: n,
            meta,
            values,
            body,
            meta_at: self.schema_message.len(),
        })
    }

    /// Writes the record `layout` describes (made by [`RowsEncoder::layout`] for the same
    /// `batch` and `rows`) into `dst`, exactly [`RowsLayout::len`] bytes, padding zeroed.
    pub fn write(&self, layout: &RowsLayout, batch: &RecordBatch, rows: &[u32], dst: &mut [u8]) {
        assert_eq!(dst.len(), layout.len(), "the destination is the record's length");
        assert_eq!(rows.len(), layout.rows, "the rows the layout was made for");
        let (head, body) = dst.split_at_mut(layout.body_start());
        let (schema, meta) = head.split_at_mut(self.schema_message.len());
        schema.copy_from_slice(&self.schema_message);
        meta.copy_from_slice(&layout.meta);
        let mut rest = body;
        for ((col, kind), &bytes) in batch.columns().iter().zip(&self.kinds).zip(&layout.values) {
            let data = col.to_data();
            match *kind {
                Kind::Fixed(width) => {
                    let src = &data.buffers()[0].as_slice()[data.offset() * width..][..data.len() * width];
                    let out = take_buffer(&mut rest, bytes);
                    match width {
                        1 => gather::<1>(src, rows, out),
                        2 => gather::<2>(src, rows, out),
                        4 => gather::<4>(src, rows, out),
                        8 => gather::<8>(src, rows, out),
                        16 => gather::<16>(src, rows, out),
                        32 => gather::<32>(src, rows, out),
                        _ => unreachable!("kind() admits these widths only"),
                    }
                }
                Kind::Bytes { wide } => {
                    let n = rows.len();
                    let offsets = take_buffer(&mut rest, (n + 1) * if wide { 8 } else { 4 });
                    let values = take_buffer(&mut rest, bytes);
                    if wide {
                        gather_bytes::<i64, 8>(&data, rows, offsets, values, |v| (v as i64).to_le_bytes());
                    } else {
                        gather_bytes::<i32, 4>(&data, rows, offsets, values, |v| (v as i32).to_le_bytes());
                    }
                }
            }
        }
        rest.fill(0);
    }
}

/// How a column of `dt` is written directly, if it is.
fn kind(dt: &DataType) -> Option<Kind> {
    match dt {
        DataType::Utf8 | DataType::Binary => Some(Kind::Bytes { wide: false }),
        DataType::LargeUtf8 | DataType::LargeBinary => Some(Kind::Bytes { wide: true }),
        dt if dt.is_primitive() => match dt.primitive_width()? {
            w @ (1 | 2 | 4 | 8 | 16 | 32) => Some(Kind::Fixed(w)),
            _ => None,
        },
        _ => None,
    }
}

/// The next `len` bytes of `rest` (then its padding, zeroed) as a buffer to fill.
fn take_buffer<'a>(rest: &mut &'a mut [u8], len: usize) -> &'a mut [u8] {
    let padded = len.next_multiple_of(ALIGN);
    let (buf, tail) = std::mem::take(rest).split_at_mut(padded);
    *rest = tail;
    let (out, pad) = buf.split_at_mut(len);
    pad.fill(0);
    out
}

/// The values of a column, `W` bytes each, at `rows`, in order, into `out`.
fn gather<const W: usize>(src: &[u8], rows: &[u32], out: &mut [u8]) {
    let (src, _) = src.as_chunks::<W>();
    let (out, _) = out.as_chunks_mut::<W>();
    for (o, &r) in out.iter_mut().zip(rows) {
        *o = src[r as usize];
    }
}

/// Bytes of the values at `rows` of a byte column with `O` offsets.
fn selected_bytes<O: ArrowNativeType>(col: &dyn Array, rows: &[u32]) -> usize {
    let data = col.to_data();
    let offs = offsets::<O>(&data).expect("a valid byte column has len + 1 offsets");
    rows.iter()
        .map(|&r| offs[r as usize + 1].as_usize() - offs[r as usize].as_usize())
        .sum()
}

/// The offsets (from 0) and the values of a byte column's `rows`, in order.
fn gather_bytes<O: ArrowNativeType, const W: usize>(
    data: &arrow_data::ArrayData,
    rows: &[u32],
    offsets_out: &mut [u8],
    values_out: &mut [u8],
    le: fn(usize) -> [u8; W],
) {
    let offs = offsets::<O>(data).expect("a valid byte column has len + 1 offsets");
    let values = data.buffers()[1].as_slice();
    let (offsets_out, _) = offsets_out.as_chunks_mut::<W>();
    let mut at = 0usize;
    offsets_out[0] = le(0);
    for (o, &r) in offsets_out[1..].iter_mut().zip(rows) {
        let (s, e) = (offs[r as usize].as_usize(), offs[r as usize + 1].as_usize());
        values_out[at..at + e - s].copy_from_slice(&values[s..e]);
        at += e - s;
        *o = le(at);
    }
    assert_eq!(at, values_out.len(), "the values the layout counted");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{
        ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Decimal256Array, Float64Array,
        Int16Array, Int8Array, LargeBinaryArray, LargeStringArray, StringArray, TimestampMicrosecondArray,
        UInt32Array,
    };
    use arrow_buffer::i256;
    use arrow_select::take::take_record_batch;

    use super::*;
    use crate::serde::{BatchEncoder, SelfContainedDecoder};

    /// A batch of every kind written directly, `n` rows, sliced from `skip` (an input with
    /// offsets that do not start at 0).
    fn every_kind(n: usize, skip: usize) -> RecordBatch {
        let all = n + skip;
        let word = |i: usize| "é".repeat(i % 4) + &"x".repeat(i % 7);
        let cols: Vec<(&str, ArrayRef)> = vec![
            (
                "i8",
                Arc::new(Int8Array::from_iter_values((0..all).map(|i| i as i8))),
            ),
            (
                "i16",
                Arc::new(Int16Array::from_iter_values((0..all).map(|i| i as i16 * 3))),
            ),
            (
                "u32",
                Arc::new(UInt32Array::from_iter_values((0..all).map(|i| i as u32 * 7))),
            ),
            (
                "f64",
                Arc::new(Float64Array::from_iter_values((0..all).map(|i| i as f64 / 3.0))),
            ),
            (
                "date",
                Arc::new(Date32Array::from_iter_values((0..all).map(|i| i as i32))),
            ),
            (
                "ts",
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    (0..all).map(|i| i as i64 * 1_000_003),
                )),
            ),
            (
                "d128",
                Arc::new(
                    Decimal128Array::from_iter_values((0..all).map(|i| i as i128 * 101))
                        .with_precision_and_scale(20, 2)
                        .unwrap(),
                ),
            ),
            (
                "d256",
                Arc::new(Decimal256Array::from_iter_values(
                    (0..all).map(|i| i256::from_i128(i as i128 - 5)),
                )),
            ),
            ("s", Arc::new(StringArray::from_iter_values((0..all).map(word)))),
            (
                "ls",
                Arc::new(LargeStringArray::from_iter_values((0..all).map(word))),
            ),
            (
                "b",
                Arc::new(BinaryArray::from_iter_values(
                    (0..all).map(|i| vec![i as u8; i % 5]),
                )),
            ),
            (
                "lb",
                Arc::new(LargeBinaryArray::from_iter_values(
                    (0..all).map(|i| vec![!(i as u8); i % 3]),
                )),
            ),
        ];
        RecordBatch::try_from_iter(cols).unwrap().slice(skip, n)
    }

    /// The record for `rows` of `batch`, written as a piece is.
    fn direct(enc: &mut RowsEncoder, batch: &RecordBatch, rows: &[u32]) -> Vec<u8> {
        let layout = enc.layout(batch, rows).expect("no nulls");
        // Stale bytes where the record goes: the padding must come out zeroed all the same.
        let mut out = vec![0xa5u8; layout.len()];
        enc.write(&layout, batch, rows, &mut out);
        out
    }

    /// What Arrow's own writer makes of the same rows: take them, then encode.
    fn two_step(batch: &RecordBatch, rows: &[u32]) -> Vec<u8> {
        let taken = take_record_batch(batch, &UInt32Array::from(rows.to_vec())).unwrap();
        let (_, parts) = BatchEncoder::new(batch.schema_ref())
            .unwrap()
            .encode(&taken)
            .unwrap()
            .into_parts();
        parts.iter().flat_map(|p| p.as_slice().to_vec()).collect()
    }

    proptest::proptest! {
        /// Any selection of rows (in any order, repeated, none) of a sliced batch of every
        /// kind comes out as the same bytes as Arrow's take-then-encode, and a strict decoder
        /// reads back exactly those rows.
        #[test]
        fn a_selection_is_written_as_arrow_writes_the_rows_taken(
            skip in 0usize..9,
            picks in proptest::collection::vec(0usize..1000, 0..300),
        ) {
            let batch = every_kind(200, skip);
            let rows: Vec<u32> = picks.iter().map(|&p| (p % 200) as u32).collect();
            let mut enc = RowsEncoder::new(batch.schema_ref()).unwrap().expect("every kind is written directly");
            let bytes = direct(&mut enc, &batch, &rows);
            proptest::prop_assert_eq!(&bytes, &two_step(&batch, &rows));
            let back = SelfContainedDecoder::new(1 << 24).decode(arrow_buffer::Buffer::from_vec(bytes)).unwrap();
            let want = take_record_batch(&batch, &UInt32Array::from(rows)).unwrap();
            proptest::prop_assert_eq!(back, want);
        }
    }

    #[test]
    fn a_column_with_nulls_or_of_another_type_is_left_to_the_two_step_way() {
        let with_nulls: ArrayRef = Arc::new(arrow_array::Int64Array::from(vec![Some(1), None, Some(3)]));
        let plain: ArrayRef = Arc::new(arrow_array::Int64Array::from(vec![1, 2, 3]));
        let b = RecordBatch::try_from_iter([("a", plain.clone()), ("n", with_nulls)]).unwrap();
        let mut enc = RowsEncoder::new(b.schema_ref()).unwrap().unwrap();
        assert!(enc.layout(&b, &[0, 2]).is_none(), "a column has a null");
        // The same schema without nulls in this batch is written directly.
        let b2 = RecordBatch::try_new(b.schema(), vec![plain.clone(), plain.clone()]).unwrap();
        assert!(enc.layout(&b2, &[0, 2]).is_some());
        let flags: ArrayRef = Arc::new(BooleanArray::from(vec![true, false, true]));
        let b3 = RecordBatch::try_from_iter([("a", plain), ("f", flags)]).unwrap();
        assert!(
            RowsEncoder::new(b3.schema_ref()).unwrap().is_none(),
            "booleans are not"
        );
    }
}
