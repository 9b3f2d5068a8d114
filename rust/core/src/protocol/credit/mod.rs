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
//! # Invariants
//!
//! The property tests at the bottom check these after every step of random interleavings:
//! for each live channel, its empty buffers = sender credit + credit in flight + data buffers
//! in flight + unannounced credit (so no data buffer ever arrives without a free buffer);
//! buffers held by channels + floating buffers in the gate = configured floating buffers;
//! a channel with unannounced credit is queued for an AddCredit exactly once; a channel short
//! of buffers is waiting, and then the gate has none; and once the consumer drains everything,
//! all data is delivered in order.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::hash::Hash;

use crate::base::error::{Error, Result};

/// Exclusive buffers per remote channel unless configured otherwise (Flink:
/// `taskmanager.network.memory.buffers-per-channel`).
pub const DEFAULT_EXCLUSIVE_BUFFERS: u32 = 2;

/// Floating buffers per input gate unless configured otherwise (Flink:
/// `taskmanager.network.memory.floating-buffers-per-gate`).
pub const DEFAULT_FLOATING_BUFFERS: u32 = 8;

// ---------------------------------------------------------------------------------------------
// Credit
// ---------------------------------------------------------------------------------------------

/// A number of buffers one side has promised the other: one credit is one free buffer.
///
/// Arithmetic is checked: a result that would overflow or go below zero is a protocol error,
/// never a wrapped or saturated value, since it can only come from a peer that broke the rules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Credit(u32);

impl Credit {
    /// No credit.
    pub const ZERO: Credit = Credit(0);
    /// One buffer.
    pub const ONE: Credit = Credit(1);

    /// Credit for `buffers` buffers.
    pub const fn new(buffers: u32) -> Self {
        Credit(buffers)
    }

    /// The number of buffers.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// Whether this is no credit at all.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// `self + other`, or a protocol error if that exceeds `u32::MAX`.
    pub fn checked_add(self, other: Credit) -> Result<Credit> {
        self.0
            .checked_add(other.0)
            .map(Credit)
            .ok_or_else(|| Error::Protocol(format!("credit overflow: {self} + {other} exceeds {}", u32::MAX)))
    }

    /// `self - other`, or a protocol error if that is negative.
    pub fn checked_sub(self, other: Credit) -> Result<Credit> {
        self.0
            .checked_sub(other.0)
            .map(Credit)
            .ok_or_else(|| Error::Protocol(format!("credit underflow: {self} - {other} is negative")))
    }
}

impl fmt::Display for Credit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Credit> for u32 {
    fn from(credit: Credit) -> u32 {
        credit.0
    }
}

// ---------------------------------------------------------------------------------------------
// Messages' credit-relevant fields
// ---------------------------------------------------------------------------------------------

/// Identifies a remote input channel within its gate (the wire's receiver id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChannelId(pub usize);

impl fmt::Display for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "channel {}", self.0)
    }
}

/// What a BufferResponse carries (Flink: `Buffer.DataType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// Serialized records; needs a credit.
    Data,
    /// An event such as end of partition; travels without credit.
    Event,
}

/// The credit-relevant fields of a BufferResponse header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferHeader {
    /// Position of this BufferResponse in its channel, from 0, one more per response.
    pub sequence_number: u64,
    /// Data buffers still queued at the sender after this one.
    pub backlog: u32,
    /// Data or event.
    pub data_type: DataType,
}

// ---------------------------------------------------------------------------------------------
// Receiver side
// ---------------------------------------------------------------------------------------------

/// Buffer budget of one input gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateCreditConfig {
    /// Buffers each remote channel owns; its initial credit. May be 0, then the channel lives
    /// on floating buffers requested through backlog announcements.
    pub exclusive_buffers_per_channel: u32,
    /// Buffers shared by all channels of the gate, handed out by backlog.
    pub floating_buffers: u32,
}

impl Default for GateCreditConfig {
    fn default() -> Self {
        GateCreditConfig {
            exclusive_buffers_per_channel: DEFAULT_EXCLUSIVE_BUFFERS,
            floating_buffers: DEFAULT_FLOATING_BUFFERS,
        }
    }
}

/// Where the buffer for a received data buffer comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferOrigin {
    /// One of the channel's exclusive buffers.
    Exclusive,
    /// A floating buffer the channel got from the gate.
    Floating,
}

/// A received data buffer's claim on a receiver buffer. Deliberately neither `Clone` nor
/// `Copy`: hand it back exactly once, to [`GateCredit::on_buffer_recycled`], when the
/// consumer is done with the buffer.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a lease that is not recycled leaks a buffer and its credit"]
pub struct BufferLease {
    channel: ChannelId,
    origin: BufferOrigin,
}

impl BufferLease {
    /// The channel the buffer was received on.
    pub fn channel(&self) -> ChannelId {
        self.channel
    }

    /// Whether the buffer is exclusive or floating: tells the memory layer which pool to take
    /// the segment from.
    pub fn origin(&self) -> BufferOrigin {
        self.origin
    }
}

/// What to do with a received BufferResponse, answered by [`GateCredit::on_buffer_response`].
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub enum Delivery {
    /// Copy the payload into a buffer of this origin and give it to the consumer.
    Data(BufferLease),
    /// Read the payload straight into the channel's record in progress: a record body buffer
    /// (see [`GateCredit::on_buffer_response_inside_record`]) needs no credit and takes no
    /// buffer.
    Record,
    /// Give the event to the consumer; it occupies no credited buffer.
    Event,
    /// The channel was released: drop the payload.
    Discarded,
}

/// Something the receiver asks the transport to do, from [`GateCredit::poll_action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReceiverAction {
    /// The channel's unannounced credit went from zero to positive: queue an AddCredit for it
    /// and fill in the amount with [`GateCredit::take_unannounced_credit`] when writing it
    /// (Flink: `notifyCreditAvailable`).
    SendAddCredit {
        /// The channel with credit to announce.
        channel: ChannelId,
    },
}

