#!/usr/bin/env bash
# Build (or reuse) the Kubernetes binaries of the end-to-end tests: kube-apiserver, kube-controller-manager, kubelet and
# kube-scheduler of KUBE_VERSION from the Go module k8s.io/kubernetes in ONE `go build` (the four share most of their
# packages, compiled once), etcd from go.etcd.io/etcd, and kube-apiserver alone of the oldest supported version.
#
# The binaries land in the cache directory, outside the checkout and keyed by version, so a warm
# machine (and CI's fresh clone on it) skips the build:
#
#   ${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}/kube-v$KUBE_VERSION/bin/{kube-apiserver,kube-controller-manager}
#   ${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}/node-kube-v$KUBE_VERSION/bin/{kubelet,kube-scheduler}
#   ${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}/kube-v$KUBE_OLDEST_VERSION/bin/kube-apiserver
#   ${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}/etcd-v$ETCD_VERSION/bin/etcd
#
# Only what is missing is built: one `go build` of the missing binaries of a version.
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every k8s.io staging module with
# ./staging/... . A throwaway module requires it and maps each of those staging modules to the same
# module at v0.Y.Z, which the module proxy serves.
#
# Idempotent and non-interactive; two set-ups at once take turns (a lock in the cache directory). Needs Go >= the go
# directive of k8s.io/kubernetes (1.26 for 1.37); GOTOOLCHAIN=auto fetches a newer toolchain as a module when the
# machine's is older. The versions live in versions.env beside this script (KUBE_BUILD_VERSION / ETCD_BUILD_VERSION
# override them; without KUBE_BUILD_VERSION the oldest supported version, KUBE_OLDEST_VERSION, is built too: its API
# server only, which is all tests/e2e/test_oldest_kubernetes.py runs); KUBE_BUILD_ONLY=newest or oldest builds etcd and
# that one (tests/infra/builds.sh makes them apart, in the order the tests need them); KUBE_BUILD_FORCE=1 rebuilds what
# is present.
# The Go build cache is deleted at the end (COMPILECACHE_KEEP_GOCACHE=1 keeps it for a later build of the same set-up:
# tests/infra/builds.sh).
set -euo pipefail

# shellcheck source=versions.env
source "$(dirname "${BASH_SOURCE[0]}")/versions.env"
BUILD_NAME=kube-build
# shellcheck source=module.sh
source "$(dirname "${BASH_SOURCE[0]}")/module.sh"
KUBE_VERSION="${KUBE_BUILD_VERSION:-$KUBE_VERSION}"
ETCD_VERSION="${ETCD_BUILD_VERSION:-$ETCD_VERSION}"

ETCD_DIR="$CACHE_DIR/etcd-v$ETCD_VERSION"

usable() {  # usable BINARY... : every one exists and prints its version
    local bin
    for bin in "$@"; do
        [[ -x "$bin" ]] && "$bin" --version >/dev/null 2>&1 || return 1
    done
}

# The four binaries of a version and where each lands.
declare -A KUBE_TARGETS=(
    [kube-apiserver]=kube-v [kube-controller-manager]=kube-v [kubelet]=node-kube-v [kube-scheduler]=node-kube-v
)

target_path() {  # target_path BINARY VERSION
    echo "$CACHE_DIR/${KUBE_TARGETS[$1]}$2/bin/$1"
}

