"""The shuffle across ranks (``shuffle="global"``): in every epoch after the first, the ranks'
homes (:mod:`creditflow.spark._home`) are dealt out again, chunk by chunk, so that a row
lands on a rank chosen at random every epoch, seeded by ``(seed, epoch)``.

* :func:`traffic` says how many rows each rank sends each rank (and leaves out, with
  ``drop_last``): every rank then gets exactly the rows its steps need; the same answer on
  every rank, from the homes' sizes alone.
* :func:`deal` (the sending side, a thread of each rank) reads its home in its seeded order and
  sends each chunk, or a piece of it, to a rank drawn at random in proportion to what that
  rank has still to get from it, over a hybrid partition with one subpartition per rank: the
  writer never waits for a slow reader (what is not read yet spills), so ranks that read in
  their own order never wait on each other in a cycle.
* :class:`Gathering` (the receiving side) drains every rank's subpartition for it as the
  rows come, into a hybrid partition of its own with one subpartition per source (what the
  consumer has not read yet spills), and :func:`gather` reads those back in the consumer's
  thread, drawing the next source at random in proportion to the rows still to come from
  it: an order that depends only on (seed, epoch) and the rows, so a resumed epoch repeats
  it. Draining first matters: a rank that read the sources' partitions in its own order
  would leave the others' channels full, and the segments they pin in a source's pool are
  the ones that source's own reading needs (two ranks each waiting on its own deal, each
  deal starved by the other's full channel).

A pass is one reading of an epoch: a rank that starts epoch ``e`` for the ``n``-th time asks
every rank for pass ``(e, n)`` (:func:`pass_id` names its partitions), and every rank of a job
runs the same epochs (as DDP does).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa

import creditflow as cf
from creditflow.spark._runs import Chunks, split_ids, with_ids
from creditflow.spark._stripes import STRIPE_ROWS
from creditflow.spark._window import one_batch

#: Bytes a rank's deal holds back at most, pieces for the other ranks joined into batches
#: (each batch costs every step it passes through about as much as a chunk's rows do); its
#: gathering holds as much of the others' batches while it cuts them into chunks. A rank
#: with less than 32 times as much ``memory`` holds a 32nd of it (:func:`deal_bytes`).
DEAL_BYTES = 1 << 20
#: Chunks joined into one dealt batch at most.
MAX_GROUP_CHUNKS = 8


def deal_bytes(memory: int) -> int:
    """What a rank with ``memory`` bytes holds back of its deal at most."""
    return min(DEAL_BYTES, memory // 32)


def group_rows(world: int, row_bytes: float, limit: int = DEAL_BYTES) -> int:
    """Rows a dealt batch holds at most: whole chunks, as many as ``limit`` bytes allow for
    ``world`` ranks at ``row_bytes`` a row (at least one, at most :data:`MAX_GROUP_CHUNKS`)."""
    chunks = int(limit // (max(world, 1) * max(row_bytes, 1.0) * STRIPE_ROWS))
    return max(1, min(MAX_GROUP_CHUNKS, chunks)) * STRIPE_ROWS


def traffic(homes: list[int], needs: list[int]) -> list[list[int]]:
    """``out[s][d]``: rows rank ``s`` sends rank ``d`` (``d == len(homes)``: rows it leaves
    out), each rank's share of every destination in proportion to its home's size, rounded
    so that rank ``s`` sends ``homes[s]`` rows in all and rank ``d`` gets ``needs[d]``."""
    world, total = len(homes), sum(homes)
    cols = [*needs, total - sum(needs)]
    if cols[-1] < 0:
        raise ValueError(f"the ranks need {sum(needs)} rows but hold {total}")
    if total == 0:
        return [[0] * (world + 1) for _ in range(world)]
    out = [[h * c // total for c in cols] for h in homes]
    row_left = [h - sum(row) for h, row in zip(homes, out, strict=True)]
    col_left = [c - sum(out[s][d] for s in range(world)) for d, c in enumerate(cols)]
    for s in range(world):
        # Largest remainders first; every row short of its sum takes from columns still short.
        order = sorted(range(world + 1), key=lambda d: (-(homes[s] * cols[d] % total), d))
        while row_left[s]:
            d = next(d for d in order if col_left[d] > 0)
            k = min(row_left[s], col_left[d])
            out[s][d] += k
            row_left[s] -= k
            col_left[d] -= k
    return out


def pass_id(job: str, source: int, epoch: int, n: int) -> str:
    """The partition rank ``source`` deals pass ``(epoch, n)`` of a job into."""
    return f"cf-rank-deal/{job}/{source}/{epoch}/{n}"


def _draw(rng: np.random.Generator, left: list[int]) -> int:
    """An index drawn in proportion to ``left`` (a few ranks: plain Python beats NumPy)."""
    x = int(rng.integers(sum(left)))
    for i, n in enumerate(left):
        if x < n:
            return i
        x -= n
    raise AssertionError("x < sum(left)")


def deal(
    chunks: Iterator[tuple[pa.RecordBatch, np.ndarray]],
    quotas: list[int],
    rng: np.random.Generator,
    write: Callable[[int, pa.RecordBatch], None],
    group: int = STRIPE_ROWS,
) -> None:
    """Sends the rows of ``chunks`` to the ranks: ``quotas[d]`` rows to rank ``d`` (the last
    entry: rows left out), each chunk or piece of one to a rank drawn in proportion to its
    quota left; ``write(d, batch)`` sends a batch with its ids: the pieces for one rank, in
    order, joined into batches of at most ``group`` rows (a longer piece alone; with the
    default, one chunk, each piece at once). Raises ValueError when the chunks hold other
    than ``sum(quotas)`` rows."""
    left = list(quotas)
    drop = len(quotas) - 1
    pending: list[list[pa.RecordBatch]] = [[] for _ in range(drop)]
    held = [0] * drop

    def send(d: int) -> None:
        if pending[d]:
            write(d, one_batch(pending[d]))
            pending[d], held[d] = [], 0

    for batch, ids in chunks:
        offset = 0
        while offset < len(ids):
            if not any(left):
                raise ValueError(f"more rows than the {sum(quotas)} to deal")
            d = _draw(rng, left)
            k = min(left[d], len(ids) - offset)
            if d != drop:
                if held[d] + k > group:
                    send(d)
                pending[d].append(with_ids(batch.slice(offset, k), ids[offset : offset + k]))
                held[d] += k
            left[d] -= k
            offset += k
            if d != drop and (held[d] + STRIPE_ROWS > group or not left[d]):
                send(d)
    if any(left):
        raise ValueError(f"{sum(left)} rows fewer than the {sum(quotas)} to deal")
    for d in range(drop):
        send(d)


def gather(
    gates: list[cf.InputGate],
    expect: list[int],
    rng: np.random.Generator,
    timeout: float | None,
    rank: int,
) -> Chunks:
    """The rows dealt to this rank: ``expect[s]`` from ``gates[s]`` (rank ``s``'s
    subpartition for it), the next :data:`STRIPE_ROWS` rows (or fewer: the rest of a dealt
    batch) from a source drawn in proportion to the rows still to come from it. Raises
    :class:`creditflow.ProducerFailedError` naming a rank that sends other than it should."""
    left = list(expect)
    none = np.empty(0, dtype=np.int64)
    # Per source: the dealt batch being cut into chunks, its ids, and the rows taken.
    batches: list[pa.RecordBatch | None] = [None] * len(gates)
    ids_of = [none] * len(gates)
    at = [0] * len(gates)
    try:
        while any(left):
            s = _draw(rng, left)
            if batches[s] is None:
                batches[s], ids_of[s] = _next_dealt(gates[s], left[s], timeout, rank, s)
                at[s] = 0
            rows, ids, a = batches[s], ids_of[s], at[s]
            assert rows is not None
            k = min(STRIPE_ROWS, len(ids) - a)
            at[s] = a + k
            left[s] -= k
            if at[s] == len(ids):  # cut: held no longer than its chunks
                batches[s], ids_of[s] = None, none
            yield (rows if k == len(ids) else rows.slice(a, k)), ids[a : a + k]
        for s, gate in enumerate(gates):
            if gate.next(timeout=timeout) is not None:
                raise cf.ProducerFailedError(f"rank {rank}: rank {s} dealt more rows than it should")
    finally:
        for gate in gates:
            gate.close()


def _next_dealt(
    gate: cf.InputGate, left: int, timeout: float | None, rank: int, source: int
) -> tuple[pa.RecordBatch, np.ndarray]:
    """The next batch rank ``source`` dealt (``left`` rows still to come) and its ids."""
    try:
        got = gate.next(timeout=timeout)
    except (cf.ConnectionLostError, cf.ProducerFailedError) as exc:
        raise cf.ProducerFailedError(f"rank {rank}: rank {source} failed while dealing: {exc}") from exc
    if got is None or not 0 < got.num_rows <= left:
        n = 0 if got is None else got.num_rows
        raise cf.ProducerFailedError(
            f"rank {rank}: rank {source} dealt other rows than it should ({n} more, {left} expected)"
        )
    return split_ids(got)


class Gathering:
    """The rows the ranks deal this one in one pass, drained from ``sources`` (channel ``s``:
    rank ``s``'s subpartition for this rank) into a hybrid partition of ``env`` as they
    come, one subpartition per source; ``drained`` is called once every source ended (the
    ranks may then let go of their deals)."""

    def __init__(
        self,
        env: cf.NetworkEnvironment,
        sources: list[cf.ChannelSpec],
        rank: int,
        drained: Callable[[], None] = lambda: None,
    ) -> None:
        self._env = env
        self._rank = rank
        self._drained = drained
        self._sources = len(sources)
        self._part = env.create_partition(
            f"cf-rank-gather/{uuid.uuid4().hex[:12]}", len(sources), kind="hybrid"
        )
        self._writer = cf.RecordWriter(self._part, cf.ForwardPartitioner())
        self._gate = env.create_input_gate(sources)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="creditflow-rank-gather", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while not self._closed.is_set():
                try:
                    item = self._gate.next_item(timeout=1.0)
                except cf.TimeoutError:
                    continue
                if item is None:
                    self._writer.close()
                    break
                if isinstance(item, cf.Batch):
                    self._writer.write(item.batch, subpartition=item.channel)
            else:
                return  # closed before the end
        except Exception as exc:
            if not self._closed.is_set():
                self._writer.fail(
                    f"rank {self._rank}: a rank failed while dealing: {type(exc).__name__}: {exc}"
                )
            return
        self._drained()

    def chunks(self, expect: list[int], rng: np.random.Generator, timeout: float | None) -> Chunks:
        """The rows, ``expect[s]`` from rank ``s``, in ``rng``'s interleaving (:func:`gather`)."""
        gates = [
            self._env.create_input_gate([cf.ChannelSpec(self._env.address, self._part.id, s)])
            for s in range(self._sources)
        ]
        return gather(gates, expect, rng, timeout, self._rank)

    def close(self) -> None:
        """Stops draining and drops what is left."""
        self._closed.set()
        self._gate.close()
        self._thread.join(timeout=10)
        self._part.release()
