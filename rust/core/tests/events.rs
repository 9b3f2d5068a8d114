//! In-band events and checkpoint barriers, local and over loopback TCP.
//!
//! Every batch carries its write stamp `t` (key column = `t * ROWS ..`), every user event
//! its stamp as payload, so each test can check order and exactly-once delivery.

use std::sync::Arc;
use std::time::Duration;

use creditflow_core::base::error::Error;
use creditflow_core::base::wait::Wait;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::gate::{GateItem, InputGate};
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use creditflow_core::partition::ResultPartition;

mod support;

use support::{env, spec, stamp, stamped, wait};

const ROWS: usize = 500;

#[derive(Clone, Copy, Debug)]
enum Where {
    /// Same environment, batches handed over.
    Handoff,
    /// Same environment, serialized into segments.
    Serialized,
    /// Another environment, over TCP.
    Remote,
}

const ALL: [Where; 3] = [Where::Handoff, Where::Serialized, Where::Remote];

/// A producer environment, the consumer environment (the same one when local), a partition
/// of `subs` subpartitions and a gate reading all of them.
struct Setup {
    _producer: Arc<NetworkEnvironment>,
    _consumer: Arc<NetworkEnvironment>,
    part: Arc<ResultPartition>,
    gate: InputGate,
}

fn setup(w: Where, subs: usize, cfg: impl Fn(&mut EnvConfig)) -> Setup {
    let producer = Arc::new(env(|c| {
        c.local_handoff = matches!(w, Where::Handoff);
        cfg(c)
    }));
    let consumer = match w {
        Where::Remote => Arc::new(env(&cfg)),
        _ => producer.clone(),
    };
    let part = producer.create_partition("p", subs).unwrap();
    let specs = (0..subs).map(|i| spec(&producer, "p", i)).collect();
    let gate = consumer.create_input_gate(specs).unwrap();
    Setup {
        _producer: producer,
        _consumer: consumer,
        part,
        gate,
    }
}

/// Everything a gate yields, until the end.
fn drain(gate: &mut InputGate, pause: Duration) -> Vec<GateItem> {
    let mut out = Vec::new();
    while let Some(item) = gate.next_item(&mut wait(60)).unwrap() {
        out.push(item);
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    out
}

#[test]
fn events_keep_their_order_with_batches_on_every_channel() {
    for w in ALL {
        let subs = 3;
        let mut s = setup(w, subs, |_| {});
        let part = s.part.clone();
        let writer = std::thread::spawn(move || {
            let mut wr = RecordWriter::new(part, Partitioner::RoundRobin);
            // What each subpartition must see, in order: ("b", t) or ("e", t).
            let mut expected: Vec<Vec<(char, usize)>> = vec![Vec::new(); subs];
            let mut rr = 0;
            for t in 0..60usize {
                match t % 5 {
                    0 => {
                        wr.broadcast_event(&t.to_le_bytes()).unwrap();
                        for e in expected.iter_mut() {
                            e.push(('e', t));
                        }
                    }
                    3 => {
                        let sp = t % subs;
                        wr.emit_event(&t.to_le_bytes(), sp).unwrap();
                        expected[sp].push(('e', t));
                    }
                    _ => {
                        wr.write(&stamped(t, ROWS), &mut wait(30)).unwrap();
                        expected[rr].push(('b', t));
                        rr = (rr + 1) % subs;
                    }
                }
            }
            wr.close().unwrap();
            expected
        });
        let items = drain(&mut s.gate, Duration::ZERO);
        let expected = writer.join().unwrap();
        let mut got: Vec<Vec<(char, usize)>> = vec![Vec::new(); subs];
        for item in items {
            match item {
                GateItem::Batch {
                    channel,
                    batch,
                    in_flight,
                    ..
                } => {
                    assert!(in_flight.is_empty());
                    got[channel].push(('b', stamp(&batch)));
                }
                GateItem::Event { channel, payload } => {
                    got[channel].push(('e', usize::from_le_bytes(payload.try_into().unwrap())));
                }
                other => panic!("{w:?}: unexpected {other:?}"),
            }
        }
        assert_eq!(got, expected, "{w:?}");
    }
}

#[test]
fn oversized_events_and_non_increasing_barrier_ids_are_refused() {
    let s = setup(Where::Handoff, 2, |_| {});
    let mut wr = RecordWriter::new(s.part.clone(), Partitioner::RoundRobin);
    let max = creditflow_core::base::event::MAX_EVENT_PAYLOAD_LEN;
    wr.broadcast_event(&vec![1; max]).unwrap();
    let e = wr.broadcast_event(&vec![1; max + 1]).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("16384"),
        "{e}"
    );
    let e = wr.emit_event(b"x", 2).unwrap_err();
    assert!(matches!(e, Error::SubpartitionOutOfRange { .. }), "{e}");
    wr.broadcast_barrier(5, false).unwrap();
    for id in [5, 4] {
        let e = wr.broadcast_barrier(id, true).unwrap_err();
        assert!(e.to_string().contains("must increase"), "{e}");
    }
    wr.close().unwrap();
    assert!(matches!(wr.broadcast_event(b"x").unwrap_err(), Error::Closed(_)));
}

