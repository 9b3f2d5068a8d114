//! The remote half of an input gate ([`RemoteGate`]): its exclusive and floating segments,
//! held for the gate's life, and the credit state that says which one a received buffer goes
//! into; and the received buffers ([`Received`]) that give their segment back when dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use arrow_buffer::Buffer;
use tokio::sync::Notify;

use super::state::{GateBuffers, Received, RecordBytes, RemoteChannel, RemoteGate};
use super::stats::{RemoteChannelStats, RemoteStats};
use crate::base::config::{ChannelSpec, FlowControl};
use crate::base::error::{Error, Result};
use crate::memory::{PooledSegment, RecordPool};
use crate::net::shm::ChannelTransport;
use crate::protocol::credit::{
    BufferLease, ChannelCreditStats, ChannelId, ChannelRecordStats, Credit, Delivery, GateCredit,
    GateCreditConfig, ReceiverAction, RecordBudget,
};
use crate::protocol::wire;

impl Received {
    /// The records this buffer completed, in order (taken once).
    pub(crate) fn take_records(&mut self) -> Vec<Buffer> {
        std::mem::take(&mut self.records)
    }

    /// The count of those records' bytes in the gate's record budget: drop it when the
    /// consumer has taken them.
    pub(crate) fn take_record_bytes(&mut self) -> Option<RecordBytes> {
        self.record_bytes.take()
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

impl RecordBytes {
    /// No bytes yet, of channel `cid` of `gate`.
    pub(super) fn empty(gate: Arc<RemoteGate>, cid: ChannelId) -> RecordBytes {
        RecordBytes { gate, cid, bytes: 0 }
    }

    /// Moves `bytes` (at most all) into a count of their own.
    pub(super) fn split(&mut self, bytes: u64) -> RecordBytes {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        RecordBytes {
            gate: self.gate.clone(),
            cid: self.cid,
            bytes,
        }
    }
}

impl Drop for RecordBytes {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.gate.records_taken(self.cid, self.bytes);
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
        record_budget: u64,
    ) -> Result<Arc<RemoteGate>> {
        let credit = GateCredit::new(GateCreditConfig {
            exclusive_buffers_per_channel: exclusive_per_channel as u32,
            floating_buffers: floating as u32,
        })?;
        Ok(Arc::new(RemoteGate {
            priority: AtomicBool::new(false),
            flow,
            max_record,
            // Idle record buffers, with the records out, stay within the record budget.
            record_pool: RecordPool::new(usize::try_from(record_budget).unwrap_or(usize::MAX)),
            bufs: Mutex::new(GateBuffers {
                credit,
                records: RecordBudget::new(record_budget),
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
        s.record_bytes = b.records.held();
        s.record_bytes_peak = b.records.peak();
        s.record_bytes_granted = b.records.granted();
        s.record_budget = b.records.budget();
        let blocks = self.record_pool.stats();
        s.record_blocks_allocated = blocks.allocated;
        s.record_blocks_reused = blocks.reused;
        let channels: Vec<Arc<RemoteChannel>> = b.channels.iter().filter_map(Weak::upgrade).collect();
        drop(b);
        s.queued_buffers = channels.iter().map(|c| c.queued()).sum();
        s
    }

    /// Buffers and credit per remote channel, by the channel's spec, for metrics.
    pub(crate) fn channel_stats(&self) -> HashMap<ChannelSpec, RemoteChannelStats> {
        let b = self.bufs.lock().unwrap();
        let channels: Vec<(Arc<RemoteChannel>, ChannelCreditStats, ChannelRecordStats)> = b
            .channels
            .iter()
            .filter_map(|w| {
                let ch = w.upgrade()?;
                let stats = b.credit.channel_stats(ch.cid)?;
                let records = b.records.channel_stats(ch.cid)?;
                Some((ch, stats, records))
            })
            .collect();
        drop(b);
        channels
            .into_iter()
            .map(|(ch, c, r)| {
                let stats = RemoteChannelStats {
                    exclusive_in_use: c.exclusive_in_use as usize,
                    floating_in_use: (c.floating_in_use + c.floating_available) as usize,
                    credit_announced: c.announced.get() as usize,
                    credit_unannounced: c.unannounced.get() as usize,
                    required: c.required as usize,
                    queued_buffers: ch.queued(),
                    record_bytes: r.held,
                    record_bytes_peak: r.peak,
                    transport: if ch.conn.shm.load(std::sync::atomic::Ordering::Relaxed) {
                        ChannelTransport::Shm
                    } else {
                        ChannelTransport::Tcp
                    },
                };
                (ch.spec.clone(), stats)
            })
            .collect()
    }

    pub(super) fn recycle(&self, buffers: impl Iterator<Item = (PooledSegment, Option<BufferLease>)>) {
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
    pub(super) async fn take_buffer(
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
    pub(super) fn on_event(&self, ch: &RemoteChannel, header: wire::BufferResponseHeader) -> Result<()> {
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

    pub(super) fn on_backlog(&self, ch: &RemoteChannel, backlog: u32) -> Result<()> {
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

    pub(super) fn release(&self, ch: &RemoteChannel) {
        let (wake, grants) = {
            let mut b = self.bufs.lock().unwrap();
            b.records.release_channel(ch.cid);
            if self.flow != FlowControl::Tcp {
                let _ = b.credit.release_channel(ch.cid);
            }
            (drain_actions(&mut b), drain_grants(&mut b))
        };
        for c in wake {
            c.conn.request_credit(c.rid);
        }
        send_grants(grants);
    }

    /// A RecordAnnouncement: `ch`'s next buffer starts records of `bytes` in all.
    pub(super) fn on_record_announcement(&self, ch: &RemoteChannel, bytes: u64) -> Result<()> {
        Ok(self.with_records(|r| r.on_record_announcement(ch.cid, bytes))?)
    }

    /// Records of `bytes` in all start on channel `cid` (their length prefixes arrived): a
    /// protocol error beyond the channel's grant. The grant topped up unasked goes out now:
    /// the budget counts it as given, and answers the sender's next announcement with it.
    pub(super) fn records_started(&self, cid: ChannelId, bytes: u64) -> Result<()> {
        Ok(self.with_records(|r| r.on_records_started(cid, bytes))?)
    }

    /// Records of `bytes` in all of channel `cid` were taken by the consumer or dropped.
    pub(super) fn records_taken(&self, cid: ChannelId, bytes: u64) {
        self.with_records(|r| r.on_records_taken(cid, bytes));
    }

    /// Runs `f` on the gate's record budget, then sends the grants it queued: the budget
    /// counts a grant as given once queued, so none may wait for a later call.
    fn with_records<T>(&self, f: impl FnOnce(&mut RecordBudget) -> T) -> T {
        let (out, grants) = {
            let mut b = self.bufs.lock().unwrap();
            let out = f(&mut b.records);
            (out, drain_grants(&mut b))
        };
        send_grants(grants);
        out
    }

    /// Whether `ch`'s AddCredit is due now (see [`GateCredit::announcement_due`]). Credit
    /// pending means the AddCredit is already queued for the writer (the credit state asks
    /// for one when unannounced credit leaves zero), so the caller need only let it run.
    pub(super) fn credit_running_low(&self, ch: &RemoteChannel) -> bool {
        self.bufs.lock().unwrap().credit.announcement_due(ch.cid)
    }

    pub(super) fn take_credit(&self, ch: &RemoteChannel) -> Option<Credit> {
        self.bufs.lock().unwrap().credit.take_unannounced_credit(ch.cid)
    }
}

/// Where the payload of a data BufferResponse goes, from [`RemoteGate::take_buffer`].
pub(super) enum Landing {
    /// Into this segment (with its claim on the credit state in credit mode), then into the
    /// channel's records.
    Segment(PooledSegment, Option<BufferLease>),
    /// Straight into the channel's record in progress, credited against its memory.
    Record,
    /// Nowhere: the channel was released or the gate closed; skip the payload.
    Drop,
}

fn drain_grants(b: &mut GateBuffers) -> Vec<(Arc<RemoteChannel>, u64)> {
    let mut out = Vec::new();
    while let Some((channel, bytes)) = b.records.poll_grant() {
        if let Some(ch) = b.channels.get(channel.0).and_then(Weak::upgrade) {
            out.push((ch, bytes));
        }
    }
    out
}

fn send_grants(grants: Vec<(Arc<RemoteChannel>, u64)>) {
    for (ch, bytes) in grants {
        ch.conn.send(wire::Message::RecordGrant {
            receiver: ch.rid,
            bytes,
        });
    }
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
