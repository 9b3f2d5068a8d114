//! A gate read by polling (`try_next_item`) and woken by its ready listener, as a reader that
//! serves many gates from one thread reads them: local channels handed over or serialized,
//! and remote ones over loopback TCP.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use creditflow_core::base::wait::Wait;
use creditflow_core::env::NetworkEnvironment;
use creditflow_core::gate::{GateItem, InputGate};
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use creditflow_core::partition::ResultPartition;

mod support;

use support::{spec, stamp, stamped};

const ROWS: usize = 100;
const SUBS: usize = 3;
const BATCHES: usize = 60;

fn env(handoff: bool) -> NetworkEnvironment {
    support::env(|c| c.local_handoff = handoff)
}

/// Wakes a polling reader: a flag and a condvar, and how many times the listener ran.
#[derive(Default)]
struct Bell {
    rung: Mutex<bool>,
    cv: Condvar,
    calls: AtomicUsize,
}

impl Bell {
    fn listen(gate: &InputGate) -> Arc<Bell> {
        let bell = Arc::new(Bell::default());
        let b = bell.clone();
        assert!(gate.set_ready_listener(Arc::new(move || {
            b.calls.fetch_add(1, Ordering::SeqCst);
            *b.rung.lock().unwrap() = true;
            b.cv.notify_all();
        })));
        bell
    }

    /// Waits for a ring (or `most`); false if none came.
    fn wait(&self, most: Duration) -> bool {
        let rung = self.rung.lock().unwrap();
        let (mut rung, _) = self.cv.wait_timeout_while(rung, most, |r| !*r).unwrap();
        std::mem::replace(&mut *rung, false)
    }
}

/// Everything the gate yields until its end, polling: after each `None` the reader sleeps until
/// the listener rings, or until a pending channel is due. A lost wake-up fails the test.
fn poll_to_end(gate: &mut InputGate, bell: &Bell) -> Vec<GateItem> {
    let mut out = Vec::new();
    loop {
        match gate.try_next_item().unwrap() {
            Some(Some(item)) => out.push(item),
            Some(None) => return out,
            None => {
                let most = gate.retry_due_in().unwrap_or(Duration::from_secs(10));
                let rung = bell.wait(most);
                assert!(
                    rung || gate.retry_due_in().is_some(),
                    "nothing ready and no ring for 10 s after {} items",
                    out.len()
                );
            }
        }
    }
}

fn write_all(part: Arc<ResultPartition>) {
    let mut w = RecordWriter::new(part, Partitioner::RoundRobin);
    for t in 0..BATCHES {
        w.write_to(&stamped(t, ROWS), None, t % SUBS, &mut Wait::forever())
            .unwrap();
        if t % 10 == 9 {
            w.emit_event(&(t as u64).to_le_bytes(), t % SUBS).unwrap();
        }
        // Now and then the reader catches up and sleeps: the listener must wake it.
        if t % 7 == 0 {
            std::thread::sleep(Duration::from_millis(3));
        }
    }
    w.close().unwrap();
}

/// Every batch once, in order per channel; every event after the batch written before it.
fn check(items: &[GateItem]) {
    let mut next = [0usize; SUBS];
    let mut batches = 0;
    for item in items {
        match item {
            GateItem::Batch { channel, batch, .. } => {
                let t = stamp(batch);
                assert_eq!(t % SUBS, *channel, "batch {t} on channel {channel}");
                assert_eq!(
                    t,
                    next[*channel] * SUBS + channel,
                    "channel {channel} out of order"
                );
                next[*channel] += 1;
                batches += 1;
            }
            GateItem::Event { channel, payload } => {
                let t = u64::from_le_bytes(payload.as_slice().try_into().unwrap()) as usize;
                assert_eq!(t % SUBS, *channel);
                assert_eq!(
                    next[*channel],
                    t / SUBS + 1,
                    "event {t} not right after its batch"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(batches, BATCHES);
}

#[test]
fn a_polled_gate_gets_every_item_in_order_woken_by_its_listener_local_and_remote() {
    for (handoff, remote) in [(true, false), (false, false), (true, true)] {
        let producer = Arc::new(env(handoff));
        let consumer = if remote {
            Arc::new(env(handoff))
        } else {
            producer.clone()
        };
        let id = format!("p-{handoff}-{remote}");
        // The partition first: every channel resolves at once.
        let part = producer.create_partition(&id, SUBS).unwrap();
        let specs = (0..SUBS).map(|i| spec(&producer, &id, i)).collect();
        let mut gate = consumer.create_input_gate(specs).unwrap();
        let bell = Bell::listen(&gate);
        let writer = std::thread::spawn(move || write_all(part));
        let items = poll_to_end(&mut gate, &bell);
        writer.join().unwrap();
        check(&items);
        assert!(
            bell.calls.load(Ordering::SeqCst) > 0,
            "handoff {handoff}, remote {remote}: the listener never ran"
        );
    }
}

#[test]
fn a_channel_whose_partition_comes_late_is_found_by_polling_when_its_retry_is_due() {
    let producer = Arc::new(env(true));
    let specs = (0..SUBS).map(|i| spec(&producer, "late", i)).collect();
    let mut gate = producer.create_input_gate(specs).unwrap();
    let bell = Bell::listen(&gate);
    assert!(
        gate.try_next_item().unwrap().is_none(),
        "nothing can be ready yet"
    );
    let due = gate.retry_due_in().expect("channels wait for their partition");
    assert!(due <= Duration::from_secs(10), "retry in {due:?}");
    let p = producer.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        write_all(p.create_partition("late", SUBS).unwrap());
    });
    let items = poll_to_end(&mut gate, &bell);
    writer.join().unwrap();
    check(&items);
    assert_eq!(gate.retry_due_in(), None, "every channel resolved");
}

#[test]
fn a_polled_gate_is_idle_from_finding_nothing_to_its_next_item() {
    let producer = Arc::new(env(true));
    let part = producer.create_partition("idle", 1).unwrap();
    let mut gate = producer
        .create_input_gate(vec![spec(&producer, "idle", 0)])
        .unwrap();
    let bell = Bell::listen(&gate);
    let before = gate.metrics().idle_total;
    assert!(gate.try_next_item().unwrap().is_none());
    std::thread::sleep(Duration::from_millis(80));
    let waiting = gate.metrics().idle_total - before;
    assert!(
        waiting >= Duration::from_millis(80),
        "idle {waiting:?} while nothing was ready"
    );
    // Polling again while still waiting does not restart the interval.
    assert!(gate.try_next_item().unwrap().is_none());
    assert!(gate.metrics().idle_total - before >= waiting);
    let mut w = RecordWriter::new(part, Partitioner::RoundRobin);
    w.write_to(&stamped(0, ROWS), None, 0, &mut Wait::forever())
        .unwrap();
    let start = Instant::now();
    let item = loop {
        if let Some(item) = gate.try_next_item().unwrap() {
            break item;
        }
        assert!(bell.wait(Duration::from_secs(10)), "no ring for a written batch");
    };
    assert!(matches!(item, Some(GateItem::Batch { .. })));
    let ended = gate.metrics().idle_total;
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(gate.metrics().idle_total, ended, "not idle once an item came");
    assert!(ended - before <= waiting + start.elapsed() + Duration::from_millis(80));
}