/// Aligned barriers every `every` batches, a consumer slower than the producer: each barrier
/// comes out once, in order, with exactly the batches written before it ahead of it.
fn aligned_run(w: Where, subs: usize, batches: usize, every: usize, pause: Duration) {
    aligned_run_with(w, subs, batches, every, pause, |_| {});
}

fn aligned_run_with(
    w: Where,
    subs: usize,
    batches: usize,
    every: usize,
    pause: Duration,
    cfg: impl Fn(&mut EnvConfig),
) {
    let mut s = setup(w, subs, |c| {
        c.memory = 2 << 20;
        cfg(c)
    });
    let part = s.part.clone();
    let writer = std::thread::spawn(move || {
        let mut wr = RecordWriter::new(part, Partitioner::RoundRobin);
        for t in 0..batches {
            if t > 0 && t % every == 0 {
                wr.broadcast_barrier((t / every) as u64, false).unwrap();
            }
            wr.write(&stamped(t, ROWS), &mut wait(60)).unwrap();
        }
        wr.close().unwrap();
    });
    let items = drain(&mut s.gate, pause);
    writer.join().unwrap();
    let mut epoch = 0u64;
    let mut seen = vec![false; batches];
    for item in items {
        match item {
            GateItem::Batch { batch, .. } => {
                let t = stamp(&batch);
                assert!(!seen[t], "{w:?}: batch {t} twice");
                seen[t] = true;
                assert_eq!(
                    (t / every) as u64,
                    epoch,
                    "{w:?}: batch {t} came out after barrier {epoch}"
                );
            }
            GateItem::Barrier {
                checkpoint_id,
                unaligned,
            } => {
                assert!(!unaligned);
                assert_eq!(
                    checkpoint_id,
                    epoch + 1,
                    "{w:?}: barriers out of order or repeated"
                );
                epoch = checkpoint_id;
            }
            other => panic!("{w:?}: unexpected {other:?}"),
        }
    }
    assert!(seen.iter().all(|s| *s), "{w:?}: batches lost");
    assert_eq!(epoch, ((batches - 1) / every) as u64, "{w:?}: barriers lost");
    assert_eq!(s.gate.metrics().stale_barriers, 0);
}

#[test]
fn aligned_barrier_remote_four_channels_slow_consumer() {
    aligned_run(Where::Remote, 4, 240, 30, Duration::from_millis(2));
}

#[test]
fn aligned_barrier_remote_floating_buffers_only() {
    // No exclusive buffers, 2 floating ones for 4 channels: a paused channel must not hold
    // floating buffers the others need to reach their barrier (it announces no backlog).
    aligned_run_with(Where::Remote, 4, 160, 20, Duration::from_millis(1), |c| {
        c.exclusive_buffers = 0;
        c.floating_buffers = 2;
    });
}

