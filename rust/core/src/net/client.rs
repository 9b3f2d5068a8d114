//! The receiving side: connections this environment opened to read remote subpartitions
//! (Flink's `PartitionRequestClient`, `CreditBasedPartitionRequestClientHandler` and
//! `RemoteInputChannel`).
//!
//! * [`ClientConn`]: one per remote environment, shared by every remote channel of every
//!   gate of this environment that reads from it. Its reader half takes each data
//!   BufferResponse's header, asks the gate's [`GateCredit`] which buffer it stands for, and
//!   gathers the channel's records from the payloads (a [`RecordAssembler`] per channel):
//!   the body bytes of a record in progress are read from the socket straight into the
//!   record's own buffer, so the reader thread gets whole records and copies nothing; length
//!   prefixes and short pieces that the socket has not delivered yet go through the segment.
//!   A data buffer wholly inside a record in progress that does not complete it is a *record
//!   body buffer*: it needs no credit and takes no segment (see [`crate::protocol::credit`]), it is read
//!   straight into the record. Otherwise credit follows Flink's spanning-record deserializer:
//!   a buffer that only carried part of a record in progress is recycled at once (its bytes
//!   already sit in the record), and a buffer that completed records holds its credit until
//!   the reader has taken them. So the reader is woken once per record rather than once per
//!   buffer, and the memory outside the gate's segments is at most one record in progress
//!   plus, per buffer of credit, the records it completed (each at most `max_record_size`).
//!   Its writer half sends
//!   PartitionRequests, AddCredits (the amount taken when the message is written, so a burst
//!   of recycled buffers costs one message), CancelPartitionRequests and CloseRequest.
//! * [`RemoteGate`]: the buffers of one input gate — its exclusive and floating segments,
//!   held for the gate's life, and the credit state that says which one a buffer goes into.
//! * [`RemoteChannel`]: one channel's inbox of received buffers and events, read by the
//!   gate's thread, which hands each buffer back ([`Received`] drop) once deserialized.
//!
//! In `flow_control="tcp"` mode there is no credit: the request carries unlimited credit,
//! and the reader half takes any free segment of the gate, or stops reading the socket
//! until one is recycled, so TCP's window stalls every channel of the connection at once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use arrow_buffer::Buffer;

use super::handshake;
use super::io::{self, FrameReader, FrameSource, InFrame};
use crate::base::config::{Backoff, ChannelSpec, FlowControl};
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::memory::PooledSegment;
use crate::partition::subpartition::Listener;
use crate::protocol::credit::{
    BufferLease, ChannelCreditStats, ChannelId, Credit, Delivery, GateCredit, GateCreditConfig,
    ReceiverAction,
};
use crate::protocol::wire::{self, ErrorKind, Message, Payload, ReceiverId};
use crate::serde::RecordAssembler;

/// A snapshot of a gate's remote buffers (credit mode; in tcp mode only the totals and
/// queued buffers mean anything).
#[derive(Debug, Clone, Copy, Default)]
pub struct RemoteStats {
    /// Remote channels opened by the gate.
    pub remote_channels: usize,
    /// Exclusive buffers of channels still open.
    pub exclusive_total: usize,
    /// Exclusive buffers holding received data not yet read.
    pub exclusive_in_use: usize,
    /// Floating buffers of the gate.
    pub floating_total: usize,
    /// Floating buffers assigned to channels (holding data or promised to a sender).
    pub floating_in_use: usize,
    /// Empty buffers announced to senders (their credit, in flight included).
    pub credit_announced: usize,
    /// Empty buffers not yet announced.
    pub credit_unannounced: usize,
    /// Received buffers waiting to be read.
    pub queued_buffers: usize,
}

/// Buffers and credit of one remote channel, for metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct RemoteChannelStats {
    /// Exclusive buffers holding received data not yet read.
    pub exclusive_in_use: usize,
    /// Floating buffers assigned to the channel (holding data or promised to the sender).
    pub floating_in_use: usize,
    /// Empty buffers announced to the sender (its credit, in flight included).
    pub credit_announced: usize,
    /// Empty buffers not yet announced.
    pub credit_unannounced: usize,
    /// The sender's last announced backlog plus the exclusive buffers (buffers wanted).
    pub required: usize,
    /// Received buffers waiting to be read.
    pub queued_buffers: usize,
}

/// What a remote channel's inbox holds.
pub(crate) enum Inbound {
    /// A data buffer.
    Data(Received),
    /// An event (end of partition, producer failed, user event, checkpoint barrier).
    Event(Event),
    /// The channel failed (connection lost, partition not found, remote error).
    Failed(Error),
}

impl Inbound {
    /// Whether nothing follows it on the channel (end of partition or a failure).
    fn is_last(&self) -> bool {
        match self {
            Inbound::Data(_) => false,
            Inbound::Event(ev) => matches!(ev, Event::EndOfPartition | Event::ProducerFailed(_)),
            Inbound::Failed(_) => true,
        }
    }
}

/// A received data buffer that completed records: the records (whole bodies, without their
/// length prefixes) and the buffer's credit. Dropping it gives the segment back to the gate
/// (and its credit back to the sender).
pub(crate) struct Received {
    segment: Option<PooledSegment>,
    records: Vec<Buffer>,
    /// Network buffers this stands for: itself and the ones recycled before it that carried
    /// only parts of its first record.
    buffers: usize,
    lease: Option<BufferLease>,
    gate: Arc<RemoteGate>,
}

impl Received {
    /// The records this buffer completed, in order (taken once).
    pub(crate) fn take_records(&mut self) -> Vec<Buffer> {
        std::mem::take(&mut self.records)
    }

