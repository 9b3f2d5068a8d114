"""The points at which a retry's rows are checked against those a receiver has before it
continues a partition (``creditflow.spark._resume``), without a receiver."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from creditflow.spark._resume import Points, Trail, mismatch, samples_in


def test_the_sampled_rows_are_row_0_and_the_powers_of_two_in_any_range() -> None:
    rng = np.random.default_rng(3)
    for _ in range(2000):
        start, count = int(rng.integers(0, 5000)), int(rng.integers(0, 3000))
        want = [r for r in range(start, start + count) if r & (r - 1) == 0]
        assert list(samples_in(start, count)) == want, (start, count)


def batches(values: np.ndarray, size: int) -> list[pa.RecordBatch]:
    table = pa.table({"x": values, "s": [f"row {v}" for v in values]})
    return table.to_batches(max_chunksize=size)


def trail_of(values: np.ndarray, size: int) -> Trail:
    """A receiver's trail of ``values`` received in batches of ``size`` rows by one reader,
    which then stopped."""
    trail, start = Trail(), 0
    for b in batches(values, size):
        trail.see(b, start)
        start += b.num_rows
    trail.end(b, start)
    return trail


def sent_by(values: np.ndarray, size: int, skip: int) -> list[list[object]]:
    """What a retry that computes ``values`` in batches of ``size`` sends after ``skip`` rows."""
    points, start = Points(skip), 0
    for b in batches(values, size):
        due = points.see(b, start)
        if due is not None:
            return due
        start += b.num_rows
    raise AssertionError("the retry never reached the rows the receiver has")


@pytest.mark.parametrize("skip", [1, 2, 3, 1000, 1024, 4097])
def test_the_same_rows_pass_whatever_the_batches(skip: int) -> None:
    values = np.arange(10_000)
    expected = trail_of(values[:skip], 700).expected()
    assert mismatch(expected, sent_by(values, 333, skip)) is None
    assert len(expected) <= skip.bit_length() + 2, "a digest a point, not a row"


def test_rows_moved_before_the_last_one_are_found_at_the_first_point_they_move() -> None:
    values = np.arange(10_000)
    skip = 5000
    expected = trail_of(values[:skip], 1000).expected()
    moved = values.copy()
    moved[[64, 65]] = moved[[65, 64]]  # row 64, a point, moves; the last row stays in place
    assert mismatch(expected, sent_by(moved, 1000, skip)) == 64
    other = values.copy()
    other[skip - 1] = -1  # the last row the receiver has
    assert mismatch(expected, sent_by(other, 1000, skip)) == skip - 1


def test_a_retry_that_sends_other_points_does_not_pass() -> None:
    values = np.arange(100)
    expected = trail_of(values[:50], 10).expected()
    sent = sent_by(values, 10, 50)
    assert mismatch(expected, sent[:-1]) == 49, "a point missing"
    assert mismatch(expected, [*sent, [99, "x"]]) == 99, "a point too many"
