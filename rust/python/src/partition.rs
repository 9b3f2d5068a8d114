//! `ResultPartition`: one of this process's environment, or one a host service holds for this
//! task (made through an `Attachment`).

use std::sync::Arc;

use creditflow_core::base::wait::Wait;
use creditflow_core::host::AttachedPartition;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::check_pid;
use crate::error::IntoPyResult;

/// Where a partition lives.
#[derive(Clone)]
pub(crate) enum Partition {
    /// In this process's environment.
    Local(Arc<creditflow_core::ResultPartition>),
    /// In the host service this task is attached to.
    Attached(Arc<AttachedPartition>),
}

/// A partition: N subpartitions filled by a :class:`RecordWriter`.
#[pyclass(module = "creditflow._native", frozen)]
pub struct ResultPartition {
    pub(crate) inner: Partition,
    pub(crate) pid: u32,
}

#[pymethods]
impl ResultPartition {
    /// The partition id.
    #[getter]
    fn id(&self) -> &str {
        match &self.inner {
            Partition::Local(p) => p.id(),
            Partition::Attached(p) => p.id(),
        }
    }

    /// Number of subpartitions.
    #[getter]
    fn num_subpartitions(&self) -> usize {
        match &self.inner {
            Partition::Local(p) => p.num_subpartitions(),
            Partition::Attached(p) => p.num_subpartitions(),
        }
    }

    /// Schema of the first batch written (``pyarrow.Schema``), or None.
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let schema = match &self.inner {
            Partition::Local(p) => p.schema(),
            Partition::Attached(p) => p.schema(),
        };
        match schema {
            None => Ok(None),
            Some(s) => Ok(Some(pyo3_arrow::PySchema::new(s).into_pyarrow(py)?)),
        }
    }

    /// Whether end-of-partition was sent.
    #[getter]
    fn finished(&self, py: Python<'_>) -> PyResult<bool> {
        match &self.inner {
            Partition::Local(p) => Ok(p.is_finished()),
            Partition::Attached(p) => py.detach(|| p.is_finished()).py_err(py),
        }
    }

    /// Whether the partition was released (all readers done, or released explicitly).
    #[getter]
    fn released(&self, py: Python<'_>) -> PyResult<bool> {
        match &self.inner {
            Partition::Local(p) => Ok(p.is_released()),
            Partition::Attached(p) => py.detach(|| p.is_released()).py_err(py),
        }
    }

    /// Makes partly filled buffers readable now.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        check_pid(self.pid, "ResultPartition")?;
        match &self.inner {
            Partition::Local(p) => {
                p.flush();
                Ok(())
            }
            Partition::Attached(p) => py.detach(|| p.flush()).py_err(py),
        }
    }

    /// Drops queued data, returns the memory and unregisters the partition.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        match &self.inner {
            Partition::Local(p) => {
                py.detach(|| p.release());
                Ok(())
            }
            Partition::Attached(p) => {
                if crate::args::current_pid() != self.pid {
                    return Ok(()); // the parent's session: not ours to use
                }
                py.detach(|| p.release()).py_err(py)
            }
        }
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
            move |w: &mut Wait<'_>| match &inner {
                Partition::Local(p) => p.wait_consumed(w),
                Partition::Attached(p) => p.wait_consumed(w),
            },
        )
    }

    /// This partition's metrics (``creditflow.metrics.PartitionMetrics``).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Without the GIL: collecting takes the partition's locks, which a writer may hold
        // while it waits for the GIL (a Ctrl-C check).
        let m = match &self.inner {
            Partition::Local(p) => py.detach(|| p.metrics()),
            Partition::Attached(p) => py.detach(|| p.metrics()).py_err(py)?,
        };
        crate::metrics::partition(py, &m)
    }

    fn __repr__(&self) -> String {
        format!(
            "ResultPartition(id={:?}, num_subpartitions={}{})",
            self.id(),
            self.num_subpartitions(),
            if matches!(self.inner, Partition::Attached(_)) {
                ", in the host service"
            } else {
                ""
            }
        )
    }
}
