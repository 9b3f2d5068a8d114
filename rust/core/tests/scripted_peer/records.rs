//! Records longer than a buffer, both ways. The sender cuts a record into buffers of the
//! client's size (or the size it announced last) and bulk buffers for handed-off batches; only
//! the buffer that starts a record and the one that completes it take credit, on either side.

use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use creditflow_core::protocol::wire::{Message, ReceiverId, MAX_BULK_PAYLOAD};

use crate::script::client::{connect, recv_to_end, request_written};
use crate::script::server::{one_record, scripted};
use crate::script::{
    add_credit, batch, data, data_msg, decode_records, env_with, record_stream, request, wait, IO_TIMEOUT,
    SEG,
};

#[test]
fn large_handed_off_batch_goes_in_a_first_segment_then_bulk_buffers() {
    let env = env_with(true, |_| {});
    // About 1.3 MB: a segment, a bulk buffer of MAX_BULK_PAYLOAD, and the rest.
    let (mut p, written) = request_written(&env, 1, 60_000, 1000);
    let got = recv_to_end(&mut p, 1, 0);
    let lens: Vec<usize> = got.iter().map(|d| d.payload.len()).collect();
    assert_eq!(lens.len(), 3, "buffers of {lens:?} bytes");
    assert_eq!(&lens[..2], &[SEG, MAX_BULK_PAYLOAD]);
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.backlog as usize, 2 - i);
    }
    assert_eq!(decode_records(got.iter().map(|d| d.payload.as_slice())), written);
}

/// One batch spanning several buffers, with credit for one buffer: the first buffer (the
/// record's length prefix) takes it, the buffers wholly inside the record follow without
/// credit (segments of a serialized stream; one bulk buffer of a handed-off batch), and the
/// one that completes the record waits for the next AddCredit.
fn record_body_buffers_go_out_without_credit(handoff: bool) {
    let env = env_with(handoff, |_| {});
    let rows = if handoff { 60_000 } else { 3000 };
    let (mut p, written) = request_written(&env, 1, rows, 1);
    let first = data(p.recv());
    assert_eq!((first.seq, first.payload.len()), (0, SEG));
    let backlog = first.backlog as usize;
    assert!(
        backlog >= 2,
        "the record should span at least 3 buffers, not {}",
        backlog + 1
    );
    let body = if handoff { MAX_BULK_PAYLOAD } else { SEG };
    let mut got = vec![first];
    for seq in 1..=backlog as u64 - 1 {
        let d = data(p.recv());
        assert_eq!((d.seq, d.payload.len()), (seq, body), "a record body buffer");
        got.push(d);
    }
    p.assert_quiet();
    p.send(&[add_credit(1, 1)]);
    got.extend(recv_to_end(&mut p, 1, backlog as u64));
    assert_eq!(got.len(), backlog + 1);
    assert_eq!(decode_records(got.iter().map(|d| d.payload.as_slice())), written);
}

#[test]
fn record_body_buffers_go_out_without_credit_handoff() {
    record_body_buffers_go_out_without_credit(true);
}

#[test]
fn record_body_buffers_go_out_without_credit_serialized() {
    record_body_buffers_go_out_without_credit(false);
}

#[test]
fn client_with_smaller_segments_gets_first_buffers_of_its_size() {
    let env = env_with(true, |c| c.segment_size = 2 * SEG);
    let (mut p, written) = request_written(&env, 1, 3000, 1000);
    let got = recv_to_end(&mut p, 1, 0);
    // The first buffer (it starts the record, so it takes one of the client's buffers) is cut
    // at the client's size; the rest of the record's body is one bulk buffer.
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].payload.len(), SEG);
    assert!(got[1].payload.len() > 2 * SEG);
    assert_eq!(decode_records(got.iter().map(|d| d.payload.as_slice())), written);
}

