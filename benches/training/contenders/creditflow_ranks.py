"""creditflow with ranks: ``send(df, [addr0, addr1], secret)`` into one ranked ``Receiver``
per rank, read through ``creditflow.torch``'s ``IterableDataset``, ``DataLoader(batch_size=None)``.

Epoch 0 streams while Spark computes (the ranks start before the job); later epochs come
from the receivers' memory (``Config.receiver_memory``, more than a rank's share: nothing is
expected on disk), without running the Spark job again. Needs the ranks API
(``Receiver(rank=..., world_size=..., batch_size=..., shuffle=..., seed=...)``,
``rx.set_epoch``, ``creditflow.torch``); on a creditflow without it the rank reports the
error and the run says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from benches.training.contenders.base import Batch, Contender, DriverContext, RankContext, Spec


def dataset_class(module: Any) -> Any:
    """The one ``torch.utils.data.IterableDataset`` that ``creditflow.torch`` defines, found by
    its base class so that the contender does not depend on the class's name."""
    from torch.utils.data import IterableDataset

    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, IterableDataset)
        and obj.__module__.startswith("creditflow")
    ]
    if len(found) != 1:
        names = sorted(o.__name__ for o in found)
        raise RuntimeError(f"expected one IterableDataset in creditflow.torch, found {names}")
    return found[0]


class CreditflowRanks(Contender):
    name = "creditflow"
    method = (
        "`creditflow.spark.send(df, [addr0, addr1], secret)` -> `Receiver(rank=r, world_size=2, "
        "batch_size=1024, shuffle=True, seed=...)` per rank, `rx.set_epoch(e)`, `creditflow.torch` "
        "IterableDataset in `DataLoader(batch_size=None)`; later epochs from the receivers' memory"
    )

    def setup(self, ctx: RankContext) -> dict[str, Any]:
        import torch.utils.data  # noqa: F401  (imported before the clock starts, as for every peer)

        import creditflow.spark as cfs
        import creditflow.torch  # noqa: F401

        cfg = ctx.cfg
        self.rx = cfs.Receiver(
            rank=ctx.rank,
            world_size=cfg.world_size,
            batch_size=cfg.batch_size,
            shuffle=True,
            seed=cfg.seed,
            secret=ctx.secret,
            memory=cfg.receiver_memory,
            spill_dir=str(ctx.scratch / f"spill-{ctx.rank}"),
        )
        return {"address": self.rx.address}

    def epochs(self, ctx: RankContext, spec: Spec) -> Iterator[Iterable[Batch]]:
        from torch.utils.data import DataLoader

        import creditflow.torch

        loader = DataLoader(dataset_class(creditflow.torch)(self.rx), batch_size=None)
        for epoch in range(ctx.cfg.epochs):
            self.rx.set_epoch(epoch)
            yield loader

    def close(self) -> None:
        rx = getattr(self, "rx", None)
        if rx is not None:
            rx.close()

    def run_driver(self, ctx: DriverContext, ready: list[dict[str, Any]], go: Callable[[Spec], None]) -> Spec:
        import creditflow.spark as cfs

        go({})
        stats = cfs.send(ctx.df, [r["address"] for r in ready], ctx.secret)
        return {"tasks": len(stats)}
