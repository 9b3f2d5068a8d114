"""creditflow.spark on ``local-cluster[2,1,1024]``: two executor JVMs, each with its own
Python workers, so every exchange crosses processes over TCP."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import creditflow.spark as cfs  # noqa: E402


@pytest.fixture(scope="module", params=["classic", "connect"])
def cluster(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """A classic session, then a Spark Connect one (its local server runs the local-cluster;
    the driver reads the slots from ``local-cluster[2,1,1024]``). One at a time: pytest groups
    the tests by this parameter."""
    session = cfs.local_session(
        "local-cluster[2,1,1024]",
        "creditflow-test-cluster",
        {"spark.sql.shuffle.partitions": "2", "spark.executor.memory": "1g"},
        connect=request.param == "connect",
    )
    try:
        yield session
    finally:
        session.stop()


def test_exchange_across_executor_processes_matches_repartition(cluster: SparkSession) -> None:
    df = cluster.range(0, 200_000, numPartitions=2).select(
        "id", (F.col("id") % 997).alias("k"), F.concat(F.lit("v"), F.col("id").cast("string")).alias("s")
    )

    def tag(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Which Python worker (and so which executor) produced the output partition.
        for b in batches:
            yield b.append_column("worker", pa.array(np.full(b.num_rows, os.getpid(), dtype=np.int64)))

    out = cfs.exchange(df, "k", func=tag, schema="id long, k long, s string, worker long")
    got = {
        r["id"]: (r["pid"], r["worker"])
        for r in out.select("id", "worker", F.spark_partition_id().alias("pid")).collect()
    }
    want = {
        r["id"]: r["pid"]
        for r in df.repartition(2, "k").select("id", F.spark_partition_id().alias("pid")).collect()
    }
    assert {i: p for i, (p, _) in got.items()} == want
    # Two executor JVMs ran the two tasks: their output came from two different processes.
    assert len({w for _, w in got.values()}) == 2


def test_stream_out_of_executors_on_a_cluster(cluster: SparkSession) -> None:
    df = cluster.range(0, 300_000, numPartitions=4)
    with cfs.Receiver(max_queued=2) as rx:
        stats: list[dict[str, object]] = []
        t = threading.Thread(target=lambda: stats.extend(cfs.send(df, rx.address, rx.secret)))
        t.start()
        ids = np.concatenate([b.column("id").to_numpy() for b in rx])
        t.join(120)
    assert np.array_equal(np.sort(ids), np.arange(300_000))
    assert len(stats) == 4
