"""Prometheus export of an environment's metrics (needs ``pip install creditflow[metrics]``).

:func:`register` adds a collector that reads ``env.metrics()`` on every scrape (nothing is
sampled in between); ``env.serve_metrics(port)`` serves one environment at ``/metrics`` on
its own registry and stops when the environment closes. A host service
(:class:`creditflow.HostService`) is read the same way: its environment's families (the
partitions and gates of every attached task) and its own (``creditflow_service_*``);
``creditflow serve --metrics-port`` serves them. Family names and labels are listed in
:data:`FAMILIES` and in ``docs/observability.md``.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

try:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "creditflow.prometheus needs prometheus_client: pip install 'creditflow[metrics]'"
    ) from e

if TYPE_CHECKING:
    from typing_extensions import Self

    from creditflow.metrics import EnvMetrics, ReceiverMetrics, ServiceMetrics


class Source(Protocol):
    """What a collector reads: a ``NetworkEnvironment``, a rank's ``Receiver`` (whose
    metrics carry the rank's under ``rank``) or a ``HostService`` (whose environment's are
    read besides its own, by ``environment_metrics()``)."""

    @property
    def closed(self) -> bool:
        """Whether the source has closed (a closed source is no longer read)."""
        ...

    def metrics(self) -> EnvMetrics | ReceiverMetrics | ServiceMetrics:
        """The source's metrics as a dict (``creditflow.metrics``)."""
        ...


__all__ = [
    "FAMILIES",
    "LEVELS",
    "NOT_EXPORTED",
    "CreditflowCollector",
    "MetricsServer",
    "Source",
    "register",
    "serve",
]

#: Backpressure levels as exported by ``creditflow_partition_backpressure_level``.
LEVELS = {"OK": 0, "LOW": 1, "HIGH": 2}

#: A metrics dict at any level (``creditflow.metrics``'s TypedDicts are read as mappings).
Dict = Mapping[str, Any]


@dataclass(frozen=True)
class Family:
    """One exported metric family: where its values come from."""

    name: str
    kind: str  # "gauge" or "counter" (counters are exposed with a `_total` suffix)
    help: str
    labels: tuple[str, ...]
    #: The key it reads in the dict of its level (``labels``), dotted into nested dicts
    #: (``remote.credit_announced``): the Rust field's name (``creditflow.metrics``).
    field: str
    value: Callable[[Dict], float | None]


ENV = ("env",)
PART = ("env", "partition")
SUB = ("env", "partition", "subpartition", "peer")
GATE = ("env", "gate")
CHAN = ("env", "gate", "channel", "peer", "partition", "subpartition")
RANK = ("env", "rank")
#: A host service's own level; its value is the address its environment's ``env`` label has.
SERVICE = ("service",)

#: Which dict each label set reads: the level of ``env.metrics()`` its families describe
#: (``rank``: a rank's ``Receiver.metrics()["rank"]``).
LEVEL_OF_LABELS = {
    ENV: "env",
    PART: "partition",
    SUB: "subpartition",
    GATE: "gate",
    CHAN: "channel",
    RANK: "rank",
    SERVICE: "service",
}


def _lookup(d: Dict, field: str) -> Any:
    """``d[a][b]`` for ``field == "a.b"``; None where a level is None or missing."""
    v: Any = d
    for key in field.split("."):
        if v is None:
            return None
        v = v.get(key)
    return v


def _family(
    name: str,
    kind: str,
    help: str,  # noqa: A002 - the family's HELP text, as prometheus_client names it
    labels: tuple[str, ...],
    field: str,
    convert: Callable[[Any], float] = float,
) -> Family:
    def read(d: Dict) -> float | None:
        v = _lookup(d, field)
        return None if v is None else convert(v)

    return Family(name, kind, help, labels, field, read)


def _ratio(ms_per_second: float) -> float:
    return float(ms_per_second) / 1000.0


def _total(values: list[int]) -> float:
    return float(sum(values))


def _level(name: str) -> float:
    return float(LEVELS[name])


