//! The ground floor: what every other layer may use and which uses nothing of this crate
//! above it. The error type, byte sizes, blocking-call limits, the loom-swappable sync
//! primitives and what is built on them for shared memory (the byte ring [`byte_ring`] and the chunk map [`chunk_map`], model-checked), the one in-band [`event::Event`], the settings types several layers read
//! ([`config`]) and cheap counters and meters ([`metrics`]).

pub(crate) mod byte_ring;
pub(crate) mod chunk_map;
pub mod config;
pub mod error;
pub mod event;
pub mod metrics;
pub(crate) mod sync;
pub mod units;
pub mod wait;
