//! The scripted peer: environments and batches, the peer's end of a connection, and the
//! messages it sends and takes apart. [`client`] scripts a client against the environment's
//! listener, [`server`] a server that the environment's gate connects to.

pub mod client;
pub mod server;

use std::borrow::Cow;
use std::collections::VecDeque;
use std::io::{ErrorKind as IoErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType as ArrowType, Field, Schema};
use creditflow_core::base::wait::Wait;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use creditflow_core::protocol::credit::Credit;
use creditflow_core::protocol::wire::{
    encode, max_frame_size, AuthMode, BufferResponse, Decoder, Event, Hello, Message, Payload, ReceiverId,
    MAX_CONTROL_FRAME_LEN, NONCE_LEN, PROTOCOL_VERSION, TAG_LEN,
};
use creditflow_core::serde::{BatchEncoder, RecordDeserializer};

/// Segment size of every environment here (the smallest allowed): small buffers, many frames.
pub const SEG: usize = 4096;
/// How long to wait for something that must happen.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to listen when nothing may arrive.
pub const QUIET: Duration = Duration::from_millis(300);
/// The tag of a handshake without authentication.
pub const NO_TAG: [u8; TAG_LEN] = [0; TAG_LEN];

// ---------------------------------------------------------------------------------------------
// Environments, batches, records
// ---------------------------------------------------------------------------------------------

/// An environment with `SEG`-byte segments whose partly filled buffers are never flushed by
/// time (only full buffers and `close` make data readable, so buffer counts are exact).
pub fn env_with(handoff: bool, cfg: impl FnOnce(&mut EnvConfig)) -> NetworkEnvironment {
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

pub fn batch(start: i64, n: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", ArrowType::Int64, false),
        Field::new("s", ArrowType::Utf8, true),
    ]));
    let k = Int64Array::from_iter_values(start..start + n as i64);
    let s = StringArray::from_iter((0..n).map(|i| (i % 7 != 0).then(|| format!("row-{}", start + i as i64))));
    RecordBatch::try_new(schema, vec![Arc::new(k), Arc::new(s)]).unwrap()
}

pub fn wait() -> Wait<'static> {
    Wait::timeout(Some(IO_TIMEOUT), "scripted peer test")
}

/// Registers partition `id` and writes `n` batches of `rows` rows into it; returns the open
/// writer and the batches in the order written.
pub fn write(
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
pub fn write_and_close(env: &NetworkEnvironment, n: usize, rows: usize) -> Vec<RecordBatch> {
    let (mut w, batches) = write(env, "p", 1, Partitioner::Forward, n, rows);
    w.close().unwrap();
    batches
}

/// Appends `batches` to a subpartition stream encoded by `enc`: one record (u64 LE length +
/// Arrow IPC messages, the schema in the stream's first) per batch.
pub fn encode_records(enc: &mut Option<BatchEncoder>, batches: &[RecordBatch], out: &mut Vec<u8>) {
    for b in batches {
        let e = enc.get_or_insert_with(|| BatchEncoder::new(&b.schema()).unwrap());
        for chunk in e.encode(b).unwrap().chunks() {
            out.extend_from_slice(chunk);
        }
    }
}

/// A whole stream of `batches`.
pub fn record_stream(batches: &[RecordBatch]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_records(&mut None, batches, &mut out);
    out
}

/// Decodes the concatenated payloads of one channel; they must end on a record boundary.
pub fn decode_records<'a>(payloads: impl IntoIterator<Item = &'a [u8]>) -> Vec<RecordBatch> {
    let mut de = RecordDeserializer::new(1 << 30);
    let mut out = VecDeque::new();
    for p in payloads {
        de.push(p, &mut out).unwrap();
    }
    assert!(de.is_at_record_boundary(), "the stream ended inside a record");
    out.into()
}

// ---------------------------------------------------------------------------------------------
// The peer's end of a connection, and its messages
// ---------------------------------------------------------------------------------------------

/// What the peer read next.
#[derive(Debug)]
pub enum Got {
    Msg(Message<'static>),
    /// Nothing within the time given.
    Quiet,
    /// End of stream or reset.
    Closed,
}

/// One end of a connection, scripted by the test.
pub struct Peer {
    pub stream: TcpStream,
    dec: Decoder,
}

impl Peer {
    pub fn new(stream: TcpStream) -> Peer {
        stream.set_nodelay(true).unwrap();
        Peer {
            stream,
            dec: Decoder::new(MAX_CONTROL_FRAME_LEN),
        }
    }

    /// Encodes `msgs` and writes them with one write.
    pub fn send(&mut self, msgs: &[Message<'_>]) {
        let mut out = Vec::new();
        for m in msgs {
            encode(m, &mut out).unwrap();
        }
        self.send_raw(&out);
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// After the handshake: frames up to one segment of payload.
    pub fn negotiated(&mut self, segment_size: usize) {
        self.dec.set_max_frame_size(max_frame_size(segment_size));
    }

    pub fn next_within(&mut self, timeout: Duration) -> Got {
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

    pub fn recv(&mut self) -> Message<'static> {
        match self.next_within(IO_TIMEOUT) {
            Got::Msg(m) => m,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    pub fn assert_quiet(&mut self) {
        match self.next_within(QUIET) {
            Got::Quiet => {}
            other => panic!("expected nothing, got {other:?}"),
        }
    }

    /// Everything that arrives until the peer closes the connection (within `timeout`).
    pub fn recv_until_closed(&mut self, timeout: Duration) -> Vec<Message<'static>> {
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

pub fn hello(segment_size: usize) -> Hello {
    Hello {
        version: PROTOCOL_VERSION,
        segment_size: segment_size as u32,
        max_frame_size: max_frame_size(segment_size) as u32,
        auth: AuthMode::None,
        nonce: [7; NONCE_LEN],
        shm: None,
    }
}

pub fn request(partition_id: &str, subpartition: u32, rid: u64, credit: u32) -> Message<'static> {
    Message::PartitionRequest {
        partition_id: partition_id.into(),
        subpartition,
        receiver: ReceiverId(rid),
        initial_credit: Credit::new(credit),
    }
}

pub fn add_credit(rid: u64, credit: u32) -> Message<'static> {
    Message::AddCredit {
        receiver: ReceiverId(rid),
        credit: Credit::new(credit),
    }
}

pub fn data_msg(rid: ReceiverId, seq: u64, backlog: u32, payload: &[u8]) -> Message<'static> {
    Message::BufferResponse(BufferResponse {
        receiver: rid,
        sequence_number: seq,
        backlog,
        payload: Payload::Data(Cow::Owned(payload.to_vec())),
    })
}

/// A data BufferResponse, taken apart.
#[derive(Debug)]
pub struct Data {
    pub receiver: u64,
    pub seq: u64,
    pub backlog: u32,
    pub payload: Vec<u8>,
}

pub fn data(msg: Message<'static>) -> Data {
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
pub fn event(msg: Message<'static>) -> (u64, u64, u32, Event) {
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
