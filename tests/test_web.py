"""The pipeline page: ``creditflow top --web`` and ``Monitor(web=...)`` draw the
job as a graph, color tasks by backpressure level and name the bottleneck.

The first tests build graphs from synthetic scrapes (``env.metrics()``-shaped dicts exported
by :mod:`creditflow.prometheus` and parsed back by :mod:`creditflow.tools.snapshot`, as a scrape
would): pure Python, fast (Spark jobs' graphs: ``tests/test_web_spark.py``). Then the server: what it serves,
its token and its refusal of a non-loopback address. The end-to-end test runs source → map →
sink in three processes (``tests/pipeline_worker.py``, the sink throttled), serves the page
with ``creditflow top --web`` and reads the page's DOM as headless Chromium rendered it.

``CREDITFLOW_SCREENSHOT=docs/pipeline.png`` makes the end-to-end test also save a screenshot
of the page while the sink is the bottleneck.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from creditflow.prometheus import families
from creditflow.spark.monitor import Monitor
from creditflow.tools.pipeline import Pipeline, from_view
from creditflow.tools.snapshot import Snapshot, View, from_text, level_of, summarize
from creditflow.tools.web import PipelineServer, Scraper, check_bind, page, parse_bind, split_name
from helpers import by_id, get, get_json, poll

MB = 1_000_000

# ------------------------------------------------------------------------- synthetic scrapes


def partition(written: float, bp: float, pool: float = 0.5) -> dict[str, Any]:
    """A partition's metrics: ``written`` bytes so far (rows: a tenth), ``bp`` of the last
    second backpressured."""
    return {
        "out_pool_usage": pool,
        "pool": {"in_use": 10, "usage": pool},
        "backlog": [3],
        "bytes_written": written,
        "rows_written": written / 10,
        "backpressured_ms_per_second": 1000 * bp,
        "busy_ms_per_second": 1000 * (1 - bp),
        "level": level_of(bp),
        "subpartitions": [],
    }


def gate(idle: float, channels: Sequence[tuple[str, str, float]], pool: float = 0.25) -> dict[str, Any]:
    """A gate's metrics: ``idle`` of the last second waiting, and its channels as
    ``(peer address, partition, bytes received so far)``."""
    return {
        "pool": {"in_use": 4, "usage": pool},
        "bytes_received": sum(c[2] for c in channels),
        "rows_received": sum(c[2] for c in channels) / 10,
        "idle_ms_per_second": 1000 * idle,
        "busy_ms_per_second": 1000 * (1 - idle),
        "channels": [
            {
                "index": i,
                "spec": {"address": peer, "partition_id": pid, "subpartition": 0},
                "bytes_received": received,
                "rows_received": received / 10,
            }
            for i, (peer, pid, received) in enumerate(channels)
        ],
    }


def environment(
    address: str, partitions: Mapping[str, Any] | None = None, gates: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An ``env.metrics()``-shaped dict."""
    return {
        "address": address,
        "segments_total": 256,
        "segments_available": 12,
        "segment_size": 32768,
        "partitions": dict(partitions or {}),
        "gates": dict(gates or {}),
    }


class _Fixed(Collector):
    def __init__(self, metrics: dict[str, Any]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(families(self._metrics))


def page_of(metrics: dict[str, Any]) -> str:
    """The ``/metrics`` page an environment with these metrics serves."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(metrics))
    return generate_latest(registry).decode()


def snapshot(envs: Sequence[dict[str, Any]], at: float) -> Snapshot:
    """What scraping every environment's page at time ``at`` gives."""
    snap = Snapshot(at)
    for m in envs:
        snap = snap.merge(from_text(page_of(m), at=at))
    return snap


def view(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], seconds: float = 1.0) -> View:
    """The view between two scrapes ``seconds`` apart."""
    return summarize(snapshot(before, 100.0), snapshot(after, 100.0 + seconds))


SRC, MAP, SINK = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"


def chain(t: float, sink_throttled: bool) -> list[dict[str, Any]]:
    """source → map → sink at ``t`` seconds, moving 2 MB/s (throttled sink: source and map
    backpressured 90% of the time, the sink never idle) or 9 MB/s (all keep up)."""
    rate = 2 * MB if sink_throttled else 9 * MB
    bp, idle = (0.9, 0.02) if sink_throttled else (0.0, 0.6)
    moved = rate * t
    return [
        environment(SRC, {"src": partition(moved, bp, pool=1.0 if sink_throttled else 0.1)}),
        environment(
            MAP,
            {"mapped": partition(moved, bp, pool=1.0 if sink_throttled else 0.1)},
            {"g0": gate(0.0 if sink_throttled else idle, [(SRC, "src", moved)])},
        ),
        environment(SINK, gates={"g0": gate(idle, [(MAP, "mapped", moved)], pool=1.0)}),
    ]


