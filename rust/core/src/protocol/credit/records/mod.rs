//! Record bytes, the receiving side: [`RecordBudget`], one per input gate (protocol version 3).
//!
//! Buffer credit bounds the segments of a gate; it does not bound the records. A record's
//! whole body is allocated when its length prefix arrives, and a record may be as large as a
//! batch (up to 2 GiB), so the gate also counts *record bytes*: the records in progress plus
//! the completed records the consumer has not taken yet, per channel and per gate.
//!
//! The rule: **a record may start only while the gate's record bytes are under its budget.**
//! The sender knows each record's length before it sends the buffer that carries its length
//! prefix (it follows the framing of its stream), so it withholds that buffer until the
//! receiver has granted it the bytes of the records that buffer starts:
//!
//! 1. The sender announces the bytes its next buffer starts (RecordAnnouncement) when the
//!    record bytes it was granted and has not used do not cover them.
//! 2. The receiver grants what is missing (RecordGrant) at once while the gate's *reserved*
//!    bytes (records held + granted and not yet started) are under the budget; otherwise the
//!    channel waits, first come first served, until the consumer takes records. It grants
//!    ahead too: up to the channel's *window* (half the budget shared by the live channels)
//!    in all, as long as that keeps the reserved bytes within half the budget, and tops the
//!    grant up again, unasked, once the channel's records used half of it. Without it,
//!    every record waited for its grant: the sender announces the next record while the
//!    current one goes out, but a grant needs both sides' I/O threads (and on a busy machine
//!    their turn on a core), and one record of 65,536 rows goes out faster than that.
//! 3. Sending the buffer uses up the granted bytes; its length prefixes arriving at the
//!    receiver use them up there. A record started beyond its channel's grant is a protocol
//!    error.
//! 4. When the consumer takes a record (or a channel's record is dropped), its bytes leave the
//!    gate's count and waiting channels are served.
//!
//! Since a grant is made only while the reserved bytes are under the budget, at most one
//! grant at a time takes the gate beyond it: the gate holds at most `budget` plus the records
//! one buffer starts (its largest record plus a buffer's worth of small ones). A record larger
//! than the whole budget still goes through, alone. And no deadlock: the bytes granted ahead
//! never take the reserved bytes past half the budget, so once the consumer took what it can
//! the reserved bytes are under the budget and the first waiting channel is granted, whatever
//! it needs; and the records reserved are ones the consumer can take (a sender announces
//! nothing while paused by a barrier).

use std::collections::VecDeque;

use super::error::CreditError;
use super::value::ChannelId;

#[cfg(test)]
mod tests;

/// Record budget of a gate unless configured otherwise (64 MiB).
pub const DEFAULT_RECORD_BUDGET: u64 = 64 << 20;

#[derive(Clone, Debug, Default)]
struct ChannelRecords {
    /// Bytes granted (as far as the receiver knows, grants in flight included) and not used.
    granted: u64,
    /// Bytes of this channel's records in progress and completed but not taken.
    held: u64,
    /// The bytes its next buffer starts, announced and not yet covered (0: none).
    need: u64,
    /// In the waiting queue (exactly when true).
    waiting: bool,
    released: bool,
    /// Largest `held` seen.
    peak: u64,
}

/// A snapshot of a channel's record bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelRecordStats {
    /// Records in progress plus completed and not taken, in bytes.
    pub held: u64,
    /// The largest `held` so far.
    pub peak: u64,
    /// Granted and not used yet.
    pub granted: u64,
    /// Whether the channel waits for a grant.
    pub waiting: bool,
}

/// The record bytes of one input gate (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct RecordBudget {
    budget: u64,
    channels: Vec<ChannelRecords>,
    /// Sum of `held` over the channels.
    held: u64,
    /// Sum of `granted` over the live channels.
    granted: u64,
    /// Largest `held` so far.
    peak: u64,
    /// Largest `held + granted` so far (what the bound is about).
    peak_reserved: u64,
    waiting: VecDeque<ChannelId>,
    /// Grants to send: channel and bytes.
    grants: VecDeque<(ChannelId, u64)>,
}

impl RecordBudget {
    /// A gate allowed `budget` record bytes (at least 1).
    pub fn new(budget: u64) -> Self {
        RecordBudget {
            budget: budget.max(1),
            channels: Vec::new(),
            held: 0,
            granted: 0,
            peak: 0,
            peak_reserved: 0,
            waiting: VecDeque::new(),
            grants: VecDeque::new(),
        }
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Adds a channel (ids in order from 0, as [`super::GateCredit::add_channel`]).
    pub fn add_channel(&mut self) -> ChannelId {
        self.channels.push(ChannelRecords::default());
        ChannelId(self.channels.len() - 1)
    }

    /// Records in progress plus completed and not taken, in bytes, over the gate.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Record bytes granted to channels and not used yet.
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// Largest [`RecordBudget::held`] so far.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Largest `held + granted` so far.
    pub fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }

