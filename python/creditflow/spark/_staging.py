"""What a continuous receiver holds of a job before the job commits: each partition attempt's
batches in a spool of its own (a hybrid partition with replay, so that nothing is read before
the commit and what does not fit in ``memory`` spills), and how each attempt went.

One spool per attempt, not per job: the commit names the attempt of each partition that Spark
kept, and every other attempt is dropped with its spool, so no row of a broken attempt reaches
the consumer, even one that ended cleanly on this side (its task's input ended early).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa

import creditflow as cf
from creditflow.spark._spool import Spool


@dataclass
class Attempt:
    """One attempt of a partition: its spool and how it went."""

    index: int
    attempt: int
    spool: Spool
    state: Literal["reading", "done", "failed"] = "reading"
    reason: str | None = None
    rows: int = 0
    batches: int = 0
    settled: threading.Event = field(default_factory=threading.Event)

    def settle(self, reason: str | None) -> None:
        """Done whole (``reason`` None) or failed: a failed attempt's spool is dropped. The
        first word stands (the task's own word that it failed, then its reader's)."""
        if self.settled.is_set():
            return
        self.state = "done" if reason is None else "failed"
        self.reason = reason
        if reason is not None:
            self.spool.release()
        self.settled.set()


@dataclass
class Job:
    """A job (a ``send`` or a micro-batch of the ``creditflow`` sink) until it commits."""

    key: str
    #: The streaming query it belongs to and its micro-batch (None outside foreachBatch/sink).
    stream: str | None
    batch_id: int | None
    #: Every attempt of each partition, oldest first.
    partitions: dict[int, list[Attempt]] = field(default_factory=dict)
    #: Why the job was dropped (failed, aborted, a replay); None while it may commit.
    dropped: str | None = None
    #: The number of partitions ``send`` registered (the sink's tasks register on their own).
    num_partitions: int | None = None

    def attempt(self, index: int, number: int) -> Attempt | None:
        """Attempt ``number`` of partition ``index``, if it registered."""
        return next((a for a in self.partitions.get(index, []) if a.attempt == number), None)

    def drop(self, reason: str) -> list[Attempt]:
        """Drops the job (its attempts' spools are released by the caller, outside the lock);
        returns the attempts still holding data."""
        self.dropped = reason
        return [a for atts in self.partitions.values() for a in atts if a.state != "failed"]

    def rows(self) -> int:
        """Rows its delivered attempts hold."""
        return sum(a.rows for atts in self.partitions.values() for a in atts if a.state == "done")


def new_attempt(env: cf.NetworkEnvironment, index: int, attempt: int) -> Attempt:
    """An attempt of partition ``index`` with an empty spool that keeps everything until released."""
    return Attempt(index, attempt, Spool(env, replay=True))


def release(attempts: list[Attempt]) -> None:
    """Drops the attempts' spools (their spill files go too)."""
    for att in attempts:
        att.spool.release()


@dataclass
class Committed:
    """A committed job for the consumer: its partitions' delivered attempts, in partition order."""

    job: Job
    parts: list[Attempt]
    batches: int = 0

    def __post_init__(self) -> None:
        self.batches = sum(a.batches for a in self.parts)


@dataclass(frozen=True)
class JobDone:
    """The boundary after the last batch of a job, in the stream of a
    ``Receiver(continuous=True)`` (see :meth:`creditflow.spark.Receiver.items`).

    ``job`` is the job's id; ``stream`` the streaming query (its id) and ``batch_id`` the
    micro-batch, for a ``send(..., batch_id=...)`` or the ``creditflow`` sink (else None);
    ``rows`` and ``batches`` what the job delivered."""

    job: str
    stream: str | None
    batch_id: int | None
    rows: int
    batches: int


#: What a continuous receiver's stream holds: batches and the boundaries between jobs.
Item = pa.RecordBatch | JobDone
