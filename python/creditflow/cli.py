"""The ``creditflow`` command (also ``python -m creditflow``).

``creditflow top URL [URL ...]`` scrapes ``/metrics`` endpoints (``env.serve_metrics``)
and shows, refreshing in the terminal, every task, partition and gate with throughput,
pool usage and backpressure level, marking the bottleneck (see :mod:`creditflow.snapshot`).
Needs ``pip install 'creditflow[top]'``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import RenderableType

    from creditflow.snapshot import Snapshot, View

__all__ = ["main", "render"]

MARK = "◀ BOTTLENECK"


def _mb(bps: float) -> str:
    return f"{bps / 1e6:,.1f}"


def _pct(ratio: float) -> str:
    return f"{100 * ratio:.0f}%"


_LEVEL_STYLE = {"OK": "green", "LOW": "yellow", "HIGH": "bold red"}


def render(view: View, errors: dict[str, str]) -> RenderableType:
    """The screen for one view: tasks, partitions and gates, and unreachable URLs."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    tasks = Table(title="tasks (one per environment)", expand=True)
    for col in ("task", "level", "backpressured", "idle", "busy", "upstream", ""):
        tasks.add_column(col)
    for t in view.tasks:
        tasks.add_row(
            t.env,
            Text(t.level, style=_LEVEL_STYLE[t.level]),
            _pct(t.backpressured),
            _pct(t.idle),
            _pct(t.busy),
            ", ".join(t.upstream) or "-",
            Text(MARK, style="bold magenta") if t.bottleneck else "",
        )
    parts = Table(title="partitions (output)", expand=True)
    for col in ("task", "partition", "MB/s", "rows/s", "out pool", "backpressured", "level"):
        parts.add_column(col)
    for p in view.partitions:
        parts.add_row(
            p.env,
            p.partition,
            _mb(p.bytes_per_second),
            f"{p.rows_per_second:,.0f}",
            _pct(p.out_pool_usage),
            _pct(p.backpressured),
            Text(p.level, style=_LEVEL_STYLE.get(p.level, "")),
        )
    gates = Table(title="gates (input)", expand=True)
    for col in ("task", "gate", "MB/s", "rows/s", "in pool", "idle", "reads from"):
        gates.add_column(col)
    for g in view.gates:
        gates.add_row(
            g.env,
            g.gate,
            _mb(g.bytes_per_second),
            f"{g.rows_per_second:,.0f}",
            _pct(g.in_pool_usage),
            _pct(g.idle),
            ", ".join(g.upstream_envs) or "-",
        )
    parts_of_screen: list[RenderableType] = [tasks, parts, gates]
    for url, err in sorted(errors.items()):
        parts_of_screen.append(Text(f"{url}: {err}", style="red"))
    return Group(*parts_of_screen)


def _scrape_all(urls: Sequence[str], timeout: float) -> tuple[Snapshot, dict[str, str]]:
    from creditflow.snapshot import Snapshot, scrape

    snap = Snapshot(time.monotonic())
    errors: dict[str, str] = {}
    for url in urls:
        try:
            snap = snap.merge(scrape(url, timeout=timeout))
        except (OSError, ValueError) as e:
            errors[url] = f"unreachable ({e})"
    return snap, errors


def top(urls: Sequence[str], interval: float, iterations: int | None) -> int:
    """Runs the live view; returns the exit code."""
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        print("creditflow top needs rich: pip install 'creditflow[top]'", file=sys.stderr)
        return 2
    from creditflow.snapshot import summarize

    console = Console()
    prev, errors = _scrape_all(urls, timeout=interval)
    done = 0
    with Live(console=console, auto_refresh=False, screen=False) as live:
        while iterations is None or done < iterations:
            time.sleep(interval)
            cur, errors = _scrape_all(urls, timeout=interval)
            live.update(render(summarize(prev, cur), errors), refresh=True)
            prev = cur
            done += 1
    return 0


def _positive(value: str) -> float:
    v = float(value)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return v


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``creditflow`` console script."""
    parser = argparse.ArgumentParser(prog="creditflow", description="creditflow tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p_top = sub.add_parser(
        "top",
        help="live view of /metrics endpoints, marking the bottleneck",
        description="Scrapes /metrics endpoints (env.serve_metrics) and shows throughput, pool usage "
        "and backpressure per task, partition and gate, marking the bottleneck.",
    )
    p_top.add_argument(
        "urls", nargs="+", metavar="URL", help="e.g. http://127.0.0.1:9100/metrics or host:port"
    )
    p_top.add_argument("--interval", type=_positive, default=1.0, help="seconds between scrapes (default 1)")
    p_top.add_argument("--iterations", type=int, default=None, help="stop after this many refreshes")
    args = parser.parse_args(argv)
    try:
        return top(args.urls, args.interval, args.iterations)
    except KeyboardInterrupt:
        return 130
