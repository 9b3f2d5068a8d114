//! [`AttachedGate`]: an `InputGate` that lives in the host service. The service takes the
//! gate's items and puts them on the gate's link; here, the caller's thread reads the next
//! frame (a record's bytes into a block of the record pool, or a lease on the heap where the
//! service placed it, or in a writer link's heap that the service handed over) and decodes it
//! in `next_item`. The link belongs to a runtime of the gate's own that only the caller drives:
//! a sleeping caller is woken by the service's doorbell itself, not by a thread of this process
//! that read the frame first and handed it over.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::net::UnixStream;
use tokio::runtime::Runtime;

use super::client::{gate_metrics, link_wait, Session};
use super::codec::{Forwarded, Signal};
use super::handed::Table;
use super::link::{HeapEnd, LinkEnd, LinkKind, SourceHeap};
use super::records::{leased_record, read_incoming, Incoming, RecordReceiver};
use super::runtime::{self, drive};
use crate::base::config::ChannelSpec;
use crate::base::error::{Error, Result};
use crate::base::wait::Wait;
use crate::gate::{GateItem, GateMetrics};
use crate::memory::RecordPool;
use crate::net::shm::{HeapReader, ShmReader, ShmWriter};
use crate::serde::SelfContainedDecoder;

/// The most bytes one record may have (as a gate's `max_record_size` default).
const MAX_RECORD: usize = 2 << 30;
/// Idle record blocks the link keeps for the next records, at most.
const RECORD_POOL: usize = 16 << 20;

/// A read of the link's next frame; it owns the link while it runs and hands it back with
/// the frame, so a read a caller's timeout interrupts goes on at the next call (a frame read
/// halfway is never lost).
type Read = Pin<Box<dyn Future<Output = (LinkIn, Result<Incoming>)> + Send>>;

/// Reads the items of a gate the host service holds.
pub struct AttachedGate {
    session: Arc<Session>,
    link: u64,
    specs: Vec<ChannelSpec>,
    /// The link, while no read has it.
    idle: Option<LinkIn>,
    /// The read in progress, while one is.
    read: Option<Read>,
    /// Why the link ended, once it has.
    broken: Option<String>,
    records: RecordReceiver,
    pieces: SelfContainedDecoder,
    ended: bool,
    closed: bool,
    /// The runtime the link lives on (`None` only while dropped).
    rt: Option<Runtime>,
}

impl Drop for AttachedGate {
    fn drop(&mut self) {
        // The link first (its end tells the service), then its runtime, without waiting: a
        // gate may be let go where a runtime runs, which a plain drop of one does not allow.
        self.read = None;
        self.idle = None;
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl AttachedGate {
    /// Opens the link of gate `link` (set up by the service for this session) and the gate's
    /// own runtime it lives on.
    pub(crate) fn open(session: Arc<Session>, link: u64, specs: Vec<ChannelSpec>) -> Result<AttachedGate> {
        let rt = runtime::own()?;
        // Opened on the gate's runtime, so its sockets belong to it.
        let end = drive(&rt, session.link_opening(link, LinkKind::Gate), &mut link_wait())??;
        Ok(AttachedGate {
            session,
            link,
            specs,
            idle: Some(LinkIn::new(end)?),
            read: None,
            broken: None,
            records: RecordReceiver::new(MAX_RECORD),
            pieces: SelfContainedDecoder::new(MAX_RECORD),
            ended: false,
            closed: false,
            rt: Some(rt),
        })
    }

    /// The next frame of the link, read on the caller's thread as `wait` allows.
    fn incoming(&mut self, wait: &mut Wait<'_>) -> Result<Incoming> {
        if let Some(why) = &self.broken {
            return Err(self.session.lost(why));
        }
        let read = match self.read.as_mut() {
            Some(read) => read,
            None => {
                let link = self.idle.take().expect("the link is idle when no read has it");
                self.read.insert(Box::pin(link.next()))
            }
        };
        let rt = self.rt.as_ref().expect("the runtime lives as long as the gate");
        let (link, next) = drive(rt, read, wait)?;
        self.read = None;
        match next {
            Ok(x) => {
                self.idle = Some(link);
                Ok(x)
            }
            Err(e) => {
                // The link is done with: its end tells the service.
                drop(link);
                let (why, e) = match e {
                    Error::ConnectionLost(why) => (why.clone(), self.session.lost(&why)),
                    e => (format!("the gate's link ended: {e}"), e),
                };
                self.broken = Some(why);
                Err(e)
            }
        }
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
        Ok(Some(match self.incoming(wait)? {
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
        // Ends the link (and a read interrupted halfway): its end tells the service.
        self.read = None;
        self.idle = None;
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

/// The gate's end of its link and what reading it takes.
struct LinkIn {
    reader: ShmReader,
    /// The ring back: unused, but open while the gate is (its end tells the service).
    _writer: ShmWriter,
    heap: HeapReader,
    pool: RecordPool,
    sources: Sources,
    /// The pieces the service handed over in place, shared with it.
    table: Arc<Table>,
}

impl LinkIn {
    fn new(end: LinkEnd) -> Result<LinkIn> {
        let LinkEnd {
            reader,
            writer,
            heap,
            bell: _,
            heaps,
            table,
        } = end;
        let HeapEnd::Reader(heap) = heap else {
            return Err(Error::Protocol("a gate's link whose heap the task writes".into()));
        };
        let heaps = heaps.ok_or_else(|| Error::Protocol("a gate's link without its heaps".into()))?;
        let table = table.ok_or_else(|| Error::Protocol("a gate's link without its table".into()))?;
        Ok(LinkIn {
            reader,
            _writer: writer,
            heap,
            pool: RecordPool::new(RECORD_POOL),
            sources: Sources::new(heaps),
            table: Arc::new(table),
        })
    }

    /// The next frame, a forwarded piece resolved to its body in its writer's heap; the link
    /// comes back with it. A link that closed is lost.
    async fn next(mut self) -> (LinkIn, Result<Incoming>) {
        let next = match read_incoming(&mut self.reader, Some(&self.heap), &self.pool, MAX_RECORD).await {
            Ok(Some(Incoming::Forward { head, piece })) => {
                self.sources
                    .piece(&piece, &self.table)
                    .await
                    .map(|body| Incoming::Piece {
                        head,
                        body,
                        lease: None,
                    })
            }
            Ok(Some(x)) => Ok(x),
            Ok(None) => Err(Error::ConnectionLost("it closed the gate's link".into())),
            Err(e) => Err(e),
        };
        (self, next)
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

    /// The body of `piece`, which lies in a writer link's heap (mapped first if new: the
    /// service passed it before the frame that names it), taken from its slot of `table`.
    /// Dropping every batch built on it frees its slot, then its chunks for that writer.
    async fn piece(&mut self, piece: &Forwarded, table: &Arc<Table>) -> Result<arrow_buffer::Buffer> {
        let source = piece.source;
        if !self.mapped.contains_key(&source) {
            let (link, heap) = SourceHeap::receive(&self.heaps).await?;
            if link != source {
                return Err(Error::Protocol(format!(
                    "attach: the heap of writer link {link} came for a piece of link {source}"
                )));
            }
            self.mapped.insert(link, heap);
        }
        let lease = self.mapped[&source]
            .lease(piece.start, piece.len)
            .and_then(|lease| table.take(piece.slot, lease))
            .map_err(Error::Protocol)?;
        leased_record(lease, MAX_RECORD).map(|(_lease, body)| body)
    }
}
