//! The sending side: a scripted client reads from the environment's listener. Credit bounds
//! the data buffers, backlog counts down, sequence numbers go up, end-of-partition needs no
//! credit; requests for what does not exist or is taken fail only that receiver; a cancel
//! stops one stream, and two streams on one connection take turns.

use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::protocol::wire::{ErrorKind, Event, Message, ReceiverId};

use crate::script::client::{assert_serves, connect, recv_to_end, request_written};
use crate::script::{add_credit, batch, data, decode_records, env_with, event, request, wait, write, SEG};

fn initial_credit_bounds_data(handoff: bool) {
    let env = env_with(handoff, |_| {});
    let (mut p, _) = request_written(&env, 40, 50, 2);
    for seq in 0..2 {
        let d = data(p.recv());
        assert_eq!((d.receiver, d.seq), (1, seq));
    }
    p.assert_quiet();
    p.send(&[add_credit(1, 1)]);
    assert_eq!(data(p.recv()).seq, 2);
    p.assert_quiet();
}

#[test]
fn initial_credit_bounds_data_buffers_handoff() {
    initial_credit_bounds_data(true);
}

#[test]
fn initial_credit_bounds_data_buffers_serialized() {
    initial_credit_bounds_data(false);
}

#[test]
fn zero_credit_announces_backlog_then_add_credit_releases_exactly_that_many() {
    let env = env_with(true, |_| {});
    // Hand-off: one small batch is one data buffer.
    let (mut p, _) = request_written(&env, 5, 10, 0);
    match p.recv() {
        Message::BacklogAnnouncement { receiver, backlog } => assert_eq!((receiver.0, backlog), (1, 5)),
        other => panic!("expected BacklogAnnouncement, got {other:?}"),
    }
    p.assert_quiet();
    p.send(&[add_credit(1, 3)]);
    for seq in 0..3 {
        let d = data(p.recv());
        assert_eq!((d.receiver, d.seq, d.backlog), (1, seq, 4 - seq as u32));
    }
    p.assert_quiet();
    // The rest, and the end-of-partition behind it.
    p.send(&[add_credit(1, 2)]);
    assert_eq!(recv_to_end(&mut p, 1, 3).len(), 2);
}

fn backlog_and_sequence(handoff: bool) {
    let env = env_with(handoff, |_| {});
    let (mut p, written) = request_written(&env, 12, 50, 1000);
    let got = recv_to_end(&mut p, 1, 0);
    let n = got.len();
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.backlog as usize, n - 1 - i, "backlog of buffer {i} of {n}");
        assert!(d.payload.len() <= SEG);
    }
    if handoff {
        assert_eq!(n, written.len(), "one buffer per small handed-off batch");
    } else {
        assert!(n > 1);
        assert!(
            got[..n - 1].iter().all(|d| d.payload.len() == SEG),
            "full buffers but the last"
        );
    }
    assert_eq!(decode_records(got.iter().map(|d| d.payload.as_slice())), written);
}

#[test]
fn backlog_counts_down_and_sequence_numbers_go_up_handoff() {
    backlog_and_sequence(true);
}

#[test]
fn backlog_counts_down_and_sequence_numbers_go_up_serialized() {
    backlog_and_sequence(false);
}

#[test]
fn end_of_partition_needs_no_credit() {
    let env = env_with(true, |_| {});
    let (mut p, _) = request_written(&env, 0, 0, 0);
    assert_eq!(event(p.recv()), (1, 0, 0, Event::EndOfPartition));
    p.assert_quiet();
}

#[test]
fn end_of_partition_follows_the_data_once_credit_is_used_up() {
    let env = env_with(true, |_| {});
    // Exactly the credit for the two data buffers: the event comes without more.
    let (mut p, _) = request_written(&env, 2, 10, 2);
    assert_eq!(recv_to_end(&mut p, 1, 0).len(), 2);
    p.assert_quiet();
}

#[test]
fn unknown_partition_gets_partition_not_found() {
    let env = env_with(true, |_| {});
    let mut p = connect(&env);
    p.send(&[request("nope", 0, 7, 2)]);
    match p.recv() {
        Message::PartitionNotFound { receiver } => assert_eq!(receiver, ReceiverId(7)),
        other => panic!("expected PartitionNotFound, got {other:?}"),
    }
    p.assert_quiet();
}

