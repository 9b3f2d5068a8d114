//! Credit-based flow control as plain state: no I/O, no threads, no clocks.
//!
//! This module is the single source of truth for credit on both ends of a remote channel.
//! The transport feeds it protocol events (a frame arrived, a frame is being written, the
//! consumer recycled a buffer) and does what the answers say. Everything here is
//! deterministic, so the tests drive a sender and a receiver against each other in memory.
//!
//! # The protocol (Flink names in parentheses)
//!
//! A *credit* is one empty buffer that the receiver has reserved for a channel and told the
//! sender about. A sender sends a data buffer only while it holds credit, so every data buffer
//! that reaches the receiver has a free buffer waiting for it, and the TCP connection that all
//! channels between two environments share never stalls behind one slow consumer.
//!
//! Receiver side, [`GateCredit`] (`RemoteInputChannel`, its `BufferManager`, the gate's
//! `LocalBufferPool`):
//!
//! 1. Every remote channel owns `exclusive` buffers (exclusive buffers, default 2, may be 0).
//!    They are its *initial credit*, announced in the PartitionRequest (`initialCredit`).
//! 2. Every BufferResponse carries the sender's *backlog*: the data buffers still queued behind
//!    it. The channel then wants `backlog + exclusive` buffers (`numRequiredBuffers`). If it
//!    holds fewer, it takes floating buffers from the gate (floating buffers, default 8, shared
//!    by all channels of the gate). If the gate has none left, the channel waits
//!    (`BufferListener`) and is served first come, first served as floating buffers are recycled.
//! 3. A buffer the channel has obtained is *unannounced credit* (`unannouncedCredit`) until
//!    the transport sends it in an AddCredit. The channel asks for an AddCredit only when its
//!    unannounced credit goes from zero to positive ([`ReceiverAction::SendAddCredit`],
//!    `notifyCreditAvailable`). When the transport writes the message,
//!    [`GateCredit::take_unannounced_credit`] hands over everything that accumulated meanwhile
//!    (`getAndResetUnannouncedCredit`), so a burst of recycled buffers costs one message.
//! 4. A data buffer uses up one announced credit; events (end of partition) need no credit,
//!    and neither does a *record body buffer*: a data buffer that lies wholly inside the
//!    channel's record in progress, whose length prefix has arrived, without completing it.
//!    The receiver allocates a record's whole body when its length prefix arrives, so such a
//!    buffer is read straight into memory that already exists and takes no buffer. Both ends
//!    tell these buffers apart from the byte stream alone (the sender tracks its records'
//!    framing as it sends, the receiver as it reassembles), so a record of many buffers streams
//!    without an AddCredit round trip. The buffer that completes a record takes a real buffer
//!    and keeps it until the consumer takes the record, so completed records stay bounded by
//!    the channel's buffers, and the memory outside them is one record in progress.
//!    Records themselves are bounded by record bytes (protocol version 3, [`RecordBudget`]): a
//!    buffer that starts records needs their bytes granted as well as a credit.
//!    Sequence numbers start at 0 and go up by one per BufferResponse of a channel; a gap or a
//!    reorder is a protocol error (`BufferReorderingException`).
//! 5. When the consumer is done with a buffer: an exclusive one goes back to its channel as new
//!    credit, unless the channel then holds more buffers than it needs, in which case it hands
//!    one floating buffer back to the gate instead (`BufferManager#addExclusiveBuffer`); a
//!    floating one goes to the first waiting channel that still needs one, else back to the
//!    gate (`LocalBufferPool#recycle`).
//! 6. Releasing a channel gives its floating buffers back to the gate.
//!
//! Sender side, [`SenderCredit`] per subpartition reader (`CreditBasedSequenceNumberingViewReader`)
//! and [`ReadyQueue`] per connection (`PartitionRequestQueue`):
//!
//! 1. Credit starts at the PartitionRequest's initial credit and grows with every AddCredit.
//! 2. Sending a data buffer uses up one credit; events and record body buffers go out
//!    without credit. Every BufferResponse gets the next sequence number and the current
//!    backlog.
//! 3. A reader is *available* when its next buffer is an event or a record body buffer, or a
//!    data buffer and it has credit. Available readers wait in a ready queue, at most once each, and are served round
//!    robin: write one buffer, put the reader back at the end if it is still available.
//! 4. With zero exclusive buffers a channel has no credit of its own, so a sender that has
//!    backlog but no credit, and whose last word to the receiver was "backlog 0", announces its
//!    backlog in a separate message (`BacklogAnnouncement`); otherwise neither side would move.
//!
//! # Driving it from the transport
//!
//! Receiver (one [`GateCredit`] per input gate, shared by the connections its channels use):
//!
//! - [`GateCredit::add_channel`] per remote channel; send the PartitionRequest with
//!   [`GateCredit::initial_credit`].
//! - For each BufferResponse header, [`GateCredit::on_buffer_response`] *before* copying the
//!   payload ([`GateCredit::on_buffer_response_inside_record`] for a record body buffer): [`Delivery::Data`] says which buffer (exclusive or floating) to copy it into and
//!   carries a [`BufferLease`] that goes back in [`GateCredit::on_buffer_recycled`] once the
//!   consumer is done with the buffer. [`Delivery::Discarded`] means the channel was released:
//!   drop the payload. An `Err` is fatal for the connection.
//! - For each BacklogAnnouncement, [`GateCredit::on_backlog_announcement`].
//! - After every call, drain [`GateCredit::poll_action`]. For each
//!   [`ReceiverAction::SendAddCredit`] queue the channel on its connection's writer; when the
//!   writer gets to it, [`GateCredit::take_unannounced_credit`] gives the amount to put in the
//!   AddCredit (`None`: nothing left to announce, send nothing).
//!
//! Sender (one [`SenderCredit`] per subpartition reader, one [`ReadyQueue`] per connection):
//!
//! - [`SenderCredit::new`] with the PartitionRequest's credit;
//!   [`SenderCredit::on_add_credit`] per AddCredit (an `Err` is fatal for the connection).
//! - Whenever a reader may have changed (data or an event was queued, credit arrived, a buffer
//!   was written): if [`SenderCredit::is_available`] for its queue head,
//!   [`ReadyQueue::enqueue`] it; else if [`SenderCredit::needs_backlog_announcement`], write
//!   a BacklogAnnouncement and call [`SenderCredit::on_backlog_announced`].
//! - Writer loop: [`ReadyQueue::dequeue`] a reader, skip it if it is no longer available, take
//!   its next buffer, build the header with [`SenderCredit::on_buffer_sent`] (or
//!   [`SenderCredit::on_record_body_sent`] for a record body buffer), write it, and
//!   look at the reader again as above.
//!
//! # Example: one channel, in memory
//!
//! ```
//! use creditflow_core::protocol::credit::{
//!     DataType, Delivery, GateCredit, GateCreditConfig, QueueHead, ReceiverAction, SenderCredit,
//! };
//!
//! // A gate with 2 exclusive buffers per channel and 8 floating ones, and one remote channel.
//! let mut gate = GateCredit::new(GateCreditConfig::default()).unwrap();
//! let channel = gate.add_channel();
//! // Its PartitionRequest carries the exclusive buffers as initial credit.
//! let mut sender = SenderCredit::new(gate.initial_credit());
//!
//! // Two data buffers use both credits; a third waits.
//! let mut leases = Vec::new();
//! for _ in 0..2 {
//!     let header = sender.on_buffer_sent(DataType::Data, 0).unwrap();
//!     match gate.on_buffer_response(channel, header).unwrap() {
//!         Delivery::Data(lease) => leases.push(lease),
//!         other => panic!("a credited data buffer lands in a buffer, got {other:?}"),
//!     }
//! }
//! assert!(!sender.is_available(QueueHead::Data));
//! // An event needs no credit.
//! assert!(sender.is_available(QueueHead::Event));
//!
//! // The consumer is done with both buffers: one AddCredit carries both credits.
//! for lease in leases {
//!     gate.on_buffer_recycled(lease).unwrap();
//! }
//! assert_eq!(gate.poll_action(), Some(ReceiverAction::SendAddCredit { channel }));
//! assert_eq!(gate.poll_action(), None);
//! let credit = gate.take_unannounced_credit(channel).unwrap();
//! assert_eq!(credit.get(), 2);
//! sender.on_add_credit(credit).unwrap();
//! assert!(sender.is_available(QueueHead::Data));
//! ```
//!
//! # Invariants
//!
//! The property tests at the bottom check these after every step of random interleavings:
//! for each live channel, its empty buffers = sender credit + credit in flight + data buffers
//! in flight + unannounced credit (so no data buffer ever arrives without a free buffer);
//! buffers held by channels + floating buffers in the gate = configured floating buffers;
//! a channel with unannounced credit is queued for an AddCredit exactly once; a channel short
//! of buffers is waiting, and then the gate has none; and once the consumer drains everything,
//! all data is delivered in order.

mod error;
mod ready_queue;
mod receiver;
mod records;
mod sender;
#[cfg(test)]
mod tests;
mod value;

pub use error::CreditError;
pub use ready_queue::ReadyQueue;
pub use receiver::{
    BufferLease, BufferOrigin, ChannelCreditStats, Delivery, GateCredit, GateCreditConfig, ReceiverAction,
    DEFAULT_EXCLUSIVE_BUFFERS, DEFAULT_FLOATING_BUFFERS,
};
pub use records::{ChannelRecordStats, RecordBudget, DEFAULT_RECORD_BUDGET};
pub use sender::{QueueHead, SenderCredit};
pub use value::{BufferHeader, ChannelId, Credit, DataType};
