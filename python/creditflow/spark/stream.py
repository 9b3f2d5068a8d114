"""Streaming a DataFrame out of Spark into another process, with backpressure.

The consumer (a trainer, a service: any Python process outside Spark) opens a
:class:`Receiver` and hands its one ``address`` and ``secret`` to the driver, which calls
:func:`send`. Every task then creates a one-subpartition partition in its worker's
environment, registers it with the receiver (an authenticated control message) and writes
its batches into it as Spark computes them; the receiver reads every registered partition
through credit-based channels and yields the batches in arrival order. A consumer that
reads slowly holds back its credit, so the tasks' writers block, and with them the Spark
computation feeding them: executor memory stays within each task's ``memory`` setting.

``send(df, ..., via="driver")`` instead collects ``df.toArrow()`` on the driver and streams
that table (for results small enough for the driver, or executors that cannot reach the
consumer).

Every partition is delivered once: a second attempt of a partition already being read
(speculation, a retried task) is turned away, and a failed attempt makes the receiver
raise instead of silently delivering part of a partition twice.

``Receiver(spill=True)`` decouples the two: the receiver reads the tasks at Spark's speed and
keeps what its consumer has not taken yet in a hybrid partition of its own environment
(:mod:`creditflow.spark._spool`), spilling to disk what does not fit in its memory, so the job
finishes and frees its executors while the consumer reads at its own pace; with replay the
consumer can read the whole DataFrame again (epochs) without Spark computing it again.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame

import creditflow as cf
from creditflow.metrics import EnvMetrics, SpillMetrics
from creditflow.spark import _messages
from creditflow.spark._driver import application_id, host_memory, prepare, use_host_service
from creditflow.spark._messages import Closeable
from creditflow.spark._process import (
    EnvSettings,
    TlsFiles,
    check_wire_compression,
    host_environment,
    host_towards,
    metrics_url_of,
    task_environment,
)
from creditflow.spark._spool import Spool
from creditflow.spark.monitor import Monitor, MonitorHandle, Reporter

_log = logging.getLogger(__name__)

#: How long a registration waits for the receiver's answer.
REGISTER_TIMEOUT = 30.0
#: How long a partition's broken connection waits for the driver's word that the job failed
#: (then the consumer raises the job's error rather than the connection's).
JOB_FAILED_GRACE = 5.0
#: How often blocked receiver threads look whether the receiver closed.
_POLL = 0.1


class _Failed:
    """A queued failure: raised by the consumer's thread when it reaches it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


