"""The CompileCache validating webhook: a spec the operator would mark InvalidSpec is refused at create and update.

The check is the operator's own (:func:`spec_parse.parse_spec`, then :func:`confinement.check_confinement` with
the grants the replica holds), so the API server refuses exactly what would otherwise become the
``InvalidSpec`` condition, with the same message naming each field at fault (credentials masked). A store,
Secret or ServiceAccount refused by the allow-lists is looked at once more with the grant ConfigMaps read
from the API at that moment (:func:`read_grants`): a grant made a second ago counts, though the replica's
own copy is refreshed only every few seconds.

The chart's ValidatingWebhookConfiguration sends only a create, or an update that changes ``spec`` of an
object not being deleted (``matchConditions``); :func:`to_check` says the same, so a status write or a
finalizer's removal is never refused here, even where those conditions are not in place.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from compilecache_operator.edge.kube import KubeAPI
from compilecache_operator.model.confinement import ALLOW_LABEL, Confinement, Grant, check_confinement, grants_from
from compilecache_operator.model.spec import CacheSpec, Defaults, InvalidSpec
from compilecache_operator.model.spec_parse import parse_spec

log = logging.getLogger(__name__)

Regrant = Callable[[], Awaitable[Sequence[Grant]]]
"""Reads the grants afresh from the API."""


class CacheCheckSettings(Protocol):
    """The operator's settings the CompileCache webhook reads."""

    @property
    def defaults(self) -> Defaults: ...
    @property
    def confinement(self) -> Confinement: ...
    def in_scope(self, namespace: str) -> bool: ...


def to_check(request: Mapping[str, Any]) -> bool:
    """Whether an admission request is one the check answers: a create, or an update of ``spec`` of an object
    that is not being deleted."""
    new = request.get("object")
    if not isinstance(new, Mapping):
        return False
    if request.get("operation") == "CREATE":
        return True
    old = request.get("oldObject")
    deleting = bool((new.get("metadata") or {}).get("deletionTimestamp"))
    return (request.get("operation") == "UPDATE" and not deleting
            and not (isinstance(old, Mapping) and old.get("spec") == new.get("spec")))


def spec_problem(defaults: Defaults, confinement: Confinement, namespace: str,
                 cache: Mapping[str, Any]) -> tuple[CacheSpec | None, InvalidSpec | None]:
    """``cache`` of ``namespace`` parsed, and what is wrong with it (None: nothing); the spec is None when it
    does not parse, given when only the allow-lists refuse it."""
    name = (cache.get("metadata") or {}).get("name")
    try:
        spec = parse_spec(cache.get("spec"), defaults, name=str(name) if name else None)
    except InvalidSpec as exc:
        return None, exc
    return spec, confinement_problem(confinement, namespace, spec)


def confinement_problem(confinement: Confinement, namespace: str, spec: CacheSpec) -> InvalidSpec | None:
    """What of ``spec`` is outside the allow-lists and grants for ``namespace`` (None: nothing)."""
    try:
        check_confinement(confinement, namespace, spec)
    except InvalidSpec as exc:
        return exc
    return None


def answer(review: Mapping[str, Any], refused: InvalidSpec | None) -> dict[str, Any]:
    """The AdmissionReview that admits the request, or refuses it with the InvalidSpec's message."""
    request = review.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": refused is None}
    if refused is not None:
        response["status"] = {"code": 422, "reason": "Invalid", "message": f"CompileCache spec refused: {refused}"}
    return {"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
            "response": response}


async def review_cache(settings: CacheCheckSettings, regrant: Regrant | None,
                       review: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to a review of a CompileCache: refused when its spec is one the operator would mark
    InvalidSpec; a refusal by the allow-lists stands only if the grants read afresh (``regrant``) refuse it too."""
    request = review.get("request") or {}
    namespace = str(request.get("namespace") or "")
    cache = request.get("object")
    if not to_check(request) or not isinstance(cache, Mapping) or not settings.in_scope(namespace):
        return answer(review, None)
    spec, refused = spec_problem(settings.defaults, settings.confinement, namespace, cache)
    if spec is not None and refused is not None and regrant is not None:
        try:
            grants = tuple(await regrant())
        except Exception as exc:  # the replica's own grants decide
            log.warning("could not read the grant ConfigMaps again: %s", exc)
        else:
            if grants != settings.confinement.grants:
                refused = confinement_problem(replace(settings.confinement, grants=grants), namespace, spec)
    return answer(review, refused)


async def read_grants(api: KubeAPI, namespace: str) -> tuple[tuple[Grant, ...], list[str]]:
    """The grants of the ConfigMaps labelled ``compilecache.io/allow`` in ``namespace`` (the operator's), and
    one message per ConfigMap that grants nothing because it cannot be read as a grant."""
    listed = await api.list_all(f"/api/v1/namespaces/{namespace}/configmaps", {"labelSelector": ALLOW_LABEL})
    return grants_from(listed)
