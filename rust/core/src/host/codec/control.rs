//! What a task and its host service say on a session: how the first connection opens, the
//! control requests and replies, and errors as they cross.

use std::time::Duration;

use arrow_schema::ArrowError;

use crate::base::config::ChannelSpec;
use crate::base::error::{Error, Result};
use crate::partition::spill::SpillKind;
use crate::partition::Partitioner;
use crate::serde::Compression;

use super::{frame, ty, In, Out};

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
    /// A writer link into `partition` through `partitioner`, whose heap has `heap` bytes (the
    /// task's own memory; the service checks it).
    OpenWriter {
        partition: String,
        partitioner: Partitioner,
        heap: u64,
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
                    heap,
                } => {
                    o.u8(2);
                    o.str(partition);
                    put_partitioner(o, partitioner);
                    o.u64(*heap);
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
                heap: i.u64()?,
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
            put_arrow_error(o, a);
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
        15 => Error::Arrow(get_arrow_error(i)?),
        16 => Error::ProducerFailed(i.str()?),
        17 => Error::Spill(i.str()?),
        c => return Err(Error::Protocol(format!("attach: unknown error kind {c}"))),
    })
}

/// Writes an Arrow error as its kind and description, so that [`get_arrow_error`] gives back
/// the kind and the same message (not the message as the description of another kind).
fn put_arrow_error(o: &mut Out, e: &ArrowError) {
    let (code, desc) = match e {
        ArrowError::NotYetImplemented(d) => (1, d.clone()),
        ArrowError::ExternalError(source) => (2, source.to_string()),
        ArrowError::CastError(d) => (3, d.clone()),
        ArrowError::MemoryError(d) => (4, d.clone()),
        ArrowError::ParseError(d) => (5, d.clone()),
        ArrowError::SchemaError(d) => (6, d.clone()),
        ArrowError::ComputeError(d) => (7, d.clone()),
        ArrowError::DivideByZero => (8, String::new()),
        ArrowError::ArithmeticOverflow(d) => (9, d.clone()),
        ArrowError::CsvError(d) => (10, d.clone()),
        ArrowError::JsonError(d) => (11, d.clone()),
        ArrowError::AvroError(d) => (12, d.clone()),
        ArrowError::IoError(d, _) => (13, d.clone()),
        ArrowError::IpcError(d) => (14, d.clone()),
        ArrowError::InvalidArgumentError(d) => (15, d.clone()),
        ArrowError::ParquetError(d) => (16, d.clone()),
        ArrowError::CDataInterface(d) => (17, d.clone()),
        ArrowError::DictionaryKeyOverflowError => (18, String::new()),
        ArrowError::RunEndIndexOverflowError => (19, String::new()),
        ArrowError::OffsetOverflowError(n) => (20, n.to_string()),
    };
    o.u8(code);
    o.str(&desc);
}

/// Reads an Arrow error [`put_arrow_error`] wrote.
fn get_arrow_error(i: &mut In<'_>) -> Result<ArrowError> {
    let code = i.u8()?;
    let d = i.str()?;
    let unit = |e: ArrowError, d: &str| {
        if d.is_empty() {
            Ok(e)
        } else {
            Err(Error::Protocol(format!(
                "attach: arrow error {code} with a description"
            )))
        }
    };
    Ok(match code {
        1 => ArrowError::NotYetImplemented(d),
        2 => ArrowError::ExternalError(Box::new(std::io::Error::other(d))),
        3 => ArrowError::CastError(d),
        4 => ArrowError::MemoryError(d),
        5 => ArrowError::ParseError(d),
        6 => ArrowError::SchemaError(d),
        7 => ArrowError::ComputeError(d),
        8 => unit(ArrowError::DivideByZero, &d)?,
        9 => ArrowError::ArithmeticOverflow(d),
        10 => ArrowError::CsvError(d),
        11 => ArrowError::JsonError(d),
        12 => ArrowError::AvroError(d),
        13 => ArrowError::IoError(d.clone(), std::io::Error::other(d)),
        14 => ArrowError::IpcError(d),
        15 => ArrowError::InvalidArgumentError(d),
        16 => ArrowError::ParquetError(d),
        17 => ArrowError::CDataInterface(d),
        18 => unit(ArrowError::DictionaryKeyOverflowError, &d)?,
        19 => unit(ArrowError::RunEndIndexOverflowError, &d)?,
        20 => ArrowError::OffsetOverflowError(
            d.parse()
                .map_err(|_| Error::Protocol(format!("attach: an offset overflow of {d:?}")))?,
        ),
        c => return Err(Error::Protocol(format!("attach: unknown arrow error kind {c}"))),
    })
}
