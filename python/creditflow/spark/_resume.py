"""The check a retried attempt passes before it continues a partition (or a rank's share of one)
after the rows a receiver already has: that it computed the same rows there.

A receiver keeps a digest (:func:`fingerprint`) of the rows it received at a few *points*:
row 0 and every power of two (:class:`Trail`, some 40 digests for a trillion rows), and the
last row it has. A retry digests its own rows at the same points as it computes them
(:class:`Points`) and sends them before it writes anything past what the receiver has; a
difference at any point means the DataFrame computed other rows or another order, and the
stream fails rather than deliver some rows twice and lose others. The points cost a digest
each, not one a batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import pyarrow as pa

__all__ = ["Points", "Trail", "fingerprint", "mismatch"]


def fingerprint(batch: pa.RecordBatch, row: int) -> str:
    """What row ``row`` of ``batch`` holds, as a short digest of its values (their ``repr``,
    which tells apart every float, NaN included, and every other value Arrow converts to
    Python), independent of how the batch lays out its buffers."""
    values = batch.slice(row, 1).to_pylist()[0]
    return hashlib.blake2b(repr(values).encode(), digest_size=16).hexdigest()


def samples_in(start: int, count: int) -> Iterator[int]:
    """The sampled rows (0 and the powers of two) in ``start .. start + count``."""
    row = 0 if start == 0 else 1 << (start - 1).bit_length()
    while row < start + count:
        yield row
        row = row * 2 if row else 1


class Trail:
    """What a receiver received of one partition (or share): the digests of its sampled rows,
    by row, and of the last row it has once the reader that kept it stopped."""

    def __init__(self) -> None:
        self.digests: dict[int, str] = {}
        self.last: tuple[int, str] | None = None

    def see(self, batch: pa.RecordBatch, start: int) -> None:
        """``batch`` holds rows ``start ..`` of the partition."""
        for row in samples_in(start, batch.num_rows):
            self.digests[row] = fingerprint(batch, row - start)

    def end(self, batch: pa.RecordBatch, rows: int) -> None:
        """A reader stopped after ``batch``, the last it kept, which ended at ``rows`` rows of
        the partition (a reader that an attempt replaced may stop after one that kept more)."""
        if self.last is None or rows - 1 > self.last[0]:
            self.last = (rows - 1, fingerprint(batch, batch.num_rows - 1))

    def expected(self) -> dict[int, str]:
        """What a retry continuing after the last row must send (nothing before any)."""
        if self.last is None:
            return {}
        out = {row: d for row, d in self.digests.items() if row < self.last[0]}
        out[self.last[0]] = self.last[1]
        return out


def mismatch(expected: dict[int, str], sent: list[list[object]]) -> int | None:
    """The first row at which the digests a retry ``sent`` (``[row, digest]`` pairs) differ
    from the ``expected`` ones, or None when they agree."""
    got = {int(str(row)): str(digest) for row, digest in sent}
    for row in sorted(set(expected) | set(got)):
        if expected.get(row) != got.get(row):
            return row
    return None


class Points:
    """The points a retry digests before it continues after the first ``skip`` rows of a
    receiver's (or a rank's share: ``row_of`` maps a share's row to the partition's)."""

    def __init__(self, skip: int, row_of: Callable[[int], int] = lambda row: row) -> None:
        rows = sorted({*samples_in(0, skip), skip - 1}) if skip else []
        #: (the partition's row, the receiver's row), in the partition's order: the last one
        #: is the last row the receiver has.
        self._todo = [(row_of(r), r) for r in rows]
        self._digests: list[list[object]] = []

    def see(self, batch: pa.RecordBatch, first_row: int) -> list[list[object]] | None:
        """Digests the points in ``batch`` (whose first row is ``first_row`` of the
        partition); returns every digest, as ``[row, digest]`` pairs, once the last point
        is among them (the check is due before the batch is written), else None."""
        end = first_row + batch.num_rows
        while self._todo and self._todo[0][0] < end:
            at, row = self._todo.pop(0)
            self._digests.append([row, fingerprint(batch, at - first_row)])
            if not self._todo:
                return self._digests
        return None
