//! `InputGate`: reads one subpartition per channel and yields batches (Flink's
//! `SingleInputGate` with `LocalInputChannel`s).
//!
//! Channels that have something to read are queued in `ready` by the subpartitions'
//! listeners (each at most once); `next()` takes them round-robin, so one busy channel
//! cannot starve the others. Per channel, batches come out in the order they were written.
//! A channel whose partition is not registered yet is retried with exponential backoff
//! and fails with `PartitionNotFound` when the backoff is exhausted.
//!
//! Besides batches, [`InputGate::next_item`] yields user events and checkpoint barriers,
//! each in order with the batches of its channel; the alignment of barriers is
//! [`crate::protocol::checkpoint`]'s. [`InputGate::next`] yields only the batches (barriers are still
//! aligned: a channel blocked in an alignment is not read).
//!
//! Rooms: `input_gate` ([`InputGate`]), `item` ([`GateItem`], and what a relay gets),
//! `channels` (channel states, the ready queue), `handle` (what the environment keeps:
//! counters, debloating, [`GateMetricsReader`]), `metrics` (snapshots). May use every layer below it, [`crate::net`] included.

mod channels;
mod handle;
mod input_gate;
mod item;
mod metrics;

pub use channels::ReadyListener;
pub use handle::GateMetricsReader;
pub(crate) use handle::{DebloatSetup, GateHandle};
pub use input_gate::InputGate;
pub(crate) use input_gate::RemoteSetup;
pub use item::GateItem;
pub(crate) use item::Relayed;
pub use metrics::{ChannelKind, ChannelMetrics, DebloatMetrics, GateMetrics};
