//! The protocol: what two environments say to each other and the state each side keeps
//! about it, all as plain values with no I/O, no threads and no clock of their own (no
//! tokio here), so tests drive them step by step. The wire format ([`wire`]), credit-based
//! flow control ([`credit`]), checkpoint barrier alignment ([`checkpoint`]) and the buffer
//! debloating calculator ([`debloat`]).
//!
//! May use [`crate::base`] (and, for what travels, nothing else: batches are bytes here).

pub mod checkpoint;
pub mod credit;
pub mod debloat;
pub mod wire;
