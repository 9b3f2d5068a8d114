"""Arrow data survives a local exchange exactly, and lands where the partitioner says.

Every type test runs in three modes:

* ``handoff``: ``local_handoff=True`` with a ``pyarrow.RecordBatch`` (the reader gets the
  writer's own object back);
* ``handoff-cdata``: ``local_handoff=True`` with an object that only exposes
  ``__arrow_c_array__``, so the batch crosses into Rust and back out through the Arrow C data
  interface;
* ``serialized``: ``local_handoff=False``, Arrow IPC encoded into 32 KiB segments and decoded
  again: the same buffer machinery a remote channel uses.

and with ``buffer_timeout`` 0 (flush every write) and 0.1 s (output flusher).
"""

from __future__ import annotations

import collections
import datetime as dt
import struct
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf
from helpers import HANDOFF, CArrayOnly, assert_batches_equal, exchange

MODES = ["handoff", "handoff-cdata", "serialized"]
TIMEOUTS = [0, 0.1]


def run(batches: list[pa.RecordBatch], mode: str, buffer_timeout: float, **kwargs: object) -> list:
    items = [CArrayOnly(b) for b in batches] if mode == "handoff-cdata" else batches
    return exchange(items, local_handoff=(mode != "serialized"), buffer_timeout=buffer_timeout, **kwargs)


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=TIMEOUTS, ids=lambda t: f"timeout{t}")
def buffer_timeout(request: pytest.FixtureRequest) -> float:
    return request.param


# ---------------------------------------------------------------------------------------------
# The type zoo
# ---------------------------------------------------------------------------------------------


def _ints(t: pa.DataType) -> pa.Array:
    info = np.iinfo(t.to_pandas_dtype())
    return pa.array([info.min, None, 0, 1, info.max, -1 if info.min < 0 else 7], t)


def _decimals(t: pa.DataType) -> pa.Array:
    def dec(unscaled: int) -> Decimal:
        digits = tuple(int(c) for c in str(abs(unscaled)))
        return Decimal((1 if unscaled < 0 else 0, digits, -t.scale))

    top = 10**t.precision - 1
    return pa.array([dec(top), dec(-top), None, dec(0), dec(-1), dec(-(12345 % top))], t)


_TS = [dt.datetime(1969, 12, 31, 23, 59, 59), None, dt.datetime(2024, 2, 29, 12, 30, 15, 123456)]


