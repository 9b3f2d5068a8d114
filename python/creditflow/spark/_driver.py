"""Driver-side checks before a creditflow job starts: the Python the workers run, free slots."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from pyspark import SparkContext

#: How long to wait for executors to register before saying there are too few slots
#: (a local-cluster or a real cluster registers its executors after the session starts).
REGISTRATION_WAIT = 30.0


def ensure_python(sc: SparkContext) -> None:
    """Makes Spark's Python workers run this interpreter when nobody chose one.

    Without ``PYSPARK_PYTHON`` Spark starts ``python3`` from PATH, which is often an
    interpreter without creditflow (or pyarrow); the first task then fails with an
    ImportError far from its cause.
    """
    if os.environ.get("PYSPARK_PYTHON"):
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Functions created from now on carry the context's pythonExec to the executors.
    if getattr(sc, "pythonExec", None) in (None, "python3", "python"):
        sc.pythonExec = sys.executable


def concurrent_slots(sc: SparkContext) -> int:
    """How many tasks the cluster runs at once (what a barrier stage needs as many of as it has
    tasks): Spark's own count when it can be asked, else ``defaultParallelism``."""
    jsc: Any = sc._jsc.sc()
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # an older or different Spark: fall back to the documented figure
        return int(sc.defaultParallelism)


def check_slots(sc: SparkContext, tasks: int) -> None:
    """Raises at once when a barrier stage of ``tasks`` tasks cannot run, instead of letting
    Spark's own check wait for about ten minutes before it fails."""
    slots = concurrent_slots(sc)
    master = sc.master or ""
    if slots < tasks and not master.startswith("local["):
        # Executors may still be registering.
        deadline = time.monotonic() + REGISTRATION_WAIT
        while slots < tasks and time.monotonic() < deadline:
            time.sleep(0.25)
            slots = concurrent_slots(sc)
    if slots < tasks:
        raise ValueError(
            f"creditflow exchange needs {tasks} task slots at once (one per partition, all running "
            f"together in a barrier stage) but the cluster has {slots} (master {master!r}). Use fewer "
            f"partitions (num_partitions={slots} or df.repartition({slots}) first), or give Spark more "
            "cores (local[N], more executors or spark.executor.cores)."
        )
