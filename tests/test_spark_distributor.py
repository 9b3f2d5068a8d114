"""Ranks started by torch's launchers. PySpark's ``TorchDistributor`` runs the training
function as a barrier job of 2 tasks (CPU, gloo), each rank finds the driver through a
``TrainingJob`` spec passed as an argument, and the DataFrame streams to them as another job
of the same session. ``torchrun`` starts 2 rank processes that find the driver through the
``CREDITFLOW_JOB`` environment variable and their rank through torchrun's own.

A barrier stage needs as many free task slots as it has tasks, and the sending job needs one
more while the ranks run: the session is ``local[4]`` (the other Spark tests use 2 slots).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

pyspark = pytest.importorskip("pyspark")
pytest.importorskip("torch")
from pyspark.ml.torch.distributor import TorchDistributor  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import creditflow.spark as cfs  # noqa: E402


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = cfs.local_session("local[4]", "creditflow-test-distributor")
    try:
        yield session
    finally:
        session.stop()


def test_torch_distributor_ranks_are_spark_tasks_fed_by_another_job(spark: SparkSession) -> None:
    """Two epochs with an all-reduce per step (unequal steps would hang it): both ranks take
    the same number of steps, and every row reaches one rank per epoch."""
    rows, batch, epochs = 20_011, 500, 2
    df = spark.range(0, rows, numPartitions=3).selectExpr("id", "cast(id as float) as x")

    # Defined here so that it travels by value to the tasks (the test module is not on the
    # Spark workers' path).
    def train(spec: str, epochs: int, batch: int) -> dict[str, Any] | None:
        import torch.distributed as dist
        from torch.utils.data import DataLoader

        import creditflow.spark as cfs
        from creditflow.torch import RankDataset

        dist.init_process_group("gloo")  # torchrun's RANK, WORLD_SIZE, MASTER_ADDR
        steps: list[int] = []
        ids: list[list[int]] = []
        with cfs.Receiver(batch_size=batch, job=spec, timeout=300) as rx:
            data = RankDataset(rx, columns=["id", "x"])
            for epoch in range(epochs):
                data.set_epoch(epoch)
                n, got = 0, []
                for item in DataLoader(data, batch_size=None):
                    total = item["x"].sum()
                    dist.all_reduce(total)
                    n += 1
                    got.extend(item["id"].tolist())
                steps.append(n)
                ids.append(got)
        rank = dist.get_rank()
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, {"rank": rank, "steps": steps, "ids": ids})
        dist.destroy_process_group()
        return {"ranks": every} if rank == 0 else None

    result: dict[str, Any] = {}
    with cfs.TrainingJob(world_size=2) as job:

        def sender() -> None:
            try:
                result["stats"] = cfs.send(df, job.addresses(timeout=300), job.secret)
            except BaseException as exc:
                result["error"] = exc

        t = threading.Thread(target=sender)
        t.start()
        out = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
            train, job.spec, epochs, batch
        )
        t.join(300)
    assert "error" not in result, result
    ranks = sorted(out["ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["steps"] == ranks[1]["steps"], "equal steps"
    for e in range(epochs):
        got = np.sort(np.array(ranks[0]["ids"][e] + ranks[1]["ids"][e]))
        assert np.array_equal(got, np.arange(rows)), f"epoch {e}: every row once"


def test_torchrun_ranks_find_the_job_through_the_environment(spark: SparkSession, tmp_path: Path) -> None:
    """``torchrun --nproc-per-node 2``: each rank takes ``RANK``/``WORLD_SIZE`` from torchrun
    and the job from ``CREDITFLOW_JOB``; two epochs with an all-reduce per step end on both
    ranks (equal steps), and every row reaches one rank per epoch."""
    rows, batch, epochs = 30_007, 512, 2
    df = spark.range(0, rows, numPartitions=3).selectExpr("id", "cast(id as float) as x")
    torchrun = Path(sys.executable).parent / "torchrun"
    script = Path(__file__).resolve().parent / "torchrun_rank.py"
    out = tmp_path / "ids"
    with cfs.TrainingJob(world_size=2) as job:
        env = {**os.environ, **job.env}
        cmd = [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            str(out),
            str(epochs),
            str(batch),
        ]
        with subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as ranks:
            try:
                cfs.send(df, job.addresses(timeout=300), job.secret)
                output, _ = ranks.communicate(timeout=300)
            finally:
                ranks.kill()
    assert ranks.returncode == 0, output
    for e in range(epochs):
        got = [np.fromfile(f"{out}.{r}.{e}", dtype=np.int64) for r in range(2)]
        steps = [int(Path(f"{out}.{r}.{e}.steps").read_text()) for r in range(2)]
        assert steps[0] == steps[1] > 0, f"epoch {e}: equal steps"
        assert np.array_equal(np.sort(np.concatenate(got)), np.arange(rows)), f"epoch {e}: every row once"
