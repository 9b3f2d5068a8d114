"""HashPartitioner co-partitions with Spark: every row lands in the subpartition that
``df.repartition(n, *keys)`` puts it in, checked against a real local Spark.

For each key type (and multi-column keys), a random table with a fixed seed, nulls, all-null
key rows and the type's edge values (-0.0, NaN payloads, extremes, non-ASCII string tails...)
is repartitioned by Spark, which tags each row with ``spark_partition_id()``, and pushed
through creditflow with one input gate per subpartition. The two assignments are joined on a
unique row id.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf

pytestmark = pytest.mark.spark

ROWS = 3000
SEED = 20240611
NUM_PARTITIONS = (1, 4, 7, 200)
# Generous: a bug must fail the test, not hang it, but a loaded CI machine must not flake.
TIMEOUT = 60.0
REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------- Spark session


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    """A small local[2] SparkSession bound to loopback, shared by the module."""
    from creditflow.spark import local_session

    session = local_session(
        "local[2]",
        "creditflow-test-spark-hash",
        {
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
        },
    )
    try:
        yield session
    finally:
        session.stop()


# ------------------------------------------------------------------------------------ test data


def _with_nulls(values: pa.Array, rng: np.random.Generator, fraction: float = 0.1) -> pa.Array:
    mask = rng.random(len(values)) < fraction
    return pa.array(values.to_pylist(), type=values.type, mask=mask)


def _ints(rng: np.random.Generator, n: int, dtype: type, edges: list[int]) -> list[object]:
    info = np.iinfo(dtype)
    small = rng.integers(-1000, 1000, n)  # many repeats: equal keys must land together
    wide = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    values = np.where(rng.random(n) < 0.5, small, wide).astype(dtype).tolist()
    values[: len(edges)] = edges
    return values


def _strings(rng: np.random.Generator, n: int) -> list[object]:
    # Lengths 0..12 exercise every tail length of Spark's hashUnsafeBytes; the non-ASCII
    # characters put bytes >= 0x80 into the tail, which Spark sign-extends.
    alphabet = list("abcXYZ09 _-") + ["é", "ß", "€", "中", "😀"]
    values: list[object] = []
    for _ in range(n):
        length = int(rng.integers(0, 13))
        values.append("".join(alphabet[i] for i in rng.integers(0, len(alphabet), length)))
    values[:6] = ["", "a", "é", "€", "😀", "abcd"]
    return values


def _float64s(rng: np.random.Generator, n: int) -> pa.Array:
    values = rng.normal(0, 1e6, n)
    small = rng.random(n) < 0.3  # repeated small integral values
    values[small] = rng.integers(-5, 5, int(small.sum())).astype(np.float64)
    specials = np.array(
        [0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -1.0, 5e-324, 1.7976931348623157e308],
        dtype=np.float64,
    )
    # NaNs with other payloads and the sign bit set: Spark hashes every NaN alike.
    nan_bits = np.array([0x7FF8000000000001, 0xFFF8000000000000, 0x7FF0000000000001], dtype=np.uint64)
    specials = np.concatenate([specials, nan_bits.view(np.float64)])
    values[: len(specials)] = specials
    # Sprinkle the specials through the table too (not only at the front).
    where = rng.integers(0, n, 200)
    values[where] = specials[rng.integers(0, len(specials), len(where))]
    return pa.array(values, type=pa.float64())


def _column(kind: str, rng: np.random.Generator, n: int) -> pa.Array:
    if kind == "int32":
        arr = pa.array(_ints(rng, n, np.int32, [0, -1, 1, 2**31 - 1, -(2**31)]), pa.int32())
    elif kind == "int64":
        arr = pa.array(_ints(rng, n, np.int64, [0, -1, 1, 2**63 - 1, -(2**63), 2**32, -(2**32)]), pa.int64())
    elif kind == "string":
        arr = pa.array(_strings(rng, n), pa.string())
    elif kind == "date":
        # 0001-01-01 .. 9999-12-31 is what Spark's DateType holds.
        days = rng.integers(-30_000, 30_000, n)
        days[:4] = [0, -1, -719_162, 2_932_896]
        arr = pa.array(days.astype(np.int32), pa.date32())
    elif kind == "bool":
        arr = pa.array(rng.random(n) < 0.5, pa.bool_())
    elif kind == "float64":
        arr = _float64s(rng, n)
    elif kind == "timestamp":
        micros = rng.integers(-(2**52), 2**52, n)
        micros[:3] = [0, -1, 1]
        arr = pa.array(micros, pa.timestamp("us", tz="UTC"))
    elif kind == "decimal_small":
        unscaled = rng.integers(-(10**9), 10**9, n)
        arr = pa.array([decimal.Decimal(int(u)).scaleb(-2) for u in unscaled], pa.decimal128(10, 2))
    elif kind == "decimal_large":
        # precision > 18: Spark hashes the minimal big-endian two's complement bytes.
        hi = rng.integers(-(10**12), 10**12, n)
        lo = rng.integers(0, 10**18, n)
        vals = [decimal.Decimal(int(h) * 10**18 + int(lo_)).scaleb(-6) for h, lo_ in zip(hi, lo, strict=True)]
        vals[:4] = [
            decimal.Decimal(0),
            decimal.Decimal("-0.000001"),
            decimal.Decimal("0.000128"),
            decimal.Decimal(-1),
        ]
        arr = pa.array(vals, pa.decimal128(38, 6))
    else:
        raise AssertionError(kind)
    return _with_nulls(arr, rng)


# name -> key column kinds
CASES: dict[str, list[str]] = {
    "int32": ["int32"],
    "int64": ["int64"],
    "string": ["string"],
    "date": ["date"],
    "bool": ["bool"],
    "float64": ["float64"],
    "int64+string": ["int64", "string"],
    "date+bool": ["date", "bool"],
    "string+float64+int32": ["string", "float64", "int32"],
    "timestamp": ["timestamp"],
    "decimal(10,2)": ["decimal_small"],
    "decimal(38,6)": ["decimal_large"],
}


def make_table(case: str) -> tuple[pa.Table, list[str]]:
    """A table with a unique ``id`` column and the key columns ``k0, k1, ...`` of ``case``."""
    kinds = CASES[case]
    rng = np.random.default_rng([SEED, *map(ord, case)])
    columns = {"id": pa.array(np.arange(ROWS, dtype=np.int64))}
    keys = []
    for i, kind in enumerate(kinds):
        arr = _column(kind, rng, ROWS)
        # The last rows have every key null (hash stays the seed, 42).
        mask = np.asarray(arr.is_null()) | (np.arange(ROWS) >= ROWS - 50)
        arr = pa.array(arr.to_pylist(), type=arr.type, mask=mask)
        columns[f"k{i}"] = arr
        keys.append(f"k{i}")
    columns["payload"] = pa.array(rng.random(ROWS))
    return pa.table(columns), keys


# ------------------------------------------------------------------------------ both partitioners


def spark_assignment(spark: object, table: pa.Table, keys: list[str], n: int) -> dict[int, int]:
    from pyspark.sql import functions as F

    df = spark.createDataFrame(table)  # type: ignore[attr-defined]
    out = df.repartition(n, *keys).withColumn("pid", F.spark_partition_id()).select("id", "pid").toArrow()
    ids = out.column("id").to_pylist()
    pids = out.column("pid").to_pylist()
    assert len(ids) == table.num_rows
    return dict(zip(ids, pids, strict=True))


def creditflow_assignment(
    table: pa.Table, keys: list[str], n: int, *, local_handoff: bool = True
) -> dict[int, int]:
    """Row id -> subpartition creditflow's HashPartitioner sent the row to."""
    # Uneven slices: several batches, sliced (offset) arrays, and an empty batch.
    bounds = [0, 1, 700, 1999, table.num_rows]
    batches = [pa.RecordBatch.from_pylist([], schema=table.schema)]
    batches += [b for s, e in itertools.pairwise(bounds) for b in table.slice(s, e - s).to_batches()]
    assert sum(b.num_rows for b in batches) == table.num_rows

    with cf.NetworkEnvironment(memory="256MiB", local_handoff=local_handoff) as env:
        part = env.create_partition("spark-hash", num_subpartitions=n)
        gates = [env.create_input_gate([cf.ChannelSpec(env.address, "spark-hash", i)]) for i in range(n)]
        errors: list[BaseException] = []

        def write() -> None:
            try:
                with cf.RecordWriter(part, cf.HashPartitioner(keys), timeout=TIMEOUT) as writer:
                    for batch in batches:
                        writer.write(batch)
            except BaseException as exc:  # re-raised in the main thread
                errors.append(exc)

        writer_thread = threading.Thread(target=write, name="spark-hash-writer", daemon=True)
        writer_thread.start()
        assignment: dict[int, int] = {}
        try:
            for sub, gate in enumerate(gates):
                while (batch := gate.next(timeout=TIMEOUT)) is not None:
                    assert batch.schema == table.schema
                    for row_id in batch.column("id").to_pylist():
                        assert row_id not in assignment, f"row {row_id} delivered twice"
                        assignment[row_id] = sub
        finally:
            writer_thread.join(TIMEOUT)
        assert not writer_thread.is_alive(), "writer did not finish"
        if errors:
            raise errors[0]
        for gate in gates:
            gate.close()
    assert len(assignment) == table.num_rows
    return assignment