def _type_cases() -> dict[str, pa.Array]:
    cases: dict[str, pa.Array] = {}
    for t in (
        pa.int8(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.uint8(),
        pa.uint16(),
        pa.uint32(),
        pa.uint64(),
    ):
        cases[str(t)] = _ints(t)
    # NaN != NaN for RecordBatch.equals: NaNs have their own test below.
    cases["float16"] = pa.array(np.array([1.5, -0.0, 65504, np.inf, 6e-8], dtype=np.float16))
    cases["float16_nulls"] = pa.array([np.float16(1.5), None, np.float16(-2)], pa.float16())
    cases["float32"] = pa.array([1.5, None, -0.0, float("inf"), 1e-45, 3.4e38], pa.float32())
    cases["float64"] = pa.array([1.5, None, -0.0, float("-inf"), 5e-324, 1e308], pa.float64())
    cases["bool"] = pa.array([True, False, None, True, True, False, False, True, None, True])
    for p, s in ((1, 0), (9, 2), (18, 0), (38, 10), (38, 38), (10, -2)):
        cases[f"decimal128({p},{s})"] = _decimals(pa.decimal128(p, s))
    for p, s in ((40, 2), (76, 0), (76, 38)):
        cases[f"decimal256({p},{s})"] = _decimals(pa.decimal256(p, s))
    cases["date32"] = pa.array(
        [dt.date(1, 1, 1), None, dt.date(1970, 1, 1), dt.date(9999, 12, 31)], pa.date32()
    )
    cases["date64"] = pa.array([dt.date(1969, 7, 20), None, dt.date(2038, 1, 19)], pa.date64())
    cases["time32[s]"] = pa.array([0, None, 86399], pa.time32("s"))
    cases["time32[ms]"] = pa.array([0, None, 86399999], pa.time32("ms"))
    cases["time64[us]"] = pa.array([0, None, 86399999999], pa.time64("us"))
    cases["time64[ns]"] = pa.array([0, None, 86399999999999], pa.time64("ns"))
    for unit in ("s", "ms", "us", "ns"):
        cases[f"timestamp[{unit}]"] = pa.array(_TS, pa.timestamp(unit))
        for tz in ("UTC", "Europe/Paris", "+05:30"):
            cases[f"timestamp[{unit},{tz}]"] = pa.array(_TS, pa.timestamp(unit, tz))
        cases[f"duration[{unit}]"] = pa.array([-(2**40), None, 0, 2**40], pa.duration(unit))
    cases["month_day_nano_interval"] = pa.array(
        [pa.MonthDayNano([1, -2, 3_000_000_000]), None, pa.MonthDayNano([-(2**31), 2**31 - 1, -(2**63)])],
        pa.month_day_nano_interval(),
    )
    strs = ["", None, "a", "héllo wörld", "日本語", "x" * 100, "😀"]
    cases["string"] = pa.array(strs, pa.string())
    cases["large_string"] = pa.array(strs, pa.large_string())
    cases["string_view"] = pa.array(strs, pa.string_view())
    bins = [b"", None, b"\x00\xff", b"y" * 40, b"abc"]
    cases["binary"] = pa.array(bins, pa.binary())
    cases["large_binary"] = pa.array(bins, pa.large_binary())
    cases["binary_view"] = pa.array(bins, pa.binary_view())
    cases["fixed_size_binary"] = pa.array([b"abcd", None, b"\x00\x00\x00\x00"], pa.binary(4))
    lists = [[1, None, 3], None, [], [4]]
    cases["list"] = pa.array(lists, pa.list_(pa.int32()))
    cases["large_list"] = pa.array(lists, pa.large_list(pa.int64()))
    cases["fixed_size_list"] = pa.array([[1, 2], None, [None, 4]], pa.list_(pa.int16(), 2))
    cases["list_view"] = pa.array(lists, pa.list_view(pa.int32()))
    cases["large_list_view"] = pa.array(lists, pa.large_list_view(pa.int32()))
    cases["list<string>"] = pa.array([["a", None], None, [], ["bc"]], pa.list_(pa.string()))
    st = pa.struct([("i", pa.int32()), ("s", pa.string()), ("b", pa.bool_())])
    cases["struct"] = pa.array([{"i": 1, "s": "a", "b": True}, None, {"i": None, "s": None, "b": None}], st)
    mt = pa.map_(pa.string(), pa.int64())
    cases["map"] = pa.array([[("a", 1), ("b", None)], None, [], [("c", 3)]], mt)
    nested = pa.list_(pa.struct([("k", pa.int32()), ("m", mt)]))
    cases["list<struct<map>>"] = pa.array(
        [[{"k": 1, "m": [("x", 1)]}, None, {"k": None, "m": None}], None, [], [{"k": 2, "m": []}]], nested
    )
    for idx in (pa.int8(), pa.int32()):
        cases[f"dictionary<{idx},string>"] = pa.DictionaryArray.from_arrays(
            pa.array([0, 1, None, 0, 2], idx), pa.array(["a", "bb", None])
        )
    cases["dictionary<int16,int64,ordered>"] = pa.DictionaryArray.from_arrays(
        pa.array([2, 1, 0, None], pa.int16()), pa.array([10, 20, 30]), ordered=True
    )
    cases["null"] = pa.nulls(4)
    cases["dense_union"] = pa.UnionArray.from_dense(
        pa.array([0, 1, 0, 1], pa.int8()),
        pa.array([0, 0, 1, 1], pa.int32()),
        [pa.array([1, None]), pa.array(["a", "b"])],
        ["i", "s"],
    )
    cases["sparse_union"] = pa.UnionArray.from_sparse(
        pa.array([0, 1, 1, 0], pa.int8()),
        [pa.array([1, 2, None, 4]), pa.array(["a", None, "c", "d"])],
        ["i", "s"],
    )
    cases["run_end_encoded"] = pa.RunEndEncodedArray.from_arrays(
        pa.array([2, 5, 6], pa.int32()), pa.array(["a", None, "b"])
    )
    return cases


TYPE_CASES = _type_cases()


def type_batch(name: str) -> pa.RecordBatch:
    arr = TYPE_CASES[name]
    field = pa.field("c", arr.type, metadata={"field-meta": name})
    schema = pa.schema(
        [field, pa.field("row", pa.int64(), nullable=False)], metadata={"origin": "creditflow"}
    )
    return pa.record_batch([arr, pa.array(range(len(arr)), pa.int64())], schema=schema)


@pytest.mark.parametrize("name", list(TYPE_CASES))
def test_every_arrow_type_round_trips_exactly(name: str, mode: str, buffer_timeout: float) -> None:
    b = type_batch(name)
    # The whole batch, then a slice with a non-zero offset (into every child buffer).
    want = [b, b.slice(1, len(b) - 2)]
    assert_batches_equal(run(want, mode, buffer_timeout), want)


def test_handoff_returns_the_writers_own_batch() -> None:
    b = type_batch("string")
    (got,) = exchange([b], local_handoff=True)
    assert got is b


@pytest.mark.parametrize(
    "name", ["int64", "string", "bool", "struct", "list", "null", "dictionary<int8,string>"]
)
def test_empty_batches_round_trip(name: str, mode: str, buffer_timeout: float) -> None:
    b = type_batch(name)
    want = [b.slice(0, 0), b, b.slice(len(b), 0), b.slice(1, 0)]
    got = run(want, mode, buffer_timeout)
    assert [g.num_rows for g in got] == [w.num_rows for w in want]
    assert_batches_equal(got, want)


def test_nan_payloads_and_negative_zero_keep_their_bits(mode: str, buffer_timeout: float) -> None:
    bits64 = [0x7FF8000000000000, 0x7FF0000000000001, 0xFFF8DEADBEEF0001, 0x8000000000000000, 0]
    bits32 = [0x7FC00000, 0x7F800001, 0xFFC0BEEF, 0x80000000, 0]
    b = pa.record_batch(
        {
            "f64": pa.array(bits64, pa.uint64()).view(pa.float64()),
            "f32": pa.array(bits32, pa.uint32()).view(pa.float32()),
        }
    )
    (got,) = run([b], mode, buffer_timeout)
    assert got.schema == b.schema
    assert got.column("f64").view(pa.uint64()).to_pylist() == bits64
    assert got.column("f32").view(pa.uint32()).to_pylist() == bits32


def test_batch_whose_only_column_is_null_typed(mode: str, buffer_timeout: float) -> None:
    # Its IPC body is empty: zero bytes of buffers.
    want = [pa.record_batch({"n": pa.nulls(3)}), pa.record_batch({"n": pa.nulls(1000)})]
    assert_batches_equal(run(want, mode, buffer_timeout), want)


def test_nulls_everywhere(mode: str, buffer_timeout: float) -> None:
    names = [
        "int32",
        "float64",
        "bool",
        "string",
        "binary_view",
        "list",
        "struct",
        "map",
        "timestamp[us,UTC]",
    ]
    n = 7
    cols = {name: pa.nulls(n, TYPE_CASES[name].type) for name in names}
    cols["dict"] = pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int8()), pa.array(["a"]))
    b = pa.record_batch(cols)
    assert all(c.null_count == n for c in b.columns)
    assert_batches_equal(run([b, b.slice(3)], mode, buffer_timeout), [b, b.slice(3)])


