"""The receiving side of :func:`creditflow.spark.send` that every receiver mode shares: the
control inbox the driver and the tasks talk to, the job's registration, the tasks' partitions
and a reader thread per partition, which hands each batch to the mode's :class:`Sink`.

Every partition is delivered once: a second attempt of a partition already being read
(speculation, a retried task) is turned away, and a failed attempt fails the stream, so that
nothing is delivered partly twice. A clean end of an attempt's channel does not prove its
partition whole (a task whose upstream Python worker died sees its input end early, and ends
its channel cleanly before Spark fails it): the stream ends only on the driver's word that
the job succeeded, with each partition's rows from the attempt Spark kept, once every
partition ended with that many rows; fewer fails the stream. A rank receiver
(:mod:`creditflow.spark._rank`) handles its partitions itself (it resumes a failed attempt's
partition where it broke) and gives the inbox a handler of its own.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

import pyarrow as pa

import creditflow as cf
from creditflow.spark import _messages
from creditflow.spark._threads import Threads

#: How long a registration waits for the receiver's answer.
REGISTER_TIMEOUT = 30.0
#: How long a partition's broken connection waits for the driver's word that the job failed
#: (then the consumer raises the job's error rather than the connection's).
JOB_FAILED_GRACE = 5.0
#: How often blocked receiver threads look whether the receiver closed.
POLL = 0.1


class Sink(Protocol):
    """Where a receiver's reader threads put what the tasks send (one class per mode)."""

    #: Whether a task asks, once its channel ended, whether its partition was kept whole
    #: (a spilling receiver's channels end before its consumer has the data).
    confirm: bool

    def deliver(self, batch: pa.RecordBatch) -> bool:
        """Takes ``batch``, waiting while the consumer is behind; False once closed."""

    def end(self) -> None:
        """Every partition arrived."""

    def fail(self, error: BaseException) -> None:
        """The job or a partition failed: the consumer raises after the batches before."""

    def failure(self) -> str | None:
        """The sink's own first failure (a full spill directory...), or None."""