    /// Network buffers this stands for (for the gate's buffer counters).
    pub(crate) fn buffers(&self) -> usize {
        self.buffers
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        if let Some(seg) = self.segment.take() {
            self.gate.recycle(std::iter::once((seg, self.lease.take())));
        }
    }
}

/// Hands back many received buffers at once: one lock, and one AddCredit per channel for
/// the whole burst rather than one per buffer.
pub(crate) fn recycle_all(received: Vec<Received>) {
    let Some(gate) = received.first().map(|r| r.gate.clone()) else {
        return;
    };
    gate.recycle(
        received
            .into_iter()
            .filter_map(|mut r| r.segment.take().map(|seg| (seg, r.lease.take()))),
    );
}

struct GateBuffers {
    credit: GateCredit,
    free: Vec<PooledSegment>,
    /// Channels by credit id, to route AddCredit requests.
    channels: Vec<Weak<RemoteChannel>>,
    closed: bool,
}

/// The remote half of one input gate: its segments and its credit.
pub(crate) struct RemoteGate {
    flow: FlowControl,
    /// Largest record a channel accepts (a longer length prefix fails the channel).
    max_record: usize,
    bufs: Mutex<GateBuffers>,
    /// tcp mode: a reader task waits here for a free segment.
    recycled: Notify,
    /// An unaligned checkpoint barrier arrived and was not yet taken: the gate reads its
    /// channels before yielding what it already queued, so the barrier overtakes that too.
    priority: AtomicBool,
}

impl RemoteGate {
    /// Whether an unaligned barrier arrived since the last call (and clears the flag).
    pub(crate) fn take_priority(&self) -> bool {
        self.priority.load(Ordering::Relaxed) && self.priority.swap(false, Ordering::AcqRel)
    }

    /// A gate's remote half over `segments` (exclusive ones for every channel, then floating).
    pub(crate) fn new(
        flow: FlowControl,
        exclusive_per_channel: usize,
        floating: usize,
        segments: Vec<PooledSegment>,
        max_record: usize,
    ) -> Result<Arc<RemoteGate>> {
        let credit = GateCredit::new(GateCreditConfig {
            exclusive_buffers_per_channel: exclusive_per_channel as u32,
            floating_buffers: floating as u32,
        })?;
        Ok(Arc::new(RemoteGate {
            priority: AtomicBool::new(false),
            flow,
            max_record,
            bufs: Mutex::new(GateBuffers {
                credit,
                free: segments,
                channels: Vec::new(),
                closed: false,
            }),
            recycled: Notify::new(),
        }))
    }

    /// Buffers and credit of the remote channels, for metrics.
    pub(crate) fn stats(&self) -> RemoteStats {
        let b = self.bufs.lock().unwrap();
        let cfg = b.credit.config();
        let mut s = RemoteStats {
            remote_channels: b.credit.num_channels(),
            floating_total: cfg.floating_buffers as usize,
            ..RemoteStats::default()
        };
        for i in 0..b.credit.num_channels() {
            let Some(c) = b.credit.channel_stats(ChannelId(i)) else {
                continue;
            };
            if c.released {
                continue;
            }
            s.exclusive_total += cfg.exclusive_buffers_per_channel as usize;
            s.exclusive_in_use += c.exclusive_in_use as usize;
            s.floating_in_use += (c.floating_in_use + c.floating_available) as usize;
            s.credit_announced += c.announced.get() as usize;
            s.credit_unannounced += c.unannounced.get() as usize;
        }
        let channels: Vec<Arc<RemoteChannel>> = b.channels.iter().filter_map(Weak::upgrade).collect();
        drop(b);
        s.queued_buffers = channels.iter().map(|c| c.queued()).sum();
        s
    }

    /// Buffers and credit per remote channel, by the channel's spec, for metrics.
    pub(crate) fn channel_stats(&self) -> HashMap<ChannelSpec, RemoteChannelStats> {
        let b = self.bufs.lock().unwrap();
        let channels: Vec<(Arc<RemoteChannel>, ChannelCreditStats)> = b
            .channels
            .iter()
            .filter_map(|w| {
                let ch = w.upgrade()?;
                let stats = b.credit.channel_stats(ch.cid)?;
                Some((ch, stats))
            })
            .collect();
        drop(b);
        channels
            .into_iter()
            .map(|(ch, c)| {
                let stats = RemoteChannelStats {
                    exclusive_in_use: c.exclusive_in_use as usize,
                    floating_in_use: (c.floating_in_use + c.floating_available) as usize,
                    credit_announced: c.announced.get() as usize,
                    credit_unannounced: c.unannounced.get() as usize,
                    required: c.required as usize,
                    queued_buffers: ch.queued(),
                };
                (ch.spec.clone(), stats)
            })
            .collect()
    }

    fn recycle(&self, buffers: impl Iterator<Item = (PooledSegment, Option<BufferLease>)>) {
        let wake = {
            let mut b = self.bufs.lock().unwrap();
            if b.closed {
                return;
            }
            for (seg, lease) in buffers {
                b.free.push(seg);
                if let Some(lease) = lease {
                    if let Err(e) = b.credit.on_buffer_recycled(lease) {
                        log::error!("creditflow: recycling a buffer: {e}");
                    }
                }
            }
            drain_actions(&mut b)
        };
        for ch in wake {
            ch.conn.request_credit(ch.rid);
        }
        if self.flow == FlowControl::Tcp {
            self.recycled.notify_waiters();
        }
    }

    /// The gate closed: later recycled segments go back to the memory layer.
    pub(crate) fn close(&self) {
        let mut b = self.bufs.lock().unwrap();
        b.closed = true;
        b.free.clear();
        drop(b);
        self.recycled.notify_waiters();
    }

