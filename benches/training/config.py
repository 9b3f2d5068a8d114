"""The benchmark's settings, shared by the driver and the rank processes (as JSON)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

#: TPC-H lineitem rows at scale factor 0.1 (dbgen's count).
SF01_ROWS = 600_572


@dataclass(frozen=True)
class Config:
    """What every contender is asked to do."""

    rows: int = SF01_ROWS
    #: Source partitions of the DataFrame (Spark tasks that generate the rows).
    partitions: int = 8
    world_size: int = 2
    batch_size: int = 1024
    epochs: int = 3
    seed: int = 28
    #: Memory each creditflow receiver keeps the stream in (more than a rank's share: the
    #: "fits in memory" case of the goal of no data on disk, ``report.goals``).
    receiver_memory: str = "256MiB"
    #: Rows a shuffle buffer holds where a peer takes one (Petastorm's shuffling queue).
    shuffle_buffer: int = 16_384
    #: Seconds a contender's round may take before its ranks are killed.
    timeout: float = 1800.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Config:
        return cls(**json.loads(text))
