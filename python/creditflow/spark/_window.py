"""A rank's window of rows: what it received and has not yielded yet, each row with its id,
shuffled with a seeded generator (or kept in order).

Rows come in as Arrow batches (stripe pieces, a few thousand rows at most) and leave as
batches of the sizes asked for. With a generator, once ``size`` rows are waiting they are
mixed with what is left of the last mix in one random permutation (one ``take``: a copy), and
batches are cut from its front until half of it is left; so every row is copied about twice
and lands anywhere within about ``size`` rows of where it came in. Without, rows leave in the
order they came: a batch within the first piece waiting is a slice of it; otherwise what is
waiting is concatenated once (one copy) and batches are sliced from that.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from creditflow import _native


class Window:
    """Rows waiting to be yielded, with their ids."""

    def __init__(self, size: int, rng: np.random.Generator | None) -> None:
        self._size = max(1, size)
        self._rng = rng
        self._pieces: list[tuple[pa.RecordBatch, np.ndarray]] = []
        self._waiting = 0
        #: The last mix (or, in order, the concatenated front) and how much of it is taken.
        self._mixed: pa.RecordBatch | None = None
        self._mixed_ids = np.empty(0, dtype=np.int64)
        self._pos = 0

    def __len__(self) -> int:
        return self._waiting + (len(self._mixed_ids) - self._pos)

    def add(self, batch: pa.RecordBatch, ids: np.ndarray) -> None:
        """Adds rows (``ids[i]`` names row i)."""
        if batch.num_rows:
            self._pieces.append((batch, ids))
            self._waiting += batch.num_rows

    def full(self) -> bool:
        """Whether a shuffled window has taken in enough to yield from (an unshuffled one
        yields as soon as it has the rows)."""
        return self._rng is None or len(self) >= self._size

    def _mix(self) -> None:
        """Moves the waiting rows into the mixed front (shuffling it, with a generator)."""
        rest = len(self._mixed_ids) - self._pos
        batches = [self._mixed.slice(self._pos)] if self._mixed is not None and rest else []
        ids = [self._mixed_ids[self._pos :]] if rest else []
        batches += [b for b, _ in self._pieces]
        ids += [i for _, i in self._pieces]
        self._pieces, self._waiting = [], 0
        if not batches:
            return
        merged_ids = np.concatenate(ids)
        if self._rng is not None:
            order = permutation(self._rng, len(merged_ids))
            merged = _taken(batches, order)
            merged_ids = merged_ids[order]
        else:
            merged = one_batch(batches)
        self._mixed = merged
        self._mixed_ids = merged_ids
        self._pos = 0

    def take(self, rows: int) -> tuple[pa.RecordBatch, np.ndarray]:
        """The next ``rows`` rows (at most what it holds) and their ids."""
        front = len(self._mixed_ids) - self._pos
        if self._rng is None and not front and self._pieces and self._pieces[0][0].num_rows >= rows:
            return self._take_piece(rows)
        if front < rows or (self._rng is not None and self._waiting and front - rows < self._size // 2):
            self._mix()
        assert self._mixed is not None, "take() from an empty window"
        k = min(rows, len(self._mixed_ids) - self._pos)
        out = self._mixed.slice(self._pos, k)
        ids = self._mixed_ids[self._pos : self._pos + k]
        self._pos += k
        return out, ids

    def _take_piece(self, rows: int) -> tuple[pa.RecordBatch, np.ndarray]:
        """The first ``rows`` rows of the first waiting piece, which has them: a slice."""
        batch, ids = self._pieces[0]
        if batch.num_rows == rows:
            self._pieces.pop(0)
        else:
            self._pieces[0] = (batch.slice(rows), ids[rows:])
        self._waiting -= rows
        return batch.slice(0, rows), ids[:rows]

    def take_last(self, rows: int) -> tuple[pa.RecordBatch | None, np.ndarray]:
        """Takes ``rows`` rows out of the window (the last of it, for another rank)."""
        self._mix()
        if self._mixed is None or rows == 0:
            return None, np.empty(0, dtype=np.int64)
        end = len(self._mixed_ids)
        start = max(self._pos, end - rows)
        out = self._mixed.slice(start, end - start)
        ids = self._mixed_ids[start:end]
        self._mixed = self._mixed.slice(0, start)
        self._mixed_ids = self._mixed_ids[:start]
        return out, ids

    def clear(self) -> None:
        """Drops everything (the rows left out of an epoch with ``drop_last``)."""
        self._pieces, self._waiting = [], 0
        self._mixed, self._mixed_ids, self._pos = None, np.empty(0, dtype=np.int64), 0


def permutation(rng: np.random.Generator, n: int) -> np.ndarray:
    """``0 .. n - 1`` in an order drawn uniformly at random, seeded by one draw from ``rng``
    (numpy's own ``permutation`` takes about 12 ns a row, a shuffle in Rust a few)."""
    seed = int(rng.bit_generator.random_raw())
    return np.frombuffer(_native._permutation(n, seed), dtype=np.int64)


def warm_up() -> None:
    """Runs, on a few rows, the Arrow kernels a window uses (``take``, ``filter``, a
    concatenation). The first ``take`` of a process imports ``pyarrow.compute`` and sets up
    its kernels, which costs a good part of a second of CPU: a rank does it while it waits
    for the job rather than in front of its first batch."""
    tiny = pa.record_batch([pa.array([0, 1], pa.int64())], names=["x"])
    one_batch([tiny, tiny]).take(pa.array([1, 0])).filter(pa.array([True, False]))


def _taken(batches: list[pa.RecordBatch], order: np.ndarray) -> pa.RecordBatch:
    """Row ``order[i]`` of ``batches`` (as if concatenated) at i: one copy, the take's (a
    table's take gathers across its chunks without concatenating them first)."""
    if len(batches) == 1:
        return batches[0].take(pa.array(order))
    return one_batch(pa.Table.from_batches(batches).take(pa.array(order)).to_batches())


def one_batch(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """The rows of ``batches`` as one batch (a copy unless there is one batch)."""
    if len(batches) == 1:
        return batches[0]
    table = pa.Table.from_batches(batches).combine_chunks()
    return table.to_batches()[0]
