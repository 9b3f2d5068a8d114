//! A scripted server that the environment's gate connects to: the server side of the
//! handshake, the gate's request and record grant, and the channel's stream sent in buffers.

use std::io::ErrorKind as IoErrorKind;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use creditflow_core::base::config::ChannelSpec;
use creditflow_core::base::error::Error;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::gate::InputGate;
use creditflow_core::protocol::credit::Credit;
use creditflow_core::protocol::wire::{ErrorKind, Event, Message, ReceiverId};
use creditflow_core::serde::BatchEncoder;

use super::{batch, data_msg, encode_records, env_with, hello, wait, Peer, IO_TIMEOUT, NO_TAG, SEG};

/// A gate of a real environment reading subpartition 0 of "p" from a scripted server.
pub struct Scripted {
    pub gate: InputGate,
    pub peer: Peer,
    pub rid: ReceiverId,
    /// The stream encoder of the channel (the first record carries the schema).
    pub enc: Option<BatchEncoder>,
    /// The gate's environment (dropped last).
    pub env: NetworkEnvironment,
}

pub fn accept(listener: &TcpListener) -> TcpStream {
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
pub fn scripted(cfg: impl FnOnce(&mut EnvConfig)) -> Scripted {
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
pub fn expect_request(peer: &mut Peer, env: &NetworkEnvironment) -> ReceiverId {
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
pub fn grant_all_records(peer: &mut Peer, receiver: ReceiverId) {
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
    pub fn send_batches(&mut self, batches: &[RecordBatch], first_seq: u64) -> u64 {
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

    pub fn send_end(&mut self, seq: u64) {
        self.peer
            .send(&[Message::event(self.rid, seq, 0, Event::EndOfPartition)]);
    }

    /// AddCredits for our receiver until they sum to `total`, then nothing more.
    pub fn expect_credit(&mut self, total: u32) {
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
    pub fn expect_fatal_protocol_error(&mut self) -> String {
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
    pub fn finish_with(&mut self, b: RecordBatch, seq: u64) {
        let seq = self.send_batches(std::slice::from_ref(&b), seq);
        self.send_end(seq);
        self.read_to_end(b);
    }

    /// The gate yields `b`, then ends.
    pub fn read_to_end(&mut self, b: RecordBatch) {
        assert_eq!(self.gate.next(&mut wait()).unwrap(), Some(b));
        assert_eq!(self.gate.next(&mut wait()).unwrap(), None);
    }

    /// The gate fails with an error that `expected` accepts.
    pub fn assert_gate_fails(&mut self, expected: impl Fn(&Error) -> bool) {
        let err = self.gate_error();
        assert!(expected(&err), "unexpected gate error: {err}");
    }

    /// Reads the gate until it fails; returns the error.
    pub fn gate_error(&mut self) -> Error {
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

/// The stream of one record of `rows` rows, and the record's length with its prefix.
pub fn one_record(s: &mut Scripted, rows: usize) -> (Vec<u8>, usize) {
    let mut bytes = Vec::new();
    encode_records(&mut s.enc, &[batch(0, rows)], &mut bytes);
    let len = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(len, bytes.len());
    (bytes, len)
}