def _describe_mismatches(
    table: pa.Table, keys: list[str], spark_pids: dict[int, int], ours: dict[int, int]
) -> str:
    bad = [i for i in range(table.num_rows) if spark_pids[i] != ours[i]]
    if not bad:
        return ""
    lines = [f"{len(bad)} of {table.num_rows} rows differ; first ones:"]
    cols = {k: table.column(k) for k in keys}
    for i in bad[:10]:
        vals = {k: cols[k][i].as_py() for k in keys}
        lines.append(f"  id={i} keys={vals!r} spark={spark_pids[i]} creditflow={ours[i]}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def tables() -> Callable[[str], tuple[pa.Table, list[str]]]:
    cache: dict[str, tuple[pa.Table, list[str]]] = {}

    def get(case: str) -> tuple[pa.Table, list[str]]:
        if case not in cache:
            cache[case] = make_table(case)
        return cache[case]

    return get


@pytest.mark.parametrize("n", NUM_PARTITIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_hash_partitioner_matches_spark_repartition(
    spark: object, tables: Callable[[str], tuple[pa.Table, list[str]]], case: str, n: int
) -> None:
    table, keys = tables(case)
    expected = spark_assignment(spark, table, keys, n)
    actual = creditflow_assignment(table, keys, n)
    assert expected.keys() == actual.keys()
    assert expected == actual, _describe_mismatches(table, keys, expected, actual)
    if n > 1:
        # Guard against a vacuous pass (e.g. everything in one partition on both sides).
        assert len(set(actual.values())) > 1 or case == "bool"


@pytest.mark.parametrize("case", ["int64+string", "float64", "date+bool"])
def test_serialized_path_partitions_like_spark(
    spark: object, tables: Callable[[str], tuple[pa.Table, list[str]]], case: str
) -> None:
    """The serialized (non hand-off) path splits rows identically."""
    table, keys = tables(case)
    expected = spark_assignment(spark, table, keys, 7)
    actual = creditflow_assignment(table, keys, 7, local_handoff=False)
    assert expected == actual, _describe_mismatches(table, keys, expected, actual)


def test_all_null_and_signed_zero_rows_land_together(spark: object) -> None:
    """Rows whose keys are all null share Spark's partition pmod(42, n); -0.0 joins 0.0 and
    every NaN joins every other NaN."""
    nan2 = np.array([0xFFF8000000000000], dtype=np.uint64).view(np.float64)[0]
    table = pa.table(
        {
            "id": pa.array(range(8), pa.int64()),
            "k0": pa.array([None, None, 0.0, -0.0, float("nan"), nan2, 1.5, None], pa.float64()),
            "k1": pa.array([None, None, "x", "x", "y", "y", None, "z"], pa.string()),
            "d": pa.array([dt.date(2020, 1, 1)] * 8, pa.date32()),
        }
    )
    for n in (4, 7, 200):
        expected = spark_assignment(spark, table, ["k0", "k1"], n)
        actual = creditflow_assignment(table, ["k0", "k1"], n)
        assert expected == actual, _describe_mismatches(table, ["k0", "k1"], expected, actual)
        assert actual[0] == actual[1] == 42 % n
        assert actual[2] == actual[3]
        assert actual[4] == actual[5]
