//! The global pool (Flink's `NetworkBufferPool`) and local pools (`LocalBufferPool`).
//!
//! * The [`GlobalPool`] owns at most `total = memory / segment_size` segments, allocated
//!   lazily on first request and never more. Freed segments go back to its free list.
//! * A [`LocalPool`] belongs to one partition or one input gate. It is guaranteed `min`
//!   segments (checked at construction: [`Error::InsufficientBuffers`](crate::base::error::Error::InsufficientBuffers) if the minimums of all
//!   pools would exceed `total`) and may grow to its *share*: `min` plus an equal part of the
//!   segments nobody's minimum claims, capped at its `max`. Shares are recomputed whenever a
//!   pool is created or destroyed.
//! * Segments leave a local pool wrapped in a [`PooledSegment`]; dropping it recycles the
//!   segment: back to the local free list, or to the global pool while the local pool holds
//!   more than its share (or after it was destroyed).
//!
//! Locking: a local pool's mutex may be held while taking the global mutex, never the other
//! way round. The global pool wakes waiting local pools only after releasing its own lock.
//!
//! * A [`RecordPool`] holds the blocks received records are gathered into, so that a block a
//!   dropped batch gave back is written again instead of a fresh allocation (page faults).
//!
//! Rooms: [`segment`] (the fixed-size aligned block), `global` ([`GlobalPool`], the registry of
//! local pools and redistribution), `local` ([`LocalPool`], [`PooledSegment`],
//! [`Reservation`]) and `records` ([`RecordPool`]). May use [`crate::base`] only.

mod global;
mod local;
mod records;
pub mod segment;
#[cfg(test)]
mod tests;

pub use global::{GlobalPool, HeldOutside, PoolStats};
pub use local::{LocalPool, PooledSegment, Reservation};
pub use records::{RecordBuf, RecordPool, RecordPoolStats};
pub use segment::Segment;
