//! Scripted-peer tests of the wire protocol: one real `NetworkEnvironment` against a peer
//! written here with a plain `std::net` socket and the public codec, one behaviour per test.
//!
//! * `a_*`: a scripted client against the environment's listener (the environment sends).
//! * `b_*`: a scripted server that the environment's gate connects to (the environment
//!   receives).
//!
//! Reads use generous timeouts; "nothing arrives" is checked with a short quiet window,
//! which can only fail when the environment really sends something it should not.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::io::{ErrorKind as IoErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType as ArrowType, Field, Schema};
use creditflow_core::base::config::{Backoff, ChannelSpec};
use creditflow_core::base::error::Error;
use creditflow_core::base::wait::Wait;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::gate::InputGate;
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use creditflow_core::protocol::credit::{BufferHeader, Credit, DataType};
use creditflow_core::protocol::wire::{
    encode, encode_buffer_response_header, max_frame_size, AuthMode, BufferResponse, Decoder, ErrorKind,
    Event, Hello, Message, Payload, ReceiverId, MAX_BULK_PAYLOAD, MAX_CONTROL_FRAME_LEN, NONCE_LEN,
    PROTOCOL_VERSION, TAG_LEN,
};
use creditflow_core::serde::{BatchEncoder, RecordDeserializer};

/// Segment size of every environment here (the smallest allowed): small buffers, many frames.
const SEG: usize = 4096;
/// How long to wait for something that must happen.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to listen when nothing may arrive.
const QUIET: Duration = Duration::from_millis(300);
const NO_TAG: [u8; TAG_LEN] = [0; TAG_LEN];

// ---------------------------------------------------------------------------------------------
// Helpers: environments, batches, records
// ---------------------------------------------------------------------------------------------

/// An environment with `SEG`-byte segments whose partly filled buffers are never flushed by
/// time (only full buffers and `close` make data readable, so buffer counts are exact).
fn env_with(handoff: bool, cfg: impl FnOnce(&mut EnvConfig)) -> NetworkEnvironment {
    let mut c = EnvConfig {
        memory: 8 << 20,
        segment_size: SEG,
        buffer_timeout: Duration::from_secs(3600),
        local_handoff: handoff,
        ..EnvConfig::default()
    };
    cfg(&mut c);
    NetworkEnvironment::new(c).unwrap()
}

fn batch(start: i64, n: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", ArrowType::Int64, false),
        Field::new("s", ArrowType::Utf8, true),
    ]));
    let k = Int64Array::from_iter_values(start..start + n as i64);
    let s = StringArray::from_iter((0..n).map(|i| (i % 7 != 0).then(|| format!("row-{}", start + i as i64))));
    RecordBatch::try_new(schema, vec![Arc::new(k), Arc::new(s)]).unwrap()
}

fn wait() -> Wait<'static> {
    Wait::timeout(Some(IO_TIMEOUT), "scripted peer test")
}

/// Registers partition `id` and writes `n` batches of `rows` rows into it; returns the open
/// writer and the batches in the order written.
fn write(
    env: &NetworkEnvironment,
    id: &str,
    subs: usize,
    partitioner: Partitioner,
    n: usize,
    rows: usize,
) -> (RecordWriter, Vec<RecordBatch>) {
    let part = env.create_partition(id, subs).unwrap();
    let mut w = RecordWriter::new(part, partitioner);
    let batches: Vec<RecordBatch> = (0..n).map(|i| batch((i * rows) as i64, rows)).collect();
    for b in &batches {
        w.write(b, &mut wait()).unwrap();
    }
    (w, batches)
}

/// Like [`write`], then closes the writer: every buffer is finished and end-of-partition
/// is queued behind them.
fn write_and_close(env: &NetworkEnvironment, n: usize, rows: usize) -> Vec<RecordBatch> {
    let (mut w, batches) = write(env, "p", 1, Partitioner::Forward, n, rows);
    w.close().unwrap();
    batches
}

/// Appends `batches` to a subpartition stream encoded by `enc`: one record (u64 LE length +
/// Arrow IPC messages, the schema in the stream's first) per batch.
fn encode_records(enc: &mut Option<BatchEncoder>, batches: &[RecordBatch], out: &mut Vec<u8>) {
    for b in batches {
        let e = enc.get_or_insert_with(|| BatchEncoder::new(&b.schema()).unwrap());
        for chunk in e.encode(b).unwrap().chunks() {
            out.extend_from_slice(chunk);
        }
    }
}

/// A whole stream of `batches`.
fn record_stream(batches: &[RecordBatch]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_records(&mut None, batches, &mut out);
    out
}