build_kube() {  # build_kube VERSION BINARY... : one `go build` of these binaries of k8s.io/kubernetes at VERSION
    local version="$1"; shift
    local work="$CACHE_DIR/kube-v$version/module" out="$CACHE_DIR/kube-v$version/out" bin packages=() imports=()
    rm -rf "$work" "$out"; mkdir -p "$work" "$out"
    for bin in "$@"; do packages+=("k8s.io/kubernetes/cmd/$bin"); imports+=("k8s.io/kubernetes/cmd/$bin/app"); done
    log "go mod download k8s.io/kubernetes@v$version"
    kubernetes_module "$work" compilecache.test/kube "$version" "${imports[@]}"
    log "resolving the module graph (first run downloads ~1 GB of modules into $GOMODCACHE)"
    (cd "$work" && go mod tidy -e >"$CACHE_DIR/kube-v$version/tidy.log" 2>&1) \
        || { tail -n 40 "$CACHE_DIR/kube-v$version/tidy.log" >&2; die "go mod tidy failed"; }
    local ldflags
    ldflags=$(kubernetes_ldflags "$version")
    log "go build $* v$version (one build; minutes on 2 cores)"
    (cd "$work" && go build -trimpath -ldflags "$ldflags" -o "$out/" "${packages[@]}" \
        >"$CACHE_DIR/kube-v$version/build.log" 2>&1) \
        || { tail -n 60 "$CACHE_DIR/kube-v$version/build.log" >&2; die "go build failed (log: $CACHE_DIR/kube-v$version/build.log)"; }
    for bin in "$@"; do
        mkdir -p "$(dirname "$(target_path "$bin" "$version")")"
        mv "$out/$bin" "$(target_path "$bin" "$version")"
    done
    rm -rf "$work" "$out"
}

missing_kube() {  # missing_kube VERSION BINARY... : the binaries among these that are absent or do not run
    local version="$1" bin; shift
    for bin in "$@"; do
        [[ "${KUBE_BUILD_FORCE:-0}" != 1 ]] && usable "$(target_path "$bin" "$version")" || echo "$bin"
    done
}

ensure_kube() {  # ensure_kube VERSION BINARY... : build the missing ones, in one `go build`
    local version="$1"; shift
    local missing t0
    mapfile -t missing < <(missing_kube "$version" "$@")
    if [[ ${#missing[@]} -eq 0 ]]; then
        log "reusing $* v$version"
    else
        t0=$(date +%s); build_kube "$version" "${missing[@]}"; log "built ${missing[*]} v$version in $(( $(date +%s) - t0 ))s"
    fi
    for bin in "$@"; do usable "$(target_path "$bin" "$version")" || die "$bin v$version does not run after the build"; done
    log "ready: $("$(target_path kube-apiserver "$version")" --version)"
}

build_etcd() {
    # etcd's server module carries replace directives too (so no `go install mod@version`): a
    # throwaway module requires it and builds its main package.
    local work="$ETCD_DIR/module"
    rm -rf "$work"; mkdir -p "$work" "$ETCD_DIR/bin"
    printf 'module compilecache.test/etcd\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$ETCD_VERSION" >"$work/go.mod"
    printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$work/tools.go"
    log "go build go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
    (cd "$work" && go mod tidy -e >"$ETCD_DIR/build.log" 2>&1 \
        && go build -trimpath -ldflags "-s -w" -o "$ETCD_DIR/bin/etcd" go.etcd.io/etcd/server/v3 >>"$ETCD_DIR/build.log" 2>&1) \
        || { tail -n 40 "$ETCD_DIR/build.log" >&2; die "building etcd failed (log: $ETCD_DIR/build.log)"; }
    rm -rf "$work"
}

log "go: $(go version)"
take_build_lock
if [[ "${KUBE_BUILD_FORCE:-0}" != 1 ]] && usable "$ETCD_DIR/bin/etcd"; then
    log "reusing $ETCD_DIR/bin/etcd"
else
    t0=$(date +%s); build_etcd; log "built etcd v$ETCD_VERSION in $(( $(date +%s) - t0 ))s"
fi
case "${KUBE_BUILD_ONLY:-all}" in
    all|newest) ensure_kube "$KUBE_VERSION" kube-apiserver kube-controller-manager kubelet kube-scheduler ;;
esac
# The oldest supported version (unless KUBE_BUILD_VERSION names one version): its API server alone.
if [[ -z "${KUBE_BUILD_VERSION:-}" && -n "${KUBE_OLDEST_VERSION:-}" ]]; then
    case "${KUBE_BUILD_ONLY:-all}" in all|oldest) ensure_kube "$KUBE_OLDEST_VERSION" kube-apiserver ;; esac
fi
[[ "${COMPILECACHE_KEEP_GOCACHE:-0}" == 1 ]] || rm -rf "$GOCACHE"  # only speeds up a rebuild of the same version
log "done: etcd $("$ETCD_DIR/bin/etcd" --version | head -n1)"
