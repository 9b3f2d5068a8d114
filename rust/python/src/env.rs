//! `NetworkEnvironment`: its settings, partitions, gates and metrics (the native half of
//! `creditflow.NetworkEnvironment`; metrics become dicts in `metrics.rs`).

use std::net::ToSocketAddrs;
use std::sync::Mutex;
use std::time::Duration;

use creditflow_core::base::config::{Backoff, Limits};
use creditflow_core::memory::HeldOutside;
use creditflow_core::serde::Compression;
use creditflow_core::{base::units, EnvConfig, FlowControl};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyString};

use crate::args::{check_pid, count_arg, partition_kind};
use crate::error::IntoPyResult;
use crate::gate::InputGate;
use crate::partition::{Partition, ResultPartition};
use crate::spec::ChannelSpec;
use crate::tls::TlsConfig;

/// Removes the spill directories of this process's environments that are still open
/// (``creditflow.NetworkEnvironment`` registers it with :mod:`atexit`).
#[pyfunction]
pub fn _remove_spill_dirs(py: Python<'_>) {
    py.detach(creditflow_core::partition::spill::dir::remove_all);
}

/// Reads a byte size given as an int or a string with a unit.
pub(crate) fn bytes_arg(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
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

/// A `secret` argument: bytes or str, not empty.
pub(crate) fn secret_arg(secret: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<u8>>> {
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
    Ok(secret)
}

/// Refuses to listen beyond loopback with neither a secret nor mutual TLS, unless `insecure`.
pub(crate) fn check_exposure(
    bind: &str,
    secret: Option<&[u8]>,
    tls: Option<&creditflow_core::base::config::TlsSettings>,
    insecure: bool,
) -> PyResult<()> {
    let mutual_tls = tls.is_some_and(|t| t.client_auth);
    if secret.is_none() && !mutual_tls && !insecure && !is_loopback(bind) {
        return Err(PyValueError::new_err(format!(
            "refusing to bind {bind:?} without a secret or mutual TLS: anyone who can reach it could read \
             your data. Pass secret=... (shared by all peers) or tls=TLSConfig(...), bind a loopback \
             address, or pass insecure=True"
        )));
    }
    Ok(())
}

/// The settings every listening config starts from: the pool (`memory`, `segment_size`) and
/// where and how it listens (`bind`, `secret`, `tls`), refused beyond loopback unprotected
/// unless `insecure`.
pub(crate) fn exposed_config(
    memory: Option<&Bound<'_, PyAny>>,
    segment_size: Option<&Bound<'_, PyAny>>,
    bind: &str,
    secret: Option<&Bound<'_, PyAny>>,
    tls: Option<Bound<'_, TlsConfig>>,
    insecure: bool,
) -> PyResult<EnvConfig> {
    let mut config = EnvConfig::default();
    if let Some(m) = memory {
        config.memory = bytes_arg(m, "memory")?;
    }
    if let Some(s) = segment_size {
        config.segment_size = bytes_arg(s, "segment_size")?;
    }
    config.bind = bind.to_string();
    config.secret = secret_arg(secret)?;
    config.tls = tls.map(|t| t.get().settings.clone());
    check_exposure(bind, config.secret.as_deref(), config.tls.as_ref(), insecure)?;
    Ok(config)
}

/// A duration argument in seconds: finite and not negative.
pub(crate) fn secs(v: f64, name: &str) -> PyResult<Duration> {
    if v.is_finite() && v >= 0.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(PyValueError::new_err(format!(
            "{name} must be a non-negative number of seconds, got {v}"
        )))
    }
}

/// `wire_compression`: None, "lz4" or "zstd".
pub(crate) fn wire_compression_arg(value: Option<&str>) -> PyResult<Option<Compression>> {
    Compression::parse(value).map_err(|_| {
        PyValueError::new_err(format!(
            "wire_compression must be None, \"lz4\" or \"zstd\", got {:?}",
            value.unwrap_or_default()
        ))
    })
}

/// One per process: the buffer pool, partitions, gates, the listener and connections.
///
/// The native half of `creditflow.NetworkEnvironment` (`python/creditflow/env.py`), which
/// subclasses it and starts what is Python's: the log-forwarding thread and `/metrics`
/// servers. Nothing here imports the package.
#[pyclass(module = "creditflow._native", frozen, weakref, subclass)]
pub struct NetworkEnvironment {
    inner: creditflow_core::NetworkEnvironment,
    pid: u32,
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
        debloat = false, debloat_target = 1.0, debloat_min_buffer = 256, spill_dir = None, max_spill = None,
        wire_compression = None, shared_memory = true
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
        spill_dir: Option<std::path::PathBuf>,
        max_spill: Option<&Bound<'_, PyAny>>,
        wire_compression: Option<&str>,
        shared_memory: bool,
    ) -> PyResult<Self> {
        let mut config = exposed_config(memory, segment_size, bind, secret, tls, insecure)?;
        config.flow_control = match flow_control {
            "credit" => FlowControl::Credit,
            "tcp" => FlowControl::Tcp,
            other => {
                return Err(PyValueError::new_err(format!(
                    "flow_control must be \"credit\" or \"tcp\", got {other:?}"
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
        config.peer_timeout = secs(peer_timeout, "peer_timeout")?;
        config.advertise = advertise;
        config.spill_dir = spill_dir;
        if let Some(m) = max_spill {
            config.max_spill = Some(bytes_arg(m, "max_spill")? as u64);
        }
        config.wire_compression = wire_compression_arg(wire_compression)?;
        config.shared_memory = shared_memory;
        let inner = Python::attach(|py| creditflow_core::NetworkEnvironment::new(config).py_err(py))?;
        Ok(NetworkEnvironment {
            inner,
            pid: crate::args::current_pid(),
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

    /// Creates a partition with ``num_subpartitions`` subpartitions of ``kind``
    /// (``"pipelined"``, ``"blocking"`` or ``"hybrid"``).
    #[pyo3(signature = (partition_id, num_subpartitions = 1, *, kind = "pipelined", replay = false, compression = None))]
    fn create_partition(
        &self,
        py: Python<'_>,
        partition_id: &str,
        num_subpartitions: i64,
        kind: &str,
        replay: bool,
        compression: Option<&str>,
    ) -> PyResult<ResultPartition> {
        check_pid(self.pid, "NetworkEnvironment")?;
        let num_subpartitions = count_arg(num_subpartitions, "num_subpartitions")?;
        let (spill, compression) = partition_kind(py, kind, replay, compression)?;
        let inner = match spill {
            None => py.detach(|| self.inner.create_partition(partition_id, num_subpartitions)),
            Some(kind) => py.detach(|| {
                self.inner
                    .create_spillable_partition(partition_id, num_subpartitions, kind, compression)
            }),
        }
        .py_err(py)?;
        Ok(ResultPartition {
            inner: Partition::Local(inner),
            pid: self.pid,
        })
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

    /// Holds ``nbytes`` (an int or a string such as ``"8MiB"``; rounded up to whole segments)
    /// of this environment's memory for data kept outside its pools, such as rows a consumer
    /// has taken but not used yet: the pools' shares shrink by as much, so blocking and
    /// hybrid partitions spill down to fit within ``buffer_timeout``, and the total stays
    /// within ``memory``. Allocates nothing. Raises :class:`InsufficientBuffersError` when
    /// the pools' minimums leave less.
    #[pyo3(signature = (nbytes, what = "reservation"))]
    fn reserve_memory(
        &self,
        py: Python<'_>,
        nbytes: &Bound<'_, PyAny>,
        what: &str,
    ) -> PyResult<MemoryReservation> {
        check_pid(self.pid, "NetworkEnvironment")?;
        let bytes = bytes_arg(nbytes, "nbytes")?;
        let held = py.detach(|| self.inner.reserve_memory(what, bytes)).py_err(py)?;
        let bytes = held.segments() * self.inner.pool().segment_size();
        Ok(MemoryReservation {
            held: Mutex::new(Some(held)),
            bytes,
        })
    }

    /// Metrics of the environment, its partitions and gates (``creditflow.metrics.EnvMetrics``).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Without the GIL: collecting takes every partition's and gate's locks.
        let m = py.detach(|| self.inner.metrics());
        crate::metrics::env(py, &m)
    }

    /// Closes connections and the listener, releases every partition and stops the
    /// background threads. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.close());
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Calls ``self.close()`` (a subclass's, which also stops what it started).
    #[pyo3(signature = (*_args))]
    fn __exit__(slf: &Bound<'_, Self>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        slf.call_method0("close")?;
        Ok(false)
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

/// Memory of a :class:`NetworkEnvironment` held by :meth:`NetworkEnvironment.reserve_memory`
/// until :meth:`release` (or the reservation is dropped).
#[pyclass(module = "creditflow._native", frozen)]
pub struct MemoryReservation {
    held: Mutex<Option<HeldOutside>>,
    bytes: usize,
}

#[pymethods]
impl MemoryReservation {
    /// The bytes held (whole segments), 0 once released.
    #[getter]
    fn nbytes(&self) -> usize {
        if self.held.lock().unwrap().is_some() {
            self.bytes
        } else {
            0
        }
    }

    /// Gives the memory back to the environment's pools. Idempotent.
    fn release(&self, py: Python<'_>) {
        let held = self.held.lock().unwrap().take();
        py.detach(move || drop(held));
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Calls :meth:`release`.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release(py);
        false
    }

    fn __repr__(&self) -> String {
        format!("MemoryReservation(nbytes={})", self.nbytes())
    }
}
