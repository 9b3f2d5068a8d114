"""scripts/check_layers.py: fails on an upward import and on a cycle, passes on a clean tree,
and passes on this repository."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def check_layers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_layers", ROOT / "scripts" / "check_layers.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# A core with three layers and the files that join them; each test changes one thing.
CLEAN = {
    "rust/core/src/lib.rs": "pub mod base;\npub mod memory;\npub mod gate;\npub use gate::InputGate;\n",
    "rust/core/src/base/mod.rs": "pub mod error;\npub mod units;\n",
    "rust/core/src/base/error.rs": "pub enum Error {}\n",
    "rust/core/src/base/units.rs": "use crate::base::error::Error;\npub fn parse() {}\n",
    "rust/core/src/memory/mod.rs": "mod pool;\npub use pool::Pool;\n",
    "rust/core/src/memory/pool.rs": (
        "use crate::base::{error::Error, units};\n"
        "pub struct Pool;\n"
        "#[cfg(test)]\nmod tests {\n    use crate::gate::InputGate; // tests may use anything\n}\n"
    ),
    "rust/core/src/gate/mod.rs": "mod input;\npub use input::InputGate;\n",
    "rust/core/src/gate/input.rs": (
        "use crate::memory::Pool;\n"
        "pub struct InputGate(Pool);\n"
        "fn f() -> crate::base::error::Error { todo!() }\n"
    ),
    "python/creditflow/__init__.py": (
        "from creditflow._native import Env\nfrom creditflow.errors import Error\n"
    ),
    "python/creditflow/_native.pyi": "class Env: ...\n",
    "python/creditflow/errors.py": "class Error(Exception): ...\n",
    "python/creditflow/spark/__init__.py": "from .exchange import exchange\n",
    "python/creditflow/spark/exchange.py": "import creditflow as cf\ndef exchange() -> None: ...\n",
}


def test_a_clean_tree_passes(check_layers: ModuleType, tmp_path: Path) -> None:
    report = check_layers.check(write(tmp_path, CLEAN), known={})
    assert report.offences == []
    assert report.files == len(CLEAN)
    assert report.imports > 0


def test_an_upward_import_fails_naming_both_files(check_layers: ModuleType, tmp_path: Path) -> None:
    files = dict(CLEAN)
    files["rust/core/src/base/units.rs"] = "use crate::base::error::Error;\nuse crate::gate::InputGate;\n"
    report = check_layers.check(write(tmp_path, files), known={})
    upward = [o for o in report.offences if "imports the higher layer" in o]
    assert upward == [
        "rust/core/src/base/units.rs -> rust/core/src/gate/input.rs: layer base imports the higher layer "
        "gate (crate::gate::InputGate, line 2)"
    ]
    assert check_layers.main([str(tmp_path)]) == 1


def test_an_inline_path_and_a_grouped_use_count_too(check_layers: ModuleType, tmp_path: Path) -> None:
    files = dict(CLEAN)
    files["rust/core/src/memory/pool.rs"] = (
        "use crate::{base::error::Error, gate::{InputGate}};\nfn f() { let _ = crate::gate::InputGate; }\n"
    )
    offences = check_layers.check(write(tmp_path, files), known={}).offences
    upward = [o for o in offences if "imports the higher layer" in o]
    assert len(upward) == 2
    assert all(o.startswith("rust/core/src/memory/pool.rs -> rust/core/src/gate/input.rs:") for o in upward)


def test_a_cycle_between_files_of_one_layer_fails(check_layers: ModuleType, tmp_path: Path) -> None:
    files = dict(CLEAN)
    files["rust/core/src/gate/mod.rs"] = "mod input;\nmod channel;\npub use input::InputGate;\n"
    files["rust/core/src/gate/input.rs"] = "use super::channel::Channel;\npub struct InputGate(Channel);\n"
    files["rust/core/src/gate/channel.rs"] = (
        "use super::input::InputGate;\npub struct Channel(Box<InputGate>);\n"
    )
    offences = check_layers.check(write(tmp_path, files), known={}).offences
    assert offences == [
        "rust/core/src/gate/channel.rs -> rust/core/src/gate/input.rs: files import each other in a cycle: "
        "rust/core/src/gate/channel.rs -> rust/core/src/gate/input.rs -> rust/core/src/gate/channel.rs"
    ]


def test_a_python_cycle_through_a_relative_import_fails(check_layers: ModuleType, tmp_path: Path) -> None:
    files = dict(CLEAN)
    files["python/creditflow/spark/monitor.py"] = "from .exchange import exchange\n"
    files["python/creditflow/spark/exchange.py"] = "from . import monitor\ndef exchange() -> None: ...\n"
    offences = check_layers.check(write(tmp_path, files), known={}).offences
    assert len(offences) == 1
    assert "files import each other in a cycle" in offences[0]
    assert "spark/exchange.py" in offences[0]
    assert "spark/monitor.py" in offences[0]


def test_a_python_upward_import_fails(check_layers: ModuleType, tmp_path: Path) -> None:
    files = dict(CLEAN)
    files["python/creditflow/errors.py"] = "from creditflow.spark import exchange\n"
    offences = check_layers.check(write(tmp_path, files), known={}).offences
    assert any(
        o.startswith("python/creditflow/errors.py -> python/creditflow/spark/exchange.py: layer native")
        for o in offences
    )


def test_this_repository_passes(check_layers: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    report = check_layers.check(ROOT)
    assert report.offences == []
    assert report.files > 100
    assert check_layers.main([str(ROOT)]) == 0
    assert capsys.readouterr().out.startswith("check_layers: ok: ")
