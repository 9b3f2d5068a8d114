//! The service's side of a writer's link: a task on the service's runtime that queues each
//! piece the task sends in its subpartition, undecoded where the partition hands batches over
//! (the service reads only its schema and rows; whoever reads it decodes it). A piece that
//! lies in the link's heap is queued with its place ([`InHeap`]), so that a gate of this host
//! can hand it on as it lies. A link that ends without the writer's close (the task died, or dropped the writer)
//! fails the partition.
//!
//! For a pipelined partition that hands batches over, a piece is queued on the runtime's
//! thread that the link's doorbell woke, which goes on to serve the gates the piece is for: one
//! wake-up of the service per batch when nothing holds the writer back. When the partition is
//! full the write waits on a blocking thread instead, and that wait, the link's ring and heap
//! filling, and the task's next `write` waiting is the backpressure. A partition whose writes
//! may wait part-way (spillable: it writes to disk; serializing) has a thread of its own for
//! its link, where each write waits as it needs ([`spawn`] chooses).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::runtime::Handle;

use super::codec::Signal;
use super::link::{self, HeapEnd, InHeap, LinkEnd, SourceHeap, Watched};
use super::records::{read_incoming, small, Incoming};
use crate::base::error::{Error, Result};
use crate::base::wait::Wait;
use crate::memory::RecordPool;
use crate::net::shm::ShmWriter;
use crate::partition::subpartition::Token;
use crate::partition::{EncodedPiece, Handed, Partitioner, RecordWriter, ResultPartition, MAX_PIECE};
use crate::serde::SelfContainedDecoder;

/// Idle record blocks kept for the next records, at most.
const RECORD_POOL: usize = 16 << 20;
/// How long a stopped link waits for the next frame a task sent before it went.
const DRAIN: Duration = Duration::from_secs(1);
/// How long a stopped link is read at most (a task still writing while the service ends would
/// otherwise keep it).
const DRAIN_MAX: Duration = Duration::from_secs(10);

/// When the link ends for the task: once the task dropped the link or went (or its session or
/// the service ended), what it sent before is still read from the ring, and written, until
/// nothing more has come for [`DRAIN`] (a frame the task left half written never completes)
/// or [`DRAIN_MAX`] has passed; only then does the link end. The wait starts again with each
/// frame read, so a loaded service still reads every frame a task left.
struct Drain {
    stops: [Arc<AtomicBool>; 3],
    /// Once stopped: when, and when the last frame was read since.
    since: Mutex<Option<(Instant, Instant)>>,
    pid: u32,
}

impl Drain {
    fn check(&self) -> Result<()> {
        if !self.stops.iter().any(|f| f.load(Ordering::SeqCst)) {
            return Ok(());
        }
        let mut since = self.since.lock().unwrap();
        let (stopped, last) = *since.get_or_insert_with(|| (Instant::now(), Instant::now()));
        if last.elapsed() >= DRAIN || stopped.elapsed() >= DRAIN_MAX {
            Err(Error::ConnectionLost(format!(
                "the task (pid {}) went away",
                self.pid
            )))
        } else {
            Ok(())
        }
    }

    /// A frame was read: a stopped link waits [`DRAIN`] for the next one again.
    fn progressed(&self) {
        if let Some((_, last)) = self.since.lock().unwrap().as_mut() {
            *last = Instant::now();
        }
    }

    /// Runs `fut` to its end, or until the check fails.
    async fn run<F: std::future::Future>(&self, fut: F) -> Result<F::Output> {
        link::until_stopped(fut, || self.check()).await
    }
}

/// Starts a writer's link on the current runtime, until the writer closes or fails, or the
/// task or the service goes. `stop`: flags that end it (the session's end, the service's). A
/// partition whose writes queue whole is served on the runtime's threads; one whose writes may
/// wait part-way (spillable: it writes to disk; serializing) on a blocking thread of its own.
pub(crate) fn spawn(
    partition: Arc<ResultPartition>,
    partitioner: Partitioner,
    end: LinkEnd,
    source: SourceHeap,
    pid: u32,
    stop: [Arc<AtomicBool>; 2],
) -> tokio::task::JoinHandle<()> {
    let handle = Handle::current();
    if partition.writes_whole() {
        return handle.spawn(run(partition, partitioner, end, source, pid, stop));
    }
    handle.spawn_blocking({
        let handle = handle.clone();
        move || handle.block_on(run(partition, partitioner, end, source, pid, stop))
    })
}

