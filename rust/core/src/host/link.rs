//! A link between an attached task and its service: a connection of its own to the service's
//! name, over which the service passes a sealed `memfd` (the same region, rings, heap and
//! doorbell as [`crate::net::shm`]'s links between environments). One ring each way and one
//! heap, written by the side that sends batches: the task for a writer's link, the service for
//! a gate's. The connection stays as the doorbell; its end tells either side that the other is
//! gone, however it went.
//!
//! A gate's link has a second connection, its heaps' (a socket pair whose task end comes with
//! the region): over it the service passes the regions of writers' links whose heaps hold
//! pieces it hands to the gate's task as they lie ([`SourceHeap`]).

use std::io::IoSlice;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arrow_buffer::Buffer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::codec::{self, FRAME_HEADER};
use super::handed::{Table, TABLE_BYTES};
use crate::base::error::{Error, Result};
use crate::base::wait::CHECK_INTERVAL;
use crate::net::shm::{
    heap_offset, recv_fds, region_len, sane_heap, send_fds, Doorbell, HeapLease, HeapReader, HeapWriter,
    Region, Ring, ShmReader, ShmWriter, Waiter, HEAP_CHUNK, MAX_HEAP_BYTES, RING_HEADER,
};

/// Bytes of the ring that carries batches (towards the side that receives them).
pub(crate) const BATCH_RING: usize = 1 << 20;
/// Bytes of the ring back (acknowledgements and errors).
pub(crate) const BACK_RING: usize = 64 << 10;
/// Bytes of the smallest heap a writer's link has: a task's `memory` below it still gets it.
pub(crate) const MIN_WRITER_HEAP: usize = 1 << 20;
/// Bytes of a gate link's heap.
pub(crate) const GATE_HEAP: usize = 4 << 20;
/// Bytes of the layout the service sends with the region.
const LAYOUT_LEN: usize = 32;

/// Which way a link's batches go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkKind {
    /// A writer's: task to service.
    Writer,
    /// A gate's: service to task.
    Gate,
}

impl LinkKind {
    fn code(self) -> u64 {
        match self {
            LinkKind::Writer => 1,
            LinkKind::Gate => 2,
        }
    }

    /// Capacities of the ring from the service to the task and back.
    fn rings(self) -> (usize, usize) {
        match self {
            LinkKind::Writer => (BACK_RING, BATCH_RING),
            LinkKind::Gate => (BATCH_RING, BACK_RING),
        }
    }

    /// Bytes of the region: the rings, the heap of `heap` bytes, and for a gate's link the
    /// table of pieces handed to its task after them.
    fn region_len(self, s2t: usize, t2s: usize, heap: usize) -> usize {
        let table = if self == LinkKind::Gate { TABLE_BYTES } else { 0 };
        region_len(s2t, t2s, heap) + table
    }
}

/// Bytes of the heap of a writer's link for a task whose own `memory` is `memory` bytes: that
/// much, in whole chunks, within [`MIN_WRITER_HEAP`] and the largest heap. The pieces its
/// partition queues and its readers hold lie there until read (beyond, pieces go through the
/// ring and the service copies them), and its pages count in the task's memory once written,
/// so a task's footprint follows its `memory` as an environment's does.
pub(crate) fn writer_heap(memory: usize) -> usize {
    let chunks = memory.div_ceil(HEAP_CHUNK).saturating_mul(HEAP_CHUNK);
    chunks.clamp(MIN_WRITER_HEAP, MAX_HEAP_BYTES)
}

/// The heap a task asked for its writer's link, checked: whole chunks, within
/// [`MIN_WRITER_HEAP`] and the largest heap.
pub(crate) fn checked_writer_heap(heap: u64) -> Result<usize> {
    usize::try_from(heap)
        .ok()
        .filter(|&h| h >= MIN_WRITER_HEAP && sane_heap(h))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a writer link's heap of {heap} bytes: it must be whole {HEAP_CHUNK}-byte chunks, \
                 from {MIN_WRITER_HEAP} to {MAX_HEAP_BYTES} bytes"
            ))
        })
}

/// One side of a link's heap.
pub(crate) enum HeapEnd {
    /// The side that sends batches places them.
    Writer(HeapWriter),
    /// The other reads them where they lie.
    Reader(HeapReader),
}

