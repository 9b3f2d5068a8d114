//! Memory: fixed-size segments ([`segment`]) handed out by a capped global pool to local
//! pools with a guaranteed minimum and an elastic share ([`pool`]).

pub mod pool;
pub mod segment;

pub use pool::{GlobalPool, LocalPool, PoolStats, PooledSegment, Reservation};
pub use segment::Segment;
