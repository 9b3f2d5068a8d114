//! The wire protocol between two environments, as an I/O-free codec: [`Message`] ⇄ bytes.
//! The network layer ([`crate::transport`]) reads and writes bytes; everything about what those
//! bytes mean is here.
//!
//! # Frames
//!
//! Every message is one frame: a 10-byte header and a body. All integers are little-endian.
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 4 | frame length, u32: the **whole** frame, these 4 bytes included (≥ 10) |
//! | 4 | 4 | magic `b"CFLW"` ([`MAGIC`]) |
//! | 8 | 1 | protocol version, 2 ([`PROTOCOL_VERSION`]; version 1 had no record body buffers, see [`crate::protocol::credit`]) |
//! | 9 | 1 | message type ([`MessageType`]) |
//!
//! Bodies, in field order (`rid` = receiver id, u64; `str` = u32 byte length + UTF-8 bytes):
//!
//! | type | message | body | body bytes |
//! |---|---|---|---|
//! | 1 | Hello | version u8, segment_size u32, max_frame_size u32, auth u8 (0 none, 1 HMAC-SHA256), nonce \[32\] | 42 |
//! | 2 | HelloAck | the Hello fields, then tag \[32\] (HMAC of the client's nonce) | 74 |
//! | 3 | AuthProof | tag \[32\] (HMAC of the server's nonce) | 32 |
//! | 4 | PartitionRequest | rid, subpartition u32, initial credit u32, partition id `str` (≤ 1024 bytes) | 20 + id |
//! | 5 | AddCredit | rid, credit u32 (> 0) | 12 |
//! | 6 | BacklogAnnouncement | rid, backlog u32 (> 0) | 12 |
//! | 7 | BufferResponse | rid, sequence number u64, backlog u32, data type u8 (0 data, 1 event), payload length u32, payload | 25 + payload |
//! | 8 | ErrorResponse | scope u8 (0 fatal, 1 channel), rid (0 when fatal), error kind u16, message `str` (≤ 2048 bytes) | 15 + message |
//! | 9 | CancelPartitionRequest | rid | 8 |
//! | 10 | CloseRequest | (empty) | 0 |
//! | 11 | PartitionNotFound | rid | 8 |
//! | 12 | ResumeConsumption | rid (receiver → sender: a reader paused after an aligned barrier continues) | 8 |
//! | 13 | NewBufferSize (receiver → sender; buffer debloating) | rid, size u32 (> 0, ≤ the sender's segment size) | 12 |
//!
//! An event payload (data type 1) is a tag u8: 0 EndOfPartition (nothing follows),
//! 1 ProducerFailed (message `str`, ≤ 2048 bytes), 2 user event (u32 length + bytes,
//! ≤ [`MAX_EVENT_PAYLOAD_LEN`] = 16 KiB), 3 checkpoint barrier (id u64, flags u8:
//! 1 = unaligned; after an aligned one the sender pauses that reader until ResumeConsumption),
//! 4 barrier position (id u64: where an unaligned barrier was written, see
//! [`crate::protocol::checkpoint`]). Error kinds are [`ErrorKind`]: 1
//! internal, 2 protocol, 3 authentication, 4 producer failed, 5 subpartition out of range,
//! 6 already consumed, 7 limit exceeded. The fixed part of a BufferResponse is
//! [`BUFFER_RESPONSE_HEADER_LEN`] = 35 bytes, header included.
//!
//! Every encoding is canonical: a decoder accepts exactly what the encoder produces, so the
//! property tests can require `decode(encode(m)) == m` and reject every other byte.
//!
//! # Limits
//!
//! A connection's frame limit is [`max_frame_size`]`(segment_size)` = segment size +
//! 35, and never less than [`MAX_CONTROL_FRAME_LEN`] (the largest control message or
//! event); before the handshake the limit is `MAX_CONTROL_FRAME_LEN`. The decoder reads the
//! declared length from the first 4 bytes and rejects it, before allocating anything, if it is
//! over the limit or under the minimum for its type; fixed-size messages must have exactly
//! their size. Then a wrong magic, version or message type is rejected as soon as its byte
//! arrives; the body must be used up exactly, strings must be valid UTF-8 and within their
//! limit (checked before the string is copied). All of these are [`Error::Protocol`] naming
//! the numbers; after one, the stream has lost its framing and the connection must close.
//!
//! # Decoding in two phases (mini-redis `Frame::check` / `Frame::parse`)
//!
//! 1. [`check`]: is a whole, plausible frame buffered? `Ok(None)` means "need more
//!    bytes", which is not an error. Never allocates.
//! 2. [`decode`]: parse exactly that frame into a [`Message`]; a data payload
//!    is borrowed from the frame, not copied.
//!
//! For data, [`decode_buffer_response_header`] decodes a BufferResponse from its
//! first 35 bytes, so the transport knows the payload size and can read the payload straight
//! into a pooled segment rather than buffering the whole frame. [`Decoder`] drives
//! both over a byte stream: `next_message` yields whole messages; `next_frame` yields data
//! BufferResponses as a header followed by payload bytes handed to the caller
//! (`read_payload`, `payload_read_elsewhere`, `discard_payload`).
//!
//! # Encoding
//!
//! [`encode`] appends a whole frame for any message (it copies a data payload: use it
//! for control messages, events and tests). The data path uses
//! [`encode_buffer_response_header`]: a 35-byte array, written with the segment
//! slices in one vectored write, so payload bytes are never copied.
//!
//! # Handshake (carried here, checked by the transport)
//!
//! The client sends Hello (its segment size, frame limit, auth mode, a random nonce); the
//! server answers HelloAck (its own, plus the HMAC-SHA256 tag of the client's nonce under the
//! shared secret); the client answers AuthProof (the tag of the server's nonce). Without a
//! secret the auth mode is 0 and the tags are zero. No other message is valid before the
//! handshake completes.

use std::borrow::Cow;
use std::fmt;

use crate::base::error::{Error, Result};
pub use crate::base::event::{Event, MAX_EVENT_PAYLOAD_LEN};
use crate::protocol::credit::{BufferHeader, Credit, DataType};

// ---------------------------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------------------------

/// The four bytes after the length field of every frame.
pub const MAGIC: [u8; 4] = *b"CFLW";

/// The frame format version this side speaks; a frame with any other version is rejected.
pub const PROTOCOL_VERSION: u8 = 2;

/// Bytes of the header every frame starts with: length, magic, version, message type.
pub const HEADER_LEN: usize = 10;

/// Bytes of a BufferResponse before its payload (frame header + fixed fields).
pub const BUFFER_RESPONSE_HEADER_LEN: usize = HEADER_LEN + BUFFER_RESPONSE_FIXED_BODY_LEN;

/// Longest partition id a PartitionRequest may carry, in UTF-8 bytes.
pub const MAX_PARTITION_ID_LEN: usize = 1024;

/// Longest message an ErrorResponse or a ProducerFailed event may carry, in UTF-8 bytes.
/// Longer messages are cut at a character boundary by [`Message::error_response`] and
/// [`Event::producer_failed`].
pub const MAX_MESSAGE_LEN: usize = 2048;

/// Bytes of a nonce in Hello / HelloAck.
pub const NONCE_LEN: usize = 32;

/// Bytes of an HMAC-SHA256 tag in HelloAck / AuthProof.
pub const TAG_LEN: usize = 32;

/// A random challenge sent in Hello / HelloAck.
pub type Nonce = [u8; NONCE_LEN];

/// An HMAC-SHA256 tag proving knowledge of the shared secret (the codec only carries it).
pub type AuthTag = [u8; TAG_LEN];

