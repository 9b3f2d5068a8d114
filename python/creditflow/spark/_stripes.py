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

from creditflow.spark._window import one_batch

#: Rows per stripe.
STRIPE_ROWS = 1024
#: Bits of a row id that hold the row's index in its partition (the rest: the partition).
ID_BITS = 40
#: Bytes of a rank's stripes a task joins into one batch at most (a stripe larger goes alone):
#: a batch costs the rank about as much as a stripe's rows do, to receive and store. A rank
#: with less than 64 times as much ``memory`` asks for a 64th of it (:func:`join_bytes`).
JOIN_BYTES = 256 << 10


def join_bytes(memory: int) -> int:
    """What a rank with ``memory`` bytes asks its tasks to join its stripes into at most."""
    return min(JOIN_BYTES, memory // 64)


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


def partition_row(partition: int, rank: int, world: int, share_row: int) -> int:
    """The index in ``partition`` of row ``share_row`` of ``rank``'s share of it."""
    stripe = (rank - partition) % world + world * (share_row // STRIPE_ROWS)
    return stripe * STRIPE_ROWS + share_row % STRIPE_ROWS


def share_ids(partition: int, rank: int, world: int, start: int, count: int) -> np.ndarray:
    """The ids of rows ``start .. start + count`` of ``rank``'s share of ``partition`` (its
    stripes of that partition, in order)."""
    if start % STRIPE_ROWS + count <= STRIPE_ROWS:  # within one stripe (a run's chunk): consecutive
        base = (partition << ID_BITS) | partition_row(partition, rank, world, start)
        return np.arange(base, base + count, dtype=np.int64)
    i = np.arange(start, start + count, dtype=np.int64)
    stripes = (rank - partition) % world + world * (i // STRIPE_ROWS)
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


def for_ranks(
    batch: pa.RecordBatch,
    first_row: int,
    partition: int,
    skip: list[int],
    sent: list[int],
    join: list[int],
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(rank, batch)`` for each rank's rows of ``batch`` (whose first row is row
    ``first_row`` of ``partition``), its stripe pieces joined, in order, into batches of at
    most ``join[r]`` bytes (a stripe larger alone; one copy, none with one rank), leaving
    out the first ``skip[r]`` rows of rank r's share. ``sent[r]``: rows of rank r's share
    before ``batch``; moved on past it."""
    world = len(skip)
    # Buffers over rows: within a few bytes of each row's share for fixed widths, the average
    # for variable ones (a task's input is not a slice).
    row_bytes = max(batch.get_total_buffer_size() / max(batch.num_rows, 1), 1.0)
    if world == 1:  # every row is the one rank's: slices
        n = batch.num_rows
        cut = min(n, max(0, skip[0] - sent[0]))
        sent[0] += n
        step = max(STRIPE_ROWS, int(join[0] // row_bytes))
        for offset in range(cut, n, step):
            yield 0, batch.slice(offset, min(step, n - offset))
        return
    mine: list[list[pa.RecordBatch]] = [[] for _ in range(world)]
    for rank, piece in pieces(batch, first_row, partition, world):
        n = piece.num_rows
        if sent[rank] + n > skip[rank]:
            cut = max(0, skip[rank] - sent[rank])
            mine[rank].append(piece.slice(cut) if cut else piece)
        sent[rank] += n
    for rank, parts in enumerate(mine):
        group: list[pa.RecordBatch] = []
        rows = 0
        for piece in parts:
            if group and (rows + piece.num_rows) * row_bytes > join[rank]:
                yield rank, one_batch(group)
                group, rows = [], 0
            group.append(piece)
            rows += piece.num_rows
        if group:
            yield rank, one_batch(group)


def stripe_cuts(start: int, rows: int) -> Iterator[tuple[int, int]]:
    """``(offset, length)`` of each stripe piece of ``rows`` rows of a share that start at row
    ``start`` of the share (a rank's stripes of a partition, one after another)."""
    offset = 0
    while offset < rows:
        length = min(rows - offset, STRIPE_ROWS - (start + offset) % STRIPE_ROWS)
        yield offset, length
        offset += length


def partition_of(ids: np.ndarray) -> np.ndarray:
    """The partition of each id."""
    return ids >> ID_BITS
