#!/usr/bin/env bash
# Check that a built wheel is the one we mean to ship: a single abi3 wheel carrying the compiled
# module, the hand-written stub and the py.typed marker.
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
for required in ("creditflow/__init__.py", "creditflow/py.typed", "creditflow/_native.pyi"):
    if required not in names:
        problems.append(f"missing {required}")
if not any(n.startswith("creditflow/_native.") and n.endswith((".so", ".pyd")) for n in names):
    problems.append("missing the compiled creditflow/_native module")
if problems:
    sys.exit(f"{wheel}: " + "; ".join(problems))
print(f"check-wheel: {wheel} ok ({len(names)} files)")
PY
