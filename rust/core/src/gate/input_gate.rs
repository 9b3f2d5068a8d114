//! [`InputGate`]: reads one subpartition per channel and yields batches, user events and
//! checkpoint barriers, resolving channels whose partition is not registered yet, aligning
//! barriers and polling ready channels round-robin.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Instant;

use arrow_array::RecordBatch;

use super::channels::{Channel, ChannelState, Queued, Ready, ReadyListener};
use super::handle::{
    ChannelCounters, DebloatSetup, GateCounters, GateDebloat, GateHandle, GateMetricsReader,
};
use super::item::{GateItem, Relayed};
use super::metrics::{ChannelKind, GateMetrics};
use crate::base::config::{Backoff, ChannelSpec};
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::base::metrics::Counter;
use crate::base::wait::Wait;
use crate::memory::LocalPool;
use crate::net::{recycle_all, Inbound, RemoteGate, Transport};
use crate::partition::subpartition::Polled;
use crate::partition::{Handed, Registry, MAX_PIECE};
use crate::protocol::checkpoint::{Action, Aligner, InFlight};
use crate::protocol::debloat::Debloater;
use crate::serde::{batch_bytes, RecordDeserializer, SelfContainedDecoder};

/// What names the zero wait of [`InputGate::try_next_item`] (its timeout is "nothing ready").
const NOTHING_READY: &str = "input gate: nothing ready";

/// Reads batches from a set of channels.
pub struct InputGate {
    channels: Vec<Channel>,
    ready: Arc<Ready>,
    /// Decoded batches, events and barriers not yet returned (keeps per-channel order).
    pending: VecDeque<Queued>,
    /// Checkpoint barrier alignment.
    aligner: Aligner,
    /// What unaligned barriers overtook.
    in_flight: InFlight,
    ended: usize,
    /// Channels still `Pending` (keeps the per-batch path from scanning them all).
    unresolved: usize,
    registry: Weak<Registry>,
    local_address: String,
    backoff: Backoff,
    max_record: usize,
    handle: Arc<GateHandle>,
    /// Buffers and credit of the remote channels, if any.
    remote: Option<Arc<RemoteGate>>,
    /// Decodes the pieces a host service queued undecoded, for a reader of batches.
    pieces: SelfContainedDecoder,
    /// A channel's failure that arrived behind batches still in `pending`: raised once they
    /// have been returned (at most one: no channel is polled while `pending` is non-empty).
    deferred: Option<Error>,
    closed: bool,
}

/// What a gate with remote channels needs.
pub(crate) struct RemoteSetup {
    pub(crate) transport: Arc<Transport>,
    pub(crate) exclusive_buffers: usize,
    pub(crate) floating_buffers: usize,
    /// Bytes of records (in progress, or completed and not taken) the gate's remote channels
    /// may start beyond which they wait (see `protocol::credit::RecordBudget`).
    pub(crate) record_budget: u64,
}

/// At least one channel, none listed twice.
fn check_specs(specs: &[ChannelSpec]) -> Result<()> {
    if specs.is_empty() {
        return Err(Error::InvalidArgument(
            "an input gate needs at least one channel".into(),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for s in specs {
        if !seen.insert(s) {
            return Err(Error::InvalidArgument(format!("channel {s:?} listed twice")));
        }
    }
    Ok(())
}

/// The buffers and credit of a gate's `num_remote` remote channels: the exclusive buffers are
/// guaranteed by the pool's minimum; floating ones are taken as far as the pool's share allows
/// (at least one is guaranteed).
fn remote_gate(
    pool: &LocalPool,
    setup: &RemoteSetup,
    num_remote: usize,
    max_record: usize,
) -> Result<Arc<RemoteGate>> {
    let exclusive = num_remote * setup.exclusive_buffers;
    let mut segments = pool.try_request_many(exclusive).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "the gate pool cannot hold its {exclusive} exclusive buffers"
        ))
    })?;
    let mut floating = 0;
    while floating < setup.floating_buffers {
        match pool.try_request() {
            Some(seg) => segments.push(seg),
            None => break,
        }
        floating += 1;
    }
    RemoteGate::new(
        setup.transport.flow_control(),
        setup.exclusive_buffers,
        floating,
        segments,
        max_record,
        setup.record_budget,
    )
}

