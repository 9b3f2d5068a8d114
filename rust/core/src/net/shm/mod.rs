//! Shared-memory channels: when a producer and a consumer environment run on one host as one
//! user, their connection's byte stream moves from the TCP socket to two rings in a memory
//! region only the two processes map. The frames, and so the credit protocol, backlog,
//! events, barriers, debloating and metrics, are the same as over TCP; only the pipe under
//! them changes, after the (TCP) handshake has authenticated the peer.
//!
//! Rooms: `identity` (what a side says about itself: boot id, uid, pid), `region` (a sealed
//! `memfd` mapped shared), `ring` (a single-producer single-consumer byte ring in the region),
//! `heap` (chunks where the producer puts whole records for the consumer to decode in place),
//! `doorbell` (the Unix socket that wakes a sleeping side and tells a dead peer), `stream`
//! (the rings as `AsyncRead` / `AsyncWrite` halves), `fdpass` (a message with a descriptor over
//! a Unix socket), `link` (the Unix socket listener and the peer-credential checks that set a
//! link up). The host service (`crate::host`) builds its links to attached tasks from the same
//! parts.

mod doorbell;
mod fdpass;
mod heap;
mod identity;
mod link;
mod region;
mod ring;
mod stream;
#[cfg(test)]
mod tests;

pub use crate::base::metrics::ChannelTransport;
pub(crate) use doorbell::{Doorbell, Waiter};
pub(crate) use fdpass::{recv_fds, send_fds};
pub(crate) use heap::{
    heap_bytes_for, sane_heap, HeapLease, HeapReader, HeapWriter, HEAP_CHUNK, MAX_HEAP_BYTES, MIN_ITEM,
};
#[cfg(test)]
pub(crate) use heap::{heap_region_len, ITEM_PAD};
pub(crate) use identity::local_offer;
pub(crate) use link::{check_peer, connect_link, heap_offset, region_len, serve_link, ShmListener};
pub(crate) use region::Region;
pub(crate) use ring::{Ring, RING_HEADER};
pub(crate) use stream::{ShmReader, ShmWriter};
