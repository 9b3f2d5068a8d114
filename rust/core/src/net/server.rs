//! The sending side: connections this environment accepted, each serving the subpartitions
//! its peer requested (Flink's `PartitionRequestServerHandler` + `PartitionRequestQueue`).
//!
//! One [`ServerConn`] per accepted connection. Its reader half handles PartitionRequest,
//! AddCredit, CancelPartitionRequest and CloseRequest; its writer half is the *sender loop*:
//! round robin over the readers that have something to send **and** credit for it
//! ([`SenderCredit`] and [`ReadyQueue`] from [`crate::protocol::credit`] decide), gathering up to
//! [`MAX_WRITE_BYTES`] of frames into one vectored write. Only that loop writes, so there is
//! one write in flight per connection. Payloads are never copied: serialized buffers go out
//! as slices of their segments, handed-off batches as the Arrow IPC encoder's parts, which
//! point at the batch's own buffers.
//!
//! A subpartition wakes the loop through its listener (called by the producer's thread when
//! the loop found it empty). Each reader drains its subpartition into its own queue, so the
//! backlog it announces is exact in buffers.

use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::sync::{Arc, Mutex, Weak};

use arrow_buffer::Buffer;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use super::handshake;
use super::io::{self, FrameReader, FrameSource, InFrame};
use super::limits::{self, Slot};
use crate::base::config::Limits;
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::partition::buffer::BufferSlice;
use crate::partition::subpartition::{LocalBatch, Polled, Subpartition};
use crate::partition::{Registry, ResultPartition};
use crate::protocol::credit::{Credit, DataType, QueueHead, ReadyQueue, SenderCredit};
use crate::protocol::wire::{self, ErrorKind, Message, ReceiverId, BUFFER_RESPONSE_HEADER_LEN};
use crate::serde::{BatchEncoder, RecordFraming, RECORD_HEADER_LEN};

/// Bytes of frames gathered into one vectored write.
const MAX_WRITE_BYTES: usize = 1 << 20;
/// Frames gathered into one vectored write (stays well under `IOV_MAX`).
const MAX_WRITE_FRAMES: usize = 128;

/// A piece of an outgoing payload; never a copy of data bytes.
#[derive(Clone)]
enum Part {
    Slice(BufferSlice),
    Arrow(Buffer),
    Bytes(Vec<u8>),
}

impl Part {
    fn bytes(&self) -> &[u8] {
        match self {
            Part::Slice(s) => s.as_slice(),
            Part::Arrow(b) => b.as_slice(),
            Part::Bytes(v) => v,
        }
    }

    fn len(&self) -> usize {
        self.bytes().len()
    }