class _Settled:
    """Whether a partition's reader thread kept all of it, once the thread is done."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.failure: str | None = None


class Receiver(Closeable):
    """Receives DataFrames that :func:`send` streams out of Spark.

    Args:
        memory, segment_size: this process's creditflow network memory (see
            :class:`creditflow.NetworkEnvironment`).
        bind: The host (name or IP address) the receiver listens on; the executors (or the
            driver, with ``via="driver"``) must reach it. Its ports are ephemeral.
        secret: Shared by the receiver and the tasks (default: a fresh random one; give the
            driver :attr:`secret`).
        max_queued: Batches received but not yet taken by the consumer; beyond that, the
            channels stop returning credit and the Spark tasks block. Not used with
            ``spill=True``.
        timeout: Longest :meth:`next`/iteration waits for a batch, in seconds (None: no limit).
        spill: Let Spark finish first: read the tasks as fast as Spark sends and keep what
            the consumer has not taken yet in a hybrid partition of this receiver's
            environment, which holds at most ``memory`` and spills the rest to
            ``spill_dir``; the job completes and frees its executors while the consumer
            reads at its own pace. Default False: the tasks wait for the consumer
            (backpressure).
        replay: With ``spill=True``, keep the whole stream until :meth:`close` so that it can
            be read again: every ``iter(rx)`` starts from the first batch, without Spark
            computing anything again. Default: True when ``epochs > 1``. Without replay,
            what the consumer read is freed at once, and at ``max_spill`` the tasks wait
            for the consumer.
        epochs: With ``spill=True`` and replay, how many times one iteration goes through
            the whole stream (default 1).
        spill_dir: With ``spill=True``, where the spill file goes (see
            :class:`creditflow.NetworkEnvironment`; default ``creditflow-spill`` in the
            system temp dir).
        max_spill: With ``spill=True``, the most bytes the spill file may hold (default
            unbounded). Without replay, the tasks then wait for the consumer; with replay,
            the receiver cannot keep the stream: it fails with
            :class:`creditflow.SpillError` naming ``max_spill``, the consumer gets
            :class:`creditflow.ProducerFailedError` and :func:`send` raises with that
            message.
        tls: A :class:`creditflow.TLSConfig`: the receiver reads the tasks' partitions over
            TLS (pass :func:`send` the same kind of files: each task's certificate must be
            valid for its executor's address, the receiver's for ``bind``). The secret still
            authenticates both ends and the registrations sent to :attr:`address` (which
            carry where the partitions are, not data).

    Iterate it (or call :meth:`next`) to get ``pyarrow.RecordBatch`` objects, in the order
    they arrive (partitions interleave); iteration ends once the job that registered with
    it delivered every partition. Raises :class:`ValueError` for ``replay``, ``epochs``,
    ``spill_dir`` or ``max_spill`` without ``spill=True``, and for ``epochs > 1`` with
    ``replay=False``.
    """

    def __init__(
        self,
        *,
        memory: int | str = "64MiB",
        segment_size: int | str = "32KiB",
        bind: str = "127.0.0.1",
        secret: str | None = None,
        max_queued: int = 8,
        timeout: float | None = None,
        spill: bool = False,
        replay: bool | None = None,
        epochs: int = 1,
        spill_dir: str | None = None,
        max_spill: int | str | None = None,
        tls: cf.TLSConfig | None = None,
    ) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
        replay = _check_spill(spill, replay, epochs, spill_dir, max_spill)
        host = bind.strip("[]")
        if bind.count(":") == 1:  # "host:port" (an IPv6 address has more colons)
            raise ValueError(
                f"bind takes a host, not {bind!r}: the receiver's ports are chosen by the system"
            )
        self.secret = secret or secrets.token_hex(32)
        self._timeout = timeout
        self._env = cf.NetworkEnvironment(
            memory=memory,
            segment_size=segment_size,
            bind=f"[{host}]:0" if ":" in host else f"{host}:0",
            secret=self.secret,
            spill_dir=spill_dir,  # both None (the defaults) without spill
            max_spill=max_spill,
            tls=tls,
        )
        self._epochs = epochs
        # With spill, batches go to the spool; the queue only ever holds the end or a failure.
        self._spool = Spool(self._env, replay=replay) if spill else None
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queued)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._job_failed = threading.Event()
        self._job: str | None = None
        self._num_partitions: int | None = None
        self._accepted: dict[int, str] = {}
        self._ended: set[int] = set()
        self._settled: dict[int, _Settled] = {}
        self._readers: list[threading.Thread] = []
        self._done = False
        self._inbox = _messages.Inbox(
            self._on_message, host=host, key=self.secret, name="creditflow-receiver"
        )

    @property
    def address(self) -> str:
        """The one address to give :func:`send` (``host:port``)."""
        return self._inbox.address

    def _on_message(self, msg: _messages.Message) -> _messages.Message | None:
        kind = msg.get("kind")
        if kind == "job_failed":
            with self._lock:
                # A job may fail before it registers (a Connect session's probe job fails
                # where the job would): the first job to say anything is this receiver's.
                if self._job is None:
                    self._job = msg.get("job")
                mine = msg.get("job") == self._job
            if mine:
                self._fail(cf.ProducerFailedError(f"the Spark job failed: {msg.get('error')}"))
                self._job_failed.set()
            return None
        if kind == "delivered" and msg.get("job") == self._job:
            return self._delivered(int(msg["partition"]))
        with self._lock:
            if kind == "job":
                if self._job is not None and self._job != msg["job"]:
                    return {"accept": False, "reason": "this receiver already serves another job"}
                self._job = msg["job"]
                self._num_partitions = int(msg["num_partitions"])
                end = self._all_ended()
            elif kind != "partition" or msg.get("job") != self._job:
                return {"accept": False, "reason": "unknown job"}
            else:
                index = int(msg["partition"])
                if index in self._accepted:
                    # Another attempt of a partition already being read: delivered once only.
                    return {"accept": False, "reason": f"partition {index} is already being received"}
                self._accepted[index] = msg["partition_id"]
                spec = cf.ChannelSpec(msg["address"], msg["partition_id"], 0)
                thread = threading.Thread(
                    target=self._read, args=(index, spec), name=f"creditflow-receiver-{index}", daemon=True
                )
                self._readers.append(thread)
                thread.start()
                # A spilling receiver's channel ends before the consumer has the data: the
                # task then asks whether its partition was kept (see _stream_partition).
                return {"accept": True, "confirm": self._spool is not None}
        if end:
            self._end()
        return {"accept": True}

    def _put(self, item: object) -> bool:
        """Queues ``item``, waiting while the queue is full; False if the receiver closed."""
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _end(self) -> None:
        """Every partition arrived: the consumer sees the end after the last batch."""
        if self._spool is not None:
            self._spool.end()
        else:
            self._put(_END)

    def _fail(self, error: BaseException) -> None:
        """The job or a partition failed: the consumer raises after the batches before."""
        if self._spool is not None:
            # A no-op once the spool failed by itself (SpillError) or ended.
            self._spool.fail(f"{type(error).__name__}: {error}")
        else:
            self._put(_Failed(error))

    def _deliver(self, batch: pa.RecordBatch) -> bool:
        """Hands ``batch`` to the consumer's side; False if the receiver closed."""
        if self._spool is None:
            return self._put(batch)
        self._spool.put(batch)  # waits only without replay at max_spill
        return True

    def _read(self, index: int, spec: cf.ChannelSpec) -> None:
        failure: str | None = "the receiver closed"
        try:
            try:
                with self._env.create_input_gate([spec]) as gate:
                    while not self._closed.is_set():
                        try:
                            batch = gate.next(timeout=_POLL * 10)
                        except cf.TimeoutError:
                            continue
                        if batch is None:
                            break
                        if not self._deliver(batch):
                            return
            except Exception as exc:
                if isinstance(exc, cf.ConnectionLostError):
                    # A PySpark worker whose task failed exits at once: its connection can break
                    # before its failure arrives. The driver tells of the failed job: give that
                    # a moment, so the consumer sees the job's error, not the broken connection.
                    self._job_failed.wait(JOB_FAILED_GRACE)
                if not self._closed.is_set():
                    self._fail(exc)
                cause = self._spool.failure if self._spool is not None else None
                failure = cause or f"{type(exc).__name__}: {exc}"
                return
            if not self._closed.is_set():
                failure = None
            with self._lock:
                self._ended.add(index)
                end = self._all_ended()
            if end:
                self._end()
        finally:
            self._settle(index, failure)

    def _settle(self, index: int, failure: str | None) -> None:
        """Records that partition ``index`` was kept whole (``failure`` None) or why not."""
        with self._lock:
            settled = self._settled.setdefault(index, _Settled())
        settled.failure = failure
        settled.event.set()

    def _delivered(self, index: int) -> _messages.Message:
        """The answer to a spilling task that asks whether its partition was kept whole
        (its reader thread is done with it by then, or soon)."""
        with self._lock:
            settled = self._settled.setdefault(index, _Settled())
        if not settled.event.wait(REGISTER_TIMEOUT):
            return {"ok": False, "reason": f"partition {index} is still being received"}
        return {"ok": settled.failure is None, "reason": settled.failure}

    def _all_ended(self) -> bool:
        """Whether every partition of the job ended, the first time it is true (the caller
        then queues the end, outside the lock: the queue may be full)."""
        if self._num_partitions is None or len(self._ended) < self._num_partitions or self._done:
            return False
        self._done = True
        return True

    def next(self, timeout: float | None = None) -> pa.RecordBatch | None:
        """The next batch; None once every partition of the job arrived. Raises
        :class:`creditflow.TimeoutError` after ``timeout`` seconds (default: the receiver's),
        and the task's error if a partition failed (with ``spill=True``: a
        :class:`creditflow.ProducerFailedError` naming it). With replay, :meth:`next`
        continues the current pass (the first one if none started) and returns None at its
        end; ``iter(rx)`` starts new ones."""
        limit = self._timeout if timeout is None else timeout
        if self._spool is not None:
            return self._spool.next(limit)
        try:
            item = self._queue.get(timeout=limit)
        except queue.Empty:
            raise cf.TimeoutError(f"no batch within {limit} s") from None
        if item is _END:
            self._queue.put(_END)  # later calls see the end too
            return None
        if isinstance(item, _Failed):
            self._queue.put(item)
            raise item.error
        assert isinstance(item, pa.RecordBatch)
        return item

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        """The batches until the end; with replay, the whole stream from its first batch,
        ``epochs`` times over (each ``iter(rx)`` starts again)."""
        passes = self._epochs if self._spool is not None and self._spool.replay else 1
        for _ in range(passes):
            if self._spool is not None and self._spool.replay:
                self._spool.restart()
            while (batch := self.next()) is not None:
                yield batch

    def metrics(self) -> EnvMetrics:
        """The receiver's environment metrics (see :meth:`creditflow.NetworkEnvironment.metrics`).
        With ``spill=True`` its partitions include the receiver's store while it holds data
        (see also :meth:`spill_metrics`)."""
        return self._env.metrics()

    def spill_metrics(self) -> SpillMetrics | None:
        """With ``spill=True``, the store's metrics (``creditflow.metrics.SpillMetrics``: bytes
        stored, spilled and read back, what it holds in memory and on disk now); None
        without."""
        return self._spool.metrics() if self._spool is not None else None

    def close(self) -> None:
        """Stops receiving; open channels are cancelled; with ``spill=True`` the stored stream
        and its spill file are removed. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._inbox.close()
        if self._spool is not None:
            self._spool.release()  # wakes a reader thread waiting for room
        for t in list(self._readers):
            t.join()
        self._env.close()


def _check_spill(
    spill: bool, replay: bool | None, epochs: int, spill_dir: str | None, max_spill: int | str | None
) -> bool:
    """Checks the spilling arguments of :class:`Receiver`; returns whether to replay."""
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    if not spill:
        given = [
            name
            for name, value in (
                ("replay", replay),
                ("epochs", epochs if epochs != 1 else None),
                ("spill_dir", spill_dir),
                ("max_spill", max_spill),
            )
            if value is not None
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)} need{'s' if len(given) == 1 else ''} spill=True: without it the "
                "receiver keeps nothing (the consumer reads straight from the Spark tasks)"
            )
        return False
    if epochs > 1 and replay is False:
        raise ValueError(f"epochs={epochs} needs replay: without it the stream is read once")
    return epochs > 1 if replay is None else replay


@dataclass(frozen=True)
class _SendPlan:
    job: str
    address: str
    env: EnvSettings
    timeout: float | None
    monitor: MonitorHandle | None
    #: The application whose host services the tasks attach to, and its host memory (bytes);
    #: None: an environment per task.
    app_id: str | None = None
    host_memory: int = 0


#: The one row each sending task returns to the driver.
_STATS_SCHEMA = "partition int, attempt int, accepted boolean, rows long, bytes long, seconds double"


def send(
    df: DataFrame,
    address: str,
    secret: str,
    *,
    via: Literal["executors", "driver"] = "executors",
    memory: int | str = "16MiB",
    segment_size: int | str = "32KiB",
    wire_compression: str | None = None,
    tls: cf.TLSConfig | None = None,
    timeout: float | None = 600.0,
    monitor: Monitor | None = None,
    host_service: bool | None = None,
) -> list[dict[str, Any]]:
    """Streams ``df`` to the :class:`Receiver` at ``address``; returns when it has it all.

    With ``via="executors"`` (the default) every task streams its partition straight from
    its executor as Spark computes it, with backpressure from the receiver reaching the
    computation; ``memory`` bounds what each task holds in flight (with ``host_service=False``;
    the tasks attached to a host service share its ``spark.creditflow.hostMemory``). With ``via="driver"`` the
    driver collects ``df.toArrow()`` (the whole result in driver memory) and streams that.

    ``wire_compression`` (``"lz4"``, ``"zstd"``) compresses what the tasks send, as for
    :class:`creditflow.NetworkEnvironment` (pays when the receiver is across a slow link).
    ``tls`` (a :class:`creditflow.TLSConfig`, for a :class:`Receiver` made with ``tls``): every
    task serves its partition over TLS with these files, which each executor (or, with
    ``via="driver"``, the driver) reads at these paths; the certificate must be valid for the
    address the receiver reaches it at.
    ``timeout`` bounds each wait for buffer space or for the receiver to finish reading, in
    seconds. ``host_service`` (with ``via="executors"``): ``True`` sends through each host's
    creditflow service (one pool for the host, ``spark.creditflow.hostMemory``, default 64 MiB
    per task slot of the host; one connection per host to the receiver), ``False`` from an
    environment per task, ``None`` (the default) as the session's
    ``spark.creditflow.hostService`` says (default true).
    Returns one dict per partition: ``partition``, ``attempt``, ``accepted``,
    ``rows``, ``bytes``, ``seconds``. Raises what the job raised, after telling the
    receiver (which then raises too).
    """
    if via not in ("executors", "driver"):
        raise ValueError(f'via must be "executors" or "driver", got {via!r}')
    check_wire_compression(wire_compression)
    job = uuid.uuid4().hex[:12]
    settings = EnvSettings(
        secret=secret,
        memory=memory,
        segment_size=segment_size,
        wire_compression=wire_compression,
        tls=TlsFiles.of(tls),
    )
    plan = _SendPlan(job, address, settings, timeout, monitor.handle if monitor is not None else None)
    if via == "driver":
        return [_send_from_driver(df, plan)]
    if use_host_service(df.sparkSession, host_service):
        plan = replace(plan, app_id=application_id(df.sparkSession), host_memory=host_memory(df.sparkSession))
    try:
        # On Connect this runs a probe job over df, which fails where the job would.
        n = prepare(df)
    except BaseException as exc:
        _tell_job_failed(address, secret, job, exc)
        raise
    _register_job(plan, n)
    try:

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return _send_task(plan, batches)

        rows = df.mapInArrow(run, _STATS_SCHEMA).collect()
    except BaseException as exc:
        _tell_job_failed(address, secret, job, exc)
        raise
    return [r.asDict() for r in sorted(rows, key=lambda r: (r.partition, r.attempt))]


def _tell_job_failed(address: str, secret: str, job: str, exc: BaseException) -> None:
    """Tells the receiver at ``address`` that ``job`` failed with ``exc``, best effort: a
    receiver that is gone or unreachable is logged, so that the caller raises the job's own
    error rather than the notice's."""
    try:
        _messages.send(address, secret, {"kind": "job_failed", "job": job, "error": str(exc)[:2000]})
    except (OSError, EOFError, multiprocessing.AuthenticationError) as notice:
        _log.warning("creditflow: could not tell the receiver at %s that the job failed: %s", address, notice)


