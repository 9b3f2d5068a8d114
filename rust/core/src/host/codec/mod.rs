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
pub(crate) use signals::{RecordHead, Signal, TO_PARTITIONER};

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use arrow_schema::ArrowError;

    use super::*;
    use crate::base::config::ChannelSpec;
    use crate::partition::spill::SpillKind;
    use crate::partition::Partitioner;
    use crate::serde::Compression;

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
