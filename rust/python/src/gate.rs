//! `InputGate`: batches, events and barriers from channels, read from this process's
//! environment or through the host service; `GateItems` iterates its items.

use std::sync::Mutex;

use creditflow_core::base::wait::Wait;
use creditflow_core::gate::{GateItem, GateMetrics, GateMetricsReader};
use creditflow_core::host::AttachedGate;
use creditflow_core::Error;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::args::check_pid;
use crate::arrow_out::BatchExporter;
use crate::blocking;
use crate::error::to_py;
use crate::items;
use crate::spec::ChannelSpec;

/// A gate of this process's environment or of the host service.
// One per gate, made once and never moved: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Gate {
    Local(creditflow_core::InputGate),
    Attached(AttachedGate),
}

impl Gate {
    fn next_item(&mut self, wait: &mut Wait<'_>) -> Result<Option<GateItem>, Error> {
        match self {
            Gate::Local(g) => g.next_item(wait),
            Gate::Attached(g) => g.next_item(wait),
        }
    }

    fn close(&mut self) {
        match self {
            Gate::Local(g) => g.close(),
            Gate::Attached(g) => g.close(),
        }
    }
}

/// An attached gate's metrics request: asks the host service, needs no lock of the gate.
type AskMetrics = Box<dyn Fn() -> Result<GateMetrics, Error> + Send + Sync>;

/// Where a gate's metrics come from, without the gate (a reader may be blocked in `next`).
enum GateMetricsSource {
    /// Read in place.
    Local(GateMetricsReader),
    /// Asked of the host service (the gate lives there).
    Attached(AskMetrics),
}

/// Reads batches from channels; iterate it, or call :meth:`next`.
#[pyclass(module = "creditflow._native", frozen)]
pub struct InputGate {
    /// Locked only with the GIL released (inside `blocking::run` or `detach`): a reader
    /// blocked in `next` takes the GIL every 50 ms to check for Ctrl-C.
    inner: Mutex<Gate>,
    /// Read without `inner`, so `metrics()` and the getters never wait for `next`.
    metrics: GateMetricsSource,
    channels: Vec<ChannelSpec>,
    /// Its batches out to pyarrow.
    exporter: BatchExporter,
    pid: u32,
}

impl InputGate {
    pub(crate) fn new(gate: creditflow_core::InputGate, pid: u32) -> InputGate {
        let channels = gate.specs().map(ChannelSpec::from_core).collect();
        InputGate {
            metrics: GateMetricsSource::Local(gate.metrics_reader()),
            channels,
            inner: Mutex::new(Gate::Local(gate)),
            exporter: BatchExporter::default(),
            pid,
        }
    }

    /// A gate the host service holds for this task.
    pub(crate) fn attached(gate: AttachedGate, pid: u32) -> InputGate {
        let channels = gate.specs().map(ChannelSpec::from_core).collect();
        let metrics = GateMetricsSource::Attached(Box::new(gate.metrics_handle()));
        InputGate {
            metrics,
            channels,
            inner: Mutex::new(Gate::Attached(gate)),
            exporter: BatchExporter::default(),
            pid,
        }
    }

    fn next_batch(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        check_pid(self.pid, "InputGate")?;
        let timeout = blocking::timeout(timeout)?;
        let item = blocking::run(py, timeout, "waiting for data", |wait| {
            let mut gate = self.inner.lock().unwrap();
            loop {
                match gate.next_item(wait)? {
                    None => return Ok(None),
                    Some(GateItem::Batch { batch, token, .. }) => return Ok(Some((batch, token))),
                    Some(_) => {}
                }
            }
        })?;
        match item {
            None => Ok(None),
            Some((b, token)) => Ok(Some(self.exporter.export(py, b, token)?)),
        }
    }

    fn next_any(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        check_pid(self.pid, "InputGate")?;
        let timeout = blocking::timeout(timeout)?;
        let item = blocking::run(py, timeout, "waiting for data", |wait| {
            self.inner.lock().unwrap().next_item(wait)
        })?;
        item.map(|item| items::to_python(py, item, &self.exporter))
            .transpose()
    }
}

#[pymethods]
impl InputGate {
    /// The next ``pyarrow.RecordBatch``; None once every channel has ended.
    #[pyo3(signature = (timeout = None))]
    fn next(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        self.next_batch(py, timeout)
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.next_batch(py, None)
    }

    /// The next :class:`Batch`, :class:`Event`, :class:`Barrier` or
    /// :class:`CheckpointAborted`; None once every channel has ended.
    #[pyo3(signature = (timeout = None))]
    fn next_item(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        self.next_any(py, timeout)
    }

    /// An iterator of :class:`Batch`, :class:`Event`, :class:`Barrier` and
    /// :class:`CheckpointAborted` items, each channel's in the order written (the plain
    /// iterator yields only the batches).
    #[pyo3(signature = (timeout = None))]
    fn items(slf: Bound<'_, Self>, timeout: Option<f64>) -> PyResult<GateItems> {
        blocking::timeout(timeout)?;
        Ok(GateItems {
            gate: slf.unbind(),
            timeout,
        })
    }

    /// Number of channels.
    #[getter]
    fn num_channels(&self) -> usize {
        self.channels.len()
    }

    /// The channels, in order.
    #[getter]
    fn channels(&self) -> Vec<ChannelSpec> {
        self.channels.clone()
    }

    /// Releases the channels (producers stop being backpressured by this gate).
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.lock().unwrap().close());
    }

    /// This gate's metrics (``creditflow.metrics.GateMetrics``).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = match &self.metrics {
            GateMetricsSource::Local(r) => r.read(),
            GateMetricsSource::Attached(ask) => py.detach(ask).map_err(|e| to_py(py, e))?,
        };
        crate::metrics::gate(py, &m)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }
}

/// Iterates an :class:`InputGate`'s batches, events and barriers (see :meth:`InputGate.items`).
#[pyclass(module = "creditflow._native", frozen)]
pub struct GateItems {
    gate: Py<InputGate>,
    timeout: Option<f64>,
}

#[pymethods]
impl GateItems {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.gate.get().next_any(py, self.timeout)
    }
}
