"""Arrow tables to training batches, for the contenders whose loaders yield Arrow (the rank
side; imports torch)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import torch
from benches.training.contenders.base import Batch


def to_torch(table: pa.Table | pa.RecordBatch) -> Batch:
    """Column name -> tensor (zero-copy where the column is one null-free chunk)."""
    out: Batch = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        out[name] = torch.from_numpy(column.to_numpy(zero_copy_only=False))
    return out


def rebatch(
    tables: Iterable[pa.Table], batch_size: int, rng: np.random.Generator | None, *, keep_last: bool
) -> Iterator[pa.Table]:
    """Tables of exactly ``batch_size`` rows from ``tables`` (each one's rows permuted by
    ``rng`` first, if given), carrying the rest of one into the next; the short remainder
    at the end only with ``keep_last``."""
    carry: pa.Table | None = None
    for table in tables:
        if rng is not None and table.num_rows > 1:
            table = table.take(pa.array(rng.permutation(table.num_rows)))
        if carry is not None and carry.num_rows:
            table = pa.concat_tables([carry, table])
        full = table.num_rows - table.num_rows % batch_size
        for start in range(0, full, batch_size):
            yield table.slice(start, batch_size)
        carry = table.slice(full)
    if keep_last and carry is not None and carry.num_rows:
        yield carry
