"""The CRD stuck Terminating after the operator is gone, and docs/runbooks.md's recovery, run as written.

A CompileCache with ``deletionPolicy: Delete`` carries the operator's finalizer and has a bundle in a real
redis-server, the operator stops (as ``helm uninstall`` removes it), the CRD is deleted (as the uninstall does with
``crds.keep: false``): the CRD stays Terminating while the cache keeps the operator's finalizer, and its warm-up still
runs. The runbook's commands (its ``<!-- stuck-deletion-recovery -->`` block, in bash with kubectl and the
``compilecache`` CLI of this checkout on the PATH, the cluster's admin kubeconfig) end it: the CRD is gone, no
warm-up pod is left to publish, and the bundle is deleted from the store.
The chart's ValidatingWebhookConfiguration is left behind too, its Service gone (an uninstall that stopped half-way):
it refuses a change of spec it cannot have checked, and is never sent the runbook's finalizer removal.
The CRD is installed again afterwards for the tests that follow in the session.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachelib.publish import publish
from cachelib.stores import open_store
from tests.cachelib.helpers import make_key, make_outdir
from tests.chart.chart import one, template
from tests.chart.e2e_fixtures import CRDS_API, VWC_API
from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.node import RealNode
from tests.operator import e2e_support as e2e
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.crd import install_crd
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CRD_NAME = "compilecaches.compilecache.io"
OURS = "compilecache.io/bundles"


def recovery_block() -> str:
    text = (ROOT / "docs" / "runbooks.md").read_text()
    return text[text.index("<!-- stuck-deletion-recovery -->"):].split("```sh\n", 1)[1].split("```", 1)[0]


def cli_shim(directory: Path) -> Path:
    """``compilecache`` on the PATH: this checkout's CLI."""
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "compilecache"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m cachelib.cli \"$@\"\n")
    shim.chmod(0o755)
    return directory


def bundles(store: str) -> int:
    proc = subprocess.run([sys.executable, "-m", "cachelib.cli", "ls", "--store", store, "-o", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    return len(proc.stdout.splitlines())


def test_the_runbook_ends_a_crd_stuck_terminating_after_the_operator_is_gone(
    operator: e2e.OperatorProcess, kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str,
    redis_server: RedisServer, real_node: RealNode, kubectl_bin: Path, helm_bin: Path, tmp_path: Path,
) -> None:
    ns = kube_namespace
    store = redis_server.store_url()
    # its warm-up still runs when the operator goes: a publish after the runbook's clean-up would leave a bundle
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("doomed", {
        "image": WORKLOAD_IMAGE, "model": {"command": "python -c 'import time; time.sleep(600)'"},
        "storage": {"url": store}, "deletionPolicy": "Delete"}))
    # the operator takes the cache on (its finalizer); a bundle of the cache's key is in the store (published
    # here, as its warm-up would: the test is about the deletion, not the warm-up)
    wait_for(lambda: OURS in (kube_client.get(e2e.cache_path(ns, "doomed"))["metadata"].get("finalizers") or []), 60,
             "the operator's finalizer on the cache")
    with open_store(store) as opened:
        publish(make_outdir(tmp_path / "out", make_key(namespace=ns, name="doomed")), opened)
    assert bundles(store) == 1
    wait_for(lambda: warmup_pods(kube_client, ns), 120, "the warm-up pod")

    check = one(template(helm_bin, set_values=[f"operator.watchNamespaces={{{ns}}}"], namespace=f"{ns}-gone"),
                "ValidatingWebhookConfiguration")
    check["metadata"]["name"] = f"{ns}-left-behind"
    operator.stop()  # the uninstall removes the operator ...
    # a cache the operator never wrote a status for (no status.storage), holding its finalizer all the same
    unseen = e2e.compile_cache("unseen", {"image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"},
                                      "storage": {"url": store}, "deletionPolicy": "Delete"})
    unseen["metadata"]["finalizers"] = [OURS]
    kube_client.post(e2e.cache_path(ns), unseen)
    kube_client.post(VWC_API, check)
    try:
        def refused_unchecked() -> bool:
            try:
                kube_client.merge_patch(e2e.cache_path(ns, "doomed"), {"spec": {"image": f"{WORKLOAD_IMAGE}-changed"}})
            except KubeAPIError as error:
                return "validate.compilecaches.compilecache.io" in error.body
            return False

        wait_for(refused_unchecked, 30, "the left-behind check to refuse a change of spec nobody can check")
        kube_client.delete(f"{CRDS_API}/{CRD_NAME}")  # ... and, with crds.keep: false, the CRD

        # stuck: the CRD is Terminating and stays, the cache keeps its finalizer
        time.sleep(10)
        stuck = kube_client.get(f"{CRDS_API}/{CRD_NAME}")
        assert stuck["metadata"].get("deletionTimestamp"), stuck["metadata"]
        conditions = {c["type"]: c for c in stuck["status"]["conditions"]}
        assert conditions["Terminating"]["status"] == "True", conditions
        cache = kube_client.get(e2e.cache_path(ns, "doomed"))
        assert cache["metadata"]["deletionTimestamp"] and cache["metadata"]["finalizers"] == [OURS]

        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
        env.update(KUBECONFIG=str(kube_cluster.kubeconfig),
                   PATH=os.pathsep.join([str(kubectl_bin.parent), str(cli_shim(tmp_path / "bin")), env["PATH"]]))
        proc = subprocess.run(["bash", "-c", recovery_block()], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        said = f"{proc.stdout}{proc.stderr}\n{what_holds_the_crd(kube_client)}"
        assert proc.returncode == 0, said
        assert not crd_exists(kube_client), said
        assert "unseen" not in proc.stderr, proc.stderr  # nothing to collect for it, and no error
        assert warmup_pods(kube_client, ns) == [], said  # no warm-up left to publish after the clean-up
        assert bundles(store) == 0, said  # what the finalizer would have deleted
    finally:  # its failures are notes on the test's own (testsupport/firstfailure.py)
        kube_client.delete_if_present(f"{VWC_API}/{ns}-left-behind")
        end_a_stuck_crd(kube_client)
        install_crd(kube_client)  # for the tests after this one in the session


def warmup_pods(client: KubeClient, namespace: str) -> list[str]:
    pods = client.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector="compilecache.io/warmup-for")["items"]
    return [p["metadata"]["name"] for p in pods]


