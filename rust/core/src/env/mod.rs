//! `NetworkEnvironment`: one per process (Flink's `NettyShuffleEnvironment`). Owns the global
//! pool, the registry of partitions, the gates' metric handles and the output flusher.
//!
//! Threads: exactly one, the flusher (`creditflow-flusher`), started by [`NetworkEnvironment::new`]
//! (never at import) and stopped by [`NetworkEnvironment::close`] or drop. It flushes every
//! partition each `buffer_timeout` and samples the time meters four times a second.
//!
//! The top of the library: it may use every layer (base, memory, serde, protocol, partition,
//! net, gate).

pub mod settings;

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::base::config::{Backoff, ChannelSpec, DebloatConfig, FlowControl, Limits, TlsSettings};
use crate::base::error::{Error, Result};
use crate::gate::{DebloatSetup, GateHandle, GateMetrics, InputGate, RemoteSetup};
use crate::memory::{GlobalPool, HeldOutside};
use crate::net::{Tls, Transport, TransportConfig};
use crate::partition::spill::replay::READ_AHEAD;
use crate::partition::spill::{SpillDir, SpillDirMetrics, SpillKind, SpillStore};
use crate::partition::{Handoff, PartitionMetrics, Registry, ResultPartition};
use crate::serde::Compression;
use crate::serde::RECORD_HEADER_LEN;

/// Settings of an environment. See the Python `NetworkEnvironment` for the user-facing docs.
#[derive(Debug, Clone)]
pub struct EnvConfig {
    /// Bytes of network memory (`total segments = memory / segment_size`).
    pub memory: usize,
    /// Bytes per segment (power of two, >= 4 KiB).
    pub segment_size: usize,
    /// Listen address, `host:port` (port 0 = ephemeral).
    pub bind: String,
    /// Partly filled buffers become readable after this long (0 = on every write).
    pub buffer_timeout: Duration,
    /// Exclusive buffers per remote channel.
    pub exclusive_buffers: usize,
    /// Floating buffers per gate.
    pub floating_buffers: usize,
    /// Credit or TCP flow control.
    pub flow_control: FlowControl,
    /// Hand batches to local readers without serializing (false: serialize as for remote).
    pub local_handoff: bool,
    /// Partition request retry backoff.
    pub request_backoff: Backoff,
    /// Largest record (one serialized batch) a reader accepts.
    pub max_record_size: usize,
    /// Shared secret for the peer handshake (HMAC challenge-response); `None`: no proof.
    pub secret: Option<Vec<u8>>,
    /// How long a peer may take to connect and complete the handshake; a peer that connects
    /// and stays silent is dropped after it.
    pub handshake_timeout: Duration,
    /// The address to report as `address` when the bound one is not what peers reach
    /// (NAT, containers); `None`: the bound address.
    pub advertise: Option<String>,
    /// Segments a partition may borrow beyond its share to finish a record it has started
    /// when its pool is exhausted (Flink's overdraft buffers, default 5).
    pub overdraft_buffers: usize,
    /// Caps on connections, channels per connection and unread answers per connection.
    pub limits: Limits,
    /// TLS on every connection (mutual unless `client_auth` is off); `None`: plaintext.
    pub tls: Option<TlsSettings>,
    /// A connection whose peer acknowledges nothing (data or keepalive probes) for this long
    /// fails with `ConnectionLost` (TCP_USER_TIMEOUT + keepalive); zero: the OS defaults
    /// (minutes).
    pub peer_timeout: Duration,
    /// Buffer debloating (Flink's `buffer-debloat.enabled`, off by default): every gate sizes
    /// its producers' buffers so the data in flight to it drains in about `debloat_target`.
    pub debloat: bool,
    /// How long the data in flight to a gate should take to drain (default 1 s).
    pub debloat_target: Duration,
    /// Smallest buffer size debloating announces, in bytes (default 256).
    pub debloat_min_buffer: usize,
    /// Where spillable partitions spill (a per-environment subdirectory is made there);
    /// `None`: `creditflow-spill` in the system temp dir.
    pub spill_dir: Option<std::path::PathBuf>,
    /// Bytes the environment's spill files may hold together; `None`: unbounded.
    pub max_spill: Option<u64>,
    /// Arrow IPC body compression of what this environment serializes for readers: the
    /// serialized path of pipelined partitions and the handed-off batches a connection
    /// encodes for a remote reader; `None`: uncompressed. Spillable partitions send their
    /// stored stream as it is (compressed by their own `compression`).
    pub wire_compression: Option<Compression>,
    /// Offer shared-memory links (net/shm) to peers on this host run by this user.
    pub shared_memory: bool,
}