/// A snapshot of one channel's buffers and credit, for metrics and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelCreditStats {
    /// Empty exclusive buffers the channel holds.
    pub exclusive_available: u32,
    /// Exclusive buffers holding received data not yet recycled.
    pub exclusive_in_use: u32,
    /// Empty floating buffers the channel holds.
    pub floating_available: u32,
    /// Floating buffers holding received data not yet recycled.
    pub floating_in_use: u32,
    /// Buffers the channel wants: last backlog + exclusive buffers (`numRequiredBuffers`).
    pub required: u32,
    /// Empty buffers not yet announced to the sender.
    pub unannounced: Credit,
    /// Empty buffers announced to the sender: its credit, plus AddCredits and data in flight.
    pub announced: Credit,
    /// Whether the channel waits for floating buffers.
    pub waiting_for_floating: bool,
    /// Whether the channel was released.
    pub released: bool,
    /// The sequence number the next BufferResponse must carry.
    pub expected_sequence_number: u64,
}

impl ChannelCreditStats {
    /// Empty buffers the channel holds: exclusive and floating.
    pub fn available(&self) -> u32 {
        self.exclusive_available + self.floating_available
    }
}

/// One channel's share of the gate, all counts in buffers.
///
/// Invariant: `unannounced <= exclusive_available + floating_available`; the
/// difference is the credit the sender has been told about and has not used yet.
#[derive(Clone, Debug)]
struct ChannelState {
    exclusive_available: u32,
    exclusive_in_use: u32,
    floating_available: u32,
    floating_in_use: u32,
    required: u32,
    unannounced: u32,
    expected_sequence_number: u64,
    /// In `GateCredit::waiting` (exactly when true).
    waiting: bool,
    released: bool,
}

impl ChannelState {
    fn available(&self) -> u32 {
        self.exclusive_available + self.floating_available
    }

    fn announced(&self) -> u32 {
        self.available() - self.unannounced
    }

    /// Floating buffers still needed to reach `required`.
    fn shortfall(&self) -> u32 {
        self.required.saturating_sub(self.available())
    }
}

/// Receiver-side credit of one input gate: per remote channel credit, backlog and sequence
/// numbers, plus the gate's floating buffers (Flink: `RemoteInputChannel` + `BufferManager`
/// state, and the floating part of the gate's `LocalBufferPool`).
///
/// Buffers are counted, not held: the segments themselves live in the memory layer, which
/// follows what this state says (see [`BufferLease::origin`]).
#[derive(Clone, Debug)]
pub struct GateCredit {
    config: GateCreditConfig,
    channels: Vec<ChannelState>,
    /// Floating buffers in the gate, not held by any channel.
    floating_available: u32,
    /// Channels short of buffers, served first come, first served as floating buffers come
    /// back (Flink: `LocalBufferPool#registeredListeners`). A channel that no longer needs a
    /// buffer when its turn comes is skipped.
    waiting: VecDeque<ChannelId>,
    /// Requests for the transport, drained by `poll_action`.
    actions: VecDeque<ReceiverAction>,
}

impl GateCredit {
    /// A gate with no channels yet and all floating buffers available.
    ///
    /// Fails with [`Error::InvalidArgument`] if the gate could never receive data (no
    /// exclusive and no floating buffers) or if one channel's buffers would not fit a `u32`.
    pub fn new(config: GateCreditConfig) -> Result<Self> {
        let GateCreditConfig {
            exclusive_buffers_per_channel: exclusive,
            floating_buffers: floating,
        } = config;
        if exclusive == 0 && floating == 0 {
            return Err(Error::InvalidArgument(
                "an input gate needs at least one floating buffer when channels have no exclusive buffers"
                    .into(),
            ));
        }
        if exclusive.checked_add(floating).is_none() {
            return Err(Error::InvalidArgument(format!(
                "too many buffers per input gate: {exclusive} exclusive + {floating} floating"
            )));
        }
        Ok(GateCredit {
            config,
            channels: Vec::new(),
            floating_available: floating,
            waiting: VecDeque::new(),
            actions: VecDeque::new(),
        })
    }

    /// The budget this gate was created with.
    pub fn config(&self) -> GateCreditConfig {
        self.config
    }

    /// Adds a remote channel holding its exclusive buffers, all announced as initial credit.
    /// Ids are handed out in order from 0.
    pub fn add_channel(&mut self) -> ChannelId {
        let exclusive = self.config.exclusive_buffers_per_channel;
        self.channels.push(ChannelState {
            exclusive_available: exclusive,
            exclusive_in_use: 0,
            floating_available: 0,
            floating_in_use: 0,
            required: exclusive,
            unannounced: 0,
            expected_sequence_number: 0,
            waiting: false,
            released: false,
        });
        ChannelId(self.channels.len() - 1)
    }

    /// The credit to put in every channel's PartitionRequest: its exclusive buffers.
    pub fn initial_credit(&self) -> Credit {
        Credit(self.config.exclusive_buffers_per_channel)
    }

    /// Number of channels added so far.
    pub fn num_channels(&self) -> usize {
        self.channels.len()
    }

    /// Floating buffers in the gate, not held by any channel.
    pub fn available_floating(&self) -> u32 {
        self.floating_available
    }

    /// A snapshot of a channel's buffers and credit, `None` for an unknown id.
    pub fn channel_stats(&self, channel: ChannelId) -> Option<ChannelCreditStats> {
        let s = self.channels.get(channel.0)?;
        Some(ChannelCreditStats {
            exclusive_available: s.exclusive_available,
            exclusive_in_use: s.exclusive_in_use,
            floating_available: s.floating_available,
            floating_in_use: s.floating_in_use,
            required: s.required,
            unannounced: Credit(s.unannounced),
            announced: Credit(s.announced()),
            waiting_for_floating: s.waiting,
            released: s.released,
            expected_sequence_number: s.expected_sequence_number,
        })
    }

