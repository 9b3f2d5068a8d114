//! creditflow-core: Apache Flink's TaskManager network stack for Arrow record batches,
//! in pure Rust (no Python). The pyo3 crate `rust/python` is a thin layer over this one.
//!
//! # Layout
//!
//! Each layer only uses the ones above it:
//!
//! | layer | module | Flink counterpart |
//! |---|---|---|
//! | fixed-size aligned memory blocks | [`memory::segment`] | `MemorySegment` |
//! | global pool with a hard cap, local pools with min + elastic share | [`memory`] | `NetworkBufferPool`, `LocalBufferPool` |
//! | a segment being written while it is read | [`partition::buffer`] | `BufferBuilder` / `BufferConsumer` |
//! | per-consumer lock-free queue with backlog | [`partition::subpartition`] | `PipelinedSubpartition` |
//! | N subpartitions + flusher | [`partition`] | `ResultPartition`, `OutputFlusher` |
//! | Arrow IPC into / out of segments | [`serde`] | `SpanningRecordSerializer`, `SpillingAdaptiveSpanningRecordDeserializer` |
//! | Spark-compatible Murmur3 | [`partition::spark_hash`] | (Spark's `Murmur3Hash`) |
//! | row → subpartition | [`partition::partitioner`] | `ChannelSelector` |
//! | batch → partition | [`partition::writer`] | `RecordWriter` |
//! | channels → batches | [`gate`] | `SingleInputGate`, `LocalInputChannel` |
//! | buffer size from the gate's throughput (no I/O) | [`protocol::debloat`] | `BufferDebloater`, `ThroughputCalculator` |
//! | credit, backlog, sequence numbers (no I/O) | [`protocol::credit`] | `CreditBasedPartitionRequestClientHandler` state |
//! | wire protocol: frames ⇄ messages (no I/O) | [`protocol::wire`] | `NettyMessage`, `NettyMessageClientDecoderDelegate` |
//! | counters, meters, OK/LOW/HIGH | [`base::metrics`] | `BackPressureStatsTracker`, `TimerGauge` |
//! | one per process: pools, partitions, gates, flusher | [`mod@env`] | `NettyShuffleEnvironment` |
//!
//! Blocking calls take a [`base::wait::Wait`]: an optional deadline and an interrupt check that
//! the Python layer uses for Ctrl-C, so no call can block forever without a way out.

pub mod base;
#[cfg(not(loom))]
pub mod env;
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;
#[cfg(not(loom))]
pub mod gate;
pub mod memory;
#[cfg(not(loom))]
pub mod net;
pub mod partition;
pub mod protocol;
pub mod serde;

pub use base::config::{ChannelSpec, FlowControl};
pub use base::error::{Error, Result};
#[cfg(not(loom))]
pub use env::{EnvConfig, NetworkEnvironment};
#[cfg(not(loom))]
pub use gate::{GateItem, InputGate};
pub use partition::ResultPartition;
pub use partition::{Partitioner, RecordWriter};
