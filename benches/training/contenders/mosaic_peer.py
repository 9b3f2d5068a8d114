"""Mosaic ``streaming``: ``dataframe_to_mds(df)`` writes MDS shards (one folder per Spark
partition, merged index), each rank reads them with ``StreamingDataset(local=...,
shuffle=True, batch_size=1024)`` in a ``DataLoader(batch_size=1024)``.

The ranks find each other as under ``torchrun``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE`` are set in every rank's environment (see ``benches.training.ranks``), and
the dataset coordinates them through shared memory. Each ``iter(loader)`` is the next epoch;
Mosaic gives every rank the same number of samples (repeating some).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from benches.training.contenders.base import Batch, Contender, DriverContext, RankContext, Spec

#: Spark SQL type name -> MDS column encoding (the feature columns' types).
MDS_TYPES = {"int": "int32", "bigint": "int64", "float": "float32", "double": "float64"}


class Mosaic(Contender):
    name = "mosaic"
    method = (
        "`dataframe_to_mds(df, merge_index=True)` (MDS shards) + `StreamingDataset(local=..., "
        "shuffle=True, batch_size=1024)` in `DataLoader(batch_size=1024)`, ranks via RANK/WORLD_SIZE"
    )

    def setup(self, ctx: RankContext) -> dict[str, Any]:
        import torch  # noqa: F401
        from streaming import StreamingDataset  # noqa: F401

        return {}

    def epochs(self, ctx: RankContext, spec: Spec) -> Iterator[Iterable[Batch]]:
        from streaming import StreamingDataset
        from torch.utils.data import DataLoader

        cfg = ctx.cfg
        dataset = StreamingDataset(
            local=spec["local"], remote=None, shuffle=True, shuffle_seed=cfg.seed, batch_size=cfg.batch_size
        )
        loader = DataLoader(dataset, batch_size=cfg.batch_size, num_workers=0)
        for _ in range(cfg.epochs):
            yield loader

    def run_driver(self, ctx: DriverContext, ready: list[dict[str, Any]], go: Callable[[Spec], None]) -> Spec:
        from streaming.base.converters import dataframe_to_mds

        out = ctx.scratch / "mds"
        columns = {f.name: MDS_TYPES[f.dataType.simpleString()] for f in ctx.df.schema.fields}
        dataframe_to_mds(ctx.df, merge_index=True, mds_kwargs={"out": str(out), "columns": columns})
        go({"local": str(out)})
        return {}
