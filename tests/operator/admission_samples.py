"""AdmissionReviews of pods as the API server sends them, and a pod with the webhook's answer applied."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch


def review(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    obj["metadata"].pop("namespace", None)  # the API server may leave it to the request
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": operation, "namespace": "team-a", "object": obj}}


def patched(obj: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    ops = json.loads(base64.b64decode(answer["response"]["patch"])) if "patch" in answer["response"] else []
    result: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return result
