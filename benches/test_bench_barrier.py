"""Checkpoint barrier latency under steady backpressure: aligned without and with buffer
debloating, and unaligned, with pytest-benchmark.

Two OS processes over loopback: a producer writes to a partition of ``CHANNELS`` (4)
subpartitions at ten times the rate its consumer reads the ``CHANNELS`` remote channels of one
gate, so the producer's queues and the gate's buffers are full all the time. Every
``MARKER_INTERVAL`` the producer injects checkpoint barrier ``id`` with
``RecordWriter.broadcast_barrier`` and notes the time; the consumer notes when the gate yields
``Barrier(id)``. Both clocks are ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for every
process on the host), so the difference is the injection-to-surfacing latency.

* **aligned**: the barrier queues behind the data on every channel and surfaces once the last
  channel delivered it: about the bytes in flight (the producer's queue plus the gate's
  buffers) over the consumer's rate.
* **aligned + debloating**: the gate has its producer cut buffers so that the same number of
  buffers holds about ``debloat_target`` seconds of data, so less is in flight.
* **unaligned**: the barrier overtakes the queued data on the producer, on the wire and in
  the gate, and surfaces when the first channel delivers it.

:func:`inject`, :func:`barrier_id` are the only places that know what a barrier is.

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

SCHEMA = pa.schema([("payload", pa.binary())])


# --------------------------------------------------------------------------------- the seam


def inject(writer: cf.RecordWriter, checkpoint_id: int, unaligned: bool) -> float:
    """Injects checkpoint barrier ``checkpoint_id`` on every channel; returns the injection time."""
    ts = time.monotonic()
    writer.broadcast_barrier(checkpoint_id, unaligned=unaligned)
    return ts


def barrier_id(item: object) -> int | None:
    """The checkpoint id of a gate item that is a barrier, else None."""
    return item.checkpoint_id if isinstance(item, cf.Barrier) else None


# ------------------------------------------------------------------------------- the workers


def data_batch(seed: int) -> pa.RecordBatch:
    """A data batch of ``BATCH_BYTES`` of payload in 32 rows."""
    rows = 32
    rng = np.random.default_rng(seed)
    payload = [rng.bytes(BATCH_BYTES // rows) for _ in range(rows)]
    return pa.record_batch([pa.array(payload, pa.binary())], schema=SCHEMA)


def producer(cfg: Config) -> None:
    """cfg: env, rate (bytes/s per channel), markers, unaligned. Writes data broadcast to every
    channel at ``rate``; injects barrier 1, 2, ... every ``MARKER_INTERVAL`` after ``WARMUP``;
    after the last one it writes on until "stop", then reports the injection times and closes."""
    batches = [data_batch(i) for i in range(4)]
    with environment(cfg["env"]) as env:
        part = env.create_partition("barrier", CHANNELS)
        emit(address=env.address)
        stop = threading.Event()
        injected: list[float] = []

        def write() -> None:
            with cf.RecordWriter(part, cf.BroadcastPartitioner(), timeout=TIMEOUT) as w:
                start = time.monotonic()
                due = [start + WARMUP + i * MARKER_INTERVAL for i in range(cfg["markers"])]
                i = 0
                while not stop.is_set():
                    if due and time.monotonic() >= due[0]:
                        due.pop(0)
                        injected.append(inject(w, len(injected) + 1, cfg["unaligned"]))
                    w.write(batches[i % len(batches)])
                    i += 1
                    sleep_until(start + i * BATCH_BYTES / cfg["rate"])

        def control() -> None:
            receive()  # "stop"
            stop.set()

        run_threads([control, write], timeout=TIMEOUT * 4)
        emit(done=True, injected=injected)
        receive()  # "exit": the consumer may still be reading what is queued here


def consumer(cfg: Config) -> None:
    """cfg: env, producer, rate (bytes/s over all channels), markers. Reads at ``rate`` until
    every barrier came out, reports when each did and the gate's debloating metrics, then reads
    to the end unpaced."""
    with environment(cfg["env"]) as env:
        gate = env.create_input_gate([cf.ChannelSpec(cfg["producer"], "barrier", i) for i in range(CHANNELS)])
        surfaced: dict[int, float] = {}
        due = time.monotonic()
        items = gate.items(timeout=TIMEOUT)
        while len(surfaced) < cfg["markers"]:
            item = next(items)
            ckpt = barrier_id(item)
            if ckpt is not None:
                assert ckpt not in surfaced, f"barrier {ckpt} came out twice"
                surfaced[ckpt] = time.monotonic()
                continue
            assert isinstance(item, cf.Batch), f"unexpected {item!r}"
            # Paced without catching up: a late start must not become a burst.
            due = max(due, time.monotonic()) + item.batch.nbytes / cfg["rate"]
            sleep_until(due)
        debloat = next(iter(env.metrics()["gates"].values()))["debloat"] or {}
        emit(
            surfaced=[surfaced[i + 1] for i in range(cfg["markers"])],
            buffer_size=debloat.get("buffer_size"),
            throughput=debloat.get("throughput"),
        )
        for _ in items:
            pass


ROLES = {"barrier-producer": producer, "barrier-consumer": consumer}


class BarrierWorker(Worker):
    script = Path(__file__).resolve()


# ------------------------------------------------------------------------------ the benchmark


MODES = {  # name: (unaligned, debloat)
    "aligned": (False, False),
    "aligned+debloat": (False, True),
    "unaligned": (True, False),
}


def barrier_latencies(unaligned: bool, debloat: bool) -> Config:
    """One run: each barrier's injection-to-surfacing latency in seconds, and what the
    consumer's gate announced."""
    base = {"segment_size": SEGMENT}
    prod_env = {**base, "memory": PRODUCER_MEMORY}
    cons_env = {**base, "memory": CONSUMER_MEMORY, "debloat": debloat, "debloat_target": TARGET}
    with BarrierWorker(
        "barrier-producer",
        env=prod_env,
        rate=SPEEDUP * RATE / CHANNELS,
        markers=MARKERS,
        unaligned=unaligned,
    ) as prod:
        address = prod.read()["address"]
        with BarrierWorker(
            "barrier-consumer", env=cons_env, producer=address, rate=RATE, markers=MARKERS
        ) as cons:
            result = cons.read(timeout=TIMEOUT * 4)
            prod.send(cmd="stop")
            done = prod.read(timeout=TIMEOUT)
            assert done["done"] is True
            cons.wait()
            prod.send(cmd="exit")
            prod.wait()
    assert len(done["injected"]) == len(result["surfaced"]) == MARKERS
    result["latencies"] = [s - i for i, s in zip(done["injected"], result["surfaced"], strict=True)]
    assert all(x >= 0 for x in result["latencies"]), result["latencies"]
    return result


