"""The pipeline as a graph: what the page of ``creditflow top --web`` and
``creditflow.spark.Monitor(web=...)`` draws, and what ``/api/pipeline`` returns.

One :class:`Node` per task (an environment scraped from ``/metrics``, or a Spark task), with
its partitions and gates inside; one :class:`Edge` per producer → consumer pair with the
throughput between them. Levels and the bottleneck follow :mod:`creditflow.tools.snapshot` (the
rule ``creditflow top`` applies), with the reason in words. Nodes carry a ``layer`` and a
``row`` for a left-to-right drawing: tasks that feed each other in a loop (an all-to-all
exchange) share a column, the others stand one column right of their rightmost upstream.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from creditflow.samples import TaskSample
from creditflow.tools.snapshot import BUSY_THRESHOLD, TaskView, View, level_of, mark_bottlenecks, per_second

__all__ = ["Edge", "Node", "Pipeline", "from_spark", "from_view", "layout"]


@dataclass
class Node:
    """One task of the pipeline."""

    id: str
    name: str
    level: str = "OK"
    backpressured: float = 0.0
    idle: float = 0.0
    busy: float = 0.0
    #: Highest usage of its partitions' output pools and of its gates' input pools (``None``:
    #: it has none).
    out_pool_usage: float | None = None
    in_pool_usage: float | None = None
    bytes_out_per_second: float = 0.0
    bytes_in_per_second: float = 0.0
    rows_out_per_second: float = 0.0
    rows_in_per_second: float = 0.0
    partitions: list[str] = field(default_factory=list)
    gates: list[str] = field(default_factory=list)
    bottleneck: bool = False
    reason: str = ""
    #: False for a peer known only from a consumer's channels (its endpoint was not given).
    scraped: bool = True
    done: bool = False
    layer: int = 0
    row: int = 0


@dataclass
class Edge:
    """Data flowing from one task to another, over all the partitions between them."""

    source: str
    target: str
    partitions: list[str]
    bytes_per_second: float = 0.0
    rows_per_second: float = 0.0


@dataclass
class Pipeline:
    """Nodes and edges at one moment, the bottleneck, and the sources that failed."""

    title: str
    nodes: list[Node]
    edges: list[Edge]
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def levels(self) -> dict[str, str]:
        """Level of every node, by id."""
        return {n.id: n.level for n in self.nodes}

    @property
    def bottlenecks(self) -> list[Node]:
        """The nodes marked as bottleneck."""
        return [n for n in self.nodes if n.bottleneck]

    def to_json(self) -> dict[str, Any]:
        """What ``/api/pipeline`` returns: ``title``, ``nodes``, ``edges``, ``levels`` (by node
        id), ``bottleneck`` (``[{"id", "name", "reason"}]``, empty when there is none) and
        ``errors`` (by source)."""
        return {
            "title": self.title,
            "nodes": [asdict(n) for n in self.nodes],
            "edges": [asdict(e) for e in self.edges],
            "levels": self.levels,
            "bottleneck": [{"id": n.id, "name": n.name, "reason": n.reason} for n in self.bottlenecks],
            "errors": dict(self.errors),
        }


# ------------------------------------------------------------------------------------- layout


def _components(ids: Sequence[str], succ: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Strongly connected components (Tarjan, iterative): node → component number, numbered
    in reverse topological order of the condensed graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    comp: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    count = 0
    for root in ids:
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, list(succ.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, list(succ.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp[member] = count
                    if member == node:
                        break
                count += 1
    return comp


def layout(nodes: Sequence[Node], edges: Sequence[Edge]) -> None:
    """Sets ``layer`` (column, left to right) and ``row`` of every node: a loop of tasks
    feeding each other shares a column; any other task stands one column right of its
    rightmost upstream; rows follow the upstream's rows, then the names."""
    ids = [n.id for n in nodes]
    succ: dict[str, set[str]] = {i: set() for i in ids}
    for e in edges:
        if e.source in succ and e.target in succ and e.source != e.target:
            succ[e.source].add(e.target)
    comp = _components(ids, {k: sorted(v) for k, v in succ.items()})
    # Tarjan numbers components in reverse topological order: walk them from the highest.
    layer_of_comp: dict[int, int] = {}
    for c in sorted(set(comp.values()), reverse=True):
        members = [i for i in ids if comp[i] == c]
        preds = {comp[p] for p in ids for m in members if m in succ[p] and comp[p] != c}
        layer_of_comp[c] = max((layer_of_comp[p] + 1 for p in preds), default=0)
    by_id = {n.id: n for n in nodes}
    for n in nodes:
        n.layer = layer_of_comp[comp[n.id]]

    def key(n: Node) -> tuple[float, str]:
        rows = [by_id[p].row for p in ids if n.id in succ[p] and by_id[p].layer < n.layer]
        return (sum(rows) / len(rows) if rows else 0.0, n.name)

    for layer in sorted({n.layer for n in nodes}):  # left to right: the upstream rows are set
        for row, n in enumerate(sorted((n for n in nodes if n.layer == layer), key=key)):
            n.row = row


