//! `NetworkEnvironment` and `ResultPartition`, and metrics as plain dicts.

use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::Duration;

use creditflow_core::base::config::{Backoff, Limits};
use creditflow_core::env::EnvMetrics;
use creditflow_core::gate::GateMetrics;
use creditflow_core::memory::PoolStats;
use creditflow_core::partition::PartitionMetrics;
use creditflow_core::{base::units, EnvConfig, FlowControl};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PyString};

use crate::error::IntoPyResult;
use crate::io::{ChannelSpec, InputGate};
use crate::tls::TlsConfig;

/// Reads a byte size given as an int or a string with a unit.
fn bytes_arg(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    if let Ok(i) = value.cast::<PyInt>() {
        let v: i64 = i.extract()?;
        return usize::try_from(v).map_err(|_| {
            PyValueError::new_err(format!("{name} must be a non-negative number of bytes, got {v}"))
        });
    }
    if let Ok(s) = value.cast::<PyString>() {
        return units::parse_bytes(s.to_str()?).map_err(|e| PyValueError::new_err(format!("{name}: {e}")));
    }
    Err(PyTypeError::new_err(format!(
        "{name} must be an int (bytes) or a string such as \"64MiB\""
    )))
}

/// A non-negative count; a negative one is a `ValueError` (not pyo3's `OverflowError`).
pub(crate) fn count_arg(value: i64, name: &str) -> PyResult<usize> {
    usize::try_from(value).map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, got {value}")))
}

/// Parses a byte size such as ``"64MiB"``, ``"32 KiB"`` or ``65536`` into bytes.
#[pyfunction]
pub fn parse_bytes(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    bytes_arg(value, "size")
}