/// The gate's channels: one opened on the transport for each spec of another address (when
/// the gate has remote buffers), the others `Pending` until their partition is found here.
fn open_channels(
    specs: Vec<ChannelSpec>,
    local_address: &str,
    ready: &Arc<Ready>,
    remote: Option<(&RemoteSetup, &Arc<RemoteGate>)>,
    max_record: usize,
    backoff: &Backoff,
) -> Vec<Channel> {
    let now = Instant::now();
    specs
        .into_iter()
        .enumerate()
        .map(|(idx, spec)| {
            let state = match remote {
                Some((setup, rg)) if spec.address != local_address => {
                    let weak = Arc::downgrade(ready);
                    let notify: crate::partition::subpartition::Listener = Arc::new(move || {
                        if let Some(r) = weak.upgrade() {
                            r.push(idx);
                        }
                    });
                    ChannelState::Remote {
                        ch: setup.transport.open_channel(spec.clone(), rg, notify),
                        de: RecordDeserializer::new(max_record),
                        held: VecDeque::new(),
                    }
                }
                _ => ChannelState::Pending {
                    next_try: now,
                    delay: backoff.initial,
                },
            };
            Channel { spec, state }
        })
        .collect()
}

/// A channel's counters, zero, of the kind it starts as.
fn channel_counters(c: &Channel) -> ChannelCounters {
    ChannelCounters {
        spec: c.spec.clone(),
        kind: std::sync::atomic::AtomicU8::new(match c.state {
            ChannelState::Remote { .. } => ChannelKind::Remote as u8,
            _ => ChannelKind::Pending as u8,
        }),
        batches: Counter::default(),
        buffers: Counter::default(),
        bytes: Counter::default(),
        rows: Counter::default(),
    }
}

/// Buffer debloating of a gate with `channels` (the remote ones adjust their credit).
fn gate_debloat(channels: &[Channel], setup: DebloatSetup) -> Mutex<GateDebloat> {
    let buffers = (channels.len() * setup.exclusive_buffers + setup.floating_buffers).max(1);
    let remote = channels
        .iter()
        .filter_map(|c| match &c.state {
            ChannelState::Remote { ch, .. } => Some(ch.clone()),
            _ => None,
        })
        .collect();
    Mutex::new(GateDebloat {
        debloater: Debloater::new(setup.config, Instant::now()),
        buffers,
        remote,
        local: Vec::new(),
    })
}