# ------------------------------------------------------------------------------ graph (unit)


def test_a_throttled_sink_is_the_bottleneck_of_its_chain_with_the_reason_in_words() -> None:
    p = from_view(view(chain(0, True), chain(1, True)), names={SRC: "source", MAP: "map", SINK: "sink"})
    nodes = by_id(p)
    assert [(n.name, n.level, n.layer, n.row) for n in p.nodes] == [
        ("source", "HIGH", 0, 0),
        ("map", "HIGH", 1, 0),
        ("sink", "OK", 2, 0),
    ]
    assert [n.id for n in p.bottlenecks] == [SINK]
    assert nodes[SINK].reason == "busy 98%, not backpressured; its upstream is HIGH"
    assert nodes[MAP].reason.startswith("backpressured 90%")
    assert nodes[SRC].partitions == ["src"]
    assert nodes[MAP].gates == ["g0"]
    assert nodes[MAP].out_pool_usage == 1.0
    assert nodes[SINK].in_pool_usage == 1.0
    assert nodes[SINK].out_pool_usage is None  # it has no partition
    assert [(e.source, e.target, e.partitions) for e in p.edges] == [
        (SRC, MAP, ["src"]),
        (MAP, SINK, ["mapped"]),
    ]
    assert all(e.bytes_per_second == pytest.approx(2 * MB) for e in p.edges)
    assert all(e.rows_per_second == pytest.approx(2 * MB / 10) for e in p.edges)
    assert nodes[MAP].bytes_in_per_second == pytest.approx(2 * MB)
    assert nodes[MAP].bytes_out_per_second == pytest.approx(2 * MB)

    data = json.loads(json.dumps(p.to_json()))
    assert set(data) == {"title", "nodes", "edges", "levels", "bottleneck", "errors"}
    assert data["levels"] == {SRC: "HIGH", MAP: "HIGH", SINK: "OK"}
    assert data["bottleneck"] == [
        {"id": SINK, "name": "sink", "reason": "busy 98%, not backpressured; its upstream is HIGH"}
    ]
    assert {(e["source"], e["target"]) for e in data["edges"]} == {(SRC, MAP), (MAP, SINK)}


def test_when_everyone_keeps_up_there_is_no_bottleneck() -> None:
    p = from_view(view(chain(0, False), chain(2, False), seconds=2.0))
    assert set(p.levels.values()) == {"OK"}
    assert p.bottlenecks == []
    assert by_id(p)[SINK].reason == "idle 60%: waits for input"
    assert all(e.bytes_per_second == pytest.approx(9 * MB) for e in p.edges)


def test_the_first_scrape_has_the_graph_but_no_rates() -> None:
    p = from_view(summarize(None, snapshot(chain(5, True), 1.0)))
    assert len(p.nodes) == 3
    assert len(p.edges) == 2
    assert all(e.bytes_per_second == 0 for e in p.edges)


def test_a_peer_reached_under_another_name_is_matched_by_its_partition() -> None:
    # The map reads "src" at localhost:7000, the name it was given; the source reports itself
    # as 10.0.0.1:7000. Only one scraped environment exports "src": that is the producer.
    def envs(t: float) -> list[dict[str, Any]]:
        moved = MB * t
        return [
            environment(SRC, {"src": partition(moved, 0.0)}),
            environment(MAP, gates={"g": gate(0.5, [("localhost:7000", "src", moved)])}),
        ]

    p = from_view(view(envs(0), envs(1)))
    assert [(e.source, e.target) for e in p.edges] == [(SRC, MAP)]
    assert by_id(p)[MAP].gates == ["g"]
    assert len(p.nodes) == 2


def test_a_producer_whose_endpoint_was_not_given_is_drawn_as_not_scraped() -> None:
    def envs(t: float) -> list[dict[str, Any]]:
        return [environment(SINK, gates={"g": gate(0.1, [(MAP, "mapped", MB * t)])})]

    p = from_view(view(envs(0), envs(1)))
    assert [(n.id, n.scraped) for n in p.nodes] == [(SINK, True), (MAP, False)]
    assert "not scraped" in by_id(p)[MAP].reason
    assert [(e.source, e.target) for e in p.edges] == [(MAP, SINK)]
    assert (by_id(p)[MAP].layer, by_id(p)[SINK].layer) == (0, 1)


