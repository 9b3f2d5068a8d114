"""How an exchange's writer merges small input batches before splitting them
(``creditflow.spark._merge.merged``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from creditflow.spark._merge import merged


def numbered(sizes: list[int]) -> list[pa.RecordBatch]:
    """One batch per size; column ``src`` names the batch, ``row`` numbers all rows in order."""
    out, start = [], 0
    for i, n in enumerate(sizes):
        rows = np.arange(start, start + n, dtype=np.int64)
        out.append(pa.record_batch({"src": pa.array(np.full(n, i, dtype=np.int64)), "row": rows}))
        start += n
    return out


def sources(batch: pa.RecordBatch) -> list[int]:
    """The input batches a merged batch was made of, in order."""
    return sorted(set(batch.column("src").to_pylist()))


def test_batches_with_enough_rows_pass_as_they_are() -> None:
    batches = numbered([5000, 2048, 10_000])
    out = list(merged(batches, 2048, 1 << 30))
    assert len(out) == 3
    assert all(o is b for o, b in zip(out, batches, strict=True))


@pytest.mark.parametrize("seed", range(8))
def test_small_batches_merge_in_order_into_writes_just_large_enough(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = [int(n) for n in rng.integers(0, 700, 200)]
    sizes[17] = 5000  # a large batch among small ones
    batches = numbered(sizes)
    min_rows, max_bytes = 2048, 1 << 30
    out = list(merged(batches, min_rows, max_bytes))
    # Nothing lost, repeated or reordered.
    got = pa.Table.from_batches(out).column("row").to_pylist()
    assert got == list(range(sum(sizes)))
    nonempty = [b for b in out if b.num_rows]
    assert len(nonempty) < len([n for n in sizes if n]) / 2, "small batches were merged"
    for i, b in enumerate(out):
        srcs = sources(b)
        if 17 in srcs:
            assert b is batches[17], "a large batch passes alone, not copied"
            continue
        if srcs:
            # Just large enough: without its last input the write would be too small.
            assert sum(sizes[s] for s in srcs[:-1]) < min_rows
        last = i == len(out) - 1
        before_large = i + 1 < len(out) and sources(out[i + 1]) == [17]
        if not last and not before_large:
            assert b.num_rows >= min_rows


def test_merged_writes_stop_at_the_byte_bound() -> None:
    batches = numbered([100] * 50)  # 1,600 bytes of buffers each
    each = batches[0].get_total_buffer_size()
    out = list(merged(batches, 1_000_000, 5 * each))
    assert [b.num_rows for b in out] == [500] * 10
    assert all(b.get_total_buffer_size() <= 5 * each for b in out)


def test_what_is_held_at_the_end_comes_as_one_batch() -> None:
    batches = numbered([10, 20, 30])
    out = list(merged(batches, 1000, 1 << 30))
    assert len(out) == 1
    assert out[0].column("row").to_pylist() == list(range(60))
    assert list(merged([], 1000, 1 << 30)) == []
    (alone,) = list(merged(batches[:1], 1000, 1 << 30))
    assert alone is batches[0], "a batch held alone is not copied"


def test_a_large_batch_after_small_ones_is_not_copied() -> None:
    batches = numbered([300, 400, 5000, 200])
    out = list(merged(batches, 2048, 1 << 30))
    assert [sources(b) for b in out] == [[0, 1], [2], [3]]
    assert out[1] is batches[2]


def test_batches_merge_the_same_without_pyarrow_s_concat_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = numbered([10, 20, 30])
    batches = [b.replace_schema_metadata({"origin": "spark"}) for b in batches]
    with_it = list(merged(batches, 1000, 1 << 30))
    monkeypatch.delattr(pa, "concat_batches", raising=False)  # pyarrow before 19
    without = list(merged(batches, 1000, 1 << 30))
    assert len(without) == len(with_it) == 1
    assert without[0].equals(with_it[0], check_metadata=True)
    assert without[0].schema.metadata == {b"origin": b"spark"}
