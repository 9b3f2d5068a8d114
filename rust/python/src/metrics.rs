//! Metrics of the core as plain dicts.

use creditflow_core::env::EnvMetrics;
use creditflow_core::gate::GateMetrics;
use creditflow_core::memory::PoolStats;
use creditflow_core::partition::PartitionMetrics;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

fn pool_dict<'py>(py: Python<'py>, p: &PoolStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("min", p.min)?;
    d.set_item("max", if p.max == usize::MAX { None } else { Some(p.max) })?;
    d.set_item("share", p.share)?;
    d.set_item("held", p.held)?;
    d.set_item("in_use", p.in_use)?;
    Ok(d)
}

pub(crate) fn partition_metrics_dict<'py>(
    py: Python<'py>,
    m: &PartitionMetrics,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", &m.id)?;
    d.set_item("num_subpartitions", m.num_subpartitions)?;
    d.set_item("out_pool_usage", m.out_pool_usage())?;
    d.set_item("out_pool", pool_dict(py, &m.pool)?)?;
    d.set_item("backlog", PyList::new(py, &m.backlog)?)?;
    d.set_item("batches_written", m.batches_written)?;
    d.set_item("buffers_written", m.buffers_written)?;
    d.set_item("bytes_written", m.bytes_written)?;
    d.set_item("rows_written", m.rows_written)?;
    d.set_item("backpressured_time_ms_per_second", m.backpressured_ms_per_second)?;
    d.set_item("backpressure_level", m.level().as_str())?;
    d.set_item("busy_time_ms_per_second", m.busy_ms_per_second())?;
    d.set_item("backpressured_seconds_total", m.backpressured_total.as_secs_f64())?;
    d.set_item("finished", m.finished)?;
    let subs = PyList::empty(py);
    for sm in &m.subpartitions {
        let sd = PyDict::new(py);
        sd.set_item("index", sm.index)?;
        sd.set_item("backlog", sm.backlog)?;
        sd.set_item("consumed", sm.consumed)?;
        sd.set_item("buffers_out", sm.buffers_out)?;
        sd.set_item("bytes_out", sm.bytes_out)?;
        match &sm.remote {
            Some(r) => {
                sd.set_item("peer", &r.peer)?;
                sd.set_item("credit", r.credit)?;
                sd.set_item("buffers_sent", r.buffers_sent)?;
                sd.set_item("bytes_sent", r.bytes_sent)?;
            }
            None => {
                sd.set_item("peer", py.None())?;
            }
        }
        subs.append(sd)?;
    }
    d.set_item("subpartitions", subs)?;
    Ok(d)
}

pub(crate) fn gate_metrics_dict<'py>(py: Python<'py>, m: &GateMetrics) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &m.name)?;
    d.set_item("num_channels", m.num_channels)?;
    d.set_item("ended_channels", m.ended_channels)?;
    d.set_item("in_pool_usage", m.pool.usage())?;
    d.set_item("in_pool", pool_dict(py, &m.pool)?)?;
    d.set_item("queued_batches", m.queued_batches)?;
    d.set_item("stale_barriers", m.stale_barriers)?;
    d.set_item("batches_received", m.batches_received)?;
    d.set_item("buffers_received", m.buffers_received)?;
    d.set_item("bytes_received", m.bytes_received)?;
    d.set_item("rows_received", m.rows_received)?;
    d.set_item("idle_time_ms_per_second", m.idle_ms_per_second)?;
    if let Some(r) = &m.remote {
        d.set_item("remote_channels", r.remote_channels)?;
        d.set_item("exclusive_buffers", r.exclusive_total)?;
        d.set_item("exclusive_in_use", r.exclusive_in_use)?;
        d.set_item("floating_buffers", r.floating_total)?;
        d.set_item("floating_in_use", r.floating_in_use)?;
        d.set_item("credit_outstanding", r.credit_announced)?;
        d.set_item("credit_unannounced", r.credit_unannounced)?;
        d.set_item("queued_buffers", r.queued_buffers)?;
    }
    if let Some(db) = &m.debloat {
        d.set_item("debloat_buffer_size", db.buffer_size)?;
        d.set_item("debloat_desired_buffer_size", db.desired_buffer_size)?;
        d.set_item("debloat_throughput_bytes_per_second", db.throughput)?;
        d.set_item("debloat_buffers", db.buffers)?;
    }
    d.set_item("busy_time_ms_per_second", m.busy_ms_per_second())?;
    d.set_item("idle_seconds_total", m.idle_total.as_secs_f64())?;
    let chans = PyList::empty(py);
    for c in &m.channels {
        let cd = PyDict::new(py);
        cd.set_item("index", c.index)?;
        cd.set_item("address", &c.spec.address)?;
        cd.set_item("partition_id", &c.spec.partition_id)?;
        cd.set_item("subpartition", c.spec.subpartition)?;
        cd.set_item("kind", c.kind.as_str())?;
        cd.set_item("batches_received", c.batches_received)?;
        cd.set_item("buffers_received", c.buffers_received)?;
        cd.set_item("bytes_received", c.bytes_received)?;
        cd.set_item("rows_received", c.rows_received)?;
        if let Some(r) = &c.remote {
            cd.set_item("exclusive_in_use", r.exclusive_in_use)?;
            cd.set_item("floating_in_use", r.floating_in_use)?;
            cd.set_item("credit_outstanding", r.credit_announced)?;
            cd.set_item("credit_unannounced", r.credit_unannounced)?;
            cd.set_item("buffers_required", r.required)?;
            cd.set_item("queued_buffers", r.queued_buffers)?;
        }
        chans.append(cd)?;
    }
    d.set_item("channels", chans)?;
    Ok(d)
}

pub(crate) fn env_metrics_dict<'py>(py: Python<'py>, m: &EnvMetrics) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("address", &m.address)?;
    d.set_item("segment_size", m.segment_size)?;
    d.set_item("segments_total", m.segments_total)?;
    d.set_item("segments_available", m.segments_available)?;
    d.set_item("segments_allocated", m.segments_allocated)?;
    d.set_item("segments_reserved", m.segments_reserved)?;
    let parts = PyDict::new(py);
    for p in &m.partitions {
        parts.set_item(&p.id, partition_metrics_dict(py, p)?)?;
    }
    d.set_item("partitions", parts)?;
    let gates = PyDict::new(py);
    for g in &m.gates {
        gates.set_item(&g.name, gate_metrics_dict(py, g)?)?;
    }
    d.set_item("gates", gates)?;
    Ok(d)
}
