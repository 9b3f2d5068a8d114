"""One rank of a training job: the receiver mode behind ``Receiver(rank=r, world_size=W,
batch_size=B, ...)``.

**Epoch 0** streams while Spark computes. Every task splits its partition between the ranks
in stripes (:mod:`creditflow.spark._stripes`) and writes rank r's share to a subpartition that
rank r reads. The reader threads keep every row in the rank's runs (:mod:`._runs`, for the
later epochs) and hand it to the consumer through a queue of at most ``max_queued`` pieces, so
a slow trainer holds the tasks back (backpressure). The ranks tell each other how many rows
they hold (:mod:`._group`); a rank yields a batch only while every rank is sure to yield at
least as many (:func:`._steps.full_steps_at_least`). When every rank has its whole share, each
knows the epoch's total and so the steps (:func:`._steps.plan`); ranks short of rows take them
from ranks with rows to spare, over creditflow channels, on a background thread (the giver's
trainer may be waiting in a collective for the taker), and every rank yields the same number
of batches.

**Later epochs** replay the runs without Spark: the runs in a seeded order, a few at a time,
their chunks interleaved by the same generator, through a shuffle window. The order depends
only on (seed, epoch) and the rows, so a restarted job continues an epoch at the next batch.

**Tasks** are fenced: rank 0 grants each partition to one attempt at a time; an attempt that
breaks (its executor died) is replaced by the next one, which skips the rows each rank already
has, so every row reaches its rank once.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

import creditflow as cf
from creditflow.metrics import SpillMetrics
from creditflow.samples import TaskSample
from creditflow.spark import _messages
from creditflow.spark._group import Group
from creditflow.spark._intake import REGISTER_TIMEOUT
from creditflow.spark._rankstate import RankState, RowSet
from creditflow.spark._runs import Runs
from creditflow.spark._steps import Steps, full_steps_at_least, moves, plan
from creditflow.spark._stripes import ID_BITS, share_ids, share_size
from creditflow.spark._window import Window
from creditflow.spark.monitor import MonitorHandle, Reporter

#: Runs an epoch after the first reads at once (their chunks interleaved).
OPEN_RUNS = 4
#: The column that carries a moved row's id between ranks.
ID_COLUMN = "__creditflow_row_id"
#: Seconds over which the data stall is measured.
STALL_WINDOW = 1.0


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


@dataclass
class _Share:
    """This rank's share of one Spark partition: the attempt being read and what it sent."""

    grant: int = 0
    rows: int = 0
    ended: bool = False
    gate: cf.InputGate | None = None
    settled: dict[int, tuple[threading.Event, list[str | None]]] = field(default_factory=dict)


@dataclass
class _Final:
    """The epochs' steps, once every rank's total is known, and the rows moved."""

    steps: Steps
    moved_out: RowSet


