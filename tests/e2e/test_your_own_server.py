"""docs/your-own-server.md run as written: from an empty store to a warm server pod on the real node, then the
deliberate miss that `compilecache why` names.

The commands come out of the guide's ``<!-- your-own-server -->`` block and run one by one in bash with kubectl on
the PATH and the cluster's admin kubeconfig, in a workspace holding examples/ as it is. What the test stands in
for, and only that:

- the operator, installed as the README's quick start says: here a host process watching the guide's namespace,
  with a redis-server the node's pods reach as its default store (an empty one);
- the image: ``docker build`` of examples/your-own-server/Dockerfile cannot run here (no registry, no network in
  builds). The test builds it from the same Dockerfile with podman, on the e2e workload image instead of
  ``python:3.11-slim``: its ``RUN pip install`` lines and the wheel's COPY are left out, after checking that they
  install torch, transformers and compilecache at the versions the workload image's mounted virtualenv holds
  (with the checkout on PYTHONPATH); every other instruction (the app, WORKDIR, USER, CMD) is the Dockerfile's
  own. The ``compilecache`` command that pip would install is a two-line script calling ``python -m
  cachelib.cli`` (the virtualenv's own script names the host's interpreter path). The image goes into the node's
  containerd under the guide's name, ``registry.example.com/ml/gpt2-server:1.0``, so the YAML is applied as
  written.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import E2E_DIR, python_bin_dir
from tests.infra.images import podman, podman_env
from tests.infra.node import RealNode, ensure_workload_image
from tests.operator.e2e_support import OperatorProcess
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.namespaces import delete_namespace
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.helm, pytest.mark.slow]

ROOT = E2E_DIR.parents[1]
GUIDE = ROOT / "docs" / "your-own-server.md"
EXAMPLE = ROOT / "examples" / "your-own-server"
COMMAND_TIMEOUT = 1800
INSTALLS = re.compile(r"^RUN pip install --no-cache-dir (?P<what>.+?)(?: && rm .*)?$")
SHIM = '#!/bin/sh\nexec python -m cachelib.cli "$@"\n'


def guide_commands() -> list[str]:
    text = GUIDE.read_text()
    block = text[text.index("<!-- your-own-server -->"):].split("```sh\n", 1)[1].split("```", 1)[0]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip() and not c.startswith("#")]


def installed(python: Path, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def containerfile(dockerfile: str, base: str, venv_python: Path) -> str:
    """The guide's Dockerfile on the e2e workload image: the same instructions but FROM and what installs the
    packages the workload image already holds (checked to be those packages, at those versions)."""
    out = [f"FROM {base}"]
    for line in dockerfile.splitlines():
        if not line.strip() or line.startswith("#") or line.startswith("FROM "):
            continue
        match = INSTALLS.match(line)
        if match:
            for requirement in match["what"].split():
                requirement = requirement.strip('"')
                if requirement.startswith("/tmp/compilecache-"):
                    assert requirement.endswith("[metrics]"), requirement
                    continue
                name, _, version = requirement.partition("==")
                assert installed(venv_python, name) == version, f"the workload image has another {name}"
            continue
        if line.startswith("COPY compilecache-") and line.endswith(".whl /tmp/"):
            continue
        out.append(line)
    # pip's console script, and first on PATH (the mounted virtualenv's own names the host's interpreter path)
    out[1:1] = ["COPY compilecache /opt/guide-bin/compilecache",
                "ENV PATH=/opt/guide-bin:/opt/compilecache-test/venv/bin:/usr/local/bin:/usr/bin:/bin"]
    return "\n".join(out) + "\n"


def build_guide_image(node: RealNode, name: str, context: Path, venv_python: Path) -> None:
    """The guide's image built with podman and imported into the node's containerd under ``name``."""
    shutil.copytree(EXAMPLE, context)
    (context / "compilecache").write_text(SHIM)
    (context / "compilecache").chmod(0o755)
    base = ensure_workload_image(node.workload is not None and node.workload.pycache is not None)
    (context / "Containerfile").write_text(containerfile((EXAMPLE / "Dockerfile").read_text(), base, venv_python))
    reference = "localhost/compilecache-test/gpt2-server:guide"
    podman("build", "--quiet", "--file", str(context / "Containerfile"), "--tag", reference, str(context))
    archive = context / "image.tar"
    subprocess.run(["podman", "save", "-q", "--format", "docker-archive", "-o", str(archive), reference],
                   env=podman_env(), check=True, capture_output=True, timeout=300)  # fmt: skip
    node.ctr("images", "import", "--local", str(archive))
    node.ctr("images", "tag", "--force", reference, name)


@pytest.fixture
def guide_namespace(kube_client: KubeClient) -> Iterator[str]:
    (namespace,) = {c.split()[-1] for c in guide_commands() if c.startswith("kubectl create namespace ")}
    yield namespace
    delete_namespace(kube_client, namespace)


def test_the_guide_runs_as_written_from_an_empty_store_to_a_warm_server(
    kube_cluster: LocalCluster, kube_client: KubeClient, real_node: RealNode, redis_server: RedisServer,
    kubectl_bin: Path, crd: None, guide_namespace: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    (cache_doc,) = [d for d in yaml.safe_load_all((EXAMPLE / "compilecache.yaml").read_text()) if d]
    build_guide_image(real_node, cache_doc["spec"]["image"], tmp_path / "image", python_bin_dir() / "python")
    workspace = tmp_path / "guide"
    workspace.mkdir()
    (workspace / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
    env.update(KUBECONFIG=str(kube_cluster.kubeconfig), PATH=os.pathsep.join([str(kubectl_bin.parent), env["PATH"]]))

    operator: OperatorProcess | None = None
    outputs: dict[str, str] = {}
    try:
        for index, command in enumerate(guide_commands()):
            proc = subprocess.run(["bash", "-c", command], cwd=workspace, env=env, capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT)  # fmt: skip
            assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
            outputs[f"{index}: {command}"] = proc.stdout
            if command.startswith("kubectl create namespace "):  # the operator the README's quick start installs
                operator = OperatorProcess(kube_cluster.kubeconfig, guide_namespace, tmp_path / "operator",
                                           "--default-storage-url", redis_server.store_url())  # fmt: skip
                operator.start(kube_client)
        said = list(outputs.values())
        preload = json.loads(next(o for c, o in outputs.items() if "initContainerStatuses" in c))
        assert preload["result"] == "hit", preload
        warm, cold = [o for c, o in outputs.items() if "compilecache why" in c]
        assert "the pod's verdict (compilecache-why.json): hit (none): all 2 graphs hit the warm-up's cache" in warm
        assert "the pod's process against the warm-up: none" in warm, warm
        assert re.search(r"miss \(shape\): 1 of 3 graphs compiled afresh \(shape\): .*\[8, 32\]", cold), cold
        assert "warm this one up too, or compile with dynamic=True" in cold, cold
        assert json.loads(said[-2])["next"], said[-2]
        shown = "\n".join(f"$ {c}\n{o}" for c, o in outputs.items())
        request.node.add_report_section("call", "the guide's outputs", shown)
    finally:
        if operator is not None:
            operator.stop()
            operator.delete_webhook_config(kube_client)
            request.node.add_report_section("teardown", "operator log", operator.log_tail())
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run(["podman", "rmi", "-f", "localhost/compilecache-test/gpt2-server:guide"],
                           env=podman_env(), capture_output=True, timeout=120)  # fmt: skip