def _register_job(plan: _SendPlan, num_partitions: int) -> None:
    answer = _messages.send(
        plan.address,
        plan.env.secret,
        {"kind": "job", "job": plan.job, "num_partitions": num_partitions},
        reply=True,
        timeout=REGISTER_TIMEOUT,
    )
    if not answer.get("accept"):
        raise ValueError(f"the receiver at {plan.address} refused the job: {answer.get('reason')}")


def _stream_partition(
    env: cf.NetworkEnvironment | cf.Attachment,
    plan: _SendPlan,
    index: int,
    attempt: int,
    batches: Iterator[pa.RecordBatch],
) -> dict[str, Any]:
    """Registers partition ``index`` with the receiver and writes ``batches`` to it; returns
    once the receiver has read everything (or turned this attempt away)."""
    start = time.perf_counter()
    part = env.create_partition(f"cf-send/{plan.job}/{index}/{attempt}/{uuid.uuid4().hex[:6]}", 1)
    stats: dict[str, Any] = {"partition": index, "attempt": attempt, "accepted": False, "rows": 0, "bytes": 0}
    wanted = plan.monitor is not None and plan.monitor.metrics
    served = metrics_url_of(env) if wanted and isinstance(env, cf.NetworkEnvironment) else None
    metrics = {"metrics_url": served} if served else {}
    reporter = Reporter(
        plan.monitor,
        lambda: {
            "job": plan.job,
            "kind": "send",
            "task": index,
            "receiver": plan.address,
            "partition_id": part.id,
            **stats,
            **_levels(part),
            **metrics,
        },
    )
    try:
        answer = _messages.send(
            plan.address,
            plan.env.secret,
            {
                "kind": "partition",
                "job": plan.job,
                "partition": index,
                "attempt": attempt,
                "address": env.address,
                "partition_id": part.id,
            },
            reply=True,
            timeout=REGISTER_TIMEOUT,
        )
        if answer.get("accept"):
            stats["accepted"] = True
            with cf.RecordWriter(part, cf.ForwardPartitioner()) as w:
                for batch in batches:
                    w.write(batch, timeout=plan.timeout)
                    stats["rows"] += batch.num_rows
                    stats["bytes"] += batch.nbytes
            part.wait_consumed(timeout=plan.timeout)
            if answer.get("confirm"):
                _confirm(plan, index)
    finally:
        reporter.stop()
        part.release()
    stats["seconds"] = time.perf_counter() - start
    return stats


