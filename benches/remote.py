"""Worker processes of the remote benchmarks (``benches/test_bench_remote.py``), and the
parent-side :class:`Worker` that starts and drives them.

Every worker is a separate OS process, ``python benches/remote.py ROLE CONFIG_JSON``. It talks
to the parent in JSON lines: it prints one object per line on stdout (its address, "warm",
its result) and reads one object per line on stdin ("go" with a start time, "exit"). Its
stderr goes to a file that the parent shows when the worker fails.

Times that cross processes are ``time.monotonic()``: on Linux that is ``CLOCK_MONOTONIC``,
one clock for the whole machine, so a producer's start and a consumer's end can be
subtracted. Every transfer is timed from the producer's first timed write (after a warm-up
that has connected every channel) to the consumer's end of stream.

Roles:

``cf-producer``     partitions in one NetworkEnvironment, one writer thread each: warm-up
                    batches, then ``count`` timed batches from ``start_at``, then close
``cf-consumer``     gates in one NetworkEnvironment, one reader thread each: reads the warm-up,
                    reports "warm", reads to end of stream, reports rows and the end time
``lat-producer``    one partition, ``buffer_timeout=0``: small batches numbered 0..count-1,
                    one every ``interval`` seconds; reports each send time
``lat-consumer``    one gate; reports each batch's receive time
``hol-producer``    two partitions "hol/a" and "hol/b" (one subpartition each, one writer
                    thread each) writing continuously on a schedule of absolute times
``hol-consumer``    two gates (one channel each, over one connection); reader "a" stops
                    reading for ``stall`` seconds; reports both receive timelines
``flight-server``   pyarrow.flight server; ``do_get`` streams ``count`` pool batches
``flight-client``   one warm-up ``do_get`` of one batch, then one timed ``do_get``
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import creditflow as cf

# The worker harness is the tests' (tests/workers.py): one copy for tests and benchmarks.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from workers import Config, WorkerError, emit, environment, partitioner, receive, run_threads, sleep_until
from workers import Worker as _Worker

ROWS = 65_536
POOL = 4  # distinct pre-built batches, cycled
SEED = 11
TIMEOUT = 120.0  # any single wait of a worker or of the parent


def make_batches(
    rows: int = ROWS, pool: int = POOL, seed: int = SEED, columns: str = "mixed"
) -> list[pa.RecordBatch]:
    """``pool`` distinct batches ``k: int64, v: float64, s: utf8`` ("k" + up to 7 digits, about
    8 characters). 65,536 rows are about 1.83 MB of Arrow data (``RecordBatch.nbytes``,
    1,827,677 to 1,827,930 bytes for the default pool: 8 + 8 bytes a row, 4 of offsets, 7.9 of
    characters, and validity bitmaps). ``columns="numeric"``: ``k, a: int64, v, b: float64``
    instead (32 bytes a row: 65,536 rows are 2 MiB). Deterministic: every process that calls
    this with the same arguments gets the same batches."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(pool):
        if columns == "numeric":
            ints = rng.integers(-(2**62), 2**62, (2, rows))
            floats = rng.random((2, rows))
            out.append(pa.record_batch({"k": ints[0], "a": ints[1], "v": floats[0], "b": floats[1]}))
            continue
        words = np.char.add("k", rng.integers(0, 10**7, rows).astype(str))
        out.append(
            pa.record_batch(
                {
                    "k": pa.array(rng.integers(-(2**62), 2**62, rows), pa.int64()),
                    "v": pa.array(rng.random(rows), pa.float64()),
                    "s": pa.array(words.tolist(), pa.string()),
                }
            )
        )
    return out


def payload_bytes(batches: list[pa.RecordBatch], count: int, start: int = 0) -> int:
    """Bytes of Arrow data (``nbytes``) in ``count`` batches cycled from ``batches[start]`` on."""
    return sum(batches[i % len(batches)].nbytes for i in range(start, start + count))