@pytest.mark.benchmark(group="barrier")
def test_barrier_latency_aligned_debloated_unaligned(benchmark: object, report: Any) -> None:
    runs: dict[str, list[Config]] = {mode: [] for mode in MODES}

    def round_() -> None:
        for mode, (unaligned, debloat) in MODES.items():
            runs[mode].append(barrier_latencies(unaligned, debloat))

    benchmark.pedantic(round_, rounds=ROUNDS, iterations=1, warmup_rounds=0)  # type: ignore[attr-defined]
    median = {mode: statistics.median(x for r in rs for x in r["latencies"]) for mode, rs in runs.items()}
    assert all(r["buffer_size"] is None for r in runs["aligned"] + runs["unaligned"])
    sizes = [r["buffer_size"] for r in runs["aligned+debloat"]]
    assert all(size < SEGMENT for size in sizes), sizes
    benchmark.extra_info["runs"] = json.loads(json.dumps(runs))  # type: ignore[attr-defined]
    report(
        "aligned barrier, no debloating (median)", median["aligned"] * 1e3, "ms", None, higher_is_better=False
    )
    report(
        "aligned barrier, debloating (median)",
        median["aligned+debloat"] * 1e3,
        "ms",
        None,
        higher_is_better=False,
    )
    report("debloating cuts the aligned latency by", median["aligned"] / median["aligned+debloat"], "x", 3.0)
    report("unaligned barrier (median)", median["unaligned"] * 1e3, "ms", 100.0, higher_is_better=False)
    report("debloated buffer size (median)", statistics.median(sizes), "bytes", None, higher_is_better=False)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ROLES:
        raise SystemExit(f"usage: {sys.argv[0]} {{{','.join(ROLES)}}} CONFIG_JSON")
    ROLES[sys.argv[1]](json.loads(sys.argv[2]))
