//! Scripted-peer tests of the wire protocol: one real `NetworkEnvironment` against a peer
//! written here with a plain `std::net` socket and the public codec, one behaviour per test.
//!
//! * [`sending`]: a scripted client against the environment's listener (the environment
//!   sends): credit, backlog, sequence numbers, end-of-partition, requests and cancels.
//! * [`receiving`]: a scripted server that the environment's gate connects to (the
//!   environment receives): the credit the gate grants, and what it makes of each message.
//! * [`records`]: records longer than a buffer, both ways: how the sender cuts them and
//!   which of their buffers take credit on either side.
//! * [`client_faults`]: malformed, hostile and vanishing clients, and the limits that bound
//!   what one client can take from the environment.
//! * [`server_faults`]: a server that breaks the protocol or goes away under the gate.
//!
//! The script itself (the peer, the messages it sends and takes apart, environments and
//! batches) is in [`script`]. Reads use generous timeouts; "nothing arrives" is checked with
//! a short quiet window, which can only fail when the environment really sends something it
//! should not.

mod client_faults;
mod receiving;
mod records;
mod script;
mod sending;
mod server_faults;