def test_a_slow_stage_in_a_longer_chain_is_the_only_bottleneck() -> None:
    # a → b → c → d, d slow: b and c are HIGH and busy pushing, but only d is the bottleneck.
    names = ["a:1", "b:1", "c:1", "d:1"]

    def envs(t: float) -> list[dict[str, Any]]:
        out = []
        for i, env in enumerate(names):
            parts = {f"p{i}": partition(MB * t, 0.8)} if i < 3 else {}
            gates = {"g": gate(0.0, [(names[i - 1], f"p{i - 1}", MB * t)])} if i else {}
            out.append(environment(env, parts, gates))
        return out

    p = from_view(view(envs(0), envs(1)))
    assert [n.id for n in p.bottlenecks] == ["d:1"]
    assert [n.layer for n in p.nodes] == [0, 1, 2, 3]


def test_in_an_all_to_all_exchange_the_task_whose_reader_never_waits_is_the_bottleneck() -> None:
    # Three tasks each read every task's partition. Task 1's consumer is slow: every writer
    # (its own too) waits for buffers, so all are HIGH; the others' readers wait for input.
    tasks = ["t0:1", "t1:1", "t2:1"]

    def envs(t: float) -> list[dict[str, Any]]:
        return [
            environment(
                env,
                {f"x{i}": partition(3 * MB * t, 0.85)},
                {"g": gate(0.03 if i == 1 else 0.8, [(tasks[j], f"x{j}", MB * t) for j in range(3)])},
            )
            for i, env in enumerate(tasks)
        ]

    p = from_view(view(envs(0), envs(1)))
    assert set(p.levels.values()) == {"HIGH"}
    assert [n.id for n in p.bottlenecks] == ["t1:1"]
    assert "busy reading 97%" in by_id(p)["t1:1"].reason
    assert "all-to-all" in by_id(p)["t1:1"].reason
    # Own partitions stay inside the node; the others are six edges, all in one column.
    assert len(p.edges) == 6
    assert {n.layer for n in p.nodes} == {0}
    assert sorted(n.row for n in p.nodes) == [0, 1, 2]


def test_names_come_from_the_urls_the_environments_were_scraped_from() -> None:
    assert split_name("source=127.0.0.1:9100") == ("source", "127.0.0.1:9100")
    assert split_name("http://h:1/metrics?a=b") == (None, "http://h:1/metrics?a=b")
    assert split_name("127.0.0.1:9100") == (None, "127.0.0.1:9100")
    snap = snapshot(chain(0, True), 1.0)
    snap.origin = {SRC: "s", MAP: "m", SINK: "k"}
    assert snap.names({"s": "source", "k": "sink"}) == {SRC: "source", SINK: "sink"}


def test_top_shows_the_names_too() -> None:
    from rich.console import Console

    from creditflow.tools.cli import MARK, render

    console = Console(width=200, record=True)
    console.print(render(view(chain(0, True), chain(1, True)), {}, {SRC: "source", SINK: "sink"}))
    text = console.export_text()
    marked = [line.split("│") for line in text.splitlines() if MARK in line]
    assert len(marked) == 1
    assert marked[0][1].strip() == "sink"
    assert MAP in marked[0][6]  # its upstream, unnamed: the address
    assert "source" in text


# ------------------------------------------------------------------------------------ server


def test_the_page_is_one_offline_asset() -> None:
    html = page().decode()
    # The only http(s) URL in it is the SVG namespace, which is a name, not a download.
    assert set(re.findall(r"https?://[^\s\"'<>)]+", html)) == {"http://www.w3.org/2000/svg"}
    assert "<script src" not in html
    assert "<link" not in html
    assert "@import" not in html
    assert "api/pipeline" in html


def test_server_serves_the_page_and_the_json_and_nothing_else() -> None:
    p = from_view(view(chain(0, True), chain(1, True)))
    with PipelineServer(lambda: p) as server:
        assert server.url == f"http://127.0.0.1:{server.port}/"
        status, body, headers = get(server.url)
        assert status == 200
        assert body == page()
        assert headers["Content-Type"].startswith("text/html")
        assert "connect-src 'self'" in headers["Content-Security-Policy"]
        assert get_json(server.url + "api/pipeline") == json.loads(json.dumps(p.to_json()))
        assert get(server.url + "nope")[0] == 404


