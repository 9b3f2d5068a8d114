"""One training rank: ``python -m benches.training.rank CONTENDER RANK CONFIG SCRATCH RESULT``
(the secret comes on stdin's first line).

It sets its contender up (imports, listeners), prints ``@@ready {json}``, waits for a ``go``
line on stdin (the driver's clock start ``t0`` and the contender's spec), then runs the epochs,
consuming every batch as a training step would take it (row count and the sum of row keys,
computed on the tensors). Done, it prints ``@@epochs`` and waits for a ``close`` line (the
driver's side finished) before it closes its loader; then it writes its result (timeline, peak
RSS, its own write_bytes and CPU seconds, or the error) as JSON to RESULT and prints ``@@done``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from benches.training import contenders
from benches.training.config import Config
from benches.training.contenders.base import Batch, RankContext
from benches.training.measure import Timeline, peak_rss, read_counters


def say(kind: str, payload: dict[str, Any]) -> None:
    print(f"@@{kind} {json.dumps(payload)}", flush=True)


def describe(exc: BaseException) -> dict[str, str]:
    """An error as the report shows it: its type and message, and the traceback."""
    return {"error": f"{type(exc).__name__}: {exc}".strip(), "traceback": traceback.format_exc()}


def consume(batch: Batch) -> tuple[int, int]:
    """(rows, sum of row keys) of one batch, as a training step would touch its tensors."""
    import torch

    key = batch["l_orderkey"].to(dtype=torch.int64) * 8 + batch["l_linenumber"]
    return int(key.shape[0]), int(key.sum())


def counters() -> dict[str, float]:
    c = read_counters(os.getpid())
    assert c is not None
    return {
        "write_bytes": c.write_bytes,
        "cancelled_write_bytes": c.cancelled_write_bytes,
        "cpu": c.cpu_seconds,
    }


def main(argv: list[str]) -> int:
    name, rank, config, scratch, result_path = argv
    secret = sys.stdin.readline().strip()
    ctx = RankContext(Config.from_json(config), int(rank), Path(scratch), secret)
    contender = contenders.get(name)
    result: dict[str, Any] = {"rank": ctx.rank}
    try:
        info = contender.setup(ctx)
        import torch  # noqa: F401  (every contender's batches are torch tensors)
    except BaseException as exc:
        result.update(describe(exc), phase="setup")
        Path(result_path).write_text(json.dumps(result))
        say("ready", {"ok": False, **describe(exc)})
        return 1
    result["start"] = counters()
    result["rss_ready"] = peak_rss()
    say("ready", {"ok": True, **info})
    line = sys.stdin.readline()
    if not line.strip():  # the driver gave up before starting
        contender.close()
        return 0
    go = json.loads(line)
    timeline = Timeline()
    try:
        for loader in contender.epochs(ctx, go["spec"]):
            for batch in loader:
                timeline.batch(*consume(batch))
            timeline.end_epoch()
        result["ok"] = True
    except BaseException as exc:
        result.update(describe(exc), phase="epochs")
        result["ok"] = False
    result.update(timeline=timeline.as_dict(), t0=go["t0"], rss_peak=peak_rss(), end=counters())
    if result["ok"]:
        # Keep the loader open until the driver's side is done too: a receiver closed as soon
        # as its rank has read everything can still be asked by a Spark task to confirm.
        say("epochs", {})
        sys.stdin.readline()
    try:
        contender.close()
    except BaseException as exc:
        result.setdefault("error", f"close: {type(exc).__name__}: {exc}")
    Path(result_path).write_text(json.dumps(result))
    say("done", {"ok": result["ok"]})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
