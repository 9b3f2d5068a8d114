"""``mapInArrow`` functions that break a Spark task's first attempt, for the tests of what
Spark's retry does next."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext

MapFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def kill_first_attempt(partition: int, after: int) -> MapFunction:
    """Passes batches through; in attempt 0 of task ``partition``, the Python worker kills
    itself (SIGKILL, as a lost executor's would go) right after yielding batch ``after``."""

    def func(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None
        for i, b in enumerate(batches):
            yield b
            if ctx.partitionId() == partition and ctx.attemptNumber() == 0 and i == after:
                os.kill(os.getpid(), signal.SIGKILL)

    return func


def fail_first_attempt(partition: int, at: int) -> MapFunction:
    """Passes batches through; attempt 0 of task ``partition`` raises at batch ``at`` (an
    upstream function's failure: a downstream task's input then ends early, cleanly)."""

    def func(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None
        for i, b in enumerate(batches):
            if ctx.partitionId() == partition and ctx.attemptNumber() == 0 and i == at:
                raise RuntimeError("upstream failure in attempt 0")
            yield b

    return func


def reversed_after_first_attempt(partition: int, at: int, delivered: Path) -> MapFunction:
    """Attempt 0 of task ``partition`` raises at batch ``at`` (as :func:`fail_first_attempt`),
    once the file ``delivered`` exists (the test's consumer has rows of it: a retry then has
    rows to continue after); every later attempt of every task gives each batch's rows in
    reverse order: another order, as a partition computed again after a shuffle may have."""

    def func(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None
        retried = ctx.attemptNumber() > 0
        for i, b in enumerate(batches):
            if ctx.partitionId() == partition and not retried and i == at:
                deadline = time.monotonic() + 60
                while not delivered.exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
                raise RuntimeError("upstream failure in attempt 0")
            yield b.take(pa.array(range(b.num_rows - 1, -1, -1))) if retried else b

    return func
