//! The codec's errors: [`WireError`], one variant per way bytes can fail to be a frame of this
//! protocol (the peer's fault) or a message can fail to be encoded (the caller's). Upward they
//! become the crate's [`Error`] with the same text: [`Error::Protocol`] for the peer's,
//! [`Error::InvalidArgument`] for the caller's.

use super::constants::{HEADER_LEN, MAGIC, MAX_EVENT_LEN, MAX_EVENT_PAYLOAD_LEN, PROTOCOL_VERSION};
use super::message::{MessageType, ReceiverId};
use crate::base::error::Error;

/// Why the codec refused bytes or a message. The messages are the ones users see.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    // The peer broke the format: after one of these the stream has lost its framing.
    /// A declared frame length below the header's size.
    #[error("frame length {len} is shorter than the {HEADER_LEN}-byte frame header")]
    FrameTooShort {
        /// The declared length.
        len: usize,
    },
    /// A declared frame length over the connection's limit.
    #[error("frame length {len} exceeds the maximum frame size {max}")]
    FrameTooLong {
        /// The declared length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Not [`MAGIC`] after the length (as far as it arrived).
    #[error("bad magic {got:02x?}, expected {expected:02x?} ({magic:?})", magic = magic_text())]
    BadMagic {
        /// The bytes that arrived.
        got: Vec<u8>,
        /// What they should have been.
        expected: Vec<u8>,
    },
    /// A protocol version other than [`PROTOCOL_VERSION`].
    #[error("unsupported protocol version {0}, this side speaks {PROTOCOL_VERSION}")]
    UnsupportedVersion(u8),
    /// A message type byte no message has.
    #[error("unknown message type {0}")]
    UnknownMessageType(u8),
    /// A frame shorter than its type's smallest body allows.
    #[error("{ty} frame of {len} bytes is shorter than its minimum of {min}")]
    BodyTooShort {
        /// The message type.
        ty: MessageType,
        /// The frame's length.
        len: usize,
        /// The smallest frame of the type.
        min: usize,
    },
    /// A frame longer than its type's largest body allows.
    #[error("{ty} frame of {len} bytes is longer than its maximum of {max}")]
    BodyTooLong {
        /// The message type.
        ty: MessageType,
        /// The frame's length.
        len: usize,
        /// The largest frame of the type.
        max: usize,
    },
    /// A header-only decode of a frame that is not a BufferResponse.
    #[error("expected a BufferResponse, got {0}")]
    NotBufferResponse(MessageType),
    /// A BufferResponse data type byte other than data or event.
    #[error("unknown BufferResponse data type {0}")]
    UnknownDataType(u8),
    /// A BufferResponse whose payload length disagrees with its frame length.
    #[error(
        "BufferResponse declares a {declared}-byte payload but its frame of {frame_len} bytes has room for {room}"
    )]
    PayloadLengthMismatch {
        /// The payload length field.
        declared: usize,
        /// The frame's length.
        frame_len: usize,
        /// The payload bytes the frame has.
        room: usize,
    },
    /// An event payload longer than the longest event.
    #[error("event payload of {0} bytes exceeds the limit of {MAX_EVENT_LEN}")]
    EventTooLong(usize),
    /// A body or payload that ends before a field does.
    #[error("truncated {what}: {needed} more bytes needed, {left} left")]
    Truncated {
        /// What was being read ("AddCredit body", "event payload", ...).
        what: &'static str,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left.
        left: usize,
    },
    /// A string field over its limit.
    #[error("{field} of {len} bytes in {what} exceeds the limit of {max} bytes")]
    StringTooLong {
        /// The field ("partition id", "error message", ...).
        field: &'static str,
        /// What it was read from.
        what: &'static str,
        /// Its declared length.
        len: usize,
        /// Its limit.
        max: usize,
    },
    /// A string field that is not UTF-8.
    #[error("{field} in {what} is not valid UTF-8: {error}")]
    InvalidUtf8 {
        /// The field.
        field: &'static str,
        /// What it was read from.
        what: &'static str,
        /// Where the bytes stopped being UTF-8.
        error: std::str::Utf8Error,
    },
    /// Bytes left after the last field of a body or payload.
    #[error("{n} trailing bytes after the {what}")]
    TrailingBytes {
        /// How many.
        n: usize,
        /// What was read.
        what: &'static str,
    },
    /// A whole-frame decode given fewer bytes than a header.
    #[error("a frame of {0} bytes is shorter than the {HEADER_LEN}-byte frame header")]
    ShorterThanHeader(usize),
    /// A whole-frame decode given a different number of bytes than the frame declares.
    #[error("frame of {len} bytes declares a length of {declared}")]
    LengthMismatch {
        /// Bytes given.
        len: usize,
        /// The declared length.
        declared: usize,
    },
    /// An AddCredit, BacklogAnnouncement or NewBufferSize carrying zero.
    #[error("{ty} of zero for {receiver}")]
    Zero {
        /// The message type.
        ty: MessageType,
        /// The channel.
        receiver: ReceiverId,
    },
    /// A SharedBuffer that is empty or reaches past its item.
    #[error("SharedBuffer for {} of {} bytes at {} of an item of {} bytes", .0.receiver, .0.len, .0.offset, .0.item_len)]
    SharedBufferOutOfItem(super::SharedBuffer),
    /// A fatal ErrorResponse that names a channel.
    #[error("fatal ErrorResponse with receiver id {0}, expected 0")]
    FatalWithReceiver(u64),
    /// An ErrorResponse scope byte other than fatal or channel.
    #[error("unknown ErrorResponse scope {0}")]
    UnknownErrorScope(u8),
    /// An auth mode byte other than none or HMAC-SHA256.
    #[error("unknown auth mode {0}")]
    UnknownAuthMode(u8),
    /// A Hello's shared-memory flag other than 0 (no offer) or 1 (an offer).
    #[error("unknown shared-memory flag {0} in Hello")]
    UnknownShmFlag(u8),
    /// A Hello without a shared-memory offer (flag 0) whose offer bytes are not all zero.
    #[error("Hello without a shared-memory offer has non-zero bytes in its place")]
    ShmOfferWithoutFlag,
    /// An error kind no [`ErrorKind`](super::ErrorKind) has.
    #[error("unknown error kind {0}")]
    UnknownErrorKind(u16),
    /// A user event longer than [`MAX_EVENT_PAYLOAD_LEN`].
    #[error("user event of {0} bytes exceeds {MAX_EVENT_PAYLOAD_LEN}")]
    UserEventTooLong(usize),
    /// A barrier flags byte other than aligned or unaligned.
    #[error("unknown barrier flags {0}")]
    UnknownBarrierFlags(u8),
    /// An event tag byte no event has.
    #[error("unknown event tag {0}")]
    UnknownEventTag(u8),
    /// Every call of a [`Decoder`](super::Decoder) after the error that broke its stream.
    #[error("stream already failed: {0}")]
    StreamFailed(Box<WireError>),

    // The caller asked for what the format cannot carry, or used the decoder out of order.
    /// A string to send over its limit.
    #[error("{what} of {len} bytes exceeds the limit of {max} bytes")]
    TooLongToSend {
        /// The field.
        what: &'static str,
        /// Its length.
        len: usize,
        /// Its limit.
        max: usize,
    },
    /// An AddCredit, BacklogAnnouncement or NewBufferSize to send carrying zero.
    #[error("{ty} of zero for {receiver}")]
    ZeroToSend {
        /// The message type.
        ty: MessageType,
        /// The channel.
        receiver: ReceiverId,
    },
    /// A user event to send over [`MAX_EVENT_PAYLOAD_LEN`].
    #[error("an event payload is at most {MAX_EVENT_PAYLOAD_LEN} bytes, got {0}")]
    EventPayloadTooLong(usize),
    /// A frame to send that does not fit the u32 length field.
    #[error("frame of {0} bytes does not fit a u32 length")]
    FrameOverU32(usize),
    /// The next frame was asked for before the current data frame's payload was taken.
    #[error("{0} payload bytes of the current BufferResponse not taken yet")]
    PayloadNotTaken(usize),
    /// Payload read from the stream while the decoder still holds bytes.
    #[error("{0} bytes are buffered in the decoder: take them with read_payload first")]
    BytesBuffered(usize),
    /// More payload read than the frame has.
    #[error("{n} payload bytes read but only {remaining} remain in the frame")]
    PayloadOverrun {
        /// Bytes reported read.
        n: usize,
        /// Bytes the frame had left.
        remaining: usize,
    },
}

fn magic_text() -> &'static str {
    std::str::from_utf8(&MAGIC).unwrap_or("")
}

impl WireError {
    /// Whether the peer broke the protocol (the connection must close), rather than this side
    /// asking for something the format cannot carry.
    pub fn is_peer_fault(&self) -> bool {
        !matches!(
            self,
            WireError::TooLongToSend { .. }
                | WireError::ZeroToSend { .. }
                | WireError::EventPayloadTooLong(_)
                | WireError::FrameOverU32(_)
                | WireError::PayloadNotTaken(_)
                | WireError::BytesBuffered(_)
                | WireError::PayloadOverrun { .. }
        )
    }
}

impl From<WireError> for Error {
    fn from(e: WireError) -> Error {
        if e.is_peer_fault() {
            Error::Protocol(e.to_string())
        } else {
            Error::InvalidArgument(e.to_string())
        }
    }
}
