//! Snapshots of a partition's metrics: the partition, each subpartition, and a remote reader's
//! view from the sending side.

use crate::base::metrics::{BackpressureLevel, ChannelTransport};
use crate::memory::PoolStats;
use crate::partition::spill::SpillMetrics;

/// A snapshot of a partition's metrics.
#[derive(Debug, Clone)]
pub struct PartitionMetrics {
    /// Partition id.
    pub id: String,
    /// Number of subpartitions.
    pub num_subpartitions: usize,
    /// The partition's pool.
    pub pool: PoolStats,
    /// Finished buffers/batches waiting per subpartition.
    pub backlog: Vec<usize>,
    /// Batches written (a hash split counts each piece).
    pub batches_written: u64,
    /// Buffers (segments filled or batches handed off) published.
    pub buffers_written: u64,
    /// Arrow payload bytes written.
    pub bytes_written: u64,
    /// Rows written.
    pub rows_written: u64,
    /// Time writers spent blocked on a buffer, over the last second.
    pub backpressured_ms_per_second: f64,
    /// Time writers spent blocked on a buffer since the partition was created.
    pub backpressured_total: std::time::Duration,
    /// Whether end-of-partition was sent.
    pub finished: bool,
    /// A blocking or hybrid partition's store and spilling (`None`: pipelined).
    pub spill: Option<SpillMetrics>,
    /// Per-subpartition detail, by index.
    pub subpartitions: Vec<SubpartitionMetrics>,
}

/// A snapshot of one subpartition's metrics.
#[derive(Debug, Clone)]
pub struct SubpartitionMetrics {
    /// Index in the partition.
    pub index: usize,
    /// Finished buffers/batches waiting for the reader.
    pub backlog: usize,
    /// Whether a reader attached.
    pub consumed: bool,
    /// Buffers the reader took.
    pub buffers_out: u64,
    /// Bytes the reader took (serialized bytes or Arrow bytes of handed-off batches).
    pub bytes_out: u64,
    /// The remote reader's view, when the reader is on another environment.
    pub remote: Option<RemoteReaderMetrics>,
}

/// What the sender side did for a remote reader of a subpartition.
#[derive(Debug, Clone)]
pub struct RemoteReaderMetrics {
    /// The consumer's connection address.
    pub peer: String,
    /// Whether the connection's frames go through TCP or shared memory.
    pub transport: ChannelTransport,
    /// Buffers the sender may still send (the receiver's credit).
    pub credit: u64,
    /// Data buffers written to the connection.
    pub buffers_sent: u64,
    /// Payload bytes written to the connection.
    pub bytes_sent: u64,
}

impl PartitionMetrics {
    /// Out-pool usage: segments in use / pool share.
    pub fn out_pool_usage(&self) -> f64 {
        self.pool.usage()
    }

    /// OK / LOW / HIGH.
    pub fn level(&self) -> BackpressureLevel {
        BackpressureLevel::from_ms_per_second(self.backpressured_ms_per_second)
    }

    /// The writer's time not blocked on a buffer, over the last second (Flink's
    /// `busyTimeMsPerSecond` as seen from the output side).
    pub fn busy_ms_per_second(&self) -> f64 {
        (1000.0 - self.backpressured_ms_per_second).max(0.0)
    }
}
