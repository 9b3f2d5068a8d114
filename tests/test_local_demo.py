"""The in-process demo (``python examples/local_demo.py``, no Spark): it verifies its own
exchange, shows the backpressure level going HIGH while a consumer is slow and OK again after,
draws a chart, serves its metrics and the pipeline page while it runs (and says where), and
exits cleanly on Ctrl-C.

The demo's phases follow what it observes (the slow phase ends once the level has been HIGH
for a number of samples; the producer writes on until OK is seen again), so these checks hold
on a fast machine and on a loaded one alike."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DEMO = Path(__file__).resolve().parents[1] / "examples" / "local_demo.py"

#: The quick run takes about 8 s on a 2-core machine; this only bounds a broken one.
RUN_TIMEOUT = 60.0


def _default_sigint() -> None:
    """In the child: Ctrl-C raises KeyboardInterrupt even when the test runner ignores SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _demo(*args: str) -> list[str]:
    return [sys.executable, str(DEMO), *args]


def _slow_phase(out: str) -> tuple[float, float]:
    """When consumer 0 was slow, from the summary's ``slow phase`` line."""
    m = re.search(r"slow phase\s+([\d.]+) s - ([\d.]+) s", out)
    assert m, out
    return float(m.group(1)), float(m.group(2))


def _backpressure_check(out: str) -> tuple[int, float, float, float, float]:
    """(HIGH samples, phase start, phase end, first HIGH, OK again) from the backpressure check."""
    m = re.search(
        r"\[ok\] backpressure: HIGH in (\d+) samples of the slow phase ([\d.]+)-([\d.]+) s"
        r" \(first at ([\d.]+) s\), OK again at ([\d.]+) s while writing",
        out,
    )
    assert m, out
    highs, start, end, first_high, ok_again = m.groups()
    return int(highs), float(start), float(end), float(first_high), float(ok_again)


def _timeline(out: str) -> list[tuple[float, str]]:
    """The ``level timeline`` line as (time, level) changes."""
    m = re.search(r"level timeline\s+(.+)", out)
    assert m, out
    changes = [(float(t), level) for level, t in re.findall(r"(OK|LOW|HIGH)@([\d.]+)s", m.group(1))]
    assert changes, m.group(0)
    return changes


def test_quick_demo_verifies_and_shows_backpressure(tmp_path: Path) -> None:
    chart = tmp_path / "c.png"
    proc = subprocess.run(
        _demo("--quick", "--chart", str(chart)),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "VERIFIED" in proc.stdout, out
    assert "FAIL" not in proc.stdout, out
    assert proc.stdout.count("[ok]") == 4, out

    start, end = _slow_phase(out)
    highs, check_start, check_end, first_high, ok_again = _backpressure_check(out)
    assert (check_start, check_end) == (start, end), out
    assert highs >= 1, out
    assert start <= first_high <= end < ok_again, out
    timeline = _timeline(out)
    assert timeline[0][1] == "OK", f"the run starts unblocked: {timeline}"
    # The level timeline agrees: HIGH by the end of the slow phase, OK again after it.
    assert any(level == "HIGH" and t <= end for t, level in timeline), f"no HIGH by {end} s: {timeline}"
    assert any(level == "OK" and t > end for t, level in timeline), f"not OK after {end} s: {timeline}"
    # Every order written was read, whatever the count: at least the 15,000,000 asked for.
    rows = re.search(r"\[ok\] rows: ([\d,]+) read == ([\d,]+) written", out)
    assert rows, out
    assert rows.group(1) == rows.group(2), out
    assert int(rows.group(2).replace(",", "")) >= 15_000_000, out
    assert re.search(r"^live view: creditflow top http://127\.0\.0\.1:\d+/metrics$", proc.stdout, re.M), out
    assert re.search(r"^pipeline page: http://127\.0\.0\.1:\d+/$", proc.stdout, re.M), out

    if importlib.util.find_spec("matplotlib") is not None:
        assert chart.is_file(), out
        data = chart.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert len(data) > 10_000


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX-only")
def test_demo_exits_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        _demo("--quick", "--no-chart"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        preexec_fn=_default_sigint,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + RUN_TIMEOUT
        seen: list[str] = []
        for line in proc.stdout:  # plain progress lines, one a second
            seen.append(line)
            if "consumer slow" in line or time.monotonic() > deadline:
                break
        assert any("consumer slow" in line for line in seen), "".join(seen)
        # While it runs, what it printed is there to look at: its /metrics and the page.
        text = "".join(seen)
        metrics = re.search(r"creditflow top (http://\S+/metrics)", text)
        page = re.search(r"pipeline page: (http://\S+/)", text)
        assert metrics, text
        assert page, text
        with urllib.request.urlopen(metrics.group(1), timeout=10) as resp:
            assert b"creditflow_partition_backpressure_level{" in resp.read()
        with urllib.request.urlopen(page.group(1) + "api/pipeline", timeout=10) as resp:
            graph = json.load(resp)
        assert [n["name"] for n in graph["nodes"]] == ["demo (in-process)"], graph
        assert graph["nodes"][0]["partitions"] == ["demo/orders/0"], graph
        assert len(graph["nodes"][0]["gates"]) == 4, graph
        proc.send_signal(signal.SIGINT)  # the writer is blocked or about to be: backpressure
        started = time.monotonic()
        rest, _ = proc.communicate(timeout=10)
        assert proc.returncode == 130, "".join(seen) + rest
        assert "interrupted" in rest
        assert "Traceback" not in rest, rest
        assert time.monotonic() - started < 5, "Ctrl-C took too long"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
