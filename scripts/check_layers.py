#!/usr/bin/env python3
"""Checks that imports point one way: from a layer to itself or to the layers below it, and
that no files import each other in a circle. Python standard library only; `make lint-layers`.

It reads three trees:

* the Rust core (``rust/core/src``): ``use crate::...`` lines (grouped ones too), inline
  ``crate::a::b`` paths and ``super::`` paths. Each path is mapped to the file that defines
  it: the deepest module file on the path, then through that module's ``pub use``
  re-exports to the file the item comes from. A folder is a layer (``RUST_CORE_LAYERS``);
* the bindings crate (``rust/python/src``), read the same way; a file is a layer;
* the Python package (``python/creditflow``): ``import`` and ``from ... import`` statements
  (relative ones too), read with ``ast``; a module is a layer.

Tests are skipped: ``#[cfg(test)] mod ... { ... }`` blocks and files named ``tests.rs`` may
use anything (the credit tests drive the fuzz model, which sits on top). A ``pub use`` in a
``mod.rs`` or ``lib.rs`` that re-exports its own children is the folder's front door, not an
import.

Exit status 1 with one line per offence (``file -> file: why``) when an import goes from a
lower layer to a higher one or files form a cycle (a strongly connected component of more
than one file); otherwise 0 and a short summary.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# ------------------------------------------------------------------------------------- layers
# Lowest first. A file may import its own layer and the ones before it.

# The core: one folder per layer (`env.rs` is the layer `env`). `lib.rs` is the crate root: it
# declares and re-exports every layer, so it is not checked.
RUST_CORE_LAYERS = ["base", "memory", "serde", "protocol", "partition", "net", "gate", "env", "host", "fuzz"]

# The bindings crate, by file (patterns relative to rust/python/src; "*" is the default for a
# file not named elsewhere).
RUST_BINDINGS_LAYERS: list[tuple[str, list[str]]] = [
    ("errors", ["error.rs"]),
    # blocking, logs, tls, args, arrow_in/out, metrics dicts, spec, partitioners, gate items: the
    # core's types made Python
    ("support", ["*"]),
    ("partition", ["partition.rs"]),
    ("io", ["writer.rs", "gate.rs"]),
    ("env", ["env.rs"]),
    ("host", ["host.rs"]),
    ("module", ["lib.rs"]),
]

# The Python package, by module path relative to python/creditflow (without .py/.pyi).
PYTHON_LAYERS: list[tuple[str, list[str]]] = [
    ("types", ["metrics"]),  # the TypedDicts of the metrics the native module returns
    ("native", ["_native", "errors"]),
    ("library", ["*"]),  # __init__, env, host, logs, samples, prometheus (serve_metrics' exporter), ...
    ("tools", ["tools/*"]),  # what reads metrics back and shows them: snapshot, pipeline, web, charts; certs
    ("spark", ["spark/*"]),  # its Monitor serves the tools' pipeline page
    ("torch", ["torch"]),  # creditflow.torch: tensors from a Spark rank's Receiver
    ("apps", ["tools/cli", "__main__"]),  # the `creditflow` command
]

# Imports that break the rules today, each with the change that removes it. The check skips
# them, and fails when one is gone (so the entry goes with the fix). Keep this short.
KNOWN: dict[tuple[str, str], str] = {}

CORE = "rust/core/src"
BINDINGS = "rust/python/src"
PACKAGE = "python/creditflow"


@dataclass(frozen=True)
class Import:
    """One import of `target` by `source`; `what` is the path as written, `line` 1-based."""

    source: Path
    target: Path
    what: str
    line: int


@dataclass
class Report:
    """What a run found: offences (empty: clean) and what it read."""

    offences: list[str] = field(default_factory=list)
    files: int = 0
    imports: int = 0
    trees: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------- Rust reading

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_STRING = re.compile(r'b?"(?:\\.|[^"\\])*"')
_CHAR = re.compile(r"'(?:\\.|[^'\\])'")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_LINE_COMMENT = re.compile(r"//[^\n]*")
_TEST_MOD = re.compile(
    r"#\[cfg\([^\]]*\btest\b[^\]]*\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{"
)
_USE = re.compile(r"\b(pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]+);")
_CHILD_MOD = re.compile(r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", re.M)
_INLINE = re.compile(r"(?<![\w:])((?:crate|(?:super::)*super)(?:::" + IDENT + r")+)")


def _blank(text: str, start: int, end: int) -> str:
    """`text` with [start, end) replaced by spaces, newlines kept (line numbers stay right)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def _strip(text: str) -> str:
    """Rust source without comments, string and char literals, and `#[cfg(test)]` modules."""
    for pattern in (_BLOCK_COMMENT, _STRING, _LINE_COMMENT, _CHAR):
        text = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    while m := _TEST_MOD.search(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = _blank(text, m.start(), i)
    return text


def _use_paths(tree: str) -> list[tuple[str, str]]:
    """Flattens a use tree: `a::{b, c::{d as e}}` -> [("a::b", "b"), ("a::c::d", "e")]; the
    second item is the name it is known by (`*` for a glob)."""
    tree = re.sub(r"\s+as\s+", "@", tree)
    tree = re.sub(r"\s+", "", tree)
    out: list[tuple[str, str]] = []

    def walk(prefix: str, t: str) -> None:
        if "{" in t and t.endswith("}"):
            head, body = t.split("{", 1)
            body = body[:-1]
            depth, start = 0, 0
            for i, ch in enumerate(body + ","):
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                elif ch == "," and depth == 0:
                    part = body[start:i]
                    if part:
                        walk(prefix + head, part)
                    start = i + 1
            return
        path, _, alias = t.partition("@")
        path = prefix + path
        name = alias or path.rsplit("::", 1)[-1]
        if name == "self":  # `a::{self, b}` names `a`
            path = path[: -len("::self")]
            name = path.rsplit("::", 1)[-1]
        out.append((path, name))

    walk("", tree)
    return out


@dataclass
class RustFile:
    path: Path
    module: list[str]  # module path from the crate root
    text: str  # stripped source
    children: set[str]
    exports: dict[str, list[str]] = field(default_factory=dict)  # re-exported name -> absolute path
    globs: list[list[str]] = field(default_factory=list)


class RustCrate:
    """The module files of one crate, and the imports between them."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self.files: dict[tuple[str, ...], RustFile] = {}
        for path in sorted(src.rglob("*.rs")):
            rel = path.relative_to(src)
            parts = list(rel.with_suffix("").parts)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            text = _strip(path.read_text(encoding="utf-8"))
            self.files[tuple(parts)] = RustFile(path, parts, text, set(_CHILD_MOD.findall(text)))
        for f in self.files.values():
            for m in _USE.finditer(f.text):
                if not m.group(1):
                    continue
                for path, name in _use_paths(m.group(2)):
                    absolute = self.absolute(f, path.split("::"))
                    if absolute is None:
                        continue
                    if name == "*":
                        f.globs.append(absolute[:-1])
                    else:
                        f.exports[name] = absolute

    def absolute(self, f: RustFile, segments: list[str]) -> list[str] | None:
        """`segments` as written in `f`, from the crate root; `None` for another crate's path."""
        first = segments[0]
        if first == "crate":
            return segments[1:]
        if first == "self":
            return f.module + segments[1:]
        if first == "super":
            module = list(f.module)
            while segments and segments[0] == "super":
                module = module[:-1]
                segments = segments[1:]
            return module + segments
        if first in f.children:
            return f.module + segments
        return None

    def resolve(self, absolute: list[str], seen: frozenset[tuple[str, ...]] = frozenset()) -> RustFile | None:
        """The file that defines the item at `absolute`: the deepest module file on the path,
        then through its re-exports."""
        depth = 0
        while depth < len(absolute) and tuple(absolute[: depth + 1]) in self.files:
            depth += 1
        module = self.files.get(tuple(absolute[:depth]))
        if module is None:
            return None
        rest = absolute[depth:]
        key = tuple(absolute)
        if rest and key not in seen:
            if rest[0] in module.exports:
                target = module.exports[rest[0]] + rest[1:]
                return self.resolve(target, seen | {key}) or module
            for glob in module.globs:
                found = self.resolve(glob + rest, seen | {key})
                if found is not None and found is not module and tuple(glob) != tuple(module.module):
                    return found
        return module

    def imports(self) -> Iterable[Import]:
        for f in self.files.values():
            if f.path.name == "tests.rs":
                continue
            facade = f.path.name in ("mod.rs", "lib.rs")
            seen: set[tuple[Path, int]] = set()
            for m in _USE.finditer(f.text):
                line = f.text.count("\n", 0, m.start()) + 1
                for path, _name in _use_paths(m.group(2)):
                    absolute = self.absolute(f, path.split("::"))
                    if absolute is None:
                        continue
                    if facade and m.group(1) and absolute[: len(f.module)] == f.module:
                        continue  # the folder's front door re-exporting its own rooms
                    yield from self._edge(f, absolute, path, line, seen)
            code = _USE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), f.text)
            for m in _INLINE.finditer(code):
                line = code.count("\n", 0, m.start()) + 1
                absolute = self.absolute(f, m.group(1).split("::"))
                if absolute is not None:
                    yield from self._edge(f, absolute, m.group(1), line, seen)

    def _edge(
        self, f: RustFile, absolute: list[str], what: str, line: int, seen: set[tuple[Path, int]]
    ) -> Iterable[Import]:
        target = self.resolve(absolute)
        if target is None or target.path == f.path or (target.path, line) in seen:
            return
        seen.add((target.path, line))
        yield Import(f.path, target.path, what, line)