# ---------------------------------------------------------------------------------- builders


def _node_from_task(t: TaskView, name: str) -> Node:
    return Node(
        id=t.env,
        name=name,
        level=t.level,
        backpressured=t.backpressured,
        idle=t.idle,
        busy=t.busy,
        bottleneck=t.bottleneck,
        reason=t.reason,
    )


def from_view(
    view: View,
    names: Mapping[str, str] | None = None,
    errors: Mapping[str, str] | None = None,
    title: str = "creditflow pipeline",
) -> Pipeline:
    """The graph of a :class:`~creditflow.tools.snapshot.View` of scraped environments. ``names``:
    display names by environment address (default: the address). A peer read by a gate
    whose endpoint was not scraped becomes a node with ``scraped=False``."""
    names = names or {}
    nodes = {t.env: _node_from_task(t, names.get(t.env, t.env)) for t in view.tasks}
    for p in view.partitions:
        n = nodes[p.env]
        n.partitions.append(p.partition)
        n.out_pool_usage = max(n.out_pool_usage or 0.0, p.out_pool_usage)
        n.bytes_out_per_second += p.bytes_per_second
        n.rows_out_per_second += p.rows_per_second
    for g in view.gates:
        n = nodes[g.env]
        n.gates.append(g.gate)
        n.in_pool_usage = max(n.in_pool_usage or 0.0, g.in_pool_usage)
        n.bytes_in_per_second += g.bytes_per_second
        n.rows_in_per_second += g.rows_per_second
    edges: dict[tuple[str, str], Edge] = {}
    for ev in view.edges:
        if ev.producer == ev.consumer:
            continue  # a task reading its own partition: inside the node
        if ev.producer not in nodes:
            nodes[ev.producer] = Node(
                ev.producer,
                names.get(ev.producer, ev.producer),
                scraped=False,
                reason="not scraped: give its /metrics endpoint too",
            )
        e = edges.setdefault((ev.producer, ev.consumer), Edge(ev.producer, ev.consumer, []))
        if ev.partition not in e.partitions:
            e.partitions.append(ev.partition)
        e.bytes_per_second += ev.bytes_per_second
        e.rows_per_second += ev.rows_per_second
    pipeline = Pipeline(title, list(nodes.values()), list(edges.values()), dict(errors or {}))
    layout(pipeline.nodes, pipeline.edges)
    return pipeline


def _change(cur: TaskSample, prev: TaskSample | None, key: str) -> float:
    """Per second, how much ``key`` of a task's samples grew from ``prev`` to ``cur``."""
    if prev is None:
        return 0.0
    return per_second(float(getattr(cur, key)), float(getattr(prev, key)), cur.time - prev.time)


