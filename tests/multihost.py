"""A multi-host Spark cluster on one machine (``tests/test_multihost.py``; run this file to
bring one up by hand).

Every host is a network namespace with its own address on one /24, joined to a bridge in a
"switch" namespace by a veth pair; the driver (the process that starts the session) stays in
the root namespace, which joins the bridge by a veth of its own::

    root namespace: driver .1 --+
    m: Spark master        .2 --+
    a: Spark worker       .11 --+-- bridge (namespace s)
    b: Spark worker       .12 --+
    c: client (no Spark)  .21 --+

The master and the workers are the pyspark package's own classes started by its
``bin/spark-class`` (``SPARK_HOME`` is the package), each with ``SPARK_LOCAL_IP`` set to its
host's address, so a worker's executors and their Python workers live in its namespace. The
namespaces share the filesystem: executors run the driver's ``PYSPARK_PYTHON`` and read the
same certificate files.

:meth:`Network.cut` isolates two hosts' bridge ports from each other (both still reach the
driver and the master), which drops their packets silently, as a failed link between them
would. Leaving :func:`cluster` kills every process in the hosts' namespaces (by pid) and
removes the namespaces and the driver's veth, whatever happened; namespaces left by a run
that was killed (their owner's pid is gone) are removed at the next start.

Needs root, iproute2, a JDK and PySpark; raises :class:`netns.Unavailable` with the reason
when namespaces cannot be made.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netns import Unavailable, ip, require_namespaces

#: Namespace names start with this and the owning process's pid.
PREFIX = "cfmh"
#: The /24s the beds use: 10.216.X.0/24, X chosen free.
SUBNET = "10.216"
HOST_NUMBERS = {"m": 2, "a": 11, "b": 12, "c": 21}
MASTER_PORT = 7077
MASTER_UI_PORT = 8080
#: Heap of the master and of each worker daemon (they only schedule).
DAEMON_MEMORY = "256m"
#: Java class of an executor, as it appears on its command line.
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
START_TIMEOUT = 120.0
#: Taken while a bed chooses its subnet.
LOCK = "/tmp/creditflow-multihost.lock"


@dataclass
class Host:
    """A host: namespace ``ns`` with address ``addr`` on device ``eth0``, plugged into the
    bridge at ``port`` (a device of the switch namespace)."""

    name: str
    ns: str
    addr: str
    port: str

    def pids(self) -> list[int]:
        """Every process in this host's namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def exec(self, *argv: str) -> list[str]:
        """``argv`` run in this host's namespace (for ``subprocess``)."""
        return ["ip", "netns", "exec", self.ns, *argv]


