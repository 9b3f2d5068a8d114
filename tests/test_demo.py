"""The main demo (``make demo`` = ``python examples/spark_demo.py``): a PySpark local[2] pipeline
exchanging lineitem rows by key through creditflow. Its quick run must verify itself against
Spark's own repartition, show backpressure while task 1's consumer is slow, and draw its chart."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[1] / "examples" / "spark_demo.py"


def test_quick_demo_verifies_against_spark_and_shows_backpressure(tmp_path: Path) -> None:
    chart = tmp_path / "demo.png"
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--quick", "--plain", "--chart", str(chart)],
        capture_output=True,
        text=True,
        timeout=420,  # the quick run takes 1.5-3.5 min on a 2-core machine, busy or not
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "VERIFIED" in proc.stdout, out
    assert proc.stdout.count("[ok]") == 3, out
    assert "FAIL" not in proc.stdout, out
    # The slow consumer pushed back on the writers, and the live lines showed it.
    levels = dict(re.findall(r"task (\d): backpressure levels seen (.+)", proc.stdout))
    assert set(levels) == {"0", "1"}, out
    assert any("HIGH" in seen for seen in levels.values()), out
    assert re.search(r"task 1's consumer was slow from [\d.]+ s to [\d.]+ s", proc.stdout), out
    assert re.search(r"task \d: [^|]*HIGH", proc.stdout), out
    # Beside the live lines: the pipeline page and the command for the tasks' /metrics.
    assert re.search(r"^pipeline page: http://127\.0\.0\.1:\d+/$", proc.stdout, re.M), out
    top = re.search(r"^live view: creditflow top (http://127\.0\.0\.1:\d+/metrics ?){2,}$", proc.stdout, re.M)
    assert top, out
    # The run with the slow consumer says so; the timings compare runs without it, like with like.
    m = re.search(
        r"exchange with task 1's consumer slowed on purpose: 1,000,000 rows \(\d[\d,]* MB of Arrow data\)"
        r" in ([\d.]+) s",
        proc.stdout,
    )
    assert m, out
    assert re.search(r"timings without a slow consumer \(one run each\) on the same 1,000,000 rows", out), out
    for what in (
        r"creditflow exchange \+ Arrow aggregation in the task",
        r"Spark's shuffle \(repartition\) \+ the same Arrow aggregation \(mapInArrow\)",
        r"the same Arrow aggregation of the same rows, partitioned by key beforehand: .*\(the floor\)",
        r"Spark's shuffle \+ its own groupBy in the JVM",
    ):
        assert re.search(r"^ +[\d.]+ s  " + what, proc.stdout, re.M), (what, out)  # 1 run: no spread
    assert re.search(
        r"the exchange's own part(: [\d.]+ s over the floor| does not show: [\d.]+ s under the floor)",
        proc.stdout,
    ), out
    assert chart.stat().st_size > 10_000
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("exchange", "shuffle", "says"),
    [
        ([3.0, 3.1, 3.2], [3.8, 3.9, 4.0], "the exchange is faster than Spark's shuffle"),
        ([3.9, 4.0, 4.5], [3.8, 3.9, 3.9], "took the same time here (their runs' ranges overlap"),
        ([5.0, 5.1, 5.2], [3.8, 3.9, 4.0], "Spark's shuffle was faster here, by 1.2 s"),
    ],
    ids=["exchange-faster", "within-noise", "shuffle-faster"],
)
def test_the_timings_say_which_is_faster_for_the_same_work(
    exchange: list[float], shuffle: list[float], says: str
) -> None:
    """Whichever way the exchange and Spark's shuffle (the same Python work) compare, the demo
    says so: faster, the same within the runs' spread, or slower and by how much."""
    sys.path.insert(0, str(DEMO.parent))
    import spark_demo

    cfg: Any = type("Cfg", (), {"timing_rounds": 3, "rows": 4_000_000})()
    t = spark_demo.Timings(
        exchange=sorted(exchange)[1],
        shuffle_arrow=sorted(shuffle)[1],
        floor=3.9,
        spark_groupby=2.2,
        rounds={"exchange": exchange, "shuffle_arrow": shuffle, "floor": [3.9], "spark_groupby": [2.2]},
    )
    text = "\n".join(spark_demo.timing_lines(cfg, t, 5.5))
    assert says in text
    others = {"exchange is faster", "took the same time", "shuffle was faster"} - {
        s for s in ("exchange is faster", "took the same time", "shuffle was faster") if s in says
    }
    assert not any(o in text for o in others), text
