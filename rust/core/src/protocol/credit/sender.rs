//! The sending side's credit: [`SenderCredit`], one per subpartition reader (Flink's
//! `CreditBasedSequenceNumberingViewReader`).

use super::error::CreditError;
use super::value::{BufferHeader, Credit, DataType};
use crate::base::error::Result;

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
    /// Record bytes granted (RecordGrant) and not used yet (protocol version 3).
    record_granted: u64,
    /// Record bytes announced for the buffer at the head (0: none announced).
    record_announced: u64,
}

impl SenderCredit {
    /// A reader created by a PartitionRequest carrying `initial_credit`.
    pub fn new(initial_credit: Credit) -> Self {
        SenderCredit {
            initial_credit,
            credit: initial_credit,
            next_sequence_number: 0,
            last_backlog_announced: 0,
            record_granted: 0,
            record_announced: 0,
        }
    }

    /// Record bytes granted and not used yet.
    pub fn record_granted(&self) -> u64 {
        self.record_granted
    }

    /// Whether a data buffer that starts records of `bytes` in all (the lengths of the records
    /// whose length prefixes it completes) may go now: always for none, else when the grant
    /// covers them (see [`super::RecordBudget`]).
    pub fn can_start_records(&self, bytes: u64) -> bool {
        bytes <= self.record_granted
    }

    /// A RecordGrant arrived. Zero or an overflow is a protocol error.
    pub fn on_record_grant(&mut self, bytes: u64) -> Result<(), CreditError> {
        if bytes == 0 {
            return Err(CreditError::BadRecordBytes(0));
        }
        self.record_granted = self
            .record_granted
            .checked_add(bytes)
            .ok_or(CreditError::BadRecordBytes(bytes))?;
        Ok(())
    }

    /// Whether to send a RecordAnnouncement for a head buffer that starts records of `bytes`:
    /// the grant does not cover them and they were not announced already.
    pub fn needs_record_announcement(&self, bytes: u64) -> bool {
        bytes > self.record_granted && bytes != self.record_announced
    }

    /// Whether a RecordAnnouncement was sent and its buffer has not gone out yet.
    pub fn has_record_announcement(&self) -> bool {
        self.record_announced != 0
    }

    /// A RecordAnnouncement for `bytes` is being written.
    pub fn on_record_announced(&mut self, bytes: u64) {
        self.record_announced = bytes;
    }

    /// A data buffer starting records of `bytes` in all is being written: uses up the grant.
    /// Beyond the grant is an error (a bug in the sender loop) and nothing changes.
    pub fn on_records_started(&mut self, bytes: u64) -> Result<(), CreditError> {
        if bytes == 0 {
            return Ok(());
        }
        if bytes > self.record_granted {
            return Err(CreditError::RecordWithoutGrant {
                channel: 0,
                bytes,
                granted: self.record_granted,
            });
        }
        self.record_granted -= bytes;
        self.record_announced = 0;
        Ok(())
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
    pub fn on_add_credit(&mut self, credit: Credit) -> Result<(), CreditError> {
        if credit.is_zero() {
            return Err(CreditError::ZeroAddCredit);
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
    pub fn on_buffer_sent(&mut self, data_type: DataType, backlog: u32) -> Result<BufferHeader, CreditError> {
        if data_type == DataType::Data {
            if self.credit.is_zero() {
                return Err(CreditError::SentWithoutCredit(self.next_sequence_number));
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
