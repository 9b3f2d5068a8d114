"""Where the CPU of Spark's ``exchange`` goes, per group of processes: the JVM, the Python
workers and the host service, for several pipelines run in turn, paired by round.

    python benches/spark_cpu_groups.py                   # many tasks: 16 tasks, 10 rounds
    python benches/spark_cpu_groups.py --tasks 8 --rounds 6
    python benches/spark_cpu_groups.py --pipeline cheap --rounds 6

``--pipeline many-tasks`` (the default) is ``benches/test_bench_spark_scale.py``'s many-task
pipeline (2 M TPC-H-like ``lineitem`` rows generated and cached by Spark, ``exchange`` by
``l_orderkey`` to ``noop``, ``memory="64MiB"``) on ``local[16]``, without its ``Monitor``,
through the host service and with an environment per task. ``--pipeline cheap`` is
``benches/test_bench_spark.py``'s cheap function on ``local[2]`` (20 M generated rows,
``CREDITFLOW_BENCH_SPARK_ROWS``): the no-exchange floor, the fused exchange through the host
service and with an environment per task. Each round runs every pipeline, in an order that
rotates from round to round. Over each run, every process of the groups is read from
``/proc``: its CPU seconds (``stat``: user and system, its ended threads included), and per
thread the time spent waiting for a core and the times it was switched in (``schedstat``; a
thread that ended before the run did is not counted there: where threads come and go these
two are a lower bound). A group is told by its command line: ``java`` (the JVM: driver and
executor), ``pyspark.daemon`` / ``pyspark.worker`` (the Python workers), ``creditflow serve``
(the host service). The table gives the medians, then the medians of each round's ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import creditflow.spark as cfs
from test_bench_spark_scale import MEMORY, lineitem, noop
from training.measure import read_counters

GROUPS = ("jvm", "workers", "service")
#: The pipelines' names in the table.
SERVICE, PER_TASK, FLOOR = "host service", "environment per task", "the floor (no exchange)"
#: (group, pid) -> (CPU s, 0, 0) and (group, pid, tid) -> (0, s waited for a core, switches in).
Snapshot = dict[tuple[str, ...], tuple[float, float, int]]
#: Per group: CPU s, s waited for a core, switches in.
Spent = dict[str, tuple[float, float, int]]


def group_of(pid: str) -> str | None:
    """The group a process belongs to, by its command line; None for any other."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    line = b" ".join(argv)
    if b"creditflow serve" in line:
        return "service"
    if b"pyspark.daemon" in line or b"pyspark.worker" in line:
        return "workers"
    if argv and argv[0].endswith(b"java"):
        return "jvm"
    return None


def snapshot() -> Snapshot:
    """Per grouped process, (group, pid) -> (CPU s, 0, 0); per thread of one, (group, pid,
    tid) -> (0, s waited for a core, switches in)."""
    out: Snapshot = {}
    for pid in os.listdir("/proc"):
        group = pid.isdigit() and group_of(pid)
        if not group:
            continue
        counters = read_counters(int(pid))
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            counters = None
        if counters is None:  # it ended meanwhile
            continue
        out[(group, pid)] = (counters.cpu_seconds, 0.0, 0)
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    _, wait_ns, slices = map(int, f.read().split())
            except OSError:
                continue
            out[(group, pid, tid)] = (0.0, wait_ns / 1e9, slices)
    return out


def spent(before: Snapshot, after: Snapshot) -> Spent:
    """Per group, what its processes spent between two snapshots: a process or thread that
    is new counts from zero; the waits and switches of a thread that ended meanwhile are not
    counted (its CPU is, in its process's)."""
    sums = {g: [0.0, 0.0, 0] for g in GROUPS}
    for key, now in after.items():
        was = before.get(key, (0.0, 0.0, 0))
        for i in range(3):
            sums[key[0]][i] += now[i] - was[i]
    return {g: (s[0], s[1], int(s[2])) for g, s in sums.items()}


