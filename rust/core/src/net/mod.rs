//! The network: the TCP (optionally TLS) connections between environments that carry the
//! wire protocol of [`crate::protocol::wire`], the receiving side (`client`) and the sending
//! side (`server`), run on one tokio runtime per environment.

mod auth;
mod client;
mod handshake;
mod io;
mod limits;
mod liveness;
mod runtime;
mod server;
mod tls;

pub(crate) use client::{recycle_all, Inbound, RemoteChannel, RemoteGate};
pub use client::{RemoteChannelStats, RemoteStats};
pub(crate) use runtime::{Transport, TransportConfig};
pub(crate) use tls::Tls;
