"""The threads a receiver starts (its readers, mostly) and its close waits for."""

from __future__ import annotations

import threading
from typing import Any


class Threads:
    """Daemon threads started on a receiver's behalf. Once :meth:`join` began, none starts
    (:meth:`start` says so), and every thread :meth:`join` waits for was started: a thread
    is listed and started under one lock, so a close racing a registration never finds one
    listed but not yet started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closing = False

    def start(self, target: Any, name: str, *args: Any) -> bool:
        """Starts ``target(*args)`` on a daemon thread called ``name``; False (and nothing
        started) once :meth:`join` began. Threads that ended are forgotten here, as a
        receiver may live for many jobs."""
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            if self._closing:
                return False
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
            thread.start()
        return True

    def join(self, timeout: float | None = None) -> None:
        """Refuses new threads and waits for each started one, up to ``timeout`` each."""
        with self._lock:
            self._closing = True
            threads = list(self._threads)
        for t in threads:
            t.join(timeout)
