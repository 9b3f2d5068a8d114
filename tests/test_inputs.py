"""What ``RecordWriter.write()`` accepts: any Arrow PyCapsule producer, one schema per partition."""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow as pa
import pytest

import creditflow as cf
from helpers import HANDOFF, STEP_TIMEOUT, CArrayOnly, CStreamOnly, assert_batches_equal, exchange, read_all


def sample(start: int = 0, n: int = 5) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "name": pa.array([None if i % 4 == 0 else f"n{i}" for i in range(start, start + n)]),
        }
    )


def as_table(batches: list[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(batches)


@HANDOFF
def test_record_batch(local_handoff: bool) -> None:
    b = sample()
    assert_batches_equal(exchange([b], local_handoff=local_handoff), [b])


@HANDOFF
def test_multi_chunk_table_arrives_chunk_by_chunk(local_handoff: bool) -> None:
    chunks = [sample(0, 3), sample(3, 4), sample(7, 1)]
    table = pa.Table.from_batches(chunks)
    assert table.column("id").num_chunks == 3
    got = exchange([table], local_handoff=local_handoff)
    assert as_table(got).equals(table)
    assert_batches_equal(got, chunks)


@HANDOFF
def test_record_batch_reader_is_consumed(local_handoff: bool) -> None:
    chunks = [sample(i * 10, 10) for i in range(5)]
    reader = pa.RecordBatchReader.from_batches(chunks[0].schema, iter(chunks))
    got = exchange([reader], local_handoff=local_handoff)
    assert_batches_equal(got, chunks)
    with pytest.raises(Exception):  # noqa: B017, PT011 - pyarrow's own error for a used-up stream
        reader.read_next_batch()


@HANDOFF
def test_polars_dataframe(local_handoff: bool) -> None:
    df = pl.DataFrame({"a": [1, 2, None, 4], "s": ["x", None, "zz", "é"], "f": [0.5, 1.5, 2.5, None]})
    want = pa.table(df)  # what pyarrow itself makes of the same capsule stream
    got = exchange([df], local_handoff=local_handoff)
    table = as_table(got)
    assert table.schema == want.schema
    assert table.to_pylist() == want.to_pylist()
    assert pl.from_arrow(table).equals(df)


@HANDOFF
def test_duckdb_relation(local_handoff: bool) -> None:
    sql = "select range::BIGINT as a, 'v' || range::VARCHAR as s, range / 2 as d from range(2500)"
    rel = duckdb.sql(sql)
    assert hasattr(rel, "__arrow_c_stream__"), "duckdb relations are Arrow PyCapsule streams"
    want = pa.table(duckdb.sql(sql))
    got = exchange([rel], local_handoff=local_handoff)
    table = as_table(got)
    assert table.schema == want.schema
    assert table.num_rows == 2500
    assert table.sort_by("a").to_pylist() == want.sort_by("a").to_pylist()


@HANDOFF
def test_object_with_only_arrow_c_array(local_handoff: bool) -> None:
    b = sample(0, 7)
    got = exchange([CArrayOnly(b), CArrayOnly(b.slice(2, 3))], local_handoff=local_handoff)
    assert_batches_equal(got, [b, b.slice(2, 3)])
    assert got[0] is not b  # a new pyarrow batch, imported from Rust


@HANDOFF
def test_object_with_only_arrow_c_stream(local_handoff: bool) -> None:
    chunks = [sample(0, 2), sample(2, 3)]
    got = exchange([CStreamOnly(as_table(chunks)), CStreamOnly(sample(5, 1))], local_handoff=local_handoff)
    assert_batches_equal(got, [*chunks, sample(5, 1)])


def test_mixed_inputs_in_one_partition() -> None:
    parts = [sample(0, 3), sample(3, 2), sample(5, 2), sample(7, 1), sample(8, 4)]
    items = [
        parts[0],
        as_table([parts[1]]),
        CArrayOnly(parts[2]),
        CStreamOnly(parts[3]),
        pa.RecordBatchReader.from_batches(parts[4].schema, [parts[4]]),
    ]
    assert_batches_equal(exchange(items), parts)


@pytest.mark.parametrize(
    "bad",
    [[1, 2, 3], None, "abc", {"a": [1, 2]}, 42, object()],
    ids=["list", "None", "str", "dict", "int", "object"],
)
def test_non_arrow_input_is_a_type_error_with_a_helpful_message(bad: object) -> None:
    with cf.NetworkEnvironment(memory="4MiB") as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])
        w = cf.RecordWriter(part)
        with pytest.raises(TypeError) as info:
            w.write(bad, timeout=1)
        msg = str(info.value)
        assert "__arrow_c_array__" in msg
        assert "__arrow_c_stream__" in msg
        assert type(bad).__name__ in msg
        # The writer is still usable and nothing was written.
        assert part.schema is None
        good = sample()
        w.write(good, timeout=STEP_TIMEOUT)
        w.close()
        assert_batches_equal(read_all(gate), [good])


