//! The attach protocol's messages and their bytes, without I/O: what a task and its host
//! service say on a session (control requests and replies) and on a link (batches, events and
//! the writer's or gate's other calls, in order).
//!
//! Every message is one frame: `u32` frame length (the whole frame, these 4 bytes included),
//! `u8` message type, the body. Integers are little-endian; a string is a `u32` byte length
//! and UTF-8 bytes. A decoder takes exactly one frame's body and refuses anything left over.
//! Both ends are processes of one user on one host (checked with `SO_PEERCRED`), so the limits
//! here guard against bugs and garbage, not against an adversary.

use std::time::Duration;

use crate::base::config::ChannelSpec;
use crate::base::error::{Error, Result};
use crate::partition::spill::SpillKind;
use crate::partition::Partitioner;
use crate::serde::Compression;

/// Bytes of a frame's header: length and type.
pub(crate) const FRAME_HEADER: usize = 5;
/// Largest control frame (metrics of a gate with many channels are the largest).
pub(crate) const MAX_CONTROL_FRAME: usize = 64 << 20;

/// Frame types. Connection openers, control, then link frames.
pub(crate) mod ty {
    pub(crate) const ATTACH: u8 = 1;
    pub(crate) const LINK: u8 = 2;
    pub(crate) const WELCOME: u8 = 3;
    pub(crate) const REFUSED: u8 = 4;
    pub(crate) const REQUEST: u8 = 10;
    pub(crate) const REPLY: u8 = 11;
    /// A record (a batch) inline: `channel u32`, `in_flight` ids, then the record's bytes.
    pub(crate) const RECORD: u8 = 20;
    /// A record in the link's heap: `channel u32`, `in_flight` ids, `start u64`, `len u64`.
    pub(crate) const RECORD_ITEM: u8 = 21;
    pub(crate) const EVENT: u8 = 22;
    pub(crate) const BARRIER: u8 = 23;
    pub(crate) const ABORTED: u8 = 24;
    pub(crate) const FLUSH: u8 = 25;
    pub(crate) const CLOSE: u8 = 26;
    pub(crate) const FAIL: u8 = 27;
    pub(crate) const END: u8 = 28;
    pub(crate) const ERROR: u8 = 29;
    /// The service's answer to a writer's barrier or close.
    pub(crate) const ACK: u8 = 30;
}

/// Appends one frame: header, then what `body` writes.
pub(crate) fn frame(ty: u8, body: impl FnOnce(&mut Out)) -> Vec<u8> {
    let mut out = Out(vec![0; FRAME_HEADER]);
    out.0[4] = ty;
    body(&mut out);
    let len = out.0.len() as u32;
    out.0[..4].copy_from_slice(&len.to_le_bytes());
    out.0
}

/// A frame's header: its whole length and type; an error for a length out of bounds.
pub(crate) fn header(bytes: [u8; FRAME_HEADER], max: usize) -> Result<(usize, u8)> {
    let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
    if len < FRAME_HEADER || len > max {
        return Err(Error::Protocol(format!(
            "attach frame of {len} bytes (at least {FRAME_HEADER}, at most {max})"
        )));
    }
    Ok((len, bytes[4]))
}

/// A body being written.
#[derive(Default)]
pub(crate) struct Out(Vec<u8>);

impl Out {
    /// The bytes written.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.0
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn f64(&mut self, v: f64) {
        self.u64(v.to_bits());
    }
    pub(crate) fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    pub(crate) fn usize(&mut self, v: usize) {
        self.u64(v as u64);
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
    }
    pub(crate) fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
    pub(crate) fn u64s(&mut self, v: &[u64]) {
        self.u32(v.len() as u32);
        for x in v {
            self.u64(*x);
        }
    }
}

/// A body being read; every read checks that the bytes are there.
pub(crate) struct In<'a>(&'a [u8]);

fn short() -> Error {
    Error::Protocol("attach frame ends early".into())
}

