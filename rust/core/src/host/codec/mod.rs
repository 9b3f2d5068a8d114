//! The attach protocol's messages and their bytes, without I/O: what a task and its host
//! service say on a session (control requests and replies) and on a link (batches, events and
//! the writer's or gate's other calls, in order).
//!
//! Every message is one frame: `u32` frame length (the whole frame, these 4 bytes included),
//! `u8` message type, the body. Integers are little-endian; a string is a `u32` byte length
//! and UTF-8 bytes. A decoder takes exactly one frame's body and refuses anything left over.
//! Both ends are processes of one user on one host (checked with `SO_PEERCRED`), so the limits
//! here guard against bugs and garbage, not against an adversary.
//!
//! Framing is here; the session's messages are in [`control`], the link's in [`signals`].

mod control;
mod signals;

pub(crate) use control::{get_error, put_error, Opening, Reply, Request, Welcome};
pub(crate) use signals::{Forwarded, RecordHead, Signal};

use crate::base::error::{Error, Result};

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
    /// A piece of a batch the task split, to a subpartition, inline: as [`RECORD`], but the
    /// record holds its schema (it can be decoded alone).
    pub(crate) const PIECE: u8 = 31;
    /// A piece in the writer link's heap: as [`RECORD_ITEM`], the record holding its schema.
    pub(crate) const PIECE_ITEM: u8 = 32;
    /// A piece left in a writer link's heap, handed to a gate's task: `channel u32`,
    /// `in_flight` ids, `source u64` (the writer link), `start u64`, `len u64`.
    pub(crate) const FORWARD: u8 = 33;
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
    #[cfg(any(test, feature = "fuzz"))]
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

/// Every request, each variant with its fields set.
#[cfg(any(test, feature = "fuzz"))]
pub(crate) fn sample_requests() -> Vec<Request> {
    use std::time::Duration;

    use crate::base::config::ChannelSpec;
    use crate::partition::spill::SpillKind;
    use crate::partition::Partitioner;
    use crate::serde::Compression;

    vec![
        Request::CreatePartition {
            id: "cf-exchange/1/0".into(),
            subpartitions: 16,
            kind: None,
            compression: None,
        },
        Request::CreatePartition {
            id: "h".into(),
            subpartitions: 2,
            kind: Some(SpillKind::Hybrid { replay: true }),
            compression: Some(Compression::Zstd),
        },
        Request::OpenWriter {
            partition: "p".into(),
            partitioner: Partitioner::Hash(vec!["l_orderkey".into(), "é".into()]),
            heap: 64 << 20,
        },
        Request::OpenWriter {
            partition: "p".into(),
            partitioner: Partitioner::Broadcast,
            heap: 1 << 20,
        },
        Request::CreateGate {
            specs: vec![
                ChannelSpec {
                    address: "10.0.0.2:7000".into(),
                    partition_id: "p".into(),
                    subpartition: 0,
                },
                ChannelSpec {
                    address: "10.0.0.3:7000".into(),
                    partition_id: "q".into(),
                    subpartition: 5,
                },
            ],
        },
        Request::Release {
            partition: "p".into(),
        },
        Request::WaitConsumed {
            partition: "p".into(),
            timeout: Some(Duration::from_millis(1500)),
        },
        Request::WaitConsumed {
            partition: "p".into(),
            timeout: None,
        },
        Request::Flush {
            partition: "p".into(),
        },
        Request::PartitionState {
            partition: "p".into(),
        },
        Request::PartitionMetrics {
            partition: "p".into(),
        },
        Request::GateMetrics { link: 9 },
        Request::ServiceMetrics,
    ]
}

/// Every link signal, each variant with its fields set.
#[cfg(any(test, feature = "fuzz"))]
pub(crate) fn sample_signals() -> Vec<Signal> {
    vec![
        Signal::Event {
            target: Some(3),
            payload: b"watermark".to_vec(),
        },
        Signal::Event {
            target: None,
            payload: Vec::new(),
        },
        Signal::Barrier {
            id: 7,
            unaligned: true,
        },
        Signal::Aborted { id: 7 },
        Signal::Flush,
        Signal::Close,
        Signal::Fail {
            message: "the user said so".into(),
        },
        Signal::End,
        Signal::Error(Error::Closed("input gate")),
        Signal::Ack {
            overtaken: vec![0, 2, 1],
        },
    ]
}