FAMILIES: tuple[Family, ...] = (
    # environment
    _family("creditflow_segments", "gauge", "Segments of the network memory", ENV, "segments_total"),
    _family("creditflow_segments_available", "gauge", "Segments not in any pool", ENV, "segments_available"),
    _family("creditflow_segment_size_bytes", "gauge", "Bytes per segment", ENV, "segment_size"),
    _family(
        "creditflow_connections_opened",
        "gauge",
        "Connections opened to other environments",
        ENV,
        "connections_opened",
    ),
    _family(
        "creditflow_connections_served",
        "gauge",
        "Connections other environments opened here",
        ENV,
        "connections_served",
    ),
    _family("creditflow_spill_disk_bytes", "gauge", "Bytes the spill files hold", ENV, "spill.disk_bytes"),
    _family("creditflow_spill_max_bytes", "gauge", "max_spill (absent: unbounded)", ENV, "spill.max_spill"),
    _family(
        "creditflow_spill_written_bytes",
        "counter",
        "Bytes written to spill files",
        ENV,
        "spill.written_bytes",
    ),
    _family("creditflow_spill_files_created", "counter", "Spill files created", ENV, "spill.files_created"),
    # partitions
    _family(
        "creditflow_partition_out_pool_usage_ratio",
        "gauge",
        "Output pool segments in use / pool share",
        PART,
        "out_pool_usage",
    ),
    _family(
        "creditflow_partition_out_pool_in_use_segments",
        "gauge",
        "Output pool segments in use",
        PART,
        "pool.in_use",
    ),
    _family(
        "creditflow_partition_backlog_buffers",
        "gauge",
        "Finished buffers waiting in all subpartitions",
        PART,
        "backlog",
        _total,
    ),
    _family("creditflow_partition_written_batches", "counter", "Batches written", PART, "batches_written"),
    _family("creditflow_partition_written_buffers", "counter", "Buffers published", PART, "buffers_written"),
    _family("creditflow_partition_written_bytes", "counter", "Arrow bytes written", PART, "bytes_written"),
    _family("creditflow_partition_written_rows", "counter", "Rows written", PART, "rows_written"),
    _family(
        "creditflow_partition_backpressured_ratio",
        "gauge",
        "Share of the last second writers waited for a buffer",
        PART,
        "backpressured_ms_per_second",
        _ratio,
    ),
    _family(
        "creditflow_partition_backpressured_seconds",
        "counter",
        "Time writers waited for a buffer",
        PART,
        "backpressured_total",
    ),
    _family(
        "creditflow_partition_busy_ratio",
        "gauge",
        "Share of the last second writers were not waiting for a buffer",
        PART,
        "busy_ms_per_second",
        _ratio,
    ),
    _family(
        "creditflow_partition_backpressure_level",
        "gauge",
        "0 = OK (<= 10% backpressured), 1 = LOW (<= 50%), 2 = HIGH",
        PART,
        "level",
        _level,
    ),
    # spillable (blocking and hybrid) partitions: no samples for pipelined ones
    _family(
        "creditflow_partition_stored_bytes",
        "counter",
        "Stream bytes stored (after compression)",
        PART,
        "spill.stream_bytes",
    ),
    _family(
        "creditflow_partition_spilled_bytes",
        "counter",
        "Bytes written to spill files",
        PART,
        "spill.spilled_bytes",
    ),
    _family(
        "creditflow_partition_spilled_chunks",
        "counter",
        "Chunks written to spill files",
        PART,
        "spill.spilled_chunks",
    ),
    _family(
        "creditflow_partition_read_back_bytes",
        "counter",
        "Bytes read back from spill files",
        PART,
        "spill.read_back_bytes",
    ),
    _family(
        "creditflow_partition_read_back_chunks",
        "counter",
        "Chunks read back from spill files",
        PART,
        "spill.read_back_chunks",
    ),
    _family(
        "creditflow_partition_spill_disk_bytes",
        "gauge",
        "Bytes the spill files hold now",
        PART,
        "spill.disk_bytes",
    ),
    _family("creditflow_partition_spill_files", "gauge", "Spill files open now", PART, "spill.files"),
    _family(
        "creditflow_partition_store_memory_segments",
        "gauge",
        "Segments the stored stream holds in memory",
        PART,
        "spill.memory_segments",
    ),
    # subpartitions
    _family(
        "creditflow_subpartition_backlog_buffers",
        "gauge",
        "Finished buffers waiting for the reader",
        SUB,
        "backlog",
    ),
    _family("creditflow_subpartition_out_buffers", "counter", "Buffers the reader took", SUB, "buffers_out"),
    _family("creditflow_subpartition_out_bytes", "counter", "Bytes the reader took", SUB, "bytes_out"),
    _family(
        "creditflow_subpartition_credit_buffers",
        "gauge",
        "Remote reader: buffers the sender may still send",
        SUB,
        "remote.credit",
    ),
    _family(
        "creditflow_subpartition_sent_buffers",
        "counter",
        "Remote reader: data buffers written to the connection",
        SUB,
        "remote.buffers_sent",
    ),
    _family(
        "creditflow_subpartition_sent_bytes",
        "counter",
        "Remote reader: payload bytes written to the connection",
        SUB,
        "remote.bytes_sent",
    ),
    # gates
    _family(
        "creditflow_gate_in_pool_usage_ratio",
        "gauge",
        "Input pool segments in use / pool share",
        GATE,
        "pool.usage",
    ),
    _family(
        "creditflow_gate_in_pool_in_use_segments",
        "gauge",
        "Input pool segments in use",
        GATE,
        "pool.in_use",
    ),
    _family(
        "creditflow_gate_exclusive_buffers",
        "gauge",
        "Exclusive buffers of open remote channels",
        GATE,
        "remote.exclusive_total",
    ),
    _family(
        "creditflow_gate_exclusive_in_use_buffers",
        "gauge",
        "Exclusive buffers holding unread data",
        GATE,
        "remote.exclusive_in_use",
    ),
    _family("creditflow_gate_floating_buffers", "gauge", "Floating buffers", GATE, "remote.floating_total"),
    _family(
        "creditflow_gate_floating_in_use_buffers",
        "gauge",
        "Floating buffers assigned to channels",
        GATE,
        "remote.floating_in_use",
    ),
    _family(
        "creditflow_gate_credit_outstanding_buffers",
        "gauge",
        "Empty buffers announced to senders",
        GATE,
        "remote.credit_announced",
    ),
    _family(
        "creditflow_gate_queued_buffers",
        "gauge",
        "Received buffers not yet read",
        GATE,
        "remote.queued_buffers",
    ),
    _family(
        "creditflow_gate_record_bytes",
        "gauge",
        "Records in progress plus completed and not yet taken, in bytes",
        GATE,
        "remote.record_bytes",
    ),
    _family(
        "creditflow_gate_record_peak_bytes",
        "gauge",
        "The largest record bytes held so far",
        GATE,
        "remote.record_bytes_peak",
    ),
    _family(
        "creditflow_gate_record_granted_bytes",
        "gauge",
        "Record bytes granted to senders and not used yet",
        GATE,
        "remote.record_bytes_granted",
    ),
    _family(
        "creditflow_gate_record_budget_bytes",
        "gauge",
        "Record bytes beyond which new records wait (at most one record beyond it)",
        GATE,
        "remote.record_budget",
    ),
    _family(
        "creditflow_gate_record_blocks_allocated",
        "counter",
        "Record buffers allocated fresh (each costs page faults as it is first written)",
        GATE,
        "remote.record_blocks_allocated",
    ),
    _family(
        "creditflow_gate_record_blocks_reused",
        "counter",
        "Record buffers used again after the batches over them were dropped",
        GATE,
        "remote.record_blocks_reused",
    ),
    _family(
        "creditflow_gate_queued_batches",
        "gauge",
        "Decoded batches not yet returned",
        GATE,
        "queued_batches",
    ),
    _family("creditflow_gate_received_batches", "counter", "Batches received", GATE, "batches_received"),
    _family("creditflow_gate_received_buffers", "counter", "Buffers received", GATE, "buffers_received"),
    _family("creditflow_gate_received_bytes", "counter", "Arrow bytes received", GATE, "bytes_received"),
    _family("creditflow_gate_received_rows", "counter", "Rows received", GATE, "rows_received"),
    _family(
        "creditflow_gate_idle_ratio",
        "gauge",
        "Share of the last second the reader waited for data",
        GATE,
        "idle_ms_per_second",
        _ratio,
    ),
    _family(
        "creditflow_gate_idle_seconds",
        "counter",
        "Time the reader waited for data",
        GATE,
        "idle_total",
    ),
    _family(
        "creditflow_gate_busy_ratio",
        "gauge",
        "Share of the last second the reader was not waiting for data",
        GATE,
        "busy_ms_per_second",
        _ratio,
    ),
    _family(
        "creditflow_gate_debloat_buffer_size_bytes",
        "gauge",
        "Buffer debloating: the buffer size last announced to the producers",
        GATE,
        "debloat.buffer_size",
    ),
    _family(
        "creditflow_gate_debloat_throughput_bytes_per_second",
        "gauge",
        "Buffer debloating: smoothed bytes consumed per second not spent waiting for data",
        GATE,
        "debloat.throughput",
    ),
    # channels
    _family("creditflow_channel_received_batches", "counter", "Batches received", CHAN, "batches_received"),
    _family("creditflow_channel_received_buffers", "counter", "Buffers received", CHAN, "buffers_received"),
    _family("creditflow_channel_received_bytes", "counter", "Arrow bytes received", CHAN, "bytes_received"),
    _family("creditflow_channel_received_rows", "counter", "Rows received", CHAN, "rows_received"),
    _family(
        "creditflow_channel_credit_outstanding_buffers",
        "gauge",
        "Remote channel: empty buffers announced to the sender",
        CHAN,
        "remote.credit_announced",
    ),
    _family(
        "creditflow_channel_queued_buffers",
        "gauge",
        "Remote channel: received buffers not yet read",
        CHAN,
        "remote.queued_buffers",
    ),
    _family(
        "creditflow_channel_record_bytes",
        "gauge",
        "Remote channel: records in progress plus completed and not yet taken, in bytes",
        CHAN,
        "remote.record_bytes",
    ),
    _family(
        "creditflow_channel_record_peak_bytes",
        "gauge",
        "Remote channel: the largest record bytes held so far",
        CHAN,
        "remote.record_bytes_peak",
    ),
    _family(
        "creditflow_channel_exclusive_in_use_buffers",
        "gauge",
        "Remote channel: exclusive buffers holding unread data",
        CHAN,
        "remote.exclusive_in_use",
    ),
    _family(
        "creditflow_channel_floating_in_use_buffers",
        "gauge",
        "Remote channel: floating buffers assigned",
        CHAN,
        "remote.floating_in_use",
    ),
    # a training rank (Receiver(rank=...).serve_metrics())
    _family(
        "creditflow_rank_data_stall_ratio",
        "gauge",
        "Share of the last second the rank's trainer waited for data",
        RANK,
        "stall_ms_per_second",
        _ratio,
    ),
    _family(
        "creditflow_rank_data_stall_seconds",
        "counter",
        "Seconds the rank's trainer waited for data",
        RANK,
        "stall_total",
    ),
    _family(
        "creditflow_rank_backpressure_ratio",
        "gauge",
        "Share of the last second the rank held the Spark tasks back (its queue was full)",
        RANK,
        "backpressure_ms_per_second",
        _ratio,
    ),
    _family(
        "creditflow_rank_backpressure_seconds",
        "counter",
        "Seconds the rank held the Spark tasks back",
        RANK,
        "backpressure_total",
    ),
    _family("creditflow_rank_epoch", "gauge", "The rank's current epoch", RANK, "epoch"),
    _family("creditflow_rank_batches", "gauge", "Batches the trainer took in the epoch", RANK, "batches"),
    _family("creditflow_rank_rows_yielded", "counter", "Rows the rank yielded", RANK, "rows_yielded"),
    _family("creditflow_rank_rows_held", "gauge", "Rows the rank keeps for the epochs", RANK, "rows_held"),
    _family("creditflow_rank_memory_bytes", "gauge", "Bytes the rank holds now", RANK, "memory_bytes"),
    _family("creditflow_rank_memory_limit_bytes", "gauge", "The rank's memory setting", RANK, "memory_limit"),
    # a host service (its environment's families describe its pool, partitions and gates)
    _family("creditflow_service_sessions", "gauge", "Tasks attached to the service", SERVICE, "sessions"),
    _family("creditflow_service_partitions", "gauge", "Partitions the service holds", SERVICE, "partitions"),
    _family("creditflow_service_gates", "gauge", "Gates the service serves for its tasks", SERVICE, "gates"),
    _family(
        "creditflow_service_batches_in_place",
        "counter",
        "Batches handed to a reading task where its writer put them, uncopied",
        SERVICE,
        "batches_in_place",
    ),
    _family(
        "creditflow_service_batches_copied",
        "counter",
        "Batches copied onto a reading task's link",
        SERVICE,
        "batches_copied",
    ),
    _family(
        "creditflow_service_pieces_reclaimed",
        "counter",
        "Batches handed over in place that the reader never let go, freed by the service",
        SERVICE,
        "pieces_reclaimed",
    ),
)

