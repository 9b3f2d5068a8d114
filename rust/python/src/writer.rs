//! `RecordWriter`: Arrow data into a partition of this process or of the host service.

use std::sync::Mutex;

use arrow_array::RecordBatch;
use creditflow_core::base::wait::Wait;
use creditflow_core::host::AttachedWriter;
use creditflow_core::partition::subpartition::Token;
use creditflow_core::Error;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3_arrow::input::AnyRecordBatch;

use crate::args::{check_pid, count_arg};
use crate::arrow_in::BatchImporter;
use crate::arrow_out::{is_pyarrow_batch, token_for};
use crate::blocking;
use crate::error::to_py;
use crate::partition::{Partition, ResultPartition};
use crate::partitioners::partitioner_arg;

/// A writer of a partition of this process or of the host service.
enum Writer {
    Local(creditflow_core::RecordWriter),
    Attached(Box<AttachedWriter>),
}

impl Writer {
    /// Writes `batch` through the partitioner, or whole to subpartition `target`.
    fn write(
        &mut self,
        batch: &RecordBatch,
        token: Option<Token>,
        target: Option<usize>,
        wait: &mut Wait<'_>,
    ) -> Result<(), Error> {
        match (self, target) {
            (Writer::Local(w), None) => w.write_with_token(batch, token, wait),
            (Writer::Local(w), Some(sp)) => w.write_to(batch, token, sp, wait),
            (Writer::Attached(w), None) => w.write(batch, wait),
            (Writer::Attached(w), Some(sp)) => w.write_to(batch, sp, wait),
        }
    }

    fn flush(&mut self) -> Result<(), Error> {
        match self {
            Writer::Local(w) => {
                w.flush();
                Ok(())
            }
            Writer::Attached(w) => w.flush(&mut Wait::timeout(
                Some(CONTROL_WAIT),
                "waiting for a free buffer",
            )),
        }
    }

    fn event(&mut self, payload: &[u8], target: Option<usize>) -> Result<(), Error> {
        match (self, target) {
            (Writer::Local(w), None) => w.broadcast_event(payload),
            (Writer::Local(w), Some(t)) => w.emit_event(payload, t),
            (Writer::Attached(w), t) => w.send_event(
                t,
                payload,
                &mut Wait::timeout(Some(CONTROL_WAIT), "waiting for a free buffer"),
            ),
        }
    }

    fn barrier(&mut self, checkpoint_id: u64, unaligned: bool) -> Result<Vec<usize>, Error> {
        match self {
            Writer::Local(w) => w.broadcast_barrier(checkpoint_id, unaligned),
            Writer::Attached(w) => w.broadcast_barrier(
                checkpoint_id,
                unaligned,
                &mut Wait::timeout(Some(CONTROL_WAIT), "waiting for a free buffer"),
            ),
        }
    }

    fn close(&mut self) -> Result<(), Error> {
        match self {
            Writer::Local(w) => w.close(),
            Writer::Attached(w) => w.close(&mut Wait::timeout(
                Some(CONTROL_WAIT),
                "waiting for a free buffer",
            )),
        }
    }

    fn fail(&mut self, partition: &Partition, message: &str) {
        match (self, partition) {
            (Writer::Attached(w), _) => {
                // Best effort: a writer whose service is gone has failed its readers already.
                let _ = w.fail(
                    message,
                    &mut Wait::timeout(Some(CONTROL_WAIT), "waiting for a free buffer"),
                );
            }
            (Writer::Local(_), Partition::Local(p)) => p.fail(message),
            (Writer::Local(_), Partition::Attached(_)) => {
                unreachable!("a local writer of an attached partition")
            }
        }
    }
}

/// How long a writer's call other than `write` waits for the host service (a flush, an event,
/// a barrier, the close): bounded, since its link has room once the service takes what is
/// queued.
const CONTROL_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Writes Arrow data into a partition through a partitioner.
#[pyclass(module = "creditflow._native", frozen)]
pub struct RecordWriter {
    inner: Mutex<Writer>,
    /// Imports the batches written, their schema once (taken with the GIL held).
    import: Mutex<BatchImporter>,
    partition: Partition,
    pid: u32,
    timeout: Option<f64>,
}

