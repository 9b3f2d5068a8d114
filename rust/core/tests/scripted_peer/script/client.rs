//! A scripted client against the environment's listener: the handshake, a request for
//! written data, and reading a channel to its end.

use std::net::TcpStream;

use arrow_array::RecordBatch;
use creditflow_core::env::NetworkEnvironment;
use creditflow_core::protocol::wire::{
    max_frame_size, AuthMode, Event, Message, Payload, ReceiverId, PROTOCOL_VERSION,
};

use super::{data, event, hello, request, write_and_close, Data, Peer, NO_TAG, SEG};

/// Connects to `env` and does the client side of the handshake, offering `segment_size`.
pub fn connect_with_segment(env: &NetworkEnvironment, segment_size: usize) -> Peer {
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

pub fn connect(env: &NetworkEnvironment) -> Peer {
    connect_with_segment(env, SEG)
}

/// Writes `n` batches of `rows` rows into partition "p" of `env` and closes the writer; then
/// a client offering `SEG`-byte segments requests "p"[0] as receiver 1 with `credit`.
pub fn request_written(
    env: &NetworkEnvironment,
    n: usize,
    rows: usize,
    credit: u32,
) -> (Peer, Vec<RecordBatch>) {
    let written = write_and_close(env, n, rows);
    let mut p = connect(env);
    p.send(&[request("p", 0, 1, credit)]);
    (p, written)
}

/// A fresh, well-behaved client is still served: it gets an answer to a request.
pub fn assert_serves(env: &NetworkEnvironment) {
    let mut p = connect(env);
    p.send(&[request("no-such-partition", 0, 99, 1)]);
    match p.recv() {
        Message::PartitionNotFound { receiver } => assert_eq!(receiver, ReceiverId(99)),
        other => panic!("expected PartitionNotFound, got {other:?}"),
    }
}

/// Receives data BufferResponses for receiver `rid` up to and including its end-of-partition
/// event; checks sequence numbers (from `first_seq`, one up) and returns the data.
pub fn recv_to_end(p: &mut Peer, rid: u64, first_seq: u64) -> Vec<Data> {
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
