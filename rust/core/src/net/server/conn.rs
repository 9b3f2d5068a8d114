//! [`ServerConn`]: one accepted connection, serving the subpartitions its peer requested:
//! PartitionRequest, AddCredit, cancellation and the round-robin gathering of frames into one
//! vectored write.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

use super::frames::{Cursor, Item, OutFrame, Part, Placement, MAX_WRITE_BYTES, MAX_WRITE_FRAMES};
use super::reader::SubReader;
use crate::base::config::Limits;
use crate::base::error::{Error, Result};
use crate::base::metrics::ChannelTransport;
use crate::net::shm::{HeapWriter, MIN_ITEM};
use crate::partition::{Registry, MAX_PIECE};
use crate::protocol::credit::{Credit, DataType, QueueHead, ReadyQueue, SenderCredit};
use crate::protocol::wire::{self, ErrorKind, Message, ReceiverId, SharedBuffer, BUFFER_RESPONSE_HEADER_LEN};
use crate::serde::{Compression, RecordFraming, SelfContainedDecoder};

#[derive(Default)]
pub(super) struct ServerState {
    pub(super) readers: HashMap<ReceiverId, SubReader>,
    pub(super) ready: ReadyQueue<ReceiverId>,
    pub(super) control: VecDeque<Message<'static>>,
}

/// One accepted connection.
pub(crate) struct ServerConn {
    pub(super) peer: String,
    /// What carries this connection's frames (metrics of the subpartitions it serves).
    pub(super) transport: ChannelTransport,
    pub(super) payload_limit: usize,
    pub(super) limits: Limits,
    /// IPC body compression of handed-off batches encoded for this peer.
    pub(super) wire_compression: Option<Compression>,
    pub(super) registry: Weak<Registry>,
    pub(super) state: Mutex<ServerState>,
    /// Readers whose subpartition has new data (pushed by the producers' listeners).
    pub(super) signalled: Mutex<Vec<ReceiverId>>,
    pub(super) wake: Notify,
    /// The environment closes: the writer stops once it has nothing left to write.
    pub(super) closing: std::sync::atomic::AtomicBool,
    /// A shared-memory link's heap, where handed-off records go whole (`None` over TCP).
    pub(super) heap: Option<HeapWriter>,
}

