"""Petastorm: ``make_spark_converter(df)`` writes a Parquet cache, each rank reads it with
``make_torch_dataloader(cur_shard=rank, shard_count=2)``.

As Databricks' guide for distributed training does: one loader with ``num_epochs=None`` and
``len(converter) // (batch_size * shard_count)`` steps per epoch (equal steps on every rank;
which rows an epoch sees is up to the reader). Row groups are shuffled (Petastorm's default),
rows through a shuffling queue of ``Config.shuffle_buffer`` rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from benches.training.contenders.base import Batch, Contender, DriverContext, RankContext, Spec


class Petastorm(Contender):
    name = "petastorm"
    method = (
        "`make_spark_converter(df)` (Parquet cache) + `make_torch_dataloader(batch_size=1024, "
        "cur_shard=r, shard_count=2, num_epochs=None, shuffling_queue_capacity=16384)`, "
        "len // (1024 * 2) steps per epoch"
    )

    def setup(self, ctx: RankContext) -> dict[str, Any]:
        import torch  # noqa: F401
        from petastorm.spark import SparkDatasetConverter  # noqa: F401

        return {}

    def epochs(self, ctx: RankContext, spec: Spec) -> Iterator[Iterable[Batch]]:
        from petastorm.spark import SparkDatasetConverter

        cfg = ctx.cfg
        converter = SparkDatasetConverter(spec["cache_dir_url"], spec["file_urls"], spec["dataset_size"])
        steps = len(converter) // (cfg.batch_size * cfg.world_size)
        with converter.make_torch_dataloader(
            batch_size=cfg.batch_size,
            num_epochs=None,
            cur_shard=ctx.rank,
            shard_count=cfg.world_size,
            shuffling_queue_capacity=cfg.shuffle_buffer,
            seed=cfg.seed,
        ) as loader:
            batches = iter(loader)
            for _ in range(cfg.epochs):
                yield itertools.islice(batches, steps)

    def run_driver(self, ctx: DriverContext, ready: list[dict[str, Any]], go: Callable[[Spec], None]) -> Spec:
        from petastorm.spark import SparkDatasetConverter, make_spark_converter

        ctx.spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, (ctx.scratch / "cache").as_uri())
        converter = make_spark_converter(ctx.df)
        go(
            {
                "cache_dir_url": converter.cache_dir_url,
                "file_urls": list(converter.file_urls),
                "dataset_size": converter.dataset_size,
            }
        )
        return {"files": len(converter.file_urls)}
