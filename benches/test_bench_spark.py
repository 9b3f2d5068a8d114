"""PySpark benchmark: the same keyed pipeline three ways, in one run, on ``local[2]``.

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

Settings: ``CREDITFLOW_BENCH_SPARK_ROWS`` (default 20,000,000), ``CREDITFLOW_BENCH_SPARK_ROUNDS``
(default 3), ``CREDITFLOW_BENCH_SPARK_KEYS`` (distinct keys, default 1,000,000).
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
