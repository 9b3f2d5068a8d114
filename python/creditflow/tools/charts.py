"""Charts of metrics over time: :class:`Recorder` samples environments (in this process)
and/or ``/metrics`` URLs and writes a PNG of throughput, pool usage and backpressure per
task. Needs ``pip install 'creditflow[charts]'``.

    rec = Recorder([env, "http://10.0.0.5:9100/metrics"], names={env.address: "source"})
    with rec:  # samples every `interval` seconds in a background thread
        run_job()
    rec.write_png("exchange.png")
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from creditflow.tools.snapshot import Snapshot, View, from_env, scrape, summarize

if TYPE_CHECKING:
    from typing_extensions import Self

    from creditflow._native import NetworkEnvironment

__all__ = ["Recorder"]


class Recorder:
    """Samples metrics over time and draws them.

    ``sources``: :class:`~creditflow.NetworkEnvironment` objects of this process and/or
    ``/metrics`` URLs. ``interval``: seconds between samples of the background thread
    (:meth:`start` / ``with``); :meth:`sample` takes one by hand. ``names``: display names
    of tasks by environment address (default: the address).
    """

    def __init__(
        self,
        sources: Sequence[NetworkEnvironment | str],
        interval: float = 0.5,
        names: Mapping[str, str] | None = None,
    ) -> None:
        if not sources:
            raise ValueError("Recorder needs at least one environment or URL")
        if not interval > 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.sources = list(sources)
        self.interval = interval
        self.names = dict(names or {})
        #: One :class:`~creditflow.tools.snapshot.View` per sample after the first.
        self.views: list[View] = []
        #: URLs that could not be scraped, with the last error.
        self.errors: dict[str, str] = {}
        self._prev: Snapshot | None = None
        self._t0: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _snapshot(self) -> Snapshot:
        snap = Snapshot(time.monotonic())
        for src in self.sources:
            if isinstance(src, str):
                try:
                    snap = snap.merge(scrape(src, timeout=max(self.interval, 1.0)))
                except (OSError, ValueError) as e:
                    self.errors[src] = str(e)
            elif not src.closed:
                snap = snap.merge(from_env(src))
        return snap

    def sample(self) -> View | None:
        """Takes one sample now; returns the view since the previous one (``None`` for the
        first sample, which only sets the baseline)."""
        snap = self._snapshot()
        with self._lock:
            prev, self._prev = self._prev, snap
            if prev is None:
                self._t0 = snap.time
                return None
            view = summarize(prev, snap)
            self.views.append(view)
            return view

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> Self:
        """Starts sampling every ``interval`` seconds in a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the recorder is already running")
        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="creditflow-recorder", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the sampling thread after a last sample. Idempotent."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.sample()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_args: object) -> None:
        self.stop()

    def _name(self, env: str) -> str:
        return self.names.get(env, env)

    def write_png(self, path: str | Path, title: str | None = None) -> Path:
        """Draws throughput, pool usage and time backpressured per task over time into a
        PNG at ``path`` and returns the path. Needs at least two samples."""
        try:
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError(
                "creditflow.tools.charts needs matplotlib: pip install 'creditflow[charts]'"
            ) from e
        with self._lock:
            views = list(self.views)
            t0 = self._t0
        if not views or t0 is None:
            raise ValueError("nothing recorded yet: take at least two samples")
        envs = sorted({t.env for v in views for t in v.tasks})
        fig = Figure(figsize=(10, 8), layout="constrained")
        ax_tp, ax_pool, ax_bp = fig.subplots(3, 1, sharex=True)
        for env in envs:
            xs, tp, pool, bp = [], [], [], []
            for v in views:
                task = next((t for t in v.tasks if t.env == env), None)
                if task is None:
                    continue
                out = [p for p in v.partitions if p.env == env]
                inp = [g for g in v.gates if g.env == env]
                # A task's throughput: what it writes, or for a sink what it reads.
                rate = sum(p.bytes_per_second for p in out) if out else sum(g.bytes_per_second for g in inp)
                # Output pools fill when the task is backpressured; a gate with remote
                # channels holds its exclusive and floating buffers from the start, so its
                # in-pool usage shows only for a task without output.
                pools = [p.out_pool_usage for p in out] or [g.in_pool_usage for g in inp]
                usage = max(pools, default=0.0)
                xs.append(v.time - t0)
                tp.append(rate / 1e6)
                pool.append(100 * usage)
                bp.append(100 * task.backpressured)
            label = self._name(env)
            ax_tp.plot(xs, tp, label=label)
            ax_pool.plot(xs, pool, label=label)
            ax_bp.plot(xs, bp, label=label)
        ax_tp.set_ylabel("throughput (MB/s)")
        ax_pool.set_ylabel("pool usage (%)")
        ax_pool.set_ylim(0, 105)
        ax_bp.set_ylabel("backpressured (% of time)")
        ax_bp.set_ylim(0, 105)
        for y, name in ((10, "OK ≤ 10%"), (50, "LOW ≤ 50% < HIGH")):
            ax_bp.axhline(y, color="grey", linestyle="--", linewidth=0.8)
            ax_bp.annotate(name, (0, y), xycoords=("axes fraction", "data"), fontsize=8, color="grey")
        ax_bp.set_xlabel("seconds")
        ax_tp.legend(loc="upper right", fontsize=8)
        if title:
            fig.suptitle(title)
        out_path = Path(path)
        fig.savefig(out_path, dpi=100)
        return out_path
