"""Streaming a DataFrame into the ranks of a training job: every row to one rank per epoch,
equal steps, epochs replayed without Spark, seeded shuffles, resuming, faults.

The ranks run as threads of the test process (each its own Receiver and environment, as in
its own process); the DataFrame has an ``id`` column, so every check is row by row.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from typing_extensions import Self

import creditflow as cf

pytestmark = pytest.mark.spark

pyspark = pytest.importorskip("pyspark")
from pyspark import TaskContext  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import creditflow.spark as cfs  # noqa: E402
from spark_faults import fail_first_attempt, kill_first_attempt, reversed_after_first_attempt  # noqa: E402


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # local[2, 4]: two task slots, and a failed task is tried up to 4 times (killed workers).
    session = cfs.local_session("local[2, 4]", "creditflow-test-ranks", {"spark.driver.memory": "1g"})
    try:
        yield session
    finally:
        session.stop()


def numbers(spark: SparkSession, rows: int, partitions: int) -> DataFrame:
    return spark.range(0, rows, numPartitions=partitions).select(
        "id", (F.col("id") * 2).cast("double").alias("x")
    )


def ids_of(batch: pa.RecordBatch) -> np.ndarray:
    ids: np.ndarray = batch.column("id").to_numpy().copy()
    return ids


class Job:
    """W ranks in threads; ``epoch(e)`` iterates epoch e on every rank at once."""

    def __init__(
        self, world: int, batch_size: int, states: list[dict[str, Any]] | None = None, **kw: Any
    ) -> None:
        self.secret = "s" * 64
        self.rx = [
            cfs.Receiver(
                rank=r,
                world_size=world,
                batch_size=batch_size,
                secret=self.secret,
                timeout=120,
                state=states[r] if states is not None else None,
                **kw,
            )
            for r in range(world)
        ]

    @property
    def addresses(self) -> list[str]:
        return [rx.address for rx in self.rx]

    def epoch(self, e: int, stop_after: int | None = None) -> list[list[np.ndarray]]:
        out: list[list[np.ndarray]] = [[] for _ in self.rx]
        errors: list[BaseException] = []

        def run(r: int) -> None:
            try:
                self.rx[r].set_epoch(e)
                for batch in self.rx[r]:
                    out[r].append(ids_of(batch))
                    if stop_after is not None and len(out[r]) == stop_after:
                        return
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(r,)) for r in range(len(self.rx))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        if errors:
            raise errors[0]
        return out

    def stream(
        self, df: DataFrame, epochs: int, **kw: Any
    ) -> tuple[list[list[list[np.ndarray]]], dict[str, Any]]:
        """``send(df)`` to the ranks while they read epochs ``0 .. epochs - 1``: each epoch's
        ids per rank, and what ``send`` returned (``stats``) or raised (``error``)."""
        result: dict[str, Any] = {}
        t = start_send(df, self, result, **kw)
        got = [self.epoch(e) for e in range(epochs)]
        t.join(120)
        return got, result

    def close(self) -> None:
        for rx in self.rx:
            rx.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def start_send(df: DataFrame, job: Job, result: dict[str, Any], **kw: Any) -> threading.Thread:
    def run() -> None:
        try:
            result["stats"] = cfs.send(df, job.addresses, job.secret, **kw)
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t


def run_ranks(job: Job, rank: Callable[[int], None], send: threading.Thread) -> None:
    """Runs ``rank(r)`` for every rank of ``job`` in threads of its own, then waits for them
    and for ``send``; closes the job's receivers in any case."""
    try:
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(job.rx))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(180)
        send.join(120)
    finally:
        job.close()


def resumed(
    df: DataFrame,
    before: list[list[np.ndarray]],
    states: list[dict[str, Any]],
    epoch: int,
    rows: int,
    batch: int,
    **kw: Any,
) -> list[list[np.ndarray]]:
    """The whole job started again from ``states`` (new receivers, Spark again): the rest of
    ``epoch``; checks that ``before`` and the rest are every row once, in equal steps."""
    with Job(2, batch, states=states, **kw) as again:
        result: dict[str, Any] = {}
        t = start_send(df, again, result)
        after = again.epoch(epoch)
        t.join(120)
    assert "error" not in result, result
    steps = [len(b) + len(a) for b, a in zip(before, after, strict=True)]
    assert steps[0] == steps[1], f"equal steps across the restart: {steps}"
    got = np.concatenate([x for b in before + after for x in b])
    assert np.array_equal(np.sort(got), np.arange(rows)), f"epoch {epoch}: every row once across the restart"
    return after