# ------------------------------------------------------------------------------- worker side


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of this process's live threads so far, by thread id, with
    each thread's name (``creditflow-io``, ``creditflow-flusher``, ``python`` for the
    interpreter's threads...); empty where ``/proc`` has no per-thread stat."""
    out: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    with contextlib.suppress(OSError):
        for task in Path("/proc/self/task").iterdir():
            with contextlib.suppress(OSError):
                stat = (task / "stat").read_text()
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2 :].split()
                out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


class SelfTimed:
    """The CPU seconds of threads that time themselves (``time.thread_time``) because they end
    before the process's last look at ``/proc``: an ended thread's time is gone from there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[int, float] = {}

    def add(self, since: float) -> None:
        """Counts this thread's CPU seconds since ``since`` (its ``time.thread_time()`` then)."""
        with self._lock:
            self.seconds[threading.get_native_id()] = time.thread_time() - since


def thread_cpu_since(before: dict[int, tuple[str, float]], timed: SelfTimed) -> dict[str, float]:
    """CPU seconds by thread name since ``before`` (a :func:`thread_cpu`): the live threads'
    from ``/proc``, and those of ``timed`` (interpreter threads) as they counted them."""
    out: dict[str, float] = {}
    for tid, (name, secs) in thread_cpu().items():
        if tid not in timed.seconds:
            out[name] = out.get(name, 0.0) + secs - before.get(tid, (name, 0.0))[1]
    for secs in timed.seconds.values():
        out["python"] = out.get("python", 0.0) + secs
    return {k: round(v, 3) for k, v in out.items()}


def _gates(env: cf.NetworkEnvironment, specs: list[list[list[Any]]]) -> list[cf.InputGate]:
    """One gate per entry of ``specs``; an entry lists channels as [address, partition, sub]."""
    return [env.create_input_gate([cf.ChannelSpec(a, p, s) for a, p, s in chans]) for chans in specs]


def cf_producer(cfg: Config) -> None:
    """cfg: env, partitions, subpartitions, partitioner, count, warmup, rows, columns, pool
    (distinct batches cycled, default ``POOL``). Its result carries the process's CPU seconds
    at the start (``cpu0``); after "exit" it reports them again (``cpu1``): the sender loop
    works until its readers have taken everything."""
    rows, pool = cfg.get("rows", ROWS), cfg.get("pool", POOL)
    batches = make_batches(rows, pool, columns=cfg.get("columns", "mixed"))
    with environment(cfg["env"]) as env:
        parts = [env.create_partition(pid, cfg["subpartitions"]) for pid in cfg["partitions"]]
        emit(address=env.address)
        go = threading.Event()
        start_at = [0.0]
        starts: list[float] = []
        ends: list[float] = []

        def writer(part: cf.ResultPartition) -> Callable[[], None]:
            def run() -> None:
                with cf.RecordWriter(part, partitioner(cfg["partitioner"]), timeout=TIMEOUT) as w:
                    for i in range(cfg["warmup"]):
                        w.write(batches[i % len(batches)])
                    w.flush()
                    go.wait(TIMEOUT)
                    sleep_until(start_at[0])
                    cpu_start = time.thread_time()
                    starts.append(time.monotonic())
                    for i in range(cfg["warmup"], cfg["warmup"] + cfg["count"]):
                        w.write(batches[i % len(batches)])
                ends.append(time.monotonic())
                timed.add(cpu_start)

            return run

        cpu0 = [0.0]
        threads0: dict[int, tuple[str, float]] = {}
        timed = SelfTimed()

        def control() -> None:
            start_at[0] = receive()["start_at"]
            cpu0[0] = time.process_time()
            threads0.update(thread_cpu())
            go.set()

        run_threads([control] + [writer(p) for p in parts], TIMEOUT)
        emit(
            t0=min(starts),
            t_written=max(ends),
            rows=len(parts) * cfg["count"] * cfg.get("rows", ROWS),
            bytes=len(parts) * payload_bytes(batches, cfg["count"], cfg["warmup"]),
            cpu0=cpu0[0],
        )
        receive()  # "exit": remote readers may still be reading what is queued here
        emit(cpu1=time.process_time(), threads=thread_cpu_since(threads0, timed))