impl<'a> In<'a> {
    pub(crate) fn new(body: &'a [u8]) -> In<'a> {
        In(body)
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(short());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub(crate) fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_bits(self.u64()?))
    }
    pub(crate) fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(Error::Protocol(format!("attach frame: {b} is not a boolean"))),
        }
    }
    pub(crate) fn usize(&mut self) -> Result<usize> {
        usize::try_from(self.u64()?).map_err(|_| Error::Protocol("attach frame: a size out of range".into()))
    }
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub(crate) fn str(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?.to_vec())
            .map_err(|_| Error::Protocol("attach frame: a string is not UTF-8".into()))
    }
    pub(crate) fn u64s(&mut self) -> Result<Vec<u64>> {
        let n = self.u32()? as usize;
        if n > self.0.len() / 8 {
            return Err(short());
        }
        (0..n).map(|_| self.u64()).collect()
    }
    /// The rest of the body.
    #[cfg(test)]
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
    /// Refuses bytes left over.
    pub(crate) fn end(&self) -> Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Error::Protocol(format!(
                "attach frame has {} bytes too many",
                self.0.len()
            )))
        }
    }
}

/// How a task's first connection opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Opening {
    /// A session: the task's pid and the pid of the process it belongs to (a Spark executor;
    /// 0: none), whose end may end the service.
    Attach { pid: u32, owner: u32 },
    /// A link the session asked for.
    Link { session: u64, link: u64 },
}

impl Opening {
    pub(crate) fn encode(&self) -> Vec<u8> {
        match *self {
            Opening::Attach { pid, owner } => frame(ty::ATTACH, |o| {
                o.u32(pid);
                o.u32(owner);
            }),
            Opening::Link { session, link } => frame(ty::LINK, |o| {
                o.u64(session);
                o.u64(link);
            }),
        }
    }

    pub(crate) fn decode(ty: u8, body: &[u8]) -> Result<Opening> {
        let mut i = In::new(body);
        let m = match ty {
            ty::ATTACH => Opening::Attach {
                pid: i.u32()?,
                owner: i.u32()?,
            },
            ty::LINK => Opening::Link {
                session: i.u64()?,
                link: i.u64()?,
            },
            t => {
                return Err(Error::Protocol(format!(
                    "attach: unexpected opening frame type {t}"
                )))
            }
        };
        i.end()?;
        Ok(m)
    }
}

/// The service's answer to an `Attach`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Welcome {
    /// The session's id (links name it).
    pub(crate) session: u64,
    /// The service's pid (the task checks its links' peer against it).
    pub(crate) pid: u32,
    /// The service's address: what peers put in their channel specs.
    pub(crate) address: String,
    /// The host's `memory` and `segment_size`.
    pub(crate) memory: u64,
    pub(crate) segment_size: u64,
}

impl Welcome {
    pub(crate) fn encode(&self) -> Vec<u8> {
        frame(ty::WELCOME, |o| {
            o.u64(self.session);
            o.u32(self.pid);
            o.str(&self.address);
            o.u64(self.memory);
            o.u64(self.segment_size);
        })
    }

    pub(crate) fn decode(body: &[u8]) -> Result<Welcome> {
        let mut i = In::new(body);
        let w = Welcome {
            session: i.u64()?,
            pid: i.u32()?,
            address: i.str()?,
            memory: i.u64()?,
            segment_size: i.u64()?,
        };
        i.end()?;
        Ok(w)
    }
}

/// The kinds of partition a task may create (`"pipelined"` when `None`).
fn kind_code(kind: Option<SpillKind>) -> u8 {
    match kind {
        None => 0,
        Some(SpillKind::Blocking) => 1,
        Some(SpillKind::Hybrid { replay: false }) => 2,
        Some(SpillKind::Hybrid { replay: true }) => 3,
    }
}

fn kind_of(code: u8) -> Result<Option<SpillKind>> {
    Ok(match code {
        0 => None,
        1 => Some(SpillKind::Blocking),
        2 => Some(SpillKind::Hybrid { replay: false }),
        3 => Some(SpillKind::Hybrid { replay: true }),
        c => return Err(Error::Protocol(format!("attach: unknown partition kind {c}"))),
    })
}

fn compression_code(c: Option<Compression>) -> u8 {
    match c {
        None => 0,
        Some(Compression::Lz4) => 1,
        Some(Compression::Zstd) => 2,
    }
}

