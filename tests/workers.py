"""The harness of worker processes, for the tests (``tests/remote_worker.py``), the benchmarks
(``benches/remote.py``) and the soaks: a parent starts a worker as ``python SCRIPT ROLE
CONFIG_JSON`` and drives it in JSON lines, one object a line each way.

* Worker side: :func:`emit` prints one object, :func:`receive` reads the parent's next one,
  :func:`commands` iterates over them, :func:`guarded` turns a failure in a thread into an
  ``{"error"}`` message, :func:`run_threads` runs functions in threads and re-raises the
  first failure, :func:`sleep_until` waits for a ``time.monotonic()`` instant (one clock for
  the whole machine, so times of two processes can be subtracted), :func:`environment` makes a
  NetworkEnvironment from JSON settings, :func:`partitioner` a partitioner.
* Parent side: :class:`Worker` starts a script's role (in a network namespace if asked),
  :meth:`Worker.read` takes its next message and :meth:`Worker.wait_for` the next with a key,
  :meth:`Worker.send` writes it one; a worker's stderr is shown when it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import creditflow as cf

Config = dict[str, Any]

#: Set to "0" by the tests' ``transport`` fixture (conftest.py) to run workers without shared
#: memory.
SHARED_MEMORY_VAR = "CREDITFLOW_TEST_SHARED_MEMORY"

# ------------------------------------------------------------------------------ worker side

_emit_lock = threading.Lock()


def emit(**fields: Any) -> None:
    """Prints one message to the parent (thread-safe)."""
    with _emit_lock:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def receive() -> Config:
    """The parent's next message; exits when the parent closed stdin."""
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("the parent closed stdin")
    msg: Config = json.loads(line)
    return msg


def commands() -> Iterator[Config]:
    """The parent's messages, until it closes stdin."""
    for line in sys.stdin:
        if line.strip():
            yield json.loads(line)


def guarded(where: str, fn: Callable[[], None]) -> Callable[[], None]:
    """``fn``, printing its failure as ``{"error"}`` instead of dying silently in a thread."""

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            emit(error=f"{type(exc).__name__}: {exc}", type=type(exc).__name__, where=where)

    return run


def run_threads(fns: list[Callable[[], None]], timeout: float) -> None:
    """Runs each function in its own thread, joins them, re-raises the first error."""
    errors: list[BaseException] = []

    def guard(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guard(fn), daemon=True) for fn in fns]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise RuntimeError(f"a thread is still running after {timeout} s")


def sleep_until(t: float) -> None:
    """Sleeps until ``time.monotonic()`` reaches ``t``."""
    while (left := t - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def partitioner(name: str) -> cf.ForwardPartitioner | cf.RoundRobinPartitioner | cf.HashPartitioner:
    """The partitioner a JSON config names: ``forward``, ``round_robin`` or ``hash:k1,k2``."""
    if name == "forward":
        return cf.ForwardPartitioner()
    if name == "round_robin":
        return cf.RoundRobinPartitioner()
    if name.startswith("hash:"):
        return cf.HashPartitioner(name.removeprefix("hash:").split(","))
    raise ValueError(f"unknown partitioner {name!r}")


def environment(settings: Config) -> cf.NetworkEnvironment:
    """A NetworkEnvironment from JSON settings; ``tls`` holds :class:`cf.TLSConfig` arguments."""
    kwargs = dict(settings)
    if os.environ.get(SHARED_MEMORY_VAR) == "0":
        # The tests' ``transport`` fixture: TCP between processes (one side off suffices).
        kwargs.setdefault("shared_memory", False)
    if "tls" in kwargs:
        kwargs["tls"] = cf.TLSConfig(**kwargs["tls"])
    return cf.NetworkEnvironment(**kwargs)


# ------------------------------------------------------------------------------ parent side


class WorkerError(RuntimeError):
    """A worker failed, exited, or did not answer in time."""


class Worker(contextlib.AbstractContextManager["Worker"]):
    """A worker process. Subclasses name the ``script`` whose roles they start."""

    #: The script run as ``python SCRIPT ROLE CONFIG_JSON``.
    script: Path
    #: Any single wait for the worker, unless a call says otherwise.
    timeout: float = 60.0

    def __init__(self, role: str, *, netns: str | None = None, **cfg: Any) -> None:
        """Starts ``role`` with ``cfg``; in network namespace ``netns`` if given (``ip netns exec``)."""
        self.role = role
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by close())
        prefix = ["ip", "netns", "exec", netns] if netns else []
        self._proc = subprocess.Popen(
            [*prefix, sys.executable, str(self.script), role, json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stash: list[Config] = []
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _fail(self, what: str) -> WorkerError:
        self._stderr.seek(0)
        tail = self._stderr.read()[-4000:]
        return WorkerError(f"worker {self.role}: {what}\n--- its stderr ---\n{tail}")

    def _next(self, deadline: float, what: str) -> Config:
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise self._fail(f"no {what} within the time given") from None
        if line is None:
            self._proc.wait(5)
            raise self._fail(f"exited (code {self._proc.returncode}) before {what}")
        msg: Config = json.loads(line)
        return msg

    def _failed(self, msg: Config) -> WorkerError:
        return self._fail(f"failed in {msg['where']}: {msg['error']}")

    def read(self, timeout: float | None = None) -> Config:
        """The worker's next message (a message reporting an error raises :class:`WorkerError`)."""
        msg = (
            self._stash.pop(0)
            if self._stash
            else self._next(time.monotonic() + (timeout or self.timeout), "a message")
        )
        if "error" in msg:
            raise self._failed(msg)
        return msg

    def wait_for(self, key: str, timeout: float | None = None) -> Config:
        """The next message with ``key`` (``"error"`` too); other messages are kept for later
        calls. Another message reporting an error raises :class:`WorkerError`."""
        for i, kept in enumerate(self._stash):
            if key in kept:
                return self._stash.pop(i)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            msg = self._next(deadline, repr(key))
            if key in msg:
                return msg
            if "error" in msg:
                raise self._failed(msg)
            self._stash.append(msg)

    def send(self, **fields: Any) -> None:
        """Writes one message to the worker."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(fields) + "\n")
        self._proc.stdin.flush()

    def wait(self, timeout: float | None = None) -> None:
        """Waits for the worker to exit, and raises if it failed."""
        try:
            code = self._proc.wait(timeout or self.timeout)
        except subprocess.TimeoutExpired:
            raise self._fail(f"still running after {timeout or self.timeout} s") from None
        if code != 0:
            raise self._fail(f"exited with code {code}")

    def kill(self) -> None:
        """SIGKILLs the worker if it is still running (no clean-up of any kind in it)."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        """Kills the worker if it is still running, and closes its pipes."""
        self.kill()
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        with contextlib.suppress(OSError):  # a broken pipe to a dead worker
            self._proc.stdin.close()
        self._pump_thread.join(5)
        self._proc.stdout.close()
        self._stderr.close()

    def __exit__(self, *_exc: object) -> None:
        self.close()
