#!/usr/bin/env bash
# Build (or reuse) the real node of the end-to-end tests: kubelet and kube-scheduler (testsupport/kube/build.sh builds
# them in one `go build` with kube-apiserver and kube-controller-manager), containerd with its runc shim and ctr,
# crictl, and the pause image from kubernetes' own build/pause/linux/pause.c.
#
# Everything lands in the cache directory, outside the checkout and keyed by version; a present, working
# binary is never rebuilt:
#
#   $CACHE/node-kube-v$KUBE_VERSION/bin/{kubelet,kube-scheduler}
#   $CACHE/containerd-v$CONTAINERD_VERSION/bin/{containerd,containerd-shim-runc-v2,ctr}
#   $CACHE/crictl-v$CRICTL_VERSION/bin/crictl
#   $CACHE/pause-v$KUBE_VERSION/pause.tar     (docker-archive, tag localhost/compilecache-test/pause:3.10)
#
# with CACHE=${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}. runc and the CNI plugins come from
# Debian (runc, containernetworking-plugins); gcc makes the static pause binary. The versions live in
# testsupport/kube/versions.env. NODE_BUILD_FORCE=1 rebuilds what is present. Run it under `nice` on a shared machine.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../../testsupport/kube/versions.env
source "$here/../../../testsupport/kube/versions.env"
BUILD_NAME=node-build
# shellcheck source=../../../testsupport/kube/module.sh
source "$here/../../../testsupport/kube/module.sh"
KUBE_DIR="$CACHE_DIR/node-kube-v$KUBE_VERSION"
CONTAINERD_DIR="$CACHE_DIR/containerd-v$CONTAINERD_VERSION"
CRICTL_DIR="$CACHE_DIR/crictl-v$CRICTL_VERSION"
PAUSE_DIR="$CACHE_DIR/pause-v$KUBE_VERSION"
PAUSE_TAG="localhost/compilecache-test/pause:3.10"

force() { [[ "${NODE_BUILD_FORCE:-0}" == 1 ]]; }
runs() {  # runs BINARY ARGS... : it exists and answers
    [[ -x "$1" ]] && "$@" >/dev/null 2>&1
}

build_containerd() {
    mkdir -p "$CONTAINERD_DIR/bin"
    log "go install containerd, containerd-shim-runc-v2, ctr v$CONTAINERD_VERSION"
    GOBIN="$CONTAINERD_DIR/bin" GOFLAGS= go install -trimpath -tags "no_btrfs no_devmapper no_zfs" \
        -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD_VERSION" \
        "github.com/containerd/containerd/v2/cmd/containerd@v$CONTAINERD_VERSION" \
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@v$CONTAINERD_VERSION" \
        "github.com/containerd/containerd/v2/cmd/ctr@v$CONTAINERD_VERSION" \
        >"$CONTAINERD_DIR/build.log" 2>&1 || { tail -n 40 "$CONTAINERD_DIR/build.log" >&2; die "building containerd failed"; }
}

build_crictl() {
    mkdir -p "$CRICTL_DIR/bin"
    log "go install crictl v$CRICTL_VERSION"
    GOBIN="$CRICTL_DIR/bin" GOFLAGS= go install -trimpath \
        -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v$CRICTL_VERSION" \
        "sigs.k8s.io/cri-tools/cmd/crictl@v$CRICTL_VERSION" \
        >"$CRICTL_DIR/build.log" 2>&1 || { tail -n 40 "$CRICTL_DIR/build.log" >&2; die "building crictl failed"; }
}

build_pause() {
    # A docker-archive written by hand: one layer holding /pause, a config whose entrypoint runs it.
    local src work layer_sha config config_sha
    command -v gcc >/dev/null || die "gcc not found (Debian: apt-get install gcc libc6-dev)"
    src="$GOMODCACHE/k8s.io/kubernetes@v$KUBE_VERSION/build/pause/linux/pause.c"
    [[ -f "$src" ]] || (cd "$CACHE_DIR" && go mod download "k8s.io/kubernetes@v$KUBE_VERSION" >/dev/null 2>&1) || true
    [[ -f "$src" ]] || die "$src not found"
    work="$PAUSE_DIR/work"; rm -rf "$work"; mkdir -p "$work/root" "$work/archive"
    gcc -Os -static -Wall -Werror -DVERSION="v3.10-compilecache" -o "$work/root/pause" "$src"
    strip "$work/root/pause"
    tar --numeric-owner --owner=0 --group=0 --mtime=@0 -C "$work/root" -cf "$work/layer.tar" pause
    layer_sha=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
    mkdir -p "$work/archive/$layer_sha"; mv "$work/layer.tar" "$work/archive/$layer_sha/layer.tar"
    config="{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{\"Entrypoint\":[\"/pause\"],\"User\":\"65535:65535\"},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$layer_sha\"]}}"
    config_sha=$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)
    printf '%s' "$config" >"$work/archive/$config_sha.json"
    printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$config_sha" "$PAUSE_TAG" "$layer_sha" \
        >"$work/archive/manifest.json"
    tar --numeric-owner --owner=0 --group=0 --mtime=@0 -C "$work/archive" -cf "$PAUSE_DIR/pause.tar.tmp" .
    mv "$PAUSE_DIR/pause.tar.tmp" "$PAUSE_DIR/pause.tar"
    echo "$PAUSE_TAG" >"$PAUSE_DIR/tag"
    rm -rf "$work"
}

step() {  # step NAME CHECK-COMMAND... -- BUILD-FUNCTION
    local name="$1"; shift
    local check=() t0
    while [[ "$1" != "--" ]]; do check+=("$1"); shift; done
    shift
    if ! force && "${check[@]}"; then
        log "reusing $name"
    else
        t0=$(date +%s); "$1"; log "built $name in $(( $(date +%s) - t0 ))s"
        "${check[@]}" || die "$name does not run after the build"
    fi
}

log "go: $(go version)"
# kubelet and kube-scheduler, with the control plane's binaries of the same version when they are missing too.
KUBE_BUILD_VERSION="$KUBE_VERSION" KUBE_BUILD_ONLY=newest bash "$here/../../../testsupport/kube/build.sh"
take_build_lock
step "pause image" test -s "$PAUSE_DIR/pause.tar" -- build_pause
step "containerd v$CONTAINERD_VERSION" runs "$CONTAINERD_DIR/bin/containerd" --version -- build_containerd
step "crictl v$CRICTL_VERSION" runs "$CRICTL_DIR/bin/crictl" --version -- build_crictl
[[ "${COMPILECACHE_KEEP_GOCACHE:-0}" == 1 ]] || rm -rf "$GOCACHE"  # only speeds up a rebuild
log "done: $("$KUBE_DIR/bin/kubelet" --version), containerd $("$CONTAINERD_DIR/bin/containerd" --version | cut -d' ' -f3), crictl $("$CRICTL_DIR/bin/crictl" --version | cut -d' ' -f3)"
