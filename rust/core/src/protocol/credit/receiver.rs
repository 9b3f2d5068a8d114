//! The receiving side's credit: [`GateCredit`], one per input gate, shared by the connections
//! its remote channels use (Flink's `RemoteInputChannel`, its `BufferManager` and the gate's
//! `LocalBufferPool`). See the [module docs](super) for the protocol.

use std::collections::VecDeque;

use super::error::CreditError;
use super::value::{BufferHeader, ChannelId, Credit, DataType};
use crate::base::error::Result;

/// Exclusive buffers per remote channel unless configured otherwise (Flink:
/// `taskmanager.network.memory.buffers-per-channel`).
pub const DEFAULT_EXCLUSIVE_BUFFERS: u32 = 2;

/// Floating buffers per input gate unless configured otherwise (Flink:
/// `taskmanager.network.memory.floating-buffers-per-gate`).
pub const DEFAULT_FLOATING_BUFFERS: u32 = 8;

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
    /// Fails with [`CreditError::NoBuffers`] if the gate could never receive data (no
    /// exclusive and no floating buffers), [`CreditError::TooManyBuffers`] if one channel's
    /// buffers would not fit a `u32`.
    pub fn new(config: GateCreditConfig) -> Result<Self, CreditError> {
        let GateCreditConfig {
            exclusive_buffers_per_channel: exclusive,
            floating_buffers: floating,
        } = config;
        if exclusive == 0 && floating == 0 {
            return Err(CreditError::NoBuffers);
        }
        if exclusive.checked_add(floating).is_none() {
            return Err(CreditError::TooManyBuffers { exclusive, floating });
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
        Credit::new(self.config.exclusive_buffers_per_channel)
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
            unannounced: Credit::new(s.unannounced),
            announced: Credit::new(s.announced()),
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
    pub fn on_buffer_response(
        &mut self,
        channel: ChannelId,
        header: BufferHeader,
    ) -> Result<Delivery, CreditError> {
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
    ) -> Result<Delivery, CreditError> {
        self.on_response(channel, header, true)
    }

    fn on_response(
        &mut self,
        channel: ChannelId,
        header: BufferHeader,
        inside_record: bool,
    ) -> Result<Delivery, CreditError> {
        let s = self
            .channels
            .get_mut(channel.0)
            .ok_or(CreditError::UnknownChannel {
                message: "BufferResponse",
                channel: channel.0,
            })?;
        if s.released {
            return Ok(Delivery::Discarded);
        }
        if header.sequence_number != s.expected_sequence_number {
            return Err(CreditError::OutOfOrder {
                channel: channel.0,
                expected: s.expected_sequence_number,
                got: header.sequence_number,
            });
        }
        let delivery = match header.data_type {
            DataType::Event => Delivery::Event,
            DataType::Data if inside_record => Delivery::Record,
            DataType::Data if s.announced() == 0 => {
                return Err(CreditError::ArrivedWithoutCredit {
                    channel: channel.0,
                    sequence_number: header.sequence_number,
                });
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
    pub fn on_backlog_announcement(&mut self, channel: ChannelId, backlog: u32) -> Result<(), CreditError> {
        let s = self.channels.get(channel.0).ok_or(CreditError::UnknownChannel {
            message: "BacklogAnnouncement",
            channel: channel.0,
        })?;
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
    /// Fails with [`CreditError::ForeignLease`] for a lease from another gate.
    pub fn on_buffer_recycled(&mut self, lease: BufferLease) -> Result<(), CreditError> {
        let BufferLease { channel, origin } = lease;
        let foreign = CreditError::ForeignLease(channel.0);
        let s = self.channels.get_mut(channel.0).ok_or(foreign.clone())?;
        match origin {
            BufferOrigin::Floating => {
                s.floating_in_use = s.floating_in_use.checked_sub(1).ok_or(foreign)?;
                self.recycle_floating();
            }
            BufferOrigin::Exclusive => {
                s.exclusive_in_use = s.exclusive_in_use.checked_sub(1).ok_or(foreign)?;
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
    pub fn release_channel(&mut self, channel: ChannelId) -> Result<(), CreditError> {
        let s = self
            .channels
            .get_mut(channel.0)
            .ok_or(CreditError::ReleaseUnknown(channel.0))?;
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
        Some(Credit::new(std::mem::take(&mut s.unannounced)))
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
