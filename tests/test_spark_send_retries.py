"""``send`` to one receiver (no ranks) through Spark's task retries: a worker killed in the
middle of its partition, and a task whose input ends early (an upstream Python function
failed), are tried again by Spark, and the retried attempt continues after the rows the
receiver already has, so the consumer sees every row once; a retry that computes the rows
in another order, and a job that fails for good, make the consumer raise why."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pyspark = pytest.importorskip("pyspark")
from pyspark import TaskContext  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import creditflow as cf  # noqa: E402
import creditflow.spark as cfs  # noqa: E402
from spark_faults import fail_first_attempt, kill_first_attempt, reversed_after_first_attempt  # noqa: E402

pytestmark = pytest.mark.spark

ROWS = 100_000


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # local[2, 4]: two task slots, and a failed task is tried up to 4 times.
    session = cfs.local_session("local[2, 4]", "creditflow-test-send-retries", {"spark.driver.memory": "1g"})
    session.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "5000")
    try:
        yield session
    finally:
        session.stop()


def numbers(spark: SparkSession) -> DataFrame:
    return spark.range(0, ROWS, numPartitions=2).select("id", (F.col("id") * 2).cast("double").alias("x"))


def send_and_read(
    df: DataFrame, on_batch: Callable[[pa.RecordBatch], None] = lambda b: None, **receiver: Any
) -> tuple[np.ndarray, dict[str, Any]]:
    """Sends ``df`` to a receiver and reads it (``on_batch`` is called with each batch): the
    ids the consumer got, in order (up to its error, if it raised: ``consumer``), and what
    ``send`` returned (``stats``) or raised (``error``)."""
    with cfs.Receiver(timeout=120, **receiver) as rx:
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["stats"] = cfs.send(df, rx.address, rx.secret)
            except Exception as exc:
                result["error"] = exc

        t = threading.Thread(target=run)
        t.start()
        ids: list[np.ndarray] = []  # what came before a failure too
        try:
            for b in rx:
                on_batch(b)
                ids.append(b.column("id").to_numpy())
        except cf.ProducerFailedError as exc:
            result["consumer"] = exc
        t.join(120)
        assert not t.is_alive(), "send returns"
    return (np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)), result


@pytest.mark.parametrize("spill", [False, True], ids=["queue", "spill"])
def test_a_worker_killed_mid_partition_is_retried_and_every_row_arrives_once(
    spark: SparkSession, spill: bool
) -> None:
    df = numbers(spark).mapInArrow(kill_first_attempt(1, 3), "id long, x double")
    ids, result = send_and_read(df, spill=spill)
    assert "error" not in result, result
    assert (1, 1) in {(s["partition"], s["attempt"]) for s in result["stats"]}, result["stats"]
    assert len(ids) == ROWS, "no row twice"
    assert np.array_equal(np.sort(ids), np.arange(ROWS))
    # A partition's rows arrive in its order, the retry's after the killed attempt's.
    second = ids[ids >= ROWS // 2]
    assert np.array_equal(second, np.arange(ROWS // 2, ROWS))


def test_a_task_whose_input_ends_early_is_retried_and_continues(spark: SparkSession) -> None:
    """An upstream Python function fails in attempt 0 after a few batches: the sending task's
    input ends there without an error (its channel ends cleanly), Spark fails the task and
    tries it again, and the retry continues after the rows the receiver has."""

    df = numbers(spark).mapInArrow(fail_first_attempt(0, 3), "id long, x double")
    ids, result = send_and_read(df)
    assert "error" not in result, result
    assert (0, 1) in {(s["partition"], s["attempt"]) for s in result["stats"]}, result["stats"]
    assert len(ids) == ROWS
    assert np.array_equal(np.sort(ids), np.arange(ROWS))


def test_a_retry_that_computes_another_order_fails_send_and_the_consumer(
    spark: SparkSession, tmp_path: Any
) -> None:
    """A retried attempt whose rows come in another order cannot continue after the rows the
    consumer has (some would come twice, others never): its check at the resume point fails,
    and ``send`` and the consumer raise saying so, after rows each delivered once. Attempt 0
    fails once the consumer has rows of the partition, so that there are rows to continue
    after."""
    delivered = tmp_path / "delivered"

    def seen(batch: pa.RecordBatch) -> None:
        if (batch.column("id").to_numpy() < ROWS // 2).any():  # partition 0's
            delivered.touch()

    df = numbers(spark).mapInArrow(reversed_after_first_attempt(0, 3, delivered), "id long, x double")
    ids, result = send_and_read(df, seen)
    assert "computed other rows than the attempt it continues" in str(result.get("error")), result
    assert "computed other rows" in str(result.get("consumer")), result
    assert len(np.unique(ids)) == len(ids), "no row twice before the failure"


def test_a_task_that_fails_every_attempt_makes_send_and_the_consumer_raise(spark: SparkSession) -> None:
    def always_fails(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None
        for i, b in enumerate(batches):
            if ctx.partitionId() == 1 and i == 2:
                raise RuntimeError(f"the source broke in attempt {ctx.attemptNumber()}")
            yield b

    df = numbers(spark).mapInArrow(always_fails, "id long, x double")
    ids, result = send_and_read(df)
    assert "the source broke in attempt 3" in str(result.get("error")), result
    assert "the source broke" in str(result.get("consumer")), result
    assert len(np.unique(ids)) == len(ids), "no row twice before the failure"
