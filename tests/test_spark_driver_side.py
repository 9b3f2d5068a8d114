"""creditflow.spark on the driver, before any task runs: the host memory's default and the
check that refuses too little of it, a receiver's spilling arguments, ``PYSPARK_PYTHON`` for
Spark's workers, a Connect session's slots and workers, and a stage attempt with fewer tasks
than its exchange."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import creditflow as cf

pytestmark = pytest.mark.spark

pytest.importorskip("pyspark")
import creditflow.spark as cfs  # noqa: E402
from creditflow.spark._driver import HOST_MEMORY_CONF  # noqa: E402


def test_the_host_memory_defaults_to_64_mib_per_task_slot_of_a_host() -> None:
    """Without the setting, a host service's memory is 64 MiB per task slot of a host, from
    the executors' cores over the task's CPUs (a cluster) or local-cluster's cores per worker."""
    from creditflow.spark import _driver

    class Session:
        def __init__(self, app: str, conf: dict[str, str]) -> None:
            self.sparkContext = SimpleNamespace(applicationId=app)
            self.conf = conf

    cases = (
        ({"spark.master": "local-cluster[2,3,1024]"}, 3 * (64 << 20)),
        ({"spark.master": "spark://h:7077", "spark.executor.cores": "4", "spark.task.cpus": "2"}, 128 << 20),
        ({"spark.master": "spark://h:7077", "spark.executor.cores": "4", HOST_MEMORY_CONF: "1GiB"}, 1 << 30),
    )
    for i, (conf, memory) in enumerate(cases):
        assert _driver.host_memory(Session(f"default-host-memory-{os.getpid()}-{i}", conf)) == memory


def test_a_host_memory_too_small_for_the_tasks_of_a_host_is_refused_on_the_driver() -> None:
    """The driver's check for host services: the tasks one host may run, their partitions and
    the exclusive buffers of their channels from other hosts (channels between tasks of the
    host are local), in the host's memory."""
    from creditflow.spark._process import EnvSettings
    from creditflow.spark.exchange import _check_settings

    settings = EnvSettings(secret="s", segment_size="32KiB")
    segment = 32 << 10
    # 12 tasks, 4 on a host: each task 13 for its partition + 8 x 2 + 1 for its gate = 30.
    _check_settings(settings, 12, host_tasks=4, host_memory=120 * segment)
    with pytest.raises(
        cf.InsufficientBuffersError, match="needs at least 120 segments in a host service"
    ) as info:
        _check_settings(settings, 12, host_tasks=4, host_memory=119 * segment)
    assert "spark.creditflow.hostMemory" in str(info.value)
    assert (info.value.required, info.value.available) == (120, 119)
    # The per-task memory plays no part with host services (64 MiB would hold it alone).
    _check_settings(EnvSettings(secret="s", memory="64KiB"), 12, host_tasks=4, host_memory=120 * segment)


def test_spilling_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="epochs need.* spill=True"):
        cfs.Receiver(epochs=2)
    with pytest.raises(ValueError, match="replay, max_spill need spill=True"):
        cfs.Receiver(replay=True, max_spill="1GiB")
    with pytest.raises(ValueError, match="spill_dir needs spill=True"):
        cfs.Receiver(spill_dir="/tmp")
    with pytest.raises(ValueError, match="epochs=2 needs replay"):
        cfs.Receiver(spill=True, epochs=2, replay=False)
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        cfs.Receiver(spill=True, epochs=0)


def test_pyspark_python_is_set_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without PYSPARK_PYTHON, Spark's workers would run ``python3`` from PATH (usually
    without creditflow): the driver's interpreter is filled in, a user's choice is kept."""
    from creditflow.spark._driver import ensure_python

    class FakeContext:
        pythonExec = "python3"

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    sc = FakeContext()
    ensure_python(sc)  # type: ignore[arg-type]
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert sc.pythonExec == sys.executable

    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/my/python")
    chosen = FakeContext()
    ensure_python(chosen)  # type: ignore[arg-type]
    assert os.environ["PYSPARK_PYTHON"] == "/opt/my/python"
    assert chosen.pythonExec == "python3"


class _FakeConf:
    def __init__(self, values: dict[str, str]) -> None:
        self._values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self._values.get(key, default)


class _FakeConnectSession:
    """Stands for a Connect session: only ``conf`` (the driver needs nothing else)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.conf = _FakeConf(values)