impl EnvConfig {
    /// The buffer debloating calculator's settings (Flink's period, samples and threshold).
    pub fn debloat_config(&self) -> DebloatConfig {
        DebloatConfig {
            target: self.debloat_target,
            min_buffer: self.debloat_min_buffer,
            ..DebloatConfig::new(self.segment_size)
        }
    }

    /// The record bytes a gate with `remote` remote channels may hold (records in progress,
    /// or completed and not taken) before its channels wait to start more: `memory` less the
    /// most its segments can take, so that segments plus records stay within `memory` plus
    /// one batch (at least 1 byte: then records go one at a time).
    pub fn gate_record_budget(&self, remote: usize) -> u64 {
        let segments =
            (remote * self.exclusive_buffers + self.floating_buffers).saturating_mul(self.segment_size);
        self.memory.saturating_sub(segments).max(1) as u64
    }
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            memory: 64 << 20,
            segment_size: 32 << 10,
            bind: "127.0.0.1:0".into(),
            buffer_timeout: Duration::from_millis(100),
            exclusive_buffers: 2,
            floating_buffers: 8,
            flow_control: FlowControl::Credit,
            local_handoff: true,
            request_backoff: Backoff::default(),
            max_record_size: 2 << 30,
            secret: None,
            handshake_timeout: Duration::from_secs(10),
            advertise: None,
            overdraft_buffers: 5,
            limits: Limits::default(),
            tls: None,
            peer_timeout: Duration::from_secs(30),
            debloat: false,
            debloat_target: Duration::from_secs(1),
            debloat_min_buffer: crate::base::config::DEFAULT_DEBLOAT_MIN_BUFFER,
            spill_dir: None,
            max_spill: None,
            wire_compression: None,
            shared_memory: true,
        }
    }
}

/// How long `close` waits for remote consumers of finished partitions to be sent everything.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the flusher samples meters.
const METER_TICK: Duration = Duration::from_millis(250);

struct Inner {
    config: EnvConfig,
    address: String,
    pool: Arc<GlobalPool>,
    registry: Arc<Registry>,
    gates: Mutex<Vec<Weak<GateHandle>>>,
    next_gate: AtomicU64,
    closed: AtomicBool,
    /// Wakes the flusher early on close.
    stop: (Mutex<bool>, Condvar),
    /// The listener, connections and I/O thread.
    transport: Arc<Transport>,
    /// The spill directory, opened when the first spillable partition is created.
    spill: Mutex<Option<Arc<SpillDir>>>,
}

/// A snapshot of an environment's metrics.
#[derive(Debug, Clone)]
pub struct EnvMetrics {
    /// `env.address`.
    pub address: String,
    /// Bytes per segment.
    pub segment_size: usize,
    /// The global pool's cap.
    pub segments_total: usize,
    /// Segments not held by any local pool.
    pub segments_available: usize,
    /// Segments allocated so far (lazy).
    pub segments_allocated: usize,
    /// Sum of local pools' guaranteed minimums.
    pub segments_reserved: usize,
    /// Registered partitions.
    pub partitions: Vec<PartitionMetrics>,
    /// Open gates.
    pub gates: Vec<GateMetrics>,
    /// The spill directory, once a blocking or hybrid partition opened it.
    pub spill: Option<SpillDirMetrics>,
    /// Connections this environment opened and that are up: one per remote address its
    /// gates read from, shared by all their channels.
    pub connections_opened: usize,
    /// Connections other environments opened to this one that are up.
    pub connections_served: usize,
}

/// One per process: pools, partitions, gates.
pub struct NetworkEnvironment {
    inner: Arc<Inner>,
    flusher: Mutex<Option<JoinHandle<()>>>,
}

