"""Reading metrics back: snapshots of one or more environments, rates between two
snapshots, per-task summaries and the bottleneck (used by ``creditflow top`` and
:mod:`creditflow.tools.charts`).

A *task* here is one environment (one process, one ``/metrics`` endpoint), named by its
address. Its upstream tasks are known from its gates' channels: each channel's ``peer``
label is the producing environment's address and its ``partition`` label the partition
it reads, which that environment exports under the same ``partition`` label.

A channel's ``peer`` normally is that environment's ``env`` label; when it is not (the
consumer reached the producer under another name), the channel is matched to the one
scraped environment that exports its partition. Each channel also gives the throughput of
its edge, producer → consumer (:class:`EdgeView`).

A task is **the bottleneck** when it is busy (more than half of the last second neither
waiting for input nor for an output buffer) and not backpressured itself (level OK),
while at least one of its upstream tasks is backpressured (LOW or HIGH): the upstream
waits for it, and it does not wait for anyone. Where tasks feed each other in a loop (an
all-to-all exchange) no task is free of backpressure; there the bottleneck is a
backpressured task whose reader is busy (waits for input less than half of the time)
while an upstream task is backpressured and every task it feeds is backpressured too.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from creditflow.metrics import BUSY_THRESHOLD, level_of
from creditflow.prometheus import LEVELS, families

if TYPE_CHECKING:
    from creditflow._native import NetworkEnvironment

__all__ = [
    "BUSY_THRESHOLD",
    "EdgeView",
    "GateView",
    "PartitionView",
    "Snapshot",
    "TaskView",
    "View",
    "from_env",
    "from_text",
    "level_of",
    "mark_bottlenecks",
    "per_second",
    "scrape",
    "scrape_all",
    "summarize",
]

_NAMES = {v: k for k, v in LEVELS.items()}


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
    #: Blocking/hybrid partitions only (None for pipelined ones): bytes spilled so far, and
    #: bytes the spill files hold now.
    spilled_bytes: float | None = None
    spill_disk_bytes: float | None = None


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
    #: Bytes and rows received from each (env, partition) it reads, over all its channels.
    channel_bytes: dict[tuple[str, str], float] = field(default_factory=dict)
    channel_rows: dict[tuple[str, str], float] = field(default_factory=dict)


@dataclass
class Snapshot:
    """Metrics of some environments at one moment."""

    time: float
    partitions: dict[tuple[str, str], Partition] = field(default_factory=dict)
    gates: dict[tuple[str, str], Gate] = field(default_factory=dict)
    #: The URL each environment was scraped from (by address; empty for ``from_env``).
    origin: dict[str, str] = field(default_factory=dict)

    def merge(self, other: Snapshot) -> Snapshot:
        """This snapshot plus another one's objects (time: the later one)."""
        return Snapshot(
            max(self.time, other.time),
            {**self.partitions, **other.partitions},
            {**self.gates, **other.gates},
            {**self.origin, **other.origin},
        )

    def names(self, by_url: dict[str, str]) -> dict[str, str]:
        """Display names by environment address, from names by the URL it was scraped from."""
        return {env: by_url[url] for env, url in self.origin.items() if url in by_url}

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
    "creditflow_partition_spilled_bytes_total": "spilled_bytes",
    "creditflow_partition_spill_disk_bytes": "spill_disk_bytes",
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
                _add(g.channel_bytes, (labels["peer"], labels["partition"]), value)
        elif name == "creditflow_channel_received_rows_total":
            g = snap.gates.setdefault((labels["env"], labels["gate"]), Gate(labels["env"], labels["gate"]))
            _add(g.channel_rows, (labels["peer"], labels["partition"]), value)
    return snap


