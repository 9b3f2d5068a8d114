"""The harness's check before ranks exist: today's single-consumer ``Receiver(spill=True,
replay=True)`` in each rank, each fed by its own ``send`` of half the DataFrame's source
partitions (two Spark jobs at once; together they compute every row once).

It is not the training ranks' design and its figures are not creditflow's: the split is by source
partition (so the ranks' batch counts differ when the halves do), the order is arrival order
with rows shuffled within each arriving Arrow batch, and the last short batch is kept. Later
epochs replay the receiver's store (memory, spilling past ``Config.receiver_memory``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from benches.training.contenders.base import Batch, Contender, DriverContext, RankContext, Spec


class CreditflowToday(Contender):
    name = "creditflow-today"
    method = (
        "harness check, not the ranks design: per rank `Receiver(spill=True, replay=True)`, "
        "`send()` of half the source partitions to each; rows shuffled within arriving batches"
    )

    def setup(self, ctx: RankContext) -> dict[str, Any]:
        import torch  # noqa: F401

        import creditflow.spark as cfs

        self.rx = cfs.Receiver(
            spill=True,
            replay=True,
            secret=ctx.secret,
            memory=ctx.cfg.receiver_memory,
            spill_dir=str(ctx.scratch / f"spill-{ctx.rank}"),
        )
        return {"address": self.rx.address}

    def epochs(self, ctx: RankContext, spec: Spec) -> Iterator[Iterable[Batch]]:
        for epoch in range(ctx.cfg.epochs):
            yield self._epoch(ctx, epoch)

    def _epoch(self, ctx: RankContext, epoch: int) -> Iterator[Batch]:
        from benches.training.contenders.batches import rebatch, to_torch

        rng = np.random.default_rng([ctx.cfg.seed, epoch, ctx.rank])
        tables = (pa.Table.from_batches([b]) for b in self.rx)  # each iter(rx) replays from the start
        for table in rebatch(tables, ctx.cfg.batch_size, rng, keep_last=True):
            yield to_torch(table)

    def close(self) -> None:
        rx = getattr(self, "rx", None)
        if rx is not None:
            rx.close()

    def run_driver(self, ctx: DriverContext, ready: list[dict[str, Any]], go: Callable[[Spec], None]) -> Spec:
        import creditflow.spark as cfs

        world, parts = ctx.cfg.world_size, ctx.cfg.partitions
        errors: list[BaseException] = []

        def send(rank: int) -> None:
            try:
                cfs.send(ctx.part_of(range(rank, parts, world)), ready[rank]["address"], ctx.secret)
            except BaseException as exc:
                errors.append(exc)

        go({})
        threads = [threading.Thread(target=send, args=(r,), name=f"send-{r}") for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return {}
