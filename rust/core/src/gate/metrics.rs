//! Snapshots of a gate's metrics: the gate, each channel, buffer debloating.

use std::time::Duration;

use crate::base::config::ChannelSpec;
use crate::memory::PoolStats;
use crate::net::{RemoteChannelStats, RemoteStats};

/// How a channel reads, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ChannelKind {
    /// Waiting for its (local) partition to be registered.
    Pending,
    /// Reading a subpartition of this environment.
    Local,
    /// Reading a subpartition of another environment over TCP.
    Remote,
    /// Reached its end (or the gate was closed).
    Ended,
}

impl ChannelKind {
    /// "pending", "local", "remote" or "ended".
    pub fn as_str(&self) -> &'static str {
        match self {
            ChannelKind::Pending => "pending",
            ChannelKind::Local => "local",
            ChannelKind::Remote => "remote",
            ChannelKind::Ended => "ended",
        }
    }

    pub(super) fn from_u8(v: u8) -> ChannelKind {
        match v {
            1 => ChannelKind::Local,
            2 => ChannelKind::Remote,
            3 => ChannelKind::Ended,
            _ => ChannelKind::Pending,
        }
    }
}

/// A snapshot of one channel's metrics.
#[derive(Debug, Clone)]
pub struct ChannelMetrics {
    /// Index in the gate.
    pub index: usize,
    /// Which subpartition it reads, and where.
    pub spec: ChannelSpec,
    /// How it reads now.
    pub kind: ChannelKind,
    /// Batches received.
    pub batches_received: u64,
    /// Buffers received.
    pub buffers_received: u64,
    /// Arrow bytes received.
    pub bytes_received: u64,
    /// Rows received.
    pub rows_received: u64,
    /// Buffers and credit, for a remote channel.
    pub remote: Option<RemoteChannelStats>,
}

/// A snapshot of a gate's metrics.
#[derive(Debug, Clone)]
pub struct GateMetrics {
    /// Gate name.
    pub name: String,
    /// Number of channels.
    pub num_channels: usize,
    /// Channels that reached the end.
    pub ended_channels: usize,
    /// The gate's pool (exclusive + floating buffers of remote channels).
    pub pool: PoolStats,
    /// Batches (and events, barriers) decoded but not yet returned.
    pub queued_batches: usize,
    /// Checkpoint barriers ignored as stale (an id already surfaced or abandoned).
    pub stale_barriers: u64,
    /// Batches received.
    pub batches_received: u64,
    /// Buffers (serialized buffers or handed-off batches) received.
    pub buffers_received: u64,
    /// Arrow bytes received.
    pub bytes_received: u64,
    /// Rows received.
    pub rows_received: u64,
    /// Time the reader waited for data, over the last second.
    pub idle_ms_per_second: f64,
    /// Time the reader waited for data since the gate was created.
    pub idle_total: Duration,
    /// Buffers and credit of the remote channels (`None`: no remote channel).
    pub remote: Option<RemoteStats>,
    /// Buffer debloating (`None`: off).
    pub debloat: Option<DebloatMetrics>,
    /// Per-channel detail, by index.
    pub channels: Vec<ChannelMetrics>,
}

impl GateMetrics {
    /// The reader's time not spent waiting for data, over the last second.
    pub fn busy_ms_per_second(&self) -> f64 {
        (1000.0 - self.idle_ms_per_second).max(0.0)
    }
}

/// What a gate's buffer debloating measured and announced.
#[derive(Debug, Clone, Copy)]
pub struct DebloatMetrics {
    /// The buffer size last announced to the producers (the segment size before any).
    pub buffer_size: usize,
    /// The buffer size the last sample computed, announced or not (damping).
    pub desired_buffer_size: usize,
    /// Smoothed bytes consumed per second of time not spent waiting for data.
    pub throughput: f64,
    /// Buffers that can be in flight to the gate (the divisor of the size).
    pub buffers: usize,
}
