"""Spillable partitions (blocking and hybrid), with pytest-benchmark, driven the way users
call them: ``env.create_partition(..., kind=...)``, ``cf.RecordWriter``, ``cf.InputGate``.

- Blocking write and read-back against an Arrow IPC file written and read with pyarrow in the
  same directory; each round runs pyarrow and then creditflow (paired rounds).
- Hybrid against pipelined under a slow consumer: the producer's time to finish, next to the
  producer alone (no consumer) as the floor.
- Compression of TPC-H-like ``lineitem`` batches: stored stream bytes and write/read rates per
  codec (none, lz4, zstd).

Every benchmark checks what it read (batch and row counts, every batch's first key, one batch
in full) so a broken read cannot look fast. Figures are medians of the timed rounds, measured
inside the round; see docs/benchmarks.md.

Settings (environment variables):

``CREDITFLOW_BENCH_SPILL_MEMORY``  the environments' ``memory`` in MiB (default 64); every
                                   benchmark writes about ten times that
``CREDITFLOW_BENCH_SPILL_DIR``     where spill files and the pyarrow file go (default: pytest's
                                   temporary directory)
``CREDITFLOW_BENCH_SPILL_PACE``    seconds the slow consumer waits after each batch (default
                                   0.005)
"""

from __future__ import annotations

import itertools
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf
import lineitem
from test_bench_local import POOL, ROWS, _batch

pytestmark = pytest.mark.benchmark

MEMORY = int(os.environ.get("CREDITFLOW_BENCH_SPILL_MEMORY", "64")) << 20
VOLUME = 10 * MEMORY  # Arrow payload each run writes: most of it cannot stay in memory
PACE = float(os.environ.get("CREDITFLOW_BENCH_SPILL_PACE", "0.005"))
TIMEOUT = 120.0
LINEITEM_POOL = 8  # distinct lineitem batches, cycled (IPC compresses each buffer on its own)
_ids = itertools.count()

Codec = Literal["lz4", "zstd"] | None
T = TypeVar("T")


def _timed(samples: list[T]) -> list[T]:
    """The timed rounds: without pytest-benchmark's warm-up round when there is more than one
    (``--benchmark-disable`` runs one round)."""
    return samples[1:] if len(samples) > 1 else samples


