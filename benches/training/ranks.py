"""The driver's handle on a rank process (:mod:`benches.training.rank`)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from benches.training.config import Config

#: The repository root: the ranks and Spark's workers import ``benches`` from here.
ROOT = Path(__file__).resolve().parents[2]


class RankProcess:
    """A rank in its own process group (so that a kill reaches whatever it started), its
    control lines on stdout, its log (stderr and stray prints) and result in ``logs``; its
    TMPDIR and whatever the contender writes in ``data``."""

    def __init__(
        self, name: str, rank: int, cfg: Config, data: Path, logs: Path, secret: str, master_port: int
    ) -> None:
        self.rank = rank
        self.result_path = logs / f"rank-{rank}.json"
        self.log_path = logs / f"rank-{rank}.log"
        tmp = data / f"tmp-{rank}"
        tmp.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            TMPDIR=str(tmp),
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            # As torchrun sets them (Mosaic's StreamingDataset finds its peers through these).
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master_port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(cfg.world_size),
            LOCAL_WORLD_SIZE=str(cfg.world_size),
        )
        self._log = open(self.log_path, "w")  # noqa: SIM115  (closed in wait/kill)
        argv = [sys.executable, "-m", "benches.training.rank", name, str(rank), cfg.to_json()]
        self.proc = subprocess.Popen(
            [*argv, str(data), str(self.result_path)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
        )
        self._lines: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(secret + "\n")
        self.proc.stdin.flush()
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self, out: IO[str]) -> None:
        for line in out:
            if line.startswith("@@"):
                kind, _, payload = line[2:].partition(" ")
                self._lines.put((kind, json.loads(payload)))
            else:
                self._log.write(line)
        self._lines.put(None)

    def wait_for(self, kind: str, timeout: float) -> dict[str, Any]:
        """The payload of the next ``@@kind`` line; a failure payload if the rank exits or
        says nothing in time."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return {"ok": False, "error": f"rank {self.rank}: no {kind} within {timeout:.0f} s"}
            if item is None:
                self._lines.put(None)
                return {"ok": False, "error": f"rank {self.rank} exited before {kind}: {self.tail()}"}
            if item[0] == kind:
                return item[1]

    def go(self, t0: float, spec: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"t0": t0, "spec": spec}) + "\n")
        self.proc.stdin.flush()

    def close_loader(self) -> None:
        """Tells the rank that the driver's side is done (it may close its loader)."""
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write("close\n")
            self.proc.stdin.flush()

    def result(self) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = json.loads(self.result_path.read_text())
            return out
        except (OSError, ValueError):
            return None

    def tail(self, lines: int = 5) -> str:
        self._log.flush()
        try:
            return " | ".join(self.log_path.read_text().strip().splitlines()[-lines:])
        except OSError:
            return ""

    def wait(self, timeout: float) -> bool:
        """Whether it exited within ``timeout`` seconds."""
        try:
            self.proc.wait(timeout=max(0.0, timeout))
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill(self) -> None:
        """Kills the rank's process group (the rank and what it started), then reaps it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        """After :meth:`wait` or :meth:`kill`: closes its pipes and log."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self._reader.join(timeout=5)
        self._log.close()