def test_two_ranks_get_every_row_once_in_equal_steps_every_epoch(spark: SparkSession, tmp_path: Any) -> None:
    """Epoch 0 streams from Spark, epochs 1 and 2 replay from the ranks (Spark ran once):
    every row reaches one rank per epoch, both ranks yield the same number of batches of
    batch_size rows (the last step splits the remainder), each epoch in another order, and
    the same order again for the same (seed, epoch)."""
    rows, batch = 100_003, 1000
    df = numbers(spark, rows, 3)
    job = Job(2, batch, memory="8MiB", spill_dir=str(tmp_path), seed=11)
    result: dict[str, Any] = {}
    try:
        t = start_send(df, job, result)
        epochs = [job.epoch(e) for e in range(3)]
        t.join(120)
        again = job.epoch(1)  # epoch 1 anew: set_epoch(1) after epoch 2
        stores = [rx.spill_metrics() for rx in job.rx]
    finally:
        job.close()
    assert "error" not in result, result
    assert [s["partition"] for s in result["stats"]] == [0, 1, 2], "Spark computed each partition once"
    for e, per_rank in enumerate(epochs):
        counts = [len(b) for b in per_rank]
        assert counts[0] == counts[1], f"epoch {e}: equal steps {counts}"
        sizes = [len(x) for b in per_rank for x in b[:-1]]
        assert set(sizes) == {batch}, f"epoch {e}: all but the last batch have batch_size rows"
        got = np.concatenate([x for b in per_rank for x in b])
        assert len(got) == rows, f"epoch {e}"
        assert np.array_equal(np.sort(got), np.arange(rows)), f"epoch {e}: every row once"
    orders = [np.concatenate(per_rank[0]) for per_rank in epochs]
    assert not np.array_equal(orders[1], orders[2]), "each epoch in another order"
    assert np.array_equal(np.concatenate(again[0]), orders[1]), "the same (seed, epoch): the same order"
    assert all(s is not None and s["replay"] for s in stores)


@pytest.mark.parametrize("drop_last", [False, True])
def test_the_global_shuffle_deals_rows_to_other_ranks_every_epoch(
    spark: SparkSession, tmp_path: Any, drop_last: bool
) -> None:
    """``shuffle="global"``: from epoch 1 on the ranks deal their rows out to each other
    over creditflow channels. Every epoch: every row once across the ranks (fewer than a
    step left out with drop_last), equal steps; each epoch a rank holds other rows than the
    epoch before (about half of them from the other rank), and the same (seed, epoch) deals
    the same rows in the same order again."""
    rows, batch = 60_007, 500
    job = Job(2, batch, shuffle="global", seed=7, memory="8MiB", spill_dir=str(tmp_path), drop_last=drop_last)
    result: dict[str, Any] = {}
    try:
        t = start_send(numbers(spark, rows, 4), job, result)
        epochs = [job.epoch(e) for e in range(4)]
        t.join(120)
        again = job.epoch(2)  # epoch 2 anew
    finally:
        job.close()
    assert "error" not in result, result
    held = []
    for e, per_rank in enumerate(epochs):
        assert len(per_rank[0]) == len(per_rank[1]), f"epoch {e}: equal steps"
        got = np.concatenate([x for b in per_rank for x in b])
        assert len(np.unique(got)) == len(got), f"epoch {e}: no row twice"
        if drop_last:
            assert {len(x) for b in per_rank for x in b} == {batch}
            assert rows - len(got) < 2 * batch
        else:
            assert len(got) == rows, f"epoch {e}: every row"
        held.append(set(np.concatenate(per_rank[0]).tolist()))
    for e in (1, 2, 3):
        stayed = len(held[e] & held[e - 1]) / len(held[e])
        assert 0.35 < stayed < 0.65, f"epoch {e}: {stayed:.2f} of rank 0's rows were its rows before"
    for r in range(2):
        assert np.array_equal(np.concatenate(again[r]), np.concatenate(epochs[2][r])), "the same deal again"


