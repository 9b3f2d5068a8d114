"""PySpark benchmarks with a skewed key, and with many tasks (one run each, on ``local[16]``).

* ``test_skew``: one key holds 30 % of the rows; 4 tasks. Three pipelines, each ending in a
  ``noop`` write, with the same user function (a per-key sum, streamed batch by batch):
  ``exchange(kind="pipelined")``, ``exchange(kind="hybrid")`` and Spark's
  ``repartition(4, "key").mapInArrow(f)``. Every round runs the three back to back in rotating
  order. For the exchanges a :class:`creditflow.spark.Monitor` gives each task's time
  backpressured (its writer waited for buffers) and idle (its reader waited for data), from
  the tasks' last samples, and a thread reads ``Monitor.pipeline()`` (what the live view
  draws) every 0.25 s and counts which task it marks as the bottleneck.
* ``test_many_tasks``: TPC-H-like ``lineitem`` rows by ``l_orderkey`` with 8 and 16 tasks
  (64 and 256 channels): ``exchange`` (through the host service, and with an environment per
  task, paired by round in wall time and in the machine's CPU seconds, every process's:
  ``/proc/stat``) against Spark's ``repartition(n, "l_orderkey")``, alone
  and followed by an identity ``mapInArrow`` (the Python round trip ``exchange`` makes too),
  all written to ``noop``. Before timing, every output partition of the exchange is checked
  against Spark's (row count and the sum of a 64-bit hash of every row, per partition); after
  the rounds, the workers are checked for leaks (environments, listening sockets, threads,
  segments still in use), and every task's pools stayed within its ``memory``.

Settings: ``CREDITFLOW_BENCH_SKEW_ROWS`` (default 8,000,000), ``CREDITFLOW_BENCH_SKEW_MEMORY``
(the exchanges' ``memory`` in the skew test, default 64MiB), ``CREDITFLOW_BENCH_SKEW_WORK_US``
(a sleep per row in the consumer, default 0), ``CREDITFLOW_BENCH_SCALE_ROWS``
(lineitem rows, default 2,000,000), ``CREDITFLOW_BENCH_SCALE_ROUNDS`` (default 3). The figures
of every round are printed (``-s``) and stored in ``extra_info``.
"""

from __future__ import annotations

import collections
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import pyarrow as pa
import pytest

# Each test runs a dozen Spark jobs: more than the suite's 300 s on a loaded 2-core machine.
pytestmark = [pytest.mark.benchmark, pytest.mark.spark, pytest.mark.timeout(1800)]

pytest.importorskip("pyspark")
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import creditflow.spark as cfs  # noqa: E402

SKEW_ROWS = int(os.environ.get("CREDITFLOW_BENCH_SKEW_ROWS", 8_000_000))
SCALE_ROWS = int(os.environ.get("CREDITFLOW_BENCH_SCALE_ROWS", 2_000_000))
ROUNDS = int(os.environ.get("CREDITFLOW_BENCH_SCALE_ROUNDS", 3))
SKEW_MEMORY = os.environ.get("CREDITFLOW_BENCH_SKEW_MEMORY", "64MiB")
#: Extra time the consumer takes per row, in µs, as a sleep (work that does not compete for this
#: machine's two cores: a service call, an accelerator): 0 = the aggregation alone.
SKEW_WORK_US = float(os.environ.get("CREDITFLOW_BENCH_SKEW_WORK_US", 0))
SKEW_TASKS = 4
#: The share of the rows the hot key holds, in tenths.
HOT_TENTHS = 3
MEMORY = "64MiB"


@pytest.fixture(scope="module")
def spark() -> Any:
    session = cfs.local_session(
        "local[16]",
        "creditflow-bench-spark-scale",
        {"spark.sql.shuffle.partitions": "16", "spark.driver.memory": "2g"},
    )
    yield session
    session.stop()


def noop(df: DataFrame) -> None:
    df.write.format("noop").mode("overwrite").save()


def machine_cpu() -> float:
    """CPU seconds this machine has spent so far, every process's (``/proc/stat``: user, nice,
    system, irq and softirq of all CPUs): the JVM, the Python workers and a host service alike.
    Another VM's load on the host shows as steal time, which this leaves out."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def rounds_of(runs: dict[str, Callable[[], None]]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Runs every pipeline once (warm-up), then ROUNDS rounds of all, in rotating order, every
    other round backwards: each pipeline runs before and after each other one (rotation alone
    would always run the same one right after another). Returns each pipeline's wall seconds
    and the machine's CPU seconds (:func:`machine_cpu`) of each round."""
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(ROUNDS):
        turn = r // 2 % len(names)
        order = names[turn:] + names[:turn]
        for name in order if r % 2 == 0 else order[::-1]:
            start, start_cpu = time.perf_counter(), machine_cpu()
            runs[name]()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(machine_cpu() - start_cpu)
    return times, cpu


