//! Decoding in two phases: [`check`] (is a whole, plausible frame buffered? never allocates)
//! and [`decode`] (parse exactly that frame), plus the header-only decode of a BufferResponse
//! and the parsing of an event payload.

use std::borrow::Cow;

use super::constants::*;
use super::error::WireError;
use super::message::{
    AuthMode, BufferResponse, BufferResponseHeader, ErrorKind, Hello, Message, MessageType, Payload,
    ReceiverId, SharedBuffer, ShmOffer,
};
use crate::base::error::Result;
use crate::base::event::Event;
use crate::protocol::credit::{Credit, DataType};

/// What [`check`] found out about the frame at the start of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameInfo {
    /// Bytes of the whole frame, header included.
    pub frame_len: usize,
    /// Its message type.
    pub message_type: MessageType,
}

/// Validates the frame header at the start of `buf` as far as it is buffered, without
/// allocating: each field is checked as soon as its bytes are there, so a frame longer than
/// `max_frame`, shorter than its type allows, with a wrong magic, version or type is rejected
/// from its first 4 to 10 bytes. `Ok(None)`: the header is not complete yet.
pub fn check_header(buf: &[u8], max_frame: usize) -> Result<Option<FrameInfo>, WireError> {
    let Some(len_bytes) = buf.get(..4) else {
        return Ok(None);
    };
    let frame_len = u32::from_le_bytes(len_bytes.try_into().expect("4 bytes")) as usize;
    if frame_len < HEADER_LEN {
        return Err(WireError::FrameTooShort { len: frame_len });
    }
    if frame_len > max_frame {
        return Err(WireError::FrameTooLong {
            len: frame_len,
            max: max_frame,
        });
    }
    let magic_end = buf.len().min(8);
    if buf[4..magic_end] != MAGIC[..magic_end - 4] {
        return Err(WireError::BadMagic {
            got: buf[4..magic_end].to_vec(),
            expected: MAGIC[..magic_end - 4].to_vec(),
        });
    }
    let Some(&version) = buf.get(8) else {
        return Ok(None);
    };
    if version != PROTOCOL_VERSION {
        return Err(WireError::UnsupportedVersion(version));
    }
    let Some(&type_byte) = buf.get(9) else {
        return Ok(None);
    };
    let message_type = MessageType::from_u8(type_byte).ok_or(WireError::UnknownMessageType(type_byte))?;
    let body_len = frame_len - HEADER_LEN;
    let (min_body, max_body) = message_type.body_len_range();
    if body_len < min_body {
        return Err(WireError::BodyTooShort {
            ty: message_type,
            len: frame_len,
            min: HEADER_LEN + min_body,
        });
    }
    if let Some(max_body) = max_body {
        if body_len > max_body {
            return Err(WireError::BodyTooLong {
                ty: message_type,
                len: frame_len,
                max: HEADER_LEN + max_body,
            });
        }
    }
    Ok(Some(FrameInfo {
        frame_len,
        message_type,
    }))
}

/// Phase 1 of decoding: validates the header at the start of `buf` (see [`check_header`]) and
/// says whether the whole frame is buffered. Never allocates on success; `Ok(None)` means
/// "need more bytes", an `Err` that the stream is broken.
pub fn check(buf: &[u8], max_frame: usize) -> Result<Option<FrameInfo>, WireError> {
    match check_header(buf, max_frame)? {
        Some(info) if buf.len() >= info.frame_len => Ok(Some(info)),
        _ => Ok(None),
    }
}

/// Header-only decode of a BufferResponse: as soon as its first [`BUFFER_RESPONSE_HEADER_LEN`]
/// bytes are buffered, the fixed fields, so the payload can be read straight into a segment.
/// `Ok(None)`: not enough bytes yet. Fails if the frame is not a well-formed BufferResponse.
pub fn decode_buffer_response_header(
    buf: &[u8],
    max_frame: usize,
) -> Result<Option<BufferResponseHeader>, WireError> {
    let Some(info) = check_header(buf, max_frame)? else {
        return Ok(None);
    };
    if info.message_type != MessageType::BufferResponse {
        return Err(WireError::NotBufferResponse(info.message_type));
    }
    let Some(fixed) = buf.get(HEADER_LEN..BUFFER_RESPONSE_HEADER_LEN) else {
        return Ok(None);
    };
    let mut r = Reader::new(fixed, "BufferResponse header");
    let receiver = ReceiverId(r.u64()?);
    let sequence_number = r.u64()?;
    let backlog = r.u32()?;
    let data_type = match r.u8()? {
        DATA_TYPE_DATA => DataType::Data,
        DATA_TYPE_EVENT => DataType::Event,
        other => return Err(WireError::UnknownDataType(other)),
    };
    let payload_len = r.u32()? as usize;
    let expected = info.frame_len - BUFFER_RESPONSE_HEADER_LEN;
    if payload_len != expected {
        return Err(WireError::PayloadLengthMismatch {
            declared: payload_len,
            frame_len: info.frame_len,
            room: expected,
        });
    }
    if data_type == DataType::Event && payload_len > MAX_EVENT_LEN {
        return Err(WireError::EventTooLong(payload_len));
    }
    Ok(Some(BufferResponseHeader {
        receiver,
        sequence_number,
        backlog,
        data_type,
        payload_len,
    }))
}

