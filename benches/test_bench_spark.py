"""PySpark benchmarks on ``local[2]``: keyed pipelines several ways, in one run each.

**Group-by** (:func:`test_spark_exchange_vs_repartition_vs_floor`): the same keyed pipeline
three ways:

* ``spark``: ``df.repartition(n, "key").mapInArrow(f)`` -- Spark's own shuffle (sort-based,
  through local disk) before the Python function;
* ``creditflow``: ``creditflow.spark.exchange(df, "key", func=f)`` -- the pipelined exchange
  in one barrier stage;
* ``floor``: ``df.mapInArrow(f)`` with no exchange at all (wrong answer for a keyed ``f``,
  but the least any exchange can cost: generation, JVM->Python Arrow transfer, ``f``).

``f`` aggregates its partition by key (sum and count, pyarrow ``group_by``). Every round runs
the three pipelines back to back (in rotating order, so none always runs on a warm or cold
machine) and times each end to end (the action is a ``noop`` write, which evaluates every
column); the figures are medians over the rounds.

**Cheap function** (:func:`test_spark_cheap_function`): ``f`` only counts its rows and sums
``value``, so what an exchange itself costs is not hidden behind ``f`` (a group-by's cost halves
after an exchange, a count's does not). Seven pipelines: the floor, Spark's shuffle, the fused
``exchange(df, "key", func=f)`` (through the host's creditflow service, the default), the same
with ``host_service=False`` (an environment per task), the same with ``shared_memory=False``
(loopback TCP between the tasks instead of shared memory), the chained
``exchange(df, "key").mapInArrow(f)`` (fused too) and the unfused
``exchange(df, "key").select("*").mapInArrow(f)`` (a second JVM -> Python -> JVM pass, which
Spark does not fuse into the barrier stage). Same rounds and rotation; the figures are medians
and their ratios to the floor, of wall time and of the CPU seconds the whole process tree
(driver, JVM, Python workers) used; every round is printed.

Settings: ``CREDITFLOW_BENCH_SPARK_ROWS`` (default 20,000,000), ``CREDITFLOW_BENCH_SPARK_ROUNDS``
(default 3), ``CREDITFLOW_BENCH_SPARK_KEYS`` (distinct keys, default 1,000,000),
``CREDITFLOW_BENCH_SPARK_CHEAP`` (the cheap function's pipelines to run, comma-separated, e.g.
``fused,fused_per_task``; the floor and Spark's shuffle always run; default all).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

pytestmark = [pytest.mark.benchmark, pytest.mark.spark]

pytest.importorskip("pyspark")
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import creditflow.spark as cfs  # noqa: E402

ROWS = int(os.environ.get("CREDITFLOW_BENCH_SPARK_ROWS", 20_000_000))
ROUNDS = int(os.environ.get("CREDITFLOW_BENCH_SPARK_ROUNDS", 3))
KEYS = int(os.environ.get("CREDITFLOW_BENCH_SPARK_KEYS", 1_000_000))
#: The cheap function's pipelines to run (comma-separated names; default all).
CHEAP_PIPELINES = [p for p in os.environ.get("CREDITFLOW_BENCH_SPARK_CHEAP", "").split(",") if p.strip()]
OUT_SCHEMA = "key long, total double, n long"


@pytest.fixture(scope="module")
def spark() -> Any:
    session = cfs.local_session(
        "local[2]",
        "creditflow-bench-spark",
        {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"},
    )
    yield session
    session.stop()


def source(spark: SparkSession) -> DataFrame:
    i = F.col("id")
    return spark.range(0, ROWS, numPartitions=2).select(
        ((i * 2654435761) % KEYS).alias("key"), F.rand(11).alias("v"), (i % 1000).alias("w")
    )


def make_totals() -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The user's function: sum and count of ``v`` per key over the whole partition. (Made by a
    factory so that Spark pickles it by value: workers cannot import this module.)"""

    def totals(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = list(batches)
        if not received:
            return
        agg = pa.Table.from_batches(received).group_by("key").aggregate([("v", "sum"), ("v", "count")])
        agg = agg.select(["key", "v_sum", "v_count"]).rename_columns(["key", "total", "n"])
        yield from agg.to_batches()

    return totals


def pipelines(spark: SparkSession) -> dict[str, Callable[[], None]]:
    df = source(spark)
    totals = make_totals()

    def run(out: DataFrame) -> None:
        out.write.format("noop").mode("overwrite").save()

    return {
        "floor": lambda: run(df.mapInArrow(totals, OUT_SCHEMA)),
        "spark": lambda: run(df.repartition(2, "key").mapInArrow(totals, OUT_SCHEMA)),
        "creditflow": lambda: run(cfs.exchange(df, "key", func=totals, schema=OUT_SCHEMA)),
    }


def test_spark_exchange_vs_repartition_vs_floor(benchmark: Any, report: Any, spark: SparkSession) -> None:
    runs = pipelines(spark)
    for fn in runs.values():  # warm up: JIT, Python workers, pyarrow imports
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)

    def one_round() -> None:
        for name in order:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
        order.append(order.pop(0))

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, m in med.items():
        report(f"spark {ROWS / 1e6:g}M rows: {name}", m, "s", None, higher_is_better=False)
    report("spark repartition / creditflow exchange", med["spark"] / med["creditflow"], "x", 1.5)
    report(
        "creditflow exchange / no-exchange floor",
        med["creditflow"] / med["floor"],
        "x",
        1.3,
        higher_is_better=False,
    )