    /// Where a data BufferResponse's payload goes (credit mode: as the credit state says;
    /// tcp mode: into any free segment, waiting for a recycled one). `inside_record`: the
    /// payload lies wholly inside the channel's record in progress without completing it.
    async fn take_buffer(
        self: &Arc<Self>,
        ch: &RemoteChannel,
        header: wire::BufferResponseHeader,
        inside_record: bool,
    ) -> Result<Landing> {
        if self.flow == FlowControl::Tcp {
            ch.check_sequence(header.sequence_number)?;
            loop {
                let notified = self.recycled.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                {
                    let mut b = self.bufs.lock().unwrap();
                    if b.closed || ch.released.load(Ordering::SeqCst) {
                        return Ok(Landing::Drop);
                    }
                    if let Some(seg) = b.free.pop() {
                        return Ok(Landing::Segment(seg, None));
                    }
                }
                // No free segment: stop reading the socket until one is recycled.
                notified.await;
            }
        }
        let (delivery, wake) = {
            let mut b = self.bufs.lock().unwrap();
            let delivery = if inside_record {
                b.credit
                    .on_buffer_response_inside_record(ch.cid, header.credit_header())?
            } else {
                b.credit.on_buffer_response(ch.cid, header.credit_header())?
            };
            let wake = drain_actions(&mut b);
            let out = match delivery {
                Delivery::Record => Landing::Record,
                Delivery::Data(lease) => match b.free.pop() {
                    Some(seg) => Landing::Segment(seg, Some(lease)),
                    None if b.closed => Landing::Drop,
                    None => {
                        return Err(Error::Protocol(format!(
                            "{}: a credited buffer arrived but the gate has no free segment",
                            header.receiver
                        )))
                    }
                },
                Delivery::Event | Delivery::Discarded => Landing::Drop,
            };
            (out, wake)
        };
        for c in wake {
            c.conn.request_credit(c.rid);
        }
        Ok(delivery)
    }

    /// An event or a backlog announcement: sequence check / floating buffers.
    fn on_event(&self, ch: &RemoteChannel, header: wire::BufferResponseHeader) -> Result<()> {
        if self.flow == FlowControl::Tcp {
            return ch.check_sequence(header.sequence_number);
        }
        let wake = {
            let mut b = self.bufs.lock().unwrap();
            let delivery = b.credit.on_buffer_response(ch.cid, header.credit_header())?;
            debug_assert!(matches!(delivery, Delivery::Event | Delivery::Discarded));
            drain_actions(&mut b)
        };
        for c in wake {
            c.conn.request_credit(c.rid);
        }
        Ok(())
    }

    fn on_backlog(&self, ch: &RemoteChannel, backlog: u32) -> Result<()> {
        if self.flow == FlowControl::Tcp {
            return Ok(());
        }
        let wake = {
            let mut b = self.bufs.lock().unwrap();
            b.credit.on_backlog_announcement(ch.cid, backlog)?;
            drain_actions(&mut b)
        };
        for c in wake {
            c.conn.request_credit(c.rid);
        }
        Ok(())
    }

    fn release(&self, ch: &RemoteChannel) {
        if self.flow == FlowControl::Tcp {
            return;
        }
        let wake = {
            let mut b = self.bufs.lock().unwrap();
            let _ = b.credit.release_channel(ch.cid);
            drain_actions(&mut b)
        };
        for c in wake {
            c.conn.request_credit(c.rid);
        }
    }

    /// Whether `ch`'s AddCredit is due now (see [`GateCredit::announcement_due`]). Credit
    /// pending means the AddCredit is already queued for the writer (the credit state asks
    /// for one when unannounced credit leaves zero), so the caller need only let it run.
    fn credit_running_low(&self, ch: &RemoteChannel) -> bool {
        self.bufs.lock().unwrap().credit.announcement_due(ch.cid)
    }

    fn take_credit(&self, ch: &RemoteChannel) -> Option<Credit> {
        self.bufs.lock().unwrap().credit.take_unannounced_credit(ch.cid)
    }
}

/// Where the payload of a data BufferResponse goes, from [`RemoteGate::take_buffer`].
enum Landing {
    /// Into this segment (with its claim on the credit state in credit mode), then into the
    /// channel's records.
    Segment(PooledSegment, Option<BufferLease>),
    /// Straight into the channel's record in progress, credited against its memory.
    Record,
    /// Nowhere: the channel was released or the gate closed; skip the payload.
    Drop,
}

fn drain_actions(b: &mut GateBuffers) -> Vec<Arc<RemoteChannel>> {
    let mut out = Vec::new();
    while let Some(ReceiverAction::SendAddCredit { channel }) = b.credit.poll_action() {
        if let Some(ch) = b.channels.get(channel.0).and_then(Weak::upgrade) {
            out.push(ch);
        }
    }
    out
}

struct Inbox {
    items: VecDeque<Inbound>,
    /// The last item (end of partition or failure) was queued.
    done: bool,
}

/// One remote input channel.
pub(crate) struct RemoteChannel {
    rid: ReceiverId,
    cid: ChannelId,
    spec: ChannelSpec,
    gate: Arc<RemoteGate>,
    conn: Arc<ClientConn>,
    inbox: Mutex<Inbox>,
    notify: Listener,
    /// tcp mode: the next sequence number (credit mode: the credit state checks).
    next_sequence: AtomicU64,
    /// Backoff of the partition request: the delay used last (`None` before the first retry).
    retry: Mutex<Option<Duration>>,
    backoff: Backoff,
    released: AtomicBool,
    /// Buffer debloating: the size last announced to the sender (0: none), sent again with
    /// a retried partition request.
    buffer_size: std::sync::atomic::AtomicUsize,
}

