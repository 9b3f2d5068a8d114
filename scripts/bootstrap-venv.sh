#!/usr/bin/env bash
# Create .venv and install requirements-dev.txt into it. Idempotent and quick when nothing changed:
# a stamp file records the interpreter version and a hash of the requirements, and the install is
# skipped while both match. Never uses globally installed Python packages.
#
# usage: scripts/bootstrap-venv.sh [VENV_DIR]   (env: PYTHON=python3.11 to pick the interpreter)
set -euo pipefail

cd "$(dirname "$0")/.."
source scripts/venv-lib.sh
venv=${1:-.venv}
python=${PYTHON:-python3}
reqs=requirements-dev.txt
stamp=$venv/.creditflow-dev-stamp

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "error: $python is missing or older than 3.10 (set PYTHON=...)" >&2
    exit 1
fi

ensure_venv "$venv" "$python" bootstrap

want="$("$venv/bin/python" -c 'import sys; print(sys.version)' | head -1) $(sha256sum "$reqs" | cut -d' ' -f1)"
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
    echo "bootstrap: $venv is up to date"
    exit 0
fi

echo "bootstrap: installing $reqs into $venv"
start=$SECONDS
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
"$venv/bin/python" -m pip install --quiet -r "$reqs"
"$venv/bin/python" -m pip check
echo "$want" >"$stamp"
echo "bootstrap: done in $((SECONDS - start))s"