def test_sliced_strings_and_bools_keep_their_offsets(mode: str, buffer_timeout: float) -> None:
    n = 1000
    b = pa.record_batch(
        {
            "s": pa.array([None if i % 7 == 0 else f"s{i}" * (i % 5) for i in range(n)]),
            "ls": pa.array([f"L{i}" for i in range(n)], pa.large_string()),
            "sv": pa.array([f"view-number-{i}-long-enough-not-inline" for i in range(n)], pa.string_view()),
            "b": pa.array([None if i % 11 == 0 else i % 3 == 0 for i in range(n)]),
            "l": pa.array([[i] * (i % 3) for i in range(n)], pa.list_(pa.int64())),
        }
    )
    # Offsets that are not multiples of 8 exercise bit-packed validity and boolean buffers.
    want = [b.slice(3, 10), b.slice(17, 1), b.slice(513, 400), b.slice(999, 1)]
    assert_batches_equal(run(want, mode, buffer_timeout), want)


@pytest.mark.parametrize("index_type", [pa.int8(), pa.int32()], ids=str)
def test_dictionaries_that_change_between_batches(mode: str, buffer_timeout: float, index_type) -> None:
    def dict_batch(indices: list[int | None], values: list[str]) -> pa.RecordBatch:
        arr = pa.DictionaryArray.from_arrays(pa.array(indices, index_type), pa.array(values))
        return pa.record_batch({"d": arr, "n": pa.array(range(len(indices)))})

    want = [
        dict_batch([0, 1, None], ["a", "b"]),
        dict_batch([0, 1, None], ["a", "b"]),  # same dictionary again
        dict_batch([1, 0, 1], ["x", "y"]),  # replacement
        dict_batch([2, 0, 1, 0], ["x", "y", "z"]),  # a superset (delta-able)
        dict_batch([0], ["only"]),  # smaller again
    ]
    got = run(want, mode, buffer_timeout)
    assert_batches_equal(got, want)
    assert [g.column("d").to_pylist() for g in got] == [w.column("d").to_pylist() for w in want]


