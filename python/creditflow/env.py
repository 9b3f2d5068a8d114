"""``NetworkEnvironment``: the compiled environment, plus what belongs to Python.

The native class (``creditflow._native.NetworkEnvironment``) owns the pools, partitions,
gates, connections and its Rust threads, and imports nothing from this package. This
subclass starts what is Python's when an environment is created and stops it when it
closes (or is garbage-collected): the thread that forwards Rust log records to
:mod:`logging` (:mod:`creditflow.logs`) and the ``/metrics`` servers of
:meth:`NetworkEnvironment.serve_metrics` (:mod:`creditflow.prometheus`).

Nothing starts at import (Spark forks its Python workers). In a forked child an inherited
environment's Python side is left alone: its threads belong to the parent.
"""

from __future__ import annotations

import atexit
import inspect
import os
import threading
import weakref
from typing import TYPE_CHECKING, ClassVar

from creditflow import _native, logs
from creditflow.errors import ClosedError

if TYPE_CHECKING:
    from creditflow.prometheus import MetricsServer

__all__ = ["NetworkEnvironment"]


class _PythonSide:
    """What one environment started on the Python side. Held by the environment and by its
    finalizer, so it must not refer to the environment."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._servers: list[MetricsServer] = []
        self._logs = False
        self._stopped = False

    def start_logs(self) -> None:
        """Counts this environment as a user of the log-forwarding thread (starting it)."""
        logs._acquire()
        self._logs = True

    def add_server(self, server: MetricsServer) -> bool:
        """Keeps ``server`` to close with the environment; False if that already happened."""
        with self._lock:
            if not self._stopped:
                self._servers.append(server)
                return True
        return False

    def stop(self) -> None:
        """Closes the ``/metrics`` servers and lets go of the log-forwarding thread (which
        stops when the last environment lets go). Once; nothing in a forked child."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            servers, self._servers = self._servers, []
        if os.getpid() != self.pid:
            return
        try:
            for server in servers:
                server.close()
        finally:
            if self._logs:
                logs._release()


_exit_hook = threading.Lock()
_exit_hook_pid: int | None = None


def _remove_spill_dirs_at_exit() -> None:
    """Has this process remove its environments' spill directories when the interpreter
    exits, once per process (registered with the first environment, not at import)."""
    global _exit_hook_pid
    with _exit_hook:
        if _exit_hook_pid != os.getpid():
            _exit_hook_pid = os.getpid()
            atexit.register(_native._remove_spill_dirs)


class NetworkEnvironment(_native.NetworkEnvironment):
    """One per process: the buffer pool, partitions, gates, the listener and connections.

    Create it with the settings below (all optional), use it as a context manager or call
    :meth:`close`. While it is open, Rust log records reach :mod:`logging` (see
    :mod:`creditflow.logs`).
    """

    __signature__: ClassVar[inspect.Signature]
    _side: _PythonSide
    _finalizer: weakref.finalize[[], None]

    # Type checkers take the parameters from the native class's __new__ (the stub); this
    # __init__ only sees them again after __new__ created the environment.
    if not TYPE_CHECKING:

        def __init__(self, *args, **kwargs):
            side = _PythonSide()
            self._side = side
            # Dropped without close(), or still open at exit: stop what was started.
            self._finalizer = weakref.finalize(self, side.stop)
            side.start_logs()
            _remove_spill_dirs_at_exit()

    def serve_metrics(self, port: int = 0, addr: str = "127.0.0.1") -> MetricsServer:
        """Serves this environment's metrics in the Prometheus text format at
        ``http://addr:port/metrics`` (``port=0``: any free port) until the environment closes.
        Needs ``prometheus_client`` (``pip install 'creditflow[metrics]'``)."""
        if os.getpid() != self._side.pid:
            raise RuntimeError(
                f"this NetworkEnvironment was created in process {self._side.pid} and cannot be used "
                f"in process {os.getpid()} (after fork); create a new NetworkEnvironment in this process"
            )
        if self.closed:
            raise ClosedError("network environment is closed")
        from creditflow import prometheus

        server = prometheus.serve(self, port, addr)
        if not self._side.add_server(server):
            server.close()
            raise ClosedError("network environment is closed")
        return server

    def close(self) -> None:
        """Closes connections and the listener, releases every partition, stops background
        threads and ``/metrics`` servers. Idempotent."""
        super().close()
        self._finalizer()


def _settings_doc() -> str:
    """The constructor's settings as a docstring section, from the core's table."""
    lines = ["", "Settings:", ""]
    for s in _native.settings():
        doc = s.doc.replace("`", "``")
        lines.append(f"- ``{s.name}={s.means or s.default}`` ({s.unit}): {doc}")
    return "\n    ".join(lines) + "\n"


NetworkEnvironment.__doc__ = (NetworkEnvironment.__doc__ or "").rstrip() + "\n" + _settings_doc()
# help() and IDEs show the native constructor's parameters, not __init__(*args, **kwargs).
NetworkEnvironment.__signature__ = inspect.signature(_native.NetworkEnvironment)