#[test]
fn aligned_barrier_local_channels() {
    aligned_run(Where::Handoff, 4, 120, 20, Duration::ZERO);
    aligned_run(Where::Serialized, 4, 120, 20, Duration::from_millis(1));
}

/// Two producers, one channel each, so each can send its own barrier ids.
struct Two {
    _envs: Vec<NetworkEnvironment>,
    a: RecordWriter,
    b: RecordWriter,
    gate: InputGate,
}

fn two(remote: bool) -> Two {
    let pa = env(|_| {});
    let pb = env(|_| {});
    let consumer = env(|_| {});
    let (pa_ref, pb_ref) = if remote {
        (&pa, &pb)
    } else {
        (&consumer, &consumer)
    };
    let a = pa_ref.create_partition("a", 1).unwrap();
    let b = pb_ref.create_partition("b", 1).unwrap();
    let gate = consumer
        .create_input_gate(vec![spec(pa_ref, "a", 0), spec(pb_ref, "b", 0)])
        .unwrap();
    Two {
        a: RecordWriter::new(a, Partitioner::Forward),
        b: RecordWriter::new(b, Partitioner::Forward),
        gate,
        _envs: vec![pa, pb, consumer],
    }
}

/// Reads until nothing comes for a while (the gate is blocked or idle).
fn read_until_quiet(gate: &mut InputGate, out: &mut Vec<GateItem>) {
    loop {
        match gate.next_item(&mut Wait::timeout(Some(Duration::from_millis(300)), "quiet")) {
            Ok(Some(item)) => out.push(item),
            Err(Error::Timeout(..)) => return,
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn summary(items: &[GateItem]) -> Vec<String> {
    items
        .iter()
        .map(|i| match i {
            GateItem::Batch { channel, batch, .. } => format!("b{channel}:{}", stamp(batch)),
            GateItem::Barrier { checkpoint_id, .. } => format!("barrier {checkpoint_id}"),
            GateItem::CheckpointAborted { checkpoint_id } => format!("aborted {checkpoint_id}"),
            GateItem::Event { channel, .. } => format!("e{channel}"),
        })
        .collect()
}

/// Writes batch `first`, then for each id an aligned barrier and the next batch, then closes:
/// `batches_around_barriers(w, 0, &[1, 2])` sends 0, barrier 1, 1, barrier 2, 2, end.
fn batches_around_barriers(w: &mut RecordWriter, first: usize, ids: &[u64]) {
    w.write(&stamped(first, ROWS), &mut wait(10)).unwrap();
    for (i, id) in ids.iter().enumerate() {
        w.broadcast_barrier(*id, false).unwrap();
        w.write(&stamped(first + i + 1, ROWS), &mut wait(10)).unwrap();
    }
    w.close().unwrap();
}

#[test]
fn a_higher_id_aborts_the_pending_alignment() {
    for remote in [false, true] {
        let mut t = two(remote);
        batches_around_barriers(&mut t.a, 0, &[1, 2]);
        let mut items = Vec::new();
        // Channel a is blocked at barrier 1: batch 1 must not come out.
        read_until_quiet(&mut t.gate, &mut items);
        assert_eq!(summary(&items), ["b0:0"], "remote={remote}");
        // b skips checkpoint 1.
        batches_around_barriers(&mut t.b, 10, &[2]);
        items.extend(drain(&mut t.gate, Duration::ZERO));
        let s = summary(&items);
        let pos = |x: &str| {
            s.iter()
                .position(|y| y == x)
                .unwrap_or_else(|| panic!("{x} missing: {s:?}"))
        };
        assert!(pos("b1:10") < pos("aborted 1"), "{s:?}");
        assert!(pos("aborted 1") < pos("barrier 2"), "{s:?}");
        assert!(
            pos("b0:1") < pos("barrier 2") && pos("b1:10") < pos("barrier 2"),
            "{s:?}"
        );
        assert!(
            pos("barrier 2") < pos("b0:2") && pos("barrier 2") < pos("b1:11"),
            "{s:?}"
        );
        assert_eq!(s.len(), 7, "{s:?}");
        assert_eq!(t.gate.metrics().stale_barriers, 0);
    }
}

#[test]
fn a_stale_barrier_is_ignored_and_counted() {
    for remote in [false, true] {
        let mut t = two(remote);
        batches_around_barriers(&mut t.b, 10, &[2]);
        let mut items = Vec::new();
        read_until_quiet(&mut t.gate, &mut items);
        assert_eq!(summary(&items), ["b1:10"], "remote={remote}");
        // a sends barrier 1, lower than the 2 being aligned, then 2.
        batches_around_barriers(&mut t.a, 0, &[1, 2]);
        items.extend(drain(&mut t.gate, Duration::ZERO));
        let s = summary(&items);
        assert_eq!(&s[..3], ["b1:10", "b0:0", "b0:1"], "{s:?}");
        assert_eq!(s[3], "barrier 2", "{s:?}");
        assert_eq!(s.len(), 6, "{s:?}");
        assert_eq!(t.gate.metrics().stale_barriers, 1, "remote={remote}");
    }
}

#[test]
fn a_channel_ending_during_alignment_is_no_longer_waited_for() {
    for remote in [false, true] {
        let mut t = two(remote);
        batches_around_barriers(&mut t.a, 0, &[1]);
        let mut items = Vec::new();
        read_until_quiet(&mut t.gate, &mut items);
        assert_eq!(summary(&items), ["b0:0"], "remote={remote}");
        batches_around_barriers(&mut t.b, 10, &[]);
        items.extend(drain(&mut t.gate, Duration::ZERO));
        assert_eq!(
            summary(&items),
            ["b0:0", "b1:10", "barrier 1", "b0:1"],
            "remote={remote}"
        );
    }
}

/// Queues `before` batches with nobody reading, sends unaligned barrier 7, writes `after`
/// more, and checks the contract: every batch comes out exactly once; those written after
/// the barrier come out after it, unmarked; those written before it and coming out after it
/// are marked in-flight for 7, those coming out before it are not. Locally the barrier is
/// read before anything queued, so it comes out first; remotely the channels have one
/// exclusive and one floating buffer, so most of the data is still queued at the sender when
/// the barrier overtakes it (so at least one batch is in flight, whatever the timing: the
/// gate's first AddCredit reaches the sender after the barrier is queued, and the sender
/// reads priority events first).
fn unaligned_run(w: Where, rows: usize, segment_size: usize) {
    let subs = 2;
    // Remotely at most 3 buffers are in flight (1 exclusive per channel, 1 floating), so with
    // 24 batches of at least 4 KB per subpartition most of the data is still at the sender.
    let (before, after) = (24 * subs, 4 * subs);
    let mut s = setup(w, subs, |c| {
        c.segment_size = segment_size;
        c.memory = 8 << 20;
        c.exclusive_buffers = 1;
        c.floating_buffers = 1;
    });
    let mut wr = RecordWriter::new(s.part.clone(), Partitioner::RoundRobin);
    for t in 0..before {
        wr.write(&stamped(t, rows), &mut wait(10)).unwrap();
    }
    // Let a remote sender push what credit allows into the gate's buffers.
    std::thread::sleep(Duration::from_millis(200));
    let overtaken = wr.broadcast_barrier(7, true).unwrap();
    assert_eq!(overtaken.len(), subs);
    if !matches!(w, Where::Remote) {
        // Remotely the sender drains the subpartitions into its own queues eagerly.
        assert!(overtaken.iter().all(|n| *n > 0), "{w:?}: {overtaken:?}");
    }
    for t in before..before + after {
        wr.write(&stamped(t, rows), &mut wait(10)).unwrap();
    }
    wr.close().unwrap();
    let items = drain(&mut s.gate, Duration::ZERO);
    let at = items
        .iter()
        .position(|i| {
            matches!(
                i,
                GateItem::Barrier {
                    checkpoint_id: 7,
                    unaligned: true
                }
            )
        })
        .expect("barrier 7 missing");
    if !matches!(w, Where::Remote) {
        assert_eq!(at, 0, "{w:?}: {:?}", summary(&items));
    }
    let mut seen = vec![false; before + after];
    let mut marked = 0;
    for (i, item) in items.iter().enumerate() {
        if i == at {
            continue;
        }
        let GateItem::Batch { batch, in_flight, .. } = item else {
            panic!("{w:?}: unexpected {item:?}");
        };
        let t = stamp(batch);
        assert!(!seen[t], "{w:?}: batch {t} twice");
        seen[t] = true;
        let want: &[u64] = if t < before && i > at { &[7] } else { &[] };
        assert_eq!(in_flight, want, "{w:?}: batch {t} at {i}, barrier at {at}");
        assert!(
            t < before || i > at,
            "{w:?}: batch {t} written after the barrier came out before it"
        );
        marked += usize::from(!in_flight.is_empty());
    }
    assert!(seen.iter().all(|s| *s), "{w:?}: batches lost");
    assert!(marked > 0, "{w:?}: the barrier overtook nothing");
}

#[test]
fn unaligned_barrier_overtakes_queued_data_everywhere() {
    for w in ALL {
        unaligned_run(w, ROWS, 32 << 10);
    }
}

#[test]
fn unaligned_barrier_between_the_buffers_of_a_split_batch() {
    // 2000 Int64 rows = 16 KB per record over 4 KiB segments: the barrier overtakes records
    // cut across buffers, and each still comes out once, whole.
    for w in [Where::Serialized, Where::Remote] {
        unaligned_run(w, 2000, 4096);
    }
}

#[test]
fn unaligned_barrier_overtakes_batches_the_gate_already_decoded() {
    // Small batches: one buffer holds many, so reading the first one leaves the rest decoded
    // and queued in the gate. A remote unaligned barrier that arrives then comes out next.
    // No timed flush: the one explicit flush sends all 40 batches in one buffer.
    let mut s = setup(Where::Remote, 1, |c| c.buffer_timeout = Duration::from_secs(600));
    let mut wr = RecordWriter::new(s.part.clone(), Partitioner::Forward);
    for t in 0..40 {
        wr.write(&stamped(t, 20), &mut wait(10)).unwrap();
    }
    wr.flush();
    let queued = |gate: &InputGate| gate.metrics().remote.map_or(0, |r| r.queued_buffers);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while queued(&s.gate) == 0 {
        assert!(std::time::Instant::now() < deadline, "the data never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    let first = s.gate.next_item(&mut wait(10)).unwrap();
    assert!(matches!(first, Some(GateItem::Batch { .. })), "{first:?}");
    let decoded = s.gate.metrics().queued_batches;
    assert_eq!(decoded, 39, "the rest of the buffer should be decoded and queued");
    assert_eq!(queued(&s.gate), 0);
    wr.broadcast_barrier(3, true).unwrap();
    while queued(&s.gate) == 0 {
        assert!(std::time::Instant::now() < deadline, "the barrier never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    let next = s.gate.next_item(&mut wait(10)).unwrap();
    assert!(
        matches!(
            next,
            Some(GateItem::Barrier {
                checkpoint_id: 3,
                unaligned: true
            })
        ),
        "{next:?} came before the barrier, with {decoded} batches decoded"
    );
    wr.close().unwrap();
    let rest = drain(&mut s.gate, Duration::ZERO);
    assert_eq!(rest.len(), 39, "{:?}", summary(&rest));
    assert!(rest
        .iter()
        .all(|i| matches!(i, GateItem::Batch { in_flight, .. } if in_flight == &[3])));
}