def what_holds_the_crd(client: KubeClient) -> str:
    """The CRD's conditions and the CompileCaches left with their finalizers: why it may still be there."""
    crd = client.get_if_present(f"{CRDS_API}/{CRD_NAME}")
    if crd is None:
        return "the CRD is gone"
    conditions = [f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
                  for c in (crd.get("status") or {}).get("conditions") or []]
    try:
        caches = client.get("/apis/compilecache.io/v1alpha1/compilecaches")["items"]
    except KubeAPIError as error:
        caches, conditions = [], [*conditions, f"listing the caches: HTTP {error.status}"]
    held = [f"{c['metadata']['namespace']}/{c['metadata']['name']} {c['metadata'].get('finalizers')}"
            for c in caches if c["metadata"].get("finalizers")]
    return f"the CRD (deleting: {bool(crd['metadata'].get('deletionTimestamp'))}): {conditions}; caches held: {held}"


def end_a_stuck_crd(client: KubeClient) -> None:
    """A CRD this test deleted goes before it is installed again, whatever the runbook did: the finalizers of the
    caches still held are removed here. A CRD never deleted (the test failed before) is left as it is."""
    crd = client.get_if_present(f"{CRDS_API}/{CRD_NAME}")
    if crd is None or not crd["metadata"].get("deletionTimestamp"):
        return
    for cache in client.get("/apis/compilecache.io/v1alpha1/compilecaches")["items"]:
        meta = cache["metadata"]
        if meta.get("finalizers"):
            path = f"/apis/compilecache.io/v1alpha1/namespaces/{meta['namespace']}/compilecaches/{meta['name']}"
            with contextlib.suppress(KubeAPIError):
                client.request("PATCH", path, [{"op": "remove", "path": "/metadata/finalizers"}],
                               content_type="application/json-patch+json")
    wait_for(lambda: not crd_exists(client), 120, f"the old CRD to go ({what_holds_the_crd(client)})")


def crd_exists(client: KubeClient) -> bool:
    return client.exists(f"{CRDS_API}/{CRD_NAME}")
