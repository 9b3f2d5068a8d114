//! A subpartition's byte stream is a sequence of records, `[u64 little-endian length][body]`:
//! the length prefix as it arrives in pieces, and [`RecordFraming`], the sending side's view
//! of where the stream stands between records.

/// Bytes of the record length prefix.
pub const RECORD_HEADER_LEN: usize = 8;

/// A record's length prefix as it arrives in pieces.
#[derive(Clone, Debug, Default)]
pub(super) struct LengthPrefix {
    bytes: [u8; RECORD_HEADER_LEN],
    pub(super) filled: usize,
}

impl LengthPrefix {
    /// Bytes of the prefix still to come.
    pub(super) fn missing(&self) -> usize {
        RECORD_HEADER_LEN - self.filled
    }

    /// Takes what it still needs from the front of `bytes` (advancing it); returns the
    /// record length once the prefix is complete, and starts over.
    pub(super) fn take(&mut self, bytes: &mut &[u8]) -> Option<u64> {
        let n = self.missing().min(bytes.len());
        self.bytes[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
        self.filled += n;
        *bytes = &bytes[n..];
        if self.filled < RECORD_HEADER_LEN {
            return None;
        }
        self.filled = 0;
        Some(u64::from_le_bytes(self.bytes))
    }
}

/// Where a subpartition's byte stream stands between records, without keeping its bytes:
/// the sending side's view of what the receiver's [`RecordAssembler`](super::RecordAssembler) holds at the same point
/// of the stream. It tells which buffers are *record body buffers*, which need no credit (see
/// [`crate::protocol::credit`]): both ends decide that from the stream alone, so they agree.
#[derive(Clone, Debug, Default)]
pub struct RecordFraming {
    prefix: LengthPrefix,
    body_missing: u64,
}

impl RecordFraming {
    /// Bytes of the body in progress still to come (0 at a record boundary or inside a
    /// length prefix).
    pub fn body_missing(&self) -> u64 {
        self.body_missing
    }

    /// Whether a payload of `len` bytes sent next lies wholly inside the record in progress
    /// without completing it (the receiver has its length prefix, so its body is allocated).
    pub fn is_record_body(&self, len: usize) -> bool {
        (len as u64) < self.body_missing
    }

    /// The stream moves on by `bytes`. Body bytes are only counted; a length prefix is read.
    /// A length of 0 starts no body (the receiver refuses it; nothing here is then a record
    /// body buffer). Returns the lengths, summed, of the records whose length prefixes these
    /// bytes complete: the record bytes they *start* (protocol version 3 grants those before
    /// the buffer goes out; see [`crate::protocol::credit::RecordBudget`]).
    pub fn advance(&mut self, mut bytes: &[u8]) -> u64 {
        let mut started = 0u64;
        while !bytes.is_empty() {
            if self.body_missing > 0 {
                let n = self.body_missing.min(bytes.len() as u64);
                self.body_missing -= n;
                // `n` is at most `bytes.len()`, so it fits in usize.
                bytes = &bytes[n as usize..];
                continue;
            }
            if let Some(len) = self.prefix.take(&mut bytes) {
                self.body_missing = len;
                started = started.saturating_add(len);
            }
        }
        started
    }

    /// The record bytes a payload made of `parts` would start (see [`RecordFraming::advance`]),
    /// without moving on.
    pub fn starts<'a>(&self, parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
        let mut peek = self.clone();
        parts
            .into_iter()
            .map(|p| peek.advance(p))
            .fold(0u64, u64::saturating_add)
    }
}
