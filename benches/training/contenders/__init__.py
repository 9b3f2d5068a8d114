"""The contenders by name. Each module imports its library only inside its methods, so that
a missing or broken library is an error of that contender's run, reported as such."""

from __future__ import annotations

from benches.training.contenders.base import Contender
from benches.training.contenders.creditflow_ranks import CreditflowRanks
from benches.training.contenders.creditflow_today import CreditflowToday
from benches.training.contenders.hf_peer import HFDatasets, HFIterable
from benches.training.contenders.mosaic_peer import Mosaic
from benches.training.contenders.parquet_peer import Parquet
from benches.training.contenders.petastorm_peer import Petastorm

ALL: dict[str, type[Contender]] = {
    c.name: c for c in (CreditflowRanks, CreditflowToday, Petastorm, Mosaic, HFDatasets, HFIterable, Parquet)
}
#: What a run compares when not told otherwise.
DEFAULT = ["creditflow", "petastorm", "mosaic", "hf-datasets", "hf-iterable", "parquet"]
PEERS = ["petastorm", "mosaic", "hf-datasets", "hf-iterable", "parquet"]


def get(name: str) -> Contender:
    try:
        return ALL[name]()
    except KeyError:
        raise ValueError(f"unknown contender {name!r}; known: {', '.join(ALL)}") from None
