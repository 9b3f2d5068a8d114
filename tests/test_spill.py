"""Blocking and hybrid partitions (Flink's spillable subpartitions): a writer that never
waits for its readers, spill files under ``spill_dir``, replay, clean-up and failures.

Producers and consumers that must be measured (RSS) or killed run in their own processes;
each prints JSON lines on stdout that the test reads.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import creditflow as cf

ROWS = 4096  # rows per batch: 32 KiB of int64 + a short string column


def batch(i: int) -> pa.RecordBatch:
    """Batch ``i``: every value of ``k`` says which batch it is."""
    return pa.record_batch(
        {
            "k": pa.array([i] * ROWS, pa.int64()),
            "s": pa.array([f"row {r % 13} of some batch" for r in range(ROWS)]),
        }
    )


def spill_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.spill"))


def read_keys(gate: cf.InputGate) -> list[int]:
    keys = []
    while (b := gate.next(timeout=60)) is not None:
        ks = b.column("k").unique().to_pylist()
        assert len(ks) == 1, "a batch arrived mixed"
        assert b.equals(batch(ks[0])), "a batch arrived changed"
        keys.append(ks[0])
    return keys


PRODUCER = textwrap.dedent(
    r"""
    import json, sys, os
    import pyarrow as pa
    import creditflow as cf

    cfg = json.loads(sys.argv[1])

    def vm_kib(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise RuntimeError(key)

    def batch(i):
        rows = cfg["rows"]
        return pa.record_batch({"k": pa.array([i] * rows, pa.int64()),
                                "s": pa.array([f"row {r % 13} of some batch" for r in range(rows)])})

    env = cf.NetworkEnvironment(memory=cfg["memory"], spill_dir=cfg["spill_dir"])
    part = env.create_partition("p", 1, kind=cfg["kind"], replay=cfg.get("replay", False))
    batches = [batch(i % 16) for i in range(16)]      # built before the measurement
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                  # VmHWM := VmRSS
    idle = vm_kib("VmRSS")
    w = cf.RecordWriter(part)
    for i in range(cfg["batches"]):
        b = batches[i % 16] if cfg.get("same") else batch(i)
        w.write(b, timeout=30)                       # nobody reads: a wait would time out
    w.close()
    peak = vm_kib("VmHWM")
    print(json.dumps({"address": env.address, "idle_kib": idle, "peak_kib": peak,
                      "metrics": part.metrics()["spill"]}), flush=True)
    sys.stdin.readline()                              # "release", or EOF
    part.release()
    print(json.dumps({"released": True}), flush=True)
    sys.stdin.read()
    env.close()
    """
)

CONSUMER = textwrap.dedent(
    r"""
    import json, sys, time
    import creditflow as cf

    address, delay = sys.argv[1], float(sys.argv[2])
    env = cf.NetworkEnvironment(memory="4MiB", request_backoff_max=0.5)
    try:
        gate = env.create_input_gate([cf.ChannelSpec(address, "p", 0)])
        while (b := gate.next(timeout=60)) is not None:
            print(json.dumps({"k": b.column("k")[0].as_py(), "rows": b.num_rows}), flush=True)
            time.sleep(delay)
        print(json.dumps({"end": True}), flush=True)
    except cf.CreditflowError as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}), flush=True)
    env.close()
    """
)


def start_producer(cfg: dict[str, Any]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    p = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line, f"the producer died (exit {p.wait()})"
    return p, json.loads(line)


def stop(p: subprocess.Popen[str]) -> None:
    """Kills a helper process and closes its pipes."""
    p.kill()
    p.communicate()


def consume(address: str, delay: float = 0.0) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-c", CONSUMER, address, str(delay)],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_blocking_writes_ten_times_memory_unread_and_is_read_twice_locally_and_remotely(
    tmp_path: Path,
) -> None:
    memory = 8 << 20
    n = 10 * memory // (ROWS * 8) + 1  # int64 column alone: 10x memory
    producer, info = start_producer(
        {
            "memory": memory,
            "spill_dir": str(tmp_path),
            "kind": "blocking",
            "batches": n,
            "rows": ROWS,
            "same": True,
        }
    )
    try:
        m = info["metrics"]
        assert m["spilled_bytes"] > 9 * memory, m
        growth = (info["peak_kib"] - info["idle_kib"]) * 1024
        assert growth <= memory + (64 << 20), f"RSS grew {growth / 2**20:.1f} MiB"
        assert len(spill_files(tmp_path)) == 1
        want = [i % 16 for i in range(n)]
        for _ in range(2):
            got = consume(info["address"])
            assert got[-1] == {"end": True}, got[-1]
            assert [r["k"] for r in got[:-1]] == want
        assert producer.stdin is not None
        assert producer.stdout is not None
        producer.stdin.write("release\n")
        producer.stdin.flush()
        assert json.loads(producer.stdout.readline()) == {"released": True}
        assert spill_files(tmp_path) == [], "release removes the files"
        last = consume(info["address"])
        assert last == [{"error": "PartitionNotFoundError", "message": last[0]["message"]}], last
    finally:
        stop(producer)


def test_blocking_in_process_readers_read_from_the_start_each_time(tmp_path: Path) -> None:
    with cf.NetworkEnvironment(memory="2MiB", spill_dir=str(tmp_path), request_backoff_max=0.2) as env:
        part = env.create_partition("b", 2, kind="blocking", compression="lz4")
        gates = [env.create_input_gate([cf.ChannelSpec(env.address, "b", 1)]) for _ in range(2)]
        with cf.RecordWriter(part, cf.RoundRobinPartitioner()) as w:
            for i in range(200):
                w.write(batch(i), timeout=10)
        want = list(range(1, 200, 2))
        assert [read_keys(g) for g in gates] == [want, want]
        again = env.create_input_gate([cf.ChannelSpec(env.address, "b", 1)])
        assert read_keys(again) == want
        m = part.metrics()["spill"]
        assert m is not None
        assert m["kind"] == "blocking"
        assert m["replay"]
        assert m["spilled_bytes"] > 0
        part.release()
        assert spill_files(tmp_path) == []
        with pytest.raises(cf.PartitionNotFoundError):
            env.create_input_gate([cf.ChannelSpec(env.address, "b", 1)]).next(timeout=10)


def test_a_memory_reservation_makes_a_hybrid_partition_spill_down_to_fit(tmp_path: Path) -> None:
    """Memory held for data kept outside the pools (a rank's window of rows) counts within
    ``memory``: the store spills down to what is left, and the reservation is given back."""
    with cf.NetworkEnvironment(memory="2MiB", spill_dir=str(tmp_path)) as env:
        part = env.create_partition("h", 1, kind="hybrid", replay=True)
        with cf.RecordWriter(part, cf.ForwardPartitioner()) as w:
            for i in range(100):
                w.write(batch(i), timeout=10)

        def in_memory() -> int:
            m = part.metrics()["spill"]
            assert m is not None
            return int(m["memory_segments"]) * env.segment_size

        assert in_memory() > 1 << 20, "the store fills its share first"
        held = env.reserve_memory("1MiB", "window")
        assert held.nbytes == 1 << 20
        assert env.metrics()["segments_reserved"] >= (1 << 20) // env.segment_size
        part.flush()  # what the environment's flusher does every buffer_timeout
        assert in_memory() + held.nbytes <= 2 << 20
        with pytest.raises(cf.InsufficientBuffersError, match="memory"):
            env.reserve_memory(2 << 20)
        with held:
            pass  # leaving the block releases it
        assert held.nbytes == 0
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "h", 0)])
        assert read_keys(gate) == list(range(100)), "what spilled reads back"
        part.release()


@pytest.mark.parametrize("kind", ["blocking", "hybrid"])
def test_a_consumer_killed_halfway_is_replaced_by_one_that_reads_everything_from_the_start(
    tmp_path: Path, kind: str
) -> None:
    n = 400
    producer, info = start_producer(
        {
            "memory": 2 << 20,
            "spill_dir": str(tmp_path),
            "kind": kind,
            "replay": True,
            "batches": n,
            "rows": 1024,
        }
    )
    try:
        first = subprocess.Popen(
            [sys.executable, "-c", CONSUMER, info["address"], "0.005"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert first.stdout is not None
        seen = [json.loads(first.stdout.readline()) for _ in range(n // 2)]
        first.send_signal(signal.SIGKILL)
        first.communicate()
        assert [r["k"] for r in seen] == list(range(n // 2))
        got = consume(info["address"])
        assert got[-1] == {"end": True}
        assert [r["k"] for r in got[:-1]] == list(range(n)), "everything, once, in order"
    finally:
        stop(producer)


def _race(kind: str, tmp_path: Path, n: int) -> tuple[int, int, list[int]]:
    """Writes ``n`` batches into a ``kind`` partition of 2 MiB while a reader takes one
    every 5 ms; returns how many the reader had when the writer finished, the total, and
    what the reader got."""
    with cf.NetworkEnvironment(memory="2MiB", spill_dir=str(tmp_path)) as env:
        part = env.create_partition("h", 1, kind=kind)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "h", 0)])
        got: list[int] = []

        def reader() -> None:
            while (b := gate.next(timeout=60)) is not None:
                got.append(b.column("k")[0].as_py())
                time.sleep(0.005)

        t = threading.Thread(target=reader)
        t.start()
        w = cf.RecordWriter(part)
        for i in range(n):
            w.write(batch(i), timeout=60)
        w.close()
        at_finish = len(got)
        t.join(120)
        return at_finish, n, got


def test_hybrid_lets_the_writer_finish_ahead_of_a_slow_reader_where_pipelined_waits(tmp_path: Path) -> None:
    n = 10 * (2 << 20) // (ROWS * 8)  # 10x the memory
    hybrid_at_finish, total, got = _race("hybrid", tmp_path, n)
    assert got == list(range(total)), "the hybrid reader got everything, in order"
    pipelined_at_finish, _, got = _race("pipelined", tmp_path, n)
    assert got == list(range(total))
    # Hybrid: the writer was done while most of the stream was still unread (spilled).
    assert hybrid_at_finish < total // 2, (hybrid_at_finish, total)
    # Pipelined: the writer could only be as far ahead as the memory holds.
    assert pipelined_at_finish > total * 3 // 4, (pipelined_at_finish, total)


def test_the_next_environment_removes_a_killed_producer_s_files_and_keeps_a_live_one_s(
    tmp_path: Path,
) -> None:
    cfg = {"memory": 2 << 20, "spill_dir": str(tmp_path), "kind": "blocking", "batches": 200, "rows": ROWS}
    dead, _ = start_producer(cfg)
    alive, _ = start_producer(cfg)
    try:
        dead_files = [f for f in spill_files(tmp_path) if f.parent.name.startswith(f"{dead.pid}-")]
        alive_files = [f for f in spill_files(tmp_path) if f.parent.name.startswith(f"{alive.pid}-")]
        assert dead_files
        assert alive_files
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        assert all(f.exists() for f in dead_files), "a killed process leaves its files"
        with cf.NetworkEnvironment(spill_dir=str(tmp_path)) as env:
            env.create_partition("x", kind="blocking")  # opens the spill directory
            spill = env.metrics()["spill"]
            assert spill is not None
            assert spill["swept_dirs"] == 1
            assert not any(f.exists() for f in dead_files)
            assert not any(f.parent.exists() for f in dead_files)
            assert all(f.exists() for f in alive_files), "a live process's files are untouched"
    finally:
        for p in (dead, alive):
            stop(p)


def write_until_error(w: cf.RecordWriter, n: int) -> None:
    """Writes batches 0..n-1 (the caller expects one of them to raise)."""
    for i in range(n):
        w.write(batch(i), timeout=10)


def test_a_full_disk_fails_the_writer_clearly_and_the_readers_get_producer_failed(small_tmpfs: Path) -> None:
    with cf.NetworkEnvironment(memory="1MiB", spill_dir=str(small_tmpfs), request_backoff_max=0.2) as env:
        part = env.create_partition("d", 1, kind="blocking")
        w = cf.RecordWriter(part)
        with pytest.raises(cf.SpillError) as info:
            write_until_error(w, 1000)  # ~100 MiB into 4 MiB of disk
        message = str(info.value)
        assert str(small_tmpfs) in message, message
        assert "bytes" in message, message
        assert isinstance(info.value, OSError)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "d", 0)])
        with pytest.raises(cf.ProducerFailedError):
            gate.next(timeout=10)  # nothing partial is delivered as complete


def test_max_spill_fails_a_blocking_writer_with_an_error_naming_the_setting(tmp_path: Path) -> None:
    with cf.NetworkEnvironment(memory="1MiB", spill_dir=str(tmp_path), max_spill="2MiB") as env:
        part = env.create_partition("m", 1, kind="blocking")
        w = cf.RecordWriter(part)
        with pytest.raises(cf.SpillError, match="max_spill"):
            write_until_error(w, 1000)
        with pytest.raises(cf.ProducerFailedError, match="max_spill"):
            env.create_input_gate([cf.ChannelSpec(env.address, "m", 0)]).next(timeout=10)


def test_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    with cf.NetworkEnvironment(spill_dir=str(tmp_path)) as env:
        with pytest.raises(ValueError, match="kind must be"):
            env.create_partition("a", kind="spilled")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="replay=True needs"):
            env.create_partition("a", replay=True)
        with pytest.raises(ValueError, match="compression must be"):
            env.create_partition("a", kind="blocking", compression="gzip")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="pipelined partition stores nothing"):
            env.create_partition("a", compression="lz4")
        part = env.create_partition("a", kind="hybrid")
        w = cf.RecordWriter(part)
        with pytest.raises(ValueError, match="unaligned barriers need a pipelined partition"):
            w.broadcast_barrier(1, unaligned=True)
        part2 = env.create_partition("once", kind="hybrid")
        cf.RecordWriter(part2).close()
        first = env.create_input_gate([cf.ChannelSpec(env.address, "once", 0)])
        with pytest.raises(cf.AlreadyConsumedError):  # without replay, read once
            env.create_input_gate([cf.ChannelSpec(env.address, "once", 0)])
        assert first.next(timeout=10) is None
    with pytest.raises(ValueError, match="max_spill"):
        cf.NetworkEnvironment(max_spill="lots")


def test_spilling_shows_in_metrics_prometheus_and_top(tmp_path: Path) -> None:
    from rich.console import Console

    from creditflow.prometheus import families
    from creditflow.tools import cli, snapshot

    with cf.NetworkEnvironment(memory="1MiB", spill_dir=str(tmp_path)) as env:
        pipelined = env.create_partition("pipe")
        part = env.create_partition("spilly", kind="blocking", compression="zstd")
        before = snapshot.from_env(env, at=0.0)
        with cf.RecordWriter(part) as w:
            for i in range(100):
                w.write(batch(i), timeout=10)
        m = part.metrics()["spill"]
        assert m is not None
        assert m["files"] == 1
        assert m["disk_bytes"] == m["spilled_bytes"] > 0
        assert pipelined.metrics()["spill"] is None
        samples = {
            (s.name, s.labels.get("partition")): s.value
            for fam in families(env.metrics())
            for s in fam.samples
        }
        assert samples[("creditflow_partition_spilled_bytes_total", "spilly")] == m["spilled_bytes"]
        assert samples[("creditflow_partition_spill_disk_bytes", "spilly")] == m["disk_bytes"]
        assert ("creditflow_partition_spilled_bytes_total", "pipe") not in samples
        spill = env.metrics()["spill"]
        assert spill is not None
        assert spill["disk_bytes"] == m["disk_bytes"]
        assert spill["written_bytes"] == m["spilled_bytes"]
        assert spill["files_created"] == 1
        assert spill["max_spill"] is None
        assert Path(spill["path"]).parent == tmp_path
        assert samples[("creditflow_spill_disk_bytes", None)] == m["disk_bytes"]
        assert ("creditflow_spill_max_bytes", None) not in samples
        view = snapshot.summarize(before, snapshot.from_env(env, at=1.0))
        rows = {p.partition: p for p in view.partitions}
        assert rows["spilly"].spilled_per_second == m["spilled_bytes"]
        assert rows["pipe"].spilled_per_second is None
        console = Console(width=200, record=True)
        console.print(cli.render(view, {}))
        text = console.export_text()
        assert f"{m['disk_bytes'] / 1e6:,.1f} MB on disk" in text, text


def test_a_process_that_exits_with_environments_open_leaves_no_spill_files(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, threading, time
        import pyarrow as pa
        import creditflow as cf

        env = cf.NetworkEnvironment(memory="1MiB", spill_dir=sys.argv[1])
        part = env.create_partition("p", kind="blocking")
        w = cf.RecordWriter(part)
        for i in range(200):
            w.write(pa.record_batch({"k": pa.array([i] * 4096, pa.int64())}), timeout=10)
        assert sorted(__import__("pathlib").Path(sys.argv[1]).rglob("*.spill"))

        def consumer(env=env, part=part):  # a daemon thread still using the environment:
            time.sleep(1000)               # it is never garbage-collected at exit

        threading.Thread(target=consumer, daemon=True).start()
        # no close(), no release(): the interpreter exits with everything open
        """
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=60)
    assert list(tmp_path.iterdir()) == [], "the exiting process removed its spill directory"
