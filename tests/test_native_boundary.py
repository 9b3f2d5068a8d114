"""Python drives the native module: ``creditflow._native`` imports nothing from the package;
the package hands it the exception classes and starts log forwarding and ``/metrics``
servers itself (``creditflow/errors.py``, ``creditflow/env.py``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import creditflow as cf
import creditflow.errors
from creditflow import _native

BINDINGS = Path(__file__).resolve().parents[1] / "rust" / "python" / "src"

ERRORS = {
    name: getattr(creditflow.errors, name) for name in creditflow.errors.__all__ if name != "CreditflowError"
}


def run_python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_bindings_import_no_package_module() -> None:
    for path in sorted(BINDINGS.rglob("*.rs")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not re.search(r"import\w*\(\s*(py,\s*)?\"creditflow", line), f"{path.name}:{n}: {line}"


def test_the_native_module_alone_imports_nothing_and_raises_runtime_error_unregistered() -> None:
    # Loaded without the package: no creditflow.* module is imported, not even to raise.
    out = run_python(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("creditflow._native", {_native.__file__!r})
        native = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(native)
        env = native.NetworkEnvironment(memory="1MiB")
        env.create_partition("p")
        try:
            env.create_partition("p")
        except RuntimeError as e:
            print(type(e).__name__, "|", e)
        env.close()
        print(sorted(m for m in sys.modules if m.startswith("creditflow")))
        """
    )
    error, modules = out.splitlines()
    assert error.startswith("RuntimeError | ")
    assert "InvalidArgumentError" in error
    assert "not registered" in error
    assert modules == "[]", "the native module imported a creditflow module"


def test_core_errors_are_the_registered_classes() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        env.create_partition("p")
        with pytest.raises(cf.InvalidArgumentError):
            env.create_partition("p")
        with pytest.raises(cf.InsufficientBuffersError) as info:
            env.create_partition("big", 1000)
        assert info.value.required == 1001
        assert info.value.segment_size == env.segment_size


def test_registering_other_classes_again_is_refused_and_the_same_ones_are_fine() -> None:
    _native._register_errors(dict(ERRORS))  # what errors.py did at import

    class Other(Exception):
        pass

    with pytest.raises(RuntimeError, match="already registered"):
        _native._register_errors({**ERRORS, "ClosedError": Other})
    with pytest.raises(ValueError, match="ClosedError is missing"):
        _native._register_errors({k: v for k, v in ERRORS.items() if k != "ClosedError"})
    with pytest.raises(ValueError, match="expected exactly"):
        _native._register_errors({**ERRORS, "Extra": Other})
    with pytest.raises(TypeError, match="not an Exception subclass"):
        _native._register_errors({**ERRORS, "ClosedError": int})
    with cf.NetworkEnvironment(memory="1MiB") as env:
        env.close()
        with pytest.raises(cf.ClosedError):
            env.create_partition("p")


def test_the_package_environment_is_the_native_one_plus_python_s_side() -> None:
    env = cf.NetworkEnvironment(memory="1MiB")
    assert isinstance(env, _native.NetworkEnvironment)
    server = env.serve_metrics()
    with env as same:
        assert same is env
    # __exit__ called the subclass's close(): the server stopped with the environment.
    assert env.closed
    assert server.closed
    env.close()  # idempotent
    with pytest.raises(cf.ClosedError):
        env.serve_metrics()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_neither_serves_nor_stops_the_parent_s_threads() -> None:
    out = run_python(
        """
        import os, threading
        import creditflow as cf
        env = cf.NetworkEnvironment(memory="1MiB")
        server = env.serve_metrics()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                env.serve_metrics()
                result = "served"
            except RuntimeError as e:
                result = "fork" if "fork" in str(e) else repr(e)
            env._finalizer()  # the Python side's stop: must leave the parent's threads alone
            os.write(w, result.encode())
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        print(os.read(r, 100).decode())
        assert not server.closed, "the child's close() closed the parent's server"
        assert any(t.name == "creditflow-logs" for t in threading.enumerate())
        env.close()
        assert server.closed
        print(threading.active_count())
        """
    )
    assert out.split() == ["fork", "1"]
