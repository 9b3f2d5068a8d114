//! Metrics across a session: the service's snapshots of a partition, a gate and itself, as
//! bytes, so an attached task's `metrics()` returns the same structs an environment's do.

use std::time::Duration;

use super::codec::{In, Out};
use crate::base::config::ChannelSpec;
use crate::base::error::{Error, Result};
use crate::base::metrics::ChannelTransport;
use crate::gate::{ChannelKind, ChannelMetrics, DebloatMetrics, GateMetrics};
use crate::memory::PoolStats;
use crate::net::{RemoteChannelStats, RemoteStats};
use crate::partition::spill::SpillMetrics;
use crate::partition::{PartitionMetrics, RemoteReaderMetrics, SubpartitionMetrics};

/// What a host service holds: its pool (the host's `memory`), the tasks attached, and its
/// connections to other hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceMetrics {
    /// The service's address.
    pub address: String,
    /// Bytes per segment.
    pub segment_size: usize,
    /// Segments in the host's pool (`memory / segment_size`).
    pub segments_total: usize,
    /// Segments no local pool holds.
    pub segments_available: usize,
    /// Sum of the local pools' minimums.
    pub segments_reserved: usize,
    /// Tasks attached now.
    pub sessions: usize,
    /// Partitions registered.
    pub partitions: usize,
    /// Gates the service serves now (one that ended, or whose task let it go, is not counted).
    pub gates: usize,
    /// Connections the service opened to other services (one per address it reads from).
    pub connections_opened: usize,
    /// Connections other services opened to this one.
    pub connections_served: usize,
    /// Batches handed to a reading task where the writing task put them (a piece in its
    /// writer link's heap), not copied: since the service started.
    pub batches_in_place: usize,
    /// Batches copied onto a reading task's link (small pieces, pieces that did not fit the
    /// writer link's heap, and batches from other hosts): since the service started.
    pub batches_copied: usize,
    /// Batches handed to a reading task in place that it never let go, whose writer link's
    /// chunks the service freed: the task closed its gate before reading them, or ended
    /// holding them. Since the service started.
    pub pieces_reclaimed: usize,
}

fn pool(o: &mut Out, p: &PoolStats) {
    for v in [p.min, p.max, p.share, p.held, p.in_use] {
        o.usize(v);
    }
}

fn get_pool(i: &mut In<'_>) -> Result<PoolStats> {
    Ok(PoolStats {
        min: i.usize()?,
        max: i.usize()?,
        share: i.usize()?,
        held: i.usize()?,
        in_use: i.usize()?,
    })
}

fn duration(o: &mut Out, d: Duration) {
    o.u64(d.as_nanos().min(u64::MAX as u128) as u64);
}

fn get_duration(i: &mut In<'_>) -> Result<Duration> {
    Ok(Duration::from_nanos(i.u64()?))
}

fn transport(t: ChannelTransport) -> u8 {
    match t {
        ChannelTransport::Tcp => 0,
        ChannelTransport::Shm => 1,
    }
}

fn get_transport(i: &mut In<'_>) -> Result<ChannelTransport> {
    Ok(if i.bool()? {
        ChannelTransport::Shm
    } else {
        ChannelTransport::Tcp
    })
}

fn option<T>(o: &mut Out, v: Option<&T>, put: impl FnOnce(&mut Out, &T)) {
    o.bool(v.is_some());
    if let Some(v) = v {
        put(o, v);
    }
}

fn get_option<'a, T>(i: &mut In<'a>, get: impl FnOnce(&mut In<'a>) -> Result<T>) -> Result<Option<T>> {
    if i.bool()? {
        get(i).map(Some)
    } else {
        Ok(None)
    }
}

/// A partition's metrics as bytes.
pub(crate) fn encode_partition(m: &PartitionMetrics) -> Vec<u8> {
    let mut o = Out::default();
    o.str(&m.id);
    o.usize(m.num_subpartitions);
    pool(&mut o, &m.pool);
    o.u32(m.backlog.len() as u32);
    for b in &m.backlog {
        o.usize(*b);
    }
    for v in [
        m.batches_written,
        m.buffers_written,
        m.bytes_written,
        m.rows_written,
    ] {
        o.u64(v);
    }
    o.f64(m.backpressured_ms_per_second);
    duration(&mut o, m.backpressured_total);
    o.bool(m.finished);
    option(&mut o, m.spill.as_ref(), |o, s| {
        o.bool(s.kind == "hybrid");
        o.bool(s.replay);
        for v in [
            s.stream_bytes,
            s.spilled_bytes,
            s.spilled_chunks,
            s.read_back_bytes,
            s.read_back_chunks,
            s.disk_bytes,
        ] {
            o.u64(v);
        }
        o.usize(s.memory_segments);
        o.usize(s.files);
    });
    o.u32(m.subpartitions.len() as u32);
    for s in &m.subpartitions {
        o.usize(s.index);
        o.usize(s.backlog);
        o.bool(s.consumed);
        o.u64(s.buffers_out);
        o.u64(s.bytes_out);
        option(&mut o, s.remote.as_ref(), |o, r| {
            o.str(&r.peer);
            o.u8(transport(r.transport));
            o.u64(r.credit);
            o.u64(r.buffers_sent);
            o.u64(r.bytes_sent);
        });
    }
    o.into_bytes()
}

