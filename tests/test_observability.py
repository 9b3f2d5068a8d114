"""Observability: detailed metrics, Prometheus export, Rust logs in Python
``logging``, ``creditflow top`` and the chart recorder.

The pipeline tests run source → map → sink in three worker processes
(``tests/pipeline_worker.py``) and look at them only through their ``/metrics`` endpoints.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import termios
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import creditflow as cf
import creditflow.logs
from creditflow.metrics import RemoteReaderMetrics
from creditflow.prometheus import FAMILIES, register
from creditflow.tools.cli import MARK
from creditflow.tools.snapshot import View, scrape, summarize
from helpers import poll, read_all


def batch(i: int, rows: int = 100) -> pa.RecordBatch:
    return pa.record_batch({"i": pa.array(range(i * rows, (i + 1) * rows), pa.int64())})


# ------------------------------------------------------------------------------ metric dicts


def test_partition_and_gate_metrics_have_subpartition_and_channel_detail() -> None:
    with cf.NetworkEnvironment(memory="4MiB") as env:
        part = env.create_partition("p", 2)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", i) for i in range(2)])
        w = cf.RecordWriter(part, cf.RoundRobinPartitioner())
        for i in range(6):
            w.write(batch(i))
        w.flush()
        got = [gate.next(timeout=5) for _ in range(3)]
        m = env.metrics()
        p = m["partitions"]["p"]
        subs = p["subpartitions"]
        assert [s["index"] for s in subs] == [0, 1]
        assert sum(s["backlog"] for s in subs) == sum(p["backlog"])
        assert sum(s["buffers_out"] for s in subs) == 3
        assert all(s["consumed"] and s["remote"] is None for s in subs)
        assert p["busy_ms_per_second"] == pytest.approx(1000.0 - p["backpressured_ms_per_second"])
        assert p["backpressured_total"] == 0.0  # 4 MiB holds every buffer: the writer never waited
        g = m["gates"][gate.metrics()["name"]]
        chans = g["channels"]
        assert [(c["spec"]["partition_id"], c["spec"]["subpartition"], c["kind"]) for c in chans] == [
            ("p", 0, "local"),
            ("p", 1, "local"),
        ]
        assert sum(c["rows_received"] for c in chans) == g["rows_received"] == sum(b.num_rows for b in got)
        assert sum(c["bytes_received"] for c in chans) == g["bytes_received"]
        assert g["busy_ms_per_second"] == pytest.approx(1000.0 - g["idle_ms_per_second"])
        assert all(c["remote"] is None for c in chans)
        w.close()
        read_all(gate)


def test_remote_readers_report_peer_credit_and_bytes_sent() -> None:
    with cf.NetworkEnvironment(memory="8MiB") as prod, cf.NetworkEnvironment(memory="8MiB") as cons:
        part = prod.create_partition("r", 1)
        gate = cons.create_input_gate([cf.ChannelSpec(prod.address, "r", 0)])
        w = cf.RecordWriter(part)
        for i in range(20):
            w.write(batch(i, 2000))
        w.flush()
        name = gate.metrics()["name"]

        def gate_full() -> bool:
            remote = cons.metrics()["gates"][name]["channels"][0]["remote"]
            return remote is not None and remote["queued_buffers"] == 10

        # Before the consumer reads: the producer sends a batch per buffer until the gate's 2
        # exclusive and 8 floating buffers are full, and then has no credit left.
        poll("the gate's 10 buffers full", gate_full)
        sent: RemoteReaderMetrics | None = prod.metrics()["partitions"]["r"]["subpartitions"][0]["remote"]
        assert sent is not None
        assert sent["peer"]
        assert sent["peer"] != prod.address
        assert sent["buffers_sent"] == 10
        assert sent["credit"] == 0
        held = cons.metrics()["gates"][name]["channels"][0]["remote"]
        assert held is not None
        # Two environments of one process: shared memory (the default), said by the metrics.
        assert held["transport"] == "shm"
        assert (held["exclusive_in_use"], held["floating_in_use"], held["queued_buffers"]) == (2, 8, 10)
        assert (held["credit_announced"], held["credit_unannounced"]) == (0, 0)
        assert held["record_bytes"] == held["record_bytes_peak"] > 10 * batch(0, 2000).nbytes
        for _ in range(5):
            gate.next(timeout=10)
        g = cons.metrics()["gates"][name]
        chan = g["channels"][0]
        assert chan["kind"] == "remote"
        assert chan["spec"]["address"] == prod.address
        assert chan["remote"] is not None
        assert chan["bytes_received"] > 0
        assert g["remote"] is not None
        assert g["remote"]["remote_channels"] == 1
        assert g["remote"]["exclusive_total"] == 2
        w.close()
        read_all(gate)


@pytest.mark.parametrize("shared_memory", [False, True], ids=["tcp", "shm"])
def test_bytes_written_and_received_count_each_batch_s_bytes_once(shared_memory: bool) -> None:
    """A batch decoded from a record shares the record's memory: counted by its buffers'
    capacity, each of its columns' buffers would count the whole record (several times its
    bytes for a batch with string columns). Both ends count a batch's bytes as pyarrow does."""
    rows = 5_000
    text = [f"row {j}" for j in range(rows)]
    sent = [
        pa.record_batch({"i": pa.array(range(n, n + rows), pa.int64()), "s": text})
        for n in range(0, 10 * rows, rows)
    ]
    with (
        cf.NetworkEnvironment(memory="8MiB", shared_memory=shared_memory) as prod,
        cf.NetworkEnvironment(memory="8MiB", shared_memory=shared_memory) as cons,
    ):
        part = prod.create_partition("b", 1)
        gate = cons.create_input_gate([cf.ChannelSpec(prod.address, "b", 0)])
        with cf.RecordWriter(part) as w:
            for b in sent:
                w.write(b)
        transport = "shm" if shared_memory else "tcp"

        def link() -> bool:
            remote = gate.metrics()["channels"][0]["remote"]
            return remote is not None and remote["transport"] == transport

        poll(f"the channel's {transport} link", link)
        got = read_all(gate)
        nbytes = sum(b.nbytes for b in sent)
        assert sum(b.nbytes for b in got) == nbytes
        assert gate.metrics()["bytes_received"] == pytest.approx(nbytes, rel=0.01)
        assert part.metrics()["bytes_written"] == pytest.approx(nbytes, rel=0.01)


