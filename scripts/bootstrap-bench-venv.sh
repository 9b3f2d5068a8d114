#!/usr/bin/env bash
# Create the training benchmark's environment (default .venv-bench) and install a creditflow wheel
# into it. Apart from .venv: it holds torch (a few GB with its CUDA libraries from PyPI) and the
# peers, which the project's tests do not need (benches/training/requirements*.txt).
#
# Each peer (requirements-peers.txt) is first resolved with requirements.txt (torch and the
# project's pins): one that resolves is installed with its dependencies; one that does not is
# installed without them (requirements-peer-imports.txt has what such peers import), and what pip
# said goes to VENV/peer-install.json, which the benchmark's report quotes. Quick when nothing
# changed (a stamp of the interpreter and the requirement files); the wheel is always reinstalled.
#
# usage: scripts/bootstrap-bench-venv.sh VENV_DIR WHEEL   (env: PYTHON=python3.11)
set -euo pipefail

cd "$(dirname "$0")/.."
source scripts/venv-lib.sh
venv=${1:?usage: $0 VENV_DIR WHEEL}
wheel=${2:?usage: $0 VENV_DIR WHEEL}
python=${PYTHON:-python3}
reqs=benches/training/requirements.txt
peers=benches/training/requirements-peers.txt
imports=benches/training/requirements-peer-imports.txt
stamp=$venv/.creditflow-bench-stamp
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

ensure_venv "$venv" "$python" bootstrap-bench
pip=("$venv/bin/python" -m pip)

# note NAME TEXT: records what became of peer NAME in $venv/peer-install.json.tmp.
note() {
    "$venv/bin/python" -c '
import json, sys
path, name, text = sys.argv[1:]
try:
    notes = json.load(open(path))
except FileNotFoundError:
    notes = {}
notes[name] = " ".join(text.split())
json.dump(notes, open(path, "w"), indent=1)
' "$venv/peer-install.json.tmp" "$1" "$2"
}

want="$("$venv/bin/python" -c 'import sys; print(sys.version)' | head -1) $(cat "$reqs" "$peers" "$imports" requirements-dev.txt | sha256sum | cut -d' ' -f1)"
if [[ ! -f $stamp || "$(cat "$stamp")" != "$want" ]]; then
    echo "bootstrap-bench: installing $reqs into $venv (torch is large: minutes the first time)"
    start=$SECONDS
    rm -f "$venv/peer-install.json.tmp"
    "${pip[@]}" install --quiet -r "$reqs" -r "$imports"
    for spec in $(grep -Ev '^[[:space:]]*(#|$)' "$peers"); do
        if out=$("${pip[@]}" install --dry-run -r "$reqs" "$spec" 2>&1); then
            "${pip[@]}" install --quiet -r "$reqs" "$spec"
            verdict="installed with its dependencies"
        else
            "${pip[@]}" install --quiet --no-deps "$spec"
            why=$(grep -E '^ +(The user requested|.* depends on )' <<<"$out" | head -8 | sed 's/^ *//' | paste -sd ';' -)
            verdict="pip cannot install it next to torch and the project's pins ($why); installed without its declared dependencies"
        fi
        echo "bootstrap-bench: $spec: $verdict"
        note "${spec%%[=<>]*}" "$verdict"
    done
    mv "$venv/peer-install.json.tmp" "$venv/peer-install.json"
    echo "$want" >"$stamp"
    echo "bootstrap-bench: done in $((SECONDS - start))s"
fi
"${pip[@]}" install --quiet --no-deps --force-reinstall "$wheel"
