"""The pieces of a training rank that need no Spark: equal steps, moves between ranks,
stripes, the shuffle window, row sets and the state's format."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf
from creditflow.spark._rankstate import RankState, RowSet
from creditflow.spark._reshuffle import (
    DEAL_BYTES,
    MAX_GROUP_CHUNKS,
    deal,
    deal_bytes,
    gather,
    group_rows,
    traffic,
)
from creditflow.spark._runs import ID_COLUMN, Chunks, MovedIn, RunReader, Runs, split_ids, with_ids
from creditflow.spark._steps import full_steps_at_least, moves, plan
from creditflow.spark._stripes import (
    ID_BITS,
    JOIN_BYTES,
    STRIPE_ROWS,
    for_ranks,
    join_bytes,
    partition_row,
    pieces,
    share_ids,
    stripe_cuts,
)
from creditflow.spark._window import Window, permutation


@pytest.mark.parametrize("total", [0, 1, 7, 999, 1000, 1001, 2047, 2048, 2049, 10_007, 123_457])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_steps_are_equal_and_lose_or_repeat_nothing(total: int, world: int, drop_last: bool) -> None:
    batch = 256
    if not drop_last and 0 < total < world:  # fewer rows than ranks: some batch would be empty
        with pytest.raises(ValueError, match="drop_last=True"):
            plan(total, world, batch, drop_last)
        return
    steps = plan(total, world, batch, drop_last)
    sizes = [steps.sizes(r) for r in range(world)]
    assert len({len(s) for s in sizes}) == 1, "every rank yields the same number of batches"
    assert all(1 <= n <= batch for s in sizes for n in s)
    yielded = sum(map(sum, sizes))
    if drop_last:
        assert all(n == batch for s in sizes for n in s)
        assert 0 <= total - yielded <= world * batch - 1
    else:
        assert yielded == total


def test_the_bound_never_exceeds_the_final_full_steps() -> None:
    rng = np.random.default_rng(1)
    for _ in range(2000):
        world, batch = int(rng.integers(1, 6)), int(rng.integers(1, 50))
        total = int(rng.integers(world, 5000))
        known = int(rng.integers(0, total + 1))
        for drop_last in (False, True):
            steps = (
                plan(total, world, batch, drop_last) if drop_last or batch > 1 or total % world == 0 else None
            )
            if steps is None:
                continue
            assert full_steps_at_least(known, world, batch, drop_last) <= steps.full


def layouts(seed: int, most: int) -> Iterator[tuple[list[int], list[int]]]:
    """500 random ranks' row counts (1 to 6 ranks, up to ``most`` rows each) and the rows
    each needs for its steps (random batch sizes, with and without drop_last)."""
    rng = np.random.default_rng(seed)
    for _ in range(500):
        world = int(rng.integers(1, 7))
        counts = [int(x) for x in rng.integers(0, most, world)]
        if sum(counts) < world:
            continue
        steps = plan(sum(counts), world, int(rng.integers(2, 300)), drop_last=bool(rng.integers(2)))
        yield counts, [steps.need(r) for r in range(len(counts))]


def test_moves_give_every_rank_what_it_needs_from_spare_rows_only() -> None:
    for holdings, needs in layouts(2, 3000):
        after = list(holdings)
        for giver, taker, rows in moves(holdings, needs):
            assert rows > 0
            assert giver != taker
            after[giver] -= rows
            after[taker] += rows
        assert all(a >= n for a, n in zip(after, needs, strict=False))
        kept = zip(after, holdings, needs, strict=True)
        assert all(a >= min(h, n) for a, h, n in kept), "a giver keeps what it needs"


def test_stripes_send_every_row_to_one_rank_whatever_the_batches() -> None:
    world, partition, rows = 3, 5, 10 * STRIPE_ROWS + 17
    table = pa.table({"i": np.arange(rows)})
    shares: dict[int, list[int]] = {r: [] for r in range(world)}
    row = 0
    for size in (1, 700, 3000, 4096, rows):  # odd batch boundaries
        chunk = table.slice(row, size).to_batches()
        for b in chunk:
            for rank, piece in pieces(b, row, partition, world):
                shares[rank].extend(piece.column(0).to_pylist())
            row += b.num_rows
        if row >= rows:
            break
    rest = table.slice(row).to_batches()
    for b in rest:
        for rank, piece in pieces(b, row, partition, world):
            shares[rank].extend(piece.column(0).to_pylist())
        row += b.num_rows
    assert sorted(sum(shares.values(), [])) == list(range(rows))
    for rank, got in shares.items():
        ids = share_ids(partition, rank, world, 0, len(got))
        assert (ids >> ID_BITS == partition).all()
        assert ((ids & ((1 << ID_BITS) - 1)) == np.array(got)).all(), "a rank names its rows"
        rows_of = [partition_row(partition, rank, world, i) for i in range(len(got))]
        assert rows_of == got, "a row of a share is found in the partition"
    assert max(map(len, shares.values())) - min(map(len, shares.values())) <= STRIPE_ROWS


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("width", [1, 40, 400])
def test_a_task_joins_a_ranks_stripes_leaving_out_what_it_has(world: int, width: int) -> None:
    """``for_ranks`` gives each rank the rows ``pieces`` gives it, in order, less the first
    ``skip`` of its share, in batches of at most the bytes it asks for (or one stripe piece;
    a rank that asks for none, a stripe piece a batch); with one rank, slices of the input
    (no copy)."""
    partition, rows = 3, 9 * STRIPE_ROWS + 500
    cols = {f"c{j}": np.arange(rows) * (j + 1) for j in range(width)}
    table = pa.table({"i": np.arange(rows), **cols})
    skip = [1500 * (r % 2) for r in range(world)]
    join = [0 if r == 2 else JOIN_BYTES for r in range(world)]  # rank 2 asks for none
    sent = [0] * world
    want: dict[int, list[int]] = {r: [] for r in range(world)}
    got: dict[int, list[int]] = {r: [] for r in range(world)}
    counted = [0] * world
    row = n_pieces = n_out = 0
    for b in table.to_batches(max_chunksize=4000):  # input batches across stripes
        for rank, piece in pieces(b, row, partition, world):
            want[rank].extend(piece.column(0).to_pylist())
            n_pieces += 1
        row_bytes = b.get_total_buffer_size() / b.num_rows
        for rank, out in for_ranks(b, row, partition, skip, sent, join):
            got[rank].extend(out.column(0).to_pylist())
            n_out += 1
            assert out.num_rows * row_bytes <= join[rank] or out.num_rows <= STRIPE_ROWS
            if world == 1:
                assert out.column(0).buffers()[1].address == b.column(0).buffers()[1].address
        row += b.num_rows
    for r in range(world):
        counted[r] = len(want[r])
        assert got[r] == want[r][skip[r] :], f"rank {r}"
    assert sent == counted, "sent counts each rank's share, skipped rows too"
    if width == 1:
        inputs = len(table.to_batches(max_chunksize=4000))
        asked = sum(1 for r in range(world) if join[r])
        assert n_out <= inputs * world + (world - asked) * rows // STRIPE_ROWS, "narrow rows: joined"
    if width == 400 and world > 1:
        assert n_out >= n_pieces - world, "wide rows: a stripe is more than JOIN_BYTES, alone"


def test_what_a_rank_joins_and_deals_is_a_small_share_of_its_memory() -> None:
    for memory in (1 << 20, 8 << 20, 64 << 20, 1 << 30):
        assert join_bytes(memory) == min(JOIN_BYTES, memory // 64)
        assert deal_bytes(memory) == min(DEAL_BYTES, memory // 32)
        assert 3 * (join_bytes(memory) + deal_bytes(memory)) <= memory * 15 // 100


@pytest.mark.parametrize("start", [0, 1, 1023, 1024, 5000])
@pytest.mark.parametrize("rows", [1, 1024, 3000, 8192])
def test_stripe_cuts_cut_a_shares_rows_at_its_stripes(start: int, rows: int) -> None:
    cuts = list(stripe_cuts(start, rows))
    assert [o for o, _ in cuts] == list(np.cumsum([0] + [n for _, n in cuts[:-1]]))
    assert sum(n for _, n in cuts) == rows
    for offset, length in cuts:
        first = start + offset
        assert first // STRIPE_ROWS == (first + length - 1) // STRIPE_ROWS, "within one stripe"
        assert offset == 0 or first % STRIPE_ROWS == 0, "cut at stripe starts"


def test_a_windows_permutation_is_every_row_once_seeded_by_its_generator() -> None:
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    first, again = permutation(a, 10_000), permutation(b, 10_000)
    assert np.array_equal(np.sort(first), np.arange(10_000))
    assert np.array_equal(first, again), "the same generator state, the same order"
    assert not np.array_equal(permutation(a, 10_000), first), "the generator moves on"
    assert len(permutation(a, 0)) == 0
    # Where row 0 lands, over many draws: anywhere about as often (a chi-square bound).
    lands = np.bincount([int(np.flatnonzero(permutation(a, 8) == 0)[0]) for _ in range(8000)], minlength=8)
    assert ((lands - 1000) ** 2 / 1000).sum() < 30, lands


@pytest.mark.parametrize("shuffle", [False, True])
def test_window_yields_every_row_once(shuffle: bool) -> None:
    rng = np.random.default_rng(3) if shuffle else None
    w = Window(1000, rng)
    got: list[int] = []
    n = 0
    for size in [100, 1024, 3, 777, 2000, 1]:
        w.add(pa.record_batch({"x": np.arange(n, n + size)}), np.arange(n, n + size))
        n += size
        while w.full() and len(w) >= 300:
            b, ids = w.take(300)
            assert b.num_rows == 300
            assert (b.column(0).to_numpy() == ids).all()
            got.extend(ids.tolist())
    while len(w):
        b, ids = w.take(300)
        got.extend(ids.tolist())
    assert sorted(got) == list(range(n))
    assert (got != sorted(got)) == shuffle


def test_window_in_order_slices_the_first_piece_when_it_holds_the_batch() -> None:
    w = Window(1000, None)
    pieces = [pa.record_batch({"x": np.arange(n, n + 1024)}) for n in range(0, 4096, 1024)]
    for piece in pieces:
        w.add(piece, piece.column(0).to_numpy())
    first, ids = w.take(1024)  # exactly the first piece
    assert first.column(0).buffers()[1].address == pieces[0].column(0).buffers()[1].address
    inside, _ = w.take(500)  # within the second: a slice of it
    assert inside.column(0).buffers()[1].address == pieces[1].column(0).buffers()[1].address
    spanning, ids = w.take(1000)  # the second's last 524 rows and the third's first 476
    assert ids.tolist() == list(range(1524, 2524))
    assert spanning.column(0).to_numpy().tolist() == ids.tolist()
    assert len(w) == 4096 - 2524
    rest, ids = w.take(2000)
    assert ids.tolist() == list(range(2524, 4096))
    assert rest.column(0).to_numpy().tolist() == ids.tolist()
    assert len(w) == 0


def test_window_in_order_after_take_last_yields_the_front_then_the_pieces() -> None:
    w = Window(1000, None)
    for n in (0, 300, 600):
        w.add(pa.record_batch({"x": np.arange(n, n + 300)}), np.arange(n, n + 300))
    _, moved = w.take_last(200)  # the last 200 go to another rank
    assert moved.tolist() == list(range(700, 900))
    w.add(pa.record_batch({"x": np.arange(900, 1000)}), np.arange(900, 1000))
    got: list[int] = []
    while len(w):
        b, ids = w.take(256)
        assert b.column(0).to_numpy().tolist() == ids.tolist()
        got.extend(ids.tolist())
    assert got == list(range(700)) + list(range(900, 1000))


def test_rowset_ranges_and_state_roundtrip() -> None:
    s = RowSet()
    for part in (np.arange(0, 100), np.arange(200, 250), np.arange(100, 150), np.array([5, 7, 999])):
        s.add(part)
    assert s.to_list() == [[0, 150], [200, 250], [999, 1000]]
    assert s.contains(np.array([0, 149, 150, 199, 200, 999, 1000])).tolist() == [
        True,
        True,
        False,
        False,
        True,
        True,
        False,
    ]
    state = RankState(1, 2, 64, 7, True, False, 3, 0, 5, s, None)
    again = RankState.from_dict(state.to_dict())
    assert again.consumed.to_list() == s.to_list()
    with pytest.raises(ValueError, match="batch_size=32 \\(state: 64\\)"):
        again.check(1, 2, 32, 7, True, False)
    with pytest.raises(ValueError, match="state_dict"):
        RankState.from_dict({"format": 99})


def test_rowset_adds_in_any_order_with_repeats_as_a_set_does() -> None:
    """Shuffled chunks, ids repeated within and across them and over what was merged before;
    enough rows that the set merges what was added several times along the way."""
    rng = np.random.default_rng(11)
    for _ in range(4):
        s, want = RowSet(), set()
        for _ in range(40):
            start = int(rng.integers(0, 300_000))
            chunk = np.arange(start, start + int(rng.integers(1, 9_000)), dtype=np.int64)
            chunk = np.concatenate([chunk, rng.choice(chunk, len(chunk) // 3)])  # repeats
            rng.shuffle(chunk)
            s.add(chunk)
            want.update(chunk.tolist())
        starts, ends = s.ranges()
        assert len(s) == len(want)
        assert (starts[1:] > ends[:-1]).all(), "sorted, disjoint, not touching"
        probe = np.arange(310_000, dtype=np.int64)
        assert s.contains(probe).nonzero()[0].tolist() == sorted(want)


def test_rowset_difference_and_last_match_plain_sets() -> None:
    rng = np.random.default_rng(4)
    for _ in range(300):
        a_ids = np.unique(rng.integers(0, 400, int(rng.integers(0, 200))))
        b_ids = np.unique(rng.integers(0, 400, int(rng.integers(0, 200))))
        a, b = RowSet(), RowSet()
        a.add(a_ids)
        b.add(b_ids)
        want = sorted(set(a_ids.tolist()) - set(b_ids.tolist()))
        got = a.without(b)
        assert got.contains(np.arange(400)).nonzero()[0].tolist() == want
        k = int(rng.integers(0, 250))
        want_last = sorted(a_ids.tolist())[len(a_ids) - min(k, len(a_ids)) :]
        assert a.last(k).contains(np.arange(400)).nonzero()[0].tolist() == want_last


def test_rowset_overlaps_matches_a_plain_set() -> None:
    rng = np.random.default_rng(9)
    for _ in range(200):
        ids = np.unique(rng.integers(0, 300, int(rng.integers(0, 80))))
        s = RowSet()
        s.add(ids)
        lo = int(rng.integers(0, 320))
        hi = lo + int(rng.integers(0, 40))
        assert s.overlaps(lo, hi) == any(lo <= i <= hi for i in ids.tolist()), (ids, lo, hi)


def test_a_reader_leaves_out_exactly_the_skipped_ids_in_any_order() -> None:
    """Moved-in rows come by giver, so a chunk's ids need not ascend: the rows whose ids are in
    ``skip`` and only those are left out, whether a chunk holds some (between its first and
    last ids or not), none, or none between skipped ids on either side of its own."""
    first = np.arange(1024, dtype=np.int64)
    first[500] = 50_000  # skipped, outside the span of the chunk's first and last ids
    between = np.arange(70_000, 72_048, 2, dtype=np.int64)  # 71_001 is skipped: none of these
    shuffled = np.random.default_rng(11).permutation(np.arange(100_000, 120_000, 2, dtype=np.int64))
    skip = RowSet()
    skip.add(np.array([50_000, 71_001], dtype=np.int64))
    skip.add(shuffled[:300])
    ids = np.concatenate([first, between, shuffled])
    with cf.NetworkEnvironment(memory="16MiB") as env:
        store = MovedIn(env)
        for start in range(0, len(ids), 1024):
            part = ids[start : start + 1024]
            store.put(with_ids(pa.record_batch({"x": part}), part))
        store.end()
        got = list(store.read(10).chunks(skip))
        store.release()
    assert all((b.column(0).to_numpy() == i).all() for b, i in got)
    kept = np.concatenate([i for _, i in got])
    gone = {50_000, *shuffled[:300].tolist()}
    assert kept.tolist() == [x for x in ids.tolist() if x not in gone]


class CountingRuns(Runs):
    """Runs that count the chunks their readers hand out."""

    chunks_read = 0

    def read(self, run: int, timeout: float | None) -> RunReader:
        reader = super().read(run, timeout)
        plain = reader.chunks

        def counted(skip: RowSet | None = None) -> Chunks:
            for chunk in plain(skip):
                self.chunks_read += 1
                yield chunk

        reader.chunks = counted  # type: ignore[method-assign]
        return reader


def test_runs_select_gives_the_wanted_rows_and_reads_a_run_only_to_its_last() -> None:
    with cf.NetworkEnvironment(memory="16MiB") as env:
        runs = CountingRuns(env, 3, 0, 2)
        for run in range(3):
            for start in range(0, 10 * STRIPE_ROWS, 2_000):  # batches across stripe bounds
                ids = runs.ids(run, start, 2_000)
                runs.put(run, pa.record_batch({"id": pa.array(ids)}))
        runs.end()
        wanted = RowSet()
        want = np.concatenate(
            [
                runs.ids(0, 5, 10),  # early in run 0: the rest of run 0 is not read
                runs.ids(2, 3 * STRIPE_ROWS - 7, 20),  # across a stripe bound of run 2
                runs.ids(2, 6 * STRIPE_ROWS, 1),
            ]
        )
        wanted.add(want)
        got = list(runs.select(wanted, timeout=10))
        got_ids = np.concatenate([ids for _, ids in got])
        assert got_ids.tolist() == want.tolist()
        for batch, ids in got:
            assert batch.column("id").to_numpy().tolist() == ids.tolist()
        # Each run with a wanted row up to the first chunk past it (of 20 a run): run 0 its
        # first two, run 1 none, run 2 its first eight.
        assert runs.chunks_read == 2 + 8
        runs.release()


def test_traffic_gives_every_rank_what_it_needs_from_every_rank() -> None:
    """Every rank sends all of its home and every rank gets exactly its need; each rank's
    home is spread over every rank in proportion (within a row of rounding)."""
    for homes, needs in layouts(5, 5000):
        world, total = len(homes), sum(homes)
        out = traffic(homes, needs)
        assert all(x >= 0 for row in out for x in row)
        assert [sum(row) for row in out] == homes, "every row of a home is sent or left out"
        assert [sum(out[s][d] for s in range(world)) for d in range(world)] == needs
        for s in range(world):
            for d in range(world):
                assert abs(out[s][d] - homes[s] * needs[d] / total) < world + 1


def test_deal_sends_each_rank_its_quota_in_a_seeded_order() -> None:
    chunks = [
        (pa.record_batch({"x": np.arange(i, i + n)}), np.arange(i, i + n))
        for i, n in ((0, 1024), (1024, 1024), (2048, 300), (2348, 1024), (3372, 5))
    ]
    total = 3377

    def dealt(seed: int, quotas: list[int]) -> dict[int, list[int]]:
        got: dict[int, list[int]] = {}

        def write(d: int, b: pa.RecordBatch) -> None:
            rows, ids = split_ids(b)
            assert (rows.column(0).to_numpy() == ids).all(), "rows travel with their ids"
            got.setdefault(d, []).extend(ids.tolist())

        deal(iter(chunks), quotas, np.random.default_rng(seed), write)
        return got

    quotas = [1200, 1000, 1077, 100]  # three ranks and 100 rows left out
    a, b, c = dealt(1, quotas), dealt(1, quotas), dealt(2, quotas)
    assert a == b, "the same seed deals the same"
    assert a != c
    assert [len(a[d]) for d in range(3)] == quotas[:3]
    sent = sorted(x for d in range(3) for x in a[d])
    assert len(set(sent)) == len(sent) == total - 100
    with pytest.raises(ValueError, match="fewer"):
        deal(iter(chunks[:1]), quotas, np.random.default_rng(1), lambda d, b: None)


def _numbered_chunks(sizes: list[int], start: int = 0) -> list[tuple[pa.RecordBatch, np.ndarray]]:
    """Chunks of ``sizes`` rows whose one column ``x`` is each row's id, ids counting up
    from ``start``."""
    starts = start + np.cumsum([0, *sizes])
    return [
        (pa.record_batch({"x": np.arange(a, a + n)}), np.arange(a, a + n))
        for a, n in zip(starts.tolist(), sizes, strict=False)
    ]


@pytest.mark.parametrize("group_chunks", [2, 3, 8])
def test_deal_joins_a_ranks_pieces_in_order_into_batches_of_at_most_the_group(group_chunks: int) -> None:
    chunks = _numbered_chunks([1024] * 30 + [300, 1024, 17, 1024, 700])
    quotas = [9000, 12_000, 12_712, 73]  # three ranks and 73 rows left out
    group = group_chunks * STRIPE_ROWS

    def dealt(group: int) -> tuple[dict[int, list[int]], list[int]]:
        got: dict[int, list[int]] = {}
        sizes: list[int] = []

        def write(d: int, b: pa.RecordBatch) -> None:
            rows, ids = split_ids(b)
            assert (rows.column(0).to_numpy() == ids).all(), "rows travel with their ids"
            got.setdefault(d, []).extend(ids.tolist())
            sizes.append(b.num_rows)

        deal(iter(chunks), quotas, np.random.default_rng(3), write, group)
        return got, sizes

    one, one_sizes = dealt(STRIPE_ROWS)
    joined, joined_sizes = dealt(group)
    assert joined == one, "joining changes neither where a row goes nor its place"
    assert max(one_sizes) <= STRIPE_ROWS, "one chunk a batch: each piece on its own"
    assert max(joined_sizes) <= group
    assert len(joined_sizes) < len(one_sizes) / (group_chunks - 0.5) + 3


def test_deal_sends_a_ranks_last_rows_once_its_quota_is_full() -> None:
    chunks = _numbered_chunks([1024] * 13)
    pulled = [0]

    def counted() -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
        for chunk in chunks:
            pulled[0] += 1
            yield chunk

    writes: list[tuple[int, int, int]] = []  # (rank, chunks pulled then, last id)

    def write(d: int, b: pa.RecordBatch) -> None:
        writes.append((d, pulled[0], int(split_ids(b)[1][-1])))

    deal(counted(), [3 * 1024, 10 * 1024, 0], np.random.default_rng(4), write, 8 * STRIPE_ROWS)
    (rank0,) = [w for w in writes if w[0] == 0]  # 3 chunks, fewer than a group: one batch
    last_chunk = rank0[2] // 1024
    assert last_chunk < 12, "the seed gives rank 0 a chunk before the last"
    assert rank0[1] == last_chunk + 1, "sent with the chunk that filled its quota, not at the end"


@pytest.mark.parametrize("world", [1, 2, 4, 8, 64])
@pytest.mark.parametrize("row_bytes", [8.0, 48.0, 500.0, 4096.0])
def test_a_dealt_batch_is_whole_chunks_within_the_deals_bytes(world: int, row_bytes: float) -> None:
    rows = group_rows(world, row_bytes)
    assert group_rows(world, row_bytes, deal_bytes(8 << 20)) <= rows, "less memory, smaller"
    assert rows % STRIPE_ROWS == 0
    assert STRIPE_ROWS <= rows <= MAX_GROUP_CHUNKS * STRIPE_ROWS
    if rows > STRIPE_ROWS:
        assert world * rows * row_bytes <= DEAL_BYTES
    if rows < MAX_GROUP_CHUNKS * STRIPE_ROWS:
        assert world * (rows + STRIPE_ROWS) * row_bytes > DEAL_BYTES, "as many chunks as fit"


class _Dealt:
    """A gate of the batches one rank dealt this one (``with_ids`` batches), then the end."""

    def __init__(self, batches: list[pa.RecordBatch]) -> None:
        self._batches = list(batches)
        self.closed = False

    def next(self, timeout: float | None = None) -> pa.RecordBatch | None:
        return self._batches.pop(0) if self._batches else None

    def close(self) -> None:
        self.closed = True


def _dealt_batches(start: int, sizes: list[int]) -> list[pa.RecordBatch]:
    """Batches as a rank deals them (``with_ids``) of ``sizes`` rows, ids from ``start``."""
    return [with_ids(b, ids) for b, ids in _numbered_chunks(sizes, start)]


def test_gather_cuts_the_dealt_batches_into_chunks_interleaving_the_sources() -> None:
    sent = [[8192, 300, 3000], [1024, 7000, 5]]
    sources = [_dealt_batches(s * 100_000, sizes) for s, sizes in enumerate(sent)]

    def gathered(seed: int) -> tuple[list[tuple[int, np.ndarray]], list[_Dealt]]:
        gates = [_Dealt(b) for b in sources]
        out = []
        for rows, ids in gather(gates, [sum(x) for x in sent], np.random.default_rng(seed), None, 0):  # type: ignore[arg-type]
            assert (rows.column(0).to_numpy() == ids).all(), "rows with their ids"
            assert ID_COLUMN not in rows.schema.names
            out.append((int(ids[0]) // 100_000, ids))
        return out, gates

    out, gates = gathered(5)
    assert all(g.closed for g in gates)
    assert max(len(ids) for _, ids in out) == STRIPE_ROWS
    for s, sizes in enumerate(sent):
        mine = np.concatenate([ids for src, ids in out if src == s])
        assert np.array_equal(mine, s * 100_000 + np.arange(sum(sizes))), "each source's rows in its order"
    first = [i for i, (src, ids) in enumerate(out) if src == 0 and ids[0] < 8192]
    assert first[-1] - first[0] + 1 > len(first), "the other source's chunks come between a batch's"
    assert [ids.tolist() for _, ids in gathered(5)[0]] == [ids.tolist() for _, ids in out], "seeded"


def test_gather_fails_naming_a_rank_that_deals_other_rows_than_it_should() -> None:
    def run(batches: list[pa.RecordBatch], expect: int) -> None:
        for _ in gather([_Dealt(batches)], [expect], np.random.default_rng(1), None, 2):  # type: ignore[list-item]
            pass

    with pytest.raises(cf.ProducerFailedError, match="rank 2: rank 0 dealt other rows"):
        run(_dealt_batches(0, [2048]), 2000)  # a batch of more rows than are still to come
    with pytest.raises(cf.ProducerFailedError, match="rank 2: rank 0 dealt other rows"):
        run(_dealt_batches(0, [1024]), 2000)  # ended early
    with pytest.raises(cf.ProducerFailedError, match="rank 0 dealt more rows"):
        run(_dealt_batches(0, [1024, 5]), 1024)
