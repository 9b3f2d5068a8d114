"""How a task splits its partition between W ranks: in stripes of :data:`STRIPE_ROWS`
consecutive rows, stripe ``s`` of partition ``p`` to rank ``(s + p) % W``.

The rule looks only at a row's index in its partition, never at Arrow batch boundaries, so a
partition computed again (a retried task, a restarted job) sends every row to the same rank,
and a rank can name each row it got: its *id*, ``partition << ID_BITS | row``. Stripes keep
the ranks within a stripe of each other per partition and are cheap (zero-copy slices).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

#: Rows per stripe.
STRIPE_ROWS = 1024
#: Bits of a row id that hold the row's index in its partition (the rest: the partition).
ID_BITS = 40


def pieces(
    batch: pa.RecordBatch, first_row: int, partition: int, world: int
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(rank, slice)`` for each stripe piece of ``batch``, whose first row is row
    ``first_row`` of ``partition``."""
    n = batch.num_rows
    offset = 0
    while offset < n:
        row = first_row + offset
        stripe = row // STRIPE_ROWS
        length = min(n - offset, (stripe + 1) * STRIPE_ROWS - row)
        yield (stripe + partition) % world, batch.slice(offset, length)
        offset += length


def share_ids(partition: int, rank: int, world: int, start: int, count: int) -> np.ndarray:
    """The ids of rows ``start .. start + count`` of ``rank``'s share of ``partition`` (its
    stripes of that partition, in order)."""
    first = (rank - partition) % world
    if start % STRIPE_ROWS + count <= STRIPE_ROWS:  # within one stripe (a run's chunk): consecutive
        stripe = first + world * (start // STRIPE_ROWS)
        base = (partition << ID_BITS) | (stripe * STRIPE_ROWS + start % STRIPE_ROWS)
        return np.arange(base, base + count, dtype=np.int64)
    i = np.arange(start, start + count, dtype=np.int64)
    stripes = first + world * (i // STRIPE_ROWS)
    ids: np.ndarray = (np.int64(partition) << ID_BITS) | (stripes * STRIPE_ROWS + i % STRIPE_ROWS)
    return ids


def share_size(rows: int, partition: int, rank: int, world: int) -> int:
    """How many of a partition's ``rows`` rows are ``rank``'s share."""
    full, rest = divmod(rows, STRIPE_ROWS)
    first = (rank - partition) % world
    count = (full - first + world - 1) // world * STRIPE_ROWS if full > first else 0
    if rest and (full + partition) % world == rank:
        count += rest
    return count


def partition_of(ids: np.ndarray) -> np.ndarray:
    """The partition of each id."""
    return ids >> ID_BITS
