//! Tests of the serialization: round trips of every Arrow type, records cut anywhere,
//! framing against the assembler, corrupt input.

use std::collections::VecDeque;

use arrow_array::RecordBatch;

use super::*;
use crate::base::error::Error;
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

fn compressed_record_bytes(b: &RecordBatch, codec: Compression) -> Vec<u8> {
    let mut enc = BatchEncoder::with_compression(&b.schema(), Some(codec)).unwrap();
    enc.encode(b).unwrap().chunks().flatten().copied().collect()
}

#[test]
fn compressed_records_round_trip_across_arbitrary_chunking() {
    // Decompressed buffers are new allocations, not slices of the record: the decoder must
    // align them, and the validation must see them like any other buffer.
    for codec in [Compression::Lz4, Compression::Zstd] {
        let batches: Vec<RecordBatch> = (0..4).map(|i| batch(i * 1000, 501 + i)).collect();
        let mut enc = BatchEncoder::with_compression(&batches[0].schema(), Some(codec)).unwrap();
        let mut plain = BatchEncoder::new(&batches[0].schema()).unwrap();
        let mut stream = Vec::new();
        let mut plain_len = 0;
        for b in &batches {
            stream.extend(enc.encode(b).unwrap().chunks().flatten());
            plain_len += plain.encode(b).unwrap().len();
        }
        assert!(
            stream.len() < plain_len,
            "{codec:?}: {} >= {plain_len}",
            stream.len()
        );
        for chunk in [1usize, 7, 4096, stream.len()] {
            let mut de = RecordDeserializer::new(1 << 20);
            let mut out = VecDeque::new();
            for piece in stream.chunks(chunk) {
                de.push(piece, &mut out).unwrap();
            }
            assert!(de.is_at_record_boundary());
            assert_eq!(out.iter().collect::<Vec<_>>(), batches.iter().collect::<Vec<_>>());
        }
        let wide = variable_width_batch(300);
        let mut out = VecDeque::new();
        RecordDeserializer::new(1 << 20)
            .push(&compressed_record_bytes(&wide, codec), &mut out)
            .unwrap();
        assert_eq!(out.pop_front().unwrap(), wide);
    }
}

/// Where the 8-byte decompressed-length prefix of the first compressed buffer of the record
/// batch message in `record` (length prefix included) is.
fn first_compressed_prefix(record: &[u8]) -> usize {
    let mut pos = RECORD_HEADER_LEN;
    loop {
        let meta_len = i32::from_le_bytes(record[pos + 4..pos + 8].try_into().unwrap()) as usize;
        let message = arrow_ipc::root_as_message(&record[pos + 8..pos + 8 + meta_len]).unwrap();
        let body = pos + 8 + meta_len;
        if let Some(b) = message.header_as_record_batch() {
            assert!(b.compression().is_some());
            let buf = b.buffers().unwrap().iter().find(|x| x.length() >= 8).unwrap();
            return body + buf.offset() as usize;
        }
        pos = body + message.bodyLength() as usize;
    }
}

#[test]
fn a_compressed_record_declaring_too_much_is_a_protocol_error_before_any_allocation() {
    for codec in [Compression::Lz4, Compression::Zstd] {
        let good = compressed_record_bytes(&batch(0, 300), codec);
        let at = first_compressed_prefix(&good);
        assert!(i64::from_le_bytes(good[at..at + 8].try_into().unwrap()) > 0);
        // An allocation this size would abort the process, not fail the channel.
        for declared in [(1i64 << 20) + 1, 1 << 40, i64::MAX] {
            let mut bad = good.clone();
            bad[at..at + 8].copy_from_slice(&declared.to_le_bytes());
            let err = RecordDeserializer::new(1 << 20)
                .push(&bad, &mut VecDeque::new())
                .unwrap_err();
            assert!(
                matches!(err, Error::Protocol(_)) && err.to_string().contains("decompressed"),
                "{codec:?} {declared}: {err}"
            );
        }
        // A wrong but small declared length is the codec's error, still not a panic.
        let mut bad = good.clone();
        bad[at..at + 8].copy_from_slice(&3i64.to_le_bytes());
        let mut out = VecDeque::new();
        let r = RecordDeserializer::new(1 << 20).push(&bad, &mut out);
        assert!(r.is_err() || out.len() == 1, "{codec:?}");
    }
}