class Ranked:
    """Rank ``opts.rank`` of ``opts.world``."""

    confirm = True

    def __init__(self, env: cf.NetworkEnvironment, *, host: str, secret: str, opts: Options) -> None:
        self._env = env
        self._opts = opts
        self._cond = threading.Condition()
        self._group = Group(opts.rank, opts.world, secret, self._cond)
        self._group.on_failure = self._fail
        self._group.may_leave = lambda: self._final is not None
        self._closed = threading.Event()
        self._job: str | None = None
        self._runs: Runs | None = None
        self._shares: dict[int, _Share] = {}
        #: Rank 0: each partition's grant and whether its stream is live, ended or broken.
        self._grants: dict[int, tuple[int, str]] = {}
        self._held = 0
        self._ended = False
        self._failure: str | None = None
        self._job_failed = threading.Event()
        self._finalizing = False
        self._final: _Final | None = None
        self._moves_part: cf.ResultPartition | None = None
        #: Rows other ranks gave this one (a step's worth at most: kept in memory).
        self._moved_in: list[tuple[pa.RecordBatch, np.ndarray]] = []
        self._threads: list[threading.Thread] = []
        self._reporter: Reporter | None = None
        # The consumer's side.
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
        self._window = Window(opts.window, self._rng(0))
        self._replay: Iterator[pa.RecordBatch] | None = None
        self._resumed0: RowSet | None = None
        self._last_told = 0
        self._stall = 0.0
        self._stall_marks: deque[tuple[float, float]] = deque([(time.monotonic(), 0.0)])
        self._rows_yielded = 0
        self._inbox = _messages.Inbox(
            self._on_message,
            host=host,
            key=secret,
            name=f"creditflow-rank{opts.rank}",
            on_end=self._group.lost,
        )

    # ------------------------------------------------------------------------------ control

    @property
    def address(self) -> str:
        """This rank's address (what :func:`send` is given)."""
        return self._inbox.address

    def _rng(self, epoch: int) -> np.random.Generator | None:
        return np.random.default_rng([self._opts.seed, epoch]) if self._opts.shuffle else None

    def _on_message(self, msg: _messages.Message) -> _messages.Message | None:
        kind = str(msg.get("kind"))
        if kind.startswith("rank_"):
            self._group.handle(msg)
            if kind == "rank_end":
                self._maybe_finalize()
            return None
        if kind == "job_failed":
            with self._cond:
                if self._job is None:
                    self._job = msg.get("job")
                mine = msg.get("job") == self._job
            if mine:
                self._job_failed.set()
                self._fail(f"the Spark job failed: {msg.get('error')}")
            return None
        if kind == "job":
            return self._register_job(msg)
        if msg.get("job") != self._job:
            return {"accept": False, "reason": "unknown job"}
        if kind == "partition":
            return self._register_partition(msg)
        if kind == "job_done":
            return self._job_done({int(p): int(n) for p, n in dict(msg["rows"]).items()})
        if kind == "delivered":
            return self._delivered(int(msg["partition"]), int(msg.get("grant", 0)))
        return {"accept": False, "reason": f"unknown message {kind!r}"}

    def _register_job(self, msg: _messages.Message) -> _messages.Message:
        o = self._opts
        world, rank = int(msg.get("world_size", 1)), int(msg.get("rank", 0))
        mine = {"rank": o.rank, "world_size": o.world}
        if world != o.world or rank != o.rank:
            return {
                "accept": False,
                "reason": f"this receiver is rank {o.rank} of {o.world}, but send() gave its address as "
                f"rank {rank} of {world} (give send() every rank's address, in rank order)",
                "rank": o.rank,
                "world_size": o.world,
            }
        n = int(msg["num_partitions"])
        with self._cond:
            if self._job is not None and self._job != msg["job"]:
                return {"accept": False, "reason": "this receiver already serves another job"}
            if self._job == msg["job"]:
                return {"accept": True, **mine}
            if o.state is not None and o.state.partitions not in (None, n):
                return {
                    "accept": False,
                    "reason": f"the state was taken from a DataFrame of {o.state.partitions} partitions, "
                    f"this one has {n}: resuming needs the same DataFrame",
                }
            try:
                self._runs = Runs(self._env, n, o.rank, o.world)
            except cf.CreditflowError as exc:
                return {"accept": False, "reason": f"rank {o.rank} cannot keep {n} partitions: {exc}"}
            self._job = msg["job"]
            self._shares = {p: _Share() for p in range(n)}
            self._group.join(list(msg.get("ranks", [self.address])))
            if msg.get("monitor") is not None:
                self._reporter = Reporter(MonitorHandle(**msg["monitor"]), self._sample)
        if n == 0:
            self._stream_ended()
        return {"accept": True, **mine}

    def _register_partition(self, msg: _messages.Message) -> _messages.Message:
        p, grant = int(msg["partition"]), msg.get("grant")
        if grant is None and self._opts.rank == 0:
            self._await_live_attempt(p)
        with self._cond:
            share = self._shares.get(p)
            if share is None or self._failure is not None or self._ended:
                why = "the stream ended" if self._ended else f"no partition {p} in this job"
                return {"accept": False, "reason": self._failure or why}
            if grant is None:  # rank 0 decides which attempt sends partition p
                if self._opts.rank != 0:
                    return {"accept": False, "reason": "only rank 0 grants partitions"}
                current, status = self._grants.get(p, (0, "none"))
                if status == "live":  # the task asks again (another attempt's stream is live)
                    return {"accept": False, "retry": True, "reason": f"partition {p} is being received"}
                # None yet, or the last attempt's stream broke or ended: an attempt after one
                # whose stream ended means that one's task failed after its input ended early
                # (or is a speculative copy); it continues after what the ranks have.
                grant = current + 1
                self._grants[p] = (grant, "live")
            grant = int(grant)
            if grant <= share.grant:
                return {"accept": False, "reason": f"partition {p}: a newer attempt is being received"}
            old, share.grant, share.gate, share.ended = share.gate, grant, None, False
            settled = share.settled.setdefault(grant, (threading.Event(), [None]))
            spec = cf.ChannelSpec(msg["address"], msg["partition_id"], self._opts.rank)
            thread = threading.Thread(
                target=self._read, args=(p, grant, spec, settled), name=f"creditflow-rank-{p}", daemon=True
            )
            self._threads.append(thread)
            skip = share.rows
        if old is not None:
            old.close()  # the attempt it replaces broke; stop reading what it left in flight
        thread.start()
        return {"accept": True, "grant": grant, "skip": skip, "confirm": True}

    def _await_live_attempt(self, p: int) -> None:
        """(Rank 0.) Waits, up to :data:`REGISTER_TIMEOUT`, until the stream of the attempt
        that is sending partition ``p`` settles, so that a second attempt is answered then."""
        with self._cond:
            share = self._shares.get(p)
            current, status = self._grants.get(p, (0, "none"))
            entry = share.settled.get(current) if share is not None and status == "live" else None
        if entry is not None:
            entry[0].wait(REGISTER_TIMEOUT)

    def _job_done(self, rows: dict[int, int]) -> _messages.Message:
        """The driver's word that the job succeeded, with each partition's rows: this rank
        checks it has its share of every one, and its stream ends."""
        o = self._opts
        with self._cond:
            if self._failure is not None:
                return {"ok": False, "reason": self._failure}
            if self._ended:
                return {"ok": True}
            short = [
                f"partition {p}: {self._shares[p].rows} of {share_size(n, p, o.rank, o.world)} rows"
                for p, n in sorted(rows.items())
                if p in self._shares and self._shares[p].rows != share_size(n, p, o.rank, o.world)
            ]
            missing = sorted(set(self._shares) - set(rows))
            gates = [s.gate for s in self._shares.values() if s.gate is not None and not s.ended]
            for share in self._shares.values():
                share.ended = True
        if short or missing:
            why = f"rank {o.rank} does not have its share: {'; '.join(short)}"
            if missing:
                why += f" (no word of partitions {missing})"
            self._fail(why)
            return {"ok": False, "reason": why}
        for gate in gates:  # an attempt Spark gave up on (a speculative copy): nothing more
            gate.close()
        self._stream_ended()
        return {"ok": True}

    def _delivered(self, p: int, grant: int) -> _messages.Message:
        with self._cond:
            share = self._shares.get(p)
            entry = share.settled.get(grant) if share is not None else None
        if entry is None:
            return {"ok": False, "reason": f"partition {p} was not received from this attempt"}
        if not entry[0].wait(REGISTER_TIMEOUT):
            return {"ok": False, "reason": f"partition {p} is still being received"}
        return {"ok": entry[1][0] is None, "reason": entry[1][0]}

    # ------------------------------------------------------------------------------ readers

    def _read(
        self, p: int, grant: int, spec: cf.ChannelSpec, settled: tuple[threading.Event, list[str | None]]
    ) -> None:
        failure: str | None = "the receiver closed"
        try:
            gate = self._env.create_input_gate([spec])
            with self._cond:
                if self._shares[p].grant != grant:
                    gate.close()
                    failure = "superseded"
                    return
                self._shares[p].gate = gate
            with gate:
                while not self._closed.is_set():
                    try:
                        batch = gate.next(timeout=1.0)
                    except cf.TimeoutError:
                        continue
                    if batch is None:
                        failure = None
                        self._share_ended(p, grant)
                        return
                    if not self._keep(p, grant, batch):
                        failure = "superseded"
                        return
        except (cf.ConnectionLostError, cf.ProducerFailedError, cf.ClosedError) as exc:
            # The attempt broke (its executor died, its task failed): the next attempt
            # continues where it stopped, unless the job failed (the driver says so).
            failure = f"{type(exc).__name__}: {exc}"
            with self._cond:
                current = self._shares[p].grant == grant
            if current and self._opts.rank == 0:
                with self._cond:
                    g, _ = self._grants.get(p, (grant, "live"))
                    if g == grant:
                        self._grants[p] = (grant, "broken")
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
            self._fail(failure)
        finally:
            settled[1][0] = failure
            settled[0].set()

    def _keep(self, p: int, grant: int, batch: pa.RecordBatch) -> bool:
        """Stores ``batch`` (the next rows of this rank's share of ``p``) and hands it to
        epoch 0's consumer; False when a newer attempt took over."""
        runs = self._runs
        assert runs is not None
        with self._cond:
            share = self._shares[p]
            if share.grant != grant:
                return False
            ids = share_ids(p, self._opts.rank, self._opts.world, share.rows, batch.num_rows)
            runs.put(p, batch)  # raises SpillError at max_spill: the stream fails
            share.rows += batch.num_rows
            self._held += batch.num_rows
            held = self._held
            self._group.count(held)
            if self._streaming and self._final is None:
                if len(self._skip0):
                    keep = ~self._skip0.contains(ids)
                    if not keep.all():
                        batch, ids = batch.filter(pa.array(keep)), ids[keep]
                if batch.num_rows:
                    self._queue.append((batch, ids))
                    self._cond.notify_all()
                # Backpressure: wait while the consumer is behind (not past the end of the
                # stream: the consumer takes everything then).
                while (
                    len(self._queue) > self._opts.max_queued
                    and self._streaming
                    and self._failure is None
                    and not self._closed.is_set()
                    and self._shares[p].grant == grant
                ):
                    self._cond.wait(0.1)
        if held - self._last_told >= self._opts.batch_size:
            self._last_told = held
            self._group.tell({"kind": "rank_rows", "rows": held})
        return True

    def _share_ended(self, p: int, grant: int) -> None:
        """An attempt's stream ended: the share is whole unless the task's input ended early;
        the driver's word that the job succeeded says (:meth:`_job_done`)."""
        with self._cond:
            share = self._shares[p]
            if share.grant != grant:
                return
            share.ended = True
            if self._opts.rank == 0:
                self._grants[p] = (grant, "ended")

    def _stream_ended(self) -> None:
        """This rank has its whole share: it tells the others what it holds."""
        runs = self._runs
        assert runs is not None
        runs.end()
        moves_id = f"cf-rank-moves/{self._job}/{self._opts.rank}/{uuid.uuid4().hex[:6]}"
        self._moves_part = self._env.create_partition(moves_id, self._opts.world)
        end = {
            "kind": "rank_end",
            "rank": self._opts.rank,
            "rows": self._held,
            "address": self._env.address,
            "moves": moves_id,
        }
        with self._cond:
            self._ended = True
            self._group.handle(end)
        self._group.tell(end)
        self._maybe_finalize()

    # ------------------------------------------------------------------------- the epochs' end

    def _maybe_finalize(self) -> None:
        with self._cond:
            if self._finalizing or not self._ended or len(self._group.ends) < self._opts.world:
                return
            self._finalizing = True
        thread = threading.Thread(target=self._finalize, name="creditflow-rank-final", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _finalize(self) -> None:
        """Every rank's total is known: the steps, and the rows ranks give each other."""
        o = self._opts
        try:
            ends = self._group.ends
            holdings = [int(ends[q]["rows"]) for q in range(o.world)]
            steps = plan(sum(holdings), o.world, o.batch_size, o.drop_last)
            needs = [steps.need(q) for q in range(o.world)]
            assert self._moves_part is not None
            out: list[np.ndarray] = []
            with cf.RecordWriter(self._moves_part, cf.ForwardPartitioner()) as w:
                for giver, taker, rows in moves(holdings, needs):
                    if giver == o.rank:
                        for batch, ids in self._give(rows):
                            w.write(_with_ids(batch, ids), subpartition=taker)
                            out.append(ids)
            moved_out = RowSet()
            for ids in out:
                moved_out.add(ids)
            for giver, taker, _rows in moves(holdings, needs):
                if taker == o.rank:
                    self._take(ends[giver])
            with self._cond:
                self._final = _Final(steps, moved_out)
                self._cond.notify_all()
        except Exception as exc:
            self._fail(f"rank {o.rank} could not settle the epoch's steps: {type(exc).__name__}: {exc}")

    def _give(self, rows: int) -> list[tuple[pa.RecordBatch, np.ndarray]]:
        """``rows`` rows this rank has not yielded, for another rank."""
        runs = self._runs
        assert runs is not None
        with self._cond:
            live = self._streaming and self._given is None
            if live:  # epoch 0's consumer is reading: give rows it has not had yet
                while self._queue:
                    self._window.add(*self._queue.popleft())
                self._cond.notify_all()
                batch, ids = self._window.take_last(rows)
                return [(batch, ids)] if batch is not None else []
        if self._given is not None:
            wanted = self._given
        else:  # the last rows of the runs, from the highest partition down
            wanted = RowSet()
            left = rows
            for p in reversed(range(runs.partitions)):
                k = min(left, runs.rows[p])
                if k:
                    wanted.add(runs.ids(p, runs.rows[p] - k, k))
                left -= k
                if left == 0:
                    break
        return list(self._select(wanted))

    def _select(self, wanted: RowSet) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
        """The stored rows whose ids are in ``wanted``."""
        runs = self._runs
        assert runs is not None
        starts, _ends = wanted.ranges()
        for p in np.unique(starts >> ID_BITS):
            for batch, ids in runs.read(int(p), self._opts.timeout).chunks():
                keep = wanted.contains(ids)
                if keep.any():
                    yield batch.filter(pa.array(keep)), ids[keep]

    def _take(self, giver: dict[str, Any]) -> None:
        """Reads the rows ``giver`` moves to this rank: kept in the moved-in run, and handed
        to epoch 0's consumer."""
        runs = self._runs
        assert runs is not None
        spec = cf.ChannelSpec(str(giver["address"]), str(giver["moves"]), self._opts.rank)
        with self._env.create_input_gate([spec]) as gate:
            while (batch := gate.next(timeout=self._opts.timeout)) is not None:
                ids = batch.column(ID_COLUMN).to_numpy()
                rows = batch.drop_columns([ID_COLUMN])
                with self._cond:
                    self._moved_in.append((rows, ids))
                    if self._streaming:
                        self._queue.append((rows, ids))
                        self._cond.notify_all()

    def _fail(self, message: str) -> None:
        with self._cond:
            if self._failure is not None or self._closed.is_set():
                return
            self._failure = message
            self._cond.notify_all()
        if self._runs is not None:
            self._runs.fail(message)
        self._group.close(failure=message)

    # ------------------------------------------------------------------------------ consumer

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
        self._streaming = False
        self._queue.clear()
        self._window.clear()
        self._replay = None
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
        self._stall += time.monotonic() - start

    def next(self, timeout: float | None) -> pa.RecordBatch | None:
        """The epoch's next batch; None at its end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        batch: pa.RecordBatch | None = None
        with self._cond:
            if self._streaming:
                batch = self._next_streamed(deadline)
            else:
                while self._final is None:
                    self._wait(deadline)
                if self._replay is None:
                    self._replay = self._replayed(self._epoch, self._yielded, self._resumed0)
                    self._resumed0 = None
            replay = self._replay
        if replay is not None:
            batch = next(replay, None)
        if batch is not None:
            with self._cond:
                self._yielded += 1
                self._rows_yielded += batch.num_rows
        return batch

    def _next_streamed(self, deadline: float | None) -> pa.RecordBatch | None:
        """(Under the lock.) Epoch 0's next batch, from what the tasks send."""
        o = self._opts
        while True:
            while self._queue:
                batch, ids = self._queue.popleft()
                self._window.add(batch, ids)
                self._cond.notify_all()
            final = self._final
            if final is not None:
                sizes = final.steps.sizes(o.rank)
                if self._yielded >= len(sizes):
                    self._window.clear()
                    return None
                need = sizes[self._yielded]
                if len(self._window) >= need:
                    return self._emit0(need)
            else:
                bound = full_steps_at_least(sum(self._group.rows), o.world, o.batch_size, o.drop_last)
                ready = self._window.full() or self._ended
                if self._yielded < bound and ready and len(self._window) >= o.batch_size:
                    return self._emit0(o.batch_size)
            self._wait(deadline)

    def _emit0(self, rows: int) -> pa.RecordBatch:
        batch, ids = self._window.take(rows)
        self._consumed.add(ids)
        return batch

    def _replayed(self, epoch: int, first: int, without: RowSet | None) -> Iterator[pa.RecordBatch]:
        """Epoch ``epoch`` from the runs, from its batch ``first`` on: without the rows in
        ``without`` (those yielded before, in a streamed epoch 0), else by skipping the
        batches before (the order repeats)."""
        runs, final = self._runs, self._final
        assert runs is not None
        assert final is not None
        rng = self._rng(epoch)
        order = [r for r in range(runs.partitions) if runs.rows[r]]
        if self._moved_in:
            order.append(runs.partitions)  # the rows moved in, after the runs
        if rng is not None:
            order = [order[i] for i in rng.permutation(len(order))]
        skip = final.moved_out if without is None else final.moved_out.union(without)
        window = Window(self._opts.window, rng)
        sizes = final.steps.sizes(self._opts.rank)
        skip_batches = first
        if without is not None:
            sizes, skip_batches = sizes[first:], 0
        pending = deque(order)
        open_: list[Iterator[tuple[pa.RecordBatch, np.ndarray]]] = []
        step = 0
        while step < len(sizes):
            while len(open_) < OPEN_RUNS and pending:
                open_.append(self._chunks(pending.popleft(), skip))
            while open_ and not (window.full() and len(window) >= sizes[step]):
                i = int(rng.integers(len(open_))) if rng is not None else 0
                chunk = next(open_[i], None)
                if chunk is None:
                    open_.pop(i)
                    if pending:
                        open_.append(self._chunks(pending.popleft(), skip))
                else:
                    window.add(*chunk)
            if len(window) < sizes[step]:
                have, want, rank = len(window), sizes[step], self._opts.rank
                raise cf.ProducerFailedError(f"rank {rank}: epoch {epoch} has {have} rows of {want}")
            batch, _ids = window.take(sizes[step])
            step += 1
            if step > skip_batches:
                yield batch

    def _chunks(self, run: int, skip: RowSet) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
        """Run ``run``'s chunks; the run after the last partition's: the rows moved in."""
        runs = self._runs
        assert runs is not None
        if run < runs.partitions:
            return runs.read(run, self._opts.timeout).chunks(skip)
        return ((b.filter(pa.array(~skip.contains(i))), i[~skip.contains(i)]) for b, i in self._moved_in)

    # --------------------------------------------------------------------------- state, metrics

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: enough to continue at the next batch after a restart."""
        o = self._opts
        with self._cond:
            final = self._final
            state = RankState(
                rank=o.rank,
                world=o.world,
                batch_size=o.batch_size,
                seed=o.seed,
                shuffle=o.shuffle,
                drop_last=o.drop_last,
                partitions=len(self._shares) if self._job is not None else None,
                epoch=self._epoch,
                batches=self._yielded,
                consumed=self._consumed if self._streaming else RowSet(),
                moved_out=final.moved_out if final is not None else None,
            )
        return state.to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Moves this (live) rank to ``state``'s epoch and batch, from its runs (a streamed
        epoch 0: once the whole stream arrived, without the rows yielded before)."""
        s = RankState.from_dict(state)
        o = self._opts
        s.check(o.rank, o.world, o.batch_size, o.seed, o.shuffle, o.drop_last)
        with self._cond:
            if s.epoch == 0 and len(s.consumed) and self._final is None:
                raise ValueError(
                    "a live rank goes back into the streamed epoch 0 only once the whole stream arrived"
                )
            self._start(s.epoch, s.batches)
            self._resumed0 = s.consumed if s.epoch == 0 and len(s.consumed) else None

    def rank_metrics(self) -> dict[str, Any]:
        """The rank's progress and its data stall (see :class:`creditflow.metrics.RankMetrics`)."""
        now = time.monotonic()
        with self._cond:
            self._stall_marks.append((now, self._stall))
            while len(self._stall_marks) > 2 and now - self._stall_marks[1][0] >= STALL_WINDOW:
                self._stall_marks.popleft()
            t0, s0 = self._stall_marks[0]
            per_second = (self._stall - s0) / (now - t0) if now > t0 else 0.0
            return {
                "rank": self._opts.rank,
                "world_size": self._opts.world,
                "epoch": self._epoch,
                "batches": self._yielded,
                "rows_yielded": self._rows_yielded,
                "rows_held": self._held,
                "queued": len(self._queue),
                "window_rows": len(self._window),
                "stream_ended": self._ended,
                "steps": self._final.steps.count if self._final is not None else None,
                "stall_ms_per_second": min(1000.0, 1000.0 * per_second),
                "stall_total": self._stall,
            }

    def _sample(self) -> TaskSample:
        """What this rank reports to the job's monitor: rows it received and yielded, and
        its data stall as idle time."""
        m = self.rank_metrics()
        return TaskSample(
            job=self._job or "",
            kind="rank",
            task=self._opts.rank,
            rows_received=m["rows_held"],
            rows_written=m["rows_yielded"],
            idle_ms_per_second=m["stall_ms_per_second"],
            idle_total=m["stall_total"],
            receiver=self.address,
        )

    def spill_metrics(self) -> SpillMetrics | None:
        """The runs' store (None before the job registered)."""
        return self._runs.metrics() if self._runs is not None else None

    def close(self) -> None:
        """Says goodbye to the other ranks, stops receiving and drops the runs."""
        if self._closed.is_set():
            return
        self._group.close()
        if self._reporter is not None:
            self._reporter.stop()
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
            gates = [s.gate for s in self._shares.values() if s.gate is not None]
        self._inbox.close()
        for gate in gates:
            gate.close()
        if self._runs is not None:
            self._runs.release()
        if self._moves_part is not None:
            self._moves_part.release()
        for t in list(self._threads):
            t.join(timeout=10)


def _with_ids(batch: pa.RecordBatch, ids: np.ndarray) -> pa.RecordBatch:
    return batch.append_column(ID_COLUMN, pa.array(ids, pa.int64()))
