"""Parquet by hand: ``df.write.parquet(dir)``, then each rank reads every other file with
pyarrow.

Rank r takes files r, r + 2, ...; every epoch it reads them in a shuffled order, permutes each
file's rows and cuts 1024-row batches, carrying the rest into the next file. Both ranks stop
after the same number of steps (the smaller rank's rows // 1024, from the files' footers), so a
DDP job would not hang; the rows past that are not seen in that epoch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from benches.training.contenders.base import Batch, Contender, DriverContext, RankContext, Spec


class Parquet(Contender):
    name = "parquet"
    method = (
        "`df.write.parquet(dir)` + pyarrow `read_table` per file in each rank (files r::2, shuffled "
        "file order and rows), equal steps from the footers"
    )

    def setup(self, ctx: RankContext) -> dict[str, Any]:
        import pyarrow.parquet  # noqa: F401
        import torch  # noqa: F401

        return {}

    def epochs(self, ctx: RankContext, spec: Spec) -> Iterator[Iterable[Batch]]:
        import pyarrow.parquet as pq

        cfg = ctx.cfg
        files = sorted(str(p) for p in Path(spec["path"]).glob("*.parquet"))
        rows = [pq.ParquetFile(f).metadata.num_rows for f in files]
        per_rank = [sum(rows[r :: cfg.world_size]) for r in range(cfg.world_size)]
        steps = min(per_rank) // cfg.batch_size
        mine = files[ctx.rank :: cfg.world_size]
        for epoch in range(cfg.epochs):
            rng = np.random.default_rng([cfg.seed, epoch, ctx.rank])
            yield itertools.islice(self._epoch(mine, cfg.batch_size, rng), steps)

    @staticmethod
    def _epoch(files: list[str], batch_size: int, rng: np.random.Generator) -> Iterator[Batch]:
        import pyarrow.parquet as pq
        from benches.training.contenders.batches import rebatch, to_torch

        tables = (pq.read_table(files[i]) for i in rng.permutation(len(files)))
        for table in rebatch(tables, batch_size, rng, keep_last=False):
            yield to_torch(table)

    def run_driver(self, ctx: DriverContext, ready: list[dict[str, Any]], go: Callable[[Spec], None]) -> Spec:
        out = ctx.scratch / "parquet"
        ctx.df.write.parquet(str(out))
        go({"path": str(out)})
        return {"files": len(list(out.glob("*.parquet")))}