fn compression_of(code: u8) -> Result<Option<Compression>> {
    Ok(match code {
        0 => None,
        1 => Some(Compression::Lz4),
        2 => Some(Compression::Zstd),
        c => return Err(Error::Protocol(format!("attach: unknown compression {c}"))),
    })
}

fn put_partitioner(o: &mut Out, p: &Partitioner) {
    match p {
        Partitioner::Hash(keys) => {
            o.u8(0);
            o.u32(keys.len() as u32);
            for k in keys {
                o.str(k);
            }
        }
        Partitioner::RoundRobin => o.u8(1),
        Partitioner::Broadcast => o.u8(2),
        Partitioner::Forward => o.u8(3),
    }
}

fn get_partitioner(i: &mut In<'_>) -> Result<Partitioner> {
    Ok(match i.u8()? {
        0 => {
            let n = i.u32()?;
            let keys = (0..n).map(|_| i.str()).collect::<Result<Vec<_>>>()?;
            Partitioner::Hash(keys)
        }
        1 => Partitioner::RoundRobin,
        2 => Partitioner::Broadcast,
        3 => Partitioner::Forward,
        c => return Err(Error::Protocol(format!("attach: unknown partitioner {c}"))),
    })
}

/// What a task asks of its service on the session.
#[derive(Debug, Clone)]
pub(crate) enum Request {
    /// A partition of `subpartitions`, pipelined (`kind` `None`), blocking or hybrid.
    CreatePartition {
        id: String,
        subpartitions: u32,
        kind: Option<SpillKind>,
        compression: Option<Compression>,
    },
    /// A writer link into `partition` through `partitioner`.
    OpenWriter {
        partition: String,
        partitioner: Partitioner,
    },
    /// A gate over `specs` and its link.
    CreateGate { specs: Vec<ChannelSpec> },
    /// Releases a partition.
    Release { partition: String },
    /// Answered once the partition is consumed (or `timeout` ran out).
    WaitConsumed {
        partition: String,
        timeout: Option<Duration>,
    },
    /// Makes a partition's partly filled buffers readable.
    Flush { partition: String },
    /// Whether a partition is finished and released.
    PartitionState { partition: String },
    /// A partition's metrics.
    PartitionMetrics { partition: String },
    /// A gate's metrics (by its link).
    GateMetrics { link: u64 },
    /// The service's metrics (pool, connections).
    ServiceMetrics,
}

impl Request {
    pub(crate) fn encode(&self, id: u64) -> Vec<u8> {
        frame(ty::REQUEST, |o| {
            o.u64(id);
            match self {
                Request::CreatePartition {
                    id,
                    subpartitions,
                    kind,
                    compression,
                } => {
                    o.u8(1);
                    o.str(id);
                    o.u32(*subpartitions);
                    o.u8(kind_code(*kind));
                    o.u8(compression_code(*compression));
                }
                Request::OpenWriter {
                    partition,
                    partitioner,
                } => {
                    o.u8(2);
                    o.str(partition);
                    put_partitioner(o, partitioner);
                }
                Request::CreateGate { specs } => {
                    o.u8(3);
                    o.u32(specs.len() as u32);
                    for s in specs {
                        o.str(&s.address);
                        o.str(&s.partition_id);
                        o.u64(s.subpartition as u64);
                    }
                }
                Request::Release { partition } => {
                    o.u8(4);
                    o.str(partition);
                }
                Request::WaitConsumed { partition, timeout } => {
                    o.u8(5);
                    o.str(partition);
                    o.u64(timeout.map_or(u64::MAX, |t| t.as_millis().min(u64::MAX as u128 - 1) as u64));
                }
                Request::Flush { partition } => {
                    o.u8(6);
                    o.str(partition);
                }
                Request::PartitionState { partition } => {
                    o.u8(7);
                    o.str(partition);
                }
                Request::PartitionMetrics { partition } => {
                    o.u8(8);
                    o.str(partition);
                }
                Request::GateMetrics { link } => {
                    o.u8(9);
                    o.u64(*link);
                }
                Request::ServiceMetrics => o.u8(10),
            }
        })
    }

