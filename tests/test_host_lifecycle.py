"""The host service's start and end, and its faults: services started at once, an idle
service ending, Ctrl-C and SIGTERM, a killed service, a killed task, a crashed application's
service, bad names.

Each test names its own service (a name per test and run), so tests never share one.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

import creditflow as cf
from creditflow.host import attach_or_start, log_path
from helpers import poll
from host_service import name_for, numbered_batch


def test_starting_a_service_removes_the_logs_of_services_long_gone() -> None:
    from creditflow.host import LOG_KEEP_DAYS, _keep_log

    old, recent = log_path(name_for("gone")), log_path(name_for("recent"))
    for path in (old, recent):
        path.write_text("a service's last words\n")
    week_ago = time.time() - (LOG_KEEP_DAYS + 1) * 86400
    os.utime(old, (week_ago, week_ago))
    os.utime(recent, (time.time() - 86400,) * 2)
    name = name_for("pruner")
    a = attach_or_start(name, {"memory": "8MiB"}, idle_timeout=1.0)
    a.close()
    assert not old.exists()
    assert recent.exists()
    assert log_path(name).exists()
    recent.unlink()
    # A running service marks its log as written, however quiet it is.
    kept = log_path(name_for("kept"))
    kept.write_text("")
    os.utime(kept, (week_ago, week_ago))
    ended = threading.Event()
    keeper = threading.Thread(target=_keep_log, args=(kept.stem, ended, 0.05))
    keeper.start()
    poll("the log marked as written", lambda: kept.stat().st_mtime > time.time() - 60, deadline=10)
    ended.set()
    keeper.join(10)
    kept.unlink()


def test_concurrent_starters_get_one_service_which_ends_when_idle(tmp_path: Path) -> None:
    name = name_for("ondemand")
    script = textwrap.dedent(
        f"""
        from creditflow.host import attach_or_start
        a = attach_or_start({name!r}, {{"memory": "8MiB"}}, idle_timeout=1.0)
        print(a.service_pid, flush=True)
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(3)
    ]
    pids = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(pids) == 1, pids
    service = int(pids.pop())
    # Nothing attached any more: it ends after its idle time and frees its name.
    deadline = time.monotonic() + 30
    while _alive(service):
        assert time.monotonic() < deadline, f"the service did not end: {log_path(name).read_text()}"
        time.sleep(0.1)
    assert "no task attached" in log_path(name).read_text()
    with pytest.raises(cf.ConnectionLostError, match="no creditflow host service"):
        cf.attach(name)


class _Waits:
    """Stands in for a ``HostService`` in :class:`~creditflow.host._StopSignals`' wait."""

    def __init__(self, signum: int | None = None) -> None:
        self.signum = signum
        self.calls = 0

    def wait(self) -> str:
        self.calls += 1
        if self.signum is not None:
            signal.raise_signal(self.signum)
        time.sleep(10)  # the signal's handler interrupts this at once
        return "ended"