    /// A BufferResponse header arrived for `channel` (Flink: `RemoteInputChannel#onBuffer`).
    ///
    /// Checks the sequence number, takes a buffer for a data buffer (floating ones first, so
    /// they go back to the gate sooner) and updates the channel's needs from the backlog.
    /// Protocol errors: unknown channel, sequence gap or reorder, data without credit. On error
    /// nothing changes.
    pub fn on_buffer_response(&mut self, channel: ChannelId, header: BufferHeader) -> Result<Delivery> {
        self.on_response(channel, header, false)
    }

    /// [`GateCredit::on_buffer_response`] for a *record body buffer*: a data buffer whose
    /// payload lies wholly inside the channel's record in progress (its length prefix has
    /// arrived, so its whole body is allocated) without completing it. It needs no credit and
    /// takes no buffer: [`Delivery::Record`], read it straight into the record. An event is
    /// delivered as usual. Protocol errors as for [`GateCredit::on_buffer_response`], but
    /// never "without credit".
    pub fn on_buffer_response_inside_record(
        &mut self,
        channel: ChannelId,
        header: BufferHeader,
    ) -> Result<Delivery> {
        self.on_response(channel, header, true)
    }

    fn on_response(
        &mut self,
        channel: ChannelId,
        header: BufferHeader,
        inside_record: bool,
    ) -> Result<Delivery> {
        let s = self
            .channels
            .get_mut(channel.0)
            .ok_or_else(|| Error::Protocol(format!("BufferResponse for unknown {channel}")))?;
        if s.released {
            return Ok(Delivery::Discarded);
        }
        if header.sequence_number != s.expected_sequence_number {
            return Err(Error::Protocol(format!(
                "{channel}: buffer out of order: expected sequence number {}, got {}",
                s.expected_sequence_number, header.sequence_number
            )));
        }
        let delivery = match header.data_type {
            DataType::Event => Delivery::Event,
            DataType::Data if inside_record => Delivery::Record,
            DataType::Data if s.announced() == 0 => {
                return Err(Error::Protocol(format!(
                    "{channel}: data buffer {} arrived without credit",
                    header.sequence_number
                )));
            }
            DataType::Data => {
                let origin = if s.floating_available > 0 {
                    s.floating_available -= 1;
                    s.floating_in_use += 1;
                    BufferOrigin::Floating
                } else {
                    s.exclusive_available -= 1;
                    s.exclusive_in_use += 1;
                    BufferOrigin::Exclusive
                };
                Delivery::Data(BufferLease { channel, origin })
            }
        };
        s.expected_sequence_number += 1;
        self.on_sender_backlog(channel, header.backlog);
        Ok(delivery)
    }

    /// A BacklogAnnouncement arrived: the sender has `backlog` data buffers but no credit
    /// (Flink: `RemoteInputChannel#onSenderBacklog`). Ignored for a released channel.
    pub fn on_backlog_announcement(&mut self, channel: ChannelId, backlog: u32) -> Result<()> {
        let s = self
            .channels
            .get(channel.0)
            .ok_or_else(|| Error::Protocol(format!("BacklogAnnouncement for unknown {channel}")))?;
        if !s.released {
            self.on_sender_backlog(channel, backlog);
        }
        Ok(())
    }

    /// The consumer is done with a received buffer (Flink: `Buffer#recycleBuffer`).
    ///
    /// An exclusive buffer returns to its channel as credit, or, if the channel now holds more
    /// buffers than it needs, makes the channel hand a floating buffer back to the gate. A
    /// floating buffer goes to the first waiting channel that needs it, else to the gate.
    /// Fails with [`Error::InvalidArgument`] for a lease from another gate.
    pub fn on_buffer_recycled(&mut self, lease: BufferLease) -> Result<()> {
        let BufferLease { channel, origin } = lease;
        let foreign = || Error::InvalidArgument(format!("buffer lease of {channel} is not from this gate"));
        let s = self.channels.get_mut(channel.0).ok_or_else(foreign)?;
        match origin {
            BufferOrigin::Floating => {
                s.floating_in_use = s.floating_in_use.checked_sub(1).ok_or_else(foreign)?;
                self.recycle_floating();
            }
            BufferOrigin::Exclusive => {
                s.exclusive_in_use = s.exclusive_in_use.checked_sub(1).ok_or_else(foreign)?;
                if s.released {
                    // The segment goes back to the memory layer; no credit for a dead channel.
                    return Ok(());
                }
                s.exclusive_available += 1;
                if s.available() > s.required && s.floating_available > 0 {
                    // Surplus: keep the exclusive buffer, return a floating one. The number of
                    // empty buffers, hence the sender's credit, stays the same.
                    s.floating_available -= 1;
                    self.recycle_floating();
                } else {
                    self.add_unannounced(channel, 1);
                }
            }
        }
        Ok(())
    }

    /// Releases a channel (cancelled, failed or finished; Flink: `releaseAllResources`): its
    /// empty floating buffers go back to the gate, its empty exclusive buffers to the memory
    /// layer, and unannounced credit is dropped. Buffers still in use are returned when
    /// recycled; BufferResponses still in flight are [`Delivery::Discarded`]. Idempotent.
    pub fn release_channel(&mut self, channel: ChannelId) -> Result<()> {
        let s = self
            .channels
            .get_mut(channel.0)
            .ok_or_else(|| Error::InvalidArgument(format!("cannot release unknown {channel}")))?;
        if s.released {
            return Ok(());
        }
        s.released = true;
        s.required = 0;
        s.unannounced = 0;
        s.exclusive_available = 0;
        let floating = std::mem::take(&mut s.floating_available);
        for _ in 0..floating {
            self.recycle_floating();
        }
        Ok(())
    }

    /// Whether the channel's sender holds no more credit than waits to be announced (it is
    /// down to half the channel's empty buffers or less): the AddCredit is due now rather
    /// than whenever the transport gets round to it. `false` for an unknown channel.
    pub fn announcement_due(&self, channel: ChannelId) -> bool {
        self.channels
            .get(channel.0)
            .is_some_and(|s| s.unannounced > 0 && s.unannounced >= s.announced())
    }

