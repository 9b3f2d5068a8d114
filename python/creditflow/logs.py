"""Rust log records → Python :mod:`logging`, under the ``creditflow`` logger.

The Rust core logs connection and channel events (``creditflow.net.server``,
``creditflow.net.client``, ``creditflow.net``, ``creditflow.env``, ...). Making a record never takes the
GIL: the Rust side only puts it in a bounded queue (10,000 records; older ones are dropped
and a warning says how many). While a :class:`~creditflow.NetworkEnvironment` of this
process is open, a daemon thread (``creditflow-logs``) takes records out and emits them
with :mod:`logging`; it starts with the first environment (not at import) and stops when
the last one closes. Set the level on the ``creditflow`` logger; the Rust side follows it
within a quarter of a second. :func:`flush` emits what is queued right away.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from creditflow import _native

__all__ = ["flush"]

ROOT = "creditflow"
_POLL_SECONDS = 0.25

_lock = threading.Lock()
_thread: threading.Thread | None = None
_stop = threading.Event()
_users = 0
_pid = 0


def _emit(records: list[tuple[int, str, str]], dropped: int) -> None:
    if dropped:
        logging.getLogger(ROOT).warning("%d Rust log records were dropped (queue full)", dropped)
    for level, name, message in records:
        logging.getLogger(name).log(level, "%s", message)


def _sync_level() -> None:
    _native._set_log_level(logging.getLogger(ROOT).getEffectiveLevel())


def _run(stop: threading.Event) -> None:
    while not stop.is_set():
        _sync_level()
        _emit(*_native._drain_logs(_POLL_SECONDS))


def _acquire() -> None:
    """An environment opened: make sure the forwarding thread runs (NetworkEnvironment)."""
    global _thread, _stop, _users, _pid
    with _lock:
        if _pid != os.getpid():  # first use, or a forked child: the parent's thread is not here
            _pid, _users, _thread = os.getpid(), 0, None
        _users += 1
        if _thread is None:
            _sync_level()
            _stop = threading.Event()
            _thread = threading.Thread(target=_run, args=(_stop,), name="creditflow-logs", daemon=True)
            _thread.start()


def _release() -> None:
    """An environment closed: stop the thread when it was the last one, after emitting
    what is queued (NetworkEnvironment.close)."""
    global _thread, _users
    with _lock:
        if _pid != os.getpid() or _users == 0:
            return
        _users -= 1
        if _users > 0 or _thread is None:
            return
        thread, _thread = _thread, None
        _stop.set()
        _native._wake_logs()
    if sys.is_finalizing():
        return  # an environment dropped at interpreter shutdown: the thread may be frozen
    thread.join()
    flush()


def flush() -> None:
    """Emits the Rust log records queued so far, in the calling thread."""
    _sync_level()
    _emit(*_native._drain_logs(0.0))