/// One side of a link: its halves, its heap side, the doorbell (to watch for the peer's end),
/// and for a gate's link the connection its writers' heaps come over and the table of the
/// pieces of theirs handed to the task.
pub(crate) struct LinkEnd {
    pub(crate) reader: ShmReader,
    pub(crate) writer: ShmWriter,
    pub(crate) heap: HeapEnd,
    pub(crate) bell: Arc<Doorbell>,
    pub(crate) heaps: Option<UnixStream>,
    pub(crate) table: Option<Table>,
}

/// A writer link's heap as the service hands it to gates' tasks: the link (its id names it in
/// forward frames), its region's descriptor and where the heap lies in it.
pub(crate) struct SourceHeap {
    pub(crate) link: u64,
    fd: OwnedFd,
    region_len: usize,
    heap_offset: usize,
    heap_len: usize,
}

/// A piece that lies in a writer link's heap, as the service queues it (the token of its
/// batch): the gate that reads it may hand it to its task as it lies.
pub(crate) struct InHeap {
    pub(crate) source: Arc<SourceHeap>,
    pub(crate) lease: Arc<HeapLease>,
}

/// Bytes of the message that passes a writer's heap: link, region length, heap offset and
/// length.
const SOURCE_LEN: usize = 32;

impl SourceHeap {
    /// Passes this heap on a gate link's `heaps` connection (the descriptor goes with it).
    pub(crate) async fn send(&self, heaps: &UnixStream) -> Result<()> {
        let mut msg = [0u8; SOURCE_LEN];
        let words = [
            self.link,
            self.region_len as u64,
            self.heap_offset as u64,
            self.heap_len as u64,
        ];
        for (i, v) in words.into_iter().enumerate() {
            msg[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        send_fds(heaps, &msg, &[self.fd.as_fd()]).await.map_err(io_error)
    }

    /// Task side: the next heap passed on `heaps`, mapped: its link and its reader. An error
    /// unless it is a heap the service can have sent (a sealed region holding the heap).
    pub(crate) async fn receive(heaps: &UnixStream) -> Result<(u64, HeapReader)> {
        let mut msg = [0u8; SOURCE_LEN];
        let fd = recv_fds(heaps, &mut msg, 1, "a writer's heap")
            .await
            .map_err(io_error)?
            .remove(0);
        let word = |i: usize| u64::from_le_bytes(msg[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let (link, region, offset, heap) = (word(0), word(1), word(2), word(3));
        let bad = || Error::Protocol(format!("a writer's heap laid out {region}/{offset}/{heap}"));
        let fits = offset.checked_add(heap).is_some_and(|end| end <= region);
        let (Ok(region), Ok(offset), Ok(heap)) = (
            usize::try_from(region),
            usize::try_from(offset),
            usize::try_from(heap),
        ) else {
            return Err(bad());
        };
        if !fits || heap == 0 || !sane_heap(heap) || !offset.is_multiple_of(4096) {
            return Err(bad());
        }
        let region = Arc::new(Region::map(&fd, region).map_err(io_error)?);
        Ok((link, HeapReader::new(region, offset, heap)))
    }
}

/// Service side: creates the region for a link of `kind` and passes it on `sock` (whose peer
/// was checked when it connected), with a heap of `heap` bytes (a writer's: what its task asked
/// for, checked when asked; a gate's: [`GATE_HEAP`]). For a writer's link, also the heap to
/// hand to gates (`link` names it).
pub(crate) async fn serve(
    sock: UnixStream,
    kind: LinkKind,
    link: u64,
    heap: usize,
) -> Result<(LinkEnd, Option<SourceHeap>)> {
    let (s2t, t2s) = kind.rings();
    let len = kind.region_len(s2t, t2s, heap);
    let (region, fd) = Region::create(len).map_err(io_error)?;
    let mut layout = [0u8; LAYOUT_LEN];
    for (i, v) in [s2t as u64, t2s as u64, heap as u64, kind.code()]
        .into_iter()
        .enumerate()
    {
        layout[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
    }
    let (heaps, source) = match kind {
        LinkKind::Gate => {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(io_error)?;
            ours.set_nonblocking(true).map_err(io_error)?;
            send_fds(&sock, &layout, &[fd.as_fd(), theirs.as_fd()])
                .await
                .map_err(io_error)?;
            (Some(UnixStream::from_std(ours).map_err(io_error)?), None)
        }
        LinkKind::Writer => {
            send_fds(&sock, &layout, &[fd.as_fd()]).await.map_err(io_error)?;
            let source = SourceHeap {
                link,
                fd,
                region_len: len,
                heap_offset: heap_offset(s2t, t2s),
                heap_len: heap,
            };
            (None, Some(source))
        }
    };
    let end = end(Arc::new(region), sock, s2t, t2s, heap, kind, true, heaps)?;
    Ok((end, source))
}

/// Task side: having sent the link's opening on `sock`, maps the region the service passes.
pub(crate) async fn open(sock: UnixStream, kind: LinkKind) -> Result<LinkEnd> {
    let mut layout = [0u8; LAYOUT_LEN];
    let n = if kind == LinkKind::Gate { 2 } else { 1 };
    let mut fds = recv_fds(&sock, &mut layout, n, "a link's layout")
        .await
        .map_err(|e| Error::ConnectionLost(format!("the host service did not set the link up: {e}")))?;
    let heaps = match kind {
        LinkKind::Gate => {
            let theirs = std::os::unix::net::UnixStream::from(fds.pop().expect("two descriptors"));
            theirs.set_nonblocking(true).map_err(io_error)?;
            Some(UnixStream::from_std(theirs).map_err(io_error)?)
        }
        LinkKind::Writer => None,
    };
    let fd = fds.pop().expect("the region's descriptor");
    let word = |i: usize| u64::from_le_bytes(layout[8 * i..8 * i + 8].try_into().expect("8 bytes")) as usize;
    let (s2t, t2s, heap, code) = (word(0), word(1), word(2), word(3) as u64);
    let sane = |n: usize| n.is_power_of_two() && (4096..=1 << 30).contains(&n);
    if !sane(s2t) || !sane(t2s) || !sane_heap(heap) || heap == 0 || code != kind.code() {
        return Err(Error::Protocol(format!(
            "bad link layout {s2t}/{t2s}/{heap}/{code} for a {kind:?} link"
        )));
    }
    let region = Arc::new(Region::map(&fd, kind.region_len(s2t, t2s, heap)).map_err(io_error)?);
    drop(fd);
    end(region, sock, s2t, t2s, heap, kind, false, heaps)
}

/// One side's view of a link's region: the ring it reads, the ring it writes, its side of the
/// heap (the side that sends batches writes it), and the doorbell.
#[allow(clippy::too_many_arguments)] // the layout's figures, the side, and the connections
fn end(
    region: Arc<Region>,
    sock: UnixStream,
    s2t: usize,
    t2s: usize,
    heap: usize,
    kind: LinkKind,
    service: bool,
    heaps: Option<UnixStream>,
) -> Result<LinkEnd> {
    let to_task = Ring::new(region.clone(), 0, s2t);
    let to_service = Ring::new(region.clone(), RING_HEADER + s2t, t2s);
    let (incoming, outgoing) = if service {
        (to_service, to_task)
    } else {
        (to_task, to_service)
    };
    let table = (kind == LinkKind::Gate).then(|| Table::new(region.clone(), region_len(s2t, t2s, heap)));
    let offset = heap_offset(s2t, t2s);
    let heap = if service == (kind == LinkKind::Gate) {
        HeapEnd::Writer(HeapWriter::new(region, offset, heap))
    } else {
        HeapEnd::Reader(HeapReader::new(region, offset, heap))
    };
    let bell = Doorbell::new(sock).map_err(io_error)?;
    Ok(LinkEnd {
        reader: ShmReader::new(incoming, bell.clone()),
        writer: ShmWriter::new(outgoing, bell.clone()),
        heap,
        bell,
        heaps,
        table,
    })
}

fn io_error(e: std::io::Error) -> Error {
    Error::ConnectionLost(format!("shared memory with the host service: {e}"))
}

/// Writes every byte of `parts`, in order, as few ring writes as it takes.
pub(crate) async fn write_all<W: AsyncWriteExt + Unpin>(w: &mut W, parts: &[Buffer]) -> std::io::Result<()> {
    let mut first = 0;
    let mut offset = 0;
    while first < parts.len() {
        let slices: Vec<IoSlice<'_>> = std::iter::once(&parts[first].as_slice()[offset..])
            .chain(parts[first + 1..].iter().map(|p| p.as_slice()))
            .map(IoSlice::new)
            .collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 && slices.iter().any(|s| !s.is_empty()) {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while first < parts.len() {
            let left = parts[first].len() - offset;
            if n < left {
                offset += n;
                break;
            }
            n -= left;
            first += 1;
            offset = 0;
        }
    }
    Ok(())
}

/// Reads a frame's header: its length and type; `None` at a clean end of stream (the peer
/// closed its ring between frames).
pub(crate) async fn read_header<R: AsyncReadExt + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Option<(usize, u8)>> {
    let mut h = [0u8; FRAME_HEADER];
    let mut got = 0;
    while got < FRAME_HEADER {
        let n = r.read(&mut h[got..]).await.map_err(lost)?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(Error::ConnectionLost("the link ended inside a frame".into()));
        }
        got += n;
    }
    codec::header(h, max).map(Some)
}

/// Reads a control frame (at most [`codec::MAX_CONTROL_FRAME`]): its type and body. A clean
/// end of stream before it is `ConnectionLost` with `closed()`'s words.
pub(crate) async fn read_control<R: AsyncReadExt + Unpin>(
    r: &mut R,
    closed: impl FnOnce() -> String,
) -> Result<(u8, Vec<u8>)> {
    let (len, ty) = read_header(r, codec::MAX_CONTROL_FRAME)
        .await?
        .ok_or_else(|| Error::ConnectionLost(closed()))?;
    Ok((ty, read_body(r, len - FRAME_HEADER).await?))
}

/// Reads `n` bytes of a frame's body.
pub(crate) async fn read_body<R: AsyncReadExt + Unpin>(r: &mut R, n: usize) -> Result<Vec<u8>> {
    let mut body = vec![0u8; n];
    r.read_exact(&mut body).await.map_err(lost)?;
    Ok(body)
}

/// Runs `fut` to its end unless `check` fails first: checked before it starts and every
/// [`CHECK_INTERVAL`] while it waits. The future is kept across checks, so a frame half read or
/// written is not lost.
pub(crate) async fn until_stopped<F, E>(
    fut: F,
    mut check: impl FnMut() -> std::result::Result<(), E>,
) -> std::result::Result<F::Output, E>
where
    F: std::future::Future,
{
    let mut fut = std::pin::pin!(fut);
    loop {
        check()?;
        if let Ok(v) = tokio::time::timeout(CHECK_INTERVAL, fut.as_mut()).await {
            return Ok(v);
        }
    }
}

/// A failed read of a link: the peer is gone.
pub(crate) fn lost(e: std::io::Error) -> Error {
    Error::ConnectionLost(format!("link to the other side of the host service broken: {e}"))
}

/// A link's end on the service's side, watched: its stops are set once the task dropped the
/// link or went, its session ended, or the service ends.
pub(crate) struct Watched {
    pub(crate) reader: ShmReader,
    pub(crate) writer: ShmWriter,
    pub(crate) heap: HeapEnd,
    pub(crate) heaps: Option<UnixStream>,
    pub(crate) table: Option<Table>,
    stops: [Arc<AtomicBool>; 3],
    /// Ends the doorbell's watch with the link (else it would keep the connection open).
    _watch: tokio::task::JoinHandle<()>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self._watch.abort();
    }
}

impl Watched {
    /// Watches `end`'s doorbell on `handle`; `stop` are the session's and the service's flags.
    pub(crate) fn new(end: LinkEnd, handle: &tokio::runtime::Handle, stop: [Arc<AtomicBool>; 2]) -> Watched {
        let LinkEnd {
            reader,
            writer,
            heap,
            bell,
            heaps,
            table,
        } = end;
        let dead = Arc::new(AtomicBool::new(false));
        let flag = dead.clone();
        let watch = handle.spawn(async move {
            let mut waiter = Waiter::new(bell);
            loop {
                std::future::poll_fn(|cx| waiter.poll(cx)).await;
                if waiter.bell().is_dead() {
                    flag.store(true, Ordering::SeqCst);
                    return;
                }
            }
        });
        let [session, service] = stop;
        Watched {
            reader,
            writer,
            heap,
            heaps,
            table,
            stops: [dead, session, service],
            _watch: watch,
        }
    }

    /// The flags that say the link, the task's session or the service has ended (a check
    /// that must not borrow the link reads them).
    pub(crate) fn stops(&self) -> [Arc<AtomicBool>; 3] {
        self.stops.clone()
    }
}
