"""The consumer's side of a rank (:class:`creditflow.spark._rank.Ranked`): the batches of the
current epoch, each of the size the epoch's steps say, its position and its data stall.

* **Epoch 0, streamed.** The reader threads offer every received piece (:meth:`Consumer._offer`)
  through a queue of at most ``max_queued`` pieces; the consumer moves them into its shuffle
  window (at most ``shuffle_window + batch_size`` rows) and yields a batch only while every
  rank is sure to yield more (the bound). While the bound holds the consumer back and the
  queue is full, pieces are *parked*: they stay in the runs only, so a rank holding rows to
  spare does not keep them in memory, and the tasks are not held back by a bound that only
  the other ranks' rows can raise. Once the steps are settled the rest of the epoch comes from
  the window, the queue, the parked rows and the rows moved in.
* **Later epochs** (and epoch 0 again) from the rank's home (:mod:`creditflow.spark._home`)
  through a window, in an order seeded by ``(seed, epoch)``; with ``shuffle="global"`` from
  every rank's deal (:mod:`creditflow.spark._reshuffle`).
* **Position.** ``state_dict`` counts what the trainer has taken: a loader that reads ahead
  (:meth:`Consumer.next` with ``ahead``) says when the trainer takes a batch
  (:meth:`Consumer.consumed`) and gives back what it read ahead and dropped
  (:meth:`Consumer.unread`), which the next read returns first.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

import creditflow as cf
from creditflow.metrics import BUSY_THRESHOLD
from creditflow.spark._budget import Budget
from creditflow.spark._group import Group
from creditflow.spark._home import Home
from creditflow.spark._rankstate import RankState, RowSet
from creditflow.spark._reshuffle import Gathering, traffic
from creditflow.spark._runs import Chunks, MovedIn, Runs
from creditflow.spark._steps import Steps, full_steps_at_least
from creditflow.spark._window import Window

#: Seconds over which the data stall and the backpressure are measured.
STALL_WINDOW = 1.0


class Seconds:
    """Time spent in a state (the trainer waiting for data, the tasks held back), in total
    and per second over the last :data:`STALL_WINDOW` seconds. Not thread-safe: used under
    the rank's lock. ``begin``/``end`` nest (several readers held back at once count once)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._depth = 0
        self._since = 0.0
        self._marks: deque[tuple[float, float]] = deque([(time.monotonic(), 0.0)])

    def add(self, seconds: float) -> None:
        """Adds ``seconds`` spent in the state."""
        self.total += seconds

    def begin(self) -> None:
        """One more waiter; the state starts with the first."""
        if self._depth == 0:
            self._since = time.monotonic()
        self._depth += 1

    def end(self) -> None:
        """One waiter fewer; the state ends with the last."""
        self._depth -= 1
        if self._depth == 0:
            self.total += time.monotonic() - self._since

    def now(self) -> float:
        """The total, with a state still going counted up to now."""
        return self.total + (time.monotonic() - self._since if self._depth else 0.0)

    def per_second(self) -> float:
        """The share of the last second spent in the state (0 to 1)."""
        now, total = time.monotonic(), self.now()
        self._marks.append((now, total))
        while len(self._marks) > 2 and now - self._marks[1][0] >= STALL_WINDOW:
            self._marks.popleft()
        t0, s0 = self._marks[0]
        return min(1.0, (total - s0) / (now - t0)) if now > t0 else 0.0


#: A batch and its rows' ids (epoch 0's, for the position), or None.
_Out = tuple[pa.RecordBatch, np.ndarray | None]


@dataclass(frozen=True)
class Options:
    """What ``Receiver(rank=...)`` was given."""

    rank: int
    world: int
    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool
    window: int
    max_queued: int
    timeout: float | None
    state: RankState | None
    #: ``shuffle="global"``: the ranks deal their rows out to each other every epoch.
    across: bool = False

    @property
    def mode(self) -> bool | str:
        """``shuffle`` as given: True, False or ``"global"``."""
        return "global" if self.across else self.shuffle


