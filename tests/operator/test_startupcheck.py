"""The chart's post-install hook waits until the CompileCache webhook answers: which answers of the API server to a
dry-run create come from the webhook (real messages of kube-apiserver 1.37), and the waiting itself."""

from __future__ import annotations

import json

import pytest
from compilecache_operator import startupcheck
from hypothesis import given
from hypothesis import strategies as st

UNREACHABLE = [
    (500, {"kind": "Status", "status": "Failure", "reason": "InternalError", "code": 500, "message":
           'Internal error occurred: failed calling webhook "validate.compilecaches.compilecache.io": failed to call '
           'webhook: Post "https://cc-compilecache-operator-webhook.ccs-1.svc:443/validate-caches?timeout=5s": '
           'no endpoints available for service "cc-compilecache-operator-webhook"'}),
    (500, {"kind": "Status", "code": 500, "message":
           'Internal error occurred: failed calling webhook "validate.compilecaches.compilecache.io": failed to call '
           'webhook: Post "https://...": tls: failed to verify certificate: x509: certificate signed by unknown '
           'authority'}),
    (404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": "the server could not find the requested "
                                                                             "resource"}),
    (403, {"kind": "Status", "code": 403, "reason": "Forbidden", "message": 'compilecaches.compilecache.io is '
           'forbidden: User "system:serviceaccount:ccs:x" cannot create resource "compilecaches"'}),
]
ANSWERED = [
    (201, {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {"name": "x"}}),
    (403, {"kind": "Status", "code": 403, "reason": "Forbidden", "message":
           'admission webhook "validate.compilecaches.compilecache.io" denied the request: spec.storage: no store '
           "(set spec.storage.url, or give the operator --default-storage-url)"}),
]


@pytest.mark.parametrize(("status", "body"), UNREACHABLE)
def test_a_webhook_not_reached_yet_is_waited_for(status: int, body: dict[str, object]) -> None:
    answer = startupcheck.classify(status, json.dumps(body))
    assert not answer.answered and answer.detail


@pytest.mark.parametrize(("status", "body"), ANSWERED)
def test_an_admission_or_the_webhooks_own_refusal_is_an_answer(status: int, body: dict[str, object]) -> None:
    assert startupcheck.classify(status, json.dumps(body)).answered


@given(status=st.integers(100, 599), body=st.text(max_size=200))
def test_anything_else_is_no_answer_and_never_raises(status: int, body: str) -> None:
    answer = startupcheck.classify(status, body)
    assert answer.answered == (200 <= status < 300 or 'admission webhook "validate.compilecaches' in body)


def test_it_waits_until_the_webhook_answers_or_the_time_is_up() -> None:
    answers = iter([startupcheck.Answer(False, "no endpoints")] * 3 + [startupcheck.Answer(True, "HTTP 201")])
    now = [0.0]
    said: list[str] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds

    got = startupcheck.wait_answered(lambda: next(answers), 60, 2, said.append, clock=lambda: now[0], sleep=sleep)
    assert got.answered and now[0] == 6 and said == ["no endpoints", "HTTP 201"]  # each new detail said once
    now[0] = 0.0
    never = startupcheck.wait_answered(lambda: startupcheck.Answer(False, "x"), 10, 3, said.append,
                                       clock=lambda: now[0], sleep=sleep)
    assert not never.answered and now[0] == 12


def test_the_probe_is_a_complete_compile_cache() -> None:
    from compilecache_operator.model.spec import Defaults
    from compilecache_operator.model.spec_parse import parse_spec

    probe = startupcheck.probe_cache()
    assert parse_spec(probe["spec"], Defaults(storage_url="redis://redis:6379/0"), name=probe["metadata"]["name"])
