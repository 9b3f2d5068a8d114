"""Local (same-environment) exchange benchmarks of creditflow, with pytest-benchmark.

Run with ``make bench``, or ``pytest benches/ --benchmark-only``; see docs/benchmarks.md.
Each benchmark checks its result first, then times; headline figures (GB/s, µs per batch,
speed-up over numpy) go to ``benchmark.extra_info`` and the end-of-session table.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf

pytestmark = pytest.mark.benchmark

ROWS = 65_536
SMALL_ROWS = 1_024
POOL = 16  # distinct pre-built batches, cycled
TIMEOUT = 60.0
_ids = itertools.count()


def _batch(rng: np.random.Generator, rows: int) -> pa.RecordBatch:
    """(int64, int64, float64, utf8 of about 8 characters)."""
    words = np.char.add("k", rng.integers(0, 10**7, rows).astype(str))  # "k" + up to 7 digits
    return pa.record_batch(
        {
            "k1": pa.array(rng.integers(-(2**62), 2**62, rows), pa.int64()),
            "k2": pa.array(rng.integers(0, 1000, rows), pa.int64()),
            "v": pa.array(rng.random(rows), pa.float64()),
            "s": pa.array(words.tolist(), pa.string()),
        }
    )


@pytest.fixture(scope="module")
def big_batches() -> list[pa.RecordBatch]:
    rng = np.random.default_rng(7)
    return [_batch(rng, ROWS) for _ in range(POOL)]


@pytest.fixture(scope="module")
def small_batches() -> list[pa.RecordBatch]:
    rng = np.random.default_rng(8)
    return [_batch(rng, SMALL_ROWS) for _ in range(POOL)]


def _median(samples: list[float]) -> float:
    # The first sample is pytest-benchmark's warm-up round when there is more than one.
    return statistics.median(samples[1:] if len(samples) > 1 else samples)


def _pedantic(benchmark: object, fn: Callable[[], None], rounds: int) -> None:
    benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=1)  # type: ignore[attr-defined]


def exchange(
    env: cf.NetworkEnvironment,
    partitioner: object,
    num_subpartitions: int,
    batches: Sequence[pa.RecordBatch],
    count: int,
    consume: Callable[[pa.RecordBatch], None],
    reader_env: cf.NetworkEnvironment | None = None,
) -> None:
    """Writes ``count`` batches (cycling ``batches``) from a thread into a fresh partition,
    reads every subpartition through one gate in this thread, and waits for the writer.
    With ``reader_env``, the gate is there (a remote exchange over TCP)."""
    pid = f"bench/{next(_ids)}"
    part = env.create_partition(pid, num_subpartitions)
    gate = (reader_env or env).create_input_gate(
        [cf.ChannelSpec(env.address, pid, i) for i in range(num_subpartitions)]
    )
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with cf.RecordWriter(part, partitioner, timeout=TIMEOUT) as w:  # type: ignore[arg-type]
                for i in range(count):
                    w.write(batches[i % len(batches)])
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write, name="bench-writer", daemon=True)
    writer.start()
    try:
        while (batch := gate.next(timeout=TIMEOUT)) is not None:
            consume(batch)
    finally:
        writer.join(TIMEOUT)
        gate.close()
    assert not writer.is_alive(), "writer hung"
    if errors:
        raise errors[0]


def _throughput(
    benchmark: object,
    report: object,
    *,
    local_handoff: bool,
    count: int,
    rounds: int,
    batches: list[pa.RecordBatch],
    name: str,
    target: float | None,
) -> None:
    payload = sum(batches[i % len(batches)].nbytes for i in range(count))
    with cf.NetworkEnvironment(memory="128MiB", local_handoff=local_handoff) as env:
        # Correctness first: every batch arrives, in order, with its content.
        received: list[pa.RecordBatch] = []
        exchange(env, cf.ForwardPartitioner(), 1, batches, 2 * len(batches), received.append)
        assert len(received) == 2 * len(batches)
        for i, got in enumerate(received):
            assert got.equals(batches[i % len(batches)]), f"batch {i} differs"
        if local_handoff:
            assert received[0] is batches[0], "local hand-off returns the writer's own batch"

        samples: list[float] = []

        def run() -> None:
            seen = [0, 0]

            def consume(b: pa.RecordBatch) -> None:
                seen[0] += 1
                seen[1] += b.nbytes

            t0 = time.perf_counter()
            exchange(env, cf.ForwardPartitioner(), 1, batches, count, consume)
            samples.append(time.perf_counter() - t0)
            assert seen == [count, payload]

        _pedantic(benchmark, run, rounds)
    report(name, payload / _median(samples) / 1e9, "GB/s", target)


# --------------------------------------------------------------------------- a. forward hand-off


@pytest.mark.benchmark(group="forward-65536-rows")
def test_forward_handoff_throughput(
    benchmark: object, report: object, big_batches: list[pa.RecordBatch]
) -> None:
    """Forward exchange, 65,536-row batches, zero-copy local hand-off: GB/s of Arrow payload."""
    _throughput(
        benchmark,
        report,
        local_handoff=True,
        count=512,
        rounds=15,
        batches=big_batches,
        name="forward hand-off",
        target=5.0,
    )


# ------------------------------------------------------------------------- d. forward serialized


@pytest.mark.benchmark(group="forward-65536-rows")
def test_forward_serialized_throughput(
    benchmark: object, report: object, big_batches: list[pa.RecordBatch]
) -> None:
    """Same exchange with local_handoff=False: Arrow IPC into segments and back (for information)."""
    _throughput(
        benchmark,
        report,
        local_handoff=False,
        count=64,
        rounds=10,
        batches=big_batches,
        name="forward serialized",
        target=None,
    )


# ------------------------------------------------------------------------ b. hash split to four


C1 = np.uint32(0xCC9E2D51)
C2 = np.uint32(0x1B873593)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k: np.ndarray) -> np.ndarray:
    return _rotl(k * C1, 15) * C2


def _mix_h1(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    return _rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h: np.ndarray, length: int) -> np.ndarray:
    h = h ^ np.uint32(length)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def spark_hash_long(values: np.ndarray, seed: int = 42) -> np.ndarray:
    """Spark's ``Murmur3_x86_32.hashLong`` over an int64 array (no nulls): low word, then high."""
    u = values.view(np.uint64)
    low = (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (u >> np.uint64(32)).astype(np.uint32)
    h = np.full(len(values), seed, dtype=np.uint32)
    h = _mix_h1(h, _mix_k1(low))
    h = _mix_h1(h, _mix_k1(high))
    return _fmix(h, 8).view(np.int32)


def numpy_partition_ids(batch: pa.RecordBatch, key: str, n: int) -> np.ndarray:
    # pmod: numpy's % on a positive divisor is already non-negative, like Spark's pmod.
    return np.mod(spark_hash_long(batch.column(key).to_numpy()), n)


def numpy_split(batch: pa.RecordBatch, key: str, n: int) -> list[pa.RecordBatch]:
    """The same split as creditflow's HashPartitioner, in numpy + pyarrow (one filter per
    target, which beat sort + take + slice on these batches)."""
    ids = numpy_partition_ids(batch, key, n)
    return [batch.filter(pa.array(ids == p)) for p in range(n)]


HASH_BATCHES = 32
HASH_N = 4


@pytest.mark.benchmark(group="hash-split-4")
def test_hash_split_numpy_baseline(
    benchmark: object, report: object, big_batches: list[pa.RecordBatch]
) -> None:
    """Baseline: numpy Murmur3 + pmod + pyarrow filter per subpartition, one thread."""
    # Correctness: the numpy hash gives Spark's partition ids (checked against creditflow).
    sample = big_batches[0]
    with cf.NetworkEnvironment(memory="128MiB") as env:
        part = env.create_partition("hash-check", HASH_N)
        gates = [env.create_input_gate([cf.ChannelSpec(env.address, "hash-check", i)]) for i in range(HASH_N)]
        with cf.RecordWriter(part, cf.HashPartitioner(["k1"]), timeout=TIMEOUT) as w:
            w.write(sample)
        expected = numpy_split(sample, "k1", HASH_N)
        for sub, gate in enumerate(gates):
            got = pa.Table.from_batches(list(gate), schema=sample.schema)
            assert got.equals(pa.Table.from_batches([expected[sub]])), (
                f"subpartition {sub} differs from numpy"
            )
            assert (numpy_partition_ids(got.combine_chunks().to_batches()[0], "k1", HASH_N) == sub).all()

    samples: list[float] = []

    def run() -> None:
        t0 = time.perf_counter()
        rows = 0
        for i in range(HASH_BATCHES):
            rows += sum(p.num_rows for p in numpy_split(big_batches[i % POOL], "k1", HASH_N))
        samples.append(time.perf_counter() - t0)
        assert rows == HASH_BATCHES * ROWS

    _pedantic(benchmark, run, rounds=8)
    report(
        "hash split numpy", _median(samples) / HASH_BATCHES * 1e3, "ms/batch", None, higher_is_better=False
    )


def _numpy_ms_per_batch(batches: list[pa.RecordBatch]) -> float:
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(HASH_BATCHES):
            numpy_split(batches[i % POOL], "k1", HASH_N)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) / HASH_BATCHES * 1e3