/// Decodes the concatenated payloads of one channel; they must end on a record boundary.
fn decode_records<'a>(payloads: impl IntoIterator<Item = &'a [u8]>) -> Vec<RecordBatch> {
    let mut de = RecordDeserializer::new(1 << 30);
    let mut out = VecDeque::new();
    for p in payloads {
        de.push(p, &mut out).unwrap();
    }
    assert!(de.is_at_record_boundary(), "the stream ended inside a record");
    out.into()
}

// ---------------------------------------------------------------------------------------------
// Helpers: the scripted peer
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
enum Got {
    Msg(Message<'static>),
    /// Nothing within the time given.
    Quiet,
    /// End of stream or reset.
    Closed,
}

/// One end of a connection, scripted by the test.
struct Peer {
    stream: TcpStream,
    dec: Decoder,
}

impl Peer {
    fn new(stream: TcpStream) -> Peer {
        stream.set_nodelay(true).unwrap();
        Peer {
            stream,
            dec: Decoder::new(MAX_CONTROL_FRAME_LEN),
        }
    }

    /// Encodes `msgs` and writes them with one write.
    fn send(&mut self, msgs: &[Message<'_>]) {
        let mut out = Vec::new();
        for m in msgs {
            encode(m, &mut out).unwrap();
        }
        self.send_raw(&out);
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// After the handshake: frames up to one segment of payload.
    fn negotiated(&mut self, segment_size: usize) {
        self.dec.set_max_frame_size(max_frame_size(segment_size));
    }

    fn next_within(&mut self, timeout: Duration) -> Got {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 8192];
        // The scripted client grants every record at once (protocol version 3; the record
        // budget has tests of its own), the announcements that arrived together in one write:
        // granted one by one, the first reader granted could run ahead of the others while
        // their grants are on the way, and scripts that expect round robin would fail.
        let mut grants = Vec::new();
        loop {
            let next = self
                .dec
                .next_message()
                .expect("the environment sent a malformed frame")
                .map(Message::into_owned);
            if let Some(Message::RecordAnnouncement { receiver, bytes }) = next {
                grants.push(Message::RecordGrant { receiver, bytes });
                continue;
            }
            if !grants.is_empty() {
                self.send(&std::mem::take(&mut grants));
            }
            if let Some(m) = next {
                return Got::Msg(m);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Got::Quiet;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            match self.stream.read(&mut buf) {
                Ok(0) => return Got::Closed,
                Ok(n) => self.dec.feed(&buf[..n]),
                Err(e) if matches!(e.kind(), IoErrorKind::WouldBlock | IoErrorKind::TimedOut) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        IoErrorKind::ConnectionReset | IoErrorKind::ConnectionAborted
                    ) =>
                {
                    return Got::Closed
                }
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }

    fn recv(&mut self) -> Message<'static> {
        match self.next_within(IO_TIMEOUT) {
            Got::Msg(m) => m,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    fn assert_quiet(&mut self) {
        match self.next_within(QUIET) {
            Got::Quiet => {}
            other => panic!("expected nothing, got {other:?}"),
        }
    }

    /// Everything that arrives until the peer closes the connection (within `timeout`).
    fn recv_until_closed(&mut self, timeout: Duration) -> Vec<Message<'static>> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        loop {
            match self.next_within(deadline.saturating_duration_since(Instant::now())) {
                Got::Msg(m) => got.push(m),
                Got::Closed => return got,
                Got::Quiet => panic!("the connection was not closed within {timeout:?}; got {got:?}"),
            }
        }
    }
}

fn hello(segment_size: usize) -> Hello {
    Hello {
        version: PROTOCOL_VERSION,
        segment_size: segment_size as u32,
        max_frame_size: max_frame_size(segment_size) as u32,
        auth: AuthMode::None,
        nonce: [7; NONCE_LEN],
        shm: None,
    }
}

fn request(partition_id: &str, subpartition: u32, rid: u64, credit: u32) -> Message<'static> {
    Message::PartitionRequest {
        partition_id: partition_id.into(),
        subpartition,
        receiver: ReceiverId(rid),
        initial_credit: Credit::new(credit),
    }
}

fn add_credit(rid: u64, credit: u32) -> Message<'static> {
    Message::AddCredit {
        receiver: ReceiverId(rid),
        credit: Credit::new(credit),
    }
}

fn data_msg(rid: ReceiverId, seq: u64, backlog: u32, payload: &[u8]) -> Message<'static> {
    Message::BufferResponse(BufferResponse {
        receiver: rid,
        sequence_number: seq,
        backlog,
        payload: Payload::Data(Cow::Owned(payload.to_vec())),
    })
}

/// A data BufferResponse, taken apart.
#[derive(Debug)]
struct Data {
    receiver: u64,
    seq: u64,
    backlog: u32,
    payload: Vec<u8>,
}

