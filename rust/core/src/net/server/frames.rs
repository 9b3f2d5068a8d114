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

/// Stream bytes still to send from one polled item, cut into payloads of at most `limit`
/// bytes: the negotiated size, or the buffer size the reader's gate announced when the item
/// was queued (buffer debloating).
pub(super) struct Cursor {
    pub(super) parts: VecDeque<Part>,
    pub(super) remaining: usize,
    pub(super) limit: usize,
    /// The handed-off batch whose segments account for the bytes; released with the last chunk.
    pub(super) hold: Option<LocalBatch>,
    pub(super) placement: Placement,
}

impl Cursor {
    pub(super) fn chunks(&self) -> usize {
        self.remaining.div_ceil(self.limit)
    }

    /// Bytes of the next chunk [`Cursor::take`] hands out.
    pub(super) fn next_len(&self) -> usize {
        self.remaining.min(self.limit)
    }

    /// The bytes of the next chunk [`Cursor::take`] hands out, without taking them.
    pub(super) fn peek(&self) -> impl Iterator<Item = &[u8]> {
        self.peek_chunk(0)
    }

    /// The bytes of the chunk `index` chunks after the next one (empty past the end).
    pub(super) fn peek_chunk(&self, index: usize) -> impl Iterator<Item = &[u8]> {
        let mut skip = index * self.limit;
        let mut left = self.remaining.saturating_sub(skip).min(self.limit);
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
        let limit = self.limit;
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
