"""``Receiver(continuous=True)``: one receiver serving a sequence of jobs (a streaming query's
micro-batches through ``foreachBatch`` and :func:`~creditflow.spark.send`, or the
``creditflow`` sink), its consumer reading them as one stream with a :class:`JobDone`
boundary after each job.

**Withheld until the commit.** A job's partitions are received into spools
(:mod:`creditflow.spark._staging`) and reach the consumer only once the job commits: ``send``
commits after its Spark job succeeded, the sink in its driver-side ``commit(messages,
batchId)``. A job that fails or aborts is dropped whole; a partition attempt that breaks is
dropped and another attempt of it starts afresh. So the consumer never sees part of a
micro-batch, nor a row of it twice, and needs no way to undo what it took.

**Exactly once per micro-batch.** A job that names its micro-batch (``batch_id``, and the
query as ``stream``) is dropped when that micro-batch of the stream committed here already
(Spark retried it after the function raised, or replays it after a restart from its
checkpoint); the last complete batch id of each stream is kept in a :class:`BatchLog`
(persisted when asked), advanced when the consumer has taken the micro-batch whole.

**Backpressure.** The readers of a job stop taking batches from the tasks while the consumer
has more than ``max_queued`` committed batches left to take: the tasks' writers block, the
micro-batch takes longer, and the query's input rate falls to what the consumer takes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import pyarrow as pa

import creditflow as cf
from creditflow.metrics import ContinuousMetrics, SpillMetrics
from creditflow.spark import _messages
from creditflow.spark._batchlog import BatchLog
from creditflow.spark._intake import POLL, REGISTER_TIMEOUT
from creditflow.spark._staging import Attempt, Committed, Item, Job, JobDone, new_attempt, release
from creditflow.spark._threads import Threads

_log = logging.getLogger(__name__)

#: How long a commit waits for its partitions' readers to settle.
COMMIT_WAIT = 2 * REGISTER_TIMEOUT


class Continuous:
    """The jobs a continuous receiver serves, and its consumer's side."""

    def __init__(
        self,
        env: cf.NetworkEnvironment,
        *,
        host: str,
        secret: str,
        max_queued: int,
        log: BatchLog,
        spill: bool,
    ) -> None:
        self._env = env
        self._max_queued = max_queued
        self._spill = spill
        self.log = log
        self._cond = threading.Condition()
        self.closed = threading.Event()
        self._jobs: dict[str, Job] = {}
        #: Micro-batches committed here (the consumer may not have taken them yet), per stream.
        self._committed_ids: dict[str, int] = {}
        self._ready: deque[Committed] = deque()
        self._current: Committed | None = None
        self._part = 0
        #: Committed batches the consumer has not taken: the readers pause beyond max_queued.
        self._backlog = 0
        self._readers = Threads()
        self._m: dict[str, int] = dict.fromkeys(
            (
                "jobs_committed",
                "jobs_delivered",
                "replays_dropped",
                "jobs_dropped",
                "rows_committed",
                "rows_delivered",
                "rows_dropped",
                "attempts_failed",
            ),
            0,
        )
        self._paused = 0.0
        self._inbox = _messages.Inbox(self._on_message, host=host, key=secret, name="creditflow-receiver")

    @property
    def address(self) -> str:
        """Where :func:`send` and the sink's tasks reach this receiver."""
        return self._inbox.address

    # ------------------------------------------------------------------------------ protocol

    def _on_message(self, msg: _messages.Message) -> _messages.Message | None:
        handlers = {
            "job": self._register,
            "seen": self._seen,
            "partition": self._partition,
            "delivered": self._delivered,
            "attempt_failed": self._attempt_failed,
            "commit": self._commit,
            "job_failed": self._abort,
        }
        handler = handlers.get(str(msg.get("kind")))
        if handler is None:
            return {"accept": False, "reason": f"unknown message {msg.get('kind')!r}"}
        return handler(msg)

    def _job(self, msg: _messages.Message) -> Job:
        """(Under the lock.) The message's job, created when new."""
        key = str(msg["job"])
        job = self._jobs.get(key)
        if job is None:
            batch = msg.get("batch_id")
            job = Job(key, msg.get("stream"), None if batch is None else int(batch))
            self._jobs[key] = job
        return job

    def _replay(self, job: Job) -> bool:
        """(Under the lock.) Whether the job's micro-batch committed here already."""
        if job.batch_id is None:
            return False
        stream = job.stream or ""
        return self.log.seen(stream, job.batch_id) or job.batch_id <= self._committed_ids.get(stream, -1)

    def _seen(self, msg: _messages.Message) -> _messages.Message:
        """``send`` asks, before it computes anything, whether it has a replay in hand."""
        with self._cond:
            job = Job("", msg.get("stream"), int(msg["batch_id"]))
            replay = self._replay(job)
            self._m["replays_dropped"] += replay
        return {"continuous": True, "replay": replay}

    def _register(self, msg: _messages.Message) -> _messages.Message:
        """``send`` registers its job: a replay is told to skip it."""
        if msg.get("world_size", 1) != 1:
            return {"accept": False, "reason": "this receiver is not a rank (no world_size given)"}
        with self._cond:
            job = self._job(msg)
            job.num_partitions = int(msg["num_partitions"])
            if self._replay(job):
                self._m["replays_dropped"] += 1
                del self._jobs[job.key]
                return {"accept": True, "replay": True, "continuous": True}
        return {"accept": True, "continuous": True}

    def _partition(self, msg: _messages.Message) -> _messages.Message:
        """A task's partition attempt: read it into a spool of its own, unless the job is a
        replay or dropped. Every attempt is read: which one counts is for the commit to say
        (the attempt Spark kept), as an attempt can end cleanly and still have failed in
        Spark (its input ended early when an upstream Python worker died)."""
        index, number = int(msg["partition"]), int(msg.get("attempt", 0))
        with self._cond:
            if self.closed.is_set():
                return {"accept": False, "reason": "the receiver closed"}
            job = self._job(msg)
            if self._replay(job):
                return {"accept": False, "replay": True, "reason": "this micro-batch was delivered already"}
            if job.dropped is not None:
                return {"accept": False, "reason": f"the job was dropped: {job.dropped}"}
            if job.attempt(index, number) is not None:
                return {
                    "accept": False,
                    "reason": f"attempt {number} of partition {index} registered already",
                }
            att = new_attempt(self._env, index, number)
            job.partitions.setdefault(index, []).append(att)
            spec = cf.ChannelSpec(msg["address"], msg["partition_id"], 0)
            if not self._readers.start(self._read, f"creditflow-receiver-{index}", job, att, spec):
                return {"accept": False, "reason": "the receiver closed"}
        return {"accept": True, "confirm": True}

    def _read(self, job: Job, att: Attempt, spec: cf.ChannelSpec) -> None:
        """A reader thread: the attempt's batches into its spool, pausing while the consumer is
        behind (backpressure); settles the attempt."""
        failure: str | None = "the receiver closed"
        try:
            with self._env.create_input_gate([spec]) as gate:
                while not self.closed.is_set() and job.dropped is None and not att.settled.is_set():
                    self._wait_for_consumer(job)
                    try:
                        batch = gate.next(timeout=POLL * 10)
                    except cf.TimeoutError:
                        continue
                    if batch is None:
                        att.spool.end()
                        failure = None
                        break
                    att.spool.put(batch)
                    att.rows += batch.num_rows
                    att.batches += 1
            if job.dropped is not None:
                failure = f"the job was dropped: {job.dropped}"
        except cf.SpillError as exc:
            failure = self._too_big(exc)
        except Exception as exc:
            failure = att.spool.failure or f"{type(exc).__name__}: {exc}"
        with self._cond:
            if failure is not None and not att.settled.is_set():
                self._m["attempts_failed"] += 1
            att.settle(failure)
            self._cond.notify_all()

    def _too_big(self, exc: cf.SpillError) -> str:
        if self._spill:
            return f"SpillError: {exc}"
        return (
            "the micro-batch does not fit in the receiver's memory, and it is withheld until it "
            "commits: give the Receiver more memory, spill=True (what does not fit goes to "
            "spill_dir), or make the micro-batches smaller (maxOffsetsPerTrigger, "
            f"maxFilesPerTrigger...) ({exc})"
        )

    def _wait_for_consumer(self, job: Job) -> None:
        """Holds a reader while the consumer has more than ``max_queued`` committed batches left."""
        if self._backlog <= self._max_queued:
            return
        start = time.monotonic()
        with self._cond:
            while self._backlog > self._max_queued and not self.closed.is_set() and job.dropped is None:
                self._cond.wait(POLL)
            self._paused += time.monotonic() - start

    def _attempt_failed(self, msg: _messages.Message) -> _messages.Message:
        """A task says its attempt failed: it is dropped now (its reader may not have reached
        the channel yet, and the task's worker lives on, so the channel does not break)."""
        index, number = int(msg["partition"]), int(msg.get("attempt", 0))
        with self._cond:
            job = self._jobs.get(str(msg["job"]))
            for att in job.partitions.get(index, []) if job is not None else []:
                if att.attempt == number and not att.settled.is_set():
                    self._m["attempts_failed"] += 1
                    att.settle(str(msg.get("error")))
            self._cond.notify_all()
        return {"ok": True}

    def _delivered(self, msg: _messages.Message) -> _messages.Message:
        """A task asks whether its attempt was kept whole."""
        index, number = int(msg["partition"]), msg.get("attempt")
        with self._cond:
            job = self._jobs.get(str(msg["job"]))
            atts = job.partitions.get(index, []) if job is not None else []
            att = next((a for a in reversed(atts) if number is None or a.attempt == number), None)
        if att is None:
            return {"ok": False, "reason": f"partition {index} was not received"}
        if not att.settled.wait(COMMIT_WAIT):
            return {"ok": False, "reason": f"partition {index} is still being received"}
        return {"ok": att.state == "done", "reason": att.reason}

    def _commit(self, msg: _messages.Message) -> _messages.Message:
        """The job succeeded (``send``'s Spark job, the sink's micro-batch): the attempt Spark
        kept of each partition goes to the consumer, unless the job is a replay; one that was
        not received whole fails the commit. Every other attempt is dropped."""
        wanted = {int(p): int(a) for p, a in dict(msg.get("attempts", {})).items()}
        deadline = time.monotonic() + COMMIT_WAIT
        with self._cond:
            job = self._job(msg)
            while not self._replay(job) and job.dropped is None and time.monotonic() < deadline:
                kept = [job.attempt(p, a) for p, a in wanted.items()]
                if not any(k is not None and k.state == "reading" for k in kept):
                    break
                self._cond.wait(POLL)
            self._jobs.pop(job.key, None)
            if self._replay(job):
                self._m["replays_dropped"] += 1
                held = job.drop("a replay of a delivered micro-batch")
                answer: _messages.Message = {"ok": True, "replay": True}
            elif job.dropped is not None:
                return {"ok": False, "reason": f"the job was dropped: {job.dropped}"}
            else:
                kept = [job.attempt(p, a) for p, a in wanted.items()]
                missing = sorted(
                    p for p, k in zip(wanted, kept, strict=True) if k is None or k.state != "done"
                )
                if job.num_partitions is not None:
                    missing += sorted(set(range(job.num_partitions)) - set(wanted))
                if missing:
                    why = f"partitions {missing} were not received whole"
                    held = job.drop(why)
                    self._count_dropped(held)
                    answer = {"ok": False, "reason": why}
                else:
                    whole = [k for k in kept if k is not None]
                    answer = self._deliver(job, whole)
                    held = [a for a in job.drop("committed") if a not in whole]
                    self._m["attempts_failed"] += sum(a.state == "done" for a in held)
        release(held)
        return answer

    def _deliver(self, job: Job, parts: list[Attempt]) -> _messages.Message:
        """(Under the lock.) Hands a committed job to the consumer."""
        done = Committed(job, sorted(parts, key=lambda a: a.index))
        self._ready.append(done)
        self._backlog += done.batches
        if job.batch_id is not None:
            stream = job.stream or ""
            self._committed_ids[stream] = max(job.batch_id, self._committed_ids.get(stream, -1))
            self._drop_older(stream, job.batch_id)
        self._m["jobs_committed"] += 1
        self._m["rows_committed"] += sum(a.rows for a in parts)
        self._cond.notify_all()
        return {"ok": True, "rows": sum(a.rows for a in parts)}

    def _drop_older(self, stream: str, batch_id: int) -> None:
        """(Under the lock.) Jobs of ``stream`` up to ``batch_id`` that never committed (a run
        of the query that died) are dropped: they cannot commit any more."""
        for key, job in list(self._jobs.items()):
            if job.batch_id is not None and (job.stream or "") == stream and job.batch_id <= batch_id:
                del self._jobs[key]
                held = job.drop("its micro-batch was delivered by another run of the query")
                self._count_dropped(held)
                threading.Thread(target=release, args=(held,), daemon=True).start()

    def _count_dropped(self, held: list[Attempt]) -> None:
        self._m["jobs_dropped"] += 1
        self._m["rows_dropped"] += sum(a.rows for a in held)

    def _abort(self, msg: _messages.Message) -> None:  # no answer: the sender does not wait
        """The job failed (``send``), or the sink aborts a micro-batch (every job of it)."""
        batch, stream = msg.get("batch_id"), msg.get("stream")
        with self._cond:
            keys = [
                k
                for k, j in self._jobs.items()
                if k == msg.get("job")
                or (batch is not None and j.batch_id == int(batch) and (j.stream or "") == (stream or ""))
            ]
            held: list[Attempt] = []
            for key in keys:
                dropped = self._jobs.pop(key).drop(f"the Spark job failed: {msg.get('error')}")
                self._count_dropped(dropped)
                held += dropped
            self._cond.notify_all()
        release(held)

    # ------------------------------------------------------------------------------ consumer

    def next_item(self, timeout: float | None) -> Item | None:
        """The stream's next batch or job boundary; None once the receiver closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                while self._current is None:
                    if self.closed.is_set():
                        return None
                    if self._ready:
                        self._current, self._part = self._ready.popleft(), 0
                        break
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise cf.TimeoutError(f"no batch within {timeout} s")
                    self._cond.wait(POLL if left is None else min(left, POLL))
                current = self._current
            if self._part == len(current.parts):
                return self._finish(current)
            att = current.parts[self._part]
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                batch = att.spool.next(left)
            except Exception:
                if self.closed.is_set():
                    return None  # close() released the spool under the read
                raise
            if batch is None:
                att.spool.release()
                self._part += 1
                continue
            with self._cond:
                self._backlog -= 1
                self._m["rows_delivered"] += batch.num_rows
                self._cond.notify_all()
            return batch

    def _finish(self, done: Committed) -> JobDone:
        """The consumer took job ``done`` whole: its micro-batch is complete."""
        job = done.job
        if job.batch_id is not None:
            self.log.complete(job.stream or "", job.batch_id)
        with self._cond:
            self._current = None
            self._m["jobs_delivered"] += 1
        return JobDone(job.key, job.stream, job.batch_id, sum(a.rows for a in done.parts), done.batches)

    def next(self, timeout: float | None) -> pa.RecordBatch | None:
        """The next batch (boundaries skipped); None once the receiver closed."""
        while True:
            item = self.next_item(timeout)
            if not isinstance(item, JobDone):
                return item

    # ------------------------------------------------------------------------------- seeing it

    def metrics(self) -> ContinuousMetrics:
        """What the receiver committed, delivered and dropped (see
        :class:`creditflow.metrics.ContinuousMetrics`)."""
        with self._cond:
            staged = sum(len(j.partitions) for j in self._jobs.values())
            m = self._m
            return {
                "jobs_committed": m["jobs_committed"],
                "rows_committed": m["rows_committed"],
                "jobs_delivered": m["jobs_delivered"],
                "rows_delivered": m["rows_delivered"],
                "replays_dropped": m["replays_dropped"],
                "jobs_dropped": m["jobs_dropped"],
                "rows_dropped": m["rows_dropped"],
                "attempts_failed": m["attempts_failed"],
                "jobs_staged": len(self._jobs),
                "partitions_staged": staged,
                "backlog_batches": self._backlog,
                "paused_seconds": self._paused,
                "last_batch_ids": self.log.snapshot(),
            }

    def spill_metrics(self) -> SpillMetrics | None:
        """The spools are many; see :meth:`metrics` and the environment's partitions."""
        return None

    def close(self) -> None:
        """Stops receiving; drops what was staged and not taken; the readers end."""
        self.closed.set()
        self._inbox.close()
        with self._cond:
            held = [a for j in self._jobs.values() for a in j.drop("the receiver closed")]
            held += [a for c in self._ready for a in c.parts]
            if self._current is not None:
                held += self._current.parts[self._part :]
            self._jobs.clear()
            self._ready.clear()
            self._cond.notify_all()
        release(held)
        self._readers.join(timeout=10.0)