fn data(msg: Message<'static>) -> Data {
    match msg {
        Message::BufferResponse(BufferResponse {
            receiver,
            sequence_number,
            backlog,
            payload: Payload::Data(bytes),
        }) => Data {
            receiver: receiver.0,
            seq: sequence_number,
            backlog,
            payload: bytes.into_owned(),
        },
        other => panic!("expected a data BufferResponse, got {other:?}"),
    }
}

/// An event BufferResponse: (receiver, sequence number, backlog, event).
fn event(msg: Message<'static>) -> (u64, u64, u32, Event) {
    match msg {
        Message::BufferResponse(BufferResponse {
            receiver,
            sequence_number,
            backlog,
            payload: Payload::Event(ev),
        }) => (receiver.0, sequence_number, backlog, ev),
        other => panic!("expected an event BufferResponse, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Direction A: scripted client against the environment's listener
// ---------------------------------------------------------------------------------------------

/// Connects to `env` and does the client side of the handshake, offering `segment_size`.
fn connect_with_segment(env: &NetworkEnvironment, segment_size: usize) -> Peer {
    let mut p = Peer::new(TcpStream::connect(env.address()).unwrap());
    p.send(&[Message::Hello(hello(segment_size))]);
    match p.recv() {
        Message::HelloAck { hello: h, tag } => {
            assert_eq!(h.version, PROTOCOL_VERSION);
            assert_eq!(h.segment_size as usize, env.config().segment_size);
            assert_eq!(
                h.max_frame_size as usize,
                max_frame_size(env.config().segment_size)
            );
            assert_eq!(h.auth, AuthMode::None);
            assert_eq!(tag, NO_TAG);
        }
        other => panic!("expected HelloAck, got {other:?}"),
    }
    p.send(&[Message::AuthProof { tag: NO_TAG }]);
    p.negotiated(segment_size.min(env.config().segment_size));
    p
}

fn connect(env: &NetworkEnvironment) -> Peer {
    connect_with_segment(env, SEG)
}

/// Writes `n` batches of `rows` rows into partition "p" of `env` and closes the writer; then
/// a client offering `SEG`-byte segments requests "p"[0] as receiver 1 with `credit`.
fn request_written(env: &NetworkEnvironment, n: usize, rows: usize, credit: u32) -> (Peer, Vec<RecordBatch>) {
    let written = write_and_close(env, n, rows);
    let mut p = connect(env);
    p.send(&[request("p", 0, 1, credit)]);
    (p, written)
}

/// A fresh, well-behaved client is still served: it gets an answer to a request.
fn assert_serves(env: &NetworkEnvironment) {
    let mut p = connect(env);
    p.send(&[request("no-such-partition", 0, 99, 1)]);
    match p.recv() {
        Message::PartitionNotFound { receiver } => assert_eq!(receiver, ReceiverId(99)),
        other => panic!("expected PartitionNotFound, got {other:?}"),
    }
}

/// Receives data BufferResponses for receiver `rid` up to and including its end-of-partition
/// event; checks sequence numbers (from `first_seq`, one up) and returns the data.
fn recv_to_end(p: &mut Peer, rid: u64, first_seq: u64) -> Vec<Data> {
    let mut got = Vec::new();
    loop {
        let msg = p.recv();
        if matches!(&msg, Message::BufferResponse(b) if matches!(b.payload, Payload::Event(_))) {
            let (r, seq, backlog, ev) = event(msg);
            assert_eq!(
                (r, seq, backlog, ev),
                (rid, first_seq + got.len() as u64, 0, Event::EndOfPartition)
            );
            return got;
        }
        let d = data(msg);
        assert_eq!((d.receiver, d.seq), (rid, first_seq + got.len() as u64));
        got.push(d);
    }
}

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
fn a_initial_credit_bounds_data_buffers_handoff() {
    initial_credit_bounds_data(true);
}

#[test]
fn a_initial_credit_bounds_data_buffers_serialized() {
    initial_credit_bounds_data(false);
}

#[test]
fn a_zero_credit_announces_backlog_then_add_credit_releases_exactly_that_many() {
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
fn a_backlog_counts_down_and_sequence_numbers_go_up_handoff() {
    backlog_and_sequence(true);
}

#[test]
fn a_backlog_counts_down_and_sequence_numbers_go_up_serialized() {
    backlog_and_sequence(false);
}

#[test]
fn a_large_handed_off_batch_goes_in_a_first_segment_then_bulk_buffers() {
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
fn a_record_body_buffers_go_out_without_credit_handoff() {
    record_body_buffers_go_out_without_credit(true);
}

#[test]
fn a_record_body_buffers_go_out_without_credit_serialized() {
    record_body_buffers_go_out_without_credit(false);
}

#[test]
fn a_client_with_smaller_segments_gets_first_buffers_of_its_size() {
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

#[test]
fn a_end_of_partition_needs_no_credit() {
    let env = env_with(true, |_| {});
    let (mut p, _) = request_written(&env, 0, 0, 0);
    assert_eq!(event(p.recv()), (1, 0, 0, Event::EndOfPartition));
    p.assert_quiet();
}

#[test]
fn a_end_of_partition_follows_the_data_once_credit_is_used_up() {
    let env = env_with(true, |_| {});
    // Exactly the credit for the two data buffers: the event comes without more.
    let (mut p, _) = request_written(&env, 2, 10, 2);
    assert_eq!(recv_to_end(&mut p, 1, 0).len(), 2);
    p.assert_quiet();
}

#[test]
fn a_unknown_partition_gets_partition_not_found() {
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
fn a_subpartition_out_of_range_fails_only_that_receiver() {
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
fn a_second_reader_of_a_subpartition_gets_already_consumed() {
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
fn a_cancel_stops_the_stream_and_the_writer_keeps_serving_other_subpartitions() {
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
fn a_two_requests_on_one_connection_are_served_round_robin() {
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
fn a_client_going_away_fails_the_writer() {
    let env = env_with(true, |_| {});
    let (mut w, _) = write(&env, "p", 1, Partitioner::Forward, 2, 10);
    let mut p = connect(&env);
    p.send(&[request("p", 0, 1, 1)]);
    data(p.recv());
    drop(p);
    let deadline = Instant::now() + IO_TIMEOUT;
    let err = loop {
        match w.write(&batch(0, 10), &mut wait()) {
            Ok(()) => assert!(Instant::now() < deadline, "the writer never noticed"),
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(matches!(err, Error::ConnectionLost(_)), "{err}");
}

/// A client sends `bytes` (after the handshake if `handshake`): the environment closes that
/// connection, after the handshake with a fatal Protocol ErrorResponse first, and keeps
/// serving other clients.
fn bad_bytes_close_the_connection(bytes: &[u8], handshake: bool) {
    let env = env_with(true, |_| {});
    let mut p = if handshake {
        connect(&env)
    } else {
        Peer::new(TcpStream::connect(env.address()).unwrap())
    };
    p.send_raw(bytes);
    let got = p.recv_until_closed(IO_TIMEOUT);
    let fatal = |m: &Message<'_>| {
        matches!(
            m,
            Message::ErrorResponse {
                receiver: None,
                kind: ErrorKind::Protocol,
                ..
            }
        )
    };
    assert!(got.iter().all(fatal), "{got:?}");
    if handshake {
        assert_eq!(got.len(), 1, "{got:?}");
    }
    assert_serves(&env);
}

#[test]
fn a_garbage_before_the_handshake_closes_the_connection() {
    bad_bytes_close_the_connection(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false);
}

#[test]
fn a_wrong_magic_closes_the_connection() {
    let mut bytes = Vec::new();
    encode(&add_credit(1, 1), &mut bytes).unwrap();
    bytes[4..8].copy_from_slice(b"XXXX");
    bad_bytes_close_the_connection(&bytes, true);
}

#[test]
fn a_frame_length_2_pow_31_closes_the_connection() {
    bad_bytes_close_the_connection(&(1u32 << 31).to_le_bytes(), true);
}

#[test]
fn a_frame_length_2_pow_31_before_the_handshake_closes_the_connection() {
    bad_bytes_close_the_connection(&(1u32 << 31).to_le_bytes(), false);
}

#[test]
fn a_data_buffer_from_a_client_closes_the_connection() {
    let mut bytes = Vec::new();
    encode(&data_msg(ReceiverId(1), 0, 0, b"not for a server"), &mut bytes).unwrap();
    bad_bytes_close_the_connection(&bytes, true);
}

#[test]
fn a_wrong_protocol_version_in_hello_is_refused() {
    let env = env_with(true, |_| {});
    // Version 1 peers count credit differently (no record body buffers), version 2 peers
    // start records without record grants, version 3 peers send a shorter Hello (no
    // shared-memory block), version 4 peers do not know SharedBuffer, version 5 peers refuse
    // data buffers longer than a segment: refused too, with the versions named.
    assert_eq!(PROTOCOL_VERSION, 6);
    for version in [1, 2, 3, 4, 5, PROTOCOL_VERSION + 1] {
        let mut p = Peer::new(TcpStream::connect(env.address()).unwrap());
        p.send(&[Message::Hello(Hello {
            version,
            ..hello(SEG)
        })]);
        let got = p.recv_until_closed(IO_TIMEOUT);
        assert!(
            matches!(
                got.as_slice(),
                [Message::ErrorResponse {
                    receiver: None,
                    kind: ErrorKind::Protocol,
                    message,
                }] if message.contains(&format!("protocol version {version}, this side {PROTOCOL_VERSION}"))
            ),
            "version {version}: {got:?}"
        );
    }
    assert_serves(&env);
}

#[test]
fn a_silent_client_is_dropped_after_the_handshake_timeout() {
    let env = env_with(true, |c| c.handshake_timeout = Duration::from_millis(300));
    let t = Instant::now();
    let mut p = Peer::new(TcpStream::connect(env.address()).unwrap());
    let got = p.recv_until_closed(Duration::from_secs(30));
    assert!(got.is_empty(), "{got:?}");
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "dropped after {:?}",
        t.elapsed()
    );
    assert_serves(&env);
}

// ---------------------------------------------------------------------------------------------
// Direction A: limits against abusive clients
// ---------------------------------------------------------------------------------------------

/// The message of a fatal LimitExceeded ErrorResponse, or a panic.
fn limit_refusal(msg: &Message<'_>) -> String {
    match msg {
        Message::ErrorResponse {
            receiver: None,
            kind: ErrorKind::LimitExceeded,
            message,
        } => message.clone(),
        other => panic!("expected a fatal LimitExceeded ErrorResponse, got {other:?}"),
    }
}

#[test]
fn a_slowloris_client_sending_one_byte_at_a_time_is_dropped() {
    let env = env_with(true, |c| c.handshake_timeout = Duration::from_millis(500));
    let mut hello_bytes = Vec::new();
    encode(&Message::Hello(hello(SEG)), &mut hello_bytes).unwrap();
    let mut p = Peer::new(TcpStream::connect(env.address()).unwrap());
    let mut sent = 0;
    let closed = loop {
        if sent == hello_bytes.len() {
            break false;
        }
        if p.stream.write_all(&hello_bytes[sent..sent + 1]).is_err() {
            break true;
        }
        sent += 1;
        match p.next_within(Duration::from_millis(100)) {
            Got::Quiet => {}
            Got::Closed => break true,
            Got::Msg(m) => panic!("a slowloris client got {m:?}"),
        }
    };
    assert!(
        closed,
        "the whole Hello went out one byte per 100 ms ({} bytes) without being dropped",
        hello_bytes.len()
    );
    assert!(sent < hello_bytes.len(), "dropped only after {sent} bytes");
    assert_serves(&env);
}

#[test]
fn a_connection_over_max_connections_is_refused_and_the_others_are_served() {
    let env = env_with(true, |c| c.limits.max_connections = 2);
    let mut first = connect(&env);
    let mut second = connect(&env);
    // The third gets a refusal naming the limit in answer to its Hello, then the end.
    let mut third = Peer::new(TcpStream::connect(env.address()).unwrap());
    third.send(&[Message::Hello(hello(SEG))]);
    let got = third.recv_until_closed(IO_TIMEOUT);
    assert_eq!(got.len(), 1, "{got:?}");
    let message = limit_refusal(&got[0]);
    assert!(message.contains("max_connections=2"), "{message}");
    // The two connections in use are still served.
    for (p, rid) in [(&mut first, 1), (&mut second, 2)] {
        p.send(&[request("nope", 0, rid, 1)]);
        assert!(matches!(p.recv(), Message::PartitionNotFound { receiver } if receiver == ReceiverId(rid)));
    }
    // Once one of them closes, its slot is free again (released when the server sees the end).
    drop(first);
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let mut p = Peer::new(TcpStream::connect(env.address()).unwrap());
        p.send(&[Message::Hello(hello(SEG))]);
        match p.recv() {
            Message::HelloAck { .. } => break,
            other => {
                limit_refusal(&other);
                assert!(
                    Instant::now() < deadline,
                    "the closed connection's slot never came back"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[test]
fn a_channel_over_max_channels_per_connection_is_refused_and_the_others_are_served() {
    let env = env_with(true, |c| c.limits.max_channels_per_connection = 2);
    let (mut w, _) = write(&env, "p", 3, Partitioner::Broadcast, 1, 10);
    w.close().unwrap();
    let mut p = connect(&env);
    p.send(&[
        request("p", 0, 1, 8),
        request("p", 1, 2, 8),
        request("p", 2, 3, 8),
    ]);
    let mut ended = Vec::new();
    let mut refused = None;
    while ended.len() < 2 || refused.is_none() {
        match p.recv() {
            Message::ErrorResponse {
                receiver: Some(ReceiverId(3)),
                kind: ErrorKind::LimitExceeded,
                message,
            } => refused = Some(message),
            Message::BufferResponse(b) if matches!(b.payload, Payload::Event(Event::EndOfPartition)) => {
                ended.push(b.receiver.0)
            }
            Message::BufferResponse(b) => assert!([1, 2].contains(&b.receiver.0), "{b:?}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    ended.sort();
    assert_eq!(ended, [1, 2]);
    assert!(refused.unwrap().contains("max_channels_per_connection=2"));
    // Ended channels no longer count: the third subpartition can be read now.
    p.send(&[request("p", 2, 4, 8)]);
    assert_eq!(recv_to_end(&mut p, 4, 0).len(), 1);
}

#[test]
fn a_client_that_never_reads_its_answers_is_closed_at_max_outstanding_requests() {
    let env = env_with(true, |c| c.limits.max_outstanding_requests = 4);
    let p = connect(&env);
    // Requests for a partition that does not exist, each answered PartitionNotFound, sent
    // without reading until the environment closes the connection (the answers fill both
    // socket buffers first, then the environment's queue).
    let mut stream = p.stream.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut chunk = Vec::new();
        for rid in 0..1000u64 {
            encode(&request("nope", 0, rid, 1), &mut chunk).unwrap();
        }
        let mut sent = 0usize;
        while sent < 1 << 30 {
            if stream.write_all(&chunk).is_err() {
                return sent;
            }
            sent += chunk.len();
        }
        panic!("the environment read 1 GiB of requests without closing the connection");
    });
    let sent = writer.join().unwrap();
    assert!(sent > 0);
    // What did arrive is answers, and at most the refusal at the end.
    let mut p = p;
    let got = p.recv_until_closed(Duration::from_secs(60));
    for (i, m) in got.iter().enumerate() {
        match m {
            Message::PartitionNotFound { .. } => {}
            m if i + 1 == got.len() => {
                assert!(limit_refusal(m).contains("max_outstanding_requests=4"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_serves(&env);
}

// ---------------------------------------------------------------------------------------------
// Direction B: scripted server against a gate
// ---------------------------------------------------------------------------------------------

/// A gate of a real environment reading subpartition 0 of "p" from a scripted server.
struct Scripted {
    gate: InputGate,
    peer: Peer,
    rid: ReceiverId,
    /// The stream encoder of the channel (the first record carries the schema).
    enc: Option<BatchEncoder>,
    /// The gate's environment (dropped last).
    env: NetworkEnvironment,
}

fn accept(listener: &TcpListener) -> TcpStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return s;
            }
            Err(e) if e.kind() == IoErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "the environment never connected");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Creates the environment and its gate, accepts the gate's connection, does the server side
/// of the handshake and reads the PartitionRequest.
fn scripted(cfg: impl FnOnce(&mut EnvConfig)) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let env = env_with(true, cfg);
    let gate = env
        .create_input_gate(vec![ChannelSpec {
            address: listener.local_addr().unwrap().to_string(),
            partition_id: "p".into(),
            subpartition: 0,
        }])
        .unwrap();
    let mut peer = Peer::new(accept(&listener));
    match peer.recv() {
        Message::Hello(h) => {
            let ours = hello(SEG);
            assert_eq!(
                (h.version, h.segment_size, h.max_frame_size, h.auth),
                (ours.version, ours.segment_size, ours.max_frame_size, ours.auth)
            );
        }
        other => panic!("expected Hello, got {other:?}"),
    }
    peer.send(&[Message::HelloAck {
        hello: hello(SEG),
        tag: NO_TAG,
    }]);
    match peer.recv() {
        Message::AuthProof { tag } => assert_eq!(tag, NO_TAG),
        other => panic!("expected AuthProof, got {other:?}"),
    }
    peer.negotiated(SEG);
    let rid = expect_request(&mut peer, &env);
    grant_all_records(&mut peer, rid);
    Scripted {
        gate,
        peer,
        rid,
        enc: None,
        env,
    }
}

/// Reads the gate's PartitionRequest for "p"[0]: its credit is the exclusive buffers.
fn expect_request(peer: &mut Peer, env: &NetworkEnvironment) -> ReceiverId {
    match peer.recv() {
        Message::PartitionRequest {
            partition_id,
            subpartition,
            receiver,
            initial_credit,
        } => {
            assert_eq!((partition_id.as_str(), subpartition), ("p", 0));
            assert_eq!(initial_credit, Credit::new(env.config().exclusive_buffers as u32));
            receiver
        }
        other => panic!("expected PartitionRequest, got {other:?}"),
    }
}

/// Protocol version 3: asks for more record bytes than any script sends; the empty gate grants
/// them at once (a record may start while the gate is under its budget, whatever its size).
fn grant_all_records(peer: &mut Peer, receiver: ReceiverId) {
    const ALL: u64 = 1 << 40;
    peer.send(&[Message::RecordAnnouncement { receiver, bytes: ALL }]);
    match peer.recv() {
        Message::RecordGrant { receiver: r, bytes } => assert_eq!((r, bytes), (receiver, ALL)),
        other => panic!("expected RecordGrant, got {other:?}"),
    }
}

impl Scripted {
    /// Sends `batches` as the next records of the channel's stream, cut into `SEG`-sized data
    /// buffers from sequence number `first_seq`, the last with backlog 0; returns the next
    /// sequence number.
    fn send_batches(&mut self, batches: &[RecordBatch], first_seq: u64) -> u64 {
        let mut bytes = Vec::new();
        encode_records(&mut self.enc, batches, &mut bytes);
        let chunks: Vec<&[u8]> = bytes.chunks(SEG).collect();
        let n = chunks.len() as u64;
        let msgs: Vec<Message<'static>> = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| data_msg(self.rid, first_seq + i as u64, (n - 1 - i as u64) as u32, c))
            .collect();
        self.peer.send(&msgs);
        first_seq + n
    }

    fn send_end(&mut self, seq: u64) {
        self.peer
            .send(&[Message::event(self.rid, seq, 0, Event::EndOfPartition)]);
    }

    /// AddCredits for our receiver until they sum to `total`, then nothing more.
    fn expect_credit(&mut self, total: u32) {
        let mut sum = 0;
        while sum < total {
            match self.peer.recv() {
                Message::AddCredit { receiver, credit } => {
                    assert_eq!(receiver, self.rid);
                    sum += credit.get();
                }
                other => panic!("expected AddCredit, got {other:?}"),
            }
        }
        assert_eq!(sum, total);
        self.peer.assert_quiet();
    }

    /// The environment reports a protocol error to us and closes; returns its message.
    /// Waiting for this before touching the gate keeps the consumer from recycling buffers
    /// (and granting credit) while the script runs.
    fn expect_fatal_protocol_error(&mut self) -> String {
        let got = self.peer.recv_until_closed(IO_TIMEOUT);
        for m in &got {
            match m {
                Message::ErrorResponse {
                    receiver: None,
                    kind: ErrorKind::Protocol,
                    message,
                } => return message.clone(),
                Message::AddCredit { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        panic!("no fatal ErrorResponse before the close: {got:?}")
    }

    /// Sends `b` as the next record and then end-of-partition: the gate yields `b`, then ends.
    fn finish_with(&mut self, b: RecordBatch, seq: u64) {
        let seq = self.send_batches(std::slice::from_ref(&b), seq);
        self.send_end(seq);
        self.read_to_end(b);
    }

    /// The gate yields `b`, then ends.
    fn read_to_end(&mut self, b: RecordBatch) {
        assert_eq!(self.gate.next(&mut wait()).unwrap(), Some(b));
        assert_eq!(self.gate.next(&mut wait()).unwrap(), None);
    }

    /// The gate fails with an error that `expected` accepts.
    fn assert_gate_fails(&mut self, expected: impl Fn(&Error) -> bool) {
        let err = self.gate_error();
        assert!(expected(&err), "unexpected gate error: {err}");
    }

    /// Reads the gate until it fails; returns the error.
    fn gate_error(&mut self) -> Error {
        for _ in 0..1000 {
            match self.gate.next(&mut wait()) {
                Ok(Some(_)) => {}
                Ok(None) => panic!("the gate ended instead of failing"),
                Err(e) => return e,
            }
        }
        panic!("the gate never failed")
    }
}

#[test]
fn b_data_buffers_become_the_batch() {
    let mut s = scripted(|_| {});
    let b = batch(0, 300);
    // One record across both exclusive buffers, the first a full segment.
    let seq = s.send_batches(std::slice::from_ref(&b), 0);
    assert_eq!(seq, 2, "the record should span two segments");
    s.send_end(seq);
    s.read_to_end(b);
}

#[test]
fn b_end_of_partition_ends_the_gate() {
    let mut s = scripted(|_| {});
    s.send_end(0);
    assert_eq!(s.gate.next(&mut wait()).unwrap(), None);
}

#[test]
fn b_consumer_reading_returns_credit() {
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
fn b_backlog_in_a_buffer_makes_the_gate_grant_floating_buffers() {
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
fn b_backlog_announcement_without_exclusive_buffers_gets_floating_credit() {
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
fn b_sequence_gap_is_a_protocol_error() {
    let mut s = scripted(|_| {});
    let bytes = record_stream(&[batch(0, 10)]);
    s.peer.send(&[data_msg(s.rid, 1, 0, &bytes)]);
    let msg = s.expect_fatal_protocol_error();
    assert!(msg.contains("sequence"), "{msg}");
    s.assert_gate_fails(|e| matches!(e, Error::Protocol(_)));
}

#[test]
fn b_data_without_credit_is_a_protocol_error() {
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
fn b_record_body_buffers_need_no_credit() {
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
fn b_a_record_longer_than_max_record_size_fails_the_channel() {
    let mut s = scripted(|c| c.max_record_size = 1000);
    let bytes = record_stream(&[batch(0, 100)]);
    assert!(bytes.len() > 1000 && bytes.len() <= SEG);
    s.peer.send(&[data_msg(s.rid, 0, 0, &bytes)]);
    s.assert_gate_fails(|e| matches!(e, Error::Protocol(m) if m.contains("record length")));
}

#[test]
fn b_end_of_partition_inside_a_record_is_a_protocol_error() {
    let mut s = scripted(|_| {});
    let bytes = record_stream(&[batch(0, 300)]);
    assert!(bytes.len() > SEG);
    s.peer.send(&[data_msg(s.rid, 0, 0, &bytes[..SEG])]);
    s.send_end(1);
    s.assert_gate_fails(|e| matches!(e, Error::Protocol(m) if m.contains("middle of a record")));
}

#[test]
fn b_oversized_frame_is_a_protocol_error() {
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

/// The stream of one record of `rows` rows, and the record's length with its prefix.
fn one_record(s: &mut Scripted, rows: usize) -> (Vec<u8>, usize) {
    let mut bytes = Vec::new();
    encode_records(&mut s.enc, &[batch(0, rows)], &mut bytes);
    let len = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(len, bytes.len());
    (bytes, len)
}

#[test]
fn b_bulk_buffers_inside_a_record_are_read_into_it() {
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

#[test]
fn b_a_long_buffer_past_its_record_is_a_protocol_error() {
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
fn b_peer_closing_mid_buffer_is_connection_lost() {
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

#[test]
fn b_error_response_for_the_receiver_fails_the_gate() {
    let mut s = scripted(|_| {});
    let msg = Message::error_response(Some(s.rid), ErrorKind::ProducerFailed, "boom");
    s.peer.send(&[msg]);
    s.assert_gate_fails(|e| matches!(e, Error::ProducerFailed(m) if m == "boom"));
}

#[test]
fn b_producer_failed_event_comes_after_the_data_before_it() {
    let mut s = scripted(|_| {});
    let b = batch(0, 10);
    let seq = s.send_batches(std::slice::from_ref(&b), 0);
    let failed = Event::producer_failed("writer died");
    s.peer.send(&[Message::event(s.rid, seq, 0, failed)]);
    assert_eq!(s.gate.next(&mut wait()).unwrap(), Some(b));
    s.assert_gate_fails(|e| matches!(e, Error::ProducerFailed(m) if m == "writer died"));
}

#[test]
fn b_data_for_an_unknown_receiver_is_skipped() {
    let mut s = scripted(|_| {});
    let stranger = ReceiverId(s.rid.0 + 1000);
    s.peer.send(&[data_msg(stranger, 0, 0, &[0xAB; SEG])]);
    s.finish_with(batch(0, 10), 0);
}

#[test]
fn b_partition_not_found_is_retried_with_backoff_then_fails() {
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
fn b_closing_the_gate_early_cancels_the_request() {
    let mut s = scripted(|_| {});
    s.gate.close();
    match s.peer.recv() {
        Message::CancelPartitionRequest { receiver } => assert_eq!(receiver, s.rid),
        other => panic!("expected CancelPartitionRequest, got {other:?}"),
    }
}

#[test]
fn b_client_only_message_from_the_server_is_a_protocol_error() {
    let mut s = scripted(|_| {});
    s.peer.send(&[add_credit(s.rid.0, 1)]);
    s.expect_fatal_protocol_error();
    s.assert_gate_fails(|e| matches!(e, Error::Protocol(_)));
}

// ---------------------------------------------------------------------------------------------
// Buffer debloating: NewBufferSize (receiver → sender)
// ---------------------------------------------------------------------------------------------

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
fn a_new_buffer_size_cuts_later_buffers_handoff() {
    new_buffer_size_cuts_later_buffers(true);
}

#[test]
fn a_new_buffer_size_cuts_later_buffers_serialized() {
    new_buffer_size_cuts_later_buffers(false);
}

#[test]
fn a_new_buffer_size_for_an_unknown_receiver_is_ignored() {
    let env = env_with(true, |_| {});
    let mut p = connect(&env);
    p.send(&[Message::NewBufferSize {
        receiver: ReceiverId(42),
        size: 512,
    }]);
    p.assert_quiet();
    assert_serves(&env);
}

#[test]
fn a_zero_new_buffer_size_closes_the_connection() {
    let mut bytes = Vec::new();
    encode(
        &Message::NewBufferSize {
            receiver: ReceiverId(1),
            size: 1,
        },
        &mut bytes,
    )
    .unwrap();
    let n = bytes.len();
    bytes[n - 4..].copy_from_slice(&0u32.to_le_bytes());
    bad_bytes_close_the_connection(&bytes, true);
}

#[test]
fn a_new_buffer_size_over_the_segment_size_closes_the_connection() {
    let mut bytes = Vec::new();
    encode(
        &Message::NewBufferSize {
            receiver: ReceiverId(1),
            size: SEG as u32 + 1,
        },
        &mut bytes,
    )
    .unwrap();
    bad_bytes_close_the_connection(&bytes, true);
}
