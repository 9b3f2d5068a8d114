//! The values both sides of credit-based flow control speak in: [`Credit`] (checked
//! arithmetic), the channel id, and the credit-relevant fields of a BufferResponse header.

use std::fmt;

use super::error::CreditError;
use crate::base::error::Result;

/// A number of buffers one side has promised the other: one credit is one free buffer.
///
/// Arithmetic is checked: a result that would overflow or go below zero is a protocol error,
/// never a wrapped or saturated value, since it can only come from a peer that broke the rules.
///
/// ```
/// use creditflow_core::protocol::credit::{Credit, CreditError};
///
/// assert_eq!(Credit::new(2).checked_add(Credit::new(3)).unwrap(), Credit::new(5));
/// assert!(matches!(Credit::new(1).checked_sub(Credit::new(2)), Err(CreditError::Underflow { .. })));
/// assert!(Credit::new(u32::MAX).checked_add(Credit::new(1)).is_err());
/// ```
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
    pub fn checked_add(self, other: Credit) -> Result<Credit, CreditError> {
        self.0
            .checked_add(other.0)
            .map(Credit)
            .ok_or(CreditError::Overflow {
                credit: self.0,
                added: other.0,
            })
    }

    /// `self - other`, or a protocol error if that is negative.
    pub fn checked_sub(self, other: Credit) -> Result<Credit, CreditError> {
        self.0
            .checked_sub(other.0)
            .map(Credit)
            .ok_or(CreditError::Underflow {
                credit: self.0,
                taken: other.0,
            })
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