CHEAP_SCHEMA = "n long, total double"


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and all its descendants (the JVM, Spark's
    Python workers), dead children that were waited for included (Linux ``/proc``; 0 elsewhere).
    On a shared machine the CPU a pipeline burns is steadier than its wall time."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0.0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
        cpu[int(name)] = sum(int(x) for x in fields[11:15]) / tick
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def cheap_source(spark: SparkSession) -> DataFrame:
    """The cheap function's data: ``key = id % 1000003``, ``value`` (double), ``score`` (long)."""
    i = F.col("id")
    return spark.range(0, ROWS, numPartitions=2).select(
        (i % 1000003).alias("key"), F.rand(7).alias("value"), (i % 997).alias("score")
    )


def make_count_sum() -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The cheap user function: rows and sum of ``value`` over the partition, one output row."""

    def count_sum(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc

        n, total = 0, 0.0
        for b in batches:
            n += b.num_rows
            total += pc.sum(b.column("value")).as_py() or 0.0
        yield pa.RecordBatch.from_pydict(
            {"n": [n], "total": [total]}, schema=pa.schema([("n", pa.int64()), ("total", pa.float64())])
        )

    return count_sum


def cheap_pipelines(spark: SparkSession) -> dict[str, Callable[[], DataFrame]]:
    df = cheap_source(spark)
    f = make_count_sum()
    every = {
        "floor": lambda: df.mapInArrow(f, CHEAP_SCHEMA),
        "spark": lambda: df.repartition(2, "key").mapInArrow(f, CHEAP_SCHEMA),
        # Through the host's creditflow service (the default)...
        "fused": lambda: cfs.exchange(df, "key", func=f, schema=CHEAP_SCHEMA),
        # ...and with an environment per task (per Python worker) instead.
        "fused_per_task": lambda: cfs.exchange(df, "key", func=f, schema=CHEAP_SCHEMA, host_service=False),
        # The same over loopback TCP: what shared memory (the default on one host) saves.
        "fused_tcp": lambda: cfs.exchange(df, "key", func=f, schema=CHEAP_SCHEMA, shared_memory=False),
        # mapInArrow right after exchange() joins the exchange's stage (fused as well)...
        "chained": lambda: cfs.exchange(df, "key").mapInArrow(f, CHEAP_SCHEMA),
        # ...while after any other step it is a second Python pass, as Spark plans it.
        "unfused": lambda: cfs.exchange(df, "key").select("*").mapInArrow(f, CHEAP_SCHEMA),
    }
    # The floor and Spark's shuffle always run: the ratios' base and the rows' check.
    chosen = {"floor", "spark", *(CHEAP_PIPELINES or every)}
    unknown = chosen - set(every)
    if unknown:
        raise ValueError(
            f"CREDITFLOW_BENCH_SPARK_CHEAP: unknown pipelines {sorted(unknown)} (of {list(every)})"
        )
    return {name: make for name, make in every.items() if name in chosen}


# Twenty-eight runs of 20 M rows (a check and three rounds of seven pipelines): more than the
# suite's 300 s default on a loaded 2-core machine.
@pytest.mark.timeout(3600)
def test_spark_cheap_function(benchmark: Any, report: Any, spark: SparkSession) -> None:
    runs = cheap_pipelines(spark)
    # Correctness first (and the warm-up): every pipeline sees every row once, and the keyed
    # ones give each task the same rows (Spark's shuffle and creditflow's agree per partition).
    results = {name: sorted((r["n"], r["total"]) for r in make().collect()) for name, make in runs.items()}
    for name, parts in results.items():
        assert sum(n for n, _ in parts) == ROWS, (name, parts)
    for name in set(results) - {"floor", "spark"}:
        assert [n for n, _ in results[name]] == [n for n, _ in results["spark"]], (name, results)
        for (_, a), (_, b) in zip(results[name], results["spark"], strict=True):
            assert abs(a - b) <= 1e-9 * max(abs(b), 1.0), (name, results)
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpus: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)

    def one_round() -> None:
        for name in order:
            cpu, start = tree_cpu_seconds(), time.perf_counter()
            runs[name]().write.format("noop").mode("overwrite").save()
            times[name].append(time.perf_counter() - start)
            cpus[name].append(tree_cpu_seconds() - cpu)
        order.append(order.pop(0))

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        walls = ", ".join(f"{t:.2f}" for t in ts)
        cpu_rounds = ", ".join(f"{c:.1f}" for c in cpus[name])
        print(
            f"cheap {name}: rounds {walls} s (median {med[name]:.2f} s); "
            f"CPU {cpu_rounds} s (median {statistics.median(cpus[name]):.1f} s)"
        )
        benchmark.extra_info[f"cheap {name} rounds"] = [round(t, 3) for t in ts]
        benchmark.extra_info[f"cheap {name} cpu seconds"] = [round(c, 2) for c in cpus[name]]
    for name, m in med.items():
        report(f"spark cheap {ROWS / 1e6:g}M rows: {name}", m, "s", None, higher_is_better=False)
    ratios = {
        "cheap: fused exchange / floor": ("fused", "floor", 1.10),
        "cheap: fused exchange per task / floor": ("fused_per_task", "floor", 1.10),
        "cheap: fused through the host service / per task": ("fused", "fused_per_task", None),
        "cheap: chained exchange / floor": ("chained", "floor", 1.10),
        "cheap: unfused exchange / floor": ("unfused", "floor", None),
        "cheap: spark shuffle / floor": ("spark", "floor", None),
        "cheap: spark shuffle / fused exchange": ("spark", "fused", None),
        "cheap: fused over TCP / over shared memory": ("fused_tcp", "fused", None),
    }
    for label, (a, b, target) in ratios.items():
        if a in med and b in med:
            report(label, med[a] / med[b], "x", target, higher_is_better=a == "spark" and b != "floor")
            # Paired by round: a round runs every pipeline within a minute or two, so the median
            # of the rounds' ratios leaves out most of what the shared machine's load does to a
            # whole round (the floor's own rounds have spread by 80 %).
            wall = statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))
            cpu_ratios = [x / y for x, y in zip(cpus[a], cpus[b], strict=True) if y > 0]
            cpu_paired = statistics.median(cpu_ratios) if cpu_ratios else float("nan")  # Linux only
            print(f"{label}, paired by round: wall {wall:.3f}x, CPU {cpu_paired:.3f}x")
            benchmark.extra_info[f"{label}, paired by round"] = [round(wall, 4), round(cpu_paired, 4)]
    cpu = {name: statistics.median(cs) for name, cs in cpus.items()}
    if cpu["floor"] > 0:  # CPU seconds: Linux only
        # The target (<= 1.10x the floor) holds for CPU seconds too: on an idle 2-core
        # machine the JVM keeps both cores busy, so the exchange's extra CPU is its extra time.
        for name in sorted(set(cpu) - {"floor"}):
            target = 1.10 if name in ("fused", "fused_per_task", "chained") else None
            report(
                f"cheap: {name} / floor, CPU seconds",
                cpu[name] / cpu["floor"],
                "x",
                target,
                higher_is_better=False,
            )
