//! The hand-off path of a [`ResultPartition`]: a whole batch, or a piece still encoded, is
//! queued in its subpartition holding as many segments of the partition's pool as its bytes
//! need (fewer bytes per segment once a reader debloated); all of a write's pieces or none.

use super::{Handoff, ResultPartition};
use crate::base::error::{Error, Result};
use crate::base::wait::Wait;
use crate::memory::Reservation;
use crate::partition::handed::{EncodedPiece, Handed};
use crate::partition::partitioner::Piece;
use crate::partition::subpartition::{Entry, LocalBatch, Token};

impl ResultPartition {
    /// Hands a write's pieces over, waiting with `wait` for the segments they count as.
    pub(super) fn write_handoff(
        &self,
        pieces: Vec<Piece>,
        token: Option<Token>,
        wait: &mut Wait<'_>,
    ) -> Result<()> {
        self.hand_over(pieces.into_iter().map(Handing::from).collect(), token, wait)
    }

    /// Reserves what `items` need (waiting with `wait`), then queues them.
    fn hand_over(&self, items: Vec<Handing>, token: Option<Token>, wait: &mut Wait<'_>) -> Result<()> {
        let needs = self.handoff_needs(&items);
        let total: usize = needs.iter().sum();
        let segments = match self.pool.try_reserve(total) {
            Some(s) => s,
            None => {
                let _blocked = self.metrics.backpressure.start();
                self.pool.reserve(total, wait)?
            }
        };
        self.queue_handoff(items, token, segments, needs);
        Ok(())
    }

    /// Queues `piece` whole in subpartition `sp` without decoding it, waiting with `wait` for
    /// room: for a partition that hands batches over ([`ResultPartition::writes_whole`]),
    /// whose local readers then get it as it is (a relay passes it on; a gate decodes it).
    pub(crate) fn write_encoded(
        &self,
        sp: usize,
        piece: EncodedPiece,
        token: Option<Token>,
        wait: &mut Wait<'_>,
    ) -> Result<()> {
        let item = self.encoded_item(sp, piece)?;
        self.hand_over(vec![item], token, wait)?;
        self.after_write()
    }

    /// [`ResultPartition::write_encoded`] if the pool has room now: `true` once queued,
    /// `false` when nothing was (no room).
    pub(crate) fn try_write_encoded(
        &self,
        sp: usize,
        piece: EncodedPiece,
        token: Option<Token>,
    ) -> Result<bool> {
        let item = self.encoded_item(sp, piece)?;
        self.try_hand_over(vec![item], token)
    }

    fn encoded_item(&self, sp: usize, piece: EncodedPiece) -> Result<Handing> {
        self.check_writable()?;
        if !self.writes_whole() {
            return Err(Error::InvalidArgument(format!(
                "partition {:?} stores or serializes its batches: an encoded piece is handed only \
                 to a partition that hands batches over",
                self.id
            )));
        }
        self.check_schema_of(piece.schema())?;
        Ok(Handing::new(sp, Handed::Piece(piece), true))
    }

    /// Writes pieces already split by a partitioner if that needs no wait: all of them are
    /// queued (`true`), or none (`false`: the pool has no room now, or the partition is one
    /// whose writes are not all-or-nothing, a spillable or serializing one, which a caller
    /// writes with [`ResultPartition::write_pieces`] instead).
    pub(crate) fn try_write_pieces(&self, pieces: Vec<Piece>, token: Option<Token>) -> Result<bool> {
        self.check_writable()?;
        if !self.writes_whole() {
            return Ok(false);
        }
        self.try_hand_over(pieces.into_iter().map(Handing::from).collect(), token)
    }

    fn try_hand_over(&self, items: Vec<Handing>, token: Option<Token>) -> Result<bool> {
        let needs = self.handoff_needs(&items);
        let Some(segments) = self.pool.try_reserve(needs.iter().sum()) else {
            return Ok(false);
        };
        self.queue_handoff(items, token, segments, needs);
        self.after_write()?;
        Ok(true)
    }

    /// Whether a write queues all its pieces or none, waiting only before it starts (a
    /// pipelined partition that hands batches over); a spillable or serializing partition's
    /// write may wait part-way.
    pub(crate) fn writes_whole(&self) -> bool {
        self.spill.is_none() && matches!(self.handoff, Handoff::Batch)
    }

    /// Per piece, its bytes and the segments it counts as: segments, or fewer bytes each when
    /// the reader's gate announced a smaller buffer size (debloating), so that the bytes a
    /// subpartition queues shrink with the buffer size as in Flink.
    fn handoff_needs(&self, items: &[Handing]) -> Vec<usize> {
        let seg = self.pool.segment_size();
        items
            .iter()
            .map(|h| h.bytes.div_ceil(self.subpartitions[h.sp].buffer_size(seg)).max(1))
            .collect()
    }

    /// Queues the items, each holding its share of `segments`.
    fn queue_handoff(
        &self,
        items: Vec<Handing>,
        token: Option<Token>,
        mut segments: Reservation,
        needs: Vec<usize>,
    ) {
        for (
            Handing {
                sp,
                batch,
                whole,
                bytes,
            },
            need,
        ) in items.into_iter().zip(needs)
        {
            let take = need.min(segments.len());
            let held = segments.split_off(take);
            self.metrics.batches.add(1);
            self.metrics.buffers.add(1);
            self.metrics.bytes.add(bytes as u64);
            self.metrics.rows.add(batch.num_rows() as u64);
            let token = if whole { token.clone() } else { None };
            self.subpartitions[sp].add_finished(Entry::Batch(LocalBatch {
                token,
                batch,
                bytes,
                segments: held,
            }));
        }
    }
}

/// A whole batch to queue in subpartition `sp`, and the bytes it counts as.
struct Handing {
    sp: usize,
    batch: Handed,
    /// The writer's whole input batch (the write's token travels with it).
    whole: bool,
    bytes: usize,
}

impl Handing {
    fn new(sp: usize, batch: Handed, whole: bool) -> Handing {
        let bytes = batch.bytes();
        Handing {
            sp,
            batch,
            whole,
            bytes,
        }
    }
}

impl From<Piece> for Handing {
    fn from(p: Piece) -> Handing {
        Handing::new(p.subpartition, Handed::Batch(p.batch), p.whole)
    }
}
