"""One contender, one round: start the ranks, start the clock, run the driver side, collect.

The clock (``t0``) starts once both ranks are up and past their imports, right before the
driver side starts its Spark job. Figures, in seconds from ``t0`` unless said otherwise:

* ``first_batch``: when the slower rank had its first batch (a DDP job's first step);
* ``epochs``: epoch e ends when the slower rank ends it; its time is from the end of epoch
  e - 1 (``t0`` for epoch 0, which so includes any materialization); ``total`` is their sum;
* ``prepare``: when the driver let the ranks start (the end of the materialization; ~0 for a
  contender that streams);
* ``cpu``: CPU seconds of the driver, its JVM, Spark's Python workers and the ranks;
* ``write_bytes``/``cancelled_write_bytes``: what all of those caused to be written to storage
  (see :mod:`benches.training.measure`); ``peak_dir``: the contender's scratch directory at
  its largest (its caches, output, spill and the ranks' TMPDIR);
* ``rss``: each rank's peak resident set; ``rss_ready``: the same when it was ready (imports);
* ``batches``: per rank, per epoch; ``rows``/``keys_ok``: per epoch, the rows all ranks saw and
  whether they were each row of the DataFrame once (count and sum of row keys).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benches.training import contenders
from benches.training.config import Config
from benches.training.contenders.base import DriverContext, Spec
from benches.training.measure import Sampler
from benches.training.ranks import RankProcess
from pyspark.sql import DataFrame, SparkSession

#: How long a rank may take to import its libraries and set up.
READY_TIMEOUT = 600.0


def run_trial(
    name: str,
    cfg: Config,
    spark: SparkSession,
    df: DataFrame,
    part_of: Callable[[Sequence[int]], DataFrame],
    expected: tuple[int, int],
    scratch: Path,
) -> dict[str, Any]:
    """Runs contender ``name`` once in ``scratch`` (created, and removed after; what the
    contender writes goes to ``scratch/data``, whose size is sampled, the ranks' logs to
    :func:`log_dir`); returns its figures, or ``error`` (with ``phase``: setup, driver, epochs
    or timeout) and the end of each rank's log."""
    shutil.rmtree(scratch, ignore_errors=True)
    data, logs = scratch / "data", log_dir(scratch)
    data.mkdir(parents=True)
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    secret = secrets.token_hex(16)
    port = free_port()
    ranks = [RankProcess(name, r, cfg, data, logs, secret, port) for r in range(cfg.world_size)]
    try:
        out = _run(name, cfg, spark, df, part_of, expected, data, secret, ranks)
        if "error" in out:
            out["logs"] = [r.tail(20) for r in ranks]
        return out
    finally:
        for r in ranks:
            r.kill()
            r.close()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
        with contextlib.suppress(OSError):
            logs.parent.rmdir()  # once the last trial's logs are gone


