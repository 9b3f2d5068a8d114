//! [`AttachedGate`]: an `InputGate` that lives in the host service. The service takes the
//! gate's items and puts them on the gate's link; here, the link's I/O task reads frames into
//! a short queue (a record's bytes into a block of the record pool, or a lease on the heap
//! where the service placed it, or in a writer link's heap that the service handed over) and
//! the caller's thread decodes them in `next_item`.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::net::UnixStream;
use tokio::sync::mpsc;

use super::client::{gate_metrics, Session};
use super::codec::Signal;
use super::link::{HeapEnd, LinkEnd, SourceHeap};
use super::records::{heap_record, read_incoming, Incoming, RecordReceiver};
use super::runtime::block_on;
use crate::base::config::ChannelSpec;
use crate::base::error::{Error, Result};
use crate::base::wait::Wait;
use crate::gate::{GateItem, GateMetrics};
use crate::memory::RecordPool;
use crate::net::shm::HeapReader;
use crate::serde::SelfContainedDecoder;

/// Frames read ahead of the caller, at most (the link's ring and heap hold more).
const READ_AHEAD: usize = 2;
/// The most bytes one record may have (as a gate's `max_record_size` default).
const MAX_RECORD: usize = 2 << 30;
/// Idle record blocks the link keeps for the next records, at most.
const RECORD_POOL: usize = 16 << 20;

/// Reads the items of a gate the host service holds.
pub struct AttachedGate {
    session: Arc<Session>,
    link: u64,
    specs: Vec<ChannelSpec>,
    items: mpsc::Receiver<Result<Incoming>>,
    records: RecordReceiver,
    pieces: SelfContainedDecoder,
    ended: bool,
    closed: bool,
    io: tokio::task::JoinHandle<()>,
}

impl Drop for AttachedGate {
    fn drop(&mut self) {
        // Ends the link: the service closes the gate, its producers are no longer held back.
        self.io.abort();
    }
}

impl AttachedGate {
    pub(crate) fn start(
        session: Arc<Session>,
        link: u64,
        specs: Vec<ChannelSpec>,
        end: LinkEnd,
    ) -> Result<AttachedGate> {
        let LinkEnd {
            mut reader,
            writer,
            heap,
            bell: _,
            heaps,
        } = end;
        let HeapEnd::Reader(heap) = heap else {
            return Err(Error::Protocol("a gate's link whose heap the task writes".into()));
        };
        let heaps = heaps.ok_or_else(|| Error::Protocol("a gate's link without its heaps".into()))?;
        let (tx, items) = mpsc::channel(READ_AHEAD);
        let lost = {
            let s = session.clone();
            move |why: String| s.lost(&why)
        };
        let io = session.handle.spawn(async move {
            // The ring back stays open while the gate does: its end tells the service.
            let _writer = writer;
            let pool = RecordPool::new(RECORD_POOL);
            let mut sources = Sources::new(heaps);
            loop {
                let next = match read_incoming(&mut reader, Some(&heap), &pool, MAX_RECORD).await {
                    Ok(Some(Incoming::Forward {
                        head,
                        source,
                        start,
                        len,
                    })) => sources
                        .piece(source, start, len)
                        .await
                        .map(|body| Incoming::Piece {
                            head,
                            body,
                            lease: None,
                        }),
                    Ok(Some(x)) => Ok(x),
                    Ok(None) => Err(lost("it closed the gate's link".into())),
                    Err(Error::ConnectionLost(why)) => Err(lost(why)),
                    Err(e) => Err(e),
                };
                let stop = next.is_err();
                if tx.send(next).await.is_err() || stop {
                    return;
                }
            }
        });
        Ok(AttachedGate {
            session,
            link,
            specs,
            items,
            records: RecordReceiver::new(MAX_RECORD),
            pieces: SelfContainedDecoder::new(MAX_RECORD),
            ended: false,
            closed: false,
            io,
        })
    }

    /// Number of channels.
    pub fn num_channels(&self) -> usize {
        self.specs.len()
    }

    /// The channels, in order.
    pub fn specs(&self) -> impl Iterator<Item = &ChannelSpec> {
        self.specs.iter()
    }

