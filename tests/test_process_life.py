"""The API inside a Python process's life: Ctrl-C interrupts a blocked call, importing starts
no thread (Spark forks Python workers) and an object used after a fork raises."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import creditflow as cf
from helpers import (
    HANDOFF,
    STEP_TIMEOUT,
    assert_batches_equal,
    batch,
    big_batch,
    fill_until_timeout,
    read_all,
    spec,
)

# ---------------------------------------------------------------------------------------------
# Ctrl-C
# ---------------------------------------------------------------------------------------------


def _sigint_after(delay: float) -> threading.Timer:
    t = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    t.start()
    return t


def _interrupted(blocked: Callable[[], object], rescue: Callable[[], object]) -> float:
    """Seconds until Ctrl-C (SIGINT 0.3 s in) interrupted ``blocked()`` with KeyboardInterrupt;
    ``rescue()`` after 5 s unblocks it should Ctrl-C not work, so the test fails, not hangs."""
    rescuer = threading.Timer(5.0, rescue)
    rescuer.start()
    timer = _sigint_after(0.3)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            blocked()
        return time.monotonic() - t0
    finally:
        timer.cancel()
        rescuer.cancel()


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Python's own SIGINT handler, whatever this process inherited: a shell starts background
    jobs with SIGINT ignored, and Python then installs no handler (Ctrl-C would do nothing)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old if old is not None else signal.SIG_DFL)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals need the main thread"
)
@HANDOFF
@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_interrupts_a_write_blocked_on_a_full_pool(local_handoff: bool) -> None:
    with cf.NetworkEnvironment(memory="1MiB", local_handoff=local_handoff) as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([spec(env, "p")])
        w = cf.RecordWriter(part)
        if local_handoff:
            # Fill the pool (a timed-out hand-off write loses nothing). Serialized, the one
            # batch below is bigger than the pool and blocks half-way on its own.
            fill_until_timeout(w, lambda i: big_batch(i, 100 * 1024))
        elapsed = _interrupted(lambda: w.write(big_batch(999, 2 << 20)), rescue=gate.close)  # no timeout
        assert elapsed < 1.5, elapsed


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals need the main thread"
)
@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_interrupts_a_blocked_next() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([spec(env, "p")])
        w = cf.RecordWriter(part)
        elapsed = _interrupted(gate.next, rescue=w.close)  # no timeout
        assert elapsed < 1.5, elapsed
        # The gate still works after the interrupt.
        w.write(batch(), timeout=STEP_TIMEOUT)
        w.close()
        assert_batches_equal(read_all(gate), [batch()])


# ---------------------------------------------------------------------------------------------
# Threads and fork
# ---------------------------------------------------------------------------------------------


def run_python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_import_starts_no_thread_and_an_environment_starts_one() -> None:
    out = run_python(
        """
        import os, sys, threading, time
        import pyarrow
        def tasks():
            return len(os.listdir("/proc/self/task")) if sys.platform == "linux" else 0
        before = (threading.active_count(), tasks())
        import creditflow as cf
        after = (threading.active_count(), tasks())
        assert after == before, (before, after)
        env = cf.NetworkEnvironment(memory="1MiB")
        with_env = tasks()
        # The one Python thread: creditflow-logs, forwarding Rust log records while an
        # environment is open (creditflow.logs).
        assert threading.active_count() == before[0] + 1
        env.close()
        assert threading.active_count() == before[0]
        # A joined Python thread's OS thread may linger in /proc for a moment.
        deadline = time.monotonic() + 10
        while tasks() != before[1] and time.monotonic() < deadline:
            time.sleep(0.01)
        closed = tasks()
        print(before[1], with_env, closed)
        """
    )
    before, with_env, closed = map(int, out.split())
    if sys.platform == "linux":
        assert with_env == before + 3, "background threads: flusher and I/O, and the log forwarder"
        assert closed == before, "close() stops them"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_objects_used_after_fork_raise_runtime_error() -> None:
    out = run_python(
        """
        import os
        import pyarrow as pa
        import creditflow as cf
        env = cf.NetworkEnvironment(memory="1MiB")
        part = env.create_partition("p")
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])
        w = cf.RecordWriter(part)
        b = pa.record_batch({"a": [1, 2]})
        r, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            results = []
            calls = [
                ("create_partition", lambda: env.create_partition("q")),
                ("create_input_gate", lambda: env.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])),
                ("write", lambda: w.write(b, timeout=1)),
                ("next", lambda: gate.next(timeout=1)),
                ("flush", lambda: part.flush()),
            ]
            for name, call in calls:
                try:
                    call()
                    results.append(f"{name}:no-error")
                except RuntimeError as e:
                    results.append(f"{name}:{'fork' in str(e)}")
                except BaseException as e:
                    results.append(f"{name}:{type(e).__name__}")
            os.write(wr, ",".join(results).encode())
            os._exit(0)
        os.close(wr)
        _, status = os.waitpid(pid, 0)
        print(os.read(r, 4096).decode())
        # The parent is unaffected.
        w.write(b, timeout=5)
        w.close()
        assert gate.next(timeout=5).equals(b)
        assert gate.next(timeout=5) is None
        env.close()
        """
    )
    results = dict(item.split(":") for item in out.strip().split(","))
    assert results == {
        "create_partition": "True",
        "create_input_gate": "True",
        "write": "True",
        "next": "True",
        "flush": "True",
    }
