#!/usr/bin/env bash
# Every Go build of the suite, in the order the tests need them, each skipped when its binaries are cached:
#
#   linters    kubeconform, kube-score, helm-docs and their schemas (python3 -m tests.infra.linters): the chart tests
#   kube       etcd; kube-apiserver, kube-controller-manager, kubelet, kube-scheduler of KUBE_VERSION in one `go build`
#   node       the pause image, containerd, crictl (tests/infra/node/build.sh): the real node
#   oldest     kube-apiserver of KUBE_OLDEST_VERSION alone (tests/e2e/test_oldest_kubernetes.py)
#
# The Go build cache is kept from one build to the next (they share the standard library and many modules) and
# deleted at the end. Each step's seconds go to $1 (a TSV: name, seconds), each finished step's name to $2 (one a
# line: what the tests wait for, testsupport/builds.py), and "failed <name>" when one fails (the later steps still run).
# scripts/test.sh runs it in the background while the venv is made and the tests that need no build run.
# `builds.sh --check` exits 0 when everything is built already (nothing to run).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="$(command -v /usr/bin/python3 || command -v python3)"  # stdlib and Debian's python3-yaml: no venv needed

if [[ "${1:-}" == --check ]]; then
    # shellcheck source=../../testsupport/kube/versions.env
    source "$root/testsupport/kube/versions.env"
    cache="${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}"
    for bin in "etcd-v$ETCD_VERSION/bin/etcd" "kube-v$KUBE_VERSION/bin/kube-apiserver" \
        "kube-v$KUBE_VERSION/bin/kube-controller-manager" "node-kube-v$KUBE_VERSION/bin/kubelet" \
        "node-kube-v$KUBE_VERSION/bin/kube-scheduler" "containerd-v$CONTAINERD_VERSION/bin/containerd" \
        "containerd-v$CONTAINERD_VERSION/bin/containerd-shim-runc-v2" "containerd-v$CONTAINERD_VERSION/bin/ctr" \
        "crictl-v$CRICTL_VERSION/bin/crictl" "kube-v$KUBE_OLDEST_VERSION/bin/kube-apiserver"; do
        [[ -x "$cache/$bin" ]] || { echo "missing: $cache/$bin"; exit 1; }
    done
    [[ -s "$cache/pause-v$KUBE_VERSION/pause.tar" ]] || { echo "missing: the pause image"; exit 1; }
    cd "$root" && exec "$python" -m tests.infra.linters --check
fi
steps_tsv="${1:-/dev/null}"
done_file="${2:-/dev/null}"
export COMPILECACHE_KEEP_GOCACHE=1
status=0

run_step() {  # run_step NAME COMMAND... : time it, record it, never stop the others
    local name="$1" t0 rc; shift
    t0=$(date +%s)
    "$@"; rc=$?
    printf 'build %s\t%s\n' "$name" "$(( $(date +%s) - t0 ))" >>"$steps_tsv"
    if [[ $rc == 0 ]]; then echo "$name" >>"$done_file"; else echo "failed $name" >>"$done_file"; status=1; fi
}

cd "$root"
run_step linters "$python" -m tests.infra.linters
run_step kube env KUBE_BUILD_ONLY=newest bash testsupport/kube/build.sh
run_step node bash tests/infra/node/build.sh
run_step oldest env KUBE_BUILD_ONLY=oldest bash testsupport/kube/build.sh
rm -rf "${COMPILECACHE_TEST_CACHE:-$HOME/.cache/compilecache-test}/go/build"  # only speeds up a rebuild
echo "all" >>"$done_file"
exit $status
