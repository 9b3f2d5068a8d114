//! Metrics snapshots → plain dicts with the Rust structs' own field names and nesting (typed
//! as `TypedDict`s in `creditflow/metrics.py`).
//!
//! Each struct is destructured exhaustively and every key is written by [`put!`] from the
//! field's own identifier, so a key cannot be renamed on the way and a new field does not
//! compile until it is converted here. On top of the fields, a few values the core computes
//! by a method are added under the method's name (`PoolStats::usage`,
//! `PartitionMetrics::{out_pool_usage, level, busy_ms_per_second}`,
//! `GateMetrics::busy_ms_per_second`). Conversions: `Duration` → seconds (float), a pool's
//! unbounded `max` (`usize::MAX`) → `None`, enums → their `as_str` names, `Option` → the dict
//! or `None`; the environment's partitions and gates are dicts keyed by id and name.

use creditflow_core::base::config::ChannelSpec;
use creditflow_core::env::EnvMetrics;
use creditflow_core::gate::{ChannelMetrics, DebloatMetrics, GateMetrics};
use creditflow_core::memory::PoolStats;
use creditflow_core::net::{RemoteChannelStats, RemoteStats};
use creditflow_core::partition::spill::{SpillDirMetrics, SpillMetrics};
use creditflow_core::partition::{PartitionMetrics, RemoteReaderMetrics, SubpartitionMetrics};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// `d[name] = name` for each field `name` (a local of that name), or `d[name] = value`.
macro_rules! put {
    ($d:expr; $($name:ident $(= $value:expr)?),* $(,)?) => {
        $( put!(@one $d, $name $(, $value)?); )*
    };
    (@one $d:expr, $name:ident) => {
        $d.set_item(stringify!($name), $name)?
    };
    (@one $d:expr, $name:ident, $value:expr) => {
        $d.set_item(stringify!($name), $value)?
    };
}

/// `f(x)` as a dict, or `None`.
fn optional<'py, T>(
    py: Python<'py>,
    value: Option<&T>,
    f: impl FnOnce(Python<'py>, &T) -> PyResult<Bound<'py, PyDict>>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    value.map(|v| f(py, v)).transpose()
}

fn pool<'py>(py: Python<'py>, p: &PoolStats) -> PyResult<Bound<'py, PyDict>> {
    let PoolStats {
        min,
        max,
        share,
        held,
        in_use,
    } = *p;
    let d = PyDict::new(py);
    put!(d; min, max = (max != usize::MAX).then_some(max), share, held, in_use, usage = p.usage());
    Ok(d)
}

fn remote_reader<'py>(py: Python<'py>, r: &RemoteReaderMetrics) -> PyResult<Bound<'py, PyDict>> {
    let RemoteReaderMetrics {
        peer,
        transport,
        credit,
        buffers_sent,
        bytes_sent,
    } = r;
    let d = PyDict::new(py);
    put!(d; peer, credit, buffers_sent, bytes_sent);
    d.set_item("transport", transport.as_str())?;
    Ok(d)
}

fn subpartition<'py>(py: Python<'py>, s: &SubpartitionMetrics) -> PyResult<Bound<'py, PyDict>> {
    let SubpartitionMetrics {
        index,
        backlog,
        consumed,
        buffers_out,
        bytes_out,
        remote,
    } = s;
    let d = PyDict::new(py);
    put!(d; index, backlog, consumed, buffers_out, bytes_out, remote = optional(py, remote.as_ref(), remote_reader)?);
    Ok(d)
}

fn spill_metrics<'py>(py: Python<'py>, m: &SpillMetrics) -> PyResult<Bound<'py, PyDict>> {
    let SpillMetrics {
        kind,
        replay,
        stream_bytes,
        spilled_bytes,
        spilled_chunks,
        read_back_bytes,
        read_back_chunks,
        disk_bytes,
        memory_segments,
        files,
    } = m;
    let d = PyDict::new(py);
    put!(d; kind, replay, stream_bytes, spilled_bytes, spilled_chunks, read_back_bytes, read_back_chunks, disk_bytes, memory_segments, files);
    Ok(d)
}

/// A partition's metrics (`ResultPartition.metrics()`, `RecordWriter.metrics()`).
pub(crate) fn partition<'py>(py: Python<'py>, m: &PartitionMetrics) -> PyResult<Bound<'py, PyDict>> {
    let PartitionMetrics {
        id,
        num_subpartitions,
        pool: pool_stats,
        backlog,
        batches_written,
        buffers_written,
        bytes_written,
        rows_written,
        backpressured_ms_per_second,
        backpressured_total,
        finished,
        spill,
        subpartitions,
    } = m;
    let subs = PyList::empty(py);
    for s in subpartitions {
        subs.append(subpartition(py, s)?)?;
    }
    let d = PyDict::new(py);
    put!(d;
        id,
        num_subpartitions,
        pool = pool(py, pool_stats)?,
        backlog = PyList::new(py, backlog)?,
        batches_written,
        buffers_written,
        bytes_written,
        rows_written,
        backpressured_ms_per_second,
        backpressured_total = backpressured_total.as_secs_f64(),
        finished,
        spill = optional(py, spill.as_ref(), spill_metrics)?,
        subpartitions = subs,
        out_pool_usage = m.out_pool_usage(),
        level = m.level().as_str(),
        busy_ms_per_second = m.busy_ms_per_second(),
    );
    Ok(d)
}

