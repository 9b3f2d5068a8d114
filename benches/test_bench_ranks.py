"""What a rank's shuffle costs: the same DataFrame streamed once into three jobs of 2 ranks each
(the ranks are threads of this process, each with its own environment), with
``shuffle=False``, ``shuffle=True`` (seeded block order and a row window within each rank) and
``shuffle="global"`` (the blocks also dealt out to the ranks anew, over creditflow channels
between the ranks' environments), then later epochs replayed from the ranks (no Spark), in
paired rounds (one epoch of each per round). Reported: rows per second of a replayed epoch
(both ranks together, wall time), CPU seconds per GB of Arrow data, and each shuffle's rows
per second as a share of the unshuffled one's in the same round; and the CPU seconds per GB of
epoch 0, as it streams in from Spark, once per job.

``CREDITFLOW_BENCH_RANK_ROWS`` (default 2,000,000; 5 columns: 40 bytes a row) and
``CREDITFLOW_BENCH_RANK_ROUNDS`` (default 5). Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import pytest

pytestmark = [pytest.mark.benchmark, pytest.mark.spark]

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import creditflow.spark as cfs  # noqa: E402

ROWS = int(os.environ.get("CREDITFLOW_BENCH_RANK_ROWS", "2000000"))
ROUNDS = int(os.environ.get("CREDITFLOW_BENCH_RANK_ROUNDS", "5"))
BATCH = 1024


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = cfs.local_session("local[2]", "creditflow-bench-ranks")
    try:
        yield session
    finally:
        session.stop()


def _epoch(ranks: list[cfs.Receiver], epoch: int) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds of this process, and rows of one epoch on every rank."""
    rows = [0] * len(ranks)

    def run(r: int) -> None:
        ranks[r].set_epoch(epoch)
        for batch in ranks[r]:
            rows[r] += batch.num_rows

    cpu, start = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, time.process_time() - cpu, sum(rows)


MODES: tuple[tuple[str, bool | Literal["global"]], ...] = (
    ("off", False),
    ("block+window", True),
    ("global", "global"),
)


def test_shuffle_cost(benchmark: Any, report: Any, spark: SparkSession) -> None:
    df = spark.range(0, ROWS, numPartitions=4).select(
        "id", *[(F.col("id") * k).cast("double").alias(f"f{k}") for k in range(1, 5)]
    )
    jobs: dict[str, list[cfs.Receiver]] = {}
    streamed: dict[str, tuple[float, float, int]] = {}
    try:
        for mode, shuffle in MODES:
            secret = (mode * 64)[:64]
            ranks = [
                cfs.Receiver(
                    rank=r,
                    world_size=2,
                    batch_size=BATCH,
                    secret=secret,
                    shuffle=shuffle,
                    memory="256MiB",
                )
                for r in range(2)
            ]
            jobs[mode] = ranks
            sender = threading.Thread(target=cfs.send, args=(df, [rx.address for rx in ranks], secret))
            sender.start()
            first = _epoch(ranks, 0)
            sender.join()
            assert first[2] == ROWS
            streamed[mode] = first
        seen: dict[str, list[tuple[float, float, int]]] = {m: [] for m in jobs}

        def rounds() -> None:
            for epoch in range(1, ROUNDS + 1):
                for mode, ranks in jobs.items():
                    seen[mode].append(_epoch(ranks, epoch))

        benchmark.pedantic(rounds, rounds=1, iterations=1)
    finally:
        for ranks in jobs.values():
            for rx in ranks:
                rx.close()
    gb = ROWS * 40 / 1e9
    for mode, (_wall, cpu, _rows) in streamed.items():
        # Epoch 0 as Spark streams it in: the ranks' reading, storing and window (the tasks
        # are Spark's Python workers, other processes; the driver's part of send is small).
        report(f"ranks epoch 0 {mode}: CPU s/GB", cpu / gb, "s/GB", higher_is_better=False)
    for mode, rounds in seen.items():
        assert all(rows == ROWS for _, _, rows in rounds)
        wall = statistics.median(w for w, _, _ in rounds)
        cpu = statistics.median(c for _, c, _ in rounds)
        benchmark.extra_info[f"{mode} rounds (wall s, cpu s)"] = [
            (round(w, 3), round(c, 3)) for w, c, _ in rounds
        ]
        report(f"ranks replay {mode}: rows/s", ROWS / wall, "rows/s")
        report(f"ranks replay {mode}: CPU s/GB", cpu / gb, "s/GB", higher_is_better=False)
        if mode != "off":
            paired = statistics.median(o[0] / m[0] for o, m in zip(seen["off"], rounds, strict=True))
            report(f"ranks replay {mode}: rows/s vs off", paired, "x")