const HELLO_BODY_LEN: usize = 1 + 4 + 4 + 1 + NONCE_LEN;
const HELLO_ACK_BODY_LEN: usize = HELLO_BODY_LEN + TAG_LEN;
const PARTITION_REQUEST_FIXED_BODY_LEN: usize = 8 + 4 + 4 + 4;
const BUFFER_RESPONSE_FIXED_BODY_LEN: usize = 8 + 8 + 4 + 1 + 4;
const ERROR_RESPONSE_FIXED_BODY_LEN: usize = 1 + 8 + 2 + 4;
/// Encoded size of the longest event: tag + length + message or user payload.
const MAX_EVENT_LEN: usize = 1 + 4 + max(MAX_MESSAGE_LEN, MAX_EVENT_PAYLOAD_LEN);

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// The longest frame that is not a data BufferResponse: every control message and every
/// event fits. Also the frame limit to use until the handshake has negotiated one.
pub const MAX_CONTROL_FRAME_LEN: usize = HEADER_LEN
    + max(
        max(
            HELLO_ACK_BODY_LEN,
            PARTITION_REQUEST_FIXED_BODY_LEN + MAX_PARTITION_ID_LEN,
        ),
        max(
            ERROR_RESPONSE_FIXED_BODY_LEN + MAX_MESSAGE_LEN,
            BUFFER_RESPONSE_FIXED_BODY_LEN + MAX_EVENT_LEN,
        ),
    );

/// The frame limit for a connection whose data frames carry at most one segment of
/// `segment_size` bytes: `segment_size + BUFFER_RESPONSE_HEADER_LEN`, but never less than
/// [`MAX_CONTROL_FRAME_LEN`] so that every control message fits.
pub const fn max_frame_size(segment_size: usize) -> usize {
    max(
        segment_size.saturating_add(BUFFER_RESPONSE_HEADER_LEN),
        MAX_CONTROL_FRAME_LEN,
    )
}

fn protocol(msg: String) -> Error {
    Error::Protocol(msg)
}

// ---------------------------------------------------------------------------------------------
// Message types and fields
// ---------------------------------------------------------------------------------------------

/// The message type byte of a frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageType {
    /// Client → server: first message of a connection.
    Hello = 1,
    /// Server → client: answer to Hello.
    HelloAck = 2,
    /// Client → server: answer to the server's challenge.
    AuthProof = 3,
    /// Receiver → sender: start sending a subpartition.
    PartitionRequest = 4,
    /// Receiver → sender: more credit for a channel.
    AddCredit = 5,
    /// Sender → receiver: backlog of a channel without credit.
    BacklogAnnouncement = 6,
    /// Sender → receiver: a data buffer or an event.
    BufferResponse = 7,
    /// Either way: a channel (or the connection) failed.
    ErrorResponse = 8,
    /// Receiver → sender: stop sending a channel.
    CancelPartitionRequest = 9,
    /// Either way: close the connection.
    CloseRequest = 10,
    /// Sender → receiver: the requested partition is not registered (yet).
    PartitionNotFound = 11,
    /// Receiver → sender: a channel paused after an aligned checkpoint barrier may continue
    /// (Flink: `ResumeConsumption`).
    ResumeConsumption = 12,
    /// Receiver → sender: cut this channel's buffers at this size (buffer debloating).
    NewBufferSize = 13,
}

impl MessageType {
    /// The type for a header byte, if it is one.
    pub fn from_u8(byte: u8) -> Option<MessageType> {
        use MessageType::*;
        Some(match byte {
            1 => Hello,
            2 => HelloAck,
            3 => AuthProof,
            4 => PartitionRequest,
            5 => AddCredit,
            6 => BacklogAnnouncement,
            7 => BufferResponse,
            8 => ErrorResponse,
            9 => CancelPartitionRequest,
            10 => CloseRequest,
            11 => PartitionNotFound,
            12 => ResumeConsumption,
            13 => NewBufferSize,
            _ => return None,
        })
    }

    /// Smallest and largest body (frame minus header) a frame of this type can have; `None`
    /// for no upper bound but the frame limit (BufferResponse).
    fn body_len_range(self) -> (usize, Option<usize>) {
        use MessageType::*;
        let exact = |n| (n, Some(n));
        match self {
            Hello => exact(HELLO_BODY_LEN),
            HelloAck => exact(HELLO_ACK_BODY_LEN),
            AuthProof => exact(TAG_LEN),
            PartitionRequest => (
                PARTITION_REQUEST_FIXED_BODY_LEN,
                Some(PARTITION_REQUEST_FIXED_BODY_LEN + MAX_PARTITION_ID_LEN),
            ),
            AddCredit | BacklogAnnouncement | NewBufferSize => exact(8 + 4),
            BufferResponse => (BUFFER_RESPONSE_FIXED_BODY_LEN, None),
            ErrorResponse => (
                ERROR_RESPONSE_FIXED_BODY_LEN,
                Some(ERROR_RESPONSE_FIXED_BODY_LEN + MAX_MESSAGE_LEN),
            ),
            CancelPartitionRequest | PartitionNotFound | ResumeConsumption => exact(8),
            CloseRequest => exact(0),
        }
    }
}

impl fmt::Display for MessageType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Identifies a remote input channel on a connection (Flink: `InputChannelID`). The receiving
/// environment hands them out, unique among the channels it has open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReceiverId(pub u64);

impl fmt::Display for ReceiverId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "receiver {}", self.0)
    }
}

/// How the peers authenticate each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AuthMode {
    /// No secret; tags are all zero and not checked.
    None = 0,
    /// HMAC-SHA256 challenge-response over the nonces with the shared secret.
    HmacSha256 = 1,
}

impl AuthMode {
    fn from_u8(byte: u8) -> Result<AuthMode> {
        match byte {
            0 => Ok(AuthMode::None),
            1 => Ok(AuthMode::HmacSha256),
            _ => Err(protocol(format!("unknown auth mode {byte}"))),
        }
    }
}

/// What one side offers in Hello / HelloAck.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hello {
    /// Highest protocol version the side speaks (today [`PROTOCOL_VERSION`]).
    pub version: u8,
    /// Its segment size: the largest payload it sends in one BufferResponse.
    pub segment_size: u32,
    /// The largest frame it accepts.
    pub max_frame_size: u32,
    /// Whether it has a secret.
    pub auth: AuthMode,
    /// Its challenge: the other side answers with an HMAC of it.
    pub nonce: Nonce,
}

/// Why a channel or connection failed, in an ErrorResponse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorKind {
    /// Anything without a more specific kind.
    Internal = 1,
    /// The peer broke the protocol.
    Protocol = 2,
    /// Authentication failed.
    Authentication = 3,
    /// The producer of the channel failed.
    ProducerFailed = 4,
    /// The requested subpartition does not exist.
    SubpartitionOutOfRange = 5,
    /// The requested subpartition already has a reader.
    AlreadyConsumed = 6,
    /// The peer exceeded one of this side's limits (connections, channels, outstanding
    /// requests); the message names the limit and its setting.
    LimitExceeded = 7,
}

impl ErrorKind {
    fn from_u16(code: u16) -> Result<ErrorKind> {
        use ErrorKind::*;
        Ok(match code {
            1 => Internal,
            2 => Protocol,
            3 => Authentication,
            4 => ProducerFailed,
            5 => SubpartitionOutOfRange,
            6 => AlreadyConsumed,
            7 => LimitExceeded,
            _ => return Err(protocol(format!("unknown error kind {code}"))),
        })
    }

    /// The kind to send for a local error.
    pub fn of(error: &Error) -> ErrorKind {
        match error {
            Error::Protocol(_) => ErrorKind::Protocol,
            Error::Authentication(_) => ErrorKind::Authentication,
            Error::ProducerFailed(_) => ErrorKind::ProducerFailed,
            Error::SubpartitionOutOfRange { .. } => ErrorKind::SubpartitionOutOfRange,
            Error::AlreadyConsumed { .. } => ErrorKind::AlreadyConsumed,
            Error::LimitExceeded(_) => ErrorKind::LimitExceeded,
            _ => ErrorKind::Internal,
        }
    }
}

const EVENT_END_OF_PARTITION: u8 = 0;
const EVENT_PRODUCER_FAILED: u8 = 1;
const EVENT_USER: u8 = 2;
const EVENT_BARRIER: u8 = 3;
const EVENT_BARRIER_POSITION: u8 = 4;
const BARRIER_UNALIGNED: u8 = 1;