def _pedantic(benchmark: object, fn: Callable[[], None], rounds: int) -> None:
    benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=1)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def spill_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One directory for the spill files and the pyarrow file (the same file system)."""
    base = os.environ.get("CREDITFLOW_BENCH_SPILL_DIR")
    if base is None:
        yield tmp_path_factory.mktemp("spill")
    else:
        with tempfile.TemporaryDirectory(dir=base, prefix="creditflow-bench-") as d:
            yield Path(d)


@pytest.fixture(scope="module")
def batches() -> list[pa.RecordBatch]:
    """16 distinct 65,536-row batches of test_bench_local.py (int64, int64, float64, utf8)."""
    rng = np.random.default_rng(7)
    return [_batch(rng, ROWS) for _ in range(POOL)]


def _count_for(pool: Sequence[pa.RecordBatch], volume: int = VOLUME) -> int:
    return max(POOL, volume // int(pool[0].nbytes))


def _payload(pool: Sequence[pa.RecordBatch], count: int) -> int:
    return sum(pool[i % len(pool)].nbytes for i in range(count))


class Checker:
    """Checks a stream of batches against ``pool`` cycled: count, rows, every batch's first
    value of its first column (which pool batch it is, so order too), and batch ``full`` in
    full."""

    def __init__(self, pool: Sequence[pa.RecordBatch], count: int) -> None:
        self.pool = pool
        self.count = count
        self.full = count // 2  # in the middle: on disk, not in memory
        self.seen = 0
        self.rows = 0
        self._firsts = [b.column(0)[0].as_py() for b in pool]

    def __call__(self, b: pa.RecordBatch) -> None:
        want = self.pool[self.seen % len(self.pool)]
        assert b.num_rows == want.num_rows, f"batch {self.seen}: {b.num_rows} rows"
        assert b.column(0)[0].as_py() == self._firsts[self.seen % len(self.pool)], (
            f"batch {self.seen} is not the one written there"
        )
        if self.seen == self.full:
            assert b.equals(want), f"batch {self.seen} differs from what was written"
        self.seen += 1
        self.rows += b.num_rows

    def done(self) -> None:
        assert self.seen == self.count, f"read {self.seen} batches of {self.count}"
        assert self.rows == sum(self.pool[i % len(self.pool)].num_rows for i in range(self.count))


# ------------------------------------------------------------------- a. blocking vs an IPC file


def pyarrow_file_round(path: Path, pool: Sequence[pa.RecordBatch], count: int) -> tuple[float, float]:
    """Writes ``count`` batches to an Arrow IPC file with pyarrow and reads them back as a user
    would (``pa.ipc.open_file`` on the path: the bytes are read into memory); removes the file.
    Returns (write seconds, read seconds)."""
    check = Checker(pool, count)
    t0 = time.perf_counter()
    with pa.ipc.new_file(str(path), pool[0].schema) as writer:
        for i in range(count):
            writer.write_batch(pool[i % len(pool)])
    t1 = time.perf_counter()
    with pa.ipc.open_file(str(path)) as reader:
        for i in range(reader.num_record_batches):
            check(reader.get_batch(i))
    t2 = time.perf_counter()
    check.done()
    path.unlink()
    return t1 - t0, t2 - t1


def blocking_round(
    env: cf.NetworkEnvironment,
    pool: Sequence[pa.RecordBatch],
    count: int,
    compression: Codec = None,
) -> dict[str, Any]:
    """Writes ``count`` batches into a new blocking partition (partition creation to
    ``close()``), then reads them back through a local gate (partition request to end of
    stream), checked; releases the partition. Returns the times and the partition's spill metrics."""
    pid = f"blocking/{next(_ids)}"
    t0 = time.perf_counter()
    part = env.create_partition(pid, 1, kind="blocking", compression=compression)
    with cf.RecordWriter(part, timeout=TIMEOUT) as writer:
        for i in range(count):
            writer.write(pool[i % len(pool)])
    t1 = time.perf_counter()
    check = Checker(pool, count)
    with env.create_input_gate([cf.ChannelSpec(env.address, pid, 0)]) as gate:
        while (b := gate.next(timeout=TIMEOUT)) is not None:
            check(b)
    t2 = time.perf_counter()
    check.done()
    spill = part.metrics()["spill"]
    assert spill is not None
    part.release()
    return {"write": t1 - t0, "read": t2 - t1, "spill": spill}


@pytest.mark.benchmark(group="spill-blocking")
def test_blocking_vs_pyarrow_ipc_file(
    benchmark: object, report: Any, batches: list[pa.RecordBatch], spill_root: Path
) -> None:
    """About ten times ``memory`` of 65,536-row batches into a blocking partition and back
    through a local gate, against the same batches into an Arrow IPC file with pyarrow and
    back, in the same directory. Each round: pyarrow, then creditflow."""
    count = _count_for(batches)
    payload = _payload(batches, count)
    pairs: list[tuple[tuple[float, float], dict[str, Any]]] = []
    with cf.NetworkEnvironment(memory=MEMORY, spill_dir=str(spill_root)) as env:

        def run() -> None:
            theirs = pyarrow_file_round(spill_root / "batches.arrow", batches, count)
            ours = blocking_round(env, batches, count)
            spill = ours["spill"]
            assert spill["spilled_bytes"] >= 0.8 * spill["stream_bytes"], f"mostly in memory: {spill}"
            pairs.append((theirs, ours))

        _pedantic(benchmark, run, rounds=5)
    pairs = _timed(pairs)

    def gbps(seconds: float) -> float:
        return payload / seconds / 1e9

    extra = benchmark.extra_info  # type: ignore[attr-defined]
    extra["batches"] = count
    extra["payload bytes"] = payload
    extra["spilled bytes"] = pairs[-1][1]["spill"]["spilled_bytes"]
    extra["stream bytes"] = pairs[-1][1]["spill"]["stream_bytes"]
    extra["rounds (pyarrow write, read; creditflow write, read) s"] = [
        (t[0], t[1], o["write"], o["read"]) for t, o in pairs
    ]
    report("pyarrow ipc file write", statistics.median(gbps(t[0]) for t, _ in pairs), "GB/s")
    report("pyarrow ipc file read", statistics.median(gbps(t[1]) for t, _ in pairs), "GB/s")
    report("blocking write", statistics.median(gbps(o["write"]) for _, o in pairs), "GB/s")
    report("blocking read", statistics.median(gbps(o["read"]) for _, o in pairs), "GB/s")
    report("blocking/pyarrow write", statistics.median(t[0] / o["write"] for t, o in pairs), "x")
    report("blocking/pyarrow read", statistics.median(t[1] / o["read"] for t, o in pairs), "x")


