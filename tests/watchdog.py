"""A last-resort watchdog for the test run: a hang that pytest-timeout cannot break ends the run.

pytest-timeout (``timeout`` in pyproject.toml) interrupts a test with SIGALRM, which Python only
acts on when the main thread runs Python code. A main thread stuck in native code that never
returns to the interpreter, or a fixture teardown that waits forever, would instead hold the run
until CI's own limit kills it, with nothing said about where it hung. This plugin notices when no
test has started or finished for ``HANG_SECONDS`` (longer than pytest-timeout's limit, so it only
acts when that failed), prints every thread's stack to the terminal, and ends the process with
exit status 3, so ``make test`` fails at once and says where.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

import pytest

#: Seconds without a test starting or finishing after which the run is declared hung.
HANG_SECONDS = float(os.environ.get("CREDITFLOW_TEST_HANG_SECONDS", 900))

_last_progress = time.monotonic()
_current = "(collection)"


def _watch(config: pytest.Config) -> None:
    while True:
        time.sleep(10)
        idle = time.monotonic() - _last_progress
        if idle < HANG_SECONDS:
            continue
        capman = config.pluginmanager.getplugin("capturemanager")
        if capman is not None:
            capman.suspend_global_capture(in_=True)
        sys.stderr.write(
            f"\n\nwatchdog: no test started or finished for {idle:.0f} s "
            f"(pytest-timeout did not break it); current test: {_current}\n"
            "stacks of every thread:\n"
        )
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(3)


def pytest_configure(config: pytest.Config) -> None:
    # pytest's own process only (Spark's forked workers never load pytest plugins).
    threading.Thread(target=_watch, args=(config,), name="test-watchdog", daemon=True).start()


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    global _last_progress, _current
    _last_progress = time.monotonic()
    _current = nodeid


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    global _last_progress
    _last_progress = time.monotonic()