def test_plain_array_is_refused() -> None:
    with cf.NetworkEnvironment(memory="4MiB") as env:
        w = cf.RecordWriter(env.create_partition("p"))
        with pytest.raises((TypeError, ValueError)):
            w.write(pa.array([1, 2, 3]), timeout=1)


def _mismatched() -> list[tuple[str, pa.RecordBatch]]:
    b = sample()
    return [
        ("renamed", b.rename_columns(["id", "label"])),
        ("retyped", pa.record_batch({"id": b.column("id").cast(pa.int32()), "name": b.column("name")})),
        ("extra-column", b.append_column("x", pa.array([1.0] * len(b)))),
        ("missing-column", b.drop_columns(["name"])),
        ("reordered", b.select(["name", "id"])),
        (
            "large-string",
            pa.record_batch({"id": b.column("id"), "name": b.column("name").cast(pa.large_string())}),
        ),
        # Equal but for metadata or nullability: a writer that saw the good schema before must
        # not take these for it.
        ("metadata", b.replace_schema_metadata({"origin": "elsewhere"})),
        (
            "non-nullable",
            pa.RecordBatch.from_arrays(
                b.columns,
                schema=pa.schema([pa.field("id", pa.int64(), nullable=False), b.schema.field("name")]),
            ),
        ),
    ]


@HANDOFF
@pytest.mark.parametrize(("what", "bad"), _mismatched(), ids=[w for w, _ in _mismatched()])
def test_schema_change_is_refused_and_writes_nothing(
    local_handoff: bool, what: str, bad: pa.RecordBatch
) -> None:
    with cf.NetworkEnvironment(memory="4MiB", local_handoff=local_handoff, buffer_timeout=0) as env:
        part = env.create_partition("job/x", 2)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "job/x", i) for i in range(2)])
        good = [sample(0, 3), sample(3, 3), sample(6, 3)]
        with cf.RecordWriter(part, cf.BroadcastPartitioner()) as w:
            w.write(good[0], timeout=STEP_TIMEOUT)
            w.write(good[1], timeout=STEP_TIMEOUT)
            before = part.metrics()
            with pytest.raises(cf.SchemaMismatchError) as info:
                w.write(bad, timeout=STEP_TIMEOUT)
            assert isinstance(info.value, ValueError)
            assert isinstance(info.value, cf.CreditflowError)
            assert "job/x" in str(info.value)
            after = part.metrics()
            for key in ("batches_written", "rows_written", "bytes_written"):
                assert after[key] == before[key], key
            assert part.schema == good[0].schema
            # A table whose schema mismatches is refused as a whole, too.
            with pytest.raises(cf.SchemaMismatchError):
                w.write(pa.Table.from_batches([bad, bad]), timeout=STEP_TIMEOUT)
            w.write(good[2], timeout=STEP_TIMEOUT)
        got = read_all(gate)
        assert len(got) == 6
        for i in range(3):
            # Broadcast: each channel got good[i] in order; channels interleave.
            assert [g for g in got if g.equals(good[i])] == [good[i], good[i]]
        assert gate.next(timeout=1) is None


def test_error_raised_by_a_stream_surfaces_and_earlier_batches_arrive() -> None:
    first = sample(0, 2)

    def batches():
        yield first
        raise RuntimeError("boom from the user's generator")

    with cf.NetworkEnvironment(memory="4MiB") as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])
        w = cf.RecordWriter(part)
        with pytest.raises(Exception, match="boom from the user's generator"):
            w.write(pa.RecordBatchReader.from_batches(first.schema, batches()), timeout=STEP_TIMEOUT)
        w.write(sample(2, 1), timeout=STEP_TIMEOUT)
        w.close()
        assert_batches_equal(read_all(gate), [first, sample(2, 1)])


def test_hash_partitioner_with_unknown_key_column_is_a_value_error() -> None:
    with cf.NetworkEnvironment(memory="4MiB") as env:
        w = cf.RecordWriter(env.create_partition("p", 2), cf.HashPartitioner(["nope"]))
        with pytest.raises(ValueError, match="nope") as info:
            w.write(sample(), timeout=1)
        assert isinstance(info.value, cf.InvalidArgumentError)
        assert "name" in str(info.value)  # lists the columns there are


def test_hash_partitioner_check_schema_names_the_bad_key_before_any_write() -> None:
    schema = pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.string())), ("u", pa.uint8())])
    cf.HashPartitioner(["id"]).check_schema(schema)
    with pytest.raises(cf.InvalidArgumentError, match='key column "tags": cannot hash .*List'):
        cf.HashPartitioner(["id", "tags"]).check_schema(schema)
    with pytest.raises(cf.InvalidArgumentError, match="unsigned"):
        cf.HashPartitioner("u").check_schema(schema)
    with pytest.raises(cf.InvalidArgumentError, match="not in the batch schema"):
        cf.HashPartitioner("nope").check_schema(schema)
