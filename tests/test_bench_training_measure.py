"""The training benchmark's measuring helpers (``benches/training/measure.py``): the figures in
docs/benchmarks.md come from them, the benchmark itself does not run here (it needs torch and
the peers, in its own environment: ``make bench-training``). Cheap: a few child processes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

MEASURE = Path(__file__).resolve().parents[1] / "benches" / "training" / "measure.py"
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/<pid>/io")

# A child that writes 4 MiB into a directory when told, then removes it when told.
WRITER = """
import os, sys
path = os.path.join(sys.argv[1], "data")
sys.stdin.readline()
with open(path, "wb") as f:
    f.write(os.urandom(4 << 20))
    f.flush()
    os.fsync(f.fileno())
print("written", flush=True)
sys.stdin.readline()
os.remove(path)
print("removed", flush=True)
sys.stdin.readline()
"""


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_training_measure", MEASURE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_writer(m: ModuleType, tmp_path: Path, *, exclude_child: bool) -> object:
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        assert child.pid in m.descendants(os.getpid())
        sampler = m.Sampler(
            root=os.getpid(), directory=tmp_path, interval=0.05, exclude=[child.pid] if exclude_child else []
        ).start()
        for expect in ("written", "removed"):
            child.stdin.write("next\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == expect
            sampler.sample()  # at least one sample between the steps, whatever the thread does
        return sampler.stop()
    finally:
        child.stdin.close()
        child.wait()
        child.stdout.close()


def test_sampler_counts_a_childs_writes_and_the_directory_at_its_largest(tmp_path: Path) -> None:
    m = load()
    usage = run_writer(m, tmp_path, exclude_child=False)
    assert usage.write_bytes >= 4 * MiB  # type: ignore[attr-defined]
    assert usage.peak_dir_bytes >= 4 * MiB  # type: ignore[attr-defined]
    assert m.dir_bytes(tmp_path) == 0  # the file is gone: only the peak remembers it


def test_sampler_leaves_out_excluded_pids(tmp_path: Path) -> None:
    m = load()
    usage = run_writer(m, tmp_path, exclude_child=True)
    assert usage.write_bytes < 4 * MiB  # type: ignore[attr-defined]
    assert usage.peak_dir_bytes >= 4 * MiB  # type: ignore[attr-defined]


def test_peak_rss_and_cpu_seconds_of_a_process() -> None:
    code = f"""
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("m", {str(MEASURE)!r})
m = importlib.util.module_from_spec(spec); sys.modules["m"] = m; spec.loader.exec_module(m)
before = m.peak_rss()
block = b"\\x01" * (64 << 20)
grew = m.peak_rss() - before
start = time.process_time()
while time.process_time() - start < 0.3:
    pass
print(grew, m.read_counters(os.getpid()).cpu_seconds)
"""
    grew, cpu = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(grew) >= 60 * MiB
    assert float(cpu) >= 0.3


def test_read_counters_of_a_process_that_is_gone() -> None:
    m = load()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert m.read_counters(child.pid) is None


def test_timeline_counts_batches_rows_and_keys_per_epoch() -> None:
    m = load()
    t = m.Timeline()
    t.batch(1024, 10)
    t.batch(1024, 5)
    t.end_epoch()
    t.end_epoch()  # an epoch without a batch
    t.batch(7, 1)
    t.end_epoch()
    d = t.as_dict()
    assert d["batches"] == [2, 0, 1]
    assert d["rows"] == [2048, 0, 7]
    assert d["keys"] == [15, 0, 1]
    assert d["first_batch"] is not None
    assert d["first_batch"] <= d["epoch_ends"][0] <= d["epoch_ends"][1] <= d["epoch_ends"][2]
