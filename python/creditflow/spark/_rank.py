"""One rank of a training job: the receiver mode behind ``Receiver(rank=r, world_size=W,
batch_size=B, ...)``.

**Epoch 0** streams while Spark computes. Every task splits its partition between the ranks
in stripes (:mod:`creditflow.spark._stripes`) and writes rank r's share to a subpartition that
rank r reads. The reader threads keep every row in the rank's runs (:mod:`._runs`, for the
later epochs) and hand it to the consumer through a queue of at most ``max_queued`` pieces, so
a slow trainer holds the tasks back (backpressure). The ranks tell each other how many rows
they hold (:mod:`._group`); a rank yields a batch only while every rank is sure to yield at
least as many (:func:`._steps.full_steps_at_least`); rows it cannot yield yet stay in its runs
(*parked*) rather than in memory. When the driver says the job succeeded, each rank knows its
share is whole, then every rank knows the epoch's total and so the steps
(:func:`._steps.plan`); ranks short of rows take them from ranks with rows to spare, over
creditflow channels, on a background thread (the giver's trainer may be waiting in a
collective for the taker), and every rank yields the same number of batches.

**Later epochs** replay the rank's home (:mod:`._home`) without Spark: in a seeded order,
through a shuffle window (:mod:`._consumer`); with ``shuffle="global"`` the ranks deal their
homes out to each other every epoch (:mod:`._reshuffle`). The order depends only on (seed,
epoch) and the rows, so a restarted job continues an epoch at the next batch.

**Tasks** are fenced: rank 0 grants each partition to one attempt at a time; an attempt that
breaks (its executor died) is replaced by the next one, which skips the rows each rank already
has, so every row reaches its rank once.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

import creditflow as cf
from creditflow.metrics import SpillMetrics, level_of
from creditflow.samples import TaskSample
from creditflow.spark import _messages
from creditflow.spark._budget import Budget
from creditflow.spark._consumer import Consumer, Options
from creditflow.spark._group import Group
from creditflow.spark._home import OPEN_RUNS, Home
from creditflow.spark._intake import HOLD, NOT_THE_SAME, REGISTER_TIMEOUT
from creditflow.spark._rankstate import RowSet
from creditflow.spark._reshuffle import Gathering, deal, deal_bytes, group_rows, pass_id, traffic
from creditflow.spark._resume import Trail, mismatch
from creditflow.spark._runs import MovedIn, Runs, with_ids
from creditflow.spark._steps import moves, plan
from creditflow.spark._stripes import STRIPE_ROWS, join_bytes, share_ids, share_size, stripe_cuts
from creditflow.spark._threads import Threads
from creditflow.spark._window import warm_up
from creditflow.spark.monitor import MonitorHandle, Reporter

__all__ = ["Options", "Ranked"]


@dataclass
class _Share:
    """This rank's share of one Spark partition: the attempt being read and what it sent."""

    grant: int = 0
    rows: int = 0
    ended: bool = False
    gate: cf.InputGate | None = None
    settled: dict[int, tuple[threading.Event, list[str | None]]] = field(default_factory=dict)
    #: What the share kept at the resume check's points, which a later attempt that continues
    #: it must match (:mod:`creditflow.spark._resume`).
    trail: Trail = field(default_factory=Trail)


@dataclass
class _Deal:
    """A pass this rank deals its home into, and the ranks done reading it."""

    part: cf.ResultPartition
    done: set[int] = field(default_factory=set)


def _settle(settled: tuple[threading.Event, list[str | None]], failure: str | None) -> None:
    """Tells whoever waits on an attempt's stream that it settled: how it broke, or None
    when it ended."""
    settled[1][0] = failure
    settled[0].set()