    /// A channel's record bytes; `None` for an unknown id.
    pub fn channel_stats(&self, channel: ChannelId) -> Option<ChannelRecordStats> {
        let c = self.channels.get(channel.0)?;
        Some(ChannelRecordStats {
            held: c.held,
            peak: c.peak,
            granted: c.granted,
            waiting: c.waiting,
        })
    }

    fn channel(
        &mut self,
        channel: ChannelId,
        message: &'static str,
    ) -> Result<&mut ChannelRecords, CreditError> {
        self.channels
            .get_mut(channel.0)
            .ok_or(CreditError::UnknownChannel {
                message,
                channel: channel.0,
            })
    }

    /// A RecordAnnouncement: the channel's next buffer starts records of `bytes` in all.
    /// Grants what its grant lacks now if the gate is under budget, else queues it.
    pub fn on_record_announcement(&mut self, channel: ChannelId, bytes: u64) -> Result<(), CreditError> {
        if bytes == 0 {
            return Err(CreditError::BadRecordBytes(0));
        }
        let c = self.channel(channel, "RecordAnnouncement")?;
        if c.released || bytes <= c.granted {
            // Covered by grants still in flight to the sender.
            return Ok(());
        }
        c.need = bytes;
        if !c.waiting {
            c.waiting = true;
            self.waiting.push_back(channel);
        }
        self.serve();
        Ok(())
    }

    /// Records of `bytes` in all started on the channel (their length prefixes arrived): they
    /// use up its grant and count as held. Beyond the grant: a protocol error, nothing changes.
    pub fn on_records_started(&mut self, channel: ChannelId, bytes: u64) -> Result<(), CreditError> {
        let c = self.channel(channel, "record")?;
        if bytes > c.granted {
            return Err(CreditError::RecordWithoutGrant {
                channel: channel.0,
                bytes,
                granted: c.granted,
            });
        }
        c.granted -= bytes;
        c.held += bytes;
        c.peak = c.peak.max(c.held);
        self.granted -= bytes;
        self.held += bytes;
        self.peak = self.peak.max(self.held);
        self.top_up(channel);
        Ok(())
    }

    /// The channel's window: half the budget shared by the live channels.
    fn window(&self) -> u64 {
        let live = self.channels.iter().filter(|c| !c.released).count().max(1) as u64;
        self.budget / (2 * live)
    }

    /// Once a channel used half its window, grants it ahead up to the window again (within
    /// half the budget), so that a sender whose records keep coming rarely has to ask.
    fn top_up(&mut self, channel: ChannelId) {
        let window = self.window();
        let room = (self.budget / 2).saturating_sub(self.held + self.granted);
        let c = &mut self.channels[channel.0];
        if c.released || c.waiting || c.granted >= window / 2 {
            return;
        }
        let extra = (window - c.granted).min(room);
        if extra > 0 {
            c.granted += extra;
            self.granted += extra;
            self.peak_reserved = self.peak_reserved.max(self.held + self.granted);
            self.grants.push_back((channel, extra));
        }
    }

    /// Records of `bytes` in all were taken by the consumer (or dropped): they leave the
    /// count, and waiting channels are served. Never fails: more than held is clamped (a bug,
    /// logged by the caller's tests, not a peer's doing).
    pub fn on_records_taken(&mut self, channel: ChannelId, bytes: u64) {
        let Some(c) = self.channels.get_mut(channel.0) else {
            return;
        };
        debug_assert!(
            bytes <= c.held,
            "{channel}: taking {bytes} record bytes of {}",
            c.held
        );
        let bytes = bytes.min(c.held);
        c.held -= bytes;
        self.held -= bytes;
        self.serve();
    }

    /// The channel is released: its unused grant goes back to the gate, it waits no more.
    /// Records it still holds are counted until taken or dropped. Idempotent.
    pub fn release_channel(&mut self, channel: ChannelId) {
        let Some(c) = self.channels.get_mut(channel.0) else {
            return;
        };
        if c.released {
            return;
        }
        c.released = true;
        self.granted -= std::mem::take(&mut c.granted);
        c.need = 0;
        self.serve();
    }

    /// The next RecordGrant to send: channel and bytes.
    pub fn poll_grant(&mut self) -> Option<(ChannelId, u64)> {
        self.grants.pop_front()
    }

    /// Grants waiting channels, oldest first, while the gate is under budget.
    fn serve(&mut self) {
        while self.held + self.granted < self.budget {
            let Some(channel) = self.waiting.pop_front() else {
                break;
            };
            let window = self.window();
            let reserved = self.held + self.granted;
            let c = &mut self.channels[channel.0];
            c.waiting = false;
            let need = std::mem::take(&mut c.need);
            if c.released || need <= c.granted {
                continue;
            }
            let base = need - c.granted;
            // Ahead: up to the channel's window in all, from the lower half of the budget.
            let extra = window
                .saturating_sub(need)
                .min((self.budget / 2).saturating_sub(reserved + base));
            let grant = base + extra;
            c.granted = need + extra;
            self.granted += grant;
            self.peak_reserved = self.peak_reserved.max(self.held + self.granted);
            self.grants.push_back((channel, grant));
        }
    }
}
