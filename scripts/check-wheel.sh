#!/usr/bin/env bash
# Check that a built wheel is the one we mean to ship: a single abi3 wheel carrying the compiled
# module, the hand-written stub, the py.typed marker and the pipeline page (creditflow top --web),
# and nothing but the library (the demos live in examples/, the tests in tests/).
# usage: scripts/check-wheel.sh dist/creditflow-*.whl
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "error: expected exactly one wheel, got $#: $*" >&2
    exit 1
fi
python=${PYTHON_FOR_CHECK:-python3}
"$python" - "$1" <<'PY'
import sys
import zipfile

wheel = sys.argv[1]
names = set(zipfile.ZipFile(wheel).namelist())
problems = []
if "-abi3-" not in wheel.rsplit("/", 1)[-1]:
    problems.append("wheel is not tagged abi3")
for required in (
    "creditflow/__init__.py",
    "creditflow/py.typed",
    "creditflow/_native.pyi",
    "creditflow/tools/pipeline.html",  # the page of `creditflow top --web` (package data)
):
    if required not in names:
        problems.append(f"missing {required}")
for name in sorted(names):
    top = name.split("/", 1)[0]
    if not (top == "creditflow" or top.startswith("creditflow-")):  # the package, its .dist-info
        problems.append(f"not part of the library: {name}")
    elif name.startswith("creditflow/") and "demo" in name:
        problems.append(f"an example program in the library: {name}")
if not any(n.startswith("creditflow/_native.") and n.endswith((".so", ".pyd")) for n in names):
    problems.append("missing the compiled creditflow/_native module")
if problems:
    sys.exit(f"{wheel}: " + "; ".join(problems))
print(f"check-wheel: {wheel} ok ({len(names)} files)")
PY
