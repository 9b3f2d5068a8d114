"""Remote (between-process) benchmarks of creditflow, with pytest-benchmark, against Arrow
Flight and raw TCP on the same machine.

Every side runs in its own OS process (``benches/remote.py`` holds the workers); figures are
medians of the rounds, each measured inside the round, transfer only (process start-up,
connection and a warm-up batch are not timed; pytest-benchmark's own time column includes
them). See docs/benchmarks.md for what each benchmark measures.

Settings (environment variables):

``CREDITFLOW_BENCH_ENV``            JSON object of NetworkEnvironment settings for every
                                   environment here, over the defaults ``{"memory": "64MiB",
                                   "segment_size": "32KiB"}``, e.g. ``{"floating_buffers": 64}``
``CREDITFLOW_BENCH_4X4_PROCESSES``  processes per side of the 4x4 exchange: 1, 2 or 4 (default 2)
``CREDITFLOW_BENCH_STALL_SECONDS``  how long the head-of-line consumer stops reading (default 10)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import creditflow as cf
from remote import ROWS, TIMEOUT, Config, Worker, make_batches, payload_bytes, transfer
from remote import head_of_line as hol

# Test certificates come from the tests' helper (one copy of the PKI code).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from tls_certs import make_tls, tls_kwargs

pytestmark = pytest.mark.benchmark

ROOT = Path(__file__).resolve().parent.parent
ENV: Config = {
    "memory": "64MiB",
    "segment_size": "32KiB",
    **json.loads(os.environ.get("CREDITFLOW_BENCH_ENV", "{}")),
}
#: The creditflow-over-TCP rows run with shared memory off (it is on by default between
#: processes of one host); the shared-memory rows turn it on explicitly.
TCP_ENV: Config = {**ENV, "shared_memory": False}
SHM_ENV: Config = {**ENV, "shared_memory": True}
COUNT = 512  # 65,536-row batches per 1→1 transfer (936 MB)
COUNT_4X4 = 128  # per producer task: 4 x 128 batches in all
PROCS_4X4 = int(os.environ.get("CREDITFLOW_BENCH_4X4_PROCESSES", "2"))
LAT_ROWS = 1_024
LAT_COUNT = 1_000
LAT_WARMUP = 100
LAT_INTERVAL = 0.001
STALL = float(os.environ.get("CREDITFLOW_BENCH_STALL_SECONDS", "10"))


def _median(samples: list[float]) -> float:
    # The first sample is pytest-benchmark's warm-up round when there is more than one.
    return statistics.median(samples[1:] if len(samples) > 1 else samples)


def _pedantic(benchmark: object, fn: Callable[[], None], rounds: int, warmup: int = 1) -> None:
    benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=warmup)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def rawtcp() -> Path:
    """The creditflow-rawtcp binary (`make bench` builds it; built here if missing)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    exe = target / "release" / "creditflow-rawtcp"
    if not exe.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "creditflow-rawtcp"], cwd=ROOT, check=True)
    return exe


@pytest.fixture(scope="module")
def transport() -> None:
    """Skips the creditflow benchmarks while this build cannot connect two environments."""
    with cf.NetworkEnvironment() as a, cf.NetworkEnvironment() as b:
        a.create_partition("probe", 1)
        try:
            b.create_input_gate([cf.ChannelSpec(a.address, "probe", 0)]).close()
        except cf.InvalidArgumentError as exc:
            if "transport" not in str(exc):
                raise
            pytest.skip(f"no remote transport in this build: {exc}")


@pytest.fixture(scope="module")
def batch_bytes() -> int:
    return payload_bytes(make_batches(), 1)


# --------------------------------------------------------------------------- orchestration


def exchange(producers: list[Config], consumers_for: Callable[[list[str]], list[Config]]) -> dict[str, float]:
    """One timed transfer (:func:`remote.transfer`): seconds, bytes and GB/s."""
    t = transfer(producers, consumers_for)
    return {k: t[k] for k in ("seconds", "bytes", "gbps")}


def one_to_one(count: int, verify: str | bool = False, env: Config = ENV) -> dict[str, float]:
    producer = {
        "env": env,
        "partitions": ["fwd"],
        "subpartitions": 1,
        "partitioner": "forward",
        "count": count,
        "warmup": 1,
    }

    def consumers(addresses: list[str]) -> list[Config]:
        return [{"env": env, "gates": [[[addresses[0], "fwd", 0]]], "warmup": 1, "verify": verify}]

    return exchange([producer], consumers)