/// Decides where an item not sent from yet goes: a handed-off record of at least
/// [`MIN_ITEM`] bytes into the link's heap if it has room, anything else inline. A record in
/// the heap goes out in two SharedBuffer frames: the first as long as an inline record's
/// first buffer (it starts the record: a credit and the record's grant), then the rest in one
/// (it completes the record: a credit, as the last buffer of an inline record takes). So the
/// credit a record takes, and with it the records in flight, are as inline; only the frames
/// of the record's body, which take no credit and name bytes already in place, become one.
/// `readers` is how many channels the link serves: with more than one, none holds more than
/// half the heap (see [`HeapWriter::place`]). Returns the frames this takes off the backlog.
fn place(heap: Option<&HeapWriter>, rid: ReceiverId, readers: usize, cursor: &mut Cursor) -> usize {
    if cursor.placement != Placement::Undecided {
        return 0;
    }
    let placed = match heap {
        Some(heap) if cursor.remaining >= MIN_ITEM => heap.place(
            rid.0,
            readers > 1,
            cursor.remaining,
            cursor.parts.iter().map(Part::bytes),
        ),
        _ => None,
    };
    let Some(item) = placed else {
        cursor.placement = Placement::Inline;
        return 0;
    };
    cursor.placement = Placement::Heap {
        item,
        len: cursor.remaining as u64,
        sent: 0,
    };
    cursor.chunks().saturating_sub(2)
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
    pub(super) fn outstanding(&self) -> usize {
        self.state.lock().unwrap().control.len()
    }

    pub(super) fn signal(&self, rid: ReceiverId) {
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
    pub(super) fn refresh(&self, st: &mut ServerState, rid: ReceiverId) -> Result<()> {
        let Some(r) = st.readers.get_mut(&rid) else {
            return Ok(());
        };
        r.fill(self.payload_limit)?;
        let head = r.head();
        let starts = r.record_starts(head);
        if r.credit.is_available(head) && r.credit.can_start_records(starts) {
            st.ready.enqueue(rid);
            if starts == 0 && !r.looked_ahead && !r.credit.has_record_announcement() {
                // Once per record, while its body goes out: announce the next record start
                // ahead unless the grant (the receiver grants ahead too) covers it already.
                let ahead = r.next_record_starts();
                if ahead > 0 {
                    r.looked_ahead = true;
                    if !r.credit.can_start_records(ahead) {
                        r.credit.on_record_announced(ahead);
                        st.control.push_back(Message::RecordAnnouncement {
                            receiver: rid,
                            bytes: ahead,
                        });
                    }
                }
            }
        } else {
            if r.credit.needs_record_announcement(starts) {
                // The head starts records its grant does not cover: ask for the bytes (with
                // or without buffer credit, so the round trips overlap).
                r.credit.on_record_announced(starts);
                st.control.push_back(Message::RecordAnnouncement {
                    receiver: rid,
                    bytes: starts,
                });
            }
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

    pub(super) fn on_partition_request(
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
        let weak = Arc::downgrade(self);
        let listener: crate::partition::subpartition::Listener = Arc::new(move || {
            if let Some(c) = weak.upgrade() {
                c.signal(receiver);
            }
        });
        let attached = partition
            .open_reader(subpartition as usize, listener)
            .inspect(|sub| {
                sub.set_remote_reader(&self.peer, self.transport)
                    .set_credit(u64::from(initial_credit.get()));
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
                        compression: self.wire_compression,
                        pieces: SelfContainedDecoder::relay(MAX_PIECE),
                        framing: RecordFraming::default(),
                        drained: false,
                        paused: false,
                        looked_ahead: false,
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

    pub(super) fn on_add_credit(&self, receiver: ReceiverId, credit: Credit) -> Result<()> {
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

    /// A RecordGrant: `bytes` more record bytes for `receiver`'s reader.
    pub(super) fn on_record_grant(&self, receiver: ReceiverId, bytes: u64) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        let Some(r) = st.readers.get_mut(&receiver) else {
            // A grant for a reader that just ended or was cancelled: harmless.
            return Ok(());
        };
        r.credit.on_record_grant(bytes)?;
        self.refresh(&mut st, receiver)?;
        self.wake.notify_one();
        Ok(())
    }

    /// The receiver aligned the checkpoint whose barrier paused `receiver`'s reader.
    pub(super) fn on_resume(&self, receiver: ReceiverId) -> Result<()> {
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
    pub(super) fn on_new_buffer_size(&self, receiver: ReceiverId, size: u32) -> Result<()> {
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

    pub(super) fn cancel(&self, receiver: ReceiverId) {
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
    pub(super) fn shutdown(&self, lost: Option<&Error>) {
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
    pub(super) fn collect(&self) -> Result<Vec<OutFrame>> {
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
            let readers = st.readers.len();
            let Some(r) = st.readers.get_mut(&rid) else {
                continue;
            };
            let queue_head = r.head();
            if !r.is_available() {
                continue;
            }
            let frame = if matches!(r.queue.front(), Some(Item::Data(_))) {
                self.data_frame(r, rid, readers, queue_head)?
            } else {
                let (frame, end) = event_frame(r, rid)?;
                if end {
                    // The reader sent its end: nothing more to serve.
                    let r = st.readers.remove(&rid).expect("present");
                    r.partition.subpartition_done();
                }
                frame
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

    /// The next data frame of reader `rid` (its head is data it may send): a chunk of its head
    /// item, inline or naming its place in the link's heap, with the credit it takes.
    fn data_frame(
        &self,
        r: &mut SubReader,
        rid: ReceiverId,
        readers: usize,
        queue_head: QueueHead,
    ) -> Result<OutFrame> {
        let Some(Item::Data(cursor)) = r.queue.front_mut() else {
            unreachable!("the head is data")
        };
        r.chunks -= place(self.heap.as_ref(), rid, readers, cursor);
        let (parts, len) = cursor.take();
        let shared = match &mut cursor.placement {
            Placement::Heap {
                item,
                len: item_len,
                sent,
            } => {
                let at = *sent;
                *sent += len as u64;
                Some((*item, *item_len, at))
            }
            _ => None,
        };
        if shared.is_some() {
            // The rest of the record in one frame (see `place`).
            cursor.rest_in_one();
        }
        let started = parts
            .iter()
            .map(|part| r.framing.advance(part.bytes()))
            .fold(0u64, u64::saturating_add);
        let done = cursor.remaining == 0;
        let hold = if done { cursor.hold.take() } else { None };
        if done {
            r.queue.pop_front();
        }
        r.chunks -= 1;
        let header = if queue_head == QueueHead::RecordBody {
            debug_assert_eq!(started, 0, "a record body buffer starts no record");
            r.credit.on_record_body_sent(r.backlog())
        } else {
            r.credit.on_records_started(started)?;
            if started > 0 {
                r.looked_ahead = false;
            }
            r.credit.on_buffer_sent(DataType::Data, r.backlog())?
        };
        if let Some(stats) = r.sub.remote_reader() {
            stats.count_sent(len);
            stats.set_credit(u64::from(r.credit.credit().get()));
        }
        Ok(match shared {
            Some((item, item_len, offset)) => {
                // The bytes are in the heap already: the frame names their place.
                let msg = Message::SharedBuffer(SharedBuffer {
                    receiver: rid,
                    sequence_number: header.sequence_number,
                    backlog: header.backlog,
                    item,
                    item_len,
                    offset,
                    len: u32::try_from(len).expect("a buffer fits a u32"),
                });
                OutFrame {
                    _hold: hold,
                    ..OutFrame::control(&msg)?
                }
            }
            None => OutFrame {
                head: wire::encode_buffer_response_header(rid, header, len)?.to_vec(),
                parts,
                _hold: hold,
            },
        })
    }
}

/// The event at the head of reader `rid`'s queue as a frame (events take no credit), and
/// whether it ends the reader's stream.
fn event_frame(r: &mut SubReader, rid: ReceiverId) -> Result<(OutFrame, bool)> {
    let Some(Item::Event(event)) = r.queue.pop_front() else {
        unreachable!("the head is an event")
    };
    let header = r.credit.on_buffer_sent(DataType::Event, r.backlog())?;
    let mut head = Vec::with_capacity(BUFFER_RESPONSE_HEADER_LEN + 8);
    let msg = Message::event(rid, header.sequence_number, header.backlog, event.to_wire());
    wire::encode(&msg, &mut head)?;
    let frame = OutFrame {
        head,
        parts: Vec::new(),
        _hold: None,
    };
    Ok((frame, event.is_end()))
}
