//! `HostService` (one per host, user and application: every attached task's partitions,
//! gates and connections) and `Attachment` (a task's session with it, whose partitions and
//! gates are the same `ResultPartition` and `InputGate` classes as an environment's).

use std::sync::{Arc, Mutex};

use creditflow_core::host::{self, HostConfig, ServiceMetrics};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::{check_pid, count_arg, current_pid, partition_kind};
use crate::config::{bytes_arg, secs, EnvArgs};
use crate::error::IntoPyResult;
use crate::gate::InputGate;
use crate::partition::{Partition, ResultPartition};
use crate::spec::ChannelSpec;
use crate::tls::TlsConfig;

fn service_metrics<'py>(py: Python<'py>, m: &ServiceMetrics) -> PyResult<Bound<'py, PyDict>> {
    let ServiceMetrics {
        address,
        segment_size,
        segments_total,
        segments_available,
        segments_reserved,
        sessions,
        partitions,
        gates,
        connections_opened,
        connections_served,
        batches_in_place,
        batches_copied,
        pieces_reclaimed,
    } = m;
    let d = PyDict::new(py);
    d.set_item("address", address)?;
    d.set_item("segment_size", segment_size)?;
    d.set_item("segments_total", segments_total)?;
    d.set_item("segments_available", segments_available)?;
    d.set_item("segments_reserved", segments_reserved)?;
    d.set_item("sessions", sessions)?;
    d.set_item("partitions", partitions)?;
    d.set_item("gates", gates)?;
    d.set_item("connections_opened", connections_opened)?;
    d.set_item("connections_served", connections_served)?;
    d.set_item("batches_in_place", batches_in_place)?;
    d.set_item("batches_copied", batches_copied)?;
    d.set_item("pieces_reclaimed", pieces_reclaimed)?;
    Ok(d)
}

/// The network stack of every task of this host attached to it (one per host, user and
/// application): one pool (``memory`` is the host's), the partitions, the gates and one
/// connection per pair of hosts. Tasks find it by ``name`` (see :func:`attach`).
// `weakref`: a Prometheus collector holds the service weakly, as it does an environment.
#[pyclass(module = "creditflow._native", frozen, weakref)]
pub struct HostService {
    inner: host::HostService,
    pid: u32,
}

#[pymethods]
impl HostService {
    #[new]
    #[pyo3(signature = (
        name, *, idle_timeout = None, memory = None, segment_size = None, bind = "127.0.0.1:0", secret = None,
        flow_control = "credit", buffer_timeout = 0.1, exclusive_buffers = 2, floating_buffers = 8,
        insecure = false, local_handoff = true, request_backoff_initial = 0.1, request_backoff_max = 10.0,
        advertise = None, handshake_timeout = 10.0, max_connections = 512, max_channels_per_connection = 16384,
        max_outstanding_requests = 4096, tls = None, peer_timeout = 30.0, overdraft_buffers = 5,
        debloat = false, debloat_target = 1.0, debloat_min_buffer = 256, spill_dir = None, max_spill = None,
        wire_compression = None, shared_memory = true
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: &str,
        idle_timeout: Option<f64>,
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
        let env = EnvArgs {
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
        let idle_timeout = idle_timeout.map(|t| secs(t, "idle_timeout")).transpose()?;
        let config = HostConfig {
            env,
            name: name.to_string(),
            idle_timeout,
            link_timeout: host::LINK_TIMEOUT,
        };
        let inner = py.detach(|| host::HostService::start(config)).py_err(py)?;
        Ok(HostService {
            inner,
            pid: current_pid(),
        })
    }

    /// The address peers reach it at (``"host:port"``): what tasks put in their channel specs.
    #[getter]
    fn address(&self) -> &str {
        self.inner.address()
    }

    /// The name tasks attach by.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Its pool, the tasks attached, its partitions, gates and connections, and how many
    /// batches reached reading tasks in place or copied
    /// (``creditflow.metrics.ServiceMetrics``).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = py.detach(|| self.inner.metrics());
        service_metrics(py, &m)
    }

    /// Metrics of the service's environment, which holds every attached task's partitions
    /// and gates: the same dict as :meth:`NetworkEnvironment.metrics`
    /// (``creditflow.metrics.EnvMetrics``).
    fn environment_metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Without the GIL: collecting takes every partition's and gate's locks.
        let m = py.detach(|| self.inner.environment().metrics());
        crate::metrics::env(py, &m)
    }

    /// Whether the service has ended (:meth:`close`, its owners gone, idle for
    /// ``idle_timeout``).
    #[getter]
    fn closed(&self) -> bool {
        self.inner.has_ended()
    }

    /// Blocks until the service ends (its owners are gone, it was idle for ``idle_timeout``,
    /// or :meth:`close`) and returns why; ``timeout`` in seconds (:class:`TimeoutError`).
    /// The GIL is released and Ctrl-C interrupts.
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<String> {
        check_pid(self.pid, "HostService")?;
        crate::blocking::run(
            py,
            crate::blocking::timeout(timeout)?,
            "waiting for the host service to end",
            |w| self.inner.wait(w),
        )
    }

    /// Ends the service: attached tasks raise :class:`ConnectionLostError`, partitions are
    /// released, the spill directory removed and the name freed. Idempotent.
    fn close(&self, py: Python<'_>) {
        if current_pid() == self.pid {
            py.detach(|| self.inner.close());
        }
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
        format!(
            "HostService(name={:?}, address={:?})",
            self.inner.name(),
            self.inner.address()
        )
    }
}