def test_the_global_shuffle_resumes_a_restarted_job_at_the_next_batch(spark: SparkSession) -> None:
    """Both ranks checkpoint after 6 batches of epoch 2 (globally shuffled); the whole job
    starts again from the checkpoint: the rows before and after are every row once."""
    rows, batch = 30_000, 400
    df = numbers(spark, rows, 3)
    job = Job(2, batch, shuffle="global", seed=9)
    result: dict[str, Any] = {}
    try:
        t = start_send(df, job, result)
        job.epoch(0)
        job.epoch(1)
        before = job.epoch(2, stop_after=6)
        states = [rx.state_dict() for rx in job.rx]
        t.join(120)
    finally:
        job.close()
    assert [s["shuffle"] for s in states] == ["global", "global"]
    resumed(df, before, states, 2, rows, batch, shuffle="global", seed=9)


def skewed(spark: SparkSession, big: int, tiny: int, width: int) -> tuple[DataFrame, np.ndarray]:
    """Two partitions of ``big`` rows, then ``tiny`` partitions of which the even ones hold
    1,024 rows (one stripe each: all of them rank 0's of 2); ``width`` float columns beside
    ``id``. Returns the DataFrame and its ids."""
    parts = 2 + tiny

    def rows_of(p: int) -> int:
        return big if p < 2 else (1024 if p % 2 == 0 else 0)

    def gen(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None
        for _ in batches:
            pass
        p = ctx.partitionId()
        n = rows_of(p)
        for start in range(0, n, 8192):
            ids = p * 10_000_000 + np.arange(start, min(n, start + 8192), dtype=np.int64)
            cols = {"id": ids, **{f"f{j}": ids * 0.5 + j for j in range(width)}}
            yield pa.RecordBatch.from_pydict(cols)

    schema = "id long, " + ", ".join(f"f{j} double" for j in range(width))
    df = spark.range(0, parts, numPartitions=parts).mapInArrow(gen, schema)
    ids = np.concatenate([p * 10_000_000 + np.arange(rows_of(p), dtype=np.int64) for p in range(parts)])
    return df, ids


@pytest.mark.parametrize(
    ("width", "memory_mib", "big", "batch"),
    [(64, 16, 60_000, 256), (1, 8, 1_000_000, 1024)],
    ids=["wide rows", "narrow rows, stripes joined and batches dealt"],
)
def test_a_rank_holds_at_most_its_memory_and_a_batch(
    spark: SparkSession, tmp_path: Any, width: int, memory_mib: int, big: int, batch: int
) -> None:
    """Two ranks, each in a process of its own with ``memory``, get about twice that each,
    rank 0 first half as much again (the even tiny partitions are all its): it parks what
    the bound holds back in its runs and gives it away at the end; three epochs, shuffled
    across the ranks. Every epoch every row once; each rank's private resident memory grows
    by at most ``memory`` plus a batch plus what a process holds besides, and what it
    accounts for (its environment's allocated segments and the rows it holds outside them)
    stays within ``memory`` plus a batch. Wide rows travel a stripe a batch; narrow ones in
    the batches tasks join a rank's stripes into and ranks deal each other."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    df, ids = skewed(spark, big=big, tiny=64, width=width)
    secret = "m" * 64
    memory = memory_mib << 20
    procs = []
    for r in range(2):
        cfg = {
            "rank": r,
            "world": 2,
            "batch": batch,
            "secret": secret,
            "memory": memory,
            "spill_dir": str(tmp_path),
            "shuffle": "global",
            "epochs": 3,
            "out": str(tmp_path / f"rank{r}"),
        }
        worker = Path(__file__).resolve().parent / "rank_worker.py"
        # Allocators that give freed memory back, so that resident memory follows what is held.
        env = {
            **os.environ,
            "MALLOC_ARENA_MAX": "2",
            "MALLOC_MMAP_THRESHOLD_": "65536",
            "MALLOC_TRIM_THRESHOLD_": "131072",
            "ARROW_DEFAULT_MEMORY_POOL": "system",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(worker), json.dumps(cfg)], stdout=subprocess.PIPE, text=True, env=env
            )
        )
    try:
        addresses = [json.loads(p.stdout.readline())["address"] for p in procs]  # type: ignore[union-attr]
        cfs.send(df, addresses, secret)
        reports = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()  # type: ignore[union-attr]
    assert reports[0]["batches"] == reports[1]["batches"], "equal steps"
    for e in range(3):
        got = np.concatenate([np.fromfile(tmp_path / f"rank{r}.{e}", dtype=np.int64) for r in range(2)])
        assert np.array_equal(np.sort(got), ids), f"epoch {e}: every row once"
    # What a rank's process holds besides: threads, connections, Python objects; measured
    # 6-7 MB with a few thousand rows, and 8-10 MB over memory with this test's rows (the
    # rank before it kept the window, the rows held back and the rows moved in in memory:
    # 36 and 51 MB, with shuffle=True).
    slack = 16 << 20
    for r, rep in enumerate(reports):
        bound = rep["memory"] + rep["batch_bytes"]
        print(f"rank {r}: {rep}")
        assert rep["spilled"] > 0, "the runs spill what does not fit"
        assert rep["accounted"] <= bound, f"rank {r} accounts for more than memory and a batch: {rep}"
        assert rep["rss_growth"] <= bound + slack, f"rank {r}'s memory grew by more: {rep}"


def test_drop_last_gives_full_batches_and_drops_fewer_than_a_step(spark: SparkSession) -> None:
    rows, batch = 50_017, 512
    with Job(2, batch, drop_last=True) as job:
        epochs, _ = job.stream(numbers(spark, rows, 2), 2)
    for per_rank in epochs:
        assert len(per_rank[0]) == len(per_rank[1]) == rows // (2 * batch)
        assert {len(x) for b in per_rank for x in b} == {batch}
        got = np.concatenate([x for b in per_rank for x in b])
        assert len(np.unique(got)) == len(got), "no row twice"
        assert rows - len(got) <= 2 * batch - 1


def test_unbalanced_partitions_still_give_equal_steps(spark: SparkSession) -> None:
    """One big partition and many tiny ones (each tiny partition goes to one rank only): the
    ranks move rows at the end and still yield the same number of batches."""
    big = spark.range(0, 30_000, numPartitions=1)
    tiny = spark.range(30_000, 30_050, numPartitions=5)
    df = big.union(tiny).select("id")
    with Job(3, 700, shuffle=False) as job:
        epochs, _ = job.stream(df, 2)
    for per_rank in epochs:
        assert len({len(b) for b in per_rank}) == 1
        got = np.concatenate([x for b in per_rank for x in b])
        assert np.array_equal(np.sort(got), np.arange(30_050))


def test_a_restarted_job_continues_the_epoch_with_no_row_twice_or_missing(spark: SparkSession) -> None:
    """Both ranks checkpoint after 7 batches of epoch 0 and after 5 of epoch 1, the whole
    job (receivers and Spark) starts again from each checkpoint, and the rows before plus
    the rows after are every row once."""
    rows, batch = 40_000, 500
    df = numbers(spark, rows, 4)
    for epoch, stop in ((0, 7), (1, 5)):
        job = Job(2, batch, seed=3)
        result: dict[str, Any] = {}
        try:
            t = start_send(df, job, result)
            for e in range(epoch):
                job.epoch(e)
            before = job.epoch(epoch, stop_after=stop)
            states = [rx.state_dict() for rx in job.rx]
        finally:
            job.close()  # the training job dies (in epoch 0: while Spark still sends)
        t.join(300)
        assert not t.is_alive(), "send() returned once the ranks went away"
        assert all(s["epoch"] == epoch and s["batches"] == stop for s in states)
        resumed(df, before, states, epoch, rows, batch, seed=3)


class _Checked:
    """A rank's lock that, each time the reading thread lets go of it, checks that the rank's
    ``state_dict()`` counts exactly the batches the trainer took (``taken``)."""

    def __init__(self, rx: cfs.Receiver, taken: list[int], errors: list[str]) -> None:
        self.rx, self.taken, self.errors = rx, taken, errors
        self.inner = rx._mode._cond  # type: ignore[union-attr]
        self.reader: int | None = None
        self.checking = False
        self.depth = 0  # the reader's nesting (the lock is reentrant)

    def __enter__(self) -> bool:
        entered = self.inner.__enter__()
        if threading.get_ident() == self.reader:
            self.depth += 1
        return entered

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.inner.__exit__(kind, value, tb)
        if threading.get_ident() != self.reader:
            return
        self.depth -= 1
        if self.depth == 0 and not self.checking:
            self.checking = True
            try:
                got = self.rx.state_dict()["batches"]
                if got != self.taken[0]:
                    self.errors.append(f"state_dict says {got} batches, the trainer took {self.taken[0]}")
            finally:
                self.checking = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_batch_read_ahead_counts_in_the_state_only_once_the_trainer_took_it(spark: SparkSession) -> None:
    """Between the moment a batch is read ahead and the trainer's ``consumed()``, a rank's
    ``state_dict()`` (taken from any thread, at any moment) never counts it."""
    df = numbers(spark, 12_000, 2)
    job = Job(2, 500, seed=2)
    result: dict[str, Any] = {}
    errors: list[str] = []
    counts = [0, 0]

    def rank(r: int) -> None:
        rx, taken = job.rx[r], [0]
        checked = _Checked(rx, taken, errors)
        rx._mode._cond = checked  # type: ignore[union-attr]
        checked.reader = threading.get_ident()
        try:
            while (batch := rx.read_ahead()) is not None:
                assert batch.num_rows == 500
                taken[0] += 1  # the trainer takes it: counted from consumed() on
                rx.consumed()
        finally:
            rx._mode._cond = checked.inner  # type: ignore[union-attr]
        counts[r] = taken[0]

    run_ranks(job, rank, start_send(df, job, result))
    assert "error" not in result, result
    assert counts == [12, 12]
    assert errors == []


@pytest.mark.parametrize("epoch", [0, 1])
def test_a_prefetching_loader_s_state_counts_what_the_trainer_got(spark: SparkSession, epoch: int) -> None:
    """``RankDataset(device="cpu")`` reads a batch or two ahead of the trainer. Mid-epoch,
    once it has read ahead, each rank's ``state_dict()`` still says the batches the trainer
    got; a DataLoader made anew goes on at the next batch (the batches read ahead go back
    to the receiver); and a job restarted from the state gets the rest: the rows before and
    after are every row once."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from creditflow.torch import RankDataset

    rows, batch, stop = 24_000, 500, 5
    df = numbers(spark, rows, 2)
    job = Job(2, batch, seed=2)
    result: dict[str, Any] = {}
    before: list[list[np.ndarray]] = [[], []]
    rest: list[list[np.ndarray]] = [[], []]
    states: list[dict[str, Any]] = [{}, {}]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            rx = job.rx[r]
            data = RankDataset(rx, columns=["id"], device="cpu")
            data.set_epoch(epoch)
            start = rx.rank_metrics()["rows_yielded"]
            for item in DataLoader(data, batch_size=None):
                before[r].append(item["id"].numpy().copy())
                if len(before[r]) == stop:
                    deadline = time.monotonic() + 60
                    while rx.rank_metrics()["rows_yielded"] < start + (stop + 1) * batch:
                        assert time.monotonic() < deadline, "the loader read ahead"
                        time.sleep(0.05)
                    states[r] = rx.state_dict()
                    break
            for item in DataLoader(data, batch_size=None):  # a new loader goes on
                rest[r].append(item["id"].numpy().copy())
        except BaseException as exc:
            errors.append(exc)

    t = start_send(df, job, result)
    try:
        if epoch == 1:
            job.epoch(0)
    except BaseException:
        job.close()
        raise
    run_ranks(job, rank, t)
    if errors:
        raise errors[0]
    assert [s["batches"] for s in states] == [stop, stop], "the batches the trainer got"
    live = np.concatenate([x for b in before + rest for x in b])
    assert np.array_equal(np.sort(live), np.arange(rows)), "a new loader goes on at the next batch"
    resumed(df, before, states, epoch, rows, batch, seed=2)


def test_a_live_rank_goes_back_to_a_checkpoint_without_spark(spark: SparkSession) -> None:
    job = Job(2, 400, seed=5)
    result: dict[str, Any] = {}
    try:
        t = start_send(numbers(spark, 20_000, 2), job, result)
        job.epoch(0)
        t.join(120)
        part = job.epoch(1, stop_after=4)
        states = [rx.state_dict() for rx in job.rx]
        rest = job.epoch(1)  # the same epoch: continues
        for rx, s in zip(job.rx, states, strict=False):
            rx.load_state_dict(s)
        replayed: list[list[np.ndarray]] = [[] for _ in job.rx]
        for r, rx in enumerate(job.rx):
            replayed[r] = [ids_of(b) for b in rx]
    finally:
        job.close()
    for r in range(2):
        assert np.array_equal(np.concatenate(replayed[r]), np.concatenate(rest[r])), "from the checkpoint on"
    got = np.concatenate([x for b in part + rest for x in b])
    assert np.array_equal(np.sort(got), np.arange(20_000))


def test_a_worker_killed_in_epoch_0_still_gives_every_row_once(spark: SparkSession) -> None:
    rows = 200_000

    df = numbers(spark, rows, 2).mapInArrow(kill_first_attempt(1, 3), "id long, x double")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "5000")
    try:
        with Job(2, 1000) as job:
            (e0,), result = job.stream(df, 1)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert "error" not in result, result
    attempts = {(s["partition"], s["attempt"]) for s in result["stats"]}
    assert (1, 1) in attempts, f"partition 1 was tried again: {attempts}"
    got = np.concatenate([x for b in e0 for x in b])
    assert len(got) == rows
    assert np.array_equal(np.sort(got), np.arange(rows))
    assert len(e0[0]) == len(e0[1])


