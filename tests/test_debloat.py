"""Buffer debloating from Python: settings are checked with errors that name them, and a gate
of a debloating environment reports what it measured and announced. (How the sizes follow a
slow consumer is tested in Rust, ``rust/core/tests/debloat.rs``; the latency it saves is
measured in ``benches/test_bench_barrier.py``.)"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest

import creditflow as cf
from creditflow.metrics import DebloatMetrics, GateMetrics
from helpers import read_all


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"debloat_target": 0.0}, "debloat_target"),
        ({"debloat_target": -1.0}, "debloat_target"),
        ({"debloat_target": float("nan")}, "debloat_target"),
        ({"debloat_min_buffer": 0}, "debloat_min_buffer"),
        ({"debloat_min_buffer": -5}, "debloat_min_buffer"),
        ({"debloat_min_buffer": 64 << 10, "segment_size": "32KiB"}, "debloat_min_buffer"),
    ],
)
def test_bad_debloat_settings_are_value_errors_naming_them(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cf.NetworkEnvironment(debloat=True, **kwargs)


def _gate_metrics(env: cf.NetworkEnvironment) -> GateMetrics:
    (g,) = env.metrics()["gates"].values()
    return g


def _debloat(env: cf.NetworkEnvironment) -> DebloatMetrics:
    d = _gate_metrics(env)["debloat"]
    assert d is not None, "the gate debloats"
    return d


def test_a_debloating_gate_reports_its_buffer_size_and_throughput() -> None:
    batch = pa.record_batch({"x": pa.array(range(10_000))})
    with (
        cf.NetworkEnvironment(memory="4MiB") as prod,
        cf.NetworkEnvironment(
            memory="4MiB", debloat=True, debloat_target=0.5, debloat_min_buffer=1024
        ) as cons,
    ):
        part = prod.create_partition("p", 1)
        gate = cons.create_input_gate([cf.ChannelSpec(prod.address, "p", 0)])
        d = _debloat(cons)
        # Before any sample: whole segments, nothing measured.
        assert d["buffer_size"] == d["desired_buffer_size"] == cons.segment_size
        assert d["throughput"] == 0.0
        assert d["buffers"] == 2 + 8
        with cf.RecordWriter(part) as w:
            deadline = time.monotonic() + 10
            # A trickle (a few KB/s): the gate's throughput is far below a segment per
            # buffer-second, so it announces a much smaller size.
            while _debloat(cons)["buffer_size"] == cons.segment_size:
                assert time.monotonic() < deadline, _gate_metrics(cons)
                w.write(batch.slice(0, 10))
                w.flush()
                assert gate.next(timeout=10) is not None
                time.sleep(0.05)
        read_all(gate)
        d = _debloat(cons)
        assert 1024 <= d["buffer_size"] < cons.segment_size
        assert d["throughput"] > 0


def test_without_debloating_gates_report_no_debloat_metrics() -> None:
    with cf.NetworkEnvironment(memory="4MiB") as env:
        env.create_partition("p", 1)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])
        assert _gate_metrics(env)["debloat"] is None
        gate.close()