    fn split(self, at: usize) -> (Part, Part) {
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

/// Stream bytes still to send from one polled item, cut into payloads of at most `limit`
/// bytes: the negotiated size, or the buffer size the reader's gate announced when the item
/// was queued (buffer debloating).
struct Cursor {
    parts: VecDeque<Part>,
    remaining: usize,
    limit: usize,
    /// The handed-off batch whose segments account for the bytes; released with the last chunk.
    hold: Option<LocalBatch>,
}

impl Cursor {
    fn chunks(&self) -> usize {
        self.remaining.div_ceil(self.limit)
    }

    /// Bytes of the next chunk [`Cursor::take`] hands out.
    fn next_len(&self) -> usize {
        self.remaining.min(self.limit)
    }

    fn take(&mut self) -> (Vec<Part>, usize) {
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

enum Item {
    Data(Cursor),
    Event(Event),
}

/// One frame ready to write.
struct OutFrame {
    head: Vec<u8>,
    parts: Vec<Part>,
    _hold: Option<LocalBatch>,
}

impl OutFrame {
    fn control(msg: &Message<'_>) -> Result<OutFrame> {
        let mut head = Vec::with_capacity(32);
        wire::encode(msg, &mut head)?;
        Ok(OutFrame {
            head,
            parts: Vec::new(),
            _hold: None,
        })
    }

    fn len(&self) -> usize {
        self.head.len() + self.parts.iter().map(Part::len).sum::<usize>()
    }
}

/// One requested subpartition (Flink: `CreditBasedSequenceNumberingViewReader`).
struct SubReader {
    partition: Arc<ResultPartition>,
    sub: Arc<Subpartition>,
    credit: SenderCredit,
    queue: VecDeque<Item>,
    /// Data buffers (payload chunks) in `queue`: the backlog.
    chunks: usize,
    /// Encodes handed-off batches for the wire (their first record carries the schema).
    encoder: Option<BatchEncoder>,
    /// The records of the payloads sent so far: which next chunk is a record body buffer
    /// (needs no credit, see [`crate::protocol::credit`]).
    framing: RecordFraming,
    /// The last event was queued; the subpartition is read to its end.
    drained: bool,
    /// An aligned checkpoint barrier was queued: the subpartition is not read until the
    /// receiver sends ResumeConsumption (Flink's blocking upstream during alignment).
    paused: bool,
}

impl SubReader {
    /// Moves everything readable from the subpartition into the queue, to be sent in
    /// payloads of at most `limit` bytes (or the subpartition's debloated buffer size).
    fn fill(&mut self, limit: usize) -> Result<()> {
        let limit = self.sub.buffer_size(limit);
        while !self.drained && !self.paused {
            let Some(polled) = self.sub.poll() else { break };
            let item = match polled {
                Polled::Data(slice) => {
                    let remaining = slice.len();
                    Item::Data(Cursor {
                        parts: VecDeque::from([Part::Slice(slice)]),
                        remaining,
                        limit,
                        hold: None,
                    })
                }
                Polled::Batch(lb) => {
                    let encoder = match self.encoder.as_mut() {
                        Some(e) => e,
                        None => self.encoder.insert(BatchEncoder::new(&lb.batch.schema())?),
                    };
                    let record = encoder.encode(&lb.batch)?;
                    let (header, parts) = record.into_parts();
                    let mut all = VecDeque::with_capacity(parts.len() + 1);
                    all.push_back(Part::Bytes(header.to_vec()));
                    all.extend(parts.into_iter().filter(|p| !p.is_empty()).map(Part::Arrow));
                    let remaining = all.iter().map(Part::len).sum();
                    debug_assert!(remaining >= RECORD_HEADER_LEN);
                    Item::Data(Cursor {
                        parts: all,
                        remaining,
                        limit,
                        hold: Some(lb),
                    })
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

    fn head(&self) -> QueueHead {
        match self.queue.front() {
            None => QueueHead::Empty,
            Some(Item::Data(c)) if self.framing.is_record_body(c.next_len()) => QueueHead::RecordBody,
            Some(Item::Data(_)) => QueueHead::Data,
            Some(Item::Event(_)) => QueueHead::Event,
        }
    }

    /// Shows the sender's credit in the subpartition's metrics.
    fn publish_credit(&self) {
        if let Some(stats) = self.sub.remote_reader() {
            stats.set_credit(u64::from(self.credit.credit().get()));
        }
    }

    /// Data buffers to announce. While paused after an aligned barrier, what waits in the
    /// subpartition is not announced: the receiver must not lend this channel floating
    /// buffers that the channels it still waits for need to deliver their barriers.
    fn backlog(&self) -> u32 {
        let waiting = if self.paused { 0 } else { self.sub.backlog() };
        self.chunks.saturating_add(waiting).min(u32::MAX as usize) as u32
    }
}

#[derive(Default)]
struct ServerState {
    readers: HashMap<ReceiverId, SubReader>,
    ready: ReadyQueue<ReceiverId>,
    control: VecDeque<Message<'static>>,
}

/// One accepted connection.
pub(crate) struct ServerConn {
    peer: String,
    payload_limit: usize,
    limits: Limits,
    registry: Weak<Registry>,
    state: Mutex<ServerState>,
    /// Readers whose subpartition has new data (pushed by the producers' listeners).
    signalled: Mutex<Vec<ReceiverId>>,
    wake: Notify,
    /// The environment closes: the writer stops once it has nothing left to write.
    closing: std::sync::atomic::AtomicBool,
}

impl ServerConn {
    /// Whether a reader of a finished partition still has buffers or its end-of-partition
    /// to send (see `Transport::drain`).
    pub(crate) fn has_undrained_readers(&self) -> bool {
        self.state
            .lock()
            .unwrap()
            .readers
            .values()
            .any(|r| r.partition.is_finished())
    }

    /// Answers queued for the peer and not yet collected by the writer.
    fn outstanding(&self) -> usize {
        self.state.lock().unwrap().control.len()
    }

    fn signal(&self, rid: ReceiverId) {
        let first = {
            let mut s = self.signalled.lock().unwrap();
            s.push(rid);
            s.len() == 1
        };
        // Later signals find the loop already woken and not yet collected.
        if first {
            self.wake.notify_one();
        }
    }

    /// Puts the reader in the ready queue if it can send, or queues a backlog announcement.
    fn refresh(&self, st: &mut ServerState, rid: ReceiverId) -> Result<()> {
        let Some(r) = st.readers.get_mut(&rid) else {
            return Ok(());
        };
        r.fill(self.payload_limit)?;
        let head = r.head();
        if r.credit.is_available(head) {
            st.ready.enqueue(rid);
        } else {
            let backlog = r.backlog();
            if r.credit.needs_backlog_announcement(backlog) {
                r.credit.on_backlog_announced(backlog);
                st.control.push_back(Message::BacklogAnnouncement {
                    receiver: rid,
                    backlog,
                });
            }
        }
        Ok(())
    }

    fn on_partition_request(
        self: &Arc<Self>,
        partition_id: String,
        subpartition: u32,
        receiver: ReceiverId,
        initial_credit: Credit,
    ) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        if st.readers.contains_key(&receiver) {
            return Err(Error::Protocol(format!("{receiver} requested twice")));
        }
        if st.control.len() >= self.limits.max_outstanding_requests {
            return Err(self.limits.outstanding_error());
        }
        if st.readers.len() >= self.limits.max_channels_per_connection {
            let e = self.limits.channels_error();
            log::warn!("creditflow: {}: refused {receiver}: {e}", self.peer);
            st.control.push_back(Message::error_response(
                Some(receiver),
                ErrorKind::of(&e),
                &e.to_string(),
            ));
            self.wake.notify_one();
            return Ok(());
        }
        let partition = self
            .registry
            .upgrade()
            .and_then(|r| r.lock().unwrap().get(&partition_id).cloned());
        let Some(partition) = partition else {
            st.control.push_back(Message::PartitionNotFound { receiver });
            self.wake.notify_one();
            return Ok(());
        };
        let attached = partition
            .subpartition(subpartition as usize)
            .cloned()
            .and_then(|sub| {
                let weak = Arc::downgrade(self);
                let listener: crate::partition::subpartition::Listener = Arc::new(move || {
                    if let Some(c) = weak.upgrade() {
                        c.signal(receiver);
                    }
                });
                if sub.attach_reader(listener) {
                    sub.set_remote_reader(&self.peer)
                        .set_credit(u64::from(initial_credit.get()));
                    Ok(sub)
                } else {
                    Err(Error::AlreadyConsumed {
                        partition: partition_id.clone(),
                        index: subpartition as usize,
                    })
                }
            });
        match attached {
            Ok(sub) => {
                log::debug!(
                    "{}: serving {partition_id:?}[{subpartition}] to {receiver}",
                    self.peer
                );
                st.readers.insert(
                    receiver,
                    SubReader {
                        partition,
                        sub,
                        credit: SenderCredit::new(initial_credit),
                        queue: VecDeque::new(),
                        chunks: 0,
                        encoder: None,
                        framing: RecordFraming::default(),
                        drained: false,
                        paused: false,
                    },
                );
                self.refresh(&mut st, receiver)?;
            }
            Err(e) => {
                let kind = ErrorKind::of(&e);
                st.control
                    .push_back(Message::error_response(Some(receiver), kind, &e.to_string()));
            }
        }
        self.wake.notify_one();
        Ok(())
    }

    fn on_add_credit(&self, receiver: ReceiverId, credit: Credit) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        let Some(r) = st.readers.get_mut(&receiver) else {
            // Credit for a reader that just ended or was cancelled: harmless.
            return Ok(());
        };
        let was_available = r.credit.can_send_data();
        r.credit.on_add_credit(credit)?;
        r.publish_credit();
        if !was_available {
            self.refresh(&mut st, receiver)?;
            self.wake.notify_one();
        }
        Ok(())
    }

    /// The receiver aligned the checkpoint whose barrier paused `receiver`'s reader.
    fn on_resume(&self, receiver: ReceiverId) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        let Some(r) = st.readers.get_mut(&receiver) else {
            // The reader ended or was cancelled meanwhile: harmless.
            return Ok(());
        };
        r.paused = false;
        self.refresh(&mut st, receiver)?;
        self.wake.notify_one();
        Ok(())
    }

    /// Buffer debloating: the receiver wants `receiver`'s buffers cut at `size` bytes. A size
    /// over the negotiated payload limit breaks the protocol (zero is refused by the codec);
    /// a size for a reader that already ended is ignored.
    fn on_new_buffer_size(&self, receiver: ReceiverId, size: u32) -> Result<()> {
        let size = size as usize;
        if size > self.payload_limit {
            return Err(Error::Protocol(format!(
                "NewBufferSize of {size} bytes for {receiver} exceeds the segment size of {} bytes",
                self.payload_limit
            )));
        }
        if let Some(r) = self.state.lock().unwrap().readers.get(&receiver) {
            log::debug!("{}: {receiver} buffers cut at {size} bytes", self.peer);
            r.sub.set_buffer_size(size);
        }
        Ok(())
    }

    fn cancel(&self, receiver: ReceiverId) {
        let mut st = self.state.lock().unwrap();
        st.ready.remove(receiver);
        if let Some(r) = st.readers.remove(&receiver) {
            log::debug!("{}: {receiver} cancelled", self.peer);
            r.sub.release();
            r.partition.subpartition_done();
        }
    }

    /// The connection ended. Readers not at their end lost their consumer: their
    /// partitions fail their writers (when `lost`) and their segments go back to the pools.
    fn shutdown(&self, lost: Option<&Error>) {
        let readers: Vec<SubReader> = {
            let mut st = self.state.lock().unwrap();
            st.ready = ReadyQueue::new();
            st.control.clear();
            st.readers.drain().map(|(_, r)| r).collect()
        };
        for r in readers {
            r.sub.release();
            if let Some(e) = lost {
                r.partition.consumer_lost(&format!(
                    "the consumer of subpartition {} at {} went away: {e}",
                    r.sub.index(),
                    self.peer
                ));
            }
            r.partition.subpartition_done();
        }
    }

    /// Gathers the next frames to write: control messages first, then data round robin.
    fn collect(&self) -> Result<Vec<OutFrame>> {
        let signalled = std::mem::take(&mut *self.signalled.lock().unwrap());
        let mut st = self.state.lock().unwrap();
        for rid in signalled {
            self.refresh(&mut st, rid)?;
        }
        let mut frames = Vec::new();
        let mut bytes = 0;
        while let Some(msg) = st.control.pop_front() {
            let f = OutFrame::control(&msg)?;
            bytes += f.len();
            frames.push(f);
        }
        while bytes < MAX_WRITE_BYTES && frames.len() < MAX_WRITE_FRAMES {
            let Some(rid) = st.ready.dequeue() else { break };
            let Some(r) = st.readers.get_mut(&rid) else {
                continue;
            };
            let queue_head = r.head();
            if !r.credit.is_available(queue_head) {
                continue;
            }
            let frame = match r.queue.front_mut().expect("available means non-empty") {
                Item::Data(cursor) => {
                    let (parts, len) = cursor.take();
                    for part in &parts {
                        r.framing.advance(part.bytes());
                    }
                    let hold = if cursor.remaining == 0 {
                        cursor.hold.take()
                    } else {
                        None
                    };
                    if cursor.remaining == 0 {
                        r.queue.pop_front();
                    }
                    r.chunks -= 1;
                    let header = if queue_head == QueueHead::RecordBody {
                        r.credit.on_record_body_sent(r.backlog())
                    } else {
                        r.credit.on_buffer_sent(DataType::Data, r.backlog())?
                    };
                    if let Some(stats) = r.sub.remote_reader() {
                        stats.count_sent(len);
                        stats.set_credit(u64::from(r.credit.credit().get()));
                    }
                    let head = wire::encode_buffer_response_header(rid, header, len)?;
                    OutFrame {
                        head: head.to_vec(),
                        parts,
                        _hold: hold,
                    }
                }
                Item::Event(_) => {
                    let Some(Item::Event(event)) = r.queue.pop_front() else {
                        unreachable!()
                    };
                    let header = r.credit.on_buffer_sent(DataType::Event, r.backlog())?;
                    let mut head = Vec::with_capacity(BUFFER_RESPONSE_HEADER_LEN + 8);
                    let ev = event.to_wire();
                    let msg = Message::event(rid, header.sequence_number, header.backlog, ev);
                    wire::encode(&msg, &mut head)?;
                    if event.is_end() {
                        // The reader is at its end: nothing more to serve.
                        let r = st.readers.remove(&rid).expect("present");
                        r.partition.subpartition_done();
                    }
                    OutFrame {
                        head,
                        parts: Vec::new(),
                        _hold: None,
                    }
                }
            };
            bytes += frame.len();
            frames.push(frame);
            self.refresh(&mut st, rid)?;
        }
        // Backlog announcements queued by the refreshes above go out in this write too.
        while let Some(msg) = st.control.pop_front() {
            frames.push(OutFrame::control(&msg)?);
        }
        Ok(frames)
    }
}

/// Serves one accepted, not yet authenticated connection until it ends.
pub(crate) async fn serve<R, W>(rd: R, mut wr: W, peer: String, ctx: ServeContext)
where
    R: FrameSource,
    W: AsyncWrite + Unpin,
{
    let mut reader = FrameReader::new(rd);
    let hs = handshake::server_handshake(&mut reader, &mut wr, ctx.segment_size, ctx.secret.as_deref());
    let negotiated = match tokio::time::timeout(ctx.handshake_timeout, hs).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            log::warn!("creditflow: refused connection from {peer}: {e}");
            return;
        }
        Err(_) => {
            log::warn!(
                "creditflow: dropped connection from {peer}: no handshake within {:?}",
                ctx.handshake_timeout
            );
            return;
        }
    };
    let conn = Arc::new(ServerConn {
        peer: peer.clone(),
        payload_limit: negotiated.payload_limit,
        limits: ctx.limits,
        registry: ctx.registry,
        state: Mutex::new(ServerState::default()),
        signalled: Mutex::new(Vec::new()),
        wake: Notify::new(),
        closing: Default::default(),
    });
    ctx.served.lock().unwrap().push(Arc::downgrade(&conn));
    let mut shutdown = ctx.shutdown.clone();
    let mut closing = false;
    let result = {
        let writer = write_loop(&conn, &mut wr);
        tokio::pin!(writer);
        let r = tokio::select! {
            r = read_loop(&conn, &mut reader) => Some(r),
            r = &mut writer => Some(r),
            _ = shutdown.wait_for(|c| *c) => None,
        };
        match r {
            Some(r) => r,
            None => {
                // The environment closes: finish the write in progress and whatever is
                // queued (last buffers, end-of-partition events), then close our side.
                closing = true;
                conn.closing.store(true, std::sync::atomic::Ordering::SeqCst);
                conn.wake.notify_one();
                tokio::time::timeout(CLOSE_FLUSH, &mut writer)
                    .await
                    .unwrap_or(Ok(()))
            }
        }
    };
    if closing && result.is_ok() {
        // FIN, then read until the peer closes too: closing with its AddCredits unread
        // would make the kernel send a reset, which can discard data the peer has not read.
        let _ = wr.shutdown().await;
        let _ = tokio::time::timeout(CLOSE_FLUSH, async {
            while let Ok(frame) = reader.next().await {
                if let InFrame::Data(_) = frame {
                    break;
                }
            }
        })
        .await;
    }
    match &result {
        Ok(()) => {
            log::debug!("creditflow: connection from {peer} closed");
            conn.shutdown(None);
        }
        Err(e) => {
            if matches!(e, Error::Protocol(_) | Error::LimitExceeded(_)) {
                log::warn!("creditflow: closing connection from {peer}: {e}");
                limits::send_fatal(&mut wr, e).await;
            } else {
                log::info!("creditflow: connection from {peer} ended: {e}");
            }
            conn.shutdown(Some(e));
        }
    }
    drop(ctx.slot);
}

/// What a served connection needs from its environment.
pub(crate) struct ServeContext {
    pub(crate) segment_size: usize,
    pub(crate) secret: Option<Vec<u8>>,
    pub(crate) handshake_timeout: std::time::Duration,
    pub(crate) limits: Limits,
    /// This connection's place under `max_connections`, held until it ends.
    pub(crate) slot: Slot,
    pub(crate) registry: Weak<Registry>,
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
    pub(crate) served: Arc<Mutex<Vec<Weak<ServerConn>>>>,
}

/// How long a closing connection may take to write what is queued, and to see the peer close.
const CLOSE_FLUSH: std::time::Duration = std::time::Duration::from_millis(1000);

async fn read_loop<R: FrameSource>(conn: &Arc<ServerConn>, reader: &mut FrameReader<R>) -> Result<()> {
    loop {
        let msg = match reader.next().await {
            Ok(InFrame::Message(m)) => m,
            Ok(InFrame::Data(_)) => {
                return Err(Error::Protocol("a client sent a data buffer".into()));
            }
            Err(e) => return Err(e),
        };
        match msg {
            Message::PartitionRequest {
                partition_id,
                subpartition,
                receiver,
                initial_credit,
            } => {
                conn.on_partition_request(partition_id, subpartition, receiver, initial_credit)?;
                // Answers pile up: let the writer (polled with this loop) send them first.
                if conn.outstanding() > conn.limits.max_outstanding_requests / 2 {
                    tokio::task::yield_now().await;
                }
            }
            Message::AddCredit { receiver, credit } => conn.on_add_credit(receiver, credit)?,
            Message::CancelPartitionRequest { receiver } => conn.cancel(receiver),
            Message::ResumeConsumption { receiver } => conn.on_resume(receiver)?,
            Message::NewBufferSize { receiver, size } => conn.on_new_buffer_size(receiver, size)?,
            Message::CloseRequest => return Ok(()),
            Message::ErrorResponse {
                receiver: None,
                kind,
                message,
            } => return Err(handshake::remote_error(kind, &message)),
            Message::ErrorResponse {
                receiver: Some(receiver),
                ..
            } => conn.cancel(receiver),
            other => {
                return Err(Error::Protocol(format!(
                    "a client sent {:?}, which only servers send",
                    other.message_type()
                )))
            }
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(conn: &Arc<ServerConn>, wr: &mut W) -> Result<()> {
    loop {
        let frames = conn.collect()?;
        if frames.is_empty() {
            if conn.closing.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            conn.wake.notified().await;
            continue;
        }
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(frames.len() * 4);
        for f in &frames {
            slices.push(IoSlice::new(&f.head));
            slices.extend(f.parts.iter().map(|p| IoSlice::new(p.bytes())));
        }
        io::write_all_vectored(wr, &mut slices).await?;
        // Dropping the frames recycles their segments and releases handed-off batches.
    }
}
