//! The service's side of one attached task: what it created, the links it asked for and has
//! not connected yet, its requests, and the cleanup when it ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::codec::{Reply, Request};
use super::link;
use super::metrics;
use super::process::Process;
use super::state::HostState;
use crate::base::error::{Error, Result};
use crate::base::wait::Wait;
use crate::gate::{GateMetrics, GateMetricsReader, InputGate};
use crate::partition::{Partitioner, ResultPartition};

/// A link a task asked for and has not connected yet.
pub(crate) enum PendingLink {
    /// A writer's: into `partition` through `partitioner`, with a heap of `heap` bytes.
    Writer {
        partition: Arc<ResultPartition>,
        partitioner: Partitioner,
        heap: usize,
    },
    /// A gate's (the gate is created when asked for, so its errors come with the answer).
    Gate(Box<InputGate>),
}

/// One attached task.
pub(crate) struct TaskSession {
    /// The task's process, as it was when it attached (to tell later whether it is gone).
    pub(crate) process: Process,
    /// Set when the task's session ends: its links' threads and waits stop.
    pub(crate) dead: Arc<AtomicBool>,
    /// Partitions the task created (finished ones outlive it).
    partitions: Mutex<Vec<Arc<ResultPartition>>>,
    /// The links asked for and not connected yet, with when they were asked for.
    links: Mutex<HashMap<u64, (Instant, PendingLink)>>,
    gates: Mutex<Gates>,
}

/// The task's gates' metrics.
#[derive(Default)]
struct Gates {
    /// By link.
    metrics: HashMap<u64, GateMetricsOf>,
    /// The links of the gates that ended, oldest first: each keeps its last metrics until
    /// [`ENDED_GATES_KEPT`] more gates have ended.
    ended: std::collections::VecDeque<u64>,
}

/// Ended gates whose last metrics a session keeps (a worker's session outlives its tasks, so
/// it may see many gates end).
const ENDED_GATES_KEPT: usize = 16;

/// Where a gate's metrics come from: the gate while it is served, its last metrics after.
enum GateMetricsOf {
    Open(GateMetricsReader),
    Ended(Box<GateMetrics>),
}

impl TaskSession {
    pub(crate) fn new(pid: u32) -> TaskSession {
        TaskSession {
            process: Process::of(pid),
            dead: Arc::new(AtomicBool::new(false)),
            partitions: Mutex::new(Vec::new()),
            links: Mutex::new(HashMap::new()),
            gates: Mutex::new(Gates::default()),
        }
    }

    /// Gate `link` is no longer served (it ended, or its task let it go): its last metrics
    /// replace the gate's own handle, which the service then no longer counts as open, and
    /// the oldest ended gates beyond [`ENDED_GATES_KEPT`] are forgotten.
    pub(crate) fn gate_ended(&self, link: u64) {
        let gates = &mut *self.gates.lock().unwrap();
        let Some(of) = gates.metrics.get_mut(&link) else {
            return;
        };
        if let GateMetricsOf::Open(reader) = of {
            *of = GateMetricsOf::Ended(Box::new(reader.read()));
        }
        gates.ended.push_back(link);
        while gates.ended.len() > ENDED_GATES_KEPT {
            if let Some(old) = gates.ended.pop_front() {
                gates.metrics.remove(&old);
            }
        }
    }

    /// The link `link` if the task asked for it and has not connected it yet.
    pub(crate) fn take_link(&self, link: u64) -> Option<PendingLink> {
        self.links.lock().unwrap().remove(&link).map(|(_, l)| l)
    }

    /// Drops the links asked for `timeout` ago or more and still not connected (the task gave
    /// up opening them and lives on): a gate's goes with its channels, which free their
    /// buffers and the subpartitions they took, so that another gate can read them.
    pub(crate) fn drop_stale_links(&self, timeout: Duration) {
        let stale: Vec<(u64, (Instant, PendingLink))> = self
            .links
            .lock()
            .unwrap()
            .extract_if(|_, (asked, _)| asked.elapsed() >= timeout)
            .collect();
        for (link, (_, pending)) in stale {
            log::warn!(
                "creditflow: host service drops link {link} of task pid {}: not connected within {timeout:?}",
                self.process.pid()
            );
            if let PendingLink::Gate(gate) = pending {
                drop(gate);
                self.gate_ended(link);
            }
        }
    }

    /// The task is gone (or the service ends): its gates close when their threads see it,
    /// its links not yet connected go, and every partition it created and had not finished
    /// fails, so its readers get the data written before and then `ProducerFailed`, never an
    /// end of partition (a blocking or hybrid one is released as well: later readers find none).
    pub(crate) fn end(&self) {
        if self.dead.swap(true, Ordering::SeqCst) {
            return;
        }
        self.links.lock().unwrap().clear();
        for p in self.partitions.lock().unwrap().drain(..) {
            if !p.is_finished() {
                p.fail(&format!(
                    "the task (pid {}) writing partition {:?} ended before finishing it",
                    self.process.pid(),
                    p.id()
                ));
            }
            if p.is_failed() && p.replays() {
                // Kept for later readers otherwise: nothing in it is whole, and with its
                // writer gone nobody could release it and give its share back to the host.
                p.release();
            }
        }
    }