@pytest.mark.benchmark(group="hash-split-4")
def test_hash_split_creditflow(benchmark: object, report: object, big_batches: list[pa.RecordBatch]) -> None:
    """HashPartitioner(["k1"]) to 4 subpartitions, end to end: writer thread, one gate over
    the 4 channels; compared with the numpy baseline measured in the same session."""
    samples: list[float] = []
    with cf.NetworkEnvironment(memory="128MiB") as env:
        # Correctness: every row once, each in the subpartition numpy's Spark hash says
        # (one gate per subpartition here, to know where each piece came from).
        part = env.create_partition("hash-rows", HASH_N)
        gates = [env.create_input_gate([cf.ChannelSpec(env.address, "hash-rows", i)]) for i in range(HASH_N)]
        with cf.RecordWriter(part, cf.HashPartitioner(["k1"]), timeout=TIMEOUT) as w:
            for b in big_batches[:4]:
                w.write(b)
        total = 0
        for sub, gate in enumerate(gates):
            for b in gate:
                assert (numpy_partition_ids(b, "k1", HASH_N) == sub).all()
                total += b.num_rows
        assert total == 4 * ROWS

        def run() -> None:
            rows = [0]

            def consume(b: pa.RecordBatch) -> None:
                rows[0] += b.num_rows

            t0 = time.perf_counter()
            exchange(env, cf.HashPartitioner(["k1"]), HASH_N, big_batches, HASH_BATCHES, consume)
            samples.append(time.perf_counter() - t0)
            assert rows[0] == HASH_BATCHES * ROWS

        _pedantic(benchmark, run, rounds=8)
    ms = _median(samples) / HASH_BATCHES * 1e3
    report("hash split creditflow", ms, "ms/batch", None, higher_is_better=False)
    baseline = report.get("hash split numpy")  # type: ignore[attr-defined]
    numpy_ms = baseline.value if baseline is not None else _numpy_ms_per_batch(big_batches)
    report("hash split speed-up vs numpy", numpy_ms / ms, "x", 2.0)


