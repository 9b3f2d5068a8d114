"""An exchange of N tasks on 3 hosts of the multi-host test bed (``tests/multihost.py``): the
host service against an environment per task against Spark's shuffle.

Run as root: ``.venv/bin/python benches/multihost_scale.py --tasks 12`` (then ``--tasks 24``).
It brings up a bed of 3 worker hosts (``a``, ``b``, ``e``: network namespaces on one bridge)
with executors of 2 cores, N / 3 task slots per host, runs ``lineitem`` rows (``--rows``)
through three pipelines, each ending in a ``noop`` write, and prints one JSON object:

* ``spark``: ``df.repartition(N, "l_orderkey").mapInArrow(f)``;
* ``service``: ``creditflow.spark.exchange(df, "l_orderkey", func=f)`` through each host's
  service (one pool of ``spark.creditflow.hostMemory`` per host);
* ``per_task``: the same with ``host_service=False`` (an environment per task, ``memory`` each).

``f`` counts its partition's rows. The per-task ``memory`` times the tasks of a host is the
host memory, so both creditflow stacks have the same memory per host. Every round runs the
three back to back in a rotating order (paired rounds); the figures are medians, wall seconds
on the driver. Before the rounds, each creditflow stack runs once with a function that samples
what the task's stack holds (connections it opened that are up, its pool, the bytes its local
pools hold) while it reads; the sums per host are the figures, and every pipeline's rows are
checked against Spark's placement.

All the bed's processes share this machine's cores: the time figures compare the three
pipelines under the same contention, not what 3 hosts of their own would take.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import multihost  # noqa: E402
from spark_data import lineitem, placement  # noqa: E402

HOSTS = ("a", "b", "e")
EXECUTOR_CORES = 2
FIGURES = ("opened", "held", "pool")


def count_rows() -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The pipelines' function: the partition's row count, one row."""

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        n = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_pydict({"n": [n]}, schema=pa.schema([("n", pa.int64())]))

    return count