/// One frame of every message, each variant with its fields set (the fuzzer's seeds, and
/// what the tests decode).
#[cfg(any(test, feature = "fuzz"))]
pub(crate) fn samples() -> Vec<Vec<u8>> {
    use std::time::Duration;

    let mut out = vec![
        Opening::Attach { pid: 4242, owner: 17 }.encode(),
        Opening::Link { session: 3, link: 9 }.encode(),
        Welcome {
            session: 3,
            pid: 4243,
            address: "10.0.0.2:7000".into(),
            memory: 64 << 20,
            segment_size: 32 << 10,
        }
        .encode(),
    ];
    out.extend(
        sample_requests()
            .iter()
            .enumerate()
            .map(|(n, r)| r.encode(n as u64)),
    );
    let replies = [
        Reply::Done,
        Reply::Link { link: 10 },
        Reply::State {
            finished: true,
            released: false,
        },
        Reply::Metrics(vec![1, 2, 3, 4]),
        Reply::Failed(Error::ProducerFailed("the task died".into())),
        Reply::Failed(Error::Timeout(Duration::from_millis(250), "waiting for data")),
        Reply::Failed(Error::Arrow(arrow_schema::ArrowError::SchemaError("no k".into()))),
    ];
    out.extend(replies.iter().enumerate().map(|(n, r)| r.encode(100 + n as u64)));
    out.extend(sample_signals().iter().map(Signal::encode));
    let head = RecordHead {
        channel: 5,
        in_flight: vec![7, 8],
    };
    out.push(head.item(64, 1 << 20));
    out.push(head.piece_item(64, 1 << 20));
    out.push(head.forward(&Forwarded {
        source: 12,
        slot: 3,
        start: 64,
        len: 1 << 20,
    }));
    for mut inline in [head.inline(3), head.piece(3)] {
        inline.extend_from_slice(b"ipc");
        out.push(inline);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use arrow_schema::ArrowError;

    use super::*;

    fn body(frame: &[u8]) -> (u8, &[u8]) {
        let (len, t) = header(frame[..FRAME_HEADER].try_into().unwrap(), usize::MAX).unwrap();
        assert_eq!(len, frame.len());
        (t, &frame[FRAME_HEADER..])
    }

    #[test]
    fn requests_and_replies_come_back_as_they_went() {
        let requests = sample_requests();
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
        let arrow = [
            ArrowError::NotYetImplemented("views".into()),
            ArrowError::ExternalError(Box::new(std::io::Error::other("outside"))),
            ArrowError::CastError("utf8 to int".into()),
            ArrowError::MemoryError("no room".into()),
            ArrowError::ParseError("not a date".into()),
            ArrowError::SchemaError("field k missing".into()),
            ArrowError::ComputeError("take".into()),
            ArrowError::DivideByZero,
            ArrowError::ArithmeticOverflow("i64".into()),
            ArrowError::CsvError("csv".into()),
            ArrowError::JsonError("json".into()),
            ArrowError::AvroError("avro".into()),
            ArrowError::IoError("short read".into(), std::io::Error::other("short read")),
            ArrowError::IpcError("bad message".into()),
            ArrowError::InvalidArgumentError("offsets".into()),
            ArrowError::ParquetError("parquet".into()),
            ArrowError::CDataInterface("release".into()),
            ArrowError::DictionaryKeyOverflowError,
            ArrowError::RunEndIndexOverflowError,
            ArrowError::OffsetOverflowError(1 << 40),
        ];
        for e in errors.into_iter().chain(arrow.into_iter().map(Error::Arrow)) {
            let (text, kind) = (e.to_string(), std::mem::discriminant(&e));
            let inner = match &e {
                Error::Arrow(a) => Some(std::mem::discriminant(a)),
                _ => None,
            };
            let f = Reply::Failed(e).encode(1);
            let (_, back) = Reply::decode(body(&f).1).unwrap();
            let Reply::Failed(back) = back else {
                panic!("not a failure")
            };
            assert_eq!(back.to_string(), text);
            assert_eq!(std::mem::discriminant(&back), kind);
            let back_inner = match &back {
                Error::Arrow(a) => Some(std::mem::discriminant(a)),
                _ => None,
            };
            assert_eq!(back_inner, inner, "{text}");
        }
    }

    #[test]
    fn link_frames_come_back_as_they_went() {
        let signals = sample_signals();
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
        let f = head.piece_item(64, 1000);
        let (t, b) = body(&f);
        assert_eq!(t, ty::PIECE_ITEM);
        assert_eq!(RecordHead::decode_item(b).unwrap(), (head.clone(), 64, 1000));
        let piece = Forwarded {
            source: 3,
            slot: 4095,
            start: 64,
            len: 1000,
        };
        let f = head.forward(&piece);
        let (t, b) = body(&f);
        assert_eq!(t, ty::FORWARD);
        assert_eq!(RecordHead::decode_forward(b).unwrap(), (head.clone(), piece));
        for (mut f, ty) in [(head.inline(3), ty::RECORD), (head.piece(3), ty::PIECE)] {
            f.extend_from_slice(b"abc");
            let (t, b) = body(&f);
            assert_eq!(t, ty);
            let mut i = In::new(b);
            assert_eq!(RecordHead::decode_inline(&mut i).unwrap(), head);
            assert_eq!(i.rest(), b"abc");
        }
    }

    #[test]
    fn a_frame_length_out_of_bounds_is_refused() {
        assert!(header([4, 0, 0, 0, 1], 100).is_err());
        assert!(header([101, 0, 0, 0, 1], 100).is_err());
        assert_eq!(header([5, 0, 0, 0, 1], 100).unwrap(), (5, 1));
    }

    #[test]
    fn every_sample_decodes_to_what_was_encoded_and_back() {
        let samples = samples();
        assert_eq!(samples.len(), 38);
        for input in crate::fuzz::attach::seeds() {
            crate::fuzz::attach::run(&input);
        }
        // The harness checks what decodes; that every sample does is checked here.
        let decodes = |f: &Vec<u8>| {
            let (t, b) = body(f);
            Opening::decode(t, b).is_ok()
                || (t == ty::WELCOME && Welcome::decode(b).is_ok())
                || (t == ty::REQUEST && Request::decode(b).is_ok())
                || (t == ty::REPLY && Reply::decode(b).is_ok())
                || Signal::decode(t, b).is_ok()
                || ([ty::RECORD_ITEM, ty::PIECE_ITEM].contains(&t) && RecordHead::decode_item(b).is_ok())
                || (t == ty::FORWARD && RecordHead::decode_forward(b).is_ok())
                || ([ty::RECORD, ty::PIECE].contains(&t)
                    && RecordHead::decode_inline(&mut In::new(b)).is_ok())
        };
        assert!(samples.iter().all(decodes));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(5000))]

        /// Garbage of any type and length: every decoder refuses it or reads a message that
        /// re-encodes as it came; nothing panics.
        #[test]
        fn garbage_is_refused_or_read_exactly(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            crate::fuzz::attach::run(&data);
        }

        /// A valid frame with bytes changed, cut or added anywhere: the same.
        #[test]
        fn a_frame_changed_anywhere_is_refused_or_read_exactly(
            which in proptest::prelude::any::<usize>(),
            edits in proptest::collection::vec((0usize..256, proptest::prelude::any::<u8>(), 0u8..3), 1..4),
        ) {
            let seeds = crate::fuzz::attach::seeds();
            let mut input = seeds[which % seeds.len()].clone();
            for (at, byte, how) in edits {
                let at = at % (input.len() + 1);
                match how {
                    0 if at < input.len() => input[at] = byte,
                    1 => input.truncate(at),
                    _ => input.insert(at, byte),
                }
            }
            crate::fuzz::attach::run(&input);
        }
    }
}