def _add(totals: dict[tuple[str, str], float], key: tuple[str, str], value: float) -> None:
    totals[key] = totals.get(key, 0.0) + value


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
    ``/metrics`` when the URL has no path). Its ``origin`` names ``url`` as given."""
    given = url
    if "://" not in url:
        url = "http://" + url
    if url.count("/") == 2:
        url += "/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode("utf-8")
    snap = from_text(text)
    snap.origin = dict.fromkeys(snap.envs, given)
    return snap


def scrape_all(urls: Sequence[str], timeout: float = 2.0) -> tuple[Snapshot, dict[str, str]]:
    """One snapshot of every URL's environments, and the URLs that could not be scraped
    with the reason."""
    snap = Snapshot(time.monotonic())
    errors: dict[str, str] = {}
    for url in urls:
        try:
            snap = snap.merge(scrape(url, timeout=timeout))
        except (OSError, ValueError) as e:
            errors[url] = f"unreachable ({e})"
    return snap, errors


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
    #: Blocking/hybrid partitions only (None for pipelined ones): bytes spilled per second,
    #: and bytes the spill files hold now.
    spilled_per_second: float | None = None
    spill_disk_bytes: float | None = None


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
class EdgeView:
    """What one gate read from one partition of another environment between two snapshots
    (over all channels of that gate reading that partition)."""

    producer: str
    partition: str
    consumer: str
    gate: str
    bytes_per_second: float
    rows_per_second: float


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
    #: Why it is (or is not) the bottleneck, in words (:func:`mark_bottlenecks`).
    reason: str = ""


@dataclass
class View:
    """Everything ``top`` shows and the recorder keeps, for one interval."""

    time: float
    tasks: list[TaskView]
    partitions: list[PartitionView]
    gates: list[GateView]
    edges: list[EdgeView] = field(default_factory=list)

    @property
    def bottlenecks(self) -> list[str]:
        """Addresses of the tasks marked as bottleneck."""
        return [t.env for t in self.tasks if t.bottleneck]


def per_second(cur: float, prev: float | None, dt: float) -> float:
    """The rate of a counter that went from ``prev`` to ``cur`` in ``dt`` seconds (0 without a
    previous value, or when it went back: a restarted process)."""
    if prev is None or dt <= 0 or cur < prev:
        return 0.0
    return (cur - prev) / dt


def _producers(snap: Snapshot) -> dict[tuple[str, str], str]:
    """The environment behind each (peer, partition) a gate reads: the peer itself when it
    was scraped, else the one scraped environment exporting that partition, else the peer."""
    scraped = set(snap.envs)
    exporters: dict[str, set[str]] = {}
    for env, pid in snap.partitions:
        exporters.setdefault(pid, set()).add(env)
    out: dict[tuple[str, str], str] = {}
    for g in snap.gates.values():
        for peer, pid in g.upstream:
            found = exporters.get(pid, set())
            out[(peer, pid)] = peer if peer in scraped or len(found) != 1 else next(iter(found))
    return out


def summarize(prev: Snapshot | None, cur: Snapshot) -> View:
    """Rates, per-task levels and the bottleneck between two snapshots (``prev`` may be
    ``None``: rates are then 0)."""
    dt = cur.time - prev.time if prev is not None else 0.0
    producer = _producers(cur)
    parts = []
    for key, p in sorted(cur.partitions.items()):
        old = prev.partitions.get(key) if prev is not None else None
        parts.append(
            PartitionView(
                p.env,
                p.partition,
                per_second(p.bytes_written, old.bytes_written if old else None, dt),
                per_second(p.rows_written, old.rows_written if old else None, dt),
                p.out_pool_usage,
                p.backpressured,
                p.level,
                None
                if p.spilled_bytes is None
                else per_second(p.spilled_bytes, old.spilled_bytes if old else None, dt),
                p.spill_disk_bytes,
            )
        )
    gates = []
    edges = []
    for key, g in sorted(cur.gates.items()):
        old_g = prev.gates.get(key) if prev is not None else None
        gates.append(
            GateView(
                g.env,
                g.gate,
                per_second(g.bytes_received, old_g.bytes_received if old_g else None, dt),
                per_second(g.rows_received, old_g.rows_received if old_g else None, dt),
                g.in_pool_usage,
                g.idle,
                sorted({producer[u] for u in g.upstream}),
            )
        )
        for peer, pid in sorted(g.upstream):
            edges.append(
                EdgeView(
                    producer[(peer, pid)],
                    pid,
                    g.env,
                    g.gate,
                    per_second(
                        g.channel_bytes.get((peer, pid), 0.0),
                        old_g.channel_bytes.get((peer, pid)) if old_g else None,
                        dt,
                    ),
                    per_second(
                        g.channel_rows.get((peer, pid), 0.0),
                        old_g.channel_rows.get((peer, pid)) if old_g else None,
                        dt,
                    ),
                )
            )
    tasks = []
    for env in cur.envs:
        bp = max((p.backpressured for p in parts if p.env == env), default=0.0)
        env_gates = [g for g in gates if g.env == env]
        idle = min((g.idle for g in env_gates), default=0.0)
        upstream = sorted({u for g in env_gates for u in g.upstream_envs if u != env})
        tasks.append(TaskView(env, bp, idle, max(0.0, 1.0 - bp - idle), level_of(bp), upstream))
    mark_bottlenecks(tasks)
    return View(cur.time, tasks, parts, gates, edges)


def _pct(ratio: float) -> str:
    return f"{100 * ratio:.0f}%"


def _on_a_cycle(start: str, feeds: dict[str, list[str]]) -> bool:
    """Whether ``start`` feeds, directly or through others, back into itself."""
    seen: set[str] = set()
    todo = list(feeds.get(start, []))
    while todo:
        env = todo.pop()
        if env == start:
            return True
        if env not in seen:
            seen.add(env)
            todo.extend(feeds.get(env, []))
    return False


def mark_bottlenecks(tasks: Sequence[TaskView]) -> None:
    """Sets ``bottleneck`` and ``reason`` of every task by the rule in the module docs
    (upstream tasks missing from ``tasks`` count as OK). In a loop only the busiest reader
    is marked (the others read as fast as it lets them)."""
    levels = {t.env: t.level for t in tasks}
    rank = {"OK": 0, "LOW": 1, "HIGH": 2}
    feeds: dict[str, list[str]] = {t.env: [] for t in tasks}
    for t in tasks:
        for u in t.upstream:
            feeds.setdefault(u, []).append(t.env)
    pushing = {t.env: [levels[u] for u in t.upstream if levels.get(u, "OK") != "OK"] for t in tasks}
    in_loop = [
        t
        for t in tasks
        if t.level != "OK"
        and 1.0 - t.idle > BUSY_THRESHOLD
        and pushing[t.env]
        and all(levels.get(d, "OK") != "OK" for d in feeds[t.env])
        and _on_a_cycle(t.env, feeds)
    ]
    busiest = min((t.idle for t in in_loop), default=1.0)
    for t in tasks:
        upstream = f"its upstream is {max(pushing[t.env], key=rank.__getitem__, default='OK')}"
        if t.level == "OK" and t.busy > BUSY_THRESHOLD and pushing[t.env]:
            t.bottleneck = True
            t.reason = f"busy {_pct(t.busy)}, not backpressured; {upstream}"
        elif t in in_loop and t.idle == busiest:
            t.bottleneck = True
            t.reason = (
                f"busy reading {_pct(1.0 - t.idle)} (waits for input {_pct(t.idle)}); {upstream}, and every "
                "task it feeds is backpressured too (a loop, as in an all-to-all exchange)"
            )
        else:
            t.bottleneck = False
            if t.level != "OK":
                t.reason = f"backpressured {_pct(t.backpressured)}: waits for buffers its downstream frees"
            elif t.idle > BUSY_THRESHOLD:
                t.reason = f"idle {_pct(t.idle)}: waits for input"
            else:
                t.reason = f"busy {_pct(t.busy)}" + (", keeps up with its input" if t.upstream else "")
