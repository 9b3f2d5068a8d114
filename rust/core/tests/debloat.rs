//! Buffer debloating end to end: a consumer at a tenth of its producer's rate makes its gate
//! announce a smaller buffer size, and the producer's buffers shrink to it, over TCP and
//! between a partition and a gate of one environment; with debloating off nothing changes.
//! Also: how a handed-off batch is counted at a debloated size, bad settings, and a writer
//! deadlock that small buffers exposed.
//!
//! Rates are paced by the test (sleeps between batches), so the consumer is the bottleneck
//! whatever the machine's load; the assertions compare sizes with wide margins (a factor of
//! two or more), never times.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use creditflow_core::base::config::ChannelSpec;
use creditflow_core::base::wait::Wait;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::gate::GateMetrics;
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use creditflow_core::partition::PartitionMetrics;
use creditflow_core::Error;

mod support;

use support::{spec, wait};

const SEG: usize = 32 << 10;
const CHANNELS: usize = 4;
/// Batches the consumer takes per second; the producer writes ten times as many.
const CONSUMER_RATE: f64 = 30.0;
const PRODUCER_RATE: f64 = 10.0 * CONSUMER_RATE;
/// Rows per batch: about 24 KB serialized, so a batch spans several debloated buffers.
const ROWS: usize = 1000;
/// Buffers debloating sizes for: `CHANNELS` × 2 exclusive + 8 floating.
const BUFFERS: usize = CHANNELS * 2 + 8;
/// When the bytes per buffer are measured (the old, full-size buffers have drained by then).
const WINDOW: (Duration, Duration) = (Duration::from_millis(2500), Duration::from_millis(4000));

fn batch(start: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("s", DataType::Utf8, false),
    ]));
    let k = Int64Array::from_iter_values(start..start + ROWS as i64);
    let s = StringArray::from_iter_values((0..ROWS).map(|i| format!("value-{:06}", start + i as i64)));
    RecordBatch::try_new(schema, vec![Arc::new(k), Arc::new(s)]).unwrap()
}

/// Small pools (so the producer's queue drains in well under the measuring window's start)
/// and a 100 ms target (so a consumer of ~700 KB/s gets buffers of a few KiB).
fn config(debloat: bool, handoff: bool, memory: usize) -> EnvConfig {
    EnvConfig {
        memory,
        segment_size: SEG,
        local_handoff: handoff,
        debloat,
        debloat_target: Duration::from_millis(100),
        ..EnvConfig::default()
    }
}

/// Data bytes and buffers that went to the readers of every subpartition: sent over TCP for
/// remote readers, taken from the queue for local ones.
fn sent(m: &PartitionMetrics) -> (u64, u64) {
    m.subpartitions
        .iter()
        .fold((0, 0), |(bytes, bufs), s| match &s.remote {
            Some(r) => (bytes + r.bytes_sent, bufs + r.buffers_sent),
            None => (bytes + s.bytes_out, bufs + s.buffers_out),
        })
}

struct Outcome {
    /// The gate's debloating metrics at the end of the window (`None`: off).
    gate: GateMetrics,
    /// Mean bytes per data buffer the producer sent during the window.
    bytes_per_buffer: f64,
}

