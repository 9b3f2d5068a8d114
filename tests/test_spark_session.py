"""creditflow.spark.local_session: every session of a process has the settings given to it,
not those of a session before it (PySpark starts its JVM with the first session's settings as
Java system properties, which every later ``SparkConf`` reads back).

Runs in a fresh Python process: in this one an earlier test may have started the JVM already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

pytest.importorskip("pyspark")

SCRIPT = """
import json
import creditflow.spark as cfs

first = cfs.local_session(
    "local[1]",
    "first",
    {"spark.executor.cores": "2", "spark.creditflow.first": "yes", "spark.driver.memory": "600m"},
)
jvm = first._jvm
first.stop()
second = cfs.local_session("local[1]", "second", {"spark.creditflow.second": "yes"})
conf = second.sparkContext.getConf()
print(json.dumps({
    "executor_cores": conf.get("spark.executor.cores"),
    "first": conf.get("spark.creditflow.first"),
    "second": conf.get("spark.creditflow.second"),
    "max_heap": jvm.java.lang.Runtime.getRuntime().maxMemory(),
}))
second.stop()
"""


def test_a_second_session_does_not_inherit_the_first_session_s_settings() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["executor_cores"], got["first"], got["second"]) == (None, None, "yes")
    # What acts only at the JVM's start still does: the first session's driver heap.
    assert got["max_heap"] <= 600 * 2**20, got