def log_dir(scratch: Path) -> Path:
    """Where the ranks' logs and results go: in memory (/dev/shm) where there is one, so that
    what the libraries print is not counted as bytes written to disk."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / f"creditflow-bench-{os.getpid()}" / scratch.name
    return scratch / "logs"


def free_port() -> int:
    """A loopback port free now (the ranks' MASTER_PORT, as torchrun would give them)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _run(
    name: str,
    cfg: Config,
    spark: SparkSession,
    df: DataFrame,
    part_of: Callable[[Sequence[int]], DataFrame],
    expected: tuple[int, int],
    scratch: Path,
    secret: str,
    ranks: list[RankProcess],
) -> dict[str, Any]:
    out: dict[str, Any] = {"contender": name}
    ready = [r.wait_for("ready", READY_TIMEOUT) for r in ranks]
    failed = [x for x in ready if not x.get("ok")]
    if failed:
        return {**out, "phase": "setup", "error": failed[0]["error"], "traceback": failed[0].get("traceback")}
    sampler = Sampler(root=os.getpid(), directory=scratch, exclude=[r.pid for r in ranks]).start()
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    driver: dict[str, Any] = {}

    def go(spec: Spec) -> None:
        marks["go"] = time.monotonic()
        for r in ranks:
            r.go(t0, spec)

    def run_driver() -> None:
        ctx = DriverContext(cfg, spark, df, part_of, scratch, secret)
        try:
            driver["info"] = contenders.get(name).run_driver(ctx, ready, go)
        except BaseException as exc:
            driver["error"] = f"{type(exc).__name__}: {exc}".strip()
        marks["driver"] = time.monotonic()

    # The driver's own temporary files (Python's tempfile) go to the sampled directory too.
    saved_tempdir, tempfile.tempdir = tempfile.tempdir, str(scratch)
    thread = threading.Thread(target=run_driver, name="bench-driver", daemon=True)
    thread.start()
    deadline = t0 + cfg.timeout
    closed = False
    while time.monotonic() < deadline:
        if not closed and not thread.is_alive():
            closed = True
            for r in ranks:
                r.close_loader()
        exited = [r for r in ranks if r.proc.poll() is not None]
        if len(exited) == len(ranks):
            break
        if any(not (r.result() or {}).get("ok") for r in exited):
            break  # a rank failed: the others may wait for it forever
        if not thread.is_alive() and "go" not in marks:
            break  # the driver failed before the ranks could start
        time.sleep(0.1)
    timed_out = any(r.proc.poll() is None for r in ranks) and time.monotonic() >= deadline
    for r in ranks:
        r.kill()
    if thread.is_alive():  # e.g. a send() whose receivers are gone
        spark.sparkContext.cancelAllJobs()
        thread.join(timeout=60)
    usage = sampler.stop()
    tempfile.tempdir = saved_tempdir
    results = [
        r.result() or {"ok": False, "error": f"rank {r.rank} wrote no result: {r.tail()}"} for r in ranks
    ]
    out.update(driver.get("info") or {})
    if "error" in driver:
        out.update(phase="driver", error=driver["error"])
    elif timed_out:
        out.update(phase="timeout", error=f"not done after {cfg.timeout:.0f} s")
    elif any(not res.get("ok") for res in results):
        # The rank that failed by itself first, not one killed after it.
        bad = min((res for res in results if not res.get("ok")), key=lambda res: "traceback" not in res)
        out.update(
            phase="epochs",
            error=f"rank {bad.get('rank')}: {bad.get('error')}",
            traceback=bad.get("traceback"),
        )
    out.update(_figures(t0, marks, usage, results, expected))
    return out


def _figures(
    t0: float, marks: dict[str, float], usage: Any, results: list[dict[str, Any]], expected: tuple[int, int]
) -> dict[str, Any]:
    timelines = [res.get("timeline") or {} for res in results]
    ends = [t.get("epoch_ends", []) for t in timelines]
    done = min((len(e) for e in ends), default=0)
    slowest = [max(e[i] for e in ends) - t0 for i in range(done)]
    firsts = [t.get("first_batch") for t in timelines]
    deltas = [_delta(res) for res in results]
    rows = [sum(t["rows"][i] for t in timelines) for i in range(done)]
    keys = [sum(t["keys"][i] for t in timelines) for i in range(done)]
    return {
        "first_batch": max(f - t0 for f in firsts) if firsts and None not in firsts else None,
        "epochs": [b - a for a, b in zip([0.0, *slowest], slowest, strict=False)],
        "total": slowest[-1] if slowest else None,
        "prepare": marks["go"] - t0 if "go" in marks else None,
        "driver": marks["driver"] - t0 if "driver" in marks else None,
        "cpu": usage.cpu_seconds + sum(d["cpu"] for d in deltas),
        "write_bytes": usage.write_bytes + sum(d["write_bytes"] for d in deltas),
        "cancelled_write_bytes": usage.cancelled_write_bytes
        + sum(d["cancelled_write_bytes"] for d in deltas),
        "peak_dir": usage.peak_dir_bytes,
        "writers": usage.writers,
        "rss": [res.get("rss_peak") for res in results],
        "rss_ready": [res.get("rss_ready") for res in results],
        "batches": [t.get("batches", []) for t in timelines],
        "rows": rows,
        "keys_ok": [r == expected[0] and k == expected[1] for r, k in zip(rows, keys, strict=True)],
    }


def _delta(result: dict[str, Any]) -> dict[str, float]:
    start, end = result.get("start"), result.get("end")
    if not start or not end:
        return {"cpu": 0.0, "write_bytes": 0, "cancelled_write_bytes": 0}
    return {k: end[k] - start[k] for k in ("cpu", "write_bytes", "cancelled_write_bytes")}