class _Settled:
    """Whether a partition's reader thread kept all of it, once the thread is done."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.failure: str | None = None


class Intake:
    """The inbox and reader threads of a receiver whose batches go to ``sink``."""

    def __init__(self, env: cf.NetworkEnvironment, sink: Sink, *, host: str, secret: str) -> None:
        self._env = env
        self._sink = sink
        self._lock = threading.Lock()
        self.closed = threading.Event()
        self._job_failed = threading.Event()
        self._job: str | None = None
        self._num_partitions: int | None = None
        self._accepted: dict[int, str] = {}
        #: The attempt read of each partition.
        self._attempts: dict[int, int] = {}
        self._ended: set[int] = set()
        #: Rows read of each partition, and the rows the driver says each has (job_done).
        self._rows: dict[int, int] = {}
        self._expected: dict[int, int] | None = None
        #: Why the stream failed (a partition's attempt broke, or came short), once it did.
        self._broken: str | None = None
        self._settled: dict[int, _Settled] = {}
        self._threads = Threads()
        self._done = False
        self._inbox = _messages.Inbox(self._on_message, host=host, key=secret, name="creditflow-receiver")

    @property
    def address(self) -> str:
        """The inbox's address (``host:port``): what :func:`send` is given."""
        return self._inbox.address

    def _on_message(self, msg: _messages.Message) -> _messages.Message | _messages.Then | None:
        kind = msg.get("kind")
        if kind == "job_failed":
            with self._lock:
                # A job may fail before it registers (a Connect session's probe job fails
                # where the job would): the first job to say anything is this receiver's.
                if self._job is None:
                    self._job = msg.get("job")
                mine = msg.get("job") == self._job
            if mine:
                self._sink.fail(cf.ProducerFailedError(f"the Spark job failed: {msg.get('error')}"))
                self._job_failed.set()
            return None
        if kind == "delivered" and msg.get("job") == self._job:
            return self._delivered(int(msg["partition"]))
        if kind == "attempt_failed" and msg.get("job") == self._job:
            index, attempt = int(msg["partition"]), int(msg.get("attempt", 0))
            return self._attempt_failed(index, attempt, str(msg.get("error")))
        if kind == "job_done" and msg.get("job") == self._job:
            return self._job_done({int(p): int(n) for p, n in dict(msg["rows"]).items()})
        with self._lock:
            if kind == "job":
                if msg.get("world_size", 1) != 1:
                    return {"accept": False, "reason": "this receiver is not a rank (no world_size given)"}
                if self._job is not None and self._job != msg["job"]:
                    return {"accept": False, "reason": "this receiver already serves another job"}
                self._job = msg["job"]
                self._num_partitions = int(msg["num_partitions"])
            elif kind != "partition" or msg.get("job") != self._job:
                return {"accept": False, "reason": "unknown job"}
            else:
                return self._accept(msg)
        return {"accept": True}

    def _accept(self, msg: _messages.Message) -> _messages.Message:
        """A task's partition (under the lock): read it, unless another attempt is."""
        index = int(msg["partition"])
        if self.closed.is_set():
            return {"accept": False, "reason": "the receiver closed"}
        if index in self._accepted:
            # Another attempt of a partition already being read: delivered once only.
            return {"accept": False, "reason": f"partition {index} is already being received"}
        self._accepted[index] = msg["partition_id"]
        self._attempts[index] = int(msg.get("attempt", 0))
        spec = cf.ChannelSpec(msg["address"], msg["partition_id"], 0)
        if not self._threads.start(self._read, f"creditflow-receiver-{index}", index, spec):
            return {"accept": False, "reason": "the receiver closed"}
        return {"accept": True, "confirm": self._sink.confirm}

    def _read(self, index: int, spec: cf.ChannelSpec) -> None:
        failure: str | None = "the receiver closed"
        try:
            try:
                with self._env.create_input_gate([spec]) as gate:
                    while not self.closed.is_set():
                        try:
                            batch = gate.next(timeout=POLL * 10)
                        except cf.TimeoutError:
                            continue
                        if batch is None:
                            break
                        with self._lock:
                            self._rows[index] = self._rows.get(index, 0) + batch.num_rows
                        if not self._sink.deliver(batch):
                            return
            except Exception as exc:
                if isinstance(exc, (cf.ConnectionLostError, cf.ProducerFailedError)):
                    # A PySpark worker whose task failed exits at once: its connection can break
                    # before its failure arrives; and when one task fails the job, Spark stops the
                    # others, whose failures (a cut input stream) can come first. The driver tells
                    # of the failed job with its cause: give that a moment, so the consumer sees
                    # the job's error, not a symptom of it. (Not past the receiver's close, which
                    # waits for this thread.)
                    self._job_fails_within_grace()
                if not self.closed.is_set():
                    self._sink.fail(exc)
                failure = self._sink.failure() or f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self._broken = self._broken or f"partition {index}: {failure}"
                return
            if not self.closed.is_set():
                failure = None
            with self._lock:
                self._ended.add(index)
        finally:
            self._settle(index, failure)

    def _settle(self, index: int, failure: str | None) -> None:
        """Records that partition ``index`` was kept whole (``failure`` None) or why not."""
        with self._lock:
            settled = self._settled.setdefault(index, _Settled())
        settled.failure = failure
        settled.event.set()

    def _delivered(self, index: int) -> _messages.Message:
        """The answer to a task that asks whether its partition was kept whole (its reader
        thread is done with it by then, or soon)."""
        with self._lock:
            settled = self._settled.setdefault(index, _Settled())
        if not settled.event.wait(REGISTER_TIMEOUT):
            return {"ok": False, "reason": f"partition {index} is still being received"}
        return {"ok": settled.failure is None, "reason": settled.failure}

    def _attempt_failed(self, index: int, attempt: int, error: str) -> _messages.Message:
        """A task says its attempt failed: when it is the attempt read, the stream fails now
        (its reader may not have reached the channel yet: the task's release can come first,
        and the reader then retries for a while before it finds no partition)."""
        with self._lock:
            if self._attempts.get(index) != attempt or index in self._ended or self._broken:
                return {"ok": True}
            self._broken = f"partition {index}: {error}"
        self._threads.start(self._fail_unless_the_job_did, "creditflow-receiver-grace", error)
        return {"ok": True}

    def _fail_unless_the_job_did(self, error: str) -> None:
        """Fails the stream with a task's ``error`` unless the driver's word that the job
        failed comes within the grace: when one task fails the job, Spark stops the others,
        and a stopped task's failure (a cut input stream) can come before that word, which
        names the cause. (Not past the receiver's close.)"""
        if not self._job_fails_within_grace() and not self.closed.is_set():
            self._conclude(error)

    def _job_fails_within_grace(self) -> bool:
        """Waits up to :data:`JOB_FAILED_GRACE` for the driver's word that the job failed
        (not past the receiver's close); whether it came."""
        grace = time.monotonic() + JOB_FAILED_GRACE
        while not self.closed.is_set() and time.monotonic() < grace:
            if self._job_failed.wait(POLL):
                return True
        return False

    def _job_done(self, rows: dict[int, int]) -> _messages.Message | _messages.Then:
        """The driver's word that the job succeeded, with each partition's rows: the stream
        ends once every partition ended with that many. The answer is ``pending`` until then
        (the driver asks again: a slow consumer can hold the last batches for long); the
        stream ends or fails only once the driver has its answer, as its consumer may close
        the receiver at once."""
        with self._lock:
            if self._expected is None:
                self._expected = rows
            verdict = self._verdict()
            broken = self._broken
        answer: _messages.Message = {"ok": True}
        if broken is not None:
            answer = {"ok": False, "reason": broken}
        elif not self._done:
            answer = {"ok": False, "pending": True, "reason": "partitions are still being received"}
        return _messages.Then(answer, lambda: self._conclude(verdict))

    def _verdict(self) -> str | None:
        """(Under the lock.) Once the driver's word came and every partition ended, the first
        time: "" when each has its rows, else why not (the stream then fails); else None."""
        expected, n = self._expected, self._num_partitions
        if expected is None or n is None or len(self._ended) < n or self._done or self._broken:
            return None
        self._done = True
        short = [
            f"partition {p}: {self._rows.get(p, 0)} of {expected.get(p)} rows"
            for p in range(n)
            if self._rows.get(p, 0) != expected.get(p)
        ]
        if not short:
            return ""
        self._broken = (
            f"{'; '.join(short)}: the attempt read ended early (its task failed after its input "
            "ended, when an upstream Python worker died) and a receiver without ranks cannot take "
            "the rest from another attempt"
        )
        return self._broken

    def _conclude(self, verdict: str | None) -> None:
        """Ends the stream ("") or fails it (why), outside the lock and without holding up the
        caller (a full queue waits for the consumer)."""
        if verdict is None:
            return
        if verdict:
            error = cf.ProducerFailedError(verdict)
            threading.Thread(target=self._sink.fail, args=(error,), daemon=True).start()
        else:
            threading.Thread(target=self._sink.end, daemon=True).start()

    def close(self) -> None:
        """Stops accepting and waits for the reader threads (the caller releases what a
        blocked one waits on first, or after :attr:`closed` is set)."""
        self.closed.set()
        self._inbox.close()

    def join(self) -> None:
        """Waits for the threads it started, readers and a failure waiting for the job's word
        (after :meth:`close`)."""
        self._threads.join()
