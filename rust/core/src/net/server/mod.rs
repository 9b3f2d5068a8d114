//! The sending side: connections this environment accepted, each serving the subpartitions
//! its peer requested (Flink's `PartitionRequestServerHandler` + `PartitionRequestQueue`).
//!
//! One [`ServerConn`] per accepted connection. Its reader half handles PartitionRequest,
//! AddCredit, CancelPartitionRequest and CloseRequest; its writer half is the *sender loop*:
//! round robin over the readers that have something to send **and** credit for it
//! ([`SenderCredit`] and [`ReadyQueue`] from [`crate::protocol::credit`] decide), gathering up to
//! [`MAX_WRITE_BYTES`] of frames into one vectored write. Only that loop writes, so there is
//! one write in flight per connection. Payloads are never copied: serialized buffers go out
//! as slices of their segments, handed-off batches as the Arrow IPC encoder's parts, which
//! point at the batch's own buffers.
//!
//! A subpartition wakes the loop through its listener (called by the producer's thread when
//! the loop found it empty). Each reader drains its subpartition into its own queue, so the
//! backlog it announces is exact in buffers.

mod conn;
mod frames;
mod reader;
mod serve;

pub(crate) use conn::ServerConn;
pub(crate) use serve::{serve, ServeContext};