    /// The next batch, user event or barrier; `None` once every channel has ended. Blocks as
    /// `wait` allows.
    pub fn next_item(&mut self, wait: &mut Wait<'_>) -> Result<Option<GateItem>> {
        if self.closed {
            return Err(Error::Closed("input gate"));
        }
        if self.ended {
            return Ok(None);
        }
        let next = block_on(&self.session.handle, self.items.recv(), wait)?;
        let incoming = match next {
            Some(r) => r?,
            None => return Err(self.session.lost("the gate's link ended")),
        };
        Ok(Some(match incoming {
            Incoming::Record { head, body } => GateItem::Batch {
                channel: head.channel as usize,
                batch: self.records.decode(head.channel, body)?,
                token: None,
                in_flight: head.in_flight,
            },
            Incoming::Piece { head, body, .. } => GateItem::Batch {
                channel: head.channel as usize,
                batch: self.pieces.decode(body)?,
                token: None,
                in_flight: head.in_flight,
            },
            Incoming::Signal(Signal::Event { target, payload }) => GateItem::Event {
                channel: target.unwrap_or_default() as usize,
                payload,
            },
            Incoming::Signal(Signal::Barrier { id, unaligned }) => GateItem::Barrier {
                checkpoint_id: id,
                unaligned,
            },
            Incoming::Signal(Signal::Aborted { id }) => GateItem::CheckpointAborted { checkpoint_id: id },
            Incoming::Signal(Signal::End) => {
                self.ended = true;
                return Ok(None);
            }
            Incoming::Signal(Signal::Error(e)) => return Err(e),
            Incoming::Signal(other) => {
                return Err(Error::Protocol(format!("attach: {other:?} on a gate's link")))
            }
            Incoming::Forward { .. } => {
                return Err(Error::Protocol("attach: a forward frame not resolved".into()))
            }
        }))
    }

    /// The next batch, skipping events and barriers; `None` once every channel has ended.
    pub fn next(&mut self, wait: &mut Wait<'_>) -> Result<Option<arrow_array::RecordBatch>> {
        loop {
            match self.next_item(wait)? {
                None => return Ok(None),
                Some(GateItem::Batch { batch, .. }) => return Ok(Some(batch)),
                Some(_) => {}
            }
        }
    }

    /// Releases the channels: the service closes the gate. Idempotent.
    pub fn close(&mut self) {
        self.closed = true;
        self.io.abort();
    }

    /// The gate's metrics, as the service sees them.
    pub fn metrics(&self) -> Result<GateMetrics> {
        gate_metrics(&self.session, self.link)
    }

    /// A request for the gate's metrics that needs no access to the gate (another thread may
    /// be blocked in `next_item`).
    pub fn metrics_handle(&self) -> impl Fn() -> Result<GateMetrics> + Send + Sync + 'static {
        let (session, link) = (self.session.clone(), self.link);
        move || gate_metrics(&session, link)
    }
}

/// The writer links' heaps a gate's task has been handed (each mapped once, for as long as the
/// gate lives): where the pieces the service forwards lie.
struct Sources {
    heaps: UnixStream,
    mapped: HashMap<u64, HeapReader>,
}

impl Sources {
    fn new(heaps: UnixStream) -> Sources {
        Sources {
            heaps,
            mapped: HashMap::new(),
        }
    }

    /// The body of the piece at `start`, `len` bytes, of writer link `source`'s heap (mapped
    /// first if new: the service passed it before the frame that names it). Dropping every
    /// batch built on it frees its chunks for that writer.
    async fn piece(&mut self, source: u64, start: u64, len: u64) -> Result<arrow_buffer::Buffer> {
        if !self.mapped.contains_key(&source) {
            let (link, heap) = SourceHeap::receive(&self.heaps).await?;
            if link != source {
                return Err(Error::Protocol(format!(
                    "attach: the heap of writer link {link} came for a piece of link {source}"
                )));
            }
            self.mapped.insert(link, heap);
        }
        let heap = &self.mapped[&source];
        heap_record(heap, start, len, MAX_RECORD).map(|(_lease, body)| body)
    }
}