    pub(crate) fn decode(body: &[u8]) -> Result<(u64, Request)> {
        let mut i = In::new(body);
        let id = i.u64()?;
        let r = match i.u8()? {
            1 => Request::CreatePartition {
                id: i.str()?,
                subpartitions: i.u32()?,
                kind: kind_of(i.u8()?)?,
                compression: compression_of(i.u8()?)?,
            },
            2 => Request::OpenWriter {
                partition: i.str()?,
                partitioner: get_partitioner(&mut i)?,
            },
            3 => {
                let n = i.u32()?;
                let mut specs = Vec::new();
                for _ in 0..n {
                    specs.push(ChannelSpec {
                        address: i.str()?,
                        partition_id: i.str()?,
                        subpartition: i.usize()?,
                    });
                }
                Request::CreateGate { specs }
            }
            4 => Request::Release { partition: i.str()? },
            5 => Request::WaitConsumed {
                partition: i.str()?,
                timeout: match i.u64()? {
                    u64::MAX => None,
                    ms => Some(Duration::from_millis(ms)),
                },
            },
            6 => Request::Flush { partition: i.str()? },
            7 => Request::PartitionState { partition: i.str()? },
            8 => Request::PartitionMetrics { partition: i.str()? },
            9 => Request::GateMetrics { link: i.u64()? },
            10 => Request::ServiceMetrics,
            c => return Err(Error::Protocol(format!("attach: unknown request {c}"))),
        };
        i.end()?;
        Ok((id, r))
    }
}

/// The service's answer to a request.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Done, nothing to say.
    Done,
    /// The link the task connects next (a writer's or a gate's).
    Link { link: u64 },
    /// A partition's state.
    State { finished: bool, released: bool },
    /// Metrics, as `host::metrics` encodes them.
    Metrics(Vec<u8>),
    /// The request failed.
    Failed(Error),
}

impl Reply {
    pub(crate) fn encode(&self, id: u64) -> Vec<u8> {
        frame(ty::REPLY, |o| {
            o.u64(id);
            match self {
                Reply::Done => o.u8(1),
                Reply::Link { link } => {
                    o.u8(2);
                    o.u64(*link);
                }
                Reply::State { finished, released } => {
                    o.u8(3);
                    o.bool(*finished);
                    o.bool(*released);
                }
                Reply::Metrics(bytes) => {
                    o.u8(4);
                    o.bytes(bytes);
                }
                Reply::Failed(e) => {
                    o.u8(5);
                    put_error(o, e);
                }
            }
        })
    }

    pub(crate) fn decode(body: &[u8]) -> Result<(u64, Reply)> {
        let mut i = In::new(body);
        let id = i.u64()?;
        let r = match i.u8()? {
            1 => Reply::Done,
            2 => Reply::Link { link: i.u64()? },
            3 => Reply::State {
                finished: i.bool()?,
                released: i.bool()?,
            },
            4 => Reply::Metrics(i.bytes()?.to_vec()),
            5 => Reply::Failed(get_error(&mut i)?),
            c => return Err(Error::Protocol(format!("attach: unknown reply {c}"))),
        };
        i.end()?;
        Ok((id, r))
    }
}

/// The static strings some errors carry, so that they survive the trip.
const STATIC_WHATS: &[&str] = &[
    "buffer pool",
    "input gate",
    "network environment",
    "partition (end-of-partition already sent)",
    "partition",
    "reader",
    "record writer",
    "waiting for a free buffer",
    "waiting for data",
    "waiting for the consumers to read everything",
    "host service",
];

fn static_what(s: &str) -> &'static str {
    STATIC_WHATS
        .iter()
        .find(|w| **w == s)
        .copied()
        .unwrap_or("host service")
}

