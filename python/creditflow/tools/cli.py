"""The ``creditflow`` command (also ``python -m creditflow``).

``creditflow top URL [URL ...]`` scrapes ``/metrics`` endpoints (``env.serve_metrics``)
and shows, refreshing in the terminal, every task, partition and gate with throughput,
pool usage and backpressure level, marking the bottleneck (see :mod:`creditflow.tools.snapshot`).
Needs ``pip install 'creditflow[top]'``.

``creditflow top --web [HOST:]PORT URL [URL ...]`` scrapes the same way and, instead of the
terminal view, serves a page that draws the pipeline as a graph (see :mod:`creditflow.tools.web`)
at ``http://HOST:PORT/`` and its data at ``/api/pipeline``, until Ctrl-C. A URL may be given
as ``NAME=URL`` to name its task (``source=127.0.0.1:9100``).

``creditflow certs --out DIR NODE [NODE ...]`` writes a CA (``DIR/ca.pem``, ``DIR/ca-key.pem``;
reused if there) and, per node ``[NAME=]HOST[,HOST...]``, a certificate for its DNS names and IP
addresses with its key (``DIR/NAME.pem``, ``DIR/NAME-key.pem``, keys mode 0600) for
``TLSConfig(cert=..., key=..., ca=...)`` (see :mod:`creditflow.tools.certs`). Existing node files are
kept unless ``--force``. Needs ``pip install 'creditflow[tls]'``.

``creditflow serve NAME [OPTIONS]`` runs a host service in this process until Ctrl-C or SIGTERM
(see :mod:`creditflow.tools.serve_command`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from creditflow.tools import serve_command

if TYPE_CHECKING:
    from rich.console import RenderableType

    from creditflow.tools.snapshot import View

__all__ = ["main", "render"]

MARK = "◀ BOTTLENECK"


def _mb(bps: float) -> str:
    return f"{bps / 1e6:,.1f}"


def _pct(ratio: float) -> str:
    return f"{100 * ratio:.0f}%"


_LEVEL_STYLE = {"OK": "green", "LOW": "yellow", "HIGH": "bold red"}


def _spilling(per_second: float | None, disk: float | None) -> str:
    """A blocking or hybrid partition's spill rate and disk use; ``-`` for a pipelined one."""
    if per_second is None:
        return "-"
    return f"{_mb(per_second)} MB/s, {(disk or 0.0) / 1e6:,.1f} MB on disk"


def render(view: View, errors: dict[str, str], names: Mapping[str, str] | None = None) -> RenderableType:
    """The screen for one view: tasks, partitions and gates, and unreachable URLs. ``names``:
    display names of tasks by address (default: the address)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def name(env: str) -> str:
        return (names or {}).get(env, env)

    tasks = Table(title="tasks (one per environment)", expand=True)
    for col in ("task", "level", "backpressured", "idle", "busy", "upstream", ""):
        tasks.add_column(col)
    for t in view.tasks:
        tasks.add_row(
            name(t.env),
            Text(t.level, style=_LEVEL_STYLE[t.level]),
            _pct(t.backpressured),
            _pct(t.idle),
            _pct(t.busy),
            ", ".join(map(name, t.upstream)) or "-",
            Text(MARK, style="bold magenta") if t.bottleneck else "",
        )
    parts = Table(title="partitions (output)", expand=True)
    for col in ("task", "partition", "MB/s", "rows/s", "out pool", "backpressured", "level", "spilling"):
        parts.add_column(col)
    for p in view.partitions:
        parts.add_row(
            name(p.env),
            p.partition,
            _mb(p.bytes_per_second),
            f"{p.rows_per_second:,.0f}",
            _pct(p.out_pool_usage),
            _pct(p.backpressured),
            Text(p.level, style=_LEVEL_STYLE.get(p.level, "")),
            _spilling(p.spilled_per_second, p.spill_disk_bytes),
        )
    gates = Table(title="gates (input)", expand=True)
    for col in ("task", "gate", "MB/s", "rows/s", "in pool", "idle", "reads from"):
        gates.add_column(col)
    for g in view.gates:
        gates.add_row(
            name(g.env),
            g.gate,
            _mb(g.bytes_per_second),
            f"{g.rows_per_second:,.0f}",
            _pct(g.in_pool_usage),
            _pct(g.idle),
            ", ".join(map(name, g.upstream_envs)) or "-",
        )
    parts_of_screen: list[RenderableType] = [tasks, parts, gates]
    for url, err in sorted(errors.items()):
        parts_of_screen.append(Text(f"{url}: {err}", style="red"))
    return Group(*parts_of_screen)


def top(args: Sequence[str], interval: float, iterations: int | None) -> int:
    """Runs the live view of the ``[NAME=]URL`` arguments; returns the exit code."""
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        print("creditflow top needs rich: pip install 'creditflow[top]'", file=sys.stderr)
        return 2
    from creditflow.tools.snapshot import scrape_all, summarize

    urls, names = _named(args)
    console = Console()
    prev, errors = scrape_all(urls, timeout=interval)
    done = 0
    with Live(console=console, auto_refresh=False, screen=False) as live:
        while iterations is None or done < iterations:
            time.sleep(interval)
            cur, errors = scrape_all(urls, timeout=interval)
            live.update(render(summarize(prev, cur), errors, cur.names(names)), refresh=True)
            prev = cur
            done += 1
    return 0


def _named(args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The URLs of ``[NAME=]URL`` arguments, and the names by URL."""
    from creditflow.tools.web import split_name

    named = [split_name(a) for a in args]
    return [url for _, url in named], {url: name for name, url in named if name is not None}


