"""What a contender is: a driver side (the Spark job) and a rank side (the loader)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benches.training.config import Config

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: A batch as the training loop gets it: column name -> torch tensor.
Batch = dict[str, Any]
Spec = dict[str, Any]


@dataclass(frozen=True)
class RankContext:
    cfg: Config
    rank: int
    #: The contender's scratch directory (shared by the driver and the ranks: its size is
    #: sampled); each rank's TMPDIR is below it too.
    scratch: Path
    secret: str


@dataclass(frozen=True)
class DriverContext:
    cfg: Config
    spark: SparkSession
    df: DataFrame
    #: The same DataFrame restricted to some source partitions.
    part_of: Callable[[Sequence[int]], DataFrame]
    scratch: Path
    secret: str


class Contender:
    """One way to get the DataFrame into the ranks. The driver calls :meth:`run_driver`,
    which calls ``go(spec)`` once the ranks may start (before its Spark job when it streams,
    after it when it materializes); each rank calls :meth:`setup` before the clock starts
    (and reports what it returns to the driver), then :meth:`epochs` with the spec."""

    name = ""
    #: One line: how it gets the data to the ranks.
    method = ""

    def setup(self, ctx: RankContext) -> dict[str, Any]:
        """In the rank, before the clock starts: imports, listeners. Returns what the driver
        needs from this rank (an address)."""
        return {}

    def epochs(self, ctx: RankContext, spec: Spec) -> Iterator[Iterable[Batch]]:
        """In the rank: one iterable of batches per epoch, ``ctx.cfg.epochs`` of them."""
        raise NotImplementedError

    def close(self) -> None:
        """In the rank, after the last epoch (or a failure)."""

    def run_driver(self, ctx: DriverContext, ready: list[dict[str, Any]], go: Callable[[Spec], None]) -> Spec:
        """In the driver: runs the Spark side; returns facts for the report."""
        raise NotImplementedError
