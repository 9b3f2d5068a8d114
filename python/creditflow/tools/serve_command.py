"""``creditflow serve NAME [OPTIONS]``: a host service in this process until Ctrl-C or SIGTERM.

Its options are the service's settings (:class:`creditflow.HostService`'s, the same as
:class:`creditflow.NetworkEnvironment`'s), made from the table that declares them
(``creditflow._native.settings()``): ``--memory 256MiB``, ``--peer-timeout 4``,
``--wire-compression lz4``, each with the table's line of docs and default; a flag that is on
by default is turned off with ``--no-...`` (``--no-shared-memory``). Two are given
another way: the secret as a file (``--secret-file``: never on a command line, where other
users can read it) and TLS as its three files (``--tls-cert``, ``--tls-key``, ``--tls-ca``,
with ``--tls-no-client-auth`` for one-way TLS). A setting left out takes the service's default;
a bad value ends the command with a message naming the setting, before anything starts.
``--metrics-port`` serves the service's metrics (:mod:`creditflow.prometheus`: its environment's
families and its own) while it runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from creditflow import HostService
    from creditflow._native import Setting
    from creditflow.prometheus import MetricsServer

__all__ = ["add_parser", "option", "run", "setting_options"]

#: The type a setting's value takes on the command line, by its Python type in the table (a
#: size that takes a unit, ``int | str | None``, stays a string: the service parses ``64MiB``
#: as it does in Python; ``debloat_min_buffer`` is a plain ``int`` of bytes).
_TYPES: dict[str, Callable[[str], Any]] = {"float": float, "int": int}

_METAVARS = {"bytes": "BYTES", "seconds": "SECONDS", "buffers": "N", "count": "N"}


def option(name: str) -> str:
    """The command-line option of setting ``name`` (``peer_timeout`` -> ``--peer-timeout``)."""
    return "--" + name.replace("_", "-")


def _on_by_default(s: Setting) -> bool:
    """Whether ``s`` is a flag that is on unless turned off."""
    return s.unit == "flag" and s.default == "True"


def setting_options() -> dict[str, list[str]]:
    """Every setting of the host service, in its parameter order, with the options that give it
    on the command line."""
    from creditflow import _native
    from creditflow.host import SERVICE_SETTINGS

    table = {s.name: s for s in _native.settings()}
    special = {"secret": ["--secret-file"], "tls": ["--tls-cert", "--tls-key", "--tls-ca"]}
    return {
        name: special.get(name, [option("no_" + name if _on_by_default(table[name]) else name)])
        for name in SERVICE_SETTINGS
    }


def _help(doc: str, default: str) -> str:
    """A setting's line of docs as argparse help, with its default where it has one."""
    text = doc.replace("`", "").replace("%", "%%")
    if default in ("None", "False"):
        return text  # the line says what None stands for; a flag is off unless given
    unquoted = default.strip('"')  # the table writes a string default as a Python literal
    return f"{text} (default {unquoted})"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Adds ``serve`` to the ``creditflow`` command's subcommands and returns its parser."""
    from creditflow import _native

    p = sub.add_parser(
        "serve",
        help="run a host service that tasks of this host attach to",
        description="Runs a host service: one pool, the partitions, the gates and one connection per "
        "pair of hosts for every process of this user and host that calls creditflow.attach(NAME). "
        "Runs until Ctrl-C or SIGTERM (or --idle-timeout with nothing attached). The options are "
        "the settings of a NetworkEnvironment; memory is the whole host's.",
    )
    p.add_argument("name", help="the name processes attach by (A-Z a-z 0-9 . _ -, at most 64)")
    p.add_argument(
        "--idle-timeout", type=float, default=None, help="end after this many seconds with nothing attached"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the service's metrics (its own and its partitions' and gates') in the Prometheus "
        "format at http://ADDR:PORT/metrics (0: any free port); needs creditflow[metrics]",
    )
    p.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="address of the /metrics endpoint (default 127.0.0.1)",
    )
    table = {s.name: s for s in _native.settings()}
    for name, options in setting_options().items():
        s = table[name]
        default = s.means or s.default
        if name == "secret":
            p.add_argument(
                "--secret-file",
                default=None,
                help="file holding the secret every host shares (not on the command line): " + s.doc,
            )
        elif name == "tls":
            p.add_argument("--tls-cert", default=None, help="TLS: PEM file of the certificate chain")
            p.add_argument("--tls-key", default=None, help="TLS: PEM file of its private key")
            p.add_argument("--tls-ca", default=None, help="TLS: PEM file of the certificates it trusts")
            p.add_argument(
                "--tls-no-client-auth",
                action="store_true",
                help="TLS: one-way (peers need no certificate; default mutual)",
            )
        elif _on_by_default(s):
            p.add_argument(
                *options,
                dest=name,
                action="store_false",
                default=None,
                help="turn off (default on): " + _help(s.doc, "None"),
            )
        elif s.unit == "flag":
            p.add_argument(*options, action="store_true", default=None, help=_help(s.doc, default))
        else:
            p.add_argument(
                option(name),
                type=_TYPES.get(s.py_type, str),
                default=None,
                metavar=_METAVARS.get(s.unit, s.unit.upper()),
                help=_help(s.doc, default),
            )
    p.add_argument("--owner", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--on-demand", action="store_true", help=argparse.SUPPRESS)
    return p


def _settings(args: argparse.Namespace, fail: Callable[[str], NoReturn]) -> dict[str, Any]:
    """The settings the command line gives (those left out are not in it)."""
    from creditflow import TLSConfig

    out: dict[str, Any] = {}
    for name in setting_options():
        if name == "secret":
            if args.secret_file is not None:
                try:
                    with open(args.secret_file, encoding="utf-8") as f:
                        out["secret"] = f.read().strip()
                except OSError as exc:
                    fail(f"--secret-file: {exc}")
        elif name == "tls":
            files = (args.tls_cert, args.tls_key, args.tls_ca)
            if any(f is not None for f in files):
                if any(f is None for f in files):
                    fail("TLS needs all three of --tls-cert, --tls-key and --tls-ca")
                out["tls"] = TLSConfig(*files, client_auth=not args.tls_no_client_auth)
            elif args.tls_no_client_auth:
                fail("--tls-no-client-auth goes with --tls-cert, --tls-key and --tls-ca")
        elif (value := getattr(args, name)) is not None:
            out[name] = value
    return out


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``creditflow serve``: a host service in this process until it ends. Returns the exit
    status: 0 when it ended, 130 on Ctrl-C; a bad setting exits 2 with its message (``parser``:
    the subcommand's, from :func:`add_parser`)."""
    from creditflow import CreditflowError, host

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # SIGTERM ends it as Ctrl-C does: partitions released, spill files removed, the name freed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.on_demand:
        settings = json.loads(sys.stdin.read() or "{}")
        idle = args.idle_timeout if args.idle_timeout is not None else host.DEFAULT_IDLE_TIMEOUT
        return host.run_on_demand(args.name, settings, args.owner, idle)

    def fail(message: str) -> NoReturn:
        parser.error(message)  # "creditflow serve: error: ...", exit status 2

    if args.metrics_port is not None:
        if not 0 <= args.metrics_port <= 65535:
            fail(f"--metrics-port must be in 0..65535, got {args.metrics_port}")
        try:
            from creditflow import prometheus
        except ImportError as exc:
            fail(f"--metrics-port: {exc}")
    started = False
    servers: list[MetricsServer] = []

    def ready(service: HostService) -> None:
        nonlocal started
        print(f"creditflow host service {service.name!r} at {service.address}", flush=True)
        if args.metrics_port is not None:
            servers.append(prometheus.serve(service, args.metrics_port, args.metrics_addr))
            print(f"creditflow host service {service.name!r} metrics at {servers[0].url}", flush=True)
        started = True

    try:
        host.serve(args.name, idle_timeout=args.idle_timeout, ready=ready, **_settings(args, fail))
    except KeyboardInterrupt:
        return 130
    except (ValueError, TypeError, OSError, CreditflowError) as exc:
        if started:
            raise
        # Refused before it served (a bad setting, a name taken, a metrics port in use): the
        # message, no traceback.
        fail(str(exc))
    finally:
        for server in servers:
            server.close()
    return 0