#[pymethods]
impl RecordWriter {
    #[new]
    #[pyo3(signature = (partition, partitioner = None, *, timeout = None))]
    fn new(
        py: Python<'_>,
        partition: &Bound<'_, ResultPartition>,
        partitioner: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Self> {
        blocking::timeout(timeout)?;
        let p = partition.get();
        let kind = partitioner_arg(partitioner)?;
        let inner = match &p.inner {
            Partition::Local(part) => Writer::Local(creditflow_core::RecordWriter::new(part.clone(), kind)),
            Partition::Attached(part) => {
                check_pid(p.pid, "ResultPartition")?;
                Writer::Attached(Box::new(
                    py.detach(|| part.writer(kind)).map_err(|e| to_py(py, e))?,
                ))
            }
        };
        Ok(RecordWriter {
            inner: Mutex::new(inner),
            import: Mutex::new(BatchImporter::new()),
            partition: p.inner.clone(),
            pid: p.pid,
            timeout,
        })
    }

    /// Writes a batch, table or stream. Blocks while the partition has no free buffer. With
    /// ``subpartition``, every batch goes whole to that subpartition (the partitioner is not
    /// asked).
    #[pyo3(signature = (data, timeout = None, *, subpartition = None))]
    fn write(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        subpartition: Option<i64>,
    ) -> PyResult<()> {
        check_pid(self.pid, "RecordWriter")?;
        let target = subpartition.map(|s| count_arg(s, "subpartition")).transpose()?;
        let timeout = blocking::timeout(timeout.or(self.timeout))?;
        let not_arrow = |e: PyErr| {
            PyTypeError::new_err(format!(
                "write() takes Arrow data (an object with __arrow_c_array__ or __arrow_c_stream__: a pyarrow \
                 RecordBatch, Table or RecordBatchReader, a polars DataFrame, a duckdb relation...), got {}: {e}",
                data.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        };
        let pyarrow = is_pyarrow_batch(data)?;
        if let Some(batch) = BatchImporter::import(&self.import, data, pyarrow).map_err(not_arrow)? {
            let token = pyarrow.then(|| token_for(data));
            return blocking::run(py, timeout, "waiting for a free buffer", |wait| {
                self.inner.lock().unwrap().write(&batch, token, target, wait)
            });
        }
        let reader = match data.extract::<AnyRecordBatch>().map_err(not_arrow)? {
            AnyRecordBatch::Stream(s) => s.into_reader()?,
            AnyRecordBatch::RecordBatch(b) => {
                // Not reached: an object with __arrow_c_array__ was taken above.
                let batch = b.into_inner();
                return blocking::run(py, timeout, "waiting for a free buffer", |wait| {
                    self.inner.lock().unwrap().write(&batch, None, target, wait)
                });
            }
        };
        blocking::run(py, timeout, "waiting for a free buffer", |wait| {
            let mut w = self.inner.lock().unwrap();
            for batch in reader {
                w.write(&batch?, None, target, wait)?;
            }
            Ok(())
        })
    }

    /// Makes partly filled buffers readable now.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        check_pid(self.pid, "RecordWriter")?;
        py.detach(|| self.inner.lock().unwrap().flush())
            .map_err(|e| to_py(py, e))
    }

    /// Sends a user event (bytes, at most 16 KiB) to every subpartition, in order with the
    /// batches written before and after it. Needs no buffer and no credit.
    fn broadcast_event(&self, py: Python<'_>, payload: &[u8]) -> PyResult<()> {
        check_pid(self.pid, "RecordWriter")?;
        py.detach(|| self.inner.lock().unwrap().event(payload, None))
            .map_err(|e| to_py(py, e))
    }

    /// Sends a user event (bytes, at most 16 KiB) to one subpartition.
    fn emit_event(&self, py: Python<'_>, payload: &[u8], subpartition: usize) -> PyResult<()> {
        check_pid(self.pid, "RecordWriter")?;
        py.detach(|| self.inner.lock().unwrap().event(payload, Some(subpartition)))
            .map_err(|e| to_py(py, e))
    }

    /// Sends checkpoint barrier ``checkpoint_id`` (ids must increase) to every subpartition.
    /// Aligned by default; ``unaligned=True`` overtakes the data queued ahead of it. Returns,
    /// per subpartition, the queued entries an unaligned barrier overtook (``[]`` if aligned).
    #[pyo3(signature = (checkpoint_id, *, unaligned = false))]
    fn broadcast_barrier(&self, py: Python<'_>, checkpoint_id: u64, unaligned: bool) -> PyResult<Vec<usize>> {
        check_pid(self.pid, "RecordWriter")?;
        py.detach(|| self.inner.lock().unwrap().barrier(checkpoint_id, unaligned))
            .map_err(|e| to_py(py, e))
    }

    /// Sends end-of-partition to every subpartition. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.lock().unwrap().close())
            .map_err(|e| to_py(py, e))
    }

    /// Ends the partition with an error: readers raise ``ProducerFailedError(message)``
    /// after the data written before, instead of seeing a normal end.
    fn fail(&self, py: Python<'_>, message: &str) {
        py.detach(|| self.inner.lock().unwrap().fail(&self.partition, message));
    }

    /// The partition's metrics (``creditflow.metrics.PartitionMetrics``).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Without the GIL: collecting takes the partition's locks.
        let m = match &self.partition {
            Partition::Local(p) => py.detach(|| p.metrics()),
            Partition::Attached(p) => py.detach(|| p.metrics()).map_err(|e| to_py(py, e))?,
        };
        crate::metrics::partition(py, &m)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Closes normally; after an exception, fails the partition so readers do not mistake
    /// a partial stream for a complete one.
    #[pyo3(signature = (exc_type = None, exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        match (exc_type, exc) {
            (Some(t), e) if !t.is_none() => {
                let msg = e.map(|e| e.to_string()).unwrap_or_else(|| t.to_string());
                self.fail(py, &format!("the writer raised: {msg}"));
            }
            _ => self.close(py)?,
        }
        Ok(false)
    }
}
