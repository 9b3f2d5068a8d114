"""creditflow.spark with a skewed key and with many tasks, small data: the hot task named, its
producers held back by it when pipelined and not when hybrid, and exchanges of 8 and 16 tasks
placing rows as Spark's repartition does.

One ``local[16]`` session (classic): 16 task slots for the 16-task exchanges. The figures
(times against Spark's shuffle) come from ``benches/test_bench_spark_scale.py``; these tests
check behaviour only: where the rows go, what the monitor names, and what reused workers keep.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import creditflow as cf  # noqa: E402
import creditflow.spark as cfs  # noqa: E402
from spark_data import lineitem, placement  # noqa: E402

SKEW_TASKS = 4


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = cfs.local_session(
        "local[16]",
        "creditflow-test-scale",
        {"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "1g"},
    )
    try:
        yield session
    finally:
        session.stop()


def hot_task(spark: SparkSession, tasks: int) -> int:
    """The task Spark's hash puts key 0 in."""
    row = spark.range(1).select(F.expr(f"pmod(hash(cast(0 as bigint)), {tasks})").alias("p")).first()
    assert row is not None
    return int(row["p"])


def slow_counts(
    seconds_per_million_rows: float,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A consumer whose work grows with the rows it gets (a sleep per batch), then one row per
    key with its count: the hot key's task is the slowest."""

    def counts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts = []
        for b in batches:
            time.sleep(b.num_rows * seconds_per_million_rows / 1e6)
            parts.append(pa.table({"key": b.column("key")}).group_by("key").aggregate([("key", "count")]))
        if parts:
            agg = pa.concat_tables(parts).group_by("key").aggregate([("key_count", "sum")])
            yield from agg.rename_columns(["key", "n"]).to_batches()

    return counts


class Watch:
    """Reads ``monitor.pipeline()`` (what the live view draws) every 0.1 s while a job runs and
    counts the reads that mark each task as the bottleneck."""

    def __init__(self, monitor: cfs.Monitor) -> None:
        self.marked: collections.Counter[str] = collections.Counter()
        self._monitor = monitor
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for n in self._monitor.pipeline().bottlenecks:
                self.marked[n.name] += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def skewed_run(spark: SparkSession, kind: str, spill_dir: str | None = None) -> tuple[dict[int, Any], Watch]:
    """1,000,000 rows (16 MB), key 0 in 3 of every 10, through 1 MiB per task: the last sample
    of each task, and what the live view marked meanwhile."""
    i = F.col("id")
    key = F.when(i % 10 < 3, F.lit(0)).otherwise((i / 10).cast("long") % 5_000 + 1)
    df = spark.range(0, 1_000_000, numPartitions=SKEW_TASKS).select(key.alias("key"), i.alias("v"))
    with cfs.Monitor(interval=0.05) as mon:
        watch = Watch(mon)
        try:
            out = cfs.exchange(
                df,
                "key",
                func=slow_counts(6.0),
                schema="key long, n long",
                memory="1MiB",
                # 1 MiB per task: an environment per task, whose pool bounds what a task holds
                # (a host service's tasks share the application's host memory instead).
                host_service=False,
                kind=kind,  # type: ignore[arg-type]
                spill_dir=spill_dir,
                monitor=mon,
            )
            got = {r["key"]: r["n"] for r in out.collect()}
        finally:
            watch.stop()
        deadline = time.monotonic() + 10
        while sum(1 for s in mon.tasks() if s.done) < SKEW_TASKS and time.monotonic() < deadline:
            time.sleep(0.05)
        final = {s.task: s for s in mon.tasks()}
    # Every key once, with all its rows: the hot key's 300,000 in one task.
    assert got[0] == 300_000
    assert len(got) == 5_001
    assert sum(got.values()) == 1_000_000
    return final, watch


def test_skewed_key_pipelined_makes_every_producer_wait_and_names_the_hot_task(spark: SparkSession) -> None:
    hot = hot_task(spark, SKEW_TASKS)
    final, watch = skewed_run(spark, "pipelined")
    assert sorted(final) == list(range(SKEW_TASKS))
    cold = [t for t in final if t != hot]
    # The hot task received 30 % and its share of the rest: more than any other.
    assert all(final[hot].rows_received > final[t].rows_received + 100_000 for t in cold), final
    # Every writer waited for buffers (all of them feed the hot task), and the other tasks'
    # readers waited for data longer than the hot one's, which was busy.
    assert all(s.backpressured_total > 0 for s in final.values()), final
    assert all(final[t].idle_total > final[hot].idle_total for t in cold), final
    # The live view named the hot task as the bottleneck, more often than any other.
    assert watch.marked, "the live view never named a bottleneck"
    assert watch.marked.most_common(1)[0][0] == f"task {hot}", watch.marked


def test_skewed_key_hybrid_producers_do_not_wait(spark: SparkSession, tmp_path: Path) -> None:
    """kind="hybrid": what the hot task has not read yet spills, so the writers do not wait for
    it; the hot task still reads everything, and its spill files go with the partitions."""
    pipelined, _ = skewed_run(spark, "pipelined")
    hybrid, _ = skewed_run(spark, "hybrid", spill_dir=str(tmp_path))
    assert all(s.partition_kind == "hybrid" for s in hybrid.values())
    waited = {
        kind: sum(s.backpressured_total for s in run.values())
        for kind, run in (("pipelined", pipelined), ("hybrid", hybrid))
    }
    assert waited["hybrid"] < waited["pipelined"] / 2, waited
    assert not list(tmp_path.rglob("*.spill")), "the spill files are gone"


def test_exchange_checks_kind_and_a_hybrid_pool_s_size(spark: SparkSession) -> None:
    df = spark.range(0, 10, numPartitions=2)
    with pytest.raises(ValueError, match=r"kind must be one of \['pipelined', 'hybrid'\], got 'blocking'"):
        cfs.exchange(df, "id", kind="blocking")  # type: ignore[arg-type]
    # A hybrid partition's pool needs 8 more segments: 256 KiB (8 segments) of a task's own
    # environment holds a pipelined exchange of 2 tasks (6) but not a hybrid one (14).
    cfs.exchange(df, "id", memory="256KiB", host_service=False)
    with pytest.raises(cf.InsufficientBuffersError, match="needs at least 14 segments per task"):
        cfs.exchange(df, "id", memory="256KiB", kind="hybrid", host_service=False)


# ------------------------------------------------------------------------------- many tasks


def worker_state(spark: SparkSession, tasks: int) -> dict[int, dict[str, int]]:
    """By Python worker (pid) that runs one of ``tasks`` tiny tasks: its environments, listening
    sockets, threads, and the segments, partitions and gates its environments still hold."""

    def report(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psutil

        from creditflow.spark import _process

        for _ in batches:
            pass
        proc = psutil.Process()
        held = pools = 0
        for env, _users in list(_process._CACHE.envs.values()):
            m = env.metrics()
            held += m["segments_total"] - m["segments_available"]
            pools += len(m["partitions"]) + len(m["gates"])
        listening = [c for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        row = {
            "pid": os.getpid(),
            "envs": _process.open_environments(),
            "listening": len(listening),
            "threads": proc.num_threads(),
            "held": held,
            "pools": pools,
        }
        yield pa.RecordBatch.from_pylist([row])

    schema = "pid long, envs long, listening long, threads long, held long, pools long"
    rows = spark.range(0, tasks, numPartitions=tasks).mapInArrow(report, schema).collect()
    return {r["pid"]: r.asDict() for r in rows}


@pytest.mark.parametrize("tasks", [8, 16])
def test_many_tasks_match_repartition_and_leave_reused_workers_clean(spark: SparkSession, tasks: int) -> None:
    """8 and 16 tasks (64 and 256 channels): every row where ``repartition(n, "l_orderkey")``
    puts it, each task's pools within its memory, and after 5 exchanges in the same reused
    workers no more environments, listeners, threads or held segments than after the first."""
    df = lineitem(spark, 16_000, tasks).cache()
    want = placement(df.repartition(tasks, "l_orderkey"))
    states = []
    for run in range(5):
        with cfs.Monitor(interval=0.05) as mon:
            out = cfs.exchange(df, "l_orderkey", memory="8MiB", monitor=mon)
            if run == 0:
                assert placement(out) == want
            else:
                assert out.count() == 16_000
            samples = mon.samples()
        assert samples
        assert max(s.out_pool_usage for s in samples) <= 1.0
        assert max((s.in_pool_usage or 0.0) for s in samples) <= 1.0
        if run in (0, 4):
            states.append(worker_state(spark, tasks))
    first, last = states
    for pid, w in last.items():
        assert w["envs"] <= 1, last
        assert w["listening"] <= 2, last  # the last exchange's listener (+ the worker's own)
        assert w["held"] == 0, last
        assert w["pools"] == 0, last
        if pid in first and first[pid]["envs"] == w["envs"]:
            assert w["threads"] <= first[pid]["threads"], (first, last)
    df.unpersist()
