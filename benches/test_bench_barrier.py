"""Aligned-barrier latency under steady backpressure, without and with buffer debloating
(issue 7, acceptance point 2), with pytest-benchmark.

Two OS processes over loopback: a producer writes to a partition of ``CHANNELS`` (4)
subpartitions at ten times the rate its consumer reads the ``CHANNELS`` remote channels of one
gate, so the producer's queues and the gate's buffers are full all the time. Now and then the
producer *injects a marker* that queues behind the data on every channel; the consumer
records when the marker has arrived from the last channel. An aligned checkpoint barrier
surfaces exactly then (after every channel delivered it), so this drain time is the aligned
barrier's latency. Without debloating it is the bytes in flight (the producer's queue plus
the gate's buffers, at full segment size) over the consumer's rate; with debloating the gate
has its producer cut buffers so the same number of buffers holds about ``debloat_target``
seconds of data.

The marker is a seam: :func:`inject` writes it, :func:`is_marker` recognises it and
:func:`marker_time` reads its injection time. Today it is a 1-row batch written to every
subpartition (``BroadcastPartitioner``) whose ``marker`` column is 1 and ``ts`` column the
injection time; swapping in ``RecordWriter.broadcast_barrier`` means changing these three
functions only (keep the injection time on the producer side, keyed by checkpoint id).

Every round runs the same scenario without and then with debloating; figures are medians
over every marker of every round, and the ratio is of those medians, from one run.

Settings (environment variables):

``CREDITFLOW_BENCH_BARRIER_TARGET``  ``debloat_target`` in seconds (default 0.1; Flink's
                                     default is 1.0, for which the consumer would have to
                                     be ten times slower, and every run ten times longer,
                                     for the same buffer sizes)
``CREDITFLOW_BENCH_BARRIER_RATE``    consumer rate in bytes/s over all channels (512 KiB/s)
``CREDITFLOW_BENCH_BARRIER_ROUNDS``  rounds (default 2), each with both settings
``CREDITFLOW_BENCH_BARRIER_MARKERS`` markers per run (default 5)

Run as a script, this file is the worker (``python benches/test_bench_barrier.py ROLE CFG``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf
from remote import TIMEOUT, Config, Worker, emit, environment, receive, run_threads, sleep_until

pytestmark = pytest.mark.benchmark

CHANNELS = 4
SEGMENT = 32 << 10
PRODUCER_MEMORY = 2 << 20  # 64 segments: the producer's queue
CONSUMER_MEMORY = 8 << 20
BATCH_BYTES = 24 << 10  # payload of one data batch (under a segment: one buffer without debloating)
SPEEDUP = 10.0  # producer rate / consumer rate
WARMUP = 5.0  # seconds of backpressure before the first marker (old full-size data drains)
MARKER_INTERVAL = 1.0

TARGET = float(os.environ.get("CREDITFLOW_BENCH_BARRIER_TARGET", "0.1"))
RATE = float(os.environ.get("CREDITFLOW_BENCH_BARRIER_RATE", str(512 << 10)))
ROUNDS = int(os.environ.get("CREDITFLOW_BENCH_BARRIER_ROUNDS", "2"))
MARKERS = int(os.environ.get("CREDITFLOW_BENCH_BARRIER_MARKERS", "5"))

SCHEMA = pa.schema([("marker", pa.int8()), ("ts", pa.float64()), ("payload", pa.binary())])


# --------------------------------------------------------------------------------- the seam


def inject(writer: cf.RecordWriter, ts: float) -> None:
    """Queues a marker carrying its injection time ``ts`` behind the data on every channel."""
    writer.write(pa.record_batch([pa.array([1], pa.int8()), pa.array([ts]), pa.array([b""])], schema=SCHEMA))


def is_marker(item: pa.RecordBatch) -> bool:
    """Whether a gate item is a marker (data batches have many rows and ``marker`` 0)."""
    return item.num_rows == 1 and item.column(0)[0].as_py() == 1


def marker_time(item: pa.RecordBatch) -> float:
    """The injection time a marker carries (``time.monotonic()`` of the producer)."""
    return float(item.column(1)[0].as_py())


# ------------------------------------------------------------------------------- the workers


def data_batch(seed: int) -> pa.RecordBatch:
    """A data batch of ``BATCH_BYTES`` of payload in 32 rows."""
    rows = 32
    rng = np.random.default_rng(seed)
    payload = [rng.bytes(BATCH_BYTES // rows) for _ in range(rows)]
    return pa.record_batch(
        [pa.array(np.zeros(rows, np.int8)), pa.array(np.zeros(rows)), pa.array(payload, pa.binary())],
        schema=SCHEMA,
    )


def producer(cfg: Config) -> None:
    """cfg: rate (bytes/s per channel), markers, start delay. Writes data broadcast to every
    channel at ``rate``; injects a marker every ``MARKER_INTERVAL`` after ``WARMUP``; after the
    last marker it writes on until "stop", then closes."""
    batches = [data_batch(i) for i in range(4)]
    with environment(cfg["env"]) as env:
        part = env.create_partition("barrier", CHANNELS)
        emit(address=env.address)
        stop = threading.Event()

        def write() -> None:
            with cf.RecordWriter(part, cf.BroadcastPartitioner(), timeout=TIMEOUT) as w:
                start = time.monotonic()
                due = [start + WARMUP + i * MARKER_INTERVAL for i in range(cfg["markers"])]
                i = 0
                while not stop.is_set():
                    if due and time.monotonic() >= due[0]:
                        due.pop(0)
                        inject(w, time.monotonic())
                    w.write(batches[i % len(batches)])
                    i += 1
                    sleep_until(start + i * BATCH_BYTES / cfg["rate"])

        def control() -> None:
            receive()  # "stop"
            stop.set()

        run_threads([control, write], timeout=TIMEOUT * 4)
        emit(done=True)
        receive()  # "exit": the consumer may still be reading what is queued here


def consumer(cfg: Config) -> None:
    """cfg: env, producer, rate (bytes/s over all channels), markers. Reads at ``rate`` until
    every marker came from every channel, reports the latencies and the gate's debloating
    metrics, then reads to the end unpaced."""
    with environment(cfg["env"]) as env:
        gate = env.create_input_gate([cf.ChannelSpec(cfg["producer"], "barrier", i) for i in range(CHANNELS)])
        copies: dict[float, int] = {}
        latencies: list[float] = []
        due = time.monotonic()
        while len(latencies) < cfg["markers"]:
            item = gate.next(timeout=TIMEOUT)
            assert item is not None, "end of stream before the last marker"
            if is_marker(item):
                ts = marker_time(item)
                copies[ts] = copies.get(ts, 0) + 1
                if copies[ts] == CHANNELS:
                    latencies.append(time.monotonic() - ts)
                continue
            # Paced without catching up: a late start must not become a burst.
            due = max(due, time.monotonic()) + item.nbytes / cfg["rate"]
            sleep_until(due)
        g = next(iter(env.metrics()["gates"].values()))
        emit(
            latencies=latencies,
            buffer_size=g.get("debloat_buffer_size"),
            throughput=g.get("debloat_throughput_bytes_per_second"),
        )
        while gate.next(timeout=TIMEOUT) is not None:
            pass


ROLES = {"barrier-producer": producer, "barrier-consumer": consumer}


class BarrierWorker(Worker):
    script = Path(__file__).resolve()


# ------------------------------------------------------------------------------ the benchmark


def drain_latencies(debloat: bool) -> Config:
    """One run: the marker latencies in seconds and what the consumer's gate announced."""
    base = {"segment_size": SEGMENT}
    prod_env = {**base, "memory": PRODUCER_MEMORY}
    cons_env = {**base, "memory": CONSUMER_MEMORY, "debloat": debloat, "debloat_target": TARGET}
    with BarrierWorker(
        "barrier-producer", env=prod_env, rate=SPEEDUP * RATE / CHANNELS, markers=MARKERS
    ) as prod:
        address = prod.read()["address"]
        with BarrierWorker(
            "barrier-consumer", env=cons_env, producer=address, rate=RATE, markers=MARKERS
        ) as cons:
            result = cons.read(timeout=TIMEOUT * 4)
            prod.send(cmd="stop")
            assert prod.read(timeout=TIMEOUT) == {"done": True}
            cons.wait()
            prod.send(cmd="exit")
            prod.wait()
    assert len(result["latencies"]) == MARKERS
    return result


