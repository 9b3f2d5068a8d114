"""The settings of ``NetworkEnvironment`` live once, in the Rust core's table (``SETTINGS``,
``creditflow._native.settings()``); everything that repeats them is checked against it here:
the constructor the bindings declare, the ``.pyi`` stub, the README's table, the host
service's constructor (and the settings a service started on demand takes) and Spark's
per-task settings. (The table's defaults against ``EnvConfig::default()`` are checked by the
core's own Rust tests.)"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import creditflow as cf
from creditflow import _native

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
STUB = ROOT / "python" / "creditflow" / "_native.pyi"


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_settings", ROOT / "scripts" / "gen_settings.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_settings"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
SETTINGS = _native.settings()


def value(s: Any, literal: str) -> object:
    """A default as the value it stands for (byte sizes in bytes)."""
    v = ast.literal_eval(literal)
    if s.unit == "bytes" and isinstance(v, str):
        return cf.parse_bytes(v)
    return v


def same(a: object, b: object) -> bool:
    """Equal and of the same type (``10`` is not ``10.0``, ``1`` is not ``True``)."""
    return type(a) is type(b) and a == b


def test_the_generator_reads_the_table_the_module_was_built_with() -> None:
    fields = [f.name for f in dataclasses.fields(gen.Setting)]
    built = [{f: getattr(s, f) for f in fields} for s in SETTINGS]
    source = [dataclasses.asdict(s) for s in gen.read_settings()]
    assert source == built, "rebuild the module (make develop) or fix scripts/gen_settings.py's parser"


def test_every_setting_has_a_type_a_python_default_and_docs() -> None:
    assert [s.name for s in SETTINGS][:3] == ["memory", "segment_size", "bind"]
    for s in SETTINGS:
        ast.literal_eval(s.default)
        if s.means is not None:
            assert s.default == "None", s.name
            ast.literal_eval(s.means)
        assert s.doc, s.name
        assert "\n" not in s.doc, s.name
        assert s.unit in {
            "bytes",
            "seconds",
            "buffers",
            "count",
            "flag",
            "address",
            "choice",
            "secret",
            "TLSConfig",
            "path",
        }


@pytest.mark.parametrize(
    "cls", [cf.NetworkEnvironment, _native.NetworkEnvironment], ids=["package", "native"]
)
def test_the_constructor_takes_the_table_s_settings_in_order(cls: type) -> None:
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params] == [s.name for s in SETTINGS]
    for p, s in zip(params, SETTINGS, strict=True):
        want_kind = p.KEYWORD_ONLY if s.keyword_only else p.POSITIONAL_OR_KEYWORD
        assert p.kind == want_kind, f"{s.name}: {p.kind} in the constructor, keyword_only={s.keyword_only}"
        want = ast.literal_eval(s.default)
        assert same(p.default, want), (
            f"{s.name}: default {p.default!r} in the constructor, {want!r} in the table"
        )


def test_the_constructor_really_parses_that_signature() -> None:
    # The signature above is pyo3's text signature; this calls the constructor with it.
    positional = [ast.literal_eval(s.default) for s in SETTINGS if not s.keyword_only]
    keywords = {s.name: ast.literal_eval(s.default) for s in SETTINGS if s.keyword_only}
    with cf.NetworkEnvironment(*positional, **keywords) as env:
        assert env.segment_size == cf.parse_bytes("32KiB")
    with pytest.raises(TypeError):
        cf.NetworkEnvironment(*positional, False)  # keyword-only after the positional ones


def test_help_shows_the_settings() -> None:
    doc = inspect.getdoc(cf.NetworkEnvironment) or ""
    for s in SETTINGS:
        assert f"``{s.name}={s.means or s.default}``" in doc, s.name
    assert "(*args, **kwargs)" not in str(inspect.signature(cf.NetworkEnvironment))


# ------------------------------------------------------------------------------------- stub


def _stub_class() -> ast.ClassDef:
    tree = ast.parse(STUB.read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NetworkEnvironment")


def test_the_stub_declares_the_table_s_constructor() -> None:
    new = next(n for n in _stub_class().body if isinstance(n, ast.FunctionDef) and n.name == "__new__")
    args = new.args
    positional = args.args[1:]  # after cls
    declared = [(a, False) for a in positional] + [(a, True) for a in args.kwonlyargs]
    defaults = list(args.defaults) + list(args.kw_defaults)
    assert len(defaults) == len(declared), "every setting has a default"
    assert [a.arg for a, _ in declared] == [s.name for s in SETTINGS]
    for (arg, kwonly), default, s in zip(declared, defaults, SETTINGS, strict=True):
        assert kwonly == s.keyword_only, s.name
        assert default is not None
        assert same(ast.literal_eval(default), ast.literal_eval(s.default)), s.name
        assert arg.annotation is not None, s.name
        assert ast.unparse(arg.annotation) == s.py_type, s.name


def test_the_stub_documents_every_setting() -> None:
    doc = " ".join((ast.get_docstring(_stub_class()) or "").split())
    for s in SETTINGS:
        line = " ".join(f"``{s.name}={s.means or s.default}`` ({s.unit}): {s.doc.replace('`', '``')}".split())
        assert line in doc, f"{s.name} is not documented as the table says; run `make settings`"


def test_the_stub_is_what_the_generator_writes() -> None:
    assert gen.main(["--check", str(STUB)]) == 0, "run `make settings`"


# ---------------------------------------------------------------------------- host service

#: ``HostService``'s own parameters; every other one is a setting of the table.
SERVICE_OWN = ("name", "idle_timeout")


def test_the_host_service_takes_every_table_setting_with_the_table_s_defaults() -> None:
    table = {s.name: s for s in SETTINGS}
    params = list(inspect.signature(_native.HostService).parameters.values())
    assert tuple(p.name for p in params[: len(SERVICE_OWN)]) == SERVICE_OWN
    assert [p.name for p in params[len(SERVICE_OWN) :]] == list(table), "the table's settings, in order"
    for p in params[len(SERVICE_OWN) :]:
        assert p.name in table, f"HostService takes {p.name!r}, which is no setting of the table"
        assert p.kind == p.KEYWORD_ONLY, p.name
        want = ast.literal_eval(table[p.name].default)
        assert same(p.default, want), f"{p.name}: default {p.default!r} in HostService, {want!r} in the table"


def test_the_stub_declares_the_host_service_s_settings_with_the_table_s_types() -> None:
    # stubtest checks the stub's names and defaults against the module; this, the types.
    table = {s.name: s for s in SETTINGS}
    tree = ast.parse(STUB.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "HostService")
    new = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__new__")
    settings = [a for a in new.args.kwonlyargs if a.arg not in SERVICE_OWN]
    runtime = list(inspect.signature(_native.HostService).parameters)[len(SERVICE_OWN) :]
    assert [a.arg for a in settings] == runtime
    for a in settings:
        assert a.annotation is not None, a.arg
        assert ast.unparse(a.annotation) == table[a.arg].py_type, a.arg


def test_a_service_started_on_demand_takes_every_setting_the_service_does() -> None:
    from creditflow import host

    runtime = list(inspect.signature(_native.HostService).parameters)[len(SERVICE_OWN) :]
    assert sorted(host.SERVICE_SETTINGS) == sorted(runtime)


def test_creditflow_serve_gives_every_setting_of_the_service_typed_as_the_table_says() -> None:
    """``creditflow serve`` has an option for each of the service's settings (made from the
    table, so a setting added to the service is there too) and hands each one over typed."""
    import argparse

    from creditflow.tools import serve_command

    runtime = list(inspect.signature(_native.HostService).parameters)[len(SERVICE_OWN) :]
    options = serve_command.setting_options()
    assert list(options) == runtime
    parser = argparse.ArgumentParser()
    serve_command.add_parser(parser.add_subparsers(dest="command"))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    offered = {o for a in sub._actions for o in a.option_strings}
    assert all(o in offered for opts in options.values() for o in opts), sorted(offered)
    table = {s.name: s for s in SETTINGS}
    # By the parameter's Python type: a size that takes a unit stays text, as in Python.
    samples = {"int | str | None": ("3MiB", "3MiB"), "float": ("2.5", 2.5), "int": ("7", 7)}
    argv, want = ["serve", "x"], {}
    for name in options.keys() - {"secret", "tls"}:
        unit = table[name].unit
        if unit == "flag":
            # A flag on by default is turned off (--no-...), one off by default on.
            (flag,) = options[name]
            argv.append(flag)
            want[name] = flag == serve_command.option(name)
            assert flag == serve_command.option(name) or table[name].default == "True", flag
        else:
            text, value = samples.get(table[name].py_type, ("some-" + name, "some-" + name))
            argv += [serve_command.option(name), text]
            want[name] = value
    args = parser.parse_args(argv)
    assert serve_command._settings(args, pytest.fail) == want
    # Left out, a setting is not given at all: the service's own default applies.
    assert serve_command._settings(parser.parse_args(["serve", "x"]), pytest.fail) == {}


def test_creditflow_serve_hands_the_service_every_setting_in_a_type_it_takes() -> None:
    """Each option, given its table default as text on the command line, reaches the service in
    a type its parameter takes: the service starts with all of them."""
    import argparse
    import os

    from creditflow.tools import serve_command

    parser = argparse.ArgumentParser()
    serve_command.add_parser(parser.add_subparsers(dest="command"))
    table = {s.name: s for s in SETTINGS}
    argv, named = ["serve", "x"], []
    for name, opts in serve_command.setting_options().items():
        s = table[name]
        default = s.means or s.default
        if name in ("secret", "tls") or s.unit == "flag" or default == "None":
            continue
        argv += [opts[0], ast.literal_eval(default) if default.startswith('"') else default]
        named.append(name)
    given = serve_command._settings(parser.parse_args(argv), pytest.fail)
    assert sorted(given) == sorted(named)
    assert "debloat_min_buffer" in given  # an int of bytes, where other sizes take a unit
    with _native.HostService(f"typed-{os.getpid()}", **given) as service:
        assert not service.closed


# ----------------------------------------------------------------------------------- README


def test_the_readme_settings_table_is_generated() -> None:
    text = README.read_text()
    missing = [marker for marker in (gen.BEGIN, gen.END) if marker not in text]
    assert not missing, (
        f"README.md has no generated settings table: put the lines {gen.BEGIN} and {gen.END} "
        "around it and run `make settings`"
    )
    assert gen.main(["--check", str(README)]) == 0, "run `make settings`"
    table = text.split(gen.BEGIN)[1].split(gen.END)[0]
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", table, re.MULTILINE)
    assert rows == [(s.name, s.means or s.default) for s in SETTINGS]


def test_check_fails_when_a_table_drifts_and_without_markers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "settings.md"
    doc.write_text(f"# Settings\n\n{gen.BEGIN}\n| setting | default | meaning |\n{gen.END}\nafter\n")
    assert gen.main(["--check", str(doc)]) == 1
    assert "make settings" in capsys.readouterr().err
    assert gen.main([str(doc)]) == 0
    assert gen.main(["--check", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Settings\n\n")
    assert text.endswith(f"{gen.END}\nafter\n")
    doc.write_text(text.replace("`0.1`", "`0.05`", 1))
    assert gen.main(["--check", str(doc)]) == 1
    doc.write_text("# Settings\n\nno markers\n")
    assert gen.main(["--check", str(doc)]) == 1
    assert "settings:begin" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ Spark


def test_spark_task_settings_differ_from_the_defaults_only_where_declared() -> None:
    from creditflow.spark._process import OVERRIDES, EnvSettings

    table = {s.name: s for s in SETTINGS}
    fields = {f.name: f for f in dataclasses.fields(EnvSettings)}
    for name, f in fields.items():
        assert name in table, f"EnvSettings.{name} is not a NetworkEnvironment setting"
        s = table[name]
        if f.default is dataclasses.MISSING:
            assert name in OVERRIDES, f"EnvSettings.{name} has no default: say why in OVERRIDES"
            continue
        want = value(s, s.means or s.default)
        got = value(s, repr(f.default))
        if name in OVERRIDES:
            assert not same(got, want), f"EnvSettings.{name} no longer differs: drop it from OVERRIDES"
        else:
            assert same(got, want), (
                f"EnvSettings.{name} = {f.default!r} but NetworkEnvironment's default is "
                f"{s.means or s.default}: use the same, or add it to OVERRIDES with the reason"
            )
    assert set(OVERRIDES) <= set(fields), "OVERRIDES names a setting EnvSettings does not have"
    assert all(reason.strip() for reason in OVERRIDES.values())


def test_exchange_defaults_are_the_task_settings() -> None:
    from creditflow.spark._process import EnvSettings
    from creditflow.spark.exchange import exchange

    defaults = {f.name: f.default for f in dataclasses.fields(EnvSettings)}
    params = inspect.signature(exchange).parameters
    shared = [name for name in params if name in defaults]
    assert shared == [
        "memory",
        "segment_size",
        "buffer_timeout",
        "exclusive_buffers",
        "floating_buffers",
        "spill_dir",
        "wire_compression",
        "shared_memory",
        "tls",
        "peer_timeout",
    ]
    for name in shared:
        assert same(params[name].default, defaults[name]), name


def test_the_spark_layer_accepts_the_peer_timeouts_the_core_does() -> None:
    import creditflow as cf
    from creditflow.spark._process import check_seconds

    for ok in (0, 0.5, 30.0):
        assert check_seconds("peer_timeout", ok) == ok
        cf.NetworkEnvironment(memory="1MiB", peer_timeout=ok).close()
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="peer_timeout must be a non-negative number of seconds"):
            check_seconds("peer_timeout", bad)
        with pytest.raises(ValueError, match="peer_timeout must be a non-negative number of seconds"):
            cf.NetworkEnvironment(memory="1MiB", peer_timeout=bad)
    for wrong in ("5", None, True):
        with pytest.raises(ValueError, match="peer_timeout must be"):
            check_seconds("peer_timeout", wrong)
    # send and Receiver refuse one before anything runs (exchange: tests/test_spark_exchange.py).
    import creditflow.spark as cfs

    with pytest.raises(ValueError, match="peer_timeout must be"):
        cfs.send(None, "127.0.0.1:1", "x", peer_timeout=-1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="peer_timeout must be"):
        cfs.Receiver(peer_timeout=-1)


def test_send_and_receiver_refuse_bad_sizes_and_timeouts_before_anything_runs() -> None:
    import creditflow.spark as cfs

    for bad, match in (
        ({"memory": "banana"}, 'memory: invalid byte size "banana"'),
        ({"segment_size": "32 kilos"}, 'segment_size: invalid byte size "32 kilos"'),
        ({"timeout": 0}, "timeout must be a positive number of seconds or None, got 0"),
        ({"timeout": -5.0}, "timeout must be a positive number"),
    ):
        with pytest.raises(ValueError, match=match):
            cfs.send(None, "127.0.0.1:1", "x", **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        cfs.Receiver(timeout=-1)


def test_the_spark_layer_accepts_the_wire_compressions_the_core_does() -> None:
    import creditflow as cf
    from creditflow.spark._process import WIRE_COMPRESSIONS, check_wire_compression

    for name in (None, *WIRE_COMPRESSIONS):
        check_wire_compression(name)
        cf.NetworkEnvironment(memory="1MiB", wire_compression=name).close()
    for bad in ("gzip", "LZ4", ""):
        with pytest.raises(ValueError, match="wire_compression must be"):
            check_wire_compression(bad)
        with pytest.raises(ValueError, match="wire_compression must be"):
            cf.NetworkEnvironment(memory="1MiB", wire_compression=bad)
