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
use crate::protocol::wire::{ErrorKind, Message, Payload, ReceiverId, SharedBuffer};
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

/// Reads one data payload of `seg.len()` bytes into the channel's records, appending the
/// records it completes to `done`. The outer error is the connection's (the socket); the
/// inner one the channel's (a bad length prefix), after which the payload has still been
/// read to its end.
pub(super) async fn read_records<R: FrameSource>(
    reader: &mut FrameReader<R>,
    asm: &mut RecordAssembler,
    seg: &mut [u8],
    done: &mut Vec<Buffer>,
    mut start: impl FnMut(u64) -> Result<()>,
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
            if let Err(e) = asm.push_checked(&prefix[..n], &mut start, |_| {
                unreachable!("a prefix completes no record")
            }) {
                reader.read_payload(&mut seg[..left]).await?;
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
        assemblies.remove(&rid);
        if let Some(ch) = conn.remove(rid) {
            ch.fail(Error::Protocol(format!("channel {:?}: {e}", ch.spec)));
        }
    }
}

/// The assembly of `rid`'s records, made on its first buffer.
fn assembly<'a>(
    assemblies: &'a mut HashMap<ReceiverId, Assembly>,
    ch: &RemoteChannel,
    rid: ReceiverId,
) -> &'a mut Assembly {
    assemblies.entry(rid).or_insert_with(|| Assembly {
        records: RecordAssembler::new(ch.gate.max_record),
        bytes: RecordBytes::empty(ch.gate.clone(), ch.cid),
        uncounted: 0,
    })
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
    let bytes = lease
        .bytes(offset, header.payload_len)
        .expect("the wire and the lease checked the range");
    let adopt = |at: usize, len: usize| lease.buffer(offset + at, len);
    let inside_record = assemblies
        .get(&rid)
        .is_some_and(|a| header.payload_len < a.records.body_missing());
    match ch.gate.take_buffer(&ch, header, inside_record).await? {
        Landing::Record => {
            let a = assemblies.get_mut(&rid).expect("inside its record");
            let mut rest = bytes;
            let outcome = a.records.push_shared(
                &mut rest,
                adopt,
                |_| unreachable!("a buffer inside a record starts none"),
                |_| unreachable!("a buffer inside a record does not end it"),
            );
            a.uncounted += 1;
            if let Err(e) = outcome {
                assemblies.remove(&rid);
                if let Some(ch) = conn.remove(rid) {
                    ch.fail(Error::Protocol(format!("channel {:?}: {e}", ch.spec)));
                }
            }
        }
        Landing::Segment(seg, credit) => {
            let a = assembly(assemblies, &ch, rid);
            let mut records = Vec::new();
            let started = &mut a.bytes.bytes;
            let mut rest = bytes;
            let outcome = a.records.push_shared(
                &mut rest,
                adopt,
                |n| {
                    ch.gate.records_started(ch.cid, n)?;
                    *started += n;
                    Ok(())
                },
                |record| {
                    records.push(record);
                    Ok(())
                },
            );
            hand_on(conn, assemblies, &ch, rid, (seg, credit), records, outcome);
            if ch.gate.credit_running_low(&ch) {
                tokio::task::yield_now().await;
            }
        }
        Landing::Drop => {}
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
            InFrame::Message(Message::SharedBuffer(b)) => {
                let Some(items) = items.as_mut() else {
                    return Err(Error::Protocol(
                        "a shared buffer on a connection without shared memory".into(),
                    ));
                };
                read_shared(conn, &mut assemblies, items, b).await?;
            }
            InFrame::Data(header) => {
                let Some(ch) = conn.channel(header.receiver) else {
                    assemblies.remove(&header.receiver);
                    reader.skip_payload().await?;
                    continue;
                };
                if assemblies
                    .get(&header.receiver)
                    .is_some_and(|a| a.records.is_shared())
                {
                    return Err(Error::Protocol(format!(
                        "{}: a buffer inside a record placed in shared memory",
                        header.receiver
                    )));
                }
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
                        let a = assembly(&mut assemblies, &ch, header.receiver);
                        let mut records = Vec::new();
                        let started = &mut a.bytes.bytes;
                        let outcome =
                            read_records(reader, &mut a.records, &mut dst[..len], &mut records, |n| {
                                // Protocol version 3: a record starts only on record bytes granted.
                                ch.gate.records_started(ch.cid, n)?;
                                *started += n;
                                Ok(())
                            })
                            .await?;
                        hand_on(
                            conn,
                            &mut assemblies,
                            &ch,
                            header.receiver,
                            (seg, lease),
                            records,
                            outcome,
                        );
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
            InFrame::Message(Message::RecordAnnouncement { receiver, bytes }) => {
                if let Some(ch) = conn.channel(receiver) {
                    ch.gate.on_record_announcement(&ch, bytes)?;
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