#: Numeric metrics no family exports, by level and field (as in :attr:`Family.field`), and
#: why. ``tests/test_metrics_boundary.py`` checks that every numeric field of the Rust
#: metrics structs is exported by a family or listed here.
NOT_EXPORTED: dict[str, str] = {
    "env.segments_allocated": "lazy and never undone: segments_total - segments_available tells more",
    "env.spill.swept_dirs": "counted once when the directory is opened; logged at INFO",
    "env.segments_reserved": "a sum of pools' minimums; a construction-time check, not a live signal",
    "partition.num_subpartitions": "fixed at creation; the subpartition label counts them",
    "partition.pool.min": "fixed at creation (num_subpartitions + 1)",
    "partition.pool.max": "unbounded for partitions",
    "partition.pool.share": "exported as a ratio (out_pool_usage)",
    "partition.pool.held": "an allocation detail; in_use is what matters",
    "partition.pool.usage": "the same as out_pool_usage (creditflow_partition_out_pool_usage_ratio)",
    "subpartition.index": "a label",
    "gate.num_channels": "fixed at creation; the channel label counts them",
    "gate.ended_channels": "the channel families stop changing once ended; read it from gate.metrics()",
    "gate.stale_barriers": "a debugging counter of checkpoint alignment; read it from gate.metrics()",
    "gate.pool.min": "fixed at creation (remote channels x exclusive_buffers + 1)",
    "gate.pool.max": "fixed at creation (min + floating_buffers)",
    "gate.pool.share": "exported as a ratio (creditflow_gate_in_pool_usage_ratio)",
    "gate.pool.held": "an allocation detail; in_use is what matters",
    "gate.remote.remote_channels": "the channel label counts them",
    "gate.remote.credit_unannounced": "a transient between recycling and the next AddCredit",
    "gate.debloat.desired_buffer_size": "damped; the announced size is exported (..._buffer_size_bytes)",
    "gate.debloat.buffers": "fixed at creation (the divisor of the buffer size)",
    "channel.index": "a label",
    "channel.spec.subpartition": "a label",
    "channel.remote.credit_unannounced": "a transient between recycling and the next AddCredit",
    "channel.remote.required": "the sender's backlog + exclusive buffers: read it from gate.metrics()",
    "service.segment_size": "its environment's (creditflow_segment_size_bytes)",
    "service.segments_total": "its environment's (creditflow_segments)",
    "service.segments_available": "its environment's (creditflow_segments_available)",
    "service.segments_reserved": "a sum of pools' minimums; a construction-time check, not a live signal",
    "service.connections_opened": "its environment's (creditflow_connections_opened)",
    "service.connections_served": "its environment's (creditflow_connections_served)",
}


