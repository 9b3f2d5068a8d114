//! The network: the TCP (optionally TLS) connections between environments that carry the
//! wire protocol of [`crate::protocol::wire`], the receiving side (`client`) and the sending
//! side (`server`), run on one tokio runtime per environment.

#[cfg(not(loom))]
mod auth;
#[cfg(not(loom))]
mod client;
#[cfg(not(loom))]
mod io;
#[cfg(not(loom))]
mod limits;
#[cfg(not(loom))]
mod liveness;
#[cfg(not(loom))]
mod net;
#[cfg(not(loom))]
mod server;
#[cfg(not(loom))]
mod tls;
#[cfg(not(loom))]
mod tls_record;

#[cfg(not(loom))]
pub(crate) use client::{recycle_all, Inbound, RemoteChannel, RemoteGate};
#[cfg(not(loom))]
pub use client::{RemoteChannelStats, RemoteStats};
#[cfg(not(loom))]
pub(crate) use net::{Transport, TransportConfig};
#[cfg(not(loom))]
pub(crate) use tls::Tls;
