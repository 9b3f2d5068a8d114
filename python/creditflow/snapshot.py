"""Reading metrics back: snapshots of one or more environments, rates between two
snapshots, per-task summaries and the bottleneck (used by ``creditflow top`` and
:mod:`creditflow.charts`).

A *task* here is one environment (one process, one ``/metrics`` endpoint), named by its
address. Its upstream tasks are known from its gates' channels: each channel's ``peer``
label is the producing environment's address and its ``partition`` label the partition
it reads, which that environment exports under the same ``partition`` label.

A task is **the bottleneck** when it is busy (more than half of the last second neither
waiting for input nor for an output buffer) and not backpressured itself (level OK),
while at least one of its upstream tasks is backpressured (LOW or HIGH): the upstream
waits for it, and it does not wait for anyone.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from creditflow.prometheus import LEVELS, families

if TYPE_CHECKING:
    from creditflow._native import NetworkEnvironment

__all__ = [
    "BUSY_THRESHOLD",
    "GateView",
    "PartitionView",
    "Snapshot",
    "TaskView",
    "View",
    "from_env",
    "from_text",
    "level_of",
    "scrape",
    "summarize",
]

#: A task busier than this share of a second counts as busy.
BUSY_THRESHOLD = 0.5

_NAMES = {v: k for k, v in LEVELS.items()}


def level_of(backpressured_ratio: float) -> str:
    """Flink's level for a share of time backpressured: OK <= 0.1 < LOW <= 0.5 < HIGH."""
    if backpressured_ratio <= 0.10:
        return "OK"
    if backpressured_ratio <= 0.50:
        return "LOW"
    return "HIGH"


@dataclass
class Partition:
    """One partition's raw numbers in a snapshot."""

    env: str
    partition: str
    bytes_written: float = 0.0
    rows_written: float = 0.0
    out_pool_usage: float = 0.0
    backpressured: float = 0.0
    level: str = "OK"


@dataclass
class Gate:
    """One gate's raw numbers in a snapshot."""

    env: str
    gate: str
    bytes_received: float = 0.0
    rows_received: float = 0.0
    in_pool_usage: float = 0.0
    idle: float = 0.0
    upstream: set[tuple[str, str]] = field(default_factory=set)  # (env, partition)


@dataclass
class Snapshot:
    """Metrics of some environments at one moment."""

    time: float
    partitions: dict[tuple[str, str], Partition] = field(default_factory=dict)
    gates: dict[tuple[str, str], Gate] = field(default_factory=dict)

    def merge(self, other: Snapshot) -> Snapshot:
        """This snapshot plus another one's objects (time: the later one)."""
        return Snapshot(
            max(self.time, other.time),
            {**self.partitions, **other.partitions},
            {**self.gates, **other.gates},
        )

    @property
    def envs(self) -> list[str]:
        """Addresses of the environments seen, sorted."""
        return sorted({k[0] for k in self.partitions} | {k[0] for k in self.gates})


Sample = tuple[str, dict[str, str], float]


#: Sample name → attribute of :class:`Partition` / :class:`Gate` it sets.
_PARTITION_ATTRS = {
    "creditflow_partition_written_bytes_total": "bytes_written",
    "creditflow_partition_written_rows_total": "rows_written",
    "creditflow_partition_out_pool_usage_ratio": "out_pool_usage",
    "creditflow_partition_backpressured_ratio": "backpressured",
}
_GATE_ATTRS = {
    "creditflow_gate_received_bytes_total": "bytes_received",
    "creditflow_gate_received_rows_total": "rows_received",
    "creditflow_gate_in_pool_usage_ratio": "in_pool_usage",
    "creditflow_gate_idle_ratio": "idle",
}


def _from_samples(samples: Iterable[Sample], at: float) -> Snapshot:
    snap = Snapshot(at)
    for name, labels, value in samples:
        if name in _PARTITION_ATTRS or name == "creditflow_partition_backpressure_level":
            key = (labels["env"], labels["partition"])
            p = snap.partitions.setdefault(key, Partition(*key))
            if name in _PARTITION_ATTRS:
                setattr(p, _PARTITION_ATTRS[name], value)
            else:
                p.level = _NAMES.get(int(value), "OK")
        elif name in _GATE_ATTRS or name == "creditflow_channel_received_bytes_total":
            key = (labels["env"], labels["gate"])
            g = snap.gates.setdefault(key, Gate(*key))
            if name in _GATE_ATTRS:
                setattr(g, _GATE_ATTRS[name], value)
            else:  # a channel: the gate reads `partition` of the environment at `peer`
                g.upstream.add((labels["peer"], labels["partition"]))
    return snap


