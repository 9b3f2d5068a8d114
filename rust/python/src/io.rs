//! `RecordWriter`, `InputGate`, `ChannelSpec` and the partitioners; Arrow in and out
//! through the Arrow PyCapsule interface (pyo3-arrow).

use std::sync::{Arc, Mutex};

use arrow_array::{RecordBatch, StructArray};
use arrow_schema::Field;
use creditflow_core::base::config::ChannelSpec as CoreSpec;
use creditflow_core::base::wait::Wait;
use creditflow_core::gate::{GateItem, GateMetrics, GateMetricsReader};
use creditflow_core::host::{AttachedGate, AttachedWriter};
use creditflow_core::partition::subpartition::Token;
use creditflow_core::{Error, Partitioner};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};
use pyo3_arrow::input::AnyRecordBatch;

use crate::args::{check_pid, count_arg};
use crate::arrow_in::BatchImporter;
use crate::blocking;
use crate::error::to_py;
use crate::partition::{Partition, ResultPartition};

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
        let subpartition = count_arg(subpartition, "subpartition")?;
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

/// A writer of a partition of this process or of the host service.
enum Writer {
    Local(creditflow_core::RecordWriter),
    Attached(AttachedWriter),
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
                Writer::Attached(py.detach(|| part.writer(kind)).map_err(|e| to_py(py, e))?)
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
        if let Some((schema, array)) = BatchImporter::capsules(data).map_err(not_arrow)? {
            let batch = self
                .import
                .lock()
                .unwrap()
                .batch(&schema, &array)
                .map_err(not_arrow)?;
            let token = token_for(py, data)?;
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
    pid: u32,
}

fn spec_of(s: &CoreSpec) -> ChannelSpec {
    ChannelSpec {
        address: s.address.clone(),
        partition_id: s.partition_id.clone(),
        subpartition: s.subpartition,
    }
}

impl InputGate {
    pub(crate) fn new(gate: creditflow_core::InputGate, pid: u32) -> InputGate {
        let channels = gate.specs().map(spec_of).collect();
        InputGate {
            metrics: GateMetricsSource::Local(gate.metrics_reader()),
            channels,
            inner: Mutex::new(Gate::Local(gate)),
            pid,
        }
    }

    /// A gate the host service holds for this task.
    pub(crate) fn attached(gate: AttachedGate, pid: u32) -> InputGate {
        let channels = gate.specs().map(spec_of).collect();
        let metrics = GateMetricsSource::Attached(Box::new(gate.metrics_handle()));
        InputGate {
            metrics,
            channels,
            inner: Mutex::new(Gate::Attached(gate)),
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
            Some((b, token)) => Ok(Some(to_pyarrow(py, b, token)?)),
        }
    }

    fn next_any(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        check_pid(self.pid, "InputGate")?;
        let timeout = blocking::timeout(timeout)?;
        let item = blocking::run(py, timeout, "waiting for data", |wait| {
            self.inner.lock().unwrap().next_item(wait)
        })?;
        let Some(item) = item else { return Ok(None) };
        let obj = match item {
            GateItem::Batch {
                channel,
                batch,
                token,
                in_flight,
            } => Py::new(
                py,
                Batch {
                    channel,
                    batch: to_pyarrow(py, batch, token)?,
                    in_flight,
                },
            )?
            .into_any(),
            GateItem::Event { channel, payload } => Py::new(
                py,
                Event {
                    channel,
                    payload: PyBytes::new(py, &payload).unbind(),
                },
            )?
            .into_any(),
            GateItem::Barrier {
                checkpoint_id,
                unaligned,
            } => Py::new(
                py,
                Barrier {
                    checkpoint_id,
                    unaligned,
                },
            )?
            .into_any(),
            GateItem::CheckpointAborted { checkpoint_id } => {
                Py::new(py, CheckpointAborted { checkpoint_id })?.into_any()
            }
        };
        Ok(Some(obj))
    }
}

/// A batch from :meth:`InputGate.items`: the channel it came from, the
/// ``pyarrow.RecordBatch``, and ``in_flight``, the ids of the unaligned checkpoints it is
/// in-flight data of (written before their barrier, yielded after it; usually empty).
#[pyclass(module = "creditflow._native", frozen, get_all)]
pub struct Batch {
    channel: usize,
    batch: Py<PyAny>,
    in_flight: Vec<u64>,
}

#[pymethods]
impl Batch {
    #[new]
    #[pyo3(signature = (channel, batch, in_flight = Vec::new()))]
    fn new(channel: usize, batch: Py<PyAny>, in_flight: Vec<u64>) -> Self {
        Batch {
            channel,
            batch,
            in_flight,
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let rows = self
            .batch
            .bind(py)
            .getattr("num_rows")
            .map(|r| r.to_string())
            .unwrap_or_else(|_| "?".into());
        format!(
            "Batch(channel={}, rows={rows}, in_flight={:?})",
            self.channel, self.in_flight
        )
    }
}

/// A user event from :meth:`InputGate.items`: the channel and the bytes the writer sent
/// with :meth:`RecordWriter.broadcast_event` or :meth:`RecordWriter.emit_event`.
#[pyclass(module = "creditflow._native", frozen, get_all)]
pub struct Event {
    channel: usize,
    payload: Py<PyBytes>,
}

#[pymethods]
impl Event {
    #[new]
    fn new(channel: usize, payload: Py<PyBytes>) -> Self {
        Event { channel, payload }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Event(channel={}, payload={})",
            self.channel,
            self.payload
                .bind(py)
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_default()
        )
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<Event>().is_ok_and(|o| {
            let o = o.get();
            o.channel == self.channel && o.payload.bind(py).as_bytes() == self.payload.bind(py).as_bytes()
        })
    }
}

/// Checkpoint barrier ``checkpoint_id`` from :meth:`InputGate.items`. Aligned: every channel
/// delivered it and everything before it was yielded before it. Unaligned: yielded when the
/// first channel delivered it; the batches it overtook follow, marked by ``in_flight``.
#[pyclass(module = "creditflow._native", frozen, get_all, eq)]
#[derive(PartialEq)]
pub struct Barrier {
    checkpoint_id: u64,
    unaligned: bool,
}

#[pymethods]
impl Barrier {
    #[new]
    #[pyo3(signature = (checkpoint_id, unaligned = false))]
    fn new(checkpoint_id: u64, unaligned: bool) -> Self {
        Barrier {
            checkpoint_id,
            unaligned,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Barrier(checkpoint_id={}, unaligned={})",
            self.checkpoint_id,
            if self.unaligned { "True" } else { "False" }
        )
    }
}

/// From :meth:`InputGate.items`: the alignment of checkpoint ``checkpoint_id`` was abandoned
/// because a barrier with a higher id arrived first; its barrier will not be yielded.
#[pyclass(module = "creditflow._native", frozen, get_all, eq)]
#[derive(PartialEq)]
pub struct CheckpointAborted {
    checkpoint_id: u64,
}

#[pymethods]
impl CheckpointAborted {
    #[new]
    fn new(checkpoint_id: u64) -> Self {
        CheckpointAborted { checkpoint_id }
    }

    fn __repr__(&self) -> String {
        format!("CheckpointAborted(checkpoint_id={})", self.checkpoint_id)
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
