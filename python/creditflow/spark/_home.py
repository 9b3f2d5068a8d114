"""A rank's *home*: the rows it keeps for the epochs after the first, once the stream ended and
the ranks evened out their rows: its runs less the rows it gave away, and the rows moved in
(:mod:`creditflow.spark._runs`).

:meth:`Home.chunks` reads them in an order that depends only on a generator and the rows: the
runs in the generator's order, :data:`OPEN_RUNS` at a time, their stripe-sized chunks
interleaved at random. A rank's shuffled epoch reads it through its window; with the shuffle
across ranks, each rank deals its home's chunks to the others
(:mod:`creditflow.spark._reshuffle`).
"""

from __future__ import annotations

import numpy as np

from creditflow.spark._rankstate import RowSet
from creditflow.spark._runs import Chunks, MovedIn, Runs

#: Runs an epoch after the first reads at once (their chunks interleaved).
OPEN_RUNS = 4


class Home:
    """The rows of ``runs`` and ``moved_in`` but those in ``moved_out``."""

    def __init__(self, runs: Runs, moved_in: MovedIn, moved_out: RowSet, timeout: float | None) -> None:
        self.runs = runs
        self.moved_in = moved_in
        self.moved_out = moved_out
        self._timeout = timeout

    def chunks(self, rng: np.random.Generator | None, without: RowSet | None = None) -> Chunks:
        """The home's rows, chunk by chunk with their ids, in ``rng``'s order (the stored
        order without one), leaving out ``without`` too."""
        skip = self.moved_out if without is None else self.moved_out.union(without)
        order = [r for r in range(self.runs.partitions) if self.runs.rows[r]]
        if self.moved_in.rows[0]:
            order.append(self.runs.partitions)  # the rows moved in: one run more
        if rng is not None:
            order = [order[i] for i in rng.permutation(len(order))]
        pending = list(reversed(order))
        open_: list[Chunks] = []
        try:
            while open_ or pending:
                while len(open_) < OPEN_RUNS and pending:
                    open_.append(self._run(pending.pop(), skip))
                i = int(rng.integers(len(open_))) if rng is not None else 0
                chunk = next(open_[i], None)
                if chunk is None:
                    open_.pop(i)
                else:
                    yield chunk
        finally:
            for run in open_:
                run.close()

    def _run(self, run: int, skip: RowSet) -> Chunks:
        if run < self.runs.partitions:
            return self.runs.read(run, self._timeout).chunks(skip)
        return self.moved_in.read(self._timeout).chunks(skip)
