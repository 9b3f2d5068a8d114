//! What a gate yields: [`GateItem`] to its reader, [`Relayed`] to the host service, which passes
//! pieces on undecoded.

use arrow_array::RecordBatch;

use crate::partition::subpartition::Token;
use crate::partition::EncodedPiece;

/// What [`crate::gate::InputGate::next_item`] yields.
#[derive(Debug)]
pub enum GateItem {
    /// A batch.
    Batch {
        /// The channel it came from.
        channel: usize,
        /// The batch.
        batch: RecordBatch,
        /// The writer's token if the batch is the writer's whole input batch handed over
        /// locally.
        token: Option<Token>,
        /// The unaligned checkpoints this batch is in-flight data of: it was written before
        /// their barrier and reaches the reader after it (usually empty; see
        /// [`crate::protocol::checkpoint::InFlight`]).
        in_flight: Vec<u64>,
    },
    /// A user event.
    Event {
        /// The channel it came from.
        channel: usize,
        /// The bytes the writer sent.
        payload: Vec<u8>,
    },
    /// Checkpoint barrier `checkpoint_id`: aligned, after every channel not ended delivered
    /// it; unaligned, as soon as the first channel delivered it.
    Barrier {
        /// The checkpoint id.
        checkpoint_id: u64,
        /// Whether it is an unaligned barrier.
        unaligned: bool,
    },
    /// The alignment of checkpoint `checkpoint_id` was abandoned because a barrier with a
    /// higher id arrived first; its barrier will not be yielded.
    CheckpointAborted {
        /// The checkpoint id.
        checkpoint_id: u64,
    },
}

/// What a gate yields to a relay (the host service): an item, or a piece a writer's link
/// queued undecoded, to be passed on as it is.
pub(crate) enum Relayed {
    Item(GateItem),
    Piece {
        channel: usize,
        piece: EncodedPiece,
        token: Option<Token>,
        in_flight: Vec<u64>,
    },
}
