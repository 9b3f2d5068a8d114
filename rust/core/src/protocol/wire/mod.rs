//! The wire protocol between two environments, as an I/O-free codec: [`Message`] ⇄ bytes.
//! The network layer ([`crate::net`]) reads and writes bytes; everything about what those
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
//! | 8 | 1 | protocol version, 4 ([`PROTOCOL_VERSION`]; version 3 had no shared-memory block in Hello, version 1 no record body buffers, see [`crate::protocol::credit`]) |
//! | 9 | 1 | message type ([`MessageType`]) |
//!
//! Bodies, in field order (`rid` = receiver id, u64; `str` = u32 byte length + UTF-8 bytes):
//!
//! | type | message | body | body bytes |
//! |---|---|---|---|
//! | 1 | Hello | version u8, segment_size u32, max_frame_size u32, auth u8 (0 none, 1 HMAC-SHA256), nonce \[32\], shm u8 (0 none, 1 offer), boot_id \[16\], uid u32, pid u32, key u64 | 75 |
//! | 2 | HelloAck | the Hello fields, then tag \[32\] (HMAC of the client's nonce) | 107 |
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
//! | 14 | RecordAnnouncement (sender → receiver; version 3) | rid, bytes u64 (> 0): record bytes the next buffer starts | 16 |
//! | 15 | RecordGrant (receiver → sender; version 3) | rid, bytes u64 (> 0): more record bytes | 16 |
//! | 16 | SharedBuffer (sender → receiver, shared-memory links only; version 5) | rid, sequence number u64, backlog u32, item u64 (heap offset), item length u64 (> 0), offset u64, length u32 (> 0, offset + length ≤ item length): a data buffer whose bytes are in the link's heap | 48 |
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
//! A connection's frame limit is [`max_frame_size`]`(segment_size)` = the larger of the
//! segment size and [`MAX_BULK_PAYLOAD`] (a data buffer inside a record's body, read straight
//! into the record, may be that long), + 35, and never less than [`MAX_CONTROL_FRAME_LEN`] (the
//! largest control message or event); before the handshake the limit is
//! `MAX_CONTROL_FRAME_LEN`. That a data payload over the segment size lies inside a record is
//! the receiver's check, which knows the records. The decoder reads the
//! declared length from the first 4 bytes and rejects it, before allocating anything, if it is
//! over the limit or under the minimum for its type; fixed-size messages must have exactly
//! their size. Then a wrong magic, version or message type is rejected as soon as its byte
//! arrives; the body must be used up exactly, strings must be valid UTF-8 and within their
//! limit (checked before the string is copied). All of these are a [`WireError`] naming
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
//! # Example: a round trip
//!
//! ```
//! use creditflow_core::protocol::credit::Credit;
//! use creditflow_core::protocol::wire::{
//!     check, decode, encode, Decoder, Message, ReceiverId, MAX_CONTROL_FRAME_LEN,
//! };
//!
//! let msg = Message::AddCredit { receiver: ReceiverId(7), credit: Credit::new(3) };
//! let mut bytes = Vec::new();
//! encode(&msg, &mut bytes).unwrap();
//! assert_eq!(bytes.len(), 10 + 12); // header + receiver id and credit
//!
//! // Phase 1 says whether a whole frame is there; phase 2 parses exactly that frame.
//! assert_eq!(check(&bytes[..9], MAX_CONTROL_FRAME_LEN).unwrap(), None);
//! assert_eq!(check(&bytes, MAX_CONTROL_FRAME_LEN).unwrap().unwrap().frame_len, bytes.len());
//! assert_eq!(decode(&bytes).unwrap(), msg);
//!
//! // The stream decoder does both over bytes as they arrive, here one at a time.
//! let mut decoder = Decoder::new(MAX_CONTROL_FRAME_LEN);
//! for (i, byte) in bytes.iter().enumerate() {
//!     decoder.feed(std::slice::from_ref(byte));
//!     let next = decoder.next_message().unwrap().map(|m| m.into_owned());
//!     assert_eq!(next, (i == bytes.len() - 1).then(|| msg.clone()));
//! }
//!
//! // A frame that is not ours fails at its first wrong byte (here the magic).
//! assert!(check(b"\x16\0\0\0XXXX", MAX_CONTROL_FRAME_LEN).is_err());
//! ```
//!
//! # Handshake (carried here, checked by the transport)
//!
//! The client sends Hello (its segment size, frame limit, auth mode, a random nonce); the
//! server answers HelloAck (its own, plus the HMAC-SHA256 tag of the client's nonce under the
//! shared secret); the client answers AuthProof (the tag of the server's nonce). Without a
//! secret the auth mode is 0 and the tags are zero. No other message is valid before the
//! handshake completes.

mod constants;
mod decode;
mod decoder;
mod encode;
mod error;
mod message;
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub mod samples;
#[cfg(test)]
mod tests;

pub use constants::{
    max_frame_size, AuthTag, Nonce, BUFFER_RESPONSE_HEADER_LEN, HEADER_LEN, MAGIC, MAX_BULK_PAYLOAD,
    MAX_CONTROL_FRAME_LEN, MAX_EVENT_PAYLOAD_LEN, MAX_MESSAGE_LEN, MAX_PARTITION_ID_LEN, NONCE_LEN,
    PROTOCOL_VERSION, TAG_LEN,
};
pub use decode::{check, check_header, decode, decode_buffer_response_header, FrameInfo};
pub use decoder::{Decoder, Frame};
pub use encode::{encode, encode_buffer_response_header};
pub use error::WireError;
pub use message::{
    truncate_utf8, AuthMode, BufferResponse, BufferResponseHeader, ErrorKind, Hello, Message, MessageType,
    Payload, ReceiverId, SharedBuffer, ShmOffer,
};

pub use crate::base::event::Event;

#[cfg(doc)]
use crate::base::error::Error;
