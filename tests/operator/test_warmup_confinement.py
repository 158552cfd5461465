"""Every Secret a warm-up can reach is confined: a Secret its compile container reads (``warmup.env[].valueFrom.
secretKeyRef``, a ``warmup.volumes[].secret``), one its image is pulled with (``warmup.imagePullSecrets``), and its
ServiceAccount's API token (``warmup.automountServiceAccountToken``). Each outside the cluster admin's lists (and the
namespace's grants) is refused with its own field path, in the operator's check (the reconcile, no Job) and in the
validating webhook's answer alike; what is allowed still reaches the Job. Specs generated, lists generated."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from compilecache_operator.admission.validation import review_cache
from compilecache_operator.controller import reconcile
from compilecache_operator.controller.reconcile import Snapshot
from compilecache_operator.main import parse_args, settings_from
from compilecache_operator.model.confinement import Confinement, check_confinement, grants_from
from compilecache_operator.model.spec import Defaults, InvalidSpec
from compilecache_operator.model.spec_parse import parse_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.operator.samples import job_for, raw_spec
from tests.operator.specgen import SETTINGS, body_of

NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True)
NAMESPACE = "team-a"


@st.composite
def warmups(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """A ``spec.warmup`` that reaches some Secrets, and for each (the list it needs, the field path, the name)."""
    names = draw(st.lists(NAMES, min_size=1, max_size=6))
    env: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    pulls: list[dict[str, str]] = []
    reached: list[tuple[str, str, str]] = []
    for name in names:
        how = draw(st.sampled_from(["env", "config", "plain", "volume", "configVolume", "pull"]))
        if how == "env":
            path = f"spec.warmup.env[{len(env)}].valueFrom.secretKeyRef.name"
            env.append({"name": f"V{len(env)}", "valueFrom": {"secretKeyRef": {"name": name, "key": "k"}}})
            reached.append(("read", path, name))
        elif how == "config":  # a ConfigMap is no Secret: never refused
            env.append({"name": f"V{len(env)}", "valueFrom": {"configMapKeyRef": {"name": name, "key": "k"}}})
        elif how == "plain":
            env.append({"name": f"V{len(env)}", "value": name})
        elif how == "volume":
            path = f"spec.warmup.volumes[{len(volumes)}].secret.secretName"
            volumes.append({"name": f"v{len(volumes)}", "secret": {"secretName": name}})
            reached.append(("read", path, name))
        elif how == "configVolume":
            volumes.append({"name": f"v{len(volumes)}", "configMap": {"name": name}})
        else:
            path = f"spec.warmup.imagePullSecrets[{len(pulls)}].name"
            pulls.append({"name": name})
            reached.append(("pull", path, name))
    warmup: dict[str, Any] = {"env": env, "volumes": volumes, "imagePullSecrets": pulls}
    account = draw(st.one_of(st.none(), NAMES))
    if account is not None:
        warmup["serviceAccountName"] = account
    if draw(st.booleans()):
        warmup["automountServiceAccountToken"] = True
        reached.append(("token", "spec.warmup.automountServiceAccountToken", account or "default"))
    return warmup, reached


def entries(draw: st.DrawFn, wanted: list[str]) -> tuple[str, ...]:
    """A list that allows some of ``wanted`` (by NAME, NAMESPACE/NAME, or the wrong namespace) and other names."""
    out = []
    for name in wanted:
        out.append(draw(st.sampled_from([name, f"{NAMESPACE}/{name}", f"team-b/{name}", f"{name}x"])))
    return tuple(draw(st.permutations(out + draw(st.lists(NAMES, max_size=2)))))


def allowed(entry_list: tuple[str, ...], name: str) -> bool:
    return any(e in ("*", name, f"{NAMESPACE}/{name}") for e in entry_list)


@settings(max_examples=300, deadline=None)
@given(case=warmups(), data=st.data())
def test_each_secret_outside_its_list_is_refused_at_its_own_field(
    case: tuple[dict[str, Any], list[tuple[str, str, str]]], data: st.DataObject
) -> None:
    warmup, reached = case
    spec = parse_spec(raw_spec(warmup=warmup), Defaults())
    by_list = {kind: [n for k, _, n in reached if k == kind] for kind in ("read", "pull", "token")}
    lists = {kind: entries(data.draw, names) for kind, names in by_list.items()}
    confined = Confinement(warmup_secrets=lists["read"], warmup_pull_secrets=lists["pull"],
                           warmup_service_account_tokens=lists["token"])
    wanted = sorted((path, name) for kind, path, name in reached if not allowed(lists[kind], name))
    try:
        check_confinement(confined, NAMESPACE, spec)
        refused: list[tuple[str, str]] = []
    except InvalidSpec as exc:
        refused = sorted((e.path, e.message) for e in exc.errors)
    assert [path for path, _ in refused] == [path for path, _ in wanted]
    for (_, message), (_, name) in zip(refused, wanted, strict=True):
        assert repr(name) in message and "the cluster admin allows" in message
    # not configured: confines nothing; "*": allows all
    check_confinement(Confinement(), NAMESPACE, spec)
    check_confinement(Confinement(warmup_secrets=("*",), warmup_pull_secrets=("*",),
                                  warmup_service_account_tokens=("*",)), NAMESPACE, spec)


@settings(max_examples=60, deadline=None)
@given(team=NAMES, other=NAMES, read=NAMES, pull=NAMES)
def test_a_grant_allows_warm_up_secrets_in_its_namespaces_only(team: str, other: str, read: str, pull: str) -> None:
    if team == other:
        return
    (grant,), refused = grants_from([{"metadata": {"name": "g", "namespace": "ops"},
                                      "data": {"namespaces": team, "warmupSecrets": read,
                                               "warmupPullSecrets": f"{pull}\n"}}])
    assert not refused
    base = Confinement(warmup_secrets=(), warmup_pull_secrets=())
    granted = dataclasses.replace(base, grants=(grant,))
    spec = parse_spec(raw_spec(warmup={
        "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": read, "key": "k"}}}],
        "imagePullSecrets": [{"name": pull}]}), Defaults())
    check_confinement(granted, team, spec)
    for confinement, namespace in ((granted, other), (base, team)):
        with pytest.raises(InvalidSpec) as caught:
            check_confinement(confinement, namespace, spec)
        assert [e.path for e in caught.value.errors] == ["spec.warmup.env[0].valueFrom.secretKeyRef.name",
                                                        "spec.warmup.imagePullSecrets[0].name"]
    assert grants_from([{"metadata": {"name": "bad"}, "data": {"namespaces": "a", "warmupSecrets": "x/y"}}])[1] == [
        "ConfigMap /bad: data.warmupSecrets: 'x/y' is not a Secret name"]


def test_a_store_secret_is_not_thereby_readable_by_the_warm_up() -> None:
    confined = Confinement(store_secrets=("store",), warmup_secrets=())
    spec = parse_spec(raw_spec(storage={"url": "redis://redis.cache:6379/0", "secretRef": {"name": "store"}},
                               warmup={"volumes": [{"name": "s", "secret": {"secretName": "store"}}]}), Defaults())
    with pytest.raises(InvalidSpec, match=r"^spec\.warmup\.volumes\[0\]\.secret\.secretName: Secret 'store' is not "
                                          r"allowed for warm-ups to read \(the cluster admin allows: none\)$"):
        check_confinement(confined, NAMESPACE, spec)


@pytest.mark.parametrize(("warmup", "token"), [({}, False), ({"automountServiceAccountToken": False}, False),
                                               ({"automountServiceAccountToken": True}, True),
                                               ({"serviceAccountName": "puller"}, False)])
def test_the_warm_up_pod_mounts_no_api_token_unless_asked(warmup: dict[str, Any], token: bool) -> None:
    pod = job_for(warmup=warmup)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is token


def test_the_operators_flags_and_pull_secrets_make_the_lists() -> None:
    settings_ = settings_from(parse_args([
        "--image-pull-secrets", "regcred,mirror", "--allowed-warmup-secrets", "hub,team-a/ca",
        "--allowed-warmup-pull-secrets", "", "--allowed-warmup-service-account-tokens", "team-a/api-reader"]))
    assert settings_.confinement == Confinement(warmup_secrets=("hub", "team-a/ca"),
                                                warmup_pull_secrets=("regcred", "mirror"),
                                                warmup_service_account_tokens=("team-a/api-reader",))
    assert settings_from(parse_args(["--image-pull-secrets", "regcred"])).confinement == Confinement()


BAD = {"env": [{"name": "HUB", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}},
               {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "team-db", "key": "password"}}}],
       "volumes": [{"name": "db", "secret": {"secretName": "team-db"}}],
       "imagePullSecrets": [{"name": "team-db"}], "automountServiceAccountToken": True}
PATHS = ["spec.warmup.env[1].valueFrom.secretKeyRef.name", "spec.warmup.volumes[0].secret.secretName",
         "spec.warmup.imagePullSecrets[0].name", "spec.warmup.automountServiceAccountToken"]
CONFINED = dataclasses.replace(SETTINGS, confinement=Confinement(
    warmup_secrets=("hub",), warmup_pull_secrets=(), warmup_service_account_tokens=()))


def test_the_reconcile_refuses_them_before_any_job_and_the_webhook_with_the_same_message() -> None:
    body = body_of(raw_spec(warmup=BAD))
    body["metadata"]["namespace"] = NAMESPACE
    actions = reconcile.decide_actions(Snapshot(body), CONFINED)
    assert actions.failure is not None and actions.failure.reason == "InvalidSpec" and not actions.create
    assert [m.split(":", 1)[0] for m in actions.failure.message.split("; ")] == PATHS
    request = {"uid": "u", "operation": "CREATE", "namespace": NAMESPACE, "object": body}
    response = asyncio.run(review_cache(CONFINED, None, {"request": request}))["response"]
    assert not response["allowed"] and actions.failure.message in response["status"]["message"]
    assert "spec.warmup.env[0]" not in response["status"]["message"], "hub is allowed"
    allowed = reconcile.decide_actions(Snapshot(body), SETTINGS)  # not confined: the Job gets them all
    (job,) = allowed.create
    pod = job.manifest["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "team-db"}] and pod["automountServiceAccountToken"] is True
