"""A SparkSession on this machine, set up the way creditflow's demo, tests and benchmarks need."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import warnings
from typing import Any

from pyspark.sql import SparkSession


def _find_java_home() -> str | None:
    """A JDK for PySpark 4 (17 preferred, then 21), or the one ``java`` on PATH belongs to."""
    for version in ("17", "21"):
        for pattern in (f"/usr/lib/jvm/java-{version}-openjdk*", f"/usr/lib/jvm/*-{version}-*"):
            for home in sorted(glob.glob(pattern)):
                if os.access(os.path.join(home, "bin", "java"), os.X_OK):
                    return home
    java = shutil.which("java")
    if java:
        return os.path.dirname(os.path.dirname(os.path.realpath(java)))
    return None


#: Settings that act only when the driver's JVM starts (the heap, its options and class path,
#: packages resolved by spark-submit): given to the JVM's start, which makes them its own.
JVM_START_SETTINGS = (
    "spark.driver.memory",
    "spark.driver.extraJavaOptions",
    "spark.driver.extraClassPath",
    "spark.driver.extraLibraryPath",
    "spark.jars.packages",
    "spark.jars.repositories",
    "spark.jars.excludes",
    "spark.jars.ivy",
)


def _start_jvm(settings: dict[str, Any]) -> None:
    """Starts PySpark's JVM (once per process) with only :data:`JVM_START_SETTINGS`.

    PySpark starts its JVM with ``spark-submit`` and the first session's whole configuration,
    which ``spark-submit`` makes Java system properties of the JVM, and every later session of
    the process starts from those: a second session inherited every setting of the first that
    it did not set again (its executors' cores and memory, its event log...).
    """
    from pyspark import SparkConf, SparkContext

    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        conf = SparkConf(loadDefaults=False)
        for key in JVM_START_SETTINGS:
            if key in settings:
                conf.set(key, str(settings[key]))
        SparkContext._ensure_initialized(conf=conf)


def local_session(
    master: str = "local[2]",
    app_name: str = "creditflow",
    conf: dict[str, Any] | None = None,
    *,
    connect: bool = False,
) -> SparkSession:
    """A SparkSession bound to loopback, for a laptop, a test or a benchmark.

    Sets what a fresh machine lacks and leaves whatever is set alone: ``JAVA_HOME`` (a JDK 17
    or 21), ``PYSPARK_PYTHON`` (this interpreter, so the workers have creditflow),
    ``SPARK_LOCAL_IP`` (loopback). The Spark UI and console progress bar are off, the session
    time zone is UTC; ``conf`` adds or overrides settings. ``master`` may be ``local[N]`` or
    ``local-cluster[W,C,M]`` (separate executor JVMs; needs nothing else installed).

    With ``connect=True`` the session is a Spark Connect one
    (``SparkSession.builder.remote(master)``): PySpark starts a local Connect server in this
    process, with these settings, and the session talks to it over gRPC like any remote
    client (on 127.0.0.1:15002: one such server per machine at a time); ``session.stop()``
    stops the server. Needs ``pyspark[connect]``'s dependencies
    (``pip install creditflow[spark-connect]``). A classic session and a local Connect server
    do not share a process: stop one before starting the other. Each session has the settings
    given to it (and Spark's defaults), whatever sessions ran in the process before it.
    """
    if not os.environ.get("JAVA_HOME"):
        home = _find_java_home()
        if home:
            os.environ["JAVA_HOME"] = home
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings: dict[str, Any] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }
    if connect:
        # A Connect client cannot call setLogLevel: the server starts at this level instead.
        settings["spark.log.level"] = "ERROR"
        # The server listens on loopback only (by default it takes 0.0.0.0). Its port stays
        # PySpark's fixed 15002, which the client dials: one local Connect server at a time
        # per machine.
        settings["spark.connect.grpc.binding.address"] = "127.0.0.1"
    settings.update(conf or {})
    _start_jvm(settings)
    builder = SparkSession.builder.remote(master) if connect else SparkSession.builder.master(master)
    builder = builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    if not connect:
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        return session
    with warnings.catch_warnings():
        # PySpark hands every setting to the local server's SparkConf (where static ones such as
        # spark.ui.enabled take effect), then sets them again on the Connect session, where the
        # static ones are refused with a UserWarning although they are already in force.
        warnings.filterwarnings(
            "ignore", message=r"Failed to set .*CANNOT_MODIFY_(STATIC_)?CONFIG", category=UserWarning
        )
        return builder.getOrCreate()
