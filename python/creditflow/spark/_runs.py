"""A rank's copy of its rows for the epochs after the first: a hybrid partition of the rank's
own environment with ``replay`` (what does not fit in its memory spills to ``spill_dir``,
bounded by ``max_spill``), one subpartition (a *run*) per Spark partition, holding that
partition's share of the rank in row order.

A run is read from its start by a local gate of its own, so an epoch can read the runs in any
order and interleave a few; :class:`RunReader` cuts a run into stripe-sized chunks, whatever
the batch boundaries it was written with, so an epoch's order depends only on the rows.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

import creditflow as cf
from creditflow.metrics import SpillMetrics
from creditflow.spark._rankstate import RowSet
from creditflow.spark._stripes import STRIPE_ROWS, share_ids


class Runs:
    """``partitions`` runs in a hybrid replaying partition."""

    def __init__(self, env: cf.NetworkEnvironment, partitions: int, rank: int, world: int) -> None:
        self._env = env
        self.partitions = partitions
        self.rank = rank
        self.world = world
        self._part = env.create_partition(
            f"cf-rank/{uuid.uuid4().hex[:12]}", max(partitions, 1), kind="hybrid", replay=True
        )
        self._writer = cf.RecordWriter(self._part, cf.ForwardPartitioner())
        self._lock = threading.Lock()
        #: Rows stored per run.
        self.rows = [0] * partitions

    def put(self, run: int, batch: pa.RecordBatch) -> None:
        """Appends ``batch`` to ``run``. Raises :class:`creditflow.SpillError` when it cannot
        be kept (``max_spill``)."""
        if batch.num_rows == 0:
            return
        with self._lock:
            self._writer.write(batch, subpartition=run)
            self.rows[run] += batch.num_rows

    def end(self) -> None:
        """No more rows."""
        with self._lock:
            self._writer.close()

    def fail(self, message: str) -> None:
        """Fails the store: readers raise."""
        self._writer.fail(message)

    def ids(self, run: int, start: int, count: int) -> np.ndarray:
        """The ids of rows ``start .. start + count`` of ``run``."""
        return share_ids(run, self.rank, self.world, start, count)

    def read(self, run: int, timeout: float | None) -> RunReader:
        """A reader of ``run`` from its start."""
        gate = self._env.create_input_gate([cf.ChannelSpec(self._env.address, self._part.id, run)])
        return RunReader(self, run, gate, timeout)

    def metrics(self) -> SpillMetrics:
        """The store: what it holds in memory and on disk, and what it spilled."""
        spill = self._part.metrics()["spill"]
        assert spill is not None, "a hybrid partition has a store"
        return spill

    def release(self) -> None:
        """Drops the rows and removes the spill file. Idempotent."""
        self._part.release()


class RunReader:
    """One run from its start, in chunks of :data:`STRIPE_ROWS` rows (the last may be
    shorter), each with its rows' ids, leaving out the ids in ``skip``."""

    def __init__(self, runs: Runs, run: int, gate: cf.InputGate, timeout: float | None) -> None:
        self._runs = runs
        self.run = run
        self._gate = gate
        self._timeout = timeout
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._offset = 0
        self._ended = False

    def chunks(self, skip: RowSet | None = None) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
        """The run's rows, chunk by chunk, without the ids in ``skip``."""
        try:
            while True:
                while not self._ended and self._buffered < STRIPE_ROWS:
                    batch = self._gate.next(timeout=self._timeout)
                    if batch is None:
                        self._ended = True
                    elif batch.num_rows:
                        self._buffer.append(batch)
                        self._buffered += batch.num_rows
                if self._buffered == 0:
                    return
                k = min(STRIPE_ROWS, self._buffered)
                batch = self._cut(k)
                ids = self._runs.ids(self.run, self._offset, k)
                self._offset += k
                if skip is not None:
                    keep = ~skip.contains(ids)
                    if not keep.all():
                        batch = batch.filter(pa.array(keep))
                        ids = ids[keep]
                yield batch, ids
        finally:
            self._gate.close()

    def _cut(self, k: int) -> pa.RecordBatch:
        """The first ``k`` buffered rows (a slice when one batch holds them)."""
        first = self._buffer[0]
        if first.num_rows >= k:
            rest = first.slice(k)
            self._buffer = ([rest] if rest.num_rows else []) + self._buffer[1:]
            self._buffered -= k
            return first.slice(0, k)
        table = pa.Table.from_batches(self._buffer).combine_chunks()
        rest_table = table.slice(k)
        self._buffer = rest_table.to_batches() if rest_table.num_rows else []
        self._buffered -= k
        return table.slice(0, k).to_batches()[0]
