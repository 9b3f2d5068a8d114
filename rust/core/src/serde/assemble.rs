//! [`RecordAssembler`]: a record's bytes gathered from however many buffers it spans into
//! one 64-byte aligned buffer.

use std::mem::MaybeUninit;

use arrow_buffer::Buffer;

use super::framing::LengthPrefix;
use crate::base::error::{Error, Result};
use crate::memory::{RecordBuf, RecordPool};

/// Gathers the records of a subpartition's byte stream, each into one 64-byte aligned buffer
/// of exactly its length (the length prefix is not kept), taken from a [`RecordPool`]. Three
/// ways in, freely mixed:
///
/// * [`RecordAssembler::push`] copies stream bytes in (a local channel's buffers, or the
///   length prefixes and small pieces of a remote one);
/// * [`RecordAssembler::body_spare`] and [`RecordAssembler::commit_body`] let a reader put
///   the body bytes of the record in progress straight where they belong, so a remote
///   channel's socket reads land in the record without a copy out of a segment;
/// * [`RecordAssembler::push_shared`] takes stream bytes that stay where they are (a
///   shared-memory link's heap): a record that lies whole in them is not copied at all.
pub struct RecordAssembler {
    prefix: LengthPrefix,
    /// The record being gathered.
    body: Option<Body>,
    /// Largest record accepted (guards against a corrupt length).
    max_record: usize,
    /// Where record buffers come from (and go back to once the batches over them are dropped).
    pool: RecordPool,
}

/// A record in progress.
enum Body {
    /// Copied into a buffer of its own.
    Own(RecordBuf),
    /// Already where it lies (shared memory): the whole record, of which `have` bytes have
    /// arrived in the stream so far.
    Shared { buf: Buffer, have: usize },
}

fn shared_misplaced() -> Error {
    Error::Protocol("a record placed in shared memory continues somewhere else".into())
}

impl RecordAssembler {
    /// An assembler accepting records up to `max_record` bytes, each in a fresh allocation.
    pub fn new(max_record: usize) -> RecordAssembler {
        RecordAssembler::with_pool(max_record, RecordPool::new(0))
    }

    /// An assembler accepting records up to `max_record` bytes, gathered into `pool`'s blocks.
    pub fn with_pool(max_record: usize, pool: RecordPool) -> RecordAssembler {
        RecordAssembler {
            prefix: LengthPrefix::default(),
            body: None,
            max_record,
            pool,
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
        match &self.body {
            None => 0,
            Some(Body::Own(buf)) => buf.missing(),
            Some(Body::Shared { buf, have }) => buf.len() - have,
        }
    }

    /// True while the record in progress lies in shared memory (its bytes come only through
    /// [`RecordAssembler::push_shared`]).
    pub fn is_shared(&self) -> bool {
        matches!(self.body, Some(Body::Shared { .. }))
    }

    /// The space the next [`RecordAssembler::body_missing`] body bytes go into (empty while
    /// a length prefix is expected or the record is shared). Write a prefix of it, then call
    /// [`RecordAssembler::commit_body`].
    pub fn body_spare(&mut self) -> &mut [MaybeUninit<u8>] {
        match self.body.as_mut() {
            Some(Body::Own(buf)) => buf.spare(),
            _ => &mut [],
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
        let Some(Body::Own(buf)) = self.body.as_mut() else {
            assert_eq!(n, 0, "commit_body of a shared record");
            return None;
        };
        // SAFETY: the caller initialized these `n` bytes, within the record (checked above).
        unsafe { buf.commit(n) };
        if buf.missing() > 0 {
            return None;
        }
        match self.body.take() {
            Some(Body::Own(buf)) => Some(buf.freeze()),
            _ => unreachable!("an own body"),
        }
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
        done: impl FnMut(Buffer) -> Result<()>,
    ) -> Result<()> {
        self.push_shared(&mut bytes, |_, _| None, &mut start, done)
    }

    /// Feeds stream bytes that stay where they are (a shared-memory link's heap, which holds
    /// the rest of the stream's item after them). When a length prefix completes at
    /// `bytes[at..]`, `adopt(at, len)` may return the record's `len` bytes in place (a buffer
    /// over that same memory, holding it valid); the record is then not copied, and the bytes
    /// that follow, in this call and later ones, must be exactly its next ones. Otherwise as
    /// [`RecordAssembler::push_checked`].
    pub fn push_shared(
        &mut self,
        bytes: &mut &[u8],
        mut adopt: impl FnMut(usize, usize) -> Option<Buffer>,
        mut start: impl FnMut(u64) -> Result<()>,
        mut done: impl FnMut(Buffer) -> Result<()>,
    ) -> Result<()> {
        let base = bytes.as_ptr() as usize;
        while !bytes.is_empty() {
            match self.body.as_mut() {
                None => {
                    if let Some(len) = self.prefix.take(bytes) {
                        if len > self.max_record as u64 || len == 0 {
                            return Err(Error::Protocol(format!(
                                "record length {len} outside 1..={} bytes",
                                self.max_record
                            )));
                        }
                        start(len)?;
                        let len = len as usize;
                        let at = bytes.as_ptr() as usize - base;
                        self.body = Some(match adopt(at, len) {
                            Some(buf) if buf.len() == len && buf.as_ptr() == bytes.as_ptr() => {
                                Body::Shared { buf, have: 0 }
                            }
                            Some(_) => return Err(shared_misplaced()),
                            None => Body::Own(self.pool.take(len)),
                        });
                    }
                }
                Some(Body::Own(buf)) => {
                    let n = buf.missing().min(bytes.len());
                    buf.extend_from_slice(&bytes[..n]);
                    *bytes = &bytes[n..];
                    if buf.missing() == 0 {
                        let Some(Body::Own(buf)) = self.body.take() else {
                            unreachable!("an own body")
                        };
                        done(buf.freeze())?;
                    }
                }
                Some(Body::Shared { buf, have }) => {
                    // Not a copy: the bytes must be the record's own, where it lies.
                    if bytes.as_ptr() != buf.as_ptr().wrapping_add(*have) {
                        return Err(shared_misplaced());
                    }
                    let n = (buf.len() - *have).min(bytes.len());
                    *have += n;
                    *bytes = &bytes[n..];
                    if *have == buf.len() {
                        let Some(Body::Shared { buf, .. }) = self.body.take() else {
                            unreachable!("a shared body")
                        };
                        done(buf)?;
                    }
                }
            }
        }
        Ok(())
    }
}
