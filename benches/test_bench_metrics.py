"""Cost of metrics collection: the same local exchange with and without a Prometheus scraper
reading ``/metrics`` (``env.serve_metrics()``) every 100 ms, interleaved.

Each run takes one to a few seconds (ten or more scrapes). Each round runs the exchange
twice, once with the scraper and once without, alternating which goes first; the figure is
the ratio of the median throughputs (with / without), to be within 2 % of 1. The scraper
is another process, as Prometheus would be; the HTTP server runs in the benchmark's own
process, as it would in a task that serves its metrics, so rendering the page competes
with the exchange for the GIL and the cores. See docs/benchmarks.md.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf
from test_bench_local import POOL, ROWS, _batch, exchange

pytestmark = pytest.mark.benchmark

SCRAPE_EVERY = 0.1  # seconds


#: The scraper process: after "on" on stdin it scrapes the URLs in argv every SCRAPE_EVERY
#: seconds, after "off" it stops (each command is acknowledged with a line); at the end of
#: stdin it prints the number of rounds and the median seconds per request.
SCRAPER = """
import statistics, sys, threading, time, urllib.request
urls, every = sys.argv[2:], float(sys.argv[1])
on = threading.Event()
rounds, durations = 0, []
def scrape():
    global rounds
    while True:
        on.wait()
        for url in urls:
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=10) as resp:
                assert b"creditflow_segments" in resp.read()
            durations.append(time.perf_counter() - t0)
        rounds += 1
        time.sleep(every)
threading.Thread(target=scrape, daemon=True).start()
for line in sys.stdin:
    on.set() if line.strip() == "on" else on.clear()
    print("ok", flush=True)
print(rounds, statistics.median(durations) if durations else 0.0, flush=True)
"""


class Scraper:
    """Scrapes ``urls`` every SCRAPE_EVERY seconds from another process (as Prometheus
    would) while switched on; started once, so its start-up is not timed."""

    def __init__(self, *urls: str) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", SCRAPER, str(SCRAPE_EVERY), *urls],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.scrapes = 0
        #: Median seconds per request.
        self.duration = 0.0

    def switch(self, on: bool) -> None:
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.write("on\n" if on else "off\n")
        self._proc.stdin.flush()
        assert self._proc.stdout.readline().strip() == "ok"

    def stop(self) -> None:
        out, _ = self._proc.communicate(timeout=60)
        assert self._proc.returncode == 0, "the scraper failed"
        rounds, duration = out.split()
        self.scrapes, self.duration = int(rounds), float(duration)


def _count(seen: list[int], b: pa.RecordBatch) -> None:
    seen[0] += b.nbytes


@pytest.fixture(scope="module")
def batches() -> list[pa.RecordBatch]:
    rng = np.random.default_rng(9)
    return [_batch(rng, ROWS) for _ in range(POOL)]


def _with_and_without(
    benchmark: object,
    report: object,
    batches: list[pa.RecordBatch],
    *,
    local_handoff: bool,
    count: int,
    rounds: int,
    name: str,
    remote: bool = False,
) -> None:
    payload = sum(batches[i % len(batches)].nbytes for i in range(count))
    times: dict[bool, list[float]] = {False: [], True: []}
    settings: dict[str, object] = {"memory": "128MiB", "local_handoff": local_handoff}
    with cf.NetworkEnvironment(**settings) as env, cf.NetworkEnvironment(**settings) as reader_env:  # type: ignore[arg-type]
        urls = [env.serve_metrics().url] + ([reader_env.serve_metrics().url] if remote else [])
        scraper = Scraper(*urls)
        order = [False, True]

        def pair() -> None:
            for scraped in order:
                scraper.switch(scraped)
                seen = [0]
                t0 = time.perf_counter()
                exchange(
                    env,
                    cf.ForwardPartitioner(),
                    1,
                    batches,
                    count,
                    lambda b, seen=seen: _count(seen, b),
                    reader_env=reader_env if remote else None,
                )
                times[scraped].append(time.perf_counter() - t0)
                assert seen[0] == payload
            scraper.switch(False)
            order.reverse()

        try:
            benchmark.pedantic(pair, rounds=rounds, iterations=1, warmup_rounds=1)  # type: ignore[attr-defined]
        finally:
            scraper.stop()
    # The first pair is the warm-up round.
    off = statistics.median(times[False][1:])
    on = statistics.median(times[True][1:])
    assert scraper.scrapes >= 5 * rounds, f"the scraper ran {scraper.scrapes} times"
    report(f"{name} without scraper", payload / off / 1e9, "GB/s")  # type: ignore[operator]
    report(f"{name} scraped every 100 ms", payload / on / 1e9, "GB/s")  # type: ignore[operator]
    report(f"{name}: one /metrics request", scraper.duration * 1e3, "ms")  # type: ignore[operator]
    report(f"{name}: scraped / not scraped", off / on, "x", 0.98)  # type: ignore[operator]


@pytest.mark.benchmark(group="metrics-cost")
def test_metrics_cost_serialized(benchmark: object, report: object, batches: list[pa.RecordBatch]) -> None:
    """Serialized forward exchange (every byte through segments and counters)."""
    _with_and_without(
        benchmark, report, batches, local_handoff=False, count=800, rounds=12, name="metrics cost, serialized"
    )


@pytest.mark.benchmark(group="metrics-cost")
def test_metrics_cost_remote(benchmark: object, report: object, batches: list[pa.RecordBatch]) -> None:
    """Writer and reader in two environments of this process, over TCP on 127.0.0.1 (credit
    flow control, per-reader sender counters); both environments are scraped."""
    _with_and_without(
        benchmark,
        report,
        batches,
        local_handoff=True,
        count=400,
        rounds=12,
        name="metrics cost, remote",
        remote=True,
    )


@pytest.mark.benchmark(group="metrics-cost")
def test_metrics_cost_handoff(benchmark: object, report: object, batches: list[pa.RecordBatch]) -> None:
    """Zero-copy hand-off (per-batch costs dominate: the counters' share is largest here)."""
    _with_and_without(
        benchmark, report, batches, local_handoff=True, count=12_000, rounds=12, name="metrics cost, hand-off"
    )
