#!/usr/bin/env python3
"""Soak test of the TCP transport (``make soak``; not part of ``make test``).

Two processes (``tests/remote_worker.py`` workers): process A writes 4 partitions of 4
subpartitions round robin, one writer thread each, as fast as it can; process B reads them
through 4 gates, gate j reading subpartition j of every partition (4x4 channels over one
connection), each reader stalling at random (a stall of up to ``--longest-stall`` seconds
every ``--stall-every`` seconds on average). Every batch carries (producer, channel, seq,
checksum); B checks them as they come.

Every 5 s it prints progress and samples the resident set size of both processes. At the end
the producers close their partitions, B reads to the end, and it prints batches
sent/received/lost/duplicated/out of order/corrupted, RSS first/last/max of each process and
every error seen. Exit code 1 on any loss, duplicate, reordering, corruption or error.

    python scripts/soak.py --minutes 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from remote_worker import Worker, soak_gates, soak_partitions, vm_rss_kib
from workers import WorkerError

PARTITIONS = 4
CHANNELS = 4
SAMPLE_EVERY = 5.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--minutes", type=float, default=10.0, help="how long the producers write (default 10)")
    p.add_argument("--rows", type=int, default=8192, help="rows of the largest batch (default 8192)")
    p.add_argument("--memory", default="32MiB", help="network memory of each process (default 32MiB)")
    p.add_argument("--flow-control", default="credit", choices=["credit", "tcp"])
    p.add_argument("--stall-every", type=float, default=5.0, help="mean seconds between a reader's stalls")
    p.add_argument("--longest-stall", type=float, default=2.0, help="longest stall, seconds")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    env = {"memory": args.memory, "flow_control": args.flow_control}
    partitions = soak_partitions(args.rows, PARTITIONS, CHANNELS)
    errors: list[str] = []
    rss: dict[str, list[int]] = {"producer": [], "consumer": []}
    sent: dict[str, int] = {}
    done: list[dict[str, Any]] = []
    started = time.monotonic()
    with Worker("producer", env=env, partitions=partitions) as a:
        address = a.wait_for("address")["address"]
        gates = soak_gates(address, PARTITIONS, CHANNELS)
        stalls = {"seed": args.seed, "every": args.stall_every, "longest": args.longest_stall}
        with Worker("consumer", env=env, gates=gates, data="seq", random_stalls=stalls) as b:
            b.wait_for("address")
            workers = {"producer": a, "consumer": b}
            deadline = started + args.minutes * 60
            try:
                while (now := time.monotonic()) < deadline:
                    time.sleep(min(SAMPLE_EVERY, deadline - now))
                    for name, w in workers.items():
                        rss[name].append(vm_rss_kib(w.pid))
                    b.send(cmd="report")
                    received = b.wait_for("report")["report"]
                    print(
                        f"[{time.monotonic() - started:7.1f} s] received {sum(received):>9,} batches"
                        f" (per gate {received}); RSS producer {mib(rss['producer'][-1])},"
                        f" consumer {mib(rss['consumer'][-1])}",
                        flush=True,
                    )
                a.send(cmd="stop")
                for _ in partitions:
                    for key, n in a.wait_for("finished")["sent"].items():
                        sent[key] = sent.get(key, 0) + n
                done = b.wait_for("done")["done"]
                a.send(cmd="exit")
                a.wait()
                b.wait()
            except WorkerError as exc:
                errors.append(str(exc))

    unique: dict[str, int] = {}
    for g in done:
        unique.update(g["unique"])
    counted = ("batches", "rows", "duplicated", "out_of_order", "corrupted")
    total = {k: sum(g[k] for g in done) for k in counted}
    lost = sum(max(0, n - unique.get(key, 0)) for key, n in sent.items())
    unexpected = sorted(set(unique) - set(sent))
    if not done and not errors:
        errors.append("the consumer reported nothing")
    report = {
        "seconds": round(time.monotonic() - started, 1),
        "channels": len(sent),
        "sent": sum(sent.values()),
        "received": total["batches"],
        "rows_received": total["rows"],
        "lost": lost,
        "duplicated": total["duplicated"],
        "out_of_order": total["out_of_order"],
        "corrupted": total["corrupted"],
        "unexpected_channels": unexpected,
        "rss_mib": {
            name: {"first": s[0] / 1024, "last": s[-1] / 1024, "max": max(s) / 1024} if s else {}
            for name, s in rss.items()
        },
        "errors": errors,
    }
    print(f"soak: {report['seconds']} s, {report['channels']} channels, {args.flow_control} flow control")
    for key in ("sent", "received", "lost", "duplicated", "out_of_order", "corrupted"):
        print(f"  batches {key:<13} {report[key]:>12,}")
    for name, s in rss.items():
        if s:
            first, last, top = mib(s[0]), mib(s[-1]), mib(max(s))
            print(f"  RSS {name:<9} first {first}, last {last}, max {top} ({len(s)} samples)")
    for e in errors:
        print(f"  error: {e}")
    print(json.dumps(report))
    bad = lost + total["duplicated"] + total["out_of_order"] + total["corrupted"]
    ok = not (errors or unexpected or bad)
    print("soak: OK" if ok else "soak: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