def all_to_all(
    count: int, verify: str | bool = False, procs: int = PROCS_4X4, env: Config = ENV
) -> dict[str, float]:
    """4 producer tasks (partitions of 4 subpartitions, RoundRobinPartitioner: whole batches in
    turn) and 4 consumer tasks (gates over subpartition j of all 4 partitions: 16 remote
    channels), spread over ``procs`` processes a side, ``4 // procs`` tasks (threads) each."""
    assert procs in (1, 2, 4)
    per = 4 // procs
    producers = [
        {
            "env": env,
            "partitions": [f"p{i * per + t}" for t in range(per)],
            "subpartitions": 4,
            "partitioner": "round_robin",
            "count": count,
            "warmup": 4,  # one per subpartition: every channel is connected before timing
        }
        for i in range(procs)
    ]

    def consumers(addresses: list[str]) -> list[Config]:
        def gate(j: int) -> list[list[Any]]:
            return [[addresses[p // per], f"p{p}", j] for p in range(4)]

        return [
            {"env": env, "gates": [gate(c * per + t) for t in range(per)], "warmup": 4, "verify": verify}
            for c in range(procs)
        ]

    return exchange(producers, consumers)


def flight(count: int, verify: bool = False) -> dict[str, float]:
    """One ``do_get`` of ``count`` batches; server and client in two processes."""
    with Worker("flight-server") as server:
        port = server.read()["port"]
        with Worker("flight-client", port=port, count=count, verify=verify) as client:
            got = client.read()
            client.wait()
        server.send(cmd="exit")
        server.wait()
    assert got["rows"] == count * ROWS
    seconds = got["t_end"] - got["t0"]
    return {"seconds": seconds, "gbps": payload_bytes(make_batches(), count) / seconds / 1e9}


def raw_tcp(exe: Path, nbytes: int) -> float:
    out = subprocess.run([str(exe), "bench", str(nbytes)], capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["bytes"] == nbytes
    return float(got["bytes"] / got["seconds"] / 1e9)


def latencies() -> list[float]:
    """One-way latency in µs of each of LAT_COUNT small batches, one every LAT_INTERVAL s,
    after LAT_WARMUP more sent the same way and not counted."""
    env = {**ENV, "buffer_timeout": 0}
    count = LAT_WARMUP + LAT_COUNT
    with Worker("lat-producer", env=env, rows=LAT_ROWS, count=count, interval=LAT_INTERVAL) as prod:
        address = prod.read()["address"]
        with Worker("lat-consumer", env=env, producer=address, count=count) as cons:
            assert cons.read()["warm"]
            prod.send(start_at=time.monotonic() + 0.05)
            sent = prod.read()["sent"]
            received = cons.read()["received"]
            prod.send(cmd="exit")
            prod.wait()
            cons.wait()
    return [(r - s) * 1e6 for s, r in zip(sent, received, strict=True)][LAT_WARMUP:]


def head_of_line(flow_control: str, shared_memory: bool = False) -> dict[str, Any]:
    """:func:`remote.head_of_line` with this file's settings and stall."""
    env = {**(SHM_ENV if shared_memory else TCP_ENV), "flow_control": flow_control}
    return hol(env, STALL)


# ------------------------------------------------------------------------ 1→1 throughput


def _gbps(benchmark: object, report: Any, name: str, transfer: Callable[[], float]) -> float:
    """Times ``transfer`` (returns GB/s) in 5 rounds after one warm-up; reports the median."""
    samples: list[float] = []
    _pedantic(benchmark, lambda: samples.append(transfer()), rounds=5)
    benchmark.extra_info[f"{name} rounds"] = samples  # type: ignore[attr-defined]
    return report(name, _median(samples), "GB/s").value  # type: ignore[no-any-return]


@pytest.mark.benchmark(group="remote-1to1-65536-rows")
def test_remote_raw_tcp(benchmark: object, report: Any, rawtcp: Path, batch_bytes: int) -> None:
    """The ceiling: the same number of bytes as one creditflow 1→1 transfer, 1 MiB writes."""
    _gbps(benchmark, report, "raw tcp", lambda: raw_tcp(rawtcp, COUNT * batch_bytes))


@pytest.mark.benchmark(group="remote-1to1-65536-rows")
def test_remote_flight_do_get(benchmark: object, report: Any) -> None:
    """The same batches through one Arrow Flight do_get (server and client processes)."""
    flight(16, verify=True)
    _gbps(benchmark, report, "flight do_get", lambda: flight(COUNT)["gbps"])


def _paired(
    benchmark: object, report: Any, name: str, ours: Callable[[], float], theirs: Callable[[], float]
) -> tuple[float, float]:
    """5 rounds (after one warm-up), each timing ``theirs`` and then ``ours`` back to back
    (both return GB/s); reports the median of ``ours`` as ``name`` and returns it with the
    median of the per-round ratios ours/theirs. Pairing the rounds keeps a change of load on
    this shared machine between one benchmark and the next out of the ratio."""
    pairs: list[tuple[float, float]] = []
    _pedantic(benchmark, lambda: pairs.append((theirs(), ours())), rounds=5)
    pairs = pairs[1:]  # the warm-up round
    benchmark.extra_info[f"{name} rounds"] = [o for _, o in pairs]  # type: ignore[attr-defined]
    benchmark.extra_info[f"{name} paired rounds"] = [t for t, _ in pairs]  # type: ignore[attr-defined]
    gbps = report(name, statistics.median(o for _, o in pairs), "GB/s").value
    return gbps, statistics.median(o / t for t, o in pairs)


@pytest.mark.benchmark(group="remote-1to1-65536-rows")
@pytest.mark.usefixtures("transport")
def test_remote_forward_1to1(benchmark: object, report: Any, rawtcp: Path, batch_bytes: int) -> None:
    """ForwardPartitioner, one remote channel between two processes. Each round runs raw TCP
    and then creditflow on the same bytes; the raw-TCP ratio is the median of the rounds'
    ratios. The Flight ratio uses Flight's own benchmark of the session (measured here if it
    did not run)."""
    one_to_one(16, verify="ordered", env=TCP_ENV)
    gbps, raw_ratio = _paired(
        benchmark,
        report,
        "remote 1→1",
        lambda: one_to_one(COUNT, env=TCP_ENV)["gbps"],
        lambda: raw_tcp(rawtcp, COUNT * batch_bytes),
    )
    fl = report.get("flight do_get")
    fl_gbps = fl.value if fl is not None else _median([flight(COUNT)["gbps"] for _ in range(3)])
    report("creditflow/flight", gbps / fl_gbps, "x", 1.25)
    report("creditflow/raw tcp", raw_ratio, "x", 0.60)


@pytest.mark.benchmark(group="remote-1to1-65536-rows")
@pytest.mark.usefixtures("transport")
def test_remote_forward_1to1_tls(benchmark: object, report: Any, tmp_path: Path) -> None:
    """The 1→1 transfer over mutual TLS (rustls handshake, TLS 1.3, AES-GCM). Each round runs
    the plaintext 1→1 and then the TLS one; plaintext/TLS is the median of the rounds'
    ratios."""
    env = {**TCP_ENV, "tls": tls_kwargs(make_tls(tmp_path))}
    one_to_one(16, verify="ordered", env=env)
    gbps, tls_over_plain = _paired(
        benchmark,
        report,
        "remote 1→1 tls",
        lambda: one_to_one(COUNT, env=env)["gbps"],
        lambda: one_to_one(COUNT, env=TCP_ENV)["gbps"],
    )
    report("plaintext/tls", 1 / tls_over_plain, "x", 1.5, higher_is_better=False)


# ----------------------------------------------------------------------------- 4x4 all-to-all


@pytest.mark.benchmark(group="remote-4x4")
@pytest.mark.usefixtures("transport")
def test_remote_all_to_all_4x4(benchmark: object, report: Any) -> None:
    """4 producer tasks x 4 consumer tasks, every channel remote; aggregate GB/s."""
    all_to_all(4, verify=True, env=TCP_ENV)
    _gbps(benchmark, report, "4x4 all-to-all", lambda: all_to_all(COUNT_4X4, env=TCP_ENV)["gbps"])


# ---------------------------------------------------------------------------- shared memory


def _three_way(
    benchmark: object,
    report: Any,
    name: str,
    shm: Callable[[], float],
    tcp: Callable[[], float],
    raw: Callable[[], float],
) -> None:
    """5 rounds (after one warm-up), each timing raw TCP, creditflow over TCP and creditflow
    over shared memory back to back on the same bytes; reports the median shared-memory GB/s
    and the medians of the rounds' ratios shm/raw TCP and shm/creditflow TCP. Every round's
    figures are in extra_info."""
    rounds: list[tuple[float, float, float]] = []
    _pedantic(benchmark, lambda: rounds.append((raw(), tcp(), shm())), rounds=5)
    rounds = rounds[1:]  # the warm-up round
    info = benchmark.extra_info  # type: ignore[attr-defined]
    info[f"{name} rounds (raw tcp, creditflow tcp, shm)"] = rounds
    report(name, statistics.median(s for _, _, s in rounds), "GB/s")
    report(f"{name} tcp (paired)", statistics.median(t for _, t, _ in rounds), "GB/s")
    report(f"{name} raw tcp (paired)", statistics.median(r for r, _, _ in rounds), "GB/s")
    report(f"{name}/raw tcp", statistics.median(s / r for r, _, s in rounds), "x", 2.0)
    report(f"{name}/creditflow tcp", statistics.median(s / t for _, t, s in rounds), "x")


@pytest.mark.benchmark(group="remote-shm")
@pytest.mark.usefixtures("transport")
def test_remote_forward_1to1_shm(benchmark: object, report: Any, rawtcp: Path, batch_bytes: int) -> None:
    """The 1→1 transfer over shared memory; each round runs raw TCP, creditflow over TCP and
    creditflow over shared memory on the same bytes."""
    one_to_one(16, verify="ordered", env=SHM_ENV)
    _three_way(
        benchmark,
        report,
        "shm 1→1",
        lambda: one_to_one(COUNT, env=SHM_ENV)["gbps"],
        lambda: one_to_one(COUNT, env=TCP_ENV)["gbps"],
        lambda: raw_tcp(rawtcp, COUNT * batch_bytes),
    )


@pytest.mark.benchmark(group="remote-shm")
@pytest.mark.usefixtures("transport")
def test_remote_all_to_all_4x4_shm(benchmark: object, report: Any, rawtcp: Path, batch_bytes: int) -> None:
    """The 4x4 exchange over shared memory; each round runs raw TCP (one stream of the same
    bytes), the 4x4 over TCP and the 4x4 over shared memory."""
    all_to_all(4, verify=True, env=SHM_ENV)
    _three_way(
        benchmark,
        report,
        "shm 4x4",
        lambda: all_to_all(COUNT_4X4, env=SHM_ENV)["gbps"],
        lambda: all_to_all(COUNT_4X4, env=TCP_ENV)["gbps"],
        lambda: raw_tcp(rawtcp, 4 * COUNT_4X4 * batch_bytes),
    )


# ----------------------------------------------------------------------------------- latency


@pytest.mark.benchmark(group="remote-latency")
@pytest.mark.usefixtures("transport")
def test_remote_small_batch_latency(benchmark: object, report: Any) -> None:
    """One-way latency of 1,024-row batches with buffer_timeout=0, paced (not a throughput
    test): send (before write) to receive (after gate.next), p50 and p99 of each round."""
    p50: list[float] = []
    p99: list[float] = []

    def run() -> None:
        lat = sorted(latencies())
        p50.append(lat[len(lat) // 2])
        p99.append(lat[int(len(lat) * 0.99)])

    _pedantic(benchmark, run, rounds=5)
    report("latency p50", _median(p50), "us", None, higher_is_better=False)
    report("latency p99", _median(p99), "us", None, higher_is_better=False)


# ------------------------------------------------------------------------------ head-of-line


@pytest.mark.benchmark(group="remote-head-of-line")
@pytest.mark.parametrize(
    ("flow_control", "shared_memory"),
    [("credit", False), ("tcp", False), ("credit", True)],
    ids=["credit", "tcp", "credit-shm"],
)
@pytest.mark.usefixtures("transport")
def test_remote_head_of_line(benchmark: object, report: Any, flow_control: str, shared_memory: bool) -> None:
    """B's throughput while A's consumer stalls, relative to B alone, over one connection: the
    multiplexed TCP connection, which is what credit-based flow control keeps flowing (target
    for ``credit``), and for information a shared-memory link, where B alone runs several
    times as fast through the heap and a stalled A holds up to half of it."""
    runs: list[dict[str, float]] = []
    _pedantic(benchmark, lambda: runs.append(head_of_line(flow_control, shared_memory)), rounds=3, warmup=0)
    percent = statistics.median(r["percent"] for r in runs)
    benchmark.extra_info["runs"] = runs  # type: ignore[attr-defined]
    name = f"{flow_control}{' over shm' if shared_memory else ''}"
    report(
        f"{name}: other channel during stall",
        percent,
        "%",
        80.0 if flow_control == "credit" and not shared_memory else None,
    )
    if shared_memory:
        report(
            f"{name}: other channel during stall, GB/s", statistics.median(r["stalled"] for r in runs), "GB/s"
        )
        # Against B's first solo phase only, when A's channel is open and B holds at most half
        # the heap, as during the stall (see remote.HOL_SHARED).
        report(
            f"{name}: other channel during stall, % of its rate beside an idle A",
            statistics.median(r["percent_beside"] for r in runs),
            "%",
        )