impl InputGate {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: String,
        specs: Vec<ChannelSpec>,
        pool: LocalPool,
        registry: Weak<Registry>,
        local_address: String,
        backoff: Backoff,
        max_record: usize,
        remote: Option<RemoteSetup>,
        debloat: Option<DebloatSetup>,
    ) -> Result<(InputGate, Arc<GateHandle>)> {
        check_specs(&specs)?;
        let ready = Arc::new(Ready {
            queue: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            queued: (0..specs.len()).map(|_| AtomicBool::new(false)).collect(),
            sleeping: AtomicBool::new(false),
            listener: std::sync::OnceLock::new(),
        });
        let num_remote = specs.iter().filter(|s| s.address != local_address).count();
        let remote_gate = match &remote {
            Some(setup) if num_remote > 0 => Some(remote_gate(&pool, setup, num_remote, max_record)?),
            _ => None,
        };
        let remote_open = remote.as_ref().zip(remote_gate.as_ref());
        let channels = open_channels(specs, &local_address, &ready, remote_open, max_record, &backoff);
        let unresolved = channels
            .iter()
            .filter(|c| matches!(c.state, ChannelState::Pending { .. }))
            .count();
        let handle = Arc::new(GateHandle {
            debloat: debloat.map(|setup| gate_debloat(&channels, setup)),
            name,
            counters: GateCounters::default(),
            channels: channels.iter().map(channel_counters).collect(),
            pool,
            num_channels: channels.len(),
            ended: Default::default(),
            queued: Default::default(),
            stale_barriers: Default::default(),
            remote: Default::default(),
        });
        if let Some(r) = &remote_gate {
            let _ = handle.remote.set(r.clone());
        }
        let n = channels.len();
        let mut gate = InputGate {
            channels,
            ready,
            pending: VecDeque::new(),
            aligner: Aligner::new(n),
            in_flight: InFlight::new(n),
            ended: 0,
            unresolved,
            registry,
            local_address,
            backoff,
            max_record,
            handle: handle.clone(),
            remote: remote_gate,
            pieces: SelfContainedDecoder::new(MAX_PIECE),
            deferred: None,
            closed: false,
        };
        gate.resolve_pending(true)?;
        Ok((gate, handle))
    }

    /// Number of channels.
    pub fn num_channels(&self) -> usize {
        self.channels.len()
    }

    /// The channel specs, in channel order.
    pub fn specs(&self) -> impl Iterator<Item = &ChannelSpec> {
        self.channels.iter().map(|c| &c.spec)
    }

    /// Tries to attach channels whose partition was missing. Fails when a channel's backoff
    /// is exhausted.
    fn resolve_pending(&mut self, first: bool) -> Result<()> {
        let now = Instant::now();
        for idx in 0..self.channels.len() {
            let ChannelState::Pending { next_try, delay } = self.channels[idx].state else {
                continue;
            };
            if now < next_try {
                continue;
            }
            let spec = self.channels[idx].spec.clone();
            if spec.address != self.local_address {
                return Err(Error::InvalidArgument(format!(
                    "channel {spec:?} names another environment ({}), but this environment ({}) has no \
                     transport",
                    spec.address, self.local_address
                )));
            }
            let partition = self
                .registry
                .upgrade()
                .and_then(|r| r.lock().unwrap().get(&spec.partition_id).cloned());
            match partition {
                Some(p) => {
                    let ready = Arc::downgrade(&self.ready);
                    let listener: crate::partition::subpartition::Listener = Arc::new(move || {
                        if let Some(r) = ready.upgrade() {
                            r.push(idx);
                        }
                    });
                    let sub = p.open_reader(spec.subpartition, listener)?;
                    self.unresolved -= 1;
                    self.handle.debloat_attach(&sub);
                    self.handle.mark(idx, ChannelKind::Local);
                    self.channels[idx].state = ChannelState::Local {
                        partition: p,
                        sub,
                        de: RecordDeserializer::new(self.max_record),
                    };
                    self.ready.push(idx);
                }
                None if first => {
                    self.channels[idx].state = ChannelState::Pending {
                        next_try: now + delay,
                        delay,
                    };
                }
                None => {
                    if delay >= self.backoff.max {
                        return Err(Error::PartitionNotFound(spec.partition_id));
                    }
                    let next = (delay * 2).min(self.backoff.max);
                    self.channels[idx].state = ChannelState::Pending {
                        next_try: now + next,
                        delay: next,
                    };
                }
            }
        }
        Ok(())
    }

    fn next_retry(&self) -> Option<Instant> {
        self.channels
            .iter()
            .filter_map(|c| match c.state {
                ChannelState::Pending { next_try, .. } => Some(next_try),
                _ => None,
            })
            .min()
    }

    /// The next batch; `None` once every channel has ended. Blocks as `wait` allows. User
    /// events and checkpoint barriers are skipped (barriers are still aligned).
    pub fn next(&mut self, wait: &mut Wait<'_>) -> Result<Option<RecordBatch>> {
        loop {
            match self.next_item(wait)? {
                None => return Ok(None),
                Some(GateItem::Batch { batch, .. }) => return Ok(Some(batch)),
                Some(_) => {}
            }
        }
    }

    /// The next batch, user event or checkpoint barrier (see [`GateItem`]); `None` once
    /// every channel has ended. Blocks as `wait` allows.
    pub fn next_item(&mut self, wait: &mut Wait<'_>) -> Result<Option<GateItem>> {
        let next = self.next_item_as(wait, true)?;
        next.map(|r| self.decoded(r)).transpose()
    }

    /// A piece a host service queued undecoded, as a batch (decoded and checked here).
    fn decoded(&mut self, relayed: Relayed) -> Result<GateItem> {
        Ok(match relayed {
            Relayed::Item(item) => item,
            Relayed::Piece {
                channel,
                piece,
                token,
                in_flight,
            } => GateItem::Batch {
                channel,
                batch: piece.decode(&mut self.pieces)?,
                token,
                in_flight,
            },
        })
    }

    /// [`InputGate::next_item`] without waiting: `Some` of what it would return, or `None`
    /// when nothing is ready now. For a reader that serves many gates from one thread: it
    /// learns when to try again from [`InputGate::set_ready_listener`] and, while channels
    /// are not resolved yet, [`InputGate::retry_due_in`]. The gate counts as idle from a
    /// `None` to the next item.
    pub fn try_next_item(&mut self) -> Result<Option<Option<GateItem>>> {
        match self.try_next_relayed()? {
            Some(next) => Ok(Some(next.map(|r| self.decoded(r)).transpose()?)),
            None => Ok(None),
        }
    }

    /// [`InputGate::try_next_item`] for a relay: a piece queued undecoded comes as it is.
    pub(crate) fn try_next_relayed(&mut self) -> Result<Option<Option<Relayed>>> {
        let mut now = Wait::timeout(Some(std::time::Duration::ZERO), NOTHING_READY);
        match self.next_item_as(&mut now, false) {
            Ok(item) => {
                self.handle.counters.idle.leave();
                Ok(Some(item))
            }
            Err(Error::Timeout(_, what)) if what == NOTHING_READY => {
                self.handle.counters.idle.enter();
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Calls `listener` whenever a channel becomes ready, from the thread that made it so (a
    /// writer's, an I/O thread): it must be quick and must not call into the gate. Set once
    /// (a second listener is refused: `false`).
    pub fn set_ready_listener(&self, listener: ReadyListener) -> bool {
        self.ready.listener.set(listener).is_ok()
    }

    /// How long until a channel whose partition is not registered yet is looked for again
    /// (`None`: no such channel). A polling reader tries again by then.
    pub fn retry_due_in(&self) -> Option<std::time::Duration> {
        self.next_retry()
            .map(|t| t.saturating_duration_since(Instant::now()))
    }

    fn next_item_as(&mut self, wait: &mut Wait<'_>, meter_idle: bool) -> Result<Option<Relayed>> {
        if self.closed {
            return Err(Error::Closed("input gate"));
        }
        loop {
            if !self.pending.is_empty() && self.handle.remote.get().is_some_and(|r| r.take_priority()) {
                // An unaligned barrier arrived on a remote channel: read the ready channels
                // now, so it overtakes the batches already queued here too.
                self.poll_all_ready()?;
            }
            if let Some(q) = self.pending.pop_front() {
                self.handle.queued.store(self.pending.len(), Ordering::Relaxed);
                let item = match q {
                    Queued::Batch(channel, Handed::Piece(piece), token, _) => {
                        return Ok(Some(Relayed::Piece {
                            channel,
                            piece,
                            token,
                            in_flight: self.in_flight.batch(channel),
                        }))
                    }
                    Queued::Batch(channel, Handed::Batch(batch), token, _record_bytes) => GateItem::Batch {
                        channel,
                        batch,
                        token,
                        in_flight: self.in_flight.batch(channel),
                    },
                    Queued::Event(channel, payload) => GateItem::Event { channel, payload },
                    Queued::Barrier { id, unaligned } => {
                        if unaligned {
                            self.in_flight.barrier(id);
                        }
                        GateItem::Barrier {
                            checkpoint_id: id,
                            unaligned,
                        }
                    }
                    Queued::Aborted(id) => GateItem::CheckpointAborted { checkpoint_id: id },
                    Queued::Position(channel, id) => {
                        self.in_flight.position(channel, id);
                        continue;
                    }
                    Queued::Ended(channel) => {
                        self.in_flight.ended(channel);
                        continue;
                    }
                };
                return Ok(Some(Relayed::Item(item)));
            }
            if let Some(e) = self.deferred.take() {
                return Err(e);
            }
            if self.ended == self.channels.len() {
                return Ok(None);
            }
            if self.unresolved > 0 {
                self.resolve_pending(false)?;
            }
            let idx = match self.take_ready() {
                Some(idx) => idx,
                None => {
                    let _idle = meter_idle.then(|| self.handle.counters.idle.start());
                    match self.wait_ready(wait)? {
                        Some(idx) => idx,
                        None => continue,
                    }
                }
            };
            if self.aligner.is_blocked(idx) {
                // Read again when the alignment resumes it.
                continue;
            }
            self.poll_channel(idx)?;
        }
    }

    /// Carries out what the aligner decided.
    fn apply(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Block(_) => {}
                Action::Resume(channels) => {
                    for c in channels {
                        if let ChannelState::Remote { ch, .. } = &self.channels[c].state {
                            ch.resume_consumption();
                        }
                        self.ready.push(c);
                    }
                }
                Action::Surface { id, unaligned: false } => {
                    self.pending.push_back(Queued::Barrier { id, unaligned: false });
                }
                Action::Surface { id, unaligned: true } => {
                    // In front of the batches received but not yet yielded (they become
                    // in-flight data), but after barriers and aborts already decided.
                    let at = self
                        .pending
                        .iter()
                        .rposition(|q| matches!(q, Queued::Barrier { .. } | Queued::Aborted(_)))
                        .map_or(0, |i| i + 1);
                    self.pending.insert(at, Queued::Barrier { id, unaligned: true });
                }
                Action::Abort { id } => self.pending.push_back(Queued::Aborted(id)),
            }
        }
        self.handle
            .stale_barriers
            .store(self.aligner.stale(), Ordering::Relaxed);
    }

    /// A barrier arrived on channel `idx`; `at_boundary` says whether its deserializer is
    /// between records (an aligned barrier must be).
    fn on_barrier(&mut self, idx: usize, id: u64, unaligned: bool, at_boundary: bool) -> Result<()> {
        if !unaligned && !at_boundary {
            return Err(Error::Protocol(format!(
                "channel {:?}: aligned barrier {id} in the middle of a record",
                self.channels[idx].spec
            )));
        }
        let actions = self.aligner.on_barrier(idx, id, unaligned)?;
        self.apply(actions);
        Ok(())
    }

    /// Channel `idx` ended: bookkeeping shared by local and remote channels.
    fn channel_ended(&mut self, idx: usize) {
        self.handle.mark(idx, ChannelKind::Ended);
        self.channels[idx].state = ChannelState::Ended;
        self.ended += 1;
        self.handle.ended.store(self.ended, Ordering::Relaxed);
        self.pending.push_back(Queued::Ended(idx));
        let actions = self.aligner.on_end(idx);
        self.apply(actions);
    }

    /// Polls every channel that is ready now (not waiting for one).
    fn poll_all_ready(&mut self) -> Result<()> {
        while let Some(idx) = self.take_ready() {
            if !self.aligner.is_blocked(idx) {
                self.poll_channel(idx)?;
            }
        }
        Ok(())
    }

    fn take_ready(&self) -> Option<usize> {
        let idx = self.ready.queue.lock().unwrap().pop_front()?;
        self.ready.queued[idx].store(false, Ordering::SeqCst);
        Some(idx)
    }

    /// Sleeps until a channel is ready, a pending channel is due for a retry, or `wait` ends.
    fn wait_ready(&self, wait: &mut Wait<'_>) -> Result<Option<usize>> {
        loop {
            // The interrupt check may take the GIL: never hold the queue lock across it.
            let mut slice = wait.tick()?;
            if let Some(t) = self.next_retry() {
                let now = Instant::now();
                if t <= now {
                    return Ok(None);
                }
                slice = slice.min(t - now);
            }
            let mut q = self.ready.queue.lock().unwrap();
            if q.is_empty() {
                self.ready.sleeping.store(true, Ordering::SeqCst);
                q = self.ready.cv.wait_timeout(q, slice).unwrap().0;
                self.ready.sleeping.store(false, Ordering::SeqCst);
            }
            if let Some(idx) = q.pop_front() {
                self.ready.queued[idx].store(false, Ordering::SeqCst);
                return Ok(Some(idx));
            }
        }
    }

    fn count_batch(&self, idx: usize, rows: usize, bytes: usize) {
        let counters = &self.handle.counters;
        counters.batches.add(1);
        counters.bytes.add(bytes as u64);
        counters.rows.add(rows as u64);
        self.handle.channels[idx].count_batch(bytes, rows);
    }

    /// Counts consumed buffers holding `bytes` (the bytes feed the debloating throughput).
    fn count_buffers(&self, idx: usize, buffers: usize, bytes: usize) {
        self.handle.counters.buffer_bytes.add(bytes as u64);
        self.handle.counters.buffers.add(buffers as u64);
        self.handle.channels[idx].buffers.add(buffers as u64);
    }

    fn poll_channel(&mut self, idx: usize) -> Result<()> {
        if let ChannelState::Remote { .. } = self.channels[idx].state {
            return self.poll_remote(idx);
        }
        let ChannelState::Local { sub, .. } = &self.channels[idx].state else {
            return Ok(());
        };
        let Some(polled) = sub.poll() else { return Ok(()) };
        match polled {
            Polled::Batch(lb) => {
                self.count_buffers(idx, 1, lb.bytes);
                self.count_batch(idx, lb.batch.num_rows(), lb.bytes);
                self.pending
                    .push_back(Queued::Batch(idx, lb.batch, lb.token, None));
                // lb.segments are recycled here: the batch left the partition's budget.
            }
            Polled::Data(slice) => {
                self.count_buffers(idx, 1, slice.len());
                let mut out = VecDeque::new();
                if let ChannelState::Local { de, .. } = &mut self.channels[idx].state {
                    de.push(slice.as_slice(), &mut out)?;
                }
                for b in out {
                    self.count_batch(idx, b.num_rows(), batch_bytes(&b));
                    self.pending
                        .push_back(Queued::Batch(idx, Handed::Batch(b), None, None));
                }
            }
            Polled::Event(event) => {
                let ChannelState::Local { partition, de, .. } = &self.channels[idx].state else {
                    unreachable!("checked above")
                };
                let at_boundary = de.is_at_record_boundary();
                match event {
                    Event::EndOfPartition | Event::ProducerFailed(_) => {
                        partition.subpartition_done();
                        let spec = self.channels[idx].spec.clone();
                        self.channel_ended(idx);
                        return match event {
                            Event::ProducerFailed(msg) => Err(Error::ProducerFailed(msg)),
                            _ if !at_boundary => Err(Error::Protocol(format!(
                                "channel {spec:?} ended in the middle of a record"
                            ))),
                            _ => Ok(()),
                        };
                    }
                    Event::User(payload) => self.pending.push_back(Queued::Event(idx, payload)),
                    Event::Barrier { id, unaligned } => self.on_barrier(idx, id, unaligned, at_boundary)?,
                    Event::BarrierPosition(id) => self.pending.push_back(Queued::Position(idx, id)),
                }
            }
        }
        self.handle.queued.store(self.pending.len(), Ordering::Relaxed);
        // More may be readable: come back to this channel after the others.
        self.ready.push(idx);
        Ok(())
    }

    /// Takes everything the remote channel received (after what an alignment held back). No
    /// need to requeue the channel: it notifies again when the next buffer arrives.
    fn poll_remote(&mut self, idx: usize) -> Result<()> {
        let ChannelState::Remote { ch, held, .. } = &mut self.channels[idx].state else {
            return Ok(());
        };
        let mut items = std::mem::take(held);
        items.extend(ch.take_all());
        let mut end = None;
        let mut done = Vec::with_capacity(items.len());
        let mut out = VecDeque::new();
        while let Some(item) = items.pop_front() {
            if self.aligner.is_blocked(idx) {
                // An aligned barrier blocked the channel: keep the rest for later.
                items.push_front(item);
                if let ChannelState::Remote { held, .. } = &mut self.channels[idx].state {
                    *held = items;
                }
                break;
            }
            let ChannelState::Remote { de, .. } = &mut self.channels[idx].state else {
                unreachable!("checked above")
            };
            match item {
                Inbound::Data(mut received) => {
                    let records = received.take_records();
                    // Counted in the record budget until the consumer takes the last batch
                    // they made (a schema or dictionary record is done when decoded).
                    let mut record_bytes = received.take_record_bytes();
                    let bytes = records.iter().map(|r| r.len()).sum();
                    for record in records {
                        de.push_record(record, &mut out)?;
                    }
                    let buffers = received.buffers();
                    done.push(received);
                    self.count_buffers(idx, buffers, bytes);
                    let n = out.len();
                    for (i, b) in out.drain(..).enumerate() {
                        self.count_batch(idx, b.num_rows(), batch_bytes(&b));
                        let held = if i + 1 == n { record_bytes.take() } else { None };
                        self.pending
                            .push_back(Queued::Batch(idx, Handed::Batch(b), None, held));
                    }
                }
                Inbound::Event(ev) => {
                    let at_boundary = de.is_at_record_boundary();
                    match ev {
                        Event::EndOfPartition if !at_boundary => {
                            end = Some(Err(Error::Protocol(format!(
                                "channel {:?} ended in the middle of a record",
                                self.channels[idx].spec
                            ))));
                        }
                        Event::EndOfPartition => end = Some(Ok(())),
                        Event::ProducerFailed(msg) => end = Some(Err(Error::ProducerFailed(msg))),
                        Event::User(payload) => self.pending.push_back(Queued::Event(idx, payload)),
                        Event::Barrier { id, unaligned } => {
                            self.on_barrier(idx, id, unaligned, at_boundary)?
                        }
                        Event::BarrierPosition(id) => self.pending.push_back(Queued::Position(idx, id)),
                    }
                }
                Inbound::Failed(e) => end = Some(Err(e)),
            }
        }
        // The segments go back together: new credit for the sender in one AddCredit.
        recycle_all(done);
        self.handle.queued.store(self.pending.len(), Ordering::Relaxed);
        if let Some(result) = end {
            if let ChannelState::Remote { ch, .. } = &self.channels[idx].state {
                ch.close();
            }
            self.channel_ended(idx);
            // What was received before a failure comes out first, then the failure.
            if let Err(e) = result {
                if self.pending.is_empty() {
                    return Err(e);
                }
                self.deferred = Some(e);
            }
        }
        Ok(())
    }

    /// Releases every channel (their subpartitions drop what is queued) and the gate's pool.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        for (idx, ch) in self.channels.iter_mut().enumerate() {
            self.handle.mark(idx, ChannelKind::Ended);
            match &ch.state {
                ChannelState::Local { partition, sub, .. } => {
                    sub.release();
                    partition.subpartition_done();
                }
                ChannelState::Remote { ch, .. } => ch.close(),
                _ => {}
            }
            ch.state = ChannelState::Ended;
        }
        if let Some(r) = &self.remote {
            r.close();
        }
        self.pending.clear();
        self.handle.pool.destroy();
    }

    /// A snapshot of the metrics.
    pub fn metrics(&self) -> GateMetrics {
        self.handle.metrics()
    }

    /// A handle that reads this gate's metrics without access to the gate itself (so a
    /// monitoring thread never waits for a reader blocked in `next`).
    pub fn metrics_reader(&self) -> GateMetricsReader {
        GateMetricsReader(self.handle.clone())
    }
}

impl Drop for InputGate {
    fn drop(&mut self) {
        self.close();
    }
}
