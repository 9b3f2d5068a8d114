//! [`GateHandle`]: the part of a gate the environment keeps, to tick its meters (and its
//! buffer debloating) and report its metrics from any thread.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::metrics::{ChannelKind, ChannelMetrics, DebloatMetrics, GateMetrics};
use crate::base::config::{ChannelSpec, DebloatConfig};
use crate::base::metrics::{Counter, TimeMeter};
use crate::memory::LocalPool;
use crate::net::{RemoteChannel, RemoteGate};
use crate::partition::subpartition::Subpartition;
use crate::protocol::debloat::Debloater;

#[derive(Default)]
pub(crate) struct GateCounters {
    pub(crate) batches: Counter,
    pub(crate) buffers: Counter,
    pub(crate) bytes: Counter,
    pub(crate) rows: Counter,
    pub(crate) idle: TimeMeter,
    /// Bytes of buffers taken (serialized bytes, or Arrow bytes of handed-off batches): what
    /// the debloating throughput is measured on.
    pub(crate) buffer_bytes: Counter,
}

/// Counters of one channel, shared with the environment for metrics.
pub(super) struct ChannelCounters {
    pub(super) spec: ChannelSpec,
    pub(super) kind: std::sync::atomic::AtomicU8,
    pub(super) batches: Counter,
    pub(super) buffers: Counter,
    pub(super) bytes: Counter,
    pub(super) rows: Counter,
}

impl ChannelCounters {
    pub(super) fn count_batch(&self, bytes: usize, rows: usize) {
        self.batches.add(1);
        self.bytes.add(bytes as u64);
        self.rows.add(rows as u64);
    }
}

/// A gate's buffer debloating: the calculator and where to announce its sizes.
pub(super) struct GateDebloat {
    pub(super) debloater: Debloater,
    /// Buffers that can be in flight to the gate: exclusive buffers of every channel (local
    /// channels count as if remote) plus the floating ones.
    pub(super) buffers: usize,
    pub(super) remote: Vec<Arc<RemoteChannel>>,
    /// Subpartitions of the local channels attached so far.
    pub(super) local: Vec<Arc<Subpartition>>,
}

impl GateDebloat {
    pub(super) fn announce(&self, size: usize) {
        for ch in &self.remote {
            ch.announce_buffer_size(size);
        }
        for sub in &self.local {
            sub.set_buffer_size(size);
        }
    }
}

/// Buffer debloating settings of a gate: the calculator's and the buffer count.
pub(crate) struct DebloatSetup {
    pub(crate) config: DebloatConfig,
    pub(crate) exclusive_buffers: usize,
    pub(crate) floating_buffers: usize,
}

/// Reads a gate's metrics from any thread (see [`InputGate::metrics_reader`](super::InputGate::metrics_reader)).
#[derive(Clone)]
pub struct GateMetricsReader(pub(super) Arc<GateHandle>);

impl GateMetricsReader {
    /// A snapshot of the gate's metrics.
    pub fn read(&self) -> GateMetrics {
        self.0.metrics()
    }
}

/// The part of a gate the environment keeps, to tick its meters and report its metrics.
pub(crate) struct GateHandle {
    pub(super) name: String,
    pub(super) counters: GateCounters,
    pub(super) pool: LocalPool,
    pub(super) num_channels: usize,
    pub(super) ended: std::sync::atomic::AtomicUsize,
    pub(super) queued: std::sync::atomic::AtomicUsize,
    pub(super) stale_barriers: std::sync::atomic::AtomicU64,
    pub(super) remote: std::sync::OnceLock<Arc<RemoteGate>>,
    pub(super) channels: Vec<ChannelCounters>,
    /// Buffer debloating, when on. Locked by the environment's flusher each tick and by the
    /// reader when a local channel attaches.
    pub(super) debloat: Option<Mutex<GateDebloat>>,
}

impl GateHandle {
    pub(crate) fn tick(&self) {
        self.counters.idle.tick();
        self.debloat_tick(Instant::now());
    }

    /// Feeds the debloater the gate's totals; announces a new buffer size to every channel's
    /// producer when it changed enough.
    pub(super) fn debloat_tick(&self, now: Instant) {
        let Some(d) = &self.debloat else { return };
        let mut d = d.lock().unwrap();
        let c = &self.counters;
        let buffers = d.buffers;
        if let Some(size) = d
            .debloater
            .update(now, c.buffer_bytes.get(), c.idle.total(), buffers)
        {
            log::debug!(
                "creditflow: {}: buffer size {size} bytes ({:.0} bytes/s over {buffers} buffers)",
                self.name,
                d.debloater.throughput()
            );
            d.announce(size);
        }
    }

    /// A local channel attached: it gets the size announced so far, and later ones.
    pub(super) fn debloat_attach(&self, sub: &Arc<Subpartition>) {
        let Some(d) = &self.debloat else { return };
        let mut d = d.lock().unwrap();
        if d.debloater.announced() < d.debloater.config().max_buffer {
            sub.set_buffer_size(d.debloater.announced());
        }
        d.local.push(sub.clone());
    }

    pub(super) fn mark(&self, idx: usize, kind: ChannelKind) {
        self.channels[idx].kind.store(kind as u8, Ordering::Relaxed);
    }

    pub(crate) fn metrics(&self) -> GateMetrics {
        let c = &self.counters;
        let mut per_remote = self.remote.get().map(|r| r.channel_stats()).unwrap_or_default();
        let channels = self
            .channels
            .iter()
            .enumerate()
            .map(|(index, ch)| ChannelMetrics {
                index,
                spec: ch.spec.clone(),
                kind: ChannelKind::from_u8(ch.kind.load(Ordering::Relaxed)),
                batches_received: ch.batches.get(),
                buffers_received: ch.buffers.get(),
                bytes_received: ch.bytes.get(),
                rows_received: ch.rows.get(),
                remote: per_remote.remove(&ch.spec),
            })
            .collect();
        GateMetrics {
            name: self.name.clone(),
            num_channels: self.num_channels,
            ended_channels: self.ended.load(Ordering::Relaxed),
            pool: self.pool.stats(),
            queued_batches: self.queued.load(Ordering::Relaxed),
            stale_barriers: self.stale_barriers.load(Ordering::Relaxed),
            batches_received: c.batches.get(),
            buffers_received: c.buffers.get(),
            bytes_received: c.bytes.get(),
            rows_received: c.rows.get(),
            idle_ms_per_second: c.idle.ms_per_second(),
            idle_total: c.idle.total(),
            remote: self.remote.get().map(|r| r.stats()),
            debloat: self.debloat.as_ref().map(|d| {
                let d = d.lock().unwrap();
                DebloatMetrics {
                    buffer_size: d.debloater.announced(),
                    desired_buffer_size: d.debloater.desired(),
                    throughput: d.debloater.throughput(),
                    buffers: d.buffers,
                }
            }),
            channels,
        }
    }
}
