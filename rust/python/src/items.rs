//! What `InputGate.items()` yields: `Batch`, `Event`, `Barrier` and `CheckpointAborted`, made
//! from the core's `GateItem`.

use creditflow_core::gate::GateItem;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::arrow_out::BatchExporter;

/// The Python item for a gate's `item`: a batch becomes a `pyarrow.RecordBatch` inside its
/// `Batch`.
pub(crate) fn to_python(py: Python<'_>, item: GateItem, exporter: &BatchExporter) -> PyResult<Py<PyAny>> {
    Ok(match item {
        GateItem::Batch {
            channel,
            batch,
            token,
            in_flight,
        } => Py::new(
            py,
            Batch {
                channel,
                batch: exporter.export(py, batch, token)?,
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
    })
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