impl RemoteChannel {
    /// Buffer debloating: asks the sender to cut this channel's buffers at `size` bytes
    /// (NewBufferSize; clamped to the connection's payload limit when it is written).
    pub(crate) fn announce_buffer_size(&self, size: usize) {
        let size = size.clamp(1, u32::MAX as usize);
        self.buffer_size.store(size, Ordering::Relaxed);
        if !self.released.load(Ordering::SeqCst) {
            self.conn.send(Message::NewBufferSize {
                receiver: self.rid,
                size: size as u32,
            });
        }
    }

    /// Everything received so far, in order (the channel notifies again on the next item).
    pub(crate) fn take_all(&self) -> VecDeque<Inbound> {
        std::mem::take(&mut self.inbox.lock().unwrap().items)
    }

    /// Received buffers not yet taken.
    pub(crate) fn queued(&self) -> usize {
        self.inbox.lock().unwrap().items.len()
    }

    fn push(&self, item: Inbound) {
        {
            let mut inbox = self.inbox.lock().unwrap();
            if inbox.done {
                return;
            }
            if item.is_last() {
                inbox.done = true;
            }
            inbox.items.push_back(item);
        }
        (self.notify)();
    }

    /// Ends the channel with an error (unless it already ended).
    fn fail(&self, error: Error) {
        self.push(Inbound::Failed(error));
        self.gate.release(self);
    }

    fn check_sequence(&self, seq: u64) -> Result<()> {
        let expected = self.next_sequence.fetch_add(1, Ordering::SeqCst);
        if seq != expected {
            return Err(Error::Protocol(format!(
                "{}: buffer out of order: expected sequence number {expected}, got {seq}",
                self.rid
            )));
        }
        Ok(())
    }

    fn request(&self) -> Message<'static> {
        Message::PartitionRequest {
            partition_id: self.spec.partition_id.clone(),
            subpartition: self.spec.subpartition as u32,
            receiver: self.rid,
            initial_credit: match self.gate.flow {
                FlowControl::Credit => self.gate.bufs.lock().unwrap().credit.initial_credit(),
                FlowControl::Tcp => Credit::new(u32::MAX),
            },
        }
    }

    /// Lets the sender's reader, paused after an aligned checkpoint barrier, continue.
    pub(crate) fn resume_consumption(&self) {
        if !self.released.load(Ordering::SeqCst) {
            self.conn.send(Message::ResumeConsumption { receiver: self.rid });
        }
    }

    /// The reader of this channel goes away: stop the sender, free the buffers.
    pub(crate) fn close(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        let ended = {
            let mut inbox = self.inbox.lock().unwrap();
            let ended = inbox.done;
            inbox.done = true;
            inbox.items.clear();
            ended
        };
        self.conn.channels.lock().unwrap().remove(&self.rid);
        self.conn.closed.lock().unwrap().push(self.rid);
        if !ended {
            self.conn
                .send(Message::CancelPartitionRequest { receiver: self.rid });
        }
        self.gate.release(self);
    }
}

#[derive(Default)]
struct Outbox {
    control: VecDeque<Message<'static>>,
    credit: Vec<ReceiverId>,
    close: bool,
    /// The writer was woken and has not collected yet (saves redundant wake-ups).
    woken: bool,
}

/// One connection to a remote environment.
pub(crate) struct ClientConn {
    addr: String,
    out: Mutex<Outbox>,
    wake: Notify,
    channels: Mutex<HashMap<ReceiverId, Arc<RemoteChannel>>>,
    /// Why the connection failed, once it did (new channels need a new connection). Set
    /// under the `channels` lock, so that a channel opened while the connection fails gets
    /// the same error (an `AuthenticationError` stays one).
    failure: Mutex<Option<Error>>,
    /// Channels their readers closed since the reader task last looked: it drops their
    /// records in progress (a cancelled channel may never send the rest).
    closed: Mutex<Vec<ReceiverId>>,
    /// The payload limit the handshake settled (0 before it): announced buffer sizes are
    /// clamped to it, as the sender refuses larger ones.
    payload_limit: std::sync::atomic::AtomicUsize,
}

impl ClientConn {
    fn send(&self, msg: Message<'static>) {
        self.enqueue(|out| out.control.push_back(msg));
    }

    fn request_credit(&self, rid: ReceiverId) {
        self.enqueue(|out| out.credit.push(rid));
    }

    fn enqueue(&self, f: impl FnOnce(&mut Outbox)) {
        let wake = {
            let mut out = self.out.lock().unwrap();
            f(&mut out);
            !std::mem::replace(&mut out.woken, true)
        };
        if wake {
            self.wake.notify_one();
        }
    }

    /// Whether the connection failed.
    pub(crate) fn is_dead(&self) -> bool {
        self.failure.lock().unwrap().is_some()
    }

    /// Asks the writer to send CloseRequest and stop.
    pub(crate) fn close(&self) {
        self.enqueue(|out| out.close = true);
    }

    /// Fails every channel of the connection, and any opened on it later.
    fn fail(&self, error: Error) {
        let channels: Vec<Arc<RemoteChannel>> = {
            let mut channels = self.channels.lock().unwrap();
            *self.failure.lock().unwrap() = Some(error);
            channels.drain().map(|(_, c)| c).collect()
        };
        for ch in channels {
            ch.fail(self.failure().expect("set above"));
        }
    }

