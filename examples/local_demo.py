"""An in-process demo of creditflow without Spark: a backpressured, bounded-memory exchange.

Run it with ``python examples/local_demo.py`` (``make demo`` runs the PySpark demo,
``examples/spark_demo.py``). One producer thread generates synthetic e-commerce orders and
hash-partitions them by ``customer_id`` into a partition with four subpartitions; four
consumer threads each read one subpartition through their own input gate and aggregate the
orders per customer. For a while consumer 0 is deliberately slow: the partition's buffers
fill up with its backlog, the producer blocks (backpressure, HIGH), and once the consumer
recovers everything flows at full speed again (OK). Memory stays bounded by the
environment's pool the whole time.

The phases follow what the demo observes, not the clock alone (:class:`Story`): consumer 0
turns slow at ``--slow-start`` seconds and recovers once the writer's level has been HIGH for
``--slow-high-samples`` samples (at most ``--slow-max`` seconds); the producer writes at least
``--rows`` orders and goes on until the level has been OK again after the slow phase (at most
``--recover-max`` seconds). So the story holds on a fast machine
(the writer does not run out of rows before OK) and on a loaded one (the slow phase lasts until
HIGH was seen), and the checks cover every order actually written.

The live view shows the throughput, the out-pool usage, the backlog per subpartition and the
writer's backpressure level; a chart of the run is written if matplotlib is installed (both in
``local_demo_view.py``, next to this file). While
it runs, the environment serves its metrics (``/metrics``) and the pipeline page, and the demo
prints the ``creditflow top`` command and the page's address that show it from outside. The
demo ends by checking that every order arrived exactly once, that the hash partitioning was
consistent and that the per-customer aggregates are right, and prints ``VERIFIED``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa

import creditflow as cf
from local_demo_view import TICK_SECONDS, Sample, View, format_timeline, make_view, write_chart

PARTITION_ID = "demo/orders/0"
NUM_CONSUMERS = 4
BATCH_ROWS = 65_536
NUM_CUSTOMERS = 50_000
CUSTOMER_SKEW = 0.9  # Zipf exponent: a few customers place many of the orders
CUSTOMER_ID_BASE = 1_000_000
ORDER_ID_BASE = 10_000_000_000
TS_BASE_US = 1_735_689_600_000_000  # 2025-01-01T00:00:00Z
COUNTRIES = ("US", "DE", "GB", "FR", "JP", "BR", "IN", "CA", "AU", "NL", "ES", "IT")
COUNTRY_WEIGHTS = (0.30, 0.12, 0.10, 0.08, 0.08, 0.07, 0.07, 0.05, 0.04, 0.03, 0.03, 0.03)
MAX_CENTS = 10**12 - 1  # decimal128(12, 2)

SLOW_CONSUMERS = (0,)
SLOW_ROWS_PER_SECOND = 50_000  # what a slow consumer manages while slow
IO_TIMEOUT = 0.5  # every write() and next() gives up after this and is retried
STALL_SECONDS = 60.0  # no progress for this long is an error, never a hang
COMPACT_EVERY = 8  # partial aggregates combined every this many batches


# ------------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class Config:
    """What to run."""

    #: Orders the producer writes at least (more while the story is not complete).
    rows: int
    seed: int
    #: When consumer 0 turns slow, seconds since the start.
    slow_start: float
    #: Samples with the level HIGH after which consumer 0 recovers.
    slow_high_samples: int
    #: The slow phase lasts at most this long, s (whether HIGH was seen or not).
    slow_max: float
    #: How long after the slow phase the producer goes on waiting for OK, at most, s.
    recover_max: float
    memory: str
    chart: Path | None
    plain: bool
    #: Ports of ``/metrics`` and of the pipeline page (0: any free port); None: serve neither.
    metrics_port: int | None = 0
    web_port: int = 0

    def describe_slow(self) -> str:
        """When consumer 0 is slow, as configured."""
        return (
            f"from {self.slow_start:g} s until the level was HIGH for {self.slow_high_samples} samples"
            f" (at most {self.slow_max:g} s)"
        )


def parse_args(argv: Sequence[str] | None) -> Config:
    """Parses the command line."""
    p = argparse.ArgumentParser(
        prog="python examples/local_demo.py",
        description="In-process creditflow exchange with a temporarily slow consumer: live backpressure.",
    )
    p.add_argument("--rows", type=int, default=None, help="orders to generate, at least (default 30,000,000)")
    p.add_argument("--slow-start", type=float, default=None, help="when consumer 0 turns slow, s (3)")
    p.add_argument(
        "--slow-high-samples",
        type=int,
        default=None,
        help=f"consumer 0 recovers once the level was HIGH for this many {TICK_SECONDS:g} s samples (24)",
    )
    p.add_argument("--slow-max", type=float, default=None, help="the slow phase lasts at most, s (30)")
    p.add_argument(
        "--recover-max", type=float, default=20.0, help="wait for OK after the slow phase at most, s (20)"
    )
    p.add_argument(
        "--quick", action="store_true", help="short run (tests): 15M rows, slow from 1 s, 6 HIGH samples"
    )
    p.add_argument("--seed", type=int, default=42, help="random seed of the generated orders")
    p.add_argument("--memory", default="16MiB", help="network memory of the environment (16MiB)")
    p.add_argument("--chart", type=Path, default=Path("creditflow-local-demo.png"), help="PNG chart path")
    p.add_argument("--no-chart", action="store_true", help="do not write a chart")
    p.add_argument("--plain", action="store_true", help="plain lines instead of the live view")
    p.add_argument("--metrics-port", type=int, default=0, help="port of /metrics (default: any free one)")
    p.add_argument("--web-port", type=int, default=0, help="port of the pipeline page (default: any free)")
    p.add_argument("--no-serve", action="store_true", help="serve neither /metrics nor the pipeline page")
    a = p.parse_args(argv)
    rows, start, highs, longest = (15_000_000, 1.0, 6, 10.0) if a.quick else (30_000_000, 3.0, 24, 30.0)
    cfg = Config(
        rows=a.rows if a.rows is not None else rows,
        seed=a.seed,
        slow_start=a.slow_start if a.slow_start is not None else start,
        slow_high_samples=a.slow_high_samples if a.slow_high_samples is not None else highs,
        slow_max=a.slow_max if a.slow_max is not None else longest,
        recover_max=a.recover_max,
        memory=a.memory,
        chart=None if a.no_chart else a.chart,
        plain=a.plain,
        metrics_port=None if a.no_serve else a.metrics_port,
        web_port=a.web_port,
    )
    if cfg.rows <= 0 or cfg.slow_high_samples <= 0:
        p.error("--rows and --slow-high-samples must be positive")
    if cfg.slow_start < 0 or cfg.slow_max <= 0 or cfg.recover_max <= 0:
        p.error("--slow-start must not be negative, --slow-max and --recover-max positive")
    return cfg


@dataclass(frozen=True)
class Clock:
    """Seconds since the start of the run."""

    t0: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        """Seconds since the start."""
        return time.monotonic() - self.t0


# ----------------------------------------------------------------------------------- workload


def decimal_from_cents(cents: npt.NDArray[np.int64], precision: int = 12) -> pa.Array:
    """A decimal128(precision, 2) array over integer cents, built without Python objects."""
    words = np.empty((len(cents), 2), dtype=np.int64)
    words[:, 0] = cents
    words[:, 1] = cents >> 63  # sign extension into the high 64 bits
    return pa.Array.from_buffers(pa.decimal128(precision, 2), len(cents), [None, pa.py_buffer(words)])


class OrderGenerator:
    """Deterministic synthetic orders: batch ``i`` depends only on the seed and ``i``."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        weights = 1.0 / np.arange(1, NUM_CUSTOMERS + 1, dtype=np.float64) ** CUSTOMER_SKEW
        cdf = np.cumsum(weights)
        self._cdf = cdf / cdf[-1]
        self._customers = rng.permutation(NUM_CUSTOMERS).astype(np.int64) + CUSTOMER_ID_BASE
        self._countries = pa.array(COUNTRIES, pa.string())
        self._country_p = np.array(COUNTRY_WEIGHTS) / sum(COUNTRY_WEIGHTS)
        self._seed = seed

    def batch(self, index: int, start: int, rows: int) -> pa.RecordBatch:
        """Orders ``start .. start + rows`` (the ``index``-th batch)."""
        rng = np.random.default_rng([self._seed, index])
        seq = np.arange(start, start + rows, dtype=np.int64)
        customer = self._customers[np.searchsorted(self._cdf, rng.random(rows))]
        cents = np.clip(np.round(rng.lognormal(3.6, 0.9, rows) * 100), 1, MAX_CENTS).astype(np.int64)
        country = rng.choice(len(COUNTRIES), size=rows, p=self._country_p).astype(np.int32)
        ts = TS_BASE_US + seq * 1_500 + rng.integers(0, 1_000, rows)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(ORDER_ID_BASE + seq),
                pa.array(customer),
                decimal_from_cents(cents),
                self._countries.take(pa.array(country)),
                pa.array(ts, pa.timestamp("us", tz="UTC")),
            ],
            names=["order_id", "customer_id", "amount", "country", "ts"],
        )

    def batches(self, limit: Callable[[], int]) -> Iterator[pa.RecordBatch]:
        """Batches until ``limit()`` orders (asked before each batch: it may change)."""
        index = start = 0
        while start < (total := limit()):
            rows = min(BATCH_ROWS, total - start)
            yield self.batch(index, start, rows)
            index += 1
            start += rows


