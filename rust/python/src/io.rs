//! `RecordWriter`, `InputGate`, `ChannelSpec` and the partitioners; Arrow in and out
//! through the Arrow PyCapsule interface (pyo3-arrow).

use std::sync::{Arc, Mutex};

use arrow_array::{RecordBatch, StructArray};
use arrow_schema::Field;
use creditflow_core::gate::{ChannelSpec as CoreSpec, GateItem, GateMetricsReader};
use creditflow_core::partition::subpartition::Token;
use creditflow_core::Partitioner;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple};
use pyo3_arrow::input::AnyRecordBatch;

use crate::blocking;
use crate::env::{check_pid, gate_metrics_dict, partition_metrics_dict, ResultPartition};
use crate::error::to_py;

/// Sends row r to subpartition ``pmod(hash(keys...), n)`` with Spark SQL's Murmur3 ``hash``,
/// so rows land where ``df.repartition(n, *keys)`` puts them.
#[pyclass(module = "creditflow._native", frozen)]
pub struct HashPartitioner {
    keys: Vec<String>,
}

#[pymethods]
impl HashPartitioner {
    #[new]
    fn new(keys: &Bound<'_, PyAny>) -> PyResult<Self> {
        let keys: Vec<String> = if let Ok(s) = keys.cast::<PyString>() {
            vec![s.to_str()?.to_string()]
        } else {
            keys.extract()
                .map_err(|_| PyTypeError::new_err("keys must be a column name or a list of column names"))?
        };
        if keys.is_empty() {
            return Err(PyValueError::new_err(
                "HashPartitioner needs at least one key column",
            ));
        }
        Ok(HashPartitioner { keys })
    }

    /// The key columns.
    #[getter]
    fn keys(&self) -> Vec<String> {
        self.keys.clone()
    }

    /// Checks that batches of ``schema`` can be hashed by these keys: every key column
    /// exists at the top level and has a type Spark's ``hash`` takes. Raises
    /// ``InvalidArgumentError`` naming the column and the supported types otherwise. A
    /// writer runs the same check on its first batch; this runs it before any data moves.
    fn check_schema(&self, py: Python<'_>, schema: pyo3_arrow::PySchema) -> PyResult<()> {
        Partitioner::Hash(self.keys.clone())
            .check_schema(schema.as_ref())
            .map_err(|e| to_py(py, e))
    }

    fn __repr__(&self) -> String {
        format!("HashPartitioner({:?})", self.keys)
    }
}

/// Sends whole batches to the subpartitions in turn.
#[pyclass(module = "creditflow._native", frozen)]
pub struct RoundRobinPartitioner;

#[pymethods]
impl RoundRobinPartitioner {
    #[new]
    fn new() -> Self {
        RoundRobinPartitioner
    }

    fn __repr__(&self) -> &'static str {
        "RoundRobinPartitioner()"
    }
}

/// Sends every batch to every subpartition (the data is shared, not copied).
#[pyclass(module = "creditflow._native", frozen)]
pub struct BroadcastPartitioner;

#[pymethods]
impl BroadcastPartitioner {
    #[new]
    fn new() -> Self {
        BroadcastPartitioner
    }

    fn __repr__(&self) -> &'static str {
        "BroadcastPartitioner()"
    }
}

/// Sends every batch to subpartition 0 (one-to-one; use with one subpartition).
#[pyclass(module = "creditflow._native", frozen)]
pub struct ForwardPartitioner;

#[pymethods]
impl ForwardPartitioner {
    #[new]
    fn new() -> Self {
        ForwardPartitioner
    }

    fn __repr__(&self) -> &'static str {
        "ForwardPartitioner()"
    }
}