    /// The error a channel of the failed connection gets (also one opened after it failed);
    /// `None` while the connection is up.
    fn failure(&self) -> Option<Error> {
        self.failure
            .lock()
            .unwrap()
            .as_ref()
            .map(|error| duplicate(error, &self.addr))
    }

    fn channel(&self, rid: ReceiverId) -> Option<Arc<RemoteChannel>> {
        self.channels.lock().unwrap().get(&rid).cloned()
    }

    fn remove(&self, rid: ReceiverId) -> Option<Arc<RemoteChannel>> {
        self.channels.lock().unwrap().remove(&rid)
    }

    /// Frames to write now, and whether to stop after them.
    fn collect(&self) -> Result<(Vec<u8>, bool)> {
        let (control, credit, close) = {
            let mut out = self.out.lock().unwrap();
            out.woken = false;
            (
                std::mem::take(&mut out.control),
                std::mem::take(&mut out.credit),
                out.close,
            )
        };
        let mut bytes = Vec::new();
        let limit = self.payload_limit.load(Ordering::Relaxed);
        for msg in &control {
            match *msg {
                Message::NewBufferSize { receiver, size } if limit > 0 && size as usize > limit => {
                    let size = limit.min(u32::MAX as usize) as u32;
                    wire::encode(&Message::NewBufferSize { receiver, size }, &mut bytes)?
                }
                _ => wire::encode(msg, &mut bytes)?,
            }
        }
        for rid in credit {
            let Some(ch) = self.channel(rid) else { continue };
            if let Some(credit) = ch.gate.take_credit(&ch) {
                wire::encode(
                    &Message::AddCredit {
                        receiver: rid,
                        credit,
                    },
                    &mut bytes,
                )?;
            }
        }
        if close {
            wire::encode(&Message::CloseRequest, &mut bytes)?;
        }
        Ok((bytes, close))
    }
}

/// The same error for another channel (errors are not `Clone`).
fn duplicate(error: &Error, addr: &str) -> Error {
    match error {
        Error::Authentication(m) => Error::Authentication(m.clone()),
        Error::Protocol(m) => Error::Protocol(format!("connection to {addr}: {m}")),
        Error::ConnectionLost(m) => Error::ConnectionLost(format!("connection to {addr}: {m}")),
        Error::LimitExceeded(m) => Error::LimitExceeded(format!("connection to {addr}: {m}")),
        other => Error::ConnectionLost(format!("connection to {addr}: {other}")),
    }
}

/// The error a channel fails with for an ErrorResponse about it.
fn channel_error(spec: &ChannelSpec, kind: ErrorKind, message: String) -> Error {
    match kind {
        ErrorKind::ProducerFailed => Error::ProducerFailed(message),
        ErrorKind::Authentication => Error::Authentication(message),
        ErrorKind::Protocol => Error::Protocol(message),
        ErrorKind::LimitExceeded => Error::LimitExceeded(format!("{spec:?}: {message}")),
        ErrorKind::SubpartitionOutOfRange | ErrorKind::AlreadyConsumed => {
            Error::InvalidArgument(format!("{spec:?}: {message}"))
        }
        ErrorKind::Internal => Error::ConnectionLost(format!("{spec:?}: the producer reports: {message}")),
    }
}

/// What a client connection needs from its environment.
#[derive(Clone)]
pub(crate) struct ClientContext {
    pub(crate) segment_size: usize,
    pub(crate) secret: Option<Vec<u8>>,
    pub(crate) handshake_timeout: Duration,
    /// TLS under the creditflow handshake; `None`: plaintext.
    pub(crate) tls: Option<Arc<super::tls::Tls>>,
    /// See `liveness`; zero: OS defaults.
    pub(crate) peer_timeout: Duration,
}

impl ClientConn {
    /// The state of a connection to `addr`, before anything connects it.
    fn new(addr: String) -> Arc<ClientConn> {
        Arc::new(ClientConn {
            addr,
            out: Mutex::new(Outbox::default()),
            wake: Notify::new(),
            channels: Mutex::new(HashMap::new()),
            failure: Mutex::new(None),
            closed: Mutex::new(Vec::new()),
            payload_limit: Default::default(),
        })
    }

