//! Arrow IPC into and out of the byte stream of a subpartition.
//!
//! A subpartition's serialized stream is a sequence of *records*, one per batch:
//! `[u64 little-endian length][Arrow IPC stream messages]`. The first record carries the
//! schema message, then each record carries dictionary messages (when they change) and one
//! record-batch message. Records span buffers freely.
//!
//! * [`BatchEncoder`] turns a batch into IPC message parts that still point at the batch's
//!   own Arrow buffers (no copy); the writer copies them straight into segments, which is
//!   the one copy on the sending side.
//! * [`RecordAssembler`] gathers a record's bytes from however many buffers it spans into
//!   one 64-byte aligned buffer: copied out of a local channel's segments (the one copy on
//!   the receiving side), or read from the socket straight into it for a remote channel
//!   (the kernel's copy is then the only one).
//! * [`RecordDeserializer`] decodes a gathered record's arrays zero-copy over that buffer.
//! * [`RowsEncoder`] writes some rows of a batch as a record that holds its schema, gathering
//!   the values straight into the destination (a split batch's piece, copied once).
//!
//! Rooms: `encode` ([`BatchEncoder`]), `framing` (the length prefix, [`RecordFraming`]),
//! `assemble` ([`RecordAssembler`]), `decode` ([`RecordDeserializer`]), `rows`
//! ([`RowsEncoder`]). May use
//! [`crate::base`] and [`crate::memory`] (the [`crate::memory::RecordPool`] records go into).

mod assemble;
mod decode;
mod encode;
mod framing;
mod rows;
#[cfg(test)]
mod tests;

pub use assemble::RecordAssembler;
pub use decode::{batch_bytes, RecordDeserializer, SelfContainedDecoder};
pub use encode::{BatchEncoder, Compression, EncodedRecord};
pub use framing::{RecordFraming, RECORD_HEADER_LEN};
pub use rows::{RowsEncoder, RowsLayout};
