//! One remote input channel ([`RemoteChannel`]): the inbox of received buffers and events the
//! gate's thread reads, the partition request and what the channel says to its sender
//! (ResumeConsumption, NewBufferSize, CancelPartitionRequest).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use super::state::{Inbound, RemoteChannel};
use crate::base::config::FlowControl;
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::protocol::credit::Credit;
use crate::protocol::wire::Message;

impl Inbound {
    /// Whether nothing follows it on the channel (end of partition or a failure).
    pub(super) fn is_last(&self) -> bool {
        match self {
            Inbound::Data(_) => false,
            Inbound::Event(ev) => matches!(ev, Event::EndOfPartition | Event::ProducerFailed(_)),
            Inbound::Failed(_) => true,
        }
    }
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

    pub(super) fn push(&self, item: Inbound) {
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
    pub(super) fn fail(&self, error: Error) {
        self.push(Inbound::Failed(error));
        self.gate.release(self);
    }

    pub(super) fn check_sequence(&self, seq: u64) -> Result<()> {
        let expected = self.next_sequence.fetch_add(1, Ordering::SeqCst);
        if seq != expected {
            return Err(Error::Protocol(format!(
                "{}: buffer out of order: expected sequence number {expected}, got {seq}",
                self.rid
            )));
        }
        Ok(())
    }

    pub(super) fn request(&self) -> Message<'static> {
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