def stack_sample() -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """An exchange function that reads its partition and returns, once, the most its network
    stack held while it read: host (network namespace), stack (the service's pid or the
    worker's own), ``opened`` connections that are up, ``held`` bytes, ``pool`` bytes."""

    def sample(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from creditflow.spark import _process

        def now() -> tuple[int, dict[str, Any]]:
            envs = [env for env, users in _process._CACHE.envs.values() if users]
            if envs:
                return os.getpid(), dict(envs[0].metrics())
            attached = list(_process._ATTACHMENTS.by_name.values())[-1]
            return attached.service_pid, dict(attached.metrics())

        top = dict.fromkeys(FIGURES, 0)
        stack, n = 0, 0
        for b in batches:
            n += b.num_rows
            stack, m = now()
            values = {
                "opened": m["connections_opened"],
                "held": (m["segments_total"] - m["segments_available"]) * m["segment_size"],
                "pool": m["segments_total"] * m["segment_size"],
            }
            top = {k: max(top[k], values[k]) for k in FIGURES}
        row = {"host": os.stat("/proc/self/ns/net").st_ino, "stack": stack, "n": n, **top}
        yield pa.RecordBatch.from_pylist([row], schema=pa.schema([(k, pa.int64()) for k in row]))

    return sample


SAMPLE_SCHEMA = "host long, stack long, n long, opened long, held long, pool long"


def per_host(rows: list[Any], names: dict[int, str]) -> dict[str, dict[str, int]]:
    """The sampled figures summed over each host's stacks (a stack's figure is the most any of
    its tasks saw)."""
    stacks: dict[str, dict[int, dict[str, int]]] = {}
    for r in rows:
        s = stacks.setdefault(names[r["host"]], {}).setdefault(r["stack"], dict.fromkeys(FIGURES, 0))
        for k in FIGURES:
            s[k] = max(s[k], r[k])
    return {
        host: {"stacks": len(by), **{k: sum(s[k] for s in by.values()) for k in FIGURES}}
        for host, by in sorted(stacks.items())
    }


def run(tasks: int, rows: int, rounds: int, task_memory: int) -> dict[str, Any]:
    import creditflow.spark as cfs

    if tasks % len(HOSTS) or (tasks // len(HOSTS)) % EXECUTOR_CORES:
        raise SystemExit(f"--tasks must be a multiple of {len(HOSTS) * EXECUTOR_CORES}")
    on_host = tasks // len(HOSTS)
    load = os.getloadavg()
    base = Path(tempfile.mkdtemp(prefix="creditflow-multihost-bench-"))
    with multihost.cluster(base, HOSTS, cores=on_host, worker_memory=f"{on_host * 448}m") as bed:
        conf = {
            **bed.session_conf(),
            "spark.executor.cores": str(EXECUTOR_CORES),
            "spark.creditflow.hostMemory": str(task_memory * on_host),
        }
        spark = cfs.local_session(bed.master_url, f"creditflow-bench-multihost-{tasks}", conf)
        try:
            from creditflow.spark._driver import concurrent_slots

            deadline = time.monotonic() + 300
            while concurrent_slots(spark) < tasks:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{concurrent_slots(spark)} of {tasks} slots after 300 s\n{bed.logs()}"
                    )
                time.sleep(1)
            df = lineitem(spark, rows, tasks).cache()
            df.count()
            want = placement(df.repartition(tasks, "l_orderkey"))
            names = {os.stat(f"/run/netns/{h.ns}").st_ino: n for n, h in bed.net.hosts.items()}
            f = count_rows()
            pipelines = {
                "spark": lambda: df.repartition(tasks, "l_orderkey").mapInArrow(f, "n long"),
                "service": lambda: cfs.exchange(df, "l_orderkey", func=f, schema="n long", host_service=True),
                "per_task": lambda: cfs.exchange(
                    df, "l_orderkey", func=f, schema="n long", memory=task_memory, host_service=False
                ),
            }
            figures: dict[str, Any] = {}
            for name, service in (("service", True), ("per_task", False)):
                out = cfs.exchange(df, "l_orderkey", memory=task_memory, host_service=service)
                assert placement(out) == want, name
                sampled = cfs.exchange(
                    df,
                    "l_orderkey",
                    func=stack_sample(),
                    schema=SAMPLE_SCHEMA,
                    memory=task_memory,
                    host_service=service,
                ).collect()
                assert sum(r["n"] for r in sampled) == rows, name
                figures[name] = per_host(sampled, names)
            for make in pipelines.values():  # warm-up
                make().write.format("noop").mode("overwrite").save()
            times: dict[str, list[float]] = {name: [] for name in pipelines}
            order = list(pipelines)
            for _ in range(rounds):
                for name in order:
                    start = time.perf_counter()
                    pipelines[name]().write.format("noop").mode("overwrite").save()
                    times[name].append(round(time.perf_counter() - start, 3))
                order.append(order.pop(0))
        finally:
            spark.stop()
    # The bed's logs and work directories: kept only when the run failed (above), for its cause.
    shutil.rmtree(base, ignore_errors=True)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {
        "tasks": tasks,
        "hosts": len(HOSTS),
        "tasks_per_host": on_host,
        "rows": rows,
        "task_memory": task_memory,
        "host_memory": task_memory * on_host,
        "load_at_start": load,
        "load_at_end": os.getloadavg(),
        "per_host": figures,
        "rounds": times,
        "median_s": med,
        "x_spark": {name: round(m / med["spark"], 3) for name, m in med.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=12)
    p.add_argument("--rows", type=int, default=600_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--task-memory", default="16MiB")
    args = p.parse_args()
    import creditflow as cf

    print(json.dumps(run(args.tasks, args.rows, args.rounds, cf.parse_bytes(args.task_memory))), flush=True)


if __name__ == "__main__":
    main()