    /// Takes the channel's unannounced credit for an AddCredit being written now, resetting it
    /// to zero (Flink: `getAndResetUnannouncedCredit`). `None` if there is nothing to
    /// announce (already taken, or the channel was released or is unknown): send nothing.
    pub fn take_unannounced_credit(&mut self, channel: ChannelId) -> Option<Credit> {
        let s = self.channels.get_mut(channel.0)?;
        if s.released || s.unannounced == 0 {
            return None;
        }
        Some(Credit(std::mem::take(&mut s.unannounced)))
    }

    /// The next thing the transport has to do, oldest first. Drain after every call.
    pub fn poll_action(&mut self) -> Option<ReceiverAction> {
        self.actions.pop_front()
    }

    /// The sender has `backlog` data buffers queued: want `backlog + exclusive` buffers and
    /// take floating ones from the gate, or wait for them (Flink: `requestFloatingBuffers`).
    fn on_sender_backlog(&mut self, channel: ChannelId, backlog: u32) {
        let s = &mut self.channels[channel.0];
        s.required = backlog.saturating_add(self.config.exclusive_buffers_per_channel);
        let shortfall = s.shortfall();
        let granted = shortfall.min(self.floating_available);
        self.floating_available -= granted;
        s.floating_available += granted;
        if shortfall > granted && !s.waiting {
            s.waiting = true;
            self.waiting.push_back(channel);
        }
        self.add_unannounced(channel, granted);
    }

    /// A floating buffer comes back to the gate: the first waiting channel that still needs
    /// one gets it (and waits on at the back if it needs more), else the gate keeps it.
    fn recycle_floating(&mut self) {
        while let Some(channel) = self.waiting.pop_front() {
            let s = &mut self.channels[channel.0];
            s.waiting = false;
            if s.shortfall() == 0 {
                continue;
            }
            s.floating_available += 1;
            if s.shortfall() > 0 {
                s.waiting = true;
                self.waiting.push_back(channel);
            }
            self.add_unannounced(channel, 1);
            return;
        }
        self.floating_available += 1;
    }

