"""The network stack a Spark task uses, and how tasks reach each other.

By default a task attaches to its host's service (:mod:`creditflow.host`: one process per host,
user, application and network settings, with the application's host memory, started by the
first task that needs it, ending with the application's executors): its partitions and gates
live there, so the tasks of a host share one pool and one connection per pair of hosts.
:func:`host_environment` gives a task its attachment, kept per worker process and service and
attached again when the service is gone.

With ``host_service=False`` each Python worker process gets its own environment instead
(:func:`task_environment`), at most one per configuration, created on first use by a task,
never at import, and forgotten (not closed: its threads belong to the parent) in a forked
child. An exchange carries a fresh secret, so a later exchange in the same process gets a
new environment; environments no task uses any more are closed when a new one is created
and when the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import ipaddress
import json
import math
import os
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import creditflow as cf
from creditflow.host import attach_or_start


@dataclass(frozen=True)
class TlsFiles:
    """A :class:`creditflow.TLSConfig` as the paths it names, which is what travels in a job's
    closure (a ``TLSConfig`` does not pickle); each task makes it a ``TLSConfig`` again where it
    creates its environment, so the files are read on the executor, at these paths."""

    cert: str
    key: str
    ca: str
    client_auth: bool = True

    @classmethod
    def of(cls, tls: cf.TLSConfig | None) -> TlsFiles | None:
        """``tls``'s paths (None for None); raises TypeError for anything but a ``TLSConfig``."""
        if tls is None:
            return None
        if not isinstance(tls, cf.TLSConfig):
            raise TypeError(f"tls must be a creditflow.TLSConfig or None, got {type(tls).__name__}")
        return cls(str(tls.cert), str(tls.key), str(tls.ca), tls.client_auth)

    def config(self) -> cf.TLSConfig:
        """The ``TLSConfig`` these paths make."""
        return cf.TLSConfig(self.cert, self.key, self.ca, client_auth=self.client_auth)


@dataclass(frozen=True)
class EnvSettings:
    """What a task's environment is created with (part of the closure Spark ships to tasks).

    Each field is the ``NetworkEnvironment`` setting of the same name, with the same default
    except where :data:`OVERRIDES` says why (``tests/test_settings.py`` checks both against
    the core's settings table).
    """

    secret: str
    memory: int | str = "64MiB"
    segment_size: int | str = "32KiB"
    buffer_timeout: float = 0.1
    exclusive_buffers: int = 2
    floating_buffers: int = 8
    #: Listen address; None = the task's own host (see :func:`bind_address`), ephemeral port.
    bind: str | None = None
    #: Address to advertise instead of the bound one (NAT, containers).
    advertise: str | None = None
    #: Connections the environment serves at once; an exchange raises it to twice its tasks
    #: (each task serves one connection per peer that reads its partition).
    max_connections: int = 512
    #: Where hybrid partitions spill (an exchange with ``kind="hybrid"``); None = system temp.
    spill_dir: str | None = None
    #: IPC body compression of what the task sends ("lz4", "zstd"); None = uncompressed.
    wire_compression: str | None = None
    #: Tasks on one host exchange through shared memory (False: loopback TCP).
    shared_memory: bool = True
    #: TLS on every connection of the task's environment (the files are read on the executor).
    tls: TlsFiles | None = None
    #: Seconds a peer may acknowledge nothing (a cut link, a vanished host) before the task's
    #: connections to it fail; 0 = the OS's defaults.
    peer_timeout: float = 30.0


#: The values ``wire_compression`` takes besides None (the core's; tests/test_settings.py checks
#: that it accepts exactly these), so a bad one fails on the driver instead of in every task.
WIRE_COMPRESSIONS = ("lz4", "zstd")


def check_wire_compression(value: str | None) -> None:
    """Raises ValueError unless ``value`` is None or one of :data:`WIRE_COMPRESSIONS`."""
    if value is not None and value not in WIRE_COMPRESSIONS:
        raise ValueError(f'wire_compression must be None, "lz4" or "zstd", got {value!r}')


