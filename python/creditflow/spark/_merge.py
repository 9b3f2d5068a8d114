"""Merging an exchange's small input batches before they are split, so that each task's piece
of a write is more than a handful of rows.

An exchange over n tasks splits every batch it writes into n pieces, one per task, and a piece
costs about the same to split off, send, receive and hand to ``func`` whatever its size (a
record, a wake-up, a pyarrow import). Spark's input batches of 10,000 rows make pieces of 78
rows at 128 tasks and of 10 at 1,000, where that cost is many times the rows' own.
:func:`merged` concatenates consecutive input batches until a write gives each task about
:data:`PIECE_ROWS` rows; at a few tasks Spark's batches are large enough and pass as they are."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

__all__ = ["MEMORY_SHARE", "PIECE_ROWS", "merged", "merged_for_split"]

#: Rows per task a write of an exchange aims at: a piece's own cost is then a few nanoseconds
#: a row (docs/benchmarks.md, "many tasks").
PIECE_ROWS = 1024
#: A writer holds input batches of at most this part of its ``memory`` while it merges them.
MEMORY_SHARE = 4


def merged_for_split(batches: Iterable[pa.RecordBatch], ways: int, memory: int) -> Iterator[pa.RecordBatch]:
    """``batches`` merged for a split ``ways`` ways by a writer with ``memory`` bytes: about
    :data:`PIECE_ROWS` rows a piece, at most ``memory // MEMORY_SHARE`` held."""
    return merged(batches, ways * PIECE_ROWS, memory // MEMORY_SHARE)


def merged(batches: Iterable[pa.RecordBatch], min_rows: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batches`` in order, consecutive ones concatenated until they hold ``min_rows`` rows or
    ``max_bytes`` bytes of buffers. A batch that holds ``min_rows`` alone passes as it is (after
    what was held before it), and what is held at the end comes as one batch. Holds at most
    ``max_bytes`` plus one batch."""
    held: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in batches:
        if batch.num_rows >= min_rows:
            if held:
                yield _concat(held)
                held, rows, size = [], 0, 0
            yield batch
            continue
        held.append(batch)
        rows += batch.num_rows
        size += batch.get_total_buffer_size()
        if rows >= min_rows or size >= max_bytes:
            yield _concat(held)
            held, rows, size = [], 0, 0
    if held:
        yield _concat(held)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """The batches as one (the one itself when alone: nothing is copied)."""
    if len(batches) == 1:
        return batches[0]
    concat = getattr(pa, "concat_batches", None)  # pyarrow 19 and later
    if concat is not None:
        return concat(batches)
    columns = [pa.concat_arrays([b.column(i) for b in batches]) for i in range(batches[0].num_columns)]
    return pa.record_batch(columns, schema=batches[0].schema)
