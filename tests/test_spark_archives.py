"""creditflow reaches executors that do not have it installed, through ``spark.archives``.

PySpark's documented way to ship Python packages to executors: pack a virtual environment with
``venv-pack``, give it to Spark as ``spark.archives`` (``env.tar.gz#environment``), and make
the workers run ``./environment/bin/python``, the interpreter of the archive as every executor
unpacks it into its working directory. Here the environment is a fresh one (``python -m venv``
from the base interpreter, nothing of ``.venv``), holding only the creditflow wheel under test
and its dependency pyarrow. The job runs on ``local-cluster[2,1,1024]``: two executor JVMs
whose Python workers see neither ``.venv`` nor any creditflow but the archive's.

The session runs in a subprocess: ``PYSPARK_PYTHON`` must point at the archive's interpreter
before the SparkContext starts, and a second SparkContext cannot live beside the other Spark
tests' in this process.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import creditflow

pytestmark = [pytest.mark.spark, pytest.mark.slow]

pytest.importorskip("pyspark")
venv_pack = pytest.importorskip("venv_pack")

ROOT = Path(__file__).resolve().parents[1]


def installed_wheel() -> Path | None:
    """The wheel file the installed creditflow came from (pip records it in
    ``direct_url.json``), else the newest one ``make build-test`` or ``make build`` left."""
    try:
        direct = importlib.metadata.distribution("creditflow").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        direct = None
    if direct:
        url = json.loads(direct).get("url", "")
        if url.startswith("file://"):
            path = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
            if path.suffix == ".whl" and path.is_file():
                return path
    built = sorted(
        [*ROOT.glob("target/wheels/*/creditflow-*.whl"), *ROOT.glob("dist/creditflow-*.whl")],
        key=lambda p: p.stat().st_mtime,
    )
    return built[-1] if built else None


@pytest.fixture(scope="module")
def packed_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the creditflow wheel and pyarrow, packed by venv-pack
    (once per session: about a minute on a loaded 2-core machine)."""
    wheel = installed_wheel()
    if wheel is None:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail("no creditflow wheel to pack (make build-test makes one)")
        pytest.skip("no creditflow wheel to pack: run make build-test")
    where = tmp_path_factory.mktemp("archive")
    env = where / "env"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(env)], check=True)
    # .venv's pip installs into the fresh environment; pyarrow at .venv's version (pip's cache
    # has it), creditflow from the wheel under test.
    pyarrow = importlib.metadata.version("pyarrow")
    subprocess.run(
        [
            sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install",
            "--quiet", "--disable-pip-version-check", str(wheel), f"pyarrow=={pyarrow}",
        ],
        check=True,
    )  # fmt: skip
    archive = where / "env.tar.gz"
    venv_pack.pack(prefix=str(env), output=str(archive), compress_level=1)
    return archive


_JOB = """
import json, os, shutil, sys
from collections.abc import Iterator

import pyarrow as pa
from pyspark.find_spark_home import _find_spark_home
from pyspark.sql import functions as F

import creditflow.spark as cfs

spark = cfs.local_session(
    "local-cluster[2,1,1024]",
    "creditflow-test-archives",
    {"spark.archives": sys.argv[1] + "#environment", "spark.executor.memory": "1g",
     "spark.sql.shuffle.partitions": "2"},
)


def where(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    # Each output partition: its rows, the sum of their ids, and where its Python came from.
    import os

    import pyarrow.compute as pc
    from pyspark import TaskContext

    import creditflow

    rows = total = 0
    for b in batches:
        rows += b.num_rows
        total += pc.sum(b.column("id")).as_py() or 0
    origin = {"executable": sys.executable, "prefix": sys.prefix, "cwd": os.getcwd(),
              "creditflow": creditflow.__file__, "pid": os.getpid()}
    yield pa.RecordBatch.from_pylist([{"p": TaskContext.get().partitionId(), "rows": rows,
                                       "total": total, "origin": json.dumps(origin)}])


try:
    df = spark.range(0, 50_000, numPartitions=2).select("id", (F.col("id") % 97).alias("k"))
    out = cfs.exchange(df, "k", func=where, schema="p long, rows long, total long, origin string")
    got = [r.asDict() for r in out.collect()]
    want = [
        r.asDict()
        for r in df.repartition(2, "k").groupBy(F.spark_partition_id().alias("p"))
        .agg(F.count("id").alias("rows"), F.sum("id").alias("total")).collect()
    ]
    print("RESULT " + json.dumps({"got": got, "want": want}))
finally:
    # The executors' working directories hold an unpacked copy of the environment each, under
    # SPARK_HOME/work (inside .venv for a pip-installed PySpark): remove them with the app.
    work = os.path.join(_find_spark_home(), "work", spark.sparkContext.applicationId)
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
"""


# Packing, two executor JVMs and an unpacked environment each: minutes on a loaded machine.
@pytest.mark.timeout(600)
def test_exchange_on_executors_whose_python_gets_creditflow_from_spark_archives(
    packed_env: Path, tmp_path: Path
) -> None:
    base = getattr(sys, "_base_executable", sys.executable)
    missing = subprocess.run([base, "-c", "import creditflow"], capture_output=True, text=True)
    assert missing.returncode != 0, "the base interpreter has creditflow: the test would prove nothing"
    env = {
        **os.environ,
        "PYSPARK_PYTHON": "./environment/bin/python",
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    proc = subprocess.run(
        [sys.executable, "-c", _JOB, str(packed_env)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=500,
    )
    out = proc.stdout + proc.stderr
    # The Python error's lines first: the tail of a failed job is mostly the JVM's stack.
    errors = "\n".join(
        line for line in out.splitlines() if "Error" in line and not line.lstrip().startswith("at ")
    )
    assert proc.returncode == 0, errors[-4000:] + "\n...\n" + out[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    got = sorted(result["got"], key=lambda r: r["p"])
    want = sorted(result["want"], key=lambda r: r["p"])
    # Every row arrived where Spark's repartition puts it.
    assert [(r["p"], r["rows"], r["total"]) for r in got] == [(r["p"], r["rows"], r["total"]) for r in want]
    assert sum(r["rows"] for r in got) == 50_000
    origins = [json.loads(r["origin"]) for r in got]
    # Two executor processes, each running the archive's interpreter as unpacked in its own
    # working directory, and importing creditflow from there.
    assert len({o["pid"] for o in origins}) == 2, origins
    for o in origins:
        unpacked = os.path.realpath(os.path.join(o["cwd"], "environment"))
        assert o["executable"].endswith("environment/bin/python"), o
        assert os.path.realpath(o["prefix"]) == unpacked, o
        assert os.path.realpath(o["creditflow"]).startswith(unpacked + os.sep), o
        assert os.path.realpath(o["creditflow"]) != os.path.realpath(creditflow.__file__), o
