"""Live per-task metrics of creditflow Spark jobs, collected on the driver.

A :class:`Monitor` listens on the driver; :func:`creditflow.spark.exchange` and
:func:`creditflow.spark.send` given ``monitor=`` make every task report a sample of its
metrics every ``interval`` seconds while it runs (rows and bytes in and out, out-pool usage,
time backpressured per second and in total, the backpressure level, time idle, the worker's
RSS) and a last one when it ends::

    with cf.spark.Monitor() as mon:
        out = cf.spark.exchange(df, "key", monitor=mon)
        out.write.parquet(...)  # mon.tasks() shows each task live, from another thread
        print(mon.tasks())

``Monitor(web=PORT)`` also serves the page of ``creditflow top --web`` for these tasks
(:mod:`creditflow.tools.web`) at :attr:`Monitor.web_url`: the tasks as nodes, an exchange's
all-to-all as edges, levels and the bottleneck.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from creditflow._closeable import Closeable
from creditflow.samples import TaskSample
from creditflow.spark._driver import driver_host
from creditflow.spark._messages import Inbox, Message, Outbox

if TYPE_CHECKING:
    from creditflow.tools.pipeline import Pipeline
    from creditflow.tools.web import PipelineServer

#: Seconds over which :meth:`Monitor.pipeline` computes rates (the samples come more often).
RATE_WINDOW = 1.0


def _age(older: TaskSample, newer: TaskSample) -> float:
    return newer.time - older.time


@dataclass(frozen=True)
class MonitorHandle:
    """What a task needs to report to a :class:`Monitor` (shipped in the job's closure)."""

    address: str
    key: str
    interval: float
    #: Whether tasks serve their environment's ``/metrics`` (loopback only) and report the URL.
    metrics: bool = False


class Monitor(Closeable):
    """Receives live metric samples from the tasks of creditflow Spark jobs.

    ``host`` is the driver address the executors reach (default: ``spark.driver.host`` of
    the SparkContext running in this process, where Spark's own executors reach the driver;
    without one, ``SPARK_LOCAL_IP`` or loopback: make the session first); ``interval`` is how
    often each task reports, in seconds. Keeps the latest sample per task and, up to
    ``max_samples``, every sample in arrival order.

    ``metrics``: have every task on a loopback executor (local mode) serve its environment's
    ``/metrics`` and report the URL (:meth:`metrics_urls`: what ``creditflow top`` takes).
    Only tasks with an environment of their own (``host_service=False``) have one to serve: the
    tasks attached to a host service report their samples, not a URL.

    ``web``: also serve the pipeline page (:mod:`creditflow.tools.web`) on this ``PORT`` or
    ``HOST:PORT`` (port 0: any free port; see :attr:`web_url`). Like ``creditflow top --web``
    it binds to loopback unless told otherwise, and a non-loopback address needs
    ``web_token`` (every request must carry it) or ``web_insecure=True``.
    """

    def __init__(
        self,
        interval: float = 0.5,
        *,
        host: str | None = None,
        max_samples: int = 100_000,
        metrics: bool = False,
        web: int | str | None = None,
        web_token: str | None = None,
        web_insecure: bool = False,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        key = secrets.token_hex(16)
        self._lock = threading.Lock()
        #: By :attr:`TaskSample.key` (a rank's samples apart from the task of its number).
        self._latest: dict[tuple[str, str, int], TaskSample] = {}
        #: Each task's samples of the last RATE_WINDOW seconds or so, for rates over that window.
        self._recent: dict[tuple[str, str, int], deque[TaskSample]] = {}
        self._samples: list[TaskSample] = []
        self._max_samples = max_samples
        self._web: PipelineServer | None = None
        if web is not None:
            from creditflow.tools.web import PipelineServer

            self._web = PipelineServer(self.pipeline, web, token=web_token, insecure=web_insecure)
        host = host or driver_host() or os.environ.get("SPARK_LOCAL_IP") or "127.0.0.1"
        try:
            self._inbox = Inbox(self._receive, host=host, key=key, name="creditflow-monitor")
        except BaseException:
            if self._web is not None:
                self._web.close()
            raise
        self.handle = MonitorHandle(self._inbox.address, key, interval, metrics)

    def _receive(self, message: Message) -> None:
        sample = TaskSample.from_message(message)
        task = sample.key
        with self._lock:
            self._latest[task] = sample
            recent = self._recent.setdefault(task, deque())
            recent.append(sample)
            # Keep one sample at least RATE_WINDOW old: the base of the rates.
            while len(recent) > 2 and _age(recent[1], sample) >= RATE_WINDOW:
                recent.popleft()
            if len(self._samples) < self._max_samples:
                self._samples.append(sample)

    def metrics_urls(self, job: str | None = None) -> list[str]:
        """The ``/metrics`` URLs the tasks (of one job, or of all) reported (with ``metrics=True``)."""
        return sorted({s.metrics_url for s in self.tasks(job) if s.metrics_url})

    @property
    def web_url(self) -> str | None:
        """The address of the pipeline page (``None`` without ``web=``)."""
        return self._web.url if self._web is not None else None

    def pipeline(self, job: str | None = None) -> Pipeline:
        """The tasks (of one job, or of all) as a graph, as the page draws them
        (:func:`creditflow.tools.pipeline.from_spark`)."""
        from creditflow.tools.pipeline import from_spark

        with self._lock:
            latest = [s for (j, _, _), s in sorted(self._latest.items()) if job is None or j == job]
            previous = {task: recent[0] for task, recent in self._recent.items() if len(recent) > 1}
        return from_spark(latest, previous, title="creditflow.spark: tasks of the running jobs")

    def tasks(self, job: str | None = None) -> list[TaskSample]:
        """The latest sample of every task (of one job, or of all), by job and task number (a
        send's ranks, kind ``"rank"``, after its tasks)."""
        with self._lock:
            return [s for (j, _, _), s in sorted(self._latest.items()) if job is None or j == job]

    def samples(self) -> list[TaskSample]:
        """Every sample received so far, oldest first."""
        with self._lock:
            return list(self._samples)

    def clear(self) -> None:
        """Forgets the samples received so far."""
        with self._lock:
            self._latest.clear()
            self._recent.clear()
            self._samples.clear()

    def close(self) -> None:
        """Stops listening (and serving the page). Idempotent."""
        self._inbox.close()
        if self._web is not None:
            self._web.close()


def rss_bytes() -> int:
    """This process's resident set size now (Linux ``/proc``; elsewhere its peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class Reporter:
    """Task side: sends ``sample()`` to a monitor every interval on a thread of its own, and a
    last sample (with ``done`` set) on :meth:`stop`. Without a monitor it does nothing. A
    monitor that went away only stops the reports, never the task."""

    def __init__(self, handle: MonitorHandle | None, sample: Callable[[], TaskSample]) -> None:
        self._handle = handle
        self._sample = sample
        self._stop = threading.Event()
        self._outbox: Outbox | None = None
        self._thread: threading.Thread | None = None
        self._rss_start = rss_bytes()
        if handle is None:
            return
        try:
            self._outbox = Outbox(handle.address, handle.key)
        except OSError:
            return
        self._thread = threading.Thread(target=self._run, name="creditflow-reporter", daemon=True)
        self._thread.start()

    def _send(self, done: bool) -> bool:
        if self._outbox is None:
            return False
        sample = self._sample()
        sample.time = time.time()
        sample.done = done
        sample.rss_bytes = rss_bytes()
        sample.rss_start_bytes = self._rss_start
        try:
            self._outbox.send(sample.to_message())
            return True
        except OSError:
            self._outbox.close()
            self._outbox = None
            return False

    def _run(self) -> None:
        assert self._handle is not None
        while not self._stop.wait(self._handle.interval):
            if not self._send(done=False):
                return

    def stop(self) -> None:
        """Stops reporting after one last sample."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._send(done=True)
        if self._outbox is not None:
            self._outbox.close()
            self._outbox = None
