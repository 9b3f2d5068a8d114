"""Worker processes of a three-task pipeline, source → map → sink, one process each, for the
observability tests (``tests/test_observability.py``).

``python tests/pipeline_worker.py ROLE CONFIG_JSON`` (started by :class:`PipelineWorker`).
Every role creates a NetworkEnvironment, serves its metrics (``env.serve_metrics()``) and
prints ``{"address", "metrics_url"}``.

``source``  partition ``"src"`` (1 subpartition); writes 64 KiB batches, ``rate`` per second
            (paced; the pipeline keeps up with it unless the sink is throttled), until exit.
``map``     reads ``upstream`` (``[address, partition]``), copies every batch to partition
            ``"mapped"``.
``sink``    reads ``upstream`` and sleeps ``throttle`` seconds after each batch;
            ``{"cmd": "throttle", "seconds": s}`` changes it.

``{"cmd": "exit"}`` (or end of stdin) closes the environment and exits. Failures are printed
as ``{"error", "where"}``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

import creditflow as cf
from remote_worker import Worker


class PipelineWorker(Worker):
    """A source, map or sink process (see the module docs)."""

    script = Path(__file__).resolve()


def _say(**msg: Any) -> None:
    print(json.dumps(msg), flush=True)


def _batch(i: int) -> pa.RecordBatch:
    return pa.record_batch({"i": pa.array([i] * 8192, pa.int64())})


def main() -> None:
    role, cfg = sys.argv[1], json.loads(sys.argv[2])
    env = cf.NetworkEnvironment(memory="8MiB", segment_size="32KiB", buffer_timeout=0.01)
    server = env.serve_metrics()
    stop = threading.Event()
    state = {"throttle": float(cfg.get("throttle", 0.0))}

    def source() -> None:
        part = env.create_partition("src", 1)
        period = 1.0 / float(cfg["rate"])
        with cf.RecordWriter(part) as w:
            i = 0
            due = time.monotonic()
            while not stop.is_set():
                w.write(_batch(i))
                i += 1
                # Paced, without catching up after being held back.
                due = max(due + period, time.monotonic() - period)
                time.sleep(max(0.0, due - time.monotonic()))

    def gate() -> cf.InputGate:
        addr, pid = cfg["upstream"]
        return env.create_input_gate([cf.ChannelSpec(addr, pid, 0)])

    def mapper() -> None:
        g = gate()
        part = env.create_partition("mapped", 1)
        with cf.RecordWriter(part) as w:
            for b in g:
                if stop.is_set():
                    break
                w.write(b)

    def sink() -> None:
        g = gate()
        for _ in g:
            if stop.is_set():
                break
            if state["throttle"] > 0:
                time.sleep(state["throttle"])

    body = {"source": source, "map": mapper, "sink": sink}[role]

    def run() -> None:
        try:
            body()
        except cf.ClosedError:
            pass  # the environment closed under us at exit
        except Exception as e:
            if not stop.is_set():
                _say(error=f"{type(e).__name__}: {e}", where=traceback.format_exc())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    _say(address=env.address, metrics_url=server.url)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "throttle":
            state["throttle"] = float(cmd["seconds"])
            _say(throttled=state["throttle"])
        elif cmd["cmd"] == "exit":
            break
    stop.set()
    env.close()
    t.join(10)


if __name__ == "__main__":
    main()