# ------------------------------------------------------------------------------- Python reading


def _py_module(package: Path, path: Path) -> str:
    rel = path.relative_to(package).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["creditflow", *parts])


def _py_file(package: Path, module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != "creditflow":
        return None
    base = package.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py", base.with_suffix(".pyi")):
        if parts[1:] and candidate.is_file():
            return candidate
    init = package / "__init__.py"
    return init if not parts[1:] and init.is_file() else None


def python_imports(package: Path) -> tuple[list[Path], list[Import]]:
    files = sorted(p for p in package.rglob("*.py*") if p.suffix in (".py", ".pyi"))
    out: list[Import] = []
    for path in files:
        if path.suffix == ".pyi" and path.with_suffix(".py").exists():
            continue
        module = _py_module(package, path)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    here = module.split(".") if is_package else module.split(".")[:-1]
                    base_parts = here[: len(here) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if _py_file(package, sub) else base)
            for target in targets:
                found = _py_file(package, target)
                if found is not None and found != path:
                    out.append(Import(path, found, target, node.lineno))
    return files, out


# ------------------------------------------------------------------------------------ checking


def _pattern_layer(rel: str, layers: Sequence[tuple[str, list[str]]]) -> int:
    """Index of the layer of `rel`: a pattern without wildcards wins, then the longest glob."""
    best: tuple[int, int] | None = None  # (specificity, layer)
    for index, (_name, patterns) in enumerate(layers):
        for pattern in patterns:
            if fnmatch.fnmatchcase(rel, pattern):
                specificity = 10_000 if not any(c in pattern for c in "*?[") else len(pattern)
                if best is None or specificity > best[0]:
                    best = (specificity, index)
    if best is None:
        raise ValueError(f"{rel} is in no layer")
    return best[1]


def _core_layer(src: Path, path: Path) -> int | None:
    rel = path.relative_to(src)
    if rel.parts == ("lib.rs",):
        return None
    name = rel.parts[0].removesuffix(".rs")
    if name not in RUST_CORE_LAYERS:
        raise ValueError(f"{path}: folder {name!r} is not a layer (RUST_CORE_LAYERS in {__file__})")
    return RUST_CORE_LAYERS.index(name)


def _cycles(edges: dict[Path, set[Path]]) -> list[list[Path]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    out: list[list[Path]] = []
    nodes = sorted(set(edges) | {t for ts in edges.values() for t in ts})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def _cycle_path(component: list[Path], edges: dict[Path, set[Path]]) -> list[Path]:
    """One circle through the component's first file (breadth-first, so a shortest one)."""
    members = set(component)
    start = component[0]
    previous: dict[Path, Path] = {}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in members:
                continue
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return [*component, start]


def check(root: Path, known: dict[tuple[str, str], str] | None = None) -> Report:
    """Reads the three trees under `root` (missing ones are skipped) and checks them; `known`
    (default `KNOWN`) are the exceptions."""
    known = KNOWN if known is None else known
    report = Report()

    def rel(p: Path) -> str:
        return p.relative_to(root).as_posix()

    trees: list[tuple[str, list[Path], list[Import], dict[Path, tuple[int, str]]]] = []
    core = root / CORE
    if core.is_dir():
        crate = RustCrate(core)
        layer_of: dict[Path, tuple[int, str]] = {}
        for f in crate.files.values():
            layer = _core_layer(core, f.path)
            if layer is not None:
                layer_of[f.path] = (layer, RUST_CORE_LAYERS[layer])
        trees.append(
            (
                "rust core: " + " < ".join(RUST_CORE_LAYERS),
                [f.path for f in crate.files.values()],
                list(crate.imports()),
                layer_of,
            )
        )
    bindings = root / BINDINGS
    if bindings.is_dir():
        crate = RustCrate(bindings)
        layer_of = {}
        for f in crate.files.values():
            layer = _pattern_layer(f.path.relative_to(bindings).as_posix(), RUST_BINDINGS_LAYERS)
            layer_of[f.path] = (layer, RUST_BINDINGS_LAYERS[layer][0])
        names = " < ".join(name for name, _ in RUST_BINDINGS_LAYERS)
        trees.append(
            (f"bindings: {names}", [f.path for f in crate.files.values()], list(crate.imports()), layer_of)
        )
    package = root / PACKAGE
    if package.is_dir():
        files, imports = python_imports(package)
        layer_of = {}
        for path in files:
            module = path.relative_to(package).with_suffix("").as_posix()
            layer = _pattern_layer(module, PYTHON_LAYERS)
            layer_of[path] = (layer, PYTHON_LAYERS[layer][0])
        names = " < ".join(name for name, _ in PYTHON_LAYERS)
        trees.append((f"python: {names}", files, imports, layer_of))

    seen_known: set[tuple[str, str]] = set()
    for summary, files, imports, layer_of in trees:
        report.trees.append(summary)
        report.files += len(files)
        report.imports += len(imports)
        edges: dict[Path, set[Path]] = {}
        for imp in imports:
            key = (rel(imp.source), rel(imp.target))
            if key in known:
                seen_known.add(key)
                continue
            edges.setdefault(imp.source, set()).add(imp.target)
            src, dst = layer_of.get(imp.source), layer_of.get(imp.target)
            if src is not None and dst is not None and dst[0] > src[0]:
                report.offences.append(
                    f"{rel(imp.source)} -> {rel(imp.target)}: layer {src[1]} imports the higher layer "
                    f"{dst[1]} ({imp.what}, line {imp.line})"
                )
        for component in _cycles(edges):
            circle = _cycle_path(component, edges)
            report.offences.append(
                f"{rel(circle[0])} -> {rel(circle[1])}: files import each other in a cycle: "
                + " -> ".join(rel(p) for p in circle)
            )
    for (src, dst), why in known.items():
        if (src, dst) in seen_known:
            report.known.append(f"{src} -> {dst}: {why}")
        else:
            report.offences.append(f"{src} -> {dst}: no longer imported; remove it from KNOWN in {__file__}")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "root",
        nargs="?",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="repository root (default: the one this script is in)",
    )
    args = parser.parse_args(argv)
    try:
        report = check(args.root.resolve())
    except ValueError as e:
        print(f"check_layers: {e}", file=sys.stderr)
        return 1
    if report.offences:
        for line in report.offences:
            print(line)
        print(f"check_layers: {len(report.offences)} offence(s)", file=sys.stderr)
        return 1
    print(f"check_layers: ok: {report.files} files, {report.imports} imports, no upward import, no cycle")
    for summary in report.trees:
        print(f"  {summary}")
    for line in report.known:
        print(f"  known exception: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
