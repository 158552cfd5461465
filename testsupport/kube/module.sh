# What build.sh here and tests/infra/node/build.sh share (sourced after setting BUILD_NAME): the Go settings (module and
# build caches outside the checkout, static binaries), log/die, and the throwaway Go module that builds binaries of
# k8s.io/kubernetes. That module cannot be `go install`ed: its go.mod replaces every k8s.io staging module with
# ./staging/... . The throwaway module requires it and maps each of those staging modules to the same module at
# v0.Y.Z, which the module proxy serves.

CACHE_DIR="${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}"
export GOMODCACHE="$CACHE_DIR/go/mod"
export GOCACHE="$CACHE_DIR/go/build"
export GOFLAGS=-mod=mod
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
export CGO_ENABLED=0
started=$(date +%s)

log() { printf '[%s %4ss] %s\n' "$BUILD_NAME" "$(( $(date +%s) - started ))" "$*"; }
die() { log "error: $*" >&2; exit 1; }

# take_build_lock : wait for any other set-up's Go build in this cache directory (two builds at once would replace each
# other's throwaway module and share two cores); held until this script exits.
take_build_lock() {
    mkdir -p "$CACHE_DIR"
    exec 9>"$CACHE_DIR/.go-build.lock"
    if ! flock -n 9; then
        log "waiting for another set-up's build in $CACHE_DIR to finish"
        flock 9
    fi
}

command -v go >/dev/null || die "go not found on PATH: install Go >= 1.26 (Debian: golang from backports, or go.dev's tarball)"

# kubernetes_module DIR NAME VERSION PACKAGE... : write DIR/go.mod (module NAME requiring k8s.io/kubernetes
# vVERSION, with its go directive, godebug lines and staging replaces) and DIR/tools.go importing PACKAGE...
kubernetes_module() {
    local work="$1" name="$2" version="$3"
    shift 3
    local minor gomod staging mod pkg
    minor="${version#*.}"; minor="${minor%%.*}"
    gomod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@v$version" \
        | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    [[ -f "$gomod" ]] || die "go.mod of k8s.io/kubernetes@v$version not downloaded"
    staging=$(sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*|\1|p' "$gomod")
    [[ -n "$staging" ]] || die "no staging replaces found in $gomod"
    {
        echo "module $name"
        echo
        grep -m1 '^go ' "$gomod"
        grep '^godebug ' "$gomod" || true
        echo
        echo "require k8s.io/kubernetes v$version"
        echo
        echo "replace ("
        for mod in $staging; do echo "	$mod => $mod v0.$minor.${version##*.}"; done
        echo ")"
    } >"$work/go.mod"
    {
        printf '//go:build tools\n\npackage tools\n\nimport (\n'
        for pkg in "$@"; do printf '\t_ "%s"\n' "$pkg"; done
        printf ')\n'
    } >"$work/tools.go"
}

# kubernetes_ldflags VERSION : the -ldflags that stamp the version into kubernetes binaries (what --version prints).
kubernetes_ldflags() {
    local minor="${1#*.}"
    minor="${minor%%.*}"
    echo "-s -w -X k8s.io/component-base/version.gitVersion=v$1 -X k8s.io/component-base/version.gitMajor=1" \
        "-X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
}
