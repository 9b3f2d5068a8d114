//! What a gate's remote channels report for metrics.

use crate::net::shm::ChannelTransport;

/// A snapshot of a gate's remote buffers (credit mode; in tcp mode only the totals and
/// queued buffers mean anything).
#[derive(Debug, Clone, Copy, Default)]
pub struct RemoteStats {
    /// Remote channels opened by the gate.
    pub remote_channels: usize,
    /// Exclusive buffers of channels still open.
    pub exclusive_total: usize,
    /// Exclusive buffers holding received data not yet read.
    pub exclusive_in_use: usize,
    /// Floating buffers of the gate.
    pub floating_total: usize,
    /// Floating buffers assigned to channels (holding data or promised to a sender).
    pub floating_in_use: usize,
    /// Empty buffers announced to senders (their credit, in flight included).
    pub credit_announced: usize,
    /// Empty buffers not yet announced.
    pub credit_unannounced: usize,
    /// Received buffers waiting to be read.
    pub queued_buffers: usize,
    /// Bytes of records in progress plus completed and not yet taken by the consumer.
    pub record_bytes: u64,
    /// The largest `record_bytes` so far.
    pub record_bytes_peak: u64,
    /// Record bytes granted to senders and not used yet.
    pub record_bytes_granted: u64,
    /// The gate's record budget: records start only while `record_bytes +
    /// record_bytes_granted` is under it.
    pub record_budget: u64,
    /// Record buffers allocated fresh (each costs page faults as it is first written).
    pub record_blocks_allocated: u64,
    /// Record buffers used again after the batches over them were dropped.
    pub record_blocks_reused: u64,
}

/// Buffers and credit of one remote channel, for metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct RemoteChannelStats {
    /// Exclusive buffers holding received data not yet read.
    pub exclusive_in_use: usize,
    /// Floating buffers assigned to the channel (holding data or promised to the sender).
    pub floating_in_use: usize,
    /// Empty buffers announced to the sender (its credit, in flight included).
    pub credit_announced: usize,
    /// Empty buffers not yet announced.
    pub credit_unannounced: usize,
    /// The sender's last announced backlog plus the exclusive buffers (buffers wanted).
    pub required: usize,
    /// Received buffers waiting to be read.
    pub queued_buffers: usize,
    /// Bytes of records in progress plus completed and not yet taken by the consumer.
    pub record_bytes: u64,
    /// The largest `record_bytes` so far.
    pub record_bytes_peak: u64,
    /// What carries the channel's frames: TCP (or TLS) or shared memory.
    pub transport: ChannelTransport,
}
