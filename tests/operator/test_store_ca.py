"""A private CA for a rediss:// store: spec.storage.ca mounts one Secret or ConfigMap key at the fixed
path the URL names, in the warm-up's publish container and in the injected preload (and the chart
mounts it into the operator); a URL that does not name that path is refused with the field path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from compilecache_operator.decisions import cacheview, warmup_job
from compilecache_operator.decisions.plan import Variant
from compilecache_operator.decisions.podpatch import patched_pod
from compilecache_operator.model.spec import Defaults, InvalidSpec
from compilecache_operator.model.spec_parse import parse_spec
from compilecache_operator.model.store_ca import STORE_CA_FILE

from tests.chart.chart import Manifest, one, template
from tests.infra.helm import helm_bin, helm_binaries  # noqa: F401  (fixtures)
from tests.operator.crdschema import validator
from tests.operator.restricted import restricted_violations
from tests.operator.samples import SETTINGS, inject, owner, pod, view

URL = f"rediss://redis.cache:6380/0?ca={STORE_CA_FILE}"
MOUNT = {"name": "compilecache-store-ca", "mountPath": "/etc/compilecache/store-ca", "readOnly": True}
VOLUME = {
    "name": "compilecache-store-ca",
    "secret": {"secretName": "redis-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
}
STORAGE = {"url": URL, "ca": {"secretName": "redis-ca"}}


def test_the_publish_container_gets_the_ca() -> None:
    body = owner(storage=STORAGE)
    spec = parse_spec(body["spec"], Defaults())
    job = warmup_job.build_job(body, spec, Variant(id="0123456789", gpu="", image=spec.image),
                               name="cc-mlp-0123456789-g3", job_id="cc", settings=SETTINGS)  # fmt: skip
    pod_spec = job["spec"]["template"]["spec"]
    publish = pod_spec["containers"][0]
    assert MOUNT in publish["volumeMounts"] and VOLUME in pod_spec["volumes"]
    assert publish["command"][-1] == URL
    compile_ = pod_spec["initContainers"][1]
    assert MOUNT not in compile_["volumeMounts"]  # the user's code needs no store access
    assert restricted_violations(pod_spec) == []


def test_the_injected_preload_gets_the_ca_from_a_config_map() -> None:
    v = view(storage={"url": URL, "ca": {"configMapName": "trust-bundle", "key": "bundle.pem"}})
    out = patched_pod(pod(), inject(pod(), v))
    (preload,) = out["spec"]["initContainers"]
    assert MOUNT in preload["volumeMounts"]
    assert {"name": "compilecache-store-ca",
            "configMap": {"name": "trust-bundle", "items": [{"key": "bundle.pem", "path": "ca.crt"}]}} \
        in out["spec"]["volumes"]  # fmt: skip
    assert not any(MOUNT in c.get("volumeMounts", []) for c in out["spec"]["containers"])
    again = patched_pod(out, inject(out, v))
    assert again == out  # idempotent: one volume, one mount


def test_without_a_ca_nothing_is_added() -> None:
    out = patched_pod(pod(), inject(pod(), view()))
    assert not [vol for vol in out["spec"]["volumes"] if vol["name"] == "compilecache-store-ca"]


@pytest.mark.parametrize(
    ("storage", "field", "fragment"),
    [
        ({"url": "rediss://r:6380/0", "ca": {"secretName": "c"}}, "spec.storage.ca", f"ca={STORE_CA_FILE}"),
        ({"url": "redis://r:6379/0", "ca": {"secretName": "c"}}, "spec.storage.ca", "rediss://"),
        ({"url": URL, "ca": {"secretName": "c", "configMapName": "d"}}, "spec.storage.ca", "exactly one"),
        ({"url": URL, "ca": {"secretName": "Not_A_Name"}}, "spec.storage.ca.secretName", "not a Secret name"),
    ],
)
def test_a_ca_the_containers_would_not_find_is_refused(storage: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(owner(storage=storage)["spec"], Defaults())
    found = {e.path: e.message for e in caught.value.errors}
    assert field in found and fragment in found[field], found


def test_the_crd_schema_accepts_it() -> None:
    assert list(validator().iter_errors(owner(storage=STORAGE))) == []


@pytest.mark.helm
def test_the_chart_mounts_the_ca_into_the_operator(helm_bin: Path) -> None:  # noqa: F811
    def operator_pod(*values: str) -> Manifest:
        return one(template(helm_bin, set_values=values), "Deployment")["spec"]["template"]["spec"]

    spec = operator_pod("storeCA.secretName=redis-ca")
    (container,) = spec["containers"]
    assert {"name": "store-ca", "mountPath": "/etc/compilecache/store-ca", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert {"name": "store-ca", "secret": {"secretName": "redis-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}} \
        in spec["volumes"]  # fmt: skip
    assert not [v for v in operator_pod()["volumes"] if v["name"] == "store-ca"]


# -- the default store's CA (the chart's storeCA with a rediss:// storage.url) -----------------------------------
def chart_operator_args(helm: Path, *values: str) -> list[str]:
    (container,) = one(template(helm, set_values=values), "Deployment")["spec"]["template"]["spec"]["containers"]
    return [str(a) for a in container["args"]]


@pytest.mark.helm
@pytest.mark.parametrize("source", ["secretName", "configMapName"])
def test_caches_on_the_default_store_mount_its_ca_in_warm_up_and_preload(helm_bin: Path, source: str) -> None:  # noqa: F811
    from compilecache_operator import main

    args = chart_operator_args(helm_bin, f"storage.url={URL}", f"storeCA.{source}=corp-ca", "storeCA.key=ca.pem")
    given = [a for a in args if a.startswith(("--default-storage-url=", "--default-storage-ca="))]
    assert len(given) == 2, args
    defaults = main.settings_from(main.parse_args([*given, "--webhook-config", "off"])).defaults
    kind = "secret" if source == "secretName" else "configMap"
    name = {"secret": "secretName", "configMap": "name"}[kind]
    items = [{"key": "ca.pem", "path": "ca.crt"}]
    expected = {"name": "compilecache-store-ca", kind: {name: "corp-ca", "items": items}}

    body = owner()
    del body["spec"]["storage"]  # on the default store
    spec = parse_spec(body["spec"], defaults)
    job = warmup_job.build_job(body, spec, Variant(id="0123456789", gpu="", image=spec.image),
                               name="cc-mlp-0123456789-g3", job_id="cc", settings=SETTINGS)  # fmt: skip
    pod_spec = job["spec"]["template"]["spec"]
    assert expected in pod_spec["volumes"] and MOUNT in pod_spec["containers"][0]["volumeMounts"]
    v = cacheview.CacheView(namespace="team-a", name="mlp", ready=True, spec=spec, bundles=view().bundles,
                            current_variants=view().current_variants, job_id="cc-job")
    out = patched_pod(pod(), inject(pod(), v))
    assert MOUNT in out["spec"]["initContainers"][0]["volumeMounts"] and expected in out["spec"]["volumes"]

    own = parse_spec(owner(storage={"url": "redis://other:6379/0"})["spec"], defaults)
    assert own.storage.ca is None  # a store of its own: its own CA or none, never the default store's


@pytest.mark.helm
def test_without_a_ca_in_the_url_the_chart_passes_none(helm_bin: Path) -> None:  # noqa: F811
    args = chart_operator_args(helm_bin, "storage.url=redis://redis:6379/0", "storeCA.secretName=corp-ca")
    assert not [a for a in args if a.startswith("--default-storage-ca")]


@pytest.mark.parametrize(("argv", "said"), [
    (["--default-storage-ca", '{"secretName": "ca"}'], "needs --default-storage-url"),
    (["--default-storage-url", "redis://r:6379/0", "--default-storage-ca", '{"secretName": "ca"}'],
     "--default-storage-ca: the store URL must be rediss://"),
    (["--default-storage-url", URL, "--default-storage-ca", '{"secretName": "Not A Name"}'],
     "--default-storage-ca.secretName"),
])
def test_a_bad_default_ca_stops_the_operator_naming_the_flag(argv: list[str], said: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from compilecache_operator import main

    with pytest.raises(SystemExit):
        main.parse_args([*argv, "--webhook-config", "off"])
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(("url", "said"), [
    ("redis://:hunter2@redis:6379/0", "must not carry user info"),
    ("rediss://admin:hunter2@redis:6380/0", "must not carry user info"),
    ("s3://bucket?endpoint=http://user:hunter2@minio:9000", "a password belongs in the Secret"),
    ("ftp://hunter2.example/x", "has scheme 'ftp'"),
    ("redis://redis.hunter2.example:0/0", "the port '0' is not a port number from 1 to 65535"),
    ("s3://bucket?endpoint=http://minio.hunter2.example:70000", "the endpoint's port '70000' is not a port number"),
])
def test_a_default_store_url_no_cache_could_use_stops_the_operator(url: str, said: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Refused at start-up, naming the flag, as each CompileCache's own URL would be, never echoing a
    password (a default store with user info made every cache on it InvalidSpec)."""
    from compilecache_operator import main

    with pytest.raises(SystemExit) as exited:
        main.parse_args(["--default-storage-url", url, "--webhook-config", "off"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--default-storage-url: " in err and said in err, err
    assert "hunter2" not in err or "hunter2.example" in url
