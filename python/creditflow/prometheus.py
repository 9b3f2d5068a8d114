"""Prometheus export of an environment's metrics (needs ``pip install creditflow[metrics]``).

:func:`register` adds a collector that reads ``env.metrics()`` on every scrape (nothing is
sampled in between); ``env.serve_metrics(port)`` serves one environment at ``/metrics`` on
its own registry and stops when the environment closes. Family names and labels are listed
in :data:`FAMILIES` and in the README ("Metrics reference").
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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

    from creditflow._native import NetworkEnvironment

__all__ = ["FAMILIES", "LEVELS", "CreditflowCollector", "MetricsServer", "register", "serve"]

#: Backpressure levels as exported by ``creditflow_partition_backpressure_level``.
LEVELS = {"OK": 0, "LOW": 1, "HIGH": 2}

Dict = dict[str, Any]


@dataclass(frozen=True)
class Family:
    """One exported metric family: where its values come from."""

    name: str
    kind: str  # "gauge" or "counter" (counters are exposed with a `_total` suffix)
    help: str
    labels: tuple[str, ...]
    value: Callable[[Dict], float | None]


ENV = ("env",)
PART = ("env", "partition")
SUB = ("env", "partition", "subpartition", "peer")
GATE = ("env", "gate")
CHAN = ("env", "gate", "channel", "peer", "partition", "subpartition")


def _get(key: str) -> Callable[[Dict], float | None]:
    def read(d: Dict) -> float | None:
        v = d.get(key)
        return None if v is None else float(v)

    return read


def _ms(key: str) -> Callable[[Dict], float | None]:
    def read(d: Dict) -> float | None:
        return float(d[key]) / 1000.0

    return read


def _pool(key: str) -> Callable[[Dict], float | None]:
    def read(d: Dict) -> float | None:
        pool = d.get("out_pool") or d.get("in_pool") or {}
        v = pool.get(key)
        return None if v is None else float(v)

    return read


def _sum_backlog(d: Dict) -> float:
    return float(sum(d["backlog"]))


FAMILIES: tuple[Family, ...] = (
    # environment
    Family("creditflow_segments", "gauge", "Segments of the network memory", ENV, _get("segments_total")),
    Family(
        "creditflow_segments_available", "gauge", "Segments not in any pool", ENV, _get("segments_available")
    ),
    Family("creditflow_segment_size_bytes", "gauge", "Bytes per segment", ENV, _get("segment_size")),
    # partitions
    Family(
        "creditflow_partition_out_pool_usage_ratio",
        "gauge",
        "Output pool segments in use / pool share",
        PART,
        _get("out_pool_usage"),
    ),
    Family(
        "creditflow_partition_out_pool_in_use_segments",
        "gauge",
        "Output pool segments in use",
        PART,
        _pool("in_use"),
    ),
    Family(
        "creditflow_partition_backlog_buffers",
        "gauge",
        "Finished buffers waiting in all subpartitions",
        PART,
        _sum_backlog,
    ),
    Family(
        "creditflow_partition_written_batches", "counter", "Batches written", PART, _get("batches_written")
    ),
    Family(
        "creditflow_partition_written_buffers", "counter", "Buffers published", PART, _get("buffers_written")
    ),
    Family(
        "creditflow_partition_written_bytes", "counter", "Arrow bytes written", PART, _get("bytes_written")
    ),
    Family("creditflow_partition_written_rows", "counter", "Rows written", PART, _get("rows_written")),
    Family(
        "creditflow_partition_backpressured_ratio",
        "gauge",
        "Share of the last second writers waited for a buffer",
        PART,
        _ms("backpressured_time_ms_per_second"),
    ),
    Family(
        "creditflow_partition_backpressured_seconds",
        "counter",
        "Time writers waited for a buffer",
        PART,
        _get("backpressured_seconds_total"),
    ),
    Family(
        "creditflow_partition_busy_ratio",
        "gauge",
        "Share of the last second writers were not waiting for a buffer",
        PART,
        _ms("busy_time_ms_per_second"),
    ),
    Family(
        "creditflow_partition_backpressure_level",
        "gauge",
        "0 = OK (<= 10% backpressured), 1 = LOW (<= 50%), 2 = HIGH",
        PART,
        lambda d: float(LEVELS[d["backpressure_level"]]),
    ),
    # subpartitions
    Family(
        "creditflow_subpartition_backlog_buffers",
        "gauge",
        "Finished buffers waiting for the reader",
        SUB,
        _get("backlog"),
    ),
    Family(
        "creditflow_subpartition_out_buffers", "counter", "Buffers the reader took", SUB, _get("buffers_out")
    ),
    Family("creditflow_subpartition_out_bytes", "counter", "Bytes the reader took", SUB, _get("bytes_out")),
    Family(
        "creditflow_subpartition_credit_buffers",
        "gauge",
        "Remote reader: buffers the sender may still send",
        SUB,
        _get("credit"),
    ),
    Family(
        "creditflow_subpartition_sent_buffers",
        "counter",
        "Remote reader: data buffers written to the connection",
        SUB,
        _get("buffers_sent"),
    ),
    Family(
        "creditflow_subpartition_sent_bytes",
        "counter",
        "Remote reader: payload bytes written to the connection",
        SUB,
        _get("bytes_sent"),
    ),
    # gates
    Family(
        "creditflow_gate_in_pool_usage_ratio",
        "gauge",
        "Input pool segments in use / pool share",
        GATE,
        _get("in_pool_usage"),
    ),
    Family(
        "creditflow_gate_in_pool_in_use_segments",
        "gauge",
        "Input pool segments in use",
        GATE,
        _pool("in_use"),
    ),
    Family(
        "creditflow_gate_exclusive_buffers",
        "gauge",
        "Exclusive buffers of open remote channels",
        GATE,
        _get("exclusive_buffers"),
    ),
    Family(
        "creditflow_gate_exclusive_in_use_buffers",
        "gauge",
        "Exclusive buffers holding unread data",
        GATE,
        _get("exclusive_in_use"),
    ),
    Family("creditflow_gate_floating_buffers", "gauge", "Floating buffers", GATE, _get("floating_buffers")),
    Family(
        "creditflow_gate_floating_in_use_buffers",
        "gauge",
        "Floating buffers assigned to channels",
        GATE,
        _get("floating_in_use"),
    ),
    Family(
        "creditflow_gate_credit_outstanding_buffers",
        "gauge",
        "Empty buffers announced to senders",
        GATE,
        _get("credit_outstanding"),
    ),
    Family(
        "creditflow_gate_queued_buffers",
        "gauge",
        "Received buffers not yet read",
        GATE,
        _get("queued_buffers"),
    ),
    Family(
        "creditflow_gate_queued_batches",
        "gauge",
        "Decoded batches not yet returned",
        GATE,
        _get("queued_batches"),
    ),
    Family("creditflow_gate_received_batches", "counter", "Batches received", GATE, _get("batches_received")),
    Family("creditflow_gate_received_buffers", "counter", "Buffers received", GATE, _get("buffers_received")),
    Family("creditflow_gate_received_bytes", "counter", "Arrow bytes received", GATE, _get("bytes_received")),
    Family("creditflow_gate_received_rows", "counter", "Rows received", GATE, _get("rows_received")),
    Family(
        "creditflow_gate_idle_ratio",
        "gauge",
        "Share of the last second the reader waited for data",
        GATE,
        _ms("idle_time_ms_per_second"),
    ),
    Family(
        "creditflow_gate_idle_seconds",
        "counter",
        "Time the reader waited for data",
        GATE,
        _get("idle_seconds_total"),
    ),
    Family(
        "creditflow_gate_busy_ratio",
        "gauge",
        "Share of the last second the reader was not waiting for data",
        GATE,
        _ms("busy_time_ms_per_second"),
    ),
    Family(
        "creditflow_gate_debloat_buffer_size_bytes",
        "gauge",
        "Buffer debloating: the buffer size last announced to the producers",
        GATE,
        _get("debloat_buffer_size"),
    ),
    Family(
        "creditflow_gate_debloat_throughput_bytes_per_second",
        "gauge",
        "Buffer debloating: smoothed bytes consumed per second not spent waiting for data",
        GATE,
        _get("debloat_throughput_bytes_per_second"),
    ),
    # channels
    Family(
        "creditflow_channel_received_batches", "counter", "Batches received", CHAN, _get("batches_received")
    ),
    Family(
        "creditflow_channel_received_buffers", "counter", "Buffers received", CHAN, _get("buffers_received")
    ),
    Family(
        "creditflow_channel_received_bytes", "counter", "Arrow bytes received", CHAN, _get("bytes_received")
    ),
    Family("creditflow_channel_received_rows", "counter", "Rows received", CHAN, _get("rows_received")),
    Family(
        "creditflow_channel_credit_outstanding_buffers",
        "gauge",
        "Remote channel: empty buffers announced to the sender",
        CHAN,
        _get("credit_outstanding"),
    ),
    Family(
        "creditflow_channel_queued_buffers",
        "gauge",
        "Remote channel: received buffers not yet read",
        CHAN,
        _get("queued_buffers"),
    ),
    Family(
        "creditflow_channel_exclusive_in_use_buffers",
        "gauge",
        "Remote channel: exclusive buffers holding unread data",
        CHAN,
        _get("exclusive_in_use"),
    ),
    Family(
        "creditflow_channel_floating_in_use_buffers",
        "gauge",
        "Remote channel: floating buffers assigned",
        CHAN,
        _get("floating_in_use"),
    ),
)


def _rows(m: Dict, labels: tuple[str, ...]) -> Iterator[tuple[list[str], Dict]]:
    """Yields (label values, dict) for every object a family with these labels describes."""
    env = str(m["address"])
    if labels == ENV:
        yield [env], m
    elif labels == PART:
        for pid, p in m["partitions"].items():
            yield [env, pid], p
    elif labels == SUB:
        for pid, p in m["partitions"].items():
            for s in p.get("subpartitions", []):
                yield [env, pid, str(s["index"]), s.get("peer") or ("local" if s["consumed"] else "")], s
    elif labels == GATE:
        for name, g in m["gates"].items():
            yield [env, name], g
    elif labels == CHAN:
        for name, g in m["gates"].items():
            for c in g.get("channels", []):
                yield [env, name, str(c["index"]), c["address"], c["partition_id"], str(c["subpartition"])], c


def families(metrics: Dict) -> list[Metric]:
    """The Prometheus metric families of one ``env.metrics()`` dict."""
    out: list[Metric] = []
    for f in FAMILIES:
        fam: GaugeMetricFamily | CounterMetricFamily
        if f.kind == "counter":
            fam = CounterMetricFamily(f.name, f.help, labels=list(f.labels))
        else:
            fam = GaugeMetricFamily(f.name, f.help, labels=list(f.labels))
        for values, d in _rows(metrics, f.labels):
            v = f.value(d)
            if v is not None:
                fam.add_metric(values, v)
        out.append(fam)
    return out


class CreditflowCollector(Collector):
    """A ``prometheus_client`` collector reading an environment's metrics on each scrape.

    Holds the environment weakly: once it is garbage-collected or closed, scrapes return
    no samples.
    """

    def __init__(self, env: NetworkEnvironment) -> None:
        self._env = weakref.ref(env)

    def collect(self) -> Iterator[Metric]:
        """The current metric families (empty when the environment is gone or closed)."""
        env = self._env()
        if env is None or env.closed:
            return iter(())
        return iter(families(env.metrics()))


def register(env: NetworkEnvironment, registry: CollectorRegistry = REGISTRY) -> CreditflowCollector:
    """Adds a collector of ``env``'s metrics to ``registry`` (the default registry unless
    given) and returns it (``registry.unregister(collector)`` removes it)."""
    collector = CreditflowCollector(env)
    registry.register(collector)
    return collector


class MetricsServer:
    """A standalone ``/metrics`` HTTP endpoint serving one environment (see
    ``NetworkEnvironment.serve_metrics``). Stops with :meth:`close` or when the environment
    closes."""

    def __init__(self, env: NetworkEnvironment, port: int = 0, addr: str = "127.0.0.1") -> None:
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


def serve(env: NetworkEnvironment, port: int = 0, addr: str = "127.0.0.1") -> MetricsServer:
    """Serves ``env``'s metrics at ``http://addr:port/metrics``; prefer ``env.serve_metrics``,
    which also stops the server when the environment closes."""
    return MetricsServer(env, port, addr)
