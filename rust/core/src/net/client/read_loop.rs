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
use super::state::{ClientConn, Inbound, Received, RecordBytes};
use crate::base::config::ChannelSpec;
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::net::handshake;
use crate::net::io::{FrameReader, FrameSource, InFrame};
use crate::protocol::wire::{ErrorKind, Message, Payload, ReceiverId};
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

pub(super) async fn read_loop<R: FrameSource>(
    conn: &Arc<ClientConn>,
    reader: &mut FrameReader<R>,
) -> Result<()> {
    let mut assemblies: HashMap<ReceiverId, Assembly> = HashMap::new();
    loop {
        if conn.writer_due.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
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
                            bytes: RecordBytes::empty(ch.gate.clone(), ch.cid),
                            uncounted: 0,
                        });
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
