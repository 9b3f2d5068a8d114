//! The messages of the protocol and their fields, as values ([`Message`] and what it is made
//! of). Their byte form is [`encode`](super::encode())'s and [`decode`](super::decode())'s.

use std::borrow::Cow;
use std::fmt;

use super::constants::*;
use crate::base::error::Error;
use crate::base::event::Event;
use crate::protocol::credit::{BufferHeader, Credit, DataType};

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
    /// Sender → receiver: the channel's next buffer starts records of this many bytes, more
    /// than its record grant covers (protocol version 3).
    RecordAnnouncement = 14,
    /// Receiver → sender: more record bytes for a channel (protocol version 3).
    RecordGrant = 15,
    /// Sender → receiver, over shared memory only: a data buffer whose bytes lie in the
    /// link's heap (protocol version 5).
    SharedBuffer = 16,
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
            14 => RecordAnnouncement,
            15 => RecordGrant,
            16 => SharedBuffer,
            _ => return None,
        })
    }

    /// Smallest and largest body (frame minus header) a frame of this type can have; `None`
    /// for no upper bound but the frame limit (BufferResponse).
    pub(super) fn body_len_range(self) -> (usize, Option<usize>) {
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
            RecordAnnouncement | RecordGrant => exact(8 + 8),
            SharedBuffer => exact(SHARED_BUFFER_BODY_LEN),
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
    /// Shared-memory channels: `Some` when the side offers them (protocol version 4).
    pub shm: Option<ShmOffer>,
}

/// What a side that offers shared-memory channels says about itself in its Hello. Both sides
/// use shared memory only when both offer it with the same boot id and uid (one host, one
/// user); the pids and the key name the server's Unix socket and are checked against the
/// socket's peer credentials.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ShmOffer {
    /// `/proc/sys/kernel/random/boot_id` as 16 bytes.
    pub boot_id: [u8; 16],
    /// The process's real uid.
    pub uid: u32,
    /// The process's pid.
    pub pid: u32,
    /// A server's random listener key (its socket's name); a client sends 0.
    pub key: u64,
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

/// What the wire's limits do to an event.
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

/// A data buffer whose bytes the sender put in the shared-memory link's heap instead of
/// after the header: bytes `offset..offset + len` of the item of `item_len` bytes at heap
/// offset `item` (one handed-off record, prefix included, placed whole before its first
/// buffer). Credit, backlog and sequence numbers are a data BufferResponse's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SharedBuffer {
    /// The channel it is for.
    pub receiver: ReceiverId,
    /// Position in the channel, from 0.
    pub sequence_number: u64,
    /// Data buffers still queued at the sender after this one.
    pub backlog: u32,
    /// Heap offset of the item.
    pub item: u64,
    /// Bytes of the item (> 0).
    pub item_len: u64,
    /// Where this buffer starts in the item.
    pub offset: u64,
    /// Bytes of this buffer (> 0; `offset + len <= item_len`).
    pub len: u32,
}

impl SharedBuffer {
    /// Whether the buffer is non-empty and lies within a non-empty item (the codec refuses
    /// any other, both ways).
    pub fn is_within_item(&self) -> bool {
        self.len > 0
            && self.item_len > 0
            && self
                .offset
                .checked_add(u64::from(self.len))
                .is_some_and(|end| end <= self.item_len)
    }

    /// The header of the data BufferResponse this buffer stands for.
    pub fn header(&self) -> BufferResponseHeader {
        BufferResponseHeader {
            receiver: self.receiver,
            sequence_number: self.sequence_number,
            backlog: self.backlog,
            data_type: DataType::Data,
            payload_len: self.len as usize,
        }
    }
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
    /// Sender → receiver: `receiver`'s next buffer starts records of `bytes` in all, which
    /// its record grant does not cover (never zero).
    RecordAnnouncement {
        /// The channel.
        receiver: ReceiverId,
        /// The lengths of the records the buffer starts, summed.
        bytes: u64,
    },
    /// Receiver → sender: `bytes` more record bytes for `receiver` (never zero).
    RecordGrant {
        /// The channel.
        receiver: ReceiverId,
        /// Record bytes granted.
        bytes: u64,
    },
    /// Sender → receiver over shared memory: a data buffer in the link's heap.
    SharedBuffer(SharedBuffer),
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
            Message::RecordAnnouncement { .. } => MessageType::RecordAnnouncement,
            Message::RecordGrant { .. } => MessageType::RecordGrant,
            Message::SharedBuffer(_) => MessageType::SharedBuffer,
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
            Message::RecordAnnouncement { receiver, bytes } => {
                Message::RecordAnnouncement { receiver, bytes }
            }
            Message::RecordGrant { receiver, bytes } => Message::RecordGrant { receiver, bytes },
            Message::SharedBuffer(b) => Message::SharedBuffer(b),
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