/// A client announces a buffer size for its channel before anything is written: the sender
/// cuts every later buffer at that size, and the records still decode whole.
fn new_buffer_size_cuts_later_buffers(handoff: bool) {
    const SIZE: usize = 1000;
    let env = env_with(handoff, |_| {});
    let part = env.create_partition("p", 1).unwrap();
    let mut p = connect(&env);
    p.send(&[
        request("p", 0, 1, 1000),
        Message::NewBufferSize {
            receiver: ReceiverId(1),
            size: SIZE as u32,
        },
    ]);
    let sub = part.subpartition(0).unwrap().clone();
    let deadline = Instant::now() + IO_TIMEOUT;
    while sub.buffer_size(SEG) != SIZE {
        assert!(
            Instant::now() < deadline,
            "the size never reached the subpartition"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut w = RecordWriter::new(part, Partitioner::Forward);
    let written: Vec<RecordBatch> = (0..3).map(|i| batch(i * 700, 700)).collect();
    for b in &written {
        w.write(b, &mut wait()).unwrap();
    }
    w.close().unwrap();
    let got = recv_to_end(&mut p, 1, 0);
    assert!(got.len() > 3 * 4, "{} buffers", got.len());
    assert!(
        got.iter().all(|d| d.payload.len() <= SIZE),
        "a buffer over {SIZE} bytes"
    );
    let full = got.iter().filter(|d| d.payload.len() == SIZE).count();
    // Serialized: every buffer but the last is full. Handed off: every frame but the last of
    // each record.
    assert!(
        full >= got.len() - written.len(),
        "{full} of {} buffers full",
        got.len()
    );
    assert_eq!(decode_records(got.iter().map(|d| d.payload.as_slice())), written);
}

#[test]
fn new_buffer_size_cuts_later_buffers_handoff() {
    new_buffer_size_cuts_later_buffers(true);
}

#[test]
fn new_buffer_size_cuts_later_buffers_serialized() {
    new_buffer_size_cuts_later_buffers(false);
}

#[test]
fn gate_takes_record_body_buffers_without_credit() {
    // Floating buffers are granted by backlog only, and every buffer here announces backlog 0.
    let mut s = scripted(|_| {});
    let b = batch(0, 2000);
    let bytes = record_stream(std::slice::from_ref(&b));
    let chunks: Vec<&[u8]> = bytes.chunks(SEG).collect();
    let last = chunks.len() - 1;
    // The first buffer starts the record: it carried only part of it, so it is recycled
    // without the gate reading anything; one floating buffer was granted while it was in use.
    s.peer.send(&[data_msg(s.rid, 0, 0, chunks[0])]);
    s.expect_credit(1);
    // The sender holds 2 credits. The buffers wholly inside the record (more than that) need
    // none: they land in the record's memory, and no credit comes back for them.
    assert!(
        last - 1 > 2,
        "the record should have more body buffers than credit"
    );
    let inside: Vec<Message<'static>> = (1..last)
        .map(|i| data_msg(s.rid, i as u64, 0, chunks[i]))
        .collect();
    s.peer.send(&inside);
    s.peer.assert_quiet();
    // The last buffer completes the record and keeps its exclusive buffer until the gate
    // reads the record; the gate grants a floating one to keep the channel at 2 empty ones.
    s.peer.send(&[data_msg(s.rid, last as u64, 0, chunks[last])]);
    s.expect_credit(1);
    assert_eq!(s.gate.next(&mut wait()).unwrap(), Some(b));
    s.send_end(last as u64 + 1);
    assert_eq!(s.gate.next(&mut wait()).unwrap(), None);
}

#[test]
fn gate_reads_bulk_buffers_inside_a_record_into_it() {
    let mut s = scripted(|_| {});
    let (bytes, len) = one_record(&mut s, 20_000);
    assert!(len > 4 * SEG);
    // The prefix in a segment (a credit), a long buffer inside the record (none), then a long
    // one that completes it exactly (a credit).
    s.peer.send(&[
        data_msg(s.rid, 0, 2, &bytes[..SEG]),
        data_msg(s.rid, 1, 1, &bytes[SEG..len - SEG - 1]),
        data_msg(s.rid, 2, 0, &bytes[len - SEG - 1..]),
    ]);
    s.send_end(3);
    assert_eq!(s.gate.next(&mut wait()).unwrap(), Some(batch(0, 20_000)));
    assert_eq!(s.gate.next(&mut wait()).unwrap(), None);
}