def test_ctrl_c_and_sigterm_end_the_service_s_wait_and_interrupt_nothing_else() -> None:
    """A stop signal that comes while the service's main thread is elsewhere (here: inside a
    logging handler, holding its lock) is noted, not raised there, so that no lock is left
    taken; the wait then ends at once. One during the wait ends it."""
    from creditflow.host import _StopSignals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    class Signalling(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            signal.raise_signal(signal.SIGTERM)
            time.sleep(0.01)  # the handler runs here, within the lock

    log = logging.getLogger(f"test-stop-signals-{uuid.uuid4().hex}")
    log.propagate = False
    handler = Signalling()
    log.addHandler(handler)
    with _StopSignals() as stop:
        try:
            log.warning("a record")
        except KeyboardInterrupt:  # what the default handler does, with the lock taken
            pytest.fail("the signal was raised inside the logging handler")
        assert stop.got == "SIGTERM"
        # The handler's lock is free: another thread takes it.
        lock = handler.lock
        assert lock is not None
        taken: list[bool] = []

        def take() -> None:
            taken.append(lock.acquire(timeout=5))
            if taken[-1]:
                lock.release()

        free = threading.Thread(target=take)
        free.start()
        free.join(10)
        assert taken == [True]
        service = _Waits()
        assert stop.wait(service) == "interrupted (SIGTERM)"
        assert service.calls == 0
    log.removeHandler(handler)
    with _StopSignals() as stop:
        service = _Waits(signal.SIGINT)
        start = time.monotonic()
        assert stop.wait(service) == "interrupted (SIGINT)"
        assert time.monotonic() - start < 5
        assert service.calls == 1
        # After the wait a signal is noted again, not raised.
        signal.raise_signal(signal.SIGTERM)
        time.sleep(0.01)
        assert stop.got == "SIGTERM"
    assert {s: signal.getsignal(s) for s in before} == before


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (the test is not its parent, so it is reaped by init) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_killed_service_fails_attached_tasks_within_two_seconds_and_the_next_use_starts_one() -> None:
    name = name_for("killed")
    a = attach_or_start(name, {"memory": "4MiB"})
    gate = a.create_input_gate([cf.ChannelSpec(a.address, "never-written", 0)])
    part = a.create_partition("full", 1)
    writer = cf.RecordWriter(part)
    outcome: dict[str, BaseException | None] = {}

    def read() -> None:
        try:
            gate.next()
            outcome["read"] = None
        except BaseException as exc:
            outcome["read"] = exc

    def write() -> None:
        try:
            while True:  # nobody reads: the service holds the writer back
                writer.write(numbered_batch(0, 20_000))
        except BaseException as exc:
            outcome["write"] = exc

    threads = [threading.Thread(target=read, daemon=True), threading.Thread(target=write, daemon=True)]
    for t in threads:
        t.start()
    poll("the writer held back", lambda: part.metrics()["backpressured_total"] > 0)
    os.kill(a.service_pid, signal.SIGKILL)
    # Both blocked calls end within 2 s of the kill (a bounded wait, not a measurement).
    deadline = time.monotonic() + 2.0
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"still blocked 2 s after the kill: {outcome}"
    for what in ("read", "write"):
        assert isinstance(outcome[what], cf.ConnectionLostError), (what, outcome[what])
    poll("the attachment closed", lambda: a.closed, deadline=2.0, every=0.05)
    with pytest.raises(cf.ConnectionLostError):
        part.flush()
    with pytest.raises(cf.ConnectionLostError):
        a.create_partition("after", 1)
    # The next use starts a new service.
    b = attach_or_start(name, {"memory": "4MiB"})
    assert b.service_pid != a.service_pid
    part = b.create_partition("full", 1)  # the name is free again in the new one
    os.kill(b.service_pid, signal.SIGTERM)


def test_a_task_killed_while_attached_frees_its_reservations_and_fails_its_unfinished_partitions(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    name, _ = served
    observer = cf.attach(name)
    before = observer.metrics()
    # What a finished blocking partition of 2 subpartitions keeps reserved (it outlives its task).
    probe = observer.create_partition("probe", 2, kind="blocking")
    kept = observer.metrics()["segments_reserved"] - before["segments_reserved"]
    probe.release()
    assert observer.metrics()["segments_reserved"] == before["segments_reserved"]
    # The task writes part of a pipelined and of a blocking partition, finishes a third,
    # holds a gate, and is killed before it finishes the first two.
    script = textwrap.dedent(
        f"""
        import time, pyarrow as pa, creditflow as cf
        a = cf.attach({name!r})
        batch = pa.record_batch({{"k": list(range(1000))}})
        writers = []  # held: a writer dropped without close fails its partition at once
        for pid, kind in (("piped", "pipelined"), ("stored", "blocking"), ("done", "blocking")):
            w = cf.RecordWriter(a.create_partition(pid, 2, kind=kind), cf.RoundRobinPartitioner())
            writers.append(w)
            w.write(batch)
            w.flush()
            if pid == "done":
                w.close()
        g = a.create_input_gate([cf.ChannelSpec(a.address, "nobody-writes", 0)])
        print("wrote", flush=True)
        time.sleep(600)
        """
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as task:
        try:
            assert task.stdout is not None
            assert task.stdout.readline().strip() == "wrote"
            held = observer.metrics()
            assert held["sessions"] == before["sessions"] + 1
            assert held["segments_reserved"] > before["segments_reserved"]
            assert held["gates"] == before["gates"] + 1
            piped = [cf.ChannelSpec(observer.address, "piped", i) for i in range(2)]
            gate = observer.create_input_gate(piped)
            got = gate.next(timeout=30)
            assert got is not None
        finally:
            task.kill()
    # What was written comes whole, then the failure: never a normal end.
    rows = [got.num_rows]

    def drain() -> None:
        for b in gate.items(timeout=10):
            assert isinstance(b, cf.Batch), b
            rows.append(b.batch.num_rows)

    with pytest.raises(cf.ProducerFailedError, match=f"pid {task.pid}"):
        drain()
    assert sum(rows) <= 1000
    # A finished blocking partition outlives the task that wrote it.
    done = observer.create_input_gate([cf.ChannelSpec(observer.address, "done", i) for i in range(2)])
    assert sum(b.num_rows for b in done) == 1000
    # Its session, gate and reservations are gone with it.
    poll("the task's session ended", lambda: observer.metrics()["sessions"] == before["sessions"])
    # No gate is open: the killed task's went with its session, and this test's two have
    # ended (an ended gate is not counted, though its handle lives).
    poll(
        "the killed task's gate closed",
        lambda: observer.metrics()["gates"] == before["gates"],
        deadline=10,
    )
    for g in (gate, done):
        g.close()
    # All it reserved is free again but what its finished partition keeps.
    poll(
        "the killed task's reservations freed",
        lambda: observer.metrics()["segments_reserved"] == before["segments_reserved"] + kept,
        deadline=10,
    )
    # The blocking partition it had not finished is gone with it (nothing in it is whole).
    assert observer.metrics()["partitions"] == before["partitions"] + 1


def test_a_killed_service_of_a_crashed_application_is_cleaned_up_by_the_next(tmp_path: Path) -> None:
    name = name_for("crashed")
    settings = {"memory": "4MiB", "spill_dir": str(tmp_path)}
    with subprocess.Popen(["sleep", "600"]) as executor:
        a = attach_or_start(name, settings, owner=executor.pid)
        w = cf.RecordWriter(a.create_partition("kept", 1, kind="blocking"))
        w.write(numbered_batch(0, 50_000))
        w.close()
        spilled = [d for d in tmp_path.iterdir() if d.is_dir()]
        assert len(spilled) == 1
        assert spilled[0].name.startswith(f"{a.service_pid}-")
        # The application crashes: its service killed, then its executor.
        os.kill(a.service_pid, signal.SIGKILL)
        poll("the killed service gone", lambda: not _alive(a.service_pid))
        executor.kill()
    assert spilled[0].exists()  # what the killed service left
    # The next application's service (same spill root) removes it when it starts.
    b = attach_or_start(name_for("next"), settings)
    assert not spilled[0].exists()
    live = [d for d in tmp_path.iterdir() if d.is_dir()]
    assert [d.name.split("-")[0] for d in live] == [str(b.service_pid)]
    os.kill(b.service_pid, signal.SIGTERM)
    poll("the next service ended", lambda: not _alive(b.service_pid))
    assert not [d for d in tmp_path.iterdir() if d.is_dir()]


def test_a_service_whose_executors_are_gone_ends_and_removes_its_spill_files(tmp_path: Path) -> None:
    name = name_for("orphan")
    with subprocess.Popen(["sleep", "600"]) as executor:
        a = attach_or_start(name, {"memory": "4MiB", "spill_dir": str(tmp_path)}, owner=executor.pid)
        w = cf.RecordWriter(a.create_partition("kept", 1, kind="blocking"))
        w.write(numbered_batch(0, 10_000))
        w.close()
        a.close()
        assert [d for d in tmp_path.iterdir() if d.is_dir()]
        executor.kill()
    poll("the service ended with its executor", lambda: not _alive(a.service_pid))
    assert not [d for d in tmp_path.iterdir() if d.is_dir()]
    assert "ended" in log_path(name).read_text()
    with pytest.raises(cf.ConnectionLostError):
        cf.attach(name)


def test_serve_stops_on_sigterm_and_frees_its_name(served: tuple[str, subprocess.Popen[str]]) -> None:
    name, proc = served
    cf.attach(name).close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    with pytest.raises(cf.ConnectionLostError):
        cf.attach(name)


def test_bad_names_and_settings_are_refused() -> None:
    with pytest.raises(cf.InvalidArgumentError, match="host service name"):
        cf.HostService("a/b")
    with pytest.raises(ValueError, match="refusing to bind"):
        cf.HostService(name_for("open"), bind="0.0.0.0:0")
    with pytest.raises(ValueError, match="not settings of a host service"):
        attach_or_start(name_for("bad"), {"colour": "red"})
    with cf.HostService(name_for("twice")) as s, pytest.raises(cf.InvalidArgumentError, match="already runs"):
        cf.HostService(s.name)
