"""The driver and task side of :func:`creditflow.spark.send`.

Each task creates a partition in its worker's environment with one subpartition per
receiver and registers it (an authenticated control message). To one receiver it writes its
batches as Spark computes them, after the rows the receiver says it has (from an attempt that
broke). To W ranks it writes its partition in stripes (:mod:`creditflow.spark._stripes`): it
first asks rank 0 for the partition (rank 0 grants it to one attempt at a time, and never to
an attempt older than one it granted), then registers with every rank, each of which answers
how many rows of its share it already has (from an attempt that broke), and those are
skipped. Either way a retried attempt must compute the same rows in the same order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import multiprocessing
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame

import creditflow as cf
from creditflow.samples import TaskSample
from creditflow.spark import _messages
from creditflow.spark._intake import REGISTER_TIMEOUT
from creditflow.spark._process import EnvSettings, host_towards, metrics_url_of, task_environment, task_stack
from creditflow.spark._resume import Points
from creditflow.spark._stripes import for_ranks, partition_row
from creditflow.spark._watch import ReaderWatch
from creditflow.spark.monitor import MonitorHandle, Reporter

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SendPlan:
    """Everything a task needs (shipped in the closure)."""

    job: str
    #: The receivers: one, or one per rank in rank order.
    addresses: tuple[str, ...]
    #: Whether the receivers are ranks (a list was given, or the one receiver is a rank).
    ranks: bool
    env: EnvSettings
    timeout: float | None
    monitor: MonitorHandle | None
    #: The micro-batch this job delivers and its streaming query (``send(batch_id=...)``, the
    #: sink): a continuous receiver delivers each micro-batch of a stream once.
    batch_id: int | None = None
    stream: str | None = None
    #: Whether the receiver is a continuous one (the job then commits when it succeeded), and
    #: whether it already has this micro-batch (the job is skipped).
    continuous: bool = False
    replay: bool = False
    #: The application whose host services the tasks attach to, and its host memory (bytes);
    #: None: an environment per task.
    app_id: str | None = None
    host_memory: int = 0

    def tags(self) -> dict[str, Any]:
        """The job's micro-batch, for the messages to a continuous receiver."""
        return {"batch_id": self.batch_id, "stream": self.stream} if self.batch_id is not None else {}


#: The one row each sending task returns to the driver. ``bytes`` counts its batches' buffers
#: (``get_total_buffer_size``): for Spark's batches, which are never slices, what ``nbytes``
#: says within a few bytes of padding, at a fiftieth of its cost per batch.
STATS_SCHEMA = "partition int, attempt int, accepted boolean, rows long, bytes long, seconds double"


def stats_arrow_schema() -> pa.Schema:
    """:data:`STATS_SCHEMA` in Arrow."""
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


def tell_job_failed(plan: SendPlan, exc: BaseException) -> None:
    """Tells every receiver that the job failed with ``exc``, best effort: a receiver that is
    gone or unreachable is logged, so that the caller raises the job's own error."""
    for address in plan.addresses:
        try:
            _messages.send(
                address, plan.env.secret, {"kind": "job_failed", "job": plan.job, "error": cause_of(exc)}
            )
        except (OSError, EOFError, multiprocessing.AuthenticationError) as notice:
            _log.warning(
                "creditflow: could not tell the receiver at %s that the job failed: %s", address, notice
            )


#: The last line of a Python traceback: the exception a task raised, and its message.
_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$", re.MULTILINE)


def cause_of(exc: BaseException, limit: int = 2000) -> str:
    """What a failed job says went wrong, in a line or so: the last exception a Python task
    raised (a JVM error wraps its whole traceback, with the task's exception at its end),
    else the start of the message."""
    text = str(exc)
    raised = [r for r in _RAISED.findall(text) if not r[0].startswith(("org.", "java.", "scala.", "py4j."))]
    if raised:
        name, message = raised[-1]
        return f"{name.rsplit('.', 1)[-1]}: {message}"[:limit]
    return text[:limit]