def cf_consumer(cfg: Config) -> None:
    """cfg: env, gates, warmup (batches per gate before "warm"), verify, rows, columns. Its
    result carries the CPU seconds it spent from "warm" to the end of its streams (``cpu``)."""
    pool = make_batches(cfg.get("rows", ROWS), columns=cfg.get("columns", "mixed"))
    by_first_key = {b.column("k")[0].as_py(): i for i, b in enumerate(pool)}
    with environment(cfg["env"]) as env:
        gates = _gates(env, cfg["gates"])
        warm = threading.Barrier(len(gates) + 1)
        results: list[tuple[int, int, float]] = []

        def reader(gate: cf.InputGate) -> Callable[[], None]:
            def check(b: pa.RecordBatch, seq: int) -> None:
                i = by_first_key.get(b.column("k")[0].as_py())
                assert i is not None, f"batch {seq} is not a batch that was sent"
                assert b.equals(pool[i]), f"batch {seq} differs from the batch that was sent"
                if cfg["verify"] == "ordered":
                    assert i == seq % len(pool), f"batch {seq} out of order"

            def run() -> None:
                for i in range(cfg["warmup"]):
                    b = gate.next(timeout=TIMEOUT)
                    assert b is not None, "end of stream during the warm-up"
                    if cfg["verify"]:
                        check(b, i)
                warm.wait(TIMEOUT)
                cpu_start = time.thread_time()
                rows = batches = 0
                while (b := gate.next(timeout=TIMEOUT)) is not None:
                    if cfg["verify"]:
                        check(b, cfg["warmup"] + batches)
                    rows += b.num_rows
                    batches += 1
                results.append((rows, batches, time.monotonic()))
                timed.add(cpu_start)

            return run

        cpu0 = [0.0]
        threads0: dict[int, tuple[str, float]] = {}
        timed = SelfTimed()

        def announce() -> None:
            warm.wait(TIMEOUT)
            cpu0[0] = time.process_time()
            threads0.update(thread_cpu())
            emit(warm=True)

        run_threads([announce] + [reader(g) for g in gates], TIMEOUT)
        emit(
            cpu=time.process_time() - cpu0[0],
            threads=thread_cpu_since(threads0, timed),
            t_end=max(t for _, _, t in results),
            rows=sum(r for r, _, _ in results),
            batches=sum(n for _, n, _ in results),
            per_gate_rows=[r for r, _, _ in results],
        )


def _small_batches(rows: int, count: int) -> list[pa.RecordBatch]:
    """``count`` batches of ``rows`` rows, ``seq`` (the batch number) first, then the payload."""
    payload = make_batches(rows, 1)[0]
    return [
        pa.RecordBatch.from_arrays(
            [pa.array(np.full(rows, i, np.int64)), *payload.columns], ["seq", *payload.schema.names]
        )
        for i in range(-1, count)  # -1: the warm-up batch
    ]


def lat_producer(cfg: Config) -> None:
    """cfg: env, rows, count, interval."""
    batches = _small_batches(cfg["rows"], cfg["count"])
    with environment(cfg["env"]) as env:
        part = env.create_partition("latency", 1)
        emit(address=env.address)
        sent: list[float] = []
        with cf.RecordWriter(part, cf.ForwardPartitioner(), timeout=TIMEOUT) as w:
            w.write(batches[0])
            start_at = receive()["start_at"]
            for i, b in enumerate(batches[1:]):
                sleep_until(start_at + i * cfg["interval"])
                sent.append(time.monotonic())
                w.write(b)
        emit(sent=sent)
        receive()


