"""Structured Streaming into a ``Receiver(continuous=True)``: the figures of
docs/benchmarks.md ("Structured Streaming").

    python benches/structured_streaming.py [--rounds 5] [--json out.json]

On one classic ``local[2]`` session:

* **exactly once**: the ``creditflow`` sink from ``rate-micro-batch`` (2,000 rows per
  micro-batch); a task breaks midway through micro-batch 1 (Spark retries it); after three
  micro-batches the query stops, the last commit-log entry is removed (as when the driver
  dies between the sink's commit and Spark's record of it) and the query starts again, which
  replays that micro-batch. Rows Spark ran, rows the receiver dropped, rows delivered, and
  whether every value arrived once.
* **backpressure**: the sink (8,000 rows per micro-batch) into a consumer that takes its
  rows at once and into one that takes 1 ms per row: Spark's ``inputRowsPerSecond`` and
  ``processedRowsPerSecond`` (medians over the micro-batches after the first), and how long
  the receiver held the tasks back.
* **cost of a micro-batch** of 1,000, 10,000 and 100,000 rows (``id`` and four doubles),
  in paired rounds: ``send(df, ..., batch_id=i)`` until the consumer passed the micro-batch's
  ``JobDone``, against ``df.toArrow()`` on the driver (what a ``foreachBatch`` that collects
  does) and ``df.count()`` (a Spark job's floor). Medians in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from stream_consumer import Consumer, forget_last_commit


def _stop(query: Any) -> None:
    deadline = time.monotonic() + 2
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


def _sink(stream: Any, rx: Any, checkpoint: str) -> Any:
    w = stream.writeStream.format("creditflow").option("address", rx.address).option("secret", rx.secret)
    return w.option("checkpointLocation", checkpoint).start()


def _rate(spark: Any, rows: int) -> Any:
    src = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
    return src.option("numPartitions", 2).load().select("value")


def exactly_once(spark: Any, tmp: Path) -> dict[str, Any]:
    import creditflow.spark as cfs

    flag, checkpoint = tmp / "broke", tmp / "eo-checkpoint"

    def breaks_once(batches: Any) -> Any:
        for batch in batches:
            v = batch.column("value").to_numpy()
            hit = np.flatnonzero(v == 2300)
            if len(hit) and not flag.exists():
                yield batch.slice(0, int(hit[0]))
                flag.touch()
                raise RuntimeError("a task broke midway")
            yield batch

    stream = _rate(spark, 2000).mapInArrow(breaks_once, "value long")
    rx = cfs.Receiver(continuous=True)
    taker = Consumer(rx, "value")
    progress: list[dict[str, Any]] = []
    try:
        query = _sink(stream, rx, str(checkpoint))
        taker.wait_jobs(3, timeout=600)
        _stop(query)
        progress += query.recentProgress
        forget_last_commit(checkpoint)
        query = _sink(stream, rx, str(checkpoint))
        taker.wait_jobs(len(taker.done) + 2, timeout=600)
        _stop(query)
        progress += query.recentProgress
        time.sleep(0.5)
        m = rx.continuous_metrics()
    finally:
        rx.close()
    got = np.sort(taker.all_ids())
    return {
        "micro_batches_run_by_spark": len([p for p in progress if p["numInputRows"]]),
        "rows_run_by_spark": sum(p["numInputRows"] for p in progress),
        "micro_batches_delivered": [d.batch_id for d in taker.done],
        "rows_delivered": int(len(got)),
        "distinct_rows_delivered": int(len(np.unique(got))),
        "every_row_once": bool(np.array_equal(got, np.arange(len(got)))),
        "replays_dropped": m["replays_dropped"],
        "attempts_failed": m["attempts_failed"],
        "jobs_dropped": m["jobs_dropped"],
        "rows_dropped": m["rows_dropped"],
    }


def backpressure(spark: Any, tmp: Path, seconds_per_row: float) -> dict[str, Any]:
    import creditflow.spark as cfs

    rx = cfs.Receiver(continuous=True, max_queued=2)
    taker = Consumer(rx, "value", seconds_per_row)
    try:
        query = _sink(_rate(spark, 8000), rx, str(tmp / f"bp-{seconds_per_row}"))
        taker.wait_jobs(6, timeout=600)
        _stop(query)
        paused = rx.continuous_metrics()["paused_seconds"]
    finally:
        rx.close()
    runs = [p for p in query.recentProgress if p["numInputRows"]][1:]
    return {
        "seconds_per_row": seconds_per_row,
        "input_rows_per_s": round(statistics.median(p["inputRowsPerSecond"] for p in runs)),
        "processed_rows_per_s": round(statistics.median(p["processedRowsPerSecond"] for p in runs)),
        "batch_ms": round(statistics.median(p["batchDuration"] for p in runs)),
        "paused_s": round(paused, 1),
    }


def micro_batch_cost(spark: Any, rows: int, rounds: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    import creditflow.spark as cfs

    df = spark.range(0, rows, numPartitions=2).select(
        "id", *[(F.col("id") * k).cast("double").alias(f"x{k}") for k in range(1, 5)]
    )
    df = df.cache()
    df.count()
    rx = cfs.Receiver(continuous=True, memory="256MiB")
    taker = Consumer(rx, "id")
    times: dict[str, list[float]] = {"send": [], "toArrow": [], "count": []}
    try:
        for i in range(rounds + 1):  # the first round warms up
            t0 = time.perf_counter()
            cfs.send(df, rx.address, rx.secret, batch_id=i, stream="bench")
            taker.wait_jobs(i + 1, timeout=600)
            t1 = time.perf_counter()
            table = df.toArrow()
            t2 = time.perf_counter()
            df.count()
            t3 = time.perf_counter()
            assert isinstance(table, pa.Table)
            assert table.num_rows == rows
            assert taker.done[-1].rows == rows
            if i:
                times["send"].append(t1 - t0)
                times["toArrow"].append(t2 - t1)
                times["count"].append(t3 - t2)
    finally:
        rx.close()
        df.unpersist()
    return {"rows": rows, **{k: round(1000 * statistics.median(v), 1) for k, v in times.items()}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)

    import creditflow.spark as cfs

    conf = {"spark.sql.shuffle.partitions": "2"}
    spark = cfs.local_session("local[2, 4]", "creditflow-bench-streaming", conf)
    spark.dataSource.register(cfs.CreditflowDataSource)
    out: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="creditflow-bench-stream-") as tmp:
            out["exactly_once"] = exactly_once(spark, Path(tmp))
            print(json.dumps(out["exactly_once"]), flush=True)
            out["backpressure"] = [backpressure(spark, Path(tmp), s) for s in (0.0, 1e-3)]
            print(json.dumps(out["backpressure"]), flush=True)
        out["micro_batch"] = [micro_batch_cost(spark, n, args.rounds) for n in (1_000, 10_000, 100_000)]
        print(json.dumps(out["micro_batch"]), flush=True)
    finally:
        spark.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