def check_bytes(name: str, value: int | str) -> int:
    """``value`` as bytes (``65536``, ``"64MiB"``); raises ValueError naming ``name`` otherwise,
    so that a typo fails on the driver, not in every task. Whether the size suits its setting
    (a power of two for ``segment_size``...) is the environment's to say."""
    try:
        return cf.parse_bytes(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{name}: {str(exc).removeprefix('size: ')}") from None


def check_timeout(value: float | None) -> None:
    """Raises ValueError unless ``value`` (a wait's limit) is None or a positive number of seconds."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0):
        raise ValueError(f"timeout must be a positive number of seconds or None, got {value!r}")


def check_task_settings(
    *,
    memory: int | str,
    segment_size: int | str,
    wire_compression: str | None,
    peer_timeout: float,
    timeout: float | None,
) -> None:
    """Raises ValueError, naming the setting, for what a job's tasks would refuse, before any
    runs (``exchange`` and ``send``)."""
    check_wire_compression(wire_compression)
    check_seconds("peer_timeout", peer_timeout)
    check_timeout(timeout)
    check_bytes("memory", memory)
    check_bytes("segment_size", segment_size)


def check_seconds(name: str, value: object) -> float:
    """``value`` as seconds; raises ValueError (with the core's wording) unless it is a finite
    number >= 0, so a bad setting fails on the driver instead of in every task."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number of seconds, got {value!r}")
    return float(value)


#: The defaults of :class:`EnvSettings` that differ from ``NetworkEnvironment``'s, and why.
OVERRIDES: dict[str, str] = {
    "secret": "required: every exchange makes a fresh one, and executors are reached off-host",
    "bind": "None means the task executor's own host (bind_address), which peers on other hosts reach",
}


class _Cache:
    """Environments of this process by settings, with how many tasks use each right now."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.envs: dict[EnvSettings, tuple[cf.NetworkEnvironment, int]] = {}
        #: Environments inherited across a fork: never used nor closed in the child.
        self.orphans: list[cf.NetworkEnvironment] = []
        #: ``/metrics`` URL of each environment that serves its metrics (by address).
        self.metrics: dict[str, str] = {}

    def _forget_if_forked(self) -> None:
        if os.getpid() != self.pid:
            self.orphans.extend(env for env, _ in self.envs.values())
            self.envs.clear()
            self.metrics.clear()
            self.pid = os.getpid()

    def metrics_url(self, env: cf.NetworkEnvironment) -> str | None:
        with self.lock:
            self._forget_if_forked()
            url = self.metrics.get(env.address)
            if url is None and not env.closed and _is_loopback(env.address.rpartition(":")[0]):
                try:
                    url = env.serve_metrics(0, "127.0.0.1").url
                except ImportError:  # prometheus_client is not installed here
                    return None
                self.metrics[env.address] = url
            return url

    def acquire(self, settings: EnvSettings, host: str | None) -> cf.NetworkEnvironment:
        with self.lock:
            self._forget_if_forked()
            entry = self.envs.get(settings)
            if entry is not None and not entry[0].closed:
                self.envs[settings] = (entry[0], entry[1] + 1)
                return entry[0]
            # A new exchange: environments no running task uses belong to finished ones.
            for key, (old, users) in list(self.envs.items()):
                if users == 0:
                    del self.envs[key]
                    old.close()
            env = cf.NetworkEnvironment(
                memory=settings.memory,
                segment_size=settings.segment_size,
                buffer_timeout=settings.buffer_timeout,
                exclusive_buffers=settings.exclusive_buffers,
                floating_buffers=settings.floating_buffers,
                bind=settings.bind or bind_address(host),
                secret=settings.secret,
                advertise=settings.advertise,
                spill_dir=settings.spill_dir,
                max_connections=settings.max_connections,
                wire_compression=settings.wire_compression,
                shared_memory=settings.shared_memory,
                tls=settings.tls.config() if settings.tls is not None else None,
                peer_timeout=settings.peer_timeout,
            )
            self.envs[settings] = (env, 1)
            return env

    def release(self, settings: EnvSettings) -> None:
        with self.lock:
            entry = self.envs.get(settings)
            if entry is not None and os.getpid() == self.pid:
                self.envs[settings] = (entry[0], max(0, entry[1] - 1))

    def close_all(self) -> None:
        with self.lock:
            if os.getpid() != self.pid:
                return
            envs = [env for env, _ in self.envs.values()]
            self.envs.clear()
        for env in envs:
            env.close()

    def count(self) -> int:
        with self.lock:
            self._forget_if_forked()
            return len(self.envs)


_CACHE = _Cache()
atexit.register(_CACHE.close_all)


@contextlib.contextmanager
def task_environment(settings: EnvSettings, host: str | None = None) -> Iterator[cf.NetworkEnvironment]:
    """This process's environment for ``settings``, marked in use while the block runs.

    ``host`` is the address peers reach this task's executor at (None: work it out).
    """
    env = _CACHE.acquire(settings, host)
    try:
        yield env
    finally:
        _CACHE.release(settings)


def metrics_url_of(env: cf.NetworkEnvironment | cf.Attachment) -> str | None:
    """Serves ``env``'s metrics at ``/metrics`` on loopback (once; the server stops with the
    environment) and returns the URL; ``None`` when the environment does not listen on
    loopback (a cluster: its metrics are not exposed on the network unasked),
    ``prometheus_client`` is missing, or ``env`` is a host service's attachment (the service
    serves no ``/metrics``: its tasks send samples only)."""
    if not isinstance(env, cf.NetworkEnvironment):
        return None
    return _CACHE.metrics_url(env)


def open_environments() -> int:
    """How many environments this process holds (for tests: reused workers must not pile up)."""
    return _CACHE.count()


def close_environments() -> None:
    """Closes every environment of this process (they are re-created on next use)."""
    _CACHE.close_all()


def service_settings(settings: EnvSettings, host: str | None, memory: int) -> dict[str, Any]:
    """The settings of the host service a job's tasks on one host attach to: ``settings``' network
    settings with the application's host ``memory`` (``settings.memory`` is a task's own, for
    environments per task) and the default connection limit (a service holds one connection per
    peer host, not one per peer task)."""
    return {
        "memory": memory,
        "segment_size": settings.segment_size,
        "buffer_timeout": settings.buffer_timeout,
        "exclusive_buffers": settings.exclusive_buffers,
        "floating_buffers": settings.floating_buffers,
        "bind": settings.bind or bind_address(host),
        "secret": settings.secret,
        "advertise": settings.advertise,
        "max_connections": EnvSettings.max_connections,
        "spill_dir": settings.spill_dir,
        "wire_compression": settings.wire_compression,
        "tls": dataclasses.asdict(settings.tls) if settings.tls is not None else None,
        "peer_timeout": settings.peer_timeout,
    }


#: The settings that do not name a service: the host's memory is the application's, one value
#: (spark.creditflow.hostMemory), so it neither needs to nor may split the tasks of a host.
UNNAMED_SETTINGS = ("memory",)


def service_name(app_id: str, service: dict[str, Any]) -> str:
    """The host service of application ``app_id`` with ``service`` settings: jobs of one
    application whose network settings agree (segment size, buffers per channel, secret, TLS,
    compression...) share one, whatever their size; another such setting is another service,
    so no task attaches to a service configured otherwise. The memory is not part of the name
    (:data:`UNNAMED_SETTINGS`)."""
    named = {k: v for k, v in service.items() if k not in UNNAMED_SETTINGS}
    digest = hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()[:12]
    app = re.sub(r"[^A-Za-z0-9._-]", "_", app_id)[:44]
    return f"spark-{app}-{digest}"


class _Attachments:
    """This worker process's attachments, by service name and task memory (forgotten in a
    forked child)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.by_name: dict[tuple[str, int], cf.Attachment] = {}

    def get(self, name: str, service: dict[str, Any], memory: int | str) -> cf.Attachment:
        with self.lock:
            if os.getpid() != self.pid:
                self.by_name, self.pid = {}, os.getpid()
            key = (name, cf.parse_bytes(memory))
            a = self.by_name.get(key)
            if a is None or a.closed:
                # The executor's Python daemon (this worker's parent) ends with the executor.
                a = attach_or_start(name, service, owner=os.getppid(), memory=key[1])
                self.by_name[key] = a
            return a

    def count(self) -> int:
        with self.lock:
            return len(self.by_name) if os.getpid() == self.pid else 0