/// A producer writing round robin to `CHANNELS` subpartitions at `PRODUCER_RATE` batches a
/// second, a gate reading them at `CONSUMER_RATE`, in two environments (over TCP) or one.
fn slow_consumer(remote: bool, debloat: bool) -> Outcome {
    // Local channels read serialized buffers (a handed-off batch is one "buffer" whatever
    // its size); remote ones get handed-off batches cut by the sender.
    let producer = NetworkEnvironment::new(config(debloat, remote, 256 << 10)).unwrap();
    let consumer = remote.then(|| NetworkEnvironment::new(config(debloat, true, 4 << 20)).unwrap());
    let gate_env = consumer.as_ref().unwrap_or(&producer);
    let part = producer.create_partition("p", CHANNELS).unwrap();
    let mut gate = gate_env.create_input_gate(every_channel(&producer)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let part = part.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut w = RecordWriter::new(part, Partitioner::RoundRobin);
            let mut due = Instant::now();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                w.write(&batch(i * ROWS as i64), &mut wait(30)).unwrap();
                i += 1;
                pace(&mut due, PRODUCER_RATE);
            }
            w.close().unwrap();
        })
    };
    let start = Instant::now();
    let mut due = start;
    let mut first = None;
    let outcome = loop {
        let b = match gate.next(&mut wait(30)) {
            Ok(b) => b.expect("the producer ends only after the window"),
            Err(e) => panic!("{e}: {:#?}\n{:#?}", part.metrics(), gate.metrics()),
        };
        assert_eq!(b.num_rows(), ROWS);
        let now = start.elapsed();
        if first.is_none() && now >= WINDOW.0 {
            first = Some(sent(&part.metrics()));
        }
        if now >= WINDOW.1 {
            let (b0, n0) = first.expect("window start seen");
            let (b1, n1) = sent(&part.metrics());
            assert!(n1 > n0 + 10, "only {} buffers sent in the window", n1 - n0);
            break Outcome {
                gate: gate.metrics(),
                bytes_per_buffer: (b1 - b0) as f64 / (n1 - n0) as f64,
            };
        }
        pace(&mut due, CONSUMER_RATE);
    };
    stop.store(true, Ordering::SeqCst);
    // Drain at full speed to the end.
    while gate.next(&mut wait(30)).unwrap().is_some() {}
    writer.join().unwrap();
    outcome
}

/// One channel per subpartition of partition "p" of `producer`.
fn every_channel(producer: &NetworkEnvironment) -> Vec<ChannelSpec> {
    (0..CHANNELS).map(|i| spec(producer, "p", i)).collect()
}

/// Sleeps so that calls come at most `rate` times a second. A caller that fell behind (a
/// slow start, a loaded machine) does not catch up in a burst, so the rate never exceeds it.
fn pace(due: &mut Instant, rate: f64) {
    let now = Instant::now();
    *due = (*due).max(now) + Duration::from_secs_f64(1.0 / rate);
    std::thread::sleep(*due - now);
}

fn check_debloated(o: &Outcome) {
    let d = o.gate.debloat.expect("debloating is on");
    eprintln!(
        "throughput {:.0} B/s, announced {} B, {:.0} B per buffer sent",
        d.throughput, d.buffer_size, o.bytes_per_buffer
    );
    // ~30 batches of ~24 KB a second over 16 buffers for 100 ms: a few KiB.
    let expected = d.throughput * 0.1 / BUFFERS as f64;
    assert!(d.throughput > 100e3, "throughput {} B/s", d.throughput);
    assert!(d.buffer_size <= SEG / 4, "announced {} bytes", d.buffer_size);
    assert!(
        (d.buffer_size as f64) < 2.0 * expected.max(256.0),
        "announced {} bytes, expected about {expected:.0}",
        d.buffer_size
    );
    assert!(
        o.bytes_per_buffer <= 1.5 * d.buffer_size as f64,
        "{:.0} bytes per buffer sent, announced {}",
        o.bytes_per_buffer,
        d.buffer_size
    );
}

#[test]
fn a_slow_remote_consumer_shrinks_its_producers_buffers() {
    let on = slow_consumer(true, true);
    check_debloated(&on);
}

#[test]
fn a_slow_local_consumer_shrinks_its_producers_buffers() {
    let on = slow_consumer(false, true);
    check_debloated(&on);
}

#[test]
fn without_debloating_buffers_stay_whole() {
    for remote in [true, false] {
        let off = slow_consumer(remote, false);
        assert!(off.gate.debloat.is_none());
        // Remote: one frame per handed-off batch (~24 KB); local: full serialized segments.
        assert!(
            off.bytes_per_buffer > (SEG / 3) as f64,
            "remote={remote}: {:.0} bytes per buffer",
            off.bytes_per_buffer
        );
    }
}

#[test]
fn invalid_debloat_settings_are_refused_with_the_setting_named() {
    for (cfg, needle) in [
        (
            EnvConfig {
                debloat_target: Duration::ZERO,
                ..EnvConfig::default()
            },
            "debloat_target",
        ),
        (
            EnvConfig {
                debloat_min_buffer: 0,
                ..EnvConfig::default()
            },
            "debloat_min_buffer",
        ),
        (
            EnvConfig {
                debloat_min_buffer: 64 << 10,
                ..EnvConfig::default()
            },
            "debloat_min_buffer",
        ),
    ] {
        match NetworkEnvironment::new(cfg) {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains(needle), "{msg}"),
            Err(e) => panic!("expected InvalidArgument, got {e}"),
            Ok(_) => panic!("accepted an invalid {needle}"),
        }
    }
}