def from_text(text: str, at: float | None = None) -> Snapshot:
    """A snapshot from a ``/metrics`` page (Prometheus text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = (
        (s.name, dict(s.labels), float(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    )
    return _from_samples(samples, time.monotonic() if at is None else at)


def from_env(env: NetworkEnvironment, at: float | None = None) -> Snapshot:
    """A snapshot of an environment in this process (``env.metrics()``)."""
    metrics = env.metrics()
    samples = ((s.name, dict(s.labels), float(s.value)) for fam in families(metrics) for s in fam.samples)
    return _from_samples(samples, time.monotonic() if at is None else at)


def scrape(url: str, timeout: float = 2.0) -> Snapshot:
    """A snapshot from a ``/metrics`` URL (``http://`` is added when missing, and
    ``/metrics`` when the URL has no path)."""
    if "://" not in url:
        url = "http://" + url
    if url.count("/") == 2:
        url += "/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode("utf-8")
    return from_text(text)


@dataclass
class PartitionView:
    """A partition between two snapshots."""

    env: str
    partition: str
    bytes_per_second: float
    rows_per_second: float
    out_pool_usage: float
    backpressured: float
    level: str


@dataclass
class GateView:
    """A gate between two snapshots."""

    env: str
    gate: str
    bytes_per_second: float
    rows_per_second: float
    in_pool_usage: float
    idle: float
    upstream_envs: list[str]


@dataclass
class TaskView:
    """One environment (task) between two snapshots."""

    env: str
    backpressured: float
    idle: float
    busy: float
    level: str
    upstream: list[str]
    bottleneck: bool = False


@dataclass
class View:
    """Everything ``top`` shows and the recorder keeps, for one interval."""

    time: float
    tasks: list[TaskView]
    partitions: list[PartitionView]
    gates: list[GateView]

    @property
    def bottlenecks(self) -> list[str]:
        """Addresses of the tasks marked as bottleneck."""
        return [t.env for t in self.tasks if t.bottleneck]


def _rate(cur: float, prev: float | None, dt: float) -> float:
    if prev is None or dt <= 0 or cur < prev:
        return 0.0
    return (cur - prev) / dt


def summarize(prev: Snapshot | None, cur: Snapshot) -> View:
    """Rates, per-task levels and the bottleneck between two snapshots (``prev`` may be
    ``None``: rates are then 0)."""
    dt = cur.time - prev.time if prev is not None else 0.0
    parts = []
    for key, p in sorted(cur.partitions.items()):
        old = prev.partitions.get(key) if prev is not None else None
        parts.append(
            PartitionView(
                p.env,
                p.partition,
                _rate(p.bytes_written, old.bytes_written if old else None, dt),
                _rate(p.rows_written, old.rows_written if old else None, dt),
                p.out_pool_usage,
                p.backpressured,
                p.level,
            )
        )
    gates = []
    for key, g in sorted(cur.gates.items()):
        old_g = prev.gates.get(key) if prev is not None else None
        gates.append(
            GateView(
                g.env,
                g.gate,
                _rate(g.bytes_received, old_g.bytes_received if old_g else None, dt),
                _rate(g.rows_received, old_g.rows_received if old_g else None, dt),
                g.in_pool_usage,
                g.idle,
                sorted({e for e, _ in g.upstream}),
            )
        )
    tasks = []
    for env in cur.envs:
        bp = max((p.backpressured for p in parts if p.env == env), default=0.0)
        env_gates = [g for g in gates if g.env == env]
        idle = min((g.idle for g in env_gates), default=0.0)
        upstream = sorted({u for g in env_gates for u in g.upstream_envs if u != env})
        tasks.append(TaskView(env, bp, idle, max(0.0, 1.0 - bp - idle), level_of(bp), upstream))
    levels = {t.env: t.level for t in tasks}
    for t in tasks:
        upstream_backpressured = any(levels.get(u, "OK") != "OK" for u in t.upstream)
        t.bottleneck = t.level == "OK" and t.busy > BUSY_THRESHOLD and upstream_backpressured
    return View(cur.time, tasks, parts, gates)
