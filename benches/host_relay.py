"""CPU seconds per GB and wall time of an all-to-all exchange between the tasks of one host:
through the host service against an environment per task, paired by round.

    python benches/host_relay.py                       # 4 tasks, 150 batches each, 3 rounds
    python benches/host_relay.py --tasks 8 --batches 80 --rounds 5

Each task is a process that does what a task of ``creditflow.spark.exchange`` does, without
Spark: one partition of N subpartitions written by a ``RecordWriter(HashPartitioner)`` thread
(``l_orderkey``), and one gate of N channels (subpartition i of every task's partition) read
to the end by the main thread. The batches are TPC-H-like ``lineitem`` rows
(``benches/lineitem.py``), made once per run in ``/dev/shm`` as an Arrow file that every
task maps, so making them costs nothing in the timed part; the files are removed at the end
unless ``--keep-data`` (the next run with the same sizes then maps them at once).

* service: the bench process holds a ``HostService`` with ``--memory`` per task; the tasks
  ``attach`` to it with ``--memory`` each (their writers' heaps). Its CPU is the bench
  process's ``process_time`` over the round (it does nothing else then).
* per task: each task has a ``NetworkEnvironment(memory=--memory)``; the tasks reach each
  other over shared-memory links, and a task's own subpartition is handed over in place.

A round starts once every task has its partition and has seen the others'; its time is from
the first task's start to the last task's end of stream (and, per task, until everyone has
read its partition). CPU s/GB: the CPU seconds of every task from its start (plus the
service's), per GB of Arrow bytes written. Rounds alternate the order of the two; the
table gives the medians and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa

import creditflow as cf

MODES = ("service", "per task")


def _data_path(task: int, batches: int, rows: int) -> Path:
    return Path(f"/dev/shm/creditflow-bench-lineitem-{task}-{batches}-{rows}.arrow")


def _data(task: int, batches: int, rows: int) -> list[pa.RecordBatch]:
    """Task ``task``'s batches, mapped from /dev/shm (made there once)."""
    path = _data_path(task, batches, rows)
    if not path.exists():
        import lineitem

        made = lineitem.batches(task, batches, rows)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with pa.OSFile(str(tmp), "wb") as f, pa.ipc.new_file(f, made[0].schema) as w:
            for b in made:
                w.write_batch(b)
        tmp.rename(path)
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all().to_batches()


def task_main(mode: str, me: int, tasks: int, meeting: str, service: str, args: dict[str, Any]) -> None:
    """One task: its partition, its gate, its writer thread; prints its figures as JSON."""
    batches = _data(me, args["batches"], args["rows"])
    memory = args["memory"]
    stack: cf.Attachment | cf.NetworkEnvironment = (
        cf.attach(service, memory=memory) if mode == "service" else cf.NetworkEnvironment(memory=memory)
    )
    part = stack.create_partition(f"relay/{me}", tasks)
    mine = Path(meeting, f"{me}.json")
    mine.with_suffix(".tmp").write_text(json.dumps({"address": stack.address, "partition": part.id}))
    mine.with_suffix(".tmp").rename(mine)
    while len(list(Path(meeting).glob("*.json"))) < tasks:
        time.sleep(0.005)
    peers = [json.loads(Path(meeting, f"{i}.json").read_text()) for i in range(tasks)]
    start, cpu0 = time.time(), time.process_time()
    gate = stack.create_input_gate([cf.ChannelSpec(p["address"], p["partition"], me) for p in peers])
    failure: list[BaseException] = []

    def write() -> None:
        try:
            with cf.RecordWriter(part, cf.HashPartitioner(["l_orderkey"])) as w:
                for b in batches:
                    w.write(b, timeout=300)
        except BaseException as exc:  # reported below
            failure.append(exc)

    writer = threading.Thread(target=write, name="relay-writer")
    writer.start()
    rows = sum(b.num_rows for b in gate)
    writer.join()
    if failure:
        raise failure[0]
    if mode == "per task":
        part.wait_consumed(timeout=300)  # its readers read from this process
    end, cpu = time.time(), time.process_time() - cpu0
    print(json.dumps({"rows": rows, "start": start, "end": end, "cpu": cpu}), flush=True)