/// Reads what [`encode_partition`] wrote.
pub(crate) fn decode_partition(bytes: &[u8]) -> Result<PartitionMetrics> {
    let mut i = In::new(bytes);
    let id = i.str()?;
    let num_subpartitions = i.usize()?;
    let pool = get_pool(&mut i)?;
    let n = i.u32()?;
    let backlog = (0..n).map(|_| i.usize()).collect::<Result<Vec<_>>>()?;
    let (batches_written, buffers_written, bytes_written, rows_written) =
        (i.u64()?, i.u64()?, i.u64()?, i.u64()?);
    let backpressured_ms_per_second = i.f64()?;
    let backpressured_total = get_duration(&mut i)?;
    let finished = i.bool()?;
    let spill = get_option(&mut i, |i| {
        Ok(SpillMetrics {
            kind: if i.bool()? { "hybrid" } else { "blocking" },
            replay: i.bool()?,
            stream_bytes: i.u64()?,
            spilled_bytes: i.u64()?,
            spilled_chunks: i.u64()?,
            read_back_bytes: i.u64()?,
            read_back_chunks: i.u64()?,
            disk_bytes: i.u64()?,
            memory_segments: i.usize()?,
            files: i.usize()?,
        })
    })?;
    let n = i.u32()?;
    let mut subpartitions = Vec::new();
    for _ in 0..n {
        subpartitions.push(SubpartitionMetrics {
            index: i.usize()?,
            backlog: i.usize()?,
            consumed: i.bool()?,
            buffers_out: i.u64()?,
            bytes_out: i.u64()?,
            remote: get_option(&mut i, |i| {
                Ok(RemoteReaderMetrics {
                    peer: i.str()?,
                    transport: get_transport(i)?,
                    credit: i.u64()?,
                    buffers_sent: i.u64()?,
                    bytes_sent: i.u64()?,
                })
            })?,
        });
    }
    i.end()?;
    Ok(PartitionMetrics {
        id,
        num_subpartitions,
        pool,
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
    })
}

fn channel_kind(k: ChannelKind) -> u8 {
    match k {
        ChannelKind::Pending => 0,
        ChannelKind::Local => 1,
        ChannelKind::Remote => 2,
        ChannelKind::Ended => 3,
    }
}

fn get_channel_kind(i: &mut In<'_>) -> Result<ChannelKind> {
    Ok(match i.u8()? {
        0 => ChannelKind::Pending,
        1 => ChannelKind::Local,
        2 => ChannelKind::Remote,
        3 => ChannelKind::Ended,
        k => return Err(Error::Protocol(format!("attach: unknown channel kind {k}"))),
    })
}

fn remote_channel(o: &mut Out, r: &RemoteChannelStats) {
    for v in [
        r.exclusive_in_use,
        r.floating_in_use,
        r.credit_announced,
        r.credit_unannounced,
        r.required,
        r.queued_buffers,
    ] {
        o.usize(v);
    }
    o.u64(r.record_bytes);
    o.u64(r.record_bytes_peak);
    o.u8(transport(r.transport));
}

fn get_remote_channel(i: &mut In<'_>) -> Result<RemoteChannelStats> {
    Ok(RemoteChannelStats {
        exclusive_in_use: i.usize()?,
        floating_in_use: i.usize()?,
        credit_announced: i.usize()?,
        credit_unannounced: i.usize()?,
        required: i.usize()?,
        queued_buffers: i.usize()?,
        record_bytes: i.u64()?,
        record_bytes_peak: i.u64()?,
        transport: get_transport(i)?,
    })
}