def _rows(m: Dict, labels: tuple[str, ...]) -> Iterator[tuple[list[str], Dict]]:
    """Yields (label values, dict) for every object a family with these labels describes."""
    env = str(m["address"])
    if ("sessions" in m) != (labels == SERVICE):
        return  # a service's own dict has the service level only, and the others none of it
    if labels in (ENV, SERVICE):  # the service's address is its environment's
        yield [env], m
    elif labels == PART:
        for pid, p in m["partitions"].items():
            yield [env, pid], p
    elif labels == SUB:
        for pid, p in m["partitions"].items():
            for s in p["subpartitions"]:
                remote = s["remote"]
                peer = remote["peer"] if remote is not None else ("local" if s["consumed"] else "")
                yield [env, pid, str(s["index"]), peer], s
    elif labels == GATE:
        for name, g in m["gates"].items():
            yield [env, name], g
    elif labels == RANK:
        rank = m.get("rank")
        if rank is not None:
            yield [env, str(rank["rank"])], rank
    elif labels == CHAN:
        for name, g in m["gates"].items():
            for c in g["channels"]:
                spec = c["spec"]
                yield (
                    [
                        env,
                        name,
                        str(c["index"]),
                        spec["address"],
                        spec["partition_id"],
                        str(spec["subpartition"]),
                    ],
                    c,
                )