class CustomerAggregator:
    """Orders and amount per customer, combined incrementally so memory stays bounded."""

    def __init__(self) -> None:
        self._parts: list[pa.Table] = []

    def add(self, batch: pa.RecordBatch) -> None:
        """Adds a batch of orders."""
        agg = (
            pa.Table.from_batches([batch])
            .group_by("customer_id", use_threads=False)
            .aggregate([("order_id", "count"), ("amount", "sum")])
        )
        self._parts.append(agg.rename_columns(["customer_id", "orders", "amount"]))
        if len(self._parts) >= COMPACT_EVERY:
            self._parts = [self._combined()]

    def _combined(self) -> pa.Table:
        agg = (
            pa.concat_tables(self._parts)
            .group_by("customer_id", use_threads=False)
            .aggregate([("orders", "sum"), ("amount", "sum")])
        )
        return agg.rename_columns(["customer_id", "orders", "amount"])

    def result(self) -> pa.Table:
        """One row per customer seen, sorted by customer_id."""
        if not self._parts:
            schema = pa.schema(
                [("customer_id", pa.int64()), ("orders", pa.int64()), ("amount", pa.decimal128(38, 2))]
            )
            return schema.empty_table()
        return self._combined().sort_by("customer_id")


# ------------------------------------------------------------------------------------ workers