// ---------------------------------------------------------------------------------------------
// Decoding, phase 2: parse one whole frame
// ---------------------------------------------------------------------------------------------

/// A cursor over a body that fails with a protocol error instead of reading past its end.
struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated {
                what: self.what,
                needed: n,
                left: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A u32-length-prefixed UTF-8 string; the length is checked against `max` and what is
    /// left before anything is allocated.
    fn string(&mut self, max: usize, field: &'static str) -> Result<String, WireError> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(WireError::StringTooLong {
                field,
                what: self.what,
                len,
                max,
            });
        }
        let bytes = self.take(len)?;
        let s = std::str::from_utf8(bytes).map_err(|error| WireError::InvalidUtf8 {
            field,
            what: self.what,
            error,
        })?;
        Ok(s.to_owned())
    }

    fn finish(self) -> Result<(), WireError> {
        if !self.buf.is_empty() {
            return Err(WireError::TrailingBytes {
                n: self.buf.len(),
                what: self.what,
            });
        }
        Ok(())
    }
}

impl AuthMode {
    /// The mode for a Hello's auth byte.
    fn from_u8(byte: u8) -> Result<AuthMode, WireError> {
        match byte {
            0 => Ok(AuthMode::None),
            1 => Ok(AuthMode::HmacSha256),
            _ => Err(WireError::UnknownAuthMode(byte)),
        }
    }
}

impl ErrorKind {
    /// The kind for an ErrorResponse's kind field.
    fn from_u16(code: u16) -> Result<ErrorKind, WireError> {
        use ErrorKind::*;
        Ok(match code {
            1 => Internal,
            2 => Protocol,
            3 => Authentication,
            4 => ProducerFailed,
            5 => SubpartitionOutOfRange,
            6 => AlreadyConsumed,
            7 => LimitExceeded,
            _ => return Err(WireError::UnknownErrorKind(code)),
        })
    }
}

fn read_hello(r: &mut Reader<'_>) -> Result<Hello, WireError> {
    Ok(Hello {
        version: r.u8()?,
        segment_size: r.u32()?,
        max_frame_size: r.u32()?,
        auth: AuthMode::from_u8(r.u8()?)?,
        nonce: r.array()?,
        shm: {
            let flag = r.u8()?;
            let offer = ShmOffer {
                boot_id: r.array()?,
                uid: r.u32()?,
                pid: r.u32()?,
                key: r.u64()?,
            };
            match flag {
                // Canonical: no offer means zeros in its place (they are encoded so).
                0 if offer == ShmOffer::default() => None,
                0 => return Err(WireError::ShmOfferWithoutFlag),
                1 => Some(offer),
                _ => return Err(WireError::UnknownShmFlag(flag)),
            }
        },
    })
}

fn body_name(ty: MessageType) -> &'static str {
    use MessageType::*;
    match ty {
        Hello => "Hello body",
        HelloAck => "HelloAck body",
        AuthProof => "AuthProof body",
        PartitionRequest => "PartitionRequest body",
        AddCredit => "AddCredit body",
        BacklogAnnouncement => "BacklogAnnouncement body",
        BufferResponse => "BufferResponse body",
        ErrorResponse => "ErrorResponse body",
        CancelPartitionRequest => "CancelPartitionRequest body",
        CloseRequest => "CloseRequest body",
        PartitionNotFound => "PartitionNotFound body",
        ResumeConsumption => "ResumeConsumption body",
        NewBufferSize => "NewBufferSize body",
        RecordAnnouncement => "RecordAnnouncement body",
        RecordGrant => "RecordGrant body",
        SharedBuffer => "SharedBuffer body",
    }
}