fn is_loopback(bind: &str) -> bool {
    match bind.to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

/// Fails if used in a process other than the one that created the object (after fork).
pub(crate) fn check_pid(pid: u32, what: &str) -> PyResult<()> {
    let now = std::process::id();
    if now != pid {
        return Err(PyRuntimeError::new_err(format!(
            "this {what} was created in process {pid} and cannot be used in process {now} (after fork); \
             create a new NetworkEnvironment in this process"
        )));
    }
    Ok(())
}

/// One per process: the buffer pool, partitions, gates, the listener and connections.
#[pyclass(module = "creditflow._native", frozen, weakref)]
pub struct NetworkEnvironment {
    inner: creditflow_core::NetworkEnvironment,
    pid: u32,
    /// `/metrics` servers started by `serve_metrics` (`creditflow.prometheus.MetricsServer`),
    /// closed with the environment.
    metrics_servers: std::sync::Mutex<Vec<Py<PyAny>>>,
    /// `creditflow.logs._release`, called once when this environment closes (taken at
    /// creation: importing at interpreter shutdown fails). `None`: already called.
    release_logs: std::sync::Mutex<Option<Py<PyAny>>>,
}

impl NetworkEnvironment {
    /// Stops the `/metrics` servers and lets go of the log-forwarding thread (stopped when
    /// the last environment of the process lets go). Idempotent. Errors are reported as
    /// unraisable when `report` (not when dropped, possibly at interpreter shutdown).
    fn stop_python_side(&self, py: Python<'_>, report: bool) {
        let servers = std::mem::take(&mut *self.metrics_servers.lock().unwrap_or_else(|e| e.into_inner()));
        let release = self.release_logs.lock().unwrap_or_else(|e| e.into_inner()).take();
        // Not in a forked child: the thread and its count belong to the parent.
        let release = release.filter(|_| std::process::id() == self.pid);
        let check = |obj: &Py<PyAny>, result: PyResult<Py<PyAny>>| {
            if let (Err(e), true) = (result, report) {
                e.write_unraisable(py, Some(obj.bind(py)));
            }
        };
        for server in &servers {
            check(server, server.call_method0(py, "close"));
        }
        if let Some(release) = &release {
            check(release, release.call0(py));
        }
    }
}

impl Drop for NetworkEnvironment {
    fn drop(&mut self) {
        // Dropped by Python's GC, so attached (`try_attach` only guards the unexpected).
        let _ = Python::try_attach(|py| self.stop_python_side(py, false));
    }
}

#[pymethods]
impl NetworkEnvironment {
    #[new]
    #[pyo3(signature = (
        memory = None, segment_size = None, bind = "127.0.0.1:0", secret = None, flow_control = "credit",
        buffer_timeout = 0.1, exclusive_buffers = 2, floating_buffers = 8, *, insecure = false,
        local_handoff = true, request_backoff_initial = 0.1, request_backoff_max = 10.0, advertise = None,
        handshake_timeout = 10.0, max_connections = 512, max_channels_per_connection = 16384,
        max_outstanding_requests = 4096, tls = None, peer_timeout = 30.0, overdraft_buffers = 5,
        debloat = false, debloat_target = 1.0, debloat_min_buffer = 256
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        memory: Option<&Bound<'_, PyAny>>,
        segment_size: Option<&Bound<'_, PyAny>>,
        bind: &str,
        secret: Option<&Bound<'_, PyAny>>,
        flow_control: &str,
        buffer_timeout: f64,
        exclusive_buffers: i64,
        floating_buffers: i64,
        insecure: bool,
        local_handoff: bool,
        request_backoff_initial: f64,
        request_backoff_max: f64,
        advertise: Option<String>,
        handshake_timeout: f64,
        max_connections: i64,
        max_channels_per_connection: i64,
        max_outstanding_requests: i64,
        tls: Option<Bound<'_, TlsConfig>>,
        peer_timeout: f64,
        overdraft_buffers: i64,
        debloat: bool,
        debloat_target: f64,
        debloat_min_buffer: i64,
    ) -> PyResult<Self> {
        let mut config = EnvConfig::default();
        if let Some(m) = memory {
            config.memory = bytes_arg(m, "memory")?;
        }
        if let Some(s) = segment_size {
            config.segment_size = bytes_arg(s, "segment_size")?;
        }
        config.bind = bind.to_string();
        let secret = match secret {
            None => None,
            Some(s) => {
                if let Ok(s) = s.cast::<PyString>() {
                    Some(s.to_str()?.as_bytes().to_vec())
                } else if let Ok(b) = s.extract::<Vec<u8>>() {
                    Some(b)
                } else {
                    return Err(PyTypeError::new_err("secret must be bytes or str"));
                }
            }
        };
        if matches!(&secret, Some(s) if s.is_empty()) {
            return Err(PyValueError::new_err("secret must not be empty"));
        }
        let tls = tls.map(|t| t.get().settings.clone());
        let mutual_tls = tls.as_ref().is_some_and(|t| t.client_auth);
        if secret.is_none() && !mutual_tls && !insecure && !is_loopback(bind) {
            return Err(PyValueError::new_err(format!(
                "refusing to bind {bind:?} without a secret or mutual TLS: anyone who can reach it could read \
                 your data. Pass secret=... (shared by all peers) or tls=TLSConfig(...), bind a loopback \
                 address, or pass insecure=True"
            )));
        }
        config.flow_control = match flow_control {
            "credit" => FlowControl::Credit,
            "tcp" => FlowControl::Tcp,
            other => {
                return Err(PyValueError::new_err(format!(
                    "flow_control must be \"credit\" or \"tcp\", got {other:?}"
                )))
            }
        };
        let secs = |v: f64, name: &str| -> PyResult<Duration> {
            if v.is_finite() && v >= 0.0 {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(PyValueError::new_err(format!(
                    "{name} must be a non-negative number of seconds, got {v}"
                )))
            }
        };
        config.buffer_timeout = secs(buffer_timeout, "buffer_timeout")?;
        config.exclusive_buffers = count_arg(exclusive_buffers, "exclusive_buffers")?;
        config.floating_buffers = count_arg(floating_buffers, "floating_buffers")?;
        config.local_handoff = local_handoff;
        config.request_backoff = Backoff {
            initial: secs(request_backoff_initial, "request_backoff_initial")?,
            max: secs(request_backoff_max, "request_backoff_max")?,
        };
        if config.request_backoff.initial.is_zero() {
            return Err(PyValueError::new_err("request_backoff_initial must be positive"));
        }
        config.handshake_timeout = secs(handshake_timeout, "handshake_timeout")?;
        config.overdraft_buffers = count_arg(overdraft_buffers, "overdraft_buffers")?;
        config.debloat = debloat;
        config.debloat_target = secs(debloat_target, "debloat_target")?;
        if config.debloat_target.is_zero() {
            return Err(PyValueError::new_err("debloat_target must be positive"));
        }
        config.debloat_min_buffer = count_arg(debloat_min_buffer, "debloat_min_buffer")?;
        if config.handshake_timeout.is_zero() {
            return Err(PyValueError::new_err("handshake_timeout must be positive"));
        }
        config.limits = Limits {
            max_connections: count_arg(max_connections, "max_connections")?,
            max_channels_per_connection: count_arg(
                max_channels_per_connection,
                "max_channels_per_connection",
            )?,
            max_outstanding_requests: count_arg(max_outstanding_requests, "max_outstanding_requests")?,
        };
        config.secret = secret;
        config.tls = tls;
        config.peer_timeout = secs(peer_timeout, "peer_timeout")?;
        config.advertise = advertise;
        let (inner, release_logs) = Python::attach(|py| -> PyResult<_> {
            let inner = creditflow_core::NetworkEnvironment::new(config).py_err(py)?;
            // Rust log records reach `logging` from here on (a daemon thread while any
            // environment of the process is open).
            let logs = py.import("creditflow.logs")?;
            logs.call_method0("_acquire")?;
            Ok((inner, logs.getattr("_release")?.unbind()))
        })?;
        Ok(NetworkEnvironment {
            inner,
            pid: std::process::id(),
            metrics_servers: Default::default(),
            release_logs: std::sync::Mutex::new(Some(release_logs)),
        })
    }

    /// The address other environments reach this one at, ``"host:port"``.
    #[getter]
    fn address(&self) -> &str {
        self.inner.address()
    }

    /// Bytes per segment.
    #[getter]
    fn segment_size(&self) -> usize {
        self.inner.config().segment_size
    }

    /// Total segments (``memory // segment_size``).
    #[getter]
    fn total_segments(&self) -> usize {
        self.inner.pool().total_segments()
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Creates a partition with ``num_subpartitions`` pipelined subpartitions.
    #[pyo3(signature = (partition_id, num_subpartitions = 1))]
    fn create_partition(
        &self,
        py: Python<'_>,
        partition_id: &str,
        num_subpartitions: i64,
    ) -> PyResult<ResultPartition> {
        check_pid(self.pid, "NetworkEnvironment")?;
        let num_subpartitions = count_arg(num_subpartitions, "num_subpartitions")?;
        let inner = self
            .inner
            .create_partition(partition_id, num_subpartitions)
            .py_err(py)?;
        Ok(ResultPartition { inner, pid: self.pid })
    }

    /// Creates an input gate reading the given channels.
    fn create_input_gate(&self, py: Python<'_>, channels: &Bound<'_, PyAny>) -> PyResult<InputGate> {
        check_pid(self.pid, "NetworkEnvironment")?;
        let mut specs = Vec::new();
        for item in channels.try_iter()? {
            let item = item?;
            let spec = item.cast::<ChannelSpec>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "channels must be ChannelSpec objects, got {}",
                    item.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                ))
            })?;
            specs.push(spec.get().to_core());
        }
        let gate = self.inner.create_input_gate(specs).py_err(py)?;
        Ok(InputGate::new(gate, self.pid))
    }

    /// Metrics of the environment, its partitions and gates, as a dict.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        env_metrics_dict(py, &self.inner.metrics())
    }

    /// Serves this environment's metrics in the Prometheus text format at
    /// ``http://addr:port/metrics`` (``port=0``: any free port) until the environment closes.
    #[pyo3(signature = (port = 0, addr = "127.0.0.1"))]
    fn serve_metrics(slf: &Bound<'_, Self>, port: i64, addr: &str) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        check_pid(this.pid, "NetworkEnvironment")?;
        if this.inner.is_closed() {
            return Err(crate::error::to_py(
                py,
                creditflow_core::Error::Closed("the environment is closed"),
            ));
        }
        let server = py
            .import("creditflow.prometheus")?
            .call_method1("serve", (slf, port, addr))?
            .unbind();
        this.metrics_servers.lock().unwrap().push(server.clone_ref(py));
        Ok(server)
    }

    /// Closes connections and the listener, releases every partition, stops background
    /// threads and `/metrics` servers. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.close());
        self.stop_python_side(py, true);
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        let m = self.inner.metrics();
        format!(
            "NetworkEnvironment(address={:?}, segments={}/{} available, segment_size={}{})",
            m.address,
            m.segments_available,
            m.segments_total,
            m.segment_size,
            if self.inner.is_closed() { ", closed" } else { "" }
        )
    }
}