def receiver_at(plan: SendPlan, rank: int) -> str:
    """The receiver of ``rank`` as messages name it, with its address."""
    who = f"rank {rank}'s receiver" if plan.ranks else "the receiver"
    return f"{who} at {plan.addresses[rank]}"


def register_job(plan: SendPlan, num_partitions: int) -> SendPlan:
    """Registers the job with every receiver; returns the plan, with ``ranks`` set when a
    single address turned out to be a rank (of one). Raises ValueError naming a receiver
    that refuses, ConnectionError naming one that cannot be reached."""
    for rank, address in enumerate(plan.addresses):
        message: dict[str, Any] = {
            "kind": "job",
            "job": plan.job,
            "num_partitions": num_partitions,
            **plan.tags(),
        }
        if plan.ranks:
            message.update(world_size=len(plan.addresses), rank=rank, ranks=list(plan.addresses))
        if plan.monitor is not None:
            message["monitor"] = dataclasses.asdict(plan.monitor)
        who = receiver_at(plan, rank)
        try:
            answer = _messages.request(address, plan.env.secret, message, timeout=REGISTER_TIMEOUT)
        except (OSError, EOFError, multiprocessing.AuthenticationError) as exc:
            raise ConnectionError(f"cannot reach {who}: {type(exc).__name__}: {exc}") from exc
        if not answer.get("accept"):
            raise ValueError(f"{who} refused the job: {answer.get('reason')}")
        if not plan.ranks and answer.get("world_size") == 1:
            # A rank of one given as a plain address: its partitions go to it as to a rank.
            plan = dataclasses.replace(plan, ranks=True)
        if answer.get("continuous"):
            plan = dataclasses.replace(plan, continuous=True, replay=bool(answer.get("replay")))
    if plan.batch_id is not None and not plan.continuous:
        error = ValueError(
            f"batch_id={plan.batch_id}: the receiver at {plan.addresses[0]} is not a continuous one; "
            "exactly-once micro-batches need Receiver(continuous=True)"
        )
        tell_job_failed(plan, error)
        raise error
    return plan


def is_replay(plan: SendPlan) -> bool:
    """Whether the receiver already has the plan's micro-batch (asked before the job computes
    anything). False for a plan without a micro-batch, and for a receiver that is not a
    continuous one (registering then says why)."""
    if plan.batch_id is None:
        return False
    answer = _register(plan, 0, {"kind": "seen", **plan.tags()})
    return bool(answer.get("replay"))


def tell_job_committed(plan: SendPlan, attempts: Mapping[int, int]) -> dict[str, Any]:
    """Commits the job at a continuous receiver: ``attempts`` names the attempt of each
    partition that Spark kept, and the receiver hands those to its consumer (or drops them as
    a replay). Raises RuntimeError with the receiver's reason when it cannot (an attempt it
    did not receive whole)."""
    chosen = {str(p): int(a) for p, a in attempts.items()}
    message = {"kind": "commit", "job": plan.job, "attempts": chosen, **plan.tags()}
    answer = _register(plan, 0, message, timeout=3 * REGISTER_TIMEOUT)
    if not answer.get("ok"):
        raise RuntimeError(
            f"the receiver at {plan.addresses[0]} did not commit the job: {answer.get('reason')}"
        )
    return answer


def _register(
    plan: SendPlan, rank: int, message: dict[str, Any], timeout: float = REGISTER_TIMEOUT
) -> dict[str, Any]:
    try:
        return _messages.request(plan.addresses[rank], plan.env.secret, message, timeout=timeout)
    except (OSError, EOFError) as exc:
        raise ConnectionError(f"{receiver_at(plan, rank)} went away: {type(exc).__name__}: {exc}") from exc


