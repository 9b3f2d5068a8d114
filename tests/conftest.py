"""Shared pytest configuration for the creditflow test suite.

Markers, strictness, warnings-as-errors and the per-test timeout live in pyproject.toml
([tool.pytest.ini_options]). This file only adds what cannot be said there:

* the header names the creditflow build under test, so a run against a stale install or the
  source tree (instead of the wheel `make build` installed) is visible at a glance;
* Spark tests are skipped on a developer machine without Java, but never on CI (CI=true),
  where a missing JDK must fail the run rather than silently shrink it;
* the ``workers`` fixture, which kills the worker processes a transport test started;
* the ``pipeline`` fixture: source → map → sink in three processes, the sink throttled;
* the ``small_tmpfs`` fixture: a 4 MiB tmpfs (a disk that fills up).

The watchdog plugin (``tests/watchdog.py``) ends a run that hangs where pytest-timeout cannot
reach, printing every thread's stack.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host_service import name_for, serving

pytest_plugins = ["watchdog"]


def _java_available() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return True
    return shutil.which("java") is not None


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        import creditflow
    except Exception as exc:  # the header must not hide the real failure in the tests
        where = f"not importable ({type(exc).__name__}: {exc})"
    else:
        where = f"{getattr(creditflow, '__version__', '?')} from {os.path.dirname(creditflow.__file__)}"
    return [
        f"creditflow: {where}",
        f"JAVA_HOME: {os.environ.get('JAVA_HOME', '(unset)')}",
    ]


def _on_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _on_ci() or _java_available():
        return
    skip_spark = pytest.mark.skip(reason="no Java found (set JAVA_HOME); Spark tests need a JDK 17+")
    for item in items:
        if "spark" in item.keywords:
            item.add_marker(skip_spark)


#: Batches of 64 KiB per second the pipeline's source writes: far below what map and sink can take.
SOURCE_RATE = 100
#: Seconds the throttled sink sleeps per batch: 20 batches per second.
THROTTLE = 0.05


@pytest.fixture
def workers() -> Iterator[list[Any]]:
    """Worker processes (``remote_worker.Worker``) a test appends here are killed when it ends,
    whatever happened (a test that fails mid-exchange must not leave a producer running)."""
    started: list[Any] = []
    yield started
    for w in started:
        w.close()


@pytest.fixture(params=["shm", "tcp"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test once over each transport between environments on this host: ``shm``
    (shared memory, the default) and ``tcp`` (``shared_memory=False`` in the worker processes
    and in every environment the test process opens; one side off is enough for TCP)."""
    if request.param == "tcp":
        import functools

        import creditflow as cf
        from workers import SHARED_MEMORY_VAR

        monkeypatch.setenv(SHARED_MEMORY_VAR, "0")
        monkeypatch.setattr(
            cf, "NetworkEnvironment", functools.partial(cf.NetworkEnvironment, shared_memory=False)
        )
    return str(request.param)


@pytest.fixture
def pipeline(workers: list[Any]) -> Iterator[dict[str, Any]]:
    """source → map → sink (``tests/pipeline_worker.py``), the sink throttled; yields the
    workers, their environments' addresses and their metrics URLs, by role."""
    from pipeline_worker import PipelineWorker

    source = PipelineWorker("source", rate=SOURCE_RATE)
    workers.append(source)
    src = source.wait_for("address")
    mapper = PipelineWorker("map", upstream=[src["address"], "src"])
    workers.append(mapper)
    mid = mapper.wait_for("address")
    sink = PipelineWorker("sink", upstream=[mid["address"], "mapped"], throttle=THROTTLE)
    workers.append(sink)
    snk = sink.wait_for("address")
    yield {
        "workers": {"source": source, "map": mapper, "sink": sink},
        "address": {"source": src["address"], "map": mid["address"], "sink": snk["address"]},
        "urls": [src["metrics_url"], mid["metrics_url"], snk["metrics_url"]],
    }
    for w in (source, mapper, sink):
        w.send(cmd="exit")
    for w in (source, mapper, sink):
        w.wait()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test: a disk that fills up (needs root, as CI has)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def served() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``creditflow serve NAME --memory 16MiB``."""
    name = name_for("served")
    with serving(name, "--memory", "16MiB") as proc:
        yield name, proc