# ------------------------------------------------------------------------------- prometheus


def test_metrics_endpoint_parses_and_has_every_documented_family() -> None:
    # The consumer debloats, so its gate has the debloating families too.
    with (
        cf.NetworkEnvironment(memory="8MiB") as prod,
        cf.NetworkEnvironment(memory="8MiB", debloat=True) as cons,
    ):
        server = prod.serve_metrics()
        cons_server = cons.serve_metrics(port=0, addr="127.0.0.1")
        part = prod.create_partition("p", 1)
        gate = cons.create_input_gate([cf.ChannelSpec(prod.address, "p", 0)])
        w = cf.RecordWriter(part)
        w.write(batch(0))
        w.flush()
        gate.next(timeout=10)
        names: set[str] = set()
        for url in (server.url, cons_server.url):
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            names |= {f.name for f in text_string_to_metric_families(text)}
        readme = (Path(__file__).resolve().parents[1] / "docs" / "observability.md").read_text()
        for f in FAMILIES:
            assert f.name in names, f.name
            shown = f.name + ("_total" if f.kind == "counter" else "")
            assert f"`{shown}`" in readme, f"{shown} is not documented in docs/observability.md"
        text = urllib.request.urlopen(cons_server.url, timeout=5).read().decode()
        assert f'peer="{prod.address}"' in text
        assert 'partition="p"' in text
        w.close()
        read_all(gate)
    # Closing the environment stopped its servers.
    assert server.closed
    assert cons_server.closed
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)


