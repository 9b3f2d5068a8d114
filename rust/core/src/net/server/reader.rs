//! [`SubReader`]: one requested subpartition (Flink's
//! `CreditBasedSequenceNumberingViewReader`): its queue of items to send, its credit and
//! where its records stand.

use std::collections::VecDeque;
use std::sync::Arc;

use super::frames::{Cursor, Item, Part};
use crate::base::error::Result;
use crate::base::event::Event;
use crate::partition::subpartition::{Polled, Subpartition};
use crate::partition::ResultPartition;
use crate::protocol::credit::{QueueHead, SenderCredit};
use crate::serde::{BatchEncoder, Compression, RecordFraming, SelfContainedDecoder, RECORD_HEADER_LEN};

/// One requested subpartition (Flink: `CreditBasedSequenceNumberingViewReader`).
pub(super) struct SubReader {
    pub(super) partition: Arc<ResultPartition>,
    pub(super) sub: Arc<Subpartition>,
    pub(super) credit: SenderCredit,
    pub(super) queue: VecDeque<Item>,
    /// Data buffers (payload chunks) in `queue`: the backlog.
    pub(super) chunks: usize,
    /// Encodes handed-off batches for the wire (their first record carries the schema).
    pub(super) encoder: Option<BatchEncoder>,
    /// IPC body compression of `encoder` (the environment's `wire_compression`).
    pub(super) compression: Option<Compression>,
    /// Decodes the pieces a host service queued undecoded, to encode them for the wire.
    pub(super) pieces: SelfContainedDecoder,
    /// The records of the payloads sent so far: which next chunk is a record body buffer
    /// (needs no credit, see [`crate::protocol::credit`]).
    pub(super) framing: RecordFraming,
    /// The last event was queued; the subpartition is read to its end.
    pub(super) drained: bool,
    /// An aligned checkpoint barrier was queued: the subpartition is not read until the
    /// receiver sends ResumeConsumption (Flink's blocking upstream during alignment).
    pub(super) paused: bool,
    /// The record start after the one last sent was looked for (and announced if its grant
    /// did not cover it); looked for again after the next record starts.
    pub(super) looked_ahead: bool,
}

impl SubReader {
    /// Moves everything readable from the subpartition into the queue, to be sent in
    /// payloads of at most `limit` bytes (or the subpartition's debloated buffer size).
    pub(super) fn fill(&mut self, negotiated: usize) -> Result<()> {
        let limit = self.sub.buffer_size(negotiated);
        while !self.drained && !self.paused {
            let Some(polled) = self.sub.poll() else { break };
            let item = match polled {
                Polled::Data(slice) => Item::Data(Cursor::slice(VecDeque::from([Part::Slice(slice)]), limit)),
                Polled::Batch(lb) => {
                    let batch = lb.batch.clone().decode(&mut self.pieces)?;
                    let encoder = match self.encoder.as_mut() {
                        Some(e) => e,
                        None => self.encoder.insert(BatchEncoder::with_compression(
                            batch.schema_ref(),
                            self.compression,
                        )?),
                    };
                    let record = encoder.encode(&batch)?;
                    let (header, parts) = record.into_parts();
                    let mut all = VecDeque::with_capacity(parts.len() + 1);
                    all.push_back(Part::Bytes(header.to_vec()));
                    all.extend(parts.into_iter().filter(|p| !p.is_empty()).map(Part::Arrow));
                    let cursor = Cursor::record(all, limit, negotiated, lb);
                    debug_assert!(cursor.remaining >= RECORD_HEADER_LEN);
                    Item::Data(cursor)
                }
                Polled::Event(e) => {
                    self.drained = e.is_end();
                    match e {
                        Event::Barrier { unaligned: false, .. } => self.paused = true,
                        Event::Barrier { unaligned: true, .. } => {
                            // It overtakes everything queued here too (it needs no credit;
                            // between two chunks of a record is fine, the payload is a stream),
                            // but not an earlier unaligned barrier still waiting to go.
                            let at = self
                                .queue
                                .iter()
                                .position(|i| {
                                    !matches!(i, Item::Event(Event::Barrier { unaligned: true, .. }))
                                })
                                .unwrap_or(self.queue.len());
                            self.queue.insert(at, Item::Event(e));
                            continue;
                        }
                        _ => {}
                    }
                    Item::Event(e)
                }
            };
            if let Item::Data(c) = &item {
                self.chunks += c.chunks();
            }
            self.queue.push_back(item);
        }
        Ok(())
    }

    pub(super) fn head(&self) -> QueueHead {
        match self.queue.front() {
            None => QueueHead::Empty,
            Some(Item::Data(c)) if self.framing.is_record_body(c.next_len()) => QueueHead::RecordBody,
            Some(Item::Data(_)) => QueueHead::Data,
            Some(Item::Event(_)) => QueueHead::Event,
        }
    }

    /// The record bytes the head buffer starts (the lengths of the records whose length
    /// prefixes it completes): 0 unless the head is a data buffer that needs credit.
    pub(super) fn record_starts(&self, head: QueueHead) -> u64 {
        match (head, self.queue.front()) {
            (QueueHead::Data, Some(Item::Data(c))) => self.framing.starts(c.peek()),
            _ => 0,
        }
    }

    /// The record bytes of the first queued buffer that starts records, if any: announced
    /// ahead (while the buffers before it go out) so that its grant's round trip overlaps
    /// them. The same buffer, once at the head, needs exactly these bytes.
    pub(super) fn next_record_starts(&self) -> u64 {
        let mut framing = self.framing.clone();
        for item in &self.queue {
            let c = match item {
                Item::Data(c) => c,
                // Not past an aligned barrier: what follows it waits for the alignment, and a
                // grant held for it could keep the channels the gate waits for from starting
                // the records before their barriers.
                Item::Event(Event::Barrier { unaligned: false, .. }) => return 0,
                Item::Event(_) => continue,
            };
            for chunk in 0..c.chunks() {
                let starts = c
                    .peek_chunk(chunk)
                    .map(|p| framing.advance(p))
                    .fold(0u64, u64::saturating_add);
                if starts > 0 {
                    return starts;
                }
            }
        }
        0
    }

    /// Whether the reader can send its head now: credit for it, and the record bytes it
    /// starts granted.
    pub(super) fn is_available(&self) -> bool {
        let head = self.head();
        self.credit.is_available(head) && self.credit.can_start_records(self.record_starts(head))
    }

    /// Shows the sender's credit in the subpartition's metrics.
    pub(super) fn publish_credit(&self) {
        if let Some(stats) = self.sub.remote_reader() {
            stats.set_credit(u64::from(self.credit.credit().get()));
        }
    }

    /// Data buffers to announce. While paused after an aligned barrier, what waits in the
    /// subpartition is not announced: the receiver must not lend this channel floating
    /// buffers that the channels it still waits for need to deliver their barriers.
    pub(super) fn backlog(&self) -> u32 {
        let waiting = if self.paused { 0 } else { self.sub.backlog() };
        self.chunks.saturating_add(waiting).min(u32::MAX as usize) as u32
    }
}
