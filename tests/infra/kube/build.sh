#!/usr/bin/env bash
# Build (or reuse) kube-apiserver and kube-controller-manager for the end-to-end tests.
#
# No published package ships a kube-apiserver binary. Debian bookworm's `kubernetes` source package
# builds one offline with Debian's own Go toolchain. The binaries land in the cache directory
# (outside the checkout) so that a warm machine skips the build:
#
#   ${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}/kube/bin/{kube-apiserver,kube-controller-manager}
#
# Idempotent and non-interactive; run as root on Debian bookworm. etcd comes from Debian's etcd-server.
# Set KUBE_BUILD_FORCE=1 to rebuild even when the binaries are present.
set -euo pipefail

KUBE_SOURCE_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
KUBE_GIT_VERSION_STRING="v1.20.2"
BINARIES=(kube-apiserver kube-controller-manager)
RUNTIME_PACKAGES=(etcd-server)
BUILD_PACKAGES=(golang-go dpkg-dev golang-github-modern-go-reflect2-dev rsync make gcc libc6-dev ca-certificates)

CACHE_DIR="${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}"
KUBE_DIR="$CACHE_DIR/kube"
BIN_DIR="$KUBE_DIR/bin"
started=$(date +%s)

log() { printf '[kube-build %3ss] %s\n' "$(( $(date +%s) - started ))" "$*"; }
die() { log "error: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (it installs Debian packages with apt-get)"
command -v apt-get >/dev/null || die "apt-get not found: this script needs Debian bookworm"

export DEBIAN_FRONTEND=noninteractive

apt_updated=0
apt_install() {
    local missing=()
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        log "packages already installed: $*"
        return
    fi
    if [[ $apt_updated -eq 0 ]]; then
        log "apt-get update"
        apt-get update -qq
        apt_updated=1
    fi
    log "apt-get install ${missing[*]}"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

binaries_usable() {
    local name
    for name in "${BINARIES[@]}"; do
        [[ -x "$BIN_DIR/$name" ]] || return 1
        "$BIN_DIR/$name" --version >/dev/null 2>&1 || return 1
    done
}

apt_install "${RUNTIME_PACKAGES[@]}"
command -v etcd >/dev/null || die "etcd not on PATH after installing etcd-server"

if [[ "${KUBE_BUILD_FORCE:-0}" != 1 ]] && binaries_usable; then
    for name in "${BINARIES[@]}"; do
        log "reusing $BIN_DIR/$name ($("$BIN_DIR/$name" --version))"
    done
    log "done (nothing to build)"
    exit 0
fi

apt_install "${BUILD_PACKAGES[@]}"

# A private apt configuration holding deb-src twins of the machine's Debian entries: the machine's
# own /etc/apt stays untouched.
APT_DIR="$KUBE_DIR/apt"
rm -rf "$APT_DIR"
mkdir -p "$APT_DIR/sources.list.d" "$APT_DIR/lists/partial" "$APT_DIR/archives/partial"
shopt -s nullglob
sources=(/etc/apt/sources.list.d/*.sources)
lists=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list)
shopt -u nullglob
for file in "${sources[@]}"; do
    # deb822 stanzas: keep those whose URIs are Debian's archive, turn "Types: deb" into "Types: deb-src".
    awk 'BEGIN { RS=""; ORS="\n\n" }
         /URIs:[^\n]*debian/ && /Types:[^\n]*deb/ { sub(/Types:[^\n]*/, "Types: deb-src"); print }' \
        "$file" >"$APT_DIR/sources.list.d/$(basename "$file")"
done
for file in "${lists[@]}"; do
    [[ -f "$file" ]] || continue
    grep -E '^deb[[:space:]].*debian' "$file" | sed -E 's/^deb[[:space:]]/deb-src /' \
        >"$APT_DIR/sources.list.d/$(basename "$file" .list)-src.list" || true
done
grep -rqs . "$APT_DIR/sources.list.d" || die "no Debian source entry found under /etc/apt to derive a deb-src entry from"
APT_OPTS=(
    -o "Dir::Etc::SourceList=/dev/null"
    -o "Dir::Etc::SourceParts=$APT_DIR/sources.list.d"
    -o "Dir::State::Lists=$APT_DIR/lists"
    -o "Dir::Cache::Archives=$APT_DIR/archives"
    -o "APT::Sandbox::User=root"
)
log "apt-get update (private deb-src lists in $APT_DIR)"
apt-get "${APT_OPTS[@]}" update -qq

SRC_DIR="$KUBE_DIR/src"
rm -rf "$SRC_DIR"
mkdir -p "$SRC_DIR"
log "apt-get source kubernetes=$KUBE_SOURCE_VERSION"
(cd "$SRC_DIR" && apt-get "${APT_OPTS[@]}" source -qq "kubernetes=$KUBE_SOURCE_VERSION" >/dev/null)
TREE=$(find "$SRC_DIR" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
[[ -n "$TREE" && -f "$TREE/Makefile" ]] || die "unpacked source tree not found under $SRC_DIR"
log "source tree: $TREE"

# The vendored reflect2 1.0.1 crashes under Go >= 1.18; Debian's packaged copy (1.0.2) does not.
REFLECT2=/usr/share/gocode/src/github.com/modern-go/reflect2
[[ -d "$REFLECT2" ]] || die "$REFLECT2 missing (golang-github-modern-go-reflect2-dev)"
log "replacing vendor/github.com/modern-go/reflect2 with $REFLECT2"
rm -rf "$TREE/vendor/github.com/modern-go/reflect2"
mkdir -p "$TREE/vendor/github.com/modern-go/reflect2"
find "$REFLECT2" -maxdepth 1 -type f -name '*.go' ! -name '*_test.go' -exec cp {} "$TREE/vendor/github.com/modern-go/reflect2/" \;
find "$REFLECT2" -maxdepth 1 -type f -name '*.s' -exec cp {} "$TREE/vendor/github.com/modern-go/reflect2/" \;

export GOCACHE="$KUBE_DIR/go-cache"
export GOPATH="$KUBE_DIR/gopath"
export GOFLAGS="-mod=vendor"
export GO111MODULE=on
export GOPROXY=off
export KUBE_GIT_VERSION="$KUBE_GIT_VERSION_STRING"
export KUBE_GIT_TREE_STATE=clean
export KUBE_GIT_COMMIT=debian-"$KUBE_SOURCE_VERSION"
mkdir -p "$GOCACHE" "$GOPATH"
log "go: $(go version)"

mkdir -p "$BIN_DIR"
for name in "${BINARIES[@]}"; do
    log "make WHAT=cmd/$name"
    t0=$(date +%s)
    make -C "$TREE" WHAT="cmd/$name" >"$KUBE_DIR/build-$name.log" 2>&1 \
        || { tail -n 60 "$KUBE_DIR/build-$name.log" >&2; die "make WHAT=cmd/$name failed (log: $KUBE_DIR/build-$name.log)"; }
    out=$(find "$TREE/_output" -type f -name "$name" -perm -u+x | head -n1)
    [[ -n "$out" ]] || die "built $name not found under $TREE/_output"
    install -m 0755 "$out" "$BIN_DIR/$name.new"
    mv -f "$BIN_DIR/$name.new" "$BIN_DIR/$name"
    log "built $name in $(( $(date +%s) - t0 ))s: $("$BIN_DIR/$name" --version)"
done

log "cleaning the build tree and Go caches"
chmod -R u+w "$SRC_DIR" "$GOPATH" 2>/dev/null || true
rm -rf "$SRC_DIR" "$GOCACHE" "$GOPATH" "$APT_DIR"

binaries_usable || die "binaries in $BIN_DIR do not run"
log "done: binaries in $BIN_DIR"