/// The byte form of an event: the payload of a BufferResponse whose data type is
/// [`DataType::Event`].
impl Event {
    /// A ProducerFailed event, its message cut to [`MAX_MESSAGE_LEN`] bytes.
    pub fn producer_failed(message: &str) -> Event {
        Event::ProducerFailed(truncate_utf8(message, MAX_MESSAGE_LEN).to_owned())
    }

    /// The event as it goes on the wire: a ProducerFailed message cut to [`MAX_MESSAGE_LEN`]
    /// bytes at a character boundary.
    pub fn to_wire(&self) -> Event {
        match self {
            Event::ProducerFailed(msg) => Event::producer_failed(msg),
            other => other.clone(),
        }
    }

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
    /// [`Error::InvalidArgument`], appending nothing, if a message is over [`MAX_MESSAGE_LEN`].
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<()> {
        match self {
            Event::EndOfPartition => out.push(EVENT_END_OF_PARTITION),
            Event::ProducerFailed(msg) => {
                check_string_len(msg, MAX_MESSAGE_LEN, "ProducerFailed message")?;
                out.push(EVENT_PRODUCER_FAILED);
                put_string(out, msg);
            }
            Event::User(bytes) => {
                if bytes.len() > MAX_EVENT_PAYLOAD_LEN {
                    return Err(Error::InvalidArgument(format!(
                        "an event payload is at most {MAX_EVENT_PAYLOAD_LEN} bytes, got {}",
                        bytes.len()
                    )));
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

    /// Parses an event payload; the whole payload must be one event.
    pub fn decode(payload: &[u8]) -> Result<Event> {
        let mut r = Reader::new(payload, "event payload");
        let event = match r.u8()? {
            EVENT_END_OF_PARTITION => Event::EndOfPartition,
            EVENT_PRODUCER_FAILED => {
                Event::ProducerFailed(r.string(MAX_MESSAGE_LEN, "ProducerFailed message")?)
            }
            EVENT_USER => {
                let len = r.u32()? as usize;
                if len > MAX_EVENT_PAYLOAD_LEN {
                    return Err(protocol(format!(
                        "user event of {len} bytes exceeds {MAX_EVENT_PAYLOAD_LEN}"
                    )));
                }
                Event::User(r.take(len)?.to_vec())
            }
            EVENT_BARRIER => {
                let id = r.u64()?;
                let unaligned = match r.u8()? {
                    0 => false,
                    BARRIER_UNALIGNED => true,
                    f => return Err(protocol(format!("unknown barrier flags {f}"))),
                };
                Event::Barrier { id, unaligned }
            }
            EVENT_BARRIER_POSITION => Event::BarrierPosition(r.u64()?),
            tag => return Err(protocol(format!("unknown event tag {tag}"))),
        };
        r.finish()?;
        Ok(event)
    }
}

/// What a BufferResponse carries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Payload<'a> {
    /// Serialized records, usually borrowed from the frame that was decoded.
    Data(Cow<'a, [u8]>),
    /// An event, parsed.
    Event(Event),
}

impl Payload<'_> {
    /// Data or event.
    pub fn data_type(&self) -> DataType {
        match self {
            Payload::Data(_) => DataType::Data,
            Payload::Event(_) => DataType::Event,
        }
    }

    /// Bytes of the payload on the wire.
    pub fn encoded_len(&self) -> usize {
        match self {
            Payload::Data(bytes) => bytes.len(),
            Payload::Event(event) => event.encoded_len(),
        }
    }

    fn into_owned(self) -> Payload<'static> {
        match self {
            Payload::Data(bytes) => Payload::Data(Cow::Owned(bytes.into_owned())),
            Payload::Event(event) => Payload::Event(event),
        }
    }
}

/// A whole BufferResponse (Flink: `NettyMessage.BufferResponse`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BufferResponse<'a> {
    /// The channel it is for.
    pub receiver: ReceiverId,
    /// Position in the channel, from 0.
    pub sequence_number: u64,
    /// Data buffers still queued at the sender after this one.
    pub backlog: u32,
    /// The data or the event.
    pub payload: Payload<'a>,
}

impl BufferResponse<'_> {
    /// The fixed fields, as the header-only decode gives them.
    pub fn header(&self) -> BufferResponseHeader {
        BufferResponseHeader {
            receiver: self.receiver,
            sequence_number: self.sequence_number,
            backlog: self.backlog,
            data_type: self.payload.data_type(),
            payload_len: self.payload.encoded_len(),
        }
    }
}

/// The fixed fields of a BufferResponse: everything but the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferResponseHeader {
    /// The channel it is for.
    pub receiver: ReceiverId,
    /// Position in the channel, from 0.
    pub sequence_number: u64,
    /// Data buffers still queued at the sender after this one.
    pub backlog: u32,
    /// Data or event.
    pub data_type: DataType,
    /// Bytes of payload after the header.
    pub payload_len: usize,
}

impl BufferResponseHeader {
    /// The fields the credit state machine needs
    /// ([`GateCredit::on_buffer_response`](crate::protocol::credit::GateCredit::on_buffer_response)).
    pub fn credit_header(&self) -> BufferHeader {
        BufferHeader {
            sequence_number: self.sequence_number,
            backlog: self.backlog,
            data_type: self.data_type,
        }
    }
}

/// One message of the protocol. Only a BufferResponse borrows (its payload, from the decoded
/// frame); [`Message::into_owned`] detaches it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Message<'a> {
    /// Client → server, first message: what the client offers and its challenge.
    Hello(Hello),
    /// Server → client: what the server offers, its challenge, and its answer to the client's
    /// (all-zero without a secret).
    HelloAck {
        /// The server's offer and nonce.
        hello: Hello,
        /// HMAC of the client's nonce.
        tag: AuthTag,
    },
    /// Client → server: its answer to the server's challenge.
    AuthProof {
        /// HMAC of the server's nonce.
        tag: AuthTag,
    },
    /// Receiver → sender: start sending `subpartition` of `partition_id` to `receiver`.
    PartitionRequest {
        /// The partition (at most [`MAX_PARTITION_ID_LEN`] bytes).
        partition_id: String,
        /// The subpartition index.
        subpartition: u32,
        /// The channel that will receive it.
        receiver: ReceiverId,
        /// The channel's exclusive buffers.
        initial_credit: Credit,
    },
    /// Receiver → sender: `credit` more buffers for `receiver` (never zero).
    AddCredit {
        /// The channel.
        receiver: ReceiverId,
        /// The new credit, at least one.
        credit: Credit,
    },
    /// Sender → receiver: `receiver`'s sender has `backlog` data buffers but no credit
    /// (never zero).
    BacklogAnnouncement {
        /// The channel.
        receiver: ReceiverId,
        /// Queued data buffers, at least one.
        backlog: u32,
    },
    /// Sender → receiver: a buffer or an event.
    BufferResponse(BufferResponse<'a>),
    /// Either way: a channel failed, or the whole connection (`receiver: None`, fatal).
    ErrorResponse {
        /// The failed channel, or `None` for the connection.
        receiver: Option<ReceiverId>,
        /// Why.
        kind: ErrorKind,
        /// What happened (at most [`MAX_MESSAGE_LEN`] bytes).
        message: String,
    },
    /// Receiver → sender: stop sending to `receiver` and release its reader.
    CancelPartitionRequest {
        /// The channel.
        receiver: ReceiverId,
    },
    /// Either way: the side closes the connection.
    CloseRequest,
    /// Sender → receiver: the partition `receiver` asked for is not registered; retry later.
    PartitionNotFound {
        /// The channel.
        receiver: ReceiverId,
    },
    /// Receiver → sender: `receiver`'s reader, paused after an aligned barrier, may continue.
    ResumeConsumption {
        /// The channel.
        receiver: ReceiverId,
    },
    /// Receiver → sender: from now on, finish `receiver`'s buffers once they hold `size`
    /// bytes (buffer debloating; never zero, at most the sender's segment size).
    NewBufferSize {
        /// The channel.
        receiver: ReceiverId,
        /// Bytes per buffer, at least one.
        size: u32,
    },
}

