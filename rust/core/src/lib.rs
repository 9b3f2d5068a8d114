//! creditflow-core: Apache Flink's TaskManager network stack for Arrow record batches,
//! in pure Rust (no Python). The pyo3 crate `rust/python` is a thin layer over this one.
//!
//! # Layers
//!
//! One folder per layer, lowest first. A file may use its own layer and the ones above it in
//! this table, never one below (`scripts/check_layers.py`, run by `make lint`, checks that
//! and that no files import each other in a circle).
//!
//! | layer | owns | Flink counterpart |
//! |---|---|---|
//! | [`base`] | the error type, byte sizes, blocking-call limits ([`base::wait::Wait`]), loom-swappable sync, the one in-band [`base::event::Event`], settings types several layers read ([`base::config`]), counters and meters ([`base::metrics`]) | `BackPressureStatsTracker`, `TimerGauge` |
//! | [`memory`] | fixed-size aligned segments; a global pool with a hard cap, local pools with a minimum and an elastic share | `MemorySegment`, `NetworkBufferPool`, `LocalBufferPool` |
//! | [`serde`] | Arrow IPC into and out of a subpartition's byte stream: encode, framing, assemble, decode | `SpanningRecordSerializer`, `SpillingAdaptiveSpanningRecordDeserializer` |
//! | [`protocol`] | no I/O, no tokio: the wire format ([`protocol::wire`]), credit ([`protocol::credit`]), checkpoint alignment ([`protocol::checkpoint`]), the debloating calculator ([`protocol::debloat`]) | `NettyMessage`, `CreditBasedPartitionRequestClientHandler` state, `BufferDebloater` |
//! | [`partition`] | the producing side: a segment written while read ([`partition::buffer`]), the lock-free queue per consumer ([`partition::subpartition`]), [`ResultPartition`], [`RecordWriter`], the partitioners and Spark's Murmur3 ([`partition::spark_hash`]) | `BufferBuilder`, `PipelinedSubpartition`, `ResultPartition`, `RecordWriter`, `ChannelSelector` |
//! | [`net`] | TCP (and TLS) between environments on a tokio runtime: the handshake, the receiving side (`client`), the sending side (`server`), limits, liveness; shared-memory links between environments of one host (`shm`) | `PartitionRequestClient`, `PartitionRequestServerHandler`, `PartitionRequestQueue` |
//! | [`gate`] | the consuming side: [`InputGate`] over local and remote channels, barrier alignment, metrics | `SingleInputGate`, `LocalInputChannel`, `RemoteInputChannel` |
//! | [`mod@env`] | one per process: pools, partitions, gates, the transport, the flusher ([`NetworkEnvironment`]); every setting once, with its default, unit and doc ([`env::settings`]) | `NettyShuffleEnvironment`, `NettyShuffleEnvironmentOptions` |
//! | [`host`] | one per host, user and application: the host service holding every attached task's partitions, gates and connections in one environment ([`host::HostService`]), and the task's attachment to it ([`host::Attachment`]) | the TaskManager's `ShuffleEnvironment` shared by its tasks |
//! | `fuzz` | (feature `fuzz` only) harnesses for the cargo-fuzz targets and property tests | |
//!
//! `net`, `gate`, `env` and `host` are left out of loom builds (`--cfg loom`), which model-check the
//! lock-free parts below them.
//!
//! Blocking calls take a [`base::wait::Wait`]: an optional deadline and an interrupt check that
//! the Python layer uses for Ctrl-C, so no call can block forever without a way out.

// Loom builds leave net, gate, env and host out: what only they use is dead there, not elsewhere.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

pub mod base;
#[cfg(not(loom))]
pub mod env;
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;
#[cfg(not(loom))]
pub mod gate;
#[cfg(not(loom))]
pub mod host;
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
pub use partition::{Partitioner, RecordWriter, ResultPartition};
