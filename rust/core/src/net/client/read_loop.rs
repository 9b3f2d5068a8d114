//! The reader half of a connection: takes each data BufferResponse's header, asks the gate's
//! credit which buffer it stands for, and reads the payload into the channel's records (the
//! body bytes of a record in progress straight from the socket into the record's own
//! buffer); events, backlog announcements, PartitionNotFound and errors go to their channel.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow_buffer::Buffer;

use super::gate_buffers::Landing;
use super::retry::schedule_retry;
use super::state::{ClientConn, Inbound, Received, RecordBytes, RemoteChannel};
use crate::base::config::ChannelSpec;
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::memory::PooledSegment;
use crate::net::handshake;
use crate::net::io::{FrameReader, FrameSource, InFrame};
use crate::net::shm::{HeapLease, HeapReader};
use crate::protocol::credit::BufferLease;
use crate::protocol::wire::{
    BufferResponse, BufferResponseHeader, ErrorKind, Message, Payload, ReceiverId, SharedBuffer,
};
use crate::serde::RecordAssembler;

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

/// A channel's records in progress, on the connection's reader task.
struct Assembly {
    records: RecordAssembler,
    /// Bytes of the records started and not yet handed on in a [`Received`]: the one in
    /// progress (dropped with the assembly when the channel goes away).
    bytes: RecordBytes,
    /// Buffers recycled since the last one that completed a record (for the counters).
    uncounted: usize,
}

/// The heap items of a shared-memory link that channels are reading: the lease on each item
/// whose first buffer came and whose last has not, and where its next buffer starts.
pub(super) struct Items {
    heap: HeapReader,
    open: HashMap<ReceiverId, (Arc<HeapLease>, u64)>,
}

impl Items {
    pub(super) fn new(heap: HeapReader) -> Items {
        Items {
            heap,
            open: HashMap::new(),
        }
    }

    /// The lease on `b`'s item, checked against the channel's earlier buffers: an item's
    /// buffers come in order, from its start, one item at a time per channel. The reader lets
    /// go of it after the item's last buffer (the records decoded in place keep it).
    fn lease(&mut self, b: &SharedBuffer) -> Result<Arc<HeapLease>> {
        if b.offset == 0 {
            let lease = self.heap.lease(b.item, b.item_len).map_err(Error::Protocol)?;
            self.open.insert(b.receiver, (Arc::new(lease), 0));
        }
        let bad = || {
            Error::Protocol(format!(
                "{}: a shared buffer at {} of the item at {} out of order",
                b.receiver, b.offset, b.item
            ))
        };
        let (lease, next) = self.open.get_mut(&b.receiver).ok_or_else(bad)?;
        if lease.start() != b.item || lease.len() != b.item_len || *next != b.offset {
            return Err(bad());
        }
        *next += u64::from(b.len);
        let lease = lease.clone();
        if b.offset + u64::from(b.len) == b.item_len {
            self.open.remove(&b.receiver);
        }
        Ok(lease)
    }

    /// A channel went away: its item in progress is not the reader's to hold any more.
    fn forget(&mut self, rid: &ReceiverId) {
        self.open.remove(rid);
    }
}

/// Pieces of a record body shorter than this that the decoder does not already hold are
/// read through the segment (one read for the rest of the payload) rather than with a read
/// of their own, so many small records in one buffer do not cost a system call each.
const DIRECT_READ_MIN: usize = 4096;

/// Reads the next `n` payload bytes straight into the body of the channel's record in progress
/// (`n` at most what it misses); returns the record if they completed it.
async fn read_into_record<R: FrameSource>(
    reader: &mut FrameReader<R>,
    asm: &mut RecordAssembler,
    n: usize,
) -> Result<Option<Buffer>> {
    reader.read_payload_into(&mut asm.body_spare()[..n]).await?;
    // SAFETY: `read_payload_into` initialized exactly these `n` bytes.
    Ok(unsafe { asm.commit_body(n) })
}

