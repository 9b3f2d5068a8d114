"""Two training ranks driven without Spark: a retry that continues each rank's share of a
partition (after checking that it computed the same rows there), and what a rank's peer sees
when it fails or leaves."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")
import creditflow as cf
import creditflow.spark as cfs
from creditflow.spark._process import EnvSettings
from creditflow.spark._rank import Ranked
from creditflow.spark._reshuffle import Gathering
from creditflow.spark._runs import MovedIn
from creditflow.spark._sending import SendPlan, register_job, stream_partition, tell_job_done

SECRET = "r" * 64
R = TypeVar("R")


def rows(n: int, reverse: bool = False) -> Iterator[pa.RecordBatch]:
    """``x`` = 0 .. n - 1 in batches of 1,000 (each batch's rows reversed with ``reverse``)."""
    for start in range(0, n, 1000):
        values = range(start, start + 1000)
        yield pa.record_batch({"x": pa.array(list(reversed(values)) if reverse else values)})


class Reading:
    """Epoch 0 of every rank at once, in threads: the rows each yields, and what each raised."""

    def __init__(self, ranks: list[cfs.Receiver]) -> None:
        self.got: list[list[int]] = [[] for _ in ranks]
        self.raised: list[BaseException | None] = [None for _ in ranks]
        self._threads = [threading.Thread(target=self._run, args=(rx, r)) for r, rx in enumerate(ranks)]
        for t in self._threads:
            t.start()

    def _run(self, rx: cfs.Receiver, r: int) -> None:
        try:
            for batch in rx:
                self.got[r].extend(batch.column("x").to_pylist())
        except BaseException as exc:
            self.raised[r] = exc

    def join(self) -> None:
        for t in self._threads:
            t.join(120)


def two_ranks() -> list[cfs.Receiver]:
    return [cfs.Receiver(rank=r, world_size=2, batch_size=500, secret=SECRET, timeout=60) for r in range(2)]


def job_of(ranks: list[cfs.Receiver]) -> SendPlan:
    """A send's plan to ``ranks``, its job of one partition registered with them."""
    addresses = tuple(rx.address for rx in ranks)
    return register_job(SendPlan("j1", addresses, True, EnvSettings(secret=SECRET), 60, None), 1)


@contextlib.contextmanager
def sent(ranks: list[cfs.Receiver], reader: Callable[[list[cfs.Receiver]], R]) -> Iterator[R]:
    """``reader(ranks)`` (something with ``join()``) reads while one partition of 10,000 rows
    is sent to ``ranks`` and the driver's word that the job succeeded follows; yields the
    reader once joined and closes every rank at the end."""
    try:
        with cf.NetworkEnvironment(secret=SECRET) as env:
            plan = job_of(ranks)
            reading = reader(ranks)
            tell_job_done(plan, [stream_partition(env, plan, 0, 0, rows(10_000))])
            reading.join()
        yield reading
    finally:
        for rx in ranks:
            rx.close()


def continued(retry: Iterator[pa.RecordBatch]) -> tuple[Reading, BaseException | None]:
    """Attempt 0 of a one-partition job to two ranks ends after 3,000 rows (its input ended
    early, as when an upstream function failed); attempt 1 sends ``retry``, and the driver's
    word that the job succeeded follows. What the ranks read, and what attempt 1 raised."""
    ranks = two_ranks()
    raised: BaseException | None = None
    try:
        with cf.NetworkEnvironment(secret=SECRET) as env:
            plan = job_of(ranks)
            reading = Reading(ranks)
            assert stream_partition(env, plan, 0, 0, rows(3000))["accepted"]
            try:
                tell_job_done(plan, [stream_partition(env, plan, 0, 1, retry)])
            except RuntimeError as exc:
                raised = exc
            reading.join()
    finally:
        for rx in ranks:
            rx.close()
    return reading, raised


def test_a_retry_that_computes_the_same_rows_continues_each_rank_s_share() -> None:
    """Attempt 1 computes all 10,000 rows: each rank gets the rest of its share, and every
    row reaches one rank once."""
    reading, raised = continued(rows(10_000))
    assert raised is None
    assert reading.raised == [None, None]
    got = reading.got
    assert sorted(got[0] + got[1]) == list(range(10_000)), "every row once"
    assert len(got[0]) == len(got[1]) == 5000


def test_a_retry_that_computes_other_rows_fails_the_ranks_instead_of_continuing() -> None:
    """A retry whose rows come in another order (as after a shuffle) would give a rank some
    rows twice and lose others: its row where a rank's share stopped differs, so the task
    raises and every rank's consumer raises why."""
    reading, raised = continued(rows(10_000, reverse=True))
    assert "computed other rows than the attempt it continues" in str(raised)
    for r, exc in enumerate(reading.raised):
        assert isinstance(exc, cf.ProducerFailedError), (r, exc)
        assert "differs from the one it has" in str(exc), (r, exc)


def test_a_retry_whose_rows_match_only_at_one_rank_s_end_still_fails() -> None:
    """Each rank checks its own end: rows that agree where rank 0's share stopped but not
    where rank 1's did fail the stream too."""

    def changed_late(n: int) -> Iterator[pa.RecordBatch]:
        # Of the first 3,000 rows rank 1's share is stripe 1 (rows 1,024 .. 2,047) and rank
        # 0's ends at row 2,999: row 2,047 differs, row 2,999 does not.
        for batch in rows(n):
            x = batch.column("x").to_pylist()
            yield pa.record_batch({"x": [-1 if v == 2047 else v for v in x]})

    reading, raised = continued(changed_late(10_000))
    assert "rank 1's share" in str(raised)
    assert all(isinstance(exc, cf.ProducerFailedError) for exc in reading.raised), reading.raised


def test_a_rank_that_closes_before_it_had_its_share_fails_its_peer_at_once() -> None:
    """What a rank received of epoch 0 goes with it: its peer raises naming it at its next
    ``next()``, not after its ``timeout``."""
    ranks = two_ranks()
    try:
        job_of(ranks)
        ranks[1].close()
        with pytest.raises(cf.ProducerFailedError, match="rank 1 closed before it had its share of epoch 0"):
            ranks[0].next(timeout=30)
    finally:
        for rx in ranks:
            rx.close()


def test_a_rank_that_closes_after_epoch_0_leaves_its_peer_its_epochs() -> None:
    """A rank done with its epochs may close while its peer is still at epoch 0's end: the
    peer settled the steps from what both had and replays the next epoch on its own."""
    ranks = two_ranks()
    with sent(ranks, Reading) as reading:
        ranks[1].close()
        ranks[0].set_epoch(1)
        again = [x for batch in ranks[0] for x in batch.column("x").to_pylist()]
    assert reading.raised == [None, None]
    assert sorted(again) == sorted(reading.got[0]), "rank 0's epoch 1 is its epoch 0's rows again"


def giver_closes_first(monkeypatch: pytest.MonkeyPatch, before_take: Callable[[], None]) -> Reading:
    """Rank 0 holds more than its steps need and gives rank 1 the rest (stripes of 1,024 rows:
    rank 0 receives 5,120 of 10,000 rows, rank 1 4,880; each yields 5,000). Rank 1 calls
    ``before_take`` before it reads what it is given; rank 0 closes as soon as it has yielded
    its epoch and rank 1 is there. What the ranks read; ``closing``: rank 0's close's seconds."""
    ranks = two_ranks()
    there = threading.Event()
    take = Ranked._take

    def late_take(self: Ranked, giver: dict[str, Any], moved_in: MovedIn) -> None:
        there.set()
        before_take()
        take(self, giver, moved_in)

    monkeypatch.setattr(Ranked, "_take", late_take)  # only rank 1 takes

    class Closing(Reading):
        closing = 0.0

        def _run(self, rx: cfs.Receiver, r: int) -> None:
            super()._run(rx, r)
            if r == 0 and there.wait(30):
                start = time.monotonic()
                rx.close()
                self.closing = time.monotonic() - start

    with sent(ranks, Closing) as reading:
        pass
    assert there.is_set(), "rank 1 took no rows"
    return reading


def test_a_giver_that_closes_before_its_taker_read_the_moves_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 closes while rank 1 has not yet begun to read what rank 0 gives it: the close
    waits until rank 1 has those rows, so rank 1 yields its whole epoch."""
    reading = giver_closes_first(monkeypatch, lambda: time.sleep(1.5))
    assert reading.raised == [None, None]
    assert len(reading.got[0]) == len(reading.got[1]) == 5_000
    assert sorted(reading.got[0] + reading.got[1]) == list(range(10_000))


def test_a_giver_does_not_wait_for_a_taker_that_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 fails before it reads what rank 0 gives it: it raises why, and rank 0's close
    returns once it hears so, not after its timeout (60 s)."""

    def broken() -> None:
        time.sleep(0.5)
        raise OSError("no space left on device")

    reading = giver_closes_first(monkeypatch, broken)
    assert reading.raised[0] is None
    assert len(reading.got[0]) == 5_000
    assert isinstance(reading.raised[1], cf.ProducerFailedError)
    assert "could not settle the epoch's steps: OSError: no space left on device" in str(reading.raised[1])
    assert reading.closing < 30


def test_a_rank_done_with_its_epochs_waits_in_close_until_the_other_read_its_deal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``shuffle="global"``: in epoch 1 every rank reads its rows from every rank's deal. Rank
    1 opens epoch 1's pass late; rank 0 is done with epoch 1 meanwhile (rank 1's deal for it
    does not wait for rank 1's consumer) and closes: the close waits until rank 1 is done with
    rank 0's deal, and rank 1 yields its whole epoch."""
    ranks = [
        cfs.Receiver(
            rank=r, world_size=2, batch_size=500, secret=SECRET, timeout=60, shuffle="global", seed=1
        )
        for r in range(2)
    ]
    open_pass = Ranked._open_pass
    late = threading.Event()

    def late_open(self: Ranked, epoch: int, n: int) -> Gathering:
        if self._opts.rank == 1 and epoch == 1:
            late.set()
            time.sleep(1.5)  # rank 0 closes meanwhile
        return open_pass(self, epoch, n)

    monkeypatch.setattr(Ranked, "_open_pass", late_open)

    class Epochs(Reading):
        """Epochs 0 and 1 of every rank; rank 0 closes once done with both."""

        def __init__(self, ranks: list[cfs.Receiver]) -> None:
            self.epochs: list[list[list[int]]] = [[], []]
            super().__init__(ranks)

        def _run(self, rx: cfs.Receiver, r: int) -> None:
            try:
                for epoch in range(2):
                    rx.set_epoch(epoch)
                    self.epochs[r].append([x for batch in rx for x in batch.column("x").to_pylist()])
                if r == 0:
                    rx.close()
            except BaseException as exc:
                self.raised[r] = exc

    with sent(ranks, Epochs) as reading:
        got = reading.epochs
    assert late.is_set()
    assert reading.raised == [None, None]
    for epoch in range(2):
        assert len(got[0][epoch]) == len(got[1][epoch]) == 5_000
        assert sorted(got[0][epoch] + got[1][epoch]) == list(range(10_000)), f"epoch {epoch}"