/// Writes an error so that [`get_error`] gives back the same variant and message.
pub(crate) fn put_error(o: &mut Out, e: &Error) {
    match e {
        Error::InsufficientBuffers {
            what,
            required,
            available,
            total,
            segment_size,
            hint,
        } => {
            o.u8(1);
            o.str(what);
            o.usize(*required);
            o.usize(*available);
            o.usize(*total);
            o.usize(*segment_size);
            o.str(hint);
        }
        Error::PartitionNotFound(s) => {
            o.u8(2);
            o.str(s);
        }
        Error::PartitionExists(s) => {
            o.u8(3);
            o.str(s);
        }
        Error::SubpartitionOutOfRange {
            partition,
            index,
            count,
        } => {
            o.u8(4);
            o.str(partition);
            o.usize(*index);
            o.usize(*count);
        }
        Error::AlreadyConsumed { partition, index } => {
            o.u8(5);
            o.str(partition);
            o.usize(*index);
        }
        Error::SchemaMismatch {
            partition,
            expected,
            actual,
        } => {
            o.u8(6);
            o.str(partition);
            o.str(expected);
            o.str(actual);
        }
        Error::InvalidArgument(s) => {
            o.u8(7);
            o.str(s);
        }
        Error::Timeout(d, what) => {
            o.u8(8);
            o.u64(d.as_millis() as u64);
            o.str(what);
        }
        Error::Interrupted => o.u8(9),
        Error::Closed(what) => {
            o.u8(10);
            o.str(what);
        }
        Error::Protocol(s) => {
            o.u8(11);
            o.str(s);
        }
        Error::ConnectionLost(s) => {
            o.u8(12);
            o.str(s);
        }
        Error::LimitExceeded(s) => {
            o.u8(13);
            o.str(s);
        }
        Error::Authentication(s) => {
            o.u8(14);
            o.str(s);
        }
        Error::Arrow(a) => {
            o.u8(15);
            o.str(&a.to_string());
        }
        Error::ProducerFailed(s) => {
            o.u8(16);
            o.str(s);
        }
        Error::Spill(s) => {
            o.u8(17);
            o.str(s);
        }
    }
}

/// Reads an error [`put_error`] wrote.
pub(crate) fn get_error(i: &mut In<'_>) -> Result<Error> {
    Ok(match i.u8()? {
        1 => Error::InsufficientBuffers {
            what: i.str()?,
            required: i.usize()?,
            available: i.usize()?,
            total: i.usize()?,
            segment_size: i.usize()?,
            hint: i.str()?,
        },
        2 => Error::PartitionNotFound(i.str()?),
        3 => Error::PartitionExists(i.str()?),
        4 => Error::SubpartitionOutOfRange {
            partition: i.str()?,
            index: i.usize()?,
            count: i.usize()?,
        },
        5 => Error::AlreadyConsumed {
            partition: i.str()?,
            index: i.usize()?,
        },
        6 => Error::SchemaMismatch {
            partition: i.str()?,
            expected: i.str()?,
            actual: i.str()?,
        },
        7 => Error::InvalidArgument(i.str()?),
        8 => Error::Timeout(Duration::from_millis(i.u64()?), static_what(&i.str()?)),
        9 => Error::Interrupted,
        10 => Error::Closed(static_what(&i.str()?)),
        11 => Error::Protocol(i.str()?),
        12 => Error::ConnectionLost(i.str()?),
        13 => Error::LimitExceeded(i.str()?),
        14 => Error::Authentication(i.str()?),
        15 => Error::Arrow(arrow_schema::ArrowError::InvalidArgumentError(i.str()?)),
        16 => Error::ProducerFailed(i.str()?),
        17 => Error::Spill(i.str()?),
        c => return Err(Error::Protocol(format!("attach: unknown error kind {c}"))),
    })
}

/// A link frame that is not a record: what the writer's calls and the gate's items become.
#[derive(Debug)]
pub(crate) enum Signal {
    /// A user event: to subpartition `target` (`None`: all) from a writer, from channel
    /// `target` to a gate.
    Event { target: Option<u32>, payload: Vec<u8> },
    /// A checkpoint barrier.
    Barrier { id: u64, unaligned: bool },
    /// A gate abandoned the alignment of a checkpoint.
    Aborted { id: u64 },
    /// A writer's flush.
    Flush,
    /// A writer's close (end of partition).
    Close,
    /// A writer's fail.
    Fail { message: String },
    /// A gate's end: every channel ended.
    End,
    /// An error: the gate's next item, or the writer link's failure.
    Error(Error),
    /// The service's answer to a writer's barrier (the entries it overtook, per
    /// subpartition) or close (empty).
    Ack { overtaken: Vec<u64> },
}