class Worker(threading.Thread):
    """A daemon thread that keeps the exception of its body."""

    def __init__(self, name: str, body: Callable[[], None]) -> None:
        super().__init__(name=name, daemon=True)
        self._body = body
        self.error: BaseException | None = None

    def run(self) -> None:
        """Runs the body, keeping its exception."""
        try:
            self._body()
        except BaseException as exc:  # reported by the main thread
            self.error = exc


@dataclass
class ProducerState:
    """What the producer wrote, and the expected result computed from it."""

    rows: int = 0
    expected: CustomerAggregator = field(default_factory=CustomerAggregator)
    finished_at: float | None = None


@dataclass
class ConsumerState:
    """What one consumer read."""

    index: int
    rows: int = 0
    batches: int = 0
    last_order_id: int = -1
    out_of_order: int = 0
    aggregates: CustomerAggregator = field(default_factory=CustomerAggregator)


def write_with_retry(writer: cf.RecordWriter, batch: pa.RecordBatch, stop: threading.Event) -> bool:
    """Writes one batch, retrying short timeouts; False if stopped. A timed out hand-off write
    queued nothing, so retrying it is safe."""
    deadline = time.monotonic() + STALL_SECONDS
    while not stop.is_set():
        try:
            writer.write(batch, timeout=IO_TIMEOUT)
            return True
        except cf.TimeoutError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"producer blocked for more than {STALL_SECONDS:.0f} s") from None
    return False


