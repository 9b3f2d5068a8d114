//! The receiving side: a scripted server sends to the environment's gate. Data buffers become
//! batches, end-of-partition ends the gate; the gate returns credit as the consumer reads and
//! grants floating buffers for the sender's backlog; it skips data for receivers it does not
//! know, fails on the producer's errors, retries a partition not found, and cancels its
//! request when closed early.

use std::time::Duration;

use arrow_array::RecordBatch;
use creditflow_core::base::config::Backoff;
use creditflow_core::base::error::Error;
use creditflow_core::protocol::wire::{ErrorKind, Event, Message, ReceiverId};

use crate::script::server::{expect_request, scripted};
use crate::script::{batch, data_msg, record_stream, wait, SEG};

#[test]
fn data_buffers_become_the_batch() {
    let mut s = scripted(|_| {});
    let b = batch(0, 300);
    // One record across both exclusive buffers, the first a full segment.
    let seq = s.send_batches(std::slice::from_ref(&b), 0);
    assert_eq!(seq, 2, "the record should span two segments");
    s.send_end(seq);
    s.read_to_end(b);
}

#[test]
fn end_of_partition_ends_the_gate() {
    let mut s = scripted(|_| {});
    s.send_end(0);
    assert_eq!(s.gate.next(&mut wait()).unwrap(), None);
}

#[test]
fn consumer_reading_returns_credit() {
    // One floating buffer: the first buffer's backlog-0 top-up takes it, then the gate has
    // nothing left to grant until the consumer recycles.
    let mut s = scripted(|c| c.floating_buffers = 1);
    let batches: Vec<RecordBatch> = (0..3).map(|i| batch(i * 10, 10)).collect();
    // One buffer per small batch; the initial credit covers two.
    let mut seq = s.send_batches(&batches[..1], 0);
    seq = s.send_batches(&batches[1..2], seq);
    assert_eq!(seq, 2);
    // The floating buffer tops the channel up after the first; then the gate has none left.
    s.expect_credit(1);
    seq = s.send_batches(&batches[2..], seq);
    // 2 exclusive + 1 floating buffers, all filled and unread: no credit.
    s.peer.assert_quiet();
    for b in &batches {
        assert_eq!(s.gate.next(&mut wait()).unwrap().as_ref(), Some(b));
    }
    // Read and recycled: the channel again has its 2 exclusive buffers of credit.
    s.expect_credit(2);
    s.finish_with(batch(100, 10), seq);
}

#[test]
fn backlog_in_a_buffer_makes_the_gate_grant_floating_buffers() {
    let mut s = scripted(|c| {
        c.exclusive_buffers = 2;
        c.floating_buffers = 8;
    });
    let bytes = record_stream(&[batch(0, 10)]);
    s.peer.send(&[data_msg(s.rid, 0, 5, &bytes)]);
    // Wants backlog 5 + 2 exclusive = 7 empty buffers, has 1: 6 floating buffers.
    s.expect_credit(6);
}

#[test]
fn backlog_announcement_without_exclusive_buffers_gets_floating_credit() {
    let mut s = scripted(|c| {
        c.exclusive_buffers = 0;
        c.floating_buffers = 8;
    });
    s.peer.send(&[Message::BacklogAnnouncement {
        receiver: s.rid,
        backlog: 3,
    }]);
    s.expect_credit(3);
    s.finish_with(batch(0, 10), 0);
}

#[test]
fn data_for_an_unknown_receiver_is_skipped() {
    let mut s = scripted(|_| {});
    let stranger = ReceiverId(s.rid.0 + 1000);
    s.peer.send(&[data_msg(stranger, 0, 0, &[0xAB; SEG])]);
    s.finish_with(batch(0, 10), 0);
}

#[test]
fn error_response_for_the_receiver_fails_the_gate() {
    let mut s = scripted(|_| {});
    let msg = Message::error_response(Some(s.rid), ErrorKind::ProducerFailed, "boom");
    s.peer.send(&[msg]);
    s.assert_gate_fails(|e| matches!(e, Error::ProducerFailed(m) if m == "boom"));
}

#[test]
fn producer_failed_event_comes_after_the_data_before_it() {
    let mut s = scripted(|_| {});
    let b = batch(0, 10);
    let seq = s.send_batches(std::slice::from_ref(&b), 0);
    let failed = Event::producer_failed("writer died");
    s.peer.send(&[Message::event(s.rid, seq, 0, failed)]);
    assert_eq!(s.gate.next(&mut wait()).unwrap(), Some(b));
    s.assert_gate_fails(|e| matches!(e, Error::ProducerFailed(m) if m == "writer died"));
}

#[test]
fn partition_not_found_is_retried_with_backoff_then_fails() {
    let backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(40),
    };
    let mut s = scripted(|c| c.request_backoff = backoff);
    // Retried after 20 ms, then after 40 ms (the maximum), then given up.
    for _ in 0..2 {
        s.peer.send(&[Message::PartitionNotFound { receiver: s.rid }]);
        assert_eq!(expect_request(&mut s.peer, &s.env), s.rid);
    }
    s.peer.send(&[Message::PartitionNotFound { receiver: s.rid }]);
    s.assert_gate_fails(|e| matches!(e, Error::PartitionNotFound(id) if id == "p"));
}

#[test]
fn closing_the_gate_early_cancels_the_request() {
    let mut s = scripted(|_| {});
    s.gate.close();
    match s.peer.recv() {
        Message::CancelPartitionRequest { receiver } => assert_eq!(receiver, s.rid),
        other => panic!("expected CancelPartitionRequest, got {other:?}"),
    }
}
