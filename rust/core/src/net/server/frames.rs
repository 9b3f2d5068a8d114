//! What the sender loop writes: [`OutFrame`]s made of a header and payload [`Part`]s that
//! point into segments or Arrow buffers (never a copy of data bytes), and the [`Cursor`] that
//! cuts a polled item into payloads.

use std::collections::VecDeque;

use arrow_buffer::Buffer;

use crate::base::error::Result;
use crate::base::event::Event;
use crate::partition::buffer::BufferSlice;
use crate::partition::subpartition::LocalBatch;
use crate::protocol::wire::{self, Message};
use crate::serde::RECORD_HEADER_LEN;

/// Bytes of frames gathered into one vectored write.
pub(super) const MAX_WRITE_BYTES: usize = 1 << 20;
/// Frames gathered into one vectored write (stays well under `IOV_MAX`).
pub(super) const MAX_WRITE_FRAMES: usize = 128;

/// A piece of an outgoing payload; never a copy of data bytes.
#[derive(Clone)]
pub(super) enum Part {
    Slice(BufferSlice),
    Arrow(Buffer),
    Bytes(Vec<u8>),
}

impl Part {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Part::Slice(s) => s.as_slice(),
            Part::Arrow(b) => b.as_slice(),
            Part::Bytes(v) => v,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.bytes().len()
    }

    pub(super) fn split(self, at: usize) -> (Part, Part) {
        match self {
            Part::Slice(s) => (Part::Slice(s.sub(0..at)), Part::Slice(s.sub(at..s.len()))),
            Part::Arrow(b) => (Part::Arrow(b.slice_with_length(0, at)), Part::Arrow(b.slice(at))),
            Part::Bytes(mut v) => {
                let tail = v.split_off(at);
                (Part::Bytes(v), Part::Bytes(tail))
            }
        }
    }
}

/// Where an item's bytes travel: after each frame's header (inline), or placed whole in a
/// shared-memory link's heap, the frames naming their place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Placement {
    /// A handed-off record not sent from yet: placed in the heap at its first frame if the
    /// connection has one with room, else inline.
    Undecided,
    Inline,
    /// In the heap at `item` (`len` bytes), `sent` of them named by frames so far.
    Heap {
        item: u64,
        len: u64,
        sent: u64,
    },
}

/// Stream bytes still to send from one polled item, cut into payloads: at most `limit` bytes
/// (the negotiated size, or the buffer size the reader's gate announced when the item was
/// queued: buffer debloating), except that once a handed-off record's length prefix has gone,
/// the rest of its body goes in payloads of up to `bulk` bytes. Those lie wholly inside the
/// record, so the receiver reads them straight into it with as few system calls as the socket
/// allows; the one that completes the record takes a credit like any buffer that completes
/// one, the others none (record body buffers).
pub(super) struct Cursor {
    pub(super) parts: VecDeque<Part>,
    pub(super) remaining: usize,
    pub(super) limit: usize,
    /// The longest payload inside the record's body (`limit` for an item that is not one whole
    /// record, a segment of a serialized stream).
    pub(super) bulk: usize,
    /// Bytes of the item taken so far.
    pub(super) taken: usize,
    /// The handed-off batch whose segments account for the bytes; released with the last chunk.
    pub(super) hold: Option<LocalBatch>,
    pub(super) placement: Placement,
}

impl Cursor {
    /// A cursor over a segment's bytes (any part of a serialized stream).
    pub(super) fn slice(parts: VecDeque<Part>, limit: usize) -> Cursor {
        let remaining = parts.iter().map(Part::len).sum();
        Cursor {
            parts,
            remaining,
            limit,
            bulk: limit,
            taken: 0,
            hold: None,
            placement: Placement::Inline,
        }
    }