# ------------------------------------------------------- b. hybrid vs pipelined, slow consumer


def producer_run(
    env: cf.NetworkEnvironment,
    kind: Literal["pipelined", "hybrid"],
    pool: Sequence[pa.RecordBatch],
    count: int,
    pace: float | None,
) -> dict[str, Any]:
    """Writes ``count`` batches into a new ``kind`` partition from this thread while a local
    gate in another thread takes one batch every ``pace`` seconds (``None``: no reader at all).
    Returns the producer's seconds (first ``write`` to ``close()`` returning), how many
    batches the reader had by then, and the spill metrics; waits for the reader and checks what it got."""
    pid = f"{kind}/{next(_ids)}"
    part = env.create_partition(pid, 1, kind=kind)
    check = Checker(pool, count)
    errors: list[BaseException] = []
    reader: threading.Thread | None = None
    if pace is not None:
        gate = env.create_input_gate([cf.ChannelSpec(env.address, pid, 0)])

        def read() -> None:
            try:
                with gate:
                    while (b := gate.next(timeout=TIMEOUT)) is not None:
                        check(b)
                        time.sleep(pace)
            except BaseException as exc:
                errors.append(exc)

        reader = threading.Thread(target=read, name="bench-slow-reader", daemon=True)
        reader.start()
    t0 = time.perf_counter()
    with cf.RecordWriter(part, timeout=TIMEOUT) as writer:
        for i in range(count):
            writer.write(pool[i % len(pool)])
    seconds = time.perf_counter() - t0
    read_by_then = check.seen
    spill = part.metrics()["spill"]
    if reader is not None:
        reader.join(TIMEOUT + count * (pace or 0.0))
        assert not reader.is_alive(), "reader hung"
        if errors:
            raise errors[0]
        check.done()
    part.release()
    return {"seconds": seconds, "read_by_then": read_by_then, "spill": spill}


@pytest.mark.benchmark(group="spill-hybrid")
def test_hybrid_vs_pipelined_slow_consumer(
    benchmark: object, report: Any, batches: list[pa.RecordBatch], spill_root: Path
) -> None:
    """About ten times ``memory`` written while a local reader takes one batch every PACE
    seconds: the producer's time to finish with a hybrid partition and with a pipelined one,
    and alone into a hybrid partition nobody reads (the floor). Each round runs all three, in
    turn from a different one each round."""
    count = _count_for(batches)
    rounds: list[dict[str, dict[str, Any]]] = []
    with cf.NetworkEnvironment(memory=MEMORY, spill_dir=str(spill_root)) as env:
        runs: dict[str, Callable[[], dict[str, Any]]] = {
            "alone": lambda: producer_run(env, "hybrid", batches, count, None),
            "hybrid": lambda: producer_run(env, "hybrid", batches, count, PACE),
            "pipelined": lambda: producer_run(env, "pipelined", batches, count, PACE),
        }
        order = list(runs)
        turn = itertools.count()

        def run() -> None:
            k = next(turn) % len(order)
            rounds.append({name: runs[name]() for name in order[k:] + order[:k]})
            hybrid = rounds[-1]["hybrid"]
            assert hybrid["spill"]["spilled_bytes"] > 0, hybrid

        _pedantic(benchmark, run, rounds=5)
    rounds = _timed(rounds)

    extra = benchmark.extra_info  # type: ignore[attr-defined]
    extra["batches"] = count
    extra["payload bytes"] = _payload(batches, count)
    extra["reader pace s"] = PACE
    extra["rounds (alone, hybrid, pipelined) s"] = [
        (r["alone"]["seconds"], r["hybrid"]["seconds"], r["pipelined"]["seconds"]) for r in rounds
    ]
    extra["batches read when the producer finished (hybrid, pipelined)"] = [
        (r["hybrid"]["read_by_then"], r["pipelined"]["read_by_then"]) for r in rounds
    ]
    extra["spilled bytes (alone, hybrid)"] = [
        (r["alone"]["spill"]["spilled_bytes"], r["hybrid"]["spill"]["spilled_bytes"]) for r in rounds
    ]

    def med(kind: str) -> float:
        return float(statistics.median(r[kind]["seconds"] for r in rounds))

    report("producer alone (hybrid, no reader)", med("alone"), "s", higher_is_better=False)
    report("producer, hybrid, slow reader", med("hybrid"), "s", higher_is_better=False)
    report("producer, pipelined, slow reader", med("pipelined"), "s", higher_is_better=False)
    report(
        "pipelined/hybrid producer time",
        statistics.median(r["pipelined"]["seconds"] / r["hybrid"]["seconds"] for r in rounds),
        "x",
    )
    report(
        "hybrid/alone producer time",
        statistics.median(r["hybrid"]["seconds"] / r["alone"]["seconds"] for r in rounds),
        "x",
        higher_is_better=False,
    )


