//! The host service with several attached "tasks": in this process (each attachment is a
//! session of its own, as a task's would be) and, in `processes`, in child processes (this
//! test binary run again as one child test), so that a task or the service can be killed.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};

use super::*;
use crate::base::config::ChannelSpec;
use crate::base::error::Error;
use crate::base::wait::Wait;
use crate::env::EnvConfig;
use crate::gate::GateItem;
use crate::host::codec::{Reply, Request};
use crate::partition::spill::SpillKind;
use crate::partition::Partitioner;

mod in_place;
mod processes;

/// A name no other test (or test run) uses.
fn unique(what: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "t{}-{what}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn config(name: &str, memory: usize) -> HostConfig {
    HostConfig {
        env: EnvConfig {
            memory,
            buffer_timeout: Duration::from_millis(5),
            ..EnvConfig::default()
        },
        name: name.to_string(),
        idle_timeout: None,
        link_timeout: LINK_TIMEOUT,
    }
}

fn service(what: &str, memory: usize) -> HostService {
    HostService::start(config(&unique(what), memory)).unwrap()
}

/// A task's own memory in these tests: its writers' heaps hold 16 MiB each.
const TASK_MEMORY: usize = 16 << 20;

fn attach(s: &HostService) -> Attachment {
    Attachment::connect(s.name(), 0, TASK_MEMORY).unwrap()
}

/// `rows` rows of (k, text) with k = first..first + rows; a text of `width` bytes per row.
fn batch(first: i64, rows: usize, width: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("text", DataType::Utf8, false),
    ]));
    let k: ArrayRef = Arc::new(Int64Array::from_iter_values(first..first + rows as i64));
    let t: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..rows).map(|i| format!("{:0width$}", first + i as i64)),
    ));
    RecordBatch::try_new(schema, vec![k, t]).unwrap()
}

fn forever() -> Wait<'static> {
    Wait::timeout(Some(Duration::from_secs(60)), "test")
}

/// Every key a gate yields (checked against its text), by channel, until the gate ends.
fn drain(gate: &mut AttachedGate) -> BTreeMap<usize, Vec<i64>> {
    drain_items(|| gate.next_item(&mut forever()).unwrap())
}

/// [`drain`] of any gate: `next` gives its next item.
fn drain_items(mut next: impl FnMut() -> Option<GateItem>) -> BTreeMap<usize, Vec<i64>> {
    let mut got: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    while let Some(item) = next() {
        if let GateItem::Batch { channel, batch, .. } = item {
            let k = batch.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let t = batch.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            for (k, t) in k.values().iter().zip(t.iter()) {
                assert_eq!(t.unwrap().trim_start_matches('0').parse::<i64>().unwrap_or(0), *k);
            }
            got.entry(channel).or_default().extend(k.values().iter());
        }
    }
    got
}

fn specs(address: &str, partition: &str, subs: usize) -> Vec<ChannelSpec> {
    (0..subs)
        .map(|i| ChannelSpec {
            address: address.to_string(),
            partition_id: partition.to_string(),
            subpartition: i,
        })
        .collect()
}

#[test]
fn a_task_writes_a_partition_the_service_holds_and_another_task_of_the_host_reads_it() {
    let s = service("local", 64 << 20);
    let (a, b) = (attach(&s), attach(&s));
    assert_eq!(a.address(), s.address());
    let p = a.create_partition("p", 2, None, None).unwrap();
    let mut w = p.writer(Partitioner::RoundRobin).unwrap();
    let mut g = b.create_input_gate(specs(s.address(), "p", 2)).unwrap();
    let reader = std::thread::spawn(move || (drain(&mut g), g));
    // Small batches go through the ring, large ones (a few MB) through the heap.
    let mut first = 0;
    let mut sent = Vec::new();
    for (i, rows) in [10usize, 70_000, 3, 200_000, 1, 50_000]
        .into_iter()
        .cycle()
        .take(24)
        .enumerate()
    {
        let width = if i % 3 == 0 { 40 } else { 4 };
        w.write(&batch(first, rows, width), &mut forever()).unwrap();
        sent.extend(first..first + rows as i64);
        first += rows as i64;
    }
    w.close(&mut forever()).unwrap();
    assert!(p.is_finished().unwrap());
    let (got, g) = reader.join().unwrap();
    let mut all: Vec<i64> = got.values().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, sent);
    // Round robin: whole batches alternate between the two subpartitions, in order.
    assert!(got[&0].windows(2).all(|w| w[0] < w[1]) && got[&1].windows(2).all(|w| w[0] < w[1]));
    // Both channels read the service's own partition in place: no connection at all.
    let m = g.metrics().unwrap();
    assert_eq!(m.rows_received as usize, sent.len());
    let sm = s.metrics();
    assert_eq!((sm.connections_opened, sm.connections_served), (0, 0));
    assert_eq!(sm.sessions, 2);
}