def lat_consumer(cfg: Config) -> None:
    """cfg: env, producer (address), count."""
    with environment(cfg["env"]) as env:
        (gate,) = _gates(env, [[[cfg["producer"], "latency", 0]]])
        first = gate.next(timeout=TIMEOUT)
        assert first is not None
        assert first.column("seq")[0].as_py() == -1
        emit(warm=True)
        received: list[float] = []
        while (b := gate.next(timeout=TIMEOUT)) is not None:
            received.append(time.monotonic())
            assert b.column("seq")[0].as_py() == len(received) - 1, "latency batches out of order"
        assert len(received) == cfg["count"]
        emit(received=received)


def hol_producer(cfg: Config) -> None:
    """cfg: env. Then receives {"start": {"a": t, "b": t}, "end": {"a": t, "b": t}}: each
    writer writes batches back to back from its start time until its end time, then closes."""
    batches = make_batches()
    with environment(cfg["env"]) as env:
        parts = {name: env.create_partition(f"hol/{name}", 1) for name in ("a", "b")}
        emit(address=env.address)
        schedule: Config = {}
        go = threading.Event()
        written: dict[str, int] = {}

        def writer(name: str) -> Callable[[], None]:
            def run() -> None:
                with cf.RecordWriter(parts[name], cf.ForwardPartitioner(), timeout=TIMEOUT) as w:
                    w.write(batches[0])  # warm-up: connects the channel
                    w.flush()
                    go.wait(TIMEOUT)
                    sleep_until(schedule["start"][name])
                    n = 0
                    while time.monotonic() < schedule["end"][name]:
                        w.write(batches[n % len(batches)])
                        n += 1
                written[name] = n + 1

            return run

        def control() -> None:
            schedule.update(receive())
            go.set()

        run_threads([control, writer("a"), writer("b")], TIMEOUT)
        emit(written=written, batch_bytes=payload_bytes(batches, len(batches)) / len(batches))
        receive()


def hol_consumer(cfg: Config) -> None:
    """cfg: env, producer (address), stall (seconds). After "warm" it receives {"stall_at": t}:
    reader "a" stops calling ``next`` at its first batch after ``stall_at``, for ``stall``
    seconds; both readers record when each batch came."""
    with environment(cfg["env"]) as env:
        names = ("a", "b")
        specs = [[[cfg["producer"], f"hol/{n}", 0]] for n in names]
        gates = dict(zip(names, _gates(env, specs), strict=True))
        warm = threading.Barrier(3)
        scheduled = threading.Event()
        stall_at = [0.0]
        times: dict[str, list[float]] = {}

        def reader(name: str) -> Callable[[], None]:
            def run() -> None:
                gate = gates[name]
                assert gate.next(timeout=TIMEOUT) is not None
                warm.wait(TIMEOUT)
                scheduled.wait(TIMEOUT)
                got: list[float] = []
                stalled = name != "a"
                while (b := gate.next(timeout=TIMEOUT)) is not None:
                    now = time.monotonic()
                    got.append(now)
                    assert b.num_rows == ROWS
                    if not stalled and now >= stall_at[0]:
                        stalled = True
                        sleep_until(stall_at[0] + cfg["stall"])
                times[name] = got

            return run

        def announce() -> None:
            warm.wait(TIMEOUT)
            emit(warm=True)
            stall_at[0] = receive()["stall_at"]
            scheduled.set()

        run_threads([announce, reader("a"), reader("b")], TIMEOUT)
        emit(times=times)


def flight_server(cfg: Config) -> None:
    """cfg: rows. ``do_get`` of ticket ``b"<count>"`` streams ``count`` pool batches as one
    table through ``RecordBatchStream`` (served by Flight's C++ code, no Python per batch)."""
    import pyarrow.flight as fl

    batches = make_batches(cfg.get("rows", ROWS))

    class Server(fl.FlightServerBase):  # type: ignore[misc]
        def do_get(self, context: object, ticket: fl.Ticket) -> fl.RecordBatchStream:
            count = int(ticket.ticket.decode())
            table = pa.Table.from_batches([batches[i % len(batches)] for i in range(count)])
            return fl.RecordBatchStream(table)

    server = Server("grpc://127.0.0.1:0")
    emit(port=server.port)
    receive()
    server.shutdown()


