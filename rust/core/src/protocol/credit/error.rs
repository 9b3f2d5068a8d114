//! Credit's errors: [`CreditError`], one variant per rule a peer (or the sender loop) can break,
//! and per configuration or call the credit state refuses. Upward they become the crate's
//! [`Error`] with the same text: [`Error::Protocol`] for a broken rule,
//! [`Error::InvalidArgument`] for a refused configuration or call.

use crate::base::error::Error;

/// Why the credit state refused an event. The messages are the ones users see.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CreditError {
    // A rule of the protocol was broken.
    /// Credit that would exceed `u32::MAX`.
    #[error("credit overflow: {credit} + {added} exceeds {max}", max = u32::MAX)]
    Overflow {
        /// The credit held.
        credit: u32,
        /// The credit added.
        added: u32,
    },
    /// Credit that would go below zero.
    #[error("credit underflow: {credit} - {taken} is negative")]
    Underflow {
        /// The credit held.
        credit: u32,
        /// The credit taken.
        taken: u32,
    },
    /// A BufferResponse or BacklogAnnouncement for a channel the gate never added.
    #[error("{message} for unknown channel {channel}")]
    UnknownChannel {
        /// "BufferResponse" or "BacklogAnnouncement".
        message: &'static str,
        /// The channel (its index in the gate).
        channel: usize,
    },
    /// A BufferResponse whose sequence number is not the next one.
    #[error("channel {channel}: buffer out of order: expected sequence number {expected}, got {got}")]
    OutOfOrder {
        /// The channel (its index in the gate).
        channel: usize,
        /// The next sequence number.
        expected: u64,
        /// The one that arrived.
        got: u64,
    },
    /// A data buffer that arrived while the sender held no credit.
    #[error("channel {channel}: data buffer {sequence_number} arrived without credit")]
    ArrivedWithoutCredit {
        /// The channel (its index in the gate).
        channel: usize,
        /// The buffer's sequence number.
        sequence_number: u64,
    },
    /// An AddCredit of zero.
    #[error("AddCredit with zero credit")]
    ZeroAddCredit,
    /// The sender loop wrote a data buffer without credit.
    #[error("data buffer {0} sent without credit")]
    SentWithoutCredit(u64),
    /// A record started (its length prefix arrived, or was sent) beyond the record bytes
    /// granted to its channel.
    #[error("channel {channel}: a record of {bytes} bytes started with only {granted} record bytes granted")]
    RecordWithoutGrant {
        /// The channel (its index in the gate; 0 on the sending side).
        channel: usize,
        /// Bytes of the records started.
        bytes: u64,
        /// Record bytes granted and not used yet.
        granted: u64,
    },
    /// A RecordAnnouncement or RecordGrant of zero bytes, or a grant that overflows.
    #[error("record bytes of {0} in a RecordAnnouncement or RecordGrant")]
    BadRecordBytes(u64),

    // A configuration or call the credit state refuses.
    /// A gate whose channels could never receive data.
    #[error("an input gate needs at least one floating buffer when channels have no exclusive buffers")]
    NoBuffers,
    /// More buffers per channel than a `u32` counts.
    #[error("too many buffers per input gate: {exclusive} exclusive + {floating} floating")]
    TooManyBuffers {
        /// Exclusive buffers per channel.
        exclusive: u32,
        /// Floating buffers of the gate.
        floating: u32,
    },
    /// A buffer lease this gate did not hand out (or handed back already).
    #[error("buffer lease of channel {0} is not from this gate")]
    ForeignLease(usize),
    /// Releasing a channel the gate never added.
    #[error("cannot release unknown channel {0}")]
    ReleaseUnknown(usize),
}

impl CreditError {
    /// Whether a rule of the protocol was broken (by the peer, or by this side's sender loop),
    /// rather than a configuration or call refused.
    pub fn is_protocol_violation(&self) -> bool {
        !matches!(
            self,
            CreditError::NoBuffers
                | CreditError::TooManyBuffers { .. }
                | CreditError::ForeignLease(_)
                | CreditError::ReleaseUnknown(_)
        )
    }
}

impl From<CreditError> for Error {
    fn from(e: CreditError) -> Error {
        if e.is_protocol_violation() {
            Error::Protocol(e.to_string())
        } else {
            Error::InvalidArgument(e.to_string())
        }
    }
}