def test_batch_bigger_than_the_whole_pool_streams_through(mode: str) -> None:
    n = 1 << 20  # 8 MiB of int64 through 4 MiB of network memory
    b = pa.record_batch({"v": pa.array(np.arange(n, dtype=np.int64))})
    assert b.nbytes >= 8 << 20
    small = pa.record_batch({"v": pa.array([1, 2, 3], pa.int64())})
    want = [small, b, small]
    assert_batches_equal(run(want, mode, 0.1, memory="4MiB"), want)


def test_many_tiny_batches(mode: str, buffer_timeout: float) -> None:
    want = [pa.record_batch({"i": pa.array([i], pa.int32()), "s": pa.array([f"r{i}"])}) for i in range(1500)]
    got = run(want, mode, buffer_timeout)
    assert [g.column("i")[0].as_py() for g in got] == list(range(1500))
    assert_batches_equal(got, want)


# ---------------------------------------------------------------------------------------------
# Partitioners and per-channel order
# ---------------------------------------------------------------------------------------------

N_SUB = 4


def seq_batches(count: int, rows: int = 5) -> list[pa.RecordBatch]:
    return [
        pa.record_batch({"seq": pa.array([i] * rows, pa.int64()), "row": pa.array(range(rows), pa.int32())})
        for i in range(count)
    ]


@HANDOFF
def test_round_robin_keeps_per_channel_fifo_order(local_handoff: bool) -> None:
    want = seq_batches(41)
    out = exchange(
        want,
        num_subpartitions=N_SUB,
        partitioner=cf.RoundRobinPartitioner(),
        per_channel=True,
        local_handoff=local_handoff,
        buffer_timeout=0,
    )
    for ch in range(N_SUB):
        assert [b.column("seq")[0].as_py() for b in out[ch]] == list(range(ch, 41, N_SUB))
        assert_batches_equal(out[ch], want[ch::N_SUB])


def test_default_partitioner_is_round_robin() -> None:
    want = seq_batches(8)
    out = exchange(want, num_subpartitions=N_SUB, per_channel=True)
    for ch in range(N_SUB):
        assert_batches_equal(out[ch], want[ch::N_SUB])