class Ranked(Consumer):
    """Rank ``opts.rank`` of ``opts.world``: the tasks' and the other ranks' side; the
    consumer's is :class:`creditflow.spark._consumer.Consumer`."""

    confirm = True

    def __init__(self, env: cf.NetworkEnvironment, *, host: str, secret: str, opts: Options) -> None:
        cond = threading.Condition()
        group = Group(opts.rank, opts.world, secret, cond)
        # Rows held outside the environment's pools at most: a window and a batch twice (a
        # window is mixed into a copy), and either the queue of epoch 0 and a run being read
        # (rows to give, or the rest of epoch 0), or the open runs of this rank's deal (each
        # reader holds less than two chunks) and a chunk or two being read.
        # Besides: the batches of joined stripes its pieces are slices of, in the queue and
        # the window (its join bytes each at most); and shuffled across the ranks, the pieces
        # its deal joins for the other ranks, the others' batches its gathering cuts, and
        # those cut but still referenced by the window's pieces (its deal bytes each).
        chunks = max(opts.max_queued + 2, 2 * OPEN_RUNS + 3)
        held = 2 * (opts.window + opts.batch_size) + chunks * STRIPE_ROWS
        m = env.metrics()
        memory = int(m["segments_total"]) * int(m["segment_size"])
        #: What this rank's tasks join its stripes into, and its deal its pieces for a rank.
        self._join = join_bytes(memory)
        self._deal_bytes = deal_bytes(memory) if opts.across else 0
        extra = 3 * (self._join + self._deal_bytes)
        super().__init__(opts, cond, group, Budget(env, held, f"rank {opts.rank}", extra))
        self._env = env
        group.on_failure = self._fail
        self._job: str | None = None
        self._shares: dict[int, _Share] = {}
        #: Rank 0: each partition's grant and whether its stream is live, ended or broken.
        self._grants: dict[int, tuple[int, str]] = {}
        #: Rank 0: the newest Spark attempt granted each partition.
        self._newest: dict[int, int] = {}
        self._held = 0
        self._job_failed = threading.Event()
        self._finalizing = False
        #: The ranks this rank gives rows to at epoch 0's end (known once finalizing).
        self._takers: set[int] | None = None
        self._moves_part: cf.ResultPartition | None = None
        self._deals: dict[tuple[int, int], _Deal] = {}
        #: The passes this rank told the others it is done with.
        self._passes_done: set[tuple[int, int]] = set()
        self._threads = Threads()
        self._reporter: Reporter | None = None
        self._last_told = 0
        self._inbox = _messages.Inbox(
            self._on_message,
            host=host,
            key=secret,
            name=f"creditflow-rank{opts.rank}",
            on_end=group.lost,
        )
        # The Arrow kernels' one-time set-up, while the job starts (not before its first batch).
        threading.Thread(target=warm_up, name="creditflow-rank-warm-up", daemon=True).start()

    # ------------------------------------------------------------------------------ control

    @property
    def address(self) -> str:
        """This rank's address (what :func:`send` is given)."""
        return self._inbox.address

    def _on_message(self, msg: _messages.Message) -> _messages.Message | None:
        kind = str(msg.get("kind"))
        if kind in ("rank_pull", "rank_pass_done"):
            epoch, n, peer = int(msg["epoch"]), int(msg["pass"]), int(msg["rank"])
            (self._pull if kind == "rank_pull" else self._pass_done)(peer, epoch, n)
            return None
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
        if kind == "resume_check":
            p, grant = int(msg["partition"]), int(msg.get("grant", 0))
            return self._resume_check(p, grant, list(msg["digests"]))
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
                self._moved_in = MovedIn(self._env)
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
        p, grant, attempt = int(msg["partition"]), msg.get("grant"), int(msg.get("attempt", 0))
        if grant is None and self._opts.rank == 0:
            self._await_live_attempt(p, attempt)
        with self._cond:
            share = self._shares.get(p)
            if share is None or self._failure is not None or self._ended:
                why = "the stream ended" if self._ended else f"no partition {p} in this job"
                return {"accept": False, "reason": self._failure or why}
            if grant is None:  # rank 0 decides which attempt sends partition p
                if self._opts.rank != 0:
                    return {"accept": False, "reason": "only rank 0 grants partitions"}
                newest = self._newest.get(p, -1)
                if attempt < newest:
                    # Spark started the newer attempt after this one failed (its worker's input
                    # ended early, it asks late) or as a speculative copy: the newer one keeps
                    # the partition; a grant to this one would take it over mid-stream.
                    return {
                        "accept": False,
                        "reason": f"partition {p}: attempt {attempt} asked after attempt {newest}, "
                        "which has the partition",
                    }
                current, status = self._grants.get(p, (0, "none"))
                if status == "live":  # the task asks again (another attempt's stream is live)
                    return {"accept": False, "retry": True, "reason": f"partition {p} is being received"}
                # None yet, or the last attempt's stream broke or ended: an attempt after one
                # whose stream ended means that one's task failed after its input ended early
                # (or is a speculative copy); it continues after what the ranks have.
                grant = current + 1
                self._grants[p] = (grant, "live")
                self._newest[p] = attempt
            grant = int(grant)
            if grant <= share.grant:
                return {"accept": False, "reason": f"partition {p}: a newer attempt is being received"}
            old, share.grant, share.gate, share.ended = share.gate, grant, None, False
            settled = share.settled.setdefault(grant, (threading.Event(), [None]))
            spec = cf.ChannelSpec(msg["address"], msg["partition_id"], self._opts.rank)
            skip = share.rows
        if old is not None:
            old.close()  # the attempt it replaces broke; stop reading what it left in flight
        if not self._threads.start(self._read, f"creditflow-rank-{p}", p, grant, spec, settled):
            _settle(settled, "the receiver closed")
            return {"accept": False, "reason": "the receiver closed"}
        return {"accept": True, "grant": grant, "skip": skip, "confirm": True, "join": self._join}

    def _await_live_attempt(self, p: int, attempt: int) -> None:
        """(Rank 0.) Waits, up to :data:`HOLD`, until the stream of the attempt
        that is sending partition ``p`` settles, so that a second attempt is answered then (an
        older attempt than that one is answered at once: it is turned away)."""
        with self._cond:
            share = self._shares.get(p)
            current, status = self._grants.get(p, (0, "none"))
            live = status == "live" and attempt >= self._newest.get(p, -1)
            entry = share.settled.get(current) if share is not None and live else None
        if entry is not None:
            entry[0].wait(HOLD)

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

    def _resume_check(self, p: int, grant: int, digests: list[list[object]]) -> _messages.Message:
        """A task that continues this rank's share of ``p`` after the rows it has sends its
        digests of the share's rows at the check's points, the last one being the last row
        this rank has (:mod:`creditflow.spark._resume`): the same as those kept, or the
        DataFrame computed other rows or another order, and the stream fails rather than give
        this rank rows twice or lose some. The readers of earlier attempts are waited for, up
        to :data:`HOLD` (they stop soon after a newer one is granted)."""
        with self._cond:
            share = self._shares.get(p)
            earlier = [e for g, e in share.settled.items() if g < grant] if share is not None else []
        deadline = time.monotonic() + HOLD
        for event, _failure in earlier:
            event.wait(max(0.0, deadline - time.monotonic()))
        last = max((int(str(row)) for row, _digest in digests), default=-1)
        with self._cond:
            if share is None or share.grant != grant or self._failure is not None:
                stale = f"partition {p}: grant {grant} is not the one read"
                return {"ok": False, "reason": self._failure or stale}
            ended = share.trail.last
            if ended is None or ended[0] != last:  # the reader before is still stuck: the task fails
                stuck = f"partition {p}: the attempt before this one is still being read"
                return {"ok": False, "reason": stuck}
            row = mismatch(share.trail.expected(), digests)
        if row is None:
            return {"ok": True}
        why = (
            f"partition {p}: a retried attempt computed other rows than the attempt it continues "
            f"(row {row} of rank {self._opts.rank}'s share differs from the one it has): {NOT_THE_SAME}"
        )
        self._fail(why)
        return {"ok": False, "reason": why}

    # ------------------------------------------------------------------------------ readers

    def _read(
        self, p: int, grant: int, spec: cf.ChannelSpec, settled: tuple[threading.Event, list[str | None]]
    ) -> None:
        failure: str | None = "the receiver closed"
        last: tuple[pa.RecordBatch, int] | None = None  # the last batch kept, the share's rows then
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
                    rows = self._keep(p, grant, batch)
                    if rows is None:
                        failure = "superseded"
                        return
                    last = (batch, rows)
        except (
            cf.ConnectionLostError,
            cf.ProducerFailedError,
            cf.ClosedError,
            cf.PartitionNotFoundError,
        ) as exc:
            # The attempt broke (its executor died, its task failed, or it released its
            # partition before this rank's request reached it): the next attempt continues
            # where it stopped, unless the job failed (the driver says so).
            failure = f"{type(exc).__name__}: {exc}"
            with self._cond:
                current = self._shares[p].grant == grant
                if current and self._opts.rank == 0 and self._grants.get(p, (grant, ""))[0] == grant:
                    self._grants[p] = (grant, "broken")
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
            self._fail(failure)
        finally:
            if last is not None:
                with self._cond:
                    self._shares[p].trail.end(*last)
            _settle(settled, failure)

    def _keep(self, p: int, grant: int, batch: pa.RecordBatch) -> int | None:
        """Stores ``batch`` (the next rows of this rank's share of ``p``) and hands it to
        epoch 0's consumer; returns the share's rows kept, or None when a newer attempt took
        over."""
        runs = self._runs
        assert runs is not None
        self._budget.see(batch)  # raises when the rank's window cannot fit in its memory
        with self._cond:
            share = self._shares[p]
            if share.grant != grant:
                return None
            start, n = share.rows, int(batch.num_rows)
            ids = share_ids(p, self._opts.rank, self._opts.world, start, n)
            runs.put(p, batch)  # raises SpillError at max_spill: the stream fails
            share.rows += n
            share.trail.see(batch, start)
            self._held += n
            held = self._held
            self._group.count(held)
            # The consumer's queue holds stripe pieces (a task joins a rank's stripes of an
            # input batch): slices, so the batch stays as long as one of them.
            current = lambda: self._shares[p].grant == grant  # noqa: E731
            for offset, length in stripe_cuts(start, n):
                piece = batch if length == n else batch.slice(offset, length)
                self._offer(piece, ids[offset : offset + length], current)
        if held - self._last_told >= self._opts.batch_size:
            self._last_told = held
            self._group.tell({"kind": "rank_rows", "rows": held})
        return start + n

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
            self._cond.notify_all()
        self._group.tell(end)
        self._maybe_finalize()

    # ------------------------------------------------------------------------- the epochs' end

    def _maybe_finalize(self) -> None:
        with self._cond:
            if self._finalizing or not self._ended or len(self._group.ends) < self._opts.world:
                return
            self._finalizing = True
        self._threads.start(self._finalize, "creditflow-rank-final")

    def _finalize(self) -> None:
        """Every rank's total is known: the steps, and the rows ranks give each other."""
        o = self._opts
        runs, moved_in = self._runs, self._moved_in
        assert runs is not None
        assert moved_in is not None
        try:
            ends = self._group.ends
            holdings = [int(ends[q]["rows"]) for q in range(o.world)]
            steps = plan(sum(holdings), o.world, o.batch_size, o.drop_last)
            needs = [steps.need(q) for q in range(o.world)]
            homes = list(holdings)
            assert self._moves_part is not None
            mine = []
            for giver, taker, rows in moves(holdings, needs):
                homes[giver] -= rows
                homes[taker] += rows
                if giver == o.rank:
                    mine.append((taker, rows))
            with self._cond:
                self._takers = {taker for taker, _ in mine}
            moved_out = self._to_give(sum(rows for _, rows in mine))
            with cf.RecordWriter(self._moves_part, cf.ForwardPartitioner()) as w:
                # The takers get consecutive runs of the given ids, in the order of the
                # moves: the same split after a restart, so every rank's home is the same.
                left = moved_out
                for taker, rows in reversed(mine):
                    part, left = left.last(rows), left.without(left.last(rows))
                    for batch, ids in runs.select(part, o.timeout):
                        w.write(with_ids(batch, ids), subpartition=taker)
            for giver, taker, _rows in moves(holdings, needs):
                if taker == o.rank:
                    self._take(ends[giver], moved_in)
                    self._group.tell({"kind": "rank_taken"}, to=giver)
            moved_in.end()
            self._settle(steps, homes, Home(runs, moved_in, moved_out, o.timeout))
        except Exception as exc:
            self._fail(f"rank {o.rank} could not settle the epoch's steps: {type(exc).__name__}: {exc}")

    def _to_give(self, rows: int) -> RowSet:
        """The ids of ``rows`` rows this rank has not yielded, for another rank."""
        runs = self._runs
        assert runs is not None
        with self._cond:
            if self._given is not None:  # a restarted job gives what it gave before
                if len(self._given) != rows:
                    raise ValueError(f"the state gave {len(self._given)} rows away, the job now {rows}")
                return self._given
            if self._streaming:  # epoch 0's consumer is reading: rows it has not had yet
                return self._unyielded(rows)
        wanted = RowSet()  # the consumer is past epoch 0: the last rows of the runs
        left = rows
        for p in reversed(range(runs.partitions)):
            k = min(left, runs.rows[p])
            if k:
                wanted.add(runs.ids(p, runs.rows[p] - k, k))
            left -= k
            if left == 0:
                break
        return wanted

    def _take(self, giver: dict[str, Any], moved_in: MovedIn) -> None:
        """Reads the rows ``giver`` moves to this rank into the moved-in store (by id)."""
        spec = cf.ChannelSpec(str(giver["address"]), str(giver["moves"]), self._opts.rank)
        with self._env.create_input_gate([spec]) as gate:
            while (batch := gate.next(timeout=self._opts.timeout)) is not None:
                moved_in.put(batch)

    # ------------------------------------------------------------------ dealing (global shuffle)

    def _pull(self, peer: int, epoch: int, n: int) -> None:
        """Rank ``peer`` reads pass ``(epoch, n)``: this rank deals its home into it (once)."""
        with self._cond:
            if (epoch, n) in self._deals or self._closed.is_set() or self._job is None:
                return
            part = self._env.create_partition(
                pass_id(self._job, self._opts.rank, epoch, n), self._opts.world, kind="hybrid"
            )
            self._deals[(epoch, n)] = _Deal(part)
        self._threads.start(self._deal, f"creditflow-rank-deal-{epoch}", epoch, n, part)

    def _deal(self, epoch: int, n: int, part: cf.ResultPartition) -> None:
        o = self._opts
        with self._cond:
            while self._final is None and self._failure is None and not self._closed.is_set():
                self._cond.wait(0.5)
            final = self._final
        if final is None:
            return
        try:
            quotas = traffic(final.homes, [final.steps.need(q) for q in range(o.world)])[o.rank]
            chunks = final.home.chunks(self._rng(epoch, 1, o.rank))
            rng = self._rng(epoch, 2, o.rank)
            assert rng is not None, "the global shuffle is seeded"
            with cf.RecordWriter(part, cf.ForwardPartitioner()) as w:
                # Rows with their ids: a row's bytes and the id's.
                group = group_rows(o.world, self._budget.row_bytes + 8, self._deal_bytes)
                deal(chunks, quotas, rng, lambda d, b: w.write(b, subpartition=d), group)
        except Exception as exc:
            with self._cond:
                dropped = self._deals.get((epoch, n)) is None or self._closed.is_set()
            if not dropped:  # not released because every rank was done with the pass
                self._fail(f"rank {o.rank} could not deal epoch {epoch}: {type(exc).__name__}: {exc}")

    def _pass_done(self, peer: int, epoch: int, n: int) -> None:
        """Rank ``peer`` is done with pass ``(epoch, n)``: once every rank is, it goes."""
        with self._cond:
            entry = self._deals.get((epoch, n))
            if entry is None:
                return
            entry.done.add(peer)
            self._cond.notify_all()  # a close may wait for it
            if len(entry.done) < self._opts.world:
                return
            del self._deals[(epoch, n)]
        entry.part.release()

    def _open_pass(self, epoch: int, n: int) -> Gathering:
        """Asks every rank for pass ``(epoch, n)`` and drains their deals for this rank."""
        job = self._job
        assert job is not None
        self._group.tell({"kind": "rank_pull", "epoch": epoch, "pass": n})
        self._pull(self._opts.rank, epoch, n)
        ends = self._group.ends
        sources = [
            cf.ChannelSpec(str(ends[s]["address"]), pass_id(job, s, epoch, n), self._opts.rank)
            for s in range(self._opts.world)
        ]
        # Done with the others' deals once they are drained (not once the consumer is through
        # the pass): a rank done with its epochs may then close.
        return Gathering(self._env, sources, self._opts.rank, functools.partial(self._close_pass, epoch, n))

    def _close_pass(self, epoch: int, n: int) -> None:
        """This rank is done with pass ``(epoch, n)`` (drained, or left early): tells every
        rank, once."""
        with self._cond:
            if (epoch, n) in self._passes_done:
                return
            self._passes_done.add((epoch, n))
        self._group.tell({"kind": "rank_pass_done", "epoch": epoch, "pass": n})
        self._pass_done(self._opts.rank, epoch, n)

    # ------------------------------------------------------------------------------- failure

    def _fail(self, message: str) -> None:
        with self._cond:
            if self._failure is not None or self._closed.is_set():
                return
            self._failure = message
            self._cond.notify_all()
        for store in (self._runs, self._moved_in):
            if store is not None:
                store.fail(message)
        self._group.close(failure=message)

    # --------------------------------------------------------------------------- state, metrics

    def _partitions(self) -> int | None:
        return len(self._shares) if self._job is not None else None

    def memory_bytes(self) -> tuple[int, int]:
        """What the rank holds now (the environment's allocated segments and the rows held
        outside its pools) and its ``memory``."""
        m = self._env.metrics()
        pool = int(m["segments_allocated"]) * int(m["segment_size"])
        return pool + self._budget.held_bytes(self.held_rows()), int(m["segments_total"]) * int(
            m["segment_size"]
        )

    def _sample(self) -> TaskSample:
        """What this rank reports to the job's monitor: rows it received and yielded, its
        data stall as idle time, and how much it held the tasks back as backpressure."""
        m = self.rank_metrics()
        pressed = m["backpressure_ms_per_second"]
        return TaskSample(
            job=self._job or "",
            kind="rank",
            task=self._opts.rank,
            rows_received=m["rows_held"],
            rows_written=m["rows_yielded"],
            idle_ms_per_second=m["stall_ms_per_second"],
            idle_total=m["stall_total"],
            backpressured_ms_per_second=pressed,
            backpressured_total=m["backpressure_total"],
            level=level_of(pressed / 1000.0),
            receiver=self.address,
        )

    def spill_metrics(self) -> SpillMetrics | None:
        """The runs' store (None before the job registered)."""
        return self._runs.metrics() if self._runs is not None else None

    def _await_readers(self) -> None:
        """Waits (at most ``timeout``) until the other ranks have what they read from this
        rank's environment: the rows it gives them at epoch 0's end, and its deal of every pass
        of the global shuffle they opened. A rank whose own epochs are done may close while
        they still read, and those rows would go with its environment. Not after a failure:
        the others fail too; nor for ranks that left."""
        others = set(range(self._opts.world)) - {self._opts.rank}

        def settled() -> bool:
            if self._failure is not None:
                return True
            gone = self._group.gone
            if self._finalizing and (self._takers is None or not self._takers <= self._group.taken | gone):
                return False
            return all(others <= d.done | gone for d in self._deals.values())

        with self._cond:
            self._cond.wait_for(settled, self._opts.timeout)

    def close(self) -> None:
        """Waits until the other ranks have what they read from this one, says goodbye to
        them, stops receiving and drops the runs."""
        if self._closed.is_set():
            return
        self._await_readers()
        self._group.close()
        if self._reporter is not None:
            self._reporter.stop()
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
            gates = [s.gate for s in self._shares.values() if s.gate is not None]
            deals, self._deals = list(self._deals.values()), {}
        self._inbox.close()
        for gate in gates:
            gate.close()
        for d in deals:
            d.part.release()
        for store in (self._runs, self._moved_in, self._moves_part):
            if store is not None:
                store.release()
        self._budget.release()
        self._threads.join(timeout=10)