#[test]
fn subpartition_out_of_range_fails_only_that_receiver() {
    let env = env_with(true, |_| {});
    write(&env, "p", 2, Partitioner::Broadcast, 1, 10);
    let mut p = connect(&env);
    p.send(&[request("p", 5, 3, 2)]);
    match p.recv() {
        Message::ErrorResponse {
            receiver,
            kind,
            message,
        } => {
            assert_eq!(receiver, Some(ReceiverId(3)));
            assert_eq!(kind, ErrorKind::SubpartitionOutOfRange, "{message}");
        }
        other => panic!("expected ErrorResponse, got {other:?}"),
    }
    // The connection is still good for valid requests.
    p.send(&[request("p", 1, 4, 2)]);
    assert_eq!(data(p.recv()).receiver, 4);
}

#[test]
fn second_reader_of_a_subpartition_gets_already_consumed() {
    let env = env_with(true, |_| {});
    write(&env, "p", 1, Partitioner::Forward, 1, 10);
    let mut p = connect(&env);
    p.send(&[request("p", 0, 1, 0), request("p", 0, 2, 0)]);
    let mut got = vec![p.recv(), p.recv()];
    got.sort_by_key(|m| matches!(m, Message::ErrorResponse { .. }));
    assert!(
        matches!(
            got[0],
            Message::BacklogAnnouncement {
                receiver: ReceiverId(1),
                backlog: 1
            }
        ),
        "{got:?}"
    );
    assert!(
        matches!(
            got[1],
            Message::ErrorResponse {
                receiver: Some(ReceiverId(2)),
                kind: ErrorKind::AlreadyConsumed,
                ..
            }
        ),
        "{got:?}"
    );
}

#[test]
fn cancel_stops_the_stream_and_the_writer_keeps_serving_other_subpartitions() {
    let env = env_with(true, |_| {});
    // Round robin over two subpartitions: two batches each.
    let (mut w, _) = write(&env, "p", 2, Partitioner::RoundRobin, 4, 10);
    let mut p = connect(&env);
    p.send(&[request("p", 0, 1, 1)]);
    assert_eq!(data(p.recv()).receiver, 1);
    // Credit after the cancel is for a reader that is gone: harmless, and nothing is sent.
    p.send(&[
        Message::CancelPartitionRequest {
            receiver: ReceiverId(1),
        },
        add_credit(1, 5),
        request("p", 1, 2, 100),
    ]);
    for seq in 0..2 {
        let d = data(p.recv());
        assert_eq!((d.receiver, d.seq), (2, seq));
    }
    // The writer still writes; subpartition 1 gets its share, subpartition 0's is dropped.
    for i in 0..4 {
        w.write(&batch(1000 + i * 10, 10), &mut wait()).unwrap();
    }
    for seq in 2..4 {
        let d = data(p.recv());
        assert_eq!((d.receiver, d.seq), (2, seq));
    }
    w.close().unwrap();
    assert_eq!(event(p.recv()), (2, 4, 0, Event::EndOfPartition));
    p.assert_quiet();
}

#[test]
fn two_requests_on_one_connection_are_served_round_robin() {
    let env = env_with(true, |_| {});
    let (mut w, _) = write(&env, "p", 2, Partitioner::Broadcast, 4, 10);
    w.close().unwrap();
    let mut p = connect(&env);
    // Zero credit first, so both readers exist (their announcements say so) before either
    // may send; then credit for both in one write.
    p.send(&[request("p", 0, 1, 0), request("p", 1, 2, 0)]);
    let mut announced: Vec<(u64, u32)> = (0..2)
        .map(|_| match p.recv() {
            Message::BacklogAnnouncement { receiver, backlog } => (receiver.0, backlog),
            other => panic!("expected BacklogAnnouncement, got {other:?}"),
        })
        .collect();
    announced.sort();
    assert_eq!(announced, [(1, 4), (2, 4)]);
    p.send(&[add_credit(1, 4), add_credit(2, 4)]);
    let order: Vec<u64> = (0..8).map(|_| data(p.recv()).receiver).collect();
    assert!(
        order.windows(2).all(|w| w[0] != w[1]),
        "not round robin: {order:?}"
    );
    assert_eq!(order.iter().filter(|r| **r == 1).count(), 4, "{order:?}");
    let mut ends: Vec<u64> = (0..2).map(|_| event(p.recv()).0).collect();
    ends.sort();
    assert_eq!(ends, [1, 2]);
}

#[test]
fn new_buffer_size_for_an_unknown_receiver_is_ignored() {
    let env = env_with(true, |_| {});
    let mut p = connect(&env);
    p.send(&[Message::NewBufferSize {
        receiver: ReceiverId(42),
        size: 512,
    }]);
    p.assert_quiet();
    assert_serves(&env);
}
