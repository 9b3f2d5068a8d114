"""The receiving side of :func:`creditflow.spark.send` that every receiver mode shares: the
control inbox the driver and the tasks talk to, the job's registration, the tasks' partitions
and a reader thread per partition, which hands each batch to the mode's :class:`Sink`.

Every row is delivered once. One attempt of a partition is read at a time: another that asks
meanwhile (speculation, a retry that came before its predecessor's stream broke) is told to
ask again, and an attempt older than one that asked is turned away. An attempt whose stream
breaks (its executor died, its task failed) leaves the partition to Spark's next attempt,
which skips the rows the receiver already has and sends the rest; the stream fails only on
the driver's word that the job failed. A clean end of an attempt's channel does not prove its
partition whole (a task whose upstream Python worker died sees its input end early, and ends
its channel cleanly before Spark fails it; its retry continues too): the stream ends only on
the driver's word that the job succeeded, with each partition's rows from the attempt Spark
kept, once no partition is being read; fewer rows fail the stream. A rank receiver
(:mod:`creditflow.spark._rank`) handles its partitions itself and gives the inbox a handler of
its own.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

import pyarrow as pa

import creditflow as cf
from creditflow.spark import _messages
from creditflow.spark._resume import Trail, mismatch
from creditflow.spark._threads import Threads

#: How long a registration waits for the receiver's answer.
REGISTER_TIMEOUT = 30.0
#: How long a receiver holds its answer to an attempt while another attempt of the partition
#: is being read (then it says "ask again"): well within the registration's timeout.
HOLD = REGISTER_TIMEOUT / 2
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


#: What a reader gets when the attempt it reads broke (its executor died, its task failed, it
#: released its partition before the request reached it, or said it failed: the gate closed).
_BROKEN = (cf.ConnectionLostError, cf.ProducerFailedError, cf.ClosedError, cf.PartitionNotFoundError)


#: Why a retry that computed other rows cannot continue, and what to do about it.
NOT_THE_SAME = (
    "the DataFrame's rows or their order are not the same when Spark computes a partition again "
    "(after a shuffle, sort each partition by a unique key, or write the DataFrame out and send "
    "what is read back)"
)


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
        self._job: str | None = None
        self._num_partitions: int | None = None
        #: The attempt read (or read last) of each partition: the newest it accepted.
        self._attempts: dict[int, int] = {}
        #: The partitions whose current attempt is being read, and their gates once open.
        self._live: set[int] = set()
        self._gates: dict[tuple[int, int], cf.InputGate] = {}
        #: Attempts that said they failed before their reader opened its gate.
        self._failed: set[tuple[int, int]] = set()
        #: Rows read of each partition (over all its attempts), and the rows the driver says
        #: each has (job_done).
        self._rows: dict[int, int] = {}
        self._expected: dict[int, int] | None = None
        #: Why the stream failed (the job failed, the sink did, or a partition came short).
        self._broken: str | None = None
        #: What each partition delivered at the resume check's points, which the next
        #: attempt's same rows must match (:mod:`creditflow.spark._resume`).
        self._trails: dict[int, Trail] = {}
        #: Whether each attempt's reader kept what it read, by (partition, attempt).
        self._settled: dict[tuple[int, int], _Settled] = {}
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
                    self._broken = self._broken or f"the Spark job failed: {msg.get('error')}"
            if mine:
                self._sink.fail(cf.ProducerFailedError(f"the Spark job failed: {msg.get('error')}"))
            return None
        if kind == "delivered" and msg.get("job") == self._job:
            return self._delivered(int(msg["partition"]), int(msg.get("attempt", 0)))
        if kind == "attempt_failed" and msg.get("job") == self._job:
            index, attempt = int(msg["partition"]), int(msg.get("attempt", 0))
            return self._attempt_failed(index, attempt, str(msg.get("error")))
        if kind == "job_done" and msg.get("job") == self._job:
            return self._job_done({int(p): int(n) for p, n in dict(msg["rows"]).items()})
        if kind == "resume_check" and msg.get("job") == self._job:
            return self._resume_check(int(msg["partition"]), int(msg.get("attempt", 0)), list(msg["digests"]))
        if kind == "partition" and msg.get("job") == self._job:
            self._await_settled(int(msg["partition"]), int(msg.get("attempt", 0)))
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

    def _await_settled(self, index: int, attempt: int) -> None:
        """Waits, up to :data:`HOLD`, until the stream of the attempt being read of
        partition ``index`` settles, when ``attempt`` is a newer one (its predecessor's stream
        may not have broken yet: a killed executor's connection breaks a moment later)."""
        with self._lock:
            current = self._attempts.get(index, -1)
            live = index in self._live and attempt > current
            settled = self._settled.setdefault((index, current), _Settled()) if live else None
        if settled is not None:
            deadline = time.monotonic() + HOLD
            while not settled.event.wait(POLL) and not self.closed.is_set() and time.monotonic() < deadline:
                pass

    def _accept(self, msg: _messages.Message) -> _messages.Message:
        """A task's partition (under the lock): read it, after the rows an earlier attempt
        delivered (``skip``), unless another attempt is being read (ask again) or a newer one
        asked (turned away)."""
        index, attempt = int(msg["partition"]), int(msg.get("attempt", 0))
        if self.closed.is_set():
            return {"accept": False, "reason": "the receiver closed"}
        if self._broken is not None:
            return {"accept": False, "reason": self._broken}
        newest = self._attempts.get(index, -1)
        if attempt < newest:
            return {
                "accept": False,
                "reason": f"partition {index}: attempt {attempt} asked after attempt {newest}, which has it",
            }
        if attempt == newest and index not in self._live:
            return {"accept": False, "reason": f"partition {index}: attempt {attempt} was read already"}
        if index in self._live:
            return {"accept": False, "retry": True, "reason": f"partition {index} is being received"}
        self._attempts[index] = attempt
        self._live.add(index)
        self._trails.setdefault(index, Trail())
        spec = cf.ChannelSpec(msg["address"], msg["partition_id"], 0)
        if not self._threads.start(self._read, f"creditflow-receiver-{index}", index, attempt, spec):
            self._live.discard(index)
            return {"accept": False, "reason": "the receiver closed"}
        return {"accept": True, "confirm": self._sink.confirm, "skip": self._rows.get(index, 0)}

    def _read(self, index: int, attempt: int, spec: cf.ChannelSpec) -> None:
        failure: str | None = "the receiver closed"
        last: pa.RecordBatch | None = None
        trail = self._trails[index]
        try:
            try:
                with self._gate(index, attempt, spec) as gate:
                    while not self.closed.is_set():
                        try:
                            batch = gate.next(timeout=POLL * 10)
                        except cf.TimeoutError:
                            continue
                        if batch is None:
                            break
                        if batch.num_rows:
                            last = batch
                        with self._lock:
                            start = self._rows.get(index, 0)
                            self._rows[index] = start + batch.num_rows
                        trail.see(batch, start)
                        if not self._sink.deliver(batch):
                            return
            except _BROKEN as exc:
                # The attempt broke (its executor died, its task failed, or it released its
                # partition before the request reached it): Spark's next attempt continues
                # after the rows delivered, unless the job failed (the driver says so).
                failure = f"{type(exc).__name__}: {exc}"
                return
            except Exception as exc:
                if not self.closed.is_set():
                    self._sink.fail(exc)
                failure = self._sink.failure() or f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self._broken = self._broken or f"partition {index}: {failure}"
                return
            if not self.closed.is_set():
                failure = None
        finally:
            if last is not None:  # this is the partition's only reader until it is not live
                trail.end(last, self._rows[index])
            with self._lock:
                self._live.discard(index)
                self._gates.pop((index, attempt), None)
            self._settle(index, attempt, failure)

    def _gate(self, index: int, attempt: int, spec: cf.ChannelSpec) -> cf.InputGate:
        """The gate reading ``attempt``'s channel, closed at once when the attempt said it
        failed before (what it sent before failing is read up to there otherwise)."""
        gate = self._env.create_input_gate([spec])
        with self._lock:
            if (index, attempt) in self._failed:
                gate.close()
            else:
                self._gates[(index, attempt)] = gate
        return gate

    def _settle(self, index: int, attempt: int, failure: str | None) -> None:
        """Records that ``attempt``'s stream of partition ``index`` was kept whole
        (``failure`` None) or why not."""
        with self._lock:
            settled = self._settled.setdefault((index, attempt), _Settled())
        settled.failure = failure
        settled.event.set()

    def _delivered(self, index: int, attempt: int) -> _messages.Message:
        """The answer to a task that asks whether its partition was kept whole (its reader
        thread is done with it by then, or soon)."""
        with self._lock:
            settled = self._settled.setdefault((index, attempt), _Settled())
        if not settled.event.wait(REGISTER_TIMEOUT):
            return {"ok": False, "reason": f"partition {index} is still being received"}
        return {"ok": settled.failure is None, "reason": settled.failure}

    def _attempt_failed(self, index: int, attempt: int, error: str) -> _messages.Message:
        """A task says its attempt failed: when it is the attempt being read, its reader stops
        now (it may not have reached the channel yet: the task's release can come first, and
        the reader would retry for a while before it finds no partition), and Spark's next
        attempt continues after the rows delivered."""
        with self._lock:
            if self._attempts.get(index) != attempt or index not in self._live:
                return {"ok": True}
            self._failed.add((index, attempt))
            gate = self._gates.get((index, attempt))
        if gate is not None:
            gate.close()
        return {"ok": True}

    def _resume_check(self, index: int, attempt: int, digests: list[list[object]]) -> _messages.Message:
        """An attempt that continues partition ``index`` after the rows delivered sends its
        digests of the rows at the check's points (:mod:`creditflow.spark._resume`): the same
        as those delivered, or it computed other rows or another order (the DataFrame is not
        deterministic), and the stream fails rather than deliver rows twice or lose some."""
        with self._lock:
            if self._attempts.get(index) != attempt or self._broken is not None:
                why = self._broken or f"partition {index}: attempt {attempt} is not the one read"
                return {"ok": False, "reason": why}
            row = mismatch(self._trails[index].expected(), digests)
            if row is None:
                return {"ok": True}
            self._broken = (
                f"partition {index}: attempt {attempt} computed other rows than the attempt it continues "
                f"(its row {row} differs from the one delivered): {NOT_THE_SAME}"
            )
            why = self._broken
        self._conclude(why)
        return {"ok": False, "reason": why}

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
        """(Under the lock.) Once the driver's word came and no partition is being read (or
        waits for its first attempt), the first time: "" when each has its rows, else why not
        (the stream then fails); else None."""
        expected, n = self._expected, self._num_partitions
        if expected is None or n is None or self._done or self._broken:
            return None
        if self._live or any(p not in self._attempts for p in range(n)):
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
            f"{'; '.join(short)}: the last attempt read broke or ended early (its task failed after "
            "its input ended, when an upstream Python worker died) and no later attempt sent the rest"
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