    /// A connection to `addr`, connecting in the background; messages queue meanwhile.
    pub(crate) fn open(addr: String, ctx: ClientContext, rt: &tokio::runtime::Handle) -> Arc<ClientConn> {
        let conn = ClientConn::new(addr.clone());
        let c = conn.clone();
        rt.spawn(async move {
            let result = match tokio::time::timeout(
                ctx.handshake_timeout,
                tokio::net::TcpStream::connect(&addr),
            )
            .await
            {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    log::debug!("connected to {addr}");
                    super::liveness::set_peer_timeout(&stream, ctx.peer_timeout);
                    match &ctx.tls {
                        None => {
                            let (rd, wr) = stream.into_split();
                            run(&c, rd, wr, &ctx).await
                        }
                        Some(tls) => {
                            match tokio::time::timeout(ctx.handshake_timeout, tls.connect(&addr, stream))
                                .await
                            {
                                Ok(Ok((rd, wr))) => run(&c, rd, wr, &ctx).await,
                                Ok(Err(e)) => Err(e),
                                Err(_) => Err(Error::ConnectionLost(format!(
                                    "no TLS handshake within {:?}",
                                    ctx.handshake_timeout
                                ))),
                            }
                        }
                    }
                }
                Ok(Err(e)) => Err(Error::ConnectionLost(format!("cannot connect: {e}"))),
                Err(_) => Err(Error::ConnectionLost(format!(
                    "cannot connect: no answer within {:?}",
                    ctx.handshake_timeout
                ))),
            };
            let error = match result {
                Ok(()) => Error::ConnectionLost("closed".into()),
                Err(e) => e,
            };
            // Worth a warning only when it cuts channels off; after the last channel ended,
            // the producer closing its side is the normal end.
            let open = c.channels.lock().unwrap().len();
            if open > 0 {
                log::warn!("connection to {addr} failed with {open} channel(s) open: {error}");
            } else {
                log::debug!("connection to {addr} ended: {error}");
            }
            c.fail(error);
        });
        conn
    }

    /// Opens a channel on this connection and sends its PartitionRequest.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open_channel(
        self: &Arc<Self>,
        rid: ReceiverId,
        spec: ChannelSpec,
        gate: &Arc<RemoteGate>,
        notify: Listener,
        backoff: Backoff,
    ) -> Arc<RemoteChannel> {
        let mut bufs = gate.bufs.lock().unwrap();
        let cid = bufs.credit.add_channel();
        let ch = Arc::new(RemoteChannel {
            rid,
            cid,
            spec,
            gate: gate.clone(),
            conn: self.clone(),
            inbox: Mutex::new(Inbox {
                items: VecDeque::new(),
                done: false,
            }),
            notify,
            next_sequence: AtomicU64::new(0),
            retry: Mutex::new(None),
            backoff,
            released: AtomicBool::new(false),
            buffer_size: Default::default(),
        });
        bufs.channels.push(Arc::downgrade(&ch));
        drop(bufs);
        // Checked and inserted under the lock that `fail` drains: a channel is either failed
        // by `fail` or finds the connection's error here, never neither.
        let failure = {
            let mut channels = self.channels.lock().unwrap();
            let failure = self.failure();
            if failure.is_none() {
                channels.insert(rid, ch.clone());
            }
            failure
        };
        if let Some(error) = failure {
            ch.fail(error);
            return ch;
        }
        log::debug!(
            "{}: requesting {:?}[{}] as {rid}",
            self.addr,
            ch.spec.partition_id,
            ch.spec.subpartition
        );
        self.send(ch.request());
        ch
    }
}

async fn run<R, W>(conn: &Arc<ClientConn>, rd: R, mut wr: W, ctx: &ClientContext) -> Result<()>
where
    R: FrameSource,
    W: AsyncWrite + Unpin,
{
    let mut reader = FrameReader::new(rd);
    let hs = handshake::client_handshake(&mut reader, &mut wr, ctx.segment_size, ctx.secret.as_deref());
    let negotiated = match tokio::time::timeout(ctx.handshake_timeout, hs).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Error::ConnectionLost(format!(
                "no handshake within {:?}",
                ctx.handshake_timeout
            )))
        }
    };
    conn.payload_limit
        .store(negotiated.payload_limit, Ordering::Relaxed);
    let result = tokio::select! {
        r = read_loop(conn, &mut reader) => r,
        r = write_loop(conn, &mut wr) => r,
    };
    if let Err(Error::Protocol(m)) = &result {
        let msg = Message::error_response(None, ErrorKind::Protocol, m);
        let _ = io::write_message(&mut wr, &msg).await;
    }
    result
}

async fn write_loop<W: AsyncWrite + Unpin>(conn: &Arc<ClientConn>, wr: &mut W) -> Result<()> {
    loop {
        let notified = conn.wake.notified();
        let (bytes, close) = conn.collect()?;
        if !bytes.is_empty() {
            wr.write_all(&bytes)
                .await
                .map_err(|e| Error::ConnectionLost(e.to_string()))?;
            // A TLS writer may hold sealed records until flushed.
            wr.flush()
                .await
                .map_err(|e| Error::ConnectionLost(e.to_string()))?;
        }
        if close {
            let _ = wr.shutdown().await;
            // Wait for the peer to close its side (the read loop ends the task).
            std::future::pending::<()>().await;
        }
        if bytes.is_empty() {
            notified.await;
        }
    }
}

/// A channel's records in progress, on the connection's reader task.
struct Assembly {
    records: RecordAssembler,
    /// Buffers recycled since the last one that completed a record (for the counters).
    uncounted: usize,
}

/// Pieces of a record body shorter than this that the decoder does not already hold are
/// read through the segment (one read for the rest of the payload) rather than with a read
/// of their own, so many small records in one buffer do not cost a system call each.
const DIRECT_READ_MIN: usize = 4096;

/// Reads one data payload of `seg.len()` bytes into the channel's records, appending the
/// records it completes to `done`. The outer error is the connection's (the socket); the
/// inner one the channel's (a bad length prefix), after which the payload has still been
/// read to its end.
async fn read_records<R: FrameSource>(
    reader: &mut FrameReader<R>,
    asm: &mut RecordAssembler,
    seg: &mut [u8],
    done: &mut Vec<Buffer>,
) -> Result<Result<()>> {
    let mut left = seg.len();
    while left > 0 {
        let missing = asm.body_missing();
        let buffered = reader.buffered_payload();
        if missing > 0 && (missing.min(left) >= DIRECT_READ_MIN || buffered >= missing.min(left)) {
            let n = missing.min(left);
            reader.read_payload_into(&mut asm.body_spare()[..n]).await?;
            // SAFETY: `read_payload_into` initialized exactly these `n` bytes.
            if let Some(record) = unsafe { asm.commit_body(n) } {
                done.push(record);
            }
            left -= n;
        } else if missing == 0 && buffered >= asm.header_missing().min(left) {
            // A length prefix the decoder holds: no system call for it.
            let n = asm.header_missing().min(left);
            let mut prefix = [0u8; crate::serde::RECORD_HEADER_LEN];
            reader.read_payload(&mut prefix[..n]).await?;
            left -= n;
            if let Err(e) = asm.push(&prefix[..n], |_| unreachable!("a prefix completes no record")) {
                reader.read_payload(&mut seg[..left]).await?;
                return Ok(Err(e));
            }
        } else {
            let rest = &mut seg[..left];
            reader.read_payload(rest).await?;
            return Ok(asm.push(rest, |record| {
                done.push(record);
                Ok(())
            }));
        }
    }
    Ok(Ok(()))
}