def one_round(mode: str, args: argparse.Namespace, nbytes: int) -> dict[str, float]:
    """Runs the tasks once in ``mode``; GB/s, seconds, CPU s/GB (tasks, service, all)."""
    name = f"bench-relay-{os.getpid()}-{time.monotonic_ns()}"
    host_memory = args.tasks * cf.parse_bytes(args.memory)
    service = cf.HostService(name, memory=host_memory) if mode == "service" else None
    settings = {"batches": args.batches, "rows": args.rows, "memory": args.memory}
    try:
        with tempfile.TemporaryDirectory() as meeting:
            cpu0 = time.process_time()
            # One BLAS thread (numpy's, which pyarrow loads): its idle threads spin, and that CPU is
            # nobody's network stack.
            env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, "--task", mode, str(i), str(args.tasks), meeting, name]
                    + [json.dumps(settings)],
                    stdout=subprocess.PIPE,
                    env=env,
                )
                for i in range(args.tasks)
            ]
            outs = [p.communicate()[0] for p in procs]
            service_cpu = time.process_time() - cpu0 if service is not None else 0.0
        if any(p.returncode for p in procs):
            raise SystemExit(f"a task failed in the {mode} round")
        if service is not None:
            m = service.metrics()
            sent = m["batches_in_place"] + m["batches_copied"]
            in_place = 100.0 * m["batches_in_place"] / max(sent, 1)
    finally:
        if service is not None:
            service.close()
    figures = [json.loads(o.decode().strip().splitlines()[-1]) for o in outs]
    rows = sum(f["rows"] for f in figures)
    if rows != args.tasks * args.batches * args.rows:
        raise SystemExit(f"{mode}: {rows} rows arrived, {args.tasks * args.batches * args.rows} were written")
    seconds = max(f["end"] for f in figures) - min(f["start"] for f in figures)
    gb = nbytes / 1e9
    task_cpu = sum(f["cpu"] for f in figures)
    shares = {"batches in place %": in_place} if service is not None else {}
    return {
        "GB/s": gb / seconds,
        "s": seconds,
        "task CPU s/GB": task_cpu / gb,
        "service CPU s/GB": service_cpu / gb,
        "CPU s/GB": (task_cpu + service_cpu) / gb,
        **shares,
    }


def main() -> None:
    """Parses the arguments, runs the paired rounds and prints the table."""
    if len(sys.argv) > 1 and sys.argv[1] == "--task":
        mode, me, tasks, meeting, service, settings = sys.argv[2:8]
        task_main(mode, int(me), int(tasks), meeting, service, json.loads(settings))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=4, help="tasks (processes), default 4")
    parser.add_argument("--batches", type=int, default=150, help="batches each task writes, default 150")
    parser.add_argument("--rows", type=int, default=16384, help="rows per batch, default 16,384")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds, default 3")
    parser.add_argument("--memory", default="16MiB", help="memory per task (the service: tasks x this)")
    parser.add_argument("--keep-data", action="store_true", help="keep the batches in /dev/shm afterwards")
    args = parser.parse_args()
    try:
        paired_rounds(args)
    finally:
        if not args.keep_data:
            for i in range(args.tasks):
                _data_path(i, args.batches, args.rows).unlink(missing_ok=True)


def paired_rounds(args: argparse.Namespace) -> None:
    """The rounds, alternating the order of the modes, and their table."""
    nbytes = sum(sum(b.nbytes for b in _data(i, args.batches, args.rows)) for i in range(args.tasks))
    print(f"{args.tasks} tasks, {nbytes / 1e9:.2f} GB of lineitem in all, {args.rounds} rounds", flush=True)
    rounds: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            got = one_round(mode, args, nbytes)
            rounds[mode].append(got)
            print(f"  round {r} {mode:8}: " + ", ".join(f"{k} {v:.3f}" for k, v in got.items()), flush=True)
    keys = list(rounds[MODES[0]][0])
    print("\n| figure | " + " | ".join(MODES) + " | service / per task (paired) |")
    print("|---|---|---|---|")
    for k in keys:
        med = [statistics.median(x.get(k, 0.0) for x in rounds[m]) for m in MODES]
        ratios = [a[k] / b[k] for a, b in zip(rounds["service"], rounds["per task"], strict=True) if b.get(k)]
        ratio = f"{statistics.median(ratios):.2f}x" if ratios else "-"
        print(f"| {k} | {med[0]:.3f} | {med[1]:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
