"""Train a small PyTorch model with DDP (gloo, CPU, 2 ranks) on TPC-H ``lineitem`` features
streamed out of Spark by creditflow: no copy on storage, the first batch while Spark still
computes, epochs 1 and 2 from the ranks' memory (or spill), the same number of steps on both
ranks in every epoch.

    python examples/train_torch.py [--rows 600000] [--epochs 3]

The driver starts Spark (``local[2]``) and a :class:`creditflow.spark.TrainingJob`, starts the
two ranks as processes (as ``torchrun`` would; they find the job through ``CREDITFLOW_JOB``),
waits for their receivers and streams the DataFrame to them. Each rank trains a linear model
of the extended price from quantity, discount, tax and the ship date, and prints one JSON
line per epoch: steps, rows, loss, seconds. The last line is the driver's summary.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from typing import Any


def lineitem_features(spark: Any, rows: int) -> Any:
    """``lineitem``-like rows (dbgen's rules for quantity, price, discount, tax and dates),
    computed by Spark from a seed, as float features and the target."""
    from pyspark.sql import functions as F

    df = spark.range(0, rows, numPartitions=4)
    part = (F.hash("id", F.lit(1)) % 200_000 + 200_000) % 200_000 + 1
    retail = (90_000 + (part / 10) % 20_001 + 100 * (part % 1_000)) / 100
    quantity = (F.hash("id", F.lit(2)) % 50 + 50) % 50 + 1
    discount = ((F.hash("id", F.lit(3)) % 11 + 11) % 11) / 100
    tax = ((F.hash("id", F.lit(4)) % 9 + 9) % 9) / 100
    shipday = ((F.hash("id", F.lit(5)) % 2_526 + 2_526) % 2_526) / 2_526
    price = quantity * retail
    return df.select(
        "id",
        (quantity / 50).cast("float").alias("quantity"),
        discount.cast("float").alias("discount"),
        tax.cast("float").alias("tax"),
        shipday.cast("float").alias("shipday"),
        (retail / 2_000).cast("float").alias("retail"),
        (price * (1 - discount) * (1 + tax) / 100_000).cast("float").alias("target"),
    )


FEATURES = ["quantity", "discount", "tax", "shipday", "retail"]


def rank_main(rank: int, world: int, spec: str, epochs: int, out: Any) -> None:
    """One rank: joins the job, trains ``epochs`` epochs with DDP, reports each."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    import creditflow.spark as cfs
    from creditflow.torch import RankDataset

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(len(FEATURES) + 2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with cfs.Receiver(
        rank=rank, world_size=world, batch_size=1024, job=spec, memory="32MiB", timeout=300
    ) as rx:
        data = RankDataset(rx, columns=[*FEATURES, "target"], device="cpu")
        loader = DataLoader(data, batch_size=None)
        for epoch in range(epochs):
            data.set_epoch(epoch)
            start, steps, rows, total = time.perf_counter(), 0, 0, 0.0
            for batch in loader:
                x = torch.stack([batch[c] for c in FEATURES], dim=1)
                # the price's interactions, so that a small model can fit it
                x = torch.cat(
                    [x, (x[:, 0] * x[:, 4]).unsqueeze(1), (x[:, 0] * x[:, 4] * x[:, 1]).unsqueeze(1)], 1
                )
                loss = torch.nn.functional.mse_loss(model(x).squeeze(1), batch["target"])
                opt.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                opt.step()
                steps, rows, total = steps + 1, rows + len(x), total + float(loss)
            stall = rx.rank_metrics()["stall_total"]
            out.put(
                {
                    "rank": rank,
                    "epoch": epoch,
                    "steps": steps,
                    "rows": rows,
                    "loss": total / max(steps, 1),
                    "seconds": time.perf_counter() - start,
                    "stall_total": stall,
                }
            )
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=600_000)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    world = 2

    import creditflow.spark as cfs

    spark = cfs.local_session("local[2]", "creditflow-train-torch")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = time.perf_counter()
    with cfs.TrainingJob(world_size=world) as job:
        os.environ["MASTER_PORT"] = str(29_500 + os.getpid() % 1_000)
        ranks = [
            ctx.Process(target=rank_main, args=(r, world, job.spec, args.epochs, out)) for r in range(world)
        ]
        for p in ranks:
            p.start()
        df = lineitem_features(spark, args.rows)
        stats = cfs.send(df, job.addresses(timeout=120), job.secret)
        sent = time.perf_counter() - start
        reports = [out.get(timeout=600) for _ in range(world * args.epochs)]
        for p in ranks:
            p.join(120)
    spark.stop()
    for r in sorted(reports, key=lambda r: (r["epoch"], r["rank"])):
        print(json.dumps(r))
    by_epoch = {e: [r for r in reports if r["epoch"] == e] for e in range(args.epochs)}
    summary = {
        "rows": args.rows,
        "partitions": len(stats),
        "send_seconds": round(sent, 2),
        "equal_steps": all(len({r["steps"] for r in rs}) == 1 for rs in by_epoch.values()),
        "rows_per_epoch": [sum(r["rows"] for r in rs) for rs in by_epoch.values()],
        "loss_per_epoch": [round(sum(r["loss"] for r in rs) / len(rs), 6) for rs in by_epoch.values()],
        "exit_codes": [p.exitcode for p in ranks],
    }
    print(json.dumps({"summary": summary}))
    ok = summary["equal_steps"] and all(n == args.rows for n in summary["rows_per_epoch"])
    return 0 if ok and all(c == 0 for c in summary["exit_codes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
