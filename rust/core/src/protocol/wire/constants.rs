//! The numbers of the wire format: magic, version, header and body sizes, string limits, the
//! frame limit, and the tag bytes inside bodies.

pub use crate::base::event::MAX_EVENT_PAYLOAD_LEN;

/// The four bytes after the length field of every frame.
pub const MAGIC: [u8; 4] = *b"CFLW";

/// The frame format version this side speaks; a frame with any other version is rejected.
pub const PROTOCOL_VERSION: u8 = 6;

/// Bytes of the header every frame starts with: length, magic, version, message type.
pub const HEADER_LEN: usize = 10;

/// Bytes of a BufferResponse before its payload (frame header + fixed fields).
pub const BUFFER_RESPONSE_HEADER_LEN: usize = HEADER_LEN + BUFFER_RESPONSE_FIXED_BODY_LEN;

/// Longest partition id a PartitionRequest may carry, in UTF-8 bytes.
pub const MAX_PARTITION_ID_LEN: usize = 1024;

/// Longest message an ErrorResponse or a ProducerFailed event may carry, in UTF-8 bytes.
/// Longer messages are cut at a character boundary by [`Message::error_response`](super::Message::error_response) and
/// [`Event::producer_failed`](super::Event::producer_failed).
pub const MAX_MESSAGE_LEN: usize = 2048;

/// Bytes of a nonce in Hello / HelloAck.
pub const NONCE_LEN: usize = 32;

/// Bytes of an HMAC-SHA256 tag in HelloAck / AuthProof.
pub const TAG_LEN: usize = 32;

/// A random challenge sent in Hello / HelloAck.
pub type Nonce = [u8; NONCE_LEN];

/// An HMAC-SHA256 tag proving knowledge of the shared secret (the codec only carries it).
pub type AuthTag = [u8; TAG_LEN];

/// Bytes of a Hello's shared-memory block: flag, boot id, uid, pid, listener key.
pub(super) const SHM_OFFER_LEN: usize = 1 + 16 + 4 + 4 + 8;
pub(super) const HELLO_BODY_LEN: usize = 1 + 4 + 4 + 1 + NONCE_LEN + SHM_OFFER_LEN;
pub(super) const HELLO_ACK_BODY_LEN: usize = HELLO_BODY_LEN + TAG_LEN;
pub(super) const PARTITION_REQUEST_FIXED_BODY_LEN: usize = 8 + 4 + 4 + 4;
pub(super) const BUFFER_RESPONSE_FIXED_BODY_LEN: usize = 8 + 8 + 4 + 1 + 4;
pub(super) const ERROR_RESPONSE_FIXED_BODY_LEN: usize = 1 + 8 + 2 + 4;
pub(super) const SHARED_BUFFER_BODY_LEN: usize = 8 + 8 + 4 + 8 + 8 + 8 + 4;
/// Encoded size of the longest event: tag + length + message or user payload.
pub(super) const MAX_EVENT_LEN: usize = 1 + 4 + max(MAX_MESSAGE_LEN, MAX_EVENT_PAYLOAD_LEN);

pub(super) const fn max(a: usize, b: usize) -> usize {
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

/// The most payload a data BufferResponse that lies wholly inside a record's body may carry
/// (since version 6): such a buffer is read straight into the record, so it is not bounded by
/// the buffer (segment) size. Every other data buffer carries at most one segment.
pub const MAX_BULK_PAYLOAD: usize = 1 << 20;

/// The frame limit for a connection with segments of `segment_size` bytes: a data frame of
/// one segment or of [`MAX_BULK_PAYLOAD`], whichever is larger, but never less than
/// [`MAX_CONTROL_FRAME_LEN`] so that every control message fits. (Only data frames can be this
/// long: every other message has a limit of its own, and a data payload is streamed, never
/// buffered whole by the decoder.)
pub const fn max_frame_size(segment_size: usize) -> usize {
    max(
        max(segment_size, MAX_BULK_PAYLOAD).saturating_add(BUFFER_RESPONSE_HEADER_LEN),
        MAX_CONTROL_FRAME_LEN,
    )
}

// Event payload tags (the first byte of an event) and the barrier flag.
pub(super) const EVENT_END_OF_PARTITION: u8 = 0;
pub(super) const EVENT_PRODUCER_FAILED: u8 = 1;
pub(super) const EVENT_USER: u8 = 2;
pub(super) const EVENT_BARRIER: u8 = 3;
pub(super) const EVENT_BARRIER_POSITION: u8 = 4;
pub(super) const BARRIER_UNALIGNED: u8 = 1;

// ErrorResponse scopes and BufferResponse data types.
pub(super) const ERROR_SCOPE_FATAL: u8 = 0;
pub(super) const ERROR_SCOPE_CHANNEL: u8 = 1;
pub(super) const DATA_TYPE_DATA: u8 = 0;
pub(super) const DATA_TYPE_EVENT: u8 = 1;