def _granted(plan: SendPlan, message: dict[str, Any]) -> dict[str, Any]:
    """The receiver's (rank 0's) grant of the partition to this attempt. While another
    attempt's stream is being received, the receiver holds the answer until that stream
    settles (it ended: this attempt continues after what the ranks have, which may be
    nothing, or, at a continuous receiver, sends nothing; it broke: this one takes over),
    then asks again, up to ``plan.timeout``."""
    deadline = None if plan.timeout is None else time.monotonic() + plan.timeout
    while True:
        answer = _register(plan, 0, message)
        if answer.get("accept") or not answer.get("retry"):
            return answer
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(
                f"partition {message['partition']}: another attempt was still being received after "
                f"{plan.timeout} s: {answer.get('reason')}"
            )


def end_job(plan: SendPlan, stats: list[dict[str, Any]]) -> None:
    """The job succeeded with ``stats`` (one per partition, the attempt Spark kept): a
    continuous receiver commits those attempts, the others check their rows and end."""
    if plan.continuous:
        tell_job_committed(plan, {s["partition"]: s["attempt"] for s in stats})
    else:
        tell_job_done(plan, stats)


def tell_job_done(plan: SendPlan, stats: list[dict[str, Any]]) -> None:
    """Tells every receiver that the job succeeded, with each partition's rows (what its
    successful attempt went through): a receiver's stream ends only then, as a task whose
    input ended early (an upstream Python worker that died) ends its stream cleanly too (a
    rank's retried attempt then continues it). A receiver that is still reading answers
    ``pending`` and is asked again, up to ``plan.timeout``. Raises ConnectionError naming a
    receiver that cannot be reached, RuntimeError naming one that does not have its rows."""
    rows = {str(s["partition"]): int(s["rows"]) for s in stats}
    message = {"kind": "job_done", "job": plan.job, "rows": rows}
    deadline = None if plan.timeout is None else time.monotonic() + plan.timeout
    for rank in range(len(plan.addresses)):
        where = receiver_at(plan, rank)
        while (answer := _register(plan, rank, message)).get("pending"):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{where} was still reading after {plan.timeout} s")
            time.sleep(0.05)
        if not answer.get("ok"):
            raise RuntimeError(f"{where} did not get all rows: {answer.get('reason')}")


def stream_partition(
    env: cf.NetworkEnvironment | cf.Attachment,
    plan: SendPlan,
    index: int,
    attempt: int,
    batches: Iterator[pa.RecordBatch],
) -> dict[str, Any]:
    """Registers partition ``index`` with the receivers and writes ``batches`` to them;
    returns once they have read everything (or turned this attempt away)."""
    start = time.perf_counter()
    world = len(plan.addresses)
    part = env.create_partition(f"cf-send/{plan.job}/{index}/{attempt}/{uuid.uuid4().hex[:6]}", world)
    stats: dict[str, Any] = {"partition": index, "attempt": attempt, "accepted": False, "rows": 0, "bytes": 0}
    served = metrics_url_of(env) if plan.monitor is not None and plan.monitor.metrics else None
    reporter = Reporter(
        plan.monitor,
        lambda: TaskSample.of_partition(
            part,
            job=plan.job,
            kind="send",
            task=index,
            rows_written=stats["rows"],
            bytes_written=stats["bytes"],
            receiver=",".join(plan.addresses),
            metrics_url=served,
        ),
    )
    try:
        message: dict[str, Any] = {
            "kind": "partition",
            "job": plan.job,
            "partition": index,
            "attempt": attempt,
            "address": env.address,
            "partition_id": part.id,
            **plan.tags(),
        }
        answers = [_granted(plan, message)]
        if plan.ranks and answers[0].get("accept"):
            grant = answers[0]["grant"]
            answers += [_register(plan, r, {**message, "grant": grant}) for r in range(1, world)]
        writer = cf.RecordWriter(part, cf.ForwardPartitioner())
        refused = [(r, a) for r, a in enumerate(answers) if not a.get("accept")]
        if refused:
            # Turned away: the receiver (rank 0) knows of a newer attempt (fail what the
            # other ranks accepted), or its stream failed or closed.
            rank, answer = refused[0]
            by = f"rank {rank}" if plan.ranks else "the receiver"
            why = f"partition {index}, attempt {attempt}: turned away by {by}: {answer.get('reason')}"
            writer.fail(why)
            if not plan.continuous:
                # Fail the task: succeeding with nothing sent would leave Spark no attempt
                # that delivers the partition (the newer one may yet break).
                raise RuntimeError(why)
            return _finish(stats, start)
        stats["accepted"] = True
        who = lambda r: f"partition {index}: {receiver_at(plan, r)}"  # noqa: E731
        with ReaderWatch(part, plan.addresses, plan.env.secret, who, plan.env.peer_timeout) as watch:
            batches = watch.guard(batches)
            if plan.ranks:
                _write_stripes(writer, plan, index, batches, answers, stats)
            else:
                _write_all(writer, plan, index, attempt, batches, stats, int(answers[0].get("skip", 0)))
            writer.close()
            part.wait_consumed(timeout=plan.timeout)
        for rank, answer in enumerate(answers):
            if answer.get("confirm"):
                _confirm(plan, rank, index, answer.get("grant"), attempt)
    except cf.ConnectionLostError as exc:
        raise ConnectionError(f"partition {index}: {_who_went_away(plan, exc)}") from exc
    finally:
        reporter.stop()
        part.release()
    return _finish(stats, start)