impl Signal {
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Signal::Event { target, payload } => frame(ty::EVENT, |o| {
                o.u32(target.unwrap_or(u32::MAX));
                o.bytes(payload);
            }),
            Signal::Barrier { id, unaligned } => frame(ty::BARRIER, |o| {
                o.u64(*id);
                o.bool(*unaligned);
            }),
            Signal::Aborted { id } => frame(ty::ABORTED, |o| o.u64(*id)),
            Signal::Flush => frame(ty::FLUSH, |_| {}),
            Signal::Close => frame(ty::CLOSE, |_| {}),
            Signal::Fail { message } => frame(ty::FAIL, |o| o.str(message)),
            Signal::End => frame(ty::END, |_| {}),
            Signal::Error(e) => frame(ty::ERROR, |o| put_error(o, e)),
            Signal::Ack { overtaken } => frame(ty::ACK, |o| o.u64s(overtaken)),
        }
    }

    pub(crate) fn decode(ty: u8, body: &[u8]) -> Result<Signal> {
        let mut i = In::new(body);
        let s = match ty {
            ty::EVENT => Signal::Event {
                target: match i.u32()? {
                    u32::MAX => None,
                    t => Some(t),
                },
                payload: i.bytes()?.to_vec(),
            },
            ty::BARRIER => Signal::Barrier {
                id: i.u64()?,
                unaligned: i.bool()?,
            },
            ty::ABORTED => Signal::Aborted { id: i.u64()? },
            ty::FLUSH => Signal::Flush,
            ty::CLOSE => Signal::Close,
            ty::FAIL => Signal::Fail { message: i.str()? },
            ty::END => Signal::End,
            ty::ERROR => Signal::Error(get_error(&mut i)?),
            ty::ACK => Signal::Ack { overtaken: i.u64s()? },
            t => return Err(Error::Protocol(format!("attach: unexpected link frame type {t}"))),
        };
        i.end()?;
        Ok(s)
    }
}

/// A writer's record head naming no subpartition: the partition's partitioner splits the batch.
pub(crate) const TO_PARTITIONER: u32 = u32::MAX;

/// The fixed part of a record frame: which channel (a gate's) or, from a writer, the
/// subpartition the batch goes to whole ([`TO_PARTITIONER`]: the partitioner splits it), and
/// the unaligned checkpoints the batch is in-flight data of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordHead {
    pub(crate) channel: u32,
    pub(crate) in_flight: Vec<u64>,
}

impl RecordHead {
    /// A record frame's header and head; `len` bytes of record follow it in the frame.
    pub(crate) fn inline(&self, len: usize) -> Vec<u8> {
        let mut f = frame(ty::RECORD, |o| {
            o.u32(self.channel);
            o.u64s(&self.in_flight);
        });
        let total = f.len() + len;
        f[..4].copy_from_slice(&(total as u32).to_le_bytes());
        f
    }

    /// A frame naming a record at heap offset `start`, `len` bytes.
    pub(crate) fn item(&self, start: u64, len: u64) -> Vec<u8> {
        frame(ty::RECORD_ITEM, |o| {
            o.u32(self.channel);
            o.u64s(&self.in_flight);
            o.u64(start);
            o.u64(len);
        })
    }

