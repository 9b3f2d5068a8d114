//! `wire_compression`: a producer environment that IPC-compresses what it serializes for
//! readers (LZ4 frame or ZSTD), read by a remote gate in a second environment over loopback
//! TCP and by a local serialized gate. The batches arrive equal, and the bytes sent over the
//! connection shrink for compressible data.

use std::sync::Arc;

use arrow_array::types::Int8Type;
use arrow_array::{
    ArrayRef, DictionaryArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{Field, Schema};
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use creditflow_core::serde::Compression;

mod support;

use support::{env, spec, wait};

const BATCHES: usize = 12;
const ROWS: usize = 4000;

/// Compressible like real columns: keys that climb, few distinct strings, a dictionary, a
/// nullable float, and an odd row count per batch (buffers of unaligned lengths).
fn batch(i: usize) -> RecordBatch {
    let n = ROWS - i * 13;
    let start = (i * ROWS) as i64;
    let modes = ["REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB"];
    let columns: Vec<(&str, ArrayRef)> = vec![
        (
            "key",
            Arc::new(Int64Array::from_iter_values(start..start + n as i64)),
        ),
        (
            "qty",
            Arc::new(Int32Array::from_iter_values(
                (0..n).map(|r| (r * 7 % 50) as i32 + 1),
            )),
        ),
        (
            "price",
            Arc::new(Float64Array::from_iter(
                (0..n).map(|r| (r % 11 != 3).then_some((r % 997) as f64 * 1.25)),
            )),
        ),
        (
            "mode",
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|r| modes[r * 3 % modes.len()]),
            )),
        ),
        (
            "flag",
            Arc::new(
                (0..n)
                    .map(|r| ["A", "N", "R"][r % 3])
                    .collect::<DictionaryArray<Int8Type>>(),
            ),
        ),
    ];
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(name, a)| Field::new(*name, a.data_type().clone(), a.null_count() > 0))
            .collect::<Vec<_>>(),
    ));
    RecordBatch::try_new(schema, columns.into_iter().map(|(_, a)| a).collect()).unwrap()
}

/// Sends [`BATCHES`] batches from an environment with `compression` to a gate in another
/// environment; returns what arrived and the bytes the producer sent over the connection.
fn remote(compression: Option<Compression>, handoff: bool) -> (Vec<RecordBatch>, u64) {
    let producer = env(|c| {
        c.wire_compression = compression;
        c.local_handoff = handoff;
    });
    let consumer = env(|_| {});
    let part = producer.create_partition("p", 1).unwrap();
    let mut gate = consumer.create_input_gate(vec![spec(&producer, "p", 0)]).unwrap();
    let mut w = RecordWriter::new(part.clone(), Partitioner::Forward);
    let writer = std::thread::spawn(move || {
        for i in 0..BATCHES {
            w.write(&batch(i), &mut wait(30)).unwrap();
        }
        w.flush();
        w
    });
    let mut got = Vec::new();
    while got.len() < BATCHES {
        got.push(gate.next(&mut wait(30)).unwrap().expect("a batch before the end"));
    }
    let mut w = writer.join().unwrap();
    // Every batch arrived, so every byte of them was sent; read before the end releases it.
    let sent = part.metrics().subpartitions[0]
        .remote
        .as_ref()
        .expect("a remote reader")
        .bytes_sent;
    w.close().unwrap();
    assert!(
        gate.next(&mut wait(30)).unwrap().is_none(),
        "more than was written"
    );
    (got, sent)
}

fn assert_all_arrived(got: &[RecordBatch]) {
    assert_eq!(got.len(), BATCHES);
    for (i, b) in got.iter().enumerate() {
        assert_eq!(b, &batch(i), "batch {i}");
    }
}

#[test]
fn remote_round_trip_with_each_codec_is_equal_and_sends_fewer_bytes() {
    for handoff in [true, false] {
        let (got, plain) = remote(None, handoff);
        assert_all_arrived(&got);
        for codec in [Compression::Lz4, Compression::Zstd] {
            let (got, sent) = remote(Some(codec), handoff);
            assert_all_arrived(&got);
            assert!(
                sent * 2 < plain,
                "{codec:?} (handoff {handoff}): {sent} bytes sent, uncompressed {plain}"
            );
        }
    }
}

#[test]
fn a_local_serialized_reader_decodes_compressed_records() {
    for codec in [Compression::Lz4, Compression::Zstd] {
        let e = env(|c| {
            c.wire_compression = Some(codec);
            c.local_handoff = false;
        });
        let part = e.create_partition("local", 1).unwrap();
        let mut gate = e.create_input_gate(vec![spec(&e, "local", 0)]).unwrap();
        let writer = std::thread::spawn(move || {
            let mut w = RecordWriter::new(part, Partitioner::Forward);
            for i in 0..BATCHES {
                w.write(&batch(i), &mut wait(30)).unwrap();
            }
            w.close().unwrap();
        });
        let mut got = Vec::new();
        while let Some(b) = gate.next(&mut wait(30)).unwrap() {
            got.push(b);
        }
        writer.join().unwrap();
        assert_all_arrived(&got);
    }
}