@pytest.mark.benchmark(group="barrier")
def test_aligned_barrier_latency_with_and_without_debloating(benchmark: object, report: Any) -> None:
    runs: dict[bool, list[Config]] = {False: [], True: []}

    def round_() -> None:
        for debloat in (False, True):
            runs[debloat].append(drain_latencies(debloat))

    benchmark.pedantic(round_, rounds=ROUNDS, iterations=1, warmup_rounds=0)  # type: ignore[attr-defined]
    off = statistics.median(x for r in runs[False] for x in r["latencies"])
    on = statistics.median(x for r in runs[True] for x in r["latencies"])
    assert all(r["buffer_size"] is None for r in runs[False])
    assert all(r["buffer_size"] < SEGMENT for r in runs[True]), [r["buffer_size"] for r in runs[True]]
    benchmark.extra_info["runs"] = json.loads(json.dumps({str(k): v for k, v in runs.items()}))  # type: ignore[attr-defined]
    report("aligned marker drain, no debloating (median)", off * 1e3, "ms", None, higher_is_better=False)
    report("aligned marker drain, debloating (median)", on * 1e3, "ms", None, higher_is_better=False)
    report("debloating cuts the drain time by", off / on, "x", 3.0)
    report(
        "debloated buffer size (median)",
        statistics.median(r["buffer_size"] for r in runs[True]),
        "bytes",
        None,
        higher_is_better=False,
    )


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ROLES:
        raise SystemExit(f"usage: {sys.argv[0]} {{{','.join(ROLES)}}} CONFIG_JSON")
    ROLES[sys.argv[1]](json.loads(sys.argv[2]))