    /// Reads the head of an inline record frame; the rest of the body is the record.
    pub(crate) fn decode_inline<'a>(body: &mut In<'a>) -> Result<RecordHead> {
        Ok(RecordHead {
            channel: body.u32()?,
            in_flight: body.u64s()?,
        })
    }

    /// Reads a heap record frame's body: the head, the item's start and length.
    pub(crate) fn decode_item(body: &[u8]) -> Result<(RecordHead, u64, u64)> {
        let mut i = In::new(body);
        let head = RecordHead::decode_inline(&mut i)?;
        let (start, len) = (i.u64()?, i.u64()?);
        i.end()?;
        Ok((head, start, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frame: &[u8]) -> (u8, &[u8]) {
        let (len, t) = header(frame[..FRAME_HEADER].try_into().unwrap(), usize::MAX).unwrap();
        assert_eq!(len, frame.len());
        (t, &frame[FRAME_HEADER..])
    }

    #[test]
    fn requests_and_replies_come_back_as_they_went() {
        let requests = vec![
            Request::CreatePartition {
                id: "p/1".into(),
                subpartitions: 7,
                kind: Some(SpillKind::Hybrid { replay: true }),
                compression: Some(Compression::Zstd),
            },
            Request::OpenWriter {
                partition: "p".into(),
                partitioner: Partitioner::Hash(vec!["a".into(), "é".into()]),
            },
            Request::CreateGate {
                specs: vec![ChannelSpec {
                    address: "127.0.0.1:5".into(),
                    partition_id: "x".into(),
                    subpartition: 3,
                }],
            },
            Request::WaitConsumed {
                partition: "p".into(),
                timeout: Some(Duration::from_millis(1500)),
            },
            Request::WaitConsumed {
                partition: "p".into(),
                timeout: None,
            },
            Request::GateMetrics { link: 9 },
            Request::ServiceMetrics,
        ];
        for (n, r) in requests.into_iter().enumerate() {
            let f = r.encode(n as u64 + 40);
            let (t, b) = body(&f);
            assert_eq!(t, ty::REQUEST);
            let (id, back) = Request::decode(b).unwrap();
            assert_eq!(id, n as u64 + 40);
            assert_eq!(format!("{back:?}"), format!("{r:?}"));
            // Every byte counts: one fewer is refused, one more too.
            assert!(Request::decode(&b[..b.len() - 1]).is_err());
            let mut longer = b.to_vec();
            longer.push(0);
            assert!(Request::decode(&longer).is_err());
        }
    }

    #[test]
    fn errors_keep_their_variant_and_message() {
        let errors = vec![
            Error::InsufficientBuffers {
                what: "gate".into(),
                required: 10,
                available: 3,
                total: 64,
                segment_size: 32768,
                hint: "raise memory".into(),
            },
            Error::ProducerFailed("the task died".into()),
            Error::SchemaMismatch {
                partition: "p".into(),
                expected: "a".into(),
                actual: "b".into(),
            },
            Error::Timeout(Duration::from_millis(250), "waiting for data"),
            Error::Closed("partition"),
            Error::ConnectionLost("gone".into()),
            Error::Spill("disk full".into()),
        ];
        for e in errors {
            let (text, kind) = (e.to_string(), std::mem::discriminant(&e));
            let f = Reply::Failed(e).encode(1);
            let (_, back) = Reply::decode(body(&f).1).unwrap();
            let Reply::Failed(back) = back else {
                panic!("not a failure")
            };
            assert_eq!(back.to_string(), text);
            assert_eq!(std::mem::discriminant(&back), kind);
        }
    }

    #[test]
    fn link_frames_come_back_as_they_went() {
        let signals = vec![
            Signal::Event {
                target: Some(3),
                payload: b"hi".to_vec(),
            },
            Signal::Event {
                target: None,
                payload: vec![],
            },
            Signal::Barrier {
                id: 7,
                unaligned: true,
            },
            Signal::Fail { message: "no".into() },
            Signal::End,
            Signal::Ack {
                overtaken: vec![1, 2, 3],
            },
        ];
        for s in signals {
            let f = s.encode();
            let (t, b) = body(&f);
            assert_eq!(format!("{:?}", Signal::decode(t, b).unwrap()), format!("{s:?}"));
        }
        let head = RecordHead {
            channel: 4,
            in_flight: vec![9],
        };
        let f = head.item(64, 1000);
        let (t, b) = body(&f);
        assert_eq!(t, ty::RECORD_ITEM);
        assert_eq!(RecordHead::decode_item(b).unwrap(), (head.clone(), 64, 1000));
        let mut f = head.inline(3);
        f.extend_from_slice(b"abc");
        let (t, b) = body(&f);
        assert_eq!(t, ty::RECORD);
        let mut i = In::new(b);
        assert_eq!(RecordHead::decode_inline(&mut i).unwrap(), head);
        assert_eq!(i.rest(), b"abc");
    }

    #[test]
    fn a_frame_length_out_of_bounds_is_refused() {
        assert!(header([4, 0, 0, 0, 1], 100).is_err());
        assert!(header([101, 0, 0, 0, 1], 100).is_err());
        assert_eq!(header([5, 0, 0, 0, 1], 100).unwrap(), (5, 1));
    }
}