_ATTACHMENTS = _Attachments()


@contextlib.contextmanager
def host_environment(
    settings: EnvSettings, host: str | None, app_id: str, memory: int
) -> Iterator[cf.Attachment]:
    """This task's attachment to its host's service for ``settings`` (started when none runs,
    with ``memory``: the application's host memory, shared by every task attached to it). The
    task's own ``settings.memory`` sizes what its writers hold in place, as an environment's."""
    service = service_settings(settings, host, memory)
    yield _ATTACHMENTS.get(service_name(app_id, service), service, settings.memory)


@contextlib.contextmanager
def task_stack(
    settings: EnvSettings, host: str | None, app_id: str | None, memory: int
) -> Iterator[cf.NetworkEnvironment | cf.Attachment]:
    """A task's network stack: its attachment to its host's service of application ``app_id``
    (with the application's host ``memory``), or, with ``app_id`` None, this worker's own
    environment for ``settings``."""
    if app_id is None:
        with task_environment(settings, host) as env:
            yield env
    else:
        with host_environment(settings, host, app_id, memory) as attached:
            yield attached


def open_attachments() -> int:
    """How many host services this process is attached to (for tests)."""
    return _ATTACHMENTS.count()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def bind_address(host: str | None) -> str:
    """Where a task's environment listens: loopback when its executor's host is loopback
    (local mode), else that host's address, on an ephemeral port."""
    if host is None:
        host = os.environ.get("SPARK_LOCAL_IP") or "127.0.0.1"
    if _is_loopback(host):
        return "127.0.0.1:0"
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        return "0.0.0.0:0"
    return "127.0.0.1:0" if _is_loopback(ip) else f"{ip}:0"


def host_towards(address: str) -> str:
    """This machine's address on the route to ``address`` (``host:port``), without sending
    anything: what a peer there can reach us at."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if _is_loopback(host):
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, int(port or 9)))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"
