//! What a service's sessions need of it: the environment every attached task's objects live
//! in, the ids it hands out, whether it is stopping, and its metrics.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::metrics::ServiceMetrics;
use crate::env::NetworkEnvironment;

pub(crate) struct HostState {
    pub(crate) env: NetworkEnvironment,
    /// Set when the service ends: worker threads and waits stop.
    pub(crate) stopping: Arc<AtomicBool>,
    /// Sessions now.
    pub(crate) attached: AtomicUsize,
    /// What the gates' links did with the batches they sent.
    pub(crate) sent: Arc<SentCounters>,
    next_id: AtomicU64,
}

/// Batches the gates' links sent to their tasks, by how.
#[derive(Default)]
pub(crate) struct SentCounters {
    /// Handed over where the writing task put them (a writer link's heap): not copied.
    pub(crate) in_place: AtomicU64,
    /// Copied onto the gate's link.
    pub(crate) copied: AtomicU64,
    /// Handed over in place and never freed by the task (it let its gate go before reading
    /// them, or went holding them): freed by the service.
    pub(crate) reclaimed: AtomicU64,
}

impl HostState {
    pub(crate) fn new(env: NetworkEnvironment) -> HostState {
        HostState {
            env,
            stopping: Arc::new(AtomicBool::new(false)),
            attached: AtomicUsize::new(0),
            sent: Arc::default(),
            next_id: AtomicU64::new(1),
        }
    }

    /// A new id for a session or a link.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The service's metrics.
    pub(crate) fn metrics(&self) -> ServiceMetrics {
        let m = self.env.metrics();
        ServiceMetrics {
            address: m.address,
            segment_size: m.segment_size,
            segments_total: m.segments_total,
            segments_available: m.segments_available,
            segments_reserved: m.segments_reserved,
            sessions: self.attached.load(Ordering::SeqCst),
            partitions: m.partitions.len(),
            gates: m.gates.len(),
            connections_opened: m.connections_opened,
            connections_served: m.connections_served,
            batches_in_place: self.sent.in_place.load(Ordering::Relaxed) as usize,
            batches_copied: self.sent.copied.load(Ordering::Relaxed) as usize,
            pieces_reclaimed: self.sent.reclaimed.load(Ordering::Relaxed) as usize,
        }
    }
}