impl NetworkEnvironment {
    /// Validates `config`, binds the listener and starts the flusher.
    pub fn new(config: EnvConfig) -> Result<NetworkEnvironment> {
        if config.floating_buffers == 0 {
            return Err(Error::InvalidArgument(
                "floating_buffers must be at least 1".into(),
            ));
        }
        config.limits.validate()?;
        let tls = config.tls.as_ref().map(Tls::new).transpose()?.map(Arc::new);
        let pool = GlobalPool::new(config.memory, config.segment_size)?;
        config.debloat_config().validate()?;
        let listener = TcpListener::bind(&config.bind)
            .map_err(|e| Error::InvalidArgument(format!("cannot bind {:?}: {e}", config.bind)))?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let address = match &config.advertise {
            Some(a) => advertised(a, bound.port())?,
            None if bound.ip().is_unspecified() => {
                std::net::SocketAddr::new(outbound_ip(bound.is_ipv6()), bound.port()).to_string()
            }
            None => bound.to_string(),
        };
        let registry: Arc<Registry> = Arc::new(Mutex::new(HashMap::new()));
        let transport = Arc::new(Transport::start(
            listener,
            TransportConfig {
                segment_size: config.segment_size,
                secret: config.secret.clone(),
                flow_control: config.flow_control,
                backoff: config.request_backoff,
                handshake_timeout: config.handshake_timeout,
                limits: config.limits,
                tls,
                peer_timeout: config.peer_timeout,
                wire_compression: config.wire_compression,
                shared_memory: config.shared_memory,
                memory: config.memory,
            },
            Arc::downgrade(&registry),
        )?);
        let inner = Arc::new(Inner {
            config,
            address,
            pool,
            registry,
            gates: Mutex::new(Vec::new()),
            next_gate: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            stop: (Mutex::new(false), Condvar::new()),
            transport,
            spill: Mutex::new(None),
        });
        let weak = Arc::downgrade(&inner);
        let flusher = std::thread::Builder::new()
            .name("creditflow-flusher".into())
            .spawn(move || flusher_loop(weak))
            .map_err(|e| Error::InvalidArgument(format!("cannot start the flusher thread: {e}")))?;
        Ok(NetworkEnvironment {
            inner,
            flusher: Mutex::new(Some(flusher)),
        })
    }

    /// The address other environments reach this one at.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// The configuration.
    pub fn config(&self) -> &EnvConfig {
        &self.inner.config
    }

    /// The global pool.
    pub fn pool(&self) -> &Arc<GlobalPool> {
        &self.inner.pool
    }