def test_a_task_whose_input_ends_early_is_retried_and_continues(spark: SparkSession) -> None:
    """An upstream Python function fails in attempt 0 after a few batches: the sending
    task's input ends there without an error (its stream to the ranks ends cleanly), Spark
    fails the task and tries again, and the ranks take the retried attempt after the rows
    they have: every row once (the driver's word that the job succeeded ends the stream)."""
    rows = 120_000

    df = numbers(spark, rows, 2).mapInArrow(fail_first_attempt(0, 3), "id long, x double")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "5000")
    try:
        with Job(2, 1000) as job:
            (e0, e1), result = job.stream(df, 2)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert "error" not in result, result
    assert (0, 1) in {(s["partition"], s["attempt"]) for s in result["stats"]}, result["stats"]
    for per_rank in (e0, e1):
        got = np.concatenate([x for b in per_rank for x in b])
        assert np.array_equal(np.sort(got), np.arange(rows)), "every row once"
        assert len(per_rank[0]) == len(per_rank[1])


def test_a_retry_that_computes_another_order_fails_send_and_the_ranks(
    spark: SparkSession, tmp_path: Any
) -> None:
    """A retried attempt that computes the partition's rows in another order cannot continue
    after the rows the ranks have (some would come twice, others never): its check at each
    rank's resume point fails, ``send`` raises saying so, and so do both ranks. Attempt 0
    fails once the ranks hold rows of the partition, so that there are rows to continue after
    (more than partition 1's rows in all)."""
    rows, delivered = 60_000, tmp_path / "delivered"
    first_fails = reversed_after_first_attempt(0, 3, delivered)
    df = numbers(spark, rows, 2).mapInArrow(first_fails, "id long, x double")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "5000")
    try:
        with Job(2, 1000) as job:
            result: dict[str, Any] = {}
            t = start_send(df, job, result, timeout=120)
            raised: list[BaseException] = []

            def rank(r: int) -> None:
                try:
                    for _ in job.rx[r]:
                        pass
                except cf.ProducerFailedError as exc:
                    raised.append(exc)

            def watch() -> None:
                while t.is_alive() and not delivered.exists():
                    if sum(rx.rank_metrics()["rows_held"] for rx in job.rx) > rows // 2:
                        delivered.touch()
                    time.sleep(0.02)

            threading.Thread(target=watch, daemon=True).start()
            run_ranks(job, rank, t)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert "computed other rows than the attempt it continues" in str(result.get("error")), result
    assert len(raised) == 2, "both ranks raise"
    assert all("computed other rows" in str(exc) for exc in raised), raised


