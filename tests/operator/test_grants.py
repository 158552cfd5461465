"""Grants: ConfigMaps labelled compilecache.io/allow in the operator's namespace give namespaces stores and
Secrets besides the operator's allow-lists; a change reaches the CompileCaches of those namespaces at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from compilecache_operator import lifecycle
from compilecache_operator.controller.state import Indexes, Settings, State
from compilecache_operator.decisions.warmup_job import JobSettings
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.model.confinement import Confinement, check_confinement, grants_from
from compilecache_operator.model.spec import Defaults, InvalidSpec
from compilecache_operator.model.spec_parse import parse_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.operator.samples import raw_spec

BASE = Confinement(store_hosts=("redis.shared:6379",), store_secrets=("shared-redis",), warmup_service_accounts=())
NAMES = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "compilecache-system", "labels": {"compilecache.io/allow": ""}},
            "data": data}


def spec(url: str, secret: str | None = None) -> Any:
    storage: dict[str, Any] = {"url": url}
    if secret:
        storage["secretRef"] = {"name": secret}
    return parse_spec(raw_spec(storage=storage), Defaults())


@settings(max_examples=80, deadline=None)
@given(team=NAMES, other=NAMES, host=NAMES, secret=NAMES)
def test_a_grant_allows_its_namespaces_only(team: str, other: str, host: str, secret: str) -> None:
    if team == other:
        return
    grants, refused = grants_from([configmap("team", namespaces=f"{team}\n", storeHosts=f"{host}.svc:6380",
                                             storeSecrets=secret)])
    assert not refused
    granted = Confinement(**{**BASE.__dict__, "grants": grants})
    wanted = spec(f"redis://{host}.svc:6380/0", secret)
    check_confinement(granted, team, wanted)
    for confinement, namespace in ((granted, other), (BASE, team)):
        with pytest.raises(InvalidSpec) as caught:
            check_confinement(confinement, namespace, wanted)
        assert {e.path for e in caught.value.errors} == {"spec.storage.url", "spec.storage.secretRef.name"}
    check_confinement(granted, other, spec("redis://redis.shared:6379/0", "shared-redis"))  # the lists still hold


@pytest.mark.parametrize(("data", "said"), [
    ({"storeHosts": "redis:6379"}, "data.namespaces names no namespace"),
    ({"namespaces": "Team_A"}, "'Team_A' is not a namespace name"),
    ({"namespaces": "a", "storeHosts": "*"}, "'*' cannot be granted"),
    ({"namespaces": "a", "storeSecrets": "bad/name"}, "'bad/name' is not a Secret name"),
    ({"namespaces": "a", "hosts": "x"}, "unknown key(s) hosts"),
])
def test_a_bad_grant_is_refused_naming_the_configmap_and_key(data: dict[str, str], said: str) -> None:
    grants, refused = grants_from([configmap("bad", **data), configmap("good", namespaces="b", storeHosts="r:1")])
    assert [g.source for g in grants] == ["ConfigMap compilecache-system/good"]  # the others still grant
    (message,) = refused
    assert message.startswith("ConfigMap compilecache-system/bad: ") and said in message


def test_a_list_not_configured_stays_unconfined() -> None:
    grants, _ = grants_from([configmap("g", namespaces="a", storeHosts="r:1")])
    assert Confinement(grants=grants).for_namespace("a").store_hosts is None


def standby_state(caches: list[tuple[str, str]]) -> State:
    """A State of a replica that does not lead, so that apply_grants calls nothing (no API server), every
    cache settled."""
    state = State(settings=Settings(defaults=Defaults(), jobs=JobSettings(preloader_image="p"), confinement=BASE),
                  metrics=Metrics())
    state.cluster.indexes = Indexes(caches={k: [] for k in caches})
    state.scheduler.settled = {k: ("fingerprint",) for k in caches}
    state.lifecycle.leading = False
    return state


def test_a_change_unsettles_the_caches_of_the_namespaces_it_touches() -> None:
    state = standby_state([("a", "one"), ("b", "two"), ("c", "three")])
    grants, _ = grants_from([configmap("g", namespaces="a,b", storeHosts="r:1")])
    asyncio.run(lifecycle.apply_grants(state, grants))
    assert state.settings.confinement.grants == grants
    assert set(state.scheduler.settled) == {("c", "three")}  # a and b are reconciled again; c is untouched
    state.scheduler.settled = {k: ("fingerprint",) for k in state.cluster.indexes.caches}
    narrower, _ = grants_from([configmap("g", namespaces="b", storeHosts="r:1")])
    asyncio.run(lifecycle.apply_grants(state, narrower))
    assert set(state.scheduler.settled) == {("b", "two"), ("c", "three")}  # only a lost its grant
