//! `ResultPartition`.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::check_pid;

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
    /// out, and :class:`ConnectionLostError` when a reader went away before it had read
    /// everything. The GIL is released and Ctrl-C interrupts.
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

    /// This partition's metrics (``creditflow.metrics.PartitionMetrics``).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Without the GIL: collecting takes the partition's locks, which a writer may hold
        // while it waits for the GIL (a Ctrl-C check).
        let m = py.detach(|| self.inner.metrics());
        crate::metrics::partition(py, &m)
    }

    fn __repr__(&self) -> String {
        format!(
            "ResultPartition(id={:?}, num_subpartitions={})",
            self.inner.id(),
            self.inner.num_subpartitions()
        )
    }
}