def test_a_failing_source_is_a_500_with_the_reason_and_the_server_goes_on() -> None:
    calls = []

    def flaky() -> Pipeline:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("monitor gone")
        return Pipeline("t", [], [])

    with PipelineServer(flaky) as server:
        status, body, _ = get(server.url + "api/pipeline")
        assert status == 500
        assert "monitor gone" in json.loads(body)["error"]
        assert get_json(server.url + "api/pipeline")["nodes"] == []


def test_a_token_guards_every_request() -> None:
    with PipelineServer(lambda: Pipeline("t", [], []), "127.0.0.1:0", token="s3cret") as server:
        assert server.url.endswith("/?token=s3cret")
        base = f"http://127.0.0.1:{server.port}/"
        assert get(base)[0] == 403
        assert get(base + "api/pipeline?token=wrong")[0] == 403
        assert get(server.url)[0] == 200
        assert get(base + "api/pipeline?token=s3cret")[0] == 200
        assert get(base + "api/pipeline", {"Authorization": "Bearer s3cret"})[0] == 200
    with pytest.raises(ValueError, match="token must not be empty"):
        PipelineServer(lambda: Pipeline("t", [], []), token="")


def test_a_non_loopback_address_needs_a_token_or_insecure() -> None:
    assert parse_bind(8080) == ("127.0.0.1", 8080)
    assert parse_bind("0.0.0.0:0") == ("0.0.0.0", 0)
    assert parse_bind("[::1]:9") == ("::1", 9)
    for bad in ("x", "1:70000", "host:"):
        with pytest.raises(ValueError, match="PORT or HOST:PORT"):
            parse_bind(bad)
    with pytest.raises(ValueError, match="refusing to serve the pipeline page on 0.0.0.0:0 without a token"):
        PipelineServer(lambda: Pipeline("t", [], []), "0.0.0.0:0")
    check_bind("localhost", 1, None, False)
    check_bind("0.0.0.0", 1, "t", False)
    check_bind("0.0.0.0", 1, None, True)
    with pytest.raises(ValueError, match="insecure"):
        Monitor(web="0.0.0.0:0")


def test_top_web_refuses_a_public_address_and_stray_options(capsys: pytest.CaptureFixture[str]) -> None:
    from creditflow.tools.cli import main

    assert main(["top", "--web", "0.0.0.0:0", "127.0.0.1:1"]) == 2
    assert "refusing to serve" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["top", "--token", "t", "127.0.0.1:1"])


def test_scraper_reports_unreachable_endpoints() -> None:
    with Scraper(["127.0.0.1:1"], interval=0.1) as scraper:
        p = scraper.scrape()
    assert p.nodes == []
    assert list(p.errors) == ["127.0.0.1:1"]
    assert "unreachable" in p.errors["127.0.0.1:1"]


# ------------------------------------------------------------------------ in a real browser


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip(
            "no Chromium to render the page: `make test-python` installs Debian's chromium as root "
            "(apt-get install -y chromium); install it, or put chromium on PATH"
        )
    return path


class Browser:
    """Headless Chromium, one run per call, each with a profile of its own."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _run(self, url: str, *args: str, budget_ms: int = 3000) -> str:
        with tempfile.TemporaryDirectory(prefix="creditflow-chromium-") as profile:
            argv = [
                self.path,
                "--headless",
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--disable-dev-shm-usage",
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={budget_ms}",
                *(["--no-sandbox"] if os.geteuid() == 0 else []),  # Chromium refuses root otherwise
                *args,
                url,
            ]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=profile)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    def dom(self, url: str) -> Dom:
        """The DOM after the page's script ran for ``budget_ms`` of virtual time (about
        three refreshes)."""
        return Dom(self._run(url, "--dump-dom"))

    def screenshot(self, url: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._run(url, f"--screenshot={path.resolve()}", "--window-size=1280,400", "--hide-scrollbars")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class Dom(html.parser.HTMLParser):
    """What a test reads off a rendered page: the drawn nodes and edges (their ``data-*``
    attributes), the ``main`` element's attributes and the text of the summary line."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.nodes: list[dict[str, str]] = []
        self.edges: list[dict[str, str]] = []
        self.main: dict[str, str] = {}
        self.summary = ""
        self._in_summary = 0
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "g" and "node" in classes:
            self.nodes.append(a)
        elif tag == "g" and "edge" in classes:
            self.edges.append(a)
        elif tag == "main":
            self.main = a
        if a.get("id") == "summary" or self._in_summary:
            self._in_summary += 1

    def handle_endtag(self, tag: str) -> None:
        if self._in_summary:
            self._in_summary -= 1

    def handle_data(self, data: str) -> None:
        if self._in_summary:
            self.summary += data

    def node(self, name: str) -> dict[str, str]:
        return next((n for n in self.nodes if n.get("data-name") == name), {})


