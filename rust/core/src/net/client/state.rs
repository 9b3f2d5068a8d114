//! The state a connection's reader task, the gates' threads and the environment share:
//! [`RemoteGate`] (one gate's segments and credit), [`RemoteChannel`] (one channel's inbox)
//! and [`ClientConn`] (one connection's channels and outbox). They point at each other (a
//! channel knows its gate and its connection; a gate and a connection know their channels),
//! so they are defined together here; what each does is in a file of its own:
//! `gate_buffers.rs`, `channel.rs` and `connection.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arrow_buffer::Buffer;
use tokio::sync::Notify;

use crate::base::config::{Backoff, ChannelSpec, FlowControl};
use crate::base::error::Error;
use crate::base::event::Event;
use crate::memory::{PooledSegment, RecordPool};
use crate::partition::subpartition::Listener;
use crate::protocol::credit::{BufferLease, ChannelId, GateCredit, RecordBudget};
use crate::protocol::wire::{Message, ReceiverId};

/// What a remote channel's inbox holds.
pub(crate) enum Inbound {
    /// A data buffer.
    Data(Received),
    /// An event (end of partition, producer failed, user event, checkpoint barrier).
    Event(Event),
    /// The channel failed (connection lost, partition not found, remote error).
    Failed(Error),
}

/// A received data buffer that completed records: the records (whole bodies, without their
/// length prefixes) and the buffer's credit. Dropping it gives the segment back to the gate
/// (and its credit back to the sender).
pub(crate) struct Received {
    pub(super) segment: Option<PooledSegment>,
    pub(super) records: Vec<Buffer>,
    /// Network buffers this stands for: itself and the ones recycled before it that carried
    /// only parts of its first record.
    pub(super) buffers: usize,
    pub(super) lease: Option<BufferLease>,
    pub(super) gate: Arc<RemoteGate>,
    /// The bytes of `records`, counted in the gate's record budget until taken.
    pub(super) record_bytes: Option<RecordBytes>,
}

/// Record bytes of one channel counted in its gate's [`RecordBudget`]: records in progress, or
/// completed and not yet taken by the consumer. Dropping it takes them out of the count (and
/// lets the gate grant waiting channels).
pub(crate) struct RecordBytes {
    pub(super) gate: Arc<RemoteGate>,
    pub(super) cid: ChannelId,
    pub(super) bytes: u64,
}

pub(super) struct GateBuffers {
    pub(super) credit: GateCredit,
    /// Record bytes: records held per channel and gate, and the grants to start them.
    pub(super) records: RecordBudget,
    pub(super) free: Vec<PooledSegment>,
    /// Channels by credit id, to route AddCredit requests.
    pub(super) channels: Vec<Weak<RemoteChannel>>,
    pub(super) closed: bool,
}

/// The remote half of one input gate: its segments and its credit.
pub(crate) struct RemoteGate {
    pub(super) flow: FlowControl,
    /// Largest record a channel accepts (a longer length prefix fails the channel).
    pub(super) max_record: usize,
    /// The blocks its channels' records are gathered into, used again once the consumer
    /// dropped the batches over them.
    pub(super) record_pool: RecordPool,
    pub(super) bufs: Mutex<GateBuffers>,
    /// tcp mode: a reader task waits here for a free segment.
    pub(super) recycled: Notify,
    /// An unaligned checkpoint barrier arrived and was not yet taken: the gate reads its
    /// channels before yielding what it already queued, so the barrier overtakes that too.
    pub(super) priority: AtomicBool,
}

pub(super) struct Inbox {
    pub(super) items: VecDeque<Inbound>,
    /// The last item (end of partition or failure) was queued.
    pub(super) done: bool,
}

/// One remote input channel.
pub(crate) struct RemoteChannel {
    pub(super) rid: ReceiverId,
    pub(super) cid: ChannelId,
    pub(super) spec: ChannelSpec,
    pub(super) gate: Arc<RemoteGate>,
    pub(super) conn: Arc<ClientConn>,
    pub(super) inbox: Mutex<Inbox>,
    pub(super) notify: Listener,
    /// tcp mode: the next sequence number (credit mode: the credit state checks).
    pub(super) next_sequence: AtomicU64,
    /// Backoff of the partition request: the delay used last (`None` before the first retry).
    pub(super) retry: Mutex<Option<Duration>>,
    pub(super) backoff: Backoff,
    pub(super) released: AtomicBool,
    /// Buffer debloating: the size last announced to the sender (0: none), sent again with
    /// a retried partition request.
    pub(super) buffer_size: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
pub(super) struct Outbox {
    pub(super) control: VecDeque<Message<'static>>,
    pub(super) credit: Vec<ReceiverId>,
    pub(super) close: bool,
    /// The writer was woken and has not collected yet (saves redundant wake-ups).
    pub(super) woken: bool,
}

/// One connection to a remote environment.
pub(crate) struct ClientConn {
    pub(super) addr: String,
    pub(super) out: Mutex<Outbox>,
    pub(super) wake: Notify,
    /// Something waits in `out` for the writer: the reader task lets the writer run before
    /// it reads on (one I/O thread serves both, and a busy socket never makes the reader
    /// wait, so a RecordGrant or AddCredit could otherwise wait behind megabytes of reads).
    pub(super) writer_due: AtomicBool,
    pub(super) channels: Mutex<HashMap<ReceiverId, Arc<RemoteChannel>>>,
    /// Why the connection failed, once it did (new channels need a new connection). Set
    /// under the `channels` lock, so that a channel opened while the connection fails gets
    /// the same error (an `AuthenticationError` stays one).
    pub(super) failure: Mutex<Option<Error>>,
    /// Channels their readers closed since the reader task last looked: it drops their
    /// records in progress (a cancelled channel may never send the rest).
    pub(super) closed: Mutex<Vec<ReceiverId>>,
    /// The payload limit the handshake settled (0 before it): announced buffer sizes are
    /// clamped to it, as the sender refuses larger ones.
    pub(super) payload_limit: std::sync::atomic::AtomicUsize,
    /// Whether the connection's frames go through shared memory (set once linked).
    pub(super) shm: AtomicBool,
}
