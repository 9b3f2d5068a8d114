//! The one error type of the core. The Python layer maps each variant to an exception
//! in `creditflow.errors` (see `rust/python/src/error.rs`).

use std::time::Duration;

/// Result alias used across the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in creditflow-core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A pool's guaranteed minimum cannot be met.
    #[error(
        "insufficient network buffers for {what}: required {required} segments, available {available} \
         (of {total} total, segment size {segment_size} bytes); {hint}"
    )]
    InsufficientBuffers {
        what: String,
        required: usize,
        available: usize,
        total: usize,
        segment_size: usize,
        hint: String,
    },
    /// No partition with this id is registered (after retries, for remote requests).
    #[error("partition {0:?} not found")]
    PartitionNotFound(String),
    /// A partition with this id is already registered.
    #[error("partition {0:?} already exists in this environment")]
    PartitionExists(String),
    /// A subpartition index outside `0..num_subpartitions`.
    #[error("subpartition {index} out of range: partition {partition:?} has {count}")]
    SubpartitionOutOfRange {
        partition: String,
        index: usize,
        count: usize,
    },
    /// A subpartition already has a reader (pipelined subpartitions are read once).
    #[error("subpartition {index} of partition {partition:?} is already being read")]
    AlreadyConsumed { partition: String, index: usize },
    /// A batch whose schema differs from the partition's first batch.
    #[error("schema mismatch in partition {partition:?}: expected {expected}, got {actual}")]
    SchemaMismatch {
        partition: String,
        expected: String,
        actual: String,
    },
    /// A bad argument (configuration value, key column, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// A blocking call passed its deadline.
    #[error("timed out after {0:?} {1}")]
    Timeout(Duration, &'static str),
    /// The interrupt check of a blocking call failed (Ctrl-C in Python).
    #[error("interrupted")]
    Interrupted,
    /// The object (writer, partition, gate, environment) is closed.
    #[error("{0} is closed")]
    Closed(&'static str),
    /// The peer broke the protocol: bad frame, credit overflow, sequence gap.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The connection to a peer was lost.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// A peer exceeded a limit of an environment (`max_connections`,
    /// `max_channels_per_connection`, `max_outstanding_requests`); the message names it.
    #[error("limit exceeded: {0}")]
    LimitExceeded(String),
    /// The peer failed authentication.
    #[error("authentication failed: {0}")]
    Authentication(String),
    /// Arrow could not encode or decode a batch.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// The producer of a channel failed; the message says why.
    #[error("producer failed: {0}")]
    ProducerFailed(String),
    /// Spilling to disk failed: a full disk, a failed write or read, or `max_spill`; the
    /// message names the directory or file and the bytes.
    #[error("spill failed: {0}")]
    Spill(String),
}
