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
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame

import creditflow as cf
from creditflow.metrics import EnvMetrics
from creditflow.spark import _messages
from creditflow.spark._driver import prepare
from creditflow.spark._messages import Closeable
from creditflow.spark._process import EnvSettings, host_towards, metrics_url_of, task_environment
from creditflow.spark.monitor import Monitor, MonitorHandle, Reporter

#: How long a registration waits for the receiver's answer.
REGISTER_TIMEOUT = 30.0
#: How often blocked receiver threads look whether the receiver closed.
_POLL = 0.1


class _Failed:
    """A queued failure: raised by the consumer's thread when it reaches it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


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
            channels stop returning credit and the Spark tasks block.
        timeout: Longest :meth:`next`/iteration waits for a batch, in seconds (None: no limit).

    Iterate it (or call :meth:`next`) to get ``pyarrow.RecordBatch`` objects, in the order
    they arrive (partitions interleave); iteration ends once the job that registered with
    it delivered every partition.
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
    ) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
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
        )
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queued)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._job: str | None = None
        self._num_partitions: int | None = None
        self._accepted: dict[int, str] = {}
        self._ended: set[int] = set()
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
                self._put(_Failed(cf.ProducerFailedError(f"the Spark job failed: {msg.get('error')}")))
            return None
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
                return {"accept": True}
        if end:
            self._put(_END)
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

    def _read(self, index: int, spec: cf.ChannelSpec) -> None:
        try:
            with self._env.create_input_gate([spec]) as gate:
                while not self._closed.is_set():
                    try:
                        batch = gate.next(timeout=_POLL * 10)
                    except cf.TimeoutError:
                        continue
                    if batch is None:
                        break
                    if not self._put(batch):
                        return
        except Exception as exc:
            self._put(_Failed(exc))
            return
        with self._lock:
            self._ended.add(index)
            end = self._all_ended()
        if end:
            self._put(_END)

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
        and the task's error if a partition failed."""
        limit = self._timeout if timeout is None else timeout
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
        while (batch := self.next()) is not None:
            yield batch

    def metrics(self) -> EnvMetrics:
        """The receiver's environment metrics (see :meth:`creditflow.NetworkEnvironment.metrics`)."""
        return self._env.metrics()

    def close(self) -> None:
        """Stops receiving; open channels are cancelled. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._inbox.close()
        for t in list(self._readers):
            t.join()
        self._env.close()


@dataclass(frozen=True)
class _SendPlan:
    job: str
    address: str
    env: EnvSettings
    timeout: float | None
    monitor: MonitorHandle | None


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
    timeout: float | None = 600.0,
    monitor: Monitor | None = None,
) -> list[dict[str, Any]]:
    """Streams ``df`` to the :class:`Receiver` at ``address``; returns when it has it all.

    With ``via="executors"`` (the default) every task streams its partition straight from
    its executor as Spark computes it, with backpressure from the receiver reaching the
    computation; ``memory`` bounds what each task holds in flight. With ``via="driver"`` the
    driver collects ``df.toArrow()`` (the whole result in driver memory) and streams that.

    ``timeout`` bounds each wait for buffer space or for the receiver to finish reading, in
    seconds. Returns one dict per partition: ``partition``, ``attempt``, ``accepted``,
    ``rows``, ``bytes``, ``seconds``. Raises what the job raised, after telling the
    receiver (which then raises too).
    """
    if via not in ("executors", "driver"):
        raise ValueError(f'via must be "executors" or "driver", got {via!r}')
    job = uuid.uuid4().hex[:12]
    settings = EnvSettings(secret=secret, memory=memory, segment_size=segment_size)
    plan = _SendPlan(job, address, settings, timeout, monitor.handle if monitor is not None else None)
    if via == "driver":
        return [_send_from_driver(df, plan)]
    try:
        # On Connect this runs a probe job over df, which fails where the job would.
        n = prepare(df)
    except BaseException as exc:
        _messages.send(address, secret, {"kind": "job_failed", "job": job, "error": str(exc)[:2000]})
        raise
    _register_job(plan, n)
    try:

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return _send_task(plan, batches)

        rows = df.mapInArrow(run, _STATS_SCHEMA).collect()
    except BaseException as exc:
        _messages.send(address, secret, {"kind": "job_failed", "job": job, "error": str(exc)[:2000]})
        raise
    return [r.asDict() for r in sorted(rows, key=lambda r: (r.partition, r.attempt))]


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
    env: cf.NetworkEnvironment,
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
    served = metrics_url_of(env) if plan.monitor is not None and plan.monitor.metrics else None
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
    finally:
        reporter.stop()
        part.release()
    stats["seconds"] = time.perf_counter() - start
    return stats


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
    with task_environment(plan.env, host) as env:
        stats = _stream_partition(env, plan, ctx.partitionId(), ctx.attemptNumber(), batches)
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
        memory=plan.env.memory, segment_size=plan.env.segment_size, bind=bind, secret=plan.env.secret
    ) as env:
        try:
            stats = _stream_partition(env, plan, 0, 0, iter(table.to_batches()))
        except BaseException as exc:
            _messages.send(
                plan.address, plan.env.secret, {"kind": "job_failed", "job": plan.job, "error": str(exc)}
            )
            raise
    return stats