/// Reads one data payload of `len` bytes into the channel's records, appending the records it
/// completes to `done`; `seg` (at least `len` bytes unless the payload lies inside the record
/// in progress) takes what does not go straight into a record. The outer error is the
/// connection's (the socket); the inner one the channel's (a bad length prefix), after which
/// the payload has still been read to its end.
pub(super) async fn read_records<R: FrameSource>(
    reader: &mut FrameReader<R>,
    asm: &mut RecordAssembler,
    len: usize,
    seg: &mut [u8],
    done: &mut Vec<Buffer>,
    mut start: impl FnMut(u64) -> Result<()>,
) -> Result<Result<()>> {
    let mut left = len;
    while left > 0 {
        let missing = asm.body_missing();
        let buffered = reader.buffered_payload();
        let piece = missing.min(left);
        if missing > 0 && (piece >= DIRECT_READ_MIN || buffered >= piece || left > seg.len()) {
            done.extend(read_into_record(reader, asm, piece).await?);
            left -= piece;
        } else if missing == 0 && buffered >= asm.header_missing().min(left) {
            // A length prefix the decoder holds: no system call for it.
            let n = asm.header_missing().min(left);
            let mut prefix = [0u8; crate::serde::RECORD_HEADER_LEN];
            reader.read_payload(&mut prefix[..n]).await?;
            left -= n;
            if let Err(e) = asm.push_checked(&prefix[..n], &mut start, |_| {
                unreachable!("a prefix completes no record")
            }) {
                reader.skip_payload().await?;
                return Ok(Err(e));
            }
        } else {
            let rest = &mut seg[..left];
            reader.read_payload(rest).await?;
            return Ok(asm.push_checked(rest, &mut start, |record| {
                done.push(record);
                Ok(())
            }));
        }
    }
    Ok(Ok(()))
}

/// Hands on what a data buffer completed: the records (with the buffer's segment, which holds
/// the credit until they are taken), or the segment back at once when it completed none; a
/// channel whose stream broke is failed.
fn hand_on(
    conn: &Arc<ClientConn>,
    assemblies: &mut HashMap<ReceiverId, Assembly>,
    ch: &Arc<RemoteChannel>,
    rid: ReceiverId,
    (seg, lease): (PooledSegment, Option<BufferLease>),
    records: Vec<Buffer>,
    outcome: Result<()>,
) {
    let a = assemblies.get_mut(&rid).expect("the buffer's assembly");
    let completed: u64 = records.iter().map(|r| r.len() as u64).sum();
    let received = Received {
        segment: Some(seg),
        records,
        buffers: a.uncounted + 1,
        lease,
        gate: ch.gate.clone(),
        record_bytes: Some(a.bytes.split(completed)),
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
        fail_stream(conn, assemblies, rid, e);
    }
}

/// The channel's byte stream broke (a bad record): it fails, the connection goes on.
fn fail_stream(conn: &ClientConn, assemblies: &mut HashMap<ReceiverId, Assembly>, rid: ReceiverId, e: Error) {
    assemblies.remove(&rid);
    if let Some(ch) = conn.remove(rid) {
        ch.fail(Error::Protocol(format!("channel {:?}: {e}", ch.spec)));
    }
}

/// The assembly of `rid`'s records, made on its first buffer.
fn assembly<'a>(
    assemblies: &'a mut HashMap<ReceiverId, Assembly>,
    ch: &RemoteChannel,
    rid: ReceiverId,
) -> &'a mut Assembly {
    assemblies.entry(rid).or_insert_with(|| Assembly {
        records: RecordAssembler::with_pool(ch.gate.max_record, ch.gate.record_pool.clone()),
        bytes: RecordBytes::empty(ch.gate.clone(), ch.cid),
        uncounted: 0,
    })
}

/// Whether a buffer of `len` bytes lies inside `rid`'s record in progress without completing
/// it (a record body buffer: it takes no credit).
fn inside_record(assemblies: &HashMap<ReceiverId, Assembly>, rid: ReceiverId, len: usize) -> bool {
    assemblies
        .get(&rid)
        .is_some_and(|a| len < a.records.body_missing())
}

/// Protocol version 3: a record starts only on record bytes granted; the bytes started are
/// counted in the assembly's record bytes.
fn record_start<'a>(ch: &'a RemoteChannel, started: &'a mut u64) -> impl FnMut(u64) -> Result<()> + 'a {
    move |n| {
        ch.gate.records_started(ch.cid, n)?;
        *started += n;
        Ok(())
    }
}

/// After a buffer that took credit: lets the writer announce credit when the sender runs low.
async fn after_credited_buffer(ch: &RemoteChannel) {
    if ch.gate.credit_running_low(ch) {
        tokio::task::yield_now().await;
    }
}