def families(*metrics: EnvMetrics | ReceiverMetrics | ServiceMetrics) -> list[Metric]:
    """The Prometheus metric families of ``env.metrics()`` (or ``Receiver.metrics()``) dicts,
    or of a host service's ``metrics()`` with its ``environment_metrics()``: every family once,
    with the samples of every dict."""
    out: list[Metric] = []
    for f in FAMILIES:
        fam: GaugeMetricFamily | CounterMetricFamily
        if f.kind == "counter":
            fam = CounterMetricFamily(f.name, f.help, labels=list(f.labels))
        else:
            fam = GaugeMetricFamily(f.name, f.help, labels=list(f.labels))
        for m in metrics:
            for values, d in _rows(m, f.labels):
                v = f.value(d)
                if v is not None:
                    fam.add_metric(values, v)
        out.append(fam)
    return out


class CreditflowCollector(Collector):
    """A ``prometheus_client`` collector reading an environment's (or a receiver's) metrics
    on each scrape.

    Holds the source weakly: once it is garbage-collected or closed, scrapes return no
    samples.
    """

    def __init__(self, env: Source) -> None:
        self._env = weakref.ref(env)

    def collect(self) -> Iterator[Metric]:
        """The current metric families (empty when the environment is gone or closed)."""
        env = self._env()
        if env is None or env.closed:
            return iter(())
        environment: Callable[[], EnvMetrics] | None = getattr(env, "environment_metrics", None)
        if environment is not None:  # a host service: its environment's families too
            return iter(families(env.metrics(), environment()))
        return iter(families(env.metrics()))