/// A partition: N subpartitions filled by a :class:`RecordWriter`.
#[pyclass(module = "creditflow._native", frozen)]
pub struct ResultPartition {
    pub(crate) inner: Arc<creditflow_core::ResultPartition>,
    pub(crate) pid: u32,
}

#[pymethods]
impl ResultPartition {
    /// The partition id.
    #[getter]
    fn id(&self) -> &str {
        self.inner.id()
    }

    /// Number of subpartitions.
    #[getter]
    fn num_subpartitions(&self) -> usize {
        self.inner.num_subpartitions()
    }

    /// Schema of the first batch written (``pyarrow.Schema``), or None.
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.inner.schema() {
            None => Ok(None),
            Some(s) => Ok(Some(pyo3_arrow::PySchema::new(s).into_pyarrow(py)?)),
        }
    }

    /// Whether end-of-partition was sent.
    #[getter]
    fn finished(&self) -> bool {
        self.inner.is_finished()
    }

    /// Whether the partition was released (all readers done, or released explicitly).
    #[getter]
    fn released(&self) -> bool {
        self.inner.is_released()
    }

    /// Makes partly filled buffers readable now.
    fn flush(&self) -> PyResult<()> {
        check_pid(self.pid, "ResultPartition")?;
        self.inner.flush();
        Ok(())
    }

    /// Drops queued data, returns the memory and unregisters the partition.
    fn release(&self, py: Python<'_>) {
        py.detach(|| self.inner.release());
    }

    /// Blocks until every reader received everything up to end-of-partition (the partition
    /// is then released). ``timeout`` in seconds; raises :class:`TimeoutError` when it runs
    /// out. The GIL is released and Ctrl-C interrupts.
    #[pyo3(signature = (timeout=None))]
    fn wait_consumed(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let inner = self.inner.clone();
        crate::blocking::run(
            py,
            crate::blocking::timeout(timeout)?,
            "waiting for the consumers to read everything",
            move |w| inner.wait_consumed(w),
        )
    }

    /// This partition's metrics, as a dict.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        partition_metrics_dict(py, &self.inner.metrics())
    }

    fn __repr__(&self) -> String {
        format!(
            "ResultPartition(id={:?}, num_subpartitions={})",
            self.inner.id(),
            self.inner.num_subpartitions()
        )
    }
}

