#!/usr/bin/env bash
# Build (or reuse) the local control plane of the end-to-end tests: kube-apiserver and
# kube-controller-manager from the Go module k8s.io/kubernetes, and etcd from go.etcd.io/etcd.
#
# The binaries land in the cache directory, outside the checkout and keyed by version, so a warm
# machine (and CI's fresh clone on it) skips the build:
#
#   ${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}/kube-v$KUBE_VERSION/bin/{kube-apiserver,kube-controller-manager}
#   ${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}/etcd-v$ETCD_VERSION/bin/etcd
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every k8s.io staging module with
# ./staging/... . A throwaway module requires it and maps each of those staging modules to the same
# module at v0.Y.Z, which the module proxy serves.
#
# Idempotent and non-interactive. Needs Go >= the go directive of k8s.io/kubernetes (1.26 for 1.37);
# GOTOOLCHAIN=auto fetches a newer toolchain as a module when the machine's is older.
# The versions live in versions.env beside this script (KUBE_BUILD_VERSION / ETCD_BUILD_VERSION override them; without
# KUBE_BUILD_VERSION the oldest supported version, KUBE_OLDEST_VERSION, is built too); KUBE_BUILD_FORCE=1 rebuilds what is present.
set -euo pipefail

# shellcheck source=versions.env
source "$(dirname "${BASH_SOURCE[0]}")/versions.env"
BUILD_NAME=kube-build
# shellcheck source=module.sh
source "$(dirname "${BASH_SOURCE[0]}")/module.sh"
KUBE_VERSION="${KUBE_BUILD_VERSION:-$KUBE_VERSION}"
ETCD_VERSION="${ETCD_BUILD_VERSION:-$ETCD_VERSION}"

KUBE_DIR="$CACHE_DIR/kube-v$KUBE_VERSION"
ETCD_DIR="$CACHE_DIR/etcd-v$ETCD_VERSION"

usable() {  # usable BINARY... : every one exists and prints its version
    local bin
    for bin in "$@"; do
        [[ -x "$bin" ]] && "$bin" --version >/dev/null 2>&1 || return 1
    done
}

build_kube() {
    local work="$KUBE_DIR/module"
    rm -rf "$work"; mkdir -p "$work" "$KUBE_DIR/bin"
    log "go mod download k8s.io/kubernetes@v$KUBE_VERSION"
    kubernetes_module "$work" compilecache.test/controlplane "$KUBE_VERSION" \
        k8s.io/kubernetes/cmd/kube-apiserver/app k8s.io/kubernetes/cmd/kube-controller-manager/app
    log "resolving the module graph (first run downloads ~1 GB of modules into $GOMODCACHE)"
    (cd "$work" && go mod tidy -e >"$KUBE_DIR/tidy.log" 2>&1) || { tail -n 40 "$KUBE_DIR/tidy.log" >&2; die "go mod tidy failed"; }
    local ldflags
    ldflags=$(kubernetes_ldflags "$KUBE_VERSION")
    log "go build kube-apiserver kube-controller-manager (minutes on 2 cores)"
    (cd "$work" && go build -trimpath -ldflags "$ldflags" -o "$KUBE_DIR/bin/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        >"$KUBE_DIR/build.log" 2>&1) || { tail -n 60 "$KUBE_DIR/build.log" >&2; die "go build failed (log: $KUBE_DIR/build.log)"; }
    rm -rf "$work"
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
if [[ "${KUBE_BUILD_FORCE:-0}" != 1 ]] && usable "$ETCD_DIR/bin/etcd"; then
    log "reusing $ETCD_DIR/bin/etcd"
else
    t0=$(date +%s); build_etcd; log "built etcd v$ETCD_VERSION in $(( $(date +%s) - t0 ))s"
fi
# KUBE_VERSION, then (unless KUBE_BUILD_VERSION names one version) the oldest supported, KUBE_OLDEST_VERSION.
kube_versions=("$KUBE_VERSION")
[[ -z "${KUBE_BUILD_VERSION:-}" && -n "${KUBE_OLDEST_VERSION:-}" ]] && kube_versions+=("$KUBE_OLDEST_VERSION")
for KUBE_VERSION in "${kube_versions[@]}"; do
    KUBE_DIR="$CACHE_DIR/kube-v$KUBE_VERSION"
    if [[ "${KUBE_BUILD_FORCE:-0}" != 1 ]] && usable "$KUBE_DIR/bin/kube-apiserver" "$KUBE_DIR/bin/kube-controller-manager"; then
        log "reusing $KUBE_DIR/bin ($("$KUBE_DIR/bin/kube-apiserver" --version))"
    else
        t0=$(date +%s); build_kube; log "built kube v$KUBE_VERSION in $(( $(date +%s) - t0 ))s"
    fi
    usable "$ETCD_DIR/bin/etcd" "$KUBE_DIR/bin/kube-apiserver" "$KUBE_DIR/bin/kube-controller-manager" \
        || die "the built binaries do not run"
    log "ready: $("$KUBE_DIR/bin/kube-apiserver" --version)"
done
# The build cache is large and only speeds up a rebuild of the same version: keep the module cache.
rm -rf "$GOCACHE"
log "done: etcd $("$ETCD_DIR/bin/etcd" --version | head -n1)"
