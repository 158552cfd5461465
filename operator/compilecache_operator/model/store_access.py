"""How the cache's store is opened with its storage Secret (pure): the credentials as environment variables of
a container we create or inject (the warm-up's publish container and the injected preload get the same ones; the
store's CA is mounted beside them, :mod:`compilecache_operator.model.store_ca`), and what a namespace does to let the
operator itself read the Secret (it opens the store to check, prune and delete bundles)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compilecache_operator.model.spec import StorageSpec


@dataclass(frozen=True)
class SecretReader:
    """Who the operator is, to say how a namespace lets it read a storage Secret (``get``, by a RoleBinding there
    to the chart's ClusterRole that grants exactly that: no Helm change)."""

    cluster_role: str | None = None
    """``--secret-reader-role``: the ClusterRole a RoleBinding should name."""
    service_account: str | None = None
    """``--service-account``: the operator's ServiceAccount as ``namespace/name``."""

    def how_to_allow(self, namespace: str) -> str:
        if self.cluster_role and self.service_account:  # the binding named as the role: one per release
            return (f"allow it with: kubectl create rolebinding {self.cluster_role} -n {namespace} "
                    f"--clusterrole={self.cluster_role} --serviceaccount={self.service_account.replace('/', ':', 1)}")
        return f"grant the operator's ServiceAccount get on Secrets of namespace {namespace!r} (a RoleBinding there)"


def storage_env(storage: StorageSpec) -> list[dict[str, Any]]:
    """Credential variables from the storage Secret (``secretKeyRef``), none without a Secret."""
    if not storage.secret_name:
        return []
    env: list[dict[str, Any]] = []
    for cred in storage.secret_keys:
        ref: dict[str, Any] = {"name": storage.secret_name, "key": cred.key}
        if cred.optional:
            ref["optional"] = True
        env.append({"name": cred.env, "valueFrom": {"secretKeyRef": ref}})
    return env