@dataclass(frozen=True)
class Final:
    """The epochs' steps, once every rank's total is known, every rank's home size, and this
    rank's home."""

    steps: Steps
    homes: list[int]
    home: Home


class Consumer:
    """The consumer's side of rank ``opts.rank``."""

    def __init__(self, opts: Options, cond: threading.Condition, group: Group, budget: Budget) -> None:
        self._opts = opts
        self._cond = cond
        self._group = group
        self._budget = budget
        self._closed = threading.Event()
        self._failure: str | None = None
        self._runs: Runs | None = None
        self._moved_in: MovedIn | None = None
        self._final: Final | None = None
        #: Whether this rank has its whole share.
        self._ended = False
        state = opts.state
        self._epoch = state.epoch if state is not None else 0
        self._yielded = state.batches if state is not None else 0
        #: Rows yielded in epoch 0 (the streamed one), and the rows a restored state gave away.
        self._consumed = state.consumed if state is not None else RowSet()
        self._given = state.moved_out if state is not None else None
        #: Whether epoch 0 is served from what the tasks send (not yet from the runs).
        self._streaming = self._epoch == 0
        #: Rows not to hand to epoch 0's consumer: yielded before a restart, or given away.
        self._skip0 = (
            self._consumed.union(self._given) if self._given is not None else RowSet(*self._consumed.ranges())
        )
        self._queue: deque[tuple[pa.RecordBatch, np.ndarray]] = deque()
        self._queued_rows = 0
        self._window = Window(opts.window, self._rng(0))
        #: The window in use (epoch 0's, or a replay's), for the metrics.
        self._live_window = self._window
        #: Rows of epoch 0 left in the runs while the bound held the consumer back.
        self._parked = RowSet()
        self._held_back = False
        self._replay: Generator[_Out, None, None] | None = None
        self._resumed0: RowSet | None = None
        #: How often each epoch was started here: pass ``(epoch, n)`` of the global shuffle.
        self._starts = {self._epoch: 1}
        self._pass = (self._epoch, 0)
        #: Batches read ahead (a prefetching loader) and not yet taken, and those given back.
        self._lent: deque[_Out] = deque()
        self._returned: deque[_Out] = deque()
        #: The trainer waiting in next() for data; the tasks held back by a full queue.
        self._stall = Seconds()
        self._pressed = Seconds()
        self._rows_yielded = 0

    # Provided by the rank.
    def _open_pass(self, epoch: int, n: int) -> Gathering:
        raise NotImplementedError

    def _close_pass(self, epoch: int, n: int) -> None:
        raise NotImplementedError

    def _partitions(self) -> int | None:
        raise NotImplementedError

    def memory_bytes(self) -> tuple[int, int]:
        """What the rank holds now and its ``memory``."""
        raise NotImplementedError

    def _rng(self, epoch: int, *key: int) -> np.random.Generator | None:
        if not self._opts.shuffle:
            return None
        return np.random.default_rng([self._opts.seed, epoch, *key])

    # ------------------------------------------------------------------- the readers' side

    def _offer(self, batch: pa.RecordBatch, ids: np.ndarray, current: Callable[[], bool]) -> None:
        """(Under the lock; a reader thread.) Rows just kept in the runs, for epoch 0's
        consumer: queued (waiting while it is behind: backpressure), or parked while the
        bound holds it back and the queue is full."""
        o = self._opts
        if not (self._streaming and self._final is None):
            return
        if len(self._skip0):
            keep = ~self._skip0.contains(ids)
            if not keep.all():
                batch, ids = batch.filter(pa.array(keep)), ids[keep]
        if not batch.num_rows:
            return
        if self._held_back and len(self._queue) >= o.max_queued:
            self._parked.add(ids)
            return
        self._queue.append((batch, ids))
        self._queued_rows += batch.num_rows
        self._cond.notify_all()
        if len(self._queue) <= o.max_queued:
            return
        self._pressed.begin()  # the tasks wait for this rank's trainer
        try:
            while (
                len(self._queue) > o.max_queued
                and self._streaming
                and not self._held_back
                and self._failure is None
                and not self._closed.is_set()
                and current()
            ):
                self._cond.wait(0.1)
        finally:
            self._pressed.end()

    def _pop(self) -> tuple[pa.RecordBatch, np.ndarray]:
        batch, ids = self._queue.popleft()
        self._queued_rows -= batch.num_rows
        self._cond.notify_all()
        return batch, ids

    def _unyielded(self, rows: int) -> RowSet:
        """(Under the lock.) Takes ``rows`` rows epoch 0's consumer has not had, for another
        rank: parked ones first, then the window's last."""
        while self._queue:
            self._window.add(*self._pop())
        out = self._parked.last(rows)
        self._parked = self._parked.without(out)
        rest = rows - len(out)
        if rest:
            _batch, ids = self._window.take_last(rest)
            out.add(ids)
        return out

    def _settle(self, steps: Steps, homes: list[int], home: Home) -> None:
        with self._cond:
            self._final = Final(steps, homes, home)
            self._cond.notify_all()

    def held_rows(self) -> int:
        """Rows held outside the environment's pools: queued and in the window."""
        return self._queued_rows + len(self._live_window)

    # ------------------------------------------------------------------------------ epochs

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` at its first batch (the current epoch: nothing changes)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        with self._cond:
            if epoch == self._epoch:
                return
            self._start(epoch, 0)

    def _start(self, epoch: int, batches: int) -> None:
        """(Under the lock.) Epoch ``epoch`` from batch ``batches`` on, from the runs."""
        self._epoch, self._yielded = epoch, batches
        n = self._starts.get(epoch, 0)
        self._starts[epoch] = n + 1
        self._pass = (epoch, n)
        self._streaming = False
        while self._queue:
            self._pop()
        self._window.clear()
        self._lent.clear()
        self._returned.clear()
        old, self._replay = self._replay, None
        if old is not None:
            # A pass of the global shuffle tells its ranks it is done; one running in
            # another thread (ValueError) ends with it.
            with contextlib.suppress(ValueError):
                old.close()
        self._cond.notify_all()

    def _wait(self, deadline: float | None) -> None:
        """(Under the lock.) Waits for news, counting the time as data stall."""
        if self._failure is not None:
            raise cf.ProducerFailedError(self._failure)
        if self._closed.is_set():
            raise cf.ClosedError("the receiver closed")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise cf.TimeoutError(f"rank {self._opts.rank}: no batch within {self._opts.timeout} s")
        start = time.monotonic()
        self._cond.wait(0.5 if left is None else min(left, 0.5))
        self._stall.add(time.monotonic() - start)

    def next(self, timeout: float | None, ahead: bool = False) -> pa.RecordBatch | None:
        """The epoch's next batch; None at its end. ``ahead``: read ahead for a loader; the
        position counts it once :meth:`consumed` says the trainer took it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out: _Out | None = None
        with self._cond:
            if self._returned:
                out = self._returned.popleft()
            elif self._replay is None and self._streaming and self._final is None:
                out = self._next_streamed(deadline)
            if out is None and self._replay is None:
                while self._final is None:
                    self._wait(deadline)
                if self._streaming:
                    self._replay = self._finish0()
                else:
                    self._replay = self._replayed(self._epoch, self._yielded, self._resumed0)
                    self._resumed0 = None
            replay = self._replay
            # Counted and lent in one step: state_dict() never sees a batch yielded but not
            # yet lent (it would count it as taken by the trainer).
            if out is not None and ahead:
                self._lent.append(out)
        if out is None and replay is not None:
            out = next(replay, None)
            if out is not None:
                with self._cond:
                    self._yielded += 1
                    self._rows_yielded += out[0].num_rows
                    if ahead:
                        self._lent.append(out)
        if out is None:
            return None
        return out[0]

    def consumed(self) -> None:
        """The trainer took the oldest batch read ahead."""
        with self._cond:
            if self._lent:
                self._lent.popleft()

    def unread(self) -> None:
        """Gives back the batches read ahead and not taken: the next reads return them."""
        with self._cond:
            self._returned.extendleft(reversed(self._lent))
            self._lent.clear()

    def _next_streamed(self, deadline: float | None) -> _Out | None:
        """(Under the lock.) Epoch 0's next batch from what the tasks send, or None once the
        steps are settled (the rest comes from :meth:`_finish0`)."""
        o = self._opts
        cap = o.window + o.batch_size
        try:
            while True:
                while self._queue and len(self._window) < cap:
                    self._window.add(*self._pop())
                if self._final is not None:
                    return None
                bound = full_steps_at_least(sum(self._group.rows), o.world, o.batch_size, o.drop_last)
                ready = self._window.full() or self._ended
                if self._yielded < bound and ready and len(self._window) >= o.batch_size:
                    out = self._emit0(o.batch_size)
                    self._yielded += 1
                    self._rows_yielded += o.batch_size
                    return out
                self._held_back = self._yielded >= bound
                if self._held_back:
                    self._cond.notify_all()  # readers waiting on a full queue park instead
                self._wait(deadline)
        finally:
            self._held_back = False

    def _emit0(self, rows: int) -> _Out:
        batch, ids = self._window.take(rows)
        self._consumed.add(ids)
        return batch, ids

    def _finish0(self) -> Generator[_Out, None, None]:
        """The rest of a streamed epoch 0 once the steps are settled: the window, the queue,
        then the parked rows and the rows moved in."""
        o, final, runs, moved_in = self._opts, self._final, self._runs, self._moved_in
        assert final is not None
        assert runs is not None
        assert moved_in is not None
        sizes = final.steps.sizes(o.rank)
        tail = _chain(runs.select(self._parked, o.timeout), moved_in.read(o.timeout).chunks())
        cap = o.window + o.batch_size
        window = self._window
        try:
            for step in range(self._yielded, len(sizes)):
                need = sizes[step]
                with self._cond:
                    while self._queue:
                        window.add(*self._pop())
                while len(window) < max(need, cap) and (chunk := next(tail, None)) is not None:
                    window.add(*chunk)
                if len(window) < need:
                    raise cf.ProducerFailedError(f"rank {o.rank}: epoch 0 has {len(window)} rows of {need}")
                with self._cond:
                    out = self._emit0(need)
                yield out
        finally:
            tail.close()
            window.clear()

    def _replayed(self, epoch: int, first: int, without: RowSet | None) -> Generator[_Out, None, None]:
        """Epoch ``epoch`` from the home (or the ranks' deals), from its batch ``first`` on:
        without the rows in ``without`` (those yielded before, in a streamed epoch 0), else by
        skipping the batches before (the order repeats)."""
        o, final = self._opts, self._final
        assert final is not None
        chunks: Chunks
        if o.across and epoch > 0 and without is None:
            rng = self._rng(epoch, 4, o.rank)
            chunks = self._gathered(final)
        else:
            rng = self._rng(epoch)
            chunks = final.home.chunks(rng, without)
        window = Window(o.window, rng)
        self._live_window = window
        sizes = final.steps.sizes(o.rank)
        skip_batches = first
        if without is not None:
            sizes, skip_batches = sizes[first:], 0
        try:
            for step, need in enumerate(sizes):
                while not (window.full() and len(window) >= need):
                    chunk = next(chunks, None)
                    if chunk is None:
                        break
                    window.add(*chunk)
                if len(window) < need:
                    raise cf.ProducerFailedError(
                        f"rank {o.rank}: epoch {epoch} has {len(window)} rows of {need}"
                    )
                batch, _ids = window.take(need)
                if step >= skip_batches:
                    yield batch, None
        finally:
            chunks.close()
            window.clear()

    def _gathered(self, final: Final) -> Chunks:
        """The rows every rank deals this one in the current pass."""
        o = self._opts
        epoch, n = self._pass
        needs = [final.steps.need(q) for q in range(o.world)]
        expect = [row[o.rank] for row in traffic(final.homes, needs)]
        gathering = self._open_pass(epoch, n)
        rng = self._rng(epoch, 3, o.rank)
        assert rng is not None, "the global shuffle is seeded"
        try:
            yield from gathering.chunks(expect, rng, o.timeout)
        finally:
            gathering.close()
            self._close_pass(epoch, n)

    # --------------------------------------------------------------------------- state, metrics

    def state_dict(self) -> dict[str, Any]:
        """Where this rank's trainer is: enough to continue at the next batch after a restart
        (batches read ahead and not taken do not count)."""
        o = self._opts
        with self._cond:
            ahead = [*self._lent, *self._returned]
            consumed = RowSet()
            if self._streaming:
                consumed = self._consumed
                unread = [ids for _, ids in ahead if ids is not None]
                if unread:
                    consumed = consumed.without(_rowset(np.concatenate(unread)))
            state = RankState(
                rank=o.rank,
                world=o.world,
                batch_size=o.batch_size,
                seed=o.seed,
                shuffle=o.mode,
                drop_last=o.drop_last,
                partitions=self._partitions(),
                epoch=self._epoch,
                batches=self._yielded - len(ahead),
                consumed=consumed,
                moved_out=self._final.home.moved_out if self._final is not None else None,
            )
        return state.to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Moves this (live) rank to ``state``'s epoch and batch, from its runs (a streamed
        epoch 0: once the whole stream arrived, without the rows yielded before)."""
        s = RankState.from_dict(state)
        o = self._opts
        s.check(o.rank, o.world, o.batch_size, o.seed, o.mode, o.drop_last)
        with self._cond:
            if s.epoch == 0 and len(s.consumed) and self._final is None:
                raise ValueError(
                    "a live rank goes back into the streamed epoch 0 only once the whole stream arrived"
                )
            self._start(s.epoch, s.batches)
            self._resumed0 = s.consumed if s.epoch == 0 and len(s.consumed) else None

    def rank_metrics(self) -> dict[str, Any]:
        """The rank's progress, memory, data stall and the backpressure it puts on the
        tasks (see :class:`creditflow.metrics.RankMetrics`)."""
        memory, limit = self.memory_bytes()
        with self._cond:
            stall, pressed = self._stall.per_second(), self._pressed.per_second()
            waiting_on = None
            if pressed > BUSY_THRESHOLD:
                waiting_on = "trainer"
            elif stall > BUSY_THRESHOLD:
                waiting_on = "spark" if self._streaming and self._final is None else "ranks"
            return {
                "rank": self._opts.rank,
                "world_size": self._opts.world,
                "epoch": self._epoch,
                "batches": self._yielded - len(self._lent) - len(self._returned),
                "rows_yielded": self._rows_yielded,
                "rows_held": self._held_rows_total(),
                "rows_parked": len(self._parked),
                "queued": len(self._queue),
                "window_rows": len(self._live_window),
                "stream_ended": self._ended,
                "steps": self._final.steps.count if self._final is not None else None,
                "stall_ms_per_second": 1000.0 * stall,
                "stall_total": self._stall.now(),
                "backpressure_ms_per_second": 1000.0 * pressed,
                "backpressure_total": self._pressed.now(),
                "bottleneck": waiting_on,
                "memory_bytes": memory,
                "memory_limit": limit,
                "reserved_bytes": self._budget.reserved,
            }

    def _held_rows_total(self) -> int:
        """Rows this rank received (epoch 0's stream)."""
        runs = self._runs
        return sum(runs.rows) if runs is not None else 0


def _rowset(ids: np.ndarray) -> RowSet:
    out = RowSet()
    out.add(ids)
    return out


def _chain(*parts: Chunks) -> Chunks:
    """The parts one after the other; closing it closes them all."""
    try:
        for part in parts:
            yield from part
    finally:
        for part in parts:
            part.close()


__all__ = ["Consumer", "Final", "Options"]
