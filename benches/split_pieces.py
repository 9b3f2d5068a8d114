"""What a hash split into N pieces costs per row as N grows, with the input as it comes and
merged first as ``creditflow.spark.exchange``'s writers merge it.

    python benches/split_pieces.py                      # N = 2 16 128 512 1000
    python benches/split_pieces.py --tasks 2 1000 --batches 400

One process, one environment: a ``RecordWriter(HashPartitioner(["key"]))`` on the main thread
writes ``--batches`` batches of ``--rows`` rows (``key``: int64 from 1,000,003 values,
``value``: float64, ``score``: int64; four distinct batches cycled) into a partition of N
subpartitions, and one gate over all N (local hand-off) is read to the end on a second
thread. "merged" passes the input through ``creditflow.spark._merge.merged_for_split`` first (N × 1,024
rows a write, at most a quarter of ``--memory``). CPU ns/row: the process's CPU seconds
(``process_time``) per row written; the writer's and reader's threads' own
(``thread_time``) beside it.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

import creditflow as cf
from creditflow.spark._merge import merged_for_split


def _batches(rows: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(1)
    return [
        pa.record_batch(
            {
                "key": rng.integers(0, 1_000_003, rows),
                "value": rng.random(rows),
                "score": rng.integers(0, 100, rows),
            }
        )
        for _ in range(4)
    ]


def run(n: int, merge: bool, batches: int, rows: int, memory: int) -> dict[str, float]:
    """One split into ``n`` subpartitions; ns per row and the pieces read."""
    pool = _batches(rows)
    total = batches * rows
    with cf.NetworkEnvironment(memory=memory) as env:
        part = env.create_partition("p", n)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", j) for j in range(n)])
        got = {"rows": 0, "pieces": 0, "cpu": 0.0}

        def reader() -> None:
            start = time.thread_time()
            while (b := gate.next(timeout=60)) is not None:
                got["rows"] += b.num_rows
                got["pieces"] += 1
            got["cpu"] = time.thread_time() - start

        thread = threading.Thread(target=reader)
        thread.start()
        cpu0, wall0, writer0 = time.process_time(), time.perf_counter(), time.thread_time()
        source: Iterator[pa.RecordBatch] = (pool[i % len(pool)] for i in range(batches))
        if merge:
            source = merged_for_split(source, n, memory)
        with cf.RecordWriter(part, cf.HashPartitioner(["key"])) as w:
            for batch in source:
                w.write(batch)
        writer = time.thread_time() - writer0
        thread.join()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if got["rows"] != total:
        raise RuntimeError(f"read {got['rows']} rows of {total}")
    return {
        "pieces": got["pieces"],
        "rows_per_piece": total / got["pieces"],
        "wall": wall * 1e9 / total,
        "cpu": cpu * 1e9 / total,
        "writer": writer * 1e9 / total,
        "reader": got["cpu"] * 1e9 / total,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, nargs="+", default=[2, 16, 128, 512, 1000], help="N, the pieces")
    ap.add_argument("--batches", type=int, default=200, help="batches written, default 200")
    ap.add_argument("--rows", type=int, default=10_000, help="rows per batch, default 10,000 (Spark's)")
    ap.add_argument("--memory", default="512MiB", help="the environment's memory, default 512MiB")
    args = ap.parse_args()
    memory = cf.parse_bytes(args.memory)
    print("| N | input | pieces | rows a piece | CPU ns/row | writer ns/row | reader ns/row | wall ns/row |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.tasks:
        for merge in (False, True):
            r = run(n, merge, args.batches, args.rows, memory)
            print(
                f"| {n} | {'merged' if merge else 'as it comes'} | {r['pieces']:,.0f} | "
                f"{r['rows_per_piece']:,.1f} | {r['cpu']:.1f} | {r['writer']:.1f} | {r['reader']:.1f} | "
                f"{r['wall']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
