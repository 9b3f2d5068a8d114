"""``python -m benches.training``: run the contenders in rounds, print the table.

Every round runs each contender once (the order rotates from round to round, so none always
runs first or last), after a ``noop`` write of the DataFrame (what Spark alone takes to compute
it: no contender can deliver it faster) and a ``mapInArrow`` that only counts the rows (what
any consumer in Python pays: the JVM's Arrow conversion and a Python worker per task; and when
its first batch reaches Python). Figures are medians over the rounds. Everything goes
to ``--out`` as JSON too (every round, every rank's figures).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from benches.training import contenders, report
from benches.training.config import Config
from benches.training.measure import Sampler
from benches.training.ranks import ROOT


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benches.training", description=__doc__)
    p.add_argument("--contenders", default=",".join(contenders.DEFAULT), help="comma-separated names")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", type=int, default=Config.rows)
    p.add_argument("--partitions", type=int, default=Config.partitions)
    p.add_argument("--epochs", type=int, default=Config.epochs)
    p.add_argument("--timeout", type=float, default=Config.timeout, help="seconds per contender and round")
    p.add_argument("--scratch", type=Path, default=ROOT / "target" / "bench-training" / "scratch")
    p.add_argument("--out", type=Path, default=ROOT / "target" / "bench-training" / "results.json")
    p.add_argument(
        "--install-notes",
        type=Path,
        default=Path(sys.prefix) / "peer-install.json",
        help="what the environment's installer said of each peer (scripts/bootstrap-bench-venv.sh)",
    )
    return p.parse_args(argv)


def session() -> Any:
    # Spark's Python workers import benches.* from the repository.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # nothing here needs the Hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # No .pyc files written on a module's first import (they would count as bytes written by
    # whichever contender imports it first), here, in the ranks and in Spark's workers.
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.dont_write_bytecode = True
    import creditflow.spark as cfs

    return cfs.local_session(
        "local[2]",
        "creditflow-bench-training",
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.memory": "3g",
            # The JVM's perf-data file in /tmp would count as bytes written.
            "spark.driver.extraJavaOptions": "-XX:-UsePerfData",
        },
    )


def main(argv: list[str]) -> int:
    args = parse(argv)
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    for n in names:
        contenders.get(n)  # unknown names fail before Spark starts
    cfg = Config(rows=args.rows, partitions=args.partitions, epochs=args.epochs, timeout=args.timeout)
    spark = session()
    from benches.training.data import expected, features, python_floor

    def part_of(parts: Any) -> Any:
        return features(spark, cfg.rows, cfg.partitions, cfg.seed, parts)

    df = features(spark, cfg.rows, cfg.partitions, cfg.seed)
    start = time.monotonic()
    want = expected(df)  # also the warm-up: JVM, Python workers, imports in them
    print(
        f"DataFrame: {want[0]:,} rows, {len(df.columns)} columns; counted in {time.monotonic() - start:.1f} s"
    )
    trials: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    floor: list[dict[str, Any]] = []
    order = list(names)
    for index in range(args.rounds):
        args.scratch.mkdir(parents=True, exist_ok=True)
        sampler = Sampler(root=os.getpid(), directory=args.scratch).start()
        start = time.monotonic()
        df.write.format("noop").mode("overwrite").save()
        usage = sampler.stop()
        floor.append(
            {"seconds": time.monotonic() - start, "write_bytes": usage.write_bytes, "cpu": usage.cpu_seconds}
        )
        sampler = Sampler(root=os.getpid(), directory=args.scratch).start()
        python = python_floor(df)
        python["cpu"] = sampler.stop().cpu_seconds
        floor[-1]["python"] = python
        print(
            f"round {index + 1}: Spark alone (noop write) {floor[-1]['seconds']:.2f} s; a Python consumer "
            f"(mapInArrow counting rows) {python['seconds']:.2f} s, "
            f"its first batch at {python['first_batch']:.2f} s",
            flush=True,
        )
        for name in order:
            from benches.training.trial import run_trial

            result = run_trial(name, cfg, spark, df, part_of, want, args.scratch / name)
            result["round"] = index
            trials[name].append(result)
            shown = (
                result.get("error")
                or f"first batch {result['first_batch']:.2f} s, total {result['total']:.2f} s"
            )
            print(f"round {index + 1}: {name}: {shown}", flush=True)
        order.append(order.pop(0))
    spark.stop()
    summaries = {n: report.summarize(ts) for n, ts in trials.items()}
    installs = json.loads(args.install_notes.read_text()) if args.install_notes.exists() else {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "date": datetime.date.today().isoformat(),
                "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}",
                "config": json.loads(cfg.to_json()),
                "expected": want,
                "floor": floor,
                "installs": installs,
                "trials": trials,
                "summaries": summaries,
            },
            indent=1,
        )
    )
    floor_s = report.median([f["seconds"] for f in floor])
    py_s = report.median([f["python"]["seconds"] for f in floor])
    py_first = report.median([f["python"]["first_batch"] for f in floor])
    py_cpu = report.median([f["python"]["cpu"] for f in floor])
    print()
    print(f"Spark alone (noop write of the DataFrame): {floor_s:.2f} s (median of {len(floor)})")
    print(
        f"A Python consumer (mapInArrow counting rows): {py_s:.2f} s, first batch at {py_first:.2f} s, "
        f"{py_cpu:.1f} CPU s (medians)"
    )
    print(report.table(summaries, want[0]))
    print()
    print(report.errors(summaries) or "no errors")
    for name, note in installs.items():
        print(f"- install note, {name}: {note}")
    print()
    print(report.goals(summaries, trials))
    print(f"\nevery round: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