def many_tasks(args: argparse.Namespace) -> tuple[Any, dict[str, Callable[[], None]]]:
    """The many-task pipelines: the exchange through the host service and per task."""
    # A barrier stage needs a slot per task.
    spark = cfs.local_session(
        f"local[{max(16, args.tasks)}]",
        "creditflow-bench-cpu-groups",
        {"spark.sql.shuffle.partitions": "16", "spark.driver.memory": "2g"},
    )
    df = lineitem(spark, args.rows, args.tasks).cache()
    df.count()
    runs = {
        SERVICE: lambda: noop(cfs.exchange(df, "l_orderkey", memory=MEMORY, host_service=True)),
        PER_TASK: lambda: noop(cfs.exchange(df, "l_orderkey", memory=MEMORY, host_service=False)),
    }
    return spark, runs


def cheap(args: argparse.Namespace) -> tuple[Any, dict[str, Callable[[], None]]]:
    """The cheap function's pipelines: the floor, and the fused exchange both ways."""
    from test_bench_spark import cheap_pipelines

    spark = cfs.local_session(
        "local[2]",
        "creditflow-bench-cpu-groups",
        {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"},
    )
    made = cheap_pipelines(spark)
    names = {FLOOR: "floor", SERVICE: "fused", PER_TASK: "fused_per_task"}
    runs = {name: (lambda make=made[key]: noop(make())) for name, key in names.items()}
    return spark, runs


def main() -> None:
    """Runs the rounds and prints the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipeline", choices=("many-tasks", "cheap"), default="many-tasks")
    ap.add_argument("--tasks", type=int, default=16, help="many-tasks: the exchange's tasks")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--rows", type=int, default=2_000_000, help="many-tasks: lineitem rows")
    args = ap.parse_args()
    spark, runs = (cheap if args.pipeline == "cheap" else many_tasks)(args)
    for run in runs.values():  # warm-up: the service started, the workers forked
        run()
    spent_by: dict[str, list[tuple[float, Spent]]] = {name: [] for name in runs}
    order = list(runs)
    for _ in range(args.rounds):
        for name in order:
            before, start = snapshot(), time.perf_counter()
            runs[name]()
            spent_by[name].append((time.perf_counter() - start, spent(before, snapshot())))
        order.append(order.pop(0))
    spark.stop()
    report(args, spent_by)


HEADER = (
    "| pipeline | wall s | JVM CPU s | workers CPU s | service CPU s | workers + service "
    "| waited for a core, s | switches in |"
)


def creditflow_side(d: Spent) -> float:
    """CPU seconds of the workers and the service together."""
    return d["workers"][0] + d["service"][0]


def row(name: str, rounds: list[tuple[float, Spent]]) -> str:
    """One stack's line of the table: the medians over its rounds."""

    def med(of: Callable[[Spent], float]) -> float:
        return statistics.median(of(d) for _, d in rounds)

    cells = [
        f"{statistics.median(w for w, _ in rounds):.2f}",
        f"{med(lambda d: d['jvm'][0]):.2f}",
        f"{med(lambda d: d['workers'][0]):.2f}",
        f"{med(lambda d: d['service'][0]):.2f}",
        f"{med(creditflow_side):.2f}",
        f"{med(lambda d: sum(v[1] for v in d.values())):.1f}",
        f"{med(lambda d: sum(v[2] for v in d.values())):,.0f}",
    ]
    return f"| {name} | " + " | ".join(cells) + " |"


def report(args: argparse.Namespace, runs: dict[str, list[tuple[float, Spent]]]) -> None:
    """Prints the table: medians per pipeline, and the paired ratios."""
    if args.pipeline == "cheap":
        print(f"the cheap function, local[2], {args.rounds} rounds (medians)")
    else:
        print(f"{args.tasks} tasks, {args.rows:,} lineitem rows, {args.rounds} rounds (medians)")
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|")
    for name, rounds in runs.items():
        print(row(name, rounds))
    pairs = [(a, b) for a, b in ((SERVICE, PER_TASK), (SERVICE, FLOOR), (PER_TASK, FLOOR)) if b in runs]
    for a, b in pairs:
        both = list(zip(runs[a], runs[b], strict=True))
        ratios = {
            "wall": [x[0] / y[0] for x, y in both],
            "JVM CPU": [x[1]["jvm"][0] / y[1]["jvm"][0] for x, y in both],
            "workers + service CPU": [creditflow_side(x[1]) / creditflow_side(y[1]) for x, y in both],
        }
        for what, rs in ratios.items():
            rounds = [round(r, 3) for r in rs]
            print(f"{a} / {b}, paired, {what}: {statistics.median(rs):.3f}x (rounds {rounds})")


if __name__ == "__main__":
    main()
