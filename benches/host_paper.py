#!/usr/bin/env python3
"""The 1,000-task exchange on paper: ``H`` hosts of ``T`` tasks each, an environment per task
against one host service per host, every figure computed from the settings' defaults (read
from the Rust core's ``SETTINGS`` table, as ``make settings`` does) and the rules of
docs/design.md ("Many tasks, on paper" and "The host service"). Prints the Markdown table
design.md shows.

    benches/host_paper.py [--hosts 50] [--tasks-per-host 20]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from gen_settings import read_settings

#: A link's rings (host/link.rs): the ring towards the side that reads batches and the ring
#: back; each writer and each gate of an attached task has one link, with a heap besides.
#: Address space: a heap's pages are used only once written.
LINK_RINGS_BYTES = (1 << 20) + (64 << 10)
#: A gate link's heap; a writer link's is its task's own ``memory``.
GATE_HEAP_BYTES = 4 << 20

_UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _bytes(text: str) -> int:
    m = re.fullmatch(r'"?(\d+)\s*([KMG]iB)?"?', text.strip())
    if m is None:
        raise ValueError(f"not a byte size: {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2) or ""]


def defaults() -> dict[str, int]:
    """The defaults this table needs, from the core's settings table."""
    shown = {s.name: s.shown_default for s in read_settings()}
    return {
        "memory": _bytes(shown["memory"]),
        "segment_size": _bytes(shown["segment_size"]),
        "exclusive_buffers": int(shown["exclusive_buffers"]),
        "floating_buffers": int(shown["floating_buffers"]),
    }


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def table(hosts: int, per_host: int) -> str:
    d = defaults()
    n = hosts * per_host
    seg, e = d["segment_size"], d["exclusive_buffers"]
    per_task_segments = d["memory"] // seg
    remote_tasks = n - per_host  # channels of a gate that read another host
    rows: list[tuple[str, str, str]] = []

    # An environment per task: every pair of tasks has its own connection, each way.
    task_opened = n - 1
    rows.append(
        (
            "TCP connections per host (opened + served)",
            f"{per_host} × 2(N − 1) = {per_host * 2 * task_opened:,}",
            f"2(H − 1) = {2 * (hosts - 1):,}",
        )
    )
    rows.append(
        (
            "TCP connections in the job",
            f"N(N − 1) = {n * task_opened:,}",
            f"H(H − 1) = {hosts * (hosts - 1):,}",
        )
    )
    # Required segments: a partition N + 1, a gate (its remote channels)·E + 1.
    task_required = (n + 1) + (n - 1) * e + 1
    host_required = per_host * ((n + 1) + remote_tasks * e + 1)
    rows.append(
        (
            "buffers required per host (minimums)",
            f"{per_host} × {task_required:,} = {per_host * task_required:,}, "
            f"{task_required:,} of {per_task_segments:,} per task: **does not fit**",
            f"{host_required:,} of {per_host * per_task_segments:,}"
            + (": **does not fit**" if host_required > per_host * per_task_segments else ""),
        )
    )
    e0_task = (n + 1) + 1
    e0_host = per_host * ((n + 1) + 1)
    rows.append(
        (
            "… with `exclusive_buffers=0`",
            f"{e0_task:,} of {per_task_segments:,} per task, in {per_host} separate pools",
            f"{e0_host:,} of {per_host * per_task_segments:,} in one pool",
        )
    )
    rows.append(
        (
            "network memory per host",
            f"{per_host} pools × {_mib(d['memory'])} = {_mib(per_host * d['memory'])}, "
            "no lending between them",
            f"one pool of {per_host} slots × {_mib(d['memory'])} = {_mib(per_host * d['memory'])} "
            "(`spark.creditflow.hostMemory`'s default), "
            f"shares move to busy tasks; + links ≤ {per_host} × {_mib(LINK_RINGS_BYTES + d['memory'])} + "
            f"{per_host} × {_mib(LINK_RINGS_BYTES + GATE_HEAP_BYTES)} "
            "(address space; pages used as written)",
        )
    )
    rows.append(
        (
            "listeners, flusher and I/O threads per host",
            f"{per_host} of each",
            "1 of each (+ 1–4 threads for every link, and a thread per spillable partition's writer link)",
        )
    )
    head = (
        f"| {hosts} hosts × {per_host} tasks (N = {n:,}, H = {hosts}), defaults | "
        "an environment per task | one host service per host |\n|---|---|---|\n"
    )
    return head + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--tasks-per-host", type=int, default=20)
    args = parser.parse_args()
    print(table(args.hosts, args.tasks_per_host))


if __name__ == "__main__":
    main()