def register(env: Source, registry: CollectorRegistry = REGISTRY) -> CreditflowCollector:
    """Adds a collector of ``env``'s metrics to ``registry`` (the default registry unless
    given) and returns it (``registry.unregister(collector)`` removes it)."""
    collector = CreditflowCollector(env)
    registry.register(collector)
    return collector


class MetricsServer:
    """A standalone ``/metrics`` HTTP endpoint serving one environment (see
    ``NetworkEnvironment.serve_metrics``). Stops with :meth:`close` or when the environment
    closes."""

    def __init__(self, env: Source, port: int = 0, addr: str = "127.0.0.1") -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        self.registry = CollectorRegistry(auto_describe=False)
        register(env, self.registry)
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        self._closed = False
        self._lock = threading.Lock()
        host, bound_port = self._server.server_address[:2]
        self.host: str = str(host)
        self.port: int = int(bound_port)

    @property
    def url(self) -> str:
        """``http://host:port/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the server listens on."""
        return (self.host, self.port)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Stops serving and closes the socket. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if sys.is_finalizing():
            # An environment left open until interpreter shutdown: the serving thread may
            # already be frozen, so waiting for it would hang; the socket dies with the process.
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_args: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MetricsServer(url={self.url!r}, closed={self._closed})"


def serve(env: Source, port: int = 0, addr: str = "127.0.0.1") -> MetricsServer:
    """Serves ``env``'s metrics at ``http://addr:port/metrics``; prefer ``env.serve_metrics``,
    which also stops the server when the environment closes."""
    return MetricsServer(env, port, addr)