    /// New empty buffers for the channel; ask for an AddCredit on zero to positive.
    fn add_unannounced(&mut self, channel: ChannelId, buffers: u32) {
        let s = &mut self.channels[channel.0];
        if buffers == 0 {
            return;
        }
        let was = s.unannounced;
        s.unannounced += buffers;
        if was == 0 {
            self.actions.push_back(ReceiverAction::SendAddCredit { channel });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Sender side
// ---------------------------------------------------------------------------------------------

/// What a subpartition has next for its reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueHead {
    /// Nothing to send.
    Empty,
    /// A data buffer (needs credit).
    Data,
    /// A record body buffer: a data buffer wholly inside a record whose length prefix went out
    /// before it, not completing it (needs none; see the module docs).
    RecordBody,
    /// An event (needs none).
    Event,
}

/// Sender-side credit of one subpartition reader (Flink:
/// `CreditBasedSequenceNumberingViewReader`): credit from the receiver, the next sequence
/// number, and what the receiver last heard about the backlog.
#[derive(Clone, Debug)]
pub struct SenderCredit {
    initial_credit: Credit,
    credit: Credit,
    next_sequence_number: u64,
    /// Backlog in the last BufferResponse or BacklogAnnouncement; what the receiver plans for.
    last_backlog_announced: u32,
}

impl SenderCredit {
    /// A reader created by a PartitionRequest carrying `initial_credit`.
    pub fn new(initial_credit: Credit) -> Self {
        SenderCredit {
            initial_credit,
            credit: initial_credit,
            next_sequence_number: 0,
            last_backlog_announced: 0,
        }
    }

    /// Buffers the receiver has promised and the sender has not used yet.
    pub fn credit(&self) -> Credit {
        self.credit
    }

    /// The sequence number the next BufferResponse gets.
    pub fn next_sequence_number(&self) -> u64 {
        self.next_sequence_number
    }

    /// An AddCredit arrived (Flink: `addCredit`). A zero amount or an overflow is a protocol
    /// error; on error the credit is unchanged.
    pub fn on_add_credit(&mut self, credit: Credit) -> Result<()> {
        if credit.is_zero() {
            return Err(Error::Protocol("AddCredit with zero credit".into()));
        }
        self.credit = self.credit.checked_add(credit)?;
        Ok(())
    }

    /// Whether a data buffer may be sent now.
    pub fn can_send_data(&self) -> bool {
        !self.credit.is_zero()
    }

    /// Whether the reader belongs in the ready queue: its next buffer is an event or a record
    /// body buffer, or data and there is credit (Flink:
    /// `getAvailabilityAndBacklog().isAvailable()`).
    pub fn is_available(&self, head: QueueHead) -> bool {
        match head {
            QueueHead::Empty => false,
            QueueHead::Data => self.can_send_data(),
            QueueHead::RecordBody | QueueHead::Event => true,
        }
    }

    /// A buffer is being written; returns its header. A data buffer uses up one credit;
    /// without credit that is an error (a bug in the sender loop) and nothing changes.
    /// `backlog` is the number of data buffers left in the subpartition after this one.
    pub fn on_buffer_sent(&mut self, data_type: DataType, backlog: u32) -> Result<BufferHeader> {
        if data_type == DataType::Data {
            if self.credit.is_zero() {
                return Err(Error::Protocol(format!(
                    "data buffer {} sent without credit",
                    self.next_sequence_number
                )));
            }
            self.credit = self.credit.checked_sub(Credit::ONE)?;
        }
        Ok(self.next_header(data_type, backlog))
    }

    /// A record body buffer is being written (a data buffer wholly inside a record whose
    /// length prefix went out before it, not completing it): it needs no credit. Returns its
    /// header, as [`SenderCredit::on_buffer_sent`] does.
    pub fn on_record_body_sent(&mut self, backlog: u32) -> BufferHeader {
        self.next_header(DataType::Data, backlog)
    }

    /// The header of the BufferResponse being written: the next sequence number and the
    /// backlog it announces.
    fn next_header(&mut self, data_type: DataType, backlog: u32) -> BufferHeader {
        let header = BufferHeader {
            sequence_number: self.next_sequence_number,
            backlog,
            data_type,
        };
        self.next_sequence_number += 1;
        self.last_backlog_announced = backlog;
        header
    }

    /// Whether to send a BacklogAnnouncement for `backlog` queued data buffers: the channel
    /// has no exclusive buffers, the reader has no credit, and the receiver last heard of no
    /// backlog, so without it nobody would ever move (Flink: `needAnnounceBacklog`).
    pub fn needs_backlog_announcement(&self, backlog: u32) -> bool {
        self.initial_credit.is_zero()
            && self.credit.is_zero()
            && backlog > 0
            && self.last_backlog_announced == 0
    }

    /// A BacklogAnnouncement for `backlog` is being written.
    pub fn on_backlog_announced(&mut self, backlog: u32) {
        self.last_backlog_announced = backlog;
    }
}

/// Readers with something to send, each at most once, served round robin (Flink:
/// `PartitionRequestQueue#availableReaders`). `K` is whatever identifies a reader.
#[derive(Clone, Debug)]
pub struct ReadyQueue<K> {
    order: VecDeque<K>,
    queued: HashSet<K>,
}

impl<K> Default for ReadyQueue<K> {
    fn default() -> Self {
        ReadyQueue {
            order: VecDeque::new(),
            queued: HashSet::new(),
        }
    }
}

impl<K: Copy + Eq + Hash> ReadyQueue<K> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `reader` unless it is already queued; returns whether it was added.
    pub fn enqueue(&mut self, reader: K) -> bool {
        let added = self.queued.insert(reader);
        if added {
            self.order.push_back(reader);
        }
        added
    }

    /// Takes the reader that has waited longest. Put it back with [`ReadyQueue::enqueue`]
    /// after writing one buffer if it is still available: that is the round robin.
    pub fn dequeue(&mut self) -> Option<K> {
        let reader = self.order.pop_front()?;
        self.queued.remove(&reader);
        Some(reader)
    }

    /// Drops `reader` (cancelled or released); returns whether it was queued.
    pub fn remove(&mut self, reader: K) -> bool {
        let removed = self.queued.remove(&reader);
        if removed {
            self.order.retain(|r| *r != reader);
        }
        removed
    }

    /// Whether `reader` is queued.
    pub fn contains(&self, reader: K) -> bool {
        self.queued.contains(&reader)
    }

    /// Number of queued readers.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether no reader is queued.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz::credit::{self as model, Op, Pair};
    use proptest::prelude::*;

    fn gate(exclusive: u32, floating: u32) -> GateCredit {
        GateCredit::new(GateCreditConfig {
            exclusive_buffers_per_channel: exclusive,
            floating_buffers: floating,
        })
        .unwrap()
    }

    fn data(sequence_number: u64, backlog: u32) -> BufferHeader {
        BufferHeader {
            sequence_number,
            backlog,
            data_type: DataType::Data,
        }
    }

    fn event(sequence_number: u64, backlog: u32) -> BufferHeader {
        BufferHeader {
            sequence_number,
            backlog,
            data_type: DataType::Event,
        }
    }

    fn actions(gate: &mut GateCredit) -> Vec<ReceiverAction> {
        std::iter::from_fn(|| gate.poll_action()).collect()
    }

    fn add_credit(channel: ChannelId) -> ReceiverAction {
        ReceiverAction::SendAddCredit { channel }
    }

    fn lease(delivery: Delivery) -> BufferLease {
        match delivery {
            Delivery::Data(lease) => lease,
            other => panic!("expected data, got {other:?}"),
        }
    }

    fn stats(gate: &GateCredit, channel: ChannelId) -> ChannelCreditStats {
        gate.channel_stats(channel).unwrap()
    }

    fn is_protocol_error<T: fmt::Debug>(result: Result<T>, needle: &str) -> bool {
        matches!(result, Err(Error::Protocol(msg)) if msg.contains(needle))
    }

    #[test]
    fn default_config_is_two_exclusive_and_eight_floating() {
        let config = GateCreditConfig::default();
        assert_eq!(config.exclusive_buffers_per_channel, 2);
        assert_eq!(config.floating_buffers, 8);
    }

    #[test]
    fn gate_without_any_buffers_is_rejected() {
        assert!(matches!(
            GateCredit::new(GateCreditConfig {
                exclusive_buffers_per_channel: 0,
                floating_buffers: 0
            }),
            Err(Error::InvalidArgument(_))
        ));
        assert!(GateCredit::new(GateCreditConfig {
            exclusive_buffers_per_channel: u32::MAX,
            floating_buffers: 1
        })
        .is_err());
    }

    #[test]
    fn initial_credit_equals_exclusive_buffers() {
        let mut g = gate(3, 8);
        let ch = g.add_channel();
        assert_eq!(g.initial_credit(), Credit::new(3));
        let s = stats(&g, ch);
        assert_eq!(
            (s.exclusive_available, s.announced, s.unannounced),
            (3, Credit::new(3), Credit::ZERO)
        );
        assert_eq!(SenderCredit::new(g.initial_credit()).credit(), Credit::new(3));
        assert!(
            actions(&mut g).is_empty(),
            "initial credit travels in the PartitionRequest"
        );
    }

    #[test]
    fn record_body_buffers_need_no_credit_and_take_no_buffer() {
        let mut g = gate(1, 0);
        let ch = g.add_channel();
        // The record's first buffer (its length prefix) takes the channel's one buffer.
        let first = lease(g.on_buffer_response(ch, data(0, 0)).unwrap());
        let s = stats(&g, ch);
        assert_eq!((s.available(), s.announced), (0, Credit::ZERO));
        // With no credit left, buffers inside the record still land in it, taking nothing.
        for seq in 1..=3 {
            assert_eq!(
                g.on_buffer_response_inside_record(ch, data(seq, 0)).unwrap(),
                Delivery::Record
            );
        }
        assert_eq!(
            stats(&g, ch),
            ChannelCreditStats {
                expected_sequence_number: 4,
                ..s
            }
        );
        assert!(actions(&mut g).is_empty(), "nothing to announce");
        // The buffer that completes the record needs credit like any other.
        assert!(is_protocol_error(
            g.on_buffer_response(ch, data(4, 0)),
            "without credit"
        ));
        g.on_buffer_recycled(first).unwrap();
        assert_eq!(g.take_unannounced_credit(ch), Some(Credit::ONE));
        assert!(matches!(
            g.on_buffer_response(ch, data(4, 0)).unwrap(),
            Delivery::Data(_)
        ));
    }

    #[test]
    fn record_body_buffers_are_still_checked_and_dropped_for_a_released_channel() {
        let mut g = gate(1, 0);
        let ch = g.add_channel();
        assert!(is_protocol_error(
            g.on_buffer_response_inside_record(ch, data(1, 0)),
            "out of order"
        ));
        assert!(is_protocol_error(
            g.on_buffer_response_inside_record(ChannelId(9), data(0, 0)),
            "unknown"
        ));
        // Events inside a record are events.
        assert_eq!(
            g.on_buffer_response_inside_record(ch, event(0, 0)).unwrap(),
            Delivery::Event
        );
        g.release_channel(ch).unwrap();
        assert_eq!(
            g.on_buffer_response_inside_record(ch, data(1, 0)).unwrap(),
            Delivery::Discarded
        );
    }

    #[test]
    fn a_sender_sends_record_body_buffers_without_credit() {
        let mut sender = SenderCredit::new(Credit::ONE);
        sender.on_buffer_sent(DataType::Data, 3).unwrap();
        assert!(!sender.is_available(QueueHead::Data));
        assert!(sender.is_available(QueueHead::RecordBody));
        let header = sender.on_record_body_sent(2);
        assert_eq!(
            header,
            BufferHeader {
                sequence_number: 1,
                backlog: 2,
                data_type: DataType::Data
            }
        );
        assert_eq!(
            (sender.credit(), sender.next_sequence_number()),
            (Credit::ZERO, 2)
        );
    }

    #[test]
    fn an_announcement_is_due_once_half_the_empty_buffers_are_unannounced() {
        let mut g = gate(4, 0);
        let ch = g.add_channel();
        assert!(!g.announcement_due(ch), "all four announced in the request");
        let leases: Vec<_> = (0..4)
            .map(|seq| lease(g.on_buffer_response(ch, data(seq, 0)).unwrap()))
            .collect();
        let mut leases = leases.into_iter();
        g.on_buffer_recycled(leases.next().unwrap()).unwrap();
        // 1 unannounced, 0 announced (the other three buffers are in use).
        assert!(g.announcement_due(ch));
        assert_eq!(g.take_unannounced_credit(ch), Some(Credit::new(1)));
        assert!(!g.announcement_due(ch), "nothing left to announce");
        g.on_buffer_recycled(leases.next().unwrap()).unwrap();
        // 1 unannounced against 1 announced: half.
        assert!(g.announcement_due(ch));
        assert!(!g.announcement_due(ChannelId(7)), "unknown channel");
    }

    #[test]
    fn backlog_requests_floating_buffers() {
        let mut g = gate(2, 8);
        let ch = g.add_channel();
        let l = lease(g.on_buffer_response(ch, data(0, 5)).unwrap());
        assert_eq!(l.origin(), BufferOrigin::Exclusive);
        // Wants 5 + 2 = 7, holds 1 empty exclusive buffer: takes 6 floating ones.
        let s = stats(&g, ch);
        assert_eq!(
            (s.required, s.floating_available, s.unannounced),
            (7, 6, Credit::new(6))
        );
        assert_eq!(g.available_floating(), 2);
        assert_eq!(actions(&mut g), vec![add_credit(ch)]);
        assert_eq!(g.take_unannounced_credit(ch), Some(Credit::new(6)));
        assert_eq!(g.take_unannounced_credit(ch), None);
    }

    #[test]
    fn channels_wait_for_floating_buffers_in_fifo_order() {
        let mut g = gate(1, 2);
        let [a, b, c] = [g.add_channel(), g.add_channel(), g.add_channel()];
        let la = lease(g.on_buffer_response(a, data(0, 3)).unwrap()); // wants 4, gets both floating
        let _lb = lease(g.on_buffer_response(b, data(0, 1)).unwrap()); // wants 2, waits
        let _lc = lease(g.on_buffer_response(c, data(0, 1)).unwrap()); // wants 2, waits
        assert_eq!(stats(&g, a).floating_available, 2);
        assert!(stats(&g, a).waiting_for_floating && stats(&g, b).waiting_for_floating);
        actions(&mut g);
        g.take_unannounced_credit(a);
        // `a` uses a floating buffer and recycles it: `a` waited first, so it gets it back.
        let fa = lease(g.on_buffer_response(a, data(1, 3)).unwrap());
        assert_eq!(fa.origin(), BufferOrigin::Floating);
        g.on_buffer_recycled(fa).unwrap();
        assert_eq!(stats(&g, a).floating_available, 2);
        assert!(stats(&g, a).waiting_for_floating);
        // Its exclusive buffer comes back as credit; then backlog 0 leaves `a` content, and the
        // next floating buffer goes to `b`, which waited before `a` queued again.
        g.on_buffer_recycled(la).unwrap();
        actions(&mut g);
        let fa = lease(g.on_buffer_response(a, data(2, 0)).unwrap());
        g.on_buffer_recycled(fa).unwrap();
        assert_eq!(
            (stats(&g, b).floating_available, stats(&g, c).floating_available),
            (1, 0)
        );
        assert_eq!(actions(&mut g), vec![add_credit(b)]);
    }

    #[test]
    fn add_credit_only_on_zero_to_positive() {
        let mut g = gate(3, 0);
        let ch = g.add_channel();
        let leases: Vec<_> = (0..3)
            .map(|seq| lease(g.on_buffer_response(ch, data(seq, 0)).unwrap()))
            .collect();
        let mut emitted = Vec::new();
        for l in leases {
            g.on_buffer_recycled(l).unwrap();
            emitted.extend(actions(&mut g));
        }
        assert_eq!(
            emitted,
            vec![add_credit(ch)],
            "three recycles, one AddCredit request"
        );
        assert_eq!(g.take_unannounced_credit(ch), Some(Credit::new(3)));
        // Back at zero: the next buffer asks again.
        let l = lease(g.on_buffer_response(ch, data(3, 0)).unwrap());
        g.on_buffer_recycled(l).unwrap();
        assert_eq!(actions(&mut g), vec![add_credit(ch)]);
    }

    #[test]
    fn sequence_gap_is_a_protocol_error() {
        let mut g = gate(2, 0);
        let ch = g.add_channel();
        let _l = g.on_buffer_response(ch, data(0, 0)).unwrap();
        let before = stats(&g, ch);
        assert!(is_protocol_error(
            g.on_buffer_response(ch, data(2, 0)),
            "expected sequence number 1, got 2"
        ));
        assert!(is_protocol_error(
            g.on_buffer_response(ch, data(0, 0)),
            "expected sequence number 1, got 0"
        ));
        assert_eq!(stats(&g, ch), before, "a rejected response changes nothing");
    }

    #[test]
    fn data_without_credit_is_a_protocol_error() {
        let mut g = gate(1, 1);
        let ch = g.add_channel();
        let _l = g.on_buffer_response(ch, data(0, 0)).unwrap();
        assert!(is_protocol_error(
            g.on_buffer_response(ch, data(1, 0)),
            "without credit"
        ));
        // Unannounced buffers are not credit either.
        let mut g = gate(0, 1);
        let ch = g.add_channel();
        g.on_backlog_announcement(ch, 1).unwrap();
        assert_eq!(stats(&g, ch).unannounced, Credit::ONE);
        assert!(is_protocol_error(
            g.on_buffer_response(ch, data(0, 0)),
            "without credit"
        ));
    }

    #[test]
    fn unknown_channel_is_a_protocol_error() {
        let mut g = gate(2, 8);
        assert!(is_protocol_error(
            g.on_buffer_response(ChannelId(7), data(0, 0)),
            "unknown channel 7"
        ));
        assert!(is_protocol_error(
            g.on_backlog_announcement(ChannelId(7), 1),
            "unknown channel 7"
        ));
    }

    #[test]
    fn events_need_no_credit() {
        let mut sender = SenderCredit::new(Credit::ZERO);
        assert!(!sender.can_send_data());
        assert!(sender.is_available(QueueHead::Event));
        assert!(!sender.is_available(QueueHead::Data));
        let header = sender.on_buffer_sent(DataType::Event, 0).unwrap();
        assert_eq!(header, event(0, 0));
        assert_eq!(sender.credit(), Credit::ZERO);

        let mut g = gate(1, 1);
        let ch = g.add_channel();
        let _l = g.on_buffer_response(ch, data(0, 0)).unwrap();
        assert_eq!(stats(&g, ch).announced, Credit::ZERO);
        assert_eq!(g.on_buffer_response(ch, event(1, 0)).unwrap(), Delivery::Event);
        assert_eq!(stats(&g, ch).expected_sequence_number, 2);
    }

    #[test]
    fn sender_data_uses_credit_and_numbers_every_response() {
        let mut sender = SenderCredit::new(Credit::new(2));
        let headers: Vec<_> = [DataType::Data, DataType::Event, DataType::Data]
            .into_iter()
            .map(|t| sender.on_buffer_sent(t, 4).unwrap())
            .collect();
        assert_eq!(
            headers.iter().map(|h| h.sequence_number).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert!(headers.iter().all(|h| h.backlog == 4));
        assert_eq!(sender.credit(), Credit::ZERO);
        assert!(is_protocol_error(
            sender.on_buffer_sent(DataType::Data, 3),
            "without credit"
        ));
        assert_eq!(
            sender.next_sequence_number(),
            3,
            "a refused send uses no sequence number"
        );
        sender.on_add_credit(Credit::ONE).unwrap();
        assert!(sender.can_send_data());
    }

    #[test]
    fn exclusive_zero_relies_on_backlog() {
        let mut g = gate(0, 4);
        let ch = g.add_channel();
        let mut sender = SenderCredit::new(g.initial_credit());
        assert_eq!(sender.credit(), Credit::ZERO);
        // Two data buffers queued, no credit: announce the backlog, once.
        assert!(!sender.is_available(QueueHead::Data));
        assert!(sender.needs_backlog_announcement(2));
        sender.on_backlog_announced(2);
        assert!(!sender.needs_backlog_announcement(3));
        g.on_backlog_announcement(ch, 2).unwrap();
        assert_eq!(actions(&mut g), vec![add_credit(ch)]);
        sender
            .on_add_credit(g.take_unannounced_credit(ch).unwrap())
            .unwrap();
        assert_eq!(sender.credit(), Credit::new(2));
        for seq in 0..2 {
            let header = sender.on_buffer_sent(DataType::Data, 1 - seq as u32).unwrap();
            let l = lease(g.on_buffer_response(ch, header).unwrap());
            assert_eq!(l.origin(), BufferOrigin::Floating);
            g.on_buffer_recycled(l).unwrap();
        }
        // Everything recycled and no backlog: the floating buffers are all back in the gate.
        assert_eq!(g.available_floating(), 4);
        assert!(actions(&mut g).is_empty());
        // New data after "backlog 0": announce again.
        assert!(sender.needs_backlog_announcement(1));
        // With exclusive buffers, the sender never announces: they come back by themselves.
        assert!(!SenderCredit::new(Credit::ONE).needs_backlog_announcement(5));
    }

    #[test]
    fn credit_overflow_is_protocol_error() {
        let mut sender = SenderCredit::new(Credit::new(u32::MAX - 1));
        sender.on_add_credit(Credit::ONE).unwrap();
        assert!(is_protocol_error(
            sender.on_add_credit(Credit::ONE),
            "credit overflow"
        ));
        assert_eq!(sender.credit(), Credit::new(u32::MAX));
        assert!(is_protocol_error(
            Credit::ZERO.checked_sub(Credit::ONE),
            "credit underflow"
        ));
    }

    #[test]
    fn zero_add_credit_is_protocol_error() {
        let mut sender = SenderCredit::new(Credit::ONE);
        assert!(is_protocol_error(
            sender.on_add_credit(Credit::ZERO),
            "zero credit"
        ));
    }

    #[test]
    fn surplus_floating_returned_on_recycle() {
        let mut g = gate(2, 8);
        let ch = g.add_channel();
        let first = lease(g.on_buffer_response(ch, data(0, 3)).unwrap()); // exclusive; wants 5, gets 4
        assert_eq!(stats(&g, ch).floating_available, 4);
        actions(&mut g);
        g.take_unannounced_credit(ch);
        let second = lease(g.on_buffer_response(ch, data(1, 0)).unwrap()); // floating; wants 2
        assert_eq!(
            (second.origin(), stats(&g, ch).available()),
            (BufferOrigin::Floating, 4)
        );
        // 4 empty buffers, 2 needed: the recycled exclusive buffer stays, a floating one leaves.
        g.on_buffer_recycled(first).unwrap();
        let s = stats(&g, ch);
        assert_eq!(
            (s.exclusive_available, s.floating_available, s.unannounced),
            (2, 2, Credit::ZERO)
        );
        assert_eq!(g.available_floating(), 5);
        // A recycled floating buffer always goes back to the gate when nobody waits.
        g.on_buffer_recycled(second).unwrap();
        assert_eq!(g.available_floating(), 6);
        assert!(
            actions(&mut g).is_empty(),
            "no new credit: the sender's credit still matches"
        );
    }

    #[test]
    fn release_returns_floating_buffers_to_the_gate() {
        let mut g = gate(1, 3);
        let [a, b] = [g.add_channel(), g.add_channel()];
        let la = lease(g.on_buffer_response(a, data(0, 3)).unwrap()); // wants 4, holds 3 floating
        let _lb = lease(g.on_buffer_response(b, data(0, 1)).unwrap()); // wants 2, waits
        actions(&mut g);
        g.release_channel(a).unwrap();
        g.release_channel(a).unwrap();
        // The waiting `b` takes the two floating buffers it needs, the gate gets the rest.
        assert_eq!(stats(&g, b).floating_available, 2);
        assert_eq!(g.available_floating(), 1);
        assert_eq!(actions(&mut g), vec![add_credit(b)]);
        // Late arrivals and late recycles for `a` are harmless.
        assert_eq!(g.on_buffer_response(a, data(1, 0)).unwrap(), Delivery::Discarded);
        g.on_buffer_recycled(la).unwrap();
        assert_eq!(g.take_unannounced_credit(a), None);
        assert_eq!(stats(&g, a).available(), 0);
    }

    #[test]
    fn foreign_lease_is_rejected() {
        let mut g1 = gate(1, 1);
        let mut g2 = gate(1, 1);
        let ch = g1.add_channel();
        g2.add_channel();
        let l = lease(g1.on_buffer_response(ch, data(0, 0)).unwrap());
        assert!(matches!(g2.on_buffer_recycled(l), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn ready_queue_holds_each_reader_once_and_serves_round_robin() {
        let mut q = ReadyQueue::new();
        assert!(q.enqueue('a'));
        assert!(q.enqueue('b'));
        assert!(!q.enqueue('a'));
        assert_eq!(q.len(), 2);
        let mut served = Vec::new();
        for _ in 0..5 {
            let r = q.dequeue().unwrap();
            served.push(r);
            q.enqueue(r); // still available
        }
        assert_eq!(served, vec!['a', 'b', 'a', 'b', 'a']);
        assert!(q.remove('a') && !q.remove('a') && !q.contains('a'));
        assert_eq!((q.dequeue(), q.dequeue(), q.is_empty()), (Some('b'), None, true));
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..4usize).prop_map(Op::Produce),
            1 => (0..4usize).prop_map(Op::ProduceEvent),
            4 => Just(Op::SenderWrite),
            4 => Just(Op::DeliverToReceiver),
            3 => Just(Op::ReceiverWriteAddCredit),
            3 => Just(Op::DeliverToSender),
            3 => any::<usize>().prop_map(Op::Recycle),
            1 => (0..4usize).prop_map(Op::Release),
            2 => (0..4usize, 0..5usize).prop_map(|(c, n)| Op::ProduceRecord(c, n)),
        ]
    }

    fn config() -> impl Strategy<Value = GateCreditConfig> {
        (0..4u32, 0..7u32).prop_map(|(exclusive, floating)| model::config(exclusive, floating))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn random_interleavings_keep_credit_consistent_and_deliver_everything(
            channels in 1..5usize,
            config in config(),
            ops in prop::collection::vec(op(), 0..300),
        ) {
            let mut pair = Pair::new(channels, config);
            pair.check_invariants();
            for op in &ops {
                pair.apply(op);
                pair.check_invariants();
            }
            pair.drain();
        }

        #[test]
        fn ready_queue_answers_as_a_reference_model(ops in prop::collection::vec(any::<u8>(), 0..400)) {
            crate::fuzz::ready_queue::run(&ops);
        }

        #[test]
        fn credit_arithmetic_is_checked(a in any::<u32>(), b in any::<u32>()) {
            let (x, y) = (Credit::new(a), Credit::new(b));
            prop_assert_eq!(x.checked_add(y).ok().map(Credit::get), a.checked_add(b));
            prop_assert_eq!(x.checked_sub(y).ok().map(Credit::get), a.checked_sub(b));
        }
    }
}