def web(
    args: Sequence[str], bind: str, interval: float, token: str | None, insecure: bool, iterations: int | None
) -> int:
    """Serves the pipeline page for the ``[NAME=]URL`` arguments until Ctrl-C (or for
    ``iterations`` scrape intervals); returns the exit code."""
    try:
        import prometheus_client  # noqa: F401 - the parser of scraped pages
    except ImportError:
        print(
            "creditflow top --web needs prometheus_client: pip install 'creditflow[metrics]'", file=sys.stderr
        )
        return 2
    from creditflow.tools.web import serve

    urls, names = _named(args)
    try:
        server = serve(urls, bind, interval=interval, names=names, token=token, insecure=insecure)
    except ValueError as e:
        print(f"creditflow top: {e}", file=sys.stderr)
        return 2
    with server:
        print(
            f"creditflow top: the pipeline page is at {server.url} (JSON: /api/pipeline); Ctrl-C stops",
            flush=True,
        )
        done = 0
        while iterations is None or done < iterations:
            time.sleep(interval)
            done += 1
    return 0


def certs(out: str, nodes: Sequence[str], days: int, force: bool) -> int:
    """Writes a CA and node certificates (``creditflow certs``); returns the exit code."""
    try:
        import cryptography  # noqa: F401 - only to tell a missing package apart
    except ImportError:
        print("creditflow certs needs cryptography: pip install 'creditflow[tls]'", file=sys.stderr)
        return 2
    from creditflow.tools.certs import CA_CERT, CA_KEY, CertsError, make_certs

    try:
        written, made = make_certs(out, nodes, days=days, force=force)
    except CertsError as e:
        print(f"creditflow certs: {e}", file=sys.stderr)
        return 1
    ca = written[0].ca
    what = "wrote the CA" if made else "signed with the existing CA"
    print(f"{what} {ca} (its key: {ca.parent / CA_KEY})")
    for f in written:
        print(f"{f.name}: TLSConfig(cert={str(f.cert)!r}, key={str(f.key)!r}, ca={str(f.ca)!r})")
    print(f"Copy each node's two files and {CA_CERT} to it; keep {CA_KEY} private (it adds nodes later).")
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
        "urls",
        nargs="+",
        metavar="[NAME=]URL",
        help="e.g. http://127.0.0.1:9100/metrics, host:port or source=host:port (names the task)",
    )
    p_top.add_argument("--interval", type=_positive, default=1.0, help="seconds between scrapes (default 1)")
    p_top.add_argument("--iterations", type=int, default=None, help="stop after this many refreshes")
    p_top.add_argument(
        "--web",
        metavar="[HOST:]PORT",
        default=None,
        help="serve a page drawing the pipeline as a graph (and /api/pipeline) instead of the terminal "
        "view; HOST defaults to 127.0.0.1, PORT 0 picks a free port",
    )
    p_top.add_argument(
        "--token", default=None, help="with --web: requests must carry ?token=TOKEN (needed off loopback)"
    )
    p_top.add_argument(
        "--insecure", action="store_true", help="with --web: allow a non-loopback address without a token"
    )
    p_certs = sub.add_parser(
        "certs",
        help="write a CA and a certificate per node for TLSConfig",
        description="Writes a CA (DIR/ca.pem, DIR/ca-key.pem; reused when DIR has one) and, for each "
        "node, a certificate for its hosts signed by it (DIR/NAME.pem) with its key (DIR/NAME-key.pem, "
        "mode 0600). Give each node TLSConfig(cert=DIR/NAME.pem, key=DIR/NAME-key.pem, ca=DIR/ca.pem).",
    )
    p_certs.add_argument(
        "nodes",
        nargs="+",
        metavar="[NAME=]HOST[,HOST...]",
        help="a node and the DNS names and IP addresses peers reach it by, e.g. "
        "worker1=node1.example,10.0.0.5; NAME (default: the first host) names its files",
    )
    p_certs.add_argument("--out", default=".", help="directory of the CA and the node files (default: .)")
    p_certs.add_argument("--days", type=int, default=825, help="validity of node certificates (default 825)")
    p_certs.add_argument("--force", action="store_true", help="overwrite existing node files")
    serve_parser = serve_command.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "certs":
        return certs(args.out, args.nodes, args.days, args.force)
    if args.command == "serve":
        return serve_command.run(args, serve_parser)
    try:
        if args.web is not None:
            return web(args.urls, args.web, args.interval, args.token, args.insecure, args.iterations)
        if args.token is not None or args.insecure:
            parser.error("--token and --insecure go with --web")
        return top(args.urls, args.interval, args.iterations)
    except KeyboardInterrupt:
        return 130
