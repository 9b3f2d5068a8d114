"""The ``creditflow`` streaming sink: ``df.writeStream.format("creditflow")`` into a
``Receiver(continuous=True)``, through PySpark's Python data source API (PySpark 4.1+).

```python
spark.dataSource.register(CreditflowDataSource)
query = (
    df.writeStream.format("creditflow")
    .option("address", rx.address)
    .option("secret", rx.secret)
    .option("checkpointLocation", "/chk/q1")
    .start()
)
```

Each task of a micro-batch streams its Arrow batches straight to the receiver, as a task of
:func:`creditflow.spark.send` does (with backpressure), under a job named after the query,
its run and the micro-batch. The receiver withholds them until the micro-batch commits: Spark
calls :meth:`CreditflowStreamWriter.commit` on the driver once every task wrote, and that
hands the micro-batch to the consumer, or drops it when the receiver delivered that
micro-batch of the query already (a replay after a restart from the checkpoint).
:meth:`CreditflowStreamWriter.abort` drops it.

Options: ``address`` and ``secret`` (the receiver's; required); ``memory`` (what each task
holds in flight, default ``16MiB``), ``segment_size`` (``32KiB``), ``timeout`` (seconds each
wait for the receiver may take, default 600), ``wire_compression`` (``lz4`` or ``zstd``),
``peer_timeout`` (seconds the receiver's host may acknowledge nothing before a task's
connection to it fails, default 30).
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from creditflow.spark import _messages
from creditflow.spark._driver import QUERY_ID_PROPERTY
from creditflow.spark._intake import REGISTER_TIMEOUT
from creditflow.spark._process import (
    EnvSettings,
    check_seconds,
    check_wire_compression,
    host_towards,
    task_environment,
)
from creditflow.spark._sending import SendPlan, stream_partition, tell_job_committed

#: The local properties Spark sets in the tasks of a micro-batch: its id, and the job group,
#: which is the query's run id (a new one at every start of the query).
BATCH_ID_PROPERTY = "streaming.sql.batchId"
RUN_ID_PROPERTY = "spark.jobGroup.id"

#: The options the sink takes.
OPTIONS = ("address", "secret", "memory", "segment_size", "timeout", "wire_compression", "peer_timeout")


def _seconds(options: dict[str, str], name: str, default: float, positive: bool = False) -> float:
    """Option ``name`` as seconds (``default`` when not given); ValueError naming it for
    anything but a number >= 0 (> 0 when ``positive``)."""
    text = options.get(name)
    if text is None:
        return default
    what = "a positive" if positive else "a non-negative"
    try:
        value = check_seconds(name, float(text))
    except ValueError:
        raise ValueError(f"{name} must be {what} number of seconds, got {text!r}") from None
    if positive and value == 0:
        raise ValueError(f"{name} must be {what} number of seconds, got {text!r}")
    return value


@dataclass
class Written(WriterCommitMessage):
    """What a task of the sink reports to the driver's commit: its micro-batch's job, its
    partition and attempt, and what it sent (``accepted`` False: the receiver had the
    partition already, or the whole micro-batch)."""

    job: str
    stream: str
    batch_id: int
    partition: int
    attempt: int
    accepted: bool
    rows: int
    bytes: int
    seconds: float


class CreditflowDataSource(DataSource):
    """The ``creditflow`` data source: a streaming sink into a ``Receiver(continuous=True)``
    (register it with ``spark.dataSource.register(CreditflowDataSource)``)."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``creditflow``."""
        return "creditflow"

    def streamWriter(self, schema: StructType, overwrite: bool) -> CreditflowStreamWriter:
        """The writer of a streaming query (checks the options on the driver first)."""
        return CreditflowStreamWriter(dict(self.options))


class CreditflowStreamWriter(DataSourceStreamArrowWriter):
    """Writes each micro-batch to the receiver: every task its partition
    (:meth:`write`), then the driver commits or aborts the micro-batch."""

    def __init__(self, options: dict[str, str]) -> None:
        options = {k.lower(): v for k, v in options.items()}
        unknown = sorted(k for k in options if k not in OPTIONS and k not in _SPARK_OPTIONS)
        if unknown:
            raise ValueError(
                f"the creditflow sink does not take the options {unknown}; it takes {list(OPTIONS)}"
            )
        missing = [k for k in ("address", "secret") if not options.get(k)]
        if missing:
            raise ValueError(
                f"the creditflow sink needs the options {missing}: the Receiver(continuous=True)'s "
                '.option("address", rx.address).option("secret", rx.secret)'
            )
        check_wire_compression(options.get("wire_compression"))
        self.address = options["address"]
        self.env = EnvSettings(
            secret=options["secret"],
            memory=options.get("memory", "16MiB"),
            segment_size=options.get("segment_size", "32KiB"),
            wire_compression=options.get("wire_compression"),
            tls=None,
            peer_timeout=_seconds(options, "peer_timeout", EnvSettings.peer_timeout),
        )
        self.timeout = _seconds(options, "timeout", 600.0, positive=True)

    def _plan(self, job: str, stream: str | None, batch_id: int | None) -> SendPlan:
        return SendPlan(
            job,
            (self.address,),
            False,
            self.env,
            self.timeout,
            None,
            batch_id=batch_id,
            stream=stream,
            continuous=True,
        )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        """A task: its partition of the micro-batch to the receiver."""
        ctx = TaskContext.get()
        assert ctx is not None, "runs inside a Spark task"
        stream = ctx.getLocalProperty(QUERY_ID_PROPERTY) or ""
        batch_id = int(ctx.getLocalProperty(BATCH_ID_PROPERTY) or -1)
        run = ctx.getLocalProperty(RUN_ID_PROPERTY) or ""
        plan = self._plan(f"{stream}/{run}/{batch_id}", stream, batch_id)
        with task_environment(plan.env, host_towards(self.address)) as env:
            stats = stream_partition(env, plan, ctx.partitionId(), ctx.attemptNumber(), iterator)
        return Written(job=plan.job, stream=stream, batch_id=batch_id, **stats)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The driver, once every task wrote: the receiver hands the micro-batch to its
        consumer (a replay is dropped there). Raises when it did not get it whole."""
        written = [m for m in messages if isinstance(m, Written)]
        if not written:
            return  # no task: nothing to hand over
        first = written[0]
        plan = self._plan(first.job, first.stream, batchId)
        tell_job_committed(plan, {m.partition: m.attempt for m in written})

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The driver, when a task failed: the receiver drops what it holds of the micro-batch."""
        written = [m for m in messages if isinstance(m, Written)]
        message: dict[str, object] = {
            "kind": "job_failed",
            "job": written[0].job if written else None,
            "error": f"Spark aborted micro-batch {batchId}",
        }
        if written:
            message.update(stream=written[0].stream, batch_id=batchId)
        # Best effort: a receiver that is gone holds nothing of the micro-batch any more.
        with contextlib.suppress(OSError, EOFError, multiprocessing.AuthenticationError):
            _messages.send(self.address, self.env.secret, message, timeout=REGISTER_TIMEOUT)


#: Options Spark passes to every sink along with the user's.
_SPARK_OPTIONS = ("path", "checkpointlocation", "queryname")
