//! The receiving side: connections this environment opened to read remote subpartitions
//! (Flink's `PartitionRequestClient`, `CreditBasedPartitionRequestClientHandler` and
//! `RemoteInputChannel`).
//!
//! * [`ClientConn`]: one per remote environment, shared by every remote channel of every
//!   gate of this environment that reads from it. Its reader half takes each data
//!   BufferResponse's header, asks the gate's [`GateCredit`] which buffer it stands for, and
//!   gathers the channel's records from the payloads (a [`RecordAssembler`] per channel):
//!   the body bytes of a record in progress are read from the socket straight into the
//!   record's own buffer, so the reader thread gets whole records and copies nothing; length
//!   prefixes and short pieces that the socket has not delivered yet go through the segment.
//!   A data buffer wholly inside a record in progress that does not complete it is a *record
//!   body buffer*: it needs no credit and takes no segment (see [`crate::protocol::credit`]), it is read
//!   straight into the record. Otherwise credit follows Flink's spanning-record deserializer:
//!   a buffer that only carried part of a record in progress is recycled at once (its bytes
//!   already sit in the record), and a buffer that completed records holds its credit until
//!   the reader has taken them. So the reader is woken once per record rather than once per
//!   buffer, and the memory outside the gate's segments is at most one record in progress
//!   plus, per buffer of credit, the records it completed (each at most `max_record_size`).
//!   Its writer half sends
//!   PartitionRequests, AddCredits (the amount taken when the message is written, so a burst
//!   of recycled buffers costs one message), CancelPartitionRequests and CloseRequest.
//! * [`RemoteGate`]: the buffers of one input gate — its exclusive and floating segments,
//!   held for the gate's life, and the credit state that says which one a buffer goes into.
//! * [`RemoteChannel`]: one channel's inbox of received buffers and events, read by the
//!   gate's thread, which hands each buffer back ([`Received`] drop) once deserialized.
//!
//! In `flow_control="tcp"` mode there is no credit: the request carries unlimited credit,
//! and the reader half takes any free segment of the gate, or stops reading the socket
//! until one is recycled, so TCP's window stalls every channel of the connection at once.

mod channel;
mod connection;
mod gate_buffers;
mod read_loop;
mod retry;
mod state;
mod stats;
#[cfg(test)]
mod tests;

pub(crate) use connection::ClientContext;
pub(crate) use gate_buffers::recycle_all;
pub(crate) use state::{ClientConn, Inbound, RecordBytes, RemoteChannel, RemoteGate};
pub use stats::{RemoteChannelStats, RemoteStats};
