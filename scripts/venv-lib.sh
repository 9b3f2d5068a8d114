# Sourced by the bootstrap scripts.

# ensure_venv VENV PYTHON LABEL: creates the virtual environment VENV with PYTHON, first removing
# one whose interpreter no longer runs (machine changed, pyenv version removed); LABEL prefixes
# what it prints.
ensure_venv() {
    local venv=$1 python=$2 label=$3
    if [[ -e $venv ]] && ! "$venv/bin/python" -c 'pass' 2>/dev/null; then
        echo "$label: $venv is broken, recreating it"
        rm -rf "$venv"
    fi
    if [[ ! -x $venv/bin/python ]]; then
        echo "$label: creating $venv with $("$python" --version)"
        "$python" -m venv "$venv"
    fi
}