@dataclass
class Network:
    """The hosts, the switch namespace holding the bridge, and the driver's end of its veth."""

    tag: str
    switch: str
    driver_addr: str
    driver_dev: str
    hosts: dict[str, Host]
    cuts: set[frozenset[str]] = field(default_factory=set)

    def cut(self, x: str, y: str) -> None:
        """Cuts the link between hosts ``x`` and ``y``: the bridge drops what one sends the
        other (both stay connected to every other host and to the driver). One cut at a time."""
        if self.cuts:
            raise RuntimeError(f"a cut is already in place: {self.cuts}")
        for h in (x, y):
            self._isolate(h, True)
        self.cuts.add(frozenset((x, y)))

    def restore(self) -> None:
        """Ends the cut, if any."""
        for pair in list(self.cuts):
            for h in pair:
                self._isolate(h, False)
            self.cuts.discard(pair)

    def _isolate(self, host: str, on: bool) -> None:
        # Isolated bridge ports do not forward to each other, only to the others.
        port = self.hosts[host].port
        ip("-n", self.switch, "link", "set", port, "type", "bridge_slave", "isolated", "on" if on else "off")


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie waiting for its parent has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _kill_namespace(ns: str) -> None:
    """Kills every process in namespace ``ns`` (they were all started there by a bed) and
    removes it."""
    pids = Host("", ns, "", "").pids()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _remove_stale() -> None:
    """Removes the namespaces of beds whose process is gone (a run killed before it could
    clean up), and their driver veths."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        digits = name[len(PREFIX) : -1]
        if name.startswith(PREFIX) and digits.isdigit() and not _pid_alive(int(digits)):
            _kill_namespace(name)
            subprocess.run(["ip", "link", "del", f"{PREFIX}{digits}d"], capture_output=True)


def _free_subnet() -> str:
    """A 10.216.X prefix no route of this namespace uses yet, starting from this pid's (the
    caller holds :data:`LOCK` until its own route is in place)."""
    used = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
    for k in range(250):
        x = (os.getpid() + k) % 250
        if f"{SUBNET}.{x}." not in used:
            return f"{SUBNET}.{x}"
    raise Unavailable(f"every {SUBNET}.X.0/24 is in use")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Holds :data:`LOCK`: beds started at once (other checkouts' test runs) choose their
    subnets one after the other."""
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def network(names: Sequence[str] = ("m", "a", "b", "c")) -> Iterator[Network]:
    """Creates the switch, the hosts ``names`` (keys of :data:`HOST_NUMBERS`) and the driver's
    link; removes them all on exit, with every process left in them."""
    require_namespaces()
    tag = f"{PREFIX}{os.getpid()}"
    net = Network(tag, f"{tag}s", "", f"{tag}d", {})
    try:
        with _locked():
            _remove_stale()
            subnet = _free_subnet()
            net.driver_addr = f"{subnet}.1"
            try:
                ip("netns", "add", net.switch)
                ip("-n", net.switch, "link", "add", "br0", "type", "bridge")
            except subprocess.CalledProcessError as exc:
                refused = exc.stderr.strip()
                raise Unavailable(f"the kernel refuses a namespace or a bridge: {refused}") from exc
            ip("-n", net.switch, "link", "set", "br0", "up")
            ip("link", "add", net.driver_dev, "type", "veth", "peer", "name", "pd", "netns", net.switch)
            ip("addr", "add", f"{net.driver_addr}/24", "dev", net.driver_dev)
        ip("link", "set", net.driver_dev, "up")
        ip("-n", net.switch, "link", "set", "pd", "master", "br0", "up")
        for name in names:
            h = Host(name, f"{tag}{name}", f"{subnet}.{HOST_NUMBERS[name]}", f"p{name}")
            net.hosts[name] = h
            ip("netns", "add", h.ns)
            veth = ("type", "veth", "peer", "name", h.port, "netns", net.switch)
            ip("link", "add", "eth0", "netns", h.ns, *veth)
            ip("-n", net.switch, "link", "set", h.port, "master", "br0", "up")
            ip("-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", "eth0")
            ip("-n", h.ns, "link", "set", "eth0", "up")
            ip("-n", h.ns, "link", "set", "lo", "up")
        yield net
    finally:
        for h in net.hosts.values():
            _kill_namespace(h.ns)
        _kill_namespace(net.switch)
        subprocess.run(["ip", "link", "del", net.driver_dev], capture_output=True)


