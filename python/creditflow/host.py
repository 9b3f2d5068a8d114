"""The host service from Python: one creditflow process per host, user and application that
holds the network stack of every task attached to it (docs/design.md, "The host service").

* :class:`HostService` runs one in this process (``creditflow serve`` runs one by hand);
* :func:`attach` attaches this process to one: its :class:`Attachment` creates partitions and
  gates with the API of :class:`~creditflow.NetworkEnvironment`'s, which live in the service;
* :func:`attach_or_start` attaches, starting a service first (a process of its own, in a
  session of its own, so it outlives its starter) when none answers: what Spark tasks do.

Nothing starts at import.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from creditflow import logs
from creditflow._native import Attachment, HostService, TLSConfig, attach
from creditflow._native import settings as _settings_table
from creditflow.errors import ConnectionLostError, InvalidArgumentError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "SERVICE_SETTINGS",
    "Attachment",
    "HostService",
    "attach",
    "attach_or_start",
    "log_dir",
    "log_path",
    "prune_logs",
    "run_on_demand",
    "serve",
]

#: The settings a service started on demand takes: every setting of the table that declares
#: them (``creditflow._native.settings()``), as ``HostService`` takes them, in its parameter
#: order; JSON values only: ``tls`` as the keyword arguments of :class:`~creditflow.TLSConfig`,
#: its files' paths. ``creditflow serve`` has an option for each.
SERVICE_SETTINGS = tuple(s.name for s in _settings_table())

#: Seconds a service started on demand waits with no task attached before it ends.
DEFAULT_IDLE_TIMEOUT = 120.0

_log = logging.getLogger("creditflow.host")


class _Waitable(Protocol):
    def wait(self) -> str: ...


class _StopSignals:
    """Ctrl-C and SIGTERM while :func:`serve` runs (in the main thread): they end the service's
    wait, and only that. Raised as ``KeyboardInterrupt`` wherever the main thread happened to be,
    a signal could leave a lock taken (between a logging handler's ``acquire`` and its ``try``),
    and the log thread, which :func:`serve` joins on its way out, would wait for it forever. So
    a signal is only noted, and raised only while the main thread waits for the service."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.got: str | None = None
        self.waiting = False
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self.previous[s] = signal.signal(s, self._note)
        return self

    def __exit__(self, *_args: object) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def _note(self, signum: int, _frame: object) -> None:
        self.got = signal.Signals(signum).name
        if self.waiting:
            self.waiting = False  # one interrupt per wait
            raise KeyboardInterrupt

    def wait(self, service: _Waitable) -> str:
        """``service.wait()``, ended by a signal noted before or during it."""
        try:
            self.waiting = True
            if self.got is None:
                return service.wait()
        except KeyboardInterrupt:
            pass
        finally:
            self.waiting = False
        return f"interrupted ({self.got or 'SIGINT'})"


def serve(
    name: str,
    *,
    idle_timeout: float | None = None,
    ready: Callable[[HostService], None] | None = None,
    **settings: Any,
) -> str:
    """Runs the host service ``name`` in this process until it ends (its owners are gone, it
    was idle for ``idle_timeout`` seconds, or Ctrl-C / SIGTERM when called in the main thread)
    and returns why. ``ready`` is called with the service once it listens. Rust log records go
    to :mod:`logging` meanwhile."""
    with _StopSignals() as signals:
        logs._acquire()
        try:
            with HostService(name, idle_timeout=idle_timeout, **settings) as service:
                _log.info("host service %r listening at %s (pid %d)", name, service.address, os.getpid())
                if ready is not None:
                    ready(service)
                why = signals.wait(service)
                _log.info("host service %r ends: %s", name, why)
        finally:
            logs._release()
    return why


#: Days a service's log is kept after its last line: each application leaves one per host and
#: settings, so the logs of services long gone are removed when another service starts.
LOG_KEEP_DAYS = 7


def log_dir() -> Path:
    """The directory of the logs of services started on demand (this user's only)."""
    directory = Path(tempfile.gettempdir()) / f"creditflow-host-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory


def log_path(name: str) -> Path:
    """Where a service started on demand writes its log."""
    return log_dir() / f"{name}.log"


def prune_logs(keep_days: float = LOG_KEEP_DAYS) -> int:
    """Removes the services' logs that have not been written for ``keep_days`` days (their
    services are gone: one still running and writing keeps its log). Returns how many went;
    a log another starter removed meanwhile is no error."""
    cutoff = time.time() - keep_days * 86400
    removed = 0
    for path in log_dir().glob("*.log"):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
    return removed


#: The services this process started, until they end (reaped at the next start, so that none
#: stays a zombie and no ``Popen`` is dropped while its process runs).
_STARTED: list[subprocess.Popen[bytes]] = []


def _start(
    name: str, settings: Mapping[str, Any], owner: int, idle_timeout: float
) -> subprocess.Popen[bytes]:
    """Starts ``python -m creditflow serve NAME --on-demand``: settings as JSON on its stdin (so a
    secret never shows on a command line), its output to :func:`log_path`. It detaches (a
    session of its own), so its starter's end does not end it."""
    unknown = sorted(set(settings) - set(SERVICE_SETTINGS))
    if unknown:
        raise ValueError(f"not settings of a host service: {unknown}")
    command = [
        sys.executable,
        "-m",
        "creditflow",
        "serve",
        name,
        "--on-demand",
        "--owner",
        str(owner),
        "--idle-timeout",
        str(idle_timeout),
    ]
    _STARTED[:] = [p for p in _STARTED if p.poll() is None]
    prune_logs()
    with open(log_path(name), "ab") as log:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(dict(settings)).encode())
    proc.stdin.close()
    _STARTED.append(proc)
    return proc