#[test]
fn an_attached_writer_writes_whole_batches_to_the_subpartition_it_names() {
    let s = service("write-to", 64 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let p = a.create_partition("p", 3, None, None).unwrap();
    // A hash partitioner on a column the batches lack: write_to never asks it.
    let mut w = p.writer(Partitioner::Hash(vec!["missing".into()])).unwrap();
    let mut g = b.create_input_gate(specs(s.address(), "p", 3)).unwrap();
    let reader = std::thread::spawn(move || drain(&mut g));
    let mut want: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    let mut first = 0;
    for (i, rows) in [5usize, 80_000, 1, 3_000, 120_000, 7].into_iter().enumerate() {
        let sp = [2, 0, 2, 1, 0, 2][i];
        w.write_to(&batch(first, rows, 8), sp, &mut forever()).unwrap();
        want.entry(sp).or_default().extend(first..first + rows as i64);
        first += rows as i64;
    }
    // Out of range: refused here, and the partition goes on.
    let err = w.write_to(&batch(0, 1, 8), 3, &mut forever()).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("subpartition 3 out of range")),
        "{err:?}"
    );
    w.close(&mut forever()).unwrap();
    assert!(p.is_finished().unwrap());
    assert_eq!(reader.join().unwrap(), want);
}

#[test]
fn tasks_on_two_hosts_exchange_over_one_connection_per_pair_of_hosts() {
    let (s1, s2) = (service("h1", 32 << 20), service("h2", 32 << 20));
    let tasks = [attach(&s1), attach(&s1), attach(&s2), attach(&s2)];
    let n = tasks.len();
    // Every task writes a partition of n subpartitions, hashed by k, and reads subpartition
    // i of every partition: an all-to-all exchange between two "hosts".
    let parts: Vec<AttachedPartition> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| t.create_partition(&format!("x{i}"), n, None, None).unwrap())
        .collect();
    let mut gates: Vec<AttachedGate> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let specs = parts
                .iter()
                .enumerate()
                .map(|(j, _)| ChannelSpec {
                    address: tasks[j].address().to_string(),
                    partition_id: format!("x{j}"),
                    subpartition: i,
                })
                .collect();
            t.create_input_gate(specs).unwrap()
        })
        .collect();
    let writers: Vec<_> = parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut w = p.writer(Partitioner::Hash(vec!["k".into()])).unwrap();
            std::thread::spawn(move || {
                for b in 0..20 {
                    w.write(
                        &batch((i * 1_000_000 + b * 5_000) as i64, 5_000, 8),
                        &mut forever(),
                    )
                    .unwrap();
                }
                w.close(&mut forever()).unwrap();
            })
        })
        .collect();
    let readers: Vec<_> = gates
        .drain(..)
        .map(|mut g| std::thread::spawn(move || (drain(&mut g), g)))
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let mut total = 0;
    for r in readers {
        let (got, g) = r.join().unwrap();
        total += got.values().map(Vec::len).sum::<usize>();
        let m = g.metrics().unwrap();
        // The channels from the task's own host read in place; the others over TCP.
        let kinds: Vec<_> = m.channels.iter().map(|c| c.kind.as_str()).collect();
        assert!(kinds.iter().all(|k| *k == "ended"), "{kinds:?}");
    }
    assert_eq!(total, n * 20 * 5_000);
    // Each service read the other's two partitions for two tasks: one connection each way.
    let (m1, m2) = (s1.metrics(), s2.metrics());
    assert_eq!((m1.connections_opened, m1.connections_served), (1, 1), "{m1:?}");
    assert_eq!((m2.connections_opened, m2.connections_served), (1, 1), "{m2:?}");
}