    fn check_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::SeqCst) {
            Err(Error::Closed("network environment"))
        } else {
            Ok(())
        }
    }

    /// Creates and registers a partition. Its pool is guaranteed `num_subpartitions + 1`
    /// segments; [`Error::InsufficientBuffers`] if that does not fit.
    pub fn create_partition(&self, id: &str, num_subpartitions: usize) -> Result<Arc<ResultPartition>> {
        self.create(id, num_subpartitions, None)
    }

    /// Creates and registers a blocking or hybrid partition: its writer never waits for
    /// readers, and what does not fit in its pool spills to the environment's spill directory
    /// (opened now if this is the first), compressed with `compression`.
    pub fn create_spillable_partition(
        &self,
        id: &str,
        num_subpartitions: usize,
        kind: SpillKind,
        compression: Option<Compression>,
    ) -> Result<Arc<ResultPartition>> {
        self.create(id, num_subpartitions, Some((kind, compression)))
    }

    /// The spill directory, opened on first use.
    pub fn spill_dir(&self) -> Result<Arc<SpillDir>> {
        self.check_open()?;
        let mut dir = self.inner.spill.lock().unwrap();
        if let Some(d) = dir.as_ref() {
            return Ok(d.clone());
        }
        let cfg = &self.inner.config;
        let d = SpillDir::open(cfg.spill_dir.as_deref(), cfg.max_spill)?;
        Ok(dir.insert(d).clone())
    }

    fn create(
        &self,
        id: &str,
        num_subpartitions: usize,
        spill: Option<(SpillKind, Option<Compression>)>,
    ) -> Result<Arc<ResultPartition>> {
        self.check_open()?;
        if num_subpartitions == 0 {
            return Err(Error::InvalidArgument(
                "num_subpartitions must be at least 1".into(),
            ));
        }
        if id.is_empty() {
            return Err(Error::InvalidArgument("partition id must not be empty".into()));
        }
        let store = match spill {
            Some((kind, compression)) => Some(SpillStore::new(
                id,
                num_subpartitions,
                kind,
                self.spill_dir()?,
                compression,
                READ_AHEAD,
            )),
            None => None,
        };
        let mut reg = self.inner.registry.lock().unwrap();
        if reg.contains_key(id) {
            return Err(Error::PartitionExists(id.to_string()));
        }
        let cfg = &self.inner.config;
        // A spillable partition's store keeps one segment per subpartition it writes plus
        // one it can spill and reuse; its readers' disk reads need READ_AHEAD more.
        let reader_segments = if store.is_some() { READ_AHEAD } else { 0 };
        let pool = self.inner.pool.create_local_pool(
            format!("partition {id:?} ({num_subpartitions} subpartitions)"),
            num_subpartitions + 1 + reader_segments,
            usize::MAX,
            "increase `memory` or decrease `segment_size` of the NetworkEnvironment, or close unused partitions and gates",
        )?;
        pool.set_overdraft(cfg.overdraft_buffers);
        let handoff = if cfg.local_handoff {
            Handoff::Batch
        } else {
            Handoff::Serialized
        };
        let p = Arc::new(ResultPartition::new(
            id.to_string(),
            num_subpartitions,
            pool,
            handoff,
            cfg.wire_compression,
            cfg.buffer_timeout.is_zero(),
            Arc::downgrade(&self.inner.registry),
            store,
        ));
        reg.insert(id.to_string(), p.clone());
        Ok(p)
    }

    /// Holds `bytes` of the environment's memory (rounded up to whole segments) for data its
    /// owner keeps outside the pools, such as rows a consumer has taken but not yet used: the
    /// pools' shares shrink by as much, so spillable partitions spill down to fit (within one
    /// `buffer_timeout`), and free segments beyond the rest are dropped, so what the
    /// environment allocates plus what is held stays within `memory`. Allocates nothing.
    /// Dropping the returned value gives the memory back. [`Error::InsufficientBuffers`] when
    /// the pools' minimums leave less than that.
    pub fn reserve_memory(&self, what: &str, bytes: usize) -> Result<HeldOutside> {
        self.check_open()?;
        let segments = bytes.div_ceil(self.inner.pool.segment_size());
        self.inner.pool.hold_outside(
            &format!("memory reservation {what:?}"),
            segments,
            "increase `memory` of the NetworkEnvironment, or keep less outside its pools",
        )
    }

    /// A registered partition.
    pub fn partition(&self, id: &str) -> Option<Arc<ResultPartition>> {
        self.inner.registry.lock().unwrap().get(id).cloned()
    }

    /// Creates a gate reading `specs`. Its pool is guaranteed `remote channels ×
    /// exclusive_buffers + 1` segments and may grow by `floating_buffers`.
    pub fn create_input_gate(&self, specs: Vec<ChannelSpec>) -> Result<InputGate> {
        self.check_open()?;
        let cfg = &self.inner.config;
        let remote = specs.iter().filter(|s| s.address != self.inner.address).count();
        let n = self.inner.next_gate.fetch_add(1, Ordering::Relaxed);
        let name = format!("gate-{n}");
        let exclusive = remote * cfg.exclusive_buffers;
        let pool = self.inner.pool.create_local_pool(
            format!("input gate {name} ({} channels, {remote} remote)", specs.len()),
            exclusive + 1,
            exclusive + cfg.floating_buffers,
            "increase `memory`, or decrease `exclusive_buffers` or `segment_size` of the NetworkEnvironment",
        )?;
        let max_record = cfg.max_record_size.max(RECORD_HEADER_LEN);
        let (gate, handle) = InputGate::new(
            name,
            specs,
            pool,
            Arc::downgrade(&self.inner.registry),
            self.inner.address.clone(),
            cfg.request_backoff,
            max_record,
            Some(RemoteSetup {
                transport: self.inner.transport.clone(),
                exclusive_buffers: cfg.exclusive_buffers,
                floating_buffers: cfg.floating_buffers,
                record_budget: cfg.gate_record_budget(remote),
            }),
            cfg.debloat.then(|| DebloatSetup {
                config: cfg.debloat_config(),
                exclusive_buffers: cfg.exclusive_buffers,
                floating_buffers: cfg.floating_buffers,
            }),
        )?;
        let mut gates = self.inner.gates.lock().unwrap();
        gates.retain(|g| g.strong_count() > 0);
        gates.push(Arc::downgrade(&handle));
        Ok(gate)
    }

    /// Metrics of the environment, its partitions and gates.
    pub fn metrics(&self) -> EnvMetrics {
        let pool = &self.inner.pool;
        let (connections_opened, connections_served) = self.inner.transport.connection_counts();
        let mut partitions: Vec<PartitionMetrics> = self
            .inner
            .registry
            .lock()
            .unwrap()
            .values()
            .map(|p| p.metrics())
            .collect();
        partitions.sort_by(|a, b| a.id.cmp(&b.id));
        let gates = self
            .inner
            .gates
            .lock()
            .unwrap()
            .iter()
            .filter_map(|g| g.upgrade())
            .map(|g| g.metrics())
            .collect();
        EnvMetrics {
            address: self.inner.address.clone(),
            segment_size: pool.segment_size(),
            segments_total: pool.total_segments(),
            segments_available: pool.available_segments(),
            segments_allocated: pool.allocated_segments(),
            segments_reserved: pool.reserved_segments(),
            partitions,
            gates,
            spill: self.inner.spill.lock().unwrap().as_ref().map(|d| d.metrics()),
            connections_opened,
            connections_served,
        }
    }

    /// Releases every partition, stops the flusher. Gates still open fail on their next
    /// read. Idempotent.
    pub fn close(&self) {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // Remote consumers of finished partitions get what is queued for them first.
        if !self.inner.transport.drain(Instant::now() + DRAIN_TIMEOUT) {
            log::warn!(
                "creditflow: closing with data still queued for remote consumers after {DRAIN_TIMEOUT:?}"
            );
        }
        self.inner.transport.close();
        let parts: Vec<Arc<ResultPartition>> =
            self.inner.registry.lock().unwrap().values().cloned().collect();
        for p in parts {
            p.release();
        }
        if let Some(dir) = self.inner.spill.lock().unwrap().take() {
            dir.remove();
        }
        {
            let (lock, cv) = &self.inner.stop;
            *lock.lock().unwrap() = true;
            cv.notify_all();
        }
        if let Some(h) = self.flusher.lock().unwrap().take() {
            let _ = h.join();
        }
    }

    /// Whether [`NetworkEnvironment::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }
}

