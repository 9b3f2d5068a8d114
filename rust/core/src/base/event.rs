//! The one in-band event type: what a subpartition queues between batches, what a
//! BufferResponse of data type event carries on the wire (its byte form is
//! [`crate::protocol::wire`]'s), and what an input gate reacts to.

/// Longest payload of a user event ([`Event::User`]), in bytes. An event travels as one
/// frame, so this also bounds the frame limit of a connection with small segments (16 KiB
/// keeps the limit of the default 32 KiB segments unchanged).
pub const MAX_EVENT_PAYLOAD_LEN: usize = 16 * 1024;

/// In-band events. They carry no data and need no credit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// The writer closed the partition: nothing follows on this subpartition.
    EndOfPartition,
    /// The writer failed mid-batch (interrupted or timed out while a batch was half
    /// serialized); the reader must fail with this message. On the wire it is cut to
    /// [`MAX_MESSAGE_LEN`](crate::protocol::wire::MAX_MESSAGE_LEN) bytes.
    ProducerFailed(String),
    /// A user event: opaque bytes (at most [`MAX_EVENT_PAYLOAD_LEN`]), in order with the
    /// batches around it.
    User(Vec<u8>),
    /// Checkpoint barrier `id`. An aligned one is in order with the data; an unaligned one
    /// was put in front of the queued data (see
    /// [`Subpartition::add_priority`](crate::partition::subpartition::Subpartition::add_priority))
    /// and is followed, at its original place, by [`Event::BarrierPosition`] with the same id.
    Barrier {
        /// The checkpoint id.
        id: u64,
        /// Whether it overtook the queued data.
        unaligned: bool,
    },
    /// Where unaligned barrier `id` was written: the data between the barrier and this
    /// marker is what the barrier overtook.
    BarrierPosition(u64),
}

impl Event {
    /// Whether nothing follows this event on its subpartition (end or failure).
    pub fn is_end(&self) -> bool {
        matches!(self, Event::EndOfPartition | Event::ProducerFailed(_))
    }
}
