//! Tests of the receiving side's state: retry schedule, channels opened on a failing
//! connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::retry::next_retry_delay;
use super::*;
use crate::base::config::{Backoff, ChannelSpec, FlowControl};
use crate::base::error::Error;
use crate::partition::subpartition::Listener;
use crate::protocol::wire::ReceiverId;

/// The retry schedule on tokio's paused clock: 0.1 s doubling to 10 s, then give up.
#[tokio::test(start_paused = true)]
async fn partition_request_backoff_doubles_to_the_max_then_gives_up() {
    let backoff = Backoff::default();
    let start = tokio::time::Instant::now();
    let mut last = None;
    let mut delays = Vec::new();
    while let Some(d) = next_retry_delay(last, backoff) {
        tokio::time::sleep(d).await;
        delays.push(d.as_millis());
        last = Some(d);
    }
    assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 6400, 10000]);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(delays.iter().sum::<u128>() as u64)
    );
}

fn open(conn: &Arc<ClientConn>, rid: u64, woken: &Arc<AtomicU64>) -> Arc<RemoteChannel> {
    let gate = RemoteGate::new(FlowControl::Credit, 2, 8, Vec::new(), 1 << 20, 1 << 20).unwrap();
    let woken = woken.clone();
    let spec = ChannelSpec {
        address: conn.addr.clone(),
        partition_id: "p".into(),
        subpartition: 0,
    };
    let notify: Listener = Arc::new(move || {
        woken.fetch_add(1, Ordering::SeqCst);
    });
    conn.open_channel(ReceiverId(rid), spec, &gate, notify, Backoff::default())
}

fn failure_of(ch: &RemoteChannel) -> Option<Error> {
    ch.take_all().into_iter().find_map(|item| match item {
        Inbound::Failed(e) => Some(e),
        _ => None,
    })
}

/// A channel opened after its connection failed the handshake gets that failure
/// (AuthenticationError), not a generic ConnectionLost, and is woken for it; channels
/// open at the time get the same error.
#[test]
fn a_channel_opened_on_a_failed_connection_gets_its_error() {
    let conn = ClientConn::new("127.0.0.1:1".into());
    let woken = Arc::new(AtomicU64::new(0));
    let before = open(&conn, 1, &woken);
    conn.fail(Error::Authentication("the peer requires a shared secret".into()));
    let after = open(&conn, 2, &woken);
    for ch in [&before, &after] {
        let err = failure_of(ch).expect("the channel failed");
        assert!(
            matches!(&err, Error::Authentication(m) if m.contains("shared secret")),
            "{err}"
        );
    }
    assert_eq!(woken.load(Ordering::SeqCst), 2);
    assert!(conn.channels.lock().unwrap().is_empty());
    assert!(conn.is_dead());
}

/// Opening channels while the connection fails on another thread: every channel ends up
/// failed with the connection's error, none is left registered and waiting.
#[test]
fn no_channel_slips_past_a_concurrent_failure() {
    for round in 0..200 {
        let conn = ClientConn::new("127.0.0.1:1".into());
        let woken = Arc::new(AtomicU64::new(0));
        let failer = {
            let conn = conn.clone();
            std::thread::spawn(move || conn.fail(Error::ConnectionLost(format!("reset {round}"))))
        };
        let channels: Vec<_> = (0..20).map(|rid| open(&conn, rid, &woken)).collect();
        failer.join().unwrap();
        for ch in &channels {
            let err = failure_of(ch).expect("every channel failed");
            assert!(
                matches!(&err, Error::ConnectionLost(m) if m.contains(&format!("reset {round}"))),
                "{err}"
            );
        }
        assert!(conn.channels.lock().unwrap().is_empty());
    }
}

#[test]
fn a_max_below_initial_gives_up_after_one_retry() {
    let backoff = Backoff {
        initial: Duration::from_secs(1),
        max: Duration::from_millis(10),
    };
    assert_eq!(next_retry_delay(None, backoff), Some(Duration::from_secs(1)));
    assert_eq!(next_retry_delay(Some(Duration::from_secs(1)), backoff), None);
}

/// The record grants `conn` has queued for its writer.
fn queued_grants(conn: &ClientConn) -> Vec<u64> {
    let mut out = conn.out.lock().unwrap();
    let grants = out
        .control
        .iter()
        .filter_map(|m| match m {
            crate::protocol::wire::Message::RecordGrant { bytes, .. } => Some(*bytes),
            _ => None,
        })
        .collect();
    out.control.clear();
    grants
}

/// A grant the record budget tops up when records start goes to the sender at once: the
/// budget counts it as given from then on and answers an announcement it covers with
/// nothing, so the sender must have it (it waited for the consumer's next record taken).
#[test]
fn a_grant_topped_up_when_records_start_is_sent_at_once() {
    let conn = ClientConn::new("127.0.0.1:1".into());
    let woken = Arc::new(AtomicU64::new(0));
    let ch = open(&conn, 1, &woken);
    queued_grants(&conn);
    let kib = 1 << 10;
    // 1 MiB budget, one channel: a window of 512 KiB, granted in full with the first ask.
    ch.gate.on_record_announcement(&ch, 10 * kib).unwrap();
    assert_eq!(queued_grants(&conn), [512 * kib]);
    ch.gate.records_started(ch.cid, 300 * kib).unwrap();
    ch.gate.records_taken(ch.cid, 300 * kib);
    assert_eq!(
        queued_grants(&conn),
        Vec::<u64>::new(),
        "212 KiB left of the grant, none held"
    );
    // Below half the window with room in half the budget: topped up to the window.
    ch.gate.records_started(ch.cid, 10 * kib).unwrap();
    assert_eq!(queued_grants(&conn), [300 * kib]);
    // The sender's ask for what the top-up covers needs no second grant.
    ch.gate.on_record_announcement(&ch, 400 * kib).unwrap();
    assert_eq!(queued_grants(&conn), Vec::<u64>::new());
}