    /// A cursor over one whole record (a handed-off batch encoded for the wire): its body
    /// goes in bulk payloads after the first, unless the reader's gate asked for smaller
    /// buffers than `negotiated` (buffer debloating: then every payload is cut at `limit`).
    pub(super) fn record(parts: VecDeque<Part>, limit: usize, negotiated: usize, hold: LocalBatch) -> Cursor {
        let bulk = if limit < negotiated {
            limit
        } else {
            limit.max(wire::MAX_BULK_PAYLOAD)
        };
        Cursor {
            bulk,
            hold: Some(hold),
            placement: Placement::Undecided,
            ..Cursor::slice(parts, limit)
        }
    }

    /// The length of the chunk after `taken` bytes, with `remaining` left.
    fn chunk_len(&self, taken: usize, remaining: usize) -> usize {
        let max = if taken >= RECORD_HEADER_LEN {
            self.bulk
        } else {
            self.limit
        };
        remaining.min(max)
    }

    /// The rest in one chunk (a record placed in shared memory: the frame names its place).
    pub(super) fn rest_in_one(&mut self) {
        self.limit = self.remaining.max(1);
        self.bulk = self.limit;
    }

    /// Where each chunk still to take starts, relative to the next one, and its length.
    fn chunk_spans(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let (mut at, mut left) = (0, self.remaining);
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            let n = self.chunk_len(self.taken + at, left);
            let span = (at, n);
            at += n;
            left -= n;
            Some(span)
        })
    }

    /// Chunks still to take.
    pub(super) fn chunks(&self) -> usize {
        self.chunk_spans().count()
    }

    /// Bytes of the next chunk [`Cursor::take`] hands out.
    pub(super) fn next_len(&self) -> usize {
        self.chunk_len(self.taken, self.remaining)
    }

    /// The bytes of the next chunk [`Cursor::take`] hands out, without taking them.
    pub(super) fn peek(&self) -> impl Iterator<Item = &[u8]> {
        self.peek_chunk(0)
    }

    /// The bytes of the chunk `index` chunks after the next one (empty past the end).
    pub(super) fn peek_chunk(&self, index: usize) -> impl Iterator<Item = &[u8]> {
        let (mut skip, mut left) = self.chunk_spans().nth(index).unwrap_or((self.remaining, 0));
        self.parts.iter().filter_map(move |p| {
            let bytes = p.bytes();
            if skip >= bytes.len() {
                skip -= bytes.len();
                return None;
            }
            if left == 0 {
                return None;
            }
            let from = std::mem::take(&mut skip);
            let n = (bytes.len() - from).min(left);
            left -= n;
            Some(&bytes[from..from + n])
        })
    }

    pub(super) fn take(&mut self) -> (Vec<Part>, usize) {
        let limit = self.next_len();
        let mut out = Vec::new();
        let mut n = 0;
        while n < limit {
            let Some(front) = self.parts.pop_front() else {
                break;
            };
            let len = front.len();
            if n + len <= limit {
                n += len;
                out.push(front);
            } else {
                let (head, tail) = front.split(limit - n);
                n = limit;
                out.push(head);
                self.parts.push_front(tail);
            }
        }
        self.remaining -= n;
        self.taken += n;
        (out, n)
    }
}

pub(super) enum Item {
    Data(Cursor),
    Event(Event),
}

/// One frame ready to write.
pub(super) struct OutFrame {
    pub(super) head: Vec<u8>,
    pub(super) parts: Vec<Part>,
    pub(super) _hold: Option<LocalBatch>,
}

impl OutFrame {
    pub(super) fn control(msg: &Message<'_>) -> Result<OutFrame> {
        // Room for every fixed-size message (a SharedBuffer is 58 bytes) without a regrowth.
        let mut head = Vec::with_capacity(64);
        wire::encode(msg, &mut head)?;
        Ok(OutFrame {
            head,
            parts: Vec::new(),
            _hold: None,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.head.len() + self.parts.iter().map(Part::len).sum::<usize>()
    }
}
