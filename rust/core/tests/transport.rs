//! Two environments in one process talking over loopback TCP.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use creditflow_core::base::config::FlowControl;
use creditflow_core::base::config::{Backoff, ChannelSpec};
use creditflow_core::base::error::Error;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;

mod support;

use support::{spec, wait};

fn env(cfg: impl FnOnce(&mut EnvConfig)) -> NetworkEnvironment {
    let mut c = EnvConfig::default();
    cfg(&mut c);
    NetworkEnvironment::new(c).unwrap()
}

fn batch(start: i64, n: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("s", DataType::Utf8, true),
    ]));
    let k = Int64Array::from_iter_values(start..start + n as i64);
    let s = StringArray::from_iter((0..n).map(|i| {
        if i % 7 == 0 {
            None
        } else {
            Some(format!("row-{}", start + i as i64))
        }
    }));
    RecordBatch::try_new(schema, vec![Arc::new(k), Arc::new(s)]).unwrap()
}

fn exchange(handoff: bool, flow: FlowControl, subs: usize, batches: usize, rows: usize) {
    let producer = env(|c| {
        c.local_handoff = handoff;
        c.flow_control = flow;
        c.memory = 4 << 20;
    });
    let consumer = env(|c| {
        c.flow_control = flow;
        c.memory = 4 << 20;
    });
    let part = producer.create_partition("p", subs).unwrap();
    let specs: Vec<ChannelSpec> = (0..subs).map(|i| spec(&producer, "p", i)).collect();
    let mut gate = consumer.create_input_gate(specs).unwrap();
    let writer = std::thread::spawn(move || {
        let mut w = RecordWriter::new(part, Partitioner::RoundRobin);
        for b in 0..batches {
            w.write(&batch((b * rows) as i64, rows), &mut wait(30)).unwrap();
        }
        w.close().unwrap();
    });
    let mut seen = vec![false; batches * rows];
    let mut total = 0;
    while let Some(b) = gate.next(&mut wait(30)).unwrap() {
        let k = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        for v in k.values() {
            assert!(!seen[*v as usize], "row {v} twice");
            seen[*v as usize] = true;
        }
        total += b.num_rows();
    }
    writer.join().unwrap();
    assert_eq!(total, batches * rows);
    gate.close();
    let m = consumer.metrics();
    assert_eq!(m.segments_available, m.segments_total, "consumer leaked segments");
}

#[test]
fn handoff_batches_cross_tcp() {
    exchange(true, FlowControl::Credit, 3, 40, 5000);
}

#[test]
fn serialized_buffers_cross_tcp() {
    exchange(false, FlowControl::Credit, 3, 40, 5000);
}

#[test]
fn tcp_mode_exchange() {
    exchange(true, FlowControl::Tcp, 2, 20, 5000);
}

#[test]
fn partition_registered_later_is_served() {
    let producer = env(|c| {
        c.request_backoff = Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_secs(2),
        }
    });
    let consumer = env(|c| {
        c.request_backoff = Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_secs(2),
        }
    });
    let spec = spec(&producer, "late", 0);
    let mut gate = consumer.create_input_gate(vec![spec]).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let part = producer.create_partition("late", 1).unwrap();
    let mut w = RecordWriter::new(part, Partitioner::Forward);
    w.write(&batch(0, 10), &mut wait(5)).unwrap();
    w.close().unwrap();
    assert_eq!(gate.next(&mut wait(5)).unwrap().unwrap().num_rows(), 10);
    assert!(gate.next(&mut wait(5)).unwrap().is_none());
}

#[test]
fn missing_partition_fails_after_backoff() {
    let producer = env(|_| {});
    let consumer = env(|c| {
        c.request_backoff = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(80),
        }
    });
    let spec = spec(&producer, "never", 0);
    let mut gate = consumer.create_input_gate(vec![spec]).unwrap();
    let t = Instant::now();
    let err = gate.next(&mut wait(5)).unwrap_err();
    assert!(
        matches!(err, Error::PartitionNotFound(ref id) if id == "never"),
        "{err}"
    );
    assert!(t.elapsed() >= Duration::from_millis(10 + 20 + 40 + 80));
}

#[test]
fn wrong_secret_is_refused() {
    let producer = env(|c| c.secret = Some(b"right".to_vec()));
    let consumer = env(|c| c.secret = Some(b"wrong".to_vec()));
    producer.create_partition("p", 1).unwrap();
    let spec = spec(&producer, "p", 0);
    let mut gate = consumer.create_input_gate(vec![spec]).unwrap();
    let err = gate.next(&mut wait(5)).unwrap_err();
    assert!(matches!(err, Error::Authentication(_)), "{err}");
}

#[test]
fn missing_secret_is_refused() {
    let producer = env(|c| c.secret = Some(b"right".to_vec()));
    let consumer = env(|_| {});
    producer.create_partition("p", 1).unwrap();
    let spec = spec(&producer, "p", 0);
    let mut gate = consumer.create_input_gate(vec![spec]).unwrap();
    let err = gate.next(&mut wait(5)).unwrap_err();
    assert!(matches!(err, Error::Authentication(_)), "{err}");
}