def test_the_page_draws_the_throttled_pipeline_and_clears_the_marks(
    pipeline: dict[str, Any], chromium: str, tmp_path: Path
) -> None:
    urls, addr = pipeline["urls"], pipeline["address"]
    named = [f"{role}={url}" for role, url in zip(("source", "map", "sink"), urls, strict=True)]
    argv = [sys.executable, "-m", "creditflow", "top", "--web", "127.0.0.1:0", "--interval", "0.5", *named]
    top = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert top.stdout is not None
        line = top.stdout.readline()
        m = re.search(r"the pipeline page is at (http://127\.0\.0\.1:\d+/)", line)
        assert m, line + (top.stdout.read() if top.poll() is not None else "")
        url = m.group(1)
        browser = Browser(chromium)

        def throttled() -> Dom | None:
            dom = browser.dom(url)
            ok = (
                dom.node("source").get("data-level") == "HIGH"
                and dom.node("map").get("data-level") == "HIGH"
                and dom.node("sink").get("data-bottleneck") == "true"
            )
            return dom if ok else None

        dom = poll("source and map HIGH, the sink the bottleneck, in the rendered page", throttled)
        assert len(dom.nodes) == 3, dom.nodes
        assert len(dom.edges) == 2, dom.edges
        assert {(e["data-source"], e["data-target"]) for e in dom.edges} == {
            (addr["source"], addr["map"]),
            (addr["map"], addr["sink"]),
        }
        assert [n["data-name"] for n in dom.nodes if n["data-bottleneck"] == "true"] == ["sink"]
        assert dom.node("sink")["data-level"] == "OK"
        assert "Bottleneck: sink" in dom.summary
        assert "its upstream is HIGH" in dom.summary
        # It refreshes by itself: several updates within one page load.
        assert int(dom.main["data-updates"]) >= 2, dom.main

        def api_throttled() -> dict[str, Any] | None:
            data = get_json(url + "api/pipeline")
            levels = {addr["source"]: "HIGH", addr["map"]: "HIGH", addr["sink"]: "OK"}
            marked = [b["id"] for b in data["bottleneck"]]
            return data if data["levels"] == levels and marked == [addr["sink"]] else None

        api = poll("/api/pipeline: source and map HIGH, the sink the bottleneck", api_throttled, deadline=10)
        assert "its upstream is HIGH" in api["bottleneck"][0]["reason"]
        assert len(api["nodes"]) == 3
        assert len(api["edges"]) == 2
        assert {(e["source"], e["target"]) for e in api["edges"]} == {
            (addr["source"], addr["map"]),
            (addr["map"], addr["sink"]),
        }
        assert {n["name"] for n in api["nodes"]} == {"source", "map", "sink"}

        shot = os.environ.get("CREDITFLOW_SCREENSHOT")
        if shot:
            browser.screenshot(url, Path(shot))

        pipeline["workers"]["sink"].send(cmd="throttle", seconds=0)
        pipeline["workers"]["sink"].wait_for("throttled")
        released = time.monotonic()

        def cleared() -> Dom | None:
            dom = browser.dom(url)
            levels = {n["data-name"]: n["data-level"] for n in dom.nodes}
            marked = [n for n in dom.nodes if n["data-bottleneck"] == "true"]
            return dom if len(levels) == 3 and set(levels.values()) == {"OK"} and not marked else None

        dom = poll("every level OK and no bottleneck, in the rendered page", cleared, deadline=30)
        print(f"marks cleared {time.monotonic() - released:.1f} s after the throttle was removed")
        assert "no bottleneck" in dom.summary
        assert len(dom.edges) == 2

        def api_cleared() -> dict[str, Any] | None:
            data = get_json(url + "api/pipeline")
            return data if set(data["levels"].values()) == {"OK"} and data["bottleneck"] == [] else None

        poll("/api/pipeline: every level OK, no bottleneck", api_cleared, deadline=10)
    finally:
        top.terminate()
        top.wait(10)
        assert top.stdout is not None
        top.stdout.close()