fn partitioner_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Partitioner> {
    let Some(obj) = obj else {
        return Ok(Partitioner::RoundRobin);
    };
    if let Ok(h) = obj.cast::<HashPartitioner>() {
        return Ok(Partitioner::Hash(h.get().keys.clone()));
    }
    if obj.is_instance_of::<RoundRobinPartitioner>() {
        return Ok(Partitioner::RoundRobin);
    }
    if obj.is_instance_of::<BroadcastPartitioner>() {
        return Ok(Partitioner::Broadcast);
    }
    if obj.is_instance_of::<ForwardPartitioner>() {
        return Ok(Partitioner::Forward);
    }
    Err(PyTypeError::new_err(
        "partitioner must be HashPartitioner(keys), RoundRobinPartitioner(), BroadcastPartitioner() or ForwardPartitioner()",
    ))
}

/// Where a channel reads from: a subpartition of a partition in some environment.
#[pyclass(module = "creditflow._native", frozen, eq, hash, get_all)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ChannelSpec {
    /// Address of the environment owning the partition (its ``env.address``).
    address: String,
    /// The partition id.
    partition_id: String,
    /// The subpartition index.
    subpartition: usize,
}

impl ChannelSpec {
    pub(crate) fn to_core(&self) -> CoreSpec {
        CoreSpec {
            address: self.address.clone(),
            partition_id: self.partition_id.clone(),
            subpartition: self.subpartition,
        }
    }
}

#[pymethods]
impl ChannelSpec {
    #[new]
    fn new(address: String, partition_id: String, subpartition: i64) -> PyResult<Self> {
        let subpartition = crate::env::count_arg(subpartition, "subpartition")?;
        Ok(ChannelSpec {
            address,
            partition_id,
            subpartition,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "ChannelSpec({:?}, {:?}, {})",
            self.address, self.partition_id, self.subpartition
        )
    }
}

/// `pyarrow.RecordBatch` and its `_import_from_c_capsule`, looked up once.
static PA_RECORD_BATCH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static PA_IMPORT_BATCH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The original Python batch object, carried with a batch handed over in-process.
struct PyToken(Py<PyAny>);

/// A token for `data` if it is exactly a `pyarrow.RecordBatch` (what a gate returns).
fn token_for(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Option<Token>> {
    let cls = PA_RECORD_BATCH.import(py, "pyarrow", "RecordBatch")?;
    if data.get_type().is(cls) {
        Ok(Some(Arc::new(PyToken(data.clone().unbind()))))
    } else {
        Ok(None)
    }
}

/// Converts a batch to `pyarrow.RecordBatch` through the Arrow C data interface.
fn to_pyarrow(py: Python<'_>, batch: RecordBatch, token: Option<Token>) -> PyResult<Py<PyAny>> {
    if let Some(t) = token.as_ref().and_then(|t| t.downcast_ref::<PyToken>()) {
        return Ok(t.0.clone_ref(py));
    }
    let schema = batch.schema();
    let field =
        Field::new_struct("", schema.fields().clone(), false).with_metadata(schema.metadata().clone());
    let array = StructArray::from(batch);
    let capsules = pyo3_arrow::ffi::to_array_pycapsules(py, field.into(), &array, None)?;
    let import = PA_IMPORT_BATCH.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(PA_RECORD_BATCH
            .import(py, "pyarrow", "RecordBatch")?
            .getattr("_import_from_c_capsule")?
            .unbind())
    })?;
    Ok(import.bind(py).call1(capsules)?.unbind())
}

/// Writes Arrow data into a partition through a partitioner.
#[pyclass(module = "creditflow._native", frozen)]
pub struct RecordWriter {
    inner: Mutex<creditflow_core::RecordWriter>,
    partition: Arc<creditflow_core::ResultPartition>,
    pid: u32,
    timeout: Option<f64>,
}