fn pool_dict<'py>(py: Python<'py>, p: &PoolStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("min", p.min)?;
    d.set_item("max", if p.max == usize::MAX { None } else { Some(p.max) })?;
    d.set_item("share", p.share)?;
    d.set_item("held", p.held)?;
    d.set_item("in_use", p.in_use)?;
    Ok(d)
}

pub(crate) fn partition_metrics_dict<'py>(
    py: Python<'py>,
    m: &PartitionMetrics,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", &m.id)?;
    d.set_item("num_subpartitions", m.num_subpartitions)?;
    d.set_item("out_pool_usage", m.out_pool_usage())?;
    d.set_item("out_pool", pool_dict(py, &m.pool)?)?;
    d.set_item("backlog", PyList::new(py, &m.backlog)?)?;
    d.set_item("batches_written", m.batches_written)?;
    d.set_item("buffers_written", m.buffers_written)?;
    d.set_item("bytes_written", m.bytes_written)?;
    d.set_item("rows_written", m.rows_written)?;
    d.set_item("backpressured_time_ms_per_second", m.backpressured_ms_per_second)?;
    d.set_item("backpressure_level", m.level().as_str())?;
    d.set_item("busy_time_ms_per_second", m.busy_ms_per_second())?;
    d.set_item("backpressured_seconds_total", m.backpressured_total.as_secs_f64())?;
    d.set_item("finished", m.finished)?;
    let subs = PyList::empty(py);
    for sm in &m.subpartitions {
        let sd = PyDict::new(py);
        sd.set_item("index", sm.index)?;
        sd.set_item("backlog", sm.backlog)?;
        sd.set_item("consumed", sm.consumed)?;
        sd.set_item("buffers_out", sm.buffers_out)?;
        sd.set_item("bytes_out", sm.bytes_out)?;
        match &sm.remote {
            Some(r) => {
                sd.set_item("peer", &r.peer)?;
                sd.set_item("credit", r.credit)?;
                sd.set_item("buffers_sent", r.buffers_sent)?;
                sd.set_item("bytes_sent", r.bytes_sent)?;
            }
            None => {
                sd.set_item("peer", py.None())?;
            }
        }
        subs.append(sd)?;
    }
    d.set_item("subpartitions", subs)?;
    Ok(d)
}