def _write_all(
    writer: cf.RecordWriter,
    plan: SendPlan,
    index: int,
    attempt: int,
    batches: Iterator[pa.RecordBatch],
    stats: dict[str, Any],
    skip: int,
) -> None:
    """Writes the partition to the one receiver, without its first ``skip`` rows (the
    receiver has them from an attempt that broke). When computing it fails, the channel ends
    with that failure, and the receiver is also told on the control channel (its reader may
    not have reached the channel yet): it stops reading this attempt, and Spark's next attempt
    takes over (continuing after the rows delivered, or, at a continuous receiver, which drops
    the attempt, from the start)."""
    points = Points(skip)
    try:
        for batch in batches:
            start = stats["rows"]
            stats["rows"] += batch.num_rows
            stats["bytes"] += batch.get_total_buffer_size()
            due = points.see(batch, start)
            if due is not None:
                _check_resume(plan, 0, index, {"attempt": attempt}, due)
            cut = skip - start  # rows of this batch the receiver has
            if cut < batch.num_rows:
                writer.write(batch.slice(cut) if cut > 0 else batch, timeout=plan.timeout)
    except BaseException as exc:
        why = f"the task failed: {type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            writer.fail(why)
        message = {"kind": "attempt_failed", "job": plan.job, "partition": index, "attempt": attempt}
        with contextlib.suppress(OSError, EOFError, TimeoutError, multiprocessing.AuthenticationError):
            _register(plan, 0, {**message, "error": why[:2000]})
        raise


def _check_resume(
    plan: SendPlan, rank: int, index: int, attempt: dict[str, int], digests: list[list[object]]
) -> None:
    """Sends a receiver this attempt's ``digests`` of the rows it has of the partition (of the
    rank's share) at the check's points (:class:`creditflow.spark._resume.Points`); raises if
    the receiver had other rows there (the rows differ between attempts). ``attempt`` names
    the attempt, or its grant."""
    message = {"kind": "resume_check", "job": plan.job, "partition": index, **attempt, "digests": digests}
    answer = _register(plan, rank, message)
    if not answer.get("ok"):
        why = answer.get("reason")
        raise RuntimeError(f"{receiver_at(plan, rank)} cannot continue partition {index}: {why}")


def _finish(stats: dict[str, Any], start: float) -> dict[str, Any]:
    stats["seconds"] = time.perf_counter() - start
    return stats


def _who_went_away(plan: SendPlan, exc: BaseException) -> str:
    """The receiver a broken channel led to, by rank where it can be told."""
    text = str(exc)
    for rank, address in enumerate(plan.addresses):
        if address.rpartition(":")[0] in text or f"subpartition {rank}" in text:
            break
    if len(plan.addresses) == 1:
        return f"the receiver at {plan.addresses[0]} went away: {text}"
    return f"a rank's receiver went away ({text}); ranks: " + ", ".join(
        f"{r}={a}" for r, a in enumerate(plan.addresses)
    )


