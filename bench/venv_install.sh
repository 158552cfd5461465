#!/usr/bin/env bash
# How long a fresh clone's venv takes to install from the wheelhouse: pip, then uv with an empty cache, then uv with
# its cache filled (what scripts/_env.sh does on a machine that has installed once), byte code written in all three.
# Needs the wheelhouse filled (scripts/test.sh did it) and about 15 GB free under $TMPDIR while it runs.
#
#   bash bench/venv_install.sh
set -euo pipefail
source "$(dirname "$0")/../scripts/_env.sh"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/venv-install-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
REQUIREMENTS=("$TORCH_REQUIREMENT" $ZOO_REQUIREMENTS)
PY="$(pick_python)"
UV="$(VENV="$ROOT/.venv" uv_bin)"

timed() {  # timed LABEL COMMAND... : one line, seconds and the load
    local label="$1" t0; shift
    t0=$(date +%s.%N)
    "$@" >/dev/null
    printf '%-58s %7.1f s  (load %s)\n' "$label" "$(echo "$(date +%s.%N) - $t0" | bc)" "$(cut -d' ' -f1 /proc/loadavg)"
}

"$PY" -m venv "$WORK/pip"
timed "pip install (byte code as pip writes it)" \
    "$WORK/pip/bin/python" -m pip install -q --no-index --find-links "$WHEELHOUSE" "${REQUIREMENTS[@]}"
rm -rf "$WORK/pip"
for run in empty filled; do
    "$PY" -m venv "$WORK/uv-$run"
    timed "uv pip install --compile-bytecode, uv cache $run" env UV_CACHE_DIR="$WORK/uv-cache" \
        "$UV" pip install -q --python "$WORK/uv-$run/bin/python" --compile-bytecode --no-index \
        --find-links "$WHEELHOUSE" "${REQUIREMENTS[@]}"
    rm -rf "$WORK/uv-$run"
done
echo "$(nproc) cores; $("$PY" --version); $("$UV" --version); ${REQUIREMENTS[*]}"