def produce(
    writer: cf.RecordWriter,
    cfg: Config,
    clock: Clock,
    story: Story,
    state: ProducerState,
    stop: threading.Event,
) -> None:
    """Generates and writes the orders, computing the expected aggregates on the way: at least
    ``cfg.rows``, and on until the story is complete (which takes a bounded time)."""

    def limit() -> int:
        return cfg.rows if story.complete.is_set() else sys.maxsize

    try:
        for batch in OrderGenerator(cfg.seed).batches(limit):
            state.expected.add(batch)
            if not write_with_retry(writer, batch, stop):
                writer.fail("demo interrupted")
                return
            state.rows += batch.num_rows
        writer.close()
    except BaseException as exc:
        writer.fail(f"producer failed: {exc!r}")
        raise
    finally:
        state.finished_at = clock.elapsed()


def next_with_retry(gate: cf.InputGate, stop: threading.Event) -> pa.RecordBatch | None:
    """The next batch, retrying short timeouts; None at the end or if stopped."""
    deadline = time.monotonic() + STALL_SECONDS
    while not stop.is_set():
        try:
            return gate.next(timeout=IO_TIMEOUT)
        except cf.TimeoutError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumer got no data for {STALL_SECONDS:.0f} s") from None
    return None


def consume(
    gate: cf.InputGate,
    state: ConsumerState,
    seen: Seen,
    story: Story,
    stop: threading.Event,
) -> None:
    """Reads one subpartition, aggregating per customer; slow in the slow phase if chosen."""
    slow = state.index in SLOW_CONSUMERS
    try:
        while (batch := next_with_retry(gate, stop)) is not None:
            record_order_ids(state, batch.column("order_id").to_numpy(), seen)
            state.aggregates.add(batch)
            state.rows += batch.num_rows
            state.batches += 1
            if slow and story.slow.is_set():  # sleeps, cut short when the phase ends
                story.recovered.wait(batch.num_rows / SLOW_ROWS_PER_SECOND)
    except cf.ProducerFailedError:
        if not stop.is_set():
            raise


