//! Faults on the receiving side: a server that breaks the protocol (a sequence gap, data
//! without credit, frames or records over their limits, a message only a client sends) gets a
//! fatal error and fails the gate; a server that goes away mid-buffer is a lost connection.

use std::time::Duration;

use creditflow_core::base::error::Error;
use creditflow_core::base::wait::Wait;
use creditflow_core::protocol::credit::{BufferHeader, DataType};
use creditflow_core::protocol::wire::{encode, encode_buffer_response_header, Message, MAX_BULK_PAYLOAD};

use crate::script::server::{one_record, scripted};
use crate::script::{add_credit, batch, data_msg, encode_records, record_stream, SEG};

#[test]
fn sequence_gap_is_a_protocol_error() {
    let mut s = scripted(|_| {});
    let bytes = record_stream(&[batch(0, 10)]);
    s.peer.send(&[data_msg(s.rid, 1, 0, &bytes)]);
    let msg = s.expect_fatal_protocol_error();
    assert!(msg.contains("sequence"), "{msg}");
    s.assert_gate_fails(|e| matches!(e, Error::Protocol(_)));
}

#[test]
fn data_without_credit_is_a_protocol_error() {
    // Initial credit 2, and the gate has only 2 exclusive + 1 floating buffers: the third or
    // the fourth data buffer, sent without waiting for AddCredit, is beyond the credit.
    let mut s = scripted(|c| c.floating_buffers = 1);
    // One whole record per buffer: each holds its credit until the gate reads it, which it
    // does not before the failure. (A buffer carrying only part of a record gives its credit
    // back at once, so quarters of one record would race with the AddCredits.)
    let mut enc = None;
    let msgs: Vec<Message<'static>> = (0..4)
        .map(|seq| {
            let mut bytes = Vec::new();
            encode_records(&mut enc, &[batch(seq * 10, 10)], &mut bytes);
            assert!(bytes.len() <= SEG);
            data_msg(s.rid, seq as u64, 0, &bytes)
        })
        .collect();
    s.peer.send(&msgs);
    let msg = s.expect_fatal_protocol_error();
    assert!(msg.contains("without credit"), "{msg}");
    s.assert_gate_fails(|e| matches!(e, Error::Protocol(_)));
}

#[test]
fn record_longer_than_max_record_size_fails_the_channel() {
    let mut s = scripted(|c| c.max_record_size = 1000);
    let bytes = record_stream(&[batch(0, 100)]);
    assert!(bytes.len() > 1000 && bytes.len() <= SEG);
    s.peer.send(&[data_msg(s.rid, 0, 0, &bytes)]);
    s.assert_gate_fails(|e| matches!(e, Error::Protocol(m) if m.contains("record length")));
}

#[test]
fn end_of_partition_inside_a_record_is_a_protocol_error() {
    let mut s = scripted(|_| {});
    let bytes = record_stream(&[batch(0, 300)]);
    assert!(bytes.len() > SEG);
    s.peer.send(&[data_msg(s.rid, 0, 0, &bytes[..SEG])]);
    s.send_end(1);
    s.assert_gate_fails(|e| matches!(e, Error::Protocol(m) if m.contains("middle of a record")));
}

#[test]
fn oversized_frame_is_a_protocol_error() {
    // Over the frame limit (the decoder refuses it), and over a segment with no record in
    // progress (the reader refuses it): only the 35-byte header each time, so the length field
    // alone must be refused.
    for len in [MAX_BULK_PAYLOAD + 1, SEG + 1] {
        let mut s = scripted(|_| {});
        let header = BufferHeader {
            sequence_number: 0,
            backlog: 0,
            data_type: DataType::Data,
        };
        let head = encode_buffer_response_header(s.rid, header, len).unwrap();
        s.peer.send_raw(&head);
        s.expect_fatal_protocol_error();
        s.assert_gate_fails(|e| matches!(e, Error::Protocol(_)));
    }
}

#[test]
fn long_buffer_past_its_record_is_a_protocol_error() {
    let mut s = scripted(|_| {});
    let (mut bytes, len) = one_record(&mut s, 20_000);
    encode_records(&mut s.enc, &[batch(1, 10)], &mut bytes);
    s.peer.send(&[
        data_msg(s.rid, 0, 1, &bytes[..SEG]),
        // Longer than a segment, and running into the next record.
        data_msg(s.rid, 1, 0, &bytes[SEG..len + 8]),
    ]);
    let message = s.expect_fatal_protocol_error();
    assert!(message.contains("exceeds the segment size"), "{message}");
    s.assert_gate_fails(|e| matches!(e, Error::Protocol(_)));
}

#[test]
fn client_only_message_from_the_server_is_a_protocol_error() {
    let mut s = scripted(|_| {});
    s.peer.send(&[add_credit(s.rid.0, 1)]);
    s.expect_fatal_protocol_error();
    s.assert_gate_fails(|e| matches!(e, Error::Protocol(_)));
}

#[test]
fn peer_closing_mid_buffer_is_connection_lost() {
    let mut s = scripted(|_| {});
    let bytes = record_stream(&[batch(0, 300)]);
    assert!(bytes.len() > SEG);
    let mut frame = Vec::new();
    encode(&data_msg(s.rid, 0, 0, &bytes[..SEG]), &mut frame).unwrap();
    s.peer.send_raw(&frame[..frame.len() / 2]);
    s.peer.stream.shutdown(std::net::Shutdown::Both).unwrap();
    let err = s
        .gate
        .next(&mut Wait::timeout(Some(Duration::from_secs(2)), "close"))
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionLost(_)), "{err}");
}