async fn read_loop<R: FrameSource>(conn: &Arc<ClientConn>, reader: &mut FrameReader<R>) -> Result<()> {
    let mut assemblies: HashMap<ReceiverId, Assembly> = HashMap::new();
    loop {
        let frame = reader.next().await?;
        for rid in std::mem::take(&mut *conn.closed.lock().unwrap()) {
            assemblies.remove(&rid);
        }
        match frame {
            InFrame::Data(header) => {
                let Some(ch) = conn.channel(header.receiver) else {
                    assemblies.remove(&header.receiver);
                    reader.skip_payload().await?;
                    continue;
                };
                let inside_record = assemblies
                    .get(&header.receiver)
                    .is_some_and(|a| header.payload_len < a.records.body_missing());
                match ch.gate.take_buffer(&ch, header, inside_record).await? {
                    Landing::Record => {
                        let len = header.payload_len;
                        let a = assemblies.get_mut(&header.receiver).expect("inside its record");
                        reader
                            .read_payload_into(&mut a.records.body_spare()[..len])
                            .await?;
                        // SAFETY: `read_payload_into` initialized exactly these `len` bytes.
                        let completed = unsafe { a.records.commit_body(len) };
                        debug_assert!(completed.is_none(), "a buffer inside a record does not end it");
                        a.uncounted += 1;
                    }
                    Landing::Segment(mut seg, lease) => {
                        let len = header.payload_len;
                        let dst = seg.segment_mut().as_mut_slice();
                        if len > dst.len() {
                            return Err(Error::Protocol(format!(
                                "{}: payload of {len} bytes exceeds the segment size {}",
                                header.receiver,
                                dst.len()
                            )));
                        }
                        let a = assemblies.entry(header.receiver).or_insert_with(|| Assembly {
                            records: RecordAssembler::new(ch.gate.max_record),
                            uncounted: 0,
                        });
                        let mut records = Vec::new();
                        let outcome =
                            read_records(reader, &mut a.records, &mut dst[..len], &mut records).await?;
                        let received = Received {
                            segment: Some(seg),
                            records,
                            buffers: a.uncounted + 1,
                            lease,
                            gate: ch.gate.clone(),
                        };
                        if received.records.is_empty() {
                            // Only part of a record in progress: its bytes are in the record,
                            // so the buffer and its credit go back now (drop).
                            a.uncounted += 1;
                            drop(received);
                        } else {
                            a.uncounted = 0;
                            ch.push(Inbound::Data(received));
                        }
                        if let Err(e) = outcome {
                            assemblies.remove(&header.receiver);
                            if let Some(ch) = conn.remove(header.receiver) {
                                ch.fail(Error::Protocol(format!("channel {:?}: {e}", ch.spec)));
                            }
                        }
                        if ch.gate.credit_running_low(&ch) {
                            tokio::task::yield_now().await;
                        }
                    }
                    Landing::Drop => reader.skip_payload().await?,
                }
            }
            InFrame::Message(Message::BufferResponse(br)) => {
                let Some(ch) = conn.channel(br.receiver) else {
                    continue;
                };
                let header = br.header();
                ch.gate.on_event(&ch, header)?;
                if let Payload::Event(ev) = br.payload {
                    if matches!(ev, Event::Barrier { unaligned: true, .. }) {
                        // Set before the push's wake-up, so the gate sees it with the item.
                        ch.gate.priority.store(true, Ordering::Release);
                    }
                    let item = Inbound::Event(ev);
                    let mid_record = || {
                        assemblies
                            .get(&br.receiver)
                            .is_some_and(|a| !a.records.is_at_record_boundary())
                    };
                    if !item.is_last() {
                        // An aligned barrier comes between records; an unaligned one and a
                        // user event may come anywhere (the record completes after them).
                        if matches!(item, Inbound::Event(Event::Barrier { unaligned: false, .. }))
                            && mid_record()
                        {
                            conn.remove(br.receiver);
                            assemblies.remove(&br.receiver);
                            ch.fail(Error::Protocol(format!(
                                "channel {:?}: aligned barrier in the middle of a record",
                                ch.spec
                            )));
                        } else {
                            ch.push(item);
                        }
                        continue;
                    }
                    let partial = mid_record();
                    conn.remove(br.receiver);
                    assemblies.remove(&br.receiver);
                    if partial && matches!(item, Inbound::Event(Event::EndOfPartition)) {
                        ch.fail(Error::Protocol(format!(
                            "channel {:?} ended in the middle of a record",
                            ch.spec
                        )));
                    } else {
                        ch.push(item);
                        ch.gate.release(&ch);
                    }
                }
            }
            InFrame::Message(Message::BacklogAnnouncement { receiver, backlog }) => {
                if let Some(ch) = conn.channel(receiver) {
                    ch.gate.on_backlog(&ch, backlog)?;
                }
            }
            InFrame::Message(Message::PartitionNotFound { receiver }) => {
                if let Some(ch) = conn.channel(receiver) {
                    schedule_retry(conn, ch);
                }
            }
            InFrame::Message(Message::ErrorResponse {
                receiver: Some(receiver),
                kind,
                message,
            }) => {
                assemblies.remove(&receiver);
                if let Some(ch) = conn.remove(receiver) {
                    let e = channel_error(&ch.spec, kind, message);
                    ch.fail(e);
                }
            }
            InFrame::Message(Message::ErrorResponse {
                receiver: None,
                kind,
                message,
            }) => return Err(handshake::remote_error(kind, &message)),
            InFrame::Message(Message::CloseRequest) => {
                return Err(Error::ConnectionLost("the peer closed the connection".into()))
            }
            InFrame::Message(other) => {
                return Err(Error::Protocol(format!(
                    "a server sent {:?}, which only clients send",
                    other.message_type()
                )))
            }
        }
    }
}