class Seen:
    """Which orders arrived, by sequence number (order_id - ORDER_ID_BASE): flags allocated in
    chunks as the numbers come, since the producer writes until the story is complete and how
    many orders that takes is not known up front."""

    CHUNK = 1 << 22

    def __init__(self) -> None:
        self._chunks: dict[int, npt.NDArray[np.bool_]] = {}
        self._lock = threading.Lock()

    def _chunk(self, i: int) -> npt.NDArray[np.bool_]:
        with self._lock:
            if (chunk := self._chunks.get(i)) is None:
                chunk = self._chunks[i] = np.zeros(self.CHUNK, dtype=np.bool_)
            return chunk

    def mark(self, seq: npt.NDArray[np.int64]) -> None:
        """Marks the sequence numbers as seen."""
        seq = np.sort(seq)
        for i in range(int(seq[0]) // self.CHUNK, int(seq[-1]) // self.CHUNK + 1):
            lo, hi = np.searchsorted(seq, [i * self.CHUNK, (i + 1) * self.CHUNK])
            self._chunk(i)[seq[lo:hi] - i * self.CHUNK] = True

    def missing(self, n: int) -> int:
        """How many of 0 .. n - 1 were not seen."""
        missing = 0
        for i in range(-(-n // self.CHUNK)):
            size = min(self.CHUNK, n - i * self.CHUNK)
            chunk = self._chunks.get(i)
            missing += size if chunk is None else size - int(np.count_nonzero(chunk[:size]))
        return missing

    def beyond(self, n: int) -> int:
        """How many numbers of n or more (never written) were seen."""
        count = 0
        for i, chunk in self._chunks.items():
            start = max(n - i * self.CHUNK, 0)
            count += int(np.count_nonzero(chunk[start:])) if start < self.CHUNK else 0
        return count


def record_order_ids(state: ConsumerState, ids: npt.NDArray[np.int64], seen: Seen) -> None:
    """Marks the order ids as seen and checks they increase along the channel."""
    if len(ids) == 0:
        return
    if ids[0] <= state.last_order_id or not bool(np.all(ids[1:] > ids[:-1])):
        state.out_of_order += 1
    state.last_order_id = int(ids[-1])
    seen.mark(ids - ORDER_ID_BASE)


# ------------------------------------------------------------------------------------ metrics


class Story:
    """The demo's phases, driven by the samples the monitor takes (:meth:`observe`, in the main
    thread); the workers follow them through events.

    1. normal until ``cfg.slow_start`` seconds;
    2. consumer 0 slow until the writer's level has been HIGH in ``cfg.slow_high_samples``
       samples (or ``cfg.slow_max`` seconds have passed without that);
    3. normal again: the producer writes on (past ``cfg.rows`` if need be) until a sample shows
       the level OK while it is still writing (or ``cfg.recover_max`` seconds have passed).
    """

    def __init__(self, cfg: Config) -> None:
        self._cfg = cfg
        #: Set while consumer 0 is slow.
        self.slow = threading.Event()
        #: Set once the slow phase is over.
        self.recovered = threading.Event()
        #: Set once the story needs no more rows (the producer stops at ``cfg.rows`` or now).
        self.complete = threading.Event()
        #: When the slow phase started and ended, s.
        self.slow_from: float | None = None
        self.slow_until: float | None = None
        #: Samples of the slow phase with the level HIGH.
        self.high_samples = 0
        #: The first sample after the slow phase with the level OK while writing, s.
        self.ok_again: float | None = None

    def observe(self, s: Sample) -> None:
        """Moves the story on by what the sample shows."""
        cfg = self._cfg
        if self.slow_from is None:
            if s.t >= cfg.slow_start:
                self.slow_from = s.t
                self.slow.set()
        elif self.slow_until is None:
            self.high_samples += s.level == "HIGH"
            if self.high_samples >= cfg.slow_high_samples or s.t - self.slow_from >= cfg.slow_max:
                self.slow_until = s.t
                self.slow.clear()
                self.recovered.set()
        elif not self.complete.is_set():
            if s.producing and s.level == "OK":
                self.ok_again = s.t
                self.complete.set()
            elif s.t - self.slow_until >= cfg.recover_max:
                self.complete.set()


class Monitor:
    """Samples the environment, the writer and the gates; rates cover the last second."""

    def __init__(
        self,
        env: cf.NetworkEnvironment,
        writer: cf.RecordWriter,
        gates: list[cf.InputGate],
        clock: Clock,
        story: Story,
    ) -> None:
        self._env = env
        self._writer = writer
        # Gates are sampled through env.metrics(), by name: InputGate.metrics() would wait for the
        # gate's lock, which a consumer blocked in next() holds (taken before any thread starts).
        self._gate_names = [str(g.metrics()["name"]) for g in gates]
        self._clock = clock
        self._story = story
        self._history: deque[tuple[float, int, int]] = deque(maxlen=64)
        self.samples: list[Sample] = []

    def sample(self, producing: bool) -> Sample:
        """Takes and keeps one sample."""
        t = self._clock.elapsed()
        part = self._writer.metrics()
        env = self._env.metrics()
        gates = [env["gates"][name] for name in self._gate_names]
        written = int(part["bytes_written"])
        read = sum(int(g["bytes_received"]) for g in gates)
        write_rate, read_rate = self._rates(t, written, read)
        s = Sample(
            t=t,
            slow=self._story.slow.is_set(),
            producing=producing,
            rows_written=int(part["rows_written"]),
            bytes_written=written,
            rows_read=sum(int(g["rows_received"]) for g in gates),
            bytes_read=read,
            write_mb_s=write_rate,
            read_mb_s=read_rate,
            bp_ms=float(part["backpressured_ms_per_second"]),
            level=str(part["level"]),
            out_pool_usage=float(part["out_pool_usage"]),
            backlog=tuple(int(b) for b in part["backlog"]),
            segments_available=int(env["segments_available"]),
            segments_total=int(env["segments_total"]),
        )
        self.samples.append(s)
        return s

    def _rates(self, t: float, written: int, read: int) -> tuple[float, float]:
        """MB/s written and read since the newest sample at least a second old."""
        self._history.append((t, written, read))
        base = self._history[0]
        for h in self._history:
            if t - h[0] >= 1.0:
                base = h
        dt = t - base[0]
        if dt <= 0:
            return 0.0, 0.0
        return (written - base[1]) / dt / 1e6, (read - base[2]) / dt / 1e6


# ---------------------------------------------------------------------------------------- run


@dataclass
class Run:
    """Everything a finished (or interrupted) run leaves for the checks and the summary."""

    cfg: Config
    producer: ProducerState
    consumers: list[ConsumerState]
    seen: Seen
    samples: list[Sample]
    story: Story
    wall: float
    errors: list[str]


@contextmanager
def exchange(cfg: Config) -> Iterator[tuple[cf.NetworkEnvironment, cf.RecordWriter, list[cf.InputGate]]]:
    """The environment, a 4-way hash-partitioned partition's writer, and one gate per consumer."""
    with cf.NetworkEnvironment(memory=cfg.memory) as env:
        part = env.create_partition(PARTITION_ID, num_subpartitions=NUM_CONSUMERS)
        gates = [
            env.create_input_gate([cf.ChannelSpec(env.address, PARTITION_ID, i)])
            for i in range(NUM_CONSUMERS)
        ]
        yield env, cf.RecordWriter(part, cf.HashPartitioner(["customer_id"])), gates


@contextmanager
def serving(env: cf.NetworkEnvironment, cfg: Config) -> Iterator[list[str]]:
    """Serves the environment's ``/metrics`` and the pipeline page while the block runs;
    yields the lines that say where (the ``creditflow top`` command and the page's address)."""
    if cfg.metrics_port is None:
        yield []
        return
    try:
        metrics = env.serve_metrics(cfg.metrics_port)
        from creditflow.tools.web import serve
    except ImportError:
        yield ["live view: pip install 'creditflow[top]' to serve /metrics and the pipeline page"]
        return
    with serve([metrics.url], cfg.web_port, names={metrics.url: "demo (in-process)"}) as page:
        yield [f"live view: creditflow top {metrics.url}", f"pipeline page: {page.url}"]


def run_demo(cfg: Config, view: View) -> Run:
    """Runs the exchange, showing it live. Ctrl-C stops the workers and re-raises."""
    stop = threading.Event()
    producer = ProducerState()
    consumers = [ConsumerState(i) for i in range(NUM_CONSUMERS)]
    seen = Seen()
    story = Story(cfg)
    with exchange(cfg) as (env, writer, gates), serving(env, cfg) as links:
        view.announce(links)
        clock = Clock()
        monitor = Monitor(env, writer, gates, clock, story)
        prod = Worker("producer", partial(produce, writer, cfg, clock, story, producer, stop))
        cons = [
            Worker(f"consumer-{c.index}", partial(consume, g, c, seen, story, stop))
            for g, c in zip(gates, consumers, strict=True)
        ]
        workers = [prod, *cons]
        try:
            for w in workers:
                w.start()
            watch(workers, monitor, story, view, stop)
        finally:
            stop.set()
            for w in workers:
                w.join(timeout=IO_TIMEOUT * 4)
        wall = clock.elapsed()
    errors = [f"{w.name}: {w.error!r}" for w in workers if w.error is not None]
    return Run(cfg, producer, consumers, seen, monitor.samples, story, wall, errors)


def watch(workers: list[Worker], monitor: Monitor, story: Story, view: View, stop: threading.Event) -> None:
    """Samples and shows the metrics, moving the story on, until every worker is done (or one
    failed)."""
    producer = workers[0]
    next_tick = time.monotonic()
    while any(w.is_alive() for w in workers):
        if any(w.error is not None for w in workers):
            stop.set()  # one failed: the others give up within IO_TIMEOUT
        sample = monitor.sample(producing=producer.is_alive())
        story.observe(sample)
        view.update(sample)
        next_tick += TICK_SECONDS
        time.sleep(max(0.0, next_tick - time.monotonic()))
    view.update(monitor.sample(producing=False), force=True)


# ------------------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class Check:
    """One verified property of the run."""

    ok: bool
    text: str


def check_rows(run: Run) -> Check:
    """(1) rows read == rows written (at least --rows), every order_id written exactly once
    and none other, in order per channel."""
    read = sum(c.rows for c in run.consumers)
    written = run.producer.rows
    missing = run.seen.missing(written)
    unknown = run.seen.beyond(written)
    disorder = sum(c.out_of_order for c in run.consumers)
    ok = read == written >= run.cfg.rows and missing == unknown == 0 and disorder == 0
    text = (
        f"rows: {read:,} read == {written:,} written; every order_id exactly once"
        f" ({missing:,} missing, {unknown:,} never written), in order per channel"
        f" ({disorder} batches out of order)"
    )
    return Check(ok, text)


def check_hash_partitioning(results: list[pa.Table]) -> Check:
    """(2) every customer_id was seen by exactly one consumer."""
    ids = np.concatenate([r.column("customer_id").to_numpy() for r in results])
    shared = len(ids) - len(np.unique(ids))
    per_consumer = ", ".join(f"{r.num_rows:,}" for r in results)
    text = (
        f"hash partitioning: {len(ids) - shared:,} customers ({per_consumer}), {shared} seen by 2+ consumers"
    )
    return Check(shared == 0, text)


def check_aggregates(results: list[pa.Table], expected: pa.Table) -> Check:
    """(3) per-customer (orders, sum amount) equal a group_by over all generated data."""
    actual = pa.concat_tables(results).sort_by("customer_id")
    ok = actual.equals(expected)
    verdict = "equal" if ok else "DIFFER from"
    text = f"aggregates: {actual.num_rows:,} customers' (orders, sum amount) {verdict} a direct group_by"
    return Check(ok, text + f" over the generated data ({expected.num_rows:,} customers)")


def check_backpressure(run: Run) -> Check:
    """(4) the level was HIGH while consumer 0 was slow and OK again after, while writing; read
    from the samples themselves."""
    start, end = run.story.slow_from, run.story.slow_until
    if start is None or end is None:
        return Check(False, "backpressure: the run ended before the slow phase did")
    highs = [s.t for s in run.samples if s.slow and s.level == "HIGH"]
    ok_after = next((s.t for s in run.samples if s.t > end and s.producing and s.level == "OK"), None)
    if not highs:
        return Check(False, f"backpressure: never HIGH in the slow phase {start:.1f}-{end:.1f} s")
    if ok_after is None:
        return Check(False, f"backpressure: not OK again after the slow phase ({end:.1f} s) while writing")
    return Check(
        True,
        f"backpressure: HIGH in {len(highs)} samples of the slow phase {start:.1f}-{end:.1f} s"
        f" (first at {highs[0]:.1f} s), OK again at {ok_after:.1f} s while writing",
    )


def verify(run: Run) -> list[Check]:
    """All checks of a completed run."""
    results = [c.aggregates.result() for c in run.consumers]
    return [
        check_rows(run),
        check_hash_partitioning(results),
        check_aggregates(results, run.producer.expected.result()),
        check_backpressure(run),
    ]


# ------------------------------------------------------------------------------------ summary


def summary(run: Run, chart: Path | None) -> list[str]:
    """The lines of the summary."""
    gb = max((s.bytes_written for s in run.samples), default=0) / 1e9
    peak_rate = max((s.write_mb_s for s in run.samples), default=0.0)
    peak_pool = max((s.out_pool_usage for s in run.samples), default=0.0)
    slow = ", ".join(str(i) for i in SLOW_CONSUMERS)
    st = run.story
    extra = run.producer.rows - run.cfg.rows
    lines = [
        "",
        "creditflow demo summary",
        f"  rows            {run.producer.rows:,} written, {sum(c.rows for c in run.consumers):,} read"
        f" by {NUM_CONSUMERS} consumers ({', '.join(f'{c.rows:,}' for c in run.consumers)})",
    ]
    if extra > 0:
        lines.append(f"                  ({extra:,} more than --rows: written until the level was OK again)")
    phase_text = (
        "did not run"
        if st.slow_from is None
        else f"{st.slow_from:.1f} s - "
        + ("(end of run)" if st.slow_until is None else f"{st.slow_until:.1f} s")
        + f" (consumer {slow}; {st.high_samples} HIGH samples, {run.cfg.slow_high_samples} wanted)"
    )
    lines += [
        f"  data            {gb:.2f} GB (Arrow in-memory size) through {run.cfg.memory} of network memory",
        f"  wall time       {run.wall:.1f} s",
        f"  throughput      {gb * 1e3 / run.wall:.1f} MB/s average, {peak_rate:.1f} MB/s peak (1 s window),"
        f" {run.producer.rows / run.wall / 1e6:.2f} M rows/s",
        f"  peak out-pool   {peak_pool:.0%}",
        f"  slow phase      {phase_text}",
        f"  level timeline  {format_timeline(run.samples)}",
    ]
    if chart is not None:
        lines.append(f"  chart           {chart}")
    return lines


def chart_of(run: Run, path: Path) -> bool:
    """Writes the run's chart to ``path`` (False without matplotlib)."""
    title = f"creditflow demo: {run.producer.rows:,} orders, {run.cfg.memory}, 4 hash-partitioned consumers"
    st = run.story
    slow = None if st.slow_from is None else (st.slow_from, st.slow_until)
    return write_chart(run.samples, path, title, slow)


# --------------------------------------------------------------------------------------- main


def report(run: Run, chart: Path | None) -> int:
    """Prints the summary and the checks; 0 when everything was verified, else 1."""
    print("\n".join(summary(run, chart)))
    if run.errors:
        print("FAILED: " + "; ".join(run.errors))
        return 1
    checks = verify(run)
    for c in checks:
        print(f"  [{'ok' if c.ok else 'FAIL'}] {c.text}")
    if all(c.ok for c in checks):
        print("VERIFIED")
        return 0
    print("FAILED: " + "; ".join(c.text for c in checks if not c.ok))
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo; 0 when verified, 1 when something failed, 130 on Ctrl-C."""
    cfg = parse_args(argv)
    print(
        f"creditflow {cf.__version__} demo: {cfg.rows:,} orders in batches of {BATCH_ROWS:,},"
        f" {NUM_CONSUMERS} consumers, consumer 0 slow {cfg.describe_slow()}",
        flush=True,
    )
    try:
        with make_view(cfg.plain, cfg.describe_slow()) as view:
            run = run_demo(cfg, view)
        chart = cfg.chart if cfg.chart is not None and run.samples and chart_of(run, cfg.chart) else None
        return report(run, chart)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