/// Where a link's writes wait when they must.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Writes {
    /// On a blocking thread, each write that cannot be queued at once.
    Handed,
    /// Here: the link runs on a thread of its own.
    Here,
}

/// Runs a writer's link (see [`spawn`]).
async fn run(
    partition: Arc<ResultPartition>,
    partitioner: Partitioner,
    end: LinkEnd,
    source: SourceHeap,
    pid: u32,
    stop: [Arc<AtomicBool>; 2],
) {
    // Where `spawn` put the link says where its writes wait.
    let writes = if partition.writes_whole() {
        Writes::Handed
    } else {
        Writes::Here
    };
    let mut link = Watched::new(end, &Handle::current(), stop);
    let HeapEnd::Reader(heap) = &link.heap else {
        log::warn!("creditflow: host service: a writer's link with the wrong heap side");
        return;
    };
    let heap = heap.clone();
    let drain = Arc::new(Drain {
        stops: link.stops(),
        since: Mutex::new(None),
        pid,
    });
    let pool = RecordPool::new(RECORD_POOL);
    let source = Arc::new(source);
    let mut upload = Upload {
        // Shared with the blocking thread a write that must wait goes to (it is awaited there).
        w: Arc::new(Mutex::new(RecordWriter::new(partition.clone(), partitioner))),
        partition: partition.clone(),
        // Reads each piece's schema and rows (and decodes it for a partition that needs the
        // batch); the reading task decodes and checks it.
        pieces: SelfContainedDecoder::relay(MAX_PIECE),
        writes,
        source,
        drain: drain.clone(),
    };
    let outcome: Result<()> = loop {
        let read = read_incoming(&mut link.reader, Some(&heap), &pool, MAX_PIECE);
        let incoming = match drain.run(read).await {
            Ok(Ok(Some(x))) => {
                drain.progressed();
                x
            }
            Ok(Ok(None)) => {
                break Err(Error::ConnectionLost(format!(
                    "the task (pid {pid}) closed the writer's link without closing the writer"
                )))
            }
            Ok(Err(e)) | Err(e) => break Err(e),
        };
        match upload.take(incoming, &mut link.writer).await {
            Ok(Next::More) => {}
            Ok(Next::Done) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    if let Err(e) = outcome {
        // Nothing partial is taken for complete: the readers get what was written, then this.
        partition.fail(&format!(
            "the writer of partition {:?} in task pid {pid} failed: {e}",
            partition.id()
        ));
        let frame = small(Signal::Error(e).encode());
        let _ = tokio::time::timeout(
            Duration::from_millis(500),
            link::write_all(&mut link.writer, &frame),
        )
        .await;
    }
    // Closes the ring: the task reads what is in it, then the end.
    let _ = link.writer.shutdown().await;
}

/// What a writer's link does after an item from its task.
enum Next {
    /// Takes the next.
    More,
    /// Ends: the writer's close or failure was acknowledged.
    Done,
}

/// A writer's link's side in the service: the writer, and what its items need.
struct Upload {
    partition: Arc<ResultPartition>,
    w: Arc<Mutex<RecordWriter>>,
    pieces: SelfContainedDecoder,
    writes: Writes,
    source: Arc<SourceHeap>,
    drain: Arc<Drain>,
}

impl Upload {
    /// Does what the task sent: writes a piece, passes an event, barrier or flush on, or
    /// closes or fails the partition and acknowledges it on `replies`.
    async fn take(&mut self, incoming: Incoming, replies: &mut ShmWriter) -> Result<Next> {
        let w = &self.w;
        match incoming {
            Incoming::Piece { head, body, lease } => {
                // A partition that hands batches over queues the piece undecoded (its reader
                // decodes it); one that stores or serializes them needs the batch.
                let piece = match self.writes {
                    Writes::Handed => EncodedPiece::peek(body, &mut self.pieces).map(Handed::Piece),
                    Writes::Here => self.pieces.decode(body).map(Handed::Batch),
                }?;
                let token = lease.map(|lease| {
                    let source = self.source.clone();
                    Arc::new(InHeap { source, lease }) as Token
                });
                let channel = head.channel as usize;
                write_piece(w, piece, token, channel, &self.drain, self.writes).await?;
            }
            Incoming::Signal(Signal::Event {
                target: None,
                payload,
            }) => w.lock().unwrap().broadcast_event(&payload)?,
            Incoming::Signal(Signal::Event {
                target: Some(t),
                payload,
            }) => w.lock().unwrap().emit_event(&payload, t as usize)?,
            Incoming::Signal(Signal::Barrier { id, unaligned }) => {
                let overtaken = w.lock().unwrap().broadcast_barrier(id, unaligned)?;
                let overtaken = overtaken.into_iter().map(|n| n as u64).collect();
                reply(replies, Signal::Ack { overtaken }, &self.drain).await?;
            }
            Incoming::Signal(Signal::Flush) => w.lock().unwrap().flush(),
            Incoming::Signal(Signal::Close) => {
                w.lock().unwrap().close()?;
                return self.ended(replies).await;
            }
            Incoming::Signal(Signal::Fail { message }) => {
                self.partition.fail(&message);
                return self.ended(replies).await;
            }
            Incoming::Signal(other) => {
                return Err(Error::Protocol(format!("attach: {other:?} on a writer's link")))
            }
            Incoming::Record { .. } | Incoming::Forward { .. } => {
                return Err(Error::Protocol(
                    "attach: a record other than a piece on a writer's link".into(),
                ))
            }
        }
        Ok(Next::More)
    }

    /// Acknowledges the writer's close or failure: the link's last reply.
    async fn ended(&self, replies: &mut ShmWriter) -> Result<Next> {
        let ack = Signal::Ack {
            overtaken: Vec::new(),
        };
        reply(replies, ack, &self.drain).await?;
        Ok(Next::Done)
    }
}

/// Queues a piece: at once when the partition has room for it now, else where `writes` says
/// to wait for room (a blocking thread: the writer is used there, and this awaits it).
async fn write_piece(
    w: &Arc<Mutex<RecordWriter>>,
    piece: Handed,
    token: Option<Token>,
    channel: usize,
    drain: &Arc<Drain>,
    writes: Writes,
) -> Result<()> {
    if writes == Writes::Handed {
        let mut writer = w.lock().unwrap();
        let queued = match &piece {
            Handed::Batch(batch) => writer.try_write_to(batch, token.clone(), channel)?,
            Handed::Piece(p) => writer.try_write_encoded_to(p.clone(), token.clone(), channel)?,
        };
        if queued {
            return Ok(());
        }
    }
    let blocking = {
        let (w, drain) = (w.clone(), drain.clone());
        move || {
            let mut check = || drain.check();
            let mut wait = Wait::forever().with_check(&mut check);
            let mut writer = w.lock().unwrap();
            match piece {
                Handed::Batch(batch) => writer.write_to(&batch, token, channel, &mut wait),
                Handed::Piece(p) => writer.write_encoded_to(p, token, channel, &mut wait),
            }
        }
    };
    match writes {
        Writes::Here => blocking(),
        Writes::Handed => tokio::task::spawn_blocking(blocking)
            .await
            .map_err(|e| Error::ConnectionLost(format!("the service's write did not end: {e}")))?,
    }
}

/// Sends `signal` on the link's ring back to the task.
async fn reply(writer: &mut ShmWriter, signal: Signal, drain: &Drain) -> Result<()> {
    let frame = small(signal.encode());
    drain
        .run(link::write_all(writer, &frame))
        .await?
        .map_err(link::lost)
}
