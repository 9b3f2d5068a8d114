"""CPU seconds per GB and GB/s of creditflow between processes, 1→1 and N×N all-to-all,
beside N raw-TCP pairs, measured in one run.

Runs as it is on any Linux machine with Python, numpy, pyarrow, the creditflow wheel and the
``creditflow-rawtcp`` binary (``cargo build --release -p creditflow-rawtcp``; ``--rawtcp``
points at it elsewhere)::

    python benches/nxn.py                          # N = 1 2 4 8, TCP and shared memory, 3 rounds
    python benches/nxn.py --sizes 1 --transports tcp --rounds 6 --gb 2
    python benches/nxn.py --sizes 8 --transports tcp --pattern pairs   # N 1→1 pairs of creditflow

For each N, N producer processes (one environment, one partition of N subpartitions, one
writer thread, round robin) and N consumer processes (one environment, one gate of N
channels: subpartition j of every producer, one reader thread) move ``--gb`` GB of
65,536-row batches of four numeric columns (2 MiB each; ``--rows`` sets the rows). Every
producer starts its timed writes at the same instant after a warm-up that connected every
channel. With ``--pattern
pairs`` producer i has one subpartition, read by consumer i alone: N creditflow 1→1 transfers at
once, as the raw row's pairs are (what all-to-all adds over N processes a side: N channels per
consumer, each with a record being read into).

* GB/s: Arrow bytes written / (last consumer's end of stream − first timed write).
* CPU s/GB: the CPU seconds (``process_time``, user + system, all threads) of every producer
  and consumer process from the start of the timed writes to the end (a producer's until its
  sender loop has sent everything), per GB.
* The raw row runs N ``creditflow-rawtcp bench`` pairs at once, each moving the same bytes as
  one producer does, with 1 MiB writes and reads; its CPU is the pairs' rusage, its GB/s the
  total bytes over the slowest pair's time.

Rounds alternate creditflow and raw (paired), and the table gives medians of the rounds and
the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from remote import POOL, ROWS, make_batches, payload_bytes, transfer

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 2  # batches per channel before the timed transfer

#: One timed transfer: GB/s, CPU s/GB, seconds (and CPU s/GB by thread for creditflow).
Round = dict[str, Any]


def creditflow_round(
    n: int,
    transport: str,
    count: int,
    env: dict[str, Any],
    pool: int = POOL,
    pairs: bool = False,
    rows: int = ROWS,
) -> Round:
    """One timed N×N transfer: ``count`` batches of ``rows`` rows from each producer (cycling
    ``pool`` distinct ones), spread round robin; with ``pairs``, producer i's all to consumer i."""
    settings = {**env, "shared_memory": transport == "shm"}
    fan = 1 if pairs else n
    producers = [
        {
            "env": settings,
            "partitions": [f"p{i}"],
            "subpartitions": fan,
            "partitioner": "round_robin",
            "count": count,
            "warmup": WARMUP * fan,
            "columns": "numeric",
            "pool": pool,
            "rows": rows,
        }
        for i in range(n)
    ]

    def channels(addresses: list[str], j: int) -> list[list[Any]]:
        """Consumer j's channels: producer j's one subpartition, or subpartition j of all."""
        if pairs:
            return [[addresses[j], f"p{j}", 0]]
        return [[addresses[i], f"p{i}", j] for i in range(n)]

    t = transfer(
        producers,
        lambda addresses: [
            {
                "env": settings,
                "gates": [channels(addresses, j)],
                "warmup": WARMUP * fan,
                "verify": False,
                "columns": "numeric",
            }
            for j in range(n)
        ],
    )
    gb = t["bytes"] / 1e9
    return {
        "gbps": t["gbps"],
        "cpu_per_gb": t["cpu"] / gb,
        "seconds": t["seconds"],
        "threads_per_gb": {k: v / gb for k, v in t["threads"].items()},
    }


def raw_round(exe: Path, n: int, nbytes: int) -> Round:
    """N raw-TCP pairs at once, ``nbytes`` each."""
    procs = [
        subprocess.Popen([str(exe), "bench", str(nbytes)], stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    cpu = 0.0
    seconds = []
    for p in procs:
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        assert p.stdout is not None
        out = p.stdout.read()
        p.stdout.close()
        if p.returncode != 0:
            raise RuntimeError(f"creditflow-rawtcp failed ({p.returncode})")
        got = json.loads(out)
        if got["bytes"] != nbytes:
            raise RuntimeError(f"raw pair moved {got['bytes']} bytes, not {nbytes}")
        seconds.append(got["seconds"])
        cpu += usage.ru_utime + usage.ru_stime
    total = n * nbytes
    return {"gbps": total / max(seconds) / 1e9, "cpu_per_gb": cpu / (total / 1e9), "seconds": max(seconds)}


def _rawtcp(path: str | None) -> Path:
    if path:
        return Path(path)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    exe = target / "release" / "creditflow-rawtcp"
    if not exe.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "creditflow-rawtcp"], cwd=ROOT, check=True)
    return exe


