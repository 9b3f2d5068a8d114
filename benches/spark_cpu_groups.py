"""Where the CPU of Spark's many-task ``exchange`` goes, per group of processes: the JVM, the
Python workers and the host service, through the host service against an environment per
task, paired by round.

    python benches/spark_cpu_groups.py                   # 16 tasks, 10 rounds
    python benches/spark_cpu_groups.py --tasks 8 --rounds 6

The pipeline is ``benches/test_bench_spark_scale.py``'s many-task one (2 M TPC-H-like
``lineitem`` rows generated and cached by Spark, ``exchange`` by ``l_orderkey`` to ``noop``,
``memory="64MiB"``) on ``local[16]``, without its ``Monitor``. Each round runs both stacks,
every other round in the other order. Over each exchange, every process of the groups is read
from ``/proc``: its CPU seconds (``stat``: user and system, its ended threads included), and
per thread the time spent waiting for a core and the times it was switched in (``schedstat``;
a thread that ended before the exchange did is not counted there: where threads come and go
these two are a lower bound). A group is told by its command line: ``java`` (the JVM: driver
and executor), ``pyspark.daemon`` / ``pyspark.worker`` (the Python workers), ``creditflow
serve`` (the host service). The table gives the medians, and the median of each round's
service / per task ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import creditflow.spark as cfs
from test_bench_spark_scale import MEMORY, lineitem, noop
from training.measure import read_counters

GROUPS = ("jvm", "workers", "service")
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


def main() -> None:
    """Runs the rounds and prints the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--rows", type=int, default=2_000_000)
    args = ap.parse_args()
    # A barrier stage needs a slot per task.
    spark = cfs.local_session(
        f"local[{max(16, args.tasks)}]",
        "creditflow-bench-cpu-groups",
        {"spark.sql.shuffle.partitions": "16", "spark.driver.memory": "2g"},
    )
    df = lineitem(spark, args.rows, args.tasks).cache()
    df.count()
    runs: dict[bool, list[tuple[float, Spent]]] = {True: [], False: []}
    for service in (True, False):  # warm-up: the service started, the workers forked
        noop(cfs.exchange(df, "l_orderkey", memory=MEMORY, host_service=service))
    for r in range(args.rounds):
        for service in (True, False) if r % 2 == 0 else (False, True):
            before, start = snapshot(), time.perf_counter()
            noop(cfs.exchange(df, "l_orderkey", memory=MEMORY, host_service=service))
            runs[service].append((time.perf_counter() - start, spent(before, snapshot())))
    spark.stop()
    report(args, runs)


HEADER = (
    "| stack | wall s | JVM CPU s | workers CPU s | service CPU s | workers + service "
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


def report(args: argparse.Namespace, runs: dict[bool, list[tuple[float, Spent]]]) -> None:
    """Prints the table: medians per stack, and the paired ratios."""
    print(f"{args.tasks} tasks, {args.rows:,} lineitem rows, {args.rounds} rounds (medians)")
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|")
    print(row("host service", runs[True]))
    print(row("environment per task", runs[False]))
    pairs = list(zip(runs[True], runs[False], strict=True))
    ratios = {
        "wall": [a[0] / b[0] for a, b in pairs],
        "JVM CPU": [a[1]["jvm"][0] / b[1]["jvm"][0] for a, b in pairs],
        "workers + service CPU": [creditflow_side(a[1]) / creditflow_side(b[1]) for a, b in pairs],
    }
    for name, rs in ratios.items():
        rounds = [round(x, 3) for x in rs]
        print(f"service / per task, paired, {name}: {statistics.median(rs):.3f}x (rounds {rounds})")


if __name__ == "__main__":
    main()