def _mark_hot_consumers(nodes: Sequence[Node], tasks: Sequence[TaskView], exchanges: Iterable[str]) -> None:
    """In an exchange where some task is backpressured, the busy task that receives the most
    bytes per second is the bottleneck. Backpressure paces every producer by the slowest
    reader, so each task receives at the rate of its share: the hot key's task receives the
    most, and its own writer is HIGH too (it writes to itself), so the rule of
    :func:`mark_bottlenecks` would name a busy task that merely waits for it. Needs rates
    (a previous sample); without them the general rule stands."""
    views = {t.env: t for t in tasks}
    for job in exchanges:
        members = [n for n in nodes if n.id.startswith(f"{job}/") and n.id in views and not n.done]
        if not any(views[n.id].level != "OK" for n in members):
            continue
        busy = [n for n in members if 1.0 - views[n.id].idle > BUSY_THRESHOLD and n.bytes_in_per_second > 0]
        if not busy:
            continue
        hot = max(busy, key=lambda n: n.bytes_in_per_second)
        rates = sorted(n.bytes_in_per_second for n in members)
        median = rates[len(rates) // 2] or hot.bytes_in_per_second
        for n in members:
            view = views[n.id]
            if n is hot:
                view.bottleneck = True
                view.reason = (
                    f"busy reading {round(100 * (1.0 - view.idle))}% and receiving the most "
                    f"({hot.bytes_in_per_second / 1e6:.1f} MB/s, {hot.bytes_in_per_second / median:.1f}x the "
                    "median): the backpressured producers wait for it (a hot key?)"
                )
            elif view.bottleneck:
                view.bottleneck = False
                view.reason = f"waits for {hot.name}, which receives the most"


def _mark_send_bottleneck(nodes: Sequence[Node]) -> None:
    """A send to ranks: whether Spark or the trainer holds the job back. Ranks that wait for
    data (their stall, as idle time) most of each second while the tasks are not
    backpressured wait for Spark: the busiest task is the bottleneck. Tasks backpressured
    most of each second (as the tasks or the ranks, whose queues hold them back, say) wait
    for the ranks: the rank that stalls least (the slowest trainer) is. Otherwise neither
    waits much, and nothing is marked."""
    ranks = [n for n in nodes if "/rank" in n.id and not n.done]
    senders = [n for n in nodes if "/rank" not in n.id and n.scraped and not n.done]
    if not ranks or not senders:
        return
    stall = max(n.idle for n in ranks)
    pressed = max(n.backpressured for n in senders + ranks)
    for n in nodes:
        n.bottleneck = False
    if pressed > BUSY_THRESHOLD:
        slow = min(ranks, key=lambda n: n.idle)
        slow.bottleneck = True
        slow.reason = (
            f"the trainer: the tasks wait for {slow.name} {round(100 * pressed)}% of each second "
            f"(it waits for data {round(100 * slow.idle)}%)"
        )
    elif stall > BUSY_THRESHOLD:
        busy = max(senders, key=lambda n: n.busy)
        busy.bottleneck = True
        busy.reason = (
            f"Spark: the ranks wait for data up to {round(100 * stall)}% of each second, the tasks "
            f"are backpressured {round(100 * pressed)}%"
        )


def from_spark(
    latest: Sequence[TaskSample],
    previous: Mapping[tuple[str, str, int], TaskSample] | None = None,
    title: str = "creditflow.spark",
) -> Pipeline:
    """The graph of Spark tasks from :class:`creditflow.spark.Monitor` samples: ``latest``
    holds the newest sample of each task, ``previous`` an older one by :attr:`TaskSample.key` (rates
    are over the time between the two). An ``exchange`` is all-to-all between its tasks
    (each edge's throughput from the reading task's channels); the tasks of a ``send`` feed
    its receiver, or each of its ranks (whose samples, kind ``"rank"``, carry their data
    stall as idle time: see :func:`_mark_send_bottleneck`)."""
    previous = previous or {}
    jobs = sorted({s.job for s in latest})
    nodes: list[Node] = []
    edges: list[Edge] = []
    tasks: list[TaskView] = []
    for job in jobs:
        ranks = sorted((s for s in latest if s.job == job and s.kind == "rank"), key=lambda s: s.task)
        samples = sorted((s for s in latest if s.job == job and s.kind != "rank"), key=lambda s: s.task)
        prefix = f"job {job} " if len(jobs) > 1 else ""
        by_task = {s.task: s for s in samples}
        ids = {task: f"{job}/{task}" for task in by_task}
        exchange = bool(samples) and all(s.kind == "exchange" for s in samples)
        targets = [f"{job}/rank{r.task}" for r in ranks] or [f"{job}/receiver"]
        for s in samples:
            task = s.task
            prev = previous.get(s.key)
            bp = s.backpressured_ms_per_second / 1000.0
            idle = s.idle_ms_per_second / 1000.0
            upstream = [ids[t] for t in ids if t != task] if exchange else []
            view = TaskView(ids[task], bp, idle, max(0.0, 1.0 - bp - idle), level_of(bp), upstream)
            if s.done:  # a finished task waits for nobody and holds nobody up
                view = TaskView(ids[task], 0.0, 1.0, 0.0, "OK", upstream)
            tasks.append(view)
            node = Node(
                ids[task],
                f"{prefix}task {task}",
                out_pool_usage=s.out_pool_usage,
                in_pool_usage=s.in_pool_usage,
                bytes_out_per_second=_change(s, prev, "bytes_written"),
                bytes_in_per_second=_change(s, prev, "bytes_received"),
                rows_out_per_second=_change(s, prev, "rows_written"),
                rows_in_per_second=_change(s, prev, "rows_received"),
                done=s.done,
            )
            nodes.append(node)
            if exchange:
                before = list(prev.channel_bytes) if prev is not None else []
                for producer, total in enumerate(s.channel_bytes):
                    if producer == task or producer not in ids:
                        continue  # its own subpartition: inside the node
                    rate = 0.0
                    if prev is not None and producer < len(before):
                        rate = per_second(float(total), float(before[producer]), s.time - prev.time)
                    partition = by_task[producer].partition_id or f"task {producer}"
                    edges.append(Edge(ids[producer], ids[task], [partition], rate))
            else:
                share = node.bytes_out_per_second / len(targets)
                edges.extend(Edge(ids[task], t, [s.partition_id], share) for t in targets)
        for r in ranks:
            prev = previous.get(r.key)
            node = Node(
                f"{job}/rank{r.task}",
                f"{prefix}rank {r.task}",
                idle=r.idle_ms_per_second / 1000.0,
                busy=max(0.0, 1.0 - r.idle_ms_per_second / 1000.0),
                backpressured=r.backpressured_ms_per_second / 1000.0,
                level=r.level,
                rows_in_per_second=_change(r, prev, "rows_received"),
                bytes_in_per_second=_change(r, prev, "bytes_received"),
                rows_out_per_second=_change(r, prev, "rows_written"),
                done=r.done,
            )
            nodes.append(node)
        if not exchange and samples and not ranks:
            addr = samples[0].receiver or ""
            receiver = Node(f"{job}/receiver", f"{prefix}receiver", scraped=False)
            receiver.reason = f"the Receiver at {addr}, outside Spark: its metrics are not sampled"
            nodes.append(receiver)
    mark_bottlenecks(tasks)
    exchanges = [job for job in jobs if all(s.kind == "exchange" for s in latest if s.job == job)]
    _mark_hot_consumers(nodes, tasks, exchanges)
    by_id = {n.id: n for n in nodes}
    for t in tasks:
        n = by_id[t.env]
        n.level, n.backpressured, n.idle, n.busy = t.level, t.backpressured, t.idle, t.busy
        n.bottleneck, n.reason = t.bottleneck, ("done" if n.done else t.reason)
    for job in jobs:
        _mark_send_bottleneck([n for n in nodes if n.id.startswith(f"{job}/")])
    pipeline = Pipeline(title, nodes, edges)
    layout(pipeline.nodes, pipeline.edges)
    return pipeline