def _label(n: int, pairs: bool) -> str:
    return f"{n} pairs" if pairs else f"{n}×{n}"


def summarise(
    label: str, n: int, transport: str, gb: float, cf: list[Round], raw: list[Round]
) -> dict[str, Any]:
    """One table row: medians of the rounds, and medians of the per-round ratios."""
    med = statistics.median
    pairs = list(zip(cf, raw, strict=True))
    return {
        "n": n,
        "label": label,
        "transport": transport,
        "gb": gb,
        "cf_gbps": med(r["gbps"] for r in cf),
        "raw_gbps": med(r["gbps"] for r in raw),
        "cf_cpu_per_gb": med(r["cpu_per_gb"] for r in cf),
        "raw_cpu_per_gb": med(r["cpu_per_gb"] for r in raw),
        "gbps_ratio": med(c["gbps"] / r["gbps"] for c, r in pairs),
        "cpu_ratio": med(c["cpu_per_gb"] / r["cpu_per_gb"] for c, r in pairs),
        "rounds": {"creditflow": cf, "raw": raw},
    }


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['label']} {row['transport']:3}: creditflow {row['cf_gbps']:6.2f} GB/s "
        f"{row['cf_cpu_per_gb']:.3f} CPU s/GB | raw {row['raw_gbps']:6.2f} GB/s "
        f"{row['raw_cpu_per_gb']:.3f} CPU s/GB | ratio GB/s {row['gbps_ratio']:.2f}x, "
        f"CPU/GB {row['cpu_ratio']:.2f}x"
    )


def _round_line(label: str, transport: str, r: Round) -> str:
    """A creditflow round alone, with the CPU of each kind of thread (``--no-raw``)."""
    threads = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["threads_per_gb"].items()) if v)
    return f"{label} {transport}: {r['gbps']:.2f} GB/s, {r['cpu_per_gb']:.3f} CPU s/GB ({threads})"


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as the Markdown table of docs/benchmarks.md."""
    out = [
        "| N×N | transport | GB | creditflow GB/s | raw GB/s | GB/s ratio "
        "| creditflow CPU s/GB | raw CPU s/GB | CPU ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {r['label']} | {r['transport']} | {r['gb']:.2f} | {r['cf_gbps']:.2f} "
        f"| {r['raw_gbps']:.2f} | {r['gbps_ratio']:.2f}× | {r['cf_cpu_per_gb']:.3f} "
        f"| {r['raw_cpu_per_gb']:.3f} | {r['cpu_ratio']:.2f}× |"
        for r in rows
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8], help="processes a side")
    ap.add_argument("--transports", nargs="+", default=["tcp", "shm"], choices=["tcp", "shm"])
    ap.add_argument("--gb", type=float, default=1.0, help="GB moved per N×N transfer")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pool", type=int, default=POOL, help="distinct batches each producer sends, cycled")
    ap.add_argument("--rows", type=int, default=ROWS, help="rows per batch (32 bytes a row)")
    ap.add_argument("--env", default="{}", help="JSON NetworkEnvironment settings over the defaults")
    ap.add_argument("--rawtcp", help="path of the creditflow-rawtcp binary")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument(
        "--pattern",
        choices=["all-to-all", "pairs"],
        default="all-to-all",
        help="all-to-all: every producer to every consumer; pairs: producer i to consumer i only",
    )
    ap.add_argument("--no-raw", action="store_true", help="creditflow only, each round with its threads' CPU")
    args = ap.parse_args(argv)
    env = {"memory": "64MiB", "segment_size": "32KiB", **json.loads(args.env)}
    exe = None if args.no_raw else _rawtcp(args.rawtcp)  # --no-raw needs neither it nor cargo
    batch = payload_bytes(make_batches(args.rows, columns="numeric"), 1)
    pairs = args.pattern == "pairs"
    rows: list[dict[str, Any]] = []
    for n in args.sizes:
        label = _label(n, pairs)
        # Batches per producer: a multiple of N, so every channel gets the same share.
        count = max(n, round(args.gb * 1e9 / batch / n / n) * n)
        per_pair = count * batch
        for transport in args.transports:
            cf_rounds: list[Round] = []
            raw_rounds: list[Round] = []
            for _ in range(args.rounds):
                cf_rounds.append(creditflow_round(n, transport, count, env, args.pool, pairs, args.rows))
                if args.no_raw:
                    print(_round_line(label, transport, cf_rounds[-1]), flush=True)
                else:
                    assert exe is not None
                    raw_rounds.append(raw_round(exe, n, per_pair))
            if not args.no_raw:
                rows.append(summarise(label, n, transport, n * per_pair / 1e9, cf_rounds, raw_rounds))
                print(_line(rows[-1]), flush=True)
    if rows:
        print(f"\n{table(rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