@dataclass
class Cluster:
    """A Spark standalone master on host ``m`` and a worker on each of ``workers``."""

    net: Network
    workers: list[Host]
    cores: int
    dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def master(self) -> Host:
        return self.net.hosts["m"]

    @property
    def master_url(self) -> str:
        return f"spark://{self.master.addr}:{MASTER_PORT}"

    @property
    def slots(self) -> int:
        return self.cores * len(self.workers)

    def session_conf(self, executor_memory: str = "512m") -> dict[str, str]:
        """What a driver in the root namespace needs to run on this cluster: its address on
        the bridge, one executor of all its worker's cores per worker, an event log."""
        events = self.dir / "events"
        events.mkdir(exist_ok=True)
        return {
            "spark.driver.host": self.net.driver_addr,
            "spark.driver.bindAddress": self.net.driver_addr,
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": executor_memory,
            "spark.cores.max": str(self.slots),
            "spark.default.parallelism": str(self.slots),
            "spark.sql.shuffle.partitions": str(self.slots),
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",  # one file: <app id>.inprogress
        }

    def job_events(self, app_id: str, description: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """What the event log of application ``app_id`` says about the jobs whose description
        (``SparkContext.setJobDescription``) is ``description``: their start, end, stage and
        task events, once the last of them has ended (the log is written a little after the
        action returns)."""
        path = self.dir / "events" / f"{app_id}.inprogress"
        deadline = time.monotonic() + timeout
        while True:
            events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            jobs = {
                e["Job ID"]: set(e["Stage IDs"])
                for e in events
                if e["Event"] == "SparkListenerJobStart"
                and (e.get("Properties") or {}).get("spark.job.description") == description
            }
            ended = {e["Job ID"] for e in events if e["Event"] == "SparkListenerJobEnd"}
            if jobs and set(jobs) <= ended:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the event log has no ended job {description!r} after {timeout} s")
            time.sleep(0.2)
        stages = set().union(*jobs.values())

        def mine(e: dict[str, Any]) -> bool:
            if "Job ID" in e:
                return bool(e["Job ID"] in jobs)
            stage = e.get("Stage ID", (e.get("Stage Info") or {}).get("Stage ID"))
            return stage in stages

        return [e for e in events if mine(e)]

    def state(self) -> dict[str, Any]:
        """The master's view (its web UI's ``/json/``: workers, applications, executors)."""
        url = f"http://{self.master.addr}:{MASTER_UI_PORT}/json/"
        with urllib.request.urlopen(url, timeout=5) as r:
            state: dict[str, Any] = json.load(r)
        return state

    def executor_pids(self, host: str) -> list[int]:
        """The executor JVMs running on ``host``."""
        pids = []
        for pid in self.net.hosts[host].pids():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if EXECUTOR_CLASS.encode() in cmdline:
                pids.append(pid)
        return pids

    def logs(self) -> str:
        """The last lines of every daemon's log and of every executor's stderr (for failures)."""
        parts = []
        for path in sorted([*self.dir.glob("*.log"), *self.dir.glob("work-*/*/*/stderr")]):
            lines = path.read_text(errors="replace").splitlines()[-30:]
            parts.append(f"--- {path.relative_to(self.dir)} ---\n" + "\n".join(lines))
        return "\n".join(parts)


def _spark_env(host: Host, base: Path) -> dict[str, str]:
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    conf = base / "conf"
    conf.mkdir(exist_ok=True)
    return {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_CONF_DIR": str(conf),  # empty: no spark-defaults.conf or spark-env.sh of the machine's
        "SPARK_LOCAL_IP": host.addr,
        "SPARK_LOCAL_HOSTNAME": host.addr,
        "SPARK_LOCAL_DIRS": str(base / f"local-{host.name}"),
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        # The daemons only schedule: the quick compiler and one GC thread start them sooner.
        "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "SPARK_NO_DAEMONIZE": "1",
    }


def _start(c: Cluster, host: Host, name: str, *args: str) -> None:
    import pyspark

    spark_class = Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"
    with open(c.dir / f"{name}.log", "wb") as log:
        c.procs[name] = subprocess.Popen(
            host.exec(str(spark_class), *args),
            env=_spark_env(host, c.dir),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _wait_alive(c: Cluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    last: Any = None
    while time.monotonic() < deadline:
        for name, proc in c.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"the Spark {name} exited with {proc.returncode}\n{c.logs()}")
        try:
            last = c.state()
        except OSError as exc:
            last = exc
        else:
            alive = [w for w in last.get("workers", []) if w.get("state") == "ALIVE"]
            if len(alive) == len(c.workers):
                return
        time.sleep(0.5)
    raise RuntimeError(f"the cluster did not come up within {START_TIMEOUT} s ({last!r})\n{c.logs()}")


@contextlib.contextmanager
def cluster(
    base: Path, workers: Sequence[str] = ("a", "b"), cores: int = 2, worker_memory: str = "1g"
) -> Iterator[Cluster]:
    """The network, a master on ``m`` and a worker of ``cores`` cores and ``worker_memory`` on
    each of ``workers``, their logs and work directories under ``base``; waits until every
    worker is registered. Everything is stopped and removed on exit."""
    with network(("m", *workers, "c")) as net:
        c = Cluster(net, [net.hosts[w] for w in workers], cores, base)
        try:
            m = c.master
            master = "org.apache.spark.deploy.master.Master"
            _start(c, m, "master", master, "--host", m.addr, "--port", str(MASTER_PORT))
            for h in c.workers:
                _start(
                    c,
                    h,
                    f"worker-{h.name}",
                    "org.apache.spark.deploy.worker.Worker",
                    c.master_url,
                    "--host",
                    h.addr,
                    "--cores",
                    str(cores),
                    "--memory",
                    worker_memory,
                    "--work-dir",
                    str(base / f"work-{h.name}"),
                )
            _wait_alive(c)
            yield c
        finally:
            net.restore()
            for proc in c.procs.values():
                if proc.poll() is None:
                    proc.kill()
                proc.wait()


def main() -> None:
    """Brings a bed up, prints where it is and what a driver needs, and waits (Ctrl-C ends
    it): for trying things by hand."""
    base = Path(tempfile.mkdtemp(prefix="creditflow-multihost-"))
    with cluster(base) as c:
        print(json.dumps({"master": c.master_url, "hosts": {n: h.addr for n, h in c.net.hosts.items()}}))
        print(json.dumps({"driver settings": c.session_conf(), "logs": str(base)}), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