def test_a_dropped_environment_stops_its_server_and_an_open_one_does_not_hang_exit() -> None:
    code = """
import gc, sys, threading
import creditflow as cf
env = cf.NetworkEnvironment(memory="4MiB")
server = env.serve_metrics()
del env
gc.collect()
assert server.closed, "dropping the environment closes its server"
assert threading.active_count() == 1, threading.enumerate()
# Left open until interpreter shutdown: the process must still exit, quietly.
env = cf.NetworkEnvironment(memory="4MiB")
env.serve_metrics()
print("done")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n"
    assert proc.stderr == ""


def test_register_adds_a_collector_to_a_registry() -> None:
    registry = CollectorRegistry()
    with cf.NetworkEnvironment(memory="4MiB") as env:
        env.create_partition("x", 3)
        collector = register(env, registry)
        text = generate_latest(registry).decode()
        assert text.count("creditflow_subpartition_backlog_buffers{") == 3
        registry.unregister(collector)
        assert "creditflow_" not in generate_latest(registry).decode()


def test_serve_metrics_checks_its_arguments() -> None:
    env = cf.NetworkEnvironment(memory="4MiB")
    with pytest.raises(ValueError, match="port"):
        env.serve_metrics(port=70000)
    env.close()
    with pytest.raises(cf.ClosedError):
        env.serve_metrics()


# ---------------------------------------------------------------------------------- logging


def test_a_peer_sending_garbage_is_logged_under_creditflow(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="creditflow")
    with cf.NetworkEnvironment(memory="4MiB") as env:
        host, port = env.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"\x00\x01garbage, not a frame" * 4)
            s.settimeout(5)
            try:
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass

        def record() -> logging.LogRecord | None:
            creditflow.logs.flush()
            return next((r for r in caplog.records if r.name.startswith("creditflow.net")), None)

        rec = poll("a log record of the refused connection", record)
        assert rec.levelno == logging.WARNING
        assert rec.name == "creditflow.net.server"
        assert "refused connection from 127.0.0.1:" in rec.getMessage()


# ------------------------------------------------------------------ three-process pipeline


def _view(urls: list[str], prev: list[Any]) -> View:
    snap = scrape(urls[0])
    for u in urls[1:]:
        snap = snap.merge(scrape(u))
    view = summarize(prev[0], snap)
    prev[0] = snap
    return view


@pytest.mark.slow
def test_a_throttled_sink_backpressures_source_and_map_and_levels_recover(pipeline: dict[str, Any]) -> None:
    urls, addr = pipeline["urls"], pipeline["address"]
    prev: list[Any] = [None]

    def throttled() -> View | None:
        v = _view(urls, prev)
        levels = {t.env: t for t in v.tasks}
        if len(levels) < 3:
            return None
        ok = (
            levels[addr["source"]].level == "HIGH"
            and levels[addr["map"]].level == "HIGH"
            and levels[addr["sink"]].level == "OK"
            and levels[addr["sink"]].busy > 0.5
        )
        return v if ok else None

    v = poll("source and map HIGH, the sink busy", throttled)
    assert v.bottlenecks == [addr["sink"]]

    pipeline["workers"]["sink"].send(cmd="throttle", seconds=0)
    pipeline["workers"]["sink"].wait_for("throttled")

    def recovered() -> View | None:
        v = _view(urls, prev)
        levels = [p.level for p in v.partitions]
        return v if len(levels) == 2 and set(levels) == {"OK"} else None

    v = poll("every level back to OK", recovered)
    assert v.bottlenecks == []


def _pty_run(argv: list[str], until: Callable[[str], bool], deadline: float = 60.0, context: str = "") -> str:
    """Runs ``argv`` in a pseudo-terminal of 200 columns; returns its output (ANSI codes
    removed) once ``until(output)`` holds, or fails at the deadline."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 200, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "60"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    raw = b""
    end = time.monotonic() + deadline
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                raw += chunk
                text = _strip_ansi(raw.decode("utf-8", "replace"))
                if until(text):
                    return text
            elif proc.poll() is not None:
                break
        shown = _strip_ansi(raw.decode("utf-8", "replace"))[-4000:]
        pytest.fail(f"{argv}: condition not met ({context}); output:\n{shown}")
    finally:
        proc.kill()
        proc.wait()
        os.close(leader)


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def _task_tables(text: str) -> list[list[str]]:
    """The rows of every complete tasks table drawn (the table whose header has "busy")."""
    tables: list[list[str]] = []
    rows: list[str] | None = None
    for line in text.splitlines():
        if "busy" in line and "┃" in line:
            rows = []
        elif rows is not None and line.lstrip().startswith("└"):
            tables.append(rows)
            rows = None
        elif rows is not None and "│" in line:
            rows.append(line)
    return tables


@pytest.mark.slow
def test_top_in_a_terminal_marks_the_throttled_sink_as_the_bottleneck(pipeline: dict[str, Any]) -> None:
    addr = pipeline["address"]

    def row(table: list[str], role: str) -> str:
        # By the first cell: other rows name the task too, as their upstream.
        return next((line for line in table if line.split("│")[1].strip() == addr[role]), "")

    def wanted(table: list[str]) -> bool:
        """Source and map HIGH, and only the sink marked as the bottleneck."""
        marked = [line for line in table if MARK in line]
        return (
            len(marked) == 1
            and addr["sink"] in marked[0]
            and "HIGH" in row(table, "source")
            and "HIGH" in row(table, "map")
        )

    argv = [sys.executable, "-m", "creditflow", "top", *pipeline["urls"], "--interval", "0.5"]
    text = _pty_run(argv, lambda text: any(wanted(t) for t in _task_tables(text)), context=f"tasks {addr}")
    table = next(t for t in _task_tables(text) if wanted(t))
    assert len(table) == 3
    assert MARK not in row(table, "source") + row(table, "map")


def test_top_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        cf_main(["top"])
    with pytest.raises(SystemExit):
        cf_main(["top", "x", "--interval", "0"])


def cf_main(argv: list[str]) -> int:
    from creditflow.tools.cli import main

    return main(argv)


# ------------------------------------------------------------------------------------ charts


def test_recorder_writes_a_png_of_an_exchange(tmp_path: Path) -> None:
    from creditflow.tools.charts import Recorder

    with cf.NetworkEnvironment(memory="4MiB") as env:
        part = env.create_partition("c", 1)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "c", 0)])
        rec = Recorder([env], interval=0.05, names={env.address: "task"})
        with pytest.raises(ValueError, match="nothing recorded"):
            rec.write_png(tmp_path / "empty.png")
        rec.sample()
        w = cf.RecordWriter(part)
        for i in range(50):
            w.write(batch(i))
            if i % 10 == 9:
                w.flush()
                rec.sample()
        w.close()
        read_all(gate)
        rec.sample()
    assert len(rec.views) == 6
    assert sum(p.rows_per_second for v in rec.views for p in v.partitions) > 0
    out = rec.write_png(tmp_path / "chart.png", title="test")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_recorder_checks_its_arguments() -> None:
    from creditflow.tools.charts import Recorder

    with pytest.raises(ValueError, match="at least one"):
        Recorder([])
    with pytest.raises(ValueError, match="interval"):
        Recorder(["http://127.0.0.1:1/metrics"], interval=0)
