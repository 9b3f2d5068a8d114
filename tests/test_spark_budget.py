"""A training rank's budget for the rows it holds outside its pools (``creditflow.spark._budget``):
the reservation follows the rows' size, a slice is reserved for by what its rows reference, and
the exact count (``nbytes``, 10 µs or more a batch) is taken only when a reservation depends on
it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf
from creditflow.spark._budget import GROWTH, Budget

SEGMENT = 32 * 1024


def batch(rows: int, width: int = 8) -> pa.RecordBatch:
    """``rows`` rows of an int64 key, a nullable double and a string of ``width`` characters."""
    return pa.record_batch(
        {
            "k": pa.array(np.arange(rows)),
            "v": pa.array([None if i % 7 == 0 else float(i) for i in range(rows)]),
            "s": pa.array([f"{i:0{width}d}"[-width:] for i in range(rows)]),
        }
    )


class Counted:
    """A batch that counts how often its exact size (``nbytes``) is asked for."""

    def __init__(self, inner: pa.RecordBatch) -> None:
        self.inner = inner
        self.exact_counts = 0

    @property
    def num_rows(self) -> int:
        return self.inner.num_rows

    def get_total_buffer_size(self) -> int:
        return self.inner.get_total_buffer_size()

    @property
    def nbytes(self) -> int:
        self.exact_counts += 1
        return self.inner.nbytes


@pytest.fixture
def env() -> Iterator[cf.NetworkEnvironment]:
    with cf.NetworkEnvironment(memory="8MiB", segment_size="32KiB") as e:
        yield e


def rounded(n: float) -> int:
    """``n`` bytes rounded up to whole segments, as a reservation holds them."""
    return -(-int(n) // SEGMENT) * SEGMENT


def test_reserves_the_rows_times_their_size(env: cf.NetworkEnvironment) -> None:
    b = batch(10_000)
    budget = Budget(env, 20_000, "rank 0")
    budget.see(b)
    assert budget.row_bytes == pytest.approx(b.nbytes / b.num_rows)
    assert budget.reserved == rounded(20_000 * b.nbytes / b.num_rows)
    assert budget.held_bytes(10_000) == pytest.approx(b.nbytes, abs=16)
    budget.release()
    assert budget.reserved == 0


def test_extra_bytes_are_reserved_with_the_rows(env: cf.NetworkEnvironment) -> None:
    b = batch(10_000)
    budget = Budget(env, 20_000, "rank 0", extra=3 << 20)
    budget.see(b)
    assert budget.reserved == rounded(20_000 * b.nbytes / b.num_rows + (3 << 20))
    assert budget.held_bytes(10_000) == pytest.approx(b.nbytes, abs=16)  # rows only
    budget.release()


def test_a_slice_is_reserved_for_by_what_its_rows_reference(env: cf.NetworkEnvironment) -> None:
    whole = batch(10_000, width=40)
    piece = whole.slice(5_000, 100)
    assert piece.get_total_buffer_size() > 50 * piece.nbytes  # the slice keeps the whole buffers
    budget = Budget(env, 20_000, "rank 0")
    budget.see(piece)
    assert budget.row_bytes == pytest.approx(piece.nbytes / 100)
    assert budget.reserved == rounded(20_000 * piece.nbytes / 100)
    budget.release()


def test_the_exact_size_is_counted_only_when_a_reservation_depends_on_it(env: cf.NetworkEnvironment) -> None:
    budget = Budget(env, 20_000, "rank 0")
    first = Counted(batch(10_000))
    budget.see(cast(pa.RecordBatch, first))
    assert first.exact_counts == 1  # the first reservation
    reserved = budget.reserved
    same = [Counted(batch(10_000)) for _ in range(20)]
    for b in same:
        budget.see(cast(pa.RecordBatch, b))
    assert sum(b.exact_counts for b in same) <= 1  # at most one, for a few bytes of padding
    assert budget.reserved == reserved
    # Rows a little larger (within GROWTH): noted by their buffers, no exact count, no new
    # reservation.
    wider = Counted(batch(10_000, width=9))
    budget.see(cast(pa.RecordBatch, wider))
    assert wider.exact_counts == 0
    assert budget.row_bytes == pytest.approx(wider.inner.get_total_buffer_size() / 10_000)
    assert budget.reserved == reserved
    # Rows that grew past GROWTH: counted exactly and reserved for anew.
    grown = Counted(batch(10_000, width=40))
    size = grown.inner.nbytes / 10_000
    assert size > budget.row_bytes * GROWTH
    budget.see(cast(pa.RecordBatch, grown))
    assert grown.exact_counts == 1
    assert budget.row_bytes == pytest.approx(size)
    assert budget.reserved == rounded(20_000 * size)
    budget.release()


def test_rows_that_do_not_fit_name_the_settings_and_keep_nothing(env: cf.NetworkEnvironment) -> None:
    budget = Budget(env, 10_000_000, "rank 3")
    match = r"rank 3: 10000000 rows of about \d+ bytes.*shuffle_window"
    with pytest.raises(cf.InsufficientBuffersError, match=match):
        budget.see(batch(1_000))
    assert budget.reserved == 0
    assert env.metrics()["segments_available"] == env.metrics()["segments_total"]


def test_an_empty_batch_changes_nothing(env: cf.NetworkEnvironment) -> None:
    budget = Budget(env, 1_000, "rank 0")
    budget.see(batch(0))
    assert (budget.row_bytes, budget.reserved) == (0.0, 0)