def flight_client(cfg: Config) -> None:
    """cfg: port, count, verify, rows."""
    import pyarrow.flight as fl

    client = fl.connect(f"grpc://127.0.0.1:{cfg['port']}")
    warm = client.do_get(fl.Ticket(b"1")).read_all()
    assert warm.num_rows == cfg.get("rows", ROWS)
    pool = make_batches(cfg.get("rows", ROWS)) if cfg["verify"] else []
    t0 = time.monotonic()
    reader = client.do_get(fl.Ticket(str(cfg["count"]).encode()))
    rows = batches = 0
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        if pool:
            assert chunk.data.equals(pool[batches % len(pool)]), f"flight batch {batches} differs"
        rows += chunk.data.num_rows
        batches += 1
    t_end = time.monotonic()
    client.close()
    emit(t0=t0, t_end=t_end, rows=rows, batches=batches)


ROLES: dict[str, Callable[[Config], None]] = {
    "cf-producer": cf_producer,
    "cf-consumer": cf_consumer,
    "lat-producer": lat_producer,
    "lat-consumer": lat_consumer,
    "hol-producer": hol_producer,
    "hol-consumer": hol_consumer,
    "flight-server": flight_server,
    "flight-client": flight_client,
}


# ------------------------------------------------------------------------------- parent side


class Worker(_Worker):
    """A worker process of this script (see the roles above)."""

    script = Path(__file__).resolve()
    timeout = TIMEOUT


def transfer(producers: list[Config], consumers_for: Callable[[list[str]], list[Config]]) -> Config:
    """Runs one timed transfer: starts the ``cf-producer`` processes (they create their
    partitions and write their warm-up batches), then the ``cf-consumer`` processes (gates over
    the producers' addresses, which read the warm-up), then tells every producer to start at
    the same instant. Checks that every row written was read; returns ``seconds`` (last
    consumer's end of stream - first timed write), ``bytes`` (payload written), ``gbps``,
    ``cpu`` (CPU seconds of every process over the transfer, a producer's until its sender
    loop has sent everything) and ``threads`` (of them, by ``side/thread name``)."""
    with contextlib.ExitStack() as stack:
        prods = [stack.enter_context(Worker("cf-producer", **cfg)) for cfg in producers]
        addresses = [p.read()["address"] for p in prods]
        cons = [stack.enter_context(Worker("cf-consumer", **cfg)) for cfg in consumers_for(addresses)]
        for c in cons:
            if not c.read()["warm"]:
                raise WorkerError("a consumer did not warm up")
        start_at = time.monotonic() + 0.05
        for p in prods:
            p.send(start_at=start_at)
        written = [p.read() for p in prods]
        read = [c.read() for c in cons]
        for p in prods:
            p.send(cmd="exit")
        ends = [p.read() for p in prods]
        for w in (*prods, *cons):
            w.wait()
    rows = sum(w["rows"] for w in written)
    if sum(r["rows"] for r in read) != rows:
        raise WorkerError(f"rows read {[r['rows'] for r in read]} != rows written {rows}")
    seconds = max(r["t_end"] for r in read) - min(w["t0"] for w in written)
    payload = sum(w["bytes"] for w in written)
    threads: dict[str, float] = {}
    for side, reports in (("producer", ends), ("consumer", read)):
        for r in reports:
            for name, secs in r["threads"].items():
                threads[f"{side}/{name}"] = threads.get(f"{side}/{name}", 0.0) + secs
    return {
        "seconds": seconds,
        "bytes": payload,
        "gbps": payload / seconds / 1e9,
        "cpu": sum(e["cpu1"] - w["cpu0"] for w, e in zip(written, ends, strict=True))
        + sum(r["cpu"] for r in read),
        "threads": threads,
    }


