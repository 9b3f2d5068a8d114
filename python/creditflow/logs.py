"""Rust log records → Python :mod:`logging`, under the ``creditflow`` logger.

The Rust core logs connection and channel events (``creditflow.transport.server``,
``creditflow.transport.client``, ``creditflow.env``, ...). Making a record never takes the
GIL: the Rust side only puts it in a bounded queue (10,000 records; older ones are dropped
and a warning says how many). A daemon thread, started with the first
:class:`~creditflow.NetworkEnvironment` of a process (not at import), takes records out and
emits them with :mod:`logging`. Set the level on the ``creditflow`` logger; the Rust side
follows it within a quarter of a second. :func:`flush` emits what is queued right away.
"""

from __future__ import annotations

import logging
import os
import threading

from creditflow import _native

__all__ = ["flush"]

ROOT = "creditflow"
_POLL_SECONDS = 0.25

_lock = threading.Lock()
_thread: threading.Thread | None = None
_pid = 0


def _emit(records: list[tuple[int, str, str]], dropped: int) -> None:
    if dropped:
        logging.getLogger(ROOT).warning("%d Rust log records were dropped (queue full)", dropped)
    for level, name, message in records:
        logging.getLogger(name).log(level, "%s", message)


def _sync_level() -> None:
    _native._set_log_level(logging.getLogger(ROOT).getEffectiveLevel())


def _run() -> None:
    while True:
        _sync_level()
        records, dropped = _native._drain_logs(_POLL_SECONDS)
        _emit(records, dropped)


def _ensure_forwarding() -> None:
    """Starts the forwarding thread of this process, once (called by NetworkEnvironment)."""
    global _thread, _pid
    with _lock:
        if _thread is not None and _pid == os.getpid() and _thread.is_alive():
            return
        _sync_level()
        _pid = os.getpid()
        _thread = threading.Thread(target=_run, name="creditflow-logs", daemon=True)
        _thread.start()


def flush() -> None:
    """Emits the Rust log records queued so far, in the calling thread."""
    _sync_level()
    records, dropped = _native._drain_logs(0.0)
    _emit(records, dropped)