def _write_stripes(
    writer: cf.RecordWriter,
    plan: SendPlan,
    index: int,
    batches: Iterator[pa.RecordBatch],
    answers: list[dict[str, Any]],
    stats: dict[str, Any],
) -> None:
    """Writes the partition's stripes to their ranks, each rank's of an input batch joined
    into batches of the bytes its answer asks for (``join``; none: a stripe a batch), without
    the first ``skip`` rows of its share (it has them from an attempt that broke)."""
    world = len(plan.addresses)
    skip = [int(a.get("skip", 0)) for a in answers]
    join = [int(a.get("join", 0)) for a in answers]
    sent = [0] * world
    # The rows each rank has of its share are checked before anything after them is written.
    points = {
        r: Points(n, functools.partial(partition_row, index, r, world)) for r, n in enumerate(skip) if n
    }
    row = 0
    for batch in batches:
        for rank, check in points.items():
            due = check.see(batch, row)
            if due is not None:
                _check_resume(plan, rank, index, {"grant": int(answers[rank]["grant"])}, due)
        for rank, rows in for_ranks(batch, row, index, skip, sent, join):
            writer.write(rows, timeout=plan.timeout, subpartition=rank)
        row += batch.num_rows
        stats["rows"] += batch.num_rows
        stats["bytes"] += batch.get_total_buffer_size()


def _confirm(plan: SendPlan, rank: int, index: int, grant: object, attempt: int) -> None:
    """Asks a receiver whether it kept partition ``index`` whole; raises if not. Its reader
    may have stopped reading (a full spill directory, ``max_spill``) and cancelled the
    channel, which drops the rest of what the task wrote without an error here."""
    message = {"kind": "delivered", "job": plan.job, "partition": index, "grant": grant, "attempt": attempt}
    answer = _register(plan, rank, message, timeout=REGISTER_TIMEOUT * 2)
    if not answer.get("ok"):
        reason = answer.get("reason")
        raise RuntimeError(f"{receiver_at(plan, rank)} did not keep partition {index}: {reason}")


def send_task(plan: SendPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A Spark task of :func:`send`: its partition to the receivers."""
    ctx = TaskContext.get()
    assert ctx is not None, "runs inside a Spark task"
    with task_stack(plan.env, host_towards(plan.addresses[0]), plan.app_id, plan.host_memory) as stack:
        stats = stream_partition(stack, plan, ctx.partitionId(), ctx.attemptNumber(), batches)
    yield pa.RecordBatch.from_pylist([stats], schema=stats_arrow_schema())


def send_from_driver(df: DataFrame, plan: SendPlan) -> list[dict[str, Any]]:
    """``df.toArrow()`` on the driver, streamed as one partition from an environment of this
    process (:func:`creditflow.spark._process.task_environment`, as a task's)."""
    table = df.toArrow()
    plan = register_job(plan, 1)
    if plan.replay:
        return []
    with task_environment(plan.env, host_towards(plan.addresses[0])) as env:
        try:
            stats = stream_partition(env, plan, 0, 0, iter(table.to_batches()))
        except BaseException as exc:
            tell_job_failed(plan, exc)
            raise
    end_job(plan, [stats])
    return [stats]


def addresses_of(addresses: str | Sequence[str]) -> tuple[tuple[str, ...], bool]:
    """The receivers' addresses, and whether they are ranks (a list, even of one)."""
    if isinstance(addresses, str):
        return (addresses,), False
    out = tuple(addresses)
    if not out or not all(isinstance(a, str) for a in out):
        raise ValueError(f"addresses must be an address or a non-empty list of addresses, got {addresses!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"every rank needs its own receiver; addresses repeat: {list(out)}")
    return out, True