#[pymethods]
impl RecordWriter {
    #[new]
    #[pyo3(signature = (partition, partitioner = None, *, timeout = None))]
    fn new(
        partition: &Bound<'_, ResultPartition>,
        partitioner: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Self> {
        blocking::timeout(timeout)?;
        let p = partition.get();
        let kind = partitioner_arg(partitioner)?;
        Ok(RecordWriter {
            inner: Mutex::new(creditflow_core::RecordWriter::new(p.inner.clone(), kind)),
            partition: p.inner.clone(),
            pid: p.pid,
            timeout,
        })
    }

    /// Writes a batch, table or stream. Blocks while the partition has no free buffer.
    #[pyo3(signature = (data, timeout = None))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        check_pid(self.pid, "RecordWriter")?;
        let timeout = blocking::timeout(timeout.or(self.timeout))?;
        let input: AnyRecordBatch = data.extract().map_err(|e| {
            PyTypeError::new_err(format!(
                "write() takes Arrow data (an object with __arrow_c_array__ or __arrow_c_stream__: a pyarrow \
                 RecordBatch, Table or RecordBatchReader, a polars DataFrame, a duckdb relation...), got {}: {e}",
                data.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        })?;
        match input {
            AnyRecordBatch::RecordBatch(b) => {
                let batch = b.into_inner();
                let token = token_for(py, data)?;
                blocking::run(py, timeout, "waiting for a free buffer", |wait| {
                    self.inner.lock().unwrap().write_with_token(&batch, token, wait)
                })
            }
            AnyRecordBatch::Stream(s) => {
                let reader = s.into_reader()?;
                blocking::run(py, timeout, "waiting for a free buffer", |wait| {
                    let mut w = self.inner.lock().unwrap();
                    for batch in reader {
                        w.write(&batch?, wait)?;
                    }
                    Ok(())
                })
            }
        }
    }

    /// Makes partly filled buffers readable now.
    fn flush(&self) -> PyResult<()> {
        check_pid(self.pid, "RecordWriter")?;
        self.partition.flush();
        Ok(())
    }

    /// Sends end-of-partition to every subpartition. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.lock().unwrap().close())
            .map_err(|e| to_py(py, e))
    }

    /// Ends the partition with an error: readers raise ``ProducerFailedError(message)``
    /// after the data written before, instead of seeing a normal end.
    fn fail(&self, message: &str) {
        self.partition.fail(message);
    }

    /// The partition's metrics, as a dict.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        partition_metrics_dict(py, &self.partition.metrics())
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
                self.fail(&format!("the writer raised: {msg}"));
            }
            _ => self.close(py)?,
        }
        Ok(false)
    }
}

/// Reads batches from channels; iterate it, or call :meth:`next`.
#[pyclass(module = "creditflow._native", frozen)]
pub struct InputGate {
    /// Locked only with the GIL released (inside `blocking::run` or `detach`): a reader
    /// blocked in `next` takes the GIL every 50 ms to check for Ctrl-C.
    inner: Mutex<creditflow_core::InputGate>,
    /// Read without `inner`, so `metrics()` and the getters never wait for `next`.
    metrics: GateMetricsReader,
    channels: Vec<ChannelSpec>,
    pid: u32,
}

impl InputGate {
    pub(crate) fn new(gate: creditflow_core::InputGate, pid: u32) -> InputGate {
        let channels = gate
            .specs()
            .map(|s| ChannelSpec {
                address: s.address.clone(),
                partition_id: s.partition_id.clone(),
                subpartition: s.subpartition,
            })
            .collect();
        InputGate {
            metrics: gate.metrics_reader(),
            channels,
            inner: Mutex::new(gate),
            pid,
        }
    }

    fn next_batch(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        check_pid(self.pid, "InputGate")?;
        let timeout = blocking::timeout(timeout)?;
        let item = blocking::run(py, timeout, "waiting for data", |wait| {
            self.inner.lock().unwrap().next_item(wait)
        })?;
        match item {
            None => Ok(None),
            Some(GateItem::Batch(_, b, token)) => Ok(Some(to_pyarrow(py, b, token)?)),
        }
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

    /// This gate's metrics, as a dict.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        gate_metrics_dict(py, &self.metrics.read())
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