# --------------------------------------------------------------- c. per-batch cost, small batches

SMALL_COUNT = 2_000


def _per_batch(
    benchmark: object,
    report: object,
    batches: list[pa.RecordBatch],
    *,
    local_handoff: bool,
    name: str,
    target: float | None,
) -> None:
    # buffer_timeout=0: every write is flushed, so the serialized path can read it back at once.
    with cf.NetworkEnvironment(memory="64MiB", local_handoff=local_handoff, buffer_timeout=0) as env:
        samples: list[float] = []

        def run(count: int = SMALL_COUNT, check: bool = False) -> None:
            pid = f"small/{next(_ids)}"
            part = env.create_partition(pid, 1)
            gate = env.create_input_gate([cf.ChannelSpec(env.address, pid, 0)])
            writer = cf.RecordWriter(part, cf.ForwardPartitioner(), timeout=TIMEOUT)
            t0 = time.perf_counter()
            for i in range(count):
                batch = batches[i % POOL]
                writer.write(batch)
                got = gate.next(timeout=TIMEOUT)
                if check:
                    assert got is not None
                    assert got.equals(batch)
            elapsed = time.perf_counter() - t0
            writer.close()
            assert gate.next(timeout=TIMEOUT) is None
            gate.close()
            if not check:
                samples.append(elapsed)

        run(count=3 * POOL, check=True)
        _pedantic(benchmark, run, rounds=10)
    report(name, _median(samples) / SMALL_COUNT * 1e6, "us/batch", target, higher_is_better=False)


@pytest.mark.benchmark(group="per-batch-1024-rows")
def test_small_batch_handoff_latency(
    benchmark: object, report: object, small_batches: list[pa.RecordBatch]
) -> None:
    """write + gate.next of one 1,024-row batch, interleaved in one thread, local hand-off."""
    _per_batch(
        benchmark, report, small_batches, local_handoff=True, name="1024-row batch hand-off", target=20.0
    )


@pytest.mark.benchmark(group="per-batch-1024-rows")
def test_small_batch_serialized_latency(
    benchmark: object, report: object, small_batches: list[pa.RecordBatch]
) -> None:
    """The same through the serialized path (local_handoff=False), for information."""
    _per_batch(
        benchmark, report, small_batches, local_handoff=False, name="1024-row batch serialized", target=None
    )
