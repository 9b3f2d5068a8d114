"""A Structured Streaming query feeding a long-lived Python consumer through creditflow: an
online feature service that keeps per-key running aggregates of a stream of events, each
micro-batch applied exactly once.

    python examples/stream_features.py [--batches 6] [--rows 5000] [--via sink|foreachBatch] [--connect]

Spark (``local[2]``) reads a ``rate-micro-batch`` source (``--rows`` events per micro-batch)
and writes it into a ``Receiver(continuous=True)``, either with the ``creditflow`` sink
(``df.writeStream.format("creditflow")``) or with ``foreachBatch`` and
``send(df, ..., batch_id=...)``. The consumer, a thread standing in for a separate service,
reads one stream: batches, and a ``JobDone`` after each micro-batch, at which it applies the
micro-batch's aggregates at once (a micro-batch is never half-applied, nor applied twice).
Half-way, the query is stopped and started again from its checkpoint. Each micro-batch is one
JSON line; the last line is the summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

#: Keys of the events (a feature per key: count and sum of the event's value).
KEYS = 16


class FeatureService:
    """The consumer: running count and sum per key, updated once per micro-batch."""

    def __init__(self, rx: Any) -> None:
        self.rx = rx
        self.count: dict[int, int] = defaultdict(int)
        self.total: dict[int, float] = defaultdict(float)
        self.applied: list[int] = []
        self.seen = np.zeros(0, dtype=np.int64)
        self._pending: list[pa.RecordBatch] = []
        self.thread = threading.Thread(target=self._run, name="feature-service", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import creditflow.spark as cfs

        for item in self.rx.items():
            if not isinstance(item, cfs.JobDone):
                self._pending.append(item)
                continue
            table = pa.Table.from_batches(self._pending) if self._pending else None
            self._pending = []
            if table is not None and table.num_rows:
                grouped = table.group_by("key").aggregate([("value", "count"), ("value", "sum")])
                columns = [grouped[c].to_pylist() for c in ("key", "value_count", "value_sum")]
                for key, n, s in zip(*columns, strict=True):
                    self.count[key] += n
                    self.total[key] += s
                self.seen = np.concatenate([self.seen, table["value"].to_numpy()])
            self.applied.append(item.batch_id if item.batch_id is not None else -1)
            print(json.dumps({"micro_batch": item.batch_id, "rows": item.rows}), flush=True)


def start_query(spark: Any, rx: Any, via: str, rows: int, checkpoint: str) -> Any:
    """The streaming query into the receiver."""
    from pyspark.sql import functions as F

    import creditflow.spark as cfs

    events = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows)
        .option("numPartitions", 2)
        .load()
        .select((F.col("value") % KEYS).cast("int").alias("key"), "value")
    )
    writer = events.writeStream.option("checkpointLocation", checkpoint)
    if via == "sink":
        return writer.format("creditflow").option("address", rx.address).option("secret", rx.secret).start()
    address, secret = rx.address, rx.secret

    def each(df: Any, batch_id: int) -> None:
        cfs.send(df, address, secret, batch_id=batch_id)

    return writer.foreachBatch(each).start()


def wait_batches(service: FeatureService, n: int, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while len(service.applied) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(service.applied)} micro-batches of {n} after {timeout} s")
        time.sleep(0.05)


def stop_between_batches(query: Any) -> None:
    """Stops the query when no micro-batch runs (one stopped midway is dropped by the
    receiver and runs again after the restart)."""
    deadline = time.monotonic() + 2
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=6, help="micro-batches to apply in all")
    parser.add_argument("--rows", type=int, default=5000, help="events per micro-batch")
    parser.add_argument("--via", choices=["sink", "foreachBatch"], default="sink")
    parser.add_argument("--connect", action="store_true", help="a Spark Connect session")
    args = parser.parse_args(argv)

    import creditflow.spark as cfs

    spark = cfs.local_session("local[2]", "creditflow-stream-features", connect=args.connect)
    spark.dataSource.register(cfs.CreditflowDataSource)
    rx = cfs.Receiver(continuous=True, max_queued=8)
    service = FeatureService(rx)
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="creditflow-stream-") as tmp:
            checkpoint = str(Path(tmp) / "checkpoint")
            query = start_query(spark, rx, args.via, args.rows, checkpoint)
            wait_batches(service, args.batches // 2)
            stop_between_batches(query)  # a restart from the checkpoint, half-way
            query = start_query(spark, rx, args.via, args.rows, checkpoint)
            wait_batches(service, args.batches)
            stop_between_batches(query)
        # Micro-batches that completed after the last one counted are applied too.
        time.sleep(0.5)
        seen = np.sort(service.seen)
        summary = {
            "via": args.via,
            "micro_batches": service.applied,
            "rows": int(len(seen)),
            "every_row_once": bool(np.array_equal(seen, np.arange(len(seen)))),
            "keys": len(service.count),
            "mean_of_key_0": service.total[0] / max(service.count[0], 1),
            "seconds": round(time.perf_counter() - started, 2),
            "receiver": rx.continuous_metrics(),
        }
    finally:
        rx.close()
        spark.stop()
    print(json.dumps({"summary": summary}), flush=True)
    return summary


if __name__ == "__main__":
    ok = main()
    sys.exit(0 if ok["every_row_once"] else 1)