/// A SharedBuffer: the buffer's bytes are in the link's heap, where a record that lies whole
/// in its item is decoded in place; everything else is as for a data BufferResponse.
async fn read_shared(
    conn: &Arc<ClientConn>,
    assemblies: &mut HashMap<ReceiverId, Assembly>,
    items: &mut Items,
    b: SharedBuffer,
) -> Result<()> {
    let rid = b.receiver;
    let Some(ch) = conn.channel(rid) else {
        // A channel closed here: the rest of its item is dropped unread, and an item that
        // starts now is freed at once.
        items.forget(&rid);
        assemblies.remove(&rid);
        if b.offset == 0 {
            drop(items.heap.lease(b.item, b.item_len).map_err(Error::Protocol)?);
        }
        return Ok(());
    };
    let lease = items.lease(&b)?;
    let header = b.header();
    let offset = b.offset as usize;
    let mut rest = lease
        .bytes(offset, header.payload_len)
        .expect("the wire and the lease checked the range");
    let adopt = |at: usize, len: usize| lease.buffer(offset + at, len);
    let inside = inside_record(assemblies, rid, header.payload_len);
    match ch.gate.take_buffer(&ch, header, inside).await? {
        Landing::Record => {
            let a = assemblies.get_mut(&rid).expect("inside its record");
            let outcome = a.records.push_shared(
                &mut rest,
                adopt,
                |_| unreachable!("a buffer inside a record starts none"),
                |_| unreachable!("a buffer inside a record does not end it"),
            );
            a.uncounted += 1;
            if let Err(e) = outcome {
                fail_stream(conn, assemblies, rid, e);
            }
        }
        Landing::Segment(seg, credit) => {
            let a = assembly(assemblies, &ch, rid);
            let mut records = Vec::new();
            let outcome = a.records.push_shared(
                &mut rest,
                adopt,
                record_start(&ch, &mut a.bytes.bytes),
                |record| {
                    records.push(record);
                    Ok(())
                },
            );
            hand_on(conn, assemblies, &ch, rid, (seg, credit), records, outcome);
            after_credited_buffer(&ch).await;
        }
        Landing::Drop => {}
    }
    Ok(())
}

/// A data BufferResponse: its payload goes into the channel's records, the body of a record in
/// progress straight from the socket. A payload longer than a segment must lie inside the
/// record in progress (a bulk buffer of protocol version 6).
async fn read_data<R: FrameSource>(
    conn: &Arc<ClientConn>,
    reader: &mut FrameReader<R>,
    assemblies: &mut HashMap<ReceiverId, Assembly>,
    header: BufferResponseHeader,
) -> Result<()> {
    let rid = header.receiver;
    let len = header.payload_len;
    let Some(ch) = conn.channel(rid) else {
        assemblies.remove(&rid);
        return reader.skip_payload().await;
    };
    if assemblies.get(&rid).is_some_and(|a| a.records.is_shared()) {
        return Err(Error::Protocol(format!(
            "{rid}: a buffer inside a record placed in shared memory"
        )));
    }
    let inside = inside_record(assemblies, rid, len);
    match ch.gate.take_buffer(&ch, header, inside).await? {
        Landing::Record => {
            let a = assemblies.get_mut(&rid).expect("inside its record");
            let completed = read_into_record(reader, &mut a.records, len).await?;
            debug_assert!(completed.is_none(), "a buffer inside a record does not end it");
            a.uncounted += 1;
        }
        Landing::Segment(mut seg, lease) => {
            let dst = seg.segment_mut().as_mut_slice();
            let in_record = assemblies
                .get(&rid)
                .is_some_and(|a| len <= a.records.body_missing());
            if len > dst.len() && !in_record {
                return Err(Error::Protocol(format!(
                    "{rid}: payload of {len} bytes exceeds the segment size {} outside a record's body",
                    dst.len()
                )));
            }
            let a = assembly(assemblies, &ch, rid);
            let mut records = Vec::new();
            let started = record_start(&ch, &mut a.bytes.bytes);
            let outcome = read_records(reader, &mut a.records, len, dst, &mut records, started).await?;
            hand_on(conn, assemblies, &ch, rid, (seg, lease), records, outcome);
            after_credited_buffer(&ch).await;
        }
        Landing::Drop => reader.skip_payload().await?,
    }
    Ok(())
}

