//! Spillable partitions (Flink's blocking and hybrid result partitions): the writer never
//! waits for readers; what does not fit in the partition's pool goes to a spill file, and
//! readers read the stored stream, from memory or from disk, as often as the kind allows.
//!
//! Rooms: `dir` (the environment's spill directory, its disk budget and the clean-up of dead
//! processes' files), `file` (one partition's append-only file), `store` (the per-subpartition
//! logs and the spilling policy), `replay` (a reader: a pipelined view fed from the log).

pub mod dir;
pub mod file;
pub mod replay;
pub mod store;
#[cfg(test)]
mod tests;

pub use dir::{SpillDir, SpillDirMetrics};
pub use store::{SpillKind, SpillMetrics, SpillStore};
