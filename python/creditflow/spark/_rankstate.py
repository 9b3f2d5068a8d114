"""A rank's position, as ``Receiver.state_dict()`` returns it and ``Receiver(state=...)`` takes
it back: plain lists and numbers (``torch.save``, JSON), sets of row ids as ranges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: The format of :meth:`RankState.to_dict`.
FORMAT = 1


class RowSet:
    """Row ids as sorted, disjoint ``[start, end)`` ranges; adding is cheap (merged lazily)."""

    def __init__(self, starts: np.ndarray | None = None, ends: np.ndarray | None = None) -> None:
        self._starts = np.empty(0, dtype=np.int64) if starts is None else starts
        self._ends = np.empty(0, dtype=np.int64) if ends is None else ends
        self._added: list[np.ndarray] = []
        self._added_rows = 0

    def add(self, ids: np.ndarray) -> None:
        """Adds ``ids``."""
        if len(ids):
            self._added.append(ids)
            self._added_rows += len(ids)
            if self._added_rows > 1 << 16:
                self._merge()

    def _merge(self) -> None:
        if not self._added:
            return
        ids = np.concatenate(self._added)
        self._added, self._added_rows = [], 0
        # Sorted; an id added twice makes overlapping ranges, merged below. Not ``np.unique``:
        # NumPy 2.3 and later find unique values with a hash table, 13-19 ms for 65,536 ids
        # where a sort takes 0.5 ms, and a rank adds every row it yields.
        ids.sort()
        breaks = np.flatnonzero(np.diff(ids) != 1) + 1
        starts = np.concatenate([self._starts, ids[np.r_[0, breaks]]])
        ends = np.concatenate([self._ends, ids[np.r_[breaks - 1, len(ids) - 1]] + 1])
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        # Merge touching or overlapping ranges.
        reach = np.maximum.accumulate(ends)
        new = np.r_[True, starts[1:] > reach[:-1]]
        self._starts = starts[new]
        self._ends = np.maximum.reduceat(ends, np.flatnonzero(new)) if len(ends) else ends

    def ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """The ranges' starts and ends."""
        self._merge()
        return self._starts, self._ends

    def __len__(self) -> int:
        starts, ends = self.ranges()
        return int((ends - starts).sum())

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """A mask: which of ``ids`` are in the set."""
        starts, ends = self.ranges()
        if not len(starts):
            return np.zeros(len(ids), dtype=bool)
        at = np.searchsorted(starts, ids, side="right") - 1
        return (at >= 0) & (ids < ends[np.maximum(at, 0)])

    def overlaps(self, lo: int, hi: int) -> bool:
        """Whether an id from ``lo`` to ``hi`` (both included) is in the set."""
        starts, ends = self.ranges()
        at = int(np.searchsorted(starts, hi, side="right")) - 1
        return at >= 0 and int(ends[at]) > lo

    def union(self, other: RowSet) -> RowSet:
        """Both sets' ids."""
        out = RowSet(*self.ranges())
        starts, ends = other.ranges()
        for s, e in zip(starts.tolist(), ends.tolist(), strict=False):
            out.add(np.arange(s, e, dtype=np.int64))
        return out

    def without(self, other: RowSet) -> RowSet:
        """The ids of this set that are not in ``other``."""
        a_starts, a_ends = self.ranges()
        b_starts, b_ends = other.ranges()
        b_s, b_e = b_starts.tolist(), b_ends.tolist()
        out_s: list[int] = []
        out_e: list[int] = []
        j = 0
        for s, e in zip(a_starts.tolist(), a_ends.tolist(), strict=True):
            cur = s
            while j < len(b_s) and b_e[j] <= cur:
                j += 1
            k = j
            while k < len(b_s) and b_s[k] < e:
                if b_s[k] > cur:
                    out_s.append(cur)
                    out_e.append(b_s[k])
                cur = max(cur, b_e[k])
                k += 1
            if cur < e:
                out_s.append(cur)
                out_e.append(e)
        return RowSet(np.asarray(out_s, dtype=np.int64), np.asarray(out_e, dtype=np.int64))

    def last(self, count: int) -> RowSet:
        """The ``count`` largest ids (all of them when it holds fewer)."""
        starts, ends = self.ranges()
        out_s: list[int] = []
        out_e: list[int] = []
        for s, e in zip(starts[::-1].tolist(), ends[::-1].tolist(), strict=True):
            if count <= 0:
                break
            k = min(count, e - s)
            out_s.append(e - k)
            out_e.append(e)
            count -= k
        return RowSet(np.asarray(out_s[::-1], dtype=np.int64), np.asarray(out_e[::-1], dtype=np.int64))

    def to_list(self) -> list[list[int]]:
        """``[[start, end], ...]``."""
        starts, ends = self.ranges()
        return [[int(s), int(e)] for s, e in zip(starts, ends, strict=False)]

    @classmethod
    def from_list(cls, ranges: list[list[int]]) -> RowSet:
        """The set of ``[[start, end], ...]``."""
        arr = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
        return cls(arr[:, 0].copy(), arr[:, 1].copy())


@dataclass(frozen=True)
class RankState:
    """Where a rank is: its settings, the epoch and the batches it yielded in it; in epoch
    0, the rows it yielded; once the epoch's steps were settled, the rows it gave away."""

    rank: int
    world: int
    batch_size: int
    seed: int
    #: True, False or ``"global"``.
    shuffle: bool | str
    drop_last: bool
    partitions: int | None
    epoch: int
    batches: int
    consumed: RowSet
    moved_out: RowSet | None

    def to_dict(self) -> dict[str, Any]:
        """The state as plain data."""
        return {
            "format": FORMAT,
            "rank": self.rank,
            "world_size": self.world,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "partitions": self.partitions,
            "epoch": self.epoch,
            "batches": self.batches,
            "consumed": self.consumed.to_list(),
            "moved_out": self.moved_out.to_list() if self.moved_out is not None else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankState:
        """Reads :meth:`to_dict`'s output; ValueError for anything else."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("state must be a dict from Receiver.state_dict()")
        try:
            moved = d["moved_out"]
            return cls(
                rank=int(d["rank"]),
                world=int(d["world_size"]),
                batch_size=int(d["batch_size"]),
                seed=int(d["seed"]),
                shuffle=_shuffle(d["shuffle"]),
                drop_last=bool(d["drop_last"]),
                partitions=None if d["partitions"] is None else int(d["partitions"]),
                epoch=int(d["epoch"]),
                batches=int(d["batches"]),
                consumed=RowSet.from_list(d["consumed"]),
                moved_out=None if moved is None else RowSet.from_list(moved),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"state is not a Receiver.state_dict(): {exc}") from None

    def check(
        self, rank: int, world: int, batch_size: int, seed: int, shuffle: bool | str, drop_last: bool
    ) -> None:
        """Raises ValueError unless the state was taken with these settings."""
        mine = (self.rank, self.world, self.batch_size, self.seed, self.shuffle, self.drop_last)
        given = (rank, world, batch_size, seed, shuffle, drop_last)
        if mine != given:
            names = ("rank", "world_size", "batch_size", "seed", "shuffle", "drop_last")
            pairs = zip(names, given, mine, strict=True)
            diff = [f"{n}={a!r} (state: {b!r})" for n, a, b in pairs if a != b]
            raise ValueError(f"the state was taken with other settings: {', '.join(diff)}")


def _shuffle(value: object) -> bool | str:
    if value is True or value is False or value == "global":
        return value
    raise ValueError(f"shuffle must be True, False or 'global', got {value!r}")
