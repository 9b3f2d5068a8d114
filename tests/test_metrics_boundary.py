"""Every metric the Rust core defines reaches Python under its Rust name, and Prometheus.

The metrics structs are read from the Rust source (``pub struct ...Metrics`` / ``...Stats``
and their ``pub`` fields, wherever the core's layout puts them), so a field added in Rust
fails here until ``creditflow.metrics`` types it, ``metrics()`` returns it (the bindings'
exhaustive destructuring already refuses to compile without it) and a Prometheus family
exports it or ``creditflow.prometheus.NOT_EXPORTED`` says why not.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import creditflow as cf
import creditflow.metrics as cm
from creditflow.prometheus import FAMILIES, LEVEL_OF_LABELS, NOT_EXPORTED
from helpers import read_all

SOURCE = Path(__file__).resolve().parents[1] / "rust" / "core" / "src"

#: The Rust structs metrics() converts, and the TypedDict that types each in Python.
TYPED = {
    "EnvMetrics": cm.EnvMetrics,
    "PartitionMetrics": cm.PartitionMetrics,
    "SubpartitionMetrics": cm.SubpartitionMetrics,
    "RemoteReaderMetrics": cm.RemoteReaderMetrics,
    "GateMetrics": cm.GateMetrics,
    "ChannelMetrics": cm.ChannelMetrics,
    "ChannelSpec": cm.ChannelSpecFields,
    "DebloatMetrics": cm.DebloatMetrics,
    "RemoteStats": cm.RemoteStats,
    "RemoteChannelStats": cm.RemoteChannelStats,
    "PoolStats": cm.PoolStats,
    "SpillMetrics": cm.SpillMetrics,
    "SpillDirMetrics": cm.SpillDirMetrics,
    "ServiceMetrics": cm.ServiceMetrics,
}
#: Values the core computes by a method, included under the method's name.
METHODS = {
    "PoolStats": ("usage",),
    "PartitionMetrics": ("out_pool_usage", "level", "busy_ms_per_second"),
    "GateMetrics": ("busy_ms_per_second",),
}
#: The structs Prometheus families are labelled by (the others nest inside one of them).
LEVELS = {
    "EnvMetrics": "env",
    "PartitionMetrics": "partition",
    "SubpartitionMetrics": "subpartition",
    "GateMetrics": "gate",
    "ChannelMetrics": "channel",
    "ServiceMetrics": "service",
}
#: Rust scalar types and what they become in Python.
SCALARS: dict[str, type] = {
    "usize": int,
    "u64": int,
    "u32": int,
    "f64": float,
    "bool": bool,
    "String": str,
    "&'static str": str,
    "Duration": float,  # seconds
    "std::time::Duration": float,
    "ChannelKind": str,
    "ChannelTransport": str,
}
#: Fields converted otherwise than their Rust type says (rust/python/src/metrics.rs).
CONVERTED: dict[tuple[str, str], object] = {
    ("PoolStats", "max"): int | None,  # usize::MAX: None
    ("SpillDirMetrics", "max_spill"): int | None,
}
NUMERIC = {"usize", "u64", "u32", "f64", "Duration", "std::time::Duration", "Vec<usize>"}


@cache
def rust_structs() -> dict[str, dict[str, str]]:
    """``{struct: {field: Rust type}}`` for the structs in :data:`TYPED`, from the source."""
    found: dict[str, dict[str, str]] = {}
    for path in sorted(SOURCE.rglob("*.rs")):
        text = path.read_text()
        for m in re.finditer(r"^pub struct (\w+) \{\n(.*?)^\}", text, re.MULTILINE | re.DOTALL):
            name, body = m.groups()
            if name in TYPED:
                assert name not in found, f"two structs named {name}"
                found[name] = dict(re.findall(r"^\s*pub (\w+): (.+),$", body, re.MULTILINE))
    assert set(found) == set(TYPED), f"not found in {SOURCE}: {set(TYPED) - set(found)}"
    return found


def child(rust_type: str) -> tuple[str, str] | None:
    """``(wrapper, struct)`` when a field holds another metrics struct (``Vec``, ``Option``)."""
    m = re.fullmatch(r"(?:(Vec|Option)<)?(\w+)>?", rust_type)
    if m and m.group(2) in TYPED:
        return m.group(1) or "", m.group(2)
    return None


def keys(struct: str) -> set[str]:
    return set(rust_structs()[struct]) | set(METHODS.get(struct, ()))


def test_every_metrics_struct_has_a_typed_dict_with_its_field_names() -> None:
    for struct, typed in TYPED.items():
        assert set(typed.__required_keys__) == keys(struct), struct
        assert not typed.__optional_keys__, struct


def test_the_typed_dicts_types_follow_the_rust_types() -> None:
    for struct, fields in rust_structs().items():
        hints = typing.get_type_hints(TYPED[struct])
        for field, rust_type in fields.items():
            hint = hints[field]
            if (struct, field) in CONVERTED:
                assert hint == CONVERTED[struct, field], f"{struct}.{field}"
                continue
            sub = child(rust_type)
            optional = rust_type.startswith("Option<")
            if optional:
                assert type(None) in typing.get_args(hint), f"{struct}.{field} may be None"
            if sub is not None:
                want = TYPED[sub[1]]
                if sub[0] == "Vec":
                    origin = typing.get_origin(hint)
                    args = typing.get_args(hint)
                    assert (origin, args[-1]) in {(list, want), (dict, want)}, f"{struct}.{field}: {hint}"
                else:
                    assert want in (typing.get_args(hint) or (hint,)), f"{struct}.{field}: {hint}"
            elif rust_type == "Vec<usize>":
                assert hint == list[int], f"{struct}.{field}"
            elif not optional:
                want_scalar = SCALARS[rust_type]
                got = typing.get_origin(hint) or hint
                if got is typing.Literal:
                    got = type(typing.get_args(hint)[0])
                assert got is want_scalar, f"{struct}.{field}: {hint} for Rust {rust_type}"


def test_the_derived_values_are_methods_of_the_rust_structs() -> None:
    text = "\n".join(p.read_text() for p in SOURCE.rglob("*.rs"))
    for struct, methods in METHODS.items():
        impls = re.findall(rf"^impl {struct} \{{\n(.*?)^\}}", text, re.MULTILINE | re.DOTALL)
        for method in methods:
            assert any(re.search(rf"pub fn {method}\(&self\)", body) for body in impls), f"{struct}::{method}"


# ----------------------------------------------------------------------------------- Python


def walk(struct: str, d: Any, path: str, seen: set[str]) -> None:
    """Checks ``d`` has exactly the fields of ``struct``, recursively; records which
    structs were seen (an ``Option`` that is None checks nothing)."""
    assert isinstance(d, dict), f"{path}: {type(d).__name__}"
    assert set(d) == keys(struct), f"{path} ({struct})"
    seen.add(struct)
    for field, rust_type in rust_structs()[struct].items():
        sub = child(rust_type)
        value = d[field]
        if sub is None:
            continue
        wrapper, name = sub
        if wrapper == "Option":
            if value is not None:
                walk(name, value, f"{path}.{field}", seen)
        elif wrapper == "Vec":
            items = value.values() if isinstance(value, dict) else value
            for i, item in enumerate(items):
                walk(name, item, f"{path}.{field}[{i}]", seen)
        else:
            walk(name, value, f"{path}.{field}", seen)


def test_every_metric_reaches_python_at_its_level() -> None:
    batch = pa.record_batch({"x": pa.array(range(5_000))})
    seen: set[str] = set()
    with (
        cf.NetworkEnvironment(memory="8MiB") as prod,
        cf.NetworkEnvironment(memory="8MiB", debloat=True) as cons,
    ):
        remote = prod.create_partition("remote", 1)
        local = prod.create_partition("local", 1, kind="hybrid")
        remote_gate = cons.create_input_gate([cf.ChannelSpec(prod.address, "remote", 0)])
        local_gate = prod.create_input_gate([cf.ChannelSpec(prod.address, "local", 0)])
        writers = [cf.RecordWriter(remote), cf.RecordWriter(local)]
        for w in writers:
            w.write(batch)
            w.flush()
        assert remote_gate.next(timeout=10) is not None
        assert local_gate.next(timeout=10) is not None
        for env in (prod, cons):
            walk("EnvMetrics", env.metrics(), "env.metrics()", seen)
        walk("PartitionMetrics", remote.metrics(), "partition.metrics()", seen)
        walk("PartitionMetrics", writers[0].metrics(), "writer.metrics()", seen)
        walk("PartitionMetrics", local.metrics(), "partition.metrics() (hybrid)", seen)
        walk("GateMetrics", remote_gate.metrics(), "gate.metrics()", seen)
        for w in writers:
            w.close()
        read_all(remote_gate)
        read_all(local_gate)
    with cf.HostService(f"boundary-{os.getpid()}", memory="4MiB") as service:
        walk("ServiceMetrics", service.metrics(), "service.metrics()", seen)
        walk("EnvMetrics", service.environment_metrics(), "service.environment_metrics()", seen)
    assert seen == set(TYPED), f"never populated: {set(TYPED) - seen}"


# ------------------------------------------------------------------------------- Prometheus


def numeric_fields(struct: str, prefix: str = "") -> Iterator[str]:
    """The numeric fields of a struct's level, dotted into the structs nested in it (but
    not into the next level's: a gate's channels are the channel level)."""
    for field, rust_type in rust_structs()[struct].items():
        sub = child(rust_type)
        if sub is not None:
            if sub[1] not in LEVELS:
                yield from numeric_fields(sub[1], f"{prefix}{field}.")
        elif rust_type in NUMERIC:
            yield prefix + field
    for method in METHODS.get(struct, ()):
        if method != "level":  # a string (exported as a number by its own family)
            yield prefix + method


def all_numeric() -> set[str]:
    return {f"{level}.{f}" for struct, level in LEVELS.items() for f in numeric_fields(struct)}


def exported() -> set[str]:
    return {f"{LEVEL_OF_LABELS[f.labels]}.{f.field}" for f in FAMILIES}


@pytest.mark.parametrize("metric", sorted(all_numeric()))
def test_every_numeric_metric_is_exported_or_says_why_not(metric: str) -> None:
    assert metric in exported() or metric in NOT_EXPORTED, (
        f"{metric} reaches Python but no Prometheus family exports it: add a Family to "
        "creditflow.prometheus.FAMILIES, or say why not in NOT_EXPORTED"
    )
    assert not (metric in exported() and metric in NOT_EXPORTED), (
        f"{metric} is exported: drop it from NOT_EXPORTED"
    )


def test_families_and_exceptions_name_real_fields() -> None:
    def resolves(struct: str, path: list[str]) -> bool:
        if path[0] in METHODS.get(struct, ()):
            return len(path) == 1
        rust_type = rust_structs()[struct].get(path[0])
        if rust_type is None:
            return False
        sub = child(rust_type)
        return len(path) == 1 if sub is None else len(path) > 1 and resolves(sub[1], path[1:])

    by_level = {level: struct for struct, level in LEVELS.items()}
    for f in FAMILIES:
        level = LEVEL_OF_LABELS[f.labels]
        if level == "rank":  # computed in Python (Receiver.rank_metrics()), typed by RankMetrics
            from creditflow.metrics import RankMetrics

            assert f.field in RankMetrics.__annotations__, f"{f.name} reads rank.{f.field}"
            continue
        assert resolves(by_level[level], f.field.split(".")), f"{f.name} reads {level}.{f.field}"
    stale = set(NOT_EXPORTED) - all_numeric()
    assert not stale, f"NOT_EXPORTED names no numeric metric: {stale}"
    assert all(reason.strip() for reason in NOT_EXPORTED.values())


def test_family_values_read_the_python_dicts() -> None:
    from creditflow.prometheus import families

    with cf.NetworkEnvironment(memory="4MiB") as env:
        part = env.create_partition("p", 2)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", i) for i in range(2)])
        w = cf.RecordWriter(part, cf.RoundRobinPartitioner())
        w.write(pa.record_batch({"x": [1, 2, 3]}))
        w.flush()
        assert gate.next(timeout=10) is not None
        m = env.metrics()
        by_name = {fam.name: fam for fam in families(m)}
        rows = by_name["creditflow_partition_written_rows"].samples
        assert [(s.labels["partition"], s.value) for s in rows] == [("p", 3.0)]
        ratio = by_name["creditflow_partition_out_pool_usage_ratio"].samples[0].value
        assert ratio == m["partitions"]["p"]["out_pool_usage"]
        chans = by_name["creditflow_channel_received_rows"].samples
        assert sorted((s.labels["subpartition"], s.labels["peer"]) for s in chans) == [
            ("0", env.address),
            ("1", env.address),
        ]
        w.close()
        read_all(gate)