/// A record that holds its schema, as a writer's piece: a fresh encoder's first record.
fn self_contained(batch: &RecordBatch) -> arrow_buffer::Buffer {
    let (_, parts) = BatchEncoder::new(batch.schema_ref())
        .unwrap()
        .encode(batch)
        .unwrap()
        .into_parts();
    let bytes: Vec<u8> = parts.iter().flat_map(|p| p.as_slice().to_vec()).collect();
    arrow_buffer::Buffer::from_vec(bytes)
}

#[test]
fn a_decoded_batch_counts_its_own_bytes_not_the_record_s_once_per_buffer() {
    let sent = variable_width_batch(5_000);
    let got = SelfContainedDecoder::new(1 << 20)
        .decode(self_contained(&sent))
        .unwrap();
    assert_eq!(got, sent);
    // Every column buffer of `got` is a slice of the one record: counted by capacity, each
    // would count all of it.
    assert!(got.get_array_memory_size() > 2 * self_contained(&sent).len());
    assert_eq!(batch_bytes(&got), batch_bytes(&sent));
    assert!(batch_bytes(&got) <= self_contained(&sent).len());
    // A slice counts the rows it has.
    assert!(batch_bytes(&sent.slice(0, 100)) < batch_bytes(&sent) / 10);
}

#[test]
fn self_contained_records_decode_alone_and_share_a_schema_parsed_once() {
    let ints =
        |v: Vec<i64>| RecordBatch::try_from_iter([("k", Arc::new(Int64Array::from(v)) as ArrayRef)]).unwrap();
    let keys = arrow_array::Int32Array::from(vec![1, 0, 1]);
    let words: ArrayRef = Arc::new(StringArray::from(vec!["a", "b"]));
    let dict = |keys: arrow_array::Int32Array, words: ArrayRef| {
        let d: ArrayRef = Arc::new(DictionaryArray::<Int32Type>::try_new(keys, words).unwrap());
        RecordBatch::try_from_iter([("w", d)]).unwrap()
    };
    let mut d = SelfContainedDecoder::new(1 << 20);
    let a = d.decode(self_contained(&ints(vec![1, 2]))).unwrap();
    let b = d.decode(self_contained(&ints(vec![3]))).unwrap();
    assert_eq!((a, b.clone()), (ints(vec![1, 2]), ints(vec![3])));
    let c = d.decode(self_contained(&ints(vec![4, 5, 6]))).unwrap();
    assert!(
        Arc::ptr_eq(&b.schema(), &c.schema()),
        "one schema for the batches of one schema"
    );
    // Another schema, each piece with its own dictionary, then the first schema again.
    let x = d.decode(self_contained(&dict(keys.clone(), words))).unwrap();
    let other: ArrayRef = Arc::new(StringArray::from(vec!["c", "d"]));
    let y = d
        .decode(self_contained(&dict(keys.clone(), other.clone())))
        .unwrap();
    assert_eq!(x, dict(keys.clone(), Arc::new(StringArray::from(vec!["a", "b"]))));
    assert_eq!(y, dict(keys, other));
    assert_eq!(d.decode(self_contained(&ints(vec![7]))).unwrap(), ints(vec![7]));
    // A record without its schema (an encoder's second record) is refused.
    let mut e = BatchEncoder::new(ints(vec![1]).schema_ref()).unwrap();
    e.encode(&ints(vec![1])).unwrap();
    let (_, parts) = e.encode(&ints(vec![2])).unwrap().into_parts();
    let second: Vec<u8> = parts.iter().flat_map(|p| p.as_slice().to_vec()).collect();
    let err = SelfContainedDecoder::new(1 << 20).decode(arrow_buffer::Buffer::from_vec(second));
    assert!(matches!(err, Err(Error::Protocol(_))), "{err:?}");
}

