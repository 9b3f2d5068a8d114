"""Hugging Face ``datasets``: ``Dataset.from_spark(df, cache_dir=...)`` writes an Arrow cache;
each rank memory-maps its files, takes its part with ``split_dataset_by_node`` (a contiguous
half) and reads it through a ``DataLoader`` in shuffled 1024-row batches.

The batches come from ``BatchSampler(RandomSampler(...))`` handed to the dataset whole (one
indexed read per batch, the fast way with ``with_format("torch")``; a plain
``DataLoader(ds, batch_size=1024)`` reads and collates row by row), reshuffled every epoch by
a seeded generator. The ranks open the cache files the driver's ``Dataset`` lists
(``cache_files``), as a job whose ranks do not run Spark would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from benches.training.contenders.base import Batch, Contender, DriverContext, RankContext, Spec


class HFDatasets(Contender):
    name = "hf-datasets"
    method = (
        "`Dataset.from_spark(df)` (Arrow cache) + `split_dataset_by_node`, `with_format('torch')`, "
        "`DataLoader(sampler=BatchSampler(RandomSampler(...), 1024), batch_size=None)`"
    )

    def setup(self, ctx: RankContext) -> dict[str, Any]:
        import torch  # noqa: F401
        from datasets import Dataset  # noqa: F401

        return {}

    def epochs(self, ctx: RankContext, spec: Spec) -> Iterator[Iterable[Batch]]:
        import torch
        from datasets import Dataset, concatenate_datasets
        from datasets.distributed import split_dataset_by_node
        from torch.utils.data import BatchSampler, DataLoader, RandomSampler

        cfg = ctx.cfg
        full = concatenate_datasets([Dataset.from_file(f) for f in spec["files"]])
        part = split_dataset_by_node(full, rank=ctx.rank, world_size=cfg.world_size).with_format("torch")
        for epoch in range(cfg.epochs):
            generator = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
            sampler = BatchSampler(RandomSampler(part, generator=generator), cfg.batch_size, drop_last=False)
            yield DataLoader(part, sampler=sampler, batch_size=None)

    def run_driver(self, ctx: DriverContext, ready: list[dict[str, Any]], go: Callable[[Spec], None]) -> Spec:
        from datasets import Dataset

        dataset = Dataset.from_spark(ctx.df, cache_dir=str(ctx.scratch / "cache"))
        files = [f["filename"] for f in dataset.cache_files]
        go({"files": files})
        return {"files": len(files)}
