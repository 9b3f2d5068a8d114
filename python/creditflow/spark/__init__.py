"""creditflow for PySpark: pipelined exchanges between tasks, and streaming out of Spark.

* :func:`exchange` repartitions a DataFrame by key inside one barrier stage through
  creditflow (no shuffle files, bounded memory per task, backpressure), with the rows in the
  same partitions as ``df.repartition(n, *keys)``.
* :func:`send` streams a DataFrame out of Spark to a :class:`Receiver` in another process,
  or to the W ranks of a training job (``Receiver(rank=r, world_size=W, batch_size=B)``;
  :class:`TrainingJob` lets ranks started by ``torchrun`` find the driver).
* ``Receiver(continuous=True)`` serves a streaming query's micro-batches, each delivered
  once, from ``foreachBatch`` and ``send(..., batch_id=...)`` or from the ``creditflow``
  sink (:class:`CreditflowDataSource`), with a :class:`JobDone` boundary after each.
* :class:`Monitor` collects live per-task metrics of those jobs on the driver.

Needs ``pyspark`` (4.x; ``pip install creditflow[spark]``). Importing this module starts no
thread; a task creates its worker process's environment when it first needs one.
"""

from __future__ import annotations

from creditflow.spark._process import close_environments, open_environments
from creditflow.spark._session import local_session
from creditflow.spark._staging import JobDone
from creditflow.spark.exchange import PartitionFunction, exchange
from creditflow.spark.job import TrainingJob
from creditflow.spark.monitor import Monitor, MonitorHandle
from creditflow.spark.sink import CreditflowDataSource
from creditflow.spark.stream import Receiver, send

__all__ = [
    "CreditflowDataSource",
    "JobDone",
    "Monitor",
    "MonitorHandle",
    "PartitionFunction",
    "Receiver",
    "TrainingJob",
    "close_environments",
    "exchange",
    "local_session",
    "open_environments",
    "send",
]
