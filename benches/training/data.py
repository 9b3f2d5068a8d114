"""The DataFrame every contender delivers: TPC-H ``lineitem`` features, computed by Spark.

The rows come from :mod:`benches.lineitem` (dbgen's rules), generated inside the Spark tasks
(``mapInArrow`` over one source row per partition), then turned into numeric training features
by Spark SQL (decimals to float32, dates to day counts and lags, flags and modes to integer
codes). Nothing is cached: every Spark job over it computes it again, as a real feature
pipeline would. ``l_orderkey * 8 + l_linenumber`` is unique per row (line numbers are 1-7): its
sum per epoch over all ranks, next to the row count, shows whether each row arrived once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
from benches import lineitem
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

RAW_SCHEMA = (
    "l_orderkey long, l_partkey int, l_suppkey int, l_linenumber int, l_quantity decimal(12,2), "
    "l_extendedprice decimal(12,2), l_discount decimal(12,2), l_tax decimal(12,2), "
    "l_returnflag string, l_linestatus string, l_shipdate date, l_commitdate date, "
    "l_receiptdate date, l_shipinstruct string, l_shipmode string"
)
#: Rows per generated Arrow batch (what a task hands Spark at a time).
CHUNK = 8192
#: Order numbers of source partition i start at i * ORDER_STRIDE (disjoint keys).
ORDER_STRIDE = 10_000_000


class Generate:
    """The ``mapInArrow`` function: for each source id (one per partition), that partition's
    share of ``rows`` lineitem rows, seeded by (seed, id). A top-level class, so Spark pickles
    it by reference (the workers import this module through PYTHONPATH)."""

    def __init__(self, rows: int, partitions: int, seed: int) -> None:
        self.rows, self.partitions, self.seed = rows, partitions, seed

    def share(self, part: int) -> int:
        return self.rows // self.partitions + (1 if part < self.rows % self.partitions else 0)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for ids in batches:
            for part in ids.column("id").to_pylist():
                yield from self._partition(int(part))

    def _partition(self, part: int) -> Iterator[pa.RecordBatch]:
        rng = np.random.default_rng([self.seed, part])
        text = lineitem.text_pool(rng, 1 << 16)  # comments are not features: a small pool
        left, order = self.share(part), part * ORDER_STRIDE
        while left > 0:
            batch, order = lineitem.lineitem(rng, order, min(CHUNK, left), text)
            left -= batch.num_rows
            yield batch.drop_columns(["l_comment"])


def _code(column: str, values: Sequence[str]) -> F.Column:
    """The 0-based index of ``column``'s value in ``values``, as int."""
    return (F.array_position(F.array(*[F.lit(v) for v in values]), F.col(column)) - 1).cast("int")


def features(
    spark: SparkSession, rows: int, partitions: int, seed: int, parts: Sequence[int] | None = None
) -> DataFrame:
    """The lineitem feature DataFrame (``partitions`` Spark partitions). ``parts`` keeps only
    those source partitions (their rows are the same as in the whole DataFrame)."""
    ids = spark.range(0, partitions, numPartitions=partitions)
    if parts is not None:
        ids = ids.where(F.col("id").isin(list(parts)))
    raw = ids.mapInArrow(Generate(rows, partitions, seed), RAW_SCHEMA)
    return raw.select(
        "l_orderkey",
        "l_partkey",
        "l_suppkey",
        "l_linenumber",
        *[F.col(c).cast("float").alias(c) for c in ("l_quantity", "l_extendedprice", "l_discount", "l_tax")],
        F.datediff("l_shipdate", F.lit("1992-01-01").cast("date")).alias("ship_day"),
        F.datediff("l_commitdate", "l_shipdate").alias("commit_lag"),
        F.datediff("l_receiptdate", "l_shipdate").alias("receipt_lag"),
        _code("l_returnflag", ["R", "A", "N"]).alias("returnflag"),
        _code("l_linestatus", ["O", "F"]).alias("linestatus"),
        _code("l_shipinstruct", lineitem.INSTRUCTIONS).alias("shipinstruct"),
        _code("l_shipmode", lineitem.MODES).alias("shipmode"),
    )


def expected(df: DataFrame) -> tuple[int, int]:
    """(rows, sum of row keys) of ``df``: what the ranks together must see in each epoch."""
    key = F.col("l_orderkey") * 8 + F.col("l_linenumber")
    row = df.agg(F.count("*").alias("n"), F.sum(key).alias("k")).first()
    assert row is not None
    return int(row["n"]), int(row["k"])


class Count:
    """The floor's ``mapInArrow`` function: counts its partition's rows and notes when its
    first batch came (wall clock), which is all any Python consumer of the DataFrame must pay."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows, first = 0, None
        for batch in batches:
            if first is None:
                first = time.time()
            rows += batch.num_rows
        schema = pa.schema([("rows", pa.int64()), ("first", pa.float64())])
        yield pa.RecordBatch.from_pydict({"rows": [rows], "first": [first]}, schema=schema)


def python_floor(df: DataFrame) -> dict[str, float]:
    """The DataFrame through a ``mapInArrow`` that only counts rows: ``seconds`` (the job) and
    ``first_batch`` (from the job's start to the first batch in a Python worker)."""
    start_wall, start = time.time(), time.monotonic()
    rows = df.mapInArrow(Count(), "rows long, first double").collect()
    seconds = time.monotonic() - start
    firsts = [r["first"] for r in rows if r["first"] is not None]
    return {"seconds": seconds, "first_batch": min(firsts) - start_wall if firsts else float("nan")}
