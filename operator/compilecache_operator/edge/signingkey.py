"""The bundle-signing key kept in a Secret the operator creates once and never replaces by itself.

On its first start the leader makes an Ed25519 key into the Secret (``signing.key``); from then on
every start of every replica reads that same key, so bundles published before a restart, an upgrade
or a ``helm template`` re-render still verify. Nothing at render time makes a key.

Rotation is an explicit act: setting the annotation ``compilecache.io/rotate-signing-key`` on the
Secret to a new value (any text, e.g. the date). The leader then makes a new key and moves the
old public key into ``trusted.pub`` (one base64 public key per line), which preloads keep accepting:
bundles signed before the rotation still verify while new ones are signed by the new key. Deleting
a line of ``trusted.pub`` ends the overlap. ``compilecache.io/signing-key-rotated`` records the
request acted on, so a request is carried out once. Replicas pick the new key up within
``interval`` seconds.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable, Mapping
from typing import Any

from cachelib.signing import Signer
from compilecache_operator.edge.kube import KubeAPI, KubeError
from compilecache_operator.edge.signing import Signing, SigningKeyError, log_signing, signing_from_pem
from compilecache_operator.model.names import PREFIX

log = logging.getLogger(__name__)

KEY = "signing.key"
TRUSTED = "trusted.pub"
ROTATE_ANNOTATION = f"{PREFIX}/rotate-signing-key"
ROTATED_ANNOTATION = f"{PREFIX}/signing-key-rotated"


def decoded(secret: Mapping[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def trusted_lines(data: Mapping[str, bytes]) -> list[str]:
    return [line.strip() for line in data.get(TRUSTED, b"").decode().splitlines() if line.strip()]


def new_secret(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """A Secret with a new key."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "data": {KEY: base64.b64encode(Signer.generate().private_pem()).decode("ascii")}}


def rotation_request(secret: Mapping[str, Any]) -> str | None:
    """The rotation asked for and not yet done, if any."""
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    wanted = annotations.get(ROTATE_ANNOTATION)
    return str(wanted) if wanted and wanted != annotations.get(ROTATED_ANNOTATION) else None


def rotated(secret: Mapping[str, Any], request: str) -> dict[str, Any]:
    """``secret`` with a new key; the old one's public key first in ``trusted.pub``."""
    data = decoded(secret)
    old = Signer.from_pem(data[KEY], KEY).public_key.text()
    trusted = list(dict.fromkeys([old, *trusted_lines(data)]))
    meta = dict(secret.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), ROTATED_ANNOTATION: request}
    new_data = {**data, KEY: Signer.generate().private_pem(), TRUSTED: ("\n".join(trusted) + "\n").encode()}
    return {**secret, "metadata": meta, "data": {k: base64.b64encode(v).decode("ascii") for k, v in new_data.items()}}


def signing_of(secret: Mapping[str, Any], name: str, extra_trusted: tuple[str, ...]) -> Signing:
    data = decoded(secret)
    if KEY not in data:
        raise SigningKeyError(f"Secret {name} has no {KEY}")
    return signing_from_pem(data[KEY], f"Secret {name} {KEY}", (*trusted_lines(data), *extra_trusted))


class KeySecret:
    """The leader's writes to the signing key's Secret and every replica's reading of it."""

    def __init__(self, api: KubeAPI, namespace: str, name: str, labels: Mapping[str, str],
                 extra_trusted: tuple[str, ...] = ()) -> None:
        self.api, self.namespace, self.name, self.labels = api, namespace, name, labels
        self.extra_trusted = extra_trusted
        self.path = f"/api/v1/namespaces/{namespace}/secrets"

    async def once(self, leading: bool) -> Signing | None:
        """Create the Secret (leader, only when there is none) or carry out a rotation asked for (leader);
        the signing the Secret now holds (None while there is no Secret yet)."""
        secret = await self.api.get(f"{self.path}/{self.name}")
        try:
            if secret is None and leading:
                secret = await self.api.request("POST", self.path, body=new_secret(self.name, self.namespace,
                                                                                    self.labels))
                log.info("created the bundle-signing key in Secret %s/%s", self.namespace, self.name)
            elif secret is not None and leading and (request := rotation_request(secret)) is not None:
                secret = await self.api.request("PUT", f"{self.path}/{self.name}", body=rotated(secret, request))
                log.info("rotated the bundle-signing key of Secret %s/%s (%s=%s); the previous key stays trusted",
                         self.namespace, self.name, ROTATE_ANNOTATION, request)
        except KubeError as exc:
            if exc.status not in (409, 422):
                raise
            secret = await self.api.get(f"{self.path}/{self.name}")  # another writer was first: read its work
        return None if secret is None else signing_of(secret, self.name, self.extra_trusted)

    async def first(self, leading: Callable[[], bool], interval: float = 1.0) -> Signing:
        """The signing key, waiting until a leader has made it."""
        while True:
            signing = await self.once(leading())
            if signing is not None:
                log_signing(signing)
                return signing
            log.info("waiting for the leader to create the signing key Secret %s/%s", self.namespace, self.name)
            await asyncio.sleep(interval)

    async def keep(self, leading: Callable[[], bool], on_change: Callable[[Signing], None], current: Signing,
                   interval: float = 10.0) -> None:
        """Forever: carry out rotations (leader) and hand a changed key on (every replica)."""
        seen = (current.signer.public_key, current.trusted)
        while True:
            await asyncio.sleep(interval)
            try:
                signing = await self.once(leading())
            except (KubeError, OSError, SigningKeyError) as exc:
                log.warning("signing key Secret %s/%s: %s", self.namespace, self.name, exc)
                continue
            if signing is not None and (signing.signer.public_key, signing.trusted) != seen:
                seen = (signing.signer.public_key, signing.trusted)
                log_signing(signing)
                on_change(signing)