/// Phase 2 of decoding: parses exactly one whole frame (as delimited by [`check`]). The header
/// is validated again, so this is safe on any input; every body byte must be used. A data
/// payload is borrowed from `frame`.
pub fn decode(frame: &[u8]) -> Result<Message<'_>, WireError> {
    let info = check_header(frame, usize::MAX)?.ok_or(WireError::ShorterThanHeader(frame.len()))?;
    if frame.len() != info.frame_len {
        return Err(WireError::LengthMismatch {
            len: frame.len(),
            declared: info.frame_len,
        });
    }
    let ty = info.message_type;
    if ty == MessageType::BufferResponse {
        let header = decode_buffer_response_header(frame, usize::MAX)?.expect("whole frame");
        let payload = &frame[BUFFER_RESPONSE_HEADER_LEN..];
        let payload = match header.data_type {
            DataType::Data => Payload::Data(Cow::Borrowed(payload)),
            DataType::Event => Payload::Event(Event::decode(payload)?),
        };
        return Ok(Message::BufferResponse(BufferResponse {
            receiver: header.receiver,
            sequence_number: header.sequence_number,
            backlog: header.backlog,
            payload,
        }));
    }
    let mut r = Reader::new(&frame[HEADER_LEN..], body_name(ty));
    let msg = match ty {
        MessageType::Hello => Message::Hello(read_hello(&mut r)?),
        MessageType::HelloAck => Message::HelloAck {
            hello: read_hello(&mut r)?,
            tag: r.array()?,
        },
        MessageType::AuthProof => Message::AuthProof { tag: r.array()? },
        MessageType::PartitionRequest => {
            let receiver = ReceiverId(r.u64()?);
            let subpartition = r.u32()?;
            let initial_credit = Credit::new(r.u32()?);
            let partition_id = r.string(MAX_PARTITION_ID_LEN, "partition id")?;
            Message::PartitionRequest {
                partition_id,
                subpartition,
                receiver,
                initial_credit,
            }
        }
        MessageType::AddCredit => {
            let receiver = ReceiverId(r.u64()?);
            let credit = Credit::new(r.u32()?);
            if credit.is_zero() {
                return Err(WireError::Zero {
                    ty: MessageType::AddCredit,
                    receiver,
                });
            }
            Message::AddCredit { receiver, credit }
        }
        MessageType::BacklogAnnouncement => {
            let receiver = ReceiverId(r.u64()?);
            let backlog = r.u32()?;
            if backlog == 0 {
                return Err(WireError::Zero {
                    ty: MessageType::BacklogAnnouncement,
                    receiver,
                });
            }
            Message::BacklogAnnouncement { receiver, backlog }
        }
        MessageType::ErrorResponse => {
            let scope = r.u8()?;
            let id = r.u64()?;
            let receiver = match scope {
                ERROR_SCOPE_FATAL if id == 0 => None,
                ERROR_SCOPE_FATAL => return Err(WireError::FatalWithReceiver(id)),
                ERROR_SCOPE_CHANNEL => Some(ReceiverId(id)),
                other => return Err(WireError::UnknownErrorScope(other)),
            };
            let kind = ErrorKind::from_u16(r.u16()?)?;
            let message = r.string(MAX_MESSAGE_LEN, "error message")?;
            Message::ErrorResponse {
                receiver,
                kind,
                message,
            }
        }
        MessageType::CancelPartitionRequest => Message::CancelPartitionRequest {
            receiver: ReceiverId(r.u64()?),
        },
        MessageType::CloseRequest => Message::CloseRequest,
        MessageType::PartitionNotFound => Message::PartitionNotFound {
            receiver: ReceiverId(r.u64()?),
        },
        MessageType::ResumeConsumption => Message::ResumeConsumption {
            receiver: ReceiverId(r.u64()?),
        },
        MessageType::NewBufferSize => {
            let receiver = ReceiverId(r.u64()?);
            let size = r.u32()?;
            if size == 0 {
                return Err(WireError::Zero {
                    ty: MessageType::NewBufferSize,
                    receiver,
                });
            }
            Message::NewBufferSize { receiver, size }
        }
        ty @ (MessageType::RecordAnnouncement | MessageType::RecordGrant) => {
            let receiver = ReceiverId(r.u64()?);
            let bytes = r.u64()?;
            if bytes == 0 {
                return Err(WireError::Zero { ty, receiver });
            }
            if ty == MessageType::RecordGrant {
                Message::RecordGrant { receiver, bytes }
            } else {
                Message::RecordAnnouncement { receiver, bytes }
            }
        }
        MessageType::SharedBuffer => {
            let b = SharedBuffer {
                receiver: ReceiverId(r.u64()?),
                sequence_number: r.u64()?,
                backlog: r.u32()?,
                item: r.u64()?,
                item_len: r.u64()?,
                offset: r.u64()?,
                len: r.u32()?,
            };
            if !b.is_within_item() {
                return Err(WireError::SharedBufferOutOfItem(b));
            }
            Message::SharedBuffer(b)
        }
        MessageType::BufferResponse => unreachable!("handled above"),
    };
    r.finish()?;
    Ok(msg)
}

impl Event {
    /// Parses an event payload; the whole payload must be one event.
    pub fn decode(payload: &[u8]) -> Result<Event, WireError> {
        let mut r = Reader::new(payload, "event payload");
        let event = match r.u8()? {
            EVENT_END_OF_PARTITION => Event::EndOfPartition,
            EVENT_PRODUCER_FAILED => {
                Event::ProducerFailed(r.string(MAX_MESSAGE_LEN, "ProducerFailed message")?)
            }
            EVENT_USER => {
                let len = r.u32()? as usize;
                if len > MAX_EVENT_PAYLOAD_LEN {
                    return Err(WireError::UserEventTooLong(len));
                }
                Event::User(r.take(len)?.to_vec())
            }
            EVENT_BARRIER => {
                let id = r.u64()?;
                let unaligned = match r.u8()? {
                    0 => false,
                    BARRIER_UNALIGNED => true,
                    f => return Err(WireError::UnknownBarrierFlags(f)),
                };
                Event::Barrier { id, unaligned }
            }
            EVENT_BARRIER_POSITION => Event::BarrierPosition(r.u64()?),
            tag => return Err(WireError::UnknownEventTag(tag)),
        };
        r.finish()?;
        Ok(event)
    }
}
