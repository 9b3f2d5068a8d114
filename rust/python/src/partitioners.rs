//! The partitioners a `RecordWriter` takes: `HashPartitioner` (Spark's Murmur3 on key columns),
//! `RoundRobinPartitioner`, `BroadcastPartitioner`, `ForwardPartitioner`, and the argument that
//! turns one of them into the core's `Partitioner`.

use creditflow_core::Partitioner;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;

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

/// The core's partitioner for a writer's ``partitioner`` argument (None: round robin).
pub(crate) fn partitioner_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Partitioner> {
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
