"""Equal steps: how many batches every rank yields in an epoch, and of how many rows, from the
epoch's total number of rows; which ranks give rows to which so that each has what it needs.

With ``drop_last`` every batch has ``batch_size`` rows and fewer than ``world ×
batch_size`` rows are left out. Without, every row is yielded once: all batches have
``batch_size`` rows but the last step's, which split the remainder as evenly as possible
(when fewer rows than ranks remain, they and the step before are split into two steps, so
that no batch is empty). Every rank yields the same number of batches either way.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Steps:
    """One epoch's batches: ``full`` steps of ``batch_size`` rows, then the ``tail`` steps,
    ``tail[i][rank]`` rows each."""

    full: int
    batch_size: int
    tail: tuple[tuple[int, ...], ...]

    @property
    def count(self) -> int:
        """Batches every rank yields."""
        return self.full + len(self.tail)

    def sizes(self, rank: int) -> list[int]:
        """``rank``'s batch sizes, in order."""
        return [self.batch_size] * self.full + [step[rank] for step in self.tail]

    def need(self, rank: int) -> int:
        """The rows ``rank`` yields."""
        return self.full * self.batch_size + sum(step[rank] for step in self.tail)


def _even(rows: int, parts: int) -> list[int]:
    return [rows // parts + (1 if i < rows % parts else 0) for i in range(parts)]


def plan(total: int, world: int, batch_size: int, drop_last: bool) -> Steps:
    """The steps of an epoch of ``total`` rows. Raises ValueError when some rank would get
    an empty batch (fewer rows than ranks, or batch_size 1 with a remainder)."""
    per_step = world * batch_size
    full, rest = divmod(total, per_step)
    if drop_last or rest == 0:
        return Steps(full, batch_size, ())
    if rest >= world:
        return Steps(full, batch_size, (tuple(_even(rest, world)),))
    if full == 0 or batch_size == 1:
        raise ValueError(
            f"{total} rows cannot give each of {world} ranks a batch in every step with "
            f"batch_size={batch_size} (one would be empty): pass drop_last=True"
        )
    # Fewer rows than ranks remain: they and the last full step make two steps.
    sizes = _even(per_step + rest, 2 * world)
    return Steps(full - 1, batch_size, (tuple(sizes[:world]), tuple(sizes[world:])))


def full_steps_at_least(known: int, world: int, batch_size: int, drop_last: bool) -> int:
    """A lower bound of :attr:`Steps.full` for an epoch of at least ``known`` rows: how many
    full batches a rank may yield before the ranks know their totals."""
    full = known // (world * batch_size)
    return max(0, full if drop_last else full - 1)


def moves(holdings: list[int], needs: list[int]) -> list[tuple[int, int, int]]:
    """``(giver, taker, rows)`` so that every rank holds at least what it needs: ranks short
    of rows take from the ranks with rows to spare, in rank order (the same answer on every
    rank)."""
    spare = [max(0, h - n) for h, n in zip(holdings, needs, strict=False)]
    out: list[tuple[int, int, int]] = []
    giver = 0
    for taker, (h, n) in enumerate(zip(holdings, needs, strict=False)):
        short = n - h
        while short > 0:
            while spare[giver] == 0:
                giver += 1
            k = min(short, spare[giver])
            out.append((giver, taker, k))
            spare[giver] -= k
            short -= k
    return out