/// An event BufferResponse: to its channel, in its place among the data; the last one ends the
/// channel (a partly received record then fails it).
fn on_event(
    conn: &Arc<ClientConn>,
    assemblies: &mut HashMap<ReceiverId, Assembly>,
    br: BufferResponse<'static>,
) -> Result<()> {
    let Some(ch) = conn.channel(br.receiver) else {
        return Ok(());
    };
    ch.gate.on_event(&ch, br.header())?;
    let Payload::Event(ev) = br.payload else {
        return Ok(());
    };
    if matches!(ev, Event::Barrier { unaligned: true, .. }) {
        // Set before the push's wake-up, so the gate sees it with the item.
        ch.gate.priority.store(true, Ordering::Release);
    }
    let rid = br.receiver;
    let mid_record = assemblies
        .get(&rid)
        .is_some_and(|a| !a.records.is_at_record_boundary());
    let item = Inbound::Event(ev);
    if !item.is_last() {
        // An aligned barrier comes between records; an unaligned one and a user event may
        // come anywhere (the record completes after them).
        if matches!(item, Inbound::Event(Event::Barrier { unaligned: false, .. })) && mid_record {
            conn.remove(rid);
            assemblies.remove(&rid);
            ch.fail(mid_record_error(&ch, ": aligned barrier in"));
        } else {
            ch.push(item);
        }
        return Ok(());
    }
    conn.remove(rid);
    assemblies.remove(&rid);
    if mid_record && matches!(item, Inbound::Event(Event::EndOfPartition)) {
        ch.fail(mid_record_error(&ch, " ended in"));
    } else {
        ch.push(item);
        ch.gate.release(&ch);
    }
    Ok(())
}

/// The protocol error of an event that may not come in the middle of a record: "channel
/// SPEC{what} the middle of a record".
fn mid_record_error(ch: &RemoteChannel, what: &str) -> Error {
    Error::Protocol(format!("channel {:?}{what} the middle of a record", ch.spec))
}

/// A control message from the server (anything but data and events).
fn on_control(
    conn: &Arc<ClientConn>,
    assemblies: &mut HashMap<ReceiverId, Assembly>,
    msg: Message<'static>,
) -> Result<()> {
    match msg {
        Message::RecordAnnouncement { receiver, bytes } => {
            if let Some(ch) = conn.channel(receiver) {
                ch.gate.on_record_announcement(&ch, bytes)?;
            }
        }
        Message::BacklogAnnouncement { receiver, backlog } => {
            if let Some(ch) = conn.channel(receiver) {
                ch.gate.on_backlog(&ch, backlog)?;
            }
        }
        Message::PartitionNotFound { receiver } => {
            if let Some(ch) = conn.channel(receiver) {
                schedule_retry(conn, ch);
            }
        }
        Message::ErrorResponse {
            receiver: Some(receiver),
            kind,
            message,
        } => {
            assemblies.remove(&receiver);
            if let Some(ch) = conn.remove(receiver) {
                let e = channel_error(&ch.spec, kind, message);
                ch.fail(e);
            }
        }
        Message::ErrorResponse {
            receiver: None,
            kind,
            message,
        } => return Err(handshake::remote_error(kind, &message)),
        Message::CloseRequest => return Err(Error::ConnectionLost("the peer closed the connection".into())),
        other => {
            return Err(Error::Protocol(format!(
                "a server sent {:?}, which only clients send",
                other.message_type()
            )))
        }
    }
    Ok(())
}

pub(super) async fn read_loop<R: FrameSource>(
    conn: &Arc<ClientConn>,
    reader: &mut FrameReader<R>,
    mut items: Option<Items>,
) -> Result<()> {
    let mut assemblies: HashMap<ReceiverId, Assembly> = HashMap::new();
    loop {
        if conn.writer_due.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        let frame = reader.next().await?;
        for rid in std::mem::take(&mut *conn.closed.lock().unwrap()) {
            assemblies.remove(&rid);
            if let Some(items) = items.as_mut() {
                items.forget(&rid);
            }
        }
        match frame {
            InFrame::Data(header) => read_data(conn, reader, &mut assemblies, header).await?,
            InFrame::Message(Message::SharedBuffer(b)) => {
                let Some(items) = items.as_mut() else {
                    return Err(Error::Protocol(
                        "a shared buffer on a connection without shared memory".into(),
                    ));
                };
                read_shared(conn, &mut assemblies, items, b).await?;
            }
            InFrame::Message(Message::BufferResponse(br)) => on_event(conn, &mut assemblies, br)?,
            InFrame::Message(msg) => on_control(conn, &mut assemblies, msg)?,
        }
    }
}
