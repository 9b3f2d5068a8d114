"""Leak checks: opening and closing 1,000 environments, each with a partition, a
writer and a gate (every tenth with a second environment reading over TCP), leaves the
process as it found it: flat RSS, no extra threads (Python's or the OS's), no sockets, file
descriptors or mappings (shared-memory regions among them) left open. Runs over shared memory
and over TCP (the ``transport`` fixture).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

import psutil
import pyarrow as pa

import creditflow as cf

CYCLES = 1000
#: Cycles before the first measurement (allocator arenas, pyarrow and import caches warm up).
WARMUP = 100
REMOTE_EVERY = 10
#: Growth of RSS allowed between cycle WARMUP and the end. A leak of one segment (32 KiB)
#: per environment alone would be ~29 MiB.
RSS_SLACK = 8 << 20

BATCH = pa.record_batch(
    {"k": pa.array(range(1000), pa.int64()), "s": pa.array([str(i) for i in range(1000)])}
)


def cycle(i: int) -> None:
    """One environment, a partition of two subpartitions, a writer and a gate reading both;
    every ``REMOTE_EVERY``-th cycle the gate is in a second environment, over TCP."""
    with cf.NetworkEnvironment(memory="1MiB") as env:
        part = env.create_partition(f"p{i}", 2)
        with cf.RecordWriter(part, cf.RoundRobinPartitioner(), timeout=10) as w:
            w.write(BATCH)
            w.write(BATCH)
        specs = [cf.ChannelSpec(env.address, f"p{i}", s) for s in range(2)]
        if i % REMOTE_EVERY == 0:
            with cf.NetworkEnvironment(memory="1MiB") as peer:
                gate = peer.create_input_gate(specs)
                got = list(gate)
                gate.close()
        else:
            gate = env.create_input_gate(specs)
            got = list(gate)
            gate.close()
        assert sum(b.num_rows for b in got) == 2 * BATCH.num_rows


def shared_mappings() -> int:
    """Mappings of shared-memory regions (``memfd:creditflow-shm``) in this process."""
    with open("/proc/self/maps") as f:
        return sum("creditflow-shm" in line for line in f)


def probe_remote_cycle(i: int) -> int:
    """A remote cycle that also checks the transport its channels used: 1 if shared memory
    (its region mapped while the gate read), else 0."""
    with cf.NetworkEnvironment(memory="1MiB") as env:
        part = env.create_partition(f"p{i}", 2)
        with cf.RecordWriter(part, cf.RoundRobinPartitioner(), timeout=10) as w:
            w.write(BATCH)
            w.write(BATCH)
        with cf.NetworkEnvironment(memory="1MiB") as peer:
            gate = peer.create_input_gate([cf.ChannelSpec(env.address, f"p{i}", s) for s in range(2)])
            got = [gate.next(timeout=10)]
            (g,) = peer.metrics()["gates"].values()
            # (A channel that already ended has no remote figures.)
            used = {c["remote"]["transport"] for c in g["channels"] if c["remote"]}
            mapped = shared_mappings()
            got += list(gate)
            gate.close()
        assert sum(b.num_rows for b in got if b is not None) == 2 * BATCH.num_rows
    assert len(used) == 1, used
    if used == {"shm"}:
        assert mapped >= 2, "both ends of a link map its region"
        return 1
    return 0


def snapshot(proc: psutil.Process) -> dict[str, int]:
    return {
        "python threads": threading.active_count(),
        "os threads": proc.num_threads(),
        "sockets": len(proc.net_connections(kind="all")),
        "fds": proc.num_fds(),
        "shared mappings": shared_mappings(),
    }


def grown(now: dict[str, int], then: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The counts that are higher ``now`` than ``then``, as (then, now)."""
    return {k: (then[k], now[k]) for k in then if now[k] > then[k]}


def eventually_not_grown(
    probe: Callable[[], dict[str, int]], then: dict[str, int]
) -> dict[str, tuple[int, int]]:
    """What ``probe()`` still shows above ``then`` after up to 10 s (threads of a closed
    runtime may take a moment to exit after close returns); empty when nothing grew."""
    deadline = time.monotonic() + 10
    while (up := grown(probe(), then)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return up


def test_a_thousand_environments_leave_no_threads_sockets_or_memory_behind(transport: str) -> None:
    proc = psutil.Process()
    for i in range(WARMUP):
        cycle(i)
    # Objects of earlier tests that only the collector frees (and their fds) must not count
    # for or against this test: a leak is growth, so the check is "nothing grew".
    gc.collect()
    before = snapshot(proc)
    rss_before = proc.memory_info().rss
    rss = []
    linked = 0
    for i in range(WARMUP, CYCLES):
        if i % REMOTE_EVERY == 0 and i % 100 == 0:
            linked += probe_remote_cycle(i)
            continue
        cycle(i)
        if i % 100 == 0:
            rss.append(proc.memory_info().rss)
    gc.collect()
    assert linked == (CYCLES - WARMUP) // 100 if transport == "shm" else linked == 0, linked
    assert eventually_not_grown(lambda: snapshot(proc), before) == {}
    growth = proc.memory_info().rss - rss_before
    mib = [round(r / 2**20, 1) for r in rss]
    assert growth < RSS_SLACK, f"RSS grew {growth / 2**20:.1f} MiB over {CYCLES - WARMUP} cycles: {mib} MiB"