# -------------------------------------------------------------- c. compression, TPC-H lineitem


@pytest.fixture(scope="module")
def lineitem_batches() -> list[pa.RecordBatch]:
    """LINEITEM_POOL consecutive 65,536-row lineitem batches from a fixed seed (about 10.6 MB
    of Arrow data each)."""
    return lineitem.batches(1992, LINEITEM_POOL, ROWS)


def pyarrow_ipc_bytes(pool: Sequence[pa.RecordBatch], compression: Codec) -> int:
    """Size of an Arrow IPC stream of ``pool`` written by pyarrow with ``compression``: a
    cross-check of the ratio creditflow stores."""
    sink = pa.MockOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, pool[0].schema, options=options) as w:
        for b in pool:
            w.write_batch(b)
    return int(sink.size())


CODECS: list[Codec] = [None, "lz4", "zstd"]


def _codec_name(codec: Codec) -> str:
    return codec or "none"


@pytest.mark.benchmark(group="spill-compression")
def test_compression_lineitem(
    benchmark: object, report: Any, lineitem_batches: list[pa.RecordBatch], spill_root: Path
) -> None:
    """About ten times ``memory`` of lineitem batches into blocking partitions without
    compression, with lz4 and with zstd, each read back once through a local gate: stored
    stream bytes per codec, and write and read rates. Each round runs the three codecs, in
    turn from a different one each round."""
    lineitem.check(lineitem_batches)
    count = _count_for(lineitem_batches)
    payload = _payload(lineitem_batches, count)
    runs: dict[str, list[dict[str, Any]]] = {_codec_name(c): [] for c in CODECS}
    turn = itertools.count()
    with cf.NetworkEnvironment(memory=MEMORY, spill_dir=str(spill_root)) as env:

        def run() -> None:
            k = next(turn)
            for codec in CODECS[k % 3 :] + CODECS[: k % 3]:
                runs[_codec_name(codec)].append(blocking_round(env, lineitem_batches, count, codec))

        _pedantic(benchmark, run, rounds=4)

    extra = benchmark.extra_info  # type: ignore[attr-defined]
    extra["batches"] = count
    extra["payload bytes"] = payload
    extra["lineitem rows"] = count * ROWS
    stored = {name: rs[-1]["spill"]["stream_bytes"] for name, rs in runs.items()}
    for name, rs in runs.items():
        assert {r["spill"]["stream_bytes"] for r in rs} == {stored[name]}, "stored bytes vary between runs"
    extra["stream bytes"] = stored
    extra["arrow bytes / stored bytes, no compression"] = payload / stored["none"]
    plain = pyarrow_ipc_bytes(lineitem_batches, None)
    for codec in CODECS:
        name = _codec_name(codec)
        rs = _timed(runs[name])
        report(f"lineitem {name} write", statistics.median(payload / r["write"] / 1e9 for r in rs), "GB/s")
        report(f"lineitem {name} read", statistics.median(payload / r["read"] / 1e9 for r in rs), "GB/s")
        if codec is not None:
            report(f"lineitem {name} ratio", stored["none"] / stored[name], "x")
            theirs = plain / pyarrow_ipc_bytes(lineitem_batches, codec)
            extra[f"pyarrow ipc {name} ratio (same batches)"] = theirs
