"""Property: every CompileCache spec drawn from the CRD's schema, valid or with one field made wrong, is
refused by the CRD's schema (the API server), or refused by the operator as InvalidSpec with the field's
path, or warmed up by Jobs whose every value Kubernetes accepts. Never a Job from an invalid value, never
a blank status, never a secret in a status or an event. The operator's pure path (parse, decide, status)
only: many examples, in about a second each hundred; tests/e2e/test_spec_sweep.py sends some to a real
API server with the operator running."""

from __future__ import annotations

import json

import pytest
from compilecache_operator.controller import reconcile
from compilecache_operator.controller.reconcile import Snapshot
from hypothesis import HealthCheck, given, settings

from tests.operator import specgen
from tests.operator.crdschema import validator

SCHEMA = validator()
REFUSALS = ("InvalidSpec", "SecretKeyMissing", "SecretNotFound", "NoGPUNodes")
"""A spec that cannot be served: InvalidSpec, or what it names cannot be found (each names its field)."""
NOW = "2026-01-01T00:00:00Z"


def outcome(case: specgen.Case) -> str:
    """Check one case; returns which of the three allowed outcomes it had."""
    body = specgen.body_of(case.spec)
    if not SCHEMA.is_valid(body):
        return "refused by the schema"
    snapshot = Snapshot(body, secret={"AWS_ACCESS_KEY_ID": b"a", "AWS_SECRET_ACCESS_KEY": b"b"})
    actions = reconcile.decide_actions(snapshot, specgen.SETTINGS)
    status = reconcile.final_status(snapshot, actions, actions.bundles, "", NOW)
    ready = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["reason"] and ready[0]["message"], f"a blank status: {status}"
    assert specgen.SECRET not in json.dumps(status), f"the secret in the status: {status}"
    if actions.failure is not None:
        assert actions.failure.reason in REFUSALS, actions.failure
        assert specgen.SECRET not in actions.failure.message
        # the field itself, one inside it, or (a list item or object the case made) a sibling it needs
        where = (specgen.dotted(case.path), specgen.dotted(case.path[:-1]))
        named = [m.split(":", 1)[0] for m in actions.failure.message.split("; ")]
        assert any(p.startswith(w) or w.startswith(p) for p in named for w in where if w != "spec"), (
            where, actions.failure.message)
        return actions.failure.reason
    assert actions.create, f"neither refused nor warmed up: {actions}"
    for job in actions.create:
        problems = specgen.job_problems(job.manifest) + specgen.spec_problems(case.spec)
        assert not problems, f"a Job from an invalid value ({case.kind} at {specgen.dotted(case.path)}): {problems}"
    return "warm-up"


@settings(max_examples=1000, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(specgen.cases())
def test_every_generated_spec_is_refused_or_invalid_or_a_valid_warmup(case: specgen.Case) -> None:
    outcome(case)


@pytest.mark.parametrize("url", specgen.URL_FORMS)
@pytest.mark.parametrize("base", range(len(specgen.BASES)))
def test_a_credential_in_any_part_of_the_store_url_is_refused_and_never_shown(url: str, base: int) -> None:
    spec = {**specgen.BASES[base], "storage": {**specgen.BASES[base]["storage"], "url": url}}
    case = specgen.Case(spec, ("storage", "url"), "credential", url)
    assert outcome(case) in ("refused by the schema", "InvalidSpec")
    snapshot = Snapshot(specgen.body_of(spec))
    actions = reconcile.decide_actions(snapshot, specgen.SETTINGS)
    assert actions.failure is not None and actions.failure.reason == "InvalidSpec", "the operator refuses it too"
    assert "spec.storage.url" in actions.failure.message and specgen.SECRET not in actions.failure.message


@settings(max_examples=400, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(specgen.last_bad_specs())
def test_the_last_bad_specs_are_refused_by_the_operator_at_their_field(case: specgen.Case) -> None:
    """A NUL byte in text a container gets, a GPU resource that is not an extended resource, a resource no node
    offers, a store port outside 1..65535: the operator refuses each at its field whether or not the CRD's rules
    were in force when it was stored (the schema's patterns refuse the NUL bytes too; CEL the rest, on a real API
    server: tests/e2e/test_crd_validation.py)."""
    actions = reconcile.decide_actions(Snapshot(specgen.body_of(case.spec)), specgen.SETTINGS)
    assert actions.failure is not None and actions.failure.reason == "InvalidSpec", (case, actions.create)
    assert not actions.create
    named = [m.split(":", 1)[0] for m in actions.failure.message.split("; ")]
    assert specgen.dotted(case.path) in named, (specgen.dotted(case.path), actions.failure.message)
    assert outcome(case) in ("refused by the schema", "InvalidSpec")
    if case.kind == "nul":
        assert not SCHEMA.is_valid(specgen.body_of(case.spec)), "the schema's pattern refuses a NUL byte too"