def _confirm(plan: _SendPlan, index: int) -> None:
    """Asks a spilling receiver whether it kept partition ``index`` whole; raises if not.
    Its reader may have stopped reading (a full spill directory, ``max_spill``) and cancelled
    the channel, which drops the rest of what the task wrote without an error here."""
    answer = _messages.send(
        plan.address,
        plan.env.secret,
        {"kind": "delivered", "job": plan.job, "partition": index},
        reply=True,
        timeout=REGISTER_TIMEOUT * 2,
    )
    if not answer.get("ok"):
        reason = answer.get("reason")
        raise RuntimeError(f"the receiver at {plan.address} did not keep partition {index}: {reason}")


def _levels(part: cf.ResultPartition) -> dict[str, Any]:
    m = part.metrics()
    return {
        "out_pool_usage": m["out_pool_usage"],
        "backpressured_ms_per_second": m["backpressured_ms_per_second"],
        "level": m["level"],
        "backpressured_total": m["backpressured_total"],
    }


def _send_task(plan: _SendPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    ctx = TaskContext.get()
    assert ctx is not None, "runs inside a Spark task"
    host = host_towards(plan.address)
    if plan.app_id is None:
        with task_environment(plan.env, host) as env:
            stats = _stream_partition(env, plan, ctx.partitionId(), ctx.attemptNumber(), batches)
    else:
        with host_environment(plan.env, host, plan.app_id, plan.host_memory) as attached:
            stats = _stream_partition(attached, plan, ctx.partitionId(), ctx.attemptNumber(), batches)
    yield pa.RecordBatch.from_pylist([stats], schema=_stats_arrow_schema())


def _stats_arrow_schema() -> pa.Schema:
    return pa.schema(
        [
            ("partition", pa.int32()),
            ("attempt", pa.int32()),
            ("accepted", pa.bool_()),
            ("rows", pa.int64()),
            ("bytes", pa.int64()),
            ("seconds", pa.float64()),
        ]
    )


def _send_from_driver(df: DataFrame, plan: _SendPlan) -> dict[str, Any]:
    table = df.toArrow()
    _register_job(plan, 1)
    host = host_towards(plan.address)
    bind = "127.0.0.1:0" if host == "127.0.0.1" else f"{host}:0"
    with cf.NetworkEnvironment(
        memory=plan.env.memory,
        segment_size=plan.env.segment_size,
        bind=bind,
        secret=plan.env.secret,
        wire_compression=plan.env.wire_compression,
        tls=plan.env.tls.config() if plan.env.tls is not None else None,
    ) as env:
        try:
            stats = _stream_partition(env, plan, 0, 0, iter(table.to_batches()))
        except BaseException as exc:
            _tell_job_failed(plan.address, plan.env.secret, plan.job, exc)
            raise
    return stats
