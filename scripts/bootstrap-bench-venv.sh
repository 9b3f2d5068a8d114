#!/usr/bin/env bash
# Create the training benchmark's environment (default .venv-bench) and install a creditflow wheel
# into it. Apart from .venv: it holds torch (a few GB with its CUDA libraries from PyPI) and the
# peers (benches/training/requirements*.txt), which the project's tests do not need and one of
# which declares pins that conflict with the project's.
#
# Each requirement marked "# peer" is first resolved on its own against the project's pins
# (pip install --dry-run -c requirements-dev.txt); what pip says goes to VENV/peer-install.json,
# which the benchmark's report quotes. Peers in requirements-nodeps.txt are then installed
# without their declared dependencies. Quick when nothing changed (a stamp of the interpreter
# and the requirement files); the wheel is always reinstalled.
#
# usage: scripts/bootstrap-bench-venv.sh VENV_DIR WHEEL   (env: PYTHON=python3.11)
set -euo pipefail

cd "$(dirname "$0")/.."
venv=${1:?usage: $0 VENV_DIR WHEEL}
wheel=${2:?usage: $0 VENV_DIR WHEEL}
python=${PYTHON:-python3}
reqs=benches/training/requirements.txt
nodeps=benches/training/requirements-nodeps.txt
stamp=$venv/.creditflow-bench-stamp
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if [[ -e $venv ]] && ! "$venv/bin/python" -c 'pass' 2>/dev/null; then
    echo "bootstrap-bench: $venv is broken, recreating it"
    rm -rf "$venv"
fi
if [[ ! -x $venv/bin/python ]]; then
    echo "bootstrap-bench: creating $venv with $("$python" --version)"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip)

want="$("$venv/bin/python" -c 'import sys; print(sys.version)' | head -1) $(cat "$reqs" "$nodeps" requirements-dev.txt | sha256sum | cut -d' ' -f1)"
if [[ ! -f $stamp || "$(cat "$stamp")" != "$want" ]]; then
    echo "bootstrap-bench: installing $reqs into $venv (torch is large: minutes the first time)"
    start=$SECONDS
    "${pip[@]}" install --quiet -r "$reqs"
    notes=$venv/peer-install.json.tmp
    echo '{}' >"$notes"
    for spec in $(sed -n 's/^\([^#[:space:]]*\)[[:space:]]*#[[:space:]]*peer.*/\1/p' "$reqs" "$nodeps"); do
        name=${spec%%[=<>]*}
        if out=$("${pip[@]}" install --dry-run --quiet -c requirements-dev.txt "$spec" 2>&1); then
            verdict="pip resolves $spec with the project's pins"
        else
            verdict="pip cannot install $spec with the project's pins: $(grep -E 'conflict|requires|ERROR' <<<"$out" | head -8 | tr '\n' ' ')"
        fi
        "$venv/bin/python" - "$notes" "$name" "$verdict" <<'EOF'
import json, sys
path, name, verdict = sys.argv[1:]
notes = json.load(open(path))
notes[name] = " ".join(verdict.split())
json.dump(notes, open(path, "w"), indent=1)
EOF
    done
    "${pip[@]}" install --quiet --no-deps -r "$nodeps"
    mv "$notes" "$venv/peer-install.json"
    echo "$want" >"$stamp"
    echo "bootstrap-bench: done in $((SECONDS - start))s"
fi
"${pip[@]}" install --quiet --no-deps --force-reinstall "$wheel"