def test_a_rank_that_goes_away_fails_send_naming_it_and_the_other_rank(spark: SparkSession) -> None:
    job = Job(2, 1000, max_queued=2)
    result: dict[str, Any] = {}
    t = start_send(numbers(spark, 2_000_000, 2), job, result, timeout=60)
    try:
        for _ in range(3):
            assert job.rx[0].next() is not None
        job.rx[1].close()  # rank 1 goes away mid-stream
        # Rank 0 raises naming it: at its next batch or a few later (what it already holds
        # comes first), never at the end of the stream.
        with pytest.raises(cf.CreditflowError, match="rank 1"):
            for _ in job.rx[0]:
                pass
    finally:
        job.close()
    t.join(600)
    assert "error" in result, "send() raised"


def test_a_rank_killed_while_the_tasks_write_to_it_fails_send_promptly_naming_it(
    spark: SparkSession, tmp_path: Any
) -> None:
    """Rank 1 runs in a process of its own and is killed (SIGKILL) after 5 batches, while
    the tasks still stream millions of rows to both ranks: ``send`` raises naming rank 1
    well within its 600 s timeout, and rank 0 raises naming it instead of waiting."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    secret = "d" * 64
    rx0 = cfs.Receiver(rank=0, world_size=2, batch_size=1000, secret=secret, timeout=300)
    cfg = {
        "rank": 1,
        "world": 2,
        "batch": 1000,
        "secret": secret,
        "memory": 64 << 20,
        "spill_dir": str(tmp_path),
        "shuffle": True,
        "epochs": 1,
        "out": str(tmp_path / "rank1"),
        "die_after": 5,
    }
    worker = Path(__file__).resolve().parent / "rank_worker.py"
    proc = subprocess.Popen([sys.executable, str(worker), json.dumps(cfg)], stdout=subprocess.PIPE, text=True)
    result: dict[str, Any] = {}
    rank0: list[BaseException] = []
    try:
        address1 = json.loads(proc.stdout.readline())["address"]  # type: ignore[union-attr]

        def run() -> None:
            try:
                result["stats"] = cfs.send(numbers(spark, 4_000_000, 2), [rx0.address, address1], secret)
            except BaseException as exc:
                result["error"] = exc

        t = threading.Thread(target=run)
        t.start()
        with pytest.raises(cf.CreditflowError) as raised:
            for _ in rx0:
                pass
        rank0.append(raised.value)
        assert proc.wait(60) == -signal.SIGKILL
        t.join(120)  # the default timeout is 600 s
        assert not t.is_alive(), "send() raised well within its timeout"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        rx0.close()
    assert "error" in result, "send() raised"
    assert "rank 1" in str(result["error"])
    assert "rank 1" in str(rank0[0]), rank0[0]


@pytest.mark.slow
def test_the_torch_example_trains_two_ddp_ranks_for_three_epochs() -> None:
    """examples/train_torch.py: DDP (gloo, CPU), 2 ranks, lineitem features from Spark, 3
    epochs: equal steps, every row once per epoch, and the loss falls."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torch")
    example = Path(__file__).resolve().parent.parent / "examples" / "train_torch.py"
    done = subprocess.run(
        [sys.executable, str(example), "--rows", "120000"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])["summary"]
    assert summary["equal_steps"]
    assert summary["rows_per_epoch"] == [120_000] * 3
    loss = summary["loss_per_epoch"]
    assert loss[2] < loss[0], loss
