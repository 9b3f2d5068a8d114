#!/usr/bin/env python3
"""Soak across two network namespaces with link cuts (``make soak-netns``; root; not part of
``make test``).

A producer process in namespace a writes 4 partitions of 4 subpartitions (round robin, one
writer thread each); a consumer process in namespace b reads them through 4 gates (4x4
channels over one connection), each reader stalling at random. The run is a sequence of
exchanges of ``--round-seconds``: an exchange that is not cut ends cleanly (the producer
stops, the consumer reads to the end) and must have lost, duplicated, reordered and corrupted
nothing. Exchanges run over the veth, except about one in ``--wire-every`` (drawn at random,
seeded, so that cuts fall on both kinds of exchange), which runs over the
userspace wire (``tests/wire.py``) with ``--delay`` and ``--loss`` each way (netem's delay and
loss; this kernel has no ``sch_netem``). Every ``--cut-every`` seconds the link of the
running exchange goes down for ``--cut-seconds`` (longer than ``peer_timeout``): its gates
must fail with ``ConnectionLostError`` (no hang), and the soak starts a fresh exchange. Every
5 s it samples both processes' RSS. The report gives every exchange (link, batches
sent/received/lost, or the cut), totals over completed exchanges, RSS over time and every
error seen; exit code 1 on any loss in a completed exchange, a cut that did not fail the
gates, or an unexpected error.

    python scripts/soak_netns.py --minutes 30
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from netns import Hosts, Unavailable, Wire, namespaces, wire
from remote_worker import Worker, soak_gates, soak_partitions, vm_rss_kib
from workers import WorkerError

PARTITIONS = 4
CHANNELS = 4
SAMPLE_EVERY = 5.0
SECRET = "soak-netns"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--minutes", type=float, default=30.0, help="length of the soak (default 30)")
    p.add_argument("--round-seconds", type=float, default=60.0, help="length of one exchange (default 60)")
    p.add_argument("--cut-every", type=float, default=150.0, help="seconds between link cuts (default 150)")
    p.add_argument("--cut-seconds", type=float, default=5.0, help="length of a cut (default 5)")
    p.add_argument("--peer-timeout", type=float, default=2.0, help="peer_timeout of both sides (default 2)")
    p.add_argument("--rows", type=int, default=4096, help="rows of the largest batch (default 4096)")
    p.add_argument("--memory", default="16MiB", help="network memory of each process (default 16MiB)")
    p.add_argument(
        "--wire-every",
        type=int,
        default=3,
        help="about one exchange in n, drawn at random, runs over the impaired wire (0: none)",
    )
    p.add_argument("--delay", type=float, default=0.020, help="wire delay each way, seconds (default 0.020)")
    p.add_argument("--loss", type=float, default=0.01, help="wire loss each way, probability (default 0.01)")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def exchange(
    h: Hosts, via: Wire | None, args: argparse.Namespace, n: int, cut_at: float | None, log: dict[str, Any]
) -> None:
    """One exchange over the veth, or over the wire ``via``; cut in the middle if ``cut_at`` (a
    monotonic time) falls inside it."""
    env = {"memory": args.memory, "secret": SECRET, "peer_timeout": args.peer_timeout}
    partitions = soak_partitions(args.rows, PARTITIONS, CHANNELS)
    link = f"wire {args.delay * 1000:g} ms + {args.loss:.0%} loss" if via else "veth"
    started = time.monotonic()
    end = started + args.round_seconds
    with Worker(
        "producer", netns=h.a, env={**env, "bind": f"{(via or h).addr_a}:0"}, partitions=partitions
    ) as a:
        address = a.wait_for("address")["address"]
        gates = soak_gates(address, PARTITIONS, CHANNELS)
        stalls = {"seed": args.seed + n, "every": 5.0, "longest": 1.0}
        with Worker("consumer", netns=h.b, env=env, gates=gates, data="seq", random_stalls=stalls) as b:
            b.wait_for("address")
            while (now := time.monotonic()) < end:
                if cut_at is not None and now >= cut_at:
                    cut(via or h, args, b, log, n, link)
                    return
                time.sleep(min(SAMPLE_EVERY, end - now, max(0.0, (cut_at or end) - now)))
                log["rss"].append(
                    [round(now - log["t0"], 1), vm_rss_kib(a.pid) // 1024, vm_rss_kib(b.pid) // 1024]
                )
            a.send(cmd="stop")
            sent: dict[str, int] = {}
            for _ in partitions:
                for key, k in a.wait_for("finished")["sent"].items():
                    sent[key] = sent.get(key, 0) + k
            done = b.wait_for("done", timeout=120)["done"]
            a.send(cmd="exit")
    unique: dict[str, int] = {}
    for g in done:
        unique.update(g["unique"])
    lost = sum(max(0, k - unique.get(key, 0)) for key, k in sent.items())
    bad = {k: sum(g[k] for g in done) for k in ("duplicated", "out_of_order", "corrupted")}
    received = sum(g["batches"] for g in done)
    log["completed"] += 1
    log["sent"] += sum(sent.values())
    log["received"] += received
    log["lost"] += lost
    for k, v in bad.items():
        log[k] += v
    log["exchanges"].append(
        {"n": n, "link": link, "sent": sum(sent.values()), "received": received, "lost": lost, **bad}
    )
    at = time.monotonic() - log["t0"]
    print(
        f"[{at:7.1f} s] exchange {n} over {link} completed: sent {sum(sent.values()):,},"
        f" received {received:,}, lost {lost}, {bad}",
        flush=True,
    )


def cut(
    h: Hosts | Wire, args: argparse.Namespace, consumer: Worker, log: dict[str, Any], n: int, link: str
) -> None:
    """Cuts the link for ``--cut-seconds``; the consumer's gates must fail with ConnectionLostError."""
    h.link(up=False)
    t = time.monotonic()
    try:
        failure = consumer.wait_for("error", timeout=args.cut_seconds + 30)
        noticed = time.monotonic() - t
    finally:
        time.sleep(max(0.0, t + args.cut_seconds - time.monotonic()))
        h.link(up=True)
    log["cut"] += 1
    log["cut_noticed_s"].append(round(noticed, 2))
    log["exchanges"].append({"n": n, "link": link, "cut": True, "noticed_s": round(noticed, 2)})
    if failure.get("type") != "ConnectionLostError":
        log["errors"].append(f"a cut failed a gate with {failure}")
    print(
        f"[{time.monotonic() - log['t0']:7.1f} s] exchange {n} over {link} cut:"
        f" {failure['where']} failed with {failure.get('type')} after {noticed:.1f} s",
        flush=True,
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    log: dict[str, Any] = {
        "t0": time.monotonic(),
        "completed": 0,
        "cut": 0,
        "sent": 0,
        "received": 0,
        "lost": 0,
        "duplicated": 0,
        "out_of_order": 0,
        "corrupted": 0,
        "cut_noticed_s": [],
        "rss": [],
        "exchanges": [],
        "errors": [],
    }
    deadline = log["t0"] + args.minutes * 60
    next_cut = log["t0"] + args.cut_every
    try:
        with namespaces(f"cs{os.getpid() % 100000}") as h, wire(h, args.delay, args.loss, args.seed) as w:
            n = 0
            # A fixed every-n-th pattern locks into phase with the cut period (every exchange
            # after a cut starts at the cut): drawn at random, cuts hit both kinds.
            pick = random.Random(args.seed)
            while time.monotonic() < deadline:
                start = time.monotonic()
                cut_at = next_cut if next_cut < start + args.round_seconds else None
                impaired = args.wire_every > 0 and pick.randrange(args.wire_every) == 0
                try:
                    exchange(h, w if impaired else None, args, n, cut_at, log)
                except WorkerError as exc:
                    log["errors"].append(str(exc)[:2000])
                if cut_at is not None:
                    next_cut += args.cut_every
                n += 1
            log["wire"] = w.stats()
    except Unavailable as exc:
        print(f"soak-netns: skipped: {exc}")
        return 0
    seconds = round(time.monotonic() - log["t0"], 1)
    report = {k: v for k, v in log.items() if k != "t0"}
    print(f"soak-netns: {seconds} s, {log['completed']} exchanges completed, {log['cut']} cut")
    for kind in sorted({e["link"] for e in log["exchanges"]}):
        mine = [e for e in log["exchanges"] if e["link"] == kind]
        done = [e for e in mine if not e.get("cut")]
        print(
            f"  over {kind}: {len(done)} completed, {len(mine) - len(done)} cut;"
            f" sent {sum(e['sent'] for e in done):,}, lost {sum(e['lost'] for e in done)}"
        )
    if "wire" in log:
        print(f"  wire packets: {log['wire']}")
    for key in ("sent", "received", "lost", "duplicated", "out_of_order", "corrupted"):
        print(f"  batches {key:<13} {log[key]:>12,}  (completed exchanges)")
    if log["rss"]:
        prod, cons = [r[1] for r in log["rss"]], [r[2] for r in log["rss"]]
        print(
            f"  RSS producer first/last/max {prod[0]}/{prod[-1]}/{max(prod)} MiB (one process per exchange)"
        )
        print(f"  RSS consumer first/last/max {cons[0]}/{cons[-1]}/{max(cons)} MiB")
    print(f"  cuts noticed after (s): {log['cut_noticed_s']}")
    for e in log["errors"]:
        print(f"  error: {e}")
    print(json.dumps({"seconds": seconds, **report}))
    bad = log["lost"] + log["duplicated"] + log["out_of_order"] + log["corrupted"]
    ok = not (bad or log["errors"]) and log["completed"] > 0
    print("soak-netns: OK" if ok else "soak-netns: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