#[test]
fn the_tasks_of_a_host_share_one_pool_redistributed_as_they_come_and_go() {
    // 4 MiB of 32 KiB segments: 128 for the whole host.
    let s = service("memory", 4 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let pa = a.create_partition("a", 10, None, None).unwrap();
    assert_eq!(s.metrics().segments_reserved, 11);
    let alone = pa.metrics().unwrap().pool.share;
    assert_eq!(alone, 128, "alone, a partition may grow to the whole pool");
    let pb = b.create_partition("b", 20, None, None).unwrap();
    assert_eq!(s.metrics().segments_reserved, 11 + 21);
    let (sa, sb) = (pa.metrics().unwrap().pool.share, pb.metrics().unwrap().pool.share);
    assert!(sa < alone && sa + sb <= 128, "{sa} + {sb}");
    // A request past the host's pool fails in the task with the host's numbers.
    match b.create_partition("c", 200, None, None) {
        Err(Error::InsufficientBuffers { required, total, .. }) => assert_eq!((required, total), (201, 128)),
        other => panic!("{:?}", other.map(|p| p.id().to_string())),
    }
    // A gate with remote channels reserves exclusive buffers; the session's end frees them.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let g = b
        .create_input_gate(specs(&silent.local_addr().unwrap().to_string(), "x", 1))
        .unwrap();
    assert_eq!(s.metrics().segments_reserved, 11 + 21 + 3);
    drop(g);
    drop(pb);
    drop(b);
    wait_until(
        || s.metrics().segments_reserved == 11 + 21,
        "the gate's reservation to go",
    );
    pa.release().unwrap();
    assert!(pa.is_released().unwrap());
    assert_eq!(s.metrics().segments_reserved, 21);
    // b's unfinished partition failed with its session; its pool goes once it is released.
    assert!(s.environment().partition("b").unwrap().is_finished());
}

fn wait_until(mut f: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_writer_the_service_holds_back_waits_and_the_data_arrives_whole() {
    // 1 MiB: a partition of 2 subpartitions fills 32 segments, then the link's ring and heap.
    let s = service("backpressure", 1 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let p = a.create_partition("p", 1, None, None).unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    let mut written = 0i64;
    let blocked = loop {
        let mut wait = Wait::timeout(Some(Duration::from_millis(300)), "test");
        match w.write(&batch(written, 10_000, 16), &mut wait) {
            Ok(()) => written += 10_000,
            Err(Error::Timeout(..)) => break written,
            Err(e) => panic!("{e}"),
        }
        assert!(written < 10_000_000, "the writer was never held back");
    };
    // Held back after roughly the pool, the ring and the heap (each batch is ~250 KB).
    assert!(blocked > 0, "nothing went through");
    // The task's partition reports it (the service waits for its pool meanwhile).
    let m = p.metrics().unwrap();
    assert!(m.backpressured_total >= Duration::from_millis(250), "{m:?}");
    assert!(m.backpressured_ms_per_second >= 250.0, "{m:?}");
    let mut g = b.create_input_gate(specs(s.address(), "p", 1)).unwrap();
    let reader = std::thread::spawn(move || drain(&mut g));
    // The timed-out write may or may not have gone out: write on after it.
    let mut next = written;
    for _ in 0..20 {
        w.write(&batch(next, 10_000, 16), &mut forever()).unwrap();
        next += 10_000;
    }
    w.close(&mut forever()).unwrap();
    let got = reader.join().unwrap();
    let keys = &got[&0];
    assert!(
        keys.windows(2).all(|w| w[1] == w[0] + 1 || w[1] == written),
        "in order, nothing lost"
    );
    assert_eq!(*keys.last().unwrap(), next - 1);
}

#[test]
fn small_batches_through_the_ring_arrive_in_order_written_at_once_or_queued_behind_others() {
    // Batches of about 1 KB go through the writer link's ring, not its heap. A reader that
    // pauses lets the ring fill: then frames queue for the link's I/O task, and once it has
    // drained them, go into the ring from the writing thread again; none may overtake another.
    let s = service("ring-order", 4 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let p = a.create_partition("p", 1, None, None).unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    let mut g = b.create_input_gate(specs(s.address(), "p", 1)).unwrap();
    let reader = std::thread::spawn(move || {
        let mut keys: Vec<i64> = Vec::new();
        while let Some(batch) = g.next(&mut forever()).unwrap() {
            let k = batch.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            keys.extend(k.values().iter());
            if keys.len().is_multiple_of(2_000) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        keys
    });
    let (rows, batches) = (40, 3_000i64);
    for i in 0..batches {
        w.write(&batch(i * rows, rows as usize, 16), &mut forever())
            .unwrap();
    }
    w.close(&mut forever()).unwrap();
    let keys = reader.join().unwrap();
    assert_eq!(keys.len() as i64, rows * batches, "every row once");
    assert!(
        keys.iter().enumerate().all(|(i, k)| *k == i as i64),
        "in the order written"
    );
}

#[test]
fn events_barriers_and_failures_reach_the_gate_in_order() {
    let s = service("events", 16 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let p = a.create_partition("e", 2, None, None).unwrap();
    let mut g = b.create_input_gate(specs(s.address(), "e", 2)).unwrap();
    let mut w = p.writer(Partitioner::Broadcast).unwrap();
    w.write(&batch(0, 5, 1), &mut forever()).unwrap();
    w.send_event(None, b"all", &mut forever()).unwrap();
    w.send_event(Some(1), b"one", &mut forever()).unwrap();
    assert_eq!(
        w.broadcast_barrier(7, false, &mut forever()).unwrap(),
        Vec::<usize>::new()
    );
    assert!(
        w.broadcast_barrier(7, false, &mut forever()).is_err(),
        "ids must increase"
    );
    w.write(&batch(5, 5, 1), &mut forever()).unwrap();
    w.fail("the writer gave up", &mut forever()).unwrap();
    // Each channel ends with the failure, after what was written to it before (a channel may
    // report its failure before another delivers its last batch: read on to the end).
    let mut seen = Vec::new();
    let mut errors = Vec::new();
    loop {
        match g.next_item(&mut forever()) {
            Ok(Some(GateItem::Batch { channel, batch, .. })) => {
                seen.push(format!("b{channel}:{}", batch.num_rows()))
            }
            Ok(Some(GateItem::Event { channel, payload })) => {
                seen.push(format!("e{channel}:{}", String::from_utf8(payload).unwrap()))
            }
            Ok(Some(GateItem::Barrier { checkpoint_id, .. })) => seen.push(format!("barrier{checkpoint_id}")),
            Ok(None) => break,
            Ok(other) => panic!("{other:?}"),
            Err(e) => errors.push(e),
        }
    }
    assert_eq!(errors.len(), 2, "{errors:?}");
    for err in &errors {
        assert!(
            matches!(err, Error::ProducerFailed(m) if m.contains("gave up")),
            "{err}"
        );
    }
    let ch = |c: usize| -> Vec<&String> {
        seen.iter()
            .filter(|s| s.starts_with(&format!("b{c}")) || s.starts_with(&format!("e{c}")))
            .collect()
    };
    assert_eq!(ch(0), ["b0:5", "e0:all", "b0:5"]);
    assert_eq!(ch(1), ["b1:5", "e1:all", "e1:one", "b1:5"]);
    // The aligned barrier comes after everything written before it, on both channels.
    let barrier = seen.iter().position(|s| s == "barrier7").expect("the barrier");
    assert_eq!(seen[barrier + 1..].len(), 2, "{seen:?}");
}

#[test]
fn a_writer_dropped_without_closing_fails_its_readers_and_nothing_partial_ends_well() {
    let s = service("dropped", 16 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let p = a.create_partition("d", 1, None, None).unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    w.write(&batch(0, 100, 4), &mut forever()).unwrap();
    drop(w);
    let mut g = b.create_input_gate(specs(s.address(), "d", 1)).unwrap();
    let mut rows = 0;
    let err = loop {
        match g.next(&mut forever()) {
            Ok(Some(batch)) => rows += batch.num_rows(),
            Ok(None) => panic!("a partition whose writer went away ended normally"),
            Err(e) => break e,
        }
    };
    assert_eq!(rows, 100);
    assert!(matches!(err, Error::ProducerFailed(_)), "{err}");
}

#[test]
fn a_gate_read_its_timeout_cuts_short_goes_on_where_it_stopped() {
    // Batches larger than the writer's heap and the gate's come through the gate's ring in
    // ring-sized parts; the reader gives up after a millisecond, often between two parts.
    const ROWS: usize = 400_000;
    let s = service("resume", 128 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let p = a.create_partition("p", 1, None, None).unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    let mut g = b.create_input_gate(specs(s.address(), "p", 1)).unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..3 {
            w.write(&batch((i * ROWS) as i64, ROWS, 40), &mut forever())
                .unwrap();
        }
        w.close(&mut forever()).unwrap();
    });
    let (mut timeouts, mut batches) = (0, 0);
    let got = drain_items(|| loop {
        match g.next_item(&mut Wait::timeout(Some(Duration::from_millis(1)), "test")) {
            Err(Error::Timeout(..)) => timeouts += 1,
            Ok(item) => {
                batches += usize::from(matches!(item, Some(GateItem::Batch { .. })));
                return item;
            }
            Err(e) => panic!("{e}"),
        }
    });
    writer.join().unwrap();
    assert_eq!(got[&0], (0..3 * ROWS as i64).collect::<Vec<i64>>());
    assert_eq!(batches, 3);
    assert!(timeouts > 0, "no read was cut short");
}

#[test]
fn a_gate_can_be_dropped_inside_an_async_runtime() {
    // A gate drives a runtime of its own; letting it go where a runtime runs (a callback on a
    // runtime's thread that drops the last reference) must not panic, and ends its link.
    let s = service("dropped-in-async", 16 << 20);
    let b = attach(&s);
    let before = s.metrics().segments_reserved;
    let mut g = b.create_input_gate(specs(s.address(), "p", 1)).unwrap();
    assert!(s.metrics().segments_reserved > before, "the gate's minimum");
    assert!(matches!(
        g.next_item(&mut Wait::timeout(Some(Duration::from_millis(20)), "test")),
        Err(Error::Timeout(..))
    ));
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async move { drop(g) });
    wait_until(
        || s.metrics().segments_reserved == before,
        "the service to close the gate",
    );
}

#[test]
fn a_session_s_ended_gates_are_not_counted_open_and_keep_their_last_metrics_a_while() {
    // A Spark worker's session outlives its tasks: the gates they end must not pile up in it.
    let s = service("ended-gates", 16 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let mut gates = Vec::new();
    for i in 0..20 {
        let id = format!("p{i}");
        let p = a.create_partition(&id, 1, None, None).unwrap();
        let mut w = p.writer(Partitioner::Forward).unwrap();
        w.write(&batch(0, 10 + i, 4), &mut forever()).unwrap();
        w.close(&mut forever()).unwrap();
        let mut g = b.create_input_gate(specs(s.address(), &id, 1)).unwrap();
        assert_eq!(drain(&mut g)[&0].len(), 10 + i);
        g.close();
        gates.push(g);
    }
    wait_until(
        || s.metrics().gates == 0,
        "the ended gates to stop counting as open",
    );
    // The last ones answer with the metrics they ended with; the oldest are forgotten.
    assert_eq!(gates[19].metrics().unwrap().rows_received, 29);
    assert_eq!(gates[4].metrics().unwrap().rows_received, 14);
    let err = gates[0].metrics().unwrap_err();
    assert!(err.to_string().contains("ended long ago"), "{err}");
}

#[test]
fn a_gate_whose_link_the_task_never_opens_is_dropped_with_its_buffers() {
    // A task that gave up opening its gate's link (it took too long) and lives on: the gate
    // the service made must not hold its buffers (nor keep its channels reading) for the
    // session's life. The gate reads a blocking partition, which other gates may read too.
    let mut c = config(&unique("stale-link"), 16 << 20);
    c.link_timeout = Duration::from_millis(500);
    let s = HostService::start(c).unwrap();
    let (a, b) = (attach(&s), attach(&s));
    let p = a
        .create_partition("p", 1, Some(SpillKind::Blocking), None)
        .unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    w.write(&batch(0, 100, 4), &mut forever()).unwrap();
    w.close(&mut forever()).unwrap();
    let reserved = s.metrics().segments_reserved;
    let asked = b.ask(Request::CreateGate {
        specs: specs(s.address(), "p", 1),
    });
    assert!(matches!(asked.unwrap(), Reply::Link { .. }));
    let m = s.metrics();
    assert_eq!(m.gates, 1);
    assert!(m.segments_reserved > reserved, "the gate reserved its buffers");
    wait_until(
        || s.metrics().gates == 0,
        "the gate whose link never came to be dropped",
    );
    // Its buffers are given back (the writer's may have been too).
    assert!(s.metrics().segments_reserved <= reserved);
    // The session goes on: a gate it opens reads every row.
    let mut g = b.create_input_gate(specs(s.address(), "p", 1)).unwrap();
    assert_eq!(drain(&mut g)[&0], (0..100).collect::<Vec<i64>>());
}

#[test]
fn a_finished_blocking_partition_outlives_its_task_and_is_read_twice() {
    let s = service("blocking", 8 << 20);
    let name = s.name().to_string();
    {
        let a = Attachment::connect(&name, 0, TASK_MEMORY).unwrap();
        let p = a
            .create_partition("bl", 1, Some(SpillKind::Blocking), None)
            .unwrap();
        let mut w = p.writer(Partitioner::Forward).unwrap();
        for i in 0..40 {
            w.write(&batch(i * 10_000, 10_000, 20), &mut forever()).unwrap();
        }
        w.close(&mut forever()).unwrap();
        // The task goes; its finished partition stays.
    }
    wait_until(|| s.metrics().sessions == 0, "the task's session to end");
    for _ in 0..2 {
        let b = attach(&s);
        let mut g = b.create_input_gate(specs(s.address(), "bl", 1)).unwrap();
        let got = drain(&mut g);
        assert_eq!(got[&0], (0..400_000).collect::<Vec<i64>>());
    }
}

#[test]
fn the_service_ends_when_idle_or_when_its_owners_are_gone() {
    let mut c = config(&unique("idle"), 4 << 20);
    c.idle_timeout = Some(Duration::from_millis(200));
    let s = HostService::start(c).unwrap();
    let why = s.wait(&mut forever()).unwrap();
    assert!(why.contains("no task attached"), "{why}");
    s.close();
    // Its name is free again.
    let again = HostService::start(config(s.name(), 4 << 20)).unwrap();
    assert!(
        HostService::start(config(s.name(), 4 << 20)).is_err(),
        "one service per name"
    );
    drop(again);

    let s = service("owners", 4 << 20);
    let mut owner = Command::new("sleep").arg("60").spawn().unwrap();
    let t = Attachment::connect(s.name(), owner.id(), TASK_MEMORY).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        s.wait(&mut Wait::timeout(Some(Duration::ZERO), "test")).is_err(),
        "ended early"
    );
    owner.kill().unwrap();
    owner.wait().unwrap();
    let why = s.wait(&mut forever()).unwrap();
    assert!(why.contains("ended"), "{why}");
    drop(t);
}
