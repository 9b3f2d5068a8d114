"""Hugging Face ``datasets``: ``Dataset.from_spark(df, cache_dir=...)`` writes an Arrow cache;
each rank memory-maps its files (the ones the driver's ``Dataset`` lists in ``cache_files``, as
a job whose ranks do not run Spark would) and takes its part with ``split_dataset_by_node``.
Two ways to read it, the two HF documents:

* ``hf-datasets`` (map-style): the rank's contiguous half, ``with_format("torch")``, in a
  ``DataLoader`` whose sampler is ``BatchSampler(RandomSampler(...), 1024)`` (one indexed read
  per batch; a plain ``DataLoader(ds, batch_size=1024)`` reads and collates row by row),
  reshuffled every epoch by a seeded generator: a true shuffle, by random access;
* ``hf-iterable``: ``to_iterable_dataset(num_shards=partitions)``, ``shuffle(seed,
  buffer_size=16384)`` (shard order and a row buffer, reshuffled by ``set_epoch``), then
  ``split_dataset_by_node`` (whole shards per rank) and ``iter(batch_size=1024)``: contiguous
  reads, an approximate shuffle.
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


class HFIterable(HFDatasets):
    name = "hf-iterable"
    method = (
        "`Dataset.from_spark(df)` (Arrow cache) + `to_iterable_dataset(num_shards=8).shuffle(seed, "
        "buffer_size=16384)`, `split_dataset_by_node`, `set_epoch(e)`, `iter(batch_size=1024)`"
    )

    def epochs(self, ctx: RankContext, spec: Spec) -> Iterator[Iterable[Batch]]:
        from datasets import Dataset, concatenate_datasets
        from datasets.distributed import split_dataset_by_node

        cfg = ctx.cfg
        full = concatenate_datasets([Dataset.from_file(f) for f in spec["files"]])
        stream = full.to_iterable_dataset(num_shards=cfg.partitions)
        stream = stream.shuffle(seed=cfg.seed, buffer_size=cfg.shuffle_buffer)
        part = split_dataset_by_node(stream, rank=ctx.rank, world_size=cfg.world_size).with_format("torch")
        for epoch in range(cfg.epochs):
            part.set_epoch(epoch)
            yield part.iter(batch_size=cfg.batch_size)