/// A task's session with its host's service (made by :func:`attach`): creates partitions and
/// gates that live in the service, with the API of :class:`NetworkEnvironment`'s.
#[pyclass(module = "creditflow._native", frozen)]
pub struct Attachment {
    inner: Mutex<Option<Arc<host::Attachment>>>,
    address: String,
    name: String,
    service_pid: u32,
    writer_heap: usize,
    pid: u32,
}

impl Attachment {
    fn get(&self, py: Python<'_>) -> PyResult<Arc<host::Attachment>> {
        check_pid(self.pid, "Attachment")?;
        let a = self.inner.lock().unwrap().clone();
        a.ok_or_else(|| crate::error::to_py(py, creditflow_core::Error::Closed("attachment")))
    }
}

/// Attaches this process to the host service ``name`` of this user on this host. ``owner``:
/// the pid of the process this task belongs to (a Spark executor), whose end may end the
/// service (0: none). ``memory``: this task's own (bytes or a string such as ``"16MiB"``;
/// None: ``NetworkEnvironment``'s default), as an environment's: each of its writers places
/// batches in a heap of that much, whose pages count in this process once written. Raises
/// :class:`ConnectionLostError` when no service answers.
#[pyfunction]
#[pyo3(signature = (name, *, owner = 0, memory = None))]
pub fn attach(
    py: Python<'_>,
    name: &str,
    owner: u32,
    memory: Option<&Bound<'_, PyAny>>,
) -> PyResult<Attachment> {
    let memory = match memory {
        Some(m) => bytes_arg(m, "memory")?,
        None => creditflow_core::EnvConfig::default().memory,
    };
    let a = py
        .detach(|| host::Attachment::connect(name, owner, memory))
        .py_err(py)?;
    Ok(Attachment {
        address: a.address().to_string(),
        name: a.name().to_string(),
        service_pid: a.service_pid(),
        writer_heap: a.writer_heap(),
        inner: Mutex::new(Some(Arc::new(a))),
        pid: current_pid(),
    })
}

#[pymethods]
impl Attachment {
    /// The service's address: what peers put in their channel specs to read partitions
    /// created here.
    #[getter]
    fn address(&self) -> &str {
        &self.address
    }

    /// The service's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The service's pid.
    #[getter]
    fn service_pid(&self) -> u32 {
        self.service_pid
    }

    /// Bytes of the heap each writer of this task places batches in: its ``memory``, in whole
    /// 64 KiB chunks, from 1 MiB to 1 GiB.
    #[getter]
    fn writer_heap(&self) -> usize {
        self.writer_heap
    }

    /// Whether the attachment was closed or its service is gone.
    #[getter]
    fn closed(&self) -> bool {
        match self.inner.lock().unwrap().as_ref() {
            None => true,
            Some(a) => a.ended().is_some(),
        }
    }

    /// Creates a partition the service holds, as :meth:`NetworkEnvironment.create_partition`.
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
        let a = self.get(py)?;
        let n = count_arg(num_subpartitions, "num_subpartitions")?;
        if n == 0 {
            return Err(PyValueError::new_err("num_subpartitions must be at least 1"));
        }
        let (spill, compression) = partition_kind(py, kind, replay, compression)?;
        let p = py
            .detach(|| a.create_partition(partition_id, n, spill, compression))
            .py_err(py)?;
        Ok(ResultPartition {
            inner: Partition::Attached(Arc::new(p)),
            pid: self.pid,
        })
    }

    /// Creates a gate in the service reading the given channels, as
    /// :meth:`NetworkEnvironment.create_input_gate`.
    fn create_input_gate(&self, py: Python<'_>, channels: &Bound<'_, PyAny>) -> PyResult<InputGate> {
        let a = self.get(py)?;
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
        let gate = py.detach(|| a.create_input_gate(specs)).py_err(py)?;
        Ok(InputGate::attached(gate, self.pid))
    }

    /// The service's metrics (``creditflow.metrics.ServiceMetrics``).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let a = self.get(py)?;
        let m = py.detach(|| a.service_metrics()).py_err(py)?;
        service_metrics(py, &m)
    }

    /// Lets go of the session (it ends once the partitions, writers and gates made through
    /// it are gone too). Idempotent.
    fn close(&self) {
        self.inner.lock().unwrap().take();
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Attachment(name={:?}, address={:?}, service_pid={})",
            self.name, self.address, self.service_pid
        )
    }
}
