//! Record bytes end to end (protocol version 3): a gate whose consumer falls behind
//! holds at most its record budget plus one record, over TCP, whatever the batch size; a
//! batch larger than the whole budget still goes through; every batch arrives in order.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;

mod support;

use support::{spec, wait};

const CHANNELS: usize = 4;
const PER_CHANNEL: i64 = 3;

fn batch(tag: i64, rows: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
    RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from_iter_values(std::iter::repeat_n(
            tag, rows,
        )))],
    )
    .unwrap()
}

/// `CHANNELS` remote channels of `rows`-row batches into a gate of `memory` bytes whose
/// consumer sleeps between batches; returns (record budget, peak record bytes, batch bytes).
fn slow_consumer(memory: usize, rows: usize) -> (u64, u64, u64) {
    let producer = NetworkEnvironment::new(EnvConfig {
        memory: 64 << 20,
        ..EnvConfig::default()
    })
    .unwrap();
    let consumer = NetworkEnvironment::new(EnvConfig {
        memory,
        ..EnvConfig::default()
    })
    .unwrap();
    let part = producer.create_partition("p", CHANNELS).unwrap();
    let specs = (0..CHANNELS).map(|i| spec(&producer, "p", i)).collect();
    let mut gate = consumer.create_input_gate(specs).unwrap();
    let writer = std::thread::spawn(move || {
        let mut w = RecordWriter::new(part, Partitioner::RoundRobin);
        for seq in 0..CHANNELS as i64 * PER_CHANNEL {
            w.write(&batch(seq, rows), &mut wait(60)).unwrap();
        }
        w.close().unwrap();
    });
    let mut next = (0..CHANNELS as i64).collect::<Vec<_>>();
    let mut got = 0;
    while let Some(b) = gate.next(&mut wait(60)).unwrap() {
        let v = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let seq = v.value(0);
        let ch = seq as usize % CHANNELS;
        assert_eq!(seq, next[ch], "in order per channel");
        assert_eq!((b.num_rows(), v.value(rows - 1)), (rows, seq));
        next[ch] += CHANNELS as i64;
        got += 1;
        // The consumer falls behind: without the budget, records would pile up meanwhile.
        std::thread::sleep(Duration::from_millis(100));
    }
    writer.join().unwrap();
    assert_eq!(got, CHANNELS as i64 * PER_CHANNEL, "every batch once");
    let r = gate.metrics().remote.expect("remote channels");
    assert_eq!(r.record_bytes, 0, "nothing left held");
    (r.record_budget, r.record_bytes_peak, (rows * 8) as u64)
}

/// `memory` less the most the gate's segments can take (`CHANNELS` × 2 exclusive + 8
/// floating segments of 32 KiB).
fn expected_budget(memory: usize) -> u64 {
    (memory - (CHANNELS * 2 + 8) * (32 << 10)) as u64
}

#[test]
fn batches_larger_than_the_budget_go_through_one_at_a_time() {
    // 8 MB batches into a gate of 4 MiB: each batch alone exceeds the budget.
    let budget = expected_budget(4 << 20);
    let (reported, peak, batch) = slow_consumer(4 << 20, 1 << 20);
    assert!(budget < batch);
    assert!(peak >= batch, "a record was held");
    assert!(
        peak < budget + batch + 4096,
        "peak {peak} > budget {budget} + one batch {batch}"
    );
    assert_eq!(reported, budget);
}

#[test]
fn small_batches_fill_the_budget_but_not_more() {
    // 512 KB batches into a gate of 2 MiB: a few at a time, never the whole stream.
    let budget = expected_budget(2 << 20);
    let (reported, peak, batch) = slow_consumer(2 << 20, 64 << 10);
    assert!(
        peak < budget + batch + 4096,
        "peak {peak} > budget {budget} + one batch {batch}"
    );
    assert_eq!(reported, budget);
}
