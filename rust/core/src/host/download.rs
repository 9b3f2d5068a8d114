//! The service's side of a gate's link: a task on the service's runtime that takes the gate's
//! items and puts them on the link, a batch as a record of its channel's stream. When the link
//! is full the task waits and takes nothing more from the gate, whose channels then stop getting
//! credit: the task's pace reaches the producers. The gate closes when the task drops its end
//! (or goes), or the service ends.
//!
//! The gates of every attached task are served by the runtime's few threads, not a thread
//! each: a gate is polled, and when nothing is ready its task sleeps until the gate's ready
//! listener wakes it. A writer that queues a batch's pieces for several gates then wakes one
//! thread, not one per gate; on a host whose cores are all busy each wake-up costs a switch.
//!
//! A batch that is a piece lying in a writer link's heap ([`InHeap`]) is not copied: the task
//! gets that heap (once per writer link, over the link's heaps connection) and a frame naming
//! the piece, reads it where it lies and frees its chunks when done with it; what it never
//! frees (it let the gate go before reading them, or died holding them) this side frees once
//! it can tell ([`Handed`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::runtime::Handle;
use tokio::sync::Notify;

use super::codec::{RecordHead, Signal};
use super::handed::Handed;
use super::link::{self, HeapEnd, InHeap, LinkEnd, Watched};
use super::process::Process;
use super::records::{encoded_piece, small, Frame, RecordSender};
use super::state::SentCounters;
use crate::base::error::Result;
use crate::base::wait::CHECK_INTERVAL;
use crate::gate::{GateItem, InputGate, Relayed};
use crate::net::shm::{HeapWriter, ShmWriter};
use crate::partition::subpartition::Token;

/// Runs a gate's link until the gate ends, the task (`task`) drops it or goes, or the service
/// ends; then leaves a watch on the pieces handed to the task in place until each is freed.
pub(crate) async fn run(
    mut gate: InputGate,
    end: LinkEnd,
    task: Process,
    sent: Arc<SentCounters>,
    stop: [Arc<AtomicBool>; 2],
) {
    let mut link = Watched::new(end, &Handle::current(), stop);
    let (HeapEnd::Writer(heap), Some(table)) = (&link.heap, link.table.take()) else {
        log::warn!("creditflow: host service: a gate's link with the wrong heap side or no table");
        return;
    };
    let stops = link.stops();
    let stopped = || stops.iter().any(|f| f.load(Ordering::SeqCst));
    let ready = Arc::new(Notify::new());
    {
        let ready = ready.clone();
        gate.set_ready_listener(Arc::new(move || ready.notify_one()));
    }
    let mut framer = Framer {
        sent: &sent,
        heaps: link.heaps.as_ref(),
        heap,
        sender: RecordSender::new(None),
        given: HashSet::new(),
        handed: Handed::new(table),
    };
    // Errors in a row: a channel's failure ends that channel, so more than one per channel
    // without anything else between means the gate is stuck failing.
    let mut errors = 0usize;
    let limit = gate.num_channels() + 1;
    while let Some(next) = next_item(&mut gate, &ready, &stopped).await {
        let (frame, last) = match next {
            Ok(None) => (small(Signal::End.encode()), true),
            Ok(Some(item)) => {
                errors = 0;
                framer.frame(item).await
            }
            Err(_) if stopped() => break,
            Err(e) => {
                errors += 1;
                (small(Signal::Error(e).encode()), errors > limit)
            }
        };
        if !write_frame(&mut link.writer, &frame, &stopped).await || last {
            break;
        }
    }
    gate.close();
    // Closes the ring: the task reads what is in it (the end), then end-of-stream.
    let _ = link.writer.shutdown().await;
    let mut handed = framer.handed;
    if handed.outstanding() > 0 {
        // Watched while the link is: its doorbell tells when the task's end is gone.
        let stops = link.stops();
        tokio::spawn(async move {
            handed.settle(task, stops, sent).await;
            drop(link);
        });
    }
}