/// A gate's metrics as bytes.
pub(crate) fn encode_gate(m: &GateMetrics) -> Vec<u8> {
    let mut o = Out::default();
    o.str(&m.name);
    o.usize(m.num_channels);
    o.usize(m.ended_channels);
    pool(&mut o, &m.pool);
    o.usize(m.queued_batches);
    for v in [
        m.stale_barriers,
        m.batches_received,
        m.buffers_received,
        m.bytes_received,
        m.rows_received,
    ] {
        o.u64(v);
    }
    o.f64(m.idle_ms_per_second);
    duration(&mut o, m.idle_total);
    option(&mut o, m.remote.as_ref(), |o, r| {
        for v in [
            r.remote_channels,
            r.exclusive_total,
            r.exclusive_in_use,
            r.floating_total,
            r.floating_in_use,
            r.credit_announced,
            r.credit_unannounced,
            r.queued_buffers,
        ] {
            o.usize(v);
        }
        for v in [
            r.record_bytes,
            r.record_bytes_peak,
            r.record_bytes_granted,
            r.record_budget,
            r.record_blocks_allocated,
            r.record_blocks_reused,
        ] {
            o.u64(v);
        }
    });
    option(&mut o, m.debloat.as_ref(), |o, d| {
        o.usize(d.buffer_size);
        o.usize(d.desired_buffer_size);
        o.f64(d.throughput);
        o.usize(d.buffers);
    });
    o.u32(m.channels.len() as u32);
    for c in &m.channels {
        o.usize(c.index);
        o.str(&c.spec.address);
        o.str(&c.spec.partition_id);
        o.usize(c.spec.subpartition);
        o.u8(channel_kind(c.kind));
        for v in [
            c.batches_received,
            c.buffers_received,
            c.bytes_received,
            c.rows_received,
        ] {
            o.u64(v);
        }
        option(&mut o, c.remote.as_ref(), remote_channel);
    }
    o.into_bytes()
}

/// Reads what [`encode_gate`] wrote.
pub(crate) fn decode_gate(bytes: &[u8]) -> Result<GateMetrics> {
    let mut i = In::new(bytes);
    let name = i.str()?;
    let num_channels = i.usize()?;
    let ended_channels = i.usize()?;
    let pool = get_pool(&mut i)?;
    let queued_batches = i.usize()?;
    let (stale_barriers, batches_received, buffers_received, bytes_received, rows_received) =
        (i.u64()?, i.u64()?, i.u64()?, i.u64()?, i.u64()?);
    let idle_ms_per_second = i.f64()?;
    let idle_total = get_duration(&mut i)?;
    let remote = get_option(&mut i, |i| {
        Ok(RemoteStats {
            remote_channels: i.usize()?,
            exclusive_total: i.usize()?,
            exclusive_in_use: i.usize()?,
            floating_total: i.usize()?,
            floating_in_use: i.usize()?,
            credit_announced: i.usize()?,
            credit_unannounced: i.usize()?,
            queued_buffers: i.usize()?,
            record_bytes: i.u64()?,
            record_bytes_peak: i.u64()?,
            record_bytes_granted: i.u64()?,
            record_budget: i.u64()?,
            record_blocks_allocated: i.u64()?,
            record_blocks_reused: i.u64()?,
        })
    })?;
    let debloat = get_option(&mut i, |i| {
        Ok(DebloatMetrics {
            buffer_size: i.usize()?,
            desired_buffer_size: i.usize()?,
            throughput: i.f64()?,
            buffers: i.usize()?,
        })
    })?;
    let n = i.u32()?;
    let mut channels = Vec::new();
    for _ in 0..n {
        channels.push(ChannelMetrics {
            index: i.usize()?,
            spec: ChannelSpec {
                address: i.str()?,
                partition_id: i.str()?,
                subpartition: i.usize()?,
            },
            kind: get_channel_kind(&mut i)?,
            batches_received: i.u64()?,
            buffers_received: i.u64()?,
            bytes_received: i.u64()?,
            rows_received: i.u64()?,
            remote: get_option(&mut i, get_remote_channel)?,
        });
    }
    i.end()?;
    Ok(GateMetrics {
        name,
        num_channels,
        ended_channels,
        pool,
        queued_batches,
        stale_barriers,
        batches_received,
        buffers_received,
        bytes_received,
        rows_received,
        idle_ms_per_second,
        idle_total,
        remote,
        debloat,
        channels,
    })
}

/// A service's metrics as bytes.
pub(crate) fn encode_service(m: &ServiceMetrics) -> Vec<u8> {
    let mut o = Out::default();
    o.str(&m.address);
    for v in [
        m.segment_size,
        m.segments_total,
        m.segments_available,
        m.segments_reserved,
        m.sessions,
        m.partitions,
        m.gates,
        m.connections_opened,
        m.connections_served,
        m.batches_in_place,
        m.batches_copied,
        m.pieces_reclaimed,
    ] {
        o.usize(v);
    }
    o.into_bytes()
}

/// Reads what [`encode_service`] wrote.
pub(crate) fn decode_service(bytes: &[u8]) -> Result<ServiceMetrics> {
    let mut i = In::new(bytes);
    let m = ServiceMetrics {
        address: i.str()?,
        segment_size: i.usize()?,
        segments_total: i.usize()?,
        segments_available: i.usize()?,
        segments_reserved: i.usize()?,
        sessions: i.usize()?,
        partitions: i.usize()?,
        gates: i.usize()?,
        connections_opened: i.usize()?,
        connections_served: i.usize()?,
        batches_in_place: i.usize()?,
        batches_copied: i.usize()?,
        pieces_reclaimed: i.usize()?,
    };
    i.end()?;
    Ok(m)
}
