//! The producing side: batches in, per-consumer queues out. A [`ResultPartition`] of pipelined
//! subpartitions fed through one local pool, the [`RecordWriter`] that partitions batches into
//! it, and Spark-compatible hashing for the hash partitioner.
//!
//! Rooms: `buffer` (a segment being written while it is read), `subpartition` (the lock-free
//! queue per consumer), `handed` (a whole batch handed to a local reader: decoded, or a piece
//! still encoded), `result_partition` (its hand-off path in `result_partition/handoff`), `metrics`, `partitioner` (row → subpartition),
//! `writer` (batch → partition), `spark_hash` (Spark's Murmur3), `spill` (blocking and hybrid
//! partitions: the spill directory, files, stored streams and their readers). May use [`crate::base`],
//! [`crate::memory`], [`crate::serde`] and [`crate::protocol`].

pub mod buffer;
mod handed;
mod metrics;
pub mod partitioner;
mod result_partition;
mod row_order;
pub mod spark_hash;
pub mod spill;
pub mod subpartition;
pub mod writer;

pub use handed::{EncodedPiece, Handed, MAX_PIECE};
pub use metrics::{PartitionMetrics, RemoteReaderMetrics, SubpartitionMetrics};
pub use partitioner::Partitioner;
#[cfg(not(loom))] // for the network, the gates and the environment: not in loom builds
pub(crate) use result_partition::Registry;
pub use result_partition::{Handoff, ResultPartition};
pub use writer::RecordWriter;
