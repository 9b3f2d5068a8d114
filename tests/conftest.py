"""Shared pytest configuration for the creditflow test suite.

Markers, strictness, warnings-as-errors and the per-test timeout live in pyproject.toml
([tool.pytest.ini_options]). This file only adds what cannot be said there:

* the header names the creditflow build under test, so a run against a stale install or the
  source tree (instead of the wheel `make build` installed) is visible at a glance;
* Spark tests are skipped on a developer machine without Java, but never on CI (CI=true),
  where a missing JDK must fail the run rather than silently shrink it;
* the ``workers`` fixture, which kills the worker processes a transport test started.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest


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


@pytest.fixture
def workers() -> Iterator[list[Any]]:
    """Worker processes (``remote_worker.Worker``) a test appends here are killed when it ends,
    whatever happened (a test that fails mid-exchange must not leave a producer running)."""
    started: list[Any] = []
    yield started
    for w in started:
        w.close()
