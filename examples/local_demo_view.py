"""How the local demo (``examples/local_demo.py``) shows a run: the samples its monitor takes,
the live view (a rich panel on a terminal, else a plain line a second), the backpressure
level's timeline and the chart written at the end."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from typing_extensions import Self

TICK_SECONDS = 0.25  # live view and sampling period
LEVEL_STYLES = {"OK": "bold green", "LOW": "bold yellow", "HIGH": "bold red"}


@dataclass(frozen=True)
class Sample:
    """The exchange's metrics at one moment."""

    t: float
    slow: bool
    producing: bool
    rows_written: int
    bytes_written: int
    rows_read: int
    bytes_read: int
    write_mb_s: float
    read_mb_s: float
    bp_ms: float
    level: str
    out_pool_usage: float
    backlog: tuple[int, ...]
    segments_available: int
    segments_total: int


class View(Protocol):
    """Shows samples as they come."""

    def update(self, s: Sample, force: bool = False) -> None:
        """Shows a sample (``force``: even if the last one was shown just now)."""

    def announce(self, lines: Sequence[str]) -> None:
        """Shows lines that stay for the whole run (where to look from outside)."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


def phase(s: Sample) -> str:
    """The phase's name."""
    return "consumer slow" if s.slow else "normal"


def plain_line(s: Sample) -> str:
    """One line describing a sample."""
    backlog = ",".join(str(b) for b in s.backlog)
    return (
        f"t={s.t:5.1f}s  {phase(s):13}"
        f"  written {s.rows_written / 1e6:6.2f}M rows {s.bytes_written / 1e6:7.1f} MB"
        f"  read {s.rows_read / 1e6:6.2f}M rows  {s.write_mb_s:6.1f} MB/s  out-pool {s.out_pool_usage:4.0%}"
        f"  backlog [{backlog}]  level {s.level:4} ({s.bp_ms:4.0f} ms/s)"
        f"  segments {s.segments_available}/{s.segments_total}"
    )


class PlainView:
    """One plain line per second (no TTY, or no rich)."""

    def __init__(self) -> None:
        self._next = 0.0

    def update(self, s: Sample, force: bool = False) -> None:
        """Prints the sample if a second has passed since the last line."""
        if force or s.t >= self._next:
            print(plain_line(s), flush=True)
            self._next = s.t + 1.0 - TICK_SECONDS / 2

    def announce(self, lines: Sequence[str]) -> None:
        """Prints the lines."""
        for line in lines:
            print(line, flush=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class RichView:
    """A rich Live panel refreshed with every sample."""

    def __init__(self, slow_text: str) -> None:
        from rich.console import Console
        from rich.live import Live

        self._slow_text = slow_text
        self._live = Live(console=Console(), refresh_per_second=1 / TICK_SECONDS, transient=False)
        self._links: list[str] = []

    def update(self, s: Sample, force: bool = False) -> None:
        """Redraws the panel."""
        self._live.update(self._render(s), refresh=force)

    def announce(self, lines: Sequence[str]) -> None:
        """Shows the lines under the panel's figures."""
        self._links = list(lines)

    def _render(self, s: Sample) -> Any:
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold cyan", justify="right")
        grid.add_column()
        grid.add_row("elapsed", f"{s.t:5.1f} s")
        grid.add_row(
            "phase",
            Text(phase(s), style="bold red" if s.slow else "green")
            + Text(f"  (consumer 0 slow {self._slow_text})"),
        )
        grid.add_row("written", f"{s.rows_written:>12,} rows  {s.bytes_written / 1e6:9.1f} MB")
        grid.add_row("read", f"{s.rows_read:>12,} rows  {s.bytes_read / 1e6:9.1f} MB")
        grid.add_row(
            "throughput", f"{s.write_mb_s:7.1f} MB/s written  {s.read_mb_s:7.1f} MB/s read  (last second)"
        )
        pool = Table.grid(padding=(0, 1))
        pool.add_row(ProgressBar(total=1.0, completed=s.out_pool_usage, width=40), f"{s.out_pool_usage:4.0%}")
        grid.add_row("out-pool usage", pool)
        grid.add_row("backlog", "  ".join(f"sp{i}: {b:>3}" for i, b in enumerate(s.backlog)) + "  buffers")
        level = Text(f"{s.level:4}", style=LEVEL_STYLES.get(s.level, "bold"))
        grid.add_row("backpressure", level + Text(f"  {s.bp_ms:5.0f} ms/s blocked"))
        grid.add_row("global pool", f"{s.segments_available}/{s.segments_total} segments available")
        for line in self._links:
            label, _, text = line.partition(": ")
            grid.add_row(label, text.strip())
        return Panel(grid, title="creditflow demo: orders hash-partitioned to 4 consumers", expand=False)

    def __enter__(self) -> Self:
        self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._live.__exit__(exc_type, exc, tb)


def make_view(plain: bool, slow_text: str) -> View:
    """The rich live view on a terminal (if rich is installed and not ``plain``), plain lines
    otherwise; ``slow_text`` says when consumer 0 is slow."""
    if not plain and sys.stdout.isatty():
        try:
            return RichView(slow_text)
        except ImportError:
            pass
    return PlainView()


def level_timeline(samples: Sequence[Sample]) -> list[tuple[float, str]]:
    """(time, level) at every change of the level."""
    timeline: list[tuple[float, str]] = []
    for s in samples:
        if not timeline or timeline[-1][1] != s.level:
            timeline.append((s.t, s.level))
    return timeline


def format_timeline(samples: Sequence[Sample]) -> str:
    """The level timeline as ``OK@0.0s -> HIGH@4.2s -> ...``."""
    return " -> ".join(f"{level}@{t:.1f}s" for t, level in level_timeline(samples))


def write_chart(
    samples: Sequence[Sample], path: Path, title: str, slow: tuple[float, float | None] | None
) -> bool:
    """Writes throughput and backpressure over time as a PNG titled ``title``, the slow phase
    (``slow``: from, until or None for the end) shaded; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    t = [s.t for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6.5), constrained_layout=True)
    top.plot(t, [s.write_mb_s for s in samples], label="written MB/s", color="tab:blue")
    top.plot(t, [s.read_mb_s for s in samples], label="read MB/s", color="tab:green", linestyle="--")
    top.set_ylabel("throughput (MB/s, last 1 s)")
    top.set_title(title)
    bottom.plot(t, [s.bp_ms for s in samples], label="backpressured ms/s", color="tab:red")
    bottom.axhline(100, color="goldenrod", linestyle=":", linewidth=1, label="LOW threshold")
    bottom.axhline(500, color="darkred", linestyle=":", linewidth=1, label="HIGH threshold")
    bottom.set_ylim(0, 1050)
    bottom.set_ylabel("writer blocked (ms/s)")
    bottom.set_xlabel("time (s)")
    pool = bottom.twinx()
    pool.plot(t, [100 * s.out_pool_usage for s in samples], color="tab:purple", alpha=0.6, label="out-pool %")
    pool.set_ylim(0, 105)
    pool.set_ylabel("out-pool usage (%)")
    for ax in (top, bottom):
        if slow is not None:
            start, until = slow
            ax.axvspan(
                start,
                t[-1] if until is None else until,
                color="tab:orange",
                alpha=0.15,
                label="consumer 0 slow",
            )
        ax.grid(alpha=0.3)
    top.legend(loc="lower right")
    lines, labels = bottom.get_legend_handles_labels()
    more_lines, more_labels = pool.get_legend_handles_labels()
    bottom.legend(lines + more_lines, labels + more_labels, loc="center right", fontsize="small")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