@pytest.mark.parametrize(
    ("values", "slots"),
    [
        ({"spark.master": "local"}, 1),
        ({"spark.master": "local[2]"}, 2),
        ({"spark.master": "local[4, 3]"}, 4),
        ({"spark.master": "local[4]", "spark.task.cpus": "2"}, 2),
        ({"spark.master": "local-cluster[2, 3, 1024]"}, 6),
        ({"spark.master": "yarn", "spark.executor.instances": "5", "spark.executor.cores": "4"}, 20),
        ({"spark.master": "local[*]"}, None),
        ({"spark.master": "k8s://https://example:443"}, None),
    ],
)
def test_connect_slots_come_from_the_configuration(values: dict[str, str], slots: int | None) -> None:
    """On Connect there is no JVM to ask: slots are read from the session's configuration,
    and None (a probe instead) where it does not say."""
    from creditflow.spark._driver import _configured_slots

    assert _configured_slots(_FakeConnectSession(values)) == slots  # type: ignore[arg-type]


def test_connect_worker_without_creditflow_is_explained() -> None:
    """A Connect server's workers run the server's PYSPARK_PYTHON: a failed import of
    creditflow in the probe job becomes an error that says so and how to fix it."""
    from creditflow.spark._driver import _explain_worker_python

    with pytest.raises(RuntimeError, match="cannot import creditflow.*PYSPARK_PYTHON"):
        _explain_worker_python(
            Exception("PythonException: ModuleNotFoundError: No module named 'creditflow'")
        )
    _explain_worker_python(Exception("something else"))  # other failures pass through unchanged


_BARE_WORKER_SCRIPT = """
import creditflow.spark as cfs
spark = cfs.local_session("local[1]", "creditflow-test-bare-worker", connect=True)
try:
    cfs.exchange(spark.range(0, 10, numPartitions=1), "id")
except RuntimeError as exc:
    print("RAISED:", exc)
finally:
    spark.stop()
"""


@pytest.mark.slow
def test_connect_server_whose_workers_lack_creditflow_says_so(tmp_path: Path) -> None:
    """The Connect counterpart of the PYSPARK_PYTHON help: a local Connect server started with
    a worker Python that has neither creditflow nor pyarrow (a fresh virtual environment)
    makes exchange raise at once, saying what to fix, instead of failing in every task. In a
    subprocess: the server is a SparkContext, which cannot live beside another in this process."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    # SPARK_TESTING: PySpark's own test mode, in which a local Connect server takes a free
    # port (found by the client through py4j) instead of 15002, which another test's Connect
    # session may hold at the same time.
    env = {**os.environ, "PYSPARK_PYTHON": str(bare / "bin" / "python"), "SPARK_TESTING": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _BARE_WORKER_SCRIPT], env=env, capture_output=True, text=True, timeout=240
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(
        r"RAISED: Spark's Python workers cannot import (creditflow|pyarrow): .*PYSPARK_PYTHON", out
    ), out


def test_a_stage_attempt_with_fewer_tasks_than_the_exchange_is_refused() -> None:
    """Spark can retry a barrier stage for only the partitions it lacks output for; split over
    fewer tasks the rows would land in the wrong partitions, so such an attempt must fail
    (seen once: a retried exchange returned 41,360 rows, 30,680 distinct, of 40,000)."""
    from creditflow.spark._process import EnvSettings
    from creditflow.spark.exchange import _check_whole_stage, _Plan

    plan = _Plan(
        exchange_id="x",
        keys=("k",),
        num_tasks=2,
        kind="pipelined",
        env=EnvSettings(secret="s"),
        timeout=None,
        func=None,
        monitor=None,
    )
    _check_whole_stage(plan, 2)
    with pytest.raises(RuntimeError, match="runs 1 of the exchange's 2 tasks"):
        _check_whole_stage(plan, 1)
