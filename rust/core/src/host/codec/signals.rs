//! What travels on a link besides records' bytes: the writer's calls and the gate's items
//! (signals), and the head of a record frame.

use crate::base::error::{Error, Result};

use super::{frame, get_error, put_error, ty, In};

/// A piece handed to a gate's task as it lies: `len` bytes at `start` of writer link
/// `source`'s heap, kept in `slot` of the gate link's table of pieces handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Forwarded {
    pub(crate) source: u64,
    pub(crate) slot: u32,
    pub(crate) start: u64,
    pub(crate) len: u64,
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

/// The fixed part of a record frame: which channel (a gate's) or, from a writer, the
/// subpartition the piece goes to, and the unaligned checkpoints the batch is in-flight data
/// of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordHead {
    pub(crate) channel: u32,
    pub(crate) in_flight: Vec<u64>,
}

impl RecordHead {
    /// A record frame's header and head; `len` bytes of record follow it in the frame.
    pub(crate) fn inline(&self, len: usize) -> Vec<u8> {
        self.inline_as(ty::RECORD, len)
    }

    /// A piece frame's header and head; `len` bytes of self-contained record follow it.
    pub(crate) fn piece(&self, len: usize) -> Vec<u8> {
        self.inline_as(ty::PIECE, len)
    }

    fn inline_as(&self, ty: u8, len: usize) -> Vec<u8> {
        let mut f = frame(ty, |o| {
            o.u32(self.channel);
            o.u64s(&self.in_flight);
        });
        let total = f.len() + len;
        f[..4].copy_from_slice(&(total as u32).to_le_bytes());
        f
    }

    /// A frame naming a record at heap offset `start`, `len` bytes.
    pub(crate) fn item(&self, start: u64, len: u64) -> Vec<u8> {
        self.item_as(ty::RECORD_ITEM, start, len)
    }

    /// A frame naming a piece (a self-contained record) at heap offset `start`, `len` bytes.
    pub(crate) fn piece_item(&self, start: u64, len: u64) -> Vec<u8> {
        self.item_as(ty::PIECE_ITEM, start, len)
    }

    fn item_as(&self, ty: u8, start: u64, len: u64) -> Vec<u8> {
        frame(ty, |o| {
            o.u32(self.channel);
            o.u64s(&self.in_flight);
            o.u64(start);
            o.u64(len);
        })
    }

    /// A frame handing over `piece`, which lies in a writer link's heap.
    pub(crate) fn forward(&self, piece: &Forwarded) -> Vec<u8> {
        frame(ty::FORWARD, |o| {
            o.u32(self.channel);
            o.u64s(&self.in_flight);
            o.u64(piece.source);
            o.u32(piece.slot);
            o.u64(piece.start);
            o.u64(piece.len);
        })
    }

    /// Reads a forward frame's body: the head and the piece.
    pub(crate) fn decode_forward(body: &[u8]) -> Result<(RecordHead, Forwarded)> {
        let mut i = In::new(body);
        let head = RecordHead::decode_inline(&mut i)?;
        let piece = Forwarded {
            source: i.u64()?,
            slot: i.u32()?,
            start: i.u64()?,
            len: i.u64()?,
        };
        i.end()?;
        Ok((head, piece))
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