@HANDOFF
def test_broadcast_sends_every_batch_to_every_channel_in_order(local_handoff: bool) -> None:
    want = seq_batches(23)
    out = exchange(
        want,
        num_subpartitions=N_SUB,
        partitioner=cf.BroadcastPartitioner(),
        per_channel=True,
        local_handoff=local_handoff,
    )
    for ch in range(N_SUB):
        assert_batches_equal(out[ch], want)


@HANDOFF
def test_forward_sends_everything_to_subpartition_zero(local_handoff: bool) -> None:
    want = seq_batches(9)
    out = exchange(
        want,
        num_subpartitions=2,
        partitioner=cf.ForwardPartitioner(),
        per_channel=True,
        local_handoff=local_handoff,
    )
    assert_batches_equal(out[0], want)
    assert out[1] == []


@HANDOFF
def test_one_gate_over_all_channels_keeps_per_channel_order(local_handoff: bool) -> None:
    want = seq_batches(60)
    got = exchange(
        want, num_subpartitions=N_SUB, partitioner=cf.RoundRobinPartitioner(), local_handoff=local_handoff
    )
    assert sorted(b.column("seq")[0].as_py() for b in got) == list(range(60))
    by_channel = collections.defaultdict(list)
    for b in got:
        seq = b.column("seq")[0].as_py()
        by_channel[seq % N_SUB].append(seq)
    for ch, seqs in by_channel.items():
        assert seqs == sorted(seqs), f"channel {ch} out of order: {seqs}"


# --- Spark's hash, independently in Python ----------------------------------------------------

_M = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M


def _mix_k1(k: int) -> int:
    return (_rotl((k * 0xCC9E2D51) & _M, 15) * 0x1B873593) & _M


def _mix_h1(h: int, k: int) -> int:
    return (_rotl(h ^ k, 13) * 5 + 0xE6546B64) & _M


def _fmix(h: int, length: int) -> int:
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def spark_hash_int(v: int, seed: int) -> int:
    return _fmix(_mix_h1(seed & _M, _mix_k1(v & _M)), 4)


def spark_hash_long(v: int, seed: int) -> int:
    h = _mix_h1(seed & _M, _mix_k1(v & _M))
    h = _mix_h1(h, _mix_k1((v >> 32) & _M))
    return _fmix(h, 8)


def spark_hash_bytes(data: bytes, seed: int) -> int:
    h = seed & _M
    whole = len(data) // 4 * 4
    for (w,) in struct.iter_unpack("<i", data[:whole]):
        h = _mix_h1(h, _mix_k1(w & _M))
    for byte in data[whole:]:
        h = _mix_h1(h, _mix_k1((byte - 256 if byte >= 128 else byte) & _M))
    return _fmix(h, len(data))


def spark_pmod(row: dict, n: int) -> int:
    """``pmod(hash(k, s), n)`` for an int64 column ``k`` and a string column ``s``."""
    h = 42
    if row["k"] is not None:
        h = spark_hash_long(row["k"], h)
    if row["s"] is not None:
        h = spark_hash_bytes(row["s"].encode(), h)
    return h % n  # Python's % is already a non-negative modulo for positive n


def test_python_reference_hash_matches_known_spark_values() -> None:
    # SELECT hash(1), hash(1L), hash(-1L) in Spark SQL.
    assert spark_hash_int(1, 42) == -559580957
    assert spark_hash_long(1, 42) == -1712319331
    assert spark_hash_long(-1, 42) == -939490007


def key_batch(n: int, start: int = 0, value: str = "v") -> pa.RecordBatch:
    ks = [None if i % 17 == 0 else (i * 7919) % 1000 - 500 for i in range(start, start + n)]
    ss = [None if i % 13 == 0 else f"key-{i % 97}-é" for i in range(start, start + n)]
    return pa.record_batch(
        {"k": pa.array(ks, pa.int64()), "s": pa.array(ss), "v": pa.array([f"{value}{i}" for i in range(n)])}
    )