def attach_or_start(
    name: str,
    settings: Mapping[str, Any],
    *,
    owner: int = 0,
    memory: int | str | None = None,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    timeout: float = 60.0,
) -> Attachment:
    """Attaches to the host service ``name``; when none answers, starts one with ``settings``
    (see :data:`SERVICE_SETTINGS`) and attaches once it listens. Two processes that start one
    at once get one service: the second cannot take the name and exits. ``owner``: the pid of
    the process this one belongs to (a Spark executor), whose end ends the service. ``memory``:
    this task's own, as :func:`attach` takes it (the host's is ``settings["memory"]``).

    Raises :class:`ConnectionLostError` naming the service's log when none answers within
    ``timeout`` seconds."""
    try:
        return attach(name, owner=owner, memory=memory)
    except ConnectionLostError:
        pass
    deadline = time.monotonic() + timeout
    proc: subprocess.Popen[bytes] | None = None
    last: ConnectionLostError | None = None
    while time.monotonic() < deadline:
        if proc is None or proc.poll() is not None:
            # None yet, or the one started ended (lost the race for the name to a service
            # that is ending): start one (again).
            proc = _start(name, settings, owner, idle_timeout)
        try:
            return attach(name, owner=owner, memory=memory)
        except ConnectionLostError as exc:
            last = exc
        time.sleep(0.05)
    raise ConnectionLostError(
        f"no creditflow host service {name!r} answered within {timeout} s (its log: {log_path(name)}): {last}"
    )


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_on_demand(name: str, settings: Mapping[str, Any], owner: int, idle_timeout: float) -> int:
    """``creditflow serve --on-demand``: runs the service, or exits 0 at once when another one
    already has the name (two starters raced). Returns the exit status."""
    if owner and not _owner_alive(owner):
        _log.info("host service %r not started: its owner (pid %d) is gone", name, owner)
        return 0
    kwargs = dict(settings)
    if kwargs.get("tls") is not None:
        kwargs["tls"] = TLSConfig(**kwargs["tls"])
    ended = threading.Event()
    threading.Thread(target=_keep_log, args=(name, ended), name="creditflow-log-keeper", daemon=True).start()
    try:
        serve(name, idle_timeout=idle_timeout, **kwargs)
    except InvalidArgumentError as exc:
        if "already runs" in str(exc):
            _log.info("host service %r already runs: this one exits", name)
            return 0
        raise
    finally:
        ended.set()
    return 0


def _keep_log(name: str, ended: threading.Event, every: float = 3600.0) -> None:
    """Marks the log of a running service as written (hourly), so that :func:`prune_logs`
    leaves it alone however quiet the service is (one may serve a streaming application for
    weeks)."""
    while not ended.wait(every):
        with contextlib.suppress(OSError):
            os.utime(log_path(name))
