"""Bounded memory and backpressure under a slow consumer: RSS stays within the budget, and
the level reads HIGH while the consumer is slow and OK once it keeps up.

A 2 GiB stream of freshly allocated batches goes through a 16 MiB environment while the
consumer is ten times slower than the producer for the first quarter and unthrottled for the
rest. The scenario runs in a child process so its peak RSS (VmHWM) is its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCENARIO = textwrap.dedent(
    r"""
    import json, threading, time
    import numpy as np
    import pyarrow as pa
    import creditflow as cf

    ROWS = 65536
    TOTAL = 2 * 1024**3
    CHANNELS = 4

    def vm_kib(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise RuntimeError(key)

    rng = np.random.default_rng(7)

    def make(seq):
        base = np.arange(ROWS, dtype=np.int64) + seq * ROWS   # fresh memory every batch
        return pa.record_batch({
            "seq": pa.array(np.full(ROWS, seq, dtype=np.int64)),
            "channel": pa.array(np.full(ROWS, seq % CHANNELS, dtype=np.int32)),
            "x": pa.array(base),
            "y": pa.array(rng.standard_normal(ROWS)),       # some real work per batch
            "z": pa.array(rng.integers(0, 1 << 40, ROWS)),
        })

    batch_bytes = make(0).nbytes
    n_batches = TOTAL // batch_bytes + 1
    env = cf.NetworkEnvironment(memory="16MiB")
    part = env.create_partition("bp", CHANNELS)
    gate = env.create_input_gate([cf.ChannelSpec(env.address, "bp", i) for i in range(CHANNELS)])
    # Warm up allocators and the pool once, then measure the idle size.
    make(1); time.sleep(0.2)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                      # reset VmHWM to the current RSS
    idle_kib = vm_kib("VmRSS")

    produce_s = []                        # producer's own time per batch (no blocking)
    levels = {"slow": [], "fast": []}
    phase = ["slow"]
    stop = threading.Event()

    fast = threading.Event()

    def producer():
        pace = 0.0
        with cf.RecordWriter(part, cf.RoundRobinPartitioner()) as w:
            for seq in range(n_batches):
                t0 = time.perf_counter()
                b = make(seq)
                produce_s.append(time.perf_counter() - t0)
                w.write(b, timeout=60)
                if fast.is_set():
                    # Once the consumer is fast, the source runs at a steady rate (spreading
                    # what is left over ~4 s) so the fast phase lasts long enough to be measured.
                    if not pace:
                        pace = 4.0 / max(1, n_batches - seq)
                    time.sleep(pace)

    def monitor():
        while not stop.is_set():
            m = part.metrics()
            levels[phase[0]].append((m["level"], m["backpressured_ms_per_second"]))
            time.sleep(0.25)

    t = threading.Thread(target=producer); t.start()
    mon = threading.Thread(target=monitor); mon.start()
    expected_next = list(range(CHANNELS))
    received = 0
    errors = []
    t_start = time.perf_counter()
    while True:
        b = gate.next(timeout=60)
        if b is None:
            break
        seq = b.column("seq")[0].as_py()
        ch = b.column("channel")[0].as_py()
        if seq != expected_next[ch]:
            errors.append(f"channel {ch}: got seq {seq}, expected {expected_next[ch]}")
        expected_next[ch] = seq + CHANNELS
        x = b.column("x").to_numpy()
        if b.num_rows != ROWS or x[0] != seq * ROWS or x[-1] != seq * ROWS + ROWS - 1 \
                or int(x.sum()) != ROWS * seq * ROWS + ROWS * (ROWS - 1) // 2:
            errors.append(f"batch {seq} corrupted")
        received += 1
        if received < n_batches // 4:
            # Ten times slower than the producer's own cost per batch.
            recent = produce_s[-20:] or [0.001]
            time.sleep(10 * sum(recent) / len(recent))
        elif phase[0] == "slow":
            phase[0] = "fast"
            fast.set()
            fast_since = time.perf_counter()
        elif levels["fast"] and time.perf_counter() - fast_since < 1.25:
            levels["fast"].clear()      # the meter's one-second window still covers the slow phase
    t.join(); stop.set(); mon.join()
    peak_kib = vm_kib("VmHWM")
    m = env.metrics()
    gate.close(); env.close()
    print(json.dumps({
        "n_batches": n_batches, "received": received, "errors": errors[:10],
        "bytes": n_batches * batch_bytes, "idle_kib": idle_kib, "peak_kib": peak_kib,
        "levels_slow": levels["slow"], "levels_fast": levels["fast"],
        "seconds": time.perf_counter() - t_start,
        "segments_total": m["segments_total"], "segments_available": m["segments_available"],
    }))
    """
)


@pytest.mark.slow
def test_two_gib_through_16_mib_stays_bounded_and_reports_backpressure() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])

    assert r["bytes"] >= 2 * 1024**3
    assert r["received"] == r["n_batches"], "every batch arrives"
    assert r["errors"] == [], "intact and in order per channel"

    growth_mib = (r["peak_kib"] - r["idle_kib"]) / 1024
    assert growth_mib < 16 + 64, f"peak RSS grew by {growth_mib:.1f} MiB over idle"

    slow_levels = [lvl for lvl, _ in r["levels_slow"]]
    assert slow_levels.count("HIGH") >= len(slow_levels) // 2, slow_levels
    fast_levels = [lvl for lvl, _ in r["levels_fast"]]
    assert fast_levels, "the fast phase was sampled"
    assert fast_levels[-1] == "OK", fast_levels
    assert fast_levels.count("OK") >= len(fast_levels) // 2, fast_levels

    assert r["segments_available"] == r["segments_total"], "every segment returned"
