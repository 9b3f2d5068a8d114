//! `NetworkEnvironment`: its settings, partitions, gates and metrics (the native half of
//! `creditflow.NetworkEnvironment`; metrics become dicts in `metrics.rs`).

use std::sync::Mutex;

use creditflow_core::memory::HeldOutside;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::{check_pid, count_arg, partition_kind};
use crate::config::{bytes_arg, EnvArgs};
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

/// Parses a byte size such as ``"64MiB"``, ``"32 KiB"`` or ``65536`` into bytes.
#[pyfunction]
pub fn parse_bytes(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    bytes_arg(value, "size")
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
        let config = EnvArgs {
            memory,
            segment_size,
            bind,
            secret,
            flow_control,
            buffer_timeout,
            exclusive_buffers,
            floating_buffers,
            insecure,
            local_handoff,
            request_backoff_initial,
            request_backoff_max,
            advertise,
            handshake_timeout,
            max_connections,
            max_channels_per_connection,
            max_outstanding_requests,
            tls,
            peer_timeout,
            overdraft_buffers,
            debloat,
            debloat_target,
            debloat_min_buffer,
            spill_dir,
            max_spill,
            wire_compression,
            shared_memory,
        }
        .config()?;
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