@HANDOFF
def test_hash_partitioner_puts_every_row_exactly_once_where_spark_would(local_handoff: bool) -> None:
    batches = [key_batch(400, start=i * 400) for i in range(6)]
    out = exchange(
        batches,
        num_subpartitions=N_SUB,
        partitioner=cf.HashPartitioner(["k", "s"]),
        per_channel=True,
        local_handoff=local_handoff,
    )
    all_in = [tuple(r.values()) for b in batches for r in b.to_pylist()]
    all_out = [tuple(r.values()) for ch in out for b in ch for r in b.to_pylist()]
    assert collections.Counter(all_out) == collections.Counter(all_in)
    for ch, got in enumerate(out):
        assert got, f"subpartition {ch} got nothing"
        for b in got:
            assert b.schema == batches[0].schema
            for row in b.to_pylist():
                assert spark_pmod(row, N_SUB) == ch, (row, ch)


def test_hash_partitioner_is_consistent_across_batches_and_keeps_row_order() -> None:
    first = key_batch(500, value="first")
    second = key_batch(500, value="second")  # the same keys again, different values
    out = exchange(
        [first, second],
        num_subpartitions=N_SUB,
        partitioner=cf.HashPartitioner("k"),
        per_channel=True,
    )
    where: dict[object, set[int]] = collections.defaultdict(set)
    for ch, got in enumerate(out):
        for b in got:
            for k in b.column("k").to_pylist():
                where[k].add(ch)
    assert all(len(chs) == 1 for chs in where.values()), {k: v for k, v in where.items() if len(v) > 1}
    # Rows of one input batch keep their relative order within each subpartition.
    for got in out:
        values = [v for b in got for v in b.column("v").to_pylist()]
        firsts = [int(v[len("first") :]) for v in values if v.startswith("first")]
        seconds = [int(v[len("second") :]) for v in values if v.startswith("second")]
        assert firsts == sorted(firsts)
        assert seconds == sorted(seconds)
        assert values == [f"first{i}" for i in firsts] + [f"second{i}" for i in seconds]


def test_hash_partitioner_with_all_null_keys_goes_to_seed_partition() -> None:
    b = pa.record_batch({"k": pa.nulls(10, pa.int64()), "s": pa.nulls(10, pa.string())})
    out = exchange([b], num_subpartitions=N_SUB, partitioner=cf.HashPartitioner(["k", "s"]), per_channel=True)
    want_ch = 42 % N_SUB  # hash of nothing but nulls is the seed
    assert [sum(x.num_rows for x in ch) for ch in out] == [10 if i == want_ch else 0 for i in range(N_SUB)]


@HANDOFF
def test_a_gate_over_partitions_of_several_schemas_gives_each_batch_its_own(local_handoff: bool) -> None:
    """The reader's batches alternate between partitions of different schemas, two of them
    equal but for their metadata: each comes out with its own schema and metadata, whichever
    schema the gate gave out last."""
    a = pa.record_batch({"id": pa.array([1, 2, 3], pa.int64())}, metadata={"from": "a"})
    b = pa.record_batch({"name": pa.array(["x", None])}, metadata={"from": "b"})
    c = a.replace_schema_metadata({"from": "c"})
    sources = {"pa": a, "pb": b, "pc": c}
    with cf.NetworkEnvironment(memory="4MiB", local_handoff=local_handoff, buffer_timeout=0) as env:
        parts = {name: env.create_partition(name, 1) for name in sources}
        writers = {name: cf.RecordWriter(part, cf.ForwardPartitioner()) for name, part in parts.items()}
        with env.create_input_gate([cf.ChannelSpec(env.address, name, 0) for name in parts]) as gate:
            for name in ["pa", "pb", "pb", "pa", "pc", "pa", "pc", "pc", "pb"]:
                writers[name].write(sources[name], timeout=20)
                writers[name].flush()
                got = gate.next(timeout=20)
                assert got is not None
                assert got.equals(sources[name], check_metadata=True), (name, got.schema)
            for w in writers.values():
                w.close()
            assert gate.next(timeout=20) is None