impl Message<'_> {
    /// The header byte of this message.
    pub fn message_type(&self) -> MessageType {
        match self {
            Message::Hello(_) => MessageType::Hello,
            Message::HelloAck { .. } => MessageType::HelloAck,
            Message::AuthProof { .. } => MessageType::AuthProof,
            Message::PartitionRequest { .. } => MessageType::PartitionRequest,
            Message::AddCredit { .. } => MessageType::AddCredit,
            Message::BacklogAnnouncement { .. } => MessageType::BacklogAnnouncement,
            Message::BufferResponse(_) => MessageType::BufferResponse,
            Message::ErrorResponse { .. } => MessageType::ErrorResponse,
            Message::CancelPartitionRequest { .. } => MessageType::CancelPartitionRequest,
            Message::CloseRequest => MessageType::CloseRequest,
            Message::PartitionNotFound { .. } => MessageType::PartitionNotFound,
            Message::ResumeConsumption { .. } => MessageType::ResumeConsumption,
            Message::NewBufferSize { .. } => MessageType::NewBufferSize,
        }
    }

    /// The same message owning its payload.
    pub fn into_owned(self) -> Message<'static> {
        match self {
            Message::Hello(h) => Message::Hello(h),
            Message::HelloAck { hello, tag } => Message::HelloAck { hello, tag },
            Message::AuthProof { tag } => Message::AuthProof { tag },
            Message::PartitionRequest {
                partition_id,
                subpartition,
                receiver,
                initial_credit,
            } => Message::PartitionRequest {
                partition_id,
                subpartition,
                receiver,
                initial_credit,
            },
            Message::AddCredit { receiver, credit } => Message::AddCredit { receiver, credit },
            Message::BacklogAnnouncement { receiver, backlog } => {
                Message::BacklogAnnouncement { receiver, backlog }
            }
            Message::BufferResponse(b) => Message::BufferResponse(BufferResponse {
                receiver: b.receiver,
                sequence_number: b.sequence_number,
                backlog: b.backlog,
                payload: b.payload.into_owned(),
            }),
            Message::ErrorResponse {
                receiver,
                kind,
                message,
            } => Message::ErrorResponse {
                receiver,
                kind,
                message,
            },
            Message::CancelPartitionRequest { receiver } => Message::CancelPartitionRequest { receiver },
            Message::CloseRequest => Message::CloseRequest,
            Message::PartitionNotFound { receiver } => Message::PartitionNotFound { receiver },
            Message::ResumeConsumption { receiver } => Message::ResumeConsumption { receiver },
            Message::NewBufferSize { receiver, size } => Message::NewBufferSize { receiver, size },
        }
    }
}

impl Message<'static> {
    /// An ErrorResponse, `message` cut to [`MAX_MESSAGE_LEN`] bytes at a character boundary.
    pub fn error_response(receiver: Option<ReceiverId>, kind: ErrorKind, message: &str) -> Self {
        Message::ErrorResponse {
            receiver,
            kind,
            message: truncate_utf8(message, MAX_MESSAGE_LEN).to_owned(),
        }
    }

    /// A BufferResponse carrying `event`.
    pub fn event(receiver: ReceiverId, sequence_number: u64, backlog: u32, event: Event) -> Self {
        Message::BufferResponse(BufferResponse {
            receiver,
            sequence_number,
            backlog,
            payload: Payload::Event(event),
        })
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------

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

fn check_string_len(s: &str, max: usize, what: &str) -> Result<()> {
    if s.len() > max {
        return Err(Error::InvalidArgument(format!(
            "{what} of {} bytes exceeds the limit of {max} bytes",
            s.len()
        )));
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
}

fn frame_len_u32(frame_len: usize) -> Result<u32> {
    u32::try_from(frame_len)
        .map_err(|_| Error::InvalidArgument(format!("frame of {frame_len} bytes does not fit a u32 length")))
}

/// Appends the frame for `msg` to `out`.
///
/// Fails with [`Error::InvalidArgument`], leaving `out` as it was, for a message the decoder
/// would reject: a string over its limit, zero credit in AddCredit, zero backlog in
/// BacklogAnnouncement, a zero size in NewBufferSize, a frame over 4 GiB. A data BufferResponse's payload is copied; the data
/// path writes [`encode_buffer_response_header`] and the payload slices instead.
pub fn encode(msg: &Message<'_>, out: &mut Vec<u8>) -> Result<()> {
    let start = out.len();
    let result = encode_body(msg, out, start);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode_body(msg: &Message<'_>, out: &mut Vec<u8>, start: usize) -> Result<()> {
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
                return Err(Error::InvalidArgument(format!(
                    "AddCredit of zero for {receiver}"
                )));
            }
            put_u64(out, receiver.0);
            put_u32(out, credit.get());
        }
        Message::BacklogAnnouncement { receiver, backlog } => {
            if *backlog == 0 {
                return Err(Error::InvalidArgument(format!(
                    "BacklogAnnouncement of zero for {receiver}"
                )));
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
                return Err(Error::InvalidArgument(format!(
                    "NewBufferSize of zero for {receiver}"
                )));
            }
            put_u64(out, receiver.0);
            put_u32(out, *size);
        }
        Message::CloseRequest => {}
    }
    let frame_len = frame_len_u32(out.len() - start)?;
    out[start..start + 4].copy_from_slice(&frame_len.to_le_bytes());
    Ok(())
}

