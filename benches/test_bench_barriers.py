"""Checkpoint barrier latency under steady backpressure (issue 7 acceptance).

Two environments in this process over loopback TCP, one partition of 4 subpartitions read by
one gate (4 remote channels). The producer thread writes 64 KiB batches as fast as it can;
the consumer sleeps ``CONSUMER_SLEEP`` per batch, so it is far slower than the producer (the
producer spends most of its time blocked: steady backpressure, full queues). After
``WARMUP`` seconds the producer injects checkpoint barrier 1; the figure is the time from
the injection to the gate yielding ``Barrier(1)``: aligned (behind all queued data), and
unaligned (overtaking it). Without debloating, aligned is about in-flight bytes / consumer
rate.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import pyarrow as pa
import pytest

import creditflow as cf

ROWS = 8192  # int64: 64 KiB per batch
WARMUP = 1.0
CONSUMER_SLEEP = 0.002


def barrier_latency(unaligned: bool) -> dict[str, float]:
    """One run: ms from injection to surfacing, and the consumer's rate meanwhile."""
    with (
        cf.NetworkEnvironment(memory="8MiB") as producer,
        cf.NetworkEnvironment(memory="8MiB") as consumer,
    ):
        part = producer.create_partition("b", num_subpartitions=4)
        gate = consumer.create_input_gate([cf.ChannelSpec(producer.address, "b", i) for i in range(4)])
        writer = cf.RecordWriter(part, cf.RoundRobinPartitioner(), timeout=60)
        batch = pa.record_batch({"k": pa.array(range(ROWS), pa.int64())})
        injected: list[float] = []
        stop = threading.Event()

        def produce() -> None:
            start = time.perf_counter()
            with writer:
                while not stop.is_set():
                    if not injected and time.perf_counter() - start >= WARMUP:
                        injected.append(time.perf_counter())
                        writer.broadcast_barrier(1, unaligned=unaligned)
                    writer.write(batch)

        th = threading.Thread(target=produce)
        th.start()
        surfaced = None
        batches = 0
        for item in gate.items(timeout=60):
            if isinstance(item, cf.Barrier):
                surfaced = time.perf_counter()
                break
            batches += 1
            time.sleep(CONSUMER_SLEEP)
        stop.set()
        for _ in gate.items(timeout=60):
            pass
        th.join()
        assert injected, "the barrier was never injected"
        assert surfaced is not None, "the barrier never came out"
        took = surfaced - injected[0]
    return {"ms": took * 1000, "consumer MB/s": batches * ROWS * 8 / 1e6 / (took + WARMUP)}


@pytest.mark.benchmark(group="barrier-latency")
@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_barrier_latency(benchmark: Any, report: Any, mode: str) -> None:
    """Injection to surfacing of one barrier, 4 remote channels under backpressure."""
    runs: list[dict[str, float]] = []
    benchmark.pedantic(
        lambda: runs.append(barrier_latency(mode == "unaligned")), rounds=5, iterations=1, warmup_rounds=0
    )
    benchmark.extra_info["runs"] = runs
    report(
        f"{mode} barrier latency",
        statistics.median(r["ms"] for r in runs),
        "ms",
        100.0 if mode == "unaligned" else None,
        higher_is_better=False,
    )
