//! Encoding: a [`Message`] or an [`Event`] to its bytes, and the BufferResponse header the
//! data path writes in front of segment slices.

use super::constants::*;
use super::error::WireError;
use super::message::{BufferResponseHeader, Hello, Message, MessageType, Payload, ReceiverId};
use crate::base::error::Result;
use crate::base::event::Event;
use crate::protocol::credit::{BufferHeader, DataType};

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Length-prefixed string; the caller has checked the length against its limit.
fn put_string(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

fn check_string_len(s: &str, max: usize, what: &'static str) -> Result<(), WireError> {
    if s.len() > max {
        return Err(WireError::TooLongToSend {
            what,
            len: s.len(),
            max,
        });
    }
    Ok(())
}

fn put_header(out: &mut Vec<u8>, frame_len: u32, ty: MessageType) {
    put_u32(out, frame_len);
    out.extend_from_slice(&MAGIC);
    out.push(PROTOCOL_VERSION);
    out.push(ty as u8);
}

fn put_hello(out: &mut Vec<u8>, hello: &Hello) {
    out.push(hello.version);
    put_u32(out, hello.segment_size);
    put_u32(out, hello.max_frame_size);
    out.push(hello.auth as u8);
    out.extend_from_slice(&hello.nonce);
    match &hello.shm {
        None => out.extend_from_slice(&[0u8; 1 + 16 + 4 + 4 + 8]),
        Some(s) => {
            out.push(1);
            out.extend_from_slice(&s.boot_id);
            put_u32(out, s.uid);
            put_u32(out, s.pid);
            put_u64(out, s.key);
        }
    }
}

fn frame_len_u32(frame_len: usize) -> Result<u32, WireError> {
    u32::try_from(frame_len).map_err(|_| WireError::FrameOverU32(frame_len))
}

/// Appends the frame for `msg` to `out`.
///
/// Fails (with an error that is [`Error::InvalidArgument`](crate::Error::InvalidArgument)
/// upward), leaving `out` as it was, for a message the decoder
/// would reject: a string over its limit, zero credit in AddCredit, zero backlog in
/// BacklogAnnouncement, a zero size in NewBufferSize, a frame over 4 GiB. A data BufferResponse's payload is copied; the data
/// path writes [`encode_buffer_response_header`] and the payload slices instead.
pub fn encode(msg: &Message<'_>, out: &mut Vec<u8>) -> Result<(), WireError> {
    let start = out.len();
    let result = encode_body(msg, out, start);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode_body(msg: &Message<'_>, out: &mut Vec<u8>, start: usize) -> Result<(), WireError> {
    put_header(out, 0, msg.message_type());
    match msg {
        Message::Hello(hello) => put_hello(out, hello),
        Message::HelloAck { hello, tag } => {
            put_hello(out, hello);
            out.extend_from_slice(tag);
        }
        Message::AuthProof { tag } => out.extend_from_slice(tag),
        Message::PartitionRequest {
            partition_id,
            subpartition,
            receiver,
            initial_credit,
        } => {
            check_string_len(partition_id, MAX_PARTITION_ID_LEN, "partition id")?;
            put_u64(out, receiver.0);
            put_u32(out, *subpartition);
            put_u32(out, initial_credit.get());
            put_string(out, partition_id);
        }
        Message::AddCredit { receiver, credit } => {
            if credit.is_zero() {
                return Err(WireError::ZeroToSend {
                    ty: MessageType::AddCredit,
                    receiver: *receiver,
                });
            }
            put_u64(out, receiver.0);
            put_u32(out, credit.get());
        }
        Message::BacklogAnnouncement { receiver, backlog } => {
            if *backlog == 0 {
                return Err(WireError::ZeroToSend {
                    ty: MessageType::BacklogAnnouncement,
                    receiver: *receiver,
                });
            }
            put_u64(out, receiver.0);
            put_u32(out, *backlog);
        }
        Message::BufferResponse(b) => {
            let payload_len = b.payload.encoded_len();
            put_buffer_response_fields(out, &b.header(), payload_len as u32);
            match &b.payload {
                Payload::Data(bytes) => out.extend_from_slice(bytes),
                Payload::Event(event) => event.encode(out)?,
            }
        }
        Message::ErrorResponse {
            receiver,
            kind,
            message,
        } => {
            check_string_len(message, MAX_MESSAGE_LEN, "error message")?;
            match receiver {
                None => {
                    out.push(ERROR_SCOPE_FATAL);
                    put_u64(out, 0);
                }
                Some(r) => {
                    out.push(ERROR_SCOPE_CHANNEL);
                    put_u64(out, r.0);
                }
            }
            out.extend_from_slice(&(*kind as u16).to_le_bytes());
            put_string(out, message);
        }
        Message::CancelPartitionRequest { receiver }
        | Message::PartitionNotFound { receiver }
        | Message::ResumeConsumption { receiver } => put_u64(out, receiver.0),
        Message::NewBufferSize { receiver, size } => {
            if *size == 0 {
                return Err(WireError::ZeroToSend {
                    ty: MessageType::NewBufferSize,
                    receiver: *receiver,
                });
            }
            put_u64(out, receiver.0);
            put_u32(out, *size);
        }
        Message::RecordAnnouncement { receiver, bytes } | Message::RecordGrant { receiver, bytes } => {
            if *bytes == 0 {
                return Err(WireError::ZeroToSend {
                    ty: msg.message_type(),
                    receiver: *receiver,
                });
            }
            put_u64(out, receiver.0);
            put_u64(out, *bytes);
        }
        Message::SharedBuffer(b) => {
            if !b.is_within_item() {
                return Err(WireError::SharedBufferOutOfItem(*b));
            }
            put_u64(out, b.receiver.0);
            put_u64(out, b.sequence_number);
            put_u32(out, b.backlog);
            put_u64(out, b.item);
            put_u64(out, b.item_len);
            put_u64(out, b.offset);
            put_u32(out, b.len);
        }
        Message::CloseRequest => {}
    }
    let frame_len = frame_len_u32(out.len() - start)?;
    out[start..start + 4].copy_from_slice(&frame_len.to_le_bytes());
    Ok(())
}

fn put_buffer_response_fields(out: &mut Vec<u8>, header: &BufferResponseHeader, payload_len: u32) {
    put_u64(out, header.receiver.0);
    put_u64(out, header.sequence_number);
    put_u32(out, header.backlog);
    out.push(match header.data_type {
        DataType::Data => DATA_TYPE_DATA,
        DataType::Event => DATA_TYPE_EVENT,
    });
    put_u32(out, payload_len);
}

/// The frame header and fixed fields of a BufferResponse whose `payload_len` bytes of payload
/// the caller writes right after it (one vectored write of header + segment slices), so the
/// payload is never copied. With [`DataType::Event`] the payload must be an encoded
/// [`Event`].
///
/// Fails with [`WireError::FrameOverU32`] if the frame would not fit a `u32` length; the
/// receiver's frame limit (see [`max_frame_size`]) is the caller's to respect.
pub fn encode_buffer_response_header(
    receiver: ReceiverId,
    header: BufferHeader,
    payload_len: usize,
) -> Result<[u8; BUFFER_RESPONSE_HEADER_LEN], WireError> {
    let frame_len = frame_len_u32(BUFFER_RESPONSE_HEADER_LEN.saturating_add(payload_len))?;
    let mut out = Vec::with_capacity(BUFFER_RESPONSE_HEADER_LEN);
    put_header(&mut out, frame_len, MessageType::BufferResponse);
    let fixed = BufferResponseHeader {
        receiver,
        sequence_number: header.sequence_number,
        backlog: header.backlog,
        data_type: header.data_type,
        payload_len,
    };
    put_buffer_response_fields(&mut out, &fixed, payload_len as u32);
    let mut bytes = [0u8; BUFFER_RESPONSE_HEADER_LEN];
    bytes.copy_from_slice(&out);
    Ok(bytes)
}

/// The byte form of an event: the payload of a BufferResponse whose data type is
/// [`DataType::Event`].
impl Event {
    /// Bytes of the encoded event.
    pub fn encoded_len(&self) -> usize {
        match self {
            Event::EndOfPartition => 1,
            Event::ProducerFailed(msg) => 1 + 4 + msg.len(),
            Event::User(bytes) => 1 + 4 + bytes.len(),
            Event::Barrier { .. } => 1 + 8 + 1,
            Event::BarrierPosition(_) => 1 + 8,
        }
    }

    /// Appends the encoded event (a BufferResponse payload) to `out`. Fails with
    /// [`WireError::TooLongToSend`], appending nothing, if a message is over [`MAX_MESSAGE_LEN`].
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        match self {
            Event::EndOfPartition => out.push(EVENT_END_OF_PARTITION),
            Event::ProducerFailed(msg) => {
                check_string_len(msg, MAX_MESSAGE_LEN, "ProducerFailed message")?;
                out.push(EVENT_PRODUCER_FAILED);
                put_string(out, msg);
            }
            Event::User(bytes) => {
                if bytes.len() > MAX_EVENT_PAYLOAD_LEN {
                    return Err(WireError::EventPayloadTooLong(bytes.len()));
                }
                out.push(EVENT_USER);
                put_u32(out, bytes.len() as u32);
                out.extend_from_slice(bytes);
            }
            Event::Barrier { id, unaligned } => {
                out.push(EVENT_BARRIER);
                put_u64(out, *id);
                out.push(if *unaligned { BARRIER_UNALIGNED } else { 0 });
            }
            Event::BarrierPosition(id) => {
                out.push(EVENT_BARRIER_POSITION);
                put_u64(out, *id);
            }
        }
        Ok(())
    }
}
