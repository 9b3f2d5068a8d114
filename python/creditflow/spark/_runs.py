"""A rank's copy of its rows for the epochs after the first, in hybrid partitions of the rank's
own environment with ``replay`` (what does not fit in its memory spills to ``spill_dir``,
bounded by ``max_spill``):

* :class:`Runs`: one subpartition (a *run*) per Spark partition, holding that partition's
  share of the rank in row order; a row's id follows from its place (the stripe rule).
* :class:`MovedIn`: the rows other ranks gave this one at the end of epoch 0, each with its
  id in a column of its own (:data:`ID_COLUMN`), in the order they came: the givers' in rank
  order, each giver's rows by id.

A run is read from its start by a local gate of its own, so an epoch can read the runs in any
order and interleave a few; :class:`RunReader` cuts a run into stripe-sized chunks, whatever
the batch boundaries it was written with, so an epoch's order depends only on the rows.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Generator

import numpy as np
import pyarrow as pa

import creditflow as cf
from creditflow.metrics import SpillMetrics
from creditflow.spark._rankstate import RowSet
from creditflow.spark._stripes import ID_BITS, STRIPE_ROWS, share_ids

#: The column that carries a moved row's id (between ranks, and in :class:`MovedIn`).
ID_COLUMN = "__creditflow_row_id"

#: Rows chunk by chunk, each with its rows' ids; closing it closes its gates.
Chunks = Generator[tuple[pa.RecordBatch, np.ndarray], None, None]


def with_ids(batch: pa.RecordBatch, ids: np.ndarray) -> pa.RecordBatch:
    """``batch`` with its rows' ids as :data:`ID_COLUMN`."""
    return batch.append_column(ID_COLUMN, pa.array(ids, pa.int64()))


def split_ids(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
    """The rows and their ids of a batch made by :func:`with_ids`."""
    return batch.drop_columns([ID_COLUMN]), batch.column(ID_COLUMN).to_numpy()


class _Store:
    """A hybrid replaying partition of ``env`` with ``subpartitions`` runs."""

    def __init__(self, env: cf.NetworkEnvironment, subpartitions: int, name: str) -> None:
        self._env = env
        self._part = env.create_partition(
            f"cf-rank-{name}/{uuid.uuid4().hex[:12]}", max(subpartitions, 1), kind="hybrid", replay=True
        )
        self._writer = cf.RecordWriter(self._part, cf.ForwardPartitioner())
        self._lock = threading.Lock()
        #: Rows stored per run.
        self.rows = [0] * subpartitions

    def _put(self, run: int, batch: pa.RecordBatch, rows: int) -> None:
        if rows == 0:
            return
        with self._lock:
            self._writer.write(batch, subpartition=run)
            self.rows[run] += rows

    def end(self) -> None:
        """No more rows."""
        with self._lock:
            self._writer.close()

    def fail(self, message: str) -> None:
        """Fails the store: readers raise."""
        self._writer.fail(message)

    def _gate(self, run: int) -> cf.InputGate:
        return self._env.create_input_gate([cf.ChannelSpec(self._env.address, self._part.id, run)])

    def metrics(self) -> SpillMetrics:
        """The store: what it holds in memory and on disk, and what it spilled."""
        spill = self._part.metrics()["spill"]
        assert spill is not None, "a hybrid partition has a store"
        return spill

    def release(self) -> None:
        """Drops the rows and removes the spill file. Idempotent."""
        self._part.release()


class Runs(_Store):
    """``partitions`` runs, one per Spark partition."""

    def __init__(self, env: cf.NetworkEnvironment, partitions: int, rank: int, world: int) -> None:
        super().__init__(env, partitions, "runs")
        self.partitions = partitions
        self.rank = rank
        self.world = world

    def put(self, run: int, batch: pa.RecordBatch) -> None:
        """Appends ``batch`` to ``run``. Raises :class:`creditflow.SpillError` when it cannot
        be kept (``max_spill``)."""
        self._put(run, batch, batch.num_rows)

    def ids(self, run: int, start: int, count: int) -> np.ndarray:
        """The ids of rows ``start .. start + count`` of ``run``."""
        return share_ids(run, self.rank, self.world, start, count)

    def read(self, run: int, timeout: float | None) -> RunReader:
        """A reader of ``run`` from its start."""
        return RunReader(
            self._gate(run), timeout, lambda offset, chunk: (chunk, self.ids(run, offset, len(chunk)))
        )

    def select(self, wanted: RowSet, timeout: float | None) -> Chunks:
        """The stored rows whose ids are in ``wanted``, by id. A run's ids grow from its start,
        so a run is read up to its last wanted row only, and a chunk none of whose ids are
        wanted is passed over without looking at each."""
        starts, ends = wanted.ranges()
        runs = starts >> ID_BITS
        for p in sorted(set(runs.tolist())):
            last = int(ends[runs == p].max())  # past the run's last wanted id
            chunks = self.read(int(p), timeout).chunks()
            try:
                for batch, ids in chunks:
                    if ids[0] >= last:
                        break
                    if not wanted.overlaps(int(ids[0]), int(ids[-1])):
                        continue
                    keep = wanted.contains(ids)
                    if keep.any():
                        yield batch.filter(pa.array(keep)), ids[keep]
            finally:
                chunks.close()


class MovedIn(_Store):
    """The rows moved in from other ranks, with their ids."""

    def __init__(self, env: cf.NetworkEnvironment) -> None:
        super().__init__(env, 1, "moved-in")

    def put(self, batch: pa.RecordBatch) -> None:
        """Appends ``batch`` (made by :func:`with_ids`)."""
        self._put(0, batch, batch.num_rows)

    def read(self, timeout: float | None) -> RunReader:
        """A reader of the rows from the first."""
        return RunReader(self._gate(0), timeout, lambda _offset, chunk: split_ids(chunk))


class RunReader:
    """One run from its start, in chunks of :data:`STRIPE_ROWS` rows (the last may be
    shorter), each with its rows' ids (``ids_of(offset, chunk)`` gives the rows and their
    ids of the chunk at row ``offset``), leaving out the ids in ``skip``."""

    def __init__(
        self,
        gate: cf.InputGate,
        timeout: float | None,
        ids_of: Callable[[int, pa.RecordBatch], tuple[pa.RecordBatch, np.ndarray]],
    ) -> None:
        self._gate = gate
        self._timeout = timeout
        self._ids_of = ids_of
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._offset = 0
        self._ended = False

    def chunks(self, skip: RowSet | None = None) -> Chunks:
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
                batch, ids = self._ids_of(self._offset, self._cut(k))
                self._offset += k
                if skip is not None and _touches(skip, ids):
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


def _touches(rows: RowSet, ids: np.ndarray) -> bool:
    """Whether an id between the least and the greatest of ``ids`` is in ``rows``: a look at
    its ranges where testing every id costs a chunk 10 µs or more."""
    starts, _ends = rows.ranges()
    return bool(len(starts)) and len(ids) > 0 and rows.overlaps(int(ids.min()), int(ids.max()))
