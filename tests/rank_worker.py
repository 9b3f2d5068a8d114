"""One training rank in a process of its own (tests/test_spark_ranks.py): opens
``Receiver(rank=...)`` with the JSON settings given as the only argument, prints its address
as one JSON line, reads ``epochs`` epochs and writes each epoch's row ids to ``<out>.<epoch>``
(binary int64, as they come: nothing grows in memory; ``die_after``: it kills itself after
that many batches of epoch 0), then prints a JSON report: batches per
epoch, the largest batch's bytes, the growth of its resident memory over what it had once the
receiver was open (sampled at every batch) and the largest ``rank_metrics()["memory_bytes"]``."""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np
import pyarrow as pa

import creditflow.spark as cfs


def rss() -> int:
    """Private resident memory (``RssAnon``): the rank's data, not the shared-memory rings of
    its connections (``RssShmem``, mapped by both ends) nor mapped files."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def main() -> None:
    cfg = json.loads(sys.argv[1])
    rx = cfs.Receiver(
        rank=cfg["rank"],
        world_size=cfg["world"],
        batch_size=cfg["batch"],
        secret=cfg["secret"],
        memory=cfg["memory"],
        spill_dir=cfg["spill_dir"],
        shuffle=cfg["shuffle"],
        timeout=300,
    )
    # What the first Arrow kernels map and set up (tens of MB) is not the rank's data.
    warm = pa.record_batch({"x": np.arange(4096)})
    pa.Table.from_batches([warm.take(pa.array(np.arange(4096)[::-1])), warm]).combine_chunks()
    warm.filter(pa.array(np.arange(4096) % 2 == 0))
    base = rss()
    print(json.dumps({"address": rx.address}), flush=True)
    batches: list[int] = []
    batch_bytes = growth = accounted = 0
    try:
        for epoch in range(cfg["epochs"]):
            rx.set_epoch(epoch)
            n = 0
            with open(f"{cfg['out']}.{epoch}", "wb") as out:
                for batch in rx:
                    if n == cfg.get("die_after", -1):
                        os.kill(os.getpid(), signal.SIGKILL)  # the rank dies mid-epoch
                    out.write(batch.column("id").to_numpy().tobytes())
                    batch_bytes = max(batch_bytes, batch.nbytes)
                    growth = max(growth, rss() - base)
                    if n % 8 == 0:
                        accounted = max(accounted, rx.rank_metrics()["memory_bytes"])
                    n += 1
            batches.append(n)
        limit = rx.rank_metrics()["memory_limit"]
        store = rx.spill_metrics()
        spilled = store["spilled_bytes"] if store is not None else 0
    finally:
        rx.close()
    report = {
        "batches": batches,
        "batch_bytes": batch_bytes,
        "rss_growth": growth,
        "accounted": accounted,
        "memory": limit,
        "spilled": spilled,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    sys.exit(main())
