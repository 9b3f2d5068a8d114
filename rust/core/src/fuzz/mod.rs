//! Harnesses shared by the cargo-fuzz targets (`fuzz/`), the corpus replay test
//! (`tests/fuzz_corpus.rs`) and the property tests: each takes arbitrary bytes, reads them as
//! a scenario (a chunked byte stream, a sequence of operations) and panics if an invariant
//! breaks. Not part of the public API: compiled only with the cargo feature `fuzz`, and the
//! top layer (it may use every other).
//!
//! * [`frames::run`]: the frame decoder over arbitrary bytes in arbitrary chunks, driven the
//!   way the transport drives it, against a one-shot decode of the same bytes.
//! * [`credit::run`]: a sender and a receiver of [`crate::protocol::credit`] connected in memory,
//!   driven by an arbitrary sequence of operations, invariants checked after every step.
//! * [`records::run`]: record bytes (protocol version 3): senders against a gate's record
//!   budget, the bound after every step, every record delivered in the end.
//! * [`attach::run`]: the host service's attach protocol: every decoder over an arbitrary
//!   frame, and what it accepts re-encoded.
//! * [`ready_queue::run`]: [`crate::protocol::credit::ReadyQueue`] against a plain reference model.

#[cfg(not(loom))]
pub mod attach;
pub mod credit;
pub mod frames;
pub mod ready_queue;
pub mod records;

/// Reads values from the fuzzer's bytes; every read after the end gives `None`.
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    /// Reads `data` from the front.
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    /// The next byte.
    pub fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.data.split_first()?;
        self.data = rest;
        Some(b)
    }

    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.u8()?, self.u8()?]))
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}