fn remote_stats<'py>(py: Python<'py>, r: &RemoteStats) -> PyResult<Bound<'py, PyDict>> {
    let RemoteStats {
        remote_channels,
        exclusive_total,
        exclusive_in_use,
        floating_total,
        floating_in_use,
        credit_announced,
        credit_unannounced,
        queued_buffers,
        record_bytes,
        record_bytes_peak,
        record_bytes_granted,
        record_budget,
        record_blocks_allocated,
        record_blocks_reused,
    } = *r;
    let d = PyDict::new(py);
    put!(d;
        remote_channels,
        exclusive_total,
        exclusive_in_use,
        floating_total,
        floating_in_use,
        credit_announced,
        credit_unannounced,
        queued_buffers,
        record_bytes,
        record_bytes_peak,
        record_bytes_granted,
        record_budget,
        record_blocks_allocated,
        record_blocks_reused,
    );
    Ok(d)
}

fn debloat<'py>(py: Python<'py>, m: &DebloatMetrics) -> PyResult<Bound<'py, PyDict>> {
    let DebloatMetrics {
        buffer_size,
        desired_buffer_size,
        throughput,
        buffers,
    } = *m;
    let d = PyDict::new(py);
    put!(d; buffer_size, desired_buffer_size, throughput, buffers);
    Ok(d)
}

fn spec<'py>(py: Python<'py>, s: &ChannelSpec) -> PyResult<Bound<'py, PyDict>> {
    let ChannelSpec {
        address,
        partition_id,
        subpartition,
    } = s;
    let d = PyDict::new(py);
    put!(d; address, partition_id, subpartition);
    Ok(d)
}

fn remote_channel<'py>(py: Python<'py>, r: &RemoteChannelStats) -> PyResult<Bound<'py, PyDict>> {
    let RemoteChannelStats {
        exclusive_in_use,
        floating_in_use,
        credit_announced,
        credit_unannounced,
        required,
        queued_buffers,
        record_bytes,
        record_bytes_peak,
        transport,
    } = *r;
    let d = PyDict::new(py);
    d.set_item("transport", transport.as_str())?;
    put!(d; exclusive_in_use, floating_in_use, credit_announced, credit_unannounced, required, queued_buffers);
    put!(d; record_bytes, record_bytes_peak);
    Ok(d)
}

fn channel<'py>(py: Python<'py>, c: &ChannelMetrics) -> PyResult<Bound<'py, PyDict>> {
    let ChannelMetrics {
        index,
        spec: channel_spec,
        kind,
        batches_received,
        buffers_received,
        bytes_received,
        rows_received,
        remote,
    } = c;
    let d = PyDict::new(py);
    put!(d;
        index,
        spec = spec(py, channel_spec)?,
        kind = kind.as_str(),
        batches_received,
        buffers_received,
        bytes_received,
        rows_received,
        remote = optional(py, remote.as_ref(), remote_channel)?,
    );
    Ok(d)
}

/// A gate's metrics (`InputGate.metrics()`).
pub(crate) fn gate<'py>(py: Python<'py>, m: &GateMetrics) -> PyResult<Bound<'py, PyDict>> {
    let GateMetrics {
        name,
        num_channels,
        ended_channels,
        pool: pool_stats,
        queued_batches,
        stale_barriers,
        batches_received,
        buffers_received,
        bytes_received,
        rows_received,
        idle_ms_per_second,
        idle_total,
        remote,
        debloat: debloat_metrics,
        channels,
    } = m;
    let chans = PyList::empty(py);
    for c in channels {
        chans.append(channel(py, c)?)?;
    }
    let d = PyDict::new(py);
    put!(d;
        name,
        num_channels,
        ended_channels,
        pool = pool(py, pool_stats)?,
        queued_batches,
        stale_barriers,
        batches_received,
        buffers_received,
        bytes_received,
        rows_received,
        idle_ms_per_second,
        idle_total = idle_total.as_secs_f64(),
        remote = optional(py, remote.as_ref(), remote_stats)?,
        debloat = optional(py, debloat_metrics.as_ref(), debloat)?,
        channels = chans,
        busy_ms_per_second = m.busy_ms_per_second(),
    );
    Ok(d)
}

/// The environment's metrics (`NetworkEnvironment.metrics()`).
pub(crate) fn env<'py>(py: Python<'py>, m: &EnvMetrics) -> PyResult<Bound<'py, PyDict>> {
    let EnvMetrics {
        address,
        segment_size,
        segments_total,
        segments_available,
        segments_allocated,
        segments_reserved,
        partitions,
        gates,
        spill,
    } = m;
    let parts = PyDict::new(py);
    for p in partitions {
        parts.set_item(&p.id, partition(py, p)?)?;
    }
    let gate_dicts = PyDict::new(py);
    for g in gates {
        gate_dicts.set_item(&g.name, gate(py, g)?)?;
    }
    let d = PyDict::new(py);
    put!(d;
        address,
        segment_size,
        segments_total,
        segments_available,
        segments_allocated,
        segments_reserved,
        partitions = parts,
        gates = gate_dicts,
        spill = optional(py, spill.as_ref(), spill_dir)?,
    );
    Ok(d)
}

fn spill_dir<'py>(py: Python<'py>, m: &SpillDirMetrics) -> PyResult<Bound<'py, PyDict>> {
    let SpillDirMetrics {
        path,
        disk_bytes,
        max_spill,
        written_bytes,
        files_created,
        swept_dirs,
    } = m;
    let d = PyDict::new(py);
    put!(d; path, disk_bytes, max_spill, written_bytes, files_created, swept_dirs);
    Ok(d)
}