#: Head-of-line schedule: B writes alone for ``max(1.5, stall / 2)`` s; then A too; 0.5 s
#: later A's reader stalls for ``stall`` s; both go on for 0.5 s; A closes, and B writes alone
#: as long again. B's solo rate is from both solo phases (the first 0.3 s of each not
#: counted), so a machine that gets busier or quieter during the run biases the ratio less;
#: together they last about as long as the stall, so the load swings of a shared machine
#: (±20% over a second or two) weigh on both sides of the ratio alike. The two phases differ
#: over shared memory: in the first, A's channel is open (idle), so B may hold only half the
#: link's heap, as during the stall; in the last, A's channel has ended and B has all of it.
#: Each is reported too ("beside", "alone"), and the stall against the first ("percent_beside"):
#: what the stall costs B, apart from what sharing the link costs it.
HOL_SHARED = 0.5


def head_of_line(env: Config, stall: float) -> Config:
    """Two channels ("hol/a", "hol/b") from one producer environment (``env``) to one consumer
    environment, so over one connection. B writes alone, then A too, then A's reader stops for
    ``stall`` seconds, then B alone again. Returns B's GB/s alone ("solo": both solo phases;
    "beside": the first, A's channel open; "alone": the last, A's ended), while sharing the
    connection and during the stall, stall / solo and stall / beside in %, and B's GB/s in each
    0.25 s."""
    solo_s = max(1.5, stall / 2)
    with Worker("hol-producer", env=env) as prod:
        address = prod.read()["address"]
        with Worker("hol-consumer", env=env, producer=address, stall=stall) as cons:
            if not cons.read()["warm"]:
                raise WorkerError("the consumer did not warm up")
            t0 = time.monotonic() + 0.1
            a_start = t0 + solo_s
            stall_at = a_start + HOL_SHARED
            a_end = stall_at + stall + HOL_SHARED
            end = a_end + solo_s
            prod.send(start={"a": a_start, "b": t0}, end={"a": a_end, "b": end})
            cons.send(stall_at=stall_at)
            written = prod.read(timeout=TIMEOUT + end - t0)
            times = cons.read(timeout=TIMEOUT + end - t0)["times"]
            prod.send(cmd="exit")
            prod.wait()
            cons.wait()
    for name in ("a", "b"):
        if len(times[name]) != written["written"][name] - 1:
            raise WorkerError(f"channel {name} lost batches")
    size = float(written["batch_bytes"])

    def rate(*windows: tuple[float, float]) -> float:
        """B's GB/s over these (start, end) windows together."""
        n = sum(1 for t in times["b"] for lo, hi in windows if lo <= t < hi)
        return n * size / sum(hi - lo for lo, hi in windows) / 1e9

    first, last = (t0 + 0.3, a_start), (a_end + 0.3, end)
    solo, beside = rate(first, last), rate(first)
    stalled = rate((stall_at, stall_at + stall))
    return {
        "solo": solo,
        "beside": beside,
        "alone": rate(last),
        "shared": rate((a_start + 0.2, stall_at)),
        "stalled": stalled,
        "percent": 100 * stalled / solo,
        "percent_beside": 100 * stalled / beside,
        "a_during_stall": sum(1 for t in times["a"] if stall_at + 0.1 <= t < stall_at + stall),
        "b_timeline": [rate((t0 + i / 4, t0 + (i + 1) / 4)) for i in range(int((end - t0) * 4))],
    }


def main(argv: list[str]) -> None:
    if len(argv) != 3 or argv[1] not in ROLES:
        raise SystemExit(f"usage: {argv[0]} {{{','.join(ROLES)}}} CONFIG_JSON")
    # The imported modules (numpy, pyarrow, creditflow) are long-lived: keep them out of the
    # collector's full passes, which otherwise ran during the timed transfers (2-3% of the
    # machine's CPU in a profile of the 1→1). Every role, Flight's included, gets the same.
    gc.freeze()
    ROLES[argv[1]](json.loads(argv[2]))


if __name__ == "__main__":
    main(sys.argv)