impl Drop for NetworkEnvironment {
    fn drop(&mut self) {
        self.close();
    }
}

/// The address of the interface that routes outside (for a wildcard bind without
/// `advertise`): a UDP "connect" sends nothing but picks the route. Loopback if there is none.
fn outbound_ip(v6: bool) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
    let (any, probe, fallback): (&str, &str, IpAddr) = if v6 {
        ("[::]:0", "[2001:db8::1]:9", IpAddr::V6(Ipv6Addr::LOCALHOST))
    } else {
        ("0.0.0.0:0", "192.0.2.1:9", IpAddr::V4(Ipv4Addr::LOCALHOST))
    };
    UdpSocket::bind(any)
        .and_then(|s| s.connect(probe).and_then(|_| s.local_addr()))
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(fallback)
}

/// `advertise` as `host:port`; a bare host (or IPv6 address) gets the bound port.
fn advertised(advertise: &str, port: u16) -> Result<String> {
    let a = advertise.trim();
    if a.is_empty() {
        return Err(Error::InvalidArgument("advertise must not be empty".into()));
    }
    if a.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(a.to_string());
    }
    if a.parse::<std::net::Ipv6Addr>().is_ok() {
        return Ok(format!("[{a}]:{port}"));
    }
    match a.rsplit_once(':') {
        None => Ok(format!("{a}:{port}")),
        Some((host, p)) if !host.is_empty() && !host.contains(':') && p.parse::<u16>().is_ok() => {
            Ok(a.to_string())
        }
        Some(_) => Err(Error::InvalidArgument(format!(
            "advertise must be \"host\" or \"host:port\", got {advertise:?}"
        ))),
    }
}

fn flusher_loop(weak: Weak<Inner>) {
    let mut last_flush = Instant::now();
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let timeout = inner.config.buffer_timeout;
        let period = if timeout.is_zero() {
            METER_TICK
        } else {
            timeout.min(METER_TICK)
        };
        {
            let (lock, cv) = &inner.stop;
            let stopped = lock.lock().unwrap();
            if *stopped {
                return;
            }
            let (stopped, _) = cv.wait_timeout(stopped, period).unwrap();
            if *stopped {
                return;
            }
        }
        let parts: Vec<Arc<ResultPartition>> = inner.registry.lock().unwrap().values().cloned().collect();
        let flush = !timeout.is_zero() && last_flush.elapsed() >= timeout;
        if flush {
            last_flush = Instant::now();
        }
        for p in &parts {
            if flush {
                p.flush();
            }
            p.tick();
        }
        let gates: Vec<Arc<GateHandle>> = inner
            .gates
            .lock()
            .unwrap()
            .iter()
            .filter_map(|g| g.upgrade())
            .collect();
        for g in gates {
            g.tick();
        }
    }
}