/// The delay before the next partition request after one was answered PartitionNotFound:
/// `initial`, doubling up to `max`; `None` once a request at `max` failed (give up). `last` is
/// the delay used before the failed request (`None` for the first request).
pub(crate) fn next_retry_delay(last: Option<Duration>, backoff: Backoff) -> Option<Duration> {
    match last {
        None => Some(backoff.initial),
        Some(d) if d >= backoff.max => None,
        Some(d) => Some((d * 2).min(backoff.max)),
    }
}

/// The partition is not registered at the peer yet: ask again after the backoff, or fail.
fn schedule_retry(conn: &Arc<ClientConn>, ch: Arc<RemoteChannel>) {
    let delay = {
        let mut retry = ch.retry.lock().unwrap();
        let Some(next) = next_retry_delay(*retry, ch.backoff) else {
            drop(retry);
            conn.remove(ch.rid);
            let id = ch.spec.partition_id.clone();
            ch.fail(Error::PartitionNotFound(id));
            return;
        };
        *retry = Some(next);
        next
    };
    let conn = conn.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        if !ch.released.load(Ordering::SeqCst) && conn.channel(ch.rid).is_some() {
            conn.send(ch.request());
            // A size announced before the sender knew the channel was dropped there.
            match ch.buffer_size.load(Ordering::Relaxed) {
                0 => {}
                size => ch.announce_buffer_size(size),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The retry schedule on tokio's paused clock: 0.1 s doubling to 10 s, then give up.
    #[tokio::test(start_paused = true)]
    async fn partition_request_backoff_doubles_to_the_max_then_gives_up() {
        let backoff = Backoff::default();
        let start = tokio::time::Instant::now();
        let mut last = None;
        let mut delays = Vec::new();
        while let Some(d) = next_retry_delay(last, backoff) {
            tokio::time::sleep(d).await;
            delays.push(d.as_millis());
            last = Some(d);
        }
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 6400, 10000]);
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(delays.iter().sum::<u128>() as u64)
        );
    }

    fn open(conn: &Arc<ClientConn>, rid: u64, woken: &Arc<AtomicU64>) -> Arc<RemoteChannel> {
        let gate = RemoteGate::new(FlowControl::Credit, 2, 8, Vec::new(), 1 << 20).unwrap();
        let woken = woken.clone();
        let spec = ChannelSpec {
            address: conn.addr.clone(),
            partition_id: "p".into(),
            subpartition: 0,
        };
        let notify: Listener = Arc::new(move || {
            woken.fetch_add(1, Ordering::SeqCst);
        });
        conn.open_channel(ReceiverId(rid), spec, &gate, notify, Backoff::default())
    }

    fn failure_of(ch: &RemoteChannel) -> Option<Error> {
        ch.take_all().into_iter().find_map(|item| match item {
            Inbound::Failed(e) => Some(e),
            _ => None,
        })
    }

    /// A channel opened after its connection failed the handshake gets that failure
    /// (AuthenticationError), not a generic ConnectionLost, and is woken for it; channels
    /// open at the time get the same error.
    #[test]
    fn a_channel_opened_on_a_failed_connection_gets_its_error() {
        let conn = ClientConn::new("127.0.0.1:1".into());
        let woken = Arc::new(AtomicU64::new(0));
        let before = open(&conn, 1, &woken);
        conn.fail(Error::Authentication("the peer requires a shared secret".into()));
        let after = open(&conn, 2, &woken);
        for ch in [&before, &after] {
            let err = failure_of(ch).expect("the channel failed");
            assert!(
                matches!(&err, Error::Authentication(m) if m.contains("shared secret")),
                "{err}"
            );
        }
        assert_eq!(woken.load(Ordering::SeqCst), 2);
        assert!(conn.channels.lock().unwrap().is_empty());
        assert!(conn.is_dead());
    }

    /// Opening channels while the connection fails on another thread: every channel ends up
    /// failed with the connection's error, none is left registered and waiting.
    #[test]
    fn no_channel_slips_past_a_concurrent_failure() {
        for round in 0..200 {
            let conn = ClientConn::new("127.0.0.1:1".into());
            let woken = Arc::new(AtomicU64::new(0));
            let failer = {
                let conn = conn.clone();
                std::thread::spawn(move || conn.fail(Error::ConnectionLost(format!("reset {round}"))))
            };
            let channels: Vec<_> = (0..20).map(|rid| open(&conn, rid, &woken)).collect();
            failer.join().unwrap();
            for ch in &channels {
                let err = failure_of(ch).expect("every channel failed");
                assert!(
                    matches!(&err, Error::ConnectionLost(m) if m.contains(&format!("reset {round}"))),
                    "{err}"
                );
            }
            assert!(conn.channels.lock().unwrap().is_empty());
        }
    }

    #[test]
    fn a_max_below_initial_gives_up_after_one_retry() {
        let backoff = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_millis(10),
        };
        assert_eq!(next_retry_delay(None, backoff), Some(Duration::from_secs(1)));
        assert_eq!(next_retry_delay(Some(Duration::from_secs(1)), backoff), None);
    }
}
