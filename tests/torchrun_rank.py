"""One rank of a job started by ``torchrun`` (tests/test_spark_distributor.py): finds the
driver through ``CREDITFLOW_JOB`` and its rank through torchrun's ``RANK``/``WORLD_SIZE``
(``Receiver(batch_size=...)`` with neither a rank nor a secret), joins torch's process group
(gloo, torchrun's ``MASTER_ADDR``/``MASTER_PORT``), reads ``epochs`` epochs with an all-reduce
per step (a rank with a step more would hang the other) and writes each epoch's row ids to
``<out>.<rank>.<epoch>`` (binary int64), its step count to ``<out>.<rank>.<epoch>.steps``."""

from __future__ import annotations

import sys

import torch.distributed as dist
from torch.utils.data import DataLoader

import creditflow.spark as cfs
from creditflow.torch import RankDataset


def main() -> None:
    out, epochs, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo")
    rx = cfs.Receiver(batch_size=batch, timeout=300)
    data = RankDataset(rx)
    try:
        for epoch in range(epochs):
            rx.set_epoch(epoch)
            steps = 0
            with open(f"{out}.{dist.get_rank()}.{epoch}", "wb") as f:
                for item in DataLoader(data, batch_size=None):
                    step = item["id"].sum()
                    dist.all_reduce(step)
                    f.write(item["id"].numpy().tobytes())
                    steps += 1
            with open(f"{out}.{dist.get_rank()}.{epoch}.steps", "w") as f:
                f.write(str(steps))
    finally:
        rx.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