#[test]
fn a_relay_passes_strings_that_are_not_utf8_on_and_still_refuses_broken_offsets() {
    let strings = |offsets: Vec<i32>, values: &[u8]| {
        // SAFETY: the offsets fit the values; only their UTF-8 is wrong, and nothing here reads
        // them as text (the encoder copies bytes).
        let data = unsafe {
            arrow_data::ArrayData::builder(arrow_schema::DataType::Utf8)
                .len(offsets.len() - 1)
                .add_buffer(arrow_buffer::Buffer::from_vec(offsets))
                .add_buffer(arrow_buffer::Buffer::from_slice_ref(values))
                .build_unchecked()
        };
        let col: ArrayRef = Arc::new(StringArray::from(data));
        RecordBatch::try_from_iter([("s", col)]).unwrap()
    };
    let not_utf8 = self_contained(&strings(vec![0, 2, 3], &[0x61, 0xff, 0x62]));
    let relayed = SelfContainedDecoder::relay(1 << 20)
        .decode(not_utf8.clone())
        .unwrap();
    assert_eq!(relayed.num_rows(), 2);
    let err = SelfContainedDecoder::new(1 << 20).decode(not_utf8);
    assert!(
        matches!(&err, Err(Error::Protocol(m)) if m.contains("UTF-8")),
        "{err:?}"
    );
    // Offsets past the values are refused by both: reading the bytes would not be safe.
    let good = self_contained(&strings(vec![0, 2, 3], b"abc"));
    let mut bytes = good.as_slice().to_vec();
    let offsets: Vec<u8> = [0i32, 2, 3].iter().flat_map(|o| o.to_le_bytes()).collect();
    let at = bytes.windows(12).position(|w| w == offsets).expect("the offsets");
    bytes[at + 8..at + 12].copy_from_slice(&9i32.to_le_bytes());
    let past = arrow_buffer::Buffer::from_vec(bytes);
    assert!(SelfContainedDecoder::relay(1 << 20).decode(past.clone()).is_err());
    assert!(SelfContainedDecoder::new(1 << 20).decode(past).is_err());
}

#[test]
fn a_peek_reads_a_piece_s_schema_and_rows_and_leaves_its_columns_to_the_decoder() {
    let ints =
        |v: Vec<i64>| RecordBatch::try_from_iter([("k", Arc::new(Int64Array::from(v)) as ArrayRef)]).unwrap();
    let words = |v: Vec<&str>| {
        RecordBatch::try_from_iter([("s", Arc::new(StringArray::from(v)) as ArrayRef)]).unwrap()
    };
    let mut d = SelfContainedDecoder::relay(1 << 20);
    let (a, rows) = d.peek(&self_contained(&ints(vec![1, 2, 3]))).unwrap();
    assert_eq!((a.as_ref(), rows), (ints(vec![1]).schema().as_ref(), 3));
    let (b, rows) = d.peek(&self_contained(&ints(vec![4]))).unwrap();
    assert_eq!(rows, 1);
    assert!(
        Arc::ptr_eq(&a, &b),
        "one schema parsed for the pieces of one schema"
    );
    let (c, rows) = d.peek(&self_contained(&words(vec!["x", "y"]))).unwrap();
    assert_eq!((c.as_ref(), rows), (words(vec![]).schema().as_ref(), 2));
    // Offsets past the values: the peek does not read the columns, whoever decodes refuses it.
    let good = self_contained(&words(vec!["ab", "c"]));
    let mut bytes = good.as_slice().to_vec();
    let offsets: Vec<u8> = [0i32, 2, 3].iter().flat_map(|o| o.to_le_bytes()).collect();
    let at = bytes.windows(12).position(|w| w == offsets).expect("the offsets");
    bytes[at + 8..at + 12].copy_from_slice(&9i32.to_le_bytes());
    let past = arrow_buffer::Buffer::from_vec(bytes);
    assert_eq!(d.peek(&past).unwrap().1, 2);
    assert!(matches!(
        SelfContainedDecoder::new(1 << 20).decode(past),
        Err(Error::Protocol(_))
    ));
    // Framing that is not a piece's is refused: no schema first, two batches, a body cut
    // short, garbage.
    let mut e = BatchEncoder::new(ints(vec![1]).schema_ref()).unwrap();
    let (_, first) = e.encode(&ints(vec![1])).unwrap().into_parts();
    let (_, second) = e.encode(&ints(vec![2])).unwrap().into_parts();
    let join = |parts: &[&[arrow_buffer::Buffer]]| {
        let bytes: Vec<u8> = parts
            .iter()
            .flat_map(|p| p.iter())
            .flat_map(|b| b.as_slice().to_vec())
            .collect();
        arrow_buffer::Buffer::from_vec(bytes)
    };
    let whole = join(&[&first]);
    assert_eq!(d.peek(&whole).unwrap().1, 1);
    for bad in [
        join(&[&second]),
        join(&[&first, &second]),
        whole.slice_with_length(0, whole.len() - 8),
        arrow_buffer::Buffer::from_vec(vec![0xffu8; 64]),
        arrow_buffer::Buffer::from_vec(Vec::<u8>::new()),
    ] {
        let got = d.peek(&bad);
        assert!(matches!(got, Err(Error::Protocol(_))), "{got:?}");
    }
}

