"""``TaskSample``: the live metrics one Spark task of creditflow reports, as
:class:`creditflow.spark.Monitor` keeps them and :func:`creditflow.tools.pipeline.from_spark` draws
them. One record for the tasks of ``exchange`` and of ``send``: what a task *wrote* into its
partition and what its gate *received*, under those names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["TaskSample"]


class _Partition(Protocol):
    def metrics(self) -> Any: ...


@dataclass
class TaskSample:
    """One sample of one task."""

    #: The exchange's or send's id.
    job: str
    #: ``"exchange"`` or ``"send"``.
    kind: str
    #: The task's partition index.
    task: int
    #: Its creditflow partition.
    partition_id: str = ""
    #: What the task wrote into its partition (an exchange: its input, split by key).
    rows_written: int = 0
    bytes_written: int = 0
    #: What its gate received (an exchange's output; 0 for a send task).
    rows_received: int = 0
    bytes_received: int = 0
    #: Seconds its writer spent in ``write`` (an exchange).
    write_seconds: float = 0.0
    #: The partition's metrics, under their Rust names (:mod:`creditflow.metrics`).
    out_pool_usage: float = 0.0
    backpressured_ms_per_second: float = 0.0
    level: str = "OK"
    backpressured_total: float = 0.0
    #: The gate's metrics (an exchange); None without a gate.
    in_pool_usage: float | None = None
    idle_ms_per_second: float = 0.0
    idle_total: float = 0.0
    #: Bytes received from each task, by task index (an exchange).
    channel_bytes: list[int] = field(default_factory=list)
    #: An exchange's partition kind (``"pipelined"``, ``"hybrid"``).
    partition_kind: str | None = None
    #: A send's receiver address(es), comma-separated.
    receiver: str | None = None
    #: The task environment's ``/metrics`` URL, when served.
    metrics_url: str | None = None
    #: When it was taken (``time.time()``), whether the task had ended, the worker's RSS.
    time: float = 0.0
    done: bool = False
    rss_bytes: int = 0
    rss_start_bytes: int = 0

    @classmethod
    def of_partition(cls, part: _Partition, **fields: Any) -> TaskSample:
        """A sample with ``part``'s pool, backpressure and level, and ``fields``."""
        m = part.metrics()
        return cls(
            out_pool_usage=float(m["out_pool_usage"]),
            backpressured_ms_per_second=float(m["backpressured_ms_per_second"]),
            level=str(m["level"]),
            backpressured_total=float(m["backpressured_total"]),
            **fields,
        )

    @property
    def key(self) -> tuple[str, str, int]:
        """What tells this task's samples from the others': its job, ``"rank"`` for a
        training rank (whose number may be a task's too) or ``"task"``, and its number."""
        return (self.job, "rank" if self.kind == "rank" else "task", self.task)

    def to_message(self) -> dict[str, Any]:
        """The sample as a JSON-able dict (what a task sends to the monitor)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> TaskSample:
        """A sample from :meth:`to_message`'s dict (unknown keys are left out)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in message.items() if k in names})