/// Regression: with every subpartition holding a half-filled buffer, a record needing a few
/// small (debloated) buffers must not wait for more segments than can ever be free. The
/// writer used to reserve `needed <= share / 2` segments at once, but the other
/// subpartitions' open buffers hold theirs until more is written there: a pool of 6 with 4
/// open buffers has at most 2 free, so a record needing 3 waited forever.
#[test]
fn a_record_of_a_few_small_buffers_does_not_wait_for_segments_held_by_open_buffers() {
    use creditflow_core::serde::BatchEncoder;
    const SMALL_SEG: usize = 4096;
    let env = NetworkEnvironment::new(EnvConfig {
        memory: 8 * SMALL_SEG,
        segment_size: SMALL_SEG,
        local_handoff: false,
        buffer_timeout: Duration::from_secs(3600),
        ..EnvConfig::default()
    })
    .unwrap();
    let part = env.create_partition("p", CHANNELS).unwrap();
    let mut gate = env.create_input_gate(every_channel(&env)).unwrap();
    assert_eq!(part.pool().stats().share, 6, "the scenario needs a share of 6");
    // Subpartition 0's stream: a tiny first record (with the schema), then the big one.
    let tiny = |i: i64| {
        let b = batch(i * ROWS as i64);
        b.slice(0, 4)
    };
    let big = batch(1_000_000).slice(0, 150);
    let mut enc = BatchEncoder::new(&tiny(0).schema()).unwrap();
    let first = enc.encode(&tiny(0)).unwrap().len();
    let second = enc.encode(&big).unwrap().len();
    let beyond = second - (SMALL_SEG - first); // bytes past the open buffer
    let size = beyond.div_ceil(3); // so that exactly 3 more buffers are needed
    assert_eq!(beyond.div_ceil(size), 3);
    let writer = {
        let part = part.clone();
        std::thread::spawn(move || -> creditflow_core::Result<()> {
            let mut w = RecordWriter::new(part.clone(), Partitioner::RoundRobin);
            let mut wait = Wait::timeout(Some(Duration::from_secs(10)), "writer");
            for i in 0..CHANNELS as i64 {
                w.write(&tiny(i), &mut wait)?; // one open buffer per subpartition
            }
            part.subpartition(0)?.set_buffer_size(size);
            w.write(&big, &mut wait)?; // round robin: subpartition 0 again
            w.close()
        })
    };
    let mut rows = 0;
    let mut read = Wait::timeout(Some(Duration::from_secs(20)), "reader");
    while let Some(b) = gate.next(&mut read).unwrap() {
        rows += b.num_rows();
    }
    writer.join().unwrap().unwrap();
    assert_eq!(rows, CHANNELS * 4 + 150);
}

/// A batch handed off to a local reader counts against the partition's pool as the buffers
/// it would fill at the announced size, not at whole segments: the bytes a debloated
/// subpartition queues shrink with the buffer size.
#[test]
fn a_handed_off_batch_counts_as_buffers_of_the_announced_size() {
    let env = NetworkEnvironment::new(config(false, true, 16 << 20)).unwrap();
    let part = env.create_partition("p", 2).unwrap();
    let b = batch(0);
    let bytes = b.get_array_memory_size();
    assert!(bytes < SEG, "the batch fits one segment ({bytes} bytes)");
    part.subpartition(1).unwrap().set_buffer_size(1024);
    let mut w = RecordWriter::new(part.clone(), Partitioner::RoundRobin);
    w.write(&b, &mut wait(30)).unwrap(); // subpartition 0: whole segments
    assert_eq!(part.metrics().pool.in_use, 1);
    w.write(&b, &mut wait(30)).unwrap(); // subpartition 1: 1 KiB buffers
    assert_eq!(part.metrics().pool.in_use, 1 + bytes.div_ceil(1024));
}