/// The gate's next item (`None` inside: its end) or failure, waiting for one without holding
/// a thread; `None` once the link is stopped.
async fn next_item(
    gate: &mut InputGate,
    ready: &Notify,
    stopped: &impl Fn() -> bool,
) -> Option<Result<Option<Relayed>>> {
    loop {
        if stopped() {
            return None;
        }
        match gate.try_next_relayed() {
            Ok(Some(item)) => return Some(Ok(item)),
            Ok(None) => {
                // A push after the poll above left a permit: this returns at once.
                let slice = gate
                    .retry_due_in()
                    .map_or(CHECK_INTERVAL, |d| d.min(CHECK_INTERVAL));
                let _ = tokio::time::timeout(slice, ready.notified()).await;
            }
            Err(e) => return Some(Err(e)),
        }
    }
}

/// Makes the frames that carry a gate's items to its task.
struct Framer<'a> {
    sent: &'a SentCounters,
    /// The connection writer links' heaps go to the task over (none: every batch is copied).
    heaps: Option<&'a UnixStream>,
    /// The link's own heap, where copied records go.
    heap: &'a HeapWriter,
    sender: RecordSender,
    /// Writer links whose heaps the task has been given.
    given: HashSet<u64>,
    /// The pieces handed to the task in place.
    handed: Handed,
}

impl Framer<'_> {
    /// The frame that carries `item`, and whether it is the link's last (a batch that
    /// cannot be encoded ends the link with its error).
    async fn frame(&mut self, item: Relayed) -> (Frame, bool) {
        match item {
            Relayed::Piece {
                channel,
                piece,
                token,
                in_flight,
            } => {
                let head = RecordHead {
                    channel: channel as u32,
                    in_flight,
                };
                let forwarded = self.forward(&head, &token).await;
                match counted(self.sent, forwarded) {
                    Some(f) => (f, false),
                    None => (encoded_piece(head, piece.record(), self.heap), false),
                }
            }
            Relayed::Item(GateItem::Batch {
                channel,
                batch,
                in_flight,
                token,
            }) => {
                let head = RecordHead {
                    channel: channel as u32,
                    in_flight,
                };
                let forwarded = self.forward(&head, &token).await;
                let frame = match counted(self.sent, forwarded) {
                    Some(f) => Ok(f),
                    None => self.sender.frame(head, &batch, self.heap),
                };
                match frame {
                    Ok(f) => (f, false),
                    Err(e) => (small(Signal::Error(e).encode()), true),
                }
            }
            Relayed::Item(GateItem::Event { channel, payload }) => {
                let s = Signal::Event {
                    target: Some(channel as u32),
                    payload,
                };
                (small(s.encode()), false)
            }
            Relayed::Item(GateItem::Barrier {
                checkpoint_id,
                unaligned,
            }) => {
                let s = Signal::Barrier {
                    id: checkpoint_id,
                    unaligned,
                };
                (small(s.encode()), false)
            }
            Relayed::Item(GateItem::CheckpointAborted { checkpoint_id }) => {
                (small(Signal::Aborted { id: checkpoint_id }.encode()), false)
            }
        }
    }

    /// The frame that hands a piece lying in a writer link's heap ([`InHeap`]) on as it lies,
    /// giving the task that heap first if it has not had it; `None` when the batch is not such
    /// a piece, the heap cannot be given or no slot is free to track the piece.
    async fn forward(&mut self, head: &RecordHead, token: &Option<Token>) -> Option<Frame> {
        let piece = token.as_ref()?.downcast_ref::<InHeap>()?;
        let heaps = self.heaps?;
        let source = &piece.source;
        if !self.given.contains(&source.link) {
            source.send(heaps).await.ok()?;
            self.given.insert(source.link);
        }
        let forwarded = self.handed.hand(source.link, &piece.lease)?;
        Some(small(head.forward(&forwarded)))
    }
}

/// Counts a batch sent on as `forwarded` says: in place, or copied (`None`: the caller copies).
fn counted(sent: &SentCounters, forwarded: Option<Frame>) -> Option<Frame> {
    let how = if forwarded.is_some() {
        &sent.in_place
    } else {
        &sent.copied
    };
    how.fetch_add(1, Ordering::Relaxed);
    forwarded
}

/// Writes `frame` on the link, waiting while the ring or the heap is full; `false` when the
/// write failed or a stop came meanwhile (the task went, or the service ends).
async fn write_frame(writer: &mut ShmWriter, frame: &Frame, stopped: &impl Fn() -> bool) -> bool {
    let check = || if stopped() { Err(()) } else { Ok(()) };
    matches!(
        link::until_stopped(link::write_all(writer, frame), check).await,
        Ok(Ok(()))
    )
}