# ------------------------------------------------------------------------------------- skew


def skewed(spark: SparkSession) -> DataFrame:
    """``key`` 0 in 3 rows of 10 (spread evenly over the input partitions), else one of 1 M."""
    i = F.col("id")
    key = F.when(i % 10 < HOT_TENTHS, F.lit(0)).otherwise((i * 2654435761) % 1_000_000 + 1)
    return spark.range(0, SKEW_ROWS, numPartitions=SKEW_TASKS).select(
        key.alias("key"), F.rand(11).alias("v"), (i % 1000).alias("w")
    )


def make_sums(work_us: float) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Per-key sum and count of ``v``, each batch aggregated as it arrives (after sleeping
    ``work_us`` µs per row) and the partials combined at the end: work in proportion to the
    rows a task receives."""

    def sums(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partials = []
        for b in batches:
            if work_us:
                time.sleep(b.num_rows * work_us / 1e6)
            partials.append(
                pa.Table.from_batches([b]).group_by("key").aggregate([("v", "sum"), ("v", "count")])
            )
        if not partials:
            return
        agg = pa.concat_tables(partials).group_by("key").aggregate([("v_sum", "sum"), ("v_count", "sum")])
        yield from agg.rename_columns(["key", "total", "n"]).to_batches()

    return sums


SUMS_SCHEMA = "key long, total double, n long"


class BottleneckWatch:
    """Reads ``monitor.pipeline()`` every 0.25 s while a job runs and counts, per task name,
    the reads that marked it as the bottleneck (and the reads in all)."""

    def __init__(self, monitor: cfs.Monitor) -> None:
        self.marked: collections.Counter[str] = collections.Counter()
        self.reads = 0
        self._monitor = monitor
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            p = self._monitor.pipeline()
            if not p.nodes or all(n.done for n in p.nodes):
                continue
            self.reads += 1
            for n in p.bottlenecks:
                self.marked[n.name] += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_skew(benchmark: Any, report: Any, spark: SparkSession) -> None:
    df = skewed(spark).cache()
    assert df.count() == SKEW_ROWS
    hot_row = spark.range(1).select(F.expr(f"pmod(hash(cast(0 as bigint)), {SKEW_TASKS})").alias("p")).first()
    assert hot_row is not None
    hot = int(hot_row["p"])
    sums = make_sums(SKEW_WORK_US)
    want = {r["key"]: r["n"] for r in df.groupBy("key").agg(F.count("v").alias("n")).collect()}
    # Correctness first: every key once, with all its rows, from each pipeline.
    for kind in ("pipelined", "hybrid"):
        got = cfs.exchange(df, "key", func=sums, schema=SUMS_SCHEMA, kind=kind, memory=SKEW_MEMORY).collect()
        assert {r["key"]: r["n"] for r in got} == want, kind
    assert {
        r["key"]: r["n"] for r in df.repartition(SKEW_TASKS, "key").mapInArrow(sums, SUMS_SCHEMA).collect()
    } == want

    per_task: dict[str, list[dict[int, tuple[float, float]]]] = {"pipelined": [], "hybrid": []}
    watched: dict[str, list[tuple[dict[str, int], int]]] = {"pipelined": [], "hybrid": []}

    def with_monitor(kind: Literal["pipelined", "hybrid"]) -> Callable[[], None]:
        def run() -> None:
            with cfs.Monitor(interval=0.1) as mon:
                watch = BottleneckWatch(mon)
                try:
                    noop(
                        cfs.exchange(
                            df,
                            "key",
                            func=sums,
                            schema=SUMS_SCHEMA,
                            kind=kind,
                            memory=SKEW_MEMORY,
                            monitor=mon,
                        )
                    )
                finally:
                    watch.stop()
                deadline = time.monotonic() + 10
                while sum(1 for s in mon.tasks() if s.done) < SKEW_TASKS and time.monotonic() < deadline:
                    time.sleep(0.05)
                final = mon.tasks()
            per_task[kind].append({s.task: (s.backpressured_total, s.idle_total) for s in final})
            watched[kind].append((dict(watch.marked), watch.reads))

        return run

    runs = {
        "exchange pipelined": with_monitor("pipelined"),
        "exchange hybrid": with_monitor("hybrid"),
        "spark repartition": lambda: noop(df.repartition(SKEW_TASKS, "key").mapInArrow(sums, SUMS_SCHEMA)),
    }
    times, _ = benchmark.pedantic(lambda: rounds_of(runs), rounds=1, iterations=1)
    print(
        f"\nskew: {SKEW_ROWS:,} rows, key 0 holds {HOT_TENTHS * 10} %, {SKEW_TASKS} tasks, hot task {hot}, "
        f"memory {SKEW_MEMORY}, consumer work {SKEW_WORK_US:g} µs/row"
    )
    for name, ts in times.items():
        print(f"  {name}: rounds {[round(t, 2) for t in ts]} s, median {statistics.median(ts):.2f} s")
        report(f"skew {name}", statistics.median(ts), "s", None, higher_is_better=False)
        benchmark.extra_info[f"skew {name} rounds"] = [round(t, 3) for t in ts]
    for kind in ("pipelined", "hybrid"):
        # The warm-up run is the first entry: only the timed rounds count.
        for r, (tasks, (marked, reads)) in enumerate(zip(per_task[kind][1:], watched[kind][1:], strict=True)):
            cells = ", ".join(
                f"task {t}: bp {bp:.1f} s idle {idle:.1f} s" for t, (bp, idle) in sorted(tasks.items())
            )
            print(f"  {kind} round {r + 1}: {cells}; live bottleneck marks {marked} of {reads} reads")
        benchmark.extra_info[f"skew {kind} per task"] = per_task[kind][1:]
        benchmark.extra_info[f"skew {kind} bottleneck marks"] = watched[kind][1:]
    report(
        "skew spark / exchange pipelined",
        statistics.median(times["spark repartition"]) / statistics.median(times["exchange pipelined"]),
        "x",
        None,
    )
    report(
        "skew spark / exchange hybrid",
        statistics.median(times["spark repartition"]) / statistics.median(times["exchange hybrid"]),
        "x",
        None,
    )
    df.unpersist()


# ------------------------------------------------------------------------------- many tasks


def lineitem(spark: SparkSession, rows: int, partitions: int) -> DataFrame:
    """TPC-H-like lineitem rows generated by Spark (1-7 lines an order on average 4, keys
    spread as dbgen's: 8 of every 32 used), cut into ``partitions`` partitions."""
    i = F.col("id")
    order = (i / 4).cast("long")
    modes = F.array(*[F.lit(m) for m in ("REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB")])
    return spark.range(0, rows, numPartitions=partitions).select(
        ((order / 8).cast("long") * 32 + order % 8 + 1).alias("l_orderkey"),
        ((i * 7919) % 200_000 + 1).alias("l_partkey"),
        ((i % 50) + 1).cast("decimal(12,2)").alias("l_quantity"),
        (((i * 31) % 10_410_000 + 90_000) / 100).cast("decimal(12,2)").alias("l_extendedprice"),
        ((i % 11) / 100).cast("decimal(12,2)").alias("l_discount"),
        F.date_add(F.lit("1992-01-02").cast("date"), ((i * 13) % 2526).cast("int")).alias("l_shipdate"),
        F.element_at(F.array(F.lit("A"), F.lit("N"), F.lit("R")), (i % 3 + 1).cast("int")).alias(
            "l_returnflag"
        ),
        F.element_at(modes, (i % 7 + 1).cast("int")).alias("l_shipmode"),
        F.concat(F.lit("carefully final deposits "), (i % 9973).cast("string")).alias("l_comment"),
    )


def make_identity() -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A function that hands the batches back unchanged (the Python round trip alone); made
    by a factory so that Spark pickles it by value (workers cannot import this module)."""

    def identity(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from batches

    return identity


def fingerprint(df: DataFrame) -> dict[int, tuple[int, int]]:
    """Partition index -> (rows, sum of xxhash64 of every column): equal for two DataFrames
    whose partitions hold the same rows."""
    h = F.xxhash64(*df.columns).cast("decimal(38,0)")
    rows = (
        df.select(F.spark_partition_id().alias("p"), h.alias("h"))
        .groupBy("p")
        .agg(F.count("h").alias("n"), F.sum("h").alias("s"))
        .collect()
    )
    return {r["p"]: (r["n"], int(r["s"])) for r in rows}


def worker_state(spark: SparkSession, tasks: int) -> list[dict[str, Any]]:
    """Per Python worker that runs one of ``tasks`` tiny tasks: its creditflow environments,
    listening sockets, threads, and the segments, partitions and gates their pools still hold."""

    def report(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psutil

        from creditflow.spark import _process

        for _ in batches:
            pass
        proc = psutil.Process()
        listening = [c for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        held = pools = 0
        for env, _users in list(_process._CACHE.envs.values()):
            m = env.metrics()
            held += m["segments_total"] - m["segments_available"]
            pools += len(m["partitions"]) + len(m["gates"])
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "pid": os.getpid(),
                    "envs": _process.open_environments(),
                    "listening": len(listening),
                    "threads": proc.num_threads(),
                    "segments_held": held,
                    "pools": pools,
                }
            ]
        )

    schema = "pid long, envs long, listening long, threads long, segments_held long, pools long"
    return [
        r.asDict() for r in spark.range(0, tasks, numPartitions=tasks).mapInArrow(report, schema).collect()
    ]


@pytest.mark.parametrize("tasks", [8, 16])
def test_many_tasks(benchmark: Any, report: Any, spark: SparkSession, tasks: int) -> None:
    df = lineitem(spark, SCALE_ROWS, tasks).cache()
    assert df.count() == SCALE_ROWS
    want = fingerprint(df.repartition(tasks, "l_orderkey"))
    got = fingerprint(cfs.exchange(df, "l_orderkey", memory=MEMORY))
    assert len(want) == tasks
    assert got == want
    before = {w["pid"]: w for w in worker_state(spark, tasks)}
    usage: list[tuple[str, float, float, int]] = []

    def exchange_run(host_service: bool) -> None:
        # Both stacks run under the same monitor (its sampling costs each the same).
        with cfs.Monitor(interval=0.2) as mon:
            noop(cfs.exchange(df, "l_orderkey", memory=MEMORY, monitor=mon, host_service=host_service))
            samples = mon.samples()
        usage.append(
            (
                "service" if host_service else "per task",
                max(s.out_pool_usage for s in samples),
                max(s.in_pool_usage or 0.0 for s in samples),
                max(s.rss_bytes - s.rss_start_bytes for s in samples),
            )
        )

    identity = make_identity()
    runs = {
        "exchange": lambda: exchange_run(True),
        # The same exchange with an environment per task instead of the host's service.
        "exchange, environment per task": lambda: exchange_run(False),
        "spark repartition": lambda: noop(df.repartition(tasks, "l_orderkey")),
        # The same shuffle with the rows then handed to Python and back, as exchange's are.
        "spark repartition + mapInArrow": lambda: noop(
            df.repartition(tasks, "l_orderkey").mapInArrow(identity, df.schema)
        ),
    }
    times, cpu = benchmark.pedantic(lambda: rounds_of(runs), rounds=1, iterations=1)
    # With the check above and the warm-up, 2 + ROUNDS exchanges ran in these workers.
    state = worker_state(spark, tasks)
    print(
        f"\nmany tasks: {SCALE_ROWS:,} lineitem rows, {tasks} tasks ({tasks * tasks} channels), "
        f"memory {MEMORY}"
    )
    for name, ts in times.items():
        print(
            f"  {name}: rounds {[round(t, 2) for t in ts]} s, median {statistics.median(ts):.2f} s; "
            f"machine CPU {[round(c, 1) for c in cpu[name]]} s, median {statistics.median(cpu[name]):.2f} s"
        )
        report(f"{tasks} tasks {name}", statistics.median(ts), "s", None, higher_is_better=False)
        benchmark.extra_info[f"{tasks} tasks {name} rounds"] = [round(t, 3) for t in ts]
        benchmark.extra_info[f"{tasks} tasks {name} machine CPU"] = [round(c, 2) for c in cpu[name]]
    for spark_run in ("spark repartition", "spark repartition + mapInArrow"):
        ratio = statistics.median(times[spark_run]) / statistics.median(times["exchange"])
        report(f"{tasks} tasks {spark_run} / exchange", ratio, "x", None)
    for what, figures in (("", times), (", machine CPU", cpu)):
        per_task = [
            s / p for s, p in zip(figures["exchange"], figures["exchange, environment per task"], strict=True)
        ]
        report(
            f"{tasks} tasks exchange / environment per task, paired{what}",
            statistics.median(per_task),
            "x",
            1.0,
            higher_is_better=False,
        )
    print(
        f"  per exchange (stack, out-pool max, in-pool max, worker RSS growth MB): "
        f"{[(m, round(o, 2), round(i, 2), round(r / 1e6)) for m, o, i, r in usage]}"
    )
    print(f"  workers after the runs: {state}")
    benchmark.extra_info[f"{tasks} tasks pools and rss"] = usage
    # Memory: no task's pools went beyond their share of its memory.
    assert all(o <= 1.0 and i <= 1.0 for _, o, i, _ in usage), usage
    # No leaks in the reused workers: at most the last exchange's environment, its listener
    # (+ the worker's own), no partition, gate or segment still held, and no worker has more
    # threads than after the first exchange.
    for w in state:
        assert w["envs"] <= 1, state
        assert w["listening"] <= 2, state
        assert w["segments_held"] == 0, state
        assert w["pools"] == 0, state
        if w["pid"] in before and before[w["pid"]]["envs"] == w["envs"]:
            assert w["threads"] <= before[w["pid"]]["threads"], (before, state)
    df.unpersist()
