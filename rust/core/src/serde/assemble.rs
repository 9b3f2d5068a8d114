//! [`RecordAssembler`]: a record's bytes gathered from however many buffers it spans into
//! one 64-byte aligned buffer.

use std::mem::MaybeUninit;

use arrow_buffer::{Buffer, MutableBuffer};

use super::framing::LengthPrefix;
use crate::base::error::{Error, Result};

/// Gathers the records of a subpartition's byte stream, each into one 64-byte aligned buffer
/// of exactly its length (the length prefix is not kept). Two ways in, freely mixed:
///
/// * [`RecordAssembler::push`] copies stream bytes in (a local channel's buffers, or the
///   length prefixes and small pieces of a remote one);
/// * [`RecordAssembler::body_spare`] and [`RecordAssembler::commit_body`] let a reader put
///   the body bytes of the record in progress straight where they belong, so a remote
///   channel's socket reads land in the record without a copy out of a segment.
pub struct RecordAssembler {
    prefix: LengthPrefix,
    /// The record being gathered and how long it will be.
    body: Option<(MutableBuffer, usize)>,
    /// Largest record accepted (guards against a corrupt length).
    max_record: usize,
}

impl RecordAssembler {
    /// An assembler accepting records up to `max_record` bytes.
    pub fn new(max_record: usize) -> RecordAssembler {
        RecordAssembler {
            prefix: LengthPrefix::default(),
            body: None,
            max_record,
        }
    }

    /// True when no record is partly gathered.
    pub fn is_at_record_boundary(&self) -> bool {
        self.prefix.filled == 0 && self.body.is_none()
    }

    /// Bytes of the length prefix still to come (0 while a body is being gathered).
    pub fn header_missing(&self) -> usize {
        if self.body.is_some() {
            0
        } else {
            self.prefix.missing()
        }
    }

    /// Bytes of the body in progress still to come (0 while a length prefix is expected).
    pub fn body_missing(&self) -> usize {
        self.body.as_ref().map_or(0, |(buf, want)| want - buf.len())
    }

    /// The space the next [`RecordAssembler::body_missing`] body bytes go into (empty while
    /// a length prefix is expected). Write a prefix of it, then call
    /// [`RecordAssembler::commit_body`].
    pub fn body_spare(&mut self) -> &mut [MaybeUninit<u8>] {
        let Some((buf, want)) = self.body.as_mut() else {
            return &mut [];
        };
        let (len, want) = (buf.len(), *want);
        debug_assert!(buf.capacity() >= want);
        // SAFETY: the buffer was allocated with capacity `want` and holds `len` bytes, so
        // `len..want` lies inside the allocation; `&mut self` makes this the only access, and
        // `MaybeUninit` allows the bytes to be uninitialized.
        unsafe {
            std::slice::from_raw_parts_mut(buf.as_mut_ptr().add(len).cast::<MaybeUninit<u8>>(), want - len)
        }
    }

    /// Marks the first `n` bytes of [`RecordAssembler::body_spare`] as written; returns the
    /// record if that completed it.
    ///
    /// # Safety
    /// The first `n` bytes of the slice `body_spare` returned must have been initialized,
    /// and `n` must not exceed [`RecordAssembler::body_missing`] (checked: panics).
    pub unsafe fn commit_body(&mut self, n: usize) -> Option<Buffer> {
        assert!(n <= self.body_missing(), "commit_body past the end of the record");
        let (buf, want) = self.body.as_mut()?;
        // SAFETY: the caller initialized these `n` bytes, within the capacity (checked above).
        unsafe { buf.set_len(buf.len() + n) };
        if buf.len() < *want {
            return None;
        }
        self.body.take().map(|(buf, _)| buf.into())
    }

    /// Feeds stream bytes (copied); each completed record's body is passed to `done`, in
    /// order. A length of 0 or over the maximum is a [`Error::Protocol`].
    pub fn push(&mut self, bytes: &[u8], done: impl FnMut(Buffer) -> Result<()>) -> Result<()> {
        self.push_checked(bytes, |_| Ok(()), done)
    }

    /// [`RecordAssembler::push`], asking `start` about each record's length once its prefix
    /// is complete and valid, before its body is allocated: an error from `start` stops there
    /// (the record is not started) and is returned.
    pub fn push_checked(
        &mut self,
        mut bytes: &[u8],
        mut start: impl FnMut(u64) -> Result<()>,
        mut done: impl FnMut(Buffer) -> Result<()>,
    ) -> Result<()> {
        while !bytes.is_empty() {
            match self.body.as_mut() {
                None => {
                    if let Some(len) = self.prefix.take(&mut bytes) {
                        if len > self.max_record as u64 || len == 0 {
                            return Err(Error::Protocol(format!(
                                "record length {len} outside 1..={} bytes",
                                self.max_record
                            )));
                        }
                        start(len)?;
                        self.body = Some((MutableBuffer::with_capacity(len as usize), len as usize));
                    }
                }
                Some((buf, want)) => {
                    let n = (*want - buf.len()).min(bytes.len());
                    buf.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if buf.len() == *want {
                        let (buf, _) = self.body.take().expect("body present");
                        done(buf.into())?;
                    }
                }
            }
        }
        Ok(())
    }
}
