"""Cost of metrics collection: the same local exchange with and without a Prometheus scraper
reading ``/metrics`` (``env.serve_metrics()``) every 100 ms, interleaved.

Each run takes one to a few seconds (ten or more scrapes). Each round runs the exchange
twice, once with the scraper and once without, alternating which goes first; the figure is
the ratio of the median throughputs (with / without), to be within 2 % of 1. The scraper
and the HTTP server run in the benchmark's own process, as they would in a task that
serves its metrics, so rendering the page competes with the exchange for the GIL and the
cores. See benches/README.md.
"""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf
from test_bench_local import POOL, ROWS, _batch, exchange

pytestmark = pytest.mark.benchmark

SCRAPE_EVERY = 0.1  # seconds


class Scraper:
    """Reads ``url`` every SCRAPE_EVERY seconds in a thread until stopped."""

    def __init__(self, *urls: str) -> None:
        self.urls = urls
        self.scrapes = 0
        #: Seconds per scrape (request + rendering + parsing nothing: the page is only read).
        self.durations: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_EVERY):
            for url in self.urls:
                t0 = time.perf_counter()
                with urllib.request.urlopen(url, timeout=10) as resp:
                    assert b"creditflow_segments" in resp.read()
                self.durations.append(time.perf_counter() - t0)
            self.scrapes += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


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
    scrapers: list[Scraper] = []
    settings: dict[str, object] = {"memory": "128MiB", "local_handoff": local_handoff}
    with cf.NetworkEnvironment(**settings) as env, cf.NetworkEnvironment(**settings) as reader_env:  # type: ignore[arg-type]
        urls = [env.serve_metrics().url] + ([reader_env.serve_metrics().url] if remote else [])
        order = [False, True]

        def pair() -> None:
            for scraped in order:
                scraper = Scraper(*urls) if scraped else None
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
                if scraper is not None:
                    scraper.stop()
                    scrapers.append(scraper)
                assert seen[0] == payload
            order.reverse()

        benchmark.pedantic(pair, rounds=rounds, iterations=1, warmup_rounds=1)  # type: ignore[attr-defined]
    # The first pair is the warm-up round.
    off = statistics.median(times[False][1:])
    on = statistics.median(times[True][1:])
    scrapes = sum(s.scrapes for s in scrapers)
    assert scrapes >= 5 * rounds, f"the scraper ran {scrapes} times"
    page = statistics.median(d for s in scrapers for d in s.durations)
    report(f"{name} without scraper", payload / off / 1e9, "GB/s")  # type: ignore[operator]
    report(f"{name} scraped every 100 ms", payload / on / 1e9, "GB/s")  # type: ignore[operator]
    report(f"{name}: one /metrics request", page * 1e3, "ms")  # type: ignore[operator]
    report(f"{name}: scraped / not scraped", off / on, "x", 0.98)  # type: ignore[operator]


@pytest.mark.benchmark(group="metrics-cost")
def test_metrics_cost_serialized(benchmark: object, report: object, batches: list[pa.RecordBatch]) -> None:
    """Serialized forward exchange (every byte through segments and counters)."""
    _with_and_without(
        benchmark, report, batches, local_handoff=False, count=800, rounds=8, name="metrics cost, serialized"
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
        rounds=8,
        name="metrics cost, remote",
        remote=True,
    )


@pytest.mark.benchmark(group="metrics-cost")
def test_metrics_cost_handoff(benchmark: object, report: object, batches: list[pa.RecordBatch]) -> None:
    """Zero-copy hand-off (per-batch costs dominate: the counters' share is largest here)."""
    _with_and_without(
        benchmark, report, batches, local_handoff=True, count=12_000, rounds=8, name="metrics cost, hand-off"
    )