const ERROR_SCOPE_FATAL: u8 = 0;
const ERROR_SCOPE_CHANNEL: u8 = 1;
const DATA_TYPE_DATA: u8 = 0;
const DATA_TYPE_EVENT: u8 = 1;

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
/// Fails with [`Error::InvalidArgument`] if the frame would not fit a `u32` length; the
/// receiver's frame limit (see [`max_frame_size`]) is the caller's to respect.
pub fn encode_buffer_response_header(
    receiver: ReceiverId,
    header: BufferHeader,
    payload_len: usize,
) -> Result<[u8; BUFFER_RESPONSE_HEADER_LEN]> {
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

// ---------------------------------------------------------------------------------------------
// Decoding, phase 1: is a whole, plausible frame buffered?
// ---------------------------------------------------------------------------------------------

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
pub fn check_header(buf: &[u8], max_frame: usize) -> Result<Option<FrameInfo>> {
    let Some(len_bytes) = buf.get(..4) else {
        return Ok(None);
    };
    let frame_len = u32::from_le_bytes(len_bytes.try_into().expect("4 bytes")) as usize;
    if frame_len < HEADER_LEN {
        return Err(protocol(format!(
            "frame length {frame_len} is shorter than the {HEADER_LEN}-byte frame header"
        )));
    }
    if frame_len > max_frame {
        return Err(protocol(format!(
            "frame length {frame_len} exceeds the maximum frame size {max_frame}"
        )));
    }
    let magic_end = buf.len().min(8);
    if buf[4..magic_end] != MAGIC[..magic_end - 4] {
        return Err(protocol(format!(
            "bad magic {:02x?}, expected {:02x?} ({:?})",
            &buf[4..magic_end],
            &MAGIC[..magic_end - 4],
            std::str::from_utf8(&MAGIC).unwrap_or("")
        )));
    }
    let Some(&version) = buf.get(8) else {
        return Ok(None);
    };
    if version != PROTOCOL_VERSION {
        return Err(protocol(format!(
            "unsupported protocol version {version}, this side speaks {PROTOCOL_VERSION}"
        )));
    }
    let Some(&type_byte) = buf.get(9) else {
        return Ok(None);
    };
    let message_type = MessageType::from_u8(type_byte)
        .ok_or_else(|| protocol(format!("unknown message type {type_byte}")))?;
    let body_len = frame_len - HEADER_LEN;
    let (min_body, max_body) = message_type.body_len_range();
    if body_len < min_body {
        return Err(protocol(format!(
            "{message_type} frame of {frame_len} bytes is shorter than its minimum of {}",
            HEADER_LEN + min_body
        )));
    }
    if let Some(max_body) = max_body {
        if body_len > max_body {
            return Err(protocol(format!(
                "{message_type} frame of {frame_len} bytes is longer than its maximum of {}",
                HEADER_LEN + max_body
            )));
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
pub fn check(buf: &[u8], max_frame: usize) -> Result<Option<FrameInfo>> {
    match check_header(buf, max_frame)? {
        Some(info) if buf.len() >= info.frame_len => Ok(Some(info)),
        _ => Ok(None),
    }
}

/// Header-only decode of a BufferResponse: as soon as its first [`BUFFER_RESPONSE_HEADER_LEN`]
/// bytes are buffered, the fixed fields, so the payload can be read straight into a segment.
/// `Ok(None)`: not enough bytes yet. Fails if the frame is not a well-formed BufferResponse.
pub fn decode_buffer_response_header(buf: &[u8], max_frame: usize) -> Result<Option<BufferResponseHeader>> {
    let Some(info) = check_header(buf, max_frame)? else {
        return Ok(None);
    };
    if info.message_type != MessageType::BufferResponse {
        return Err(protocol(format!(
            "expected a BufferResponse, got {}",
            info.message_type
        )));
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
        other => return Err(protocol(format!("unknown BufferResponse data type {other}"))),
    };
    let payload_len = r.u32()? as usize;
    let expected = info.frame_len - BUFFER_RESPONSE_HEADER_LEN;
    if payload_len != expected {
        return Err(protocol(format!(
            "BufferResponse declares a {payload_len}-byte payload but its frame of {} bytes has room for {expected}",
            info.frame_len
        )));
    }
    if data_type == DataType::Event && payload_len > MAX_EVENT_LEN {
        return Err(protocol(format!(
            "event payload of {payload_len} bytes exceeds the limit of {MAX_EVENT_LEN}"
        )));
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

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(protocol(format!(
                "truncated {}: {n} more bytes needed, {} left",
                self.what,
                self.buf.len()
            )));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A u32-length-prefixed UTF-8 string; the length is checked against `max` and what is
    /// left before anything is allocated.
    fn string(&mut self, max: usize, field: &str) -> Result<String> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(protocol(format!(
                "{field} of {len} bytes in {} exceeds the limit of {max} bytes",
                self.what
            )));
        }
        let bytes = self.take(len)?;
        let s = std::str::from_utf8(bytes)
            .map_err(|e| protocol(format!("{field} in {} is not valid UTF-8: {e}", self.what)))?;
        Ok(s.to_owned())
    }

    fn finish(self) -> Result<()> {
        if !self.buf.is_empty() {
            return Err(protocol(format!(
                "{} trailing bytes after the {}",
                self.buf.len(),
                self.what
            )));
        }
        Ok(())
    }
}

fn read_hello(r: &mut Reader<'_>) -> Result<Hello> {
    Ok(Hello {
        version: r.u8()?,
        segment_size: r.u32()?,
        max_frame_size: r.u32()?,
        auth: AuthMode::from_u8(r.u8()?)?,
        nonce: r.array()?,
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
    }
}

/// Phase 2 of decoding: parses exactly one whole frame (as delimited by [`check`]). The header
/// is validated again, so this is safe on any input; every body byte must be used. A data
/// payload is borrowed from `frame`.
pub fn decode(frame: &[u8]) -> Result<Message<'_>> {
    let info = check_header(frame, usize::MAX)?.ok_or_else(|| {
        protocol(format!(
            "a frame of {} bytes is shorter than the {HEADER_LEN}-byte frame header",
            frame.len()
        ))
    })?;
    if frame.len() != info.frame_len {
        return Err(protocol(format!(
            "frame of {} bytes declares a length of {}",
            frame.len(),
            info.frame_len
        )));
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
                return Err(protocol(format!("AddCredit of zero for {receiver}")));
            }
            Message::AddCredit { receiver, credit }
        }
        MessageType::BacklogAnnouncement => {
            let receiver = ReceiverId(r.u64()?);
            let backlog = r.u32()?;
            if backlog == 0 {
                return Err(protocol(format!("BacklogAnnouncement of zero for {receiver}")));
            }
            Message::BacklogAnnouncement { receiver, backlog }
        }
        MessageType::ErrorResponse => {
            let scope = r.u8()?;
            let id = r.u64()?;
            let receiver = match scope {
                ERROR_SCOPE_FATAL if id == 0 => None,
                ERROR_SCOPE_FATAL => {
                    return Err(protocol(format!(
                        "fatal ErrorResponse with receiver id {id}, expected 0"
                    )))
                }
                ERROR_SCOPE_CHANNEL => Some(ReceiverId(id)),
                other => return Err(protocol(format!("unknown ErrorResponse scope {other}"))),
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
                return Err(protocol(format!("NewBufferSize of zero for {receiver}")));
            }
            Message::NewBufferSize { receiver, size }
        }
        MessageType::BufferResponse => unreachable!("handled above"),
    };
    r.finish()?;
    Ok(msg)
}

// ---------------------------------------------------------------------------------------------
// Decoder: the two phases over a byte stream
// ---------------------------------------------------------------------------------------------

/// What [`Decoder::next_frame`] yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A whole message: any control message, or a BufferResponse carrying an event.
    Message(Message<'a>),
    /// The fixed fields of a data BufferResponse. Its `payload_len` bytes come next, through
    /// [`Decoder::read_payload`] / [`Decoder::payload_read_elsewhere`] or
    /// [`Decoder::discard_payload`], before the next frame.
    DataHeader(BufferResponseHeader),
}

/// Turns an incoming byte stream into messages. No I/O: the transport puts the bytes it read
/// in ([`Decoder::feed`], or [`Decoder::read_buf`] + [`Decoder::commit`] to read in place) and
/// takes messages out.
///
/// Two ways to take them out, which may be mixed between frames:
///
/// - [`Decoder::next_message`]: whole messages; a data payload is borrowed from the decoder's
///   buffer, so the whole frame is buffered first.
/// - [`Decoder::next_frame`]: a data BufferResponse is split. Its header comes out as soon as
///   its [`BUFFER_RESPONSE_HEADER_LEN`] bytes are there, then the payload goes straight to the
///   caller's segment: [`Decoder::read_payload`] hands over what is already buffered, and the
///   caller may read the rest from the socket into the segment directly and report it with
///   [`Decoder::payload_read_elsewhere`]. A full frame is then never buffered here.
///
/// The buffer grows only with the bytes put in, never by a length the peer declared: a
/// declared length over the limit is an error as soon as its 4 bytes arrive. After an error
/// the stream has lost its framing; every later call fails with the same error.
#[derive(Debug)]
pub struct Decoder {
    /// Bytes read but not decoded: `buf[start..end]`; `buf[end..]` is scratch for `read_buf`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_frame_size: usize,
    /// Payload bytes of the current split data frame not yet handed over.
    payload_remaining: usize,
    /// The error that broke the stream, repeated by every later call.
    failed: Option<String>,
}

impl Decoder {
    /// A decoder accepting frames of at most `max_frame_size` bytes; before the handshake
    /// use [`MAX_CONTROL_FRAME_LEN`], after it [`max_frame_size`] of the negotiated segment
    /// size.
    pub fn new(max_frame_size: usize) -> Self {
        Decoder {
            buf: Vec::new(),
            start: 0,
            end: 0,
            max_frame_size,
            payload_remaining: 0,
            failed: None,
        }
    }

    /// The frame limit.
    pub fn max_frame_size(&self) -> usize {
        self.max_frame_size
    }

    /// Changes the frame limit (after the handshake); applies from the next frame.
    pub fn set_max_frame_size(&mut self, max_frame_size: usize) {
        self.max_frame_size = max_frame_size;
    }

    /// Bytes put in and not yet decoded or handed over.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Payload bytes of the current data frame still to be taken (0 between frames).
    pub fn payload_remaining(&self) -> usize {
        self.payload_remaining
    }

    /// Appends bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.read_buf(bytes.len())[..bytes.len()].copy_from_slice(bytes);
        self.commit(bytes.len());
    }

    /// At least `min_len` writable bytes after the buffered ones, for reading in place; call
    /// [`Decoder::commit`] with the number of bytes written.
    pub fn read_buf(&mut self, min_len: usize) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 && (self.buf.len() - self.end < min_len || self.start >= self.buf.len() / 2)
        {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < min_len {
            self.buf.resize(self.end + min_len, 0);
        }
        &mut self.buf[self.end..]
    }

    /// Marks `n` bytes of the last [`Decoder::read_buf`] as filled.
    ///
    /// # Panics
    ///
    /// If `n` is more than that slice's length.
    pub fn commit(&mut self, n: usize) {
        assert!(self.end + n <= self.buf.len(), "commit({n}) past the read buffer");
        self.end += n;
    }

    fn fail<T>(&mut self, error: Error) -> Result<T> {
        if let Error::Protocol(msg) = &error {
            self.failed = Some(msg.clone());
        }
        Err(error)
    }

    fn ready(&self) -> Result<()> {
        if let Some(msg) = &self.failed {
            return Err(protocol(format!("stream already failed: {msg}")));
        }
        if self.payload_remaining > 0 {
            return Err(Error::InvalidArgument(format!(
                "{} payload bytes of the current BufferResponse not taken yet",
                self.payload_remaining
            )));
        }
        Ok(())
    }

    /// The next whole message, `Ok(None)` if more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<Message<'_>>> {
        self.ready()?;
        let info = match check(&self.buf[self.start..self.end], self.max_frame_size) {
            Ok(Some(info)) => info,
            Ok(None) => return Ok(None),
            Err(e) => return self.fail(e),
        };
        let frame_start = self.start;
        let frame_end = frame_start + info.frame_len;
        if let Err(e) = decode(&self.buf[frame_start..frame_end]) {
            return self.fail(e);
        }
        self.start = frame_end;
        // Decoded twice (once to check, once to borrow past `&mut self`): the second parse of
        // a valid frame cannot fail, and control frames are tiny.
        Ok(Some(
            decode(&self.buf[frame_start..frame_end]).expect("decoded above"),
        ))
    }

    /// The next message or data header, `Ok(None)` if more bytes are needed; see
    /// [`Frame::DataHeader`] for what to do after a data header.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>> {
        self.ready()?;
        let buffered = &self.buf[self.start..self.end];
        let info = match check_header(buffered, self.max_frame_size) {
            Ok(Some(info)) => info,
            Ok(None) => return Ok(None),
            Err(e) => return self.fail(e),
        };
        if info.message_type == MessageType::BufferResponse {
            match decode_buffer_response_header(buffered, self.max_frame_size) {
                Ok(Some(header)) if header.data_type == DataType::Data => {
                    self.start += BUFFER_RESPONSE_HEADER_LEN;
                    self.payload_remaining = header.payload_len;
                    return Ok(Some(Frame::DataHeader(header)));
                }
                Ok(Some(_event)) => {}
                Ok(None) => return Ok(None),
                Err(e) => return self.fail(e),
            }
        }
        Ok(self.next_message()?.map(Frame::Message))
    }

    /// Copies buffered payload bytes of the current data frame into `dst`; returns how many
    /// (at most `dst.len()` and [`Decoder::payload_remaining`]).
    pub fn read_payload(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.payload_remaining).min(self.buffered());
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        self.payload_remaining -= n;
        n
    }

    /// [`Decoder::read_payload`] into possibly uninitialized memory: initializes the first
    /// bytes of `dst` and returns how many.
    pub fn read_payload_into(&mut self, dst: &mut [std::mem::MaybeUninit<u8>]) -> usize {
        let n = dst.len().min(self.payload_remaining).min(self.buffered());
        for (d, s) in dst[..n].iter_mut().zip(&self.buf[self.start..self.start + n]) {
            d.write(*s);
        }
        self.start += n;
        self.payload_remaining -= n;
        n
    }

    /// Drops buffered payload bytes of the current data frame (the channel was released);
    /// returns how many payload bytes are still to come.
    pub fn discard_payload(&mut self) -> usize {
        let n = self.payload_remaining.min(self.buffered());
        self.start += n;
        self.payload_remaining -= n;
        self.payload_remaining
    }

    /// The caller read `n` payload bytes of the current data frame from the stream itself,
    /// into its segment. Only allowed once nothing is buffered (so the order is kept) and for
    /// at most [`Decoder::payload_remaining`] bytes; otherwise [`Error::InvalidArgument`].
    pub fn payload_read_elsewhere(&mut self, n: usize) -> Result<()> {
        if self.buffered() > 0 {
            return Err(Error::InvalidArgument(format!(
                "{} bytes are buffered in the decoder: take them with read_payload first",
                self.buffered()
            )));
        }
        if n > self.payload_remaining {
            return Err(Error::InvalidArgument(format!(
                "{n} payload bytes read but only {} remain in the frame",
                self.payload_remaining
            )));
        }
        self.payload_remaining -= n;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(auth: AuthMode) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            segment_size: 32 << 10,
            max_frame_size: max_frame_size(32 << 10) as u32,
            auth,
            nonce: std::array::from_fn(|i| i as u8),
        }
    }

    fn one_of_each() -> Vec<Message<'static>> {
        let r = ReceiverId(0x0102_0304_0506_0708);
        vec![
            Message::Hello(hello(AuthMode::None)),
            Message::HelloAck {
                hello: hello(AuthMode::HmacSha256),
                tag: [0xab; TAG_LEN],
            },
            Message::AuthProof { tag: [7; TAG_LEN] },
            Message::PartitionRequest {
                partition_id: "stage-3/map-7 ✓".into(),
                subpartition: 5,
                receiver: r,
                initial_credit: Credit::new(2),
            },
            Message::AddCredit {
                receiver: r,
                credit: Credit::new(3),
            },
            Message::BacklogAnnouncement {
                receiver: r,
                backlog: 9,
            },
            Message::BufferResponse(BufferResponse {
                receiver: r,
                sequence_number: u64::MAX,
                backlog: 4,
                payload: Payload::Data(Cow::Owned(b"arrow ipc bytes".to_vec())),
            }),
            Message::event(r, 0, 0, Event::EndOfPartition),
            Message::event(r, 1, 2, Event::producer_failed("writer interrupted")),
            Message::error_response(Some(r), ErrorKind::ProducerFailed, "boom"),
            Message::error_response(None, ErrorKind::Authentication, "bad HMAC"),
            Message::CancelPartitionRequest { receiver: r },
            Message::CloseRequest,
            Message::PartitionNotFound { receiver: r },
            Message::ResumeConsumption { receiver: r },
            Message::event(r, 2, 0, Event::User(b"watermark 17".to_vec())),
            Message::event(r, 3, 0, Event::User(vec![7; MAX_EVENT_PAYLOAD_LEN])),
            Message::event(
                r,
                4,
                1,
                Event::Barrier {
                    id: 9,
                    unaligned: false,
                },
            ),
            Message::event(
                r,
                5,
                1,
                Event::Barrier {
                    id: u64::MAX,
                    unaligned: true,
                },
            ),
            Message::event(r, 6, 0, Event::BarrierPosition(u64::MAX)),
            Message::NewBufferSize {
                receiver: r,
                size: 4096,
            },
        ]
    }

    fn encoded(msg: &Message<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode(msg, &mut out).unwrap();
        out
    }

    fn protocol_message(result: Result<impl fmt::Debug>) -> String {
        match result {
            Err(Error::Protocol(msg)) => msg,
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    #[test]
    fn every_message_type_round_trips() {
        for msg in one_of_each() {
            let bytes = encoded(&msg);
            let info = check(&bytes, MAX_CONTROL_FRAME_LEN).unwrap().unwrap();
            assert_eq!(info.frame_len, bytes.len());
            assert_eq!(info.message_type, msg.message_type());
            assert_eq!(decode(&bytes).unwrap(), msg);
        }
    }

    #[test]
    fn header_is_length_magic_version_type_little_endian() {
        let bytes = encoded(&Message::CloseRequest);
        assert_eq!(bytes, [10, 0, 0, 0, b'C', b'F', b'L', b'W', 2, 10]);
        let bytes = encoded(&Message::AddCredit {
            receiver: ReceiverId(1),
            credit: Credit::new(0x0102),
        });
        assert_eq!(bytes.len(), 22);
        assert_eq!(&bytes[..4], &22u32.to_le_bytes());
        assert_eq!(&bytes[10..], [1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0]);
    }

    #[test]
    fn data_header_plus_payload_equals_encoded_buffer_response() {
        let payload = b"0123456789".as_slice();
        let msg = Message::BufferResponse(BufferResponse {
            receiver: ReceiverId(42),
            sequence_number: 7,
            backlog: 3,
            payload: Payload::Data(Cow::Borrowed(payload)),
        });
        let header = BufferHeader {
            sequence_number: 7,
            backlog: 3,
            data_type: DataType::Data,
        };
        let head = encode_buffer_response_header(ReceiverId(42), header, payload.len()).unwrap();
        assert_eq!([&head[..], payload].concat(), encoded(&msg));
        let parsed = decode_buffer_response_header(&head, usize::MAX).unwrap().unwrap();
        assert_eq!(parsed.payload_len, payload.len());
        assert_eq!(parsed.credit_header(), header);
    }

    #[test]
    fn decoded_data_payload_borrows_from_the_frame() {
        let bytes = encoded(&one_of_each()[6]);
        let Message::BufferResponse(b) = decode(&bytes).unwrap() else {
            panic!("not a BufferResponse")
        };
        let Payload::Data(Cow::Borrowed(payload)) = b.payload else {
            panic!("payload was copied")
        };
        assert_eq!(payload.as_ptr(), bytes[BUFFER_RESPONSE_HEADER_LEN..].as_ptr());
    }

    #[test]
    fn length_over_the_limit_is_rejected_from_the_first_four_bytes() {
        let err = protocol_message(check(&(1u32 << 31).to_le_bytes(), 32 << 10));
        assert!(err.contains("2147483648") && err.contains("32768"), "{err}");
        let err = protocol_message(check(&5u32.to_le_bytes(), 1 << 20));
        assert!(err.contains("frame length 5 is shorter"), "{err}");
    }

    #[test]
    fn wrong_magic_is_rejected_from_its_first_byte() {
        let mut bytes = encoded(&Message::CloseRequest);
        bytes[4] = b'X';
        assert!(protocol_message(check(&bytes[..5], 100)).contains("bad magic"));
        assert!(protocol_message(decode(&bytes)).contains("bad magic"));
    }

    #[test]
    fn unknown_version_and_type_are_rejected() {
        let mut bytes = encoded(&Message::CloseRequest);
        // Version 1 peers count credit differently (no record body buffers).
        for version in [1, PROTOCOL_VERSION + 1] {
            bytes[8] = version;
            let msg = protocol_message(check(&bytes[..9], 100));
            assert!(msg.contains(&format!("version {version}")), "{msg}");
        }
        bytes[8] = PROTOCOL_VERSION;
        bytes[9] = 200;
        assert!(protocol_message(check(&bytes, 100)).contains("unknown message type 200"));
    }

    #[test]
    fn truncated_frame_needs_more_bytes_rather_than_failing() {
        for msg in one_of_each() {
            let bytes = encoded(&msg);
            for cut in 0..bytes.len() {
                assert_eq!(
                    check(&bytes[..cut], MAX_CONTROL_FRAME_LEN).unwrap(),
                    None,
                    "{msg:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn body_with_trailing_or_missing_bytes_is_rejected() {
        // A PartitionRequest whose frame is one byte longer than its string.
        let mut bytes = encoded(&one_of_each()[3]);
        bytes.push(0);
        let len = bytes.len() as u32;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        assert!(protocol_message(decode(&bytes)).contains("1 trailing bytes"));
        // ... and one byte shorter.
        bytes.truncate(bytes.len() - 2);
        let len = bytes.len() as u32;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        assert!(protocol_message(decode(&bytes)).contains("truncated"));
        // A fixed-size message with the wrong length fails from its header.
        let mut bytes = encoded(&Message::CancelPartitionRequest {
            receiver: ReceiverId(1),
        });
        bytes[0] += 1;
        assert!(protocol_message(check(&bytes[..HEADER_LEN], 100)).contains("longer than its maximum"));
    }

    #[test]
    fn frame_slice_must_match_its_declared_length() {
        let mut bytes = encoded(&Message::CloseRequest);
        bytes.push(0);
        assert!(protocol_message(decode(&bytes)).contains("declares a length of 10"));
    }

    #[test]
    fn invalid_utf8_and_absurd_string_lengths_are_rejected() {
        let mut bytes = encoded(&Message::error_response(None, ErrorKind::Internal, "abc"));
        let n = bytes.len();
        bytes[n - 2] = 0xff;
        assert!(protocol_message(decode(&bytes)).contains("not valid UTF-8"));
        let mut bytes = encoded(&Message::error_response(None, ErrorKind::Internal, "abc"));
        bytes[n - 7..n - 3].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(protocol_message(decode(&bytes)).contains("exceeds the limit of 2048"));
    }

    #[test]
    fn zero_credit_zero_backlog_and_bad_enums_are_rejected() {
        let bytes = encoded(&Message::AddCredit {
            receiver: ReceiverId(1),
            credit: Credit::ONE,
        });
        let mut zero = bytes.clone();
        zero[18] = 0;
        assert!(protocol_message(decode(&zero)).contains("AddCredit of zero"));
        assert!(matches!(
            encode(
                &Message::AddCredit {
                    receiver: ReceiverId(1),
                    credit: Credit::ZERO
                },
                &mut Vec::new()
            ),
            Err(Error::InvalidArgument(_))
        ));
        let mut bytes = encoded(&Message::Hello(hello(AuthMode::None)));
        bytes[HEADER_LEN + 9] = 9;
        assert!(protocol_message(decode(&bytes)).contains("unknown auth mode 9"));
        let mut bytes = encoded(&one_of_each()[6]);
        bytes[HEADER_LEN + 20] = 5;
        assert!(protocol_message(decode(&bytes)).contains("data type 5"));
        let mut bytes = encoded(&Message::event(ReceiverId(1), 0, 0, Event::EndOfPartition));
        *bytes.last_mut().unwrap() = 9;
        assert!(protocol_message(decode(&bytes)).contains("unknown event tag 9"));
    }

    #[test]
    fn zero_buffer_size_is_rejected_both_ways() {
        let zero = Message::NewBufferSize {
            receiver: ReceiverId(5),
            size: 0,
        };
        assert!(matches!(
            encode(&zero, &mut Vec::new()),
            Err(Error::InvalidArgument(_))
        ));
        let mut bytes = encoded(&Message::NewBufferSize {
            receiver: ReceiverId(5),
            size: 1,
        });
        bytes[HEADER_LEN + 8] = 0;
        assert!(protocol_message(decode(&bytes)).contains("NewBufferSize of zero for receiver 5"));
        assert_eq!(MessageType::from_u8(13), Some(MessageType::NewBufferSize));
    }

    #[test]
    fn oversized_event_is_rejected_from_its_fixed_header() {
        let head = encode_buffer_response_header(
            ReceiverId(1),
            BufferHeader {
                sequence_number: 0,
                backlog: 0,
                data_type: DataType::Event,
            },
            MAX_EVENT_LEN + 1,
        )
        .unwrap();
        let err = protocol_message(decode_buffer_response_header(&head, usize::MAX));
        let want = format!("event payload of {} bytes", MAX_EVENT_LEN + 1);
        assert!(err.contains(&want), "{err}");
    }

    #[test]
    fn payload_length_field_must_match_the_frame() {
        let mut bytes = encoded(&one_of_each()[6]);
        bytes[BUFFER_RESPONSE_HEADER_LEN - 4] += 1;
        assert!(protocol_message(decode(&bytes)).contains("room for"));
    }

    #[test]
    fn oversized_strings_are_refused_by_the_encoder_without_writing() {
        let mut out = vec![1, 2, 3];
        let msg = Message::PartitionRequest {
            partition_id: "p".repeat(MAX_PARTITION_ID_LEN + 1),
            subpartition: 0,
            receiver: ReceiverId(0),
            initial_credit: Credit::ZERO,
        };
        assert!(matches!(encode(&msg, &mut out), Err(Error::InvalidArgument(_))));
        assert_eq!(out, [1, 2, 3]);
    }

    #[test]
    fn long_messages_are_cut_at_a_char_boundary() {
        let long = "é".repeat(MAX_MESSAGE_LEN);
        let Message::ErrorResponse { message, .. } =
            Message::error_response(None, ErrorKind::Internal, &long)
        else {
            unreachable!()
        };
        assert_eq!(message.len(), MAX_MESSAGE_LEN);
        let Event::ProducerFailed(m) = Event::producer_failed(&format!("x{long}")) else {
            unreachable!()
        };
        assert_eq!(m.len(), MAX_MESSAGE_LEN - 1);
    }

    #[test]
    fn largest_control_frames_fit_the_control_limit() {
        let big = "x".repeat(MAX_MESSAGE_LEN);
        for msg in [
            Message::error_response(Some(ReceiverId(1)), ErrorKind::Internal, &big),
            Message::event(ReceiverId(1), 0, 0, Event::producer_failed(&big)),
            Message::PartitionRequest {
                partition_id: "p".repeat(MAX_PARTITION_ID_LEN),
                subpartition: 0,
                receiver: ReceiverId(0),
                initial_credit: Credit::ZERO,
            },
        ] {
            let bytes = encoded(&msg);
            assert!(check(&bytes, MAX_CONTROL_FRAME_LEN).unwrap().is_some());
        }
        assert!(max_frame_size(crate::memory::segment::MIN_SEGMENT_SIZE) >= MAX_CONTROL_FRAME_LEN);
        assert_eq!(max_frame_size(32 << 10), (32 << 10) + BUFFER_RESPONSE_HEADER_LEN);
    }

    #[test]
    fn events_go_on_the_wire_as_they_are_but_a_long_failure_message_is_cut() {
        for event in [Event::EndOfPartition, Event::ProducerFailed("x".into())] {
            assert_eq!(event.to_wire(), event);
        }
        let long = "é".repeat(MAX_MESSAGE_LEN);
        let Event::ProducerFailed(cut) = Event::ProducerFailed(long.clone()).to_wire() else {
            panic!("still a ProducerFailed")
        };
        assert_eq!(cut.len(), MAX_MESSAGE_LEN);
        assert!(long.starts_with(&cut));
    }

    #[test]
    fn decoder_yields_messages_fed_one_byte_at_a_time() {
        let msgs = one_of_each();
        let stream: Vec<u8> = msgs.iter().flat_map(encoded).collect();
        let mut decoder = Decoder::new(MAX_CONTROL_FRAME_LEN);
        let mut got = Vec::new();
        for byte in stream {
            decoder.feed(&[byte]);
            while let Some(msg) = decoder.next_message().unwrap() {
                got.push(msg.into_owned());
            }
        }
        assert_eq!(got, msgs);
        assert_eq!(decoder.buffered(), 0);
    }

    #[test]
    fn decoder_splits_data_frames_so_payload_goes_straight_to_a_segment() {
        let payload: Vec<u8> = (0..100u8).collect();
        let data = Message::BufferResponse(BufferResponse {
            receiver: ReceiverId(3),
            sequence_number: 0,
            backlog: 1,
            payload: Payload::Data(Cow::Borrowed(&payload)),
        });
        let mut stream = encoded(&data);
        stream.extend(encoded(&Message::CloseRequest));
        let mut decoder = Decoder::new(max_frame_size(4096));
        // Header plus the first 5 payload bytes arrive together.
        decoder.feed(&stream[..BUFFER_RESPONSE_HEADER_LEN + 5]);
        let Some(Frame::DataHeader(header)) = decoder.next_frame().unwrap() else {
            panic!("expected a data header")
        };
        assert_eq!(header.payload_len, 100);
        assert_eq!(decoder.payload_remaining(), 100);
        assert!(matches!(decoder.next_message(), Err(Error::InvalidArgument(_))));
        let mut segment = [0u8; 100];
        assert_eq!(decoder.read_payload(&mut segment), 5);
        // The transport reads the rest from the socket into the segment itself.
        segment[5..]
            .copy_from_slice(&stream[BUFFER_RESPONSE_HEADER_LEN + 5..BUFFER_RESPONSE_HEADER_LEN + 100]);
        decoder.payload_read_elsewhere(95).unwrap();
        assert_eq!(segment.as_slice(), payload.as_slice());
        decoder.feed(&stream[BUFFER_RESPONSE_HEADER_LEN + 100..]);
        assert_eq!(
            decoder.next_frame().unwrap(),
            Some(Frame::Message(Message::CloseRequest))
        );
        assert_eq!(decoder.next_frame().unwrap(), None);
    }

    #[test]
    fn payload_read_elsewhere_refuses_while_bytes_are_buffered() {
        let mut decoder = Decoder::new(MAX_CONTROL_FRAME_LEN);
        let head = encode_buffer_response_header(
            ReceiverId(1),
            BufferHeader {
                sequence_number: 0,
                backlog: 0,
                data_type: DataType::Data,
            },
            10,
        )
        .unwrap();
        decoder.feed(&head);
        decoder.feed(&[1, 2]);
        assert!(matches!(decoder.next_frame(), Ok(Some(Frame::DataHeader(_)))));
        assert!(decoder.payload_read_elsewhere(1).is_err());
        assert_eq!(decoder.discard_payload(), 8);
        assert!(decoder.payload_read_elsewhere(9).is_err());
        decoder.payload_read_elsewhere(8).unwrap();
        assert_eq!(decoder.next_frame().unwrap(), None);
    }

    #[test]
    fn decoder_events_come_whole_from_next_frame() {
        let msg = Message::event(ReceiverId(1), 4, 0, Event::producer_failed("x"));
        let mut decoder = Decoder::new(MAX_CONTROL_FRAME_LEN);
        let bytes = encoded(&msg);
        decoder.feed(&bytes[..BUFFER_RESPONSE_HEADER_LEN]);
        assert_eq!(decoder.next_frame().unwrap(), None);
        decoder.feed(&bytes[BUFFER_RESPONSE_HEADER_LEN..]);
        assert_eq!(decoder.next_frame().unwrap(), Some(Frame::Message(msg)));
    }

    #[test]
    fn decoder_stays_failed_after_a_protocol_error() {
        let mut decoder = Decoder::new(100);
        decoder.feed(&(1u32 << 31).to_le_bytes());
        assert!(protocol_message(decoder.next_message()).contains("exceeds the maximum frame size 100"));
        decoder.feed(&encoded(&Message::CloseRequest));
        assert!(protocol_message(decoder.next_frame()).contains("already failed"));
    }

    #[test]
    fn decoder_reads_in_place_and_reuses_its_buffer() {
        let bytes = encoded(&Message::CloseRequest);
        let mut decoder = Decoder::new(100);
        for _ in 0..1000 {
            let dst = decoder.read_buf(64);
            dst[..bytes.len()].copy_from_slice(&bytes);
            decoder.commit(bytes.len());
            assert_eq!(decoder.next_message().unwrap(), Some(Message::CloseRequest));
        }
        assert!(decoder.buf.len() <= 64);
    }
}