pub(crate) fn gate_metrics_dict<'py>(py: Python<'py>, m: &GateMetrics) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &m.name)?;
    d.set_item("num_channels", m.num_channels)?;
    d.set_item("ended_channels", m.ended_channels)?;
    d.set_item("in_pool_usage", m.pool.usage())?;
    d.set_item("in_pool", pool_dict(py, &m.pool)?)?;
    d.set_item("queued_batches", m.queued_batches)?;
    d.set_item("stale_barriers", m.stale_barriers)?;
    d.set_item("batches_received", m.batches_received)?;
    d.set_item("buffers_received", m.buffers_received)?;
    d.set_item("bytes_received", m.bytes_received)?;
    d.set_item("rows_received", m.rows_received)?;
    d.set_item("idle_time_ms_per_second", m.idle_ms_per_second)?;
    if let Some(r) = &m.remote {
        d.set_item("remote_channels", r.remote_channels)?;
        d.set_item("exclusive_buffers", r.exclusive_total)?;
        d.set_item("exclusive_in_use", r.exclusive_in_use)?;
        d.set_item("floating_buffers", r.floating_total)?;
        d.set_item("floating_in_use", r.floating_in_use)?;
        d.set_item("credit_outstanding", r.credit_announced)?;
        d.set_item("credit_unannounced", r.credit_unannounced)?;
        d.set_item("queued_buffers", r.queued_buffers)?;
    }
    if let Some(db) = &m.debloat {
        d.set_item("debloat_buffer_size", db.buffer_size)?;
        d.set_item("debloat_desired_buffer_size", db.desired_buffer_size)?;
        d.set_item("debloat_throughput_bytes_per_second", db.throughput)?;
        d.set_item("debloat_buffers", db.buffers)?;
    }
    d.set_item("busy_time_ms_per_second", m.busy_ms_per_second())?;
    d.set_item("idle_seconds_total", m.idle_total.as_secs_f64())?;
    let chans = PyList::empty(py);
    for c in &m.channels {
        let cd = PyDict::new(py);
        cd.set_item("index", c.index)?;
        cd.set_item("address", &c.spec.address)?;
        cd.set_item("partition_id", &c.spec.partition_id)?;
        cd.set_item("subpartition", c.spec.subpartition)?;
        cd.set_item("kind", c.kind.as_str())?;
        cd.set_item("batches_received", c.batches_received)?;
        cd.set_item("buffers_received", c.buffers_received)?;
        cd.set_item("bytes_received", c.bytes_received)?;
        cd.set_item("rows_received", c.rows_received)?;
        if let Some(r) = &c.remote {
            cd.set_item("exclusive_in_use", r.exclusive_in_use)?;
            cd.set_item("floating_in_use", r.floating_in_use)?;
            cd.set_item("credit_outstanding", r.credit_announced)?;
            cd.set_item("credit_unannounced", r.credit_unannounced)?;
            cd.set_item("buffers_required", r.required)?;
            cd.set_item("queued_buffers", r.queued_buffers)?;
        }
        chans.append(cd)?;
    }
    d.set_item("channels", chans)?;
    Ok(d)
}

fn env_metrics_dict<'py>(py: Python<'py>, m: &EnvMetrics) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("address", &m.address)?;
    d.set_item("segment_size", m.segment_size)?;
    d.set_item("segments_total", m.segments_total)?;
    d.set_item("segments_available", m.segments_available)?;
    d.set_item("segments_allocated", m.segments_allocated)?;
    d.set_item("segments_reserved", m.segments_reserved)?;
    let parts = PyDict::new(py);
    for p in &m.partitions {
        parts.set_item(&p.id, partition_metrics_dict(py, p)?)?;
    }
    d.set_item("partitions", parts)?;
    let gates = PyDict::new(py);
    for g in &m.gates {
        gates.set_item(&g.name, gate_metrics_dict(py, g)?)?;
    }
    d.set_item("gates", gates)?;
    Ok(d)
}