mod column_bytes {
    use std::sync::Arc;

    use arrow_array::builder::{ListBuilder, StringDictionaryBuilder};
    use arrow_array::types::{
        Decimal128Type, Float64Type, Int32Type, Int64Type, Int8Type, TimestampMicrosecondType,
    };
    use arrow_array::{
        Array, ArrayRef, ArrowPrimitiveType, BinaryArray, BooleanArray, LargeBinaryArray, LargeStringArray,
        PrimitiveArray, StringArray,
    };
    use arrow_buffer::ArrowNativeType;
    use proptest::prelude::*;

    use super::super::decode::column_bytes;

    /// `rows` numbers of type `T`, null where `null` says.
    fn numbers<T: ArrowPrimitiveType>(rows: usize, null: impl Fn(usize) -> bool) -> ArrayRef {
        let value = |i: usize| T::Native::usize_as(i % 100);
        Arc::new(
            (0..rows)
                .map(|i| (!null(i)).then(|| value(i)))
                .collect::<PrimitiveArray<T>>(),
        )
    }

    /// A column of `rows` rows of every kind `column_bytes` counts itself, and of a few it
    /// leaves to `ArrayData`; every third row null where `nulls`.
    fn columns(rows: usize, nulls: bool) -> Vec<ArrayRef> {
        let null = |i: usize| nulls && i % 3 == 1;
        let text = |i: usize| (!null(i)).then(|| "x".repeat(i % 7));
        let bytes = |i: usize| (!null(i)).then(|| vec![i as u8; i % 5]);
        let mut list = ListBuilder::new(arrow_array::builder::Int64Builder::new());
        let mut dict = StringDictionaryBuilder::<Int32Type>::new();
        for i in 0..rows {
            if null(i) {
                list.append_null();
                dict.append_null();
            } else {
                list.append_value((0..i % 4).map(|v| Some(v as i64)));
                dict.append_value(format!("k{}", i % 3));
            }
        }
        vec![
            numbers::<Int8Type>(rows, null),
            numbers::<Int64Type>(rows, null),
            numbers::<Float64Type>(rows, null),
            numbers::<Decimal128Type>(rows, null),
            numbers::<TimestampMicrosecondType>(rows, null),
            Arc::new((0..rows).map(text).collect::<StringArray>()),
            Arc::new((0..rows).map(text).collect::<LargeStringArray>()),
            Arc::new(BinaryArray::from_iter((0..rows).map(bytes))),
            Arc::new(LargeBinaryArray::from_iter((0..rows).map(bytes))),
            Arc::new(
                (0..rows)
                    .map(|i| (!null(i)).then_some(i % 2 == 0))
                    .collect::<BooleanArray>(),
            ),
            Arc::new(list.finish()),
            Arc::new(dict.finish()),
        ]
    }

    proptest! {
        #[test]
        fn a_column_counts_what_its_data_counts_for_every_slice(
            rows in 0usize..200, nulls: bool, from in 0usize..200, len in 0usize..200,
        ) {
            let from = from.min(rows);
            let len = len.min(rows - from);
            for c in columns(rows, nulls) {
                let c = c.slice(from, len);
                let want = c.to_data().get_slice_memory_size().unwrap();
                prop_assert_eq!(column_bytes(c.as_ref()), want, "{:?}", c.data_type());
            }
        }
    }
}
