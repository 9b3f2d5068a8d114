//! The network: the TCP (optionally TLS) connections between environments that carry the
//! wire protocol of [`crate::protocol::wire`], run on one tokio runtime per environment.
//!
//! Rooms: `runtime` (the transport an environment owns: listener, connections, I/O thread),
//! `io` (frames on a socket), `handshake` and `auth`, `limits` and `liveness` (what an abusive
//! or silent peer meets), `client` (the receiving side, by role), `server` (the sending side,
//! by role), `tls` (handshake and record layer), `shm` (shared-memory links, whose parts the
//! host service's links to attached tasks use too). May use every layer below it: base, memory,
//! serde, protocol and partition (the subpartitions it serves).

mod auth;
mod client;
mod handshake;
mod io;
mod limits;
mod liveness;
mod runtime;
mod server;
pub(crate) mod shm;
mod tls;

pub(crate) use client::{recycle_all, Inbound, RecordBytes, RemoteChannel, RemoteGate};
pub use client::{RemoteChannelStats, RemoteStats};
pub(crate) use runtime::{Transport, TransportConfig};
pub use shm::ChannelTransport;
pub(crate) use tls::Tls;