    /// Answers one request.
    pub(crate) fn handle(&self, shared: &HostState, request: Request) -> Reply {
        match self.answer(shared, request) {
            Ok(r) => r,
            Err(e) => Reply::Failed(e),
        }
    }

    fn partition(&self, shared: &HostState, id: &str) -> Result<Arc<ResultPartition>> {
        shared
            .env
            .partition(id)
            .ok_or_else(|| Error::PartitionNotFound(id.to_string()))
    }

    fn answer(&self, shared: &HostState, request: Request) -> Result<Reply> {
        match request {
            Request::CreatePartition {
                id,
                subpartitions,
                kind,
                compression,
            } => {
                let n = subpartitions as usize;
                let p = match kind {
                    None => shared.env.create_partition(&id, n)?,
                    Some(kind) => shared.env.create_spillable_partition(&id, n, kind, compression)?,
                };
                let mut mine = self.partitions.lock().unwrap();
                mine.retain(|p| !p.is_released());
                mine.push(p);
                Ok(Reply::Done)
            }
            Request::OpenWriter {
                partition,
                partitioner,
                heap,
            } => {
                let heap = link::checked_writer_heap(heap)?;
                let partition = self.partition(shared, &partition)?;
                Ok(self.pending(
                    shared.next_id(),
                    PendingLink::Writer {
                        partition,
                        partitioner,
                        heap,
                    },
                ))
            }
            Request::CreateGate { specs } => {
                let gate = shared.env.create_input_gate(specs)?;
                let link = shared.next_id();
                let metrics = GateMetricsOf::Open(gate.metrics_reader());
                self.gates.lock().unwrap().metrics.insert(link, metrics);
                Ok(self.pending(link, PendingLink::Gate(Box::new(gate))))
            }
            Request::Release { partition } => {
                if let Some(p) = shared.env.partition(&partition) {
                    p.release();
                }
                Ok(Reply::Done)
            }
            Request::WaitConsumed { partition, timeout } => self.wait_consumed(shared, &partition, timeout),
            Request::Flush { partition } => {
                self.partition(shared, &partition)?.flush();
                Ok(Reply::Done)
            }
            Request::PartitionState { partition } => Ok(match shared.env.partition(&partition) {
                Some(p) => Reply::State {
                    finished: p.is_finished(),
                    released: false,
                },
                None => Reply::State {
                    finished: self.released(&partition).is_none_or(|p| p.is_finished()),
                    released: true,
                },
            }),
            Request::PartitionMetrics { partition } => {
                let p = self
                    .partition(shared, &partition)
                    .or_else(|e| self.released(&partition).ok_or(e))?;
                Ok(Reply::Metrics(metrics::encode_partition(&p.metrics())))
            }
            Request::GateMetrics { link } => self.gate_metrics(link),
            Request::ServiceMetrics => Ok(Reply::Metrics(metrics::encode_service(&shared.metrics()))),
        }
    }

    /// Keeps `pending` as link `link` until the task connects it (or [`Self::drop_stale_links`]
    /// drops it); the answer names the link.
    fn pending(&self, link: u64, pending: PendingLink) -> Reply {
        self.links.lock().unwrap().insert(link, (Instant::now(), pending));
        Reply::Link { link }
    }

    /// Waits until every reader of `partition` (registered, or released by this task) read
    /// everything, as long as the session and the service last.
    fn wait_consumed(&self, shared: &HostState, partition: &str, timeout: Option<Duration>) -> Result<Reply> {
        let p = self
            .partition(shared, partition)
            .or_else(|e| self.released(partition).ok_or(e))?;
        let (dead, stopping) = (self.dead.clone(), shared.stopping.clone());
        let mut check = || {
            if dead.load(Ordering::SeqCst) || stopping.load(Ordering::SeqCst) {
                Err(Error::Closed("host service"))
            } else {
                Ok(())
            }
        };
        let mut wait =
            Wait::timeout(timeout, "waiting for the consumers to read everything").with_check(&mut check);
        p.wait_consumed(&mut wait)?;
        Ok(Reply::Done)
    }

    /// Gate `link`'s metrics: the gate's own while it is served, its last ones after.
    fn gate_metrics(&self, link: u64) -> Result<Reply> {
        let m = match self.gates.lock().unwrap().metrics.get(&link) {
            Some(GateMetricsOf::Open(reader)) => reader.read(),
            Some(GateMetricsOf::Ended(last)) => (**last).clone(),
            None => {
                return Err(Error::InvalidArgument(format!(
                    "no gate {link} in this session (or it ended long ago)"
                )))
            }
        };
        Ok(Reply::Metrics(metrics::encode_gate(&m)))
    }

    /// A partition of this task no longer registered (released), if the session still knows
    /// it.
    fn released(&self, id: &str) -> Option<Arc<ResultPartition>> {
        self.partitions
            .lock()
            .unwrap()
            .iter()
            .find(|p| p.id() == id)
            .cloned()
    }
}