#[test]
fn producer_going_away_fails_the_gate() {
    let producer = env(|_| {});
    let consumer = env(|_| {});
    let part = producer.create_partition("p", 1).unwrap();
    let spec = spec(&producer, "p", 0);
    let mut gate = consumer.create_input_gate(vec![spec]).unwrap();
    let mut w = RecordWriter::new(part, Partitioner::Forward);
    w.write(&batch(0, 10), &mut wait(5)).unwrap();
    w.flush();
    assert_eq!(gate.next(&mut wait(5)).unwrap().unwrap().num_rows(), 10);
    producer.close();
    let t = Instant::now();
    let err = gate.next(&mut wait(5)).unwrap_err();
    assert!(matches!(err, Error::ConnectionLost(_)), "{err}");
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[test]
fn closing_the_producer_right_after_its_writer_still_delivers_everything() {
    for rows in [1_000, 200_000] {
        let producer = env(|_| {});
        let consumer = env(|_| {});
        let part = producer.create_partition("p", 1).unwrap();
        let spec = spec(&producer, "p", 0);
        let mut gate = consumer.create_input_gate(vec![spec]).unwrap();
        let (first_tx, first_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut total = 0;
            while let Some(b) = gate.next(&mut wait(20)).unwrap() {
                total += b.num_rows();
                let _ = first_tx.send(());
            }
            total
        });
        let mut w = RecordWriter::new(part, Partitioner::Forward);
        w.write(&batch(0, rows), &mut wait(10)).unwrap();
        w.flush();
        // The consumer is attached; now queue more than the channel's credit and close at once.
        first_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        for i in 1..6 {
            w.write(&batch(i * rows as i64, rows), &mut wait(10)).unwrap();
        }
        w.close().unwrap();
        producer.close();
        assert_eq!(reader.join().unwrap(), 6 * rows);
    }
}

/// A producer with a remote and a local reader (`handoff`: batches handed over locally) that
/// writes, lets the remote gate take a batch, finishes its partition (`finish`), fails it
/// with `failure` (if any) and releases it, as a rule before the readers have all of it; the
/// error each reader raises (`None`: a reader of a finished partition that had all of it, end
/// included, before the release, checked here), and how long they took to raise them.
fn readers_cut_off_by_a_release(
    handoff: bool,
    finish: bool,
    failure: Option<&str>,
) -> (Vec<Option<Error>>, Duration) {
    let producer = env(|c| c.local_handoff = handoff);
    let consumer = env(|_| {});
    let part = producer.create_partition("early", 3).unwrap();
    let mut remote = consumer
        .create_input_gate(vec![spec(&producer, "early", 0), spec(&producer, "early", 1)])
        .unwrap();
    let mut local = producer
        .create_input_gate(vec![spec(&producer, "early", 2)])
        .unwrap();
    let mut w = RecordWriter::new(part.clone(), Partitioner::RoundRobin);
    for i in 0..6 {
        w.write(&batch(i * 100, 100), &mut wait(5)).unwrap();
    }
    w.flush();
    // The remote gate has something of each channel; then the producer goes.
    assert_eq!(remote.next(&mut wait(5)).unwrap().unwrap().num_rows(), 100);
    if finish {
        part.finish().unwrap();
    }
    if let Some(message) = failure {
        part.fail(message);
    }
    part.release();
    let started = Instant::now();
    // Rows of each gate's channels: the remote gate's first batch is read already.
    let errors = [(&mut remote, 300), (&mut local, 200)]
        .into_iter()
        .map(|(gate, rows)| {
            let mut got = 0;
            loop {
                match gate.next(&mut wait(5)) {
                    Ok(Some(b)) => got += b.num_rows(),
                    Ok(None) => {
                        assert!(
                            finish && got == rows,
                            "a reader cut off by the release ended as if it had it whole ({got} of {rows} rows)"
                        );
                        break None;
                    }
                    Err(e) => break Some(e),
                }
            }
        })
        .collect();
    (errors, started.elapsed())
}

/// A producer that releases its partition before the end: every attached reader, remote or
/// in the same environment, mid-stream or not yet read, fails with `ProducerFailed` at once
/// instead of waiting for an end that will not come.
#[test]
fn readers_of_a_partition_released_before_its_end_fail_promptly() {
    for handoff in [true, false] {
        let (errors, took) = readers_cut_off_by_a_release(handoff, false, None);
        // Unfinished: no reader can have had all of it (the helper checks).
        for err in errors.into_iter().flatten() {
            assert!(
                matches!(&err, Error::ProducerFailed(m) if m.contains("released by its producer")),
                "{err:?}"
            );
        }
        assert!(took < Duration::from_secs(4), "{took:?}");
    }
}

/// A producer that fails its partition and then releases it (a task whose own work broke),
/// whether or not it had finished writing: readers it cuts off, remote or local, fail with
/// that failure's message, the cause, not with the release's (a reader of a finished partition
/// that had all of it before the release ends well).
#[test]
fn readers_of_a_partition_failed_then_released_get_the_failure_s_message() {
    for (handoff, finish) in [(true, false), (false, false), (true, true), (false, true)] {
        let (errors, _) = readers_cut_off_by_a_release(handoff, finish, Some("the user's function broke"));
        for err in errors.into_iter().flatten() {
            assert!(
                matches!(&err, Error::ProducerFailed(m) if m.contains("the user's function broke")),
                "{err:?}"
            );
        }
    }
}
