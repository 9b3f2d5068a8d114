#!/usr/bin/env python3
"""Writes the NetworkEnvironment settings table where it is shown, from the one description
in the Rust core (``SETTINGS`` in ``rust/core/src/**/settings.rs``).

    scripts/gen_settings.py [--check] [FILE ...]

Each FILE is a Markdown file, whose table (``setting | default | meaning``) goes between the
lines ``<!-- settings:begin -->`` and ``<!-- settings:end -->``, or a ``.pyi`` stub, whose
``NetworkEnvironment`` class gets the constructor's ``__new__`` signature and the settings
list of its docstring, and whose ``HostService`` gets the same settings (keyword-only, after its
own ``name`` and ``idle_timeout``) in its ``__new__`` signature. Without FILE: README.md and
python/creditflow/_native.pyi.

``--check`` writes nothing and exits 1 when a file differs from what would be written (or
has no markers). The table is read from the Rust source, so no build is needed
(``make settings`` writes, ``make lint`` checks).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- settings:begin -->"
END = "<!-- settings:end -->"
DEFAULT_FILES = (ROOT / "README.md", ROOT / "python" / "creditflow" / "_native.pyi")
#: The stub's line length (pyproject.toml's ruff line-length).
LINE_LENGTH = 110


@dataclass(frozen=True)
class Setting:
    """One entry of the Rust ``SETTINGS`` table (the fields of ``_native.Setting``)."""

    name: str
    py_type: str
    default: str
    means: str | None
    unit: str
    keyword_only: bool
    doc: str

    @property
    def shown_default(self) -> str:
        """The default as docs show it (what a ``None`` default stands for, if it does)."""
        return self.means if self.means is not None else self.default


_STRING = r'"((?:[^"\\]|\\.)*)"'
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "'": "'"}


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES[m.group(1)], text)


def settings_source(root: Path = ROOT) -> Path:
    """The Rust file that defines ``SETTINGS`` (wherever the core's layout puts it)."""
    for path in sorted((root / "rust").rglob("settings.rs")):
        if "pub const SETTINGS: &[Setting]" in path.read_text():
            return path
    raise SystemExit("error: no rust/**/settings.rs defines `pub const SETTINGS: &[Setting]`")


def read_settings(path: Path | None = None) -> list[Setting]:
    """Parses the ``SETTINGS`` table out of the Rust source."""
    text = (path or settings_source()).read_text()
    units = {m.group(1): _unescape(m.group(2)) for m in re.finditer(r"Unit::(\w+) => " + _STRING, text)}
    header = "pub const SETTINGS: &[Setting] = &["
    table = text[text.index(header) + len(header) :]
    table = table[: table.index("\n];")]
    entry = re.compile(
        r"Setting \{\s*"
        rf"name: {_STRING},\s*"
        rf"py_type: {_STRING},\s*"
        rf"default: {_STRING},\s*"
        rf"means: (?:Some\({_STRING}\)|None),\s*"
        r"unit: Unit::(\w+),\s*"
        r"keyword_only: (true|false),\s*"
        rf"doc: {_STRING},\s*"
        r"\}"
    )
    out = []
    end = 0
    for m in entry.finditer(table):
        if table[end : m.start()].strip(" \n,"):
            raise SystemExit(f"error: cannot read the SETTINGS entry near {table[end : m.start()][:80]!r}")
        end = m.end()
        name, py_type, default, means, unit, keyword_only, doc = m.groups()
        out.append(
            Setting(
                name=_unescape(name),
                py_type=_unescape(py_type),
                default=_unescape(default),
                means=None if means is None else _unescape(means),
                unit=units[unit],
                keyword_only=keyword_only == "true",
                doc=_unescape(doc),
            )
        )
    if not out or table[end:].strip(" \n,"):
        raise SystemExit("error: cannot read the SETTINGS table (keep each entry in the literal form)")
    return out


# ------------------------------------------------------------------------------- markdown


def markdown_table(settings: list[Setting]) -> str:
    """The settings as a Markdown table (``setting | default | meaning``)."""
    lines = ["| setting | default | meaning |", "|---|---|---|"]
    for s in settings:
        doc = s.doc.replace("|", "\\|")
        lines.append(f"| `{s.name}` | `{s.shown_default}` | {doc} |")
    return "\n".join(lines) + "\n"


def with_markdown_table(text: str, settings: list[Setting], name: str = "the file") -> str:
    """``text`` with the table between the markers replaced."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(
            f"{name} has no settings table markers: add a line {BEGIN} and a line {END} where "
            "the generated settings table goes (scripts/gen_settings.py fills it in)"
        )
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{markdown_table(settings)}{END}{tail}"


# ----------------------------------------------------------------------------------- stub


def _rst(doc: str) -> str:
    return doc.replace("`", "``")


def stub_docstring(settings: list[Setting], indent: str = "    ") -> str:
    """The native ``NetworkEnvironment``'s docstring, with one entry per setting."""
    width = LINE_LENGTH - len(indent)
    intro = (
        "The native half of ``creditflow.NetworkEnvironment``, which also forwards Rust log "
        "records to ``logging`` and serves ``/metrics``. Settings (from the core's table, "
        "``creditflow._native.settings()``; written by ``scripts/gen_settings.py``):"
    )
    lines = [
        '"""One per process: the buffer pool, partitions, gates, the listener and connections.',
        "",
        *textwrap.wrap(intro, width),
        "",
    ]
    for s in settings:
        entry = f"- ``{s.name}={s.shown_default}`` ({s.unit}): {_rst(s.doc)}"
        lines += textwrap.wrap(entry, width, subsequent_indent="  ", break_on_hyphens=False)
    lines.append('"""')
    return "\n".join(indent + line if line else "" for line in lines) + "\n"


def stub_new(settings: list[Setting], indent: str = "    ") -> str:
    """The native ``NetworkEnvironment.__new__`` declaration."""
    lines = ["def __new__(", "    cls,"]
    star = False
    for s in settings:
        if s.keyword_only and not star:
            lines.append("    *,")
            star = True
        lines.append(f"    {s.name}: {s.py_type} = {s.default},")
    lines.append(") -> Self: ...")
    return "\n".join(indent + line for line in lines) + "\n"


def service_stub_signature(settings: list[Setting], indent: str = "    ") -> str:
    """The native ``HostService.__new__`` signature (its docstring follows it): its own
    parameters, then every setting, keyword-only."""
    lines = [
        "def __new__(",
        "    cls,",
        "    name: str,",
        "    *,",
        "    idle_timeout: float | None = None,",
        *(f"    {s.name}: {s.py_type} = {s.default}," for s in settings),
        ") -> HostService:",
    ]
    return "\n".join(indent + line for line in lines) + "\n"


def _class(tree: ast.Module, cls_name: str, name: str) -> tuple[ast.ClassDef, ast.FunctionDef]:
    """Class ``cls_name`` of the stub and its ``__new__``; ``ValueError`` if either is missing."""
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    if cls is None:
        raise ValueError(f"{name} has no class {cls_name}")
    new = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__new__"), None)
    if new is None:
        raise ValueError(f"{name}: {cls_name} has no __new__")
    return cls, new


def with_stub(text: str, settings: list[Setting], name: str = "the stub") -> str:
    """``text`` (a ``.pyi``) with ``NetworkEnvironment``'s docstring and ``__new__`` and
    ``HostService.__new__``'s signature rewritten."""
    tree = ast.parse(text)
    cls, new = _class(tree, "NetworkEnvironment", name)
    first = cls.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
        raise ValueError(f"{name}: NetworkEnvironment has no docstring")
    _, service_new = _class(tree, "HostService", name)
    service_doc = service_new.body[0]
    if not (isinstance(service_doc, ast.Expr) and isinstance(service_doc.value, ast.Constant)):
        raise ValueError(f"{name}: HostService.__new__ has no docstring")
    lines = text.splitlines(keepends=True)
    # Replace the later blocks first, so the earlier ones' line numbers still hold.
    spans = sorted(
        [
            (first.lineno, first.end_lineno or first.lineno, stub_docstring(settings)),
            (new.lineno, new.end_lineno or new.lineno, stub_new(settings)),
            (service_new.lineno, service_doc.lineno - 1, service_stub_signature(settings)),
        ],
        reverse=True,
    )
    for start, end, block in spans:
        lines[start - 1 : end] = [block]
    return "".join(lines)


# ------------------------------------------------------------------------------------ cli


def generate(path: Path, text: str, settings: list[Setting]) -> str:
    """What ``path`` should contain."""
    if path.suffix == ".pyi":
        return with_stub(text, settings, str(path))
    return with_markdown_table(text, settings, str(path))


def main(argv: list[str] | None = None) -> int:
    """Writes (or with ``--check`` compares) each file; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is not up to date")
    parser.add_argument("files", nargs="*", type=Path, help="Markdown or .pyi files")
    args = parser.parse_args(argv)
    settings = read_settings()
    status = 0
    for path in args.files or DEFAULT_FILES:
        text = path.read_text()
        try:
            want = generate(path, text, settings)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 1
            continue
        if want == text:
            continue
        if args.check:
            diff = difflib.unified_diff(
                text.splitlines(keepends=True), want.splitlines(keepends=True), str(path), "generated"
            )
            sys.stderr.writelines(diff)
            print(f"error: {path}: the settings are not up to date; run `make settings`", file=sys.stderr)
            status = 1
        else:
            path.write_text(want)
            print(f"wrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
